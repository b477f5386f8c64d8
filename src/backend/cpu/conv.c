/*
 * conv.c — causal depthwise conv + SiLU over the Gated DeltaNet q/k/v channels
 * (specs/hybrid-qwen3next.md §2.2), carrying the last W−1 inputs across calls so a
 * sequence can be processed in chunks (prompt capture) and continued (branches).
 */
#include <string.h>
#include <math.h>

#include "backend/cpu/vec.h"
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
        ls_sigmoid_n(yt, yt, C, 1); /* SiLU */
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

/* Channels per block of the backward; a block keeps the last W rows of dpre, its weights
 * transposed, and W·CONV_C_BLOCK double dw accumulators on the stack (≤ 32 KiB). */
#define CONV_C_BLOCK 64
#define CONV_MAX_W 32

/* dx[T,C] (=), dw[C,W] (+=; NULL skips), dtail[W−1,C] (=; NULL skips).
 * Write x̃ = [tail_in ; x] ([W−1+T, C], oldest first), so pre[t,c] = Σ_j w[c,j]·x̃[t+j,c]
 * and y = SiLU(pre). With dpre = dy·SiLU'(pre), SiLU'(p) = σ(p)·(1 + p·(1−σ(p))):
 *   dx̃[u,c] = Σ_{j : 0 ≤ u−j < T} w[c,j]·dpre[u−j,c]   (dtail = dx̃[0, W−1), dx = dx̃[W−1, ·)),
 *   dw[c,j] += Σ_t dpre[t,c]·x̃[t+j,c].
 * Each channel block walks u = 0 .. T+W−2 once, keeping the last W rows of dpre in a ring.
 * tail_in is only read for dw (it may be NULL when dw is). */
void ls_conv_bwd(float *dx, float *dw, float *dtail, const float *dy, const float *pre,
                 const float *x, const float *tail_in, const float *w, int64_t T, int64_t C,
                 int64_t W) {
    LS_ASSERT(W >= 1 && W <= CONV_MAX_W, "conv width %lld outside [1, %d]", (long long)W,
              CONV_MAX_W);
    int64_t Wm = W - 1;
    if (C <= 0) return;
    if (T <= 0) {
        if (dtail && Wm > 0) memset(dtail, 0, (size_t)(Wm * C) * sizeof(float));
        return;
    }
    LS_ASSERT(!dw || Wm == 0 || tail_in, "conv bwd: dw needs the initial tail");
    int64_t nb = (C + CONV_C_BLOCK - 1) / CONV_C_BLOCK;
#pragma omp parallel for schedule(static) if (T * C > 65536)
    for (int64_t b = 0; b < nb; b++) {
        int64_t c0 = b * CONV_C_BLOCK;
        int64_t n = C - c0 < CONV_C_BLOCK ? C - c0 : CONV_C_BLOCK;
        float ring[CONV_MAX_W][CONV_C_BLOCK]; /* ring[t mod W] = dpre[t, c0:c0+n] */
        float wt[CONV_MAX_W][CONV_C_BLOCK];   /* wt[j][c] = w[c0+c, j] */
        double acc[CONV_MAX_W][CONV_C_BLOCK]; /* acc[j][c] → dw[c0+c, j] */
        for (int64_t j = 0; j < W; j++)
            for (int64_t c = 0; c < n; c++) {
                wt[j][c] = w[(c0 + c) * W + j];
                acc[j][c] = 0.0;
            }
        for (int64_t u = 0; u < T + Wm; u++) {
            if (u < T) {
                /* dpre of row t = u, and its dw terms dpre[t]·x̃[t+j] */
                float *dp = ring[u % W];
                const float *dyt = dy + u * C + c0, *pt = pre + u * C + c0;
                for (int64_t c = 0; c < n; c++) {
                    float p = pt[c], sig = 1.0f / (1.0f + expf(-p));
                    dp[c] = dyt[c] * (sig * (1.0f + p * (1.0f - sig)));
                }
                if (dw)
                    for (int64_t j = 0; j < W; j++) {
                        int64_t v = u + j;
                        const float *xv = v < Wm ? tail_in + v * C + c0 : x + (v - Wm) * C + c0;
                        for (int64_t c = 0; c < n; c++) acc[j][c] += (double)(dp[c] * xv[c]);
                    }
            }
            /* dx̃[u] = Σ_j w[c,j]·dpre[u−j] over the rows of dpre that exist */
            float *out = u < Wm ? (dtail ? dtail + u * C + c0 : NULL)
                                : (dx ? dx + (u - Wm) * C + c0 : NULL);
            if (!out) continue;
            for (int64_t c = 0; c < n; c++) out[c] = 0.0f;
            for (int64_t j = 0; j < W; j++) {
                int64_t t = u - j;
                if (t < 0 || t >= T) continue;
                const float *dp = ring[t % W];
                for (int64_t c = 0; c < n; c++) out[c] += wt[j][c] * dp[c];
            }
        }
        if (dw)
            for (int64_t j = 0; j < W; j++)
                for (int64_t c = 0; c < n; c++) dw[(c0 + c) * W + j] += (float)acc[j][c];
    }
}
