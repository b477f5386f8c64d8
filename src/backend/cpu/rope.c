/*
 * rope.c — partial rotate-half rotary embedding (specs/hybrid-qwen3next.md §4.3):
 * dims [0, rot) of each head rotate, channel j paired with j + rot/2, angle
 * p·theta^(−2j/rot); dims ≥ rot pass through. Angles are computed in double per
 * position so large positions (millions) keep their precision.
 */
#include <math.h>

#include "longstraw/kernels.h"

/* Rotate dims [0, rot) of every head of x[T, heads, hd] by angle sign·(pos0+t)·inv_freq_j:
 * sign = +1 is R (the forward), sign = −1 is Rᵀ = R⁻¹ (the backward). */
static void rope_apply(float *x, int64_t T, int heads, int hd, int rot, double theta, int64_t pos0,
                       float sign) {
    int half = rot / 2;
    if (half <= 0 || T <= 0) return;
    LS_ASSERT(half <= 512, "rotary dim %d too large", rot);
    double inv[512]; /* the channels' frequencies, once per call (the same bits as per position) */
    for (int j = 0; j < half; j++) inv[j] = pow(theta, -2.0 * j / (double)rot);
#pragma omp parallel for schedule(static) if (T * heads * hd > 65536)
    for (int64_t t = 0; t < T; t++) {
        float cs[512], sn[512];
        double p = (double)(pos0 + t);
        for (int j = 0; j < half; j++) {
            double ang = p * inv[j];
            cs[j] = (float)cos(ang);
            sn[j] = sign * (float)sin(ang);
        }
        for (int h = 0; h < heads; h++) {
            float *v = x + (t * heads + h) * (int64_t)hd;
            for (int j = 0; j < half; j++) {
                float a = v[j], b = v[j + half];
                v[j] = a * cs[j] - b * sn[j];
                v[j + half] = b * cs[j] + a * sn[j];
            }
        }
    }
}

/* x[T,heads,hd] ← R·x, in place */
void ls_rope_fwd(float *x, int64_t T, int heads, int hd, int rot, double theta, int64_t pos0) {
    rope_apply(x, T, heads, hd, rot, theta, pos0, 1.0f);
}

/* dx[T,heads,hd] (= in place) ← Rᵀ·dx. Each pair rotates by an orthogonal 2×2 block, so Rᵀ is
 * the same rotation with sin negated (bit-for-bit the transpose of the forward's f32 R);
 * dims ≥ rot pass through. */
void ls_rope_bwd(float *dx, int64_t T, int heads, int hd, int rot, double theta, int64_t pos0) {
    rope_apply(dx, T, heads, hd, rot, theta, pos0, -1.0f);
}
