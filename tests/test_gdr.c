/*
 * test_gdr.c — gated delta rule forward (specs/hybrid-qwen3next.md §2.6, §3):
 * the chunked WY/UT form against the token-serial recurrence (outputs, final
 * state, per-chunk tape, a prompt split over two calls), the serial
 * recurrence against a double-precision textbook reference, and the chunked
 * backward against central finite differences of a double-precision loss and
 * against a token-serial backward in double.
 */
#include <stdlib.h>
#include <string.h>

#include "longstraw/core.h"
#include "longstraw/kernels.h"
#include "testutil.h"

int test_gdr_chunk_vs_serial(void);
int test_gdr_serial_vs_double(void);

/* Random inputs of one case; q, k L2-normalised per head, β = σ(N(0,1)),
 * g = −gs·softplus(1.5·N(0,1)) (gs = 0.75: e^g spread over ~[e^-3, 1]), S_0 ≠ 0. */
typedef struct {
    int64_t T;
    ls_gdr_dims dm;
    float *q, *k;    /* (T, H_k, d_k) */
    float *v;        /* (T, H_v, d_v) */
    float *beta, *g; /* (T, H_v) */
    float *s0;       /* (H_v, d_k, d_v) */
} gdr_case;

static void gdr_case_free(gdr_case *c) {
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->beta);
    free(c->g);
    free(c->s0);
}

static void l2norm_rows(float *x, int64_t rows, int64_t d) {
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t i = 0; i < d; i++) ss += (double)x[r * d + i] * x[r * d + i];
        float s = (float)(1.0 / sqrt(ss + 1e-6));
        for (int64_t i = 0; i < d; i++) x[r * d + i] *= s;
    }
}

/* 0 on success; the only failure is malloc */
static int gdr_case_make(gdr_case *c, int64_t T, int H_k, int H_v, int d_k, int d_v, double gs,
                         uint64_t seed) {
    ls_rng rng;
    ls_rng_seed(&rng, seed);
    c->T = T;
    c->dm = (ls_gdr_dims){H_k, H_v, d_k, d_v, (float)(1.0 / sqrt((double)d_k))};
    int64_t nq = T * H_k * d_k, nv = T * H_v * d_v, ng = T * H_v, ns = (int64_t)H_v * d_k * d_v;
    /* +1 so that T = 0 still gets non-NULL buffers */
    c->q = malloc((size_t)(nq + 1) * sizeof(float));
    c->k = malloc((size_t)(nq + 1) * sizeof(float));
    c->v = malloc((size_t)(nv + 1) * sizeof(float));
    c->beta = malloc((size_t)(ng + 1) * sizeof(float));
    c->g = malloc((size_t)(ng + 1) * sizeof(float));
    c->s0 = malloc((size_t)ns * sizeof(float));
    if (!c->q || !c->k || !c->v || !c->beta || !c->g || !c->s0) return 1;
    t_fill_normal(c->q, nq, &rng, 1.0f);
    t_fill_normal(c->k, nq, &rng, 1.0f);
    l2norm_rows(c->q, T * H_k, d_k);
    l2norm_rows(c->k, T * H_k, d_k);
    t_fill_normal(c->v, nv, &rng, 1.0f);
    for (int64_t i = 0; i < ng; i++) {
        c->beta[i] = (float)(1.0 / (1.0 + exp(-ls_rng_normal(&rng))));
        double z = 1.5 * ls_rng_normal(&rng);
        double sp = z > 20 ? z : log1p(exp(z));
        c->g[i] = (float)(-gs * sp);
    }
    t_fill_normal(c->s0, ns, &rng, 0.5f);
    return 0;
}

/* Serial recurrence from s0 over tokens [t0, t0+n) of the case (pointers offset). */
static void run_serial(const gdr_case *c, float *o, float *state, int64_t t0, int64_t n) {
    const ls_gdr_dims dm = c->dm;
    ls_gdr_serial_fwd(o + t0 * dm.H_v * dm.d_v, state, c->q + t0 * dm.H_k * dm.d_k,
                      c->k + t0 * dm.H_k * dm.d_k, c->v + t0 * dm.H_v * dm.d_v,
                      c->beta + t0 * dm.H_v, c->g + t0 * dm.H_v, n, dm);
}

static ls_status run_chunk(const gdr_case *c, float *o, float *tape, float *state, int64_t t0,
                           int64_t n, ls_arena *scratch) {
    const ls_gdr_dims dm = c->dm;
    return ls_gdr_chunk_fwd(o + t0 * dm.H_v * dm.d_v, tape, state, c->q + t0 * dm.H_k * dm.d_k,
                            c->k + t0 * dm.H_k * dm.d_k, c->v + t0 * dm.H_v * dm.d_v,
                            c->beta + t0 * dm.H_v, c->g + t0 * dm.H_v, n, dm, scratch);
}

typedef struct {
    int64_t T;
    int H_k, H_v, d_k, d_v;
    double gs; /* decay strength */
} gdr_shape;

/* One shape: chunked vs serial (o, S_T, tape) and one call vs two calls. */
static int check_chunk_case(const gdr_shape *sh, uint64_t seed, ls_arena *scratch) {
    const double tol = 1e-5;
    gdr_case c;
    int rc = 1;
    float *o_ser = NULL, *o_chk = NULL, *o_two = NULL, *s_ser = NULL, *s_chk = NULL;
    float *s_two = NULL, *tape = NULL;
    if (gdr_case_make(&c, sh->T, sh->H_k, sh->H_v, sh->d_k, sh->d_v, sh->gs, seed)) {
        fprintf(stderr, "  FAIL: out of memory\n");
        goto done;
    }
    const int64_t T = c.T, C = 64, n_chunks = (T + C - 1) / C;
    const int64_t no = T * sh->H_v * sh->d_v, ns = (int64_t)sh->H_v * sh->d_k * sh->d_v;
    o_ser = malloc((size_t)(no + 1) * sizeof(float));
    o_chk = malloc((size_t)(no + 1) * sizeof(float));
    o_two = malloc((size_t)(no + 1) * sizeof(float));
    s_ser = malloc((size_t)ns * sizeof(float));
    s_chk = malloc((size_t)ns * sizeof(float));
    s_two = malloc((size_t)ns * sizeof(float));
    tape = malloc((size_t)(n_chunks * ns + 1) * sizeof(float)); /* exactly the tape: ASan sees overruns */
    if (!o_ser || !o_chk || !o_two || !s_ser || !s_chk || !s_two || !tape) {
        fprintf(stderr, "  FAIL: out of memory\n");
        goto done;
    }
    for (int64_t i = 0; i < no; i++) o_chk[i] = o_two[i] = NAN; /* every output must be written */
    for (int64_t i = 0; i < n_chunks * ns; i++) tape[i] = NAN;

    /* chunked, one call */
    memcpy(s_chk, c.s0, (size_t)ns * sizeof(float));
    size_t cur0 = scratch->cur;
    ls_status st = run_chunk(&c, o_chk, tape, s_chk, 0, T, scratch);
    if (st != LS_OK) {
        fprintf(stderr, "  FAIL: ls_gdr_chunk_fwd: %s\n", ls_err_msg());
        goto done;
    }
    if (scratch->cur != cur0) {
        fprintf(stderr, "  FAIL: scratch not released (%zu -> %zu bytes)\n", cur0, scratch->cur);
        goto done;
    }

    /* serial, chunk by chunk, checking the tape at each chunk start */
    memcpy(s_ser, c.s0, (size_t)ns * sizeof(float));
    for (int64_t ch = 0; ch < n_chunks; ch++) {
        double e = t_rel_err_f(tape + ch * ns, s_ser, ns);
        if (!(e <= tol)) {
            fprintf(stderr, "  FAIL: tape[%lld] vs serial state after %lld tokens: rel err %.3g\n",
                    (long long)ch, (long long)(ch * C), e);
            goto done;
        }
        int64_t n = T - ch * C < C ? T - ch * C : C;
        run_serial(&c, o_ser, s_ser, ch * C, n);
    }
    if (n_chunks > 0 && memcmp(tape, c.s0, (size_t)ns * sizeof(float)) != 0) {
        fprintf(stderr, "  FAIL: tape[0] is not exactly the initial state\n");
        goto done;
    }

    double eo = T > 0 ? t_rel_err_f(o_chk, o_ser, no) : 0.0;
    double es = t_rel_err_f(s_chk, s_ser, ns);
    if (!(eo <= tol) || !(es <= tol) || (T > 0 && !t_all_finite_f(o_chk, no)) ||
        !t_all_finite_f(s_chk, ns)) {
        fprintf(stderr, "  FAIL: chunk vs serial: o rel err %.3g, state rel err %.3g\n", eo, es);
        goto done;
    }

    /* two calls split at a non-multiple of 64, state carried between them */
    int64_t T1 = T * 3 / 5;
    if (T1 % C == 0 && T1 > 0) T1--;
    memcpy(s_two, c.s0, (size_t)ns * sizeof(float));
    st = run_chunk(&c, o_two, NULL, s_two, 0, T1, scratch);
    if (st == LS_OK) st = run_chunk(&c, o_two, NULL, s_two, T1, T - T1, scratch);
    if (st != LS_OK) {
        fprintf(stderr, "  FAIL: ls_gdr_chunk_fwd (split): %s\n", ls_err_msg());
        goto done;
    }
    double eo2 = T > 0 ? t_rel_err_f(o_two, o_chk, no) : 0.0;
    double es2 = t_rel_err_f(s_two, s_chk, ns);
    if (!(eo2 <= tol) || !(es2 <= tol)) {
        fprintf(stderr, "  FAIL: split at %lld vs one call: o rel err %.3g, state rel err %.3g\n",
                (long long)T1, eo2, es2);
        goto done;
    }
    printf("    T %4lld H_k %d H_v %d d_k %3d d_v %3d decay %.2f: o %.2e state %.2e split@%lld %.2e\n",
           (long long)T, sh->H_k, sh->H_v, sh->d_k, sh->d_v, sh->gs, eo, es, (long long)T1, eo2);
    rc = 0;
done:
    if (rc)
        fprintf(stderr, "  (case T %lld H_k %d H_v %d d_k %d d_v %d decay %.2f)\n", (long long)sh->T,
                sh->H_k, sh->H_v, sh->d_k, sh->d_v, sh->gs);
    free(o_ser);
    free(o_chk);
    free(o_two);
    free(s_ser);
    free(s_chk);
    free(s_two);
    free(tape);
    gdr_case_free(&c);
    return rc;
}

int test_gdr_chunk_vs_serial(void) {
    static const gdr_shape shapes[] = {
        {1, 1, 1, 8, 5, 0.75},       /* one token */
        {63, 2, 4, 5, 8, 0.75},      /* r = 2, odd d_k */
        {64, 2, 2, 16, 16, 0.75},    /* exactly one chunk */
        {65, 1, 2, 8, 5, 0.1},       /* one token into the second chunk */
        {130, 2, 4, 128, 128, 0.05}, /* mild decay: the state carries far */
        {200, 2, 2, 64, 64, 0.75},
        {200, 1, 1, 33, 17, 8.0},    /* γ reaches −100s inside a chunk */
        {70, 1, 3, 24, 40, 0.75},    /* r = 3 */
        {129, 3, 3, 128, 128, 0.75}, /* T = 2·64 + 1 */
        {100, 3, 6, 16, 32, 0.75},   /* with 2 threads a key head straddles them */
        {90, 1, 2, 33, 48, 0.75},    /* odd d_k, d_v = 32 + 16 */
        {70, 1, 1, 260, 40, 0.75},   /* d_k > 256: the serial form works on S in place */
    };
    ls_arena scratch;
    ls_arena_init(&scratch, "scratch", (size_t)1 << 20);
    int rc = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0] && rc == 0; i++)
        rc = check_chunk_case(&shapes[i], 1000 + i, &scratch);
    /* T = 0 leaves the state as it is */
    if (rc == 0) {
        gdr_case c;
        if (gdr_case_make(&c, 0, 1, 2, 8, 8, 0.75, 7) == 0) {
            float s[2 * 8 * 8];
            memcpy(s, c.s0, sizeof s);
            ls_status st = ls_gdr_chunk_fwd(c.v, NULL, s, c.q, c.k, c.v, c.beta, c.g, 0, c.dm,
                                            &scratch);
            if (st != LS_OK || memcmp(s, c.s0, sizeof s) != 0) {
                fprintf(stderr, "  FAIL: T = 0 changed the state or failed\n");
                rc = 1;
            }
        } else {
            rc = 1;
        }
        gdr_case_free(&c);
    }
    T_CHECK(scratch.cur == 0, "scratch not released: %zu bytes", scratch.cur);
    ls_arena_free(&scratch);
    return rc;
}

/* Textbook form in double (§2.6): S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,
 * o_t = S_tᵀ (scale·q_t). o (T, H_v, d_v), S (H_v, d_k, d_v) in/out. */
static void gdr_naive_double(double *o, double *S, const gdr_case *c) {
    const int64_t H_k = c->dm.H_k, H_v = c->dm.H_v, dk = c->dm.d_k, dv = c->dm.d_v;
    const int64_t rep = H_v / H_k;
    double *kS = malloc((size_t)dv * sizeof(double));
    for (int64_t h = 0; h < H_v; h++) {
        double *Sh = S + h * dk * dv;
        for (int64_t t = 0; t < c->T; t++) {
            const float *q = c->q + (t * H_k + h / rep) * dk, *k = c->k + (t * H_k + h / rep) * dk;
            const float *v = c->v + (t * H_v + h) * dv;
            double a = exp((double)c->g[t * H_v + h]), b = c->beta[t * H_v + h];
            for (int64_t j = 0; j < dv; j++) {
                kS[j] = 0;
                for (int64_t d = 0; d < dk; d++) kS[j] += (double)k[d] * Sh[d * dv + j];
            }
            /* (I − β k kᵀ) S = S − β k (kᵀ S) */
            for (int64_t d = 0; d < dk; d++)
                for (int64_t j = 0; j < dv; j++)
                    Sh[d * dv + j] = a * (Sh[d * dv + j] - b * k[d] * kS[j]) + b * k[d] * v[j];
            for (int64_t j = 0; j < dv; j++) {
                double acc = 0;
                for (int64_t d = 0; d < dk; d++) acc += Sh[d * dv + j] * (double)c->dm.scale * q[d];
                o[(t * H_v + h) * dv + j] = acc;
            }
        }
    }
    free(kS);
}

int test_gdr_serial_vs_double(void) {
    static const gdr_shape shapes[] = {
        {1, 1, 1, 8, 5, 0.75},   {50, 1, 2, 5, 8, 0.75},   {40, 2, 6, 24, 17, 0.75},
        {33, 2, 2, 64, 64, 0.05}, {30, 1, 1, 128, 128, 0.75}, {20, 1, 1, 16, 16, 8.0},
        {25, 1, 2, 33, 72, 0.75}, /* odd d_k through the 32-column blocks, plus a tail */
        {9, 1, 1, 260, 40, 0.75},  /* d_k > 256: S in place, no stack copy */
    };
    const double tol = 1e-5;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const gdr_shape *sh = &shapes[i];
        gdr_case c;
        T_CHECK(gdr_case_make(&c, sh->T, sh->H_k, sh->H_v, sh->d_k, sh->d_v, sh->gs, 2000 + i) == 0,
                "out of memory");
        const int64_t no = sh->T * sh->H_v * sh->d_v, ns = (int64_t)sh->H_v * sh->d_k * sh->d_v;
        float *o = malloc((size_t)no * sizeof(float)), *s = malloc((size_t)ns * sizeof(float));
        double *od = malloc((size_t)no * sizeof(double)), *sd = malloc((size_t)ns * sizeof(double));
        T_CHECK(o && s && od && sd, "out of memory");
        for (int64_t j = 0; j < no; j++) o[j] = NAN;
        memcpy(s, c.s0, (size_t)ns * sizeof(float));
        for (int64_t j = 0; j < ns; j++) sd[j] = c.s0[j];
        ls_gdr_serial_fwd(o, s, c.q, c.k, c.v, c.beta, c.g, c.T, c.dm);
        gdr_naive_double(od, sd, &c);
        double eo = t_rel_err_fd(o, od, no), es = t_rel_err_fd(s, sd, ns);
        int fin = t_all_finite_f(o, no) && t_all_finite_f(s, ns);
        printf("    T %4lld H_k %d H_v %d d_k %3d d_v %3d decay %.2f: o %.2e state %.2e\n",
               (long long)sh->T, sh->H_k, sh->H_v, sh->d_k, sh->d_v, sh->gs, eo, es);
        free(o);
        free(s);
        free(od);
        free(sd);
        gdr_case_free(&c);
        T_CHECK(fin && eo <= tol && es <= tol,
                "serial vs double (case %zu): o rel err %.3g, state rel err %.3g, finite %d", i, eo,
                es, fin);
    }
    return 0;
}

/* ---- backward --------------------------------------------------------------- */

int test_gdr_bwd_fd(void);

/* The case's inputs in double (the FD oracle perturbs these). */
typedef struct {
    int64_t T;
    ls_gdr_dims dm;
    double *q, *k, *v, *beta, *g, *s0; /* shapes as gdr_case */
} gdr_dcase;

static void gdr_dcase_free(gdr_dcase *d) {
    free(d->q);
    free(d->k);
    free(d->v);
    free(d->beta);
    free(d->g);
    free(d->s0);
}

static double *to_double(const float *x, int64_t n) {
    double *y = malloc((size_t)(n + 1) * sizeof(double));
    if (y)
        for (int64_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

static int gdr_dcase_make(gdr_dcase *d, const gdr_case *c) {
    const int64_t T = c->T, H_k = c->dm.H_k, H_v = c->dm.H_v, dk = c->dm.d_k, dv = c->dm.d_v;
    d->T = T;
    d->dm = c->dm;
    d->q = to_double(c->q, T * H_k * dk);
    d->k = to_double(c->k, T * H_k * dk);
    d->v = to_double(c->v, T * H_v * dv);
    d->beta = to_double(c->beta, T * H_v);
    d->g = to_double(c->g, T * H_v);
    d->s0 = to_double(c->s0, H_v * dk * dv);
    return !(d->q && d->k && d->v && d->beta && d->g && d->s0);
}

/* Textbook §2.6 in double from the double inputs: S_t = e^{g_t}(I − β_t k_t k_tᵀ)S_{t−1}
 * + β_t k_t v_tᵀ, o_t = S_tᵀ(s·q_t); returns L = Σ o·R1 + Σ S_T·R2 (R2 NULL: no state
 * term). S is scratch (d_k, d_v), kS scratch (d_v). When Sall is non-NULL it receives
 * every state: Sall[t+1] = S_t of head h at ((t+1)·H_v + h)·d_k·d_v, Sall[0] = S_0. */
static double gdr_loss_double(const gdr_dcase *c, const double *R1, const double *R2, double *S,
                              double *kS, double *Sall) {
    const int64_t H_k = c->dm.H_k, H_v = c->dm.H_v, dk = c->dm.d_k, dv = c->dm.d_v;
    const int64_t rep = H_v / H_k, ns = dk * dv;
    const double scale = c->dm.scale;
    double L = 0.0;
    for (int64_t h = 0; h < H_v; h++) {
        memcpy(S, c->s0 + h * ns, (size_t)ns * sizeof(double));
        if (Sall) memcpy(Sall + h * ns, S, (size_t)ns * sizeof(double));
        for (int64_t t = 0; t < c->T; t++) {
            const double *q = c->q + (t * H_k + h / rep) * dk, *k = c->k + (t * H_k + h / rep) * dk;
            const double *v = c->v + (t * H_v + h) * dv;
            const double a = exp(c->g[t * H_v + h]), b = c->beta[t * H_v + h];
            for (int64_t j = 0; j < dv; j++) {
                kS[j] = 0;
                for (int64_t d = 0; d < dk; d++) kS[j] += k[d] * S[d * dv + j];
            }
            for (int64_t d = 0; d < dk; d++)
                for (int64_t j = 0; j < dv; j++)
                    S[d * dv + j] = a * (S[d * dv + j] - b * k[d] * kS[j]) + b * k[d] * v[j];
            if (Sall) memcpy(Sall + ((t + 1) * H_v + h) * ns, S, (size_t)ns * sizeof(double));
            for (int64_t j = 0; j < dv; j++) {
                double o = 0;
                for (int64_t d = 0; d < dk; d++) o += S[d * dv + j] * scale * q[d];
                L += o * R1[(t * H_v + h) * dv + j];
            }
        }
        if (R2)
            for (int64_t i = 0; i < ns; i++) L += S[i] * R2[h * ns + i];
    }
    return L;
}

/* Token-serial backward of gdr_loss_double in double (§2.6 step by step, from the stored
 * states Sall): S̃ = a S_{t−1}, u = β(v − S̃ᵀk), S_t = S̃ + k uᵀ, o_t = S_tᵀ(s q).
 * All outputs =; dq, dk summed over the value heads of a key head. */
static void gdr_serial_bwd_double(double *dq, double *dk, double *dv, double *dbeta, double *dg,
                                  double *ds0, const gdr_dcase *c, const double *R1,
                                  const double *R2, const double *Sall) {
    const int64_t T = c->T, H_k = c->dm.H_k, H_v = c->dm.H_v, nk = c->dm.d_k, nv = c->dm.d_v;
    const int64_t rep = H_v / H_k, ns = nk * nv;
    const double scale = c->dm.scale;
    memset(dq, 0, (size_t)(T * H_k * nk) * sizeof(double));
    memset(dk, 0, (size_t)(T * H_k * nk) * sizeof(double));
    double *dS = malloc((size_t)ns * sizeof(double)), *u = malloc((size_t)nv * sizeof(double));
    double *du = malloc((size_t)nv * sizeof(double)), *St = malloc((size_t)ns * sizeof(double));
    for (int64_t h = 0; h < H_v; h++) {
        for (int64_t i = 0; i < ns; i++) dS[i] = R2 ? R2[h * ns + i] : 0.0;
        for (int64_t t = T - 1; t >= 0; t--) {
            const int64_t hk = h / rep;
            const double *q = c->q + (t * H_k + hk) * nk, *k = c->k + (t * H_k + hk) * nk;
            const double *v = c->v + (t * H_v + h) * nv, *dO = R1 + (t * H_v + h) * nv;
            const double *Sp = Sall + (t * H_v + h) * ns, *Sn = Sall + ((t + 1) * H_v + h) * ns;
            double *gq = dq + (t * H_k + hk) * nk, *gk = dk + (t * H_k + hk) * nk;
            const double a = exp(c->g[t * H_v + h]), b = c->beta[t * H_v + h];
            /* S̃ and u from S_{t−1} */
            for (int64_t i = 0; i < ns; i++) St[i] = a * Sp[i];
            for (int64_t j = 0; j < nv; j++) {
                double ks = 0;
                for (int64_t d = 0; d < nk; d++) ks += k[d] * St[d * nv + j];
                u[j] = b * (v[j] - ks);
            }
            /* o_t = S_tᵀ(s q): dS += s q dOᵀ, dq += s S_t dO */
            for (int64_t d = 0; d < nk; d++) {
                double acc = 0;
                for (int64_t j = 0; j < nv; j++) {
                    dS[d * nv + j] += scale * q[d] * dO[j];
                    acc += Sn[d * nv + j] * dO[j];
                }
                gq[d] += scale * acc;
            }
            /* S_t = S̃ + k uᵀ: dk += dS u, du = dSᵀ k */
            for (int64_t j = 0; j < nv; j++) {
                du[j] = 0;
                for (int64_t d = 0; d < nk; d++) du[j] += dS[d * nv + j] * k[d];
            }
            for (int64_t d = 0; d < nk; d++) {
                double acc = 0;
                for (int64_t j = 0; j < nv; j++) acc += dS[d * nv + j] * u[j];
                gk[d] += acc;
            }
            /* u = β(v − S̃ᵀk): dβ, dv, dS̃ −= β k duᵀ, dk −= β S̃ du */
            double dbeta_t = 0;
            for (int64_t j = 0; j < nv; j++) {
                double ks = 0;
                for (int64_t d = 0; d < nk; d++) ks += k[d] * St[d * nv + j];
                dbeta_t += du[j] * (v[j] - ks);
                dv[(t * H_v + h) * nv + j] = b * du[j];
            }
            dbeta[t * H_v + h] = dbeta_t;
            for (int64_t d = 0; d < nk; d++) {
                double acc = 0;
                for (int64_t j = 0; j < nv; j++) {
                    acc += St[d * nv + j] * du[j];
                    dS[d * nv + j] -= b * k[d] * du[j];
                }
                gk[d] -= b * acc;
            }
            /* S̃ = a S_{t−1}: dg = a ⟨dS̃, S_{t−1}⟩, dS_{t−1} = a dS̃ */
            double da = 0;
            for (int64_t i = 0; i < ns; i++) {
                da += dS[i] * Sp[i];
                dS[i] *= a;
            }
            dg[t * H_v + h] = a * da;
        }
        memcpy(ds0 + h * ns, dS, (size_t)ns * sizeof(double));
    }
    free(dS);
    free(u);
    free(du);
    free(St);
}

/* Kernel gradients of one case (malloc'd). */
typedef struct {
    float *dq, *dk, *dv, *dbeta, *dg, *ds0;
} gdr_grads;

static void gdr_grads_free(gdr_grads *g) {
    free(g->dq);
    free(g->dk);
    free(g->dv);
    free(g->dbeta);
    free(g->dg);
    free(g->ds0);
}

/* Allocate, fill with NaN (every output must be written), run ls_gdr_chunk_bwd. */
static int run_chunk_bwd(gdr_grads *gr, const gdr_case *c, const float *tape, const float *R1,
                         const float *R2, int want_ds0, ls_arena *scratch) {
    const int64_t T = c->T, H_k = c->dm.H_k, H_v = c->dm.H_v, dk = c->dm.d_k, dv = c->dm.d_v;
    const int64_t n[6] = {T * H_k * dk, T * H_k * dk, T * H_v * dv,
                          T * H_v,      T * H_v,      H_v * dk * dv};
    float **p[6] = {&gr->dq, &gr->dk, &gr->dv, &gr->dbeta, &gr->dg, &gr->ds0};
    for (int i = 0; i < 6; i++) {
        /* exact sizes: ASan sees overruns */
        *p[i] = malloc((size_t)(n[i] > 0 ? n[i] : 1) * sizeof(float));
        if (!*p[i]) {
            fprintf(stderr, "  FAIL: out of memory\n");
            return 1;
        }
        for (int64_t j = 0; j < n[i]; j++) (*p[i])[j] = NAN;
    }
    size_t cur0 = scratch->cur;
    ls_status st = ls_gdr_chunk_bwd(gr->dq, gr->dk, gr->dv, gr->dbeta, gr->dg,
                                    want_ds0 ? gr->ds0 : NULL, R1, R2, tape, c->q, c->k, c->v,
                                    c->beta, c->g, T, c->dm, scratch);
    if (st != LS_OK) {
        fprintf(stderr, "  FAIL: ls_gdr_chunk_bwd: %s\n", ls_err_msg());
        return 1;
    }
    if (scratch->cur != cur0) {
        fprintf(stderr, "  FAIL: bwd scratch not released (%zu -> %zu bytes)\n", cur0,
                scratch->cur);
        return 1;
    }
    return 0;
}

/* Forward with tape; checks o and S_T against the double textbook form (sanity). */
static int run_chunk_fwd_checked(const gdr_case *c, float *tape, ls_arena *scratch, double tol) {
    const int64_t T = c->T, H_v = c->dm.H_v, dk = c->dm.d_k, dv = c->dm.d_v;
    const int64_t no = T * H_v * dv, ns = H_v * dk * dv;
    float *o = malloc((size_t)(no + 1) * sizeof(float)), *s = malloc((size_t)ns * sizeof(float));
    double *od = malloc((size_t)(no + 1) * sizeof(double));
    double *sd = malloc((size_t)ns * sizeof(double));
    int rc = 1;
    if (!o || !s || !od || !sd) {
        fprintf(stderr, "  FAIL: out of memory\n");
        goto done;
    }
    memcpy(s, c->s0, (size_t)ns * sizeof(float));
    for (int64_t i = 0; i < ns; i++) sd[i] = c->s0[i];
    if (ls_gdr_chunk_fwd(o, tape, s, c->q, c->k, c->v, c->beta, c->g, T, c->dm, scratch) != LS_OK) {
        fprintf(stderr, "  FAIL: ls_gdr_chunk_fwd: %s\n", ls_err_msg());
        goto done;
    }
    gdr_naive_double(od, sd, c);
    double eo = t_rel_err_fd(o, od, no), es = t_rel_err_fd(s, sd, ns);
    if (!(eo <= tol) || !(es <= tol)) {
        fprintf(stderr, "  FAIL: forward vs double: o %.3g, state %.3g\n", eo, es);
        goto done;
    }
    rc = 0;
done:
    free(o);
    free(s);
    free(od);
    free(sd);
    return rc;
}

typedef struct {
    int64_t T;
    int H_k, H_v, d_k, d_v;
    int dsT_null, ds0_null; /* pass dstate_T = NULL (zero), dstate0 = NULL (skipped) */
} gdr_bwd_shape;

/* Relative error of every gradient against the oracle (FD or serial double); the
 * skipped dstate0 is not compared. Returns 0 when all ≤ tol and finite. */
static int compare_grads(const gdr_grads *gr, double *const ref[6], const gdr_case *c, int cmp_ds0,
                         double tol, const char *what) {
    static const char *names[6] = {"dq", "dk", "dv", "dbeta", "dg", "dstate0"};
    const int64_t T = c->T, H_k = c->dm.H_k, H_v = c->dm.H_v, dk = c->dm.d_k, dv = c->dm.d_v;
    const int64_t n[6] = {T * H_k * dk, T * H_k * dk, T * H_v * dv,
                          T * H_v,      T * H_v,      H_v * dk * dv};
    const float *a[6] = {gr->dq, gr->dk, gr->dv, gr->dbeta, gr->dg, gr->ds0};
    int rc = 0;
    int64_t compared = 0;
    printf("      %s:", what);
    for (int i = 0; i < 6; i++) {
        if (i == 5 && !cmp_ds0) continue;
        double e = t_rel_err_fd(a[i], ref[i], n[i]);
        int fin = t_all_finite_f(a[i], n[i]);
        printf(" %s %.1e", names[i], e);
        if (!(e <= tol) || !fin) {
            fprintf(stderr, "  FAIL: %s %s rel err %.3g (tol %.1g), finite %d\n", what, names[i],
                    e, tol, fin);
            rc = 1;
        }
        compared += n[i];
    }
    printf("\n");
    if (compared == 0) {
        fprintf(stderr, "  FAIL: nothing compared\n");
        rc = 1;
    }
    return rc;
}

/* Central differences (h = 1e-6) of the double loss w.r.t. every input element. */
static int check_bwd_fd(const gdr_bwd_shape *sh, uint64_t seed, ls_arena *scratch) {
    const double tol = 1e-4, hstep = 1e-6;
    gdr_case c;
    gdr_dcase dc = {0};
    gdr_grads gr = {0};
    double *fd[6] = {0}, *R1d = NULL, *R2d = NULL, *S = NULL, *kS = NULL;
    float *R1 = NULL, *R2 = NULL, *tape = NULL;
    int rc = 1;
    if (gdr_case_make(&c, sh->T, sh->H_k, sh->H_v, sh->d_k, sh->d_v, 0.75, seed)) goto oom;
    const int64_t T = c.T, H_k = sh->H_k, H_v = sh->H_v, dk = sh->d_k, dv = sh->d_v;
    const int64_t ns = H_v * dk * dv, n_chunks = (T + 63) / 64;
    const int64_t n[6] = {T * H_k * dk, T * H_k * dk, T * H_v * dv, T * H_v, T * H_v, ns};
    ls_rng rng;
    ls_rng_seed(&rng, seed + 77);
    R1 = malloc((size_t)(T * H_v * dv + 1) * sizeof(float));
    R2 = malloc((size_t)ns * sizeof(float));
    tape = malloc((size_t)(n_chunks * ns + 1) * sizeof(float));
    S = malloc((size_t)ns * sizeof(double));
    kS = malloc((size_t)dv * sizeof(double));
    if (!R1 || !R2 || !tape || !S || !kS || gdr_dcase_make(&dc, &c)) goto oom;
    t_fill_normal(R1, T * H_v * dv, &rng, 1.0f);
    t_fill_normal(R2, ns, &rng, 1.0f);
    R1d = to_double(R1, T * H_v * dv);
    R2d = to_double(R2, ns);
    if (!R1d || !R2d) goto oom;

    if (run_chunk_fwd_checked(&c, tape, scratch, 1e-5)) goto done;
    if (run_chunk_bwd(&gr, &c, tape, R1, sh->dsT_null ? NULL : R2, !sh->ds0_null, scratch))
        goto done;

    /* the oracle */
    const double *R2use = sh->dsT_null ? NULL : R2d;
    double *xs[6] = {dc.q, dc.k, dc.v, dc.beta, dc.g, dc.s0};
    for (int i = 0; i < 6; i++) {
        fd[i] = malloc((size_t)(n[i] + 1) * sizeof(double));
        if (!fd[i]) goto oom;
        for (int64_t j = 0; j < n[i]; j++) {
            const double x0 = xs[i][j];
            xs[i][j] = x0 + hstep;
            const double lp = gdr_loss_double(&dc, R1d, R2use, S, kS, NULL);
            xs[i][j] = x0 - hstep;
            const double lm = gdr_loss_double(&dc, R1d, R2use, S, kS, NULL);
            xs[i][j] = x0;
            fd[i][j] = (lp - lm) / (2 * hstep);
        }
    }
    char what[96];
    snprintf(what, sizeof what, "T %3lld H_k %d H_v %d d_k %d d_v %d%s%s vs FD", (long long)T,
             sh->H_k, sh->H_v, sh->d_k, sh->d_v, sh->dsT_null ? " dS_T=NULL" : "",
             sh->ds0_null ? " dS_0=NULL" : "");
    rc = compare_grads(&gr, fd, &c, !sh->ds0_null, tol, what);
    goto done;
oom:
    fprintf(stderr, "  FAIL: out of memory\n");
done:
    if (rc)
        fprintf(stderr, "  (case T %lld H_k %d H_v %d d_k %d d_v %d)\n", (long long)sh->T, sh->H_k,
                sh->H_v, sh->d_k, sh->d_v);
    for (int i = 0; i < 6; i++) free(fd[i]);
    free(R1d);
    free(R2d);
    free(S);
    free(kS);
    free(R1);
    free(R2);
    free(tape);
    gdr_grads_free(&gr);
    gdr_dcase_free(&dc);
    gdr_case_free(&c);
    return rc;
}

/* T = 0: dstate0 = dstate_T (zero when dstate_T is NULL); nothing else is touched. */
static int check_bwd_empty(ls_arena *scratch) {
    gdr_case c;
    if (gdr_case_make(&c, 0, 1, 2, 5, 3, 0.75, 31)) {
        gdr_case_free(&c);
        T_FAIL("out of memory");
    }
    enum { NS = 2 * 5 * 3 };
    float dsT[NS], ds0[NS], zero[NS] = {0}, sentinel[1] = {NAN};
    ls_rng rng;
    ls_rng_seed(&rng, 32);
    t_fill_normal(dsT, NS, &rng, 1.0f);
    for (int i = 0; i < NS; i++) ds0[i] = NAN;
    ls_status st = ls_gdr_chunk_bwd(sentinel, sentinel, sentinel, sentinel, sentinel, ds0, sentinel,
                                    dsT, sentinel, c.q, c.k, c.v, c.beta, c.g, 0, c.dm, scratch);
    int ok1 = st == LS_OK && memcmp(ds0, dsT, sizeof ds0) == 0;
    st = ls_gdr_chunk_bwd(sentinel, sentinel, sentinel, sentinel, sentinel, ds0, sentinel, NULL,
                          sentinel, c.q, c.k, c.v, c.beta, c.g, 0, c.dm, scratch);
    int ok2 = st == LS_OK && memcmp(ds0, zero, sizeof ds0) == 0;
    gdr_case_free(&c);
    T_CHECK(ok1 && ok2, "T = 0: dstate0 = dstate_T %d, = 0 for NULL %d", ok1, ok2);
    printf("      T   0: dstate0 = dstate_T, and 0 for dstate_T = NULL\n");
    return 0;
}

/* T = 300 (five chunks), d_k = d_v = 64, H_v = 4, r = 2: the chunked backward against
 * the token-serial backward in double; then the same call with 1 and 3 threads must
 * give identical bits (3 threads split key head 0 between two slots: the staging
 * path, over two super-chunks). */
static int check_bwd_serial(ls_arena *scratch) {
    const int64_t T = 300;
    const int H_k = 2, H_v = 4, dk = 64, dv = 64;
    const double tol = 1e-4;
    gdr_case c;
    gdr_dcase dc = {0};
    gdr_grads gr = {0}, g1 = {0}, g3 = {0};
    double *ref[6] = {0}, *Sall = NULL, *S = NULL, *kS = NULL, *R1d = NULL, *R2d = NULL;
    float *R1 = NULL, *R2 = NULL, *tape = NULL;
    const int threads0 = ls_get_threads();
    int rc = 1;
    if (gdr_case_make(&c, T, H_k, H_v, dk, dv, 0.3, 4242)) goto oom;
    const int64_t ns = (int64_t)H_v * dk * dv, n_chunks = (T + 63) / 64;
    const int64_t n[6] = {T * H_k * dk, T * H_k * dk, T * H_v * dv, T * H_v, T * H_v, ns};
    ls_rng rng;
    ls_rng_seed(&rng, 4243);
    R1 = malloc((size_t)(T * H_v * dv) * sizeof(float));
    R2 = malloc((size_t)ns * sizeof(float));
    tape = malloc((size_t)(n_chunks * ns) * sizeof(float));
    Sall = malloc((size_t)((T + 1) * ns) * sizeof(double));
    S = malloc((size_t)ns * sizeof(double));
    kS = malloc((size_t)dv * sizeof(double));
    if (!R1 || !R2 || !tape || !Sall || !S || !kS || gdr_dcase_make(&dc, &c)) goto oom;
    t_fill_normal(R1, T * H_v * dv, &rng, 1.0f);
    t_fill_normal(R2, ns, &rng, 1.0f);
    R1d = to_double(R1, T * H_v * dv);
    R2d = to_double(R2, ns);
    for (int i = 0; i < 6; i++) {
        ref[i] = malloc((size_t)n[i] * sizeof(double));
        if (!ref[i]) goto oom;
    }
    if (!R1d || !R2d) goto oom;

    if (run_chunk_fwd_checked(&c, tape, scratch, 1e-5)) goto done;
    double t0 = ls_now();
    if (run_chunk_bwd(&gr, &c, tape, R1, R2, 1, scratch)) goto done;
    double t_bwd = ls_now() - t0;
    gdr_loss_double(&dc, R1d, R2d, S, kS, Sall);
    gdr_serial_bwd_double(ref[0], ref[1], ref[2], ref[3], ref[4], ref[5], &dc, R1d, R2d, Sall);
    char what[96];
    snprintf(what, sizeof what, "T %lld H_k %d H_v %d d_k %d d_v %d vs serial bwd (%.1f ms)",
             (long long)T, H_k, H_v, dk, dv, 1e3 * t_bwd);
    if (compare_grads(&gr, ref, &c, 1, tol, what)) goto done;

    ls_set_threads(1);
    int r1 = run_chunk_bwd(&g1, &c, tape, R1, R2, 1, scratch);
    ls_set_threads(3);
    int r3 = run_chunk_bwd(&g3, &c, tape, R1, R2, 1, scratch);
    ls_set_threads(threads0);
    if (r1 || r3) goto done;
    const float *a[6] = {gr.dq, gr.dk, gr.dv, gr.dbeta, gr.dg, gr.ds0};
    const float *b1[6] = {g1.dq, g1.dk, g1.dv, g1.dbeta, g1.dg, g1.ds0};
    const float *b3[6] = {g3.dq, g3.dk, g3.dv, g3.dbeta, g3.dg, g3.ds0};
    for (int i = 0; i < 6; i++)
        if (memcmp(a[i], b1[i], (size_t)n[i] * sizeof(float)) != 0 ||
            memcmp(a[i], b3[i], (size_t)n[i] * sizeof(float)) != 0) {
            fprintf(stderr, "  FAIL: gradient %d differs between 1, %d and 3 threads\n", i,
                    threads0);
            goto done;
        }
    printf("      same bits with 1, %d and 3 threads\n", threads0);
    rc = 0;
    goto done;
oom:
    fprintf(stderr, "  FAIL: out of memory\n");
done:
    ls_set_threads(threads0);
    for (int i = 0; i < 6; i++) free(ref[i]);
    free(Sall);
    free(S);
    free(kS);
    free(R1d);
    free(R2d);
    free(R1);
    free(R2);
    free(tape);
    gdr_grads_free(&gr);
    gdr_grads_free(&g1);
    gdr_grads_free(&g3);
    gdr_dcase_free(&dc);
    gdr_case_free(&c);
    return rc;
}

int test_gdr_bwd_fd(void) {
    static const gdr_bwd_shape shapes[] = {
        {1, 1, 1, 5, 3, 0, 0},   /* one token */
        {5, 1, 2, 3, 4, 0, 0},   /* r = 2 */
        {64, 1, 1, 5, 3, 0, 0},  /* exactly one chunk */
        {65, 1, 2, 4, 5, 1, 0},  /* one token into chunk two; dstate_T = NULL */
        {130, 1, 1, 3, 5, 0, 0}, /* three chunks: the inter-chunk scan */
        {130, 2, 4, 5, 3, 0, 1}, /* r = 2, two key heads; dstate0 = NULL */
        {70, 1, 3, 3, 2, 0, 0},  /* r = 3 */
        {100, 3, 3, 17, 3, 0, 0}, /* d_k past one 16-float panel */
        {66, 1, 2, 6, 17, 0, 0},  /* d_v past one panel */
    };
    ls_arena scratch;
    ls_arena_init(&scratch, "scratch", (size_t)1 << 20);
    int rc = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0] && rc == 0; i++)
        rc = check_bwd_fd(&shapes[i], 3000 + i, &scratch);
    if (rc == 0) rc = check_bwd_empty(&scratch);
    if (rc == 0) rc = check_bwd_serial(&scratch);
    T_CHECK(rc == 0, "gdr backward checks failed");
    T_CHECK(scratch.cur == 0, "scratch not released: %zu bytes", scratch.cur);
    ls_arena_free(&scratch);
    return 0;
}
