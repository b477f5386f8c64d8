/*
 * mla_attn.c — sparse MLA attention in the absorbed ("MQA") form
 * (specs/mla-dsa-moe.md §2 "Absorbed", §3 "Top-k"): one shared key row per position,
 * [c_kv (rkv) ; k_pe (dr)], which is also the value (its first rkv values); each
 * head's query is [q̃ = W_UKᵀ q_nope ; q_pe]. A query attends only to the positions
 * its indexer selected. Keys of positions below pos0 come from pages (the prompt
 * state), the others from the call's own rows.
 */
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/vec.h"
#include "longstraw/kernels.h"

/* The key row of position p: a page row (converted into tmp) or an own row (latent rows
 * of dk values, or index keys of dI). */
static const float *key_row(const ls_kv_prefix *pf, const float *own, int64_t pos0, int64_t p, int dk, float *tmp) {
    if (p >= pos0) return own + (p - pos0) * dk;
    const char *page = (const char *)pf->k_pages[p / pf->page_size];
    size_t off = (size_t)(p % pf->page_size) * (size_t)dk * ls_dtype_size(pf->dtype);
    ls_convert_to_f32(tmp, page + off, pf->dtype, (size_t)dk);
    return tmp;
}

/* The selected rows of one query, gathered (converted once for every head): K [n, dk]. */
static int64_t gather(float *K, const ls_kv_prefix *pf, const float *own, int64_t pos0, const int32_t *sel, int64_t k,
                      int dk) {
    int64_t n = 0;
    for (; n < k && sel[n] >= 0; n++) {
        const float *r = key_row(pf, own, pos0, sel[n], dk, K + n * dk);
        if (r != K + n * dk) memcpy(K + n * dk, r, (size_t)dk * sizeof(float));
    }
    return n;
}

/* The prefix rows a call's queries select, readable as f32 once for the call: f32 pages
 * in place; a bf16 row converted once into buf (slot[p]: its row + 1, 0: not selected),
 * not once for every query that selects it — unless those rows would take more than
 * MLA_ROWS_MAX_BYTES, when each query converts its own (buf NULL). */
#define MLA_ROWS_MAX_BYTES ((size_t)256 << 20)
typedef struct {
    uint32_t *slot;
    float *buf;
} prefix_rows;

static void prefix_rows_begin(prefix_rows *pr, const ls_kv_prefix *pf, const int32_t *sel, int64_t k, int64_t T,
                              int64_t pos0, int dk) {
    pr->slot = NULL, pr->buf = NULL;
    if (!pf || pos0 <= 0 || pf->dtype == LS_DTYPE_F32 || T * k < 2 * pos0 / 8) return; /* (few queries: not worth it) */
    uint32_t *slot = calloc((size_t)pos0, sizeof(uint32_t));
    if (!slot) return;
    int64_t nd = 0;
    for (int64_t i = 0; i < T * k; i++) {
        int64_t p = sel[i];
        if (p >= 0 && p < pos0 && !slot[p]) slot[p] = (uint32_t)++nd;
    }
    float *buf = nd > 0 && (size_t)nd * (size_t)dk * sizeof(float) <= MLA_ROWS_MAX_BYTES
                     ? malloc((size_t)nd * (size_t)dk * sizeof(float))
                     : NULL;
    if (!buf) {
        free(slot);
        return;
    }
    size_t esz = ls_dtype_size(pf->dtype);
#pragma omp parallel for schedule(static) if (nd > 1024)
    for (int64_t p = 0; p < pos0; p++)
        if (slot[p]) {
            const char *page = (const char *)pf->k_pages[p / pf->page_size];
            ls_convert_to_f32(buf + (int64_t)(slot[p] - 1) * dk, page + (size_t)(p % pf->page_size) * (size_t)dk * esz,
                              pf->dtype, (size_t)dk);
        }
    pr->slot = slot, pr->buf = buf;
}

static void prefix_rows_end(prefix_rows *pr) {
    free(pr->slot);
    free(pr->buf);
}

/* The rows one query selected, as pointers rp[0..n) (returned n): own rows and f32 pages
 * in place, converted rows from pr, else converted into K [k, dk]. */
static int64_t select_rows(const float **rp, float *K, const prefix_rows *pr, const ls_kv_prefix *pf, const float *own,
                           int64_t pos0, const int32_t *sel, int64_t k, int dk) {
    int64_t n = 0;
    for (; n < k && sel[n] >= 0; n++) {
        int64_t p = sel[n];
        if (p >= pos0) {
            rp[n] = own + (p - pos0) * dk;
        } else if (pf->dtype == LS_DTYPE_F32) {
            rp[n] = (const float *)pf->k_pages[p / pf->page_size] + (p % pf->page_size) * dk;
        } else if (pr->buf) {
            rp[n] = pr->buf + (int64_t)(pr->slot[p] - 1) * dk;
        } else {
            rp[n] = key_row(pf, own, pos0, p, dk, K + n * dk);
        }
    }
    return n;
}

/* a · b over n floats in 16 independent lanes, the lanes summed pairwise (the order is
 * fixed: the same bits for the same rows, whatever the caller's batching; pairwise, the
 * lanes' sum is 4 adds deep instead of a chain of 16, which held the forward's scores) */
static inline float dot16(const float *a, const float *b, int n) {
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i];
    float s8[8], s4[4];
    for (int l = 0; l < 8; l++) s8[l] = acc[l] + acc[l + 8];
    for (int l = 0; l < 4; l++) s4[l] = s8[l] + s8[l + 4];
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

#define MLA_MAX_DK 4096

/* Heads per tile of the output: 8 accumulators beside the loaded row vector. */
#define MLA_OUT_HEADS 8

/* o[h, 0..rkv) (=) il[h] · Σ_j P[j, h]·K[j][0..rkv) for the H heads, over the n selected
 * rows K[j] (P's rows Hp apart); each element summed over j in order (the same
 * bits as a scalar loop). A tile is one vector of columns for up to 8 heads, so each row
 * vector is loaded once per 8 heads; heads past H read the padding column h = Hp − 1 ≥ H
 * or are not stored. */
static void out_rows(float *o, const float *P, int64_t Hp, const float *il, const float *const *K, int64_t n, int H,
                     int rkv) {
    for (int h0 = 0; h0 < H; h0 += MLA_OUT_HEADS) {
        int hc[MLA_OUT_HEADS]; /* the column each accumulator reads (a real head, or a repeat) */
        for (int h = 0; h < MLA_OUT_HEADS; h++) hc[h] = h0 + h < H ? h0 + h : h0;
        int d0 = 0;
        for (; d0 + LS_VL <= rkv; d0 += LS_VL) {
            ls_vf a[MLA_OUT_HEADS];
            for (int h = 0; h < MLA_OUT_HEADS; h++) a[h] = LS_SPLAT(0.0f);
            for (int64_t j = 0; j < n; j++) {
                ls_vf k;
                LS_VLOAD(k, K[j] + d0);
                const float *pj = P + j * Hp;
                for (int h = 0; h < MLA_OUT_HEADS; h++) a[h] += LS_SPLAT(pj[hc[h]]) * k;
            }
            for (int h = 0; h < MLA_OUT_HEADS && h0 + h < H; h++) {
                a[h] *= LS_SPLAT(il[h0 + h]);
                LS_VSTORE(o + (int64_t)(h0 + h) * rkv + d0, a[h]);
            }
        }
        for (; d0 < rkv; d0++)
            for (int h = 0; h < MLA_OUT_HEADS && h0 + h < H; h++) {
                float a = 0.0f;
                for (int64_t j = 0; j < n; j++) a += P[j * Hp + h0 + h] * K[j][d0];
                o[(int64_t)(h0 + h) * rkv + d0] = a * il[h0 + h];
            }
    }
}

/* Rows summed in float before a block's sum joins its head's double total. */
#define MLA_SUM_BLOCK 32

/* Rows of the score tile: 4 key rows at a time, two accumulator chains each (even and
 * odd dims), one vector of heads wide. */
#define MLA_SCORE_ROWS 4

/* S[j, 0..cols) (=) Σ_d K[j][d] · Qt[d, 0..cols) for the n selected rows (rows of S and Qt
 * Hp apart; S[j, cols..Hp) (=) 0): a vector of heads per row (lanes are heads: no
 * horizontal sums), summed over d in two chains (even, odd) added at the end — a fixed
 * order per score, whatever n, the caller's batching or the vector width (each lane's
 * arithmetic is the same). SCORE_ROWS(name, vector type, lanes, splat) defines one
 * width; cols is a multiple of it. */
#define SCORE_ROWS(name, vt, W, SPLAT)                                                        \
    static void name(float *S, const float *Qt, int64_t Hp, int64_t cols, const float *const *K, int64_t n, \
                     int dk) {                                                                 \
        for (int64_t j0 = 0; j0 < n; j0 += MLA_SCORE_ROWS) {                                   \
            int rows = n - j0 < MLA_SCORE_ROWS ? (int)(n - j0) : MLA_SCORE_ROWS;              \
            const float *kr[MLA_SCORE_ROWS];                                                   \
            for (int r = 0; r < MLA_SCORE_ROWS; r++) kr[r] = K[j0 + (r < rows ? r : 0)];       \
            for (int r = 0; cols < Hp && r < rows; r++)                                        \
                memset(S + (j0 + r) * Hp + cols, 0, (size_t)(Hp - cols) * sizeof(float));     \
            for (int64_t g = 0; g < cols; g += W) {                                            \
                vt a0[MLA_SCORE_ROWS], a1[MLA_SCORE_ROWS];                                     \
                for (int r = 0; r < MLA_SCORE_ROWS; r++) a0[r] = a1[r] = SPLAT(0.0f);          \
                int d = 0;                                                                     \
                for (; d + 2 <= dk; d += 2) {                                                  \
                    vt qa, qb;                                                                 \
                    memcpy(&qa, Qt + d * Hp + g, sizeof qa);                                   \
                    memcpy(&qb, Qt + (d + 1) * Hp + g, sizeof qb);                             \
                    for (int r = 0; r < MLA_SCORE_ROWS; r++) {                                 \
                        a0[r] += SPLAT(kr[r][d]) * qa;                                         \
                        a1[r] += SPLAT(kr[r][d + 1]) * qb;                                     \
                    }                                                                          \
                }                                                                              \
                if (d < dk) {                                                                  \
                    vt qa;                                                                     \
                    memcpy(&qa, Qt + d * Hp + g, sizeof qa);                                   \
                    for (int r = 0; r < MLA_SCORE_ROWS; r++) a0[r] += SPLAT(kr[r][d]) * qa;    \
                }                                                                              \
                for (int r = 0; r < rows; r++) {                                               \
                    vt v = a0[r] + a1[r];                                                      \
                    memcpy(S + (j0 + r) * Hp + g, &v, sizeof v);                               \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }
SCORE_ROWS(score_rows, ls_vf, LS_VL, LS_SPLAT)
#ifdef LS_HALF_VL
SCORE_ROWS(score_rows_half, ls_vf8, LS_HALF_VL, LS_SPLAT8)
#endif
#undef SCORE_ROWS

ls_status ls_mla_attn_fwd(float *o, float *lse, const float *q, const float *own, const ls_kv_prefix *prefix,
                          const int32_t *sel, int64_t k, int64_t T, int H, int rkv, int dr, int64_t pos0, float scale) {
    const int dk = rkv + dr;
    LS_ASSERT(dk <= MLA_MAX_DK, "MLA key row of %d values", dk);
#ifdef _OPENMP
    int nthr = omp_get_max_threads();
#else
    int nthr = 1;
#endif
    const int64_t Hp = ((int64_t)H + LS_VL - 1) / LS_VL * LS_VL; /* heads padded to whole vectors */
    const float l2e = 1.4426950408889634f;                       /* scores in base 2 for the exponent */
    size_t per = (size_t)(k * dk + k * Hp + (int64_t)dk * Hp + 3 * Hp); /* K, S [n, Hp], Qt [dk, Hp], max, a block's sum, 1/l */
    float *work = malloc((size_t)nthr * per * sizeof(float) + (size_t)nthr * (size_t)k * sizeof(float *) + 64);
    if (!work) return ls_err(LS_ERR_NOMEM, "MLA attention: %lld selected rows of %d values", (long long)k, dk);
    const float **rows_all = (const float **)(work + (size_t)nthr * per); /* [nthr][k] each query's rows */
    prefix_rows pr;
    prefix_rows_begin(&pr, prefix, sel, k, T, pos0, dk);
#pragma omp parallel for schedule(dynamic, 4) if (T > 4)
    for (int64_t t = 0; t < T; t++) {
#ifdef _OPENMP
        int tid = omp_get_thread_num();
#else
        int tid = 0;
#endif
        float *K = work + (size_t)tid * per, *S = K + k * dk, *Qt = S + k * Hp, *mx = Qt + (int64_t)dk * Hp;
        float *l = mx + Hp, *il = l + Hp;
        const float **rp = rows_all + (size_t)tid * (size_t)k;
        int64_t n = select_rows(rp, K, &pr, prefix, own, pos0, sel + t * k, k, dk);
        const float *qt = q + t * H * dk;
        float *ot = o + t * H * rkv;
        for (int d = 0; d < dk; d++) /* the query transposed: heads along the lanes, scaled to base 2 */
            for (int64_t h = 0; h < Hp; h++) Qt[d * Hp + h] = h < H ? qt[h * dk + d] * (scale * l2e) : 0.0f;
#ifdef LS_HALF_VL
        if (H <= LS_HALF_VL) /* ≤ 8 heads: half vectors, not 16 lanes of which half are padding */
            score_rows_half(S, Qt, Hp, LS_HALF_VL, rp, n, dk);
        else
#endif
            score_rows(S, Qt, Hp, Hp, rp, n, dk);
        double sum[Hp]; /* per head Σ 2^(s − max): blocks of rows in float, the blocks in double */
        for (int64_t h = 0; h < Hp; h++) sum[h] = 0;
        for (int64_t g = 0; g < Hp; g += LS_VL) { /* per head: the max, 2^(s − max), their sum */
            ls_vf m = LS_SPLAT(-INFINITY);
            for (int64_t j = 0; j < n; j++) {
                ls_vf v;
                LS_VLOAD(v, S + j * Hp + g);
                m = LS_VSEL(v > m, v, m);
            }
            for (int64_t j0 = 0; j0 < n; j0 += MLA_SUM_BLOCK) {
                ls_vf b = LS_SPLAT(0.0f);
                for (int64_t j = j0; j < n && j < j0 + MLA_SUM_BLOCK; j++) {
                    ls_vf v, e;
                    LS_VLOAD(v, S + j * Hp + g);
                    v -= m;
                    LS_VEXP2(e, v);
                    LS_VSTORE(S + j * Hp + g, e);
                    b += e;
                }
                LS_VSTORE(l + g, b);
                for (int i = 0; i < LS_VL; i++) sum[g + i] += l[g + i];
            }
            LS_VSTORE(mx + g, m);
        }
        for (int h = 0; h < H; h++) {
            il[h] = sum[h] > 0 ? (float)(1.0 / sum[h]) : 0.0f;
            if (lse) lse[t * H + h] = sum[h] > 0 ? (float)(((double)mx[h] + log2(sum[h])) * 0.6931471805599453) : -INFINITY;
        }
        out_rows(ot, S, Hp, il, rp, n, H, rkv); /* the value is c_kv: the row's first rkv values */
    }
    prefix_rows_end(&pr);
    free(work);
    return LS_OK;
}

ls_status ls_mla_attn_bwd(float *dq, float *down, void *const *dprefix, const float *dout, const float *o,
                          const float *lse, const float *q, const float *own, const ls_kv_prefix *prefix,
                          const int32_t *sel, int64_t k, int64_t T, int H, int rkv, int dr, int64_t pos0,
                          float scale) {
    const int dk = rkv + dr;
    LS_ASSERT(dk <= MLA_MAX_DK, "MLA key row of %d values", dk);
    memset(dq, 0, (size_t)(T * H * dk) * sizeof(float));
    if (down) memset(down, 0, (size_t)(T * dk) * sizeof(float));
    float *K = malloc((size_t)(k * dk + k * dk) * sizeof(float) + 64); /* [n, dk] rows, [n, dk] their gradient */
    if (!K) return ls_err(LS_ERR_NOMEM, "MLA attention backward: %lld selected rows", (long long)k);
    float *dK = K + k * dk;
    /* Serial over queries: key gradients of different queries meet on the same rows;
     * within a query the heads run in order. */
    for (int64_t t = 0; t < T; t++) {
        const int32_t *st = sel + t * k;
        int64_t n = gather(K, prefix, own, pos0, st, k, dk);
        memset(dK, 0, (size_t)(n * dk) * sizeof(float));
        for (int h = 0; h < H; h++) {
            const float *qh = q + (t * H + h) * dk, *oh = o + (t * H + h) * rkv, *gh = dout + (t * H + h) * rkv;
            float *dqh = dq + (t * H + h) * dk;
            float Dd = dot16(gh, oh, rkv); /* rowsum(dO ⊙ O) */
            float L = lse[t * H + h];
            for (int64_t j = 0; j < n; j++) {
                const float *kr = K + j * dk;
                float P = expf(scale * dot16(qh, kr, dk) - L);
                float ds = P * (dot16(gh, kr, rkv) - Dd) * scale;
                float *dkr = dK + j * dk;
                for (int d = 0; d < dk; d++) {
                    dqh[d] += ds * kr[d];
                    dkr[d] += ds * qh[d];
                }
                for (int d = 0; d < rkv; d++) dkr[d] += P * gh[d]; /* the value is c_kv */
            }
        }
        for (int64_t j = 0; j < n; j++) { /* scatter: own rows, or the prompt pages (full mode) */
            int64_t p = st[j];
            float *row = p >= pos0 ? (down ? down + (p - pos0) * dk : NULL)
                                   : (dprefix ? (float *)dprefix[p / prefix->page_size] + (p % prefix->page_size) * dk
                                              : NULL);
            if (!row) continue;
            for (int d = 0; d < dk; d++) row[d] += dK[j * dk + d];
        }
    }
    free(K);
    return LS_OK;
}

/* ---- the indexer KL loss (spec §3 "Indexer training", sparse stage) ------------------ */

void ls_mla_attn_probs(float *P, const float *q, const float *lse, const float *own, const ls_kv_prefix *prefix,
                       const int32_t *sel, int64_t k, int64_t T, int H, int rkv, int dr, int64_t pos0, float scale) {
    const int dk = rkv + dr;
#pragma omp parallel for schedule(dynamic, 4) if (T > 4)
    for (int64_t t = 0; t < T; t++) {
        float tmp[MLA_MAX_DK];
        for (int64_t j = 0; j < k; j++) {
            float *pt = P + t * k + j;
            *pt = 0.0f;
            if (sel[t * k + j] < 0) continue;
            const float *kr = key_row(prefix, own, pos0, sel[t * k + j], dk, tmp);
            double s = 0;
            for (int h = 0; h < H; h++) s += exp((double)(scale * dot16(q + (t * H + h) * dk, kr, dk)) - lse[t * H + h]);
            *pt = (float)(s / H);
        }
    }
}

void ls_dsa_sel_scores(float *score, const float *q, const float *w, const ls_kv_prefix *keys, const float *own,
                       const int32_t *sel, int64_t k, int64_t T, int nI, int dI, int64_t pos0, float scale) {
#pragma omp parallel for schedule(dynamic, 4) if (T > 4)
    for (int64_t t = 0; t < T; t++) {
        float tmp[MLA_MAX_DK];
        for (int64_t j = 0; j < k; j++) {
            float *it = score + t * k + j;
            *it = -INFINITY;
            if (sel[t * k + j] < 0) continue;
            const float *kr = key_row(keys, own, pos0, sel[t * k + j], dI, tmp); /* an index key row */
            double s = 0;
            for (int h = 0; h < nI; h++) {
                float a = dot16(q + (t * nI + h) * dI, kr, dI);
                if (a > 0) s += (double)w[t * nI + h] * a;
            }
            *it = (float)(s * scale);
        }
    }
}

void ls_dsa_sel_scores_bwd(float *dq, float *dw, float *down, const float *dS, const float *q, const float *w,
                           const ls_kv_prefix *keys, const float *own, const int32_t *sel, int64_t k, int64_t T, int nI,
                           int dI, int64_t pos0, float scale) {
    memset(dq, 0, (size_t)(T * nI * dI) * sizeof(float));
    memset(dw, 0, (size_t)(T * nI) * sizeof(float));
    /* serial over queries: own keys' gradients of different queries meet on the same rows */
    float tmp[MLA_MAX_DK];
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            int64_t p = sel[t * k + j];
            float g = dS[t * k + j];
            if (p < 0 || g == 0.0f) continue;
            const float *kr = key_row(keys, own, pos0, p, dI, tmp);
            float *dk = p >= pos0 && down ? down + (p - pos0) * dI : NULL;
            for (int h = 0; h < nI; h++) {
                const float *qh = q + (t * nI + h) * dI;
                float a = dot16(qh, kr, dI);
                if (!(a > 0)) continue; /* ReLU: no gradient below the kink */
                dw[t * nI + h] += g * scale * a;
                float c = g * scale * w[t * nI + h];
                float *dqh = dq + (t * nI + h) * dI;
                for (int d = 0; d < dI; d++) dqh[d] += c * kr[d];
                if (dk)
                    for (int d = 0; d < dI; d++) dk[d] += c * qh[d];
            }
        }
}
