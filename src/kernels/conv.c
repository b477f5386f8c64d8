/*
 * conv.c — causal depthwise conv + SiLU over the Gated DeltaNet q/k/v channels
 * (specs/hybrid-qwen3next.md §2.2), carrying the last W−1 inputs across calls so a
 * sequence can be processed in chunks (prompt capture) and continued (branches).
 */
#include <string.h>
#include <math.h>

#include "longstraw/kernels.h"

/* y[T,C] = SiLU(Σ_j w[c,j]·x[t−(W−1)+j, c]); tail[W−1,C] in/out; pre[T,C] saved if non-NULL */
void ls_conv_fwd(float *y, float *pre, float *tail, const float *x, const float *w, int64_t T,
                 int64_t C, int64_t W) {
    if (T <= 0) return;
    int64_t Wm = W - 1;
#pragma omp parallel for schedule(static) if (T * C > 65536)
    for (int64_t t = 0; t < T; t++) {
        float *yt = y + t * C;
        for (int64_t c = 0; c < C; c++) yt[c] = 0.0f;
        for (int64_t j = 0; j < W; j++) {
            int64_t src = t - Wm + j; /* position relative to this call */
            const float *row = src >= 0 ? x + src * C : tail + (Wm + src) * C;
            for (int64_t c = 0; c < C; c++) yt[c] += w[c * W + j] * row[c];
        }
        if (pre) memcpy(pre + t * C, yt, (size_t)C * sizeof(float));
        for (int64_t c = 0; c < C; c++) yt[c] = yt[c] / (1.0f + expf(-yt[c]));
    }
    /* New tail: the last W−1 inputs, taking from the old tail when T < W−1. */
    if (Wm <= 0) return;
    if (T >= Wm) {
        memcpy(tail, x + (T - Wm) * C, (size_t)(Wm * C) * sizeof(float));
    } else {
        memmove(tail, tail + T * C, (size_t)((Wm - T) * C) * sizeof(float));
        memcpy(tail + (Wm - T) * C, x, (size_t)(T * C) * sizeof(float));
    }
}
