/*
 * test_gdr.c — gated delta rule forward (specs/hybrid-qwen3next.md §2.6, §3):
 * the chunked WY/UT form against the token-serial recurrence (outputs, final
 * state, per-chunk tape, a prompt split over two calls), and the serial
 * recurrence against a double-precision textbook reference.
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
