/*
 * linear.c — dense projections through cblas_sgemm, and the embedding gather.
 */
#include <cblas.h>
#include <string.h>

#include "longstraw/kernels.h"

/* out[T,N] (= or +=) x[T,K] · W[N,K]ᵀ */
void ls_linear_fwd(float *out, const float *x, const float *W, int64_t T, int64_t K, int64_t N,
                   int accumulate) {
    if (T <= 0 || N <= 0) return;
    if (K <= 0) {
        if (!accumulate) memset(out, 0, (size_t)T * (size_t)N * sizeof(float));
        return;
    }
    LS_ASSERT(T <= INT32_MAX && K <= INT32_MAX && N <= INT32_MAX, "sgemm dims exceed int");
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)N, (int)K, 1.0f, x, (int)K, W,
                (int)K, accumulate ? 1.0f : 0.0f, out, (int)N);
}

/* out[T,D] = table[ids[t]] */
void ls_embed_fwd(float *out, const int32_t *ids, const float *table, int64_t T, int64_t D) {
    for (int64_t t = 0; t < T; t++)
        memcpy(out + t * D, table + (int64_t)ids[t] * D, (size_t)D * sizeof(float));
}
