/*
 * activation.c — SwiGLU: SiLU(gate) ⊙ up on a fused [gate | up] projection.
 */
#include <math.h>

#include "longstraw/kernels.h"

/* out[T,I] = SiLU(gu[t,0:I]) ⊙ gu[t,I:2I] */
void ls_swiglu_fwd(float *out, const float *gu, int64_t T, int64_t I) {
#pragma omp parallel for schedule(static) if (T * I > 65536)
    for (int64_t t = 0; t < T; t++) {
        const float *g = gu + t * 2 * I, *u = g + I;
        float *o = out + t * I;
        for (int64_t i = 0; i < I; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}
