/*
 * ops.cu — the CUDA backend's kernels of our own: elementwise gates and activations,
 * embeddings, the norms, both RoPEs, page-dtype rounding, and the optimizer. Each op
 * computes what its CPU kernel computes (kernels.h is the contract): row statistics and
 * dot products accumulate in double, angles are taken in double, and the weight
 * gradients of the norms and the embedding accumulate row after row in the CPU's order,
 * one thread per column, so they do not depend on the launch.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <float.h>
#include <math.h>

#include "backend/rows.h"
#include "cuda_backend.h"

extern "C" const int ls_cuda_ops_file = 1;

#define THREADS 256

/* Blocks for n elements in a grid-stride loop. */
static unsigned blocks_for(int64_t n) {
    int64_t b = (n + THREADS - 1) / THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}
#define GRID_STRIDE(i, n) \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

__device__ static inline float sigmoid_d(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Sum of v over the block (THREADS threads), in double; every thread gets it. */
__device__ static double block_sum(double v) {
    __shared__ double part[THREADS / 32];
    return ls_blk_sum<THREADS>(v, part);
}

/* ---- elementwise ------------------------------------------------------------------ */

__global__ static void k_add_to(float *y, const float *x, int64_t n) { GRID_STRIDE(i, n) y[i] += x[i]; }
extern "C" void ls_cuda_add_to(cuda_ctx *c, float *y, const float *x, int64_t n) {
    if (n <= 0) return;
    k_add_to<<<blocks_for(n), THREADS, 0, c->stream>>>(y, x, n);
    CU_LAUNCHED();
}

__global__ static void k_scale(float *x, float a, int64_t n) { GRID_STRIDE(i, n) x[i] *= a; }
extern "C" void ls_cuda_scale(cuda_ctx *c, float *x, float a, int64_t n) {
    if (n <= 0) return;
    k_scale<<<blocks_for(n), THREADS, 0, c->stream>>>(x, a, n);
    CU_LAUNCHED();
}

__global__ static void k_scale_rows(float *C, int64_t ld, float a, int64_t M, int64_t N) {
    GRID_STRIDE(i, M * N) C[(i / N) * ld + i % N] *= a;
}
void ls_cuda_scale_rows(cuda_ctx *c, float *C, int64_t ld, float a, int64_t M, int64_t N) {
    if (M <= 0 || N <= 0) return;
    k_scale_rows<<<blocks_for(M * N), THREADS, 0, c->stream>>>(C, ld, a, M, N);
    CU_LAUNCHED();
}

/* The CPU's conversions (core.h): bf16 round to nearest even, NaN kept quiet; f16 by the
 * hardware's round to nearest even. */
__device__ static inline float round_bf16(float f) {
    unsigned u = __float_as_uint(f), h;
    if ((u & 0x7fffffffu) > 0x7f800000u) h = (u >> 16) | 0x40u;
    else h = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return __uint_as_float(h << 16);
}
__global__ static void k_round_to(float *x, int64_t n, int bf16) {
    GRID_STRIDE(i, n) x[i] = bf16 ? round_bf16(x[i]) : __half2float(__float2half_rn(x[i]));
}
extern "C" void ls_cuda_round_to(cuda_ctx *c, float *x, int64_t n, ls_dtype dtype) {
    if (dtype == LS_DTYPE_F32 || n <= 0) return;
    LS_ASSERT(dtype == LS_DTYPE_BF16 || dtype == LS_DTYPE_F16, "round_to: dtype %d", (int)dtype);
    k_round_to<<<blocks_for(n), THREADS, 0, c->stream>>>(x, n, dtype == LS_DTYPE_BF16);
    CU_LAUNCHED();
}

__global__ static void k_store_as(void *dst, const float *src, int64_t n, int dt) {
    GRID_STRIDE(i, n) {
        if (dt == 0) ((float *)dst)[i] = src[i];
        else if (dt == 1) ((__nv_bfloat16 *)dst)[i] = __float2bfloat16_rn(src[i]);
        else ((__half *)dst)[i] = __float2half_rn(src[i]);
    }
}
extern "C" void ls_cuda_store_as(cuda_ctx *c, void *dst, const float *src, int64_t n, ls_dtype dtype) {
    if (n <= 0) return;
    LS_ASSERT(dtype == LS_DTYPE_F32 || dtype == LS_DTYPE_BF16 || dtype == LS_DTYPE_F16, "store_as: dtype %d", (int)dtype);
    k_store_as<<<blocks_for(n), THREADS, 0, c->stream>>>(dst, src, n, dtype == LS_DTYPE_F32 ? 0 : dtype == LS_DTYPE_BF16 ? 1 : 2);
    CU_LAUNCHED();
}

__global__ static void k_swiglu_fwd(float *out, const float *gu, int64_t T, int64_t I) {
    GRID_STRIDE(j, T * I) {
        int64_t t = j / I, i = j % I;
        float g = gu[t * 2 * I + i], u = gu[t * 2 * I + I + i];
        out[j] = g / (1.0f + expf(-g)) * u;
    }
}
extern "C" void ls_cuda_swiglu_fwd(cuda_ctx *c, float *out, const float *gu, int64_t T, int64_t I) {
    if (T <= 0 || I <= 0) return;
    k_swiglu_fwd<<<blocks_for(T * I), THREADS, 0, c->stream>>>(out, gu, T, I);
    CU_LAUNCHED();
}
__global__ static void k_swiglu_bwd(float *dgu, const float *dout, const float *gu, int64_t T, int64_t I) {
    GRID_STRIDE(j, T * I) {
        int64_t t = j / I, i = j % I;
        float g = gu[t * 2 * I + i], u = gu[t * 2 * I + I + i], d = dout[j];
        float sig = 1.0f / (1.0f + expf(-g));
        dgu[t * 2 * I + i] = d * u * (sig * (1.0f + g * (1.0f - sig)));
        dgu[t * 2 * I + I + i] = d * (g * sig);
    }
}
extern "C" void ls_cuda_swiglu_bwd(cuda_ctx *c, float *dgu, const float *dout, const float *gu, int64_t T, int64_t I) {
    if (T <= 0 || I <= 0) return;
    k_swiglu_bwd<<<blocks_for(T * I), THREADS, 0, c->stream>>>(dgu, dout, gu, T, I);
    CU_LAUNCHED();
}

__global__ static void k_sigmoid_mul_fwd(float *y, const float *x, const float *gate, int64_t n) {
    GRID_STRIDE(i, n) y[i] = x[i] / (1.0f + expf(-gate[i]));
}
extern "C" void ls_cuda_sigmoid_mul_fwd(cuda_ctx *c, float *y, const float *x, const float *gate, int64_t n) {
    if (n <= 0) return;
    k_sigmoid_mul_fwd<<<blocks_for(n), THREADS, 0, c->stream>>>(y, x, gate, n);
    CU_LAUNCHED();
}
__global__ static void k_sigmoid_mul_bwd(float *dx, float *dgate, const float *dy, const float *x, const float *gate,
                                         int64_t n) {
    GRID_STRIDE(i, n) {
        float s = sigmoid_d(gate[i]), d = dy[i];
        dgate[i] = d * x[i] * s * (1.0f - s);
        dx[i] = d * s;
    }
}
extern "C" void ls_cuda_sigmoid_mul_bwd(cuda_ctx *c, float *dx, float *dgate, const float *dy, const float *x,
                                        const float *gate, int64_t n) {
    if (n <= 0) return;
    k_sigmoid_mul_bwd<<<blocks_for(n), THREADS, 0, c->stream>>>(dx, dgate, dy, x, gate, n);
    CU_LAUNCHED();
}

__global__ static void k_gated_add_rows(float *x, const float *logit, const float *y, int64_t T, int64_t D) {
    GRID_STRIDE(i, T * D) x[i] += sigmoid_d(logit[i / D]) * y[i];
}
extern "C" void ls_cuda_gated_add_rows(cuda_ctx *c, float *x, const float *logit, const float *y, int64_t T,
                                       int64_t D) {
    if (T <= 0 || D <= 0) return;
    k_gated_add_rows<<<blocks_for(T * D), THREADS, 0, c->stream>>>(x, logit, y, T, D);
    CU_LAUNCHED();
}
/* One block per row: dy (=) and the row's dot in double. */
__global__ static void k_gated_add_rows_bwd(float *dy, float *dlogit, const float *dx, const float *logit,
                                            const float *y, int64_t D) {
    int64_t t = blockIdx.x;
    float sg = sigmoid_d(logit[t]);
    double dot = 0;
    for (int64_t d = threadIdx.x; d < D; d += THREADS) {
        float g = dx[t * D + d];
        dot += (double)g * y[t * D + d];
        dy[t * D + d] = sg * g;
    }
    dot = block_sum(dot);
    if (threadIdx.x == 0) dlogit[t] = (float)(dot * sg * (1.0f - sg));
}
extern "C" void ls_cuda_gated_add_rows_bwd(cuda_ctx *c, float *dy, float *dlogit, const float *dx, const float *logit,
                                           const float *y, int64_t T, int64_t D) {
    if (T <= 0) return;
    k_gated_add_rows_bwd<<<(unsigned)T, THREADS, 0, c->stream>>>(dy, dlogit, dx, logit, y, D);
    CU_LAUNCHED();
}

/* ---- embeddings ------------------------------------------------------------------- */

__global__ static void k_embed_fwd(float *out, const int32_t *ids, const float *table, int64_t T, int64_t D) {
    GRID_STRIDE(i, T * D) out[i] = table[(int64_t)ids[i / D] * D + i % D];
}
extern "C" void ls_cuda_embed_fwd(cuda_ctx *c, float *out, const int32_t *ids, const float *table, int64_t T,
                                  int64_t D) {
    if (T <= 0 || D <= 0) return;
    k_embed_fwd<<<blocks_for(T * D), THREADS, 0, c->stream>>>(out, ids, table, T, D);
    CU_LAUNCHED();
}
/* One thread per column, tokens in order: repeated ids accumulate as on the CPU. */
__global__ static void k_embed_bwd(float *dtable, const float *dout, const int32_t *ids, int64_t T, int64_t D) {
    GRID_STRIDE(d, D)
    for (int64_t t = 0; t < T; t++) dtable[(int64_t)ids[t] * D + d] += dout[t * D + d];
}
extern "C" void ls_cuda_embed_bwd(cuda_ctx *c, float *dtable, const float *dout, const int32_t *ids, int64_t T,
                                  int64_t D) {
    if (T <= 0 || D <= 0) return;
    k_embed_bwd<<<blocks_for(D), THREADS, 0, c->stream>>>(dtable, dout, ids, T, D);
    CU_LAUNCHED();
}

/* ---- norms -------------------------------------------------------------------------- */

/* One block per row: y = x·s·(one + w)·(z ? SiLU(z) : 1), s = 1/sqrt(Σx²/D + eps). */
__global__ static void k_rms_fwd(float *y, float *rstd, const float *x, const float *z, const float *w, int64_t D,
                                 float eps, float one) {
    int64_t r = blockIdx.x;
    const float *xr = x + r * D;
    double ss = 0;
    for (int64_t i = threadIdx.x; i < D; i += THREADS) ss += (double)xr[i] * xr[i];
    ss = block_sum(ss);
    float s = (float)(1.0 / sqrt(ss / (double)D + (double)eps));
    if (rstd && threadIdx.x == 0) rstd[r] = s;
    for (int64_t i = threadIdx.x; i < D; i += THREADS) {
        if (z) {
            float zi = z[r * D + i];
            y[r * D + i] = xr[i] * s * w[i] * (zi / (1.0f + expf(-zi)));
        } else {
            y[r * D + i] = xr[i] * s * (one + w[i]);
        }
    }
}

/* dw[i] += Σ_r (float)(dy·x·(z ? SiLU(z) : 1)) in double times rstd[r], rows in order. */
__global__ static void k_norm_dw(float *dw, const float *dy, const float *x, const float *z, const float *rstd,
                                 int64_t rows, int64_t D) {
    GRID_STRIDE(i, D) {
        double acc = 0;
        for (int64_t r = 0; r < rows; r++) {
            float p = dy[r * D + i] * x[r * D + i];
            if (z) {
                float zi = z[r * D + i];
                p = dy[r * D + i] * x[r * D + i] * (zi / (1.0f + expf(-zi)));
            }
            acc += (double)p * (double)rstd[r];
        }
        dw[i] += (float)acc;
    }
}

/* One block per row: dx (and dz for the gated form) from the row's dot in double. */
__global__ static void k_rms_bwd(float *dx, float *dz, const float *dy, const float *x, const float *z,
                                 const float *rstd, const float *w, int64_t D, float one) {
    int64_t r = blockIdx.x;
    const float *xr = x + r * D, *dyr = dy + r * D;
    double dot = 0;
    for (int64_t i = threadIdx.x; i < D; i += THREADS) {
        if (z) {
            float zi = z[r * D + i];
            dot += (double)(dyr[i] * w[i] * (zi / (1.0f + expf(-zi)))) * xr[i];
        } else {
            dot += (double)(dyr[i] * (one + w[i])) * xr[i];
        }
    }
    dot = block_sum(dot); /* every dy of the row is read before any dx (which may alias it) is written */
    float s = rstd[r];
    float cc = (float)(dot * (double)s * s * s / (double)D);
    for (int64_t i = threadIdx.x; i < D; i += THREADS) {
        float g = dyr[i];
        if (z) {
            float zi = z[r * D + i], sig = 1.0f / (1.0f + expf(-zi));
            dz[r * D + i] = g * xr[i] * s * w[i] * (sig * (1.0f + zi * (1.0f - sig)));
            dx[r * D + i] = s * g * w[i] * (zi * sig) - cc * xr[i];
        } else {
            dx[r * D + i] = s * (one + w[i]) * g - cc * xr[i];
        }
    }
}

static void rms_fwd(cuda_ctx *c, float *y, float *rstd, const float *x, const float *z, const float *w, int64_t rows,
                    int64_t D, float eps, float one) {
    if (rows <= 0 || D <= 0) return;
    k_rms_fwd<<<(unsigned)rows, THREADS, 0, c->stream>>>(y, rstd, x, z, w, D, eps, one);
    CU_LAUNCHED();
}
static void rms_bwd(cuda_ctx *c, float *dx, float *dz, float *dw, const float *dy, const float *x, const float *z,
                    const float *rstd, const float *w, int64_t rows, int64_t D, float one) {
    if (rows <= 0 || D <= 0) return;
    if (dw) { /* first: it reads dy, which dx may overwrite */
        k_norm_dw<<<blocks_for(D), THREADS, 0, c->stream>>>(dw, dy, x, z, rstd, rows, D);
        CU_LAUNCHED();
    }
    k_rms_bwd<<<(unsigned)rows, THREADS, 0, c->stream>>>(dx, dz, dy, x, z, rstd, w, D, one);
    CU_LAUNCHED();
}
extern "C" void ls_cuda_rmsnorm_fwd(cuda_ctx *c, float *y, float *rstd, const float *x, const float *w, int64_t rows,
                                    int64_t D, float eps) {
    rms_fwd(c, y, rstd, x, NULL, w, rows, D, eps, 1.0f);
}
extern "C" void ls_cuda_rmsnorm_bwd(cuda_ctx *c, float *dx, float *dw, const float *dy, const float *x,
                                    const float *rstd, const float *w, int64_t rows, int64_t D) {
    rms_bwd(c, dx, NULL, dw, dy, x, NULL, rstd, w, rows, D, 1.0f);
}
extern "C" void ls_cuda_rmsnorm_plain_fwd(cuda_ctx *c, float *y, float *rstd, const float *x, const float *w,
                                          int64_t rows, int64_t D, float eps) {
    rms_fwd(c, y, rstd, x, NULL, w, rows, D, eps, 0.0f);
}
extern "C" void ls_cuda_rmsnorm_plain_bwd(cuda_ctx *c, float *dx, float *dw, const float *dy, const float *x,
                                          const float *rstd, const float *w, int64_t rows, int64_t D) {
    rms_bwd(c, dx, NULL, dw, dy, x, NULL, rstd, w, rows, D, 0.0f);
}
extern "C" void ls_cuda_gated_rmsnorm_fwd(cuda_ctx *c, float *y, float *rstd, const float *x, const float *z,
                                          const float *w, int64_t rows, int64_t D, float eps) {
    rms_fwd(c, y, rstd, x, z, w, rows, D, eps, 0.0f);
}
extern "C" void ls_cuda_gated_rmsnorm_bwd(cuda_ctx *c, float *dx, float *dz, float *dw, const float *dy,
                                          const float *x, const float *z, const float *rstd, const float *w,
                                          int64_t rows, int64_t D) {
    rms_bwd(c, dx, dz, dw, dy, x, z, rstd, w, rows, D, 0.0f);
}

/* A row's mean and 1/σ (variance of the row, + eps), both in double; every thread gets them. */
__device__ static void row_mean_rstd(const float *xi, int64_t d, float eps, double *mu_out, double *rs_out) {
    double mu = 0, var = 0;
    for (int64_t j = threadIdx.x; j < d; j += THREADS) mu += xi[j];
    mu = block_sum(mu) / (double)d;
    for (int64_t j = threadIdx.x; j < d; j += THREADS) var += ((double)xi[j] - mu) * ((double)xi[j] - mu);
    var = block_sum(var);
    *mu_out = mu, *rs_out = 1.0 / sqrt(var / (double)d + (double)eps);
}

/* LayerNorm, one block per row. */
__global__ static void k_layernorm_fwd(float *y, const float *x, const float *w, const float *b, int64_t d, float eps) {
    int64_t r = blockIdx.x;
    const float *xi = x + r * d;
    double mu, rs;
    row_mean_rstd(xi, d, eps, &mu, &rs);
    for (int64_t j = threadIdx.x; j < d; j += THREADS) y[r * d + j] = (float)(((double)xi[j] - mu) * rs * w[j] + b[j]);
}
extern "C" void ls_cuda_layernorm_fwd(cuda_ctx *c, float *y, const float *x, const float *w, const float *b, int64_t n,
                                      int64_t d, float eps) {
    if (n <= 0 || d <= 0) return;
    k_layernorm_fwd<<<(unsigned)n, THREADS, 0, c->stream>>>(y, x, w, b, d, eps);
    CU_LAUNCHED();
}
/* The row's statistics again; dx from the means of ĝ and ĝ·x̂ (each in double). */
__global__ static void k_layernorm_bwd(float *dx, const float *dy, const float *x, const float *w, int64_t d,
                                       float eps) {
    int64_t r = blockIdx.x;
    const float *xi = x + r * d, *gi = dy + r * d;
    double mu, rs, m1 = 0, m2 = 0;
    row_mean_rstd(xi, d, eps, &mu, &rs);
    for (int64_t j = threadIdx.x; j < d; j += THREADS) {
        double xh = ((double)xi[j] - mu) * rs, gh = (double)gi[j] * w[j];
        m1 += gh, m2 += gh * xh;
    }
    m1 = block_sum(m1) / (double)d;
    m2 = block_sum(m2) / (double)d;
    for (int64_t j = threadIdx.x; j < d; j += THREADS) {
        double xh = ((double)xi[j] - mu) * rs;
        dx[r * d + j] = (float)(rs * ((double)gi[j] * w[j] - m1 - xh * m2));
    }
}
/* dw[j] += (float)(dy·x̂) and db[j] += dy, rows in order (the CPU's serial order). */
__global__ static void k_layernorm_dwdb(float *dw, float *db, const float *dy, const float *x, int64_t n, int64_t d,
                                        const double *stats) {
    GRID_STRIDE(j, d) {
        for (int64_t r = 0; r < n; r++) {
            double xh = ((double)x[r * d + j] - stats[2 * r]) * stats[2 * r + 1];
            if (dw) dw[j] += (float)((double)dy[r * d + j] * xh);
            if (db) db[j] += dy[r * d + j];
        }
    }
}
/* Per row: mean and 1/σ, for the weight gradients. */
__global__ static void k_layernorm_stats(double *stats, const float *x, int64_t d, float eps) {
    int64_t r = blockIdx.x;
    double mu, rs;
    row_mean_rstd(x + r * d, d, eps, &mu, &rs);
    if (threadIdx.x == 0) stats[2 * r] = mu, stats[2 * r + 1] = rs;
}
extern "C" void ls_cuda_layernorm_bwd(cuda_ctx *c, float *dx, float *dw, float *db, const float *dy, const float *x,
                                      const float *w, int64_t n, int64_t d, float eps) {
    if (n <= 0 || d <= 0) return;
    if (dw || db) { /* first: dx may alias dy */
        double *stats = NULL;
        CU_CK(cudaMallocAsync((void **)&stats, (size_t)(2 * n) * sizeof(double), c->stream));
        k_layernorm_stats<<<(unsigned)n, THREADS, 0, c->stream>>>(stats, x, d, eps);
        CU_LAUNCHED();
        k_layernorm_dwdb<<<blocks_for(d), THREADS, 0, c->stream>>>(dw, db, dy, x, n, d, stats);
        CU_LAUNCHED();
        CU_CK(cudaFreeAsync(stats, c->stream));
    }
    k_layernorm_bwd<<<(unsigned)n, THREADS, 0, c->stream>>>(dx, dy, x, w, d, eps);
    CU_LAUNCHED();
}

/* ---- rotary embeddings ------------------------------------------------------------ */

/* One thread per (position, head, pair): the pair's angle in double. */
__global__ static void k_rope(float *x, int64_t T, int heads, int hd, int rot, double theta, int64_t pos0, float sign) {
    int half = rot / 2;
    GRID_STRIDE(i, T * heads * half) {
        int64_t t = i / ((int64_t)heads * half);
        int h = (int)(i / half % heads), j = (int)(i % half);
        double ang = (double)(pos0 + t) * pow(theta, -2.0 * j / (double)rot);
        float cs = (float)cos(ang), sn = sign * (float)sin(ang);
        float *v = x + (t * heads + h) * (int64_t)hd;
        float a = v[j], b = v[j + half];
        v[j] = a * cs - b * sn;
        v[j + half] = b * cs + a * sn;
    }
}
static void rope(cuda_ctx *c, float *x, int64_t T, int heads, int hd, int rot, double theta, int64_t pos0, float sign) {
    if (rot / 2 <= 0 || T <= 0 || heads <= 0) return;
    k_rope<<<blocks_for(T * heads * (rot / 2)), THREADS, 0, c->stream>>>(x, T, heads, hd, rot, theta, pos0, sign);
    CU_LAUNCHED();
}
extern "C" void ls_cuda_rope_fwd(cuda_ctx *c, float *x, int64_t T, int heads, int hd, int rot, double theta,
                                 int64_t pos0) {
    rope(c, x, T, heads, hd, rot, theta, pos0, 1.0f);
}
extern "C" void ls_cuda_rope_bwd(cuda_ctx *c, float *dx, int64_t T, int heads, int hd, int rot, double theta,
                                 int64_t pos0) {
    rope(c, dx, T, heads, hd, rot, theta, pos0, -1.0f);
}

__global__ static void k_rope_table(float *x, int64_t T, int heads, int hd, int off, int half, const double *inv_freq,
                                    int interleaved, int64_t pos0, float sign) {
    GRID_STRIDE(k, T * heads * half) {
        int64_t t = k / ((int64_t)heads * half);
        int h = (int)(k / half % heads), i = (int)(k % half);
        double ang = (double)(pos0 + t) * inv_freq[i];
        float cs = (float)cos(ang), sn = sign * (float)sin(ang);
        float *v = x + (t * heads + h) * (int64_t)hd + off;
        int ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
        float a = v[ia], b = v[ib];
        v[ia] = a * cs - b * sn;
        v[ib] = b * cs + a * sn;
    }
}
static void rope_table(cuda_ctx *c, float *x, int64_t T, int heads, int hd, int off, int half, const double *inv_freq,
                       int interleaved, int64_t pos0, float sign) {
    if (half <= 0 || T <= 0 || heads <= 0) return;
    LS_ASSERT(off + 2 * half <= hd, "rope slice [%d, %d) of a head of %d", off, off + 2 * half, hd);
    k_rope_table<<<blocks_for(T * heads * half), THREADS, 0, c->stream>>>(x, T, heads, hd, off, half, inv_freq,
                                                                          interleaved, pos0, sign);
    CU_LAUNCHED();
}
extern "C" void ls_cuda_rope_table_fwd(cuda_ctx *c, float *x, int64_t T, int heads, int hd, int off, int half,
                                       const double *inv_freq, int interleaved, int64_t pos0) {
    rope_table(c, x, T, heads, hd, off, half, inv_freq, interleaved, pos0, 1.0f);
}
extern "C" void ls_cuda_rope_table_bwd(cuda_ctx *c, float *dx, int64_t T, int heads, int hd, int off, int half,
                                       const double *inv_freq, int interleaved, int64_t pos0) {
    rope_table(c, dx, T, heads, hd, off, half, inv_freq, interleaved, pos0, -1.0f);
}

/* ---- the optimizer ------------------------------------------------------------------ */

/* One element of AdamW: the CPU's expression (optim.c). */
__device__ static inline void adamw_elem(const ls_adamw_hp hp, float decay, float w, float g, float m, float v,
                                         float *nw, float *nm, float *nv) {
    float gi = (float)(g * hp.clip);
    *nm = __fadd_rn(__fmul_rn(hp.b1, m), __fmul_rn(1.0f - hp.b1, gi));
    *nv = __fadd_rn(__fmul_rn(hp.b2, v), __fmul_rn(__fmul_rn(1.0f - hp.b2, gi), gi));
    double mh = *nm / hp.bc1, vh = *nv / hp.bc2;
    *nw = (float)((double)__fmul_rn(w, decay) - hp.lr * mh / (sqrt(vh) + hp.eps));
}
__device__ static inline bool elem_bad(float nw, float nm, float nv) {
    return !(fabsf(nw) <= FLT_MAX) || !(fabsf(nm) <= FLT_MAX) || !(nv >= 0 && nv <= FLT_MAX);
}

__global__ static void k_adamw_step(const ls_adamw_hp hp, float decay, float *w, const float *g, float *m, float *v,
                                    int64_t n) {
    GRID_STRIDE(i, n) adamw_elem(hp, decay, w[i], g[i], m[i], v[i], &w[i], &m[i], &v[i]);
}
extern "C" void ls_cuda_adamw_step(cuda_ctx *c, const ls_adamw_hp *hp, float decay, float *w, const float *g, float *m,
                                   float *v, int64_t n) {
    if (n <= 0) return;
    k_adamw_step<<<blocks_for(n), THREADS, 0, c->stream>>>(*hp, decay, w, g, m, v, n);
    CU_LAUNCHED();
}

/* The first element the step would make non-finite: the least such index (atomicMin),
 * then its new values. */
__global__ static void k_adamw_find(unsigned long long *first, const ls_adamw_hp hp, float decay, const float *w,
                                    const float *g, const float *m, const float *v, int64_t n) {
    GRID_STRIDE(i, n) {
        float nw, nm, nv;
        adamw_elem(hp, decay, w[i], g[i], m[i], v[i], &nw, &nm, &nv);
        if (elem_bad(nw, nm, nv)) atomicMin(first, (unsigned long long)i);
    }
}
__global__ static void k_adamw_at(float *at, const unsigned long long *first, const ls_adamw_hp hp, float decay,
                                  const float *w, const float *g, const float *m, const float *v) {
    unsigned long long i = *first;
    if (i == ~0ull) return;
    adamw_elem(hp, decay, w[i], g[i], m[i], v[i], &at[0], &at[1], &at[2]);
}
extern "C" void ls_cuda_adamw_check(cuda_ctx *c, int64_t *bad, float *at, const ls_adamw_hp *hp, float decay,
                                    const float *w, const float *g, const float *m, const float *v, int64_t n) {
    *bad = -1;
    if (n <= 0) return;
    unsigned long long *first = (unsigned long long *)c->red;
    float *dat = (float *)(first + 1);
    CU_CK(cudaMemsetAsync(first, 0xff, sizeof *first, c->stream));
    k_adamw_find<<<blocks_for(n), THREADS, 0, c->stream>>>(first, *hp, decay, w, g, m, v, n);
    CU_LAUNCHED();
    k_adamw_at<<<1, 1, 0, c->stream>>>(dat, first, *hp, decay, w, g, m, v);
    CU_LAUNCHED();
    unsigned long long hf;
    CU_CK(cudaMemcpyAsync(&hf, first, sizeof hf, cudaMemcpyDeviceToHost, c->stream));
    CU_CK(cudaStreamSynchronize(c->stream));
    if (hf == ~0ull) return; /* at untouched, as on the CPU */
    *bad = (int64_t)hf;
    CU_CK(cudaMemcpy(at, dat, 3 * sizeof(float), cudaMemcpyDeviceToHost));
}

/* Σx² in double: LS_CUDA_RED_BLOCKS partial sums over fixed strided slices, then summed in
 * block order: the same bits on every call. */
__global__ static void k_sumsq_part(double *part, const float *x, int64_t n) {
    double s = 0;
    for (int64_t i = blockIdx.x * (int64_t)THREADS + threadIdx.x; i < n; i += (int64_t)LS_CUDA_RED_BLOCKS * THREADS)
        s += (double)x[i] * x[i];
    s = block_sum(s);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}
__global__ static void k_sum_parts(double *part) {
    double s = 0;
    for (int b = 0; b < LS_CUDA_RED_BLOCKS; b++) s += part[b];
    part[0] = s;
}
extern "C" void ls_cuda_sumsq(cuda_ctx *c, double *out, const float *x, int64_t n) {
    *out = 0;
    if (n <= 0) return;
    double *part = (double *)c->red;
    k_sumsq_part<<<LS_CUDA_RED_BLOCKS, THREADS, 0, c->stream>>>(part, x, n);
    CU_LAUNCHED();
    k_sum_parts<<<1, 1, 0, c->stream>>>(part);
    CU_LAUNCHED();
    CU_CK(cudaMemcpyAsync(out, part, sizeof *out, cudaMemcpyDeviceToHost, c->stream));
    CU_CK(cudaStreamSynchronize(c->stream));
}

/* ---- attention partials, MoE rows ----------------------------------------------------- */

/* One thread per row of [T·n_h]: the log-sum-exp merge of two partials (attention.c). */
__global__ static void k_attn_merge(float *o, float *lse, const float *o2, const float *lse2, int64_t rows, int hd) {
    GRID_STRIDE(i, rows) ls_attn_merge_row(o + i * hd, lse + i, o2 + i * hd, lse2[i], hd);
}
extern "C" void ls_cuda_attn_merge(cuda_ctx *c, float *o, float *lse, const float *o2, const float *lse2, int64_t T,
                                   int n_h, int hd) {
    int64_t rows = T * n_h;
    if (rows <= 0) return;
    k_attn_merge<<<blocks_for(rows), THREADS, 0, c->stream>>>(o, lse, o2, lse2, rows, hd);
    CU_LAUNCHED();
}

__global__ static void k_moe_gather(float *xs, const float *x, const int64_t *rows, int64_t n, int64_t D, int K) {
    GRID_STRIDE(j, n * D) xs[j] = x[(rows[j / D] / K) * D + j % D];
}
extern "C" void ls_cuda_moe_gather(cuda_ctx *c, float *xs, const float *x, const int64_t *rows, int64_t n, int64_t D,
                                   int K) {
    if (n <= 0 || D <= 0) return;
    k_moe_gather<<<blocks_for(n * D), THREADS, 0, c->stream>>>(xs, x, rows, n, D, K);
    CU_LAUNCHED();
}
/* One expert's rows name each token at most once (ls_moe_group: one slot per token and
 * expert), so the rows' additions never meet: one thread per element. */
__global__ static void k_moe_scatter_add(float *y, const float *ys, const int64_t *rows, const float *wt, int64_t n,
                                         int64_t D, int K) {
    GRID_STRIDE(j, n * D) {
        int64_t i = j / D, r = rows[i];
        float *yt = y + (r / K) * D + j % D;
        *yt += wt ? wt[r] * ys[j] : ys[j];
    }
}
extern "C" void ls_cuda_moe_scatter_add(cuda_ctx *c, float *y, const float *ys, const int64_t *rows, const float *wt,
                                        int64_t n, int64_t D, int K) {
    if (n <= 0 || D <= 0) return;
    k_moe_scatter_add<<<blocks_for(n * D), THREADS, 0, c->stream>>>(y, ys, rows, wt, n, D, K);
    CU_LAUNCHED();
}
/* One block per routed row: dys (=) and the combine weight's gradient, the dot in double. */
__global__ static void k_moe_combine_bwd(float *dys, float *dwt, const float *dy, const float *ys, const int64_t *rows,
                                         const float *wt, int64_t D, int K) {
    int64_t i = blockIdx.x, r = rows[i];
    const float *dr = dy + (r / K) * D;
    double dot = 0;
    for (int64_t d = threadIdx.x; d < D; d += THREADS) {
        dot += (double)dr[d] * ys[i * D + d];
        dys[i * D + d] = wt[r] * dr[d];
    }
    dot = block_sum(dot);
    if (threadIdx.x == 0) dwt[r] = (float)dot;
}
extern "C" void ls_cuda_moe_combine_bwd(cuda_ctx *c, float *dys, float *dwt, const float *dy, const float *ys,
                                        const int64_t *rows, const float *wt, int64_t n, int64_t D, int K) {
    if (n <= 0) return;
    k_moe_combine_bwd<<<(unsigned)n, THREADS, 0, c->stream>>>(dys, dwt, dy, ys, rows, wt, D, K);
    CU_LAUNCHED();
}

/* ---- the causal depthwise conv (conv.c) ------------------------------------------------ */

/* One thread per (t, c): pre = Σ_j w[c,j]·x̃[t+j,c] in j order, y = SiLU(pre). */
__global__ static void k_conv_fwd(float *y, float *pre, const float *tail, const float *x, const float *w, int64_t T,
                                  int64_t C, int64_t W) {
    int64_t Wm = W - 1;
    GRID_STRIDE(i, T * C) {
        int64_t t = i / C, ch = i % C;
        float s = 0.0f;
        for (int64_t j = 0; j < W; j++) {
            int64_t src = t - Wm + j;
            float v = src >= 0 ? x[src * C + ch] : tail[(Wm + src) * C + ch];
            s += w[ch * W + j] * v;
        }
        if (pre) pre[i] = s;
        y[i] = s / (1.0f + expf(-s));
    }
}
/* The new tail, one thread per channel walking its rows upwards (in place: row k reads
 * row k + T of the old tail, not yet written). */
__global__ static void k_conv_tail(float *tail, const float *x, int64_t T, int64_t C, int64_t Wm) {
    GRID_STRIDE(ch, C)
    for (int64_t k = 0; k < Wm; k++) {
        int64_t src = T - Wm + k; /* position in this call of the input tail row k holds */
        tail[k * C + ch] = src >= 0 ? x[src * C + ch] : tail[(k + T) * C + ch];
    }
}
extern "C" void ls_cuda_conv_fwd(cuda_ctx *c, float *y, float *pre, float *tail, const float *x, const float *w,
                                 int64_t T, int64_t C, int64_t W) {
    if (T <= 0 || C <= 0) return;
    k_conv_fwd<<<blocks_for(T * C), THREADS, 0, c->stream>>>(y, pre, tail, x, w, T, C, W);
    CU_LAUNCHED();
    if (W - 1 <= 0) return;
    k_conv_tail<<<blocks_for(C), THREADS, 0, c->stream>>>(tail, x, T, C, W - 1);
    CU_LAUNCHED();
}

#define CONV_MAX_W 32
/* One thread per channel, the CPU's walk over u = 0 .. T+W−2 with the last W rows of
 * dpre in a ring, dw accumulated in double. */
__global__ static void k_conv_bwd(float *dx, float *dw, float *dtail, const float *dy, const float *pre,
                                  const float *x, const float *tail_in, const float *w, int64_t T, int64_t C,
                                  int64_t W) {
    int64_t Wm = W - 1;
    GRID_STRIDE(ch, C) {
        float ring[CONV_MAX_W];
        double acc[CONV_MAX_W];
        for (int64_t j = 0; j < W; j++) acc[j] = 0.0;
        for (int64_t u = 0; u < T + Wm; u++) {
            if (u < T) {
                float p = pre[u * C + ch], sig = 1.0f / (1.0f + expf(-p));
                float dp = dy[u * C + ch] * (sig * (1.0f + p * (1.0f - sig)));
                ring[u % W] = dp;
                if (dw)
                    for (int64_t j = 0; j < W; j++) {
                        int64_t v = u + j;
                        float xv = v < Wm ? tail_in[v * C + ch] : x[(v - Wm) * C + ch];
                        acc[j] += (double)(dp * xv);
                    }
            }
            float *out = u < Wm ? (dtail ? dtail + u * C + ch : NULL) : (dx ? dx + (u - Wm) * C + ch : NULL);
            if (!out) continue;
            float s = 0.0f;
            for (int64_t j = 0; j < W; j++) {
                int64_t t = u - j;
                if (t < 0 || t >= T) continue;
                s += w[ch * W + j] * ring[t % W];
            }
            *out = s;
        }
        if (dw)
            for (int64_t j = 0; j < W; j++) dw[ch * W + j] += (float)acc[j];
    }
}
extern "C" void ls_cuda_conv_bwd(cuda_ctx *c, float *dx, float *dw, float *dtail, const float *dy, const float *pre,
                                 const float *x, const float *tail_in, const float *w, int64_t T, int64_t C,
                                 int64_t W) {
    LS_ASSERT(W >= 1 && W <= CONV_MAX_W, "conv width %lld outside [1, %d]", (long long)W, CONV_MAX_W);
    if (C <= 0) return;
    if (T <= 0) {
        if (dtail && W > 1) CU_CK(cudaMemsetAsync(dtail, 0, (size_t)((W - 1) * C) * sizeof(float), c->stream));
        return;
    }
    LS_ASSERT(!dw || W == 1 || tail_in, "conv bwd: dw needs the initial tail");
    k_conv_bwd<<<blocks_for(C), THREADS, 0, c->stream>>>(dx, dw, dtail, dy, pre, x, tail_in, w, T, C, W);
    CU_LAUNCHED();
}

/* ---- the Gated DeltaNet prologue (gates.c) ------------------------------------------- */

/* One block per (token, key head), for q then k: the row's L2 norm in double (norm.c). */
__global__ static void k_l2norm_rows(float *out, float *rnorm, const float *y, int64_t cd, int64_t kd, int Hk, int dk,
                                     int64_t off) {
    int64_t t = blockIdx.x / Hk;
    int h = (int)(blockIdx.x % Hk);
    const float *xr = y + t * cd + off + (int64_t)h * dk;
    double ss = 0;
    for (int i = threadIdx.x; i < dk; i += THREADS) ss += (double)xr[i] * xr[i];
    ss = block_sum(ss);
    float s = (float)(1.0 / sqrt(ss + (double)1e-6f)); /* the CPU's eps, a float */
    if (rnorm && threadIdx.x == 0) rnorm[t * Hk + h] = s;
    for (int i = threadIdx.x; i < dk; i += THREADS) out[t * kd + (int64_t)h * dk + i] = xr[i] * s;
}
__device__ static inline float softplus_d(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
__global__ static void k_gdn_gates(float *v, float *beta, float *g, const float *y, const float *ba, const float *A_log,
                                   const float *dt_bias, int64_t T, int64_t cd, int64_t kd, int64_t vd, int Hv) {
    GRID_STRIDE(i, T * vd) v[i] = y[(i / vd) * cd + 2 * kd + i % vd];
    GRID_STRIDE(i, T * Hv) {
        int64_t t = i / Hv;
        int h = (int)(i % Hv);
        float bb = ba[t * 2 * Hv + h], aa = ba[t * 2 * Hv + Hv + h];
        beta[i] = sigmoid_d(bb);
        g[i] = -expf(A_log[h]) * softplus_d(aa + dt_bias[h]);
    }
}
extern "C" void ls_cuda_gdn_prep_fwd(cuda_ctx *c, float *q, float *k, float *v, float *beta, float *g, float *rq,
                                     float *rk, const float *y, const float *ba, const float *A_log,
                                     const float *dt_bias, int64_t T, ls_gdr_dims dm) {
    if (T <= 0) return;
    int64_t kd = (int64_t)dm.H_k * dm.d_k, vd = (int64_t)dm.H_v * dm.d_v, cd = 2 * kd + vd;
    k_l2norm_rows<<<(unsigned)(T * dm.H_k), THREADS, 0, c->stream>>>(q, rq, y, cd, kd, dm.H_k, dm.d_k, 0);
    CU_LAUNCHED();
    k_l2norm_rows<<<(unsigned)(T * dm.H_k), THREADS, 0, c->stream>>>(k, rk, y, cd, kd, dm.H_k, dm.d_k, kd);
    CU_LAUNCHED();
    k_gdn_gates<<<blocks_for(T * vd), THREADS, 0, c->stream>>>(v, beta, g, y, ba, A_log, dt_bias, T, cd, kd, vd,
                                                               dm.H_v);
    CU_LAUNCHED();
}

/* dx = r·dy − r³·x·Σ dy·x per (token, head) row, into the conv output's q or k rows. */
__global__ static void k_l2norm_rows_bwd(float *dy, const float *dx_in, const float *y, const float *rn, int64_t cd,
                                         int64_t kd, int Hk, int dk, int64_t off) {
    int64_t t = blockIdx.x / Hk;
    int h = (int)(blockIdx.x % Hk);
    const float *xr = y + t * cd + off + (int64_t)h * dk, *dr = dx_in + t * kd + (int64_t)h * dk;
    double dot = 0;
    for (int i = threadIdx.x; i < dk; i += THREADS) dot += (double)dr[i] * xr[i];
    dot = block_sum(dot);
    float s = rn[t * Hk + h];
    float cc = (float)(dot * (double)s * s * s);
    for (int i = threadIdx.x; i < dk; i += THREADS) dy[t * cd + off + (int64_t)h * dk + i] = s * dr[i] - cc * xr[i];
}
/* The gates' backward per element, and dv into the conv output's v rows. */
__global__ static void k_gdn_gates_bwd(float *dy, float *dba, const float *dv, const float *dbeta, const float *dg,
                                       const float *ba, const float *beta, const float *A_log, const float *dt_bias,
                                       int64_t T, int64_t cd, int64_t kd, int64_t vd, int Hv) {
    GRID_STRIDE(i, T * vd) dy[(i / vd) * cd + 2 * kd + i % vd] = dv[i];
    GRID_STRIDE(i, T * Hv) {
        int64_t t = i / Hv;
        int h = (int)(i % Hv);
        float bt = beta[i];
        dba[t * 2 * Hv + h] = dbeta[i] * bt * (1.0f - bt);
        dba[t * 2 * Hv + Hv + h] = dg[i] * -expf(A_log[h]) * sigmoid_d(ba[t * 2 * Hv + Hv + h] + dt_bias[h]);
    }
}
/* The per-head sums over tokens in token order (one thread per head): ddt_bias += da,
 * dA_log += dg·g. */
__global__ static void k_gdn_head_sums(float *dA_log, float *ddt_bias, const float *dba, const float *dg,
                                       const float *g, int64_t T, int Hv) {
    GRID_STRIDE(h, Hv) {
        for (int64_t t = 0; t < T; t++) {
            if (ddt_bias) ddt_bias[h] += dba[t * 2 * Hv + Hv + h];
            if (dA_log) dA_log[h] += dg[t * Hv + h] * g[t * Hv + h];
        }
    }
}
extern "C" void ls_cuda_gdn_prep_bwd(cuda_ctx *c, float *dy, float *dba, float *dA_log, float *ddt_bias,
                                     const float *dq, const float *dk, const float *dv, const float *dbeta,
                                     const float *dg, const float *y, const float *rq, const float *rk, const float *ba,
                                     const float *beta, const float *g, const float *A_log, const float *dt_bias,
                                     int64_t T, ls_gdr_dims dm) {
    if (T <= 0) return;
    int64_t kd = (int64_t)dm.H_k * dm.d_k, vd = (int64_t)dm.H_v * dm.d_v, cd = 2 * kd + vd;
    k_gdn_gates_bwd<<<blocks_for(T * vd), THREADS, 0, c->stream>>>(dy, dba, dv, dbeta, dg, ba, beta, A_log, dt_bias, T,
                                                                   cd, kd, vd, dm.H_v);
    CU_LAUNCHED();
    if (dA_log || ddt_bias) {
        k_gdn_head_sums<<<blocks_for(dm.H_v), THREADS, 0, c->stream>>>(dA_log, ddt_bias, dba, dg, g, T, dm.H_v);
        CU_LAUNCHED();
    }
    k_l2norm_rows_bwd<<<(unsigned)(T * dm.H_k), THREADS, 0, c->stream>>>(dy, dq, y, rq, cd, kd, dm.H_k, dm.d_k, 0);
    CU_LAUNCHED();
    k_l2norm_rows_bwd<<<(unsigned)(T * dm.H_k), THREADS, 0, c->stream>>>(dy, dk, y, rk, cd, kd, dm.H_k, dm.d_k, kd);
    CU_LAUNCHED();
}

/* ---- the gated delta rule, token-serial (gdr.c) ----------------------------------------- */

#define GDR_MAX_DK 256
/* One thread per (value head h, column j) of the state, its column in local memory:
 * per token S̃ = e^g·S; u = β(v_j − k·S̃_j); S_j = S̃_j + k·u; o_j = scale·q·S_j — the CPU's
 * order of operations (serial_block_tail). tape (NULL skips): the state at the start of
 * every chunk of 64 tokens. */
__global__ static void k_gdr_serial(float *o, float *tape, float *state, const float *q, const float *k,
                                    const float *v, const float *beta, const float *g, int64_t T, ls_gdr_dims dm) {
    int64_t dk = dm.d_k, dv = dm.d_v, rep = dm.H_v / dm.H_k;
    GRID_STRIDE(i, (int64_t)dm.H_v * dv) {
        int64_t h = i / dv, j = i % dv, hk = h / rep;
        float S[GDR_MAX_DK];
        float *Sg = state + h * dk * dv + j;
        for (int64_t d = 0; d < dk; d++) S[d] = Sg[d * dv];
        for (int64_t t = 0; t < T; t++) {
            if (tape && t % 64 == 0)
                for (int64_t d = 0; d < dk; d++) tape[(t / 64) * dm.H_v * dk * dv + h * dk * dv + d * dv + j] = S[d];
            const float *qt = q + (t * dm.H_k + hk) * dk, *kt = k + (t * dm.H_k + hk) * dk;
            float a = expf(g[t * dm.H_v + h]), b = beta[t * dm.H_v + h], acc = 0.0f;
            for (int64_t d = 0; d < dk; d++) acc += kt[d] * S[d];
            float u = b * (v[(t * dm.H_v + h) * dv + j] - a * acc);
            acc = 0.0f;
            for (int64_t d = 0; d < dk; d++) {
                float s = a * S[d] + kt[d] * u;
                S[d] = s;
                acc += qt[d] * s;
            }
            o[(t * dm.H_v + h) * dv + j] = dm.scale * acc;
        }
        for (int64_t d = 0; d < dk; d++) Sg[d * dv] = S[d];
    }
}
static void gdr_serial(cuda_ctx *c, float *o, float *tape, float *state, const float *q, const float *k,
                       const float *v, const float *beta, const float *g, int64_t T, ls_gdr_dims dm) {
    LS_ASSERT(dm.H_k > 0 && dm.H_v > 0 && dm.H_v % dm.H_k == 0 && dm.d_k > 0 && dm.d_k <= GDR_MAX_DK && dm.d_v > 0,
              "H_k %d H_v %d d_k %d d_v %d", dm.H_k, dm.H_v, dm.d_k, dm.d_v);
    if (T <= 0) return;
    k_gdr_serial<<<blocks_for((int64_t)dm.H_v * dm.d_v), 64, 0, c->stream>>>(o, tape, state, q, k, v, beta, g, T, dm);
    CU_LAUNCHED();
}
extern "C" void ls_cuda_gdr_serial_fwd(cuda_ctx *c, float *o, float *state, const float *q, const float *k,
                                       const float *v, const float *beta, const float *g, int64_t T, ls_gdr_dims dm) {
    gdr_serial(c, o, NULL, state, q, k, v, beta, g, T, dm);
}
/* The chunked form's contract computed token-serially: the same outputs up to rounding,
 * the chunk-start states on the tape. A first, correct step; the chunked WY/UT kernel on
 * tensor cores replaces it. */
extern "C" ls_status ls_cuda_gdr_chunk_fwd(cuda_ctx *c, float *o, float *tape_h, float *state, const float *q,
                                           const float *k, const float *v, const float *beta, const float *g, int64_t T,
                                           ls_gdr_dims dm, ls_arena *scratch) {
    (void)scratch;
    gdr_serial(c, o, tape_h, state, q, k, v, beta, g, T, dm);
    return LS_OK;
}

/* One token of each of n sequences: thread per (sequence, value head, column). */
__global__ static void k_gdr_step_seqs(float *o, float *const *states, const float *q, const float *k, const float *v,
                                       const float *beta, const float *g, int64_t n, ls_gdr_dims dm) {
    int64_t dk = dm.d_k, dv = dm.d_v, rep = dm.H_v / dm.H_k, per = (int64_t)dm.H_v * dv;
    GRID_STRIDE(i, n * per) {
        int64_t s = i / per, h = i % per / dv, j = i % dv, hk = h / rep;
        float *S = states[s] + h * dk * dv + j;
        const float *qt = q + (s * dm.H_k + hk) * dk, *kt = k + (s * dm.H_k + hk) * dk;
        float a = expf(g[s * dm.H_v + h]), b = beta[s * dm.H_v + h], acc = 0.0f;
        for (int64_t d = 0; d < dk; d++) acc += kt[d] * S[d * dv];
        float u = b * (v[(s * dm.H_v + h) * dv + j] - a * acc);
        acc = 0.0f;
        for (int64_t d = 0; d < dk; d++) {
            float x = a * S[d * dv] + kt[d] * u;
            S[d * dv] = x;
            acc += qt[d] * x;
        }
        o[(s * dm.H_v + h) * dv + j] = dm.scale * acc;
    }
}
extern "C" void ls_cuda_gdr_step_seqs(cuda_ctx *c, float *o, float *const *states, const float *q, const float *k,
                                      const float *v, const float *beta, const float *g, int64_t n, ls_gdr_dims dm) {
    if (n <= 0) return;
    float *const *d = (float *const *)ls_cuda_stage_table(c, (void *const *)states, n);
    k_gdr_step_seqs<<<blocks_for(n * dm.H_v * dm.d_v), THREADS, 0, c->stream>>>(o, d, q, k, v, beta, g, n, dm);
    CU_LAUNCHED();
    ls_cuda_unstage(c, (const void *)d);
}

/* One token of each of n sequences through the conv: thread per (sequence, channel), which
 * also shifts that channel of the sequence's tail. */
__global__ static void k_conv_step_seqs(float *y, float *const *tails, const float *x, const float *w, int64_t n,
                                        int64_t C, int64_t W) {
    int64_t Wm = W - 1;
    GRID_STRIDE(i, n * C) {
        int64_t s = i / C, ch = i % C;
        float *tail = tails[s];
        float acc = 0.0f;
        for (int64_t j = 0; j < W; j++) acc += w[ch * W + j] * (j < Wm ? tail[j * C + ch] : x[i]);
        y[i] = acc / (1.0f + expf(-acc));
        for (int64_t r = 0; r + 1 < Wm; r++) tail[r * C + ch] = tail[(r + 1) * C + ch];
        if (Wm > 0) tail[(Wm - 1) * C + ch] = x[i];
    }
}
extern "C" void ls_cuda_conv_step_seqs(cuda_ctx *c, float *y, float *const *tails, const float *x, const float *w,
                                       int64_t n, int64_t C, int64_t W) {
    if (n <= 0 || C <= 0) return;
    float *const *d = (float *const *)ls_cuda_stage_table(c, (void *const *)tails, n);
    k_conv_step_seqs<<<blocks_for(n * C), THREADS, 0, c->stream>>>(y, d, x, w, n, C, W);
    CU_LAUNCHED();
    ls_cuda_unstage(c, (const void *)d);
}

/* ---- MoE routing (gates.c, mla_ops.c): the CPU's selection, token by token ---------------- */

/* One thread per token (rows.h, the CPU's own code). */
__global__ static void k_moe_route(float *probs, int32_t *sel, float *wt, const float *logits, int64_t T, int E, int K,
                                   int norm_topk) {
    GRID_STRIDE(t, T) ls_moe_route_row(probs + t * E, sel + t * K, wt + t * K, logits + t * E, E, K, norm_topk);
}
extern "C" void ls_cuda_moe_route(cuda_ctx *c, float *probs, int32_t *sel, float *wt, const float *logits, int64_t T,
                                  int E, int K, int norm_topk) {
    if (T <= 0) return;
    k_moe_route<<<blocks_for(T), 64, 0, c->stream>>>(probs, sel, wt, logits, T, E, K, norm_topk);
    CU_LAUNCHED();
}

/* One block per token, its first thread the CPU's code (rows.h), dp in shared memory. */
__global__ static void k_moe_route_bwd(float *dlogits, const float *dwt, const float *probs, const int32_t *sel,
                                       const float *wt, int E, int K, int norm_topk) {
    __shared__ double dp[1024];
    int64_t t = blockIdx.x;
    if (threadIdx.x == 0)
        ls_moe_route_bwd_row(dlogits + t * E, dwt + t * K, probs + t * E, sel + t * K, wt + t * K, E, K, norm_topk, dp);
}
extern "C" void ls_cuda_moe_route_bwd(cuda_ctx *c, float *dlogits, const float *dwt, const float *probs,
                                      const int32_t *sel, const float *wt, int64_t T, int E, int K, int norm_topk) {
    LS_ASSERT(E <= 1024, "too many experts for the router backward: %d", E);
    if (T <= 0) return;
    k_moe_route_bwd<<<(unsigned)T, 32, 0, c->stream>>>(dlogits, dwt, probs, sel, wt, E, K, norm_topk);
    CU_LAUNCHED();
}

/* Rows grouped by expert, one thread in the CPU's order: prefix counts, then each row at
 * its expert's next slot (ascending within an expert). */
__global__ static void k_moe_group(int64_t *count, int64_t *rows, int64_t *fill, const int32_t *sel, int64_t n, int E) {
    for (int e = 0; e <= E; e++) count[e] = 0;
    for (int e = 0; e < E; e++) fill[e] = 0;
    for (int64_t i = 0; i < n; i++) count[sel[i] + 1]++;
    for (int e = 0; e < E; e++) count[e + 1] += count[e];
    for (int64_t i = 0; i < n; i++) rows[count[sel[i]] + fill[sel[i]]++] = i;
}
extern "C" ls_status ls_cuda_moe_group(cuda_ctx *c, int64_t *count, int64_t *rows, const int32_t *sel, int64_t T,
                                       int E, int K, ls_arena *sc) {
    ls_arena_mark mk = ls_arena_get_mark(sc);
    int64_t *fill = (int64_t *)ls_arena_alloc(sc, (size_t)E * sizeof(int64_t));
    if (!fill) return LS_ERR_NOMEM;
    k_moe_group<<<1, 1, 0, c->stream>>>(count, rows, fill, sel, T * K, E);
    CU_LAUNCHED();
    ls_arena_release(sc, mk); /* the stream orders the next user of the block after the kernel */
    return LS_OK;
}

/* The MLA family's routing, one block per token: σ and the biased scores in shared
 * memory (in parallel), then thread 0 picks the groups and the experts (rows.h, the
 * CPU's own code). */
__global__ static void k_mla_route_fwd(int32_t *sel, float *wt, float *s_out, const float *logits, const float *bias,
                                       int E, int K, int n_group, int topk_group, int norm, double scaling) {
    __shared__ double s[1024], sb[1024];
    __shared__ unsigned char keep[1024];
    int64_t t = blockIdx.x;
    const float *lg = logits + t * E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        s[e] = 1.0 / (1.0 + exp(-(double)lg[e]));
        sb[e] = s[e] + (bias ? (double)bias[e] : 0.0);
        keep[e] = 1;
        if (s_out) s_out[t * E + e] = (float)s[e];
    }
    __syncthreads();
    if (threadIdx.x == 0) /* the kept groups hold K experts: checked on the host */
        (void)ls_mla_route_pick(sel + t * K, wt + t * K, s, sb, keep, E, K, n_group, topk_group, norm, scaling);
}
extern "C" void ls_cuda_mla_route_fwd(cuda_ctx *c, int32_t *sel, float *wt, float *s_out, const float *logits,
                                      const float *bias, int64_t T, int E, int K, int n_group, int topk_group, int norm,
                                      double scaling) {
    int kept = n_group > 1 && topk_group < n_group ? topk_group * (E / n_group) : E; /* rows.h's rule */
    LS_ASSERT(E <= 1024 && n_group >= 1 && n_group <= LS_ROUTE_MAX_GROUPS && E % n_group == 0 && K <= kept,
              "routing of %d experts in %d groups, %d of them kept, top %d", E, n_group, topk_group, K);
    if (T <= 0) return;
    k_mla_route_fwd<<<(unsigned)T, 128, 0, c->stream>>>(sel, wt, s_out, logits, bias, E, K, n_group, topk_group, norm,
                                                        scaling);
    CU_LAUNCHED();
}

__global__ static void k_mla_route_bwd(float *dlogits, const float *dwt, const float *s, const int32_t *sel, int64_t T,
                                       int E, int K, int norm, double scaling) {
    GRID_STRIDE(t, T) ls_mla_route_bwd_row(dlogits + t * E, dwt + t * K, s + t * E, sel + t * K, E, K, norm, scaling);
}
extern "C" void ls_cuda_mla_route_bwd(cuda_ctx *c, float *dlogits, const float *dwt, const float *s, const int32_t *sel,
                                      int64_t T, int E, int K, int norm, double scaling) {
    if (T <= 0) return;
    k_mla_route_bwd<<<blocks_for(T), 64, 0, c->stream>>>(dlogits, dwt, s, sel, T, E, K, norm, scaling);
    CU_LAUNCHED();
}

/* ---- the gated delta rule's backward (gdr.c's contract), token-serial ----------------- */

/* One block per value head h, a thread per state column j (blockDim = d_v). Chunks of 64
 * from the last: the chunk's states before each token are recomputed from the tape into
 * Sst, then the tokens run backwards with each thread's column of dS in local memory:
 *   S_t = a·S + k·uᵀ, u = β(v − a·Sᵀk), o_t = scale·S_tᵀq:
 *   dS_t += scale·q·do_j;  du_j = k·dS_t;  dv_j = β·du_j;  dβ += du_j·(v_j − a·k·S_j);
 *   c_j = −β·a·du_j;  dk += dS_t·u_j + c_j·S_j;  dq += scale·S_t·do_j;
 *   da += dS_t·S_j − β·du_j·(k·S_j), dg = a·da;  dS ← a·dS_t + c_j·k.
 * Sums over columns go through global scratch in column order (deterministic): dq and
 * dk per value head into dqh/dkh, summed over the heads sharing a key head afterwards. */
__global__ static void k_gdr_bwd(float *dqh, float *dkh, float *dv, float *dbeta, float *dg, float *dstate0,
                                 const float *dout, const float *dstate_T, const float *tape, const float *q,
                                 const float *k, const float *v, const float *beta, const float *g, float *Sst,
                                 float *contrib, int64_t T, ls_gdr_dims dm) {
    extern __shared__ float sh[];
    int64_t dk = dm.d_k, dvv = dm.d_v, rep = dm.H_v / dm.H_k, H = dm.H_v, SN = dk * dvv;
    int64_t h = blockIdx.x, hk = h / rep, j = threadIdx.x;
    float *qs = sh, *ks = sh + dk, *red = ks + dk; /* red: [2, d_v] scalar partials */
    float dS[GDR_MAX_DK];
    float *ctq = contrib + h * 2 * SN, *ctk = ctq + SN; /* [d_v, d_k] each: column j's share */
    for (int64_t d = 0; d < dk; d++) dS[d] = dstate_T ? dstate_T[h * SN + d * dvv + j] : 0.0f;
    int64_t nc = (T + 63) / 64;
    for (int64_t cidx = nc - 1; cidx >= 0; cidx--) {
        int64_t t0 = cidx * 64, t1 = t0 + 64 < T ? t0 + 64 : T;
        /* the states before each token of the chunk, column j */
        float S[GDR_MAX_DK];
        for (int64_t d = 0; d < dk; d++) S[d] = tape[cidx * H * SN + h * SN + d * dvv + j];
        for (int64_t t = t0; t < t1; t++) {
            float *dst = Sst + ((t - t0) * H + h) * SN;
            for (int64_t d = 0; d < dk; d++) dst[d * dvv + j] = S[d];
            const float *kt = k + (t * dm.H_k + hk) * dk;
            float a = expf(g[t * H + h]), b = beta[t * H + h], acc = 0.0f;
            for (int64_t d = 0; d < dk; d++) acc += kt[d] * S[d];
            float u = b * (v[(t * H + h) * dvv + j] - a * acc);
            for (int64_t d = 0; d < dk; d++) S[d] = a * S[d] + kt[d] * u;
        }
        for (int64_t t = t1 - 1; t >= t0; t--) {
            __syncthreads();
            for (int64_t d = j; d < dk; d += blockDim.x)
                qs[d] = q[(t * dm.H_k + hk) * dk + d], ks[d] = k[(t * dm.H_k + hk) * dk + d];
            __syncthreads();
            const float *Sp = Sst + ((t - t0) * H + h) * SN;
            float a = expf(g[t * H + h]), b = beta[t * H + h], doj = dout[(t * H + h) * dvv + j];
            float kS = 0.0f;
            for (int64_t d = 0; d < dk; d++) kS += ks[d] * Sp[d * dvv + j];
            float vj = v[(t * H + h) * dvv + j], u = b * (vj - a * kS);
            float du = 0.0f, da = 0.0f;
            for (int64_t d = 0; d < dk; d++) {
                float St = a * Sp[d * dvv + j] + ks[d] * u;
                dS[d] += dm.scale * qs[d] * doj;
                ctq[j * dk + d] = dm.scale * St * doj;
                du += ks[d] * dS[d];
            }
            dv[(t * H + h) * dvv + j] = b * du;
            float cj = -b * a * du;
            for (int64_t d = 0; d < dk; d++) {
                float sp = Sp[d * dvv + j];
                ctk[j * dk + d] = dS[d] * u + cj * sp;
                da += dS[d] * sp;
                dS[d] = a * dS[d] + cj * ks[d];
            }
            da += -b * du * kS;
            red[j] = du * (vj - a * kS);
            red[blockDim.x + j] = da;
            __syncthreads();
            for (int64_t d = j; d < dk; d += blockDim.x) { /* column order */
                float sq = 0.0f, sk = 0.0f;
                for (int64_t jj = 0; jj < dvv; jj++) sq += ctq[jj * dk + d], sk += ctk[jj * dk + d];
                dqh[(t * H + h) * dk + d] = sq;
                dkh[(t * H + h) * dk + d] = sk;
            }
            if (j == 0) {
                float sb = 0.0f, sa = 0.0f;
                for (int64_t jj = 0; jj < dvv; jj++) sb += red[jj], sa += red[blockDim.x + jj];
                dbeta[t * H + h] = sb;
                dg[t * H + h] = a * sa;
            }
        }
    }
    if (dstate0)
        for (int64_t d = 0; d < dk; d++) dstate0[h * SN + d * dvv + j] = dS[d];
}
/* dq, dk [T, H_k, d_k] (=): the value heads of each key head summed in head order. */
__global__ static void k_gdr_group_sum(float *dq, float *dk, const float *dqh, const float *dkh, int64_t T,
                                       ls_gdr_dims dm) {
    int64_t rep = dm.H_v / dm.H_k;
    GRID_STRIDE(i, T * dm.H_k * dm.d_k) {
        int64_t t = i / ((int64_t)dm.H_k * dm.d_k), hk = i / dm.d_k % dm.H_k, d = i % dm.d_k;
        float sq = 0.0f, sk = 0.0f;
        for (int64_t r = 0; r < rep; r++) {
            int64_t h = hk * rep + r;
            sq += dqh[(t * dm.H_v + h) * dm.d_k + d];
            sk += dkh[(t * dm.H_v + h) * dm.d_k + d];
        }
        dq[i] = sq, dk[i] = sk;
    }
}
extern "C" ls_status ls_cuda_gdr_chunk_bwd(cuda_ctx *c, float *dq, float *dk, float *dv, float *dbeta, float *dg,
                                           float *dstate0, const float *dout, const float *dstate_T,
                                           const float *tape_h, const float *q, const float *k, const float *v,
                                           const float *beta, const float *g, int64_t T, ls_gdr_dims dm,
                                           ls_arena *scratch) {
    LS_ASSERT(dm.H_k > 0 && dm.H_v > 0 && dm.H_v % dm.H_k == 0 && dm.d_k > 0 && dm.d_k <= GDR_MAX_DK && dm.d_v > 0 &&
                  dm.d_v <= 1024, "H_k %d H_v %d d_k %d d_v %d", dm.H_k, dm.H_v, dm.d_k, dm.d_v);
    int64_t SN = (int64_t)dm.d_k * dm.d_v, H = dm.H_v;
    if (T <= 0) {
        if (dstate0) {
            if (dstate_T) CU_CK(cudaMemcpyAsync(dstate0, dstate_T, (size_t)(H * SN) * sizeof(float),
                                                cudaMemcpyDeviceToDevice, c->stream));
            else CU_CK(cudaMemsetAsync(dstate0, 0, (size_t)(H * SN) * sizeof(float), c->stream));
        }
        return LS_OK;
    }
    ls_arena_mark mk = ls_arena_get_mark(scratch);
    int64_t chunk = T < 64 ? T : 64;
    float *Sst = (float *)ls_arena_alloc(scratch, (size_t)(chunk * H * SN) * sizeof(float));
    float *contrib = (float *)ls_arena_alloc(scratch, (size_t)(2 * H * SN) * sizeof(float));
    float *dqh = (float *)ls_arena_alloc(scratch, (size_t)(2 * T * H * dm.d_k) * sizeof(float));
    if (!Sst || !contrib || !dqh) {
        ls_arena_release(scratch, mk);
        return ls_err(LS_ERR_NOMEM, "gdr backward: scratch for %lld tokens", (long long)T);
    }
    float *dkh = dqh + T * H * dm.d_k;
    size_t smem = (size_t)(2 * dm.d_k + 2 * dm.d_v) * sizeof(float);
    k_gdr_bwd<<<(unsigned)H, (unsigned)dm.d_v, smem, c->stream>>>(dqh, dkh, dv, dbeta, dg, dstate0, dout, dstate_T,
                                                                  tape_h,
                                                                  q, k, v, beta, g, Sst, contrib, T, dm);
    CU_LAUNCHED();
    k_gdr_group_sum<<<blocks_for(T * dm.H_k * dm.d_k), THREADS, 0, c->stream>>>(dq, dk, dqh, dkh, T, dm);
    CU_LAUNCHED();
    ls_arena_release(scratch, mk);
    return LS_OK;
}
