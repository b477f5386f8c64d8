/*
 * test_lora.c — LoRA adapters (src/models/lora.c) on the committed fixtures:
 *  (1) merge: ls_lora_merge + ls_hybrid_export equals, tensor by tensor, the base HF tensor
 *      + (alpha/r)·B·A computed here in HF layout (double), for the committed PEFT adapter
 *      (next_dense: fused in_proj_qkvz, q_proj [q|gate]) and for new adapters with random B
 *      on every target of next_moe (in_proj_ba, per-expert, router, shared gate, lm_head),
 *      q35_moe (split GDN, fused experts) and q35_dense (sharded);
 *  (2) backward vs central finite differences of S(A, B) = Σ merged ⊙ dW (bilinear, so the
 *      differences are exact up to rounding), and += accumulation;
 *  (3) ls_lora_new: module count, PEFT init, B = 0 (merge = base bit for bit), errors;
 *  (4) export → load round trip under PEFT names, gradient export, load errors.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_family.h"
#include "longstraw/lora.h"
#include "longstraw/hybrid.h"
#include "longstraw/safetensors.h"
#include "testutil.h"

int test_lora_merge_and_grad(void);
int test_lora_grad_subset(void);
int test_lora_side_branch_fd(void);

#define FIX LS_SOURCE_DIR "/tests/reference/fixtures"
#define PEFT "base_model.model."

/* Read any supported tensor into a malloc'd double buffer. */
static double *read_d(const ls_st_tensor *t) {
    float *f = malloc((size_t)(t->numel > 0 ? t->numel : 1) * sizeof(float));
    double *d = malloc((size_t)(t->numel > 0 ? t->numel : 1) * sizeof(double));
    if (!f || !d || ls_st_read_f32(t, f, t->numel, t->name) != LS_OK) {
        free(f);
        free(d);
        return NULL;
    }
    for (int64_t i = 0; i < t->numel; i++) d[i] = f[i];
    free(f);
    return d;
}

/* ls_hybrid_export(merge(L, m)) vs base + (alpha/r)·B·A from `adapter` (PEFT file), in HF
 * layout and double. Adapted tensors: rel err <= 1e-6 and visibly moved; others: exact. */
static int check_merge_hf(const char *label, const char *dir, const ls_hybrid_model *m, const ls_lora *L,
                          double alpha, const char *adapter, const char *tmp, ls_arena *work) {
    char merged[700];
    snprintf(merged, sizeof merged, "%s/merged.safetensors", tmp);
    ls_arena_mark mk = ls_arena_get_mark(work);
    ls_hybrid_model eff;
    T_OK(ls_hybrid_alloc_like(m, &eff, work));
    ls_lora_merge(L, m, &eff);
    T_OK(ls_hybrid_export(&eff, LS_ST_FILE(merged), LS_DTYPE_F32, NULL, NULL));
    ls_arena_release(work, mk);
    ls_st_model base;
    ls_st_file out, ad;
    T_OK(ls_st_model_open(&base, dir));
    T_OK(ls_st_open(&out, merged));
    T_OK(ls_st_open(&ad, adapter));
    int64_t adapted = 0, plain = 0;
    double worst = 0;
    for (int64_t i = 0; i < ls_st_count(&out); i++) {
        const ls_st_tensor *to = ls_st_at(&out, i), *tb = ls_st_model_find(&base, to->name);
        T_CHECK(tb && tb->numel == to->numel, "%s: %s missing or resized", label, to->name);
        double *want = read_d(tb), *got = read_d(to);
        T_CHECK(want && got, "%s: reading %s", label, to->name);
        char an[400], bn[400];
        size_t len = strlen(to->name);
        const ls_st_tensor *ta = NULL, *tB = NULL;
        if (len > 7 && strcmp(to->name + len - 7, ".weight") == 0) {
            snprintf(an, sizeof an, PEFT "%.*s.lora_A.weight", (int)(len - 7), to->name);
            snprintf(bn, sizeof bn, PEFT "%.*s.lora_B.weight", (int)(len - 7), to->name);
            ta = ls_st_find(&ad, an);
            tB = ls_st_find(&ad, bn);
        }
        if (ta) { /* base + (alpha/r)·B·A, HF row order */
            T_CHECK(tB && to->ndim == 2 && ta->ndim == 2 && tB->ndim == 2, "%s: %s adapter shapes", label, an);
            int64_t out_d = to->shape[0], in_d = to->shape[1], r = ta->shape[0];
            T_CHECK(ta->shape[1] == in_d && tB->shape[0] == out_d && tB->shape[1] == r, "%s: %s shape", label, an);
            double *A = read_d(ta), *B = read_d(tB), s = alpha / (double)r;
            T_CHECK(A && B, "reading adapter");
            double moved = 0, nb = 0;
            for (int64_t j = 0; j < out_d; j++)
                for (int64_t c = 0; c < in_d; c++) {
                    double acc = 0;
                    for (int64_t k = 0; k < r; k++) acc += B[j * r + k] * A[k * in_d + c];
                    moved += (s * acc) * (s * acc);
                    nb += want[j * in_d + c] * want[j * in_d + c];
                    want[j * in_d + c] += s * acc;
                }
            float *gf = malloc((size_t)to->numel * sizeof(float));
            T_CHECK(gf != NULL, "malloc");
            for (int64_t e = 0; e < to->numel; e++) gf[e] = (float)got[e];
            double err = t_rel_err_fd(gf, want, to->numel);
            free(gf);
            if (!(err <= worst)) worst = err;
            T_CHECK(err <= 1e-6, "%s: merged %s rel err %.3e > 1e-6", label, to->name, err);
            T_CHECK(moved > 1e-6 * nb, "%s: the adapter on %s does not move it (|delta|^2 %.3e)", label, to->name, moved);
            free(A);
            free(B);
            adapted++;
        } else {
            for (int64_t e = 0; e < to->numel; e++)
                T_CHECK(got[e] == want[e], "%s: unadapted %s[%lld] changed: %.9g vs %.9g", label, to->name,
                        (long long)e, got[e], want[e]);
            plain++;
        }
        free(want);
        free(got);
    }
    printf("  %-10s merge vs HF base + s*B*A: %lld adapted tensors (worst rel err %.2e), %lld unchanged\n", label,
           (long long)adapted, worst, (long long)plain);
    T_CHECK(adapted == ls_lora_count(L) && adapted > 0, "%s: %lld adapted tensors in the export, %lld modules", label,
            (long long)adapted, (long long)ls_lora_count(L));
    T_CHECK(ls_st_count(&ad) == 2 * adapted, "%s: adapter file has %lld tensors for %lld modules", label,
            (long long)ls_st_count(&ad), (long long)adapted);
    T_CHECK(plain > 0, "%s: nothing unadapted compared", label);
    ls_st_close(&ad);
    ls_st_close(&out);
    ls_st_model_close(&base);
    return 0;
}

/* S = Σ merge(L, zero base) ⊙ dW, in double. A zero base keeps the merged values exactly the
 * delta, so the float rounding of base + delta does not swamp the differences. */
static double lora_S(const ls_lora *L, const ls_hybrid_model *zero, ls_hybrid_model *eff, const ls_param *pe,
                     const ls_param *pd, int64_t np) {
    ls_lora_merge(L, zero, eff);
    double s = 0;
    for (int64_t i = 0; i < np; i++)
        for (int64_t e = 0; e < pe[i].n; e++) s += (double)pe[i].p[e] * (double)pd[i].p[e];
    return s;
}

/* ls_lora_backward vs central differences of S on 4 coordinates of every A and B. */
static int check_grad_fd(const char *label, const ls_hybrid_model *m, ls_lora *L, ls_arena *work, uint64_t seed) {
    ls_arena_mark mk = ls_arena_get_mark(work);
    ls_hybrid_model zero, eff, dW;
    T_OK(ls_hybrid_alloc_like(m, &zero, work));
    T_OK(ls_hybrid_alloc_like(m, &eff, work));
    T_OK(ls_hybrid_alloc_like(m, &dW, work));
    ls_param *pe, *pd, *w, *g;
    int64_t np, nl;
    T_OK(ls_hybrid_params(&eff, &pe, &np));
    T_OK(ls_hybrid_params(&dW, &pd, &np));
    ls_rng rng;
    ls_rng_seed(&rng, seed);
    for (int64_t i = 0; i < np; i++) t_fill_normal(pd[i].p, pd[i].n, &rng, 1.0f);
    T_OK(ls_lora_params(L, &w, &g, &nl));
    T_CHECK(nl == 2 * ls_lora_count(L), "%s: %lld params", label, (long long)nl);
    ls_lora_zero_grad(L);
    ls_lora_backward(L, &dW);
    /* += : a second call doubles every gradient */
    int64_t tot = 0;
    for (int64_t i = 0; i < nl; i++) tot += g[i].n;
    float *g1 = malloc((size_t)tot * sizeof(float));
    T_CHECK(g1 != NULL, "malloc");
    for (int64_t i = 0, o = 0; i < nl; o += g[i].n, i++) {
        T_CHECK(t_all_finite_f(g[i].p, g[i].n), "%s: non-finite gradient %s", label, g[i].what);
        memcpy(g1 + o, g[i].p, (size_t)g[i].n * sizeof(float));
    }
    ls_lora_backward(L, &dW);
    for (int64_t i = 0, o = 0; i < nl; o += g[i].n, i++) {
        double d = 0, n2 = 0; /* segments sum in another order the second time: not bit for bit */
        for (int64_t e = 0; e < g[i].n; e++) {
            double x = 2.0 * g1[o + e];
            d += (g[i].p[e] - x) * (g[i].p[e] - x);
            n2 += x * x;
        }
        T_CHECK(sqrt(d) <= 1e-6 * sqrt(n2) && n2 > 0, "%s: %s not accumulated (+=): rel diff %.3e", label, g[i].what,
                sqrt(d / n2));
    }
    int64_t checked = 0;
    double worst = 0;
    const float h = 0.25f; /* S is linear in each coordinate: any h is exact up to rounding */
    for (int64_t i = 0; i < nl; i++) {
        int64_t off = 0; /* of tensor i in g1 */
        for (int64_t j = 0; j < i; j++) off += g[j].n;
        double rms = 0;
        for (int64_t e = 0; e < g[i].n; e++) rms += (double)g1[off + e] * g1[off + e];
        rms = sqrt(rms / (double)g[i].n);
        T_CHECK(rms > 0, "%s: gradient of %s is all zero", label, g[i].what);
        int64_t idx[4] = {0, g[i].n - 1, (int64_t)(ls_rng_uniform(&rng) * (double)g[i].n),
                          (int64_t)(ls_rng_uniform(&rng) * (double)g[i].n)};
        for (int q = 0; q < 4; q++) {
            int64_t e = idx[q] < g[i].n ? idx[q] : g[i].n - 1;
            float keep = w[i].p[e];
            w[i].p[e] = keep + h;
            double sp = lora_S(L, &zero, &eff, pe, pd, np);
            w[i].p[e] = keep - h;
            double sm = lora_S(L, &zero, &eff, pe, pd, np);
            w[i].p[e] = keep;
            double fd = (sp - sm) / (2.0 * (double)h), an = g1[off + e];
            double err = fabs(an - fd) / fmax(fabs(fd), rms);
            if (!(err <= worst)) worst = err;
            T_CHECK(err <= 1e-4, "%s: d/d %s[%lld]: backward %.9g, finite differences %.9g (rel %.2e)", label,
                    g[i].what, (long long)e, an, fd, err);
            checked++;
        }
    }
    printf("  %-10s backward vs finite differences: %lld coordinates in %lld tensors, worst rel err %.2e\n", label,
           (long long)checked, (long long)nl, worst);
    T_CHECK(checked > 0, "nothing checked");
    ls_lora_zero_grad(L);
    for (int64_t i = 0; i < nl; i++)
        for (int64_t e = 0; e < g[i].n; e++) T_CHECK(g[i].p[e] == 0.0f, "%s: zero_grad left %s", label, g[i].what);
    free(g1);
    free(pe);
    free(pd);
    free(w);
    free(g);
    ls_arena_release(work, mk);
    return 0;
}

/* Fill every B with N(0, 0.1) so merges move the weights. */
static int randomize_B(ls_lora *L, uint64_t seed) {
    ls_param *w;
    int64_t n;
    T_OK(ls_lora_params(L, &w, NULL, &n));
    ls_rng rng;
    ls_rng_seed(&rng, seed);
    for (int64_t i = 1; i < n; i += 2) t_fill_normal(w[i].p, w[i].n, &rng, 0.1f);
    free(w);
    return 0;
}

/* Expected module count of ls_lora_new for a set of leaf names, from the config. */
static int64_t expect_count(const ls_hybrid_model *m, int q, int qkv, int gate_proj, int down) {
    const ls_config *c = &m->cfg;
    int64_t n = 0;
    for (int l = 0; l < c->n_layers; l++) {
        n += c->kind[l] == LS_LAYER_ATTN ? q : (!m->fused_gdn ? qkv : 0);
        int64_t mlps = !c->moe[l] ? 1 : (c->shared_inter > 0) + (m->fused_experts ? 0 : c->n_experts);
        n += mlps * (gate_proj + down);
    }
    return n;
}

static int expect_error(ls_status s, const char *must_contain, const char *what) {
    T_CHECK(s != LS_OK, "%s: accepted", what);
    T_CHECK(strstr(ls_err_msg(), must_contain) != NULL, "%s: message \"%s\" does not name \"%s\"", what, ls_err_msg(),
            must_contain);
    return 0;
}

/* A small PEFT file with the given A/B shapes (zeros); B omitted when b0 < 0. */
static int write_adapter(const char *path, const char *mod, int64_t a0, int64_t a1, int64_t b0, int64_t b1) {
    static float zeros[4096];
    ls_st_writer w;
    ls_st_writer_init(&w);
    char n[300];
    int64_t sa[2] = {a0, a1}, sb[2] = {b0, b1};
    T_CHECK(a0 * a1 <= 4096 && b0 * b1 <= 4096, "write_adapter: too big");
    snprintf(n, sizeof n, "%s.lora_A.weight", mod);
    T_OK(ls_st_writer_add_f32(&w, n, LS_DTYPE_F32, 2, sa, zeros));
    if (b0 >= 0) {
        snprintf(n, sizeof n, "%s.lora_B.weight", mod);
        T_OK(ls_st_writer_add_f32(&w, n, LS_DTYPE_F32, 2, sb, zeros));
    }
    T_OK(ls_st_write(&w, path));
    ls_st_writer_free(&w);
    return 0;
}

int test_lora_merge_and_grad(void) {
    char tmp[512], path[700], dir[700];
    T_CHECK(t_make_tmpdir(tmp, sizeof tmp) == 0, "tmpdir");
    ls_arenas ar;
    ls_arenas_init(&ar);
    ls_arena *fixed = &ar.a[LS_ARENA_FIXED], *grad = &ar.a[LS_ARENA_GRAD], *work = &ar.a[LS_ARENA_SCRATCH];

    /* (1)+(2) the committed adapter on next_dense (alpha 4, rank 2, 16 modules) */
    ls_hybrid_model nd;
    T_OK(ls_hybrid_load(&nd, FIX "/next_dense", fixed));
    T_CHECK(nd.fused_gdn, "next_dense should be the fused Qwen3-Next layout");
    ls_lora *L;
    T_OK(ls_lora_load(&L, &nd, FIX "/next_dense/adapter.safetensors", 4.0, fixed, grad));
    T_CHECK(ls_lora_count(L) == 16, "next_dense adapter: %lld modules, expected 16", (long long)ls_lora_count(L));
    T_CHECK(ls_lora_alpha(L) == 4.0, "alpha %g", ls_lora_alpha(L));
    if (check_merge_hf("next_dense", FIX "/next_dense", &nd, L, 4.0, FIX "/next_dense/adapter.safetensors", tmp, work))
        return 1;
    if (check_grad_fd("next_dense", &nd, L, work, 11)) return 1;

    /* (3) new adapters on the split layout (q35_dense, sharded) */
    ls_hybrid_model qd;
    T_OK(ls_hybrid_load(&qd, FIX "/q35_dense", fixed));
    T_CHECK(!qd.fused_gdn, "q35_dense should be split");
    ls_lora *N;
    T_OK(ls_lora_new(&N, &qd, "q_proj,in_proj_qkv,gate_proj,down_proj", 3, 8.0, 5, fixed, grad));
    int64_t want = expect_count(&qd, 1, 1, 1, 1);
    T_CHECK(ls_lora_count(N) == want && want == 12, "q35_dense: %lld modules, expected %lld (12)",
            (long long)ls_lora_count(N), (long long)want);
    {
        ls_param *w, *g;
        int64_t n;
        T_OK(ls_lora_params(N, &w, &g, &n));
        T_CHECK(n == 2 * want, "params %lld", (long long)n);
        for (int64_t i = 0; i < n; i++) {
            T_CHECK(w[i].no_decay == 0 && w[i].n == g[i].n && strcmp(w[i].what, g[i].what) == 0 &&
                        strncmp(w[i].what, PEFT, strlen(PEFT)) == 0,
                    "param lists disagree at %lld (%s)", (long long)i, w[i].what);
            for (int64_t e = 0; e < w[i].n; e++) T_CHECK(g[i].p[e] == 0, "%s: grad not zeroed", w[i].what);
            if (i % 2 == 1) { /* B = 0 */
                for (int64_t e = 0; e < w[i].n; e++) T_CHECK(w[i].p[e] == 0.0f, "%s: B not zero", w[i].what);
                T_CHECK(w[i].n % 3 == 0, "%s: rank", w[i].what);
            } else { /* A ~ U(−1/sqrt(in), 1/sqrt(in)), in = n/r */
                double bound = 1.0 / sqrt((double)(w[i].n / 3)), amax = 0;
                for (int64_t e = 0; e < w[i].n; e++) amax = fmax(amax, fabs((double)w[i].p[e]));
                T_CHECK(amax <= bound && amax > 0.5 * bound, "%s: max |A| %.4g, bound %.4g", w[i].what, amax, bound);
            }
        }
        free(w);
        free(g);
    }
    { /* B = 0: merge reproduces the base bit for bit */
        ls_arena_mark mk = ls_arena_get_mark(work);
        ls_hybrid_model eff;
        T_OK(ls_hybrid_alloc_like(&qd, &eff, work));
        ls_lora_merge(N, &qd, &eff);
        ls_param *pa, *pb;
        int64_t na, nb;
        T_OK(ls_hybrid_params(&qd, &pa, &na));
        T_OK(ls_hybrid_params(&eff, &pb, &nb));
        T_CHECK(na == nb && na > 0, "param counts");
        for (int64_t i = 0; i < na; i++)
            T_CHECK(memcmp(pa[i].p, pb[i].p, (size_t)pa[i].n * sizeof(float)) == 0, "B = 0 merge changed %s",
                    pa[i].what);
        free(pa);
        free(pb);
        ls_arena_release(work, mk);
    }
    { /* errors: unknown target (named), embed_tokens, empty item, rank 0; arenas left as they were */
        size_t cf = fixed->cur, cg = grad->cur;
        ls_lora *E = NULL;
        if (expect_error(ls_lora_new(&E, &qd, "q_proj,foo_proj", 2, 1.0, 1, fixed, grad), "foo_proj", "unknown target"))
            return 1;
        if (expect_error(ls_lora_new(&E, &qd, "embed_tokens", 2, 1.0, 1, fixed, grad), "embed_tokens", "embed"))
            return 1;
        if (expect_error(ls_lora_new(&E, &qd, "q_proj,,v_proj", 2, 1.0, 1, fixed, grad), "empty", "empty item"))
            return 1;
        if (expect_error(ls_lora_new(&E, &qd, "q_proj", 0, 1.0, 1, fixed, grad), "rank", "rank 0")) return 1;
        /* in_proj_qkvz exists only in the fused layout */
        if (expect_error(ls_lora_new(&E, &qd, "in_proj_qkvz", 2, 1.0, 1, fixed, grad), "in_proj_qkvz", "fused name"))
            return 1;
        T_CHECK(E == NULL && fixed->cur == cf && grad->cur == cg, "failed ls_lora_new kept memory");
    }
    if (randomize_B(N, 21)) return 1;
    snprintf(path, sizeof path, "%s/q35_dense_adapter.safetensors", tmp);
    T_OK(ls_lora_export(N, 0, LS_ST_FILE(path), NULL, NULL));
    if (check_merge_hf("q35_dense", FIX "/q35_dense", &qd, N, 8.0, path, tmp, work)) return 1;

    /* every target kind: next_moe (fused GDN, per-expert), q35_moe (split GDN, fused experts) */
    static const char *moe_names[2] = {"next_moe", "q35_moe"};
    static const char *moe_targets[2] = {
        "in_proj_qkvz,in_proj_ba,out_proj,q_proj,k_proj,v_proj,o_proj,gate,gate_proj,up_proj,down_proj,"
        "shared_expert_gate",
        "in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj, q_proj, k_proj, v_proj, o_proj, gate, gate_proj, "
        "up_proj, down_proj, shared_expert_gate"};
    for (int f = 0; f < 2; f++) {
        snprintf(dir, sizeof dir, "%s/%s", FIX, moe_names[f]);
        ls_hybrid_model mm;
        T_OK(ls_hybrid_load(&mm, dir, fixed));
        char targets[400]; /* lm_head only when untied (tied, it is embed_tokens) */
        snprintf(targets, sizeof targets, "%s%s", moe_targets[f], mm.cfg.tie_embeddings ? "" : ",lm_head");
        ls_lora *M;
        T_OK(ls_lora_new(&M, &mm, targets, 2 + f, 3.0, 7 + (uint64_t)f, fixed, grad));
        if (mm.cfg.tie_embeddings && /* the tied head is no separate weight */
            expect_error(ls_lora_new(&(ls_lora *){NULL}, &mm, "lm_head", 2, 1.0, 1, fixed, grad), "lm_head", "tied"))
            return 1;
        const ls_config *c = &mm.cfg;
        int64_t exp_n = !c->tie_embeddings;
        for (int l = 0; l < c->n_layers; l++) {
            exp_n += c->kind[l] == LS_LAYER_ATTN ? 4 : (mm.fused_gdn ? 3 : 5);
            exp_n += c->moe[l] ? 1 + (mm.fused_experts ? 0 : 3 * c->n_experts) + (c->shared_inter > 0 ? 4 : 0) : 3;
        }
        T_CHECK(mm.fused_gdn == (f == 0) && mm.fused_experts == (f == 1), "%s: unexpected layout", moe_names[f]);
        T_CHECK(ls_lora_count(M) == exp_n, "%s: %lld modules, expected %lld", moe_names[f],
                (long long)ls_lora_count(M), (long long)exp_n);
        if (randomize_B(M, 31 + (uint64_t)f)) return 1;
        snprintf(path, sizeof path, "%s/%s_adapter.safetensors", tmp, moe_names[f]);
        T_OK(ls_lora_export(M, 0, LS_ST_FILE(path), "note", "round trip"));
        if (check_merge_hf(moe_names[f], dir, &mm, M, 3.0, path, tmp, work)) return 1;
        if (check_grad_fd(moe_names[f], &mm, M, work, 41 + (uint64_t)f)) return 1;

        /* (4) export → load: same modules, names, values, merge; gradients export */
        ls_lora *R;
        T_OK(ls_lora_load(&R, &mm, path, 3.0, fixed, grad));
        T_CHECK(ls_lora_count(R) == ls_lora_count(M), "%s: reloaded %lld of %lld modules", moe_names[f],
                (long long)ls_lora_count(R), (long long)ls_lora_count(M));
        ls_param *wm, *wr, *gm;
        int64_t nm, nr;
        T_OK(ls_lora_params(M, &wm, &gm, &nm));
        T_OK(ls_lora_params(R, &wr, NULL, &nr));
        T_CHECK(nm == nr, "param counts");
        for (int64_t i = 0; i < nm; i++) {
            int64_t j = 0;
            while (j < nr && strcmp(wr[j].what, wm[i].what) != 0) j++;
            T_CHECK(j < nr, "%s: %s not reloaded", moe_names[f], wm[i].what);
            T_CHECK(wr[j].n == wm[i].n && memcmp(wr[j].p, wm[i].p, (size_t)wm[i].n * sizeof(float)) == 0,
                    "%s: %s differs after the round trip", moe_names[f], wm[i].what);
        }
        ls_st_file sf;
        T_OK(ls_st_open(&sf, path));
        T_CHECK(ls_st_meta_get(&sf, "note") && strcmp(ls_st_meta_get(&sf, "note"), "round trip") == 0 &&
                    ls_st_meta_get(&sf, "format") && strcmp(ls_st_meta_get(&sf, "format"), "pt") == 0,
                "%s: metadata", moe_names[f]);
        ls_st_close(&sf);
        { /* gradients: fill with a pattern, export, read back */
            for (int64_t i = 0; i < nm; i++)
                for (int64_t e = 0; e < gm[i].n; e++) gm[i].p[e] = (float)(i + 1) * 0.5f + (float)e;
            snprintf(path, sizeof path, "%s/%s_grads.safetensors", tmp, moe_names[f]);
            T_OK(ls_lora_export(M, 1, LS_ST_FILE(path), NULL, NULL));
            T_OK(ls_st_open(&sf, path));
            T_CHECK(ls_st_count(&sf) == nm, "grad file has %lld tensors", (long long)ls_st_count(&sf));
            for (int64_t i = 0; i < nm; i++) {
                const ls_st_tensor *t = ls_st_find(&sf, gm[i].what);
                T_CHECK(t && t->st_dtype == LS_ST_F32 && t->numel == gm[i].n &&
                            memcmp(t->data, gm[i].p, (size_t)gm[i].n * sizeof(float)) == 0,
                        "%s: exported gradient %s", moe_names[f], gm[i].what);
            }
            ls_st_close(&sf);
            ls_lora_zero_grad(M);
        }
        free(wm);
        free(wr);
        free(gm);
    }

    /* load errors name the tensor; a failed load leaves the arenas as they were */
    {
        size_t cf = fixed->cur, cg = grad->cur;
        ls_lora *E = NULL;
        snprintf(path, sizeof path, "%s/bad.safetensors", tmp);
        /* layer 0 of next_dense is a GDN layer: no q_proj */
        if (write_adapter(path, PEFT "model.layers.0.self_attn.q_proj", 2, 32, 128, 2)) return 1;
        if (expect_error(ls_lora_load(&E, &nd, path, 4.0, fixed, grad), "model.layers.0.self_attn.q_proj", "absent"))
            return 1;
        if (write_adapter(path, PEFT "model.layers.1.self_attn.q_proj", 2, 31, 128, 2)) return 1;
        if (expect_error(ls_lora_load(&E, &nd, path, 4.0, fixed, grad), "q_proj.lora_A", "A shape")) return 1;
        if (write_adapter(path, PEFT "model.layers.1.self_attn.q_proj", 2, 32, 128, 3)) return 1;
        if (expect_error(ls_lora_load(&E, &nd, path, 4.0, fixed, grad), "q_proj.lora_B", "B shape")) return 1;
        if (write_adapter(path, PEFT "model.layers.1.self_attn.q_proj", 2, 32, -1, 0)) return 1;
        if (expect_error(ls_lora_load(&E, &nd, path, 4.0, fixed, grad), "q_proj.lora_A", "no B")) return 1;
        if (write_adapter(path, PEFT "model.embed_tokens", 2, 32, 97, 2)) return 1;
        if (expect_error(ls_lora_load(&E, &nd, path, 4.0, fixed, grad), "embed_tokens", "embed")) return 1;
        if (write_adapter(path, "model.layers.1.self_attn.q_proj", 2, 32, 128, 2)) return 1;
        if (expect_error(ls_lora_load(&E, &nd, path, 4.0, fixed, grad), "base_model.model.", "prefix")) return 1;
        /* in_proj_qkv (split name) does not exist in the fused checkpoint */
        if (write_adapter(path, PEFT "model.layers.0.linear_attn.in_proj_qkv", 2, 32, 64, 2)) return 1;
        if (expect_error(ls_lora_load(&E, &nd, path, 4.0, fixed, grad), "in_proj_qkv", "split name")) return 1;
        snprintf(path, sizeof path, "%s/missing.safetensors", tmp);
        if (expect_error(ls_lora_load(&E, &nd, path, 4.0, fixed, grad), "missing.safetensors", "missing file"))
            return 1;
        T_CHECK(E == NULL && fixed->cur == cf && grad->cur == cg, "failed ls_lora_load kept memory");
    }
    ls_arenas_free(&ar);
    T_CHECK(t_remove_dir(tmp) == 0, "cleanup");
    return 0;
}

/* Every adapter gradient of a list, end to end, into out. */
static void flatten(const ls_param *p, int64_t n, float *out) {
    for (int64_t i = 0, off = 0; i < n; off += p[i].n, i++) memcpy(out + off, p[i].p, (size_t)p[i].n * sizeof(float));
}

/* One GRPO gradient of the adapters L (gradient list lg, zeroed first) through `policy`
 * (a merged copy with the gradient set gr, or the side-branch view with none), flattened
 * into out; 0 on success. */
static int adapter_grads(ls_hybrid_model *policy, ls_hybrid_model *gr, ls_lora *L, const ls_hybrid_model *base,
                         const ls_group *g, const ls_grpo_opts *o, ls_arenas *ar, ls_grpo_metrics *mt,
                         const ls_param *lg, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++) memset(lg[i].p, 0, (size_t)lg[i].n * sizeof(float));
    T_OK(t_grpo_update_lora(policy, NULL, gr, NULL, L, base, g, o, ar, mt));
    flatten(lg, n, out);
    return 0;
}

/* Gradient buffers only for adapted tensors (ls_hybrid_alloc_grad_lora): the frozen
 * tensors get none, and a GRPO gradient through them gives the adapters exactly the
 * gradient the full buffer set gives. */
int test_lora_grad_subset(void) {
    ls_arenas ar;
    ls_arenas_init(&ar);
    ls_arena *fixed = &ar.a[LS_ARENA_FIXED], *grad = &ar.a[LS_ARENA_GRAD];
    ls_hybrid_model nd, eff, gfull, gsub;
    T_OK(ls_hybrid_load(&nd, FIX "/next_dense", fixed));
    ls_lora *La, *Lb;
    T_OK(ls_lora_new(&La, &nd, "q_proj,in_proj_qkvz,down_proj", 2, 4.0, 3, fixed, grad));
    T_OK(ls_lora_new(&Lb, &nd, "q_proj,in_proj_qkvz,down_proj", 2, 4.0, 3, fixed, grad));
    if (randomize_B(La, 5) || randomize_B(Lb, 5)) return 1;
    T_OK(ls_hybrid_alloc_like(&nd, &eff, fixed));
    ls_lora_merge(La, &nd, &eff);
    size_t g0 = grad->cur;
    T_OK(ls_hybrid_alloc_like(&nd, &gfull, grad));
    size_t g1 = grad->cur;
    T_OK(ls_hybrid_alloc_grad_lora(&nd, &gsub, grad, Lb));
    size_t g2 = grad->cur;
    const ls_config *c = &nd.cfg;
    T_CHECK(!gsub.embed && !gsub.lm_head && !gsub.final_norm, "top-level gradients allocated");
    for (int l = 0; l < c->n_layers; l++) {
        const ls_hybrid_layer *w = &gsub.layers[l];
        int attn = c->kind[l] == LS_LAYER_ATTN;
        T_CHECK(!w->input_norm && !w->post_norm && !w->mlp_gu && w->mlp_down, "layer %d: norms / MLP", l);
        T_CHECK(attn ? (w->attn_in && !w->attn_out && !w->q_norm) : (w->gdn_in && !w->gdn_out && !w->conv_w && !w->A_log),
                "layer %d: mixer gradients", l);
    }
    printf("  grad buffers: full %zu bytes, adapted tensors only %zu bytes\n", g1 - g0, g2 - g1);
    T_CHECK(g2 - g1 < (g1 - g0) / 2, "subset not smaller");
    ls_group g;
    T_OK(ls_group_load(&g, FIX "/next_dense/group_train.json", c->vocab));
    ls_grpo_opts o;
    ls_grpo_opts_default(&o);
    ls_grpo_metrics ma, mb;
    T_OK(t_grpo_update_lora(&eff, NULL, &gfull, NULL, La, &nd, &g, &o, &ar, &ma));
    T_OK(t_grpo_update_lora(&eff, NULL, &gsub, NULL, Lb, &nd, &g, &o, &ar, &mb));
    ls_param *pa, *pb;
    int64_t na, nb;
    T_OK(ls_lora_params(La, NULL, &pa, &na));
    T_OK(ls_lora_params(Lb, NULL, &pb, &nb));
    T_CHECK(na == nb && na > 0 && ma.grad_norm > 0, "adapter lists");
    for (int64_t i = 0; i < na; i++)
        T_CHECK(memcmp(pa[i].p, pb[i].p, (size_t)pa[i].n * sizeof(float)) == 0, "%s: gradients differ", pa[i].what);
    T_CHECK(ma.grad_norm == mb.grad_norm, "grad norm %.9g vs %.9g", ma.grad_norm, mb.grad_norm);
    /* the policy owning only its adapted tensors (the rest aliased to the base) is the
     * same policy: bit-identical gradients, and the base is never written */
    ls_hybrid_model alias;
    size_t f0 = fixed->cur;
    T_OK(ls_hybrid_alloc_merged_lora(&nd, &alias, fixed, Lb));
    size_t f1 = fixed->cur;
    ls_lora_merge(Lb, &nd, &alias);
    T_CHECK(alias.embed == nd.embed && alias.lm_head == nd.lm_head && alias.layers[0].mlp_gu == nd.layers[0].mlp_gu &&
                alias.layers[0].mlp_down != nd.layers[0].mlp_down,
            "aliasing: frozen tensors shared, adapted ones owned");
    printf("  policy tensors: full merged copy %zu bytes, adapted tensors only %zu bytes\n", g1 - g0, f1 - f0);
    ls_param *pc;
    int64_t nc;
    for (int64_t i = 0; i < nb; i++) memset(pb[i].p, 0, (size_t)pb[i].n * sizeof(float));
    ls_hybrid_model gsub2;
    T_OK(ls_hybrid_alloc_grad_lora(&nd, &gsub2, grad, Lb));
    ls_grpo_metrics mc;
    T_OK(t_grpo_update_lora(&alias, NULL, &gsub2, NULL, Lb, &nd, &g, &o, &ar, &mc));
    T_OK(ls_lora_params(Lb, NULL, &pc, &nc));
    for (int64_t i = 0; i < na; i++)
        T_CHECK(memcmp(pa[i].p, pc[i].p, (size_t)pa[i].n * sizeof(float)) == 0, "%s: aliased policy differs", pa[i].what);
    T_CHECK(mc.grad_norm == ma.grad_norm && f1 - f0 < (g1 - g0) / 2, "aliased policy: grad norm %.9g, %zu bytes",
            mc.grad_norm, f1 - f0);
    free(pc);
    /* side branches (policy = base + adapters on the fly, no gradient buffers at all):
     * the same gradients up to float rounding (B ≠ 0 here, so dA and dB both live). Two
     * float32 schedules (W·x + s·B(A·x) against fl(W + s·B·A)·x), so the bound is a
     * floor measured here (testutil.h), the worst of: the merged policy and the side
     * branches each on weights moved one ulp, and each with other capture chunks and
     * pages. Over Prescott, Sandybridge, Haswell, SkylakeX and Zen kernels side vs merged
     * measured 3.6e-6 .. 2.0e-5 and 0.25–1.05× that floor: 4× it. */
    T_CHECK(ls_lora_side_ok(Lb), "side mode refused");
    int64_t tot = 0;
    for (int64_t i = 0; i < na; i++) tot += pa[i].n;
    float *merged = malloc((size_t)tot * sizeof(float)), *sidev = malloc((size_t)tot * sizeof(float));
    float *alt = malloc((size_t)tot * sizeof(float));
    T_CHECK(merged && sidev && alt, "alloc");
    flatten(pa, na, merged);
    ls_hybrid_model side = nd, gnone;
    side.lora = Lb;
    T_OK(ls_hybrid_alloc_none(&nd, &gnone, grad));
    ls_grpo_metrics md;
    if (adapter_grads(&side, &gnone, Lb, &nd, &g, &o, &ar, &md, pb, nb, sidev)) return 1;
    double err = t_rel_err_f(sidev, merged, tot);
    /* the floors */
    ls_hybrid_model effp, ndp, gp, sidep;
    T_OK(ls_hybrid_alloc_like(&nd, &effp, fixed));
    ls_lora_merge(Lb, &nd, &effp);
    T_OK(t_hybrid_perturb(&effp, 41));
    T_OK(ls_hybrid_load(&ndp, FIX "/next_dense", fixed));
    T_OK(t_hybrid_perturb(&ndp, 42));
    sidep = ndp;
    sidep.lora = Lb;
    ls_grpo_opts o2 = o;
    o2.fwd.capture_chunk = 37;
    o2.page_size = 7;
    double fl[4];
    T_OK(ls_hybrid_alloc_grad_lora(&nd, &gp, grad, Lb));
    if (adapter_grads(&effp, &gp, Lb, &nd, &g, &o, &ar, &mc, pb, nb, alt)) return 1;
    fl[0] = t_rel_err_f(alt, merged, tot);
    if (adapter_grads(&sidep, &gnone, Lb, &ndp, &g, &o, &ar, &mc, pb, nb, alt)) return 1;
    fl[1] = t_rel_err_f(alt, sidev, tot);
    T_OK(ls_hybrid_alloc_grad_lora(&nd, &gp, grad, Lb));
    if (adapter_grads(&eff, &gp, Lb, &nd, &g, &o2, &ar, &mc, pb, nb, alt)) return 1;
    fl[2] = t_rel_err_f(alt, merged, tot);
    if (adapter_grads(&side, &gnone, Lb, &nd, &g, &o2, &ar, &mc, pb, nb, alt)) return 1;
    fl[3] = t_rel_err_f(alt, sidev, tot);
    double floor = 0;
    for (int k = 0; k < 4; k++) floor = fl[k] > floor ? fl[k] : floor;
    T_CHECK(fl[2] <= T_FLOOR_NOISE_MAX && fl[3] <= T_FLOOR_NOISE_MAX,
            "other capture chunks move the adapter gradients by %.3e (merged) / %.3e (side): not rounding", fl[2], fl[3]);
    double tol = t_floor_bound(floor, 4, 1e-6); /* min: 8 float32 epsilons */
    printf("  side branches vs merged: adapter gradients rel %.2e (%.2fx the floor %.2e: one ulp merged %.2e, side "
           "%.2e; other chunks merged %.2e, side %.2e; bound %.2e), grad norm %.9g vs %.9g, loss %.9g vs %.9g\n",
           err, err / floor, floor, fl[0], fl[1], fl[2], fl[3], tol, md.grad_norm, ma.grad_norm, md.loss, ma.loss);
    T_CHECK(err <= tol, "side-branch gradients differ: rel %.3e > %.2e (4x the floor %.2e)", err, tol, floor);
    free(merged);
    free(sidev);
    free(alt);
    free(pa);
    free(pb);
    ls_group_free(&g);
    ls_arenas_free(&ar);
    return 0;
}

/* The side branch of one projection (ls_lora_linear_fwd/_bwd) against a double
 * forward written here, out[t, j] = s·Σ B[j,:]·(A·x_t) on the adapter's rows, and
 * its backward by central differences (h = 1e-6) of L = Σ out·R in double: dx, dA,
 * dB. The adapter is in_proj_z of q35_dense (rows [cd, cd+vd) of the fused GDN input
 * projection); a call for another row block (the qkv rows) must leave it out. */
int test_lora_side_branch_fd(void) {
    ls_arenas ar;
    ls_arenas_init(&ar);
    ls_arena *fixed = &ar.a[LS_ARENA_FIXED], *grad = &ar.a[LS_ARENA_GRAD], *sc = &ar.a[LS_ARENA_SCRATCH];
    ls_hybrid_model m;
    T_OK(ls_hybrid_load(&m, FIX "/q35_dense", fixed));
    ls_lora *L;
    T_OK(ls_lora_new(&L, &m, "in_proj_z", 3, 6.0, 2, fixed, grad));
    if (randomize_B(L, 9)) return 1;
    const ls_config *c = &m.cfg;
    int layer = -1;
    for (int l = 0; l < c->n_layers && layer < 0; l++)
        if (c->kind[l] == LS_LAYER_GDN) layer = l;
    T_CHECK(layer >= 0, "no GDN layer");
    int64_t D = c->hidden, cd = ls_cfg_conv_dim(c), vd = ls_cfg_value_dim(c), T = 3;
    size_t field = offsetof(ls_hybrid_layer, gdn_in);
    /* this layer's module: A (r, D) then B (vd, r) in ls_lora_params order */
    ls_param *w, *g;
    int64_t np;
    T_OK(ls_lora_params(L, &w, &g, &np));
    int64_t mi = -1;
    char want[96];
    snprintf(want, sizeof want, "layers.%d.linear_attn.in_proj_z.lora_A", layer);
    for (int64_t i = 0; i < np && mi < 0; i += 2)
        if (strstr(w[i].what, want)) mi = i;
    T_CHECK(mi >= 0, "module of layer %d not found", layer);
    const int64_t r = w[mi].n / D;
    float *A = w[mi].p, *B = w[mi + 1].p, *gA = g[mi].p, *gB = g[mi + 1].p;
    T_CHECK(r == 3 && w[mi + 1].n == vd * r, "module shapes");
    const double s = 6.0 / 3.0;
    ls_rng rng;
    ls_rng_seed(&rng, 77);
    float *x = malloc((size_t)(T * D) * sizeof(float)), *out = calloc((size_t)(T * vd), sizeof(float));
    float *R = malloc((size_t)(T * vd) * sizeof(float)), *dx = calloc((size_t)(T * D), sizeof(float));
    float *other = calloc((size_t)(T * cd), sizeof(float));
    t_fill_normal(x, T * D, &rng, 1.0f);
    t_fill_normal(R, T * vd, &rng, 1.0f);
    /* forward: the rows of this projection call are exactly the adapter's */
    T_OK(ls_lora_linear_fwd(L, layer, field, cd, vd, out, x, T, sc));
    T_OK(ls_lora_linear_fwd(L, layer, field, 0, cd, other, x, T, sc)); /* the qkv block: untouched */
    for (int64_t i = 0; i < T * cd; i++) T_CHECK(other[i] == 0.0f, "a row block outside the adapter was written");
    double fe = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < vd; j++) {
            double acc = 0;
            for (int64_t k = 0; k < r; k++) {
                double ax = 0;
                for (int64_t d = 0; d < D; d++) ax += (double)A[k * D + d] * x[t * D + d];
                acc += (double)B[j * r + k] * ax;
            }
            double e = fabs(s * acc - out[t * vd + j]);
            if (!(e <= fe)) fe = e;
        }
    T_CHECK(fe <= 1e-4, "side-branch forward differs from the double forward by %.3e", fe);
    /* backward */
    ls_lora_zero_grad(L);
    T_OK(ls_lora_linear_bwd(L, layer, field, cd, vd, dx, R, x, T, sc));
    /* central differences in double of L(x, A, B) = Σ R ⊙ s·(x·Aᵀ)·Bᵀ */
    double *xd = malloc((size_t)(T * D) * sizeof(double)), *Ad = malloc((size_t)(r * D) * sizeof(double));
    double *Bd = malloc((size_t)(vd * r) * sizeof(double));
    for (int64_t i = 0; i < T * D; i++) xd[i] = x[i];
    for (int64_t i = 0; i < r * D; i++) Ad[i] = A[i];
    for (int64_t i = 0; i < vd * r; i++) Bd[i] = B[i];
    double *vars[3] = {xd, Ad, Bd};
    const float *an[3] = {dx, gA, gB};
    const int64_t nv[3] = {T * D, r * D, vd * r};
    static const char *vname[3] = {"dx", "dA", "dB"};
    double worst = 0;
    for (int v = 0; v < 3; v++) {
        double num = 0, den = 0;
        for (int64_t i = 0; i < nv[v]; i++) {
            double keep = vars[v][i], lp = 0, lm = 0;
            for (int pass = 0; pass < 2; pass++) {
                vars[v][i] = keep + (pass ? -1e-6 : 1e-6);
                double Ls = 0;
                for (int64_t t = 0; t < T; t++)
                    for (int64_t k = 0; k < r; k++) {
                        double ax = 0;
                        for (int64_t d = 0; d < D; d++) ax += Ad[k * D + d] * xd[t * D + d];
                        for (int64_t j = 0; j < vd; j++) Ls += R[t * vd + j] * s * Bd[j * r + k] * ax;
                    }
                if (pass) lm = Ls;
                else lp = Ls;
            }
            vars[v][i] = keep;
            double fd = (lp - lm) / 2e-6, d = fd - an[v][i];
            num += d * d;
            den += fd * fd;
        }
        double rel = sqrt(num / den);
        printf("  side branch %s: relative error vs central differences %.2e (%lld elements)\n", vname[v], rel,
               (long long)nv[v]);
        T_CHECK(den > 0 && rel <= 1e-4, "%s: relative error %.3e", vname[v], rel);
        if (!(rel <= worst)) worst = rel;
    }
    free(xd), free(Ad), free(Bd), free(x), free(out), free(R), free(dx), free(other), free(w), free(g);
    ls_arenas_free(&ar);
    return 0;
}
