/*
 * test_gdn_scan.c — the Gated DeltaNet shard summary (src/models/gdn_scan.c, issue 22):
 * a sequence cut into shards, each run from the zero state and summarised, then joined
 * in order to the state the sequence starts from, gives the one-pass outputs and final
 * state. Both float32 schedules are held against a double-precision token-serial
 * recurrence written here; the joined one's error is bounded by the one-pass error
 * measured in the same run (testutil.h's floors), never by a constant from one machine.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../src/models/gdn_scan.h"
#include "longstraw/backend.h"
#include "testutil.h"

int test_gdn_shard_scan(void);

/* S_t = e^{g}(I − β k kᵀ) S + β k vᵀ; o = scale·Sᵀ q, per value head, in double */
static void serial_double(double *o, double *S, const float *q, const float *k, const float *v, const float *beta,
                          const float *g, int64_t T, ls_gdr_dims dm) {
    int64_t rep = dm.H_v / dm.H_k, dk = dm.d_k, dv = dm.d_v;
    double *kS = malloc((size_t)dv * sizeof(double));
    for (int64_t h = 0; h < dm.H_v; h++) {
        double *Sh = S + h * dk * dv;
        for (int64_t t = 0; t < T; t++) {
            const float *qt = q + (t * dm.H_k + h / rep) * dk, *kt = k + (t * dm.H_k + h / rep) * dk;
            const float *vt = v + (t * dm.H_v + h) * dv;
            double a = exp((double)g[t * dm.H_v + h]), b = beta[t * dm.H_v + h];
            for (int64_t j = 0; j < dv; j++) {
                kS[j] = 0;
                for (int64_t d = 0; d < dk; d++) kS[j] += kt[d] * Sh[d * dv + j];
            }
            for (int64_t d = 0; d < dk; d++)
                for (int64_t j = 0; j < dv; j++) Sh[d * dv + j] = a * Sh[d * dv + j] + kt[d] * b * (vt[j] - a * kS[j]);
            for (int64_t j = 0; j < dv; j++) {
                double acc = 0;
                for (int64_t d = 0; d < dk; d++) acc += qt[d] * Sh[d * dv + j];
                o[(t * dm.H_v + h) * dv + j] = dm.scale * acc;
            }
        }
    }
    free(kS);
}

static double max_err(const float *x, const double *ref, int64_t n, double *mag) {
    double e = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)x[i] - ref[i]);
        if (!(d <= e)) e = d; /* NaN wins */
        if (fabs(ref[i]) > m) m = fabs(ref[i]);
    }
    if (mag) *mag = m;
    return e;
}

int test_gdn_shard_scan(void) {
    const ls_backend *be = ls_backend_cpu();
    ls_gdr_dims dm = {2, 4, 16, 24, 0.25f};
    const int64_t T = 300, cut[] = {0, 100, 177, 300}, ncut = 3; /* shards that divide nothing */
    int64_t kn = T * dm.H_k * dm.d_k, vn = T * dm.H_v * dm.d_v, hn = T * dm.H_v, sn = dm.H_v * dm.d_k * dm.d_v;
    float *q = malloc(kn * 4), *k = malloc(kn * 4), *v = malloc(vn * 4), *beta = malloc(hn * 4), *g = malloc(hn * 4);
    float *S_init = malloc(sn * 4), *o1 = malloc(vn * 4), *S1 = malloc(sn * 4), *oj = malloc(vn * 4);
    float *Sj = malloc(sn * 4), *S0 = malloc(sn * 4), *u = malloc(T * dm.H_v * dm.d_k * 4);
    float *M = malloc(dm.H_v * dm.d_k * dm.d_k * 4);
    double *od = malloc(vn * 8), *Sd = malloc(sn * 8);
    T_CHECK(q && k && v && beta && g && S_init && o1 && S1 && oj && Sj && S0 && u && M && od && Sd, "oom");
    ls_rng r;
    ls_rng_seed(&r, 22);
    t_fill_normal(q, kn, &r, 1.0f), t_fill_normal(k, kn, &r, 1.0f), t_fill_normal(v, vn, &r, 1.0f);
    t_fill_normal(S_init, sn, &r, 0.5f);
    for (int64_t t = 0; t < T; t++) /* normalised q, k (the kernel's contract), gates in range */
        for (int64_t h = 0; h < dm.H_k; h++) {
            double nq = 0, nk = 0;
            for (int64_t d = 0; d < dm.d_k; d++) nq += q[(t * dm.H_k + h) * dm.d_k + d] * q[(t * dm.H_k + h) * dm.d_k + d],
                                                   nk += k[(t * dm.H_k + h) * dm.d_k + d] * k[(t * dm.H_k + h) * dm.d_k + d];
            for (int64_t d = 0; d < dm.d_k; d++)
                q[(t * dm.H_k + h) * dm.d_k + d] /= (float)sqrt(nq), k[(t * dm.H_k + h) * dm.d_k + d] /= (float)sqrt(nk);
        }
    for (int64_t i = 0; i < hn; i++) beta[i] = (float)ls_rng_uniform(&r), g[i] = (float)(-0.3 * ls_rng_uniform(&r));
    ls_arena sc;
    ls_arena_init(&sc, "scratch", 0);
    /* the reference: one pass in double from S_init */
    for (int64_t i = 0; i < sn; i++) Sd[i] = S_init[i];
    serial_double(od, Sd, q, k, v, beta, g, T, dm);
    /* one pass in float32 (the chunked kernel): the floor */
    memcpy(S1, S_init, sn * 4);
    T_OK(ls_op_gdr_chunk_fwd(be, o1, NULL, S1, q, k, v, beta, g, T, dm, &sc));
    double mag_o, mag_s, e1 = max_err(o1, od, vn, &mag_o), s1 = max_err(S1, Sd, sn, &mag_s);
    /* shards from zero, joined in order */
    memcpy(Sj, S_init, sn * 4);
    for (int64_t c = 0; c < ncut; c++) {
        int64_t a = cut[c], n = cut[c + 1] - a;
        T_OK(ls_gdn_shard_fwd(be, oj + a * dm.H_v * dm.d_v, S0, u, M, q + a * dm.H_k * dm.d_k, k + a * dm.H_k * dm.d_k,
                              v + a * dm.H_v * dm.d_v, beta + a * dm.H_v, g + a * dm.H_v, n, dm, &sc));
        ls_gdn_shard_apply(be, oj + a * dm.H_v * dm.d_v, S0, u, M, S0, Sj, n, dm); /* S0 := M·S_in + S0 */
        memcpy(Sj, S0, sn * 4);
    }
    double ej = max_err(oj, od, vn, NULL), sj = max_err(Sj, Sd, sn, NULL);
    double bo = t_floor_bound(e1, 4.0, 1e-6 * mag_o), bs = t_floor_bound(s1, 4.0, 1e-6 * mag_s);
    printf("  outputs: one pass %.3g, shards joined %.3g (bound %.3g, |o| %.3g); final state: %.3g, %.3g (bound %.3g)\n",
           e1, ej, bo, mag_o, s1, sj, bs);
    ls_arena_free(&sc);
    free(q), free(k), free(v), free(beta), free(g), free(S_init), free(o1), free(S1), free(oj), free(Sj), free(S0);
    free(u), free(M), free(od), free(Sd);
    T_CHECK(!(ej > bo) && !(sj > bs), "shards joined: outputs off by %.3g (bound %.3g), state by %.3g (bound %.3g)", ej, bo,
            sj, bs);
    return 0;
}
