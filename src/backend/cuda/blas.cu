/*
 * blas.cu — the CUDA backend's products (cuBLAS, f32 with f32 accumulation, no TF32: the
 * CPU backend is the reference), the strided row copy, and the chunked LM head built on
 * them (lmhead.c's passes: one logits chunk of [chunk_rows, V] at a time).
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "cuda_backend.h"

#define GRID_STRIDE_LM(i, n) \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

extern "C" const int ls_cuda_blas_file = 1;

/* ---- products through cuBLAS ------------------------------------------------------ */

/* Row-major C[M,N] = alpha·op(A)·op(B) + beta·C is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: the
 * operands swap, the transposes stay. f32 in, f32 accumulation (no TF32: the CPU is the
 * reference). */
extern "C" void ls_cuda_gemm(cuda_ctx *c, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    LS_ASSERT(M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX && lda <= INT32_MAX && ldb <= INT32_MAX &&
                  ldc <= INT32_MAX, "gemm dims exceed int");
    if (K <= 0) { /* C = beta·C */
        if (beta == 0.0f)
            CU_CK(cudaMemset2DAsync(C, (size_t)ldc * sizeof(float), 0, (size_t)N * sizeof(float), (size_t)M,
                                    c->stream));
        else
            ls_cuda_scale_rows(c, C, ldc, beta, M, N);
        return;
    }
    cublasStatus_t s = cublasSgemm(c->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   (int)N, (int)M, (int)K, &alpha, B, (int)ldb, A, (int)lda, &beta, C, (int)ldc);
    LS_ASSERT(s == CUBLAS_STATUS_SUCCESS, "cublasSgemm: status %d (M %lld N %lld K %lld)", (int)s, (long long)M,
              (long long)N, (long long)K);
}

extern "C" void ls_cuda_linear_fwd(cuda_ctx *c, float *out, const float *x, const float *W, int64_t T, int64_t K,
                          int64_t N, int accumulate) {
    ls_cuda_gemm(c, 0, 1, T, N, K, 1.0f, x, K, W, K, accumulate ? 1.0f : 0.0f, out, N);
}

extern "C" void ls_cuda_linear_bwd(cuda_ctx *c, float *dx, float *dW, const float *dout, const float *x,
                          const float *W, int64_t T, int64_t K, int64_t N, int accumulate_dx) {
    if (T <= 0 || K <= 0) return;
    if (dx) ls_cuda_gemm(c, 0, 0, T, K, N, 1.0f, dout, N, W, K, accumulate_dx ? 1.0f : 0.0f, dx, K);
    if (dW && N > 0) ls_cuda_gemm(c, 1, 0, N, K, T, 1.0f, dout, N, x, K, 1.0f, dW, K);
}

extern "C" void ls_cuda_copy_rows(cuda_ctx *c, float *dst, int64_t ld_dst, const float *src, int64_t ld_src,
                         int64_t rows, int64_t width) {
    if (rows <= 0 || width <= 0) return;
    CU_CK(cudaMemcpy2DAsync(dst, (size_t)ld_dst * sizeof(float), src, (size_t)ld_src * sizeof(float),
                            (size_t)width * sizeof(float), (size_t)rows, cudaMemcpyDeviceToDevice, c->stream));
}


/* ---- the chunked LM head (lmhead.c): logits for chunk_rows tokens at a time -------------- */

/* A [rows, V] f32 chunk from the arena (the caller releases it). */
static float *logits_chunk(ls_arena *sc, int64_t *chunk_rows, int64_t T, int64_t V) {
    if (*chunk_rows <= 0) *chunk_rows = 32;
    if (*chunk_rows > T) *chunk_rows = T;
    size_t bytes;
    if (ls_mul_size((size_t)*chunk_rows, (size_t)V, &bytes) || ls_mul_size(bytes, sizeof(float), &bytes)) {
        ls_err(LS_ERR_NOMEM, "lmhead: logits chunk [%lld, %lld] overflows size_t", (long long)*chunk_rows,
               (long long)V);
        return NULL;
    }
    return (float *)ls_arena_alloc(sc, bytes);
}

#define LM_THREADS 256
/* One block per row of the chunk: max, Σe and Σe·d in double; log-prob, lse, entropy. */
__global__ static void k_lm_rows(float *logprob, float *lse, float *entropy, const float *logits,
                                 const int32_t *target, int64_t V) {
    __shared__ double dpart[LM_THREADS / 32];
    __shared__ float fpart[LM_THREADS / 32];
    int64_t r = blockIdx.x;
    const float *row = logits + r * V;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < V; j += LM_THREADS) m = fmaxf(m, row[j]);
    m = ls_blk_max<LM_THREADS>(m, fpart);
    double sum = 0, sz = 0;
    for (int64_t j = threadIdx.x; j < V; j += LM_THREADS) {
        double d = (double)row[j] - (double)m, e = exp(d);
        sum += e;
        sz += e * d;
    }
    sum = ls_blk_sum<LM_THREADS>(sum, dpart);
    sz = ls_blk_sum<LM_THREADS>(sz, dpart);
    if (threadIdx.x != 0) return;
    double l = (double)m + log(sum);
    if (logprob) logprob[r] = (float)((double)row[target[r]] - l);
    if (lse) lse[r] = (float)l;
    if (entropy) entropy[r] = (float)(log(sum) - sz / sum);
}

extern "C" ls_status ls_cuda_lmhead_fwd(cuda_ctx *c, float *logprob, float *lse, float *entropy, const float *h,
                                        const float *W, const int32_t *target, int64_t T, int64_t D, int64_t V,
                                        float temperature, int64_t chunk_rows, ls_arena *sc) {
    if (T <= 0) return LS_OK;
    LS_ASSERT(V > 0 && D > 0 && temperature > 0.0f, "lmhead: D=%lld V=%lld temperature=%g", (long long)D,
              (long long)V, (double)temperature);
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *logits = logits_chunk(sc, &chunk_rows, T, V);
    if (!logits) return LS_ERR_NOMEM;
    for (int64_t t0 = 0; t0 < T; t0 += chunk_rows) {
        int64_t n = T - t0 < chunk_rows ? T - t0 : chunk_rows;
        ls_cuda_gemm(c, 0, 1, n, V, D, 1.0f / temperature, h + t0 * D, D, W, D, 0.0f, logits, V);
        k_lm_rows<<<(unsigned)n, LM_THREADS, 0, c->stream>>>(logprob ? logprob + t0 : NULL, lse ? lse + t0 : NULL,
                                                             entropy ? entropy + t0 : NULL, logits,
                                                             target ? target + t0 : NULL, V);
        CU_LAUNCHED();
    }
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* dz/τ in place of the chunk's logits: −g·p, and g·(1 − p) at the target (expm1). */
__global__ static void k_lm_dz(float *dz, const float *dlogprob, const int32_t *target, const float *lse, int64_t n,
                               int64_t V, float inv_temp) {
    GRID_STRIDE_LM(i, n * V) {
        int64_t r = i / V, j = i % V;
        double l = lse[r], g = (double)dlogprob[r] * (double)inv_temp, z = dz[i];
        dz[i] = j == target[r] ? (float)(g * -expm1(z - l)) : (float)(-g * exp(z - l));
    }
}

extern "C" ls_status ls_cuda_lmhead_logprobs_bwd(cuda_ctx *c, float *dh, float *dW, const float *dlogprob,
                                                 const float *h, const float *W, const int32_t *target,
                                                 const float *lse, int64_t T, int64_t D, int64_t V, float temperature,
                                                 int64_t chunk_rows, ls_arena *sc) {
    if (T <= 0) return LS_OK;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *dz = logits_chunk(sc, &chunk_rows, T, V);
    if (!dz) return LS_ERR_NOMEM;
    float inv_temp = 1.0f / temperature;
    for (int64_t t0 = 0; t0 < T; t0 += chunk_rows) {
        int64_t n = T - t0 < chunk_rows ? T - t0 : chunk_rows;
        ls_cuda_gemm(c, 0, 1, n, V, D, inv_temp, h + t0 * D, D, W, D, 0.0f, dz, V);
        int64_t blocks = (n * V + 255) / 256;
        k_lm_dz<<<(unsigned)(blocks > 65535 ? 65535 : blocks), 256, 0, c->stream>>>(dz, dlogprob + t0, target + t0,
                                                                                   lse + t0, n, V, inv_temp);
        CU_LAUNCHED();
        ls_cuda_gemm(c, 0, 0, n, D, V, 1.0f, dz, V, W, D, 0.0f, dh + t0 * D, D);
        if (dW) ls_cuda_gemm(c, 1, 0, V, D, n, 1.0f, dz, V, h + t0 * D, D, 1.0f, dW, D);
    }
    ls_arena_release(sc, mk);
    return LS_OK;
}
