/*
 * norm.c — zero-centred RMSNorm (1+w), gated RMSNorm (w·SiLU(z)) and the L2 norm
 * of Gated DeltaNet q/k (specs/hybrid-qwen3next.md §2.5, §2.7, §5). Row statistics
 * accumulate in double.
 */
#include <math.h>

#include "longstraw/kernels.h"

/* 1/sqrt(Σx²/div + eps) of one row, accumulated in double. */
static float row_rscale(const float *x, int64_t D, double div, float eps) {
    double ss = 0;
    for (int64_t i = 0; i < D; i++) ss += (double)x[i] * x[i];
    return (float)(1.0 / sqrt(ss / div + (double)eps));
}

/* y[rows,D] = x·rsqrt(mean(x²)+eps)·(1+w); rstd[rows] saved when non-NULL */
void ls_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, int64_t rows,
                    int64_t D, float eps) {
#pragma omp parallel for schedule(static) if (rows * D > 65536)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * D;
        float *yr = y + r * D;
        float s = row_rscale(xr, D, (double)D, eps);
        if (rstd) rstd[r] = s;
        for (int64_t i = 0; i < D; i++) yr[i] = xr[i] * s * (1.0f + w[i]);
    }
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
        for (int64_t i = 0; i < D; i++) {
            float zi = zr[i];
            yr[i] = xr[i] * s * w[i] * (zi / (1.0f + expf(-zi)));
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
