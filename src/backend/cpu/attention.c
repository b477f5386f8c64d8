/*
 * attention.c — the core softmax attention of the gated full-attention layer
 * (specs/hybrid-qwen3next.md §4 step 4; projections, norms, RoPE and the gate live
 * elsewhere): causal GQA attention of T new queries over a paged KV prefix plus
 * their own keys.
 *
 * ls_attn_fwd is a tiled online softmax (flash-attention style). One task is a
 * (kv head j, block of Bq query tokens) pair, run by one thread; the r = n_h/n_kv
 * query heads that share kv head j are stacked into the rows, M = Bq·r. The task
 * walks key blocks of up to BK keys (the prefix, then its own keys up to the
 * diagonal) and, for each band of B query rows (B = 16 with AVX, 8 without: two
 * vectors), does the band's scores, the online-softmax update (running max and sum
 * per row) and O += P·V while the band is in L1. Everything is kept transposed,
 * query rows along the vector lanes:
 *   Qᵀ band [hd, B] (packed once per task, pre-scaled by scale·log2 e, so the
 *   weights are plain 2^x), Sᵀ = K·Qᵀ [bk, B], Oᵀ band [hd, B] += Vᵀ·Pᵀ.
 * Keys and values are then read by row pointers straight from the F32 pages or the
 * own k/v (BF16 rows are converted per block), the row max, exponentials and
 * rescaling are plain lane-wise vector operations, and the causal mask is a lane
 * compare. Memory per thread is O(M·hd + BK·B); nothing of size T×n or T×T is
 * ever formed.
 *
 * Why own register-tile kernels and not cblas_sgemm per tile: the tiles are small
 * (K = hd for Q·Kᵀ) and OpenBLAS re-packs Q, P and V, zeroes C and goes through
 * memory for every tile; these 6×B kernels with the band loop measured ~10–20%
 * faster on the reference machine, and need no K/V copies for F32 pages.
 *
 * ls_attn_bwd (below the forward) recomputes the scores block by block from the saved
 * lse with the same two register kernels: query-block tasks for dQ and key-block tasks
 * (keys along the lanes) for dK, dV — see the comment above it.
 *
 * ls_attn_naive is the double-precision reference for the tests.
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "backend/rows.h"
#include "backend/cpu/vec.h"
#include "longstraw/kernels.h"

/* Target rows per task (Bq·r) and keys per block: 128..512 for either were within
 * the measurement noise at hd 64 and 128. */
#define ATTN_ROWS 256
#define ATTN_BK 256
/* Keys (scores) or head dims (output) per register tile: KT × 2 vectors = 12
 * accumulators + 2 loaded vectors + 1 broadcast = 15 of the 16 vector registers (AVX2).
 * With AVX-512's 32, tiles of 8 and 12 measured no faster than 6 at hd 128 (issue 22). */
#define ATTN_KT 6

#define ATTN_LOG2E 1.4426950408889634
#define ATTN_LN2 0.6931471805599453

/* The vectors of vec.h (16 lanes with AVX-512: capture at P = 16K 1.2× faster than with
 * 8 lanes on an AVX-512 Xeon, issue 22). A band (the query rows of one register tile row)
 * is two vectors. */
#define ATTN_VL LS_VL
#define ATTN_SPLAT(x) LS_SPLAT(x)
#define ATTN_BAND (2 * ATTN_VL)
typedef ls_vf attn_vf;
typedef ls_vi attn_vi;
typedef ls_vh attn_vh;
#define ATTN_VSEL(mask, a, b) LS_VSEL(mask, a, b)
#define ATTN_LOAD(v, p) LS_VLOAD(v, p)
#define ATTN_STORE(p, v) LS_VSTORE(p, v)

#define ATTN_EXP2(y, x) LS_VEXP2(y, x)

/* Read-only description of one call, shared by all tasks. */
typedef struct {
    const float *q;             /* [T, n_h, hd] */
    const float *k, *v;         /* [T, n_kv, hd] own keys/values */
    const ls_kv_prefix *prefix; /* NULL when n = 0 */
    float *o;                   /* [T, n_h, hd] */
    float *lse;                 /* [T, n_h] or NULL */
    int64_t n, r; /* prefix length, query heads per kv head */
    int n_h, n_kv, hd;
    int own;      /* 0: the prefix only (a CP rank's partial), k and v unused */
    float qscale; /* scale · log2 e */
} attn_ctx;

/* Per-thread scratch, carved from the arena before the parallel region.
 * Mp = rows rounded up to B = ATTN_BAND, BKt = BK rounded up to KT. */
typedef struct {
    float *Qt;         /* [Mp/B, hd, B] scaled queries, transposed per band (padding 0) */
    float *Ot;         /* [Mp/B, hd, B] unnormalised output, transposed per band */
    float *mx;         /* [Mp] running max (base 2) */
    float *l;          /* [Mp] running sum of 2^(s − mx) */
    float *St;         /* [BKt, B] scores, then weights, of one band */
    float *Kc, *Vc;    /* [BK, hd] a BF16 block converted to f32 */
    const float **kr;  /* [BKt] key row of each key of the block (padding repeats the last) */
    const float **vr;  /* [BK]  value rows */
} attn_slab;

/* St[KT keys, B] = K[KT rows kr[0..KT−1], hd] · Qt[hd, B]. The loops over the KT tile
 * rows unroll fully: the 2·KT accumulators stay in registers. */
static void attn_uk_qk(float *restrict St, const float *restrict Qt, const float *const *kr,
                       int hd) {
    attn_vf a0[ATTN_KT], a1[ATTN_KT];
    const float *k[ATTN_KT];
#pragma GCC unroll 16
    for (int i = 0; i < ATTN_KT; i++) a0[i] = a1[i] = (attn_vf){0}, k[i] = kr[i];
    for (int64_t d = 0; d < hd; d++) {
        attn_vf q0, q1;
        ATTN_LOAD(q0, Qt + d * ATTN_BAND);
        ATTN_LOAD(q1, Qt + d * ATTN_BAND + ATTN_VL);
#pragma GCC unroll 16
        for (int i = 0; i < ATTN_KT; i++) {
            attn_vf x = ATTN_SPLAT(k[i][d]);
            a0[i] += x * q0, a1[i] += x * q1;
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < ATTN_KT; i++) {
        ATTN_STORE(St + i * ATTN_BAND, a0[i]);
        ATTN_STORE(St + i * ATTN_BAND + ATTN_VL, a1[i]);
    }
}

/* Ot[d0 + i, B] += Σ_{c<bk} V[c][d0 + i] · Pt[c, B] for i < nd (nd ≤ KT); value
 * row c is vr[c]. Lanes past nd repeat dim d0+nd−1 (stays inside the row) and are
 * not stored. */
static void attn_uk_pv(float *restrict Ot, const float *restrict Pt, const float *const *vr,
                       int64_t bk, int d0, int nd) {
    attn_vf a0[ATTN_KT], a1[ATTN_KT];
    int e[ATTN_KT];
#pragma GCC unroll 16
    for (int i = 0; i < ATTN_KT; i++) a0[i] = a1[i] = (attn_vf){0}, e[i] = d0 + (i < nd ? i : nd - 1);
    for (int64_t c = 0; c < bk; c++) {
        const float *vc = vr[c];
        attn_vf p0, p1;
        ATTN_LOAD(p0, Pt + c * ATTN_BAND);
        ATTN_LOAD(p1, Pt + c * ATTN_BAND + ATTN_VL);
#pragma GCC unroll 16
        for (int i = 0; i < ATTN_KT; i++) {
            attn_vf x = ATTN_SPLAT(vc[e[i]]);
            a0[i] += x * p0, a1[i] += x * p1;
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < ATTN_KT; i++)
        if (nd > i) {
            float *o_ = Ot + (int64_t)(d0 + i) * ATTN_BAND;
            attn_vf t_;
            ATTN_LOAD(t_, o_), t_ += a0[i], ATTN_STORE(o_, t_);
            ATTN_LOAD(t_, o_ + ATTN_VL), t_ += a1[i], ATTN_STORE(o_ + ATTN_VL, t_);
        }
}

/* One key block of bk keys (rows sl->kr, sl->vr) against all bands of the task's Mp
 * rows. When `masked`, the block holds own keys whose first one is `diag` tokens
 * after the task's first query (diag may be negative): row m (query token m/r of
 * the task) sees only keys c ≤ m/r − diag. */
static void attn_block(const attn_slab *sl, const attn_ctx *c, int64_t Mp, int64_t bk, int masked,
                       int64_t diag) {
    const int hd = c->hd;
    const int64_t r = c->r;
    const attn_vf ninf = ATTN_SPLAT(-INFINITY), zero = {0};
    for (int64_t m0 = 0; m0 < Mp; m0 += ATTN_BAND) {
        const float *Qt = sl->Qt + m0 * hd; /* [hd, B] */
        float *Ot = sl->Ot + m0 * hd;       /* [hd, B] */
        /* keys the band can see: nc = min(bk, last row's limit + 1) */
        int64_t nc = bk;
        attn_vi lim0 = {0}, lim1 = {0}; /* per-row last visible key, clamped to [−1, bk] */
        if (masked) {
            int64_t hi = (m0 + ATTN_BAND - 1) / r - diag + 1;
            if (hi <= 0) continue; /* no row of the band sees any of these keys */
            if (hi < nc) nc = hi;
            for (int i = 0; i < ATTN_BAND; i++) {
                int64_t li = (m0 + i) / r - diag;
                li = li < -1 ? -1 : li > bk ? bk : li;
                if (i < ATTN_VL) lim0[i] = (int32_t)li;
                else lim1[i - ATTN_VL] = (int32_t)li;
            }
        }
        /* scores Sᵀ [nc, B] (the last tile may run past nc: its rows are not used) */
        for (int64_t c0 = 0; c0 < nc; c0 += ATTN_KT)
            attn_uk_qk(sl->St + c0 * ATTN_BAND, Qt, sl->kr + c0, hd);
        /* online softmax, all B rows at once */
        attn_vf mo0, mo1, bm0 = ninf, bm1 = ninf, s0, s1;
        ATTN_LOAD(mo0, sl->mx + m0);
        ATTN_LOAD(mo1, sl->mx + m0 + ATTN_VL);
        for (int64_t cc = 0; cc < nc; cc++) {
            float *s = sl->St + cc * ATTN_BAND;
            ATTN_LOAD(s0, s);
            ATTN_LOAD(s1, s + ATTN_VL);
            if (masked) {
                attn_vi ci = (attn_vi){0} + (int32_t)cc;
                s0 = ATTN_VSEL(ci <= lim0, s0, ninf);
                s1 = ATTN_VSEL(ci <= lim1, s1, ninf);
                ATTN_STORE(s, s0);
                ATTN_STORE(s + ATTN_VL, s1);
            }
            bm0 = ATTN_VSEL(s0 > bm0, s0, bm0);
            bm1 = ATTN_VSEL(s1 > bm1, s1, bm1);
        }
        attn_vf mn0 = ATTN_VSEL(bm0 > mo0, bm0, mo0), mn1 = ATTN_VSEL(bm1 > mo1, bm1, mo1);
        /* rows that have seen no key yet keep max −inf: shift by 0 so −inf − shift
         * stays −inf (weight 0) instead of NaN */
        attn_vf sh0 = ATTN_VSEL(mn0 == ninf, zero, mn0), sh1 = ATTN_VSEL(mn1 == ninf, zero, mn1);
        attn_vf al0, al1, x, sum0 = zero, sum1 = zero;
        x = mo0 - sh0;
        ATTN_EXP2(al0, x); /* 1 when the max did not move, 0 on the first keys */
        x = mo1 - sh1;
        ATTN_EXP2(al1, x);
        for (int64_t cc = 0; cc < nc; cc++) {
            float *s = sl->St + cc * ATTN_BAND;
            ATTN_LOAD(s0, s);
            ATTN_LOAD(s1, s + ATTN_VL);
            x = s0 - sh0;
            ATTN_EXP2(s0, x);
            x = s1 - sh1;
            ATTN_EXP2(s1, x);
            ATTN_STORE(s, s0);
            ATTN_STORE(s + ATTN_VL, s1);
            sum0 += s0;
            sum1 += s1;
        }
        attn_vf l0, l1;
        ATTN_LOAD(l0, sl->l + m0);
        ATTN_LOAD(l1, sl->l + m0 + ATTN_VL);
        l0 = l0 * al0 + sum0;
        l1 = l1 * al1 + sum1;
        ATTN_STORE(sl->l + m0, l0);
        ATTN_STORE(sl->l + m0 + ATTN_VL, l1);
        ATTN_STORE(sl->mx + m0, mn0);
        ATTN_STORE(sl->mx + m0 + ATTN_VL, mn1);
        for (int64_t d = 0; d < hd; d++) { /* Oᵀ *= alpha */
            attn_vf o0, o1;
            ATTN_LOAD(o0, Ot + d * ATTN_BAND);
            ATTN_LOAD(o1, Ot + d * ATTN_BAND + ATTN_VL);
            o0 *= al0;
            o1 *= al1;
            ATTN_STORE(Ot + d * ATTN_BAND, o0);
            ATTN_STORE(Ot + d * ATTN_BAND + ATTN_VL, o1);
        }
        /* Oᵀ += Vᵀ · Pᵀ */
        for (int d0 = 0; d0 < hd; d0 += ATTN_KT)
            attn_uk_pv(Ot, sl->St, sl->vr, nc, d0, hd - d0 < ATTN_KT ? hd - d0 : ATTN_KT);
    }
}

/* bf16 row [hd] → f32 */
static void attn_bf16_row(float *restrict dst, const ls_bf16 *restrict src, int hd) {
    int d = 0;
    for (; d + ATTN_VL <= hd; d += ATTN_VL) { /* widen the 16-bit lanes, shift into the high half */
        attn_vh h;
        memcpy(&h, src + d, sizeof h);
        attn_vi u = __builtin_convertvector(h, attn_vi) << 16;
        memcpy(dst + d, &u, sizeof u);
    }
    for (; d < hd; d++) dst[d] = ls_bf16_to_f32(src[d]);
}

/* Pad the key (and value) row pointers of a bk-key block to a whole tile (repeating
 * the last row: scores past bk are computed but never read). Both arrays hold BKt. */
static void attn_pad_rows(const float **kr, const float **vr, int64_t bk) {
    for (int64_t i = bk; i % ATTN_KT; i++) kr[i] = kr[bk - 1], vr[i] = vr[bk - 1];
}

/* Row pointers of kv head j for the call's own keys/values s0 .. s0+bk−1. */
static void attn_own_rows(const float **kr, const float **vr, const float *k, const float *v, int j,
                          int64_t kv_ld, int64_t hd, int64_t s0, int64_t bk) {
    for (int64_t i = 0; i < bk; i++) {
        kr[i] = k + (s0 + i) * kv_ld + (int64_t)j * hd;
        vr[i] = v + (s0 + i) * kv_ld + (int64_t)j * hd;
    }
}

/* Row pointers of prefix positions [p0, p0 + bk), kv head j (kv_ld = n_kv·hd): F32
 * pages are read in place, BF16 rows are converted into Kc, Vc [bk, hd]. */
static void attn_prefix_rows(const float **kr, const float **vr, float *Kc, float *Vc,
                             const ls_kv_prefix *pf, int j, int64_t kv_ld, int hd, int64_t p0,
                             int64_t bk) {
    const int64_t S = pf->page_size;
    for (int64_t i = 0; i < bk; i++) {
        int64_t p = p0 + i, off = (p % S) * kv_ld + (int64_t)j * hd;
        if (pf->dtype == LS_DTYPE_BF16) {
            float *kd = Kc + i * hd, *vd = Vc + i * hd;
            attn_bf16_row(kd, (const ls_bf16 *)pf->k_pages[p / S] + off, hd);
            attn_bf16_row(vd, (const ls_bf16 *)pf->v_pages[p / S] + off, hd);
            kr[i] = kd;
            vr[i] = vd;
        } else {
            kr[i] = (const float *)pf->k_pages[p / S] + off;
            vr[i] = (const float *)pf->v_pages[p / S] + off;
        }
    }
}

/* One task: kv head j, query tokens [t0, t1). */
static void attn_task(const attn_ctx *c, const attn_slab *sl, int j, int64_t t0, int64_t t1) {
    const int64_t r = c->r, M = (t1 - t0) * r;
    const int64_t Mp = (M + ATTN_BAND - 1) / ATTN_BAND * ATTN_BAND;
    const int hd = c->hd;
    const int64_t kv_ld = (int64_t)c->n_kv * hd; /* row stride of own keys and of pages */
    /* Qᵀ per band, scaled: row m = (token t0 + m/r, head j·r + m%r); padding rows 0 */
    for (int64_t m = 0; m < Mp; m++) {
        float *qd = sl->Qt + (m / ATTN_BAND) * ATTN_BAND * hd + m % ATTN_BAND; /* stride B */
        if (m < M) {
            const float *qs = c->q + ((t0 + m / r) * c->n_h + (int64_t)j * r + m % r) * hd;
            for (int64_t d = 0; d < hd; d++) qd[d * ATTN_BAND] = qs[d] * c->qscale;
        } else {
            for (int64_t d = 0; d < hd; d++) qd[d * ATTN_BAND] = 0.0f;
        }
        sl->mx[m] = -INFINITY;
        sl->l[m] = 0.0f;
    }
    memset(sl->Ot, 0, (size_t)(Mp * hd) * sizeof(float));
    /* (a) the prefix: visible to every query */
    for (int64_t p0 = 0; p0 < c->n; p0 += ATTN_BK) {
        int64_t bk = c->n - p0 < ATTN_BK ? c->n - p0 : ATTN_BK;
        attn_prefix_rows(sl->kr, sl->vr, sl->Kc, sl->Vc, c->prefix, j, kv_ld, hd, p0, bk);
        attn_pad_rows(sl->kr, sl->vr, bk);
        attn_block(sl, c, Mp, bk, 0, 0);
    }
    /* (b) own keys 0 .. t1−1; the causal mask only where a block reaches past t0 */
    for (int64_t s0 = 0; c->own && s0 < t1; s0 += ATTN_BK) {
        int64_t bk = t1 - s0 < ATTN_BK ? t1 - s0 : ATTN_BK;
        attn_own_rows(sl->kr, sl->vr, c->k, c->v, j, kv_ld, hd, s0, bk);
        attn_pad_rows(sl->kr, sl->vr, bk);
        attn_block(sl, c, Mp, bk, s0 + bk - 1 > t0, s0 - t0);
    }
    /* normalise and write back */
    for (int64_t m = 0; m < M; m++) {
        int64_t t = t0 + m / r, h = (int64_t)j * r + m % r;
        float inv = sl->l[m] > 0 ? 1.0f / sl->l[m] : 0.0f; /* no key seen (empty partial): o = 0 */
        float *od = c->o + (t * c->n_h + h) * hd;
        /* stride B */
        const float *os = sl->Ot + (m / ATTN_BAND) * ATTN_BAND * hd + m % ATTN_BAND;
        for (int64_t d = 0; d < hd; d++) od[d] = os[d * ATTN_BAND] * inv;
        if (c->lse)
            c->lse[t * c->n_h + h] = sl->l[m] > 0 ? (float)(((double)sl->mx[m] + log2((double)sl->l[m])) * ATTN_LN2)
                                                  : -INFINITY;
    }
}

/* Shared argument checks of the tiled and the naive forward. */
static ls_status attn_check(const ls_kv_prefix *prefix, int64_t T, int n_h, int n_kv, int hd) {
    if (T < 0) return ls_err(LS_ERR_ARG, "attention: T = %lld, expected >= 0", (long long)T);
    if (n_h <= 0 || n_kv <= 0 || hd <= 0 || n_h % n_kv != 0)
        return ls_err(LS_ERR_ARG,
                      "attention: n_h = %d, n_kv = %d, hd = %d; expected positive with n_kv | n_h",
                      n_h, n_kv, hd);
    if ((int64_t)n_h * hd > INT_MAX)
        return ls_err(LS_ERR_ARG, "attention: n_h·hd = %lld exceeds int", (long long)n_h * hd);
    if (!prefix) return LS_OK;
    if (prefix->n < 0)
        return ls_err(LS_ERR_ARG, "attention: prefix n = %lld, expected >= 0",
                      (long long)prefix->n);
    if (prefix->n == 0) return LS_OK;
    if (prefix->dtype != LS_DTYPE_F32 && prefix->dtype != LS_DTYPE_BF16)
        return ls_err(LS_ERR_UNSUPPORTED, "attention: prefix dtype %s, expected F32 or BF16",
                      ls_dtype_name(prefix->dtype));
    if (prefix->page_size <= 0)
        return ls_err(LS_ERR_ARG, "attention: page_size = %lld, expected > 0",
                      (long long)prefix->page_size);
    if (!prefix->k_pages || !prefix->v_pages)
        return ls_err(LS_ERR_ARG, "attention: prefix of %lld positions without page tables",
                      (long long)prefix->n);
    int64_t npages = (prefix->n + prefix->page_size - 1) / prefix->page_size;
    for (int64_t i = 0; i < npages; i++)
        if (!prefix->k_pages[i] || !prefix->v_pages[i])
            return ls_err(LS_ERR_ARG, "attention: prefix page %lld of %lld is NULL", (long long)i,
                          (long long)npages);
    return LS_OK;
}

/* Scratch (from `scratch`, released before return), per thread: 2·Mp·hd + 2·Mp +
 * B·BKt + 2·BK·hd floats and 2·BKt row pointers; Mp = Bq·r rounded up to B
 * (Bq·r ≤ max(256, r)), BKt = 256 rounded up to 6. */
static ls_status attn_fwd(float *o, float *lse, const float *q, const float *k, const float *v,
                          const ls_kv_prefix *prefix, int64_t T, int n_h, int n_kv, int hd, float scale, int own,
                          ls_arena *scratch) {
    LS_TRY(attn_check(prefix, T, n_h, n_kv, hd));
    if (T == 0) return LS_OK;
    if (!scratch) return ls_err(LS_ERR_ARG, "attention: no scratch arena");
    LS_ASSERT(o && q && (!own || (k && v)), "attention: NULL tensor");
    const int64_t n = prefix ? prefix->n : 0;
    const int64_t r = n_h / n_kv;

    int nt = 1;
#ifdef _OPENMP
    nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (nt < 1) nt = 1;
#endif
    /* query block: ~ATTN_ROWS stacked rows, but at least 2 tasks per thread when T allows */
    int64_t Bq = ATTN_ROWS / r > 0 ? ATTN_ROWS / r : 1;
    int64_t want_blocks = (2 * (int64_t)nt + n_kv - 1) / n_kv;
    int64_t Bq_par = (T + want_blocks - 1) / want_blocks;
    if (Bq_par < Bq) Bq = Bq_par;
    if (Bq > T) Bq = T;
    const int64_t nqb = (T + Bq - 1) / Bq;
    const int64_t ntasks = nqb * n_kv;
    if (ntasks < nt) nt = (int)ntasks;

    /* per-thread slabs (all factors are ints or small constants; checked anyway) */
    const size_t Mp = (size_t)((Bq * r + ATTN_BAND - 1) / ATTN_BAND * ATTN_BAND);
    const size_t BKt = (size_t)((ATTN_BK + ATTN_KT - 1) / ATTN_KT * ATTN_KT);
    const int bf16 = n > 0 && prefix->dtype == LS_DTYPE_BF16;
    size_t f_q, f_s, f_c;
    if (ls_mul_size(Mp, (size_t)hd * sizeof(float), &f_q) ||
        ls_mul_size(BKt, ATTN_BAND * sizeof(float), &f_s) ||
        ls_mul_size((size_t)ATTN_BK, (size_t)hd * sizeof(float), &f_c))
        return ls_err(LS_ERR_NOMEM, "attention: scratch size overflows (rows %zu, hd %d)", Mp, hd);
    ls_arena_mark mk = ls_arena_get_mark(scratch);
    attn_slab *slabs = ls_arena_alloc(scratch, (size_t)nt * sizeof(attn_slab));
    if (!slabs) return ls_err_ctx(LS_ERR_NOMEM, "attention scratch");
    for (int i = 0; i < nt; i++) {
        attn_slab *sl = &slabs[i];
        sl->Qt = ls_arena_alloc(scratch, f_q);
        sl->Ot = ls_arena_alloc(scratch, f_q);
        sl->mx = ls_arena_alloc(scratch, Mp * sizeof(float));
        sl->l = ls_arena_alloc(scratch, Mp * sizeof(float));
        sl->St = ls_arena_alloc(scratch, f_s);
        sl->Kc = bf16 ? ls_arena_alloc(scratch, f_c) : NULL;
        sl->Vc = bf16 ? ls_arena_alloc(scratch, f_c) : NULL;
        sl->kr = ls_arena_alloc(scratch, BKt * sizeof(float *));
        sl->vr = ls_arena_alloc(scratch, BKt * sizeof(float *));
        if (!sl->Qt || !sl->Ot || !sl->mx || !sl->l || !sl->St || !sl->kr || !sl->vr ||
            (bf16 && (!sl->Kc || !sl->Vc))) {
            ls_arena_release(scratch, mk);
            return ls_err_ctx(LS_ERR_NOMEM, "attention scratch (%d threads)", nt);
        }
    }

    attn_ctx c = {.q = q, .k = k, .v = v, .prefix = prefix, .o = o, .lse = lse, .n = n, .r = r,
                  .n_h = n_h, .n_kv = n_kv, .hd = hd, .own = own,
                  .qscale = (float)((double)scale * ATTN_LOG2E)};
    /* Most expensive (latest) query blocks first, for the dynamic schedule. */
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (int64_t task = 0; task < ntasks; task++) {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        int64_t qb = nqb - 1 - task / n_kv;
        int j = (int)(task % n_kv);
        int64_t t0 = qb * Bq, t1 = t0 + Bq < T ? t0 + Bq : T;
        attn_task(&c, &slabs[tid], j, t0, t1);
    }
    ls_arena_release(scratch, mk);
    return LS_OK;
}

ls_status ls_attn_fwd(float *o, float *lse, const float *q, const float *k, const float *v,
                      const ls_kv_prefix *prefix, int64_t T, int n_h, int n_kv, int hd,
                      float scale, ls_arena *scratch) {
    return attn_fwd(o, lse, q, k, v, prefix, T, n_h, n_kv, hd, scale, 1, scratch);
}

ls_status ls_attn_prefix_fwd(float *o, float *lse, const float *q, const ls_kv_prefix *prefix, int64_t T,
                             int n_h, int n_kv, int hd, float scale, ls_arena *scratch) {
    LS_ASSERT(lse, "a partial needs its log-sum-exp");
    return attn_fwd(o, lse, q, NULL, NULL, prefix, T, n_h, n_kv, hd, scale, 0, scratch);
}

void ls_attn_merge(float *o, float *lse, const float *o2, const float *lse2, int64_t T, int n_h, int hd) {
    const int64_t rows = T * n_h;
#pragma omp parallel for schedule(static) if (rows * hd > 65536)
    for (int64_t i = 0; i < rows; i++) ls_attn_merge_row(o + i * hd, lse + i, o2 + i * hd, lse2[i], hd);
}

/* ---- backward ----------------------------------------------------------------------
 * Flash-attention backward from the saved o and lse (natural log), nothing of size T×n:
 *   P = exp(scale·Q·Kᵀ − lse), D_i = rowsum(dO_i ⊙ O_i), dP = dO·Vᵀ, dS = P ⊙ (dP − D),
 *   dQ = scale·dS·K, dK = scale·dSᵀ·Q, dV = Pᵀ·dO (summed over the r query heads of a kv
 *   head for dK, dV). Two kinds of task, each the only writer of its output rows, so the
 *   dynamic schedule is race-free without atomics or per-thread copies:
 *   - q-task (kv head j, block of query tokens): dQ of its rows over every key they see,
 *     in the forward's orientation (query rows along the lanes: Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ,
 *     dQᵀ += Kᵀ·dSᵀ; the forward's two register kernels, the contraction over keys in
 *     registers). 3 products per score.
 *   - kv-task (kv head j, block of own keys, or of prefix keys when dk_prefix/dv_prefix
 *     are given): dK, dV of its keys over every query that sees them, roles swapped (keys
 *     along the lanes, query rows broadcast: S = Q·Kᵀ, dP = dO·Vᵀ, dVᵀ += dOᵀ·P, dKᵀ +=
 *     Qᵀ·dS; the same two kernels, the contraction over query rows in registers). 4
 *     products per score.
 * In the prefix-frozen objective (dk_prefix = dv_prefix = NULL) the prefix costs 3
 * products per score (dQ only) and own keys 7. A fused pass (5 per score) cannot split a
 * kv head's keys between threads without racing on dQ, so it would use at most n_kv (2)
 * threads; the split keeps every thread busy. Measured (T = 2048 over n = 16384 F32
 * positions, n_h 8, n_kv 2, hd 128, 2 threads): backward 1.56× the forward (3/2 products
 * bound it at 1.5; the own keys, 6% of the scores, take ~17%), 3.4× with prefix
 * gradients; n = 0: 3.5×. Per product the kernels run as fast as in the forward. */

/* Read-only description of one backward call, shared by all tasks. */
typedef struct {
    const float *q;             /* [T, n_h, hd] */
    const float *k, *v;         /* [T, n_kv, hd] own keys/values */
    const float *dout;          /* [T, n_h, hd] */
    const float *lse;           /* [T, n_h] natural log */
    const float *dd;            /* [T, n_h] D = rowsum(dout ⊙ o) */
    const ls_kv_prefix *prefix; /* NULL when n = 0 */
    float *dq;                  /* [T, n_h, hd] */
    float *dk, *dv;             /* [T, n_kv, hd] */
    void *const *dk_prefix;     /* pages [S, n_kv, hd] f32, or NULL */
    void *const *dv_prefix;     /* pages [S, n_kv, hd] f32, or NULL */
    int64_t T, n, r; /* queries, prefix length, query heads per kv head */
    int n_h, n_kv, hd;
    int own;             /* 0: prefix keys only (a CP rank's part), no own keys */
    float scale, qscale; /* scale, scale · log2 e */
} attn_bctx;

/* Per-thread scratch of the backward, carved before the parallel region. A q-task uses
 * Xt, Yt = Qᵀ (scaled), dOᵀ and G1t = dQᵀ, each [Mp/B, hd, B]; a kv-task uses Xt, Yt =
 * Kᵀ (scaled), Vᵀ and G1t, G2t = dKᵀ, dVᵀ, each [BKp/B, hd, B] (keys along the lanes). */
typedef struct {
    float *Xt, *Yt, *G1t, *G2t; /* [Rx, hd] each */
    float *l2, *dd;             /* [Rr] per query row: lse·log2 e, D */
    float *St, *dPt;            /* [Rr, B]: scores → P or dS; dP → dS */
    float *Kc, *Vc;             /* [BK, hd] a BF16 prefix block in f32 (q-tasks) */
    const float **kr, **vr;     /* [Rr] key/value rows (q-task), query/dout rows (kv-task) */
} attn_bslab;

typedef enum { ATTN_BT_Q = 0, ATTN_BT_OWN_KV, ATTN_BT_PREFIX_KV } attn_btask_kind;

typedef struct {
    double cost; /* products × scores, for the largest-first order */
    attn_btask_kind kind;
    int j;         /* kv head */
    int64_t a, b;  /* query tokens [a, b) (q-task) or key positions [a, b) (kv-task) */
} attn_btask;

/* q-task, one key block of bk keys (rows sl->kr, sl->vr) against all bands: dQᵀ += Kᵀ·dSᵀ.
 * masked / diag as in attn_block. */
static void attn_bwd_q_block(const attn_bslab *sl, const attn_bctx *c, int64_t Mp, int64_t bk,
                             int masked, int64_t diag) {
    const int hd = c->hd;
    const int64_t r = c->r;
    const attn_vf ninf = ATTN_SPLAT(-INFINITY);
    for (int64_t m0 = 0; m0 < Mp; m0 += ATTN_BAND) {
        const float *Qt = sl->Xt + m0 * hd, *dOt = sl->Yt + m0 * hd; /* [hd, B] */
        float *dQt = sl->G1t + m0 * hd;                               /* [hd, B] */
        int64_t nc = bk;
        attn_vi lim0 = {0}, lim1 = {0}; /* per-row last visible key, clamped to [−1, bk] */
        if (masked) {
            int64_t hi = (m0 + ATTN_BAND - 1) / r - diag + 1;
            if (hi <= 0) continue;
            if (hi < nc) nc = hi;
            for (int i = 0; i < ATTN_BAND; i++) {
                int64_t li = (m0 + i) / r - diag;
                li = li < -1 ? -1 : li > bk ? bk : li;
                if (i < ATTN_VL) lim0[i] = (int32_t)li;
                else lim1[i - ATTN_VL] = (int32_t)li;
            }
        }
        /* Sᵀ = K·Qᵀ (base-2 scores), dPᵀ = V·dOᵀ, [nc, B] */
        for (int64_t c0 = 0; c0 < nc; c0 += ATTN_KT) {
            attn_uk_qk(sl->St + c0 * ATTN_BAND, Qt, sl->kr + c0, hd);
            attn_uk_qk(sl->dPt + c0 * ATTN_BAND, dOt, sl->vr + c0, hd);
        }
        /* dSᵀ = 2^(Sᵀ − lse·log2 e) ⊙ (dPᵀ − D), in place of Sᵀ */
        attn_vf l0, l1, D0, D1;
        ATTN_LOAD(l0, sl->l2 + m0);
        ATTN_LOAD(l1, sl->l2 + m0 + ATTN_VL);
        ATTN_LOAD(D0, sl->dd + m0);
        ATTN_LOAD(D1, sl->dd + m0 + ATTN_VL);
        for (int64_t cc = 0; cc < nc; cc++) {
            float *s = sl->St + cc * ATTN_BAND;
            const float *g = sl->dPt + cc * ATTN_BAND;
            attn_vf x0, x1, p0, p1, g0, g1;
            ATTN_LOAD(x0, s);
            ATTN_LOAD(x1, s + ATTN_VL);
            ATTN_LOAD(g0, g);
            ATTN_LOAD(g1, g + ATTN_VL);
            x0 -= l0;
            x1 -= l1;
            if (masked) {
                attn_vi ci = (attn_vi){0} + (int32_t)cc;
                x0 = ATTN_VSEL(ci <= lim0, x0, ninf);
                x1 = ATTN_VSEL(ci <= lim1, x1, ninf);
            }
            ATTN_EXP2(p0, x0);
            ATTN_EXP2(p1, x1);
            p0 *= g0 - D0;
            p1 *= g1 - D1;
            ATTN_STORE(s, p0);
            ATTN_STORE(s + ATTN_VL, p1);
        }
        /* dQᵀ += Kᵀ·dSᵀ */
        for (int d0 = 0; d0 < hd; d0 += ATTN_KT)
            attn_uk_pv(dQt, sl->St, sl->kr, nc, d0, hd - d0 < ATTN_KT ? hd - d0 : ATTN_KT);
    }
}

/* q-task: dq (=) of query tokens [t0, t1), the r query heads of kv head j. */
static void attn_bwd_q_task(const attn_bctx *c, const attn_bslab *sl, int j, int64_t t0,
                            int64_t t1) {
    const int64_t r = c->r, M = (t1 - t0) * r;
    const int64_t Mp = (M + ATTN_BAND - 1) / ATTN_BAND * ATTN_BAND;
    const int hd = c->hd;
    const int64_t kv_ld = (int64_t)c->n_kv * hd;
    /* Qᵀ (scaled by scale·log2 e), dOᵀ per band; row m = (token t0 + m/r, head j·r + m%r).
     * Padding rows: Q = dO = 0, lse = D = 0, so their dS is 0. */
    for (int64_t m = 0; m < Mp; m++) {
        int64_t off = (m / ATTN_BAND) * ATTN_BAND * hd + m % ATTN_BAND;
        float *qd = sl->Xt + off, *gd = sl->Yt + off; /* stride B */
        if (m < M) {
            int64_t row = (t0 + m / r) * c->n_h + (int64_t)j * r + m % r;
            const float *qs = c->q + row * hd, *gs = c->dout + row * hd;
            for (int64_t d = 0; d < hd; d++) {
                qd[d * ATTN_BAND] = qs[d] * c->qscale;
                gd[d * ATTN_BAND] = gs[d];
            }
            sl->l2[m] = (float)((double)c->lse[row] * ATTN_LOG2E);
            sl->dd[m] = c->dd[row];
        } else {
            for (int64_t d = 0; d < hd; d++) qd[d * ATTN_BAND] = gd[d * ATTN_BAND] = 0.0f;
            sl->l2[m] = sl->dd[m] = 0.0f;
        }
    }
    memset(sl->G1t, 0, (size_t)(Mp * hd) * sizeof(float));
    /* (a) the prefix, (b) own keys 0 .. t1−1 — the same blocks as the forward */
    for (int64_t p0 = 0; p0 < c->n; p0 += ATTN_BK) {
        int64_t bk = c->n - p0 < ATTN_BK ? c->n - p0 : ATTN_BK;
        attn_prefix_rows(sl->kr, sl->vr, sl->Kc, sl->Vc, c->prefix, j, kv_ld, hd, p0, bk);
        attn_pad_rows(sl->kr, sl->vr, bk);
        attn_bwd_q_block(sl, c, Mp, bk, 0, 0);
    }
    for (int64_t s0 = 0; c->own && s0 < t1; s0 += ATTN_BK) {
        int64_t bk = t1 - s0 < ATTN_BK ? t1 - s0 : ATTN_BK;
        attn_own_rows(sl->kr, sl->vr, c->k, c->v, j, kv_ld, hd, s0, bk);
        attn_pad_rows(sl->kr, sl->vr, bk);
        attn_bwd_q_block(sl, c, Mp, bk, s0 + bk - 1 > t0, s0 - t0);
    }
    /* dq = scale · dQᵀ */
    for (int64_t m = 0; m < M; m++) {
        int64_t row = (t0 + m / r) * c->n_h + (int64_t)j * r + m % r;
        const float *gs = sl->G1t + (m / ATTN_BAND) * ATTN_BAND * hd + m % ATTN_BAND;
        float *gd = c->dq + row * hd;
        for (int64_t d = 0; d < hd; d++) gd[d] = gs[d * ATTN_BAND] * c->scale;
    }
}

/* kv-task: gradients of keys/values [p0, p0 + bk) of kv head j — own keys (dk, dv =) or,
 * when !own, prefix positions (dk_prefix, dv_prefix +=, each only when non-NULL) — over
 * the query tokens that see them, in chunks of Cq tokens. */
static void attn_bwd_kv_task(const attn_bctx *c, const attn_bslab *sl, int j, int own,
                             int64_t p0, int64_t bk, int64_t Cq) {
    const int hd = c->hd;
    const int64_t r = c->r, kv_ld = (int64_t)c->n_kv * hd;
    const int64_t nb = (bk + ATTN_BAND - 1) / ATTN_BAND; /* bands of B keys */
    const int want_dk = own || c->dk_prefix, want_dv = own || c->dv_prefix;
    const ls_kv_prefix *pf = c->prefix;
    const attn_vf ninf = ATTN_SPLAT(-INFINITY);
    attn_vi iota0, iota1; /* lane index of each key in its band */
    for (int i = 0; i < ATTN_VL; i++) iota0[i] = i, iota1[i] = i + ATTN_VL;
    /* Kᵀ (scaled by scale·log2 e), Vᵀ per band of B keys; padding lanes 0 (and masked) */
    for (int64_t i = 0; i < nb * ATTN_BAND; i++) {
        int64_t off = (i / ATTN_BAND) * ATTN_BAND * hd + i % ATTN_BAND;
        float *kd = sl->Xt + off, *vd = sl->Yt + off; /* stride B */
        if (i >= bk) {
            for (int64_t d = 0; d < hd; d++) kd[d * ATTN_BAND] = vd[d * ATTN_BAND] = 0.0f;
        } else if (own) {
            const float *ks = c->k + (p0 + i) * kv_ld + (int64_t)j * hd;
            const float *vs = c->v + (p0 + i) * kv_ld + (int64_t)j * hd;
            for (int64_t d = 0; d < hd; d++) {
                kd[d * ATTN_BAND] = ks[d] * c->qscale;
                vd[d * ATTN_BAND] = vs[d];
            }
        } else {
            int64_t p = p0 + i, S = pf->page_size, po = (p % S) * kv_ld + (int64_t)j * hd;
            if (pf->dtype == LS_DTYPE_BF16) {
                const ls_bf16 *ks = (const ls_bf16 *)pf->k_pages[p / S] + po;
                const ls_bf16 *vs = (const ls_bf16 *)pf->v_pages[p / S] + po;
                for (int64_t d = 0; d < hd; d++) {
                    kd[d * ATTN_BAND] = ls_bf16_to_f32(ks[d]) * c->qscale;
                    vd[d * ATTN_BAND] = ls_bf16_to_f32(vs[d]);
                }
            } else {
                const float *ks = (const float *)pf->k_pages[p / S] + po;
                const float *vs = (const float *)pf->v_pages[p / S] + po;
                for (int64_t d = 0; d < hd; d++) {
                    kd[d * ATTN_BAND] = ks[d] * c->qscale;
                    vd[d * ATTN_BAND] = vs[d];
                }
            }
        }
    }
    memset(sl->G1t, 0, (size_t)(nb * ATTN_BAND * hd) * sizeof(float));
    memset(sl->G2t, 0, (size_t)(nb * ATTN_BAND * hd) * sizeof(float));
    /* own key s is seen by query tokens s .. T−1; prefix keys by all */
    for (int64_t u0 = own ? p0 : 0; u0 < c->T; u0 += Cq) {
        const int64_t u1 = u0 + Cq < c->T ? u0 + Cq : c->T, nm = (u1 - u0) * r;
        /* query rows m = (token u0 + m/r, head j·r + m%r); KT−1 padding rows repeat the last */
        for (int64_t m = 0; m < nm + ATTN_KT - 1; m++) {
            int64_t mm = m < nm ? m : nm - 1;
            int64_t row = (u0 + mm / r) * c->n_h + (int64_t)j * r + mm % r;
            sl->kr[m] = c->q + row * hd;
            sl->vr[m] = c->dout + row * hd;
            sl->l2[m] = (float)((double)c->lse[row] * ATTN_LOG2E);
            sl->dd[m] = c->dd[row];
        }
        for (int64_t b = 0; b < nb; b++) {
            const int64_t kb0 = p0 + b * ATTN_BAND; /* first key of the band */
            const int64_t nv = bk - b * ATTN_BAND < ATTN_BAND ? bk - b * ATTN_BAND : ATTN_BAND;
            /* rows of tokens before kb0 see no key of the band */
            const int64_t ms = own && kb0 > u0 ? (kb0 - u0) * r : 0;
            if (ms >= nm) break; /* nor of any later band */
            /* lanes need a mask where the band is partial or some row's token precedes
             * the band's last key */
            const int masked = nv < ATTN_BAND || (own && u0 + ms / r < kb0 + nv - 1);
            const float *Kt = sl->Xt + b * ATTN_BAND * hd, *Vt = sl->Yt + b * ATTN_BAND * hd;
            float *dKt = sl->G1t + b * ATTN_BAND * hd, *dVt = sl->G2t + b * ATTN_BAND * hd;
            /* S = Q·Kᵀ (base-2), dP = dO·Vᵀ, [nm − ms, B] */
            for (int64_t m0 = ms; m0 < nm; m0 += ATTN_KT) {
                attn_uk_qk(sl->St + m0 * ATTN_BAND, Kt, sl->kr + m0, hd);
                attn_uk_qk(sl->dPt + m0 * ATTN_BAND, Vt, sl->vr + m0, hd);
            }
            /* P = 2^(S − lse·log2 e) in place of S; dS = P ⊙ (dP − D) in place of dP */
            for (int64_t m = ms; m < nm; m++) {
                float *s = sl->St + m * ATTN_BAND, *g = sl->dPt + m * ATTN_BAND;
                const attn_vf lv = ATTN_SPLAT(sl->l2[m]), Dv = ATTN_SPLAT(sl->dd[m]);
                attn_vf x0, x1, p0v, p1v, g0, g1;
                ATTN_LOAD(x0, s);
                ATTN_LOAD(x1, s + ATTN_VL);
                ATTN_LOAD(g0, g);
                ATTN_LOAD(g1, g + ATTN_VL);
                x0 -= lv;
                x1 -= lv;
                if (masked) { /* lanes ≤ min(token − kb0, nv − 1) are visible */
                    int64_t lim = nv - 1;
                    if (own && u0 + m / r - kb0 < lim) lim = u0 + m / r - kb0;
                    const attn_vi lm = (attn_vi){0} + (int32_t)lim;
                    x0 = ATTN_VSEL(iota0 <= lm, x0, ninf);
                    x1 = ATTN_VSEL(iota1 <= lm, x1, ninf);
                }
                ATTN_EXP2(p0v, x0);
                ATTN_EXP2(p1v, x1);
                ATTN_STORE(s, p0v);
                ATTN_STORE(s + ATTN_VL, p1v);
                g0 = p0v * (g0 - Dv);
                g1 = p1v * (g1 - Dv);
                ATTN_STORE(g, g0);
                ATTN_STORE(g + ATTN_VL, g1);
            }
            /* dVᵀ += dOᵀ·P, then dKᵀ += Qᵀ·dS (contraction over the rows; one product at
             * a time keeps the working set in L1) */
            for (int d0 = 0; d0 < hd && want_dv; d0 += ATTN_KT)
                attn_uk_pv(dVt, sl->St + ms * ATTN_BAND, sl->vr + ms, nm - ms, d0,
                           hd - d0 < ATTN_KT ? hd - d0 : ATTN_KT);
            for (int d0 = 0; d0 < hd && want_dk; d0 += ATTN_KT)
                attn_uk_pv(dKt, sl->dPt + ms * ATTN_BAND, sl->kr + ms, nm - ms, d0,
                           hd - d0 < ATTN_KT ? hd - d0 : ATTN_KT);
        }
    }
    /* write back: dk = scale · dKᵀ, dv = dVᵀ (own: =; prefix pages: +=) */
    for (int64_t i = 0; i < bk; i++) {
        int64_t off = (i / ATTN_BAND) * ATTN_BAND * hd + i % ATTN_BAND;
        const float *ks = sl->G1t + off, *vs = sl->G2t + off; /* stride B */
        float *kd, *vd;
        if (own) {
            kd = c->dk + (p0 + i) * kv_ld + (int64_t)j * hd;
            vd = c->dv + (p0 + i) * kv_ld + (int64_t)j * hd;
            for (int64_t d = 0; d < hd; d++) {
                kd[d] = ks[d * ATTN_BAND] * c->scale;
                vd[d] = vs[d * ATTN_BAND];
            }
            continue;
        }
        int64_t p = p0 + i, S = pf->page_size, po = (p % S) * kv_ld + (int64_t)j * hd;
        if (c->dk_prefix) {
            kd = (float *)c->dk_prefix[p / S] + po;
            for (int64_t d = 0; d < hd; d++) kd[d] += ks[d * ATTN_BAND] * c->scale;
        }
        if (c->dv_prefix) {
            vd = (float *)c->dv_prefix[p / S] + po;
            for (int64_t d = 0; d < hd; d++) vd[d] += vs[d * ATTN_BAND];
        }
    }
}

/* Whether task x runs before y: larger cost first, ties in a fixed order (the results
 * do not depend on the order: every task writes its own rows). */
static int attn_btask_before(const attn_btask *x, const attn_btask *y) {
    if (x->cost != y->cost) return x->cost > y->cost;
    if (x->kind != y->kind) return x->kind < y->kind;
    if (x->a != y->a) return x->a < y->a;
    return x->j < y->j;
}

/* In-place heapsort into run order (qsort may malloc). */
static void attn_btask_sort(attn_btask *t, int64_t n) {
    for (int64_t top = n / 2 - 1, end = n; end > 1;) {
        int64_t i;
        if (top >= 0) {
            i = top--; /* building the heap (the root is the task that runs last) */
        } else {
            attn_btask x = t[0]; /* move the root to the end */
            t[0] = t[--end];
            t[end] = x;
            i = 0;
        }
        for (int64_t ch; (ch = 2 * i + 1) < end; i = ch) { /* sift down */
            if (ch + 1 < end && attn_btask_before(&t[ch], &t[ch + 1])) ch++;
            if (!attn_btask_before(&t[i], &t[ch])) break;
            attn_btask x = t[i];
            t[i] = t[ch];
            t[ch] = x;
        }
    }
}

/* dq (=) [T,n_h,hd]; dk, dv (=) [T,n_kv,hd]; dk_prefix, dv_prefix (+=, f32 pages like the
 * prefix, each skipped when NULL). Scratch (from `scratch`, released before return):
 * D [T, n_h] floats, the task list, and per thread 4·Rx·hd + 2·Rr·(B + 1) floats,
 * 2·Rr row pointers and (BF16 prefix) 2·BK·hd floats; Rx = max(Mp, 256) rows,
 * Rr = max(Mp, BKt, Cq·r + 5) with Mp ≤ max(256, r) rounded up to B, Cq·r ≤ max(256, r). */
static ls_status attn_bwd(float *dq, float *dk, float *dv, void *const *dk_prefix, void *const *dv_prefix,
                          const float *dout, const float *o, const float *lse, const float *q, const float *k,
                          const float *v, const ls_kv_prefix *prefix, int64_t T, int n_h, int n_kv, int hd,
                          float scale, int own, ls_arena *scratch) {
    LS_TRY(attn_check(prefix, T, n_h, n_kv, hd));
    if (T == 0) return LS_OK;
    if (!scratch) return ls_err(LS_ERR_ARG, "attention backward: no scratch arena");
    LS_ASSERT(dq && dout && o && lse && q && (!own || (dk && dv && k && v)),
              "attention backward: NULL tensor");
    const int64_t n = prefix ? prefix->n : 0;
    const int64_t r = n_h / n_kv;
    const int pgrad = n > 0 && (dk_prefix || dv_prefix);
    if (pgrad) {
        const int64_t npages = (n + prefix->page_size - 1) / prefix->page_size;
        for (int64_t i = 0; i < npages; i++)
            if ((dk_prefix && !dk_prefix[i]) || (dv_prefix && !dv_prefix[i]))
                return ls_err(LS_ERR_ARG,
                              "attention backward: prefix gradient page %lld of %lld is NULL",
                              (long long)i, (long long)npages);
    }

    int nt = 1;
#ifdef _OPENMP
    nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (nt < 1) nt = 1;
#endif
    /* q-task blocks as in the forward; own key blocks likewise at least 2 per thread
     * when T allows (whole bands); prefix key blocks of BK */
    const int64_t want_blocks = (2 * (int64_t)nt + n_kv - 1) / n_kv;
    int64_t Bq = ATTN_ROWS / r > 0 ? ATTN_ROWS / r : 1;
    const int64_t Bq_par = (T + want_blocks - 1) / want_blocks;
    if (Bq_par < Bq) Bq = Bq_par;
    if (Bq > T) Bq = T;
    int64_t Bk = (T + want_blocks - 1) / want_blocks;
    Bk = (Bk + ATTN_BAND - 1) / ATTN_BAND * ATTN_BAND;
    if (Bk > ATTN_BK) Bk = ATTN_BK;
    const int64_t Cq = ATTN_ROWS / r > 0 ? ATTN_ROWS / r : 1; /* query tokens per chunk */
    const int64_t nqb = (T + Bq - 1) / Bq, nkb = own ? (T + Bk - 1) / Bk : 0;
    const int64_t npb = pgrad ? (n + ATTN_BK - 1) / ATTN_BK : 0;
    const int64_t ntasks = (nqb + nkb + npb) * n_kv;
    if (ntasks < nt) nt = (int)ntasks;

    /* sizes (factors are ints or small constants; checked anyway) */
    const size_t Mp = (size_t)((Bq * r + ATTN_BAND - 1) / ATTN_BAND * ATTN_BAND);
    const size_t BKt = (size_t)((ATTN_BK + ATTN_KT - 1) / ATTN_KT * ATTN_KT);
    const size_t BKp = (size_t)((ATTN_BK + ATTN_BAND - 1) / ATTN_BAND * ATTN_BAND);
    const size_t Rx = Mp > BKp ? Mp : BKp;
    size_t Rr = (size_t)(Cq * r + ATTN_KT - 1);
    if (Rr < Mp) Rr = Mp;
    if (Rr < BKt) Rr = BKt;
    const int bf16 = n > 0 && prefix->dtype == LS_DTYPE_BF16;
    size_t f_x, f_s, f_c, f_d, f_t;
    if (ls_mul_size(Rx, (size_t)hd * sizeof(float), &f_x) ||
        ls_mul_size(Rr, ATTN_BAND * sizeof(float), &f_s) ||
        ls_mul_size((size_t)ATTN_BK, (size_t)hd * sizeof(float), &f_c) ||
        ls_mul_size((size_t)T, (size_t)n_h * sizeof(float), &f_d) ||
        ls_mul_size((size_t)ntasks, sizeof(attn_btask), &f_t))
        return ls_err(LS_ERR_NOMEM,
                      "attention backward: scratch size overflows (T %lld, rows %zu, hd %d)",
                      (long long)T, Rr, hd);
    ls_arena_mark mk = ls_arena_get_mark(scratch);
    float *dd = ls_arena_alloc(scratch, f_d);
    attn_btask *tasks = ls_arena_alloc(scratch, f_t);
    attn_bslab *slabs = ls_arena_alloc(scratch, (size_t)nt * sizeof(attn_bslab));
    if (!dd || !tasks || !slabs) {
        ls_arena_release(scratch, mk);
        return ls_err_ctx(LS_ERR_NOMEM, "attention backward scratch");
    }
    for (int i = 0; i < nt; i++) {
        attn_bslab *sl = &slabs[i];
        sl->Xt = ls_arena_alloc(scratch, f_x);
        sl->Yt = ls_arena_alloc(scratch, f_x);
        sl->G1t = ls_arena_alloc(scratch, f_x);
        sl->G2t = ls_arena_alloc(scratch, f_x);
        sl->l2 = ls_arena_alloc(scratch, Rr * sizeof(float));
        sl->dd = ls_arena_alloc(scratch, Rr * sizeof(float));
        sl->St = ls_arena_alloc(scratch, f_s);
        sl->dPt = ls_arena_alloc(scratch, f_s);
        sl->Kc = bf16 ? ls_arena_alloc(scratch, f_c) : NULL;
        sl->Vc = bf16 ? ls_arena_alloc(scratch, f_c) : NULL;
        sl->kr = ls_arena_alloc(scratch, Rr * sizeof(float *));
        sl->vr = ls_arena_alloc(scratch, Rr * sizeof(float *));
        if (!sl->Xt || !sl->Yt || !sl->G1t || !sl->G2t || !sl->l2 || !sl->dd || !sl->St ||
            !sl->dPt || !sl->kr || !sl->vr || (bf16 && (!sl->Kc || !sl->Vc))) {
            ls_arena_release(scratch, mk);
            return ls_err_ctx(LS_ERR_NOMEM, "attention backward scratch (%d threads)", nt);
        }
    }

    /* tasks with their cost (products × visible scores), largest first */
    int64_t nk = 0;
    for (int j = 0; j < n_kv; j++) {
        for (int64_t t0 = 0; t0 < T; t0 += Bq) {
            int64_t t1 = t0 + Bq < T ? t0 + Bq : T;
            tasks[nk++] = (attn_btask){3.0 * (double)((t1 - t0) * r) *
                                           ((double)n + 0.5 * (double)(t0 + t1)),
                                       ATTN_BT_Q, j, t0, t1};
        }
        for (int64_t s0 = 0; own && s0 < T; s0 += Bk) {
            int64_t s1 = s0 + Bk < T ? s0 + Bk : T;
            tasks[nk++] = (attn_btask){4.0 * (double)((s1 - s0) * r) *
                                           ((double)T - 0.5 * (double)(s0 + s1)),
                                       ATTN_BT_OWN_KV, j, s0, s1};
        }
        for (int64_t p0 = 0; p0 < n && pgrad; p0 += ATTN_BK) {
            int64_t p1 = p0 + ATTN_BK < n ? p0 + ATTN_BK : n;
            double prods = 2.0 + (dk_prefix != NULL) + (dv_prefix != NULL);
            tasks[nk++] = (attn_btask){prods * (double)((p1 - p0) * r) * (double)T,
                                       ATTN_BT_PREFIX_KV, j, p0, p1};
        }
    }
    LS_ASSERT(nk == ntasks, "attention backward: %lld tasks, expected %lld", (long long)nk,
              (long long)ntasks);
    attn_btask_sort(tasks, ntasks);

    /* D = rowsum(dout ⊙ o) per (token, head) */
    const int64_t rows = T * n_h;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t i = 0; i < rows; i++) {
        const float *a = dout + i * hd, *b = o + i * hd;
        double acc = 0;
        for (int64_t d = 0; d < hd; d++) acc += (double)a[d] * b[d];
        dd[i] = (float)acc;
    }

    attn_bctx c = {.q = q, .k = k, .v = v, .dout = dout, .lse = lse, .dd = dd,
                   .prefix = prefix, .dq = dq, .dk = dk, .dv = dv,
                   .dk_prefix = pgrad ? dk_prefix : NULL, .dv_prefix = pgrad ? dv_prefix : NULL,
                   .T = T, .n = n, .r = r, .n_h = n_h, .n_kv = n_kv, .hd = hd, .own = own, .scale = scale,
                   .qscale = (float)((double)scale * ATTN_LOG2E)};
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (int64_t i = 0; i < ntasks; i++) {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        const attn_btask *tk = &tasks[i];
        if (tk->kind == ATTN_BT_Q)
            attn_bwd_q_task(&c, &slabs[tid], tk->j, tk->a, tk->b);
        else
            attn_bwd_kv_task(&c, &slabs[tid], tk->j, tk->kind == ATTN_BT_OWN_KV, tk->a,
                             tk->b - tk->a, Cq);
    }
    ls_arena_release(scratch, mk);
    return LS_OK;
}

ls_status ls_attn_bwd(float *dq, float *dk, float *dv, void *const *dk_prefix,
                      void *const *dv_prefix, const float *dout, const float *o, const float *lse,
                      const float *q, const float *k, const float *v, const ls_kv_prefix *prefix,
                      int64_t T, int n_h, int n_kv, int hd, float scale, ls_arena *scratch) {
    return attn_bwd(dq, dk, dv, dk_prefix, dv_prefix, dout, o, lse, q, k, v, prefix, T, n_h, n_kv, hd, scale, 1,
                    scratch);
}

ls_status ls_attn_prefix_bwd(float *dq, void *const *dk_prefix, void *const *dv_prefix, const float *dout,
                             const float *o, const float *lse, const float *q, const ls_kv_prefix *prefix,
                             int64_t T, int n_h, int n_kv, int hd, float scale, ls_arena *scratch) {
    return attn_bwd(dq, NULL, NULL, dk_prefix, dv_prefix, dout, o, lse, q, NULL, NULL, prefix, T, n_h, n_kv, hd,
                    scale, 0, scratch);
}

/* Prefix element (position p, kv head j, dim d) as double. */
static double attn_prefix_at(const ls_kv_prefix *pf, void *const *pages, int64_t p, int j,
                             int n_kv, int hd, int d) {
    int64_t S = pf->page_size;
    int64_t off = ((p % S) * n_kv + j) * hd + d;
    if (pf->dtype == LS_DTYPE_BF16) return ls_bf16_to_f32(((const ls_bf16 *)pages[p / S])[off]);
    return ((const float *)pages[p / S])[off];
}

/* Reference: per (query, head) the full score row in double (malloc, O(n + T)). */
void ls_attn_naive(float *o, float *lse, const float *q, const float *k, const float *v,
                   const ls_kv_prefix *prefix, int64_t T, int n_h, int n_kv, int hd, float scale) {
    ls_status st = attn_check(prefix, T, n_h, n_kv, hd);
    LS_ASSERT(st == LS_OK, "%s", ls_err_msg());
    const int64_t n = prefix ? prefix->n : 0;
    const int r = n_h / n_kv;
    double *s = malloc((size_t)(n + T) * sizeof(double));  /* [n + T] scores */
    double *acc = malloc((size_t)hd * sizeof(double));     /* [hd] */
    LS_ASSERT(s && acc, "naive attention: out of memory");
    for (int64_t t = 0; t < T; t++) {
        for (int h = 0; h < n_h; h++) {
            const int j = h / r;
            const float *qt = q + (t * n_h + h) * hd;
            const int64_t nk = n + t + 1; /* visible keys: prefix, then own 0..t */
            double mx = -INFINITY;
            for (int64_t p = 0; p < nk; p++) {
                double dot = 0;
                for (int d = 0; d < hd; d++) {
                    double kd = p < n ? attn_prefix_at(prefix, prefix->k_pages, p, j, n_kv, hd, d)
                                      : k[((p - n) * n_kv + j) * hd + d];
                    dot += (double)qt[d] * kd;
                }
                s[p] = (double)scale * dot;
                if (s[p] > mx) mx = s[p];
            }
            double sum = 0;
            for (int d = 0; d < hd; d++) acc[d] = 0;
            for (int64_t p = 0; p < nk; p++) {
                double w = exp(s[p] - mx);
                sum += w;
                for (int d = 0; d < hd; d++) {
                    double vd = p < n ? attn_prefix_at(prefix, prefix->v_pages, p, j, n_kv, hd, d)
                                      : v[((p - n) * n_kv + j) * hd + d];
                    acc[d] += w * vd;
                }
            }
            for (int d = 0; d < hd; d++) o[(t * n_h + h) * hd + d] = (float)(acc[d] / sum);
            if (lse) lse[t * n_h + h] = (float)(mx + log(sum));
        }
    }
    free(acc);
    free(s);
}
