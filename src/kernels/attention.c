/*
 * attention.c — the core softmax attention of the gated full-attention layer
 * (specs/hybrid-qwen3next.md §4 step 4; projections, norms, RoPE and the gate live
 * elsewhere): causal GQA attention of T new queries over a paged KV prefix plus
 * their own keys.
 *
 * ls_attn_fwd is a tiled online softmax (flash-attention style). One task is a
 * (kv head j, block of Bq query tokens) pair; the r = n_h/n_kv query heads that
 * share kv head j are stacked into the rows, M = Bq·r. The task walks key blocks
 * (prefix first, then its own keys up to the diagonal): S = Q·Kᵀ and O += P·V are
 * cblas_sgemm calls on the calling thread (OpenBLAS OpenMP build), between which
 * each row keeps a running max and sum. Scores are kept in base 2 (q is scaled by
 * scale·log2 e once) so the weights are plain 2^x. Memory per thread is
 * O(M·(hd + BK)); nothing of size T×n or T×T is ever formed.
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

#include "longstraw/kernels.h"

/* After kernels.h: cblas.h pulls in <complex.h>, whose `I` macro would break the
 * parameter named I in kernels.h. */
#include <cblas.h>

/* Target rows per task (Bq·r) and the key block for own keys and gathered pages. */
#ifdef ATTN_TUNE
static int64_t attn_rows = 256, attn_bk = 128, attn_direct = 32;
#define ATTN_ROWS attn_rows
#define ATTN_BK attn_bk
#define ATTN_MIN_DIRECT_PAGE attn_direct
#else
#define ATTN_ROWS 256
#define ATTN_BK 128
#endif
/* F32 pages at least this long are read in place (one key block never crosses a
 * page); shorter ones, and all BF16 pages, are gathered into a [BK, hd] f32 tile. */
#ifndef ATTN_TUNE
#define ATTN_MIN_DIRECT_PAGE 32
#endif

#define ATTN_LOG2E 1.4426950408889634
#define ATTN_LN2 0.6931471805599453

/* Read-only description of one call, shared by all tasks. */
typedef struct {
    const float *q;             /* [T, n_h, hd] */
    const float *k, *v;         /* [T, n_kv, hd] own keys/values */
    const ls_kv_prefix *prefix; /* NULL when n = 0 */
    float *o;                   /* [T, n_h, hd] */
    float *lse;                 /* [T, n_h] or NULL */
    int64_t T, n, Bq, r;
    int n_h, n_kv, hd;
    float qscale; /* scale · log2 e */
} attn_ctx;

/* Per-thread scratch, carved from the arena before the parallel region. */
typedef struct {
    float *Q;  /* [M, hd]  scaled queries of the task */
    float *O;  /* [M, hd]  unnormalised output accumulator */
    float *P;  /* [M, BK]  scores, then weights */
    float *mx; /* [M]      running max (base 2) */
    float *l;  /* [M]      running sum of 2^(s − mx) */
    float *Kt; /* [BK, hd] gathered keys (f32) */
    float *Vt; /* [BK, hd] gathered values (f32) */
} attn_slab;

/* The softmax of a score row uses GCC vector extensions (8 lanes of f32: one AVX2
 * register, two SSE ones without -march): the -O2 cost model does not vectorise
 * loops of unknown trip count, and this part runs once per score, between the two
 * sgemm calls. Vectors stay local (macros, no vector arguments) so the code does
 * not depend on the vector calling convention (-Wpsabi). */
#define ATTN_VL 8
typedef float attn_vf __attribute__((vector_size(ATTN_VL * sizeof(float))));
typedef int32_t attn_vi __attribute__((vector_size(ATTN_VL * sizeof(int32_t))));
/* mask ? a : b lane-wise, mask lanes all-ones or zero (a vector comparison) */
#define ATTN_VSEL(mask, a, b) ((attn_vf)(((attn_vi)(a) & (mask)) | ((attn_vi)(b) & ~(mask))))

/* Max of s[0, len), len a multiple of ATTN_VL; NaN lanes are skipped. */
static float attn_row_max(const float *s, int64_t len) {
    attn_vf m = (attn_vf){0} - INFINITY, x;
    for (int64_t c = 0; c < len; c += ATTN_VL) {
        memcpy(&x, s + c, sizeof x);
        m = ATTN_VSEL(x > m, x, m);
    }
    float r = m[0];
    for (int i = 1; i < ATTN_VL; i++) r = m[i] > r ? m[i] : r;
    return r;
}

/* s[c] = 2^(s[c] − shift) in place over [0, len), len a multiple of ATTN_VL; returns
 * the sum. Arguments are ≤ 0 (shift is the running max). Cephes exp2f polynomial on
 * [−½, ½] (relative error ~2e−7), exponent by bit construction; x < −126 gives 0 (so
 * −inf padding gives 0) and NaN stays NaN. */
static float attn_row_exp2_sum(float *s, int64_t len, float shift) {
    const attn_vf lo = (attn_vf){0} - 126.0f, zero = {0};
    attn_vf acc = zero, x;
    for (int64_t c = 0; c < len; c += ATTN_VL) {
        memcpy(&x, s + c, sizeof x);
        x -= shift;
        attn_vf xc = ATTN_VSEL(x > lo, x, lo);                       /* NaN → −126 */
        attn_vi kk = __builtin_convertvector(xc + 127.5f, attn_vi);  /* round(xc)+127 ∈ [1,127] */
        attn_vf f = xc - __builtin_convertvector(kk - 127, attn_vf); /* ∈ [−½, ½] */
        attn_vf p = ((((1.535336188319500e-4f * f + 1.339887440266574e-3f) * f +
                       9.618437357674640e-3f) * f + 5.550332471162809e-2f) * f +
                     2.402264791363012e-1f) * f + 6.931472028550421e-1f;
        p = 1.0f + f * p;
        attn_vf y = p * (attn_vf)(kk << 23);
        y = ATTN_VSEL(x < lo, zero, y);
        y = ATTN_VSEL(x == x, y, x);
        memcpy(s + c, &y, sizeof y);
        acc += y;
    }
    float r = 0.0f;
    for (int i = 0; i < ATTN_VL; i++) r += acc[i];
    return r;
}

/* One key block of bk keys: S = Q·Kᵀ, online-softmax update, O += P·V. kp/vp
 * point at key 0 of the block with row strides ldk/ldv. When `masked`, the block
 * holds own keys whose first one is `diag` tokens after the block's first query
 * (diag may be negative), and row m (query token m/r of the block) sees only keys
 * c ≤ m/r − diag; rows that see none of them (m/r < diag) are left out. */
static void attn_block(const attn_slab *sl, int64_t M, int64_t r, int hd, const float *kp,
                       int64_t ldk, const float *vp, int64_t ldv, int64_t bk, int masked,
                       int64_t diag) {
    int64_t row_lo = masked && diag > 0 ? diag * r : 0;
    if (row_lo >= M) return;
    int64_t rows = M - row_lo;
    float *P = sl->P + row_lo * ATTN_BK; /* [rows, BK] */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)bk, hd, 1.0f,
                sl->Q + row_lo * hd, hd, kp, (int)ldk, 0.0f, P, ATTN_BK);
    for (int64_t m = row_lo; m < M; m++) {
        float *s = sl->P + m * ATTN_BK; /* [bk] */
        int64_t nv = bk;
        if (masked) {
            nv = m / r - diag + 1;
            if (nv > bk) nv = bk;
        }
        /* nv ≥ 1 here (rows that see no key lie below row_lo). Pad the row with −inf
         * to whole vectors (ATTN_BK is a multiple of ATTN_VL): they become 0. */
        int64_t len = (nv + ATTN_VL - 1) / ATTN_VL * ATTN_VL;
        for (int64_t c = nv; c < len; c++) s[c] = -INFINITY;
        float bmax = attn_row_max(s, len);
        float m_old = sl->mx[m];
        float m_new = bmax > m_old ? bmax : m_old;
        float sum = attn_row_exp2_sum(s, len, m_new);
        if (len < bk) memset(s + len, 0, (size_t)(bk - len) * sizeof(float));
        if (m_new != m_old) {
            float alpha = exp2f(m_old - m_new); /* 0 on the first block (m_old = −inf) */
            sl->l[m] = sl->l[m] * alpha + sum;
            sl->mx[m] = m_new;
            float *orow = sl->O + m * hd;
            for (int d = 0; d < hd; d++) orow[d] *= alpha;
        } else {
            sl->l[m] += sum;
        }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, hd, (int)bk, 1.0f, P,
                ATTN_BK, vp, (int)ldv, 1.0f, sl->O + row_lo * hd, hd);
}

/* Gather prefix positions [p0, p0+bk) of kv head j into Kt/Vt [bk, hd] as f32. */
static void attn_gather(const attn_slab *sl, const ls_kv_prefix *pf, int j, int n_kv, int hd,
                        int64_t p0, int64_t bk) {
    int64_t S = pf->page_size;
    for (int64_t i = 0; i < bk; i++) {
        int64_t p = p0 + i;
        int64_t off = ((p % S) * n_kv + j) * hd;
        float *kd = sl->Kt + i * hd, *vd = sl->Vt + i * hd;
        if (pf->dtype == LS_DTYPE_BF16) {
            const ls_bf16 *ks = (const ls_bf16 *)pf->k_pages[p / S] + off;
            const ls_bf16 *vs = (const ls_bf16 *)pf->v_pages[p / S] + off;
            for (int d = 0; d < hd; d++) kd[d] = ls_bf16_to_f32(ks[d]);
            for (int d = 0; d < hd; d++) vd[d] = ls_bf16_to_f32(vs[d]);
        } else {
            memcpy(kd, (const float *)pf->k_pages[p / S] + off, (size_t)hd * sizeof(float));
            memcpy(vd, (const float *)pf->v_pages[p / S] + off, (size_t)hd * sizeof(float));
        }
    }
}

/* One task: kv head j, query tokens [t0, t1). */
static void attn_task(const attn_ctx *c, const attn_slab *sl, int j, int64_t t0, int64_t t1) {
    const int64_t r = c->r, M = (t1 - t0) * r;
    const int hd = c->hd;
    const int64_t kv_ld = (int64_t)c->n_kv * hd; /* row stride of own keys and F32 pages */
    /* scaled queries: row m = (token t0 + m/r, head j·r + m%r) */
    for (int64_t t = t0; t < t1; t++) {
        const float *qs = c->q + (t * c->n_h + (int64_t)j * r) * hd; /* [r, hd], contiguous */
        float *qd = sl->Q + (t - t0) * r * hd;
        for (int64_t i = 0; i < r * hd; i++) qd[i] = qs[i] * c->qscale;
    }
    memset(sl->O, 0, (size_t)(M * hd) * sizeof(float));
    for (int64_t m = 0; m < M; m++) {
        sl->mx[m] = -INFINITY;
        sl->l[m] = 0.0f;
    }
    /* (a) the prefix: visible to every query */
    const ls_kv_prefix *pf = c->prefix;
    if (c->n > 0) {
        const int64_t S = pf->page_size;
        const int direct = pf->dtype == LS_DTYPE_F32 && S >= ATTN_MIN_DIRECT_PAGE;
        for (int64_t p0 = 0; p0 < c->n;) {
            int64_t p1 = p0 + ATTN_BK < c->n ? p0 + ATTN_BK : c->n;
            if (direct) {
                int64_t page_end = (p0 / S + 1) * S;
                if (p1 > page_end) p1 = page_end;
                int64_t off = ((p0 % S) * c->n_kv + j) * hd;
                attn_block(sl, M, r, hd, (const float *)pf->k_pages[p0 / S] + off, kv_ld,
                           (const float *)pf->v_pages[p0 / S] + off, kv_ld, p1 - p0, 0, 0);
            } else {
                attn_gather(sl, pf, j, c->n_kv, hd, p0, p1 - p0);
                attn_block(sl, M, r, hd, sl->Kt, hd, sl->Vt, hd, p1 - p0, 0, 0);
            }
            p0 = p1;
        }
    }
    /* (b) own keys 0 .. t1−1; the causal mask only where a block reaches past t0 */
    for (int64_t s0 = 0; s0 < t1; s0 += ATTN_BK) {
        int64_t bk = t1 - s0 < ATTN_BK ? t1 - s0 : ATTN_BK;
        int masked = s0 + bk - 1 > t0; /* the last key lies after the first query */
        const float *kp = c->k + (s0 * c->n_kv + j) * hd, *vp = c->v + (s0 * c->n_kv + j) * hd;
        attn_block(sl, M, r, hd, kp, kv_ld, vp, kv_ld, bk, masked, s0 - t0);
    }
    /* normalise and write back */
    for (int64_t m = 0; m < M; m++) {
        int64_t t = t0 + m / r, h = (int64_t)j * r + m % r;
        float inv = 1.0f / sl->l[m];
        float *od = c->o + (t * c->n_h + h) * hd;
        const float *os = sl->O + m * hd;
        for (int d = 0; d < hd; d++) od[d] = os[d] * inv;
        if (c->lse) c->lse[t * c->n_h + h] = (float)(((double)sl->mx[m] + log2((double)sl->l[m])) * ATTN_LN2);
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
        return ls_err(LS_ERR_ARG, "attention: prefix n = %lld, expected >= 0", (long long)prefix->n);
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

/* Scratch (from `scratch`, released before return): per thread
 * 2·M·hd + M·BK + 2·M + 2·BK·hd floats, M = Bq·r ≤ max(256, r). */
ls_status ls_attn_fwd(float *o, float *lse, const float *q, const float *k, const float *v,
                      const ls_kv_prefix *prefix, int64_t T, int n_h, int n_kv, int hd,
                      float scale, ls_arena *scratch) {
    LS_TRY(attn_check(prefix, T, n_h, n_kv, hd));
    if (T == 0) return LS_OK;
#ifdef ATTN_TUNE
    if (getenv("ATTN_ROWS")) attn_rows = atoi(getenv("ATTN_ROWS"));
    if (getenv("ATTN_BK")) attn_bk = atoi(getenv("ATTN_BK"));
    if (getenv("ATTN_DIRECT")) attn_direct = atoi(getenv("ATTN_DIRECT"));
#endif
    if (!scratch) return ls_err(LS_ERR_ARG, "attention: no scratch arena");
    LS_ASSERT(o && q && k && v, "attention: NULL tensor");
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

    /* per-thread slabs */
    const size_t Mmax = (size_t)(Bq * r);
    size_t f_qo, f_p, f_kv;
    if (ls_mul_size(Mmax, (size_t)hd, &f_qo) || ls_mul_size(Mmax, ATTN_BK, &f_p) ||
        ls_mul_size(ATTN_BK, (size_t)hd, &f_kv) || f_qo > SIZE_MAX / 64 || f_p > SIZE_MAX / 64)
        return ls_err(LS_ERR_NOMEM, "attention: scratch size overflows (M = %zu, hd = %d)", Mmax, hd);
    ls_arena_mark mk = ls_arena_get_mark(scratch);
    attn_slab *slabs = ls_arena_alloc(scratch, (size_t)nt * sizeof(attn_slab));
    if (!slabs) return ls_err_ctx(LS_ERR_NOMEM, "attention scratch");
    for (int i = 0; i < nt; i++) {
        attn_slab *sl = &slabs[i];
        sl->Q = ls_arena_alloc(scratch, f_qo * sizeof(float));
        sl->O = ls_arena_alloc(scratch, f_qo * sizeof(float));
        sl->P = ls_arena_alloc(scratch, f_p * sizeof(float));
        sl->mx = ls_arena_alloc(scratch, Mmax * sizeof(float));
        sl->l = ls_arena_alloc(scratch, Mmax * sizeof(float));
        sl->Kt = ls_arena_alloc(scratch, f_kv * sizeof(float));
        sl->Vt = ls_arena_alloc(scratch, f_kv * sizeof(float));
        if (!sl->Q || !sl->O || !sl->P || !sl->mx || !sl->l || !sl->Kt || !sl->Vt) {
            ls_arena_release(scratch, mk);
            return ls_err_ctx(LS_ERR_NOMEM, "attention scratch (%d threads)", nt);
        }
    }

    attn_ctx c = {.q = q, .k = k, .v = v, .prefix = prefix, .o = o, .lse = lse, .T = T, .n = n,
                  .Bq = Bq, .r = r, .n_h = n_h, .n_kv = n_kv, .hd = hd,
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
