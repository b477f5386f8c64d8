/*
 * test_backend.c — the backend table (backend.h) and the CPU backend behind it:
 * every slot filled; an op through the table is its kernel (same bits); the
 * general product in its four transpose forms and with leading dimensions wider
 * than the matrices against a double loop; the batched one-token decode ops
 * (conv, delta rule) equal to one serial call per sequence, bit for bit; the
 * optimizer's ops against torch's AdamW written out in double.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/backend.h"
#include "testutil.h"

int test_backend_cpu_table(void);
int test_backend_decode_ops(void);
int test_backend_arena(void);
int test_backend_optim_ops(void);
int test_backend_copy_round(void);

int test_backend_cpu_table(void) {
    const ls_backend *be = ls_backend_cpu();
    T_CHECK(be && be->i && be->i->name && !strcmp(be->i->name, "cpu"), "the CPU backend has no table");
    int slots = 0, empty = 0;
#define COUNT_SLOT(name, params, args) slots++, empty += be->i->name == NULL;
    LS_BACKEND_OPS(COUNT_SLOT)
    LS_BACKEND_STATUS_OPS(COUNT_SLOT)
#undef COUNT_SLOT
    T_CHECK(slots > 40 && empty == 0, "%d of %d op slots are empty", empty, slots);
    T_CHECK(be->i->buf_alloc && be->i->buf_free && be->i->to_device && be->i->to_host && be->i->copy,
            "a buffer slot is empty");

    /* buffers: aligned memory, copies both ways */
    float *b = be->i->buf_alloc(be, 1000 * sizeof(float), 64), h[1000], back[1000];
    T_CHECK(b && (uintptr_t)b % 64 == 0, "buf_alloc: %p not 64-byte aligned", (void *)b);
    for (int i = 0; i < 1000; i++) h[i] = (float)i * 0.5f;
    be->i->to_device(be, b, h, sizeof h);
    be->i->to_host(be, back, b, sizeof back);
    int same = !memcmp(h, back, sizeof h);
    be->i->buf_free(be, b, 1000 * sizeof(float));
    T_CHECK(same, "to_device then to_host changed the bytes");

    /* gemm, every transpose, lda/ldb/ldc wider than the rows, alpha and beta */
    ls_rng r;
    ls_rng_seed(&r, 7);
    enum { M = 5, N = 7, K = 9, LD = 13 };
    float A[M * LD > K * LD ? M * LD : K * LD], B[K * LD > N * LD ? K * LD : N * LD], C[M * LD], C0[M * LD];
    t_fill_normal(A, sizeof A / sizeof *A, &r, 1.0f);
    t_fill_normal(B, sizeof B / sizeof *B, &r, 1.0f);
    t_fill_normal(C0, M * LD, &r, 1.0f);
    double worst = 0;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            memcpy(C, C0, sizeof C);
            ls_op_gemm(be, ta, tb, M, N, K, 0.75f, A, LD, B, LD, 0.5f, C, LD);
            for (int i = 0; i < M; i++)
                for (int j = 0; j < LD; j++) {
                    double want = C0[i * LD + j];
                    if (j < N) {
                        double s = 0;
                        for (int k = 0; k < K; k++)
                            s += (double)(ta ? A[k * LD + i] : A[i * LD + k]) * (tb ? B[j * LD + k] : B[k * LD + j]);
                        want = 0.75 * s + 0.5 * want;
                    }
                    double e = fabs(C[i * LD + j] - want);
                    if (!(e <= worst)) worst = e;
                }
        }
    T_CHECK(worst <= 1e-5, "gemm: max error %.3e against the double loop (or a column beyond N changed)", worst);

    /* an op through the table is its kernel: same bits */
    float x[6 * 10], W[4 * 10], o1[6 * 4], o2[6 * 4];
    t_fill_normal(x, 60, &r, 1.0f);
    t_fill_normal(W, 40, &r, 1.0f);
    ls_linear_fwd(o1, x, W, 6, 10, 4, 0);
    ls_op_linear_fwd(be, o2, x, W, 6, 10, 4, 0);
    T_CHECK(!memcmp(o1, o2, sizeof o1), "ls_op_linear_fwd differs from ls_linear_fwd");
    printf("  %d op slots, gemm max error %.2e\n", slots, worst);
    return 0;
}

int test_backend_decode_ops(void) {
    const ls_backend *be = ls_backend_cpu();
    ls_rng r;
    ls_rng_seed(&r, 11);
    enum { NS = 5, C = 19, W = 4, HK = 2, HV = 4, DK = 8, DV = 6 };
    /* conv: each row against its own tail */
    float x[NS * C], w[C * W], tails[NS][(W - 1) * C], tails2[NS][(W - 1) * C], y[NS * C], y2[NS * C];
    t_fill_normal(x, NS * C, &r, 1.0f);
    t_fill_normal(w, C * W, &r, 0.5f);
    t_fill_normal(&tails[0][0], NS * (W - 1) * C, &r, 1.0f);
    memcpy(tails2, tails, sizeof tails);
    float *tp[NS];
    for (int i = 0; i < NS; i++) tp[i] = tails[i];
    ls_op_conv_step_seqs(be, y, tp, x, w, NS, C, W);
    for (int i = 0; i < NS; i++) ls_conv_fwd(y2 + i * C, NULL, tails2[i], x + i * C, w, 1, C, W);
    T_CHECK(!memcmp(y, y2, sizeof y) && !memcmp(tails, tails2, sizeof tails),
            "conv_step_seqs differs from one serial conv per sequence");
    /* the delta rule: each row continues its own state */
    ls_gdr_dims dm = {HK, HV, DK, DV, 0.35f};
    enum { KD = HK * DK, VD = HV * DV, SN = HV * DK * DV };
    float q[NS * KD], k[NS * KD], v[NS * VD], beta[NS * HV], g[NS * HV], o[NS * VD], o2[NS * VD];
    float S[NS][SN], S2[NS][SN];
    t_fill_normal(q, NS * KD, &r, 0.3f);
    t_fill_normal(k, NS * KD, &r, 0.3f);
    t_fill_normal(v, NS * VD, &r, 1.0f);
    for (int i = 0; i < NS * HV; i++) beta[i] = 0.1f + 0.8f * (float)ls_rng_uniform(&r), g[i] = -(float)ls_rng_uniform(&r);
    t_fill_normal(&S[0][0], NS * SN, &r, 0.5f);
    memcpy(S2, S, sizeof S);
    float *sp[NS];
    for (int i = 0; i < NS; i++) sp[i] = S[i];
    ls_op_gdr_step_seqs(be, o, sp, q, k, v, beta, g, NS, dm);
    for (int i = 0; i < NS; i++)
        ls_gdr_serial_fwd(o2 + i * VD, S2[i], q + i * KD, k + i * KD, v + i * VD, beta + i * HV, g + i * HV, 1, dm);
    T_CHECK(!memcmp(o, o2, sizeof o) && !memcmp(S, S2, sizeof S),
            "gdr_step_seqs differs from one serial step per sequence");
    T_CHECK(t_all_finite_f(o, NS * VD), "gdr_step_seqs: non-finite output");
    return 0;
}

/* An arena takes its blocks from its backend: a backend that counts (and fills what it
 * hands out with a pattern, so a calloc must zero through the table) sees every block
 * allocated and, after trim, freed; the receipt's device name comes from it. */
typedef struct {
    int allocs, frees, zeros;
    size_t live;
} count_ctx;

static void *count_alloc(const ls_backend *be, size_t bytes, size_t align) {
    count_ctx *c = be->ctx;
    void *p = ls_backend_cpu()->i->buf_alloc(ls_backend_cpu(), bytes, align);
    if (p) c->allocs++, c->live += bytes, memset(p, 0xA5, bytes);
    return p;
}
static void count_free(const ls_backend *be, void *p, size_t bytes) {
    count_ctx *c = be->ctx;
    c->frees++, c->live -= bytes;
    ls_backend_cpu()->i->buf_free(ls_backend_cpu(), p, bytes);
}
static void count_zero(const ls_backend *be, void *p, size_t bytes) {
    ((count_ctx *)be->ctx)->zeros++;
    memset(p, 0, bytes);
}

int test_backend_arena(void) {
    ls_backend_i table = *ls_backend_cpu()->i;
    table.name = "counting";
    table.buf_alloc = count_alloc;
    table.buf_free = count_free;
    table.zero = count_zero;
    count_ctx c = {0};
    ls_backend be = {.i = &table, .device = "counting-device", .ctx = &c};
    ls_arena a;
    ls_arena_init(&a, "test", 4096);
    ls_arena_set_backend(&a, &be);
    T_CHECK(!strcmp(ls_arena_device(&a), "counting-device"), "arena device %s", ls_arena_device(&a));
    ls_arena_mark m = ls_arena_get_mark(&a);
    unsigned char *p1 = ls_arena_alloc(&a, 1000), *p2 = ls_arena_alloc(&a, 10000); /* two blocks */
    int32_t *z = ls_arena_calloc(&a, 100, sizeof(int32_t));
    T_CHECK(p1 && p2 && z && (uintptr_t)p2 % LS_ALIGN == 0, "allocations failed or misaligned");
    int zeroed = 1;
    for (int i = 0; i < 100; i++) zeroed &= z[i] == 0;
    T_CHECK(zeroed && c.zeros == 1, "calloc did not zero through the backend (%d zero calls)", c.zeros);
    T_CHECK(c.allocs >= 2 && c.live >= 10000 + 1000, "backend saw %d allocations, %zu bytes live", c.allocs, c.live);
    ls_arena_release(&a, m);
    int allocs = c.allocs;
    T_CHECK(ls_arena_alloc(&a, 9000) != NULL && c.allocs == allocs, "a released block was not reused");
    ls_arena_free(&a);
    T_CHECK(c.frees == c.allocs && c.live == 0, "after free: %d of %d blocks returned, %zu bytes live", c.frees,
            c.allocs, c.live);
    ls_arena def;
    ls_arena_init(&def, "default", 0);
    T_CHECK(!strcmp(ls_arena_device(&def), "host"), "an arena without a backend is on %s", ls_arena_device(&def));
    printf("  %d blocks from the backend and back; calloc zeroed through it\n", c.allocs);
    return 0;
}

/* AdamW against torch's formulas written out in double (decoupled decay, bias-corrected
 * moments, eps outside the root), over more elements than the threaded path's
 * threshold; the check pass names the first element that would overflow and writes
 * nothing; the squares and the scaling. */
int test_backend_optim_ops(void) {
    const ls_backend *be = ls_backend_cpu();
    enum { N = 70001 };
    float *w = malloc(N * sizeof(float)), *g = malloc(N * sizeof(float)), *m = malloc(N * sizeof(float));
    float *v = malloc(N * sizeof(float)), *w0 = malloc(N * sizeof(float)), *m0 = malloc(N * sizeof(float));
    float *v0 = malloc(N * sizeof(float));
    T_CHECK(w && g && m && v && w0 && m0 && v0, "out of memory");
    ls_rng r;
    ls_rng_seed(&r, 11);
    t_fill_normal(w0, N, &r, 1.0f);
    t_fill_normal(g, N, &r, 0.1f);
    t_fill_normal(m0, N, &r, 0.01f);
    t_fill_normal(v0, N, &r, 1e-4f);
    for (int i = 0; i < N; i++) v0[i] = fabsf(v0[i]), w[i] = w0[i], m[i] = m0[i], v[i] = v0[i];
    const double b1 = (float)0.9, b2 = (float)0.999, lr = 1e-3, eps = 1e-8, clip = 0.7, decay = 1.0 - 1e-3 * 0.1;
    const int step = 3;
    /* the moments' coefficients are the hp's floats (b1, b2 as rounded), the corrections double */
    ls_adamw_hp hp = {clip, 1.0 - pow(0.9, step), 1.0 - pow(0.999, step), lr, eps, (float)b1, (float)b2};
    int64_t bad = 7;
    float at[3];
    ls_op_adamw_check(be, &bad, at, &hp, (float)decay, w, g, m, v, N);
    T_CHECK(bad == -1, "adamw_check: element %lld flagged in a finite step", (long long)bad);
    T_CHECK(!memcmp(w, w0, N * sizeof(float)) && !memcmp(m, m0, N * sizeof(float)) &&
                !memcmp(v, v0, N * sizeof(float)), "adamw_check wrote");
    ls_op_adamw_step(be, &hp, (float)decay, w, g, m, v, N);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double gi = (double)g[i] * clip, mi = b1 * m0[i] + (1 - b1) * gi, vi = b2 * v0[i] + (1 - b2) * gi * gi;
        double wi = w0[i] * decay - lr * (mi / hp.bc1) / (sqrt(vi / hp.bc2) + eps);
        double du = lr * (mi / hp.bc1) / (sqrt(vi / hp.bc2) + eps); /* errors relative to the terms' sizes */
        double e = fabs(w[i] - wi) / (fabs(w0[i] * decay) + fabs(du)) +
                   fabs(m[i] - mi) / (b1 * fabs(m0[i]) + (1 - b1) * fabs(gi)) +
                   fabs(v[i] - vi) / (b2 * v0[i] + (1 - b2) * gi * gi + 1e-30);
        if (!(e <= worst)) worst = e; /* NaN stays */
    }
    T_CHECK(worst <= 1e-6, "adamw_step: error %.3e (relative to the terms) against torch's formulas in double", worst);
    memcpy(w, w0, N * sizeof(float));
    g[50000] = 1e30f, g[12345] = -1e30f; /* the squared gradient overflows: v = inf */
    hp.clip = 1.0;
    ls_op_adamw_check(be, &bad, at, &hp, 1.0f, w, g, m0, v0, N);
    T_CHECK(bad == 12345 && !(at[2] <= 3.4e38f), "adamw_check: flagged %lld (exp_avg_sq %g), not 12345 (inf)",
            (long long)bad, (double)at[2]);
    memcpy(m, m0, N * sizeof(float)), memcpy(v, v0, N * sizeof(float));
    ls_op_adamw_check(be, &bad, at, &hp, 1.0f, w, g, m, v, N);
    T_CHECK(bad == 12345 && !memcmp(w, w0, N * sizeof(float)) && !memcmp(m, m0, N * sizeof(float)) &&
                !memcmp(v, v0, N * sizeof(float)), "adamw_check wrote");
    double ss = 0, ref = 0;
    ls_op_sumsq(be, &ss, w0, N);
    for (int i = 0; i < N; i++) ref += (double)w0[i] * w0[i];
    T_CHECK(fabs(ss - ref) <= 1e-12 * ref, "sumsq %.17g vs %.17g", ss, ref);
    ls_op_scale(be, w, 0.37f, N);
    int same = 1;
    for (int i = 0; i < N; i++) same &= w[i] == w0[i] * 0.37f;
    T_CHECK(same, "scale differs from x·c");
    free(w), free(g), free(m), free(v), free(w0), free(m0), free(v0);
    return 0;
}

/* The strided block copy against its definition (the columns outside the block and the
 * rows beyond it untouched), and the page rounding against the dtype conversions. */
int test_backend_copy_round(void) {
    const ls_backend *be = ls_backend_cpu();
    enum { R = 7, LS = 13, LD = 11, W = 5 };
    float src[R * LS], dst[R * LD], dst0[R * LD];
    ls_rng r;
    ls_rng_seed(&r, 3);
    t_fill_normal(src, R * LS, &r, 1.0f);
    t_fill_normal(dst0, R * LD, &r, 1.0f);
    memcpy(dst, dst0, sizeof dst);
    ls_op_copy_rows(be, dst + 2, LD, src + 4, LS, R - 1, W); /* rows 0..5, columns 2..6 from columns 4..8 */
    int ok = 1;
    for (int i = 0; i < R; i++)
        for (int j = 0; j < LD; j++) {
            float want = (i < R - 1 && j >= 2 && j < 2 + W) ? src[i * LS + 4 + j - 2] : dst0[i * LD + j];
            ok &= dst[i * LD + j] == want;
        }
    T_CHECK(ok, "copy_rows: a value differs from the strided copy's definition");
    enum { N = 1000 };
    float x[N], y[N], back[N];
    uint16_t h[N];
    t_fill_normal(x, N, &r, 3.0f);
    for (ls_dtype d = LS_DTYPE_BF16; d <= LS_DTYPE_F16; d++) {
        memcpy(y, x, sizeof x);
        ls_op_round_to(be, y, N, d);
        ls_convert_from_f32(h, d, x, N);
        ls_convert_to_f32(back, h, d, N);
        T_CHECK(!memcmp(y, back, sizeof y), "round_to (%s) differs from the conversion there and back",
                d == LS_DTYPE_BF16 ? "bf16" : "f16");
        double worst = 0;
        for (int i = 0; i < N; i++) {
            double e = fabs((double)y[i] - x[i]) / fabs((double)x[i]);
            if (!(e <= worst)) worst = e;
        }
        T_CHECK(worst > 0 && worst <= (d == LS_DTYPE_BF16 ? 0x1p-8 : 0x1p-11), "round_to: relative change %.3g", worst);
    }
    memcpy(y, x, sizeof x);
    ls_op_round_to(be, y, N, LS_DTYPE_F32);
    T_CHECK(!memcmp(y, x, sizeof x), "round_to f32 changed a value");
    return 0;
}
