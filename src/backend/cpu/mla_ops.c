/*
 * mla_ops.c — kernels of the MLA + DSA family (specs/mla-dsa-moe.md §2, §3):
 * rotary embedding over a slice of each head with a given frequency table, in either
 * pairing (interleaved GPT-J pairs for MLA, and for GLM's indexer; half-split NeoX
 * pairs for DeepSeek-V3.2's indexer), and the lightning indexer's causal top-k.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "backend/rows.h"
#include "backend/cpu/vec.h"
#include "longstraw/kernels.h"

/* Rotate dims [off, off + 2·half) of every head of x[T, heads, hd] by sign·(pos0+t)·inv_freq[i]:
 * pair i is (off+2i, off+2i+1) interleaved, or (off+i, off+i+half) half-split. */
static void rope_table_apply(float *x, int64_t T, int heads, int hd, int off, int half, const double *inv_freq,
                             int interleaved, int64_t pos0, float sign) {
    if (half <= 0 || T <= 0) return;
    LS_ASSERT(off + 2 * half <= hd && half <= 512, "rope slice [%d, %d) of a head of %d", off, off + 2 * half, hd);
#pragma omp parallel for schedule(static) if (T * heads * hd > 65536)
    for (int64_t t = 0; t < T; t++) {
        float cs[512], sn[512];
        double p = (double)(pos0 + t); /* angles in double: positions reach millions */
        for (int i = 0; i < half; i++) {
            double ang = p * inv_freq[i];
            cs[i] = (float)cos(ang);
            sn[i] = sign * (float)sin(ang);
        }
        for (int h = 0; h < heads; h++) {
            float *v = x + (t * heads + h) * (int64_t)hd + off;
            for (int i = 0; i < half; i++) {
                int ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
                float a = v[ia], b = v[ib];
                v[ia] = a * cs[i] - b * sn[i];
                v[ib] = b * cs[i] + a * sn[i];
            }
        }
    }
}

void ls_rope_table_fwd(float *x, int64_t T, int heads, int hd, int off, int half, const double *inv_freq,
                       int interleaved, int64_t pos0) {
    rope_table_apply(x, T, heads, hd, off, half, inv_freq, interleaved, pos0, 1.0f);
}

/* dx (= in place) ← Rᵀ·dx: each pair's 2×2 rotation transposed (sin negated). */
void ls_rope_table_bwd(float *dx, int64_t T, int heads, int hd, int off, int half, const double *inv_freq,
                       int interleaved, int64_t pos0) {
    rope_table_apply(dx, T, heads, hd, off, half, inv_freq, interleaved, pos0, -1.0f);
}

/* A score as an unsigned key of the same order (larger score, larger key; −0 is +0, as
 * they compare equal); NaN → 0, below every number (−inf is 0x007fffff). */
static inline uint32_t order_key(float x) {
    uint32_t u;
    if (x != x) return 0;
    if (x == 0.0f) x = 0.0f;
    memcpy(&u, &x, sizeof u);
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

/* key[j] = order_key(s[j]) for j < m: whole vectors without branches (a score's sign is a
 * coin flip, which a branch mispredicts half the time), the tail scalar. */
static void order_keys(uint32_t *key, const float *s, int64_t m) {
    int64_t j = 0;
    for (; j + LS_VL <= m; j += LS_VL) {
        ls_vi u, k;
        memcpy(&u, s + j, sizeof u);
        ls_vi a = u & 0x7fffffff;                /* |x|'s bits */
        k = u ^ ((u >> 31) | INT32_MIN);        /* negative: ~u; else u | the sign bit */
        ls_vi z = a == 0, nan = a > 0x7f800000; /* ±0 → +0's key; NaN → 0 */
        k = (k & ~z) | (z & INT32_MIN);
        k &= ~nan;
        memcpy(key + j, &k, sizeof k);
    }
    for (; j < m; j++) key[j] = order_key(s[j]);
}

/* The key of the want-th largest of s[0..m) (1 ≤ want ≤ m): a radix select from the top
 * bits — a histogram of the candidates' next bits, the bucket holding the want-th
 * largest kept, the candidates narrowed to it (idx: their positions; key [m]
 * (=) every score's order key). *above (=) how many keys are larger: the counts of the
 * bytes passed over. */
static uint32_t kth_key(const float *s, int64_t m, int64_t want, uint32_t *key, int32_t *idx, int64_t *above) {
    /* three levels: 12 bits (sign, exponent, 3 mantissa bits: the first narrowing leaves
     * the keys within an eighth of the k-th's value), then 10 and 10 */
    static const int shifts[3] = {20, 10, 0}, widths[3] = {12, 10, 10};
    int32_t hist[1 << 12];
    int64_t need = want;
    uint32_t prefix = 0, mask = 0;
    int64_t nc = m; /* candidates: all, until the first narrowing lists them in idx */
    for (int lv = 0; lv < 3; lv++) {
        int shift = shifts[lv], nb = 1 << widths[lv];
        uint32_t bm = (uint32_t)nb - 1;
        memset(hist, 0, (size_t)nb * sizeof hist[0]);
        if (lv == 0) {
            order_keys(key, s, m);
            for (int64_t j = 0; j < m; j++) hist[key[j] >> shift]++;
        } else
            for (int64_t i = 0; i < nc; i++) hist[key[idx[i]] >> shift & bm]++;
        int b = nb - 1;
        for (; b > 0 && hist[b] < want; b--) want -= hist[b];
        prefix |= (uint32_t)b << shift, mask |= bm << shift;
        if (lv == 2) break;
        int64_t c = 0; /* narrow to the bucket b */
        if (lv == 0) {
            for (int64_t j = 0; j < m; j++)
                if ((key[j] & mask) == prefix) idx[c++] = (int32_t)j;
        } else {
            for (int64_t i = 0; i < nc; i++)
                if ((key[idx[i]] & mask) == prefix) idx[c++] = idx[i];
        }
        nc = c;
    }
    *above = need - want; /* want: how many equal to the key are still wanted */
    return prefix;
}

/* Query t (at position pos0 + t) against keys 0..pos0+t of score[t, 0..n): the
 * min(k, pos0 + t + 1) largest, ties to the lower position (spec §3, §8.1), in
 * ascending position order; sel[t, j] = −1 pads. A selection-by-threshold: the k-th
 * largest score by a radix select over the scores' order keys (kth_key: a few counting
 * passes, no comparisons to mispredict), everything above it, then the lowest positions
 * equal to it. */
ls_status ls_dsa_topk(int32_t *sel, int64_t *count, const float *score, int64_t T, int64_t n, int64_t pos0,
                      int64_t k, ls_arena *scratch) {
    LS_ASSERT(k >= 1 && pos0 >= 0 && pos0 + T <= n, "top-k of %lld queries at %lld over %lld keys", (long long)T,
              (long long)pos0, (long long)n);
    ls_arena_mark mk = ls_arena_get_mark(scratch);
    int nt = 1;
#ifdef _OPENMP
    nt = omp_get_max_threads();
#endif
    int32_t *buf = ls_arena_alloc(scratch, 2 * (size_t)nt * (size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    if (!buf) return LS_ERR_NOMEM;
#pragma omp parallel for schedule(dynamic, 16) if (T > 16)
    for (int64_t t = 0; t < T; t++) {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        const float *s = score + t * n;
        int64_t m = pos0 + t + 1, want = m < k ? m : k;
        int32_t *out = sel + t * k;
        int64_t c = 0;
        if (want == m) { /* every causal key */
            for (int64_t j = 0; j < m; j++) out[c++] = (int32_t)j;
        } else {
            int64_t above;
            int32_t *idx = buf + 2 * (size_t)tid * (size_t)n;
            uint32_t *key = (uint32_t *)(idx + n);
            uint32_t th = kth_key(s, m, want, key, idx, &above);
            int64_t ties = want - above; /* how many equal to th to take, lowest positions first */
            for (int64_t j = 0; j < m; j++) {
                uint32_t u = key[j];
                if (u > th || (u == th && th != 0 && ties-- > 0)) out[c++] = (int32_t)j;
            }
        }
        count[t] = c;
        for (int64_t j = c; j < k; j++) out[j] = -1;
    }
    ls_arena_release(scratch, mk);
    return LS_OK;
}

/* MoE routing of the family (spec §4): s = σ(logits); selection by s + bias — within
 * the topk_group groups (of n_group) whose two best s + bias sum highest — of the K
 * largest (ties to the lower index, groups too); gates from the unbiased s,
 * renormalised (sum + 1e-20) when norm, times `scaling`. sel[T,K], wt[T,K] (=), in
 * selection order; s[T,E] (=) saved for the backward when non-NULL. */
void ls_mla_route_fwd(int32_t *sel, float *wt, float *s_out, const float *logits, const float *bias, int64_t T, int E,
                      int K, int n_group, int topk_group, int norm, double scaling) {
#pragma omp parallel for schedule(static) if (T > 64)
    for (int64_t t = 0; t < T; t++) {
        double s[1024], sb[1024];
        unsigned char keep[1024];
        LS_ASSERT(E <= 1024 && n_group >= 1 && n_group <= LS_ROUTE_MAX_GROUPS && E % n_group == 0,
                  "routing of %d experts in %d groups", E, n_group);
        const float *lg = logits + t * E;
        for (int e = 0; e < E; e++) {
            s[e] = 1.0 / (1.0 + exp(-(double)lg[e]));
            sb[e] = s[e] + (bias ? (double)bias[e] : 0.0);
            keep[e] = 1;
            if (s_out) s_out[t * E + e] = (float)s[e];
        }
        int ok = ls_mla_route_pick(sel + t * K, wt + t * K, s, sb, keep, E, K, n_group, topk_group, norm, scaling);
        LS_ASSERT(ok == 0, "fewer than %d experts in the kept groups", K);
    }
}

/* dlogits[T,E] (=) from dwt[T,K] = ∂L/∂gate, through the gates only (the selection and
 * the bias carry no gradient): chosen experts get the chain through s(1 − s) and the
 * renormalisation, the others zero. s, sel as saved by the forward. */
void ls_mla_route_bwd(float *dlogits, const float *dwt, const float *s, const int32_t *sel, int64_t T, int E, int K,
                      int norm, double scaling) {
#pragma omp parallel for schedule(static) if (T > 64)
    for (int64_t t = 0; t < T; t++)
        ls_mla_route_bwd_row(dlogits + t * E, dwt + t * K, s + t * E, sel + t * K, E, K, norm, scaling);
}

/* LayerNorm with weight and bias over rows of x[n, d]: y = (x − mean)/√(var + eps)·w + b.
 * y may alias x. (The indexer's k_norm, spec §3: trained only by the indexer KL loss.) */
void ls_layernorm_fwd(float *y, const float *x, const float *w, const float *b, int64_t n, int64_t d, float eps) {
#pragma omp parallel for schedule(static) if (n * d > 65536)
    for (int64_t i = 0; i < n; i++) {
        const float *xi = x + i * d;
        float *yi = y + i * d;
        double mu = 0, var = 0;
        for (int64_t j = 0; j < d; j++) mu += xi[j];
        mu /= (double)d;
        for (int64_t j = 0; j < d; j++) var += ((double)xi[j] - mu) * ((double)xi[j] - mu);
        double r = 1.0 / sqrt(var / (double)d + (double)eps);
        for (int64_t j = 0; j < d; j++) yi[j] = (float)(((double)xi[j] - mu) * r * w[j] + b[j]);
    }
}

void ls_layernorm_bwd(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w, int64_t n,
                      int64_t d, float eps) {
    for (int64_t i = 0; i < n; i++) { /* serial over rows: dw and db accumulate */
        const float *xi = x + i * d, *gi = dy + i * d;
        float *di = dx + i * d;
        double mu = 0, var = 0;
        for (int64_t j = 0; j < d; j++) mu += xi[j];
        mu /= (double)d;
        for (int64_t j = 0; j < d; j++) var += ((double)xi[j] - mu) * ((double)xi[j] - mu);
        double r = 1.0 / sqrt(var / (double)d + (double)eps), m1 = 0, m2 = 0;
        for (int64_t j = 0; j < d; j++) { /* ĝ = dy·w; dx = r·(ĝ − mean ĝ − x̂·mean(ĝ·x̂)) */
            double xh = ((double)xi[j] - mu) * r, gh = (double)gi[j] * w[j];
            m1 += gh, m2 += gh * xh;
            if (dw) dw[j] += (float)((double)gi[j] * xh);
            if (db) db[j] += gi[j];
        }
        m1 /= (double)d, m2 /= (double)d;
        for (int64_t j = 0; j < d; j++) {
            double xh = ((double)xi[j] - mu) * r;
            di[j] = (float)(r * ((double)gi[j] * w[j] - m1 - xh * m2));
        }
    }
}

/* The lightning indexer's scores (spec §3): score[t, s] (=) = scale·Σ_j w[t, j]·
 * ReLU(q[t, j]·k[s]) for s in [0, keys->n) of the paged index keys (one key of dI values
 * per position, f32 or bf16 pages); q[T, nI, dI], w[T, nI] (the nI^−½ already in w),
 * score [T, keys->n] row-major. Causality is the top-k's business (ls_dsa_topk).
 * Keys go through a transposed f32 block [dI, KB] so the inner loop runs across keys;
 * every score is summed in the same order (d, then j, ascending) whatever the block
 * or the number of rows, so a query's scores do not depend on how the caller batches
 * queries or splits keys (one rank and CP choose the same top-k). */
#define DSA_KEY_BLOCK 256
/* A register tile: 2 vectors of keys × DSA_HG heads of one query (16 accumulators with
 * AVX-512's 32 registers, 8 with fewer). */
#define DSA_KW (2 * LS_VL)
#if LS_VL >= 16
#define DSA_HG 8
#else
#define DSA_HG 4
#endif
/* Keys [s0, s0 + nb) of the pages into kt [dI, DSA_KEY_BLOCK] as f32 (row: one key's
 * scratch), the last tile's spare lanes zeroed. */
static void dsa_key_block(float *kt, float *row, const ls_kv_prefix *keys, int64_t s0, int64_t nb, int dI) {
    int64_t S = keys->page_size;
    for (int64_t i = 0; i < nb; i++) {
        int64_t p = s0 + i;
        const char *pg = (const char *)keys->k_pages[p / S];
        ls_convert_to_f32(row, pg + (size_t)((p % S) * dI) * ls_dtype_size(keys->dtype), keys->dtype, (size_t)dI);
        for (int d = 0; d < dI; d++) kt[d * DSA_KEY_BLOCK + i] = row[d];
    }
    int64_t nt = (nb + DSA_KW - 1) / DSA_KW * DSA_KW;
    for (int d = 0; nt > nb && d < dI; d++) memset(kt + d * DSA_KEY_BLOCK + nb, 0, (size_t)(nt - nb) * sizeof(float));
}

/* Query t's scores against the nb keys of kt (the block at s0): score[t, s0 ..). */
static void dsa_score_row(float *score, const float *q, const float *w, const float *kt, const float *zq, int64_t t,
                          int64_t n, int64_t s0, int64_t nb, int nI, int dI, float scale) {
    const float *qt = q + t * (int64_t)nI * dI, *wt = w + t * nI;
    float *st = score + t * n + s0;
    for (int64_t i0 = 0; i0 < nb; i0 += DSA_KW) {
        const ls_vf zero = LS_SPLAT(0.0f);
        ls_vf s_0 = zero, s_1 = zero;
        for (int j0 = 0; j0 < nI; j0 += DSA_HG) {
            const float *qh[DSA_HG];
            float wh[DSA_HG];
            for (int h = 0; h < DSA_HG; h++) { /* heads past nI: a zero query and weight add +0 */
                qh[h] = j0 + h < nI ? qt + (int64_t)(j0 + h) * dI : zq;
                wh[h] = j0 + h < nI ? wt[j0 + h] : 0.0f;
            }
            ls_vf a0[DSA_HG], a1[DSA_HG];
            for (int h = 0; h < DSA_HG; h++) a0[h] = a1[h] = zero;
            for (int d = 0; d < dI; d++) { /* the same order over d for every score */
                ls_vf k0, k1;
                LS_VLOAD(k0, kt + d * DSA_KEY_BLOCK + i0);
                LS_VLOAD(k1, kt + d * DSA_KEY_BLOCK + i0 + LS_VL);
                for (int h = 0; h < DSA_HG; h++) {
                    ls_vf qv = LS_SPLAT(qh[h][d]);
                    a0[h] += qv * k0, a1[h] += qv * k1;
                }
            }
            for (int h = 0; h < DSA_HG; h++) { /* Σ_j w_j·ReLU(·), heads in order */
                s_0 += LS_SPLAT(wh[h]) * LS_VSEL(a0[h] > zero, a0[h], zero);
                s_1 += LS_SPLAT(wh[h]) * LS_VSEL(a1[h] > zero, a1[h], zero);
            }
        }
        s_0 *= LS_SPLAT(scale), s_1 *= LS_SPLAT(scale);
        float out[DSA_KW];
        LS_VSTORE(out, s_0);
        LS_VSTORE(out + LS_VL, s_1);
        int64_t m = nb - i0 < DSA_KW ? nb - i0 : DSA_KW;
        memcpy(st + i0, out, (size_t)m * sizeof(float));
    }
}

/* Two schedules, the same arithmetic for every score: with many key blocks (a long
 * prefix, and callers that pass few rows at a time to bound the score block) the threads
 * split the key blocks, each converting its own — the conversion ran on one thread, which
 * held the 128K capture to 1.2x on 2 threads; with few, the blocks go one after another
 * and the threads split the rows. */
ls_status ls_dsa_scores(float *score, const float *q, const float *w, const ls_kv_prefix *keys, int64_t T, int nI,
                        int dI, float scale, ls_arena *scratch) {
    int64_t n = keys->n;
    if (n == 0 || T == 0) return LS_OK;
    int nt = 1;
#ifdef _OPENMP
    nt = omp_get_max_threads();
#endif
    int64_t nblk = (n + DSA_KEY_BLOCK - 1) / DSA_KEY_BLOCK;
    int by_keys = nt > 1 && nblk >= 4 * (int64_t)nt;
    int nbuf = by_keys ? nt : 1;
    ls_arena_mark mk = ls_arena_get_mark(scratch);
    size_t per = (size_t)dI * DSA_KEY_BLOCK + (size_t)dI; /* [dI, KB] keys, one key's row */
    float *buf = ls_arena_alloc(scratch, (size_t)nbuf * per * sizeof(float));
    float *zq = ls_arena_alloc(scratch, (size_t)dI * sizeof(float)); /* a missing head's query */
    if (!buf || !zq) return LS_ERR_NOMEM;
    memset(zq, 0, (size_t)dI * sizeof(float));
    if (by_keys) {
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t b = 0; b < nblk; b++) {
            int tid = 0;
#ifdef _OPENMP
            tid = omp_get_thread_num();
#endif
            float *kt = buf + (size_t)tid * per, *row = kt + (size_t)dI * DSA_KEY_BLOCK;
            int64_t s0 = b * DSA_KEY_BLOCK, nb = n - s0 < DSA_KEY_BLOCK ? n - s0 : DSA_KEY_BLOCK;
            dsa_key_block(kt, row, keys, s0, nb, dI);
            for (int64_t t = 0; t < T; t++) dsa_score_row(score, q, w, kt, zq, t, n, s0, nb, nI, dI, scale);
        }
    } else {
        float *kt = buf, *row = kt + (size_t)dI * DSA_KEY_BLOCK;
        for (int64_t s0 = 0; s0 < n; s0 += DSA_KEY_BLOCK) {
            int64_t nb = n - s0 < DSA_KEY_BLOCK ? n - s0 : DSA_KEY_BLOCK;
            dsa_key_block(kt, row, keys, s0, nb, dI);
#pragma omp parallel for schedule(static) if (T * nb > 4096)
            for (int64_t t = 0; t < T; t++) dsa_score_row(score, q, w, kt, zq, t, n, s0, nb, nI, dI, scale);
        }
    }
    ls_arena_release(scratch, mk);
    return LS_OK;
}
