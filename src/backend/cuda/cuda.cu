/*
 * cuda.cu — the CUDA backend's table (backend.h): device memory from cudaMalloc, one
 * stream and one cuBLAS handle per opened device, and the ops built so far as kernels of
 * our own (ops.cu) or cuBLAS products. The CPU backend is the reference every op here is
 * held to (tests/gpu/). Ops not built yet leave their slot empty: ls_backend_missing
 * names them, and a model refuses a backend with empty slots before it runs.
 *
 * Errors: an op cannot fail by contract; a CUDA error inside one is a broken device or a
 * bug, reported by LS_ASSERT with the call and CUDA's message.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"

static cuda_ctx *CTX(const ls_backend *be) { return (cuda_ctx *)be->ctx; }

static void *cu_alloc(const ls_backend *be, size_t bytes, size_t align) {
    (void)align; /* cudaMalloc aligns to 256 bytes */
    CU_CK(cudaSetDevice(CTX(be)->device));
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError(); /* out of memory is an answer, not a sticky error */
        return NULL;
    }
    return p;
}
static void cu_free(const ls_backend *be, void *p, size_t bytes) {
    (void)bytes;
    CU_CK(cudaStreamSynchronize(CTX(be)->stream));
    CU_CK(cudaFree(p));
}
static void cu_to_device(const ls_backend *be, void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    CU_CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, CTX(be)->stream));
    CU_CK(cudaStreamSynchronize(CTX(be)->stream)); /* the host buffer may change after the call */
}
static void cu_to_host(const ls_backend *be, void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    CU_CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, CTX(be)->stream));
    CU_CK(cudaStreamSynchronize(CTX(be)->stream));
}
static void cu_copy(const ls_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src) CU_CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, CTX(be)->stream));
}
static void cu_zero(const ls_backend *be, void *p, size_t bytes) {
    if (bytes) CU_CK(cudaMemsetAsync(p, 0, bytes, CTX(be)->stream));
}

void *ls_cuda_stage_table(cuda_ctx *c, void *const *ptrs, int64_t n) {
    if (!ptrs || n <= 0) return NULL;
    void *d = NULL;
    CU_CK(cudaMallocAsync(&d, (size_t)n * sizeof(void *), c->stream));
    CU_CK(cudaMemcpyAsync(d, ptrs, (size_t)n * sizeof(void *), cudaMemcpyDefault, c->stream));
    return d;
}
void ls_cuda_unstage(cuda_ctx *c, const void *staged) {
    if (staged) CU_CK(cudaFreeAsync((void *)staged, c->stream));
}

/* ---- the table ------------------------------------------------------------------- */

/* Every op's entry calls ls_cuda_<name> (ops.cu, blas.cu) with the backend's context;
 * an op not built yet has no such function (a weak reference, cuda_backend.h), and its
 * slot stays empty. */
#define CU_OP_(name, params, args) \
    static void cu_##name(LS_BACKEND_PARAMS_ params) { ls_cuda_##name(CTX(be), LS_BACKEND_ARGS_ args); }
#define CU_STATUS_OP_(name, params, args) \
    static ls_status cu_##name(LS_BACKEND_PARAMS_ params) { return ls_cuda_##name(CTX(be), LS_BACKEND_ARGS_ args); }
LS_BACKEND_OPS(CU_OP_)
LS_BACKEND_STATUS_OPS(CU_STATUS_OP_)
#define CU_ENTRY_(name, params, args) t.name = ls_cuda_built(ls_cuda_##name) ? cu_##name : NULL;

static ls_backend_i make_table(void) {
    LS_ASSERT(ls_cuda_ops_file && ls_cuda_blas_file && ls_cuda_attention_file,
              "the CUDA backend's op files are not linked");
    ls_backend_i t;
    memset(&t, 0, sizeof t);
    t.name = "cuda";
    t.buf_alloc = cu_alloc;
    t.buf_free = cu_free;
    t.to_device = cu_to_device;
    t.to_host = cu_to_host;
    t.copy = cu_copy;
    t.zero = cu_zero;
    LS_BACKEND_OPS(CU_ENTRY_)
    LS_BACKEND_STATUS_OPS(CU_ENTRY_)
    return t;
}
static const ls_backend_i cuda_table = make_table();

extern "C" ls_status ls_backend_cuda_open(int device, const ls_backend **out) {
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        return ls_err(LS_ERR_UNSUPPORTED, "no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 found");
    }
    if (device < 0 || device >= n)
        return ls_err(LS_ERR_ARG, "CUDA device %d: %d device%s found", device, n, n == 1 ? "" : "s");
    if ((e = cudaSetDevice(device)) != cudaSuccess)
        return ls_err(LS_ERR_IO, "CUDA device %d: %s", device, cudaGetErrorString(e));
    ls_backend *be = (ls_backend *)calloc(1, sizeof *be);
    cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
    if (!be || !c) {
        free(be), free(c);
        return ls_err(LS_ERR_NOMEM, "CUDA device %d: the backend's context", device);
    }
    c->device = device;
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) == cudaSuccess)
        snprintf(c->name, sizeof c->name, "cuda:%d", device), c->sm_count = prop.multiProcessorCount;
    ls_status s = LS_OK;
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess)
        s = ls_err(LS_ERR_IO, "CUDA device %d: stream: %s", device, cudaGetErrorString(e));
    if (s == LS_OK && cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS)
        s = ls_err(LS_ERR_IO, "CUDA device %d: cuBLAS handle", device);
    if (s == LS_OK && cublasSetStream(c->blas, c->stream) != CUBLAS_STATUS_SUCCESS)
        s = ls_err(LS_ERR_IO, "CUDA device %d: cuBLAS stream", device);
    if (s == LS_OK && cublasSetMathMode(c->blas, CUBLAS_PEDANTIC_MATH) != CUBLAS_STATUS_SUCCESS)
        s = ls_err(LS_ERR_IO, "CUDA device %d: cuBLAS math mode", device);
    if (s == LS_OK && (e = cudaMalloc(&c->red, LS_CUDA_RED_BYTES)) != cudaSuccess)
        s = ls_err(LS_ERR_NOMEM, "CUDA device %d: reduction scratch: %s", device, cudaGetErrorString(e));
    if (s != LS_OK) {
        be->ctx = c;
        ls_backend_cuda_close(be);
        return s;
    }
    be->i = &cuda_table;
    be->device = c->name;
    be->ctx = c;
    *out = be;
    return LS_OK;
}

extern "C" void ls_backend_cuda_close(const ls_backend *be) {
    if (!be) return;
    cuda_ctx *c = CTX(be);
    if (c) {
        if (c->stream) cudaStreamSynchronize(c->stream);
        if (c->red) cudaFree(c->red);
        if (c->blas) cublasDestroy(c->blas);
        if (c->stream) cudaStreamDestroy(c->stream);
        free(c);
    }
    free((void *)be);
}

extern "C" const ls_backend_i *ls_backend_cuda_table(void) { return &cuda_table; }

extern "C" void ls_backend_cuda_sync(const ls_backend *be) { CU_CK(cudaStreamSynchronize(CTX(be)->stream)); }
