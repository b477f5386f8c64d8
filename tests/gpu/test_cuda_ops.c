/*
 * test_cuda_ops.c — every op the CUDA backend builds, against the CPU backend (the
 * reference) on random inputs with odd shapes: rows, columns and heads that divide no
 * block size, products with leading dimensions wider than the matrices, repeated
 * embedding ids, positions near a million. Outputs and saved-for-backward values are
 * compared after both ran; an op compared in place starts from the same buffer.
 *
 * --self-check runs the harness with the CPU backend in the device's place (every op
 * must agree exactly): the suite's check that this file's shapes, copies and
 * comparisons are right, on any machine.
 *
 *   ls_gpu_tests [--device N] [--self-check] [products|elementwise|embed|rms|layernorm|rope|moe|conv|lmhead|gdn_prep|gdr|routing|attention|mla|optim ...]
 *
 * Prints one line per op and one JSON document at the end ({"device", "checked",
 * "failed", "missing"}: the ops the backend does not build yet). Exit 0 when every
 * checked op agrees, 1 when one does not, 77 (skip) in a build without CUDA or on a
 * machine without a device — never a pass.
 *
 * Tolerances are relative to the largest reference value of the output: the kernels
 * compute the CPU's expressions in the same precision, and differ only in summation
 * order (tree sums of row statistics in double, cuBLAS's blocking) and in the device's
 * expf/cos/sin, a few ulp; an error of a different kind (a wrong index, a missed
 * element) is of the order of the values themselves.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/backend.h"
#include "longstraw/kernels.h"

static const ls_backend *G, *C; /* the device, the reference */
static int n_checked, n_failed;
static char failed[4096];
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}
static float *hrand(int64_t n, float scale) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = scale * frand();
    return p;
}
/* Device copy of n floats (or n bytes with dev_bytes). */
static void *dev_bytes(const void *h, size_t bytes) {
    void *d = G->i->buf_alloc(G, bytes ? bytes : 1, 256);
    if (!d) {
        fprintf(stderr, "device allocation of %zu bytes failed\n", bytes);
        exit(1);
    }
    if (h && bytes) G->i->to_device(G, d, h, bytes);
    return d;
}
static float *dev(const float *h, int64_t n) { return dev_bytes(h, (size_t)n * sizeof(float)); }
static void dfree(void *d) { G->i->buf_free(G, d, 0); }
/* The device buffer d back on the host, compared with the reference ref: the largest
 * |d − ref| over the largest |ref| (NaN anywhere fails). */
static double rel_err(const float *d, const float *ref, int64_t n) {
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    G->i->to_host(G, h, d, (size_t)n * sizeof(float));
    double worst = 0, big = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)h[i] - ref[i]);
        if (!(e <= worst)) worst = e;
        if (fabs((double)ref[i]) > big) big = fabs((double)ref[i]);
    }
    free(h);
    return n > 0 ? worst / (big > 0 ? big : 1) : INFINITY;
}
/* The same measure between two host arrays. */
static double host_err(const float *a, const float *ref, int64_t n) {
    double worst = 0, big = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - ref[i]);
        if (!(e <= worst)) worst = e;
        if (fabs((double)ref[i]) > big) big = fabs((double)ref[i]);
    }
    return n > 0 ? worst / (big > 0 ? big : 1) : INFINITY;
}
static int check(const char *op, double err, double tol) {
    n_checked++;
    int ok = err <= tol;
    printf("  %-22s %s  max error %.3g (tolerance %.1g)\n", op, ok ? "ok  " : "FAIL", err, tol);
    if (!ok) {
        n_failed++;
        size_t l = strlen(failed);
        snprintf(failed + l, sizeof failed - l, "%s\"%s\"", l ? ", " : "", op);
    }
    return ok;
}
static int built(const char *name, int slot) {
    if (slot) return 1;
    printf("  %-22s not built\n", name);
    return 0;
}
#define BUILT(op) built(#op, G->i->op != NULL)

static void t_products(void) {
    if (!BUILT(gemm)) return;
    enum { M = 37, N = 29, K = 53, LD = 61 };
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            float *A = hrand((int64_t)LD * 64, 1), *B = hrand((int64_t)LD * 64, 1), *Cm = hrand((int64_t)M * LD, 1);
            float *dA = dev(A, (int64_t)LD * 64), *dB = dev(B, (int64_t)LD * 64), *dC = dev(Cm, (int64_t)M * LD);
            ls_op_gemm(C, ta, tb, M, N, K, 0.75f, A, LD, B, LD, 0.5f, Cm, LD);
            ls_op_gemm(G, ta, tb, M, N, K, 0.75f, dA, LD, dB, LD, 0.5f, dC, LD);
            char name[32];
            snprintf(name, sizeof name, "gemm %c%c", ta ? 'T' : 'N', tb ? 'T' : 'N');
            check(name, rel_err(dC, Cm, (int64_t)M * LD), 1e-5);
            dfree(dA), dfree(dB), dfree(dC), free(A), free(B), free(Cm);
        }
    enum { T = 19, KK = 45, NN = 33 };
    float *x = hrand(T * KK, 1), *W = hrand(NN * KK, 1), *o = hrand(T * NN, 1), *dout = hrand(T * NN, 1);
    float *dx = hrand(T * KK, 1), *dW = hrand(NN * KK, 1);
    float *gx = dev(x, T * KK), *gW = dev(W, NN * KK), *go = dev(o, T * NN), *gdout = dev(dout, T * NN);
    float *gdx = dev(dx, T * KK), *gdW = dev(dW, NN * KK);
    ls_op_linear_fwd(C, o, x, W, T, KK, NN, 1);
    ls_op_linear_fwd(G, go, gx, gW, T, KK, NN, 1);
    check("linear_fwd +=", rel_err(go, o, T * NN), 1e-5);
    ls_op_linear_fwd(C, o, x, W, T, KK, NN, 0);
    ls_op_linear_fwd(G, go, gx, gW, T, KK, NN, 0);
    check("linear_fwd =", rel_err(go, o, T * NN), 1e-5);
    ls_op_linear_bwd(C, dx, dW, dout, x, W, T, KK, NN, 1);
    ls_op_linear_bwd(G, gdx, gdW, gdout, gx, gW, T, KK, NN, 1);
    check("linear_bwd dx", rel_err(gdx, dx, T * KK), 1e-5);
    check("linear_bwd dW", rel_err(gdW, dW, NN * KK), 1e-5);
    dfree(gx), dfree(gW), dfree(go), dfree(gdout), dfree(gdx), dfree(gdW);
    free(x), free(W), free(o), free(dout), free(dx), free(dW);
}

static void t_elementwise(void) {
    enum { N = 70001, T = 23, D = 131, I = 77 };
    if (BUILT(add_to) && BUILT(scale)) {
        float *y = hrand(N, 1), *x = hrand(N, 1), *gy = dev(y, N), *gx = dev(x, N);
        ls_op_add_to(C, y, x, N), ls_op_add_to(G, gy, gx, N);
        ls_op_scale(C, y, 0.37f, N), ls_op_scale(G, gy, 0.37f, N);
        check("add_to, scale", rel_err(gy, y, N), 0);
        dfree(gy), dfree(gx), free(y), free(x);
    }
    if (BUILT(copy_rows)) {
        float *s = hrand(T * 40, 1), *d = hrand(T * 35, 1), *gs = dev(s, T * 40), *gd = dev(d, T * 35);
        ls_op_copy_rows(C, d + 3, 35, s + 5, 40, T - 2, 17), ls_op_copy_rows(G, gd + 3, 35, gs + 5, 40, T - 2, 17);
        check("copy_rows", rel_err(gd, d, T * 35), 0);
        dfree(gs), dfree(gd), free(s), free(d);
    }
    if (BUILT(round_to)) {
        for (int k = 0; k < 2; k++) {
            ls_dtype dt = k ? LS_DTYPE_F16 : LS_DTYPE_BF16;
            float *x = hrand(N, 40), *gx = dev(x, N);
            ls_op_round_to(C, x, N, dt), ls_op_round_to(G, gx, N, dt);
            check(k ? "round_to f16" : "round_to bf16", rel_err(gx, x, N), 0);
            dfree(gx), free(x);
        }
    }
    if (BUILT(store_as)) { /* f32 rows into pages of each dtype: the same bytes */
        for (int k = 0; k < 3; k++) {
            ls_dtype dt = k == 0 ? LS_DTYPE_F32 : k == 1 ? LS_DTYPE_BF16 : LS_DTYPE_F16;
            size_t bytes = (size_t)(N - 3) * ls_dtype_size(dt);
            float *x = hrand(N, 40), *gx = dev(x, N);
            unsigned char *h = malloc(bytes), *hg = malloc(bytes), *g = G->i->buf_alloc(G, bytes + 64, 64);
            if (!h || !hg || !g) {
                check("store_as: memory", 1, 0);
                return;
            }
            ls_op_store_as(C, h, x + 3, N - 3, dt), ls_op_store_as(G, g, gx + 3, N - 3, dt);
            G->i->to_host(G, hg, g, bytes);
            check(k == 0 ? "store_as f32" : k == 1 ? "store_as bf16" : "store_as f16", memcmp(h, hg, bytes) ? 1 : 0, 0);
            G->i->buf_free(G, g, bytes + 64), dfree(gx), free(x), free(h), free(hg);
        }
    }
    if (BUILT(swiglu_fwd) && BUILT(swiglu_bwd)) {
        float *gu = hrand(T * 2 * I, 4), *o = hrand(T * I, 1), *dout = hrand(T * I, 1), *dgu = hrand(T * 2 * I, 1);
        float *ggu = dev(gu, T * 2 * I), *go = dev(o, T * I), *gdout = dev(dout, T * I), *gdgu = dev(dgu, T * 2 * I);
        ls_op_swiglu_fwd(C, o, gu, T, I), ls_op_swiglu_fwd(G, go, ggu, T, I);
        check("swiglu_fwd", rel_err(go, o, T * I), 1e-6);
        ls_op_swiglu_bwd(C, dgu, dout, gu, T, I), ls_op_swiglu_bwd(G, gdgu, gdout, ggu, T, I);
        check("swiglu_bwd", rel_err(gdgu, dgu, T * 2 * I), 1e-6);
        dfree(ggu), dfree(go), dfree(gdout), dfree(gdgu), free(gu), free(o), free(dout), free(dgu);
    }
    if (BUILT(sigmoid_mul_fwd) && BUILT(sigmoid_mul_bwd)) {
        float *x = hrand(N, 3), *g = hrand(N, 5), *y = hrand(N, 1), *dy = hrand(N, 1), *dx = hrand(N, 1),
              *dg = hrand(N, 1);
        float *gx = dev(x, N), *gg = dev(g, N), *gyy = dev(y, N), *gdy = dev(dy, N), *gdx = dev(dx, N),
              *gdg = dev(dg, N);
        ls_op_sigmoid_mul_fwd(C, y, x, g, N), ls_op_sigmoid_mul_fwd(G, gyy, gx, gg, N);
        check("sigmoid_mul_fwd", rel_err(gyy, y, N), 1e-6);
        ls_op_sigmoid_mul_bwd(C, dx, dg, dy, x, g, N), ls_op_sigmoid_mul_bwd(G, gdx, gdg, gdy, gx, gg, N);
        check("sigmoid_mul_bwd dx", rel_err(gdx, dx, N), 1e-6);
        check("sigmoid_mul_bwd dgate", rel_err(gdg, dg, N), 1e-6);
        dfree(gx), dfree(gg), dfree(gyy), dfree(gdy), dfree(gdx), dfree(gdg);
        free(x), free(g), free(y), free(dy), free(dx), free(dg);
    }
    if (BUILT(gated_add_rows) && BUILT(gated_add_rows_bwd)) {
        float *x = hrand(T * D, 1), *l = hrand(T, 3), *y = hrand(T * D, 1), *dy = hrand(T * D, 1), *dl = hrand(T, 1);
        float *gx = dev(x, T * D), *gl = dev(l, T), *gyy = dev(y, T * D), *gdy = dev(dy, T * D), *gdl = dev(dl, T);
        ls_op_gated_add_rows(C, x, l, y, T, D), ls_op_gated_add_rows(G, gx, gl, gyy, T, D);
        check("gated_add_rows", rel_err(gx, x, T * D), 1e-6);
        ls_op_gated_add_rows_bwd(C, dy, dl, x, l, y, T, D), ls_op_gated_add_rows_bwd(G, gdy, gdl, gx, gl, gyy, T, D);
        check("gated_add_rows_bwd dy", rel_err(gdy, dy, T * D), 1e-6);
        check("gated_add_rows_bwd dlogit", rel_err(gdl, dl, T), 1e-5);
        dfree(gx), dfree(gl), dfree(gyy), dfree(gdy), dfree(gdl), free(x), free(l), free(y), free(dy), free(dl);
    }
}

static void t_embed(void) {
    if (!BUILT(embed_fwd) || !BUILT(embed_bwd)) return;
    enum { T = 41, D = 67, V = 13 };
    int32_t ids[T];
    for (int t = 0; t < T; t++) ids[t] = (int32_t)((t * 7 + 3) % V); /* every id repeats */
    float *tab = hrand(V * D, 1), *o = hrand(T * D, 1), *dout = hrand(T * D, 1), *dtab = hrand(V * D, 1);
    int32_t *gids = dev_bytes(ids, sizeof ids);
    float *gtab = dev(tab, V * D), *go = dev(o, T * D), *gdout = dev(dout, T * D), *gdtab = dev(dtab, V * D);
    ls_op_embed_fwd(C, o, ids, tab, T, D), ls_op_embed_fwd(G, go, gids, gtab, T, D);
    check("embed_fwd", rel_err(go, o, T * D), 0);
    ls_op_embed_bwd(C, dtab, dout, ids, T, D), ls_op_embed_bwd(G, gdtab, gdout, gids, T, D);
    check("embed_bwd", rel_err(gdtab, dtab, V * D), 0); /* the same order of additions */
    dfree(gids), dfree(gtab), dfree(go), dfree(gdout), dfree(gdtab), free(tab), free(o), free(dout), free(dtab);
}

/* kind 0 zero-centred, 1 plain, 2 gated */
static void t_rms(int kind) {
    static const char *nm[] = {"rmsnorm", "rmsnorm_plain", "gated_rmsnorm"};
    int have = kind == 0 ? BUILT(rmsnorm_fwd) && BUILT(rmsnorm_bwd)
               : kind == 1 ? BUILT(rmsnorm_plain_fwd) && BUILT(rmsnorm_plain_bwd)
                           : BUILT(gated_rmsnorm_fwd) && BUILT(gated_rmsnorm_bwd);
    if (!have) return;
    enum { R = 37, D = 301 };
    float *x = hrand(R * D, 2), *z = hrand(R * D, 3), *w = hrand(D, 0.5f), *y = hrand(R * D, 1), *rs = hrand(R, 1);
    float *dy = hrand(R * D, 1), *dx = hrand(R * D, 1), *dz = hrand(R * D, 1), *dw = hrand(D, 1);
    float *gx = dev(x, R * D), *gz = dev(z, R * D), *gw = dev(w, D), *gyy = dev(y, R * D), *grs = dev(rs, R);
    float *gdy = dev(dy, R * D), *gdx = dev(dx, R * D), *gdz = dev(dz, R * D), *gdw = dev(dw, D);
    char name[48];
    if (kind == 0) ls_op_rmsnorm_fwd(C, y, rs, x, w, R, D, 1e-6f), ls_op_rmsnorm_fwd(G, gyy, grs, gx, gw, R, D, 1e-6f);
    if (kind == 1)
        ls_op_rmsnorm_plain_fwd(C, y, rs, x, w, R, D, 1e-6f), ls_op_rmsnorm_plain_fwd(G, gyy, grs, gx, gw, R, D, 1e-6f);
    if (kind == 2)
        ls_op_gated_rmsnorm_fwd(C, y, rs, x, z, w, R, D, 1e-6f),
            ls_op_gated_rmsnorm_fwd(G, gyy, grs, gx, gz, gw, R, D, 1e-6f);
    snprintf(name, sizeof name, "%s_fwd", nm[kind]);
    check(name, rel_err(gyy, y, R * D), 1e-6);
    snprintf(name, sizeof name, "%s_fwd rstd", nm[kind]);
    check(name, rel_err(grs, rs, R), 1e-6);
    G->i->to_device(G, grs, rs, R * sizeof(float)); /* the backward from the same saved rstd */
    if (kind == 0)
        ls_op_rmsnorm_bwd(C, dx, dw, dy, x, rs, w, R, D), ls_op_rmsnorm_bwd(G, gdx, gdw, gdy, gx, grs, gw, R, D);
    if (kind == 1)
        ls_op_rmsnorm_plain_bwd(C, dx, dw, dy, x, rs, w, R, D),
            ls_op_rmsnorm_plain_bwd(G, gdx, gdw, gdy, gx, grs, gw, R, D);
    if (kind == 2)
        ls_op_gated_rmsnorm_bwd(C, dx, dz, dw, dy, x, z, rs, w, R, D),
            ls_op_gated_rmsnorm_bwd(G, gdx, gdz, gdw, gdy, gx, gz, grs, gw, R, D);
    snprintf(name, sizeof name, "%s_bwd dx", nm[kind]);
    check(name, rel_err(gdx, dx, R * D), 1e-5);
    if (kind == 0) { /* dx aliasing dy, as the models call it */
        ls_op_rmsnorm_bwd(C, dy, NULL, dy, x, rs, w, R, D), ls_op_rmsnorm_bwd(G, gdy, NULL, gdy, gx, grs, gw, R, D);
        check("rmsnorm_bwd in place", rel_err(gdy, dy, R * D), 1e-5);
    }
    snprintf(name, sizeof name, "%s_bwd dw", nm[kind]);
    check(name, rel_err(gdw, dw, D), 1e-6);
    if (kind == 2) check("gated_rmsnorm_bwd dz", rel_err(gdz, dz, R * D), 1e-6);
    dfree(gx), dfree(gz), dfree(gw), dfree(gyy), dfree(grs), dfree(gdy), dfree(gdx), dfree(gdz), dfree(gdw);
    free(x), free(z), free(w), free(y), free(rs), free(dy), free(dx), free(dz), free(dw);
}

static void t_rms_all(void) {
    for (int k = 0; k < 3; k++) t_rms(k);
}

static void t_layernorm(void) {
    if (!BUILT(layernorm_fwd) || !BUILT(layernorm_bwd)) return;
    enum { R = 29, D = 97 };
    float *x = hrand(R * D, 2), *w = hrand(D, 1), *b = hrand(D, 1), *y = hrand(R * D, 1), *dy = hrand(R * D, 1);
    float *dx = hrand(R * D, 1), *dw = hrand(D, 1), *db = hrand(D, 1);
    float *gx = dev(x, R * D), *gw = dev(w, D), *gb = dev(b, D), *gyy = dev(y, R * D), *gdy = dev(dy, R * D);
    float *gdx = dev(dx, R * D), *gdw = dev(dw, D), *gdb = dev(db, D);
    ls_op_layernorm_fwd(C, y, x, w, b, R, D, 1e-6f), ls_op_layernorm_fwd(G, gyy, gx, gw, gb, R, D, 1e-6f);
    check("layernorm_fwd", rel_err(gyy, y, R * D), 1e-6);
    ls_op_layernorm_bwd(C, dx, dw, db, dy, x, w, R, D, 1e-6f), ls_op_layernorm_bwd(G, gdx, gdw, gdb, gdy, gx, gw, R, D, 1e-6f);
    check("layernorm_bwd dx", rel_err(gdx, dx, R * D), 1e-5);
    check("layernorm_bwd dw", rel_err(gdw, dw, D), 1e-6);
    check("layernorm_bwd db", rel_err(gdb, db, D), 0);
    dfree(gx), dfree(gw), dfree(gb), dfree(gyy), dfree(gdy), dfree(gdx), dfree(gdw), dfree(gdb);
    free(x), free(w), free(b), free(y), free(dy), free(dx), free(dw), free(db);
}

static void t_rope(void) {
    enum { T = 17, H = 3, HD = 40 };
    if (BUILT(rope_fwd) && BUILT(rope_bwd)) {
        float *x = hrand(T * H * HD, 1), *gx = dev(x, T * H * HD);
        ls_op_rope_fwd(C, x, T, H, HD, 26, 1e7, 999983), ls_op_rope_fwd(G, gx, T, H, HD, 26, 1e7, 999983);
        check("rope_fwd", rel_err(gx, x, T * H * HD), 1e-6);
        ls_op_rope_bwd(C, x, T, H, HD, 26, 1e7, 999983), ls_op_rope_bwd(G, gx, T, H, HD, 26, 1e7, 999983);
        check("rope_bwd", rel_err(gx, x, T * H * HD), 1e-6);
        dfree(gx), free(x);
    }
    if (BUILT(rope_table_fwd) && BUILT(rope_table_bwd)) {
        enum { HALF = 7 };
        double f[HALF];
        for (int i = 0; i < HALF; i++) f[i] = pow(10000.0, -2.0 * i / (2.0 * HALF)) * (i % 2 ? 0.5 : 1.0);
        double *gf = dev_bytes(f, sizeof f);
        for (int il = 0; il < 2; il++) {
            float *x = hrand(T * H * HD, 1), *gx = dev(x, T * H * HD);
            ls_op_rope_table_fwd(C, x, T, H, HD, 9, HALF, f, il, 123457);
            ls_op_rope_table_fwd(G, gx, T, H, HD, 9, HALF, gf, il, 123457);
            check(il ? "rope_table_fwd interleaved" : "rope_table_fwd half", rel_err(gx, x, T * H * HD), 1e-6);
            ls_op_rope_table_bwd(C, x, T, H, HD, 9, HALF, f, il, 123457);
            ls_op_rope_table_bwd(G, gx, T, H, HD, 9, HALF, gf, il, 123457);
            check(il ? "rope_table_bwd interleaved" : "rope_table_bwd half", rel_err(gx, x, T * H * HD), 1e-6);
            dfree(gx), free(x);
        }
        dfree(gf);
    }
}

static void t_moe_merge(void) {
    enum { T = 31, D = 45, K = 3, NR = 13, NH = 3, HD = 19 };
    if (BUILT(moe_gather) && BUILT(moe_scatter_add) && BUILT(moe_combine_bwd)) {
        int64_t rows[NR];
        for (int i = 0; i < NR; i++) rows[i] = (int64_t)(i * 2 + (i % 3 == 0)) * K + i % K; /* distinct tokens */
        float *x = hrand(T * D, 1), *xs = hrand(NR * D, 1), *y = hrand(T * D, 1), *ys = hrand(NR * D, 1);
        float *wt = hrand(T * K, 1), *dys = hrand(NR * D, 1), *dwt = hrand(T * K, 1);
        int64_t *grows = dev_bytes(rows, sizeof rows);
        float *gx = dev(x, T * D), *gxs = dev(xs, NR * D), *gyy = dev(y, T * D), *gys = dev(ys, NR * D);
        float *gwt = dev(wt, T * K), *gdys = dev(dys, NR * D), *gdwt = dev(dwt, T * K);
        ls_op_moe_gather(C, xs, x, rows, NR, D, K), ls_op_moe_gather(G, gxs, gx, grows, NR, D, K);
        check("moe_gather", rel_err(gxs, xs, NR * D), 0);
        ls_op_moe_scatter_add(C, y, ys, rows, wt, NR, D, K), ls_op_moe_scatter_add(G, gyy, gys, grows, gwt, NR, D, K);
        check("moe_scatter_add", rel_err(gyy, y, T * D), 1e-6);
        ls_op_moe_scatter_add(C, y, ys, rows, NULL, NR, D, K), ls_op_moe_scatter_add(G, gyy, gys, grows, NULL, NR, D, K);
        check("moe_scatter_add (no weights)", rel_err(gyy, y, T * D), 1e-6);
        ls_op_moe_combine_bwd(C, dys, dwt, y, ys, rows, wt, NR, D, K);
        ls_op_moe_combine_bwd(G, gdys, gdwt, gyy, gys, grows, gwt, NR, D, K);
        check("moe_combine_bwd dys", rel_err(gdys, dys, NR * D), 1e-6);
        check("moe_combine_bwd dwt", rel_err(gdwt, dwt, T * K), 1e-6);
        dfree(grows), dfree(gx), dfree(gxs), dfree(gyy), dfree(gys), dfree(gwt), dfree(gdys), dfree(gdwt);
        free(x), free(xs), free(y), free(ys), free(wt), free(dys), free(dwt);
    }
    if (BUILT(attn_merge)) {
        int64_t rows = (int64_t)T * NH;
        float *o = hrand(rows * HD, 1), *l = hrand(rows, 5), *o2 = hrand(rows * HD, 1), *l2 = hrand(rows, 5);
        l[3] = -INFINITY, l2[4] = -INFINITY, l[5] = l2[5] = -INFINITY; /* empty partials */
        for (int d = 0; d < HD; d++) o[5 * HD + d] = 0;
        float *go = dev(o, rows * HD), *gl = dev(l, rows), *go2 = dev(o2, rows * HD), *gl2 = dev(l2, rows);
        ls_op_attn_merge(C, o, l, o2, l2, T, NH, HD), ls_op_attn_merge(G, go, gl, go2, gl2, T, NH, HD);
        check("attn_merge o", rel_err(go, o, rows * HD), 1e-6);
        float *hl = malloc((size_t)rows * sizeof(float));
        G->i->to_host(G, hl, gl, (size_t)rows * sizeof(float));
        double e = 0;
        for (int64_t i = 0; i < rows; i++) {
            double d = (l[i] == -INFINITY && hl[i] == -INFINITY) ? 0 : fabs((double)hl[i] - l[i]);
            if (!(d <= e)) e = d;
        }
        check("attn_merge lse", e, 1e-5);
        dfree(go), dfree(gl), dfree(go2), dfree(gl2), free(o), free(l), free(o2), free(l2), free(hl);
    }
}

static void t_conv(void) {
    if (!BUILT(conv_fwd) || !BUILT(conv_bwd)) return;
    enum { Cc = 67, W = 4 };
    for (int T = 2; T <= 29; T += 27) { /* a chunk shorter than the tail, and a longer one */
        float *x = hrand((int64_t)T * Cc, 1), *w = hrand(Cc * W, 1), *tail = hrand((W - 1) * Cc, 1);
        float *tail0 = malloc((W - 1) * Cc * sizeof(float));
        memcpy(tail0, tail, (W - 1) * Cc * sizeof(float));
        float *y = hrand((int64_t)T * Cc, 1), *pre = hrand((int64_t)T * Cc, 1), *dy = hrand((int64_t)T * Cc, 1);
        float *dx = hrand((int64_t)T * Cc, 1), *dw = hrand(Cc * W, 1), *dtail = hrand((W - 1) * Cc, 1);
        float *gx = dev(x, (int64_t)T * Cc), *gw = dev(w, Cc * W), *gtail = dev(tail, (W - 1) * Cc);
        float *gtail0 = dev(tail0, (W - 1) * Cc), *gyy = dev(y, (int64_t)T * Cc), *gpre = dev(pre, (int64_t)T * Cc);
        float *gdy = dev(dy, (int64_t)T * Cc), *gdx = dev(dx, (int64_t)T * Cc), *gdw = dev(dw, Cc * W);
        float *gdtail = dev(dtail, (W - 1) * Cc);
        char name[48];
        ls_op_conv_fwd(C, y, pre, tail, x, w, T, Cc, W), ls_op_conv_fwd(G, gyy, gpre, gtail, gx, gw, T, Cc, W);
        snprintf(name, sizeof name, "conv_fwd T=%d", T);
        check(name, rel_err(gyy, y, (int64_t)T * Cc), 1e-6);
        snprintf(name, sizeof name, "conv_fwd T=%d tail", T);
        check(name, rel_err(gtail, tail, (W - 1) * Cc), 0);
        G->i->to_device(G, gpre, pre, (size_t)T * Cc * sizeof(float)); /* the backward from the same saved pre */
        ls_op_conv_bwd(C, dx, dw, dtail, dy, pre, x, tail0, w, T, Cc, W);
        ls_op_conv_bwd(G, gdx, gdw, gdtail, gdy, gpre, gx, gtail0, gw, T, Cc, W);
        snprintf(name, sizeof name, "conv_bwd T=%d dx", T);
        check(name, rel_err(gdx, dx, (int64_t)T * Cc), 1e-6);
        snprintf(name, sizeof name, "conv_bwd T=%d dw", T);
        check(name, rel_err(gdw, dw, Cc * W), 1e-6);
        snprintf(name, sizeof name, "conv_bwd T=%d dtail", T);
        check(name, rel_err(gdtail, dtail, (W - 1) * Cc), 1e-6);
        dfree(gx), dfree(gw), dfree(gtail), dfree(gtail0), dfree(gyy), dfree(gpre), dfree(gdy), dfree(gdx), dfree(gdw);
        dfree(gdtail);
        free(x), free(w), free(tail), free(tail0), free(y), free(pre), free(dy), free(dx), free(dw), free(dtail);
    }
}

static void t_lmhead(void) {
    if (!BUILT(lmhead_fwd) || !BUILT(lmhead_logprobs_bwd)) return;
    enum { T = 23, D = 37, V = 1031, CH = 8 };
    int32_t tg[T];
    for (int t = 0; t < T; t++) tg[t] = (int32_t)((t * 389 + 11) % V);
    float *h = hrand(T * D, 1), *W = hrand(V * D, 1), *lp = hrand(T, 1), *lse = hrand(T, 1), *ent = hrand(T, 1);
    float *dlp = hrand(T, 1), *dh = hrand(T * D, 1), *dW = hrand(V * D, 1);
    int32_t *gtg = dev_bytes(tg, sizeof tg);
    float *gh = dev(h, T * D), *gW = dev(W, V * D), *glp = dev(lp, T), *glse = dev(lse, T), *gent = dev(ent, T);
    float *gdlp = dev(dlp, T), *gdh = dev(dh, T * D), *gdW = dev(dW, V * D);
    ls_arena ca, ga;
    ls_arena_init(&ca, "cpu scratch", 1 << 20), ls_arena_init(&ga, "device scratch", 1 << 20);
    ls_arena_set_backend(&ga, G);
    int ok = ls_op_lmhead_fwd(C, lp, lse, ent, h, W, tg, T, D, V, 0.7f, CH, &ca) == LS_OK &&
             ls_op_lmhead_fwd(G, glp, glse, gent, gh, gW, gtg, T, D, V, 0.7f, CH, &ga) == LS_OK;
    check("lmhead_fwd status", ok ? 0 : 1, 0);
    check("lmhead_fwd logprob", rel_err(glp, lp, T), 1e-5);
    check("lmhead_fwd lse", rel_err(glse, lse, T), 1e-6);
    check("lmhead_fwd entropy", rel_err(gent, ent, T), 1e-5);
    G->i->to_device(G, glse, lse, T * sizeof(float)); /* the backward from the same saved lse */
    ok = ls_op_lmhead_logprobs_bwd(C, dh, dW, dlp, h, W, tg, lse, T, D, V, 0.7f, CH, &ca) == LS_OK &&
         ls_op_lmhead_logprobs_bwd(G, gdh, gdW, gdlp, gh, gW, gtg, glse, T, D, V, 0.7f, CH, &ga) == LS_OK;
    check("lmhead_logprobs_bwd status", ok ? 0 : 1, 0);
    check("lmhead_logprobs_bwd dh", rel_err(gdh, dh, T * D), 1e-5);
    check("lmhead_logprobs_bwd dW", rel_err(gdW, dW, V * D), 1e-5);
    ls_arena_free(&ca), ls_arena_free(&ga);
    dfree(gtg), dfree(gh), dfree(gW), dfree(glp), dfree(glse), dfree(gent), dfree(gdlp), dfree(gdh), dfree(gdW);
    free(h), free(W), free(lp), free(lse), free(ent), free(dlp), free(dh), free(dW);
}

static void t_gdn_prep(void) {
    if (!BUILT(gdn_prep_fwd) || !BUILT(gdn_prep_bwd)) return;
    enum { T = 9, HK = 2, HV = 4, DK = 13, DV = 11, KD = HK * DK, VD = HV * DV, CD = 2 * KD + VD };
    ls_gdr_dims dm = {HK, HV, DK, DV, 0.0f};
    float *y = hrand(T * CD, 2), *ba = hrand(T * 2 * HV, 3), *Al = hrand(HV, 1), *dtb = hrand(HV, 1);
    float *q = hrand(T * KD, 1), *k = hrand(T * KD, 1), *v = hrand(T * VD, 1), *be = hrand(T * HV, 1);
    float *g = hrand(T * HV, 1), *rq = hrand(T * HK, 1), *rk = hrand(T * HK, 1);
    float *dq = hrand(T * KD, 1), *dk = hrand(T * KD, 1), *dv = hrand(T * VD, 1), *dbe = hrand(T * HV, 1);
    float *dg = hrand(T * HV, 1), *dy = hrand(T * CD, 1), *dba = hrand(T * 2 * HV, 1), *dAl = hrand(HV, 1);
    float *ddt = hrand(HV, 1);
    float *gy = dev(y, T * CD), *gba = dev(ba, T * 2 * HV), *gAl = dev(Al, HV), *gdtb = dev(dtb, HV);
    float *gq = dev(q, T * KD), *gk = dev(k, T * KD), *gv = dev(v, T * VD), *gbe = dev(be, T * HV);
    float *gg = dev(g, T * HV), *grq = dev(rq, T * HK), *grk = dev(rk, T * HK), *gdq = dev(dq, T * KD);
    float *gdk = dev(dk, T * KD), *gdv = dev(dv, T * VD), *gdbe = dev(dbe, T * HV), *gdg = dev(dg, T * HV);
    float *gdy = dev(dy, T * CD), *gdba = dev(dba, T * 2 * HV), *gdAl = dev(dAl, HV), *gddt = dev(ddt, HV);
    ls_op_gdn_prep_fwd(C, q, k, v, be, g, rq, rk, y, ba, Al, dtb, T, dm);
    ls_op_gdn_prep_fwd(G, gq, gk, gv, gbe, gg, grq, grk, gy, gba, gAl, gdtb, T, dm);
    check("gdn_prep_fwd q", rel_err(gq, q, T * KD), 1e-6);
    check("gdn_prep_fwd k", rel_err(gk, k, T * KD), 1e-6);
    check("gdn_prep_fwd v", rel_err(gv, v, T * VD), 0);
    check("gdn_prep_fwd beta", rel_err(gbe, be, T * HV), 1e-6);
    check("gdn_prep_fwd g", rel_err(gg, g, T * HV), 1e-6);
    check("gdn_prep_fwd rq, rk", fmax(rel_err(grq, rq, T * HK), rel_err(grk, rk, T * HK)), 1e-6);
    ls_op_gdn_prep_bwd(C, dy, dba, dAl, ddt, dq, dk, dv, dbe, dg, y, rq, rk, ba, be, g, Al, dtb, T, dm);
    ls_op_gdn_prep_bwd(G, gdy, gdba, gdAl, gddt, gdq, gdk, gdv, gdbe, gdg, gy, grq, grk, gba, gbe, gg, gAl, gdtb, T,
                       dm);
    check("gdn_prep_bwd dy", rel_err(gdy, dy, T * CD), 1e-5);
    check("gdn_prep_bwd dba", rel_err(gdba, dba, T * 2 * HV), 1e-6);
    check("gdn_prep_bwd dA_log", rel_err(gdAl, dAl, HV), 1e-5);
    check("gdn_prep_bwd ddt_bias", rel_err(gddt, ddt, HV), 1e-5);
    float *all[] = {y, ba, Al, dtb, q, k, v, be, g, rq, rk, dq, dk, dv, dbe, dg, dy, dba, dAl, ddt};
    float *gall[] = {gy, gba, gAl, gdtb, gq, gk, gv, gbe, gg, grq, grk, gdq, gdk, gdv, gdbe, gdg, gdy, gdba, gdAl,
                     gddt};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]), dfree(gall[i]);
}

static void t_gdr(void) {
    enum { T = 150, HK = 2, HV = 4, DK = 24, DV = 19, KD = HK * DK, VD = HV * DV, SN = HV * DK * DV, NC = 3 };
    ls_gdr_dims dm = {HK, HV, DK, DV, 0.2f};
    float *q = hrand(T * KD, 0.3f), *k = hrand(T * KD, 0.3f), *v = hrand(T * VD, 1), *be = hrand(T * HV, 0.5f);
    float *g = hrand(T * HV, 0.2f);
    for (int i = 0; i < T * HV; i++) be[i] = 0.5f + be[i], g[i] = -fabsf(g[i]); /* β in (0, 1), log decay ≤ 0 */
    float *gq = dev(q, T * KD), *gk = dev(k, T * KD), *gv = dev(v, T * VD), *gbe = dev(be, T * HV), *gg = dev(g, T * HV);
    if (BUILT(gdr_serial_fwd)) {
        float *o = hrand(T * VD, 1), *S = hrand(SN, 0.1f), *go = dev(o, T * VD), *gS = dev(S, SN);
        ls_op_gdr_serial_fwd(C, o, S, q, k, v, be, g, T, dm), ls_op_gdr_serial_fwd(G, go, gS, gq, gk, gv, gbe, gg, T, dm);
        check("gdr_serial_fwd o", rel_err(go, o, T * VD), 1e-5);
        check("gdr_serial_fwd state", rel_err(gS, S, SN), 1e-5);
        dfree(go), dfree(gS), free(o), free(S);
    }
    if (BUILT(gdr_chunk_fwd)) {
        float *o = hrand(T * VD, 1), *S = hrand(SN, 0.1f), *tape = hrand(NC * SN, 1);
        float *go = dev(o, T * VD), *gS = dev(S, SN), *gtape = dev(tape, NC * SN);
        /* the floor: the CPU's chunked form against its own token-serial one, this run */
        float *os = malloc(T * VD * sizeof(float)), *Ss = malloc(SN * sizeof(float));
        memcpy(Ss, S, SN * sizeof(float));
        ls_gdr_serial_fwd(os, Ss, q, k, v, be, g, T, dm);
        ls_arena ca, ga;
        ls_arena_init(&ca, "cpu scratch", 1 << 20), ls_arena_init(&ga, "device scratch", 1 << 20);
        ls_arena_set_backend(&ga, G);
        int ok = ls_op_gdr_chunk_fwd(C, o, tape, S, q, k, v, be, g, T, dm, &ca) == LS_OK &&
                 ls_op_gdr_chunk_fwd(G, go, gtape, gS, gq, gk, gv, gbe, gg, T, dm, &ga) == LS_OK;
        check("gdr_chunk_fwd status", ok ? 0 : 1, 0);
        double floor = fmax(host_err(os, o, T * VD), host_err(Ss, S, SN)), tol = 4 * floor + 1e-6;
        printf("  (the CPU's chunked vs token-serial floor %.3g: tolerance %.3g)\n", floor, tol);
        check("gdr_chunk_fwd o", rel_err(go, o, T * VD), tol);
        check("gdr_chunk_fwd state", rel_err(gS, S, SN), tol);
        check("gdr_chunk_fwd tape", rel_err(gtape, tape, NC * SN), tol);
        free(os), free(Ss);
        if (BUILT(gdr_chunk_bwd)) { /* from the CPU's tape (uploaded), with an incoming dstate_T */
            G->i->to_device(G, gtape, tape, NC * SN * sizeof(float));
            float *dout = hrand(T * VD, 1), *dST = hrand(SN, 0.1f), *dq = hrand(T * KD, 1), *dk = hrand(T * KD, 1);
            float *dv = hrand(T * VD, 1), *db = hrand(T * HV, 1), *dg = hrand(T * HV, 1), *dS0 = hrand(SN, 1);
            float *gdout = dev(dout, T * VD), *gdST = dev(dST, SN), *gdq = dev(dq, T * KD), *gdk = dev(dk, T * KD);
            float *gdv = dev(dv, T * VD), *gdb = dev(db, T * HV), *gdg = dev(dg, T * HV), *gdS0 = dev(dS0, SN);
            ok = ls_op_gdr_chunk_bwd(C, dq, dk, dv, db, dg, dS0, dout, dST, tape, q, k, v, be, g, T, dm, &ca) == LS_OK &&
                 ls_op_gdr_chunk_bwd(G, gdq, gdk, gdv, gdb, gdg, gdS0, gdout, gdST, gtape, gq, gk, gv, gbe, gg, T, dm,
                                     &ga) == LS_OK;
            /* the CPU's chunked form against a token-serial backward: two float32 schedules.
             * The kernel's algorithm written out in C on the host measured 3e-7 .. 7e-7 of
             * each output's scale against the CPU here; the bound leaves the device's FMAs
             * and expf an order of magnitude */
            check("gdr_chunk_bwd status", ok ? 0 : 1, 0);
            check("gdr_chunk_bwd dq", rel_err(gdq, dq, T * KD), 1e-5);
            check("gdr_chunk_bwd dk", rel_err(gdk, dk, T * KD), 1e-5);
            check("gdr_chunk_bwd dv", rel_err(gdv, dv, T * VD), 1e-5);
            check("gdr_chunk_bwd dbeta", rel_err(gdb, db, T * HV), 1e-5);
            check("gdr_chunk_bwd dg", rel_err(gdg, dg, T * HV), 1e-5);
            check("gdr_chunk_bwd dstate0", rel_err(gdS0, dS0, SN), 1e-5);
            dfree(gdout), dfree(gdST), dfree(gdq), dfree(gdk), dfree(gdv), dfree(gdb), dfree(gdg), dfree(gdS0);
            free(dout), free(dST), free(dq), free(dk), free(dv), free(db), free(dg), free(dS0);
        }
        ls_arena_free(&ca), ls_arena_free(&ga);
        dfree(go), dfree(gS), dfree(gtape), free(o), free(S), free(tape);
    }
    if (BUILT(gdr_step_seqs) && BUILT(conv_step_seqs)) {
        enum { NS = 3, CC = 29, W = 4 };
        float *S = hrand(NS * SN, 0.1f), *o = hrand(NS * VD, 1), *gS = dev(S, NS * SN), *go = dev(o, NS * VD);
        float *hs[NS], *ds[NS];
        for (int i = 0; i < NS; i++) hs[i] = S + i * SN, ds[i] = gS + i * SN;
        float **gds = dev_bytes(ds, sizeof ds); /* the pointer array on the device, then on the host (models) */
        ls_op_gdr_step_seqs(C, o, hs, q, k, v, be, g, NS, dm), ls_op_gdr_step_seqs(G, go, gds, gq, gk, gv, gbe, gg, NS, dm);
        ls_op_gdr_step_seqs(C, o, hs, q, k, v, be, g, NS, dm), ls_op_gdr_step_seqs(G, go, ds, gq, gk, gv, gbe, gg, NS, dm);
        check("gdr_step_seqs o", rel_err(go, o, NS * VD), 1e-5);
        check("gdr_step_seqs states", rel_err(gS, S, NS * SN), 1e-5);
        float *tl = hrand(NS * (W - 1) * CC, 1), *x = hrand(NS * CC, 1), *w = hrand(CC * W, 1), *y = hrand(NS * CC, 1);
        float *gtl = dev(tl, NS * (W - 1) * CC), *gx = dev(x, NS * CC), *gw = dev(w, CC * W), *gyy = dev(y, NS * CC);
        for (int i = 0; i < NS; i++) hs[i] = tl + i * (W - 1) * CC, ds[i] = gtl + i * (W - 1) * CC;
        G->i->to_device(G, gds, ds, sizeof ds);
        ls_op_conv_step_seqs(C, y, hs, x, w, NS, CC, W), ls_op_conv_step_seqs(G, gyy, gds, gx, gw, NS, CC, W);
        ls_op_conv_step_seqs(C, y, hs, x, w, NS, CC, W), ls_op_conv_step_seqs(G, gyy, ds, gx, gw, NS, CC, W);
        check("conv_step_seqs y", rel_err(gyy, y, NS * CC), 1e-6);
        check("conv_step_seqs tails", rel_err(gtl, tl, NS * (W - 1) * CC), 0);
        dfree(gS), dfree(go), dfree(gds), dfree(gtl), dfree(gx), dfree(gw), dfree(gyy);
        free(S), free(o), free(tl), free(x), free(w), free(y);
    }
    dfree(gq), dfree(gk), dfree(gv), dfree(gbe), dfree(gg), free(q), free(k), free(v), free(be), free(g);
}

/* Device bytes equal to the host's (selections, groupings). */
static double same_bytes(const void *d, const void *h, size_t bytes) {
    void *b = malloc(bytes ? bytes : 1);
    G->i->to_host(G, b, d, bytes);
    int same = !memcmp(b, h, bytes);
    free(b);
    return same ? 0 : 1;
}

static void t_routing(void) {
    enum { T = 21, E = 16, K = 3 };
    if (BUILT(moe_route) && BUILT(moe_route_bwd) && BUILT(moe_group)) {
        for (int norm = 0; norm < 2; norm++) {
            float *lg = hrand(T * E, 3), *p = hrand(T * E, 1), *wt = hrand(T * K, 1), *dwt = hrand(T * K, 1);
            float *dl = hrand(T * E, 1);
            int32_t sel[T * K];
            int64_t count[E + 1], rows[T * K];
            float *glg = dev(lg, T * E), *gp = dev(p, T * E), *gwt = dev(wt, T * K), *gdwt = dev(dwt, T * K);
            float *gdl = dev(dl, T * E);
            int32_t *gsel = dev_bytes(NULL, sizeof sel);
            int64_t *gcount = dev_bytes(NULL, sizeof count), *grows = dev_bytes(NULL, sizeof rows);
            ls_op_moe_route(C, p, sel, wt, lg, T, E, K, norm), ls_op_moe_route(G, gp, gsel, gwt, glg, T, E, K, norm);
            check(norm ? "moe_route probs (norm)" : "moe_route probs", rel_err(gp, p, T * E), 1e-6);
            check(norm ? "moe_route sel (norm)" : "moe_route sel", same_bytes(gsel, sel, sizeof sel), 0);
            check(norm ? "moe_route wt (norm)" : "moe_route wt", rel_err(gwt, wt, T * K), 1e-6);
            ls_op_moe_route_bwd(C, dl, dwt, p, sel, wt, T, E, K, norm);
            ls_op_moe_route_bwd(G, gdl, gdwt, gp, gsel, gwt, T, E, K, norm);
            check(norm ? "moe_route_bwd (norm)" : "moe_route_bwd", rel_err(gdl, dl, T * E), 1e-5);
            ls_arena ca, ga;
            ls_arena_init(&ca, "cpu scratch", 1 << 16), ls_arena_init(&ga, "device scratch", 1 << 16);
            ls_arena_set_backend(&ga, G);
            int ok = ls_op_moe_group(C, count, rows, sel, T, E, K, &ca) == LS_OK &&
                     ls_op_moe_group(G, gcount, grows, gsel, T, E, K, &ga) == LS_OK;
            check("moe_group", ok ? same_bytes(gcount, count, sizeof count) + same_bytes(grows, rows, sizeof rows) : 1,
                  0);
            ls_arena_free(&ca), ls_arena_free(&ga);
            dfree(glg), dfree(gp), dfree(gwt), dfree(gdwt), dfree(gdl), dfree(gsel), dfree(gcount), dfree(grows);
            free(lg), free(p), free(wt), free(dwt), free(dl);
        }
    }
    if (BUILT(mla_route_fwd) && BUILT(mla_route_bwd)) {
        for (int grouped = 0; grouped < 2; grouped++) {
            float *lg = hrand(T * E, 3), *bias = hrand(E, 0.1f), *wt = hrand(T * K, 1), *so = hrand(T * E, 1);
            float *dwt = hrand(T * K, 1), *dl = hrand(T * E, 1);
            int32_t sel[T * K];
            float *glg = dev(lg, T * E), *gbias = dev(bias, E), *gwt = dev(wt, T * K), *gso = dev(so, T * E);
            float *gdwt = dev(dwt, T * K), *gdl = dev(dl, T * E);
            int32_t *gsel = dev_bytes(NULL, sizeof sel);
            int ng = grouped ? 4 : 1, tg = grouped ? 2 : 1;
            ls_op_mla_route_fwd(C, sel, wt, so, lg, bias, T, E, K, ng, tg, 1, 2.5);
            ls_op_mla_route_fwd(G, gsel, gwt, gso, glg, gbias, T, E, K, ng, tg, 1, 2.5);
            check(grouped ? "mla_route_fwd sel (groups)" : "mla_route_fwd sel", same_bytes(gsel, sel, sizeof sel), 0);
            check(grouped ? "mla_route_fwd wt (groups)" : "mla_route_fwd wt", rel_err(gwt, wt, T * K), 1e-6);
            check(grouped ? "mla_route_fwd s (groups)" : "mla_route_fwd s", rel_err(gso, so, T * E), 1e-6);
            ls_op_mla_route_bwd(C, dl, dwt, so, sel, T, E, K, 1, 2.5);
            ls_op_mla_route_bwd(G, gdl, gdwt, gso, gsel, T, E, K, 1, 2.5);
            check(grouped ? "mla_route_bwd (groups)" : "mla_route_bwd", rel_err(gdl, dl, T * E), 1e-5);
            dfree(glg), dfree(gbias), dfree(gwt), dfree(gso), dfree(gdwt), dfree(gdl), dfree(gsel);
            free(lg), free(bias), free(wt), free(so), free(dwt), free(dl);
        }
    }
}

/* Pages of a prefix of n positions (page size S, [S, NKV, HD] each, dtype dt) on the host
 * (hp) and the device (dp) from f32 values; pages are zero past n. */
static void make_pages(void **hp, void **dp, const float *vals, int64_t n, int64_t S, int nkv, int hd, ls_dtype dt) {
    int64_t np = (n + S - 1) / S, per = S * nkv * hd;
    size_t pb = (size_t)per * ls_dtype_size(dt);
    float *pg = calloc((size_t)per, sizeof(float));
    for (int64_t p = 0; p < np; p++) {
        memset(pg, 0, (size_t)per * sizeof(float));
        int64_t rows = n - p * S < S ? n - p * S : S;
        memcpy(pg, vals + p * per, (size_t)(rows * nkv * hd) * sizeof(float));
        hp[p] = malloc(pb);
        ls_convert_from_f32(hp[p], dt, pg, (size_t)per);
        dp[p] = dev_bytes(hp[p], pb);
    }
    free(pg);
}

static void t_attention(void) {
    if (!BUILT(attn_fwd) || !BUILT(attn_bwd) || !BUILT(attn_prefix_fwd) || !BUILT(attn_prefix_bwd)) return;
    enum { T = 11, NH = 4, NKV = 2, HD = 24, N = 23, S = 5, NP = (N + S - 1) / S, PER = S * NKV * HD };
    const float scale = 1.0f / sqrtf((float)HD);
    for (int bf = 0; bf < 2; bf++) {
        ls_dtype dt = bf ? LS_DTYPE_BF16 : LS_DTYPE_F32;
        float *pk = hrand(NP * PER, 1), *pv = hrand(NP * PER, 1);
        void *hk[NP], *hv[NP], *dkp[NP], *dvp[NP];
        make_pages(hk, dkp, pk, N, S, NKV, HD, dt), make_pages(hv, dvp, pv, N, S, NKV, HD, dt);
        ls_kv_prefix hpre = {N, S, dt, hk, hv}, dpre = {N, S, dt, dkp, dvp};
        float *q = hrand(T * NH * HD, 1), *k = hrand(T * NKV * HD, 1), *v = hrand(T * NKV * HD, 1);
        float *o = hrand(T * NH * HD, 1), *lse = hrand(T * NH, 1), *on = malloc(T * NH * HD * sizeof(float));
        float *ln = malloc(T * NH * sizeof(float));
        float *gq = dev(q, T * NH * HD), *gk = dev(k, T * NKV * HD), *gv = dev(v, T * NKV * HD);
        float *go = dev(o, T * NH * HD), *gl = dev(lse, T * NH);
        ls_arena ca, ga;
        ls_arena_init(&ca, "cpu scratch", 1 << 20), ls_arena_init(&ga, "device scratch", 1 << 20);
        ls_arena_set_backend(&ga, G);
        char name[64];
        const char *tag = bf ? "bf16 pages" : "f32 pages";
        /* the floor: the CPU's tiled kernel against its naive double reference, this run */
        ls_attn_naive(on, ln, q, k, v, &hpre, T, NH, NKV, HD, scale);
        int ok = ls_op_attn_fwd(C, o, lse, q, k, v, &hpre, T, NH, NKV, HD, scale, &ca) == LS_OK &&
                 ls_op_attn_fwd(G, go, gl, gq, gk, gv, &dpre, T, NH, NKV, HD, scale, &ga) == LS_OK;
        double floor = host_err(o, on, T * NH * HD), tol = 4 * floor + 1e-6;
        snprintf(name, sizeof name, "attn_fwd o (%s)", tag);
        check(name, ok ? rel_err(go, o, T * NH * HD) : 1, tol);
        snprintf(name, sizeof name, "attn_fwd lse (%s)", tag);
        check(name, ok ? rel_err(gl, lse, T * NH) : 1, 4 * host_err(lse, ln, T * NH) + 1e-6);
        /* backward from the CPU's saved o and lse; prefix gradients into f32 pages */
        G->i->to_device(G, go, o, T * NH * HD * sizeof(float)), G->i->to_device(G, gl, lse, T * NH * sizeof(float));
        float *dout = hrand(T * NH * HD, 1), *dq = hrand(T * NH * HD, 1), *dk = hrand(T * NKV * HD, 1);
        float *dv = hrand(T * NKV * HD, 1), *z = calloc(NP * PER, sizeof(float));
        void *hdk[NP], *hdv[NP], *ddk[NP], *ddv[NP];
        make_pages(hdk, ddk, z, N, S, NKV, HD, LS_DTYPE_F32), make_pages(hdv, ddv, z, N, S, NKV, HD, LS_DTYPE_F32);
        float *gdout = dev(dout, T * NH * HD), *gdq = dev(dq, T * NH * HD), *gdk = dev(dk, T * NKV * HD);
        float *gdv = dev(dv, T * NKV * HD);
        ok = ls_op_attn_bwd(C, dq, dk, dv, hdk, hdv, dout, o, lse, q, k, v, &hpre, T, NH, NKV, HD, scale, &ca) == LS_OK &&
             ls_op_attn_bwd(G, gdq, gdk, gdv, ddk, ddv, gdout, go, gl, gq, gk, gv, &dpre, T, NH, NKV, HD, scale, &ga) ==
                 LS_OK;
        double e = ok ? 0 : 1;
        e = fmax(e, rel_err(gdq, dq, T * NH * HD)), e = fmax(e, rel_err(gdk, dk, T * NKV * HD));
        e = fmax(e, rel_err(gdv, dv, T * NKV * HD));
        for (int p = 0; p < NP; p++) e = fmax(e, rel_err(ddk[p], hdk[p], PER)), e = fmax(e, rel_err(ddv[p], hdv[p], PER));
        snprintf(name, sizeof name, "attn_bwd dq dk dv dprefix (%s)", tag);
        check(name, e, 1e-4);
        ok = ls_op_attn_bwd(C, dq, dk, dv, NULL, NULL, dout, o, lse, q, k, v, &hpre, T, NH, NKV, HD, scale, &ca) == LS_OK &&
             ls_op_attn_bwd(G, gdq, gdk, gdv, NULL, NULL, gdout, go, gl, gq, gk, gv, &dpre, T, NH, NKV, HD, scale, &ga) ==
                 LS_OK;
        e = ok ? fmax(fmax(rel_err(gdq, dq, T * NH * HD), rel_err(gdk, dk, T * NKV * HD)), rel_err(gdv, dv, T * NKV * HD))
               : 1;
        snprintf(name, sizeof name, "attn_bwd without prefix gradients (%s)", tag);
        check(name, e, 1e-4);
        /* the CP partial over the prefix alone, and its backward's share */
        ok = ls_op_attn_prefix_fwd(C, o, lse, q, &hpre, T, NH, NKV, HD, scale, &ca) == LS_OK &&
             ls_op_attn_prefix_fwd(G, go, gl, gq, &dpre, T, NH, NKV, HD, scale, &ga) == LS_OK;
        snprintf(name, sizeof name, "attn_prefix_fwd (%s)", tag);
        check(name, ok ? fmax(rel_err(go, o, T * NH * HD), rel_err(gl, lse, T * NH)) : 1, 1e-5);
        G->i->to_device(G, go, o, T * NH * HD * sizeof(float)), G->i->to_device(G, gl, lse, T * NH * sizeof(float));
        ok = ls_op_attn_prefix_bwd(C, dq, hdk, hdv, dout, o, lse, q, &hpre, T, NH, NKV, HD, scale, &ca) == LS_OK &&
             ls_op_attn_prefix_bwd(G, gdq, ddk, ddv, gdout, go, gl, gq, &dpre, T, NH, NKV, HD, scale, &ga) == LS_OK;
        e = ok ? rel_err(gdq, dq, T * NH * HD) : 1;
        for (int p = 0; p < NP; p++) e = fmax(e, rel_err(ddk[p], hdk[p], PER)), e = fmax(e, rel_err(ddv[p], hdv[p], PER));
        snprintf(name, sizeof name, "attn_prefix_bwd (%s)", tag);
        check(name, e, 1e-4);
        for (int p = 0; p < NP; p++) {
            free(hk[p]), free(hv[p]), free(hdk[p]), free(hdv[p]);
            dfree(dkp[p]), dfree(dvp[p]), dfree(ddk[p]), dfree(ddv[p]);
        }
        ls_arena_free(&ca), ls_arena_free(&ga);
        dfree(gq), dfree(gk), dfree(gv), dfree(go), dfree(gl), dfree(gdout), dfree(gdq), dfree(gdk), dfree(gdv);
        free(pk), free(pv), free(q), free(k), free(v), free(o), free(lse), free(on), free(ln), free(dout), free(dq);
        free(dk), free(dv), free(z);
    }
}

static void t_mla(void) {
    enum { T = 5, H = 3, RKV = 20, DR = 6, DK = RKV + DR, N = 17, S = 5, NP = (N + S - 1) / S, K = 9, NI = 2 };
    const int64_t pos0 = N;
    const float scale = 0.2f;
    int32_t sel[T * K];
    for (int t = 0; t < T; t++) { /* ascending distinct positions of 0 .. pos0 + t, then −1 */
        int c = 0;
        for (int p = t % 3; p <= pos0 + t && c < K - (t % 2) * 2; p += 1 + (p * 7 + t) % 3) sel[t * K + c++] = p;
        for (; c < K; c++) sel[t * K + c] = -1;
    }
    sel[2 * K + 2] = -1; /* a −1 before valid entries */
    int32_t *gsel = dev_bytes(sel, sizeof sel);
    for (int bf = 0; bf < 2; bf++) {
        ls_dtype dt = bf ? LS_DTYPE_BF16 : LS_DTYPE_F32;
        const char *tag = bf ? "bf16" : "f32";
        char name[64];
        float *rows = hrand(NP * S * DK, 1);
        void *hp[NP], *dp[NP];
        make_pages(hp, dp, rows, N, S, 1, DK, dt);
        ls_kv_prefix hpre = {N, S, dt, hp, NULL}, dpre = {N, S, dt, dp, NULL};
        float *q = hrand(T * H * DK, 1), *own = hrand(T * DK, 1), *o = hrand(T * H * RKV, 1), *lse = hrand(T * H, 1);
        float *gq = dev(q, T * H * DK), *gown = dev(own, T * DK), *go = dev(o, T * H * RKV), *gl = dev(lse, T * H);
        if (BUILT(mla_attn_fwd) && BUILT(mla_attn_bwd)) {
            int ok = ls_op_mla_attn_fwd(C, o, lse, q, own, &hpre, sel, K, T, H, RKV, DR, pos0, scale) == LS_OK &&
                     ls_op_mla_attn_fwd(G, go, gl, gq, gown, &dpre, gsel, K, T, H, RKV, DR, pos0, scale) == LS_OK;
            snprintf(name, sizeof name, "mla_attn_fwd (%s)", tag);
            check(name, ok ? fmax(rel_err(go, o, T * H * RKV), rel_err(gl, lse, T * H)) : 1, 1e-5);
            G->i->to_device(G, go, o, T * H * RKV * sizeof(float)), G->i->to_device(G, gl, lse, T * H * sizeof(float));
            float *dout = hrand(T * H * RKV, 1), *dq = hrand(T * H * DK, 1), *down = hrand(T * DK, 1);
            float *z = calloc(NP * S * DK, sizeof(float));
            void *hd[NP], *dd[NP];
            make_pages(hd, dd, z, N, S, 1, DK, LS_DTYPE_F32);
            float *gdout = dev(dout, T * H * RKV), *gdq = dev(dq, T * H * DK), *gdown = dev(down, T * DK);
            ok = ls_op_mla_attn_bwd(C, dq, down, hd, dout, o, lse, q, own, &hpre, sel, K, T, H, RKV, DR, pos0, scale) ==
                     LS_OK &&
                 ls_op_mla_attn_bwd(G, gdq, gdown, dd, gdout, go, gl, gq, gown, &dpre, gsel, K, T, H, RKV, DR, pos0,
                                    scale) == LS_OK;
            double e = ok ? fmax(rel_err(gdq, dq, T * H * DK), rel_err(gdown, down, T * DK)) : 1;
            for (int p = 0; p < NP; p++) e = fmax(e, rel_err(dd[p], hd[p], S * DK));
            snprintf(name, sizeof name, "mla_attn_bwd dq down dprefix (%s)", tag);
            check(name, e, 1e-5);
            for (int p = 0; p < NP; p++) free(hd[p]), dfree(dd[p]);
            dfree(gdout), dfree(gdq), dfree(gdown), free(dout), free(dq), free(down), free(z);
        }
        if (BUILT(mla_attn_probs)) {
            float *P = hrand(T * K, 1), *gP = dev(P, T * K);
            ls_op_mla_attn_probs(C, P, q, lse, own, &hpre, sel, K, T, H, RKV, DR, pos0, scale);
            ls_op_mla_attn_probs(G, gP, gq, gl, gown, &dpre, gsel, K, T, H, RKV, DR, pos0, scale);
            snprintf(name, sizeof name, "mla_attn_probs (%s)", tag);
            check(name, rel_err(gP, P, T * K), 1e-5);
            dfree(gP), free(P);
        }
        if (BUILT(dsa_sel_scores) && BUILT(dsa_sel_scores_bwd)) { /* the rows as index keys of DK values */
            float *qi = hrand(T * NI * DK, 1), *w = hrand(T * NI, 1), *sc = hrand(T * K, 1), *dS = hrand(T * K, 1);
            float *dqi = hrand(T * NI * DK, 1), *dw = hrand(T * NI, 1), *down = hrand(T * DK, 1);
            float *gqi = dev(qi, T * NI * DK), *gw = dev(w, T * NI), *gsc = dev(sc, T * K), *gdS = dev(dS, T * K);
            float *gdqi = dev(dqi, T * NI * DK), *gdw = dev(dw, T * NI), *gdown = dev(down, T * DK);
            ls_op_dsa_sel_scores(C, sc, qi, w, &hpre, own, sel, K, T, NI, DK, pos0, scale);
            ls_op_dsa_sel_scores(G, gsc, gqi, gw, &dpre, gown, gsel, K, T, NI, DK, pos0, scale);
            float *hs = malloc(T * K * sizeof(float));
            G->i->to_host(G, hs, gsc, T * K * sizeof(float));
            double e = 0, big = 0;
            for (int i = 0; i < T * K; i++) {
                if (sel[i] < 0) {
                    e = fmax(e, hs[i] == -INFINITY && sc[i] == -INFINITY ? 0 : 1);
                    continue;
                }
                double d = fabs((double)hs[i] - sc[i]);
                if (!(d <= e)) e = d;
                big = fmax(big, fabs(sc[i]));
            }
            snprintf(name, sizeof name, "dsa_sel_scores (%s)", tag);
            check(name, e / (big > 0 ? big : 1), 1e-5);
            ls_op_dsa_sel_scores_bwd(C, dqi, dw, down, dS, qi, w, &hpre, own, sel, K, T, NI, DK, pos0, scale);
            ls_op_dsa_sel_scores_bwd(G, gdqi, gdw, gdown, gdS, gqi, gw, &dpre, gown, gsel, K, T, NI, DK, pos0, scale);
            snprintf(name, sizeof name, "dsa_sel_scores_bwd (%s)", tag);
            check(name, fmax(fmax(rel_err(gdqi, dqi, T * NI * DK), rel_err(gdw, dw, T * NI)), rel_err(gdown, down, T * DK)),
                  1e-5);
            if (BUILT(dsa_scores) && BUILT(dsa_topk)) {
                int64_t n = pos0 + T;
                float *all = hrand(T * n, 1), *gall = dev(all, T * n);
                ls_kv_prefix hk = {N, S, dt, hp, NULL}, dk2 = {N, S, dt, dp, NULL};
                ls_arena ca, ga;
                ls_arena_init(&ca, "cpu scratch", 1 << 16), ls_arena_init(&ga, "device scratch", 1 << 16);
                ls_arena_set_backend(&ga, G);
                int ok = ls_op_dsa_scores(C, all, qi, w, &hk, T, NI, DK, scale, &ca) == LS_OK &&
                         ls_op_dsa_scores(G, gall, gqi, gw, &dk2, T, NI, DK, scale, &ga) == LS_OK;
                snprintf(name, sizeof name, "dsa_scores (%s)", tag);
                check(name, ok ? rel_err(gall, all, T * n) : 1, 1e-5);
                /* top-k from the same scores, with ties: every fourth score equal */
                for (int64_t i = 0; i < T * n; i += 4) all[i] = 0.25f;
                for (int64_t i = 1; i < T * n; i += 9) all[i] = i % 2 ? -0.0f : 0.0f; /* signed zeros tie */
                G->i->to_device(G, gall, all, (size_t)(T * n) * sizeof(float));
                int32_t ts[T * 6];
                int64_t cnt[T];
                int32_t *gts = dev_bytes(NULL, sizeof ts);
                int64_t *gcnt = dev_bytes(NULL, sizeof cnt);
                ok = ls_op_dsa_topk(C, ts, cnt, all, T, n, pos0, 6, &ca) == LS_OK &&
                     ls_op_dsa_topk(G, gts, gcnt, gall, T, n, pos0, 6, &ga) == LS_OK;
                snprintf(name, sizeof name, "dsa_topk (%s run)", tag);
                check(name, ok ? same_bytes(gts, ts, sizeof ts) + same_bytes(gcnt, cnt, sizeof cnt) : 1, 0);
                ls_arena_free(&ca), ls_arena_free(&ga);
                dfree(gall), dfree(gts), dfree(gcnt), free(all);
            }
            dfree(gqi), dfree(gw), dfree(gsc), dfree(gdS), dfree(gdqi), dfree(gdw), dfree(gdown);
            free(qi), free(w), free(sc), free(dS), free(dqi), free(dw), free(down), free(hs);
        }
        for (int p = 0; p < NP; p++) free(hp[p]), dfree(dp[p]);
        dfree(gq), dfree(gown), dfree(go), dfree(gl), free(rows), free(q), free(own), free(o), free(lse);
    }
    dfree(gsel);
}

static void t_optim(void) {
    enum { N = 100003 };
    if (BUILT(sumsq)) {
        float *x = hrand(N, 3), *gx = dev(x, N);
        double a = 0, b = 0;
        ls_op_sumsq(C, &a, x, N), ls_op_sumsq(G, &b, gx, N);
        check("sumsq", fabs(a - b) / a, 1e-12);
        dfree(gx), free(x);
    }
    if (BUILT(adamw_step) && BUILT(adamw_check)) {
        float *w = hrand(N, 1), *g = hrand(N, 0.1f), *m = hrand(N, 0.01f), *v = hrand(N, 1e-4f);
        for (int i = 0; i < N; i++) v[i] = fabsf(v[i]);
        float *gw = dev(w, N), *gg = dev(g, N), *gm = dev(m, N), *gv = dev(v, N);
        ls_adamw_hp hp = {0.7, 1 - pow(0.9, 3), 1 - pow(0.999, 3), 1e-3, 1e-8, 0.9f, 0.999f};
        int64_t bc = 7, bg = 7;
        float ac[3], ag[3];
        ls_op_adamw_check(C, &bc, ac, &hp, 0.9999f, w, g, m, v, N);
        ls_op_adamw_check(G, &bg, ag, &hp, 0.9999f, gw, gg, gm, gv, N);
        check("adamw_check (finite)", bc == -1 && bg == -1 ? 0 : 1, 0);
        ls_op_adamw_step(C, &hp, 0.9999f, w, g, m, v, N), ls_op_adamw_step(G, &hp, 0.9999f, gw, gg, gm, gv, N);
        check("adamw_step w", rel_err(gw, w, N), 1e-6);
        check("adamw_step m", rel_err(gm, m, N), 1e-6);
        check("adamw_step v", rel_err(gv, v, N), 1e-6);
        g[77777] = 1e30f, g[4321] = -1e30f;
        G->i->to_device(G, gg, g, N * sizeof(float));
        ls_op_adamw_check(C, &bc, ac, &hp, 1.0f, w, g, m, v, N);
        ls_op_adamw_check(G, &bg, ag, &hp, 1.0f, gw, gg, gm, gv, N);
        check("adamw_check (overflow)", bc == 4321 && bg == 4321 ? 0 : 1, 0);
        dfree(gw), dfree(gg), dfree(gm), dfree(gv), free(w), free(g), free(m), free(v);
    }
}

int main(int argc, char **argv) {
    int device = 0, a = 1, self = 0;
    if (a + 1 < argc && !strcmp(argv[a], "--device")) device = atoi(argv[a + 1]), a += 2;
    if (a < argc && !strcmp(argv[a], "--self-check")) self = 1, a++;
    char missing[4096];
    if (self) { /* the harness itself, the CPU backend in the device's place: every op agrees exactly */
        G = C = ls_backend_cpu();
        goto run;
    }
    if (!ls_backend_cuda_built()) {
        printf("SKIP: this build has no CUDA backend (configure with -DLS_CUDA=ON)\n");
        return 77;
    }
    if (ls_backend_cuda_open(device, &G) != LS_OK) {
        ls_backend table_only = {ls_backend_cuda_table(), "none", NULL, 0};
        int nm = ls_backend_missing(&table_only, missing, sizeof missing);
        printf("SKIP: %s (the backend builds %d of %d ops%s%s)\n", ls_err_msg(), LS_BACKEND_N_OPS - nm,
               LS_BACKEND_N_OPS, nm ? "; not yet: " : "", missing);
        return 77;
    }
    C = ls_backend_cpu();
run:;
    struct { const char *name; void (*fn)(void); } tests[] = {
        {"products", t_products}, {"elementwise", t_elementwise}, {"embed", t_embed}, {"rms", t_rms_all},
        {"layernorm", t_layernorm}, {"rope", t_rope}, {"moe", t_moe_merge}, {"conv", t_conv}, {"lmhead", t_lmhead},
        {"gdn_prep", t_gdn_prep}, {"gdr", t_gdr}, {"routing", t_routing},
        {"attention", t_attention}, {"mla", t_mla}, {"optim", t_optim}};
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        int run = a >= argc;
        for (int j = a; j < argc; j++) run |= !strcmp(argv[j], tests[i].name);
        if (run) tests[i].fn();
    }
    int nm = ls_backend_missing(G, missing, sizeof missing);
    printf("{\"device\": \"%s\", \"checked\": %d, \"failed\": [%s], \"missing_count\": %d, \"missing\": \"%s\"}\n",
           G->device, n_checked, failed, nm, missing);
    if (!self) ls_backend_cuda_close(G);
    return n_failed ? 1 : n_checked ? 0 : 77;
}
