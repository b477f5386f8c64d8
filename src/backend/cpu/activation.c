/*
 * activation.c — SwiGLU: SiLU(gate) ⊙ up on a fused [gate | up] projection.
 */
#include <math.h>

#include "backend/cpu/vec.h"
#include "longstraw/kernels.h"

/* out[T,I] = SiLU(gu[t,0:I]) ⊙ gu[t,I:2I] */
void ls_swiglu_fwd(float *out, const float *gu, int64_t T, int64_t I) {
#pragma omp parallel for schedule(static) if (T * I > 65536)
    for (int64_t t = 0; t < T; t++) {
        const float *g = gu + t * 2 * I, *u = g + I;
        float *o = out + t * I;
        ls_sigmoid_n(o, g, I, 1); /* SiLU(gate), then times up */
        for (int64_t i = 0; i < I; i++) o[i] *= u[i];
    }
}

/* dgu[T,2I] (=) from dout[T,I] and the forward input gu[T,2I]:
 *   dgate = dout·up·SiLU'(gate), SiLU'(g) = σ(g)·(1 + g·(1−σ(g))),   dup = dout·SiLU(gate). */
void ls_swiglu_bwd(float *dgu, const float *dout, const float *gu, int64_t T, int64_t I) {
#pragma omp parallel for schedule(static) if (T * I > 65536)
    for (int64_t t = 0; t < T; t++) {
        const float *g = gu + t * 2 * I, *u = g + I, *d = dout + t * I;
        float *dg = dgu + t * 2 * I, *du = dg + I;
        ls_sigmoid_n(du, g, I, 0); /* σ(gate) first, where dup goes */
        for (int64_t i = 0; i < I; i++) {
            float sig = du[i];
            dg[i] = d[i] * u[i] * (sig * (1.0f + g[i] * (1.0f - sig)));
            du[i] = d[i] * (g[i] * sig);
        }
    }
}
