/*
 * cuda_backend.h — what the CUDA backend's files share: the context of an opened
 * device, the error check, and the ops' entry points ls_cuda_<name> (the table's
 * parameters after the context). Each is declared weak: an op not built yet has no
 * definition, its address is NULL, and its slot in the table stays empty.
 */
#ifndef LONGSTRAW_CUDA_BACKEND_H
#define LONGSTRAW_CUDA_BACKEND_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "longstraw/backend.h"
}

typedef struct {
    int device, sm_count;
    char name[32]; /* "cuda:N", the receipts' device */
    cudaStream_t stream;
    cublasHandle_t blas;
    void *red; /* LS_CUDA_RED_BYTES of reduction scratch: partial sums, a found index */
} cuda_ctx;

/* Blocks of a two-pass reduction (each writes one double), and the scratch they use. */
#define LS_CUDA_RED_BLOCKS 1024
#define LS_CUDA_RED_BYTES (LS_CUDA_RED_BLOCKS * sizeof(double) + 64)

#define CU_CK(call)                                                                                   \
    do {                                                                                              \
        cudaError_t e_ = (call);                                                                      \
        LS_ASSERT(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                       \
    } while (0)
/* After a kernel launch: the launch's own error (bad configuration). */
#define CU_LAUNCHED() CU_CK(cudaGetLastError())

#define LS_CUDA_DECL_(name, params, args) \
    extern "C" __attribute__((weak)) void ls_cuda_##name(cuda_ctx *cu_ctx_, LS_CUDA_STRIP_ params);
#define LS_CUDA_STATUS_DECL_(name, params, args) \
    extern "C" __attribute__((weak)) ls_status ls_cuda_##name(cuda_ctx *cu_ctx_, LS_CUDA_STRIP_ params);
#define LS_CUDA_STRIP_(...) __VA_ARGS__
LS_BACKEND_OPS(LS_CUDA_DECL_)
LS_BACKEND_STATUS_OPS(LS_CUDA_STATUS_DECL_)

/* One strong symbol per file of ops: the table's file refers to them, so a static link
 * takes those files (a weak reference alone would not) and the weak ones resolve. */
extern "C" const int ls_cuda_ops_file, ls_cuda_blas_file, ls_cuda_attention_file;

/* Whether op f is built (a weak reference resolves to NULL when it is not). */
template <typename F> static inline bool ls_cuda_built(F *f) { return f != nullptr; }

/* Reductions over a block of NT threads (a multiple of 32) that every thread enters; every
 * thread gets the result. part: NT/32 slots of shared memory, free to reuse on return. */
template <int NT, typename V> __device__ static inline V ls_blk_sum(V v, V *part) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    __syncthreads(); /* part may still be read by the previous call */
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    V s = 0;
    for (int w = 0; w < NT / 32; w++) s += part[w];
    return s;
}
template <int NT> __device__ static inline float ls_blk_max(float v, float *part) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    float m = -INFINITY;
    for (int w = 0; w < NT / 32; w++) m = fmaxf(m, part[w]);
    return m;
}

/* n pointers (a page table, the decode steps' state pointers) copied to the device from
 * wherever the caller keeps them (host or device), in stream-ordered memory: NULL when
 * ptrs is NULL or n <= 0; ls_cuda_unstage frees it (NULL: nothing) after the kernels. */
void *ls_cuda_stage_table(cuda_ctx *c, void *const *ptrs, int64_t n);
void ls_cuda_unstage(cuda_ctx *c, const void *staged);

/* C[r, 0:N] *= a for rows r < M, rows ld floats apart (a product with K = 0). */
void ls_cuda_scale_rows(cuda_ctx *c, float *C, int64_t ld, float a, int64_t M, int64_t N);

#endif
