/*
 * linear.c — dense projections through cblas_sgemm, and the embedding gather.
 */
#include <cblas.h>
#include <string.h>

#include "longstraw/kernels.h"

/* Few rows (decoding): sgemm packs all of W on every call, which for one row costs
 * three passes over the weights instead of one. Here each weight row is read once and
 * dotted with every input row while it is in L1; output rows are split over threads. */
#define LS_LINEAR_SMALL_T 4
static void linear_small(float *out, const float *x, const float *W, int64_t T, int64_t K, int64_t N,
                         int accumulate) {
#pragma omp parallel for schedule(static) if (N * K > 65536)
    for (int64_t n = 0; n < N; n++) {
        const float *w = W + n * K;
        for (int64_t t = 0; t < T; t++) {
            const float *xt = x + t * K;
            float s = 0;
#pragma omp simd reduction(+ : s)
            for (int64_t k = 0; k < K; k++) s += xt[k] * w[k];
            out[t * N + n] = accumulate ? out[t * N + n] + s : s;
        }
    }
}

/* out[T,N] (= or +=) x[T,K] · W[N,K]ᵀ */
void ls_linear_fwd(float *out, const float *x, const float *W, int64_t T, int64_t K, int64_t N,
                   int accumulate) {
    if (T <= 0 || N <= 0) return;
    if (K <= 0) {
        if (!accumulate) memset(out, 0, (size_t)T * (size_t)N * sizeof(float));
        return;
    }
    if (T <= LS_LINEAR_SMALL_T) {
        linear_small(out, x, W, T, K, N, accumulate);
        return;
    }
    LS_ASSERT(T <= INT32_MAX && K <= INT32_MAX && N <= INT32_MAX, "sgemm dims exceed int");
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)N, (int)K, 1.0f, x, (int)K, W,
                (int)K, accumulate ? 1.0f : 0.0f, out, (int)N);
}

/* dx[T,K] (=, or += when accumulate_dx) dout[T,N] · W[N,K]; dW[N,K] (+=) doutᵀ · x[T,K].
 * dx or dW NULL: skipped. */
void ls_linear_bwd(float *dx, float *dW, const float *dout, const float *x, const float *W,
                   int64_t T, int64_t K, int64_t N, int accumulate_dx) {
    if (T <= 0 || K <= 0) return;
    LS_ASSERT(T <= INT32_MAX && K <= INT32_MAX && N <= INT32_MAX, "sgemm dims exceed int");
    if (dx) {
        if (N <= 0) {
            if (!accumulate_dx) memset(dx, 0, (size_t)T * (size_t)K * sizeof(float));
        } else {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)K, (int)N, 1.0f,
                        dout, (int)N, W, (int)K, accumulate_dx ? 1.0f : 0.0f, dx, (int)K);
        }
    }
    if (dW && N > 0)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)N, (int)K, (int)T, 1.0f, dout,
                    (int)N, x, (int)K, 1.0f, dW, (int)K);
}

/* out[T,D] = table[ids[t]] */
void ls_embed_fwd(float *out, const int32_t *ids, const float *table, int64_t T, int64_t D) {
    for (int64_t t = 0; t < T; t++)
        memcpy(out + t * D, table + (int64_t)ids[t] * D, (size_t)D * sizeof(float));
}

/* dtable[V,D] (+=): dtable[ids[t]] += dout[t]. Serial over t so repeated ids accumulate
 * without races. */
void ls_embed_bwd(float *dtable, const float *dout, const int32_t *ids, int64_t T, int64_t D) {
    for (int64_t t = 0; t < T; t++) {
        float *row = dtable + (int64_t)ids[t] * D;
        const float *g = dout + t * D;
        for (int64_t i = 0; i < D; i++) row[i] += g[i];
    }
}
