/*
 * mla_ops.c — kernels of the MLA + DSA family (specs/mla-dsa-moe.md §2, §3):
 * rotary embedding over a slice of each head with a given frequency table, in either
 * pairing (interleaved GPT-J pairs for MLA, and for GLM's indexer; half-split NeoX
 * pairs for DeepSeek-V3.2's indexer), and the lightning indexer's causal top-k.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

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

/* Query t (at position pos0 + t) against keys 0..pos0+t of score[t, 0..n): the
 * min(k, pos0 + t + 1) largest, ties to the lower position (spec §3, §8.1), in
 * ascending position order; sel[t, j] = −1 pads. A selection-by-threshold: find the
 * k-th largest score, take everything above it, then the lowest positions equal to it. */
ls_status ls_dsa_topk(int32_t *sel, int64_t *count, const float *score, int64_t T, int64_t n, int64_t pos0,
                      int64_t k, ls_arena *scratch) {
    LS_ASSERT(k >= 1 && pos0 >= 0 && pos0 + T <= n, "top-k of %lld queries at %lld over %lld keys", (long long)T,
              (long long)pos0, (long long)n);
    ls_arena_mark mk = ls_arena_get_mark(scratch);
    int nt = 1;
#ifdef _OPENMP
    nt = omp_get_max_threads();
#endif
    float *buf = ls_arena_alloc(scratch, (size_t)nt * (size_t)(n > 0 ? n : 1) * sizeof(float));
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
            /* the want-th largest value: sort a copy (descending) */
            float *v = buf + (size_t)tid * (size_t)n;
            memcpy(v, s, (size_t)m * sizeof(float));
            /* nth_element by partial selection: simple quickselect on a copy */
            int64_t lo = 0, hi = m - 1, kk = want - 1;
            while (lo < hi) {
                float piv = v[(lo + hi) / 2];
                int64_t i = lo, j = hi;
                while (i <= j) {
                    while (v[i] > piv) i++;
                    while (v[j] < piv) j--;
                    if (i <= j) {
                        float tmp = v[i];
                        v[i] = v[j], v[j] = tmp;
                        i++, j--;
                    }
                }
                if (kk <= j) hi = j;
                else if (kk >= i) lo = i;
                else break;
            }
            float th = v[kk];
            int64_t above = 0;
            for (int64_t j = 0; j < m; j++) above += s[j] > th;
            int64_t ties = want - above; /* how many equal to th to take, lowest positions first */
            for (int64_t j = 0; j < m; j++)
                if (s[j] > th || (s[j] == th && ties-- > 0)) out[c++] = (int32_t)j;
        }
        count[t] = c;
        for (int64_t j = c; j < k; j++) out[j] = -1;
    }
    ls_arena_release(scratch, mk);
    return LS_OK;
}
