/*
 * test_attention.c — the tiled attention forward (ls_attn_fwd) against the naive
 * double-precision reference: empty and paged prefixes of lengths that do not
 * divide the page, odd page sizes, GQA ratios 1/2/4, odd head dims; BF16 pages;
 * and prompt capture split into two calls equal to one call.
 * Invalid page slots (positions >= n of the last page) hold NaN, and the outputs
 * carry guard words, so a read or write out of bounds fails the test.
 */
#include <stdlib.h>
#include <string.h>

#include "longstraw/kernels.h"
#include "testutil.h"

int test_attn_tiled_vs_naive(void);
int test_attn_paged_bf16(void);

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
