/*
 * test_attention.c — the tiled attention forward (ls_attn_fwd) against the naive
 * double-precision reference: empty and paged prefixes of lengths that do not
 * divide the page, odd page sizes, GQA ratios 1/2/4, odd head dims; BF16 pages;
 * and prompt capture split into two calls equal to one call. The backward
 * (test_attn_bwd_fd) against central finite differences of a double-precision model of
 * the same call, for every input element including the prefix pages, and at larger
 * shapes against an analytic double backward.
 * Invalid page slots (positions >= n of the last page) hold NaN, and the outputs
 * carry guard words, so a read or write out of bounds fails the test.
 */
#include <stdlib.h>
#include <string.h>

#include "longstraw/kernels.h"
#include "testutil.h"

int test_attn_tiled_vs_naive(void);
int test_attn_paged_bf16(void);
int test_attn_bwd_fd(void);

#define GUARD 16
#define GUARD_VAL 12345.0f

/* A paged prefix with room for `cap` positions, all slots NaN until written. */
typedef struct {
    ls_kv_prefix pf;
    void **k_pages, **v_pages;
    int64_t cap_pages;
    int n_kv, hd;
} t_pages;

static int pages_init(t_pages *tp, int64_t cap, int64_t S, ls_dtype dt, int n_kv, int hd) {
    memset(tp, 0, sizeof *tp);
    tp->cap_pages = (cap + S - 1) / S;
    tp->n_kv = n_kv;
    tp->hd = hd;
    tp->k_pages = calloc((size_t)(tp->cap_pages + 1), sizeof(void *));
    tp->v_pages = calloc((size_t)(tp->cap_pages + 1), sizeof(void *));
    if (!tp->k_pages || !tp->v_pages) return 1;
    size_t elems = (size_t)S * (size_t)n_kv * (size_t)hd;
    for (int64_t i = 0; i < tp->cap_pages; i++) {
        tp->k_pages[i] = malloc(elems * ls_dtype_size(dt));
        tp->v_pages[i] = malloc(elems * ls_dtype_size(dt));
        if (!tp->k_pages[i] || !tp->v_pages[i]) return 1;
        for (size_t e = 0; e < elems; e++) {
            if (dt == LS_DTYPE_BF16) {
                ((ls_bf16 *)tp->k_pages[i])[e] = ls_f32_to_bf16(NAN);
                ((ls_bf16 *)tp->v_pages[i])[e] = ls_f32_to_bf16(NAN);
            } else {
                ((float *)tp->k_pages[i])[e] = NAN;
                ((float *)tp->v_pages[i])[e] = NAN;
            }
        }
    }
    tp->pf.n = 0;
    tp->pf.page_size = S;
    tp->pf.dtype = dt;
    tp->pf.k_pages = tp->k_pages;
    tp->pf.v_pages = tp->v_pages;
    return 0;
}

/* Append T positions of k, v [T, n_kv, hd] (f32) at the end of the prefix. */
static void pages_append(t_pages *tp, const float *k, const float *v, int64_t T) {
    int64_t S = tp->pf.page_size, row = (int64_t)tp->n_kv * tp->hd;
    for (int64_t t = 0; t < T; t++) {
        int64_t p = tp->pf.n + t;
        LS_ASSERT(p / S < tp->cap_pages, "test pages full");
        size_t off = (size_t)((p % S) * row) * ls_dtype_size(tp->pf.dtype); /* bytes */
        ls_dtype dt = tp->pf.dtype;
        ls_convert_from_f32((char *)tp->k_pages[p / S] + off, dt, k + t * row, (size_t)row);
        ls_convert_from_f32((char *)tp->v_pages[p / S] + off, dt, v + t * row, (size_t)row);
    }
    tp->pf.n += T;
}

static void pages_free(t_pages *tp) {
    for (int64_t i = 0; i < tp->cap_pages; i++) {
        if (tp->k_pages) free(tp->k_pages[i]);
        if (tp->v_pages) free(tp->v_pages[i]);
    }
    free(tp->k_pages);
    free(tp->v_pages);
}

static void round_bf16(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = ls_bf16_to_f32(ls_f32_to_bf16(x[i]));
}

/* Output buffer of n floats with GUARD guard words either side. */
static float *guarded(int64_t n) {
    float *b = malloc((size_t)(n + 2 * GUARD) * sizeof(float));
    if (!b) return NULL;
    for (int64_t i = 0; i < n + 2 * GUARD; i++) b[i] = GUARD_VAL;
    return b + GUARD;
}
static int guard_ok(const float *x, int64_t n) {
    for (int64_t i = 1; i <= GUARD; i++)
        if (x[-i] != GUARD_VAL || x[n + i - 1] != GUARD_VAL) return 0;
    return 1;
}
static void guarded_free(float *x) {
    if (x) free(x - GUARD);
}

typedef struct {
    int64_t T, n, S;
    int n_h, n_kv, hd;
    ls_dtype dt;
    float q_std; /* > 1 makes peaked softmax rows (exercises the running-max rescale) */
} attn_case;

/* Run tiled and naive on one case; return 0 on agreement within tol. */
static int run_case(const attn_case *c, ls_rng *rng, ls_arena *scratch, double tol, double *worst) {
    int64_t T = c->T, n = c->n;
    int n_h = c->n_h, n_kv = c->n_kv, hd = c->hd;
    int64_t nq = T * n_h * hd, nkv = T * n_kv * hd;
    float *q = malloc((size_t)nq * sizeof(float));   /* [T, n_h, hd] */
    float *k = malloc((size_t)nkv * sizeof(float));  /* [T, n_kv, hd] */
    float *v = malloc((size_t)nkv * sizeof(float));  /* [T, n_kv, hd] */
    float *pk = malloc((size_t)(n * n_kv * hd + 1) * sizeof(float)); /* [n, n_kv, hd] */
    float *pv = malloc((size_t)(n * n_kv * hd + 1) * sizeof(float));
    float *o = guarded(nq), *lse = guarded(T * n_h);
    float *o_ref = malloc((size_t)nq * sizeof(float));
    float *lse_ref = malloc((size_t)(T * n_h) * sizeof(float));
    T_CHECK(q && k && v && pk && pv && o && lse && o_ref && lse_ref, "alloc");
    t_fill_normal(q, nq, rng, c->q_std);
    t_fill_normal(k, nkv, rng, 1.0f);
    t_fill_normal(v, nkv, rng, 1.0f);
    t_fill_normal(pk, n * n_kv * hd, rng, 1.0f);
    t_fill_normal(pv, n * n_kv * hd, rng, 1.0f);
    t_pages tp;
    T_CHECK(pages_init(&tp, n > 0 ? n : 1, c->S, c->dt, n_kv, hd) == 0, "pages alloc");
    pages_append(&tp, pk, pv, n);
    const ls_kv_prefix *pf = n > 0 ? &tp.pf : NULL;
    float scale = 1.0f / sqrtf((float)hd);

    size_t cur0 = scratch->cur;
    T_OK(ls_attn_fwd(o, lse, q, k, v, pf, T, n_h, n_kv, hd, scale, scratch));
    T_CHECK(scratch->cur == cur0, "scratch not released: %zu -> %zu", cur0, scratch->cur);
    ls_attn_naive(o_ref, lse_ref, q, k, v, pf, T, n_h, n_kv, hd, scale);

    T_CHECK(guard_ok(o, nq) && guard_ok(lse, T * n_h), "guard words overwritten");
    T_CHECK(t_all_finite_f(o, nq) && t_all_finite_f(lse, T * n_h), "non-finite output");
    double eo = t_max_abs_diff_f(o, o_ref, nq), el = t_max_abs_diff_f(lse, lse_ref, T * n_h);
    T_CHECK(eo <= tol && el <= tol,
            "T=%lld n=%lld S=%lld n_h=%d n_kv=%d hd=%d %s: max|o-ref| %.3g, "
            "max|lse-ref| %.3g (tol %.1g)",
            (long long)T, (long long)n, (long long)c->S, n_h, n_kv, hd, ls_dtype_name(c->dt), eo,
            el, tol);
    if (eo > *worst) *worst = eo;
    if (el > *worst) *worst = el;

    /* lse == NULL must give the same o */
    float *o2 = guarded(nq);
    T_CHECK(o2, "alloc");
    T_OK(ls_attn_fwd(o2, NULL, q, k, v, pf, T, n_h, n_kv, hd, scale, scratch));
    T_CHECK(guard_ok(o2, nq) && memcmp(o, o2, (size_t)nq * sizeof(float)) == 0,
            "o differs without lse");
    guarded_free(o2);

    pages_free(&tp);
    free(q), free(k), free(v), free(pk), free(pv), free(o_ref), free(lse_ref);
    guarded_free(o);
    guarded_free(lse);
    return 0;
}

int test_attn_tiled_vs_naive(void) {
    ls_rng rng;
    ls_rng_seed(&rng, 42);
    ls_arena scratch;
    ls_arena_init(&scratch, "scratch", 1 << 20);
    const ls_dtype F = LS_DTYPE_F32;
    /* Every T ∈ {1,2,7,64,65,300}, n ∈ {0,1,63,64,65,200}, S ∈ {5,16,64} (+ 7, 31, 32,
     * and 200 with n = 450 > one key block), r ∈ {1,2,4}, hd ∈ {16,24,64,128} and the
     * odd 1, 7, 20. */
    const attn_case cases[] = {
        /* empty prefix */
        {1, 0, 64, 4, 2, 64, F, 1}, {2, 0, 64, 8, 2, 16, F, 1}, {7, 0, 64, 2, 2, 24, F, 1},
        {64, 0, 64, 8, 2, 64, F, 1}, {65, 0, 64, 4, 1, 128, F, 1}, {300, 0, 64, 8, 2, 64, F, 1},
        {300, 0, 64, 3, 3, 24, F, 1}, {300, 0, 64, 4, 2, 16, F, 2},
        /* prefixes that do not divide the page */
        {1, 1, 64, 8, 2, 64, F, 1}, {7, 63, 64, 4, 2, 128, F, 1}, {65, 64, 64, 2, 2, 24, F, 1},
        {64, 65, 64, 8, 2, 16, F, 1}, {2, 200, 64, 8, 2, 64, F, 1}, {300, 200, 64, 4, 2, 64, F, 1},
        {1, 63, 5, 2, 1, 16, F, 1}, {65, 65, 5, 8, 2, 24, F, 1}, {7, 200, 5, 4, 4, 128, F, 1},
        {2, 1, 16, 4, 1, 24, F, 1}, {64, 63, 16, 8, 2, 64, F, 1}, {300, 65, 16, 6, 3, 16, F, 1},
        {65, 200, 16, 4, 2, 64, F, 2}, {7, 64, 31, 8, 2, 16, F, 1}, {65, 200, 32, 4, 2, 24, F, 1},
        {64, 450, 200, 8, 2, 64, F, 1}, {1, 450, 200, 4, 1, 128, F, 2},
        /* head dims that are not a multiple of the 6-wide output tile or the 8 lanes */
        {33, 70, 16, 4, 2, 7, F, 1}, {20, 9, 5, 2, 1, 1, F, 1}, {300, 30, 7, 8, 2, 20, F, 1},
        /* BF16 pages through the same path (reference reads the same bf16 values) */
        {65, 200, 16, 8, 2, 64, LS_DTYPE_BF16, 1}, {7, 63, 5, 4, 2, 24, LS_DTYPE_BF16, 1},
        {40, 100, 16, 4, 2, 7, LS_DTYPE_BF16, 1},
    };
    const int ncases = (int)(sizeof cases / sizeof cases[0]);
    double worst = 0;
    int ran = 0;
    for (int i = 0; i < ncases; i++) {
        if (run_case(&cases[i], &rng, &scratch, 1e-5, &worst)) {
            ls_arena_free(&scratch);
            return 1;
        }
        ran++;
    }
    T_CHECK(ran == ncases && ran > 0, "ran %d of %d cases", ran, ncases);

    /* bad arguments come back as statuses */
    float x[64] = {0}, y[64];
    T_CHECK(ls_attn_fwd(y, NULL, x, x, x, NULL, 1, 3, 2, 8, 1.0f, &scratch) == LS_ERR_ARG,
            "n_h not a multiple of n_kv accepted");
    T_CHECK(ls_attn_fwd(y, NULL, x, x, x, NULL, -1, 2, 2, 8, 1.0f, &scratch) == LS_ERR_ARG,
            "negative T accepted");
    void *pg[1] = {x};
    ls_kv_prefix bad = {
        .n = 4, .page_size = 4, .dtype = LS_DTYPE_F16, .k_pages = pg, .v_pages = pg};
    T_CHECK(ls_attn_fwd(y, NULL, x, x, x, &bad, 1, 2, 2, 8, 1.0f, &scratch) == LS_ERR_UNSUPPORTED,
            "F16 pages accepted");
    bad.dtype = LS_DTYPE_F32;
    bad.page_size = 0;
    T_CHECK(ls_attn_fwd(y, NULL, x, x, x, &bad, 1, 2, 2, 8, 1.0f, &scratch) == LS_ERR_ARG,
            "page_size 0 accepted");
    T_CHECK(scratch.cur == 0, "scratch left allocated: %zu", scratch.cur);
    ls_arena_free(&scratch);
    printf("  %d cases, worst |err| %.3g\n", ran, worst);
    return 0;
}

/* Attention of T queries over pages tp (prefix) then own k/v; o [T,n_h,hd], lse [T,n_h]. */
static ls_status fwd_pages(float *o, float *lse, const float *q, const float *k, const float *v,
                           const t_pages *tp, int64_t T, int n_h, int n_kv, int hd, ls_arena *a) {
    return ls_attn_fwd(o, lse, q, k, v, tp->pf.n > 0 ? &tp->pf : NULL, T, n_h, n_kv, hd,
                       1.0f / sqrtf((float)hd), a);
}

int test_attn_paged_bf16(void) {
    ls_rng rng;
    ls_rng_seed(&rng, 7);
    ls_arena scratch;
    ls_arena_init(&scratch, "scratch", 1 << 20);
    double tol = 1e-5;

    /* (1) BF16 pages vs the reference on the same bf16-rounded values in F32 pages */
    {
        const int n_h = 8, n_kv = 2, hd = 64;
        const int64_t T = 97, n = 333, S = 64;
        int64_t nq = T * n_h * hd, nkv = T * n_kv * hd, npf = n * n_kv * hd;
        float *q = malloc((size_t)nq * 4), *k = malloc((size_t)nkv * 4);
        float *v = malloc((size_t)nkv * 4);
        float *pk = malloc((size_t)npf * 4), *pv = malloc((size_t)npf * 4);
        float *o = guarded(nq), *lse = guarded(T * n_h);
        float *o_ref = malloc((size_t)nq * 4), *lse_ref = malloc((size_t)(T * n_h) * 4);
        float *o_nb = malloc((size_t)nq * 4), *lse_nb = malloc((size_t)(T * n_h) * 4);
        T_CHECK(q && k && v && pk && pv && o && lse && o_ref && lse_ref && o_nb && lse_nb, "alloc");
        t_fill_normal(q, nq, &rng, 1.0f);
        t_fill_normal(k, nkv, &rng, 1.0f);
        t_fill_normal(v, nkv, &rng, 1.0f);
        t_fill_normal(pk, npf, &rng, 1.0f);
        t_fill_normal(pv, npf, &rng, 1.0f);
        t_pages pb, pf32;
        T_CHECK(pages_init(&pb, n, S, LS_DTYPE_BF16, n_kv, hd) == 0, "pages");
        T_CHECK(pages_init(&pf32, n, S, LS_DTYPE_F32, n_kv, hd) == 0, "pages");
        pages_append(&pb, pk, pv, n);
        round_bf16(pk, npf);
        round_bf16(pv, npf);
        pages_append(&pf32, pk, pv, n);
        float scale = 1.0f / sqrtf((float)hd);
        T_OK(ls_attn_fwd(o, lse, q, k, v, &pb.pf, T, n_h, n_kv, hd, scale, &scratch));
        ls_attn_naive(o_ref, lse_ref, q, k, v, &pf32.pf, T, n_h, n_kv, hd, scale);
        ls_attn_naive(o_nb, lse_nb, q, k, v, &pb.pf, T, n_h, n_kv, hd, scale);
        T_CHECK(guard_ok(o, nq) && guard_ok(lse, T * n_h), "guard words overwritten");
        T_CHECK(t_all_finite_f(o, nq) && t_all_finite_f(lse, T * n_h), "non-finite output");
        double eo = t_max_abs_diff_f(o, o_ref, nq), el = t_max_abs_diff_f(lse, lse_ref, T * n_h);
        T_CHECK(eo <= tol && el <= tol,
                "bf16 pages vs f32 pages of the same values: o %.3g lse %.3g", eo, el);
        double en = t_max_abs_diff_f(o_nb, o_ref, nq);
        double enl = t_max_abs_diff_f(lse_nb, lse_ref, T * n_h);
        T_CHECK(en == 0 && enl == 0,
                "naive bf16 vs naive f32 of the same values: o %.3g lse %.3g", en, enl);
        printf("  bf16 pages: max|o-ref| %.3g, max|lse-ref| %.3g\n", eo, el);
        pages_free(&pb);
        pages_free(&pf32);
        free(q), free(k), free(v), free(pk), free(pv);
        free(o_ref), free(lse_ref), free(o_nb), free(lse_nb);
        guarded_free(o);
        guarded_free(lse);
    }

    /* (2) prompt capture: queries split in two calls (the first call's own K/V appended
     * to the pages before the second) equal one call. Own K/V are bf16-representable so
     * that appending them to BF16 pages loses nothing. */
    const struct { int64_t n0, T1, T2, S; ls_dtype dt; int n_h, n_kv, hd; } sp[] = {
        {37, 50, 61, 16, LS_DTYPE_BF16, 8, 2, 64},  {0, 64, 65, 64, LS_DTYPE_BF16, 4, 2, 128},
        {200, 7, 130, 5, LS_DTYPE_BF16, 4, 1, 24}, {65, 129, 1, 64, LS_DTYPE_F32, 8, 2, 16},
        {0, 1, 300, 32, LS_DTYPE_F32, 2, 2, 64},
    };
    for (size_t ci = 0; ci < sizeof sp / sizeof sp[0]; ci++) {
        const int n_h = sp[ci].n_h, n_kv = sp[ci].n_kv, hd = sp[ci].hd;
        const int64_t n0 = sp[ci].n0, T1 = sp[ci].T1, T2 = sp[ci].T2, T = T1 + T2;
        int64_t qrow = (int64_t)n_h * hd, kvrow = (int64_t)n_kv * hd;
        float *q = malloc((size_t)(T * qrow) * 4), *k = malloc((size_t)(T * kvrow) * 4);
        float *v = malloc((size_t)(T * kvrow) * 4);
        float *pk = malloc((size_t)(n0 * kvrow + 1) * 4);
        float *pv = malloc((size_t)(n0 * kvrow + 1) * 4);
        float *o1 = guarded(T * qrow), *l1 = guarded(T * n_h); /* one call */
        float *o2 = guarded(T * qrow), *l2 = guarded(T * n_h); /* two calls */
        T_CHECK(q && k && v && pk && pv && o1 && l1 && o2 && l2, "alloc");
        t_fill_normal(q, T * qrow, &rng, 1.0f);
        t_fill_normal(k, T * kvrow, &rng, 1.0f);
        t_fill_normal(v, T * kvrow, &rng, 1.0f);
        t_fill_normal(pk, n0 * kvrow, &rng, 1.0f);
        t_fill_normal(pv, n0 * kvrow, &rng, 1.0f);
        round_bf16(k, T * kvrow);
        round_bf16(v, T * kvrow);
        t_pages tp;
        T_CHECK(pages_init(&tp, n0 + T, sp[ci].S, sp[ci].dt, n_kv, hd) == 0, "pages");
        pages_append(&tp, pk, pv, n0);
        T_OK(fwd_pages(o1, l1, q, k, v, &tp, T, n_h, n_kv, hd, &scratch));
        T_OK(fwd_pages(o2, l2, q, k, v, &tp, T1, n_h, n_kv, hd, &scratch));
        pages_append(&tp, k, v, T1);
        T_OK(fwd_pages(o2 + T1 * qrow, l2 + T1 * n_h, q + T1 * qrow, k + T1 * kvrow, v + T1 * kvrow,
                       &tp, T2, n_h, n_kv, hd, &scratch));
        T_CHECK(guard_ok(o1, T * qrow) && guard_ok(l1, T * n_h) && guard_ok(o2, T * qrow) &&
                    guard_ok(l2, T * n_h), "guard words overwritten");
        T_CHECK(t_all_finite_f(o1, T * qrow) && t_all_finite_f(o2, T * qrow) &&
                    t_all_finite_f(l1, T * n_h) && t_all_finite_f(l2, T * n_h),
                "non-finite output");
        double eo = t_max_abs_diff_f(o2, o1, T * qrow), el = t_max_abs_diff_f(l2, l1, T * n_h);
        T_CHECK(eo <= tol && el <= tol,
                "split %lld+%lld over n0=%lld S=%lld %s: max|o2-o1| %.3g, max|lse2-lse1| %.3g",
                (long long)T1, (long long)T2, (long long)n0, (long long)sp[ci].S,
                ls_dtype_name(sp[ci].dt), eo, el);
        pages_free(&tp);
        free(q), free(k), free(v), free(pk), free(pv);
        guarded_free(o1), guarded_free(l1), guarded_free(o2), guarded_free(l2);
    }
    T_CHECK(scratch.cur == 0, "scratch left allocated: %zu", scratch.cur);
    ls_arena_free(&scratch);
    return 0;
}

/* ---- backward ------------------------------------------------------------------ */

/* Double-precision model of one attention call, the oracle of test_attn_bwd_fd: the
 * semantics of ls_attn_fwd (prefix in pages [S, n_kv, hd], causal own keys, GQA) and the
 * loss L = Σ o·R. */
typedef struct {
    int64_t T, n, S;
    int n_h, n_kv, hd, r;
    double scale;
    double *q, *k, *v, *R; /* [T,n_h,hd], [T,n_kv,hd], [T,n_kv,hd], [T,n_h,hd] */
    double **pk, **pv;     /* ceil(n/S) pages [S, n_kv, hd] */
    double *s, *acc;       /* [n + T], [hd] scratch */
} dm_attn;

/* Key (is_v = 0) or value row of position p (prefix if p < n, else own p − n), head j. */
static double *dm_kv_row(const dm_attn *m, int is_v, int64_t p, int j) {
    if (p < m->n) {
        double *const *pg = is_v ? m->pv : m->pk;
        return pg[p / m->S] + ((p % m->S) * m->n_kv + j) * m->hd;
    }
    return (is_v ? m->v : m->k) + ((p - m->n) * m->n_kv + j) * m->hd;
}

/* Softmax weights of row (token t, head h) into m->s [n + t + 1]; returns lse. */
static double dm_weights(const dm_attn *m, int64_t t, int h) {
    const int j = h / m->r, hd = m->hd;
    const double *qt = m->q + (t * m->n_h + h) * hd;
    const int64_t nk = m->n + t + 1;
    double mx = -INFINITY, sum = 0;
    for (int64_t p = 0; p < nk; p++) {
        const double *kp = dm_kv_row(m, 0, p, j);
        double dot = 0;
        for (int d = 0; d < hd; d++) dot += qt[d] * kp[d];
        m->s[p] = m->scale * dot;
        if (m->s[p] > mx) mx = m->s[p];
    }
    for (int64_t p = 0; p < nk; p++) sum += (m->s[p] = exp(m->s[p] - mx));
    for (int64_t p = 0; p < nk; p++) m->s[p] /= sum;
    return mx + log(sum);
}

/* Row (t, h) of the forward: o row [hd] and lse when non-NULL; returns Σ_d o[d]·R[t,h,d]. */
static double dm_row(const dm_attn *m, int64_t t, int h, double *o_row, double *lse) {
    const int j = h / m->r, hd = m->hd;
    double l = dm_weights(m, t, h);
    for (int d = 0; d < hd; d++) m->acc[d] = 0;
    for (int64_t p = 0; p < m->n + t + 1; p++) {
        const double *vp = dm_kv_row(m, 1, p, j);
        for (int d = 0; d < hd; d++) m->acc[d] += m->s[p] * vp[d];
    }
    const double *Rt = m->R + (t * m->n_h + h) * hd;
    double loss = 0;
    for (int d = 0; d < hd; d++) {
        if (o_row) o_row[d] = m->acc[d];
        loss += m->acc[d] * Rt[d];
    }
    if (lse) *lse = l;
    return loss;
}

/* Central difference (h = 1e-6) of L w.r.t. *x. Only the rows x reaches (tokens [t0, t1)
 * × heads [h0, h1)) are summed: every other row has the same value at x ± h and would
 * add nothing but rounding, so this is the difference of the whole double loss. */
static double dm_fd(const dm_attn *m, double *x, int64_t t0, int64_t t1, int h0, int h1) {
    const double eps = 1e-6, x0 = *x;
    double l[2] = {0, 0};
    for (int side = 0; side < 2; side++) {
        *x = side ? x0 - eps : x0 + eps;
        for (int64_t t = t0; t < t1; t++)
            for (int h = h0; h < h1; h++) l[side] += dm_row(m, t, h, NULL, NULL);
    }
    *x = x0;
    return (l[0] - l[1]) / (2 * eps);
}

/* Analytic double backward of L (dO = R), the reference of the larger check: gq
 * [T,n_h,hd] (=), gk, gv [T,n_kv,hd] (=), gpk, gpv [n,n_kv,hd] (=, position order). */
static void dm_bwd(const dm_attn *m, double *gq, double *gk, double *gv, double *gpk,
                   double *gpv) {
    const int hd = m->hd, n_kv = m->n_kv;
    memset(gq, 0, (size_t)(m->T * m->n_h * hd) * sizeof(double));
    memset(gk, 0, (size_t)(m->T * n_kv * hd) * sizeof(double));
    memset(gv, 0, (size_t)(m->T * n_kv * hd) * sizeof(double));
    memset(gpk, 0, (size_t)(m->n * n_kv * hd) * sizeof(double));
    memset(gpv, 0, (size_t)(m->n * n_kv * hd) * sizeof(double));
    for (int64_t t = 0; t < m->T; t++) {
        for (int h = 0; h < m->n_h; h++) {
            const int j = h / m->r;
            const int64_t nk = m->n + t + 1;
            const double *qt = m->q + (t * m->n_h + h) * hd, *Rt = m->R + (t * m->n_h + h) * hd;
            double *gqt = gq + (t * m->n_h + h) * hd;
            dm_weights(m, t, h);
            double D = 0; /* dO·o = Σ_p P_p (dO·v_p) */
            for (int64_t p = 0; p < nk; p++) {
                const double *vp = dm_kv_row(m, 1, p, j);
                for (int d = 0; d < hd; d++) D += m->s[p] * vp[d] * Rt[d];
            }
            for (int64_t p = 0; p < nk; p++) {
                const double *kp = dm_kv_row(m, 0, p, j), *vp = dm_kv_row(m, 1, p, j);
                const int64_t po = p < m->n ? (p * n_kv + j) * hd : ((p - m->n) * n_kv + j) * hd;
                double *gkp = (p < m->n ? gpk : gk) + po, *gvp = (p < m->n ? gpv : gv) + po;
                double dP = 0;
                for (int d = 0; d < hd; d++) dP += Rt[d] * vp[d];
                double dS = m->s[p] * (dP - D);
                for (int d = 0; d < hd; d++) {
                    gqt[d] += m->scale * dS * kp[d];
                    gkp[d] += m->scale * dS * qt[d];
                    gvp[d] += m->s[p] * Rt[d];
                }
            }
        }
    }
}

/* ‖a − b‖ / ‖b‖ in double; INFINITY when n == 0 or non-finite. */
static double rel_err_d(const double *a, const double *b, int64_t n) {
    if (n <= 0) return INFINITY;
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    double r = sqrt(num) / fmax(sqrt(den), 1e-30);
    return isfinite(r) ? r : INFINITY;
}

/* One backward problem: f32 inputs for the kernel, the same values in the double model. */
typedef struct {
    int64_t T, n, S;
    int n_h, n_kv, hd;
    ls_dtype dt;
} bwd_case;

typedef struct {
    bwd_case c;
    int64_t nq, nkv, npf, npages;
    float *q, *k, *v, *R, *pk, *pv; /* kernel inputs; pk, pv [n, n_kv, hd] as in the pages */
    t_pages tp;                     /* the prefix in c.dt */
    dm_attn m;
} bwd_prob;

static void bwd_prob_free(bwd_prob *b) {
    free(b->q), free(b->k), free(b->v), free(b->R), free(b->pk), free(b->pv);
    pages_free(&b->tp);
    for (int64_t i = 0; i < b->npages; i++) {
        if (b->m.pk) free(b->m.pk[i]);
        if (b->m.pv) free(b->m.pv[i]);
    }
    free(b->m.pk), free(b->m.pv);
    free(b->m.q), free(b->m.k), free(b->m.v), free(b->m.R), free(b->m.s), free(b->m.acc);
}

static double *to_double(const float *x, int64_t n) {
    double *d = malloc((size_t)(n + 1) * sizeof(double));
    if (d)
        for (int64_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static int bwd_prob_init(bwd_prob *b, const bwd_case *c, ls_rng *rng) {
    memset(b, 0, sizeof *b);
    b->c = *c;
    const int64_t T = c->T, n = c->n, row = (int64_t)c->n_kv * c->hd;
    b->nq = T * c->n_h * c->hd, b->nkv = T * row, b->npf = n * row;
    b->npages = (n + c->S - 1) / c->S;
    b->q = malloc((size_t)b->nq * sizeof(float));   /* [T, n_h, hd] */
    b->R = malloc((size_t)b->nq * sizeof(float));   /* [T, n_h, hd] = dout */
    b->k = malloc((size_t)b->nkv * sizeof(float));  /* [T, n_kv, hd] */
    b->v = malloc((size_t)b->nkv * sizeof(float));  /* [T, n_kv, hd] */
    b->pk = malloc((size_t)(b->npf + 1) * sizeof(float)); /* [n, n_kv, hd] */
    b->pv = malloc((size_t)(b->npf + 1) * sizeof(float));
    T_CHECK(b->q && b->R && b->k && b->v && b->pk && b->pv, "alloc");
    t_fill_normal(b->q, b->nq, rng, 1.0f);
    t_fill_normal(b->R, b->nq, rng, 1.0f);
    t_fill_normal(b->k, b->nkv, rng, 1.0f);
    t_fill_normal(b->v, b->nkv, rng, 1.0f);
    t_fill_normal(b->pk, b->npf, rng, 1.0f);
    t_fill_normal(b->pv, b->npf, rng, 1.0f);
    if (c->dt == LS_DTYPE_BF16) { /* the model holds the values the BF16 pages hold */
        round_bf16(b->pk, b->npf);
        round_bf16(b->pv, b->npf);
    }
    T_CHECK(pages_init(&b->tp, n > 0 ? n : 1, c->S, c->dt, c->n_kv, c->hd) == 0, "pages");
    pages_append(&b->tp, b->pk, b->pv, n);

    dm_attn *m = &b->m;
    m->T = T, m->n = n, m->S = c->S;
    m->n_h = c->n_h, m->n_kv = c->n_kv, m->hd = c->hd, m->r = c->n_h / c->n_kv;
    m->scale = (double)(1.0f / sqrtf((float)c->hd)); /* the f32 scale the kernel gets */
    m->q = to_double(b->q, b->nq), m->R = to_double(b->R, b->nq);
    m->k = to_double(b->k, b->nkv), m->v = to_double(b->v, b->nkv);
    m->s = malloc((size_t)(n + T) * sizeof(double));
    m->acc = malloc((size_t)c->hd * sizeof(double));
    m->pk = calloc((size_t)b->npages + 1, sizeof(double *));
    m->pv = calloc((size_t)b->npages + 1, sizeof(double *));
    T_CHECK(m->q && m->R && m->k && m->v && m->s && m->acc && m->pk && m->pv, "alloc");
    for (int64_t i = 0; i < b->npages; i++) {
        m->pk[i] = malloc((size_t)(c->S * row) * sizeof(double));
        m->pv[i] = malloc((size_t)(c->S * row) * sizeof(double));
        T_CHECK(m->pk[i] && m->pv[i], "alloc");
        for (int64_t e = 0; e < c->S * row; e++) m->pk[i][e] = m->pv[i][e] = NAN;
    }
    for (int64_t p = 0; p < n; p++)
        for (int64_t e = 0; e < row; e++) {
            m->pk[p / c->S][(p % c->S) * row + e] = b->pk[p * row + e];
            m->pv[p / c->S][(p % c->S) * row + e] = b->pv[p * row + e];
        }
    return 0;
}

/* f32 gradient pages for the prefix: positions < n hold `base` [n, n_kv, hd], the slots
 * past n of the last page GUARD_VAL. */
static int grad_pages_init(t_pages *gp, const bwd_prob *b, const float *base) {
    const bwd_case *c = &b->c;
    T_CHECK(pages_init(gp, c->n > 0 ? c->n : 1, c->S, LS_DTYPE_F32, c->n_kv, c->hd) == 0,
            "pages");
    pages_append(gp, base, base, c->n);
    const int64_t row = (int64_t)c->n_kv * c->hd;
    for (int64_t p = c->n; p < gp->cap_pages * c->S; p++)
        for (int64_t e = 0; e < row; e++) {
            ((float *)gp->k_pages[p / c->S])[(p % c->S) * row + e] = GUARD_VAL;
            ((float *)gp->v_pages[p / c->S])[(p % c->S) * row + e] = GUARD_VAL;
        }
    return 0;
}

/* Gradient pages minus base, in position order [n, n_kv, hd]; 1 if a slot past n changed. */
static int grad_pages_gather(double *gk, double *gv, const t_pages *gp, const bwd_prob *b,
                             const float *base) {
    const int64_t S = b->c.S, row = (int64_t)b->c.n_kv * b->c.hd;
    for (int64_t p = 0; p < gp->cap_pages * S; p++)
        for (int64_t e = 0; e < row; e++) {
            float ks = ((const float *)gp->k_pages[p / S])[(p % S) * row + e];
            float vs = ((const float *)gp->v_pages[p / S])[(p % S) * row + e];
            if (p >= b->c.n) {
                if (ks != GUARD_VAL || vs != GUARD_VAL) return 1;
                continue;
            }
            gk[p * row + e] = (double)ks - base[p * row + e];
            gv[p * row + e] = (double)vs - base[p * row + e];
        }
    return 0;
}

/* Whether f32 pages a and b hold the same bits in all slots of the k pages (when `k`)
 * and of the v pages (when `v`). */
static int pages_same(const t_pages *a, const t_pages *b, int k, int v) {
    const size_t bytes = (size_t)(a->pf.page_size * a->n_kv * a->hd) * sizeof(float);
    for (int64_t i = 0; i < a->cap_pages; i++) {
        if (k && memcmp(a->k_pages[i], b->k_pages[i], bytes) != 0) return 0;
        if (v && memcmp(a->v_pages[i], b->v_pages[i], bytes) != 0) return 0;
    }
    return 1;
}

/* Kernel backward of problem b under `threads` threads, checked against the reference
 * gradients (ref_*: q, own k, own v, prefix k, prefix v) within tol; own gradients must
 * equal those of a call with dk_prefix = dv_prefix = NULL bit for bit. */
static int bwd_check(const bwd_prob *b, const float *o, const float *lse, const double *ref_q,
                     const double *ref_k, const double *ref_v, const double *ref_pk,
                     const double *ref_pv, int threads, double tol, ls_arena *scratch,
                     double *worst, int64_t *compared) {
    const bwd_case *c = &b->c;
    const ls_kv_prefix *pf = c->n > 0 ? &b->tp.pf : NULL;
    const float scale = 1.0f / sqrtf((float)c->hd);
    const int saved = ls_get_threads();
    ls_set_threads(threads);
    float *dq = guarded(b->nq), *dk = guarded(b->nkv), *dv = guarded(b->nkv);
    float *dq0 = guarded(b->nq), *dk0 = guarded(b->nkv), *dv0 = guarded(b->nkv);
    float *base = malloc((size_t)(b->npf + 1) * sizeof(float));
    double *gpk = malloc((size_t)(b->npf + 1) * sizeof(double));
    double *gpv = malloc((size_t)(b->npf + 1) * sizeof(double));
    T_CHECK(dq && dk && dv && dq0 && dk0 && dv0 && base && gpk && gpv, "alloc");
    for (int64_t i = 0; i < b->npf; i++) base[i] = 0.25f * (float)(i % 7) - 0.75f;
    t_pages gp;
    T_CHECK(grad_pages_init(&gp, b, base) == 0, "grad pages");

    size_t cur0 = scratch->cur;
    T_OK(ls_attn_bwd(dq, dk, dv, gp.k_pages, gp.v_pages, b->R, o, lse, b->q, b->k, b->v, pf,
                     c->T, c->n_h, c->n_kv, c->hd, scale, scratch));
    T_OK(ls_attn_bwd(dq0, dk0, dv0, NULL, NULL, b->R, o, lse, b->q, b->k, b->v, pf, c->T,
                     c->n_h, c->n_kv, c->hd, scale, scratch));
    /* only one of the prefix gradients: that one as with both, the other pages untouched */
    t_pages g0, g1; /* g0 stays as initialised */
    T_CHECK(grad_pages_init(&g0, b, base) == 0 && grad_pages_init(&g1, b, base) == 0,
            "grad pages");
    T_OK(ls_attn_bwd(dq0, dk0, dv0, g1.k_pages, NULL, b->R, o, lse, b->q, b->k, b->v, pf, c->T,
                     c->n_h, c->n_kv, c->hd, scale, scratch));
    T_CHECK(pages_same(&g1, &gp, 1, 0) && pages_same(&g1, &g0, 0, 1),
            "dk_prefix alone differs from both, or dv pages touched");
    T_OK(ls_attn_bwd(dq0, dk0, dv0, NULL, g1.v_pages, b->R, o, lse, b->q, b->k, b->v, pf, c->T,
                     c->n_h, c->n_kv, c->hd, scale, scratch));
    T_CHECK(pages_same(&g1, &gp, 1, 1), "dv_prefix alone differs from both, or dk pages touched");
    pages_free(&g0);
    pages_free(&g1);
    ls_set_threads(saved);
    T_CHECK(scratch->cur == cur0, "scratch not released: %zu -> %zu", cur0, scratch->cur);
    T_CHECK(guard_ok(dq, b->nq) && guard_ok(dk, b->nkv) && guard_ok(dv, b->nkv) &&
                guard_ok(dq0, b->nq) && guard_ok(dk0, b->nkv) && guard_ok(dv0, b->nkv),
            "guard words overwritten");
    T_CHECK(t_all_finite_f(dq, b->nq) && t_all_finite_f(dk, b->nkv) &&
                t_all_finite_f(dv, b->nkv), "non-finite gradient");
    T_CHECK(memcmp(dq, dq0, (size_t)b->nq * sizeof(float)) == 0 &&
                memcmp(dk, dk0, (size_t)b->nkv * sizeof(float)) == 0 &&
                memcmp(dv, dv0, (size_t)b->nkv * sizeof(float)) == 0,
            "own gradients differ with and without prefix gradients");
    T_CHECK(grad_pages_gather(gpk, gpv, &gp, b, base) == 0,
            "prefix gradient slot past n written");

    double e[5] = {t_rel_err_fd(dq, ref_q, b->nq), t_rel_err_fd(dk, ref_k, b->nkv),
                   t_rel_err_fd(dv, ref_v, b->nkv), 0, 0};
    int ne = 3;
    if (c->T == 1 && c->n == 0) {
        /* one query seeing one key: the softmax is the constant 1, dq = dk = 0 exactly, and
         * a relative error would compare rounding with rounding. Instead: both at noise
         * level (rms ≤ 1e-6 kernel, ≤ 1e-8 differences), scaled into e as rms / 1e-2. */
        double rq = 0, rk = 0, fq = 0, fk = 0;
        for (int64_t i = 0; i < b->nq; i++) rq += (double)dq[i] * dq[i], fq += ref_q[i] * ref_q[i];
        for (int64_t i = 0; i < b->nkv; i++) rk += (double)dk[i] * dk[i], fk += ref_k[i] * ref_k[i];
        T_CHECK(sqrt(fq / (double)b->nq) <= 1e-8 && sqrt(fk / (double)b->nkv) <= 1e-8,
                "reference dq, dk not zero for a single key");
        e[0] = sqrt(rq / (double)b->nq) / 1e-2;
        e[1] = sqrt(rk / (double)b->nkv) / 1e-2;
    }
    *compared += b->nq + 2 * b->nkv;
    if (c->n > 0) {
        for (int64_t i = 0; i < b->npf; i++)
            T_CHECK(isfinite(gpk[i]) && isfinite(gpv[i]), "non-finite prefix gradient");
        e[3] = rel_err_d(gpk, ref_pk, b->npf);
        e[4] = rel_err_d(gpv, ref_pv, b->npf);
        ne = 5;
        *compared += 2 * b->npf;
    }
    for (int i = 0; i < ne; i++) {
        static const char *nm[5] = {"dq", "dk", "dv", "dk_prefix", "dv_prefix"};
        T_CHECK(e[i] <= tol,
                "T=%lld n=%lld S=%lld n_h=%d n_kv=%d hd=%d %s, %d threads: %s rel err %.3g "
                "(tol %.1g)",
                (long long)c->T, (long long)c->n, (long long)c->S, c->n_h, c->n_kv, c->hd,
                ls_dtype_name(c->dt), threads, nm[i], e[i], tol);
        if (e[i] > *worst) *worst = e[i];
    }
    pages_free(&gp);
    free(base), free(gpk), free(gpv);
    guarded_free(dq), guarded_free(dk), guarded_free(dv);
    guarded_free(dq0), guarded_free(dk0), guarded_free(dv0);
    return 0;
}

/* Kernel forward of b into o, lse (guarded), checked against the double model. */
static int bwd_forward(const bwd_prob *b, float *o, float *lse, ls_arena *scratch) {
    const bwd_case *c = &b->c;
    const int64_t rows = c->T * c->n_h;
    const ls_kv_prefix *pf = c->n > 0 ? &b->tp.pf : NULL;
    T_OK(ls_attn_fwd(o, lse, b->q, b->k, b->v, pf, c->T, c->n_h, c->n_kv, c->hd,
                     1.0f / sqrtf((float)c->hd), scratch));
    double *od = malloc((size_t)b->nq * sizeof(double));  /* [T, n_h, hd] */
    double *ld = malloc((size_t)rows * sizeof(double));    /* [T, n_h] */
    T_CHECK(od && ld, "alloc");
    for (int64_t t = 0; t < c->T; t++)
        for (int h = 0; h < c->n_h; h++)
            dm_row(&b->m, t, h, od + (t * c->n_h + h) * c->hd, ld + t * c->n_h + h);
    T_CHECK(guard_ok(o, b->nq) && guard_ok(lse, rows), "forward guard words overwritten");
    double eo = 0, el = 0;
    for (int64_t i = 0; i < b->nq; i++) eo = fmax(eo, fabs(o[i] - od[i]));
    for (int64_t i = 0; i < rows; i++) el = fmax(el, fabs(lse[i] - ld[i]));
    T_CHECK(t_all_finite_f(o, b->nq) && t_all_finite_f(lse, rows) && eo <= 1e-5 && el <= 1e-5,
            "forward vs double model: max|o| err %.3g, max|lse| err %.3g", eo, el);
    free(od), free(ld);
    return 0;
}

int test_attn_bwd_fd(void) {
    ls_rng rng;
    ls_rng_seed(&rng, 2024);
    ls_arena scratch;
    ls_arena_init(&scratch, "scratch", 1 << 20);
    const ls_dtype F = LS_DTYPE_F32, H = LS_DTYPE_BF16;
    /* T ∈ {1,3,65}; prefix n ∈ {0,1,5,64,70} with S ∈ {5,64} (64 = 12·5+4 and 70 = 64+6
     * end in a partial page); r ∈ {1,2}; hd ∈ {8,16}; F32 and BF16 pages; and hd = 7
     * (not a whole register tile) over 9 = 2·4+1 positions. */
    const bwd_case cases[] = {
        {1, 0, 64, 2, 2, 8, F},   {3, 0, 64, 4, 2, 16, F}, {65, 0, 64, 2, 1, 8, F},
        {3, 1, 5, 2, 1, 16, F},   {1, 5, 64, 4, 2, 8, F},  {3, 64, 5, 2, 2, 8, F},
        {65, 70, 64, 1, 1, 8, F}, {3, 70, 5, 4, 2, 16, F}, {65, 5, 5, 2, 1, 16, H},
        {3, 64, 64, 2, 1, 16, H}, {1, 70, 5, 2, 2, 8, H},  {65, 1, 64, 2, 2, 16, H},
        {7, 9, 4, 2, 1, 7, F},
    };
    const int ncases = (int)(sizeof cases / sizeof cases[0]);
    const double tol = 1e-4;
    const int threads[3] = {ls_get_threads(), 1, 3};
    double worst = 0;
    int64_t compared = 0;
    for (int ci = 0; ci < ncases; ci++) {
        bwd_prob b;
        T_CHECK(bwd_prob_init(&b, &cases[ci], &rng) == 0, "problem setup");
        const int64_t T = b.c.T, n = b.c.n, row = (int64_t)b.c.n_kv * b.c.hd;
        const int r = b.m.r;
        float *o = guarded(b.nq), *lse = guarded(T * b.c.n_h);
        double *fq = malloc((size_t)b.nq * sizeof(double));
        double *fk = malloc((size_t)b.nkv * sizeof(double));
        double *fv = malloc((size_t)b.nkv * sizeof(double));
        double *fpk = malloc((size_t)(b.npf + 1) * sizeof(double));
        double *fpv = malloc((size_t)(b.npf + 1) * sizeof(double));
        T_CHECK(o && lse && fq && fk && fv && fpk && fpv, "alloc");
        /* (1) the kernel forward (the o, lse the backward starts from) vs the model */
        if (bwd_forward(&b, o, lse, &scratch)) return 1;
        /* (2) central differences of the double loss: every element of q, own k/v and
         * the prefix pages */
        dm_attn *m = &b.m;
        for (int64_t t = 0; t < T; t++)
            for (int h = 0; h < b.c.n_h; h++)
                for (int d = 0; d < b.c.hd; d++) {
                    int64_t i = (t * b.c.n_h + h) * b.c.hd + d;
                    fq[i] = dm_fd(m, m->q + i, t, t + 1, h, h + 1);
                }
        for (int64_t s = 0; s < T; s++) /* own key s: tokens s.. of the kv head's group */
            for (int64_t e = 0; e < row; e++) {
                int j = (int)(e / b.c.hd);
                fk[s * row + e] = dm_fd(m, m->k + s * row + e, s, T, j * r, (j + 1) * r);
                fv[s * row + e] = dm_fd(m, m->v + s * row + e, s, T, j * r, (j + 1) * r);
            }
        for (int64_t p = 0; p < n; p++)
            for (int64_t e = 0; e < row; e++) {
                int j = (int)(e / b.c.hd);
                double *xk = m->pk[p / b.c.S] + (p % b.c.S) * row + e;
                double *xv = m->pv[p / b.c.S] + (p % b.c.S) * row + e;
                fpk[p * row + e] = dm_fd(m, xk, 0, T, j * r, (j + 1) * r);
                fpv[p * row + e] = dm_fd(m, xv, 0, T, j * r, (j + 1) * r);
            }
        /* (3) the kernel under several thread counts (different blockings) */
        for (int ti = 0; ti < 3; ti++)
            if (bwd_check(&b, o, lse, fq, fk, fv, fpk, fpv, threads[ti], tol, &scratch, &worst,
                          &compared))
                return 1;
        free(fq), free(fk), free(fv), free(fpk), free(fpv);
        guarded_free(o), guarded_free(lse);
        bwd_prob_free(&b);
    }
    T_CHECK(compared > 0, "no gradient element compared");
    printf("  %d cases vs finite differences, %lld elements, worst rel err %.3g\n", ncases,
           (long long)compared, worst);

    /* larger shapes (several query, own-key and prefix blocks; r = 4) against the analytic
     * double backward, no finite differences */
    const bwd_case big[] = {{300, 200, 64, 8, 2, 64, F}, {65, 530, 64, 4, 1, 64, H}};
    double worst_big = 0;
    int64_t compared_big = 0;
    for (size_t ci = 0; ci < sizeof big / sizeof big[0]; ci++) {
        bwd_prob b;
        T_CHECK(bwd_prob_init(&b, &big[ci], &rng) == 0, "problem setup");
        float *o = guarded(b.nq), *lse = guarded(b.c.T * b.c.n_h);
        double *gq = malloc((size_t)b.nq * sizeof(double));
        double *gk = malloc((size_t)b.nkv * sizeof(double));
        double *gv = malloc((size_t)b.nkv * sizeof(double));
        double *gpk = malloc((size_t)(b.npf + 1) * sizeof(double));
        double *gpv = malloc((size_t)(b.npf + 1) * sizeof(double));
        T_CHECK(o && lse && gq && gk && gv && gpk && gpv, "alloc");
        if (bwd_forward(&b, o, lse, &scratch)) return 1;
        dm_bwd(&b.m, gq, gk, gv, gpk, gpv);
        for (int ti = 0; ti < 2; ti++)
            if (bwd_check(&b, o, lse, gq, gk, gv, gpk, gpv, threads[ti], tol, &scratch,
                          &worst_big, &compared_big))
                return 1;
        free(gq), free(gk), free(gv), free(gpk), free(gpv);
        guarded_free(o), guarded_free(lse);
        bwd_prob_free(&b);
    }
    T_CHECK(compared_big > 0, "no gradient element compared");
    printf("  larger shapes vs double backward: worst rel err %.3g\n", worst_big);

    /* bad arguments come back as statuses */
    float x[64] = {0}, y[64];
    void *pg[2] = {x, x}, *gpg[2] = {y, NULL}; /* second gradient page missing */
    ls_kv_prefix two = {
        .n = 2, .page_size = 1, .dtype = LS_DTYPE_F32, .k_pages = pg, .v_pages = pg};
    T_CHECK(ls_attn_bwd(y, y, y, gpg, NULL, x, x, x, x, x, x, &two, 1, 2, 2, 8, 1.0f,
                        &scratch) == LS_ERR_ARG,
            "NULL prefix gradient page accepted");
    T_CHECK(ls_attn_bwd(y, y, y, NULL, NULL, x, x, x, x, x, x, NULL, 1, 3, 2, 8, 1.0f,
                        &scratch) == LS_ERR_ARG,
            "n_h not a multiple of n_kv accepted");
    T_CHECK(scratch.cur == 0, "scratch left allocated: %zu", scratch.cur);
    ls_arena_free(&scratch);
    return 0;
}
