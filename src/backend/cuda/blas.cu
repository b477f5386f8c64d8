/*
 * blas.cu — the CUDA backend's products (cuBLAS, f32 with f32 accumulation, no TF32: the
 * CPU backend is the reference) and the strided row copy.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "cuda_backend.h"

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

