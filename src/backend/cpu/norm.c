/*
 * norm.c — zero-centred RMSNorm (1+w), gated RMSNorm (w·SiLU(z)) and the L2 norm
 * of Gated DeltaNet q/k (specs/hybrid-qwen3next.md §2.5, §2.7, §5). Row statistics
 * accumulate in double.
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/vec.h"
#include "longstraw/kernels.h"

/* Column block of the weight-gradient reduction: DW_BLOCK double accumulators per thread. */
#define DW_BLOCK 64

static inline float silu_f(float z) { return z / (1.0f + expf(-z)); }

/* dw[D] += Σ_r dy[r,i]·x[r,i]·rstd[r]·(z ? SiLU(z[r,i]) : 1), accumulated in double over
 * rows. Parallel over column blocks so no two threads write the same dw[i]. */
static void norm_dw_accum(float *dw, const float *dy, const float *x, const float *z,
                          const float *rstd, int64_t rows, int64_t D) {
    int64_t nb = (D + DW_BLOCK - 1) / DW_BLOCK;
#pragma omp parallel for schedule(static) if (rows * D > 65536)
    for (int64_t b = 0; b < nb; b++) {
        int64_t i0 = b * DW_BLOCK, n = D - i0 < DW_BLOCK ? D - i0 : DW_BLOCK;
        double acc[DW_BLOCK] = {0};
        for (int64_t r = 0; r < rows; r++) {
            const float *dyr = dy + r * D + i0, *xr = x + r * D + i0;
            double s = rstd[r];
            if (z) {
                const float *zr = z + r * D + i0;
                for (int64_t i = 0; i < n; i++) acc[i] += (double)(dyr[i] * xr[i] * silu_f(zr[i])) * s;
            } else {
                for (int64_t i = 0; i < n; i++) acc[i] += (double)(dyr[i] * xr[i]) * s;
            }
        }
        for (int64_t i = 0; i < n; i++) dw[i0 + i] += (float)acc[i];
    }
}

/* 1/sqrt(Σx²/div + eps) of one row, accumulated in double. */
static float row_rscale(const float *x, int64_t D, double div, float eps) {
    double ss = 0;
    for (int64_t i = 0; i < D; i++) ss += (double)x[i] * x[i];
    return (float)(1.0 / sqrt(ss / div + (double)eps));
}

/* y[rows,D] = x·rsqrt(mean(x²)+eps)·(one+w): one = 1 for the zero-centred form, 0 for
 * the plain one; rstd[rows] saved when non-NULL */
static void rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, int64_t rows, int64_t D, float eps,
                        float one) {
#pragma omp parallel for schedule(static) if (rows * D > 65536)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * D;
        float *yr = y + r * D;
        float s = row_rscale(xr, D, (double)D, eps);
        if (rstd) rstd[r] = s;
        for (int64_t i = 0; i < D; i++) yr[i] = xr[i] * s * (one + w[i]);
    }
}

/* dx[rows,D] (=), dw[D] (+=; NULL skips); dx may alias dy.
 * With s = rstd, y_i = x_i·s·(one+w_i) and ∂s/∂x_k = −s³·x_k/D:
 *   dx_k = s·(one+w_k)·dy_k − (s³/D)·x_k·Σ_i dy_i·(one+w_i)·x_i,   dw_i += Σ_rows dy_i·x_i·s. */
static void rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *rstd, const float *w,
                        int64_t rows, int64_t D, float one) {
    if (rows <= 0 || D <= 0) return;
    /* dw first: it reads dy, which dx may overwrite. */
    if (dw) norm_dw_accum(dw, dy, x, NULL, rstd, rows, D);
#pragma omp parallel for schedule(static) if (rows * D > 65536)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * D, *dyr = dy + r * D;
        float *dxr = dx + r * D;
        double dot = 0;
        for (int64_t i = 0; i < D; i++) dot += (double)(dyr[i] * (one + w[i])) * xr[i];
        float s = rstd[r];
        float c = (float)(dot * (double)s * s * s / (double)D);
        for (int64_t i = 0; i < D; i++) dxr[i] = s * (one + w[i]) * dyr[i] - c * xr[i];
    }
}

void ls_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, int64_t rows, int64_t D, float eps) {
    rmsnorm_fwd(y, rstd, x, w, rows, D, eps, 1.0f);
}
void ls_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *rstd, const float *w,
                    int64_t rows, int64_t D) {
    rmsnorm_bwd(dx, dw, dy, x, rstd, w, rows, D, 1.0f);
}
void ls_rmsnorm_plain_fwd(float *y, float *rstd, const float *x, const float *w, int64_t rows, int64_t D, float eps) {
    rmsnorm_fwd(y, rstd, x, w, rows, D, eps, 0.0f);
}
void ls_rmsnorm_plain_bwd(float *dx, float *dw, const float *dy, const float *x, const float *rstd, const float *w,
                          int64_t rows, int64_t D) {
    rmsnorm_bwd(dx, dw, dy, x, rstd, w, rows, D, 0.0f);
}

/* y[rows,D] = x·rsqrt(mean(x²)+eps)·w ⊙ SiLU(z) */
void ls_gated_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *z, const float *w,
                          int64_t rows, int64_t D, float eps) {
#pragma omp parallel for schedule(static) if (rows * D > 65536)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * D, *zr = z + r * D;
        float *yr = y + r * D;
        float s = row_rscale(xr, D, (double)D, eps);
        if (rstd) rstd[r] = s;
        int64_t i = 0; /* y may be x: each vector read before it is written */
        for (; i + LS_VL <= D; i += LS_VL) {
            ls_vf zv, xv, wv, g;
            LS_VLOAD(zv, zr + i);
            LS_VLOAD(xv, xr + i);
            LS_VLOAD(wv, w + i);
            LS_VSIGMOID(g, zv);
            g = xv * s * wv * (zv * g);
            LS_VSTORE(yr + i, g);
        }
        if (i < D) { /* the tail as one zero-padded vector: the same arithmetic */
            float zb[LS_VL] = {0}, xb[LS_VL] = {0}, wb[LS_VL] = {0};
            memcpy(zb, zr + i, (size_t)(D - i) * sizeof(float));
            memcpy(xb, xr + i, (size_t)(D - i) * sizeof(float));
            memcpy(wb, w + i, (size_t)(D - i) * sizeof(float));
            ls_vf zv, xv, wv, g;
            LS_VLOAD(zv, zb);
            LS_VLOAD(xv, xb);
            LS_VLOAD(wv, wb);
            LS_VSIGMOID(g, zv);
            g = xv * s * wv * (zv * g);
            LS_VSTORE(zb, g);
            memcpy(yr + i, zb, (size_t)(D - i) * sizeof(float));
        }
    }
}

/* dx, dz [rows,D] (=), dw[D] (+=; NULL skips); dx may alias dy (dz may not).
 * With g = SiLU(z), a_i = dy_i·w_i·g_i:
 *   dx_k = s·a_k − (s³/D)·x_k·Σ_i a_i·x_i,
 *   dz_i = dy_i·x_i·s·w_i·SiLU'(z_i),  SiLU'(z) = σ(z)·(1 + z·(1−σ(z))),
 *   dw_i += Σ_rows dy_i·x_i·s·g_i. */
void ls_gated_rmsnorm_bwd(float *dx, float *dz, float *dw, const float *dy, const float *x,
                          const float *z, const float *rstd, const float *w, int64_t rows,
                          int64_t D) {
    if (rows <= 0 || D <= 0) return;
    if (dw) norm_dw_accum(dw, dy, x, z, rstd, rows, D);
#pragma omp parallel for schedule(static) if (rows * D > 65536)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * D, *zr = z + r * D, *dyr = dy + r * D;
        float *dxr = dx + r * D, *dzr = dz + r * D;
        ls_sigmoid_n(dzr, zr, D, 0); /* σ(z) first, where dz goes */
        double dot = 0;
        for (int64_t i = 0; i < D; i++) dot += (double)(dyr[i] * w[i] * (zr[i] * dzr[i])) * xr[i];
        float s = rstd[r];
        float c = (float)(dot * (double)s * s * s / (double)D);
        for (int64_t i = 0; i < D; i++) {
            float zi = zr[i], g = dyr[i]; /* read dy before dx (which may alias it) is written */
            float sig = dzr[i];
            dzr[i] = g * xr[i] * s * w[i] * (sig * (1.0f + zi * (1.0f - sig)));
            dxr[i] = s * g * w[i] * (zi * sig) - c * xr[i];
        }
    }
}

/* y[rows,D] = x / sqrt(Σx² + eps); rnorm[rows] saved when non-NULL */
void ls_l2norm_fwd(float *y, float *rnorm, const float *x, int64_t rows, int64_t D, float eps) {
#pragma omp parallel for schedule(static) if (rows * D > 65536)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * D;
        float *yr = y + r * D;
        float s = row_rscale(xr, D, 1.0, eps);
        if (rnorm) rnorm[r] = s;
        for (int64_t i = 0; i < D; i++) yr[i] = xr[i] * s;
    }
}

/* dx[rows,D] (=); dx may alias dy. With r = rnorm, y = x·r, ∂r/∂x_k = −r³·x_k:
 *   dx_k = r·dy_k − r³·x_k·Σ_i dy_i·x_i. */
void ls_l2norm_bwd(float *dx, const float *dy, const float *x, const float *rnorm, int64_t rows,
                   int64_t D) {
    if (rows <= 0 || D <= 0) return;
#pragma omp parallel for schedule(static) if (rows * D > 65536)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * D, *dyr = dy + r * D;
        float *dxr = dx + r * D;
        double dot = 0;
        for (int64_t i = 0; i < D; i++) dot += (double)dyr[i] * xr[i];
        float s = rnorm[r];
        float c = (float)(dot * (double)s * s * s);
        for (int64_t i = 0; i < D; i++) dxr[i] = s * dyr[i] - c * xr[i];
    }
}
