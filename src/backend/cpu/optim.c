/*
 * optim.c — the optimizer's kernels (kernels.h): AdamW's step and its check pass, the
 * squares a gradient norm sums and the scaling of a gradient.
 */
#include <float.h>
#include <math.h>

#include "longstraw/kernels.h"

/* One element of the step: the new weight and moments. The check and the step share
 * it, so the check sees exactly what the step would write. */
static inline void adamw_elem(const ls_adamw_hp *c, float decay, float w, float g, float m, float v, float *nw,
                              float *nm, float *nv) {
    float gi = (float)(g * c->clip);
    *nm = c->b1 * m + (1.0f - c->b1) * gi;
    *nv = c->b2 * v + (1.0f - c->b2) * gi * gi;
    double mh = *nm / c->bc1, vh = *nv / c->bc2;
    *nw = (float)((double)(w * decay) - c->lr * mh / (sqrt(vh) + c->eps));
}

static inline int elem_bad(float nw, float nm, float nv) {
    return !(fabsf(nw) <= FLT_MAX) | !(fabsf(nm) <= FLT_MAX) | !(nv >= 0 && nv <= FLT_MAX);
}

void ls_adamw_step(const ls_adamw_hp *hp, float decay, float *w, const float *g, float *m, float *v, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) adamw_elem(hp, decay, w[i], g[i], m[i], v[i], &w[i], &m[i], &v[i]);
}

void ls_adamw_check(int64_t *bad, float *at, const ls_adamw_hp *hp, float decay, const float *w, const float *g,
                    const float *m, const float *v, int64_t n) {
    int any = 0;
#pragma omp parallel for schedule(static) reduction(| : any) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
        float nw, nm, nv;
        adamw_elem(hp, decay, w[i], g[i], m[i], v[i], &nw, &nm, &nv);
        any |= elem_bad(nw, nm, nv);
    }
    *bad = -1;
    for (int64_t i = 0; any && i < n; i++) { /* the first such element */
        float nw, nm, nv;
        adamw_elem(hp, decay, w[i], g[i], m[i], v[i], &nw, &nm, &nv);
        if (!elem_bad(nw, nm, nv)) continue;
        *bad = i, at[0] = nw, at[1] = nm, at[2] = nv;
        return;
    }
}

void ls_sumsq(double *out, const float *x, int64_t n) {
    double s = 0;
#pragma omp parallel for schedule(static) reduction(+ : s) if (n > 65536)
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    *out = s;
}

void ls_scale(float *x, float c, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) x[i] *= c;
}
