/*
 * test_kernels_bwd.c — every backward of the small CPU kernels (linear, embed, the
 * norms, conv, RoPE, SwiGLU, LM head, the sigmoid gates, the Gated DeltaNet prologue,
 * the MoE router and the combine of an expert's rows)
 * checked by central finite differences in double.
 *
 * For each kernel: a naive double-precision forward written here (independent of the kernel
 * code); the f32 kernel forward against it; then the gradient of L = Σ out·R (R random; for
 * the LM head L = Σ logprob·r) w.r.t. every input and weight element by central differences
 * (h = 1e-6) against the kernel's backward, relative error per tensor ‖a−b‖/‖b‖ ≤ 1e-4.
 * The documented contracts are checked too: `=` outputs are pre-filled with NaN (a missed
 * write fails the finiteness check), `+=` outputs are pre-filled with PREFILL and that is
 * subtracted, NULL-skips leave the other outputs unchanged, dx == dy aliasing where the
 * header permits it, guard words around every buffer, and scratch arenas are released.
 * Math: specs/hybrid-qwen3next.md §2.2 (conv), §2.5 (l2norm), §2.7 (gated norm),
 * §4.3 (partial RoPE), §5 (zero-centred RMSNorm).
 */
#include <stdlib.h>
#include <string.h>

#include "longstraw/core.h"
#include "longstraw/kernels.h"
#include "testutil.h"

int test_kernels_bwd_fd(void);

#define FD_H 1e-6
#define GRAD_TOL 1e-4
#define FWD_TOL 1e-5
#define SAME_TOL 1e-6     /* two kernel runs that must agree (NULL-skip, aliasing) */
#define PREFILL 0.375f    /* pre-fill of `+=` outputs; exact in f32 */
#define GUARD 16          /* guard floats on each side of every test buffer */
#define GUARD_VAL -7777.25f

/* ---- buffers: one pool per kernel test, freed on every exit path ---------------- */
#define POOL_MAX 96
typedef struct {
    void *base[POOL_MAX];
    int64_t n[POOL_MAX]; /* floats between the guards; −1 for double buffers */
    int count;
    int oom;
} pool;

static float *pf(pool *pl, int64_t n) {
    if (pl->count >= POOL_MAX) {
        pl->oom = 1;
        return NULL;
    }
    float *b = malloc((size_t)(n + 2 * GUARD) * sizeof(float));
    if (!b) {
        pl->oom = 1;
        return NULL;
    }
    for (int i = 0; i < GUARD; i++) b[i] = b[GUARD + n + i] = GUARD_VAL;
    pl->base[pl->count] = b;
    pl->n[pl->count++] = n;
    return b + GUARD;
}

/* n zeroed elements of `size` bytes, unguarded (references, indices) */
static void *pv(pool *pl, int64_t n, size_t size) {
    if (pl->count >= POOL_MAX) {
        pl->oom = 1;
        return NULL;
    }
    void *b = calloc((size_t)(n > 0 ? n : 1), size);
    if (!b) {
        pl->oom = 1;
        return NULL;
    }
    pl->base[pl->count] = b;
    pl->n[pl->count++] = -1;
    return b;
}

static double *pd(pool *pl, int64_t n) { return pv(pl, n, sizeof(double)); }

/* Elements compared for one tensor of n: all of them (nsample = 0), or nsample random
 * indices plus the first and the last (large shapes, where FD over every element is slow). */
typedef struct {
    int64_t n, m;
    int64_t *idx;
} fdsel;

static fdsel sel_make(pool *pl, int64_t n, int64_t nsample, ls_rng *rng) {
    fdsel s = {n, 0, NULL};
    int64_t m = (nsample <= 0 || nsample + 2 >= n) ? n : nsample + 2;
    s.idx = pv(pl, m, sizeof(int64_t));
    if (!s.idx) return s;
    s.m = m;
    if (m == n) {
        for (int64_t i = 0; i < n; i++) s.idx[i] = i;
    } else {
        s.idx[0] = 0;
        s.idx[1] = n - 1;
        for (int64_t k = 2; k < m; k++) s.idx[k] = (int64_t)(ls_rng_u64(rng) % (uint64_t)n);
    }
    return s;
}

static float *pf_normal(pool *pl, int64_t n, ls_rng *rng, float std) {
    float *p = pf(pl, n);
    if (p) t_fill_normal(p, n, rng, std);
    return p;
}

static void fill_f(float *p, int64_t n, float v) {
    for (int64_t i = 0; i < n; i++) p[i] = v;
}

static void to_d(double *d, const float *f, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = (double)f[i];
}

/* number of float buffers whose guard words were overwritten */
static int pool_bad_guards(const pool *pl) {
    int bad = 0;
    for (int k = 0; k < pl->count; k++) {
        if (pl->n[k] < 0) continue;
        const float *b = pl->base[k];
        for (int i = 0; i < GUARD; i++)
            if (b[i] != GUARD_VAL || b[GUARD + pl->n[k] + i] != GUARD_VAL) {
                bad++;
                break;
            }
    }
    return bad;
}

static void pool_free(pool *pl) {
    for (int k = 0; k < pl->count; k++) free(pl->base[k]);
    pl->count = 0;
}

/* ---- comparisons (NaN fails; empty fails) ------------------------------------------ */
typedef struct {
    const char *name;
    double grad;    /* worst gradient relative error */
    double fwd;     /* worst forward relative error */
    int64_t n_grad; /* gradient elements compared */
} kstat;

static int cmp_fwd(kstat *ks, const char *what, const float *got, const double *ref, int64_t n) {
    T_CHECK(n > 0, "%s %s: zero elements compared", ks->name, what);
    T_CHECK(t_all_finite_f(got, n), "%s %s: non-finite forward output", ks->name, what);
    double e = t_rel_err_fd(got, ref, n);
    T_CHECK(e <= FWD_TOL, "%s %s: forward rel err %.3e > %.0e", ks->name, what, e, FWD_TOL);
    if (e > ks->fwd) ks->fwd = e;
    return 0;
}

/* (got − base) against the finite-difference gradient ref over the selected elements
 * (ref[k] belongs to element sel.idx[k]); every element of got must be finite. */
static int cmp_grad(kstat *ks, const char *what, const float *got, float base, const double *ref,
                    fdsel sel) {
    T_CHECK(sel.m > 0 && sel.n > 0, "%s %s: zero elements compared", ks->name, what);
    T_CHECK(t_all_finite_f(got, sel.n), "%s %s: non-finite gradient (unwritten `=` output?)",
            ks->name, what);
    double num = 0, den = 0;
    for (int64_t k = 0; k < sel.m; k++) {
        double d = ((double)got[sel.idx[k]] - (double)base) - ref[k];
        num += d * d;
        den += ref[k] * ref[k];
    }
    T_CHECK(den > 0, "%s %s: reference gradient is all zero (vacuous check)", ks->name, what);
    double e = sqrt(num / den);
    T_CHECK(e <= GRAD_TOL, "%s %s: gradient rel err %.3e > %.0e", ks->name, what, e, GRAD_TOL);
    if (e > ks->grad) ks->grad = e;
    ks->n_grad += sel.m;
    return 0;
}

/* two kernel outputs that must agree */
static int cmp_same(kstat *ks, const char *what, const float *a, const float *b, int64_t n) {
    T_CHECK(n > 0, "%s %s: zero elements compared", ks->name, what);
    T_CHECK(t_all_finite_f(a, n), "%s %s: non-finite output", ks->name, what);
    double e = t_rel_err_f(a, b, n);
    T_CHECK(e <= SAME_TOL, "%s %s: rel diff %.3e > %.0e", ks->name, what, e, SAME_TOL);
    return 0;
}

/* ---- central finite differences of a double loss ------------------------------------ */
typedef double (*loss_fn)(void *ctx);

/* g[k] = ∂L/∂p[sel.idx[k]] by central differences; p is one of the arrays the loss reads
 * through ctx */
static void fd_grad(double *g, double *p, fdsel sel, loss_fn f, void *ctx) {
    for (int64_t k = 0; k < sel.m; k++) {
        int64_t i = sel.idx[k];
        double v = p[i];
        p[i] = v + FD_H;
        double lp = f(ctx);
        p[i] = v - FD_H;
        double lm = f(ctx);
        p[i] = v;
        g[k] = (lp - lm) / (2.0 * FD_H);
    }
}

static double dot_d(const double *a, const double *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static double silu_d(double z) { return z / (1.0 + exp(-z)); }

/* A kernel's cases: each runs with its own pool (freed, guards checked) and an int64 parameter
 * vector whose meaning the case function documents. */
typedef int (*case_fn)(pool *pl, kstat *ks, ls_rng *rng, const int64_t *p);

static int run_cases(kstat *ks, ls_rng *rng, case_fn fn, const int64_t (*cases)[8], size_t n) {
    for (size_t i = 0; i < n; i++) {
        pool pl = {0};
        int rc = fn(&pl, ks, rng, cases[i]);
        int bad = pool_bad_guards(&pl);
        pool_free(&pl);
        if (rc) return 1;
        T_CHECK(bad == 0, "%s case %zu: %d buffers written out of bounds", ks->name, i, bad);
    }
    return 0;
}

/* ======================================================================================
 * linear: out[T,N] = x[T,K]·W[N,K]ᵀ
 * ==================================================================================== */
typedef struct {
    double *x, *W, *R, *out;
    int64_t T, K, N;
} lin_ctx;

static void lin_ref(lin_ctx *c) {
    for (int64_t t = 0; t < c->T; t++)
        for (int64_t n = 0; n < c->N; n++) {
            double s = 0;
            for (int64_t k = 0; k < c->K; k++) s += c->x[t * c->K + k] * c->W[n * c->K + k];
            c->out[t * c->N + n] = s;
        }
}

static double lin_loss(void *vc) {
    lin_ctx *c = vc;
    lin_ref(c);
    return dot_d(c->out, c->R, c->T * c->N);
}

/* p = {T, K, N} */
static int kb_linear_case(pool *pl, kstat *ks, ls_rng *rng, const int64_t *p) {
    const int64_t T = p[0], K = p[1], N = p[2];
    float *x = pf_normal(pl, T * K, rng, 1.0f), *W = pf_normal(pl, N * K, rng, 0.5f);
    float *R = pf_normal(pl, T * N, rng, 1.0f), *out = pf(pl, T * N);
    float *dx = pf(pl, T * K), *dW = pf(pl, N * K), *dx2 = pf(pl, T * K), *dW2 = pf(pl, N * K);
    lin_ctx c = {pd(pl, T * K), pd(pl, N * K), pd(pl, T * N), pd(pl, T * N), T, K, N};
    /* every element when small; 2000 sampled (and both ends) when large */
    fdsel sx = sel_make(pl, T * K, T * K > 4096 ? 2000 : 0, rng), sW = sel_make(pl, N * K, N * K > 4096 ? 2000 : 0, rng);
    double *gx = pd(pl, T * K), *gW = pd(pl, N * K);
    T_CHECK(!pl->oom, "out of memory");
    to_d(c.x, x, T * K);
    to_d(c.W, W, N * K);
    to_d(c.R, R, T * N);

    lin_ref(&c);
    fill_f(out, T * N, NAN);
    ls_linear_fwd(out, x, W, T, K, N, 0);
    if (cmp_fwd(ks, "out", out, c.out, T * N)) return 1;
    fill_f(out, T * N, PREFILL); /* accumulate: += onto what is there */
    ls_linear_fwd(out, x, W, T, K, N, 1);
    for (int64_t i = 0; i < T * N; i++) out[i] -= PREFILL;
    if (cmp_fwd(ks, "out (accumulate)", out, c.out, T * N)) return 1;
    fd_grad(gx, c.x, sx, lin_loss, &c);
    fd_grad(gW, c.W, sW, lin_loss, &c);

    /* dx (=) and dW (+=) */
    fill_f(dx, T * K, NAN);
    fill_f(dW, N * K, PREFILL);
    ls_linear_bwd(dx, dW, R, x, W, T, K, N, 0);
    if (cmp_grad(ks, "dx", dx, 0.0f, gx, sx) || cmp_grad(ks, "dW", dW, PREFILL, gW, sW)) return 1;
    /* accumulate_dx = 1, dW NULL */
    fill_f(dx2, T * K, PREFILL);
    ls_linear_bwd(dx2, NULL, R, x, W, T, K, N, 1);
    if (cmp_grad(ks, "dx (accumulate)", dx2, PREFILL, gx, sx)) return 1;
    /* dx NULL: dW alone, same as before */
    fill_f(dW2, N * K, PREFILL);
    ls_linear_bwd(NULL, dW2, R, x, W, T, K, N, 0);
    return cmp_same(ks, "dW (dx NULL)", dW2, dW, N * K);
}

static int kb_linear(kstat *ks, ls_rng *rng) {
    /* T <= 4 takes the few-row path (no sgemm), serial and threaded (N·K > 65536) */
    static const int64_t cases[][8] = {{5, 7, 3}, {9, 33, 17}, {1, 200, 300}, {3, 300, 257}, {4, 64, 5}};
    return run_cases(ks, rng, kb_linear_case, cases, sizeof cases / sizeof cases[0]);
}

/* ======================================================================================
 * embedding: out[T,D] = table[ids[t]]
 * ==================================================================================== */
typedef struct {
    double *table, *R;
    const int32_t *ids;
    int64_t T, D;
} emb_ctx;

static double emb_loss(void *vc) {
    emb_ctx *c = vc;
    double L = 0;
    for (int64_t t = 0; t < c->T; t++)
        for (int64_t d = 0; d < c->D; d++) L += c->table[c->ids[t] * c->D + d] * c->R[t * c->D + d];
    return L;
}

/* p unused: V = 6, D = 5, T = 7 with repeated ids */
static int kb_embed_case(pool *pl, kstat *ks, ls_rng *rng, const int64_t *p) {
    (void)p;
    const int64_t V = 6, D = 5, T = 7;
    static const int32_t ids[7] = {2, 0, 2, 5, 2, 0, 3}; /* repeats; ids 1 and 4 unused */
    float *table = pf_normal(pl, V * D, rng, 1.0f), *R = pf_normal(pl, T * D, rng, 1.0f);
    float *out = pf(pl, T * D), *dtable = pf(pl, V * D);
    emb_ctx c = {pd(pl, V * D), pd(pl, T * D), ids, T, D};
    fdsel st = sel_make(pl, V * D, 0, rng);
    double *ref = pd(pl, T * D), *gt = pd(pl, V * D);
    T_CHECK(!pl->oom, "out of memory");
    to_d(c.table, table, V * D);
    to_d(c.R, R, T * D);
    for (int64_t t = 0; t < T; t++)
        for (int64_t d = 0; d < D; d++) ref[t * D + d] = c.table[ids[t] * D + d];
    ls_embed_fwd(out, ids, table, T, D);
    if (cmp_fwd(ks, "out", out, ref, T * D)) return 1;
    fd_grad(gt, c.table, st, emb_loss, &c);
    fill_f(dtable, V * D, PREFILL);
    ls_embed_bwd(dtable, R, ids, T, D);
    return cmp_grad(ks, "dtable", dtable, PREFILL, gt, st);
}

static int kb_embed(kstat *ks, ls_rng *rng) {
    static const int64_t cases[][8] = {{0}};
    return run_cases(ks, rng, kb_embed_case, cases, 1);
}

/* ======================================================================================
 * norms: zero-centred RMSNorm (§5) y = x·(mean x² + eps)^(−1/2)·(1+w); gated RMSNorm (§2.7)
 * y = x·(mean x² + eps)^(−1/2)·w·SiLU(z); L2 norm (§2.5) y = x / sqrt(Σx² + eps)
 * ==================================================================================== */
typedef struct {
    double *x, *w, *z, *R, *y; /* w, z only where the norm has them */
    int64_t rows, D;
    double eps;
    int kind; /* 0 rmsnorm (1+w), 1 gated, 2 l2, 3 plain rmsnorm (w; the MLA family) */
} norm_ctx;

static void norm_ref(norm_ctx *c) {
    for (int64_t r = 0; r < c->rows; r++) {
        const double *xr = c->x + r * c->D;
        double *yr = c->y + r * c->D;
        double ss = dot_d(xr, xr, c->D);
        double s = 1.0 / sqrt((c->kind == 2 ? ss : ss / (double)c->D) + c->eps);
        for (int64_t i = 0; i < c->D; i++) {
            if (c->kind == 0) yr[i] = xr[i] * s * (1.0 + c->w[i]);
            else if (c->kind == 3) yr[i] = xr[i] * s * c->w[i];
            else if (c->kind == 1) yr[i] = xr[i] * s * c->w[i] * silu_d(c->z[r * c->D + i]);
            else yr[i] = xr[i] * s;
        }
    }
}

static double norm_loss(void *vc) {
    norm_ctx *c = vc;
    norm_ref(c);
    return dot_d(c->y, c->R, c->rows * c->D);
}

/* p = {kind, rows, D, nsample}: every `=` output pre-filled with NaN, dw with PREFILL; then
 * dw NULL, and dx == dy (with dw) against the first run. */
static int kb_norm_case(pool *pl, kstat *ks, ls_rng *rng, const int64_t *p) {
    const int kind = (int)p[0];
    const int64_t rows = p[1], D = p[2], ns = p[3], n = rows * D;
    const float eps = 1e-6f;
    float *x = pf_normal(pl, n, rng, 1.0f), *R = pf_normal(pl, n, rng, 1.0f);
    float *w = pf_normal(pl, D, rng, kind == 0 ? 0.5f : 0.3f), *z = pf_normal(pl, n, rng, 1.5f);
    float *y = pf(pl, n), *rs = pf(pl, rows);
    float *dx = pf(pl, n), *dz = pf(pl, n), *dw = pf(pl, D);
    float *dx2 = pf(pl, n), *dz2 = pf(pl, n), *dw2 = pf(pl, D);
    norm_ctx c = {pd(pl, n), pd(pl, D), pd(pl, n), pd(pl, n), pd(pl, n), rows, D, eps, kind};
    fdsel sx = sel_make(pl, n, ns, rng), sz = sel_make(pl, n, ns, rng), sw = sel_make(pl, D, ns, rng);
    double *gx = pd(pl, sx.m), *gz = pd(pl, sz.m), *gw = pd(pl, sw.m);
    T_CHECK(!pl->oom, "out of memory");
    if (kind == 1 || kind == 3)
        for (int64_t i = 0; i < D; i++) w[i] += 1.0f; /* plain w around its init value 1 */
    to_d(c.x, x, n);
    to_d(c.w, w, D);
    to_d(c.z, z, n);
    to_d(c.R, R, n);
    char what[80];
#define WHAT(s) (snprintf(what, sizeof what, "%s (rows=%lld D=%lld)", s, (long long)rows, \
                          (long long)D), what)

    norm_ref(&c);
    fill_f(y, n, NAN);
    if (kind == 0) ls_rmsnorm_fwd(y, rs, x, w, rows, D, eps);
    else if (kind == 3) ls_rmsnorm_plain_fwd(y, rs, x, w, rows, D, eps);
    else if (kind == 1) ls_gated_rmsnorm_fwd(y, rs, x, z, w, rows, D, eps);
    else ls_l2norm_fwd(y, rs, x, rows, D, eps);
    if (cmp_fwd(ks, WHAT("y"), y, c.y, n)) return 1;
    fd_grad(gx, c.x, sx, norm_loss, &c);
    if (kind == 1) fd_grad(gz, c.z, sz, norm_loss, &c);
    if (kind != 2) fd_grad(gw, c.w, sw, norm_loss, &c);

    fill_f(dx, n, NAN);
    fill_f(dz, n, NAN);
    fill_f(dw, D, PREFILL);
    if (kind == 0) ls_rmsnorm_bwd(dx, dw, R, x, rs, w, rows, D);
    else if (kind == 3) ls_rmsnorm_plain_bwd(dx, dw, R, x, rs, w, rows, D);
    else if (kind == 1) ls_gated_rmsnorm_bwd(dx, dz, dw, R, x, z, rs, w, rows, D);
    else ls_l2norm_bwd(dx, R, x, rs, rows, D);
    if (cmp_grad(ks, WHAT("dx"), dx, 0.0f, gx, sx)) return 1;
    if (kind == 1 && cmp_grad(ks, WHAT("dz"), dz, 0.0f, gz, sz)) return 1;
    if (kind != 2 && cmp_grad(ks, WHAT("dw"), dw, PREFILL, gw, sw)) return 1;
    if (kind != 2) {
        /* dw NULL */
        fill_f(dx2, n, NAN);
        fill_f(dz2, n, NAN);
        if (kind == 0) ls_rmsnorm_bwd(dx2, NULL, R, x, rs, w, rows, D);
        else if (kind == 3) ls_rmsnorm_plain_bwd(dx2, NULL, R, x, rs, w, rows, D);
        else ls_gated_rmsnorm_bwd(dx2, dz2, NULL, R, x, z, rs, w, rows, D);
        if (cmp_same(ks, WHAT("dx, dw NULL"), dx2, dx, n)) return 1;
        if (kind == 1 && cmp_same(ks, WHAT("dz, dw NULL"), dz2, dz, n)) return 1;
    }
    /* dx == dy (dw still accumulated, from the dy the call started with) */
    memcpy(dx2, R, (size_t)n * sizeof(float));
    fill_f(dz2, n, NAN);
    fill_f(dw2, D, PREFILL);
    if (kind == 0) ls_rmsnorm_bwd(dx2, dw2, dx2, x, rs, w, rows, D);
    else if (kind == 3) ls_rmsnorm_plain_bwd(dx2, dw2, dx2, x, rs, w, rows, D);
    else if (kind == 1) ls_gated_rmsnorm_bwd(dx2, dz2, dw2, dx2, x, z, rs, w, rows, D);
    else ls_l2norm_bwd(dx2, dx2, x, rs, rows, D);
    if (cmp_same(ks, WHAT("dx, dx == dy"), dx2, dx, n)) return 1;
    if (kind == 1 && cmp_same(ks, WHAT("dz, dx == dy"), dz2, dz, n)) return 1;
    if (kind != 2 && cmp_grad(ks, WHAT("dw, dx == dy"), dw2, PREFILL, gw, sw)) return 1;
#undef WHAT
    return 0;
}

/* rows·D > 65536 takes the OpenMP path; D > 64 spans several dw column blocks */
static int kb_rmsnorm(kstat *ks, ls_rng *rng) {
    static const int64_t cases[][8] = {{0, 3, 11, 0}, {0, 3, 131, 0}, {0, 520, 131, 40}};
    return run_cases(ks, rng, kb_norm_case, cases, sizeof cases / sizeof cases[0]);
}

static int kb_gated_rmsnorm(kstat *ks, ls_rng *rng) {
    static const int64_t cases[][8] = {{1, 3, 9, 0}, {1, 3, 131, 0}, {1, 520, 131, 40}};
    return run_cases(ks, rng, kb_norm_case, cases, sizeof cases / sizeof cases[0]);
}

static int kb_plain_rmsnorm(kstat *ks, ls_rng *rng) {
    static const int64_t cases[][8] = {{3, 3, 16, 0}, {3, 520, 131, 40}};
    return run_cases(ks, rng, kb_norm_case, cases, sizeof cases / sizeof cases[0]);
}

static int kb_l2norm(kstat *ks, ls_rng *rng) {
    static const int64_t cases[][8] = {{2, 4, 7, 0}, {2, 520, 131, 40}};
    return run_cases(ks, rng, kb_norm_case, cases, sizeof cases / sizeof cases[0]);
}

/* ======================================================================================
 * causal depthwise conv + SiLU (§2.2) with a carried tail
 * ==================================================================================== */
typedef struct {
    double *x, *tail, *w, *R, *y, *pre;
    int64_t T, C, W;
} conv_ctx;

/* x̃ = [tail; x]; pre[t,c] = Σ_j w[c,j]·x̃[t+j,c]; y = SiLU(pre) */
static void conv_ref(conv_ctx *c) {
    int64_t Wm = c->W - 1, C = c->C;
    for (int64_t t = 0; t < c->T; t++)
        for (int64_t ch = 0; ch < C; ch++) {
            double s = 0;
            for (int64_t j = 0; j < c->W; j++) {
                int64_t u = t + j;
                double xv = u < Wm ? c->tail[u * C + ch] : c->x[(u - Wm) * C + ch];
                s += c->w[ch * c->W + j] * xv;
            }
            c->pre[t * C + ch] = s;
            c->y[t * C + ch] = silu_d(s);
        }
}

static double conv_loss(void *vc) {
    conv_ctx *c = vc;
    conv_ref(c);
    return dot_d(c->y, c->R, c->T * c->C);
}

/* p = {T, C, W, nsample} */
static int kb_conv_case(pool *pl, kstat *ks, ls_rng *rng, const int64_t *p) {
    const int64_t T = p[0], C = p[1], W = p[2], ns = p[3];
    const int64_t Wm = W - 1, nx = T * C, nt = Wm * C, nw = C * W;
    float *x = pf_normal(pl, nx, rng, 1.0f), *tail = pf_normal(pl, nt, rng, 1.0f);
    float *w = pf_normal(pl, nw, rng, 0.6f), *R = pf_normal(pl, nx, rng, 1.0f);
    float *tail_k = pf(pl, nt), *y = pf(pl, nx), *pre = pf(pl, nx);
    float *dx = pf(pl, nx), *dw = pf(pl, nw), *dtail = pf(pl, nt), *dx2 = pf(pl, nx);
    conv_ctx c = {pd(pl, nx), pd(pl, nt), pd(pl, nw), pd(pl, nx), pd(pl, nx), pd(pl, nx), T, C, W};
    fdsel sx = sel_make(pl, nx, ns, rng), st = sel_make(pl, nt, ns, rng), sw = sel_make(pl, nw, ns, rng);
    double *gx = pd(pl, sx.m), *gt = pd(pl, st.m), *gw = pd(pl, sw.m), *xt = pd(pl, nt + nx);
    T_CHECK(!pl->oom, "out of memory");
    to_d(c.x, x, nx);
    to_d(c.tail, tail, nt);
    to_d(c.w, w, nw);
    to_d(c.R, R, nx);
    char what[80];
#define WHAT(s) (snprintf(what, sizeof what, "%s (T=%lld C=%lld W=%lld)", s, (long long)T, \
                          (long long)C, (long long)W), what)

    conv_ref(&c);
    memcpy(tail_k, tail, (size_t)nt * sizeof(float));
    fill_f(y, nx, NAN);
    fill_f(pre, nx, NAN);
    ls_conv_fwd(y, pre, tail_k, x, w, T, C, W);
    if (cmp_fwd(ks, WHAT("y"), y, c.y, nx) || cmp_fwd(ks, WHAT("pre"), pre, c.pre, nx)) return 1;
    /* the carried tail: the last W−1 rows of x̃ = [tail; x]. (Built by copies: GCC 12.2 at
     * -O3 -march=native mis-vectorised the equivalent loop with a per-row ternary.) */
    memcpy(xt, c.tail, (size_t)nt * sizeof(double));
    memcpy(xt + nt, c.x, (size_t)nx * sizeof(double));
    T_CHECK(t_rel_err_fd(tail_k, xt + T * C, nt) == 0.0, "conv %s differs", WHAT("new tail"));

    fd_grad(gx, c.x, sx, conv_loss, &c);
    fd_grad(gt, c.tail, st, conv_loss, &c);
    fd_grad(gw, c.w, sw, conv_loss, &c);
    fill_f(dx, nx, NAN);
    fill_f(dtail, nt, NAN);
    fill_f(dw, nw, PREFILL);
    ls_conv_bwd(dx, dw, dtail, R, pre, x, tail, w, T, C, W);
    if (cmp_grad(ks, WHAT("dx"), dx, 0.0f, gx, sx) ||
        cmp_grad(ks, WHAT("dtail"), dtail, 0.0f, gt, st) ||
        cmp_grad(ks, WHAT("dw"), dw, PREFILL, gw, sw))
        return 1;
    /* dw and dtail NULL (and no tail_in, which only dw reads) */
    fill_f(dx2, nx, NAN);
    ls_conv_bwd(dx2, NULL, NULL, R, pre, x, NULL, w, T, C, W);
    if (cmp_same(ks, WHAT("dx, dw/dtail NULL"), dx2, dx, nx)) return 1;
#undef WHAT
    return 0;
}

/* T < W−1, T = 1, T = 7; W = 4 and 2; C = 130 spans three channel blocks; T·C > 65536 takes
 * the OpenMP path */
static int kb_conv(kstat *ks, ls_rng *rng) {
    static const int64_t cases[][8] = {{1, 5, 4, 0},  {2, 5, 4, 0},   {7, 5, 4, 0},
                                       {1, 5, 2, 0},  {7, 5, 2, 0},   {7, 130, 4, 0},
                                       {2, 130, 4, 0}, {600, 130, 4, 40}};
    return run_cases(ks, rng, kb_conv_case, cases, sizeof cases / sizeof cases[0]);
}

/* ======================================================================================
 * partial rotate-half RoPE (§4.3)
 * ==================================================================================== */
typedef struct {
    double *x, *R, *y;
    int64_t T;
    int heads, hd, rot;
    double theta;
    int64_t pos0;
} rope_ctx;

static void rope_ref(rope_ctx *c) {
    int half = c->rot / 2;
    for (int64_t t = 0; t < c->T; t++)
        for (int h = 0; h < c->heads; h++) {
            const double *v = c->x + (t * c->heads + h) * c->hd;
            double *o = c->y + (t * c->heads + h) * c->hd;
            for (int i = 0; i < c->hd; i++) o[i] = v[i];
            for (int j = 0; j < half; j++) {
                double ang = (double)(c->pos0 + t) * pow(c->theta, -2.0 * j / (double)c->rot);
                o[j] = v[j] * cos(ang) - v[j + half] * sin(ang);
                o[j + half] = v[j + half] * cos(ang) + v[j] * sin(ang);
            }
        }
}

static double rope_loss(void *vc) {
    rope_ctx *c = vc;
    rope_ref(c);
    return dot_d(c->y, c->R, c->T * c->heads * c->hd);
}

/* p = {T, heads, hd, rot, pos0, nsample} */
static int kb_rope_case(pool *pl, kstat *ks, ls_rng *rng, const int64_t *p) {
    const int64_t T = p[0], pos0 = p[4], ns = p[5];
    const int heads = (int)p[1], hd = (int)p[2], rot = (int)p[3];
    const double theta = 10000.0;
    const int64_t n = T * heads * hd;
    float *x = pf_normal(pl, n, rng, 1.0f), *R = pf_normal(pl, n, rng, 1.0f);
    float *y = pf(pl, n), *dx = pf(pl, n);
    rope_ctx c = {pd(pl, n), pd(pl, n), pd(pl, n), T, heads, hd, rot, theta, pos0};
    fdsel sx = sel_make(pl, n, ns, rng);
    double *gx = pd(pl, sx.m);
    T_CHECK(!pl->oom, "out of memory");
    to_d(c.x, x, n);
    to_d(c.R, R, n);
    char what[80];
#define WHAT(s) (snprintf(what, sizeof what, "%s (T=%lld rot=%d/%d pos0=%lld)", s, (long long)T, \
                          rot, hd, (long long)pos0), what)

    rope_ref(&c);
    memcpy(y, x, (size_t)n * sizeof(float));
    ls_rope_fwd(y, T, heads, hd, rot, theta, pos0);
    if (cmp_fwd(ks, WHAT("y"), y, c.y, n)) return 1;
    fd_grad(gx, c.x, sx, rope_loss, &c);
    memcpy(dx, R, (size_t)n * sizeof(float));
    ls_rope_bwd(dx, T, heads, hd, rot, theta, pos0);
    if (cmp_grad(ks, WHAT("dx"), dx, 0.0f, gx, sx)) return 1;
    /* Rᵀ R = I: the backward undoes the forward */
    ls_rope_bwd(y, T, heads, hd, rot, theta, pos0);
    if (cmp_same(ks, WHAT("bwd(fwd(x))"), y, x, n)) return 1;
#undef WHAT
    return 0;
}

static int kb_rope(kstat *ks, ls_rng *rng) {
    static const int64_t cases[][8] = {{3, 2, 10, 6, 0, 0},
                                       {3, 2, 10, 6, 100000, 0},
                                       {2, 3, 8, 8, 7, 0},
                                       {300, 2, 130, 64, 100000, 40}};
    return run_cases(ks, rng, kb_rope_case, cases, sizeof cases / sizeof cases[0]);
}

/* ======================================================================================
 * SwiGLU: out[T,I] = SiLU(gu[:, :I]) ⊙ gu[:, I:]
 * ==================================================================================== */
typedef struct {
    double *gu, *R, *out;
    int64_t T, I;
} swiglu_ctx;

static void swiglu_ref(swiglu_ctx *c) {
    for (int64_t t = 0; t < c->T; t++)
        for (int64_t i = 0; i < c->I; i++) {
            const double *g = c->gu + t * 2 * c->I;
            c->out[t * c->I + i] = silu_d(g[i]) * g[c->I + i];
        }
}

static double swiglu_loss(void *vc) {
    swiglu_ctx *c = vc;
    swiglu_ref(c);
    return dot_d(c->out, c->R, c->T * c->I);
}

/* p = {T, I, nsample} */
static int kb_swiglu_case(pool *pl, kstat *ks, ls_rng *rng, const int64_t *p) {
    const int64_t T = p[0], I = p[1], ns = p[2];
    float *gu = pf_normal(pl, T * 2 * I, rng, 1.5f), *R = pf_normal(pl, T * I, rng, 1.0f);
    float *out = pf(pl, T * I), *dgu = pf(pl, T * 2 * I);
    swiglu_ctx c = {pd(pl, T * 2 * I), pd(pl, T * I), pd(pl, T * I), T, I};
    fdsel sg = sel_make(pl, T * 2 * I, ns, rng);
    double *g = pd(pl, sg.m);
    T_CHECK(!pl->oom, "out of memory");
    to_d(c.gu, gu, T * 2 * I);
    to_d(c.R, R, T * I);
    swiglu_ref(&c);
    fill_f(out, T * I, NAN);
    ls_swiglu_fwd(out, gu, T, I);
    if (cmp_fwd(ks, "out", out, c.out, T * I)) return 1;
    fd_grad(g, c.gu, sg, swiglu_loss, &c);
    fill_f(dgu, T * 2 * I, NAN);
    ls_swiglu_bwd(dgu, R, gu, T, I);
    return cmp_grad(ks, "dgu", dgu, 0.0f, g, sg);
}

static int kb_swiglu(kstat *ks, ls_rng *rng) {
    static const int64_t cases[][8] = {{3, 7, 0}, {600, 131, 40}};
    return run_cases(ks, rng, kb_swiglu_case, cases, sizeof cases / sizeof cases[0]);
}

/* ======================================================================================
 * LM head: logprob[t] = (h·Wᵀ/τ)[target] − lse; entropy of softmax(h·Wᵀ/τ)
 * ==================================================================================== */
typedef struct {
    double *h, *W, *r, *lp, *lse, *ent, *z;
    const int32_t *tg;
    int64_t T, D, V;
    double inv_tau;
} lm_ctx;

static void lm_ref(lm_ctx *c) {
    for (int64_t t = 0; t < c->T; t++) {
        double m = -INFINITY;
        for (int64_t v = 0; v < c->V; v++) {
            c->z[v] = dot_d(c->h + t * c->D, c->W + v * c->D, c->D) * c->inv_tau;
            if (c->z[v] > m) m = c->z[v];
        }
        double s = 0;
        for (int64_t v = 0; v < c->V; v++) s += exp(c->z[v] - m);
        double lse = m + log(s), H = 0;
        for (int64_t v = 0; v < c->V; v++) {
            double lp = c->z[v] - lse;
            H -= exp(lp) * lp;
        }
        c->lse[t] = lse;
        c->lp[t] = c->z[c->tg[t]] - lse;
        c->ent[t] = H;
    }
}

static double lm_loss(void *vc) {
    lm_ctx *c = vc;
    lm_ref(c);
    return dot_d(c->lp, c->r, c->T);
}

/* p = {T, D, V, 1000·τ, chunk_rows, nsample}; targets repeat (t·t mod 5 hits 0, 1, 4 only
 * and small T reuses them), the last target is V−1. */
static int kb_lmhead_case(pool *pl, kstat *ks, ls_rng *rng, const int64_t *p) {
    const int64_t T = p[0], D = p[1], V = p[2], chunk = p[4], ns = p[5];
    const float tau = (float)p[3] / 1000.0f;
    float *h = pf_normal(pl, T * D, rng, 1.0f), *W = pf_normal(pl, V * D, rng, 0.5f);
    float *r = pf_normal(pl, T, rng, 1.0f), *lp = pf(pl, T), *lse = pf(pl, T), *ent = pf(pl, T);
    float *dh = pf(pl, T * D), *dW = pf(pl, V * D), *dh2 = pf(pl, T * D);
    int32_t *tg = pv(pl, T, sizeof(int32_t));
    lm_ctx c = {pd(pl, T * D), pd(pl, V * D), pd(pl, T), pd(pl, T), pd(pl, T), pd(pl, T), pd(pl, V),
                tg, T, D, V, 1.0 / (double)tau};
    fdsel sh = sel_make(pl, T * D, ns, rng), sW = sel_make(pl, V * D, ns, rng);
    double *gh = pd(pl, sh.m), *gW = pd(pl, sW.m);
    T_CHECK(!pl->oom, "out of memory");
    for (int64_t t = 0; t < T; t++) tg[t] = (int32_t)((t * t) % 5 % V);
    tg[T - 1] = (int32_t)(V - 1);
    to_d(c.h, h, T * D);
    to_d(c.W, W, V * D);
    to_d(c.r, r, T);
    ls_arena ar;
    ls_arena_init(&ar, "kb_scratch", (size_t)1 << 16);
    int rc = 1;
    char what[96];
#define WHAT(s) (snprintf(what, sizeof what, "%s (T=%lld V=%lld tau=%g chunk=%lld)", s, \
                          (long long)T, (long long)V, (double)tau, (long long)chunk), what)
#define LM_OK(expr)                                                                    \
    do {                                                                               \
        ls_status st_ = (expr);                                                        \
        if (st_ != LS_OK) {                                                            \
            fprintf(stderr, "  FAIL %s: %s -> %s: %s\n", ks->name, #expr,              \
                    ls_status_name(st_), ls_err_msg());                                \
            goto out;                                                                  \
        }                                                                              \
    } while (0)

    lm_ref(&c);
    fill_f(lp, T, NAN);
    fill_f(lse, T, NAN);
    LM_OK(ls_lmhead_logprobs_fwd(lp, lse, h, W, tg, T, D, V, tau, chunk, &ar));
    if (cmp_fwd(ks, WHAT("logprob"), lp, c.lp, T) || cmp_fwd(ks, WHAT("lse"), lse, c.lse, T))
        goto out;
    fill_f(ent, T, NAN);
    LM_OK(ls_lmhead_entropy(ent, h, W, T, D, V, tau, chunk, &ar));
    if (cmp_fwd(ks, WHAT("entropy"), ent, c.ent, T)) goto out;

    fd_grad(gh, c.h, sh, lm_loss, &c);
    fd_grad(gW, c.W, sW, lm_loss, &c);
    fill_f(dh, T * D, NAN);
    fill_f(dW, V * D, PREFILL);
    LM_OK(ls_lmhead_logprobs_bwd(dh, dW, r, h, W, tg, lse, T, D, V, tau, chunk, &ar));
    if (cmp_grad(ks, WHAT("dh"), dh, 0.0f, gh, sh) ||
        cmp_grad(ks, WHAT("dW"), dW, PREFILL, gW, sW))
        goto out;
    /* dW NULL */
    fill_f(dh2, T * D, NAN);
    LM_OK(ls_lmhead_logprobs_bwd(dh2, NULL, r, h, W, tg, lse, T, D, V, tau, chunk, &ar));
    if (cmp_same(ks, WHAT("dh, dW NULL"), dh2, dh, T * D)) goto out;
    if (ar.cur != 0) {
        fprintf(stderr, "  FAIL %s: scratch arena not released (%zu bytes held)\n", ks->name,
                ar.cur);
        goto out;
    }
    rc = 0;
out:
    ls_arena_free(&ar);
#undef LM_OK
#undef WHAT
    return rc;
}

/* T = 7 is not a multiple of chunk_rows 3 or 2; chunk_rows 0 = the default (32, > T) */
static int kb_lmhead(kstat *ks, ls_rng *rng) {
    static const int64_t cases[][8] = {{7, 9, 13, 1000, 3, 0},  {7, 9, 13, 700, 3, 0},
                                       {7, 9, 13, 700, 2, 0},   {7, 9, 13, 1000, 0, 0},
                                       {70, 33, 257, 700, 16, 40}};
    return run_cases(ks, rng, kb_lmhead_case, cases, sizeof cases / sizeof cases[0]);
}

/* ======================================================================================
 * LayerNorm with weight and bias (the indexer's k_norm, trained by the indexer KL loss)
 * ==================================================================================== */
typedef struct {
    double *x, *w, *b, *R, *y;
    int64_t n, d;
} ln_ctx;

static double ln_loss(void *vc) {
    ln_ctx *c = vc;
    for (int64_t i = 0; i < c->n; i++) {
        const double *xi = c->x + i * c->d;
        double mu = 0, var = 0;
        for (int64_t j = 0; j < c->d; j++) mu += xi[j];
        mu /= (double)c->d;
        for (int64_t j = 0; j < c->d; j++) var += (xi[j] - mu) * (xi[j] - mu);
        double r = 1.0 / sqrt(var / (double)c->d + 1e-6);
        for (int64_t j = 0; j < c->d; j++) c->y[i * c->d + j] = (xi[j] - mu) * r * c->w[j] + c->b[j];
    }
    return dot_d(c->y, c->R, c->n * c->d);
}

/* p = {n, d}: dx (also in place over dy), dw and db (+= onto a pre-fill) */
static int kb_layernorm_case(pool *pl, kstat *ks, ls_rng *rng, const int64_t *p) {
    const int64_t n = p[0], d = p[1], nx = n * d;
    float *x = pf_normal(pl, nx, rng, 1.5f), *w = pf_normal(pl, d, rng, 1.0f), *b = pf_normal(pl, d, rng, 0.3f);
    float *R = pf_normal(pl, nx, rng, 1.0f), *y = pf(pl, nx), *dx = pf(pl, nx), *dw = pf(pl, d), *db = pf(pl, d);
    float *dx2 = pf(pl, nx);
    ln_ctx c = {pd(pl, nx), pd(pl, d), pd(pl, d), pd(pl, nx), pd(pl, nx), n, d};
    fdsel sx = sel_make(pl, nx, 0, rng), sw = sel_make(pl, d, 0, rng);
    double *gx = pd(pl, nx), *gw = pd(pl, d), *gb = pd(pl, d);
    T_CHECK(!pl->oom, "oom");
    to_d(c.x, x, nx), to_d(c.w, w, d), to_d(c.b, b, d), to_d(c.R, R, nx);
    ln_loss(&c);
    ls_layernorm_fwd(y, x, w, b, n, d, 1e-6f);
    if (cmp_fwd(ks, "y", y, c.y, nx)) return 1;
    fill_f(dw, d, PREFILL), fill_f(db, d, PREFILL);
    ls_layernorm_bwd(dx, dw, db, R, x, w, n, d, 1e-6f);
    memcpy(dx2, R, (size_t)nx * sizeof(float)); /* in place: dx over dy */
    ls_layernorm_bwd(dx2, NULL, NULL, dx2, x, w, n, d, 1e-6f);
    if (cmp_same(ks, "dx in place", dx2, dx, nx)) return 1;
    fd_grad(gx, c.x, sx, ln_loss, &c);
    fd_grad(gw, c.w, sw, ln_loss, &c);
    fd_grad(gb, c.b, sw, ln_loss, &c);
    return cmp_grad(ks, "dx", dx, 0.0f, gx, sx) || cmp_grad(ks, "dw", dw, PREFILL, gw, sw) ||
           cmp_grad(ks, "db", db, PREFILL, gb, sw);
}

static int kb_layernorm(kstat *ks, ls_rng *rng) {
    static const int64_t cases[][8] = {{3, 16}, {5, 131}};
    return run_cases(ks, rng, kb_layernorm_case, cases, sizeof cases / sizeof cases[0]);
}

/* ======================================================================================
 * the index scores of selected keys (the indexer KL loss's student), and the attention
 * probabilities averaged over heads (its teacher; forward only, detached)
 * ==================================================================================== */
typedef struct {
    double *q, *w, *kp, *ko, *R; /* q [T,nI,dI], w [T,nI], paged keys [np,dI], own keys [T,dI], R [T,k] */
    const int32_t *sel;
    int64_t T, k, np;
    int nI, dI;
    double scale;
} dsa_ctx;

static double dsa_loss(void *vc) {
    dsa_ctx *c = vc;
    double L = 0;
    for (int64_t t = 0; t < c->T; t++)
        for (int64_t j = 0; j < c->k; j++) {
            int64_t p = c->sel[t * c->k + j];
            if (p < 0) continue;
            const double *kr = p < c->np ? c->kp + p * c->dI : c->ko + (p - c->np) * c->dI;
            double s = 0;
            for (int h = 0; h < c->nI; h++) {
                double a = 0;
                for (int d = 0; d < c->dI; d++) a += c->q[(t * c->nI + h) * c->dI + d] * kr[d];
                if (a > 0) s += c->w[t * c->nI + h] * a;
            }
            L += c->R[t * c->k + j] * s * c->scale;
        }
    return L;
}

/* p = {T, np (paged positions, pages of 5), k, nI, dI, H, rkv, dr}: selections of causal
 * positions with −1 padding; scores, their backward (dq, dw, the own keys' +=), and the
 * head-averaged probabilities against a double reference */
static int kb_dsa_case(pool *pl, kstat *ks, ls_rng *rng, const int64_t *p) {
    const int64_t T = p[0], np = p[1], k = p[2];
    const int nI = (int)p[3], dI = (int)p[4], H = (int)p[5], rkv = (int)p[6], dr = (int)p[7], dk = rkv + dr;
    const int64_t S = 5, npg = (np + S - 1) / S;
    float *q = pf_normal(pl, T * nI * dI, rng, 1.0f), *w = pf_normal(pl, T * nI, rng, 1.0f);
    float *kpage = pf_normal(pl, npg * S * dI, rng, 1.0f), *ko = pf_normal(pl, T * dI, rng, 1.0f);
    float *R = pf_normal(pl, T * k, rng, 1.0f), *isc = pf(pl, T * k), *dq = pf(pl, T * nI * dI), *dw = pf(pl, T * nI);
    float *dko = pf(pl, T * dI);
    float *qa = pf_normal(pl, T * H * dk, rng, 0.5f), *lpage = pf_normal(pl, npg * S * dk, rng, 1.0f);
    float *lo = pf_normal(pl, T * dk, rng, 1.0f), *P = pf(pl, T * k), *lse = pf(pl, T * H), *o = pf(pl, T * H * rkv);
    int32_t *sel = pv(pl, T * k, sizeof(int32_t));
    void **kp = pv(pl, npg, sizeof(void *)), **lp = pv(pl, npg, sizeof(void *));
    dsa_ctx c = {pd(pl, T * nI * dI), pd(pl, T * nI), pd(pl, np * dI), pd(pl, T * dI), pd(pl, T * k), sel, T, k, np,
                 nI, dI, 1.0 / sqrt((double)dI)};
    double *Pref = pd(pl, T * k);
    T_CHECK(!pl->oom, "oom");
    for (int64_t i = 0; i < npg; i++) kp[i] = kpage + i * S * dI, lp[i] = lpage + i * S * dk;
    for (int64_t t = 0; t < T; t++) { /* distinct causal positions, ascending, some rows short */
        int64_t n = np + t + 1, m = n < k ? n : k - (t % 3 == 0 ? 1 : 0), c0 = 0;
        for (int64_t pos = 0; pos < n && c0 < m; pos++)
            if ((int64_t)(ls_rng_u64(rng) % (uint64_t)(n - pos)) < m - c0) sel[t * k + c0++] = (int32_t)pos;
        for (; c0 < k; c0++) sel[t * k + c0] = -1;
    }
    ls_kv_prefix keys = {np, S, LS_DTYPE_F32, (void *const *)kp, NULL};
    ls_kv_prefix lat = {np, S, LS_DTYPE_F32, (void *const *)lp, NULL};
    to_d(c.q, q, T * nI * dI), to_d(c.w, w, T * nI), to_d(c.kp, kpage, np * dI), to_d(c.ko, ko, T * dI);
    to_d(c.R, R, T * k);
    float scale = (float)c.scale;
    ls_dsa_sel_scores(isc, q, w, &keys, ko, sel, k, T, nI, dI, np, scale);
    double L = 0;
    int64_t valid = 0;
    for (int64_t i = 0; i < T * k; i++)
        if (sel[i] >= 0) L += (double)R[i] * isc[i], valid++;
        else T_CHECK(isc[i] == -INFINITY, "%s: padding score %g, not -inf", ks->name, isc[i]);
    double Lref = dsa_loss(&c);
    T_CHECK(valid > 0 && fabs(L - Lref) <= FWD_TOL * (fabs(Lref) + 1), "%s: scores %.9g vs %.9g", ks->name, L, Lref);
    float *dS = pf(pl, T * k);
    T_CHECK(!pl->oom, "oom");
    for (int64_t i = 0; i < T * k; i++) dS[i] = sel[i] >= 0 ? R[i] : 0.0f;
    fill_f(dko, T * dI, PREFILL);
    ls_dsa_sel_scores_bwd(dq, dw, dko, dS, q, w, &keys, ko, sel, k, T, nI, dI, np, scale);
    fdsel sq = sel_make(pl, T * nI * dI, 60, rng), sw = sel_make(pl, T * nI, 0, rng), so = sel_make(pl, T * dI, 0, rng);
    double *gq = pd(pl, sq.m), *gw = pd(pl, sw.m), *go = pd(pl, so.m);
    T_CHECK(!pl->oom, "oom");
    fd_grad(gq, c.q, sq, dsa_loss, &c);
    fd_grad(gw, c.w, sw, dsa_loss, &c);
    fd_grad(go, c.ko, so, dsa_loss, &c);
    if (cmp_grad(ks, "dq", dq, 0.0f, gq, sq) || cmp_grad(ks, "dw", dw, 0.0f, gw, sw) ||
        cmp_grad(ks, "down", dko, PREFILL, go, so))
        return 1;
    /* the teacher: lse from the attention forward, P against (1/H)Σ_h softmax in double */
    LS_TRY(ls_mla_attn_fwd(o, lse, qa, lo, &lat, sel, k, T, H, rkv, dr, np, 0.3f));
    ls_mla_attn_probs(P, qa, lse, lo, &lat, sel, k, T, H, rkv, dr, np, 0.3f);
    for (int64_t t = 0; t < T; t++) {
        for (int64_t j = 0; j < k; j++) Pref[t * k + j] = 0;
        for (int h = 0; h < H; h++) {
            double sc[4096], mx = -INFINITY, z = 0;
            for (int64_t j = 0; j < k && sel[t * k + j] >= 0; j++) {
                int64_t pos = sel[t * k + j];
                const float *kr = pos < np ? lpage + pos * dk : lo + (pos - np) * dk;
                double a = 0;
                for (int d = 0; d < dk; d++) a += (double)qa[(t * H + h) * dk + d] * kr[d];
                sc[j] = 0.3 * a, mx = sc[j] > mx ? sc[j] : mx;
            }
            for (int64_t j = 0; j < k && sel[t * k + j] >= 0; j++) z += exp(sc[j] - mx);
            for (int64_t j = 0; j < k && sel[t * k + j] >= 0; j++) Pref[t * k + j] += exp(sc[j] - mx) / z / H;
        }
    }
    return cmp_fwd(ks, "P", P, Pref, T * k);
}

static int kb_dsa(kstat *ks, ls_rng *rng) {
    static const int64_t cases[][8] = {{4, 0, 3, 2, 8, 2, 8, 4}, {6, 13, 7, 3, 16, 3, 16, 8}};
    return run_cases(ks, rng, kb_dsa_case, cases, sizeof cases / sizeof cases[0]);
}

/* ======================================================================================
 * the table
 * ==================================================================================== */
/* ======================================================================================
 * the small gates (backend ops of their own): y = x·σ(gate); x[t] += σ(logit[t])·y[t];
 * the Gated DeltaNet prologue (spec §2.3–§2.5)
 * ==================================================================================== */
static double sig_d(double z) { return 1.0 / (1.0 + exp(-z)); }

typedef struct {
    double *x, *gate, *R;
    int64_t n;
} smul_ctx;

static double smul_loss(void *vc) {
    smul_ctx *c = vc;
    double L = 0;
    for (int64_t i = 0; i < c->n; i++) L += c->x[i] * sig_d(c->gate[i]) * c->R[i];
    return L;
}

/* p = {n}: n > 65536 takes the OpenMP path */
static int kb_sigmoid_mul_case(pool *pl, kstat *ks, ls_rng *rng, const int64_t *p) {
    const int64_t n = p[0];
    float *x = pf_normal(pl, n, rng, 1.0f), *gate = pf_normal(pl, n, rng, 2.0f), *R = pf_normal(pl, n, rng, 1.0f);
    float *y = pf(pl, n), *dx = pf(pl, n), *dg = pf(pl, n), *dx2 = pf(pl, n), *dg2 = pf(pl, n);
    smul_ctx c = {pd(pl, n), pd(pl, n), pd(pl, n), n};
    double *ref = pd(pl, n);
    fdsel sx = sel_make(pl, n, n > 4096 ? 2000 : 0, rng), sg = sel_make(pl, n, n > 4096 ? 2000 : 0, rng);
    double *gx = pd(pl, sx.m), *gg = pd(pl, sg.m);
    T_CHECK(!pl->oom, "out of memory");
    to_d(c.x, x, n);
    to_d(c.gate, gate, n);
    to_d(c.R, R, n);
    for (int64_t i = 0; i < n; i++) ref[i] = c.x[i] * sig_d(c.gate[i]);
    fill_f(y, n, NAN);
    ls_sigmoid_mul_fwd(y, x, gate, n);
    if (cmp_fwd(ks, "y", y, ref, n)) return 1;
    fd_grad(gx, c.x, sx, smul_loss, &c);
    fd_grad(gg, c.gate, sg, smul_loss, &c);
    fill_f(dx, n, NAN);
    fill_f(dg, n, NAN);
    ls_sigmoid_mul_bwd(dx, dg, R, x, gate, n);
    if (cmp_grad(ks, "dx", dx, 0.0f, gx, sx) || cmp_grad(ks, "dgate", dg, 0.0f, gg, sg)) return 1;
    memcpy(dx2, R, (size_t)n * sizeof(float)); /* dx == dy */
    fill_f(dg2, n, NAN);
    ls_sigmoid_mul_bwd(dx2, dg2, dx2, x, gate, n);
    return cmp_same(ks, "dx, dx == dy", dx2, dx, n) || cmp_same(ks, "dgate, dx == dy", dg2, dg, n);
}

static int kb_sigmoid_mul(kstat *ks, ls_rng *rng) {
    static const int64_t cases[][8] = {{7}, {70001}};
    return run_cases(ks, rng, kb_sigmoid_mul_case, cases, sizeof cases / sizeof cases[0]);
}

typedef struct {
    double *logit, *y, *R;
    int64_t T, D;
} gadd_ctx;

static double gadd_loss(void *vc) {
    gadd_ctx *c = vc;
    double L = 0;
    for (int64_t t = 0; t < c->T; t++)
        for (int64_t d = 0; d < c->D; d++) L += sig_d(c->logit[t]) * c->y[t * c->D + d] * c->R[t * c->D + d];
    return L;
}

/* p = {T, D} */
static int kb_gated_add_case(pool *pl, kstat *ks, ls_rng *rng, const int64_t *p) {
    const int64_t T = p[0], D = p[1], n = T * D;
    float *x = pf_normal(pl, n, rng, 1.0f), *logit = pf_normal(pl, T, rng, 2.0f), *y = pf_normal(pl, n, rng, 1.0f);
    float *R = pf_normal(pl, n, rng, 1.0f), *dy = pf(pl, n), *dl = pf(pl, T);
    gadd_ctx c = {pd(pl, T), pd(pl, n), pd(pl, n), T, D};
    double *ref = pd(pl, n);
    fdsel sy = sel_make(pl, n, 0, rng), sl = sel_make(pl, T, 0, rng);
    double *gy = pd(pl, sy.m), *gl = pd(pl, sl.m);
    T_CHECK(!pl->oom, "out of memory");
    to_d(c.logit, logit, T);
    to_d(c.y, y, n);
    to_d(c.R, R, n);
    for (int64_t t = 0; t < T; t++)
        for (int64_t d = 0; d < D; d++) ref[t * D + d] = (double)x[t * D + d] + sig_d(c.logit[t]) * c.y[t * D + d];
    ls_gated_add_rows(x, logit, y, T, D); /* += onto x */
    if (cmp_fwd(ks, "x", x, ref, n)) return 1;
    fd_grad(gy, c.y, sy, gadd_loss, &c);
    fd_grad(gl, c.logit, sl, gadd_loss, &c);
    fill_f(dy, n, NAN);
    fill_f(dl, T, NAN);
    ls_gated_add_rows_bwd(dy, dl, R, logit, y, T, D);
    return cmp_grad(ks, "dy", dy, 0.0f, gy, sy) || cmp_grad(ks, "dlogit", dl, 0.0f, gl, sl);
}

static int kb_gated_add(kstat *ks, ls_rng *rng) {
    static const int64_t cases[][8] = {{1, 5}, {6, 13}};
    return run_cases(ks, rng, kb_gated_add_case, cases, sizeof cases / sizeof cases[0]);
}

typedef struct {
    double *y, *ba, *A_log, *dt_bias, *R; /* R: [T, 2·kd + vd + 2·Hv], the outputs in order q k v beta g */
    int64_t T;
    ls_gdr_dims dm;
} prep_ctx;

static double prep_loss(void *vc) {
    prep_ctx *c = vc;
    int64_t kd = (int64_t)c->dm.H_k * c->dm.d_k, vd = (int64_t)c->dm.H_v * c->dm.d_v, cd = 2 * kd + vd;
    int Hv = c->dm.H_v, dk = c->dm.d_k;
    int64_t ro = cd + 2 * Hv;
    double L = 0;
    for (int64_t t = 0; t < c->T; t++) {
        const double *yt = c->y + t * cd, *R = c->R + t * ro;
        for (int part = 0; part < 2; part++) /* q, k: L2-normalised per key head */
            for (int h = 0; h < c->dm.H_k; h++) {
                const double *u = yt + part * kd + h * dk;
                double s = 0;
                for (int j = 0; j < dk; j++) s += u[j] * u[j];
                double r = 1.0 / sqrt(s + 1e-6);
                for (int j = 0; j < dk; j++) L += u[j] * r * R[part * kd + h * dk + j];
            }
        for (int64_t i = 0; i < vd; i++) L += yt[2 * kd + i] * R[2 * kd + i];
        for (int h = 0; h < Hv; h++) {
            double b = c->ba[t * 2 * Hv + h], a = c->ba[t * 2 * Hv + Hv + h] + c->dt_bias[h];
            double sp = a > 20 ? a : log1p(exp(a));
            L += sig_d(b) * R[cd + h] - exp(c->A_log[h]) * sp * R[cd + Hv + h];
        }
    }
    return L;
}

/* p = {T, H_k, H_v, d_k, d_v}; T·… large enough for the OpenMP loop to split */
static int kb_gdn_prep_case(pool *pl, kstat *ks, ls_rng *rng, const int64_t *p) {
    const int64_t T = p[0];
    ls_gdr_dims dm = {(int)p[1], (int)p[2], (int)p[3], (int)p[4], 1.0f};
    const int64_t kd = p[1] * p[3], vd = p[2] * p[4], cd = 2 * kd + vd, Hv = p[2], ro = cd + 2 * Hv;
    float *y = pf_normal(pl, T * cd, rng, 1.0f), *ba = pf_normal(pl, T * 2 * Hv, rng, 1.5f);
    float *A_log = pf_normal(pl, Hv, rng, 0.5f), *dt_bias = pf_normal(pl, Hv, rng, 0.5f);
    float *R = pf_normal(pl, T * ro, rng, 1.0f);
    float *q = pf(pl, T * kd), *k = pf(pl, T * kd), *v = pf(pl, T * vd), *beta = pf(pl, T * Hv), *g = pf(pl, T * Hv);
    float *rq = pf(pl, T * p[1]), *rk = pf(pl, T * p[1]);
    float *dq = pf(pl, T * kd), *dk = pf(pl, T * kd), *dv = pf(pl, T * vd), *db = pf(pl, T * Hv), *dg = pf(pl, T * Hv);
    float *dy = pf(pl, T * cd), *dba = pf(pl, T * 2 * Hv), *dA = pf(pl, Hv), *ddt = pf(pl, Hv);
    float *dy2 = pf(pl, T * cd), *dba2 = pf(pl, T * 2 * Hv);
    prep_ctx c = {pd(pl, T * cd), pd(pl, T * 2 * Hv), pd(pl, Hv), pd(pl, Hv), pd(pl, T * ro), T, dm};
    fdsel sy = sel_make(pl, T * cd, 600, rng), sb = sel_make(pl, T * 2 * Hv, 0, rng);
    fdsel sA = sel_make(pl, Hv, 0, rng), sd = sel_make(pl, Hv, 0, rng);
    double *gy = pd(pl, sy.m), *gb = pd(pl, sb.m), *gA = pd(pl, sA.m), *gd = pd(pl, sd.m);
    T_CHECK(!pl->oom, "out of memory");
    to_d(c.y, y, T * cd);
    to_d(c.ba, ba, T * 2 * Hv);
    to_d(c.A_log, A_log, Hv);
    to_d(c.dt_bias, dt_bias, Hv);
    to_d(c.R, R, T * ro);
    fill_f(q, T * kd, NAN), fill_f(k, T * kd, NAN), fill_f(v, T * vd, NAN);
    fill_f(beta, T * Hv, NAN), fill_f(g, T * Hv, NAN);
    ls_gdn_prep_fwd(q, k, v, beta, g, rq, rk, y, ba, A_log, dt_bias, T, dm);
    /* the forward through the loss's own pieces: Σ out·R in double against the loss */
    double Lk = 0;
    for (int64_t t = 0; t < T; t++) {
        const float *Rt = R + t * ro;
        for (int64_t i = 0; i < kd; i++) Lk += (double)q[t * kd + i] * Rt[i] + (double)k[t * kd + i] * Rt[kd + i];
        for (int64_t i = 0; i < vd; i++) Lk += (double)v[t * vd + i] * Rt[2 * kd + i];
        for (int64_t h = 0; h < Hv; h++) Lk += (double)beta[t * Hv + h] * Rt[cd + h] + (double)g[t * Hv + h] * Rt[cd + Hv + h];
    }
    double Lr = prep_loss(&c);
    T_CHECK(t_all_finite_f(q, T * kd) && t_all_finite_f(g, T * Hv), "gdn_prep: non-finite forward output");
    T_CHECK(fabs(Lk - Lr) <= FWD_TOL * (fabs(Lr) + 1.0), "gdn_prep forward: Σ out·R %.9g vs reference %.9g", Lk, Lr);
    if (Lr != 0 && fabs(Lk - Lr) / fabs(Lr) > ks->fwd) ks->fwd = fabs(Lk - Lr) / fabs(Lr);
    fd_grad(gy, c.y, sy, prep_loss, &c);
    fd_grad(gb, c.ba, sb, prep_loss, &c);
    fd_grad(gA, c.A_log, sA, prep_loss, &c);
    fd_grad(gd, c.dt_bias, sd, prep_loss, &c);
    for (int64_t t = 0; t < T; t++) { /* the backward's inputs: R split into its parts */
        const float *Rt = R + t * ro;
        memcpy(dq + t * kd, Rt, (size_t)kd * sizeof(float));
        memcpy(dk + t * kd, Rt + kd, (size_t)kd * sizeof(float));
        memcpy(dv + t * vd, Rt + 2 * kd, (size_t)vd * sizeof(float));
        memcpy(db + t * Hv, Rt + cd, (size_t)Hv * sizeof(float));
        memcpy(dg + t * Hv, Rt + cd + Hv, (size_t)Hv * sizeof(float));
    }
    fill_f(dy, T * cd, NAN);
    fill_f(dba, T * 2 * Hv, NAN);
    fill_f(dA, Hv, PREFILL);
    fill_f(ddt, Hv, PREFILL);
    ls_gdn_prep_bwd(dy, dba, dA, ddt, dq, dk, dv, db, dg, y, rq, rk, ba, beta, g, A_log, dt_bias, T, dm);
    if (cmp_grad(ks, "dy", dy, 0.0f, gy, sy) || cmp_grad(ks, "dba", dba, 0.0f, gb, sb) ||
        cmp_grad(ks, "dA_log", dA, PREFILL, gA, sA) || cmp_grad(ks, "ddt_bias", ddt, PREFILL, gd, sd))
        return 1;
    fill_f(dy2, T * cd, NAN); /* dA_log, ddt_bias NULL: the rest unchanged */
    fill_f(dba2, T * 2 * Hv, NAN);
    ls_gdn_prep_bwd(dy2, dba2, NULL, NULL, dq, dk, dv, db, dg, y, rq, rk, ba, beta, g, A_log, dt_bias, T, dm);
    return cmp_same(ks, "dy (NULL sums)", dy2, dy, T * cd) || cmp_same(ks, "dba (NULL sums)", dba2, dba, T * 2 * Hv);
}

static int kb_gdn_prep(kstat *ks, ls_rng *rng) {
    static const int64_t cases[][8] = {{3, 1, 2, 4, 3}, {37, 2, 4, 8, 5}};
    return run_cases(ks, rng, kb_gdn_prep_case, cases, sizeof cases / sizeof cases[0]);
}

/* ======================================================================================
 * MoE: the softmax top-k router (through the combine weights) and the weighted scatter
 * of an expert's rows (through its outputs and the weights)
 * ==================================================================================== */
typedef struct {
    double *logits, *R; /* R [T, K] */
    const int32_t *sel; /* the selection, fixed (it carries no gradient) */
    int64_t T;
    int E, K, norm;
} route_ctx;

static double route_loss(void *vc) {
    route_ctx *c = vc;
    double L = 0;
    for (int64_t t = 0; t < c->T; t++) {
        const double *lg = c->logits + t * c->E;
        double mx = lg[0], s = 0, z = 0;
        for (int e = 1; e < c->E; e++) mx = lg[e] > mx ? lg[e] : mx;
        for (int e = 0; e < c->E; e++) s += exp(lg[e] - mx);
        for (int j = 0; j < c->K; j++) z += exp(lg[c->sel[t * c->K + j]] - mx) / s;
        for (int j = 0; j < c->K; j++) {
            double p = exp(lg[c->sel[t * c->K + j]] - mx) / s;
            L += (c->norm ? p / z : p) * c->R[t * c->K + j];
        }
    }
    return L;
}

/* p = {T, E, K, norm} */
static int kb_moe_route_case(pool *pl, kstat *ks, ls_rng *rng, const int64_t *p) {
    const int64_t T = p[0];
    const int E = (int)p[1], K = (int)p[2], norm = (int)p[3];
    float *logits = pf_normal(pl, T * E, rng, 1.5f), *R = pf_normal(pl, T * K, rng, 1.0f);
    float *probs = pf(pl, T * E), *wt = pf(pl, T * K), *dl = pf(pl, T * E);
    int32_t *sel = pv(pl, T * K, sizeof(int32_t));
    route_ctx c = {pd(pl, T * E), pd(pl, T * K), sel, T, E, K, norm};
    fdsel sl = sel_make(pl, T * E, 0, rng);
    double *gl = pd(pl, sl.m), *ref = pd(pl, T * K);
    T_CHECK(!pl->oom, "out of memory");
    to_d(c.logits, logits, T * E);
    to_d(c.R, R, T * K);
    fill_f(wt, T * K, NAN);
    ls_moe_route(probs, sel, wt, logits, T, E, K, norm);
    for (int64_t t = 0; t < T; t++) { /* the selection: the K largest, in order */
        for (int j = 0; j < K; j++) {
            int s = sel[t * K + j];
            T_CHECK(s >= 0 && s < E, "moe_route: selection %d out of range", s);
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i <= j; i++) taken |= sel[t * K + i] == e;
                T_CHECK(taken || logits[t * E + e] <= logits[t * E + s], "moe_route: expert %d beats choice %d", e, j);
            }
        }
    }
    { /* the combine weights against the loss's own formula, with R = one-hot rows */
        route_ctx c1 = c;
        double *one = pd(pl, T * K);
        T_CHECK(one != NULL, "out of memory");
        c1.R = one;
        for (int64_t i = 0; i < T * K; i++) {
            one[i] = 1.0;
            ref[i] = route_loss(&c1);
            one[i] = 0.0;
        }
    }
    if (cmp_fwd(ks, "wt", wt, ref, T * K)) return 1;
    fd_grad(gl, c.logits, sl, route_loss, &c);
    fill_f(dl, T * E, NAN);
    ls_moe_route_bwd(dl, R, probs, sel, wt, T, E, K, norm);
    return cmp_grad(ks, norm ? "dlogits (renormalised)" : "dlogits", dl, 0.0f, gl, sl);
}

static int kb_moe_route(kstat *ks, ls_rng *rng) {
    static const int64_t cases[][8] = {{3, 5, 2, 1}, {4, 7, 3, 0}, {2, 9, 1, 0}}; /* K = 1 renormalised: weight 1, no gradient */
    return run_cases(ks, rng, kb_moe_route_case, cases, sizeof cases / sizeof cases[0]);
}

typedef struct {
    double *ys, *wt, *R; /* ys [n, D], wt [T·K], R [T, D] */
    const int64_t *rows;
    int64_t n, D;
    int K;
} scat_ctx;

static double scat_loss(void *vc) {
    scat_ctx *c = vc;
    double L = 0;
    for (int64_t i = 0; i < c->n; i++)
        for (int64_t d = 0; d < c->D; d++) L += c->wt[c->rows[i]] * c->ys[i * c->D + d] * c->R[(c->rows[i] / c->K) * c->D + d];
    return L;
}

/* p = {T, K, D}: every (token, slot) routed here, in a shuffled order */
static int kb_moe_scatter_case(pool *pl, kstat *ks, ls_rng *rng, const int64_t *p) {
    const int64_t T = p[0], D = p[2], n = T * p[1];
    const int K = (int)p[1];
    int64_t *rows = pv(pl, n, sizeof(int64_t));
    float *ys = pf_normal(pl, n * D, rng, 1.0f), *wt = pf_normal(pl, T * K, rng, 1.0f), *R = pf_normal(pl, T * D, rng, 1.0f);
    float *y = pf(pl, T * D), *xs = pf(pl, n * D), *dys = pf(pl, n * D), *dwt = pf(pl, T * K);
    scat_ctx c = {pd(pl, n * D), pd(pl, T * K), pd(pl, T * D), rows, n, D, K};
    double *ref = pd(pl, T * D);
    fdsel sy = sel_make(pl, n * D, 0, rng), sw = sel_make(pl, T * K, 0, rng);
    double *gy = pd(pl, sy.m), *gw = pd(pl, sw.m);
    T_CHECK(!pl->oom, "out of memory");
    for (int64_t i = 0; i < n; i++) rows[i] = i;
    for (int64_t i = n - 1; i > 0; i--) { /* shuffle */
        int64_t j = (int64_t)(ls_rng_u64(rng) % (uint64_t)(i + 1)), t = rows[i];
        rows[i] = rows[j], rows[j] = t;
    }
    to_d(c.ys, ys, n * D);
    to_d(c.wt, wt, T * K);
    to_d(c.R, R, T * D);
    /* gather: row i is token rows[i]/K of R */
    fill_f(xs, n * D, NAN);
    ls_moe_gather(xs, R, rows, n, D, K);
    for (int64_t i = 0; i < n; i++)
        T_CHECK(!memcmp(xs + i * D, R + (rows[i] / K) * D, (size_t)D * sizeof(float)), "moe_gather: row %lld wrong",
                (long long)i);
    fill_f(y, T * D, PREFILL);
    ls_moe_scatter_add(y, ys, rows, wt, n, D, K);
    for (int64_t t = 0; t < T * D; t++) ref[t] = PREFILL;
    for (int64_t i = 0; i < n; i++)
        for (int64_t d = 0; d < D; d++) ref[(rows[i] / K) * D + d] += c.wt[rows[i]] * c.ys[i * D + d];
    if (cmp_fwd(ks, "y", y, ref, T * D)) return 1;
    fd_grad(gy, c.ys, sy, scat_loss, &c);
    fd_grad(gw, c.wt, sw, scat_loss, &c);
    fill_f(dys, n * D, NAN);
    fill_f(dwt, T * K, NAN);
    ls_moe_combine_bwd(dys, dwt, R, ys, rows, wt, n, D, K);
    return cmp_grad(ks, "dys", dys, 0.0f, gy, sy) || cmp_grad(ks, "dwt", dwt, 0.0f, gw, sw);
}

static int kb_moe_scatter(kstat *ks, ls_rng *rng) {
    static const int64_t cases[][8] = {{5, 2, 3}, {7, 3, 11}};
    return run_cases(ks, rng, kb_moe_scatter_case, cases, sizeof cases / sizeof cases[0]);
}

int test_kernels_bwd_fd(void) {
    static const struct {
        const char *name;
        int (*fn)(kstat *, ls_rng *);
    } table[] = {
        {"linear", kb_linear}, {"embed", kb_embed},   {"rmsnorm", kb_rmsnorm},
        {"gated_rmsnorm", kb_gated_rmsnorm},          {"l2norm", kb_l2norm},
        {"plain_rmsnorm", kb_plain_rmsnorm},          {"layernorm", kb_layernorm},
        {"dsa_sel_scores", kb_dsa},
        {"conv", kb_conv},     {"rope", kb_rope},     {"swiglu", kb_swiglu},
        {"lmhead", kb_lmhead},
        {"sigmoid_mul", kb_sigmoid_mul}, {"gated_add_rows", kb_gated_add}, {"gdn_prep", kb_gdn_prep},
        {"moe_route", kb_moe_route}, {"moe_scatter", kb_moe_scatter},
    };
    ls_rng rng;
    ls_rng_seed(&rng, 20240611);
    int failed = 0;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        kstat ks = {table[i].name, 0.0, 0.0, 0};
        int rc = table[i].fn(&ks, &rng);
        if (!rc && ks.n_grad == 0) {
            fprintf(stderr, "  FAIL %s: no gradient element compared\n", ks.name);
            rc = 1;
        }
        printf("  %-14s %s  worst grad rel err %.2e (%lld elements), fwd %.2e\n", ks.name,
               rc ? "FAIL" : "ok  ", ks.grad, (long long)ks.n_grad, ks.fwd);
        failed |= rc;
    }
    return failed;
}
