/*
 * test_grpo_ref.c — `longstraw grad` and `longstraw step` against the independent
 * fp64 PyTorch reference (tests/reference/grpo_ref.py; committed fixtures listed in
 * tests/reference/fixtures/grpo/cases.json): per-tensor gradients to 1e-3 relative
 * (DESIGN §6) and the loss, for grpo / dapo / dr_grpo, clipping both ways, β > 0
 * with a reference model, temperature, LoRA adapters (PEFT names); and 5-step AdamW
 * trajectories, full fine-tune and LoRA (loss and grad norm per step, final weights
 * as W − W₀ per tensor).
 */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/config.h"
#include "longstraw/safetensors.h"
#include "testutil.h"

int test_grpo_reference_grads(void);
int test_grpo_reference_trajectory(void);
int test_grpo_reference_full(void);
int test_mla_reference_grads(void);
int test_mla_reference_indexer_kl(void);
int test_grpo_full_fd(void);
int test_grpo_reference_full_trajectory(void);
int test_grpo_full_vs_naive_tool(void);

#define FIX LS_SOURCE_DIR "/tests/reference/fixtures"

static cJSON *load_json(const char *path) {
    char *text;
    if (ls_read_file(path, &text, NULL) != LS_OK) return NULL;
    cJSON *j = cJSON_Parse(text);
    free(text);
    return j;
}

/* Build "cd FIX && longstraw CMD <args, --steps → --num-iterations> EXTRA". */
static void build_cmd(char *cmd, size_t cap, const char *sub, const cJSON *args, const char *extra) {
    int n = snprintf(cmd, cap, "cd '%s' && '%s' %s", FIX, LS_CLI_PATH, sub);
    const cJSON *a;
    cJSON_ArrayForEach(a, args) {
        const char *s = strcmp(a->valuestring, "--steps") == 0 ? "--num-iterations" : a->valuestring;
        n += snprintf(cmd + n, cap - (size_t)n, " '%s'", s);
    }
    snprintf(cmd + n, cap - (size_t)n, " %s 2>&1", extra);
}

/* Per-tensor ‖a − b‖/‖b‖ (optionally of a − base and b − base); worst returned. */
static int compare_files(const char *got, const char *want, const char *base, double tol, double *worst_out,
                         int64_t *n_out) {
    ls_st_file a, b, w0;
    memset(&w0, 0, sizeof w0);
    T_OK(ls_st_open(&a, got));
    T_OK(ls_st_open(&b, want));
    if (base) T_OK(ls_st_open(&w0, base));
    double worst = 0;
    int64_t n = 0;
    for (int64_t i = 0; i < ls_st_count(&b); i++) {
        const ls_st_tensor *tb = ls_st_at(&b, i), *ta = ls_st_find(&a, tb->name);
        if (!ta && strncmp(tb->name, "mtp.", 4) == 0) continue;
        T_CHECK(ta != NULL, "%s lacks %s", got, tb->name);
        T_CHECK(ta->numel == tb->numel, "%s: size", tb->name);
        float *x = malloc((size_t)ta->numel * sizeof(float)), *y = malloc((size_t)tb->numel * sizeof(float));
        T_OK(ls_st_read_f32(ta, x, ta->numel, tb->name));
        T_OK(ls_st_read_f32(tb, y, tb->numel, tb->name));
        if (base) {
            const ls_st_tensor *t0 = ls_st_find(&w0, tb->name);
            T_CHECK(t0 != NULL, "base lacks %s", tb->name);
            float *z = malloc((size_t)t0->numel * sizeof(float));
            T_OK(ls_st_read_f32(t0, z, t0->numel, tb->name));
            for (int64_t k = 0; k < tb->numel; k++) x[k] -= z[k], y[k] -= z[k];
            free(z);
        }
        double nb = 0;
        for (int64_t k = 0; k < tb->numel; k++) nb += (double)y[k] * y[k];
        double e = nb > 0 ? t_rel_err_f(x, y, tb->numel) : t_max_abs_diff_f(x, y, tb->numel);
        free(x);
        free(y);
        if (!(e <= worst)) worst = e;
        T_CHECK(e <= tol, "%s: %s relative error %.3e > %.0e", want, tb->name, e, tol);
        n++;
    }
    T_CHECK(n > 0, "nothing compared");
    ls_st_close(&a);
    ls_st_close(&b);
    ls_st_close(&w0);
    *worst_out = worst;
    *n_out = n;
    return 0;
}

/* Does a case's args ask for --mode full? */
static int full_case(const cJSON *args) {
    const cJSON *a;
    int prev_mode = 0;
    cJSON_ArrayForEach(a, args) {
        if (prev_mode && !strcmp(a->valuestring, "full")) return 1;
        prev_mode = !strcmp(a->valuestring, "--mode");
    }
    return 0;
}

/* Every case of `key` in `file` (prefix_only: not the --mode full ones): `longstraw grad
 * <args> ENGINE` against its committed fp64 gradient (1e-3 relative per tensor) and loss
 * (1e-5). */
static int grads_vs_reference_of(const char *file, const char *key, const char *engine, int min_cases,
                                 int prefix_only) {
    cJSON *j = load_json(file);
    T_CHECK(j != NULL, "cannot read %s", file);
    char tmp[512];
    T_CHECK(t_make_tmpdir(tmp, sizeof tmp) == 0, "tmpdir");
    int ran = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, key)) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        const cJSON *args = cJSON_GetObjectItem(c, "args");
        if (prefix_only && full_case(args)) continue;
        char out[700], extra[2000], cmd[4096], rcpt[700];
        const cJSON *ikl = cJSON_GetObjectItem(c, "indexer_kl"); /* the indexer KL loss's value, from the receipt */
        snprintf(out, sizeof out, "%s/%s.safetensors", tmp, name);
        snprintf(rcpt, sizeof rcpt, "%s/%s.json", tmp, name);
        snprintf(extra, sizeof extra, "%s --out '%s'%s%s%s", engine, out, ikl ? " --receipt '" : "", ikl ? rcpt : "",
                 ikl ? "'" : "");
        build_cmd(cmd, sizeof cmd, "grad", args, extra);
        int rc;
        char *log = t_run_capture(cmd, &rc);
        T_CHECK(rc == 0, "%s: grad failed: %s", name, log ? log : "");
        free(log);
        /* loss from the metadata of both files */
        ls_st_file fa, fb;
        char want[700];
        snprintf(want, sizeof want, "%s/%s", FIX, cJSON_GetObjectItem(c, "grad")->valuestring);
        T_OK(ls_st_open(&fa, out));
        T_OK(ls_st_open(&fb, want));
        double la = atof(ls_st_meta_get(&fa, "loss")), lb = atof(ls_st_meta_get(&fb, "loss"));
        ls_st_close(&fa);
        ls_st_close(&fb);
        T_CHECK(fabs(la - lb) <= 1e-5 * fmax(1.0, fabs(lb)), "%s: loss %.9g vs reference %.9g", name, la, lb);
        if (ikl) {
            char *rt = t_read_file(rcpt, NULL);
            cJSON *r = rt ? cJSON_Parse(rt) : NULL;
            free(rt);
            const cJSON *v = r ? cJSON_GetObjectItem(cJSON_GetObjectItem(r, "metrics"), "indexer_kl") : NULL;
            double ka = v ? v->valuedouble : NAN, kb = ikl->valuedouble;
            cJSON_Delete(r);
            T_CHECK(fabs(ka - kb) <= 1e-5 * fmax(1.0, fabs(kb)), "%s: indexer KL %.9g vs reference %.9g", name, ka, kb);
            printf("  %-12s indexer KL %.7f (ref %.7f)\n", name, ka, kb);
        }
        double worst;
        int64_t n;
        if (compare_files(out, want, NULL, 1e-3, &worst, &n)) return 1;
        printf("  %-12s loss %+.6f (ref %+.6f), %lld tensors, worst gradient relative error %.2e\n", name, la, lb,
               (long long)n, worst);
        ran++;
    }
    cJSON_Delete(j);
    T_CHECK(t_remove_dir(tmp) == 0, "cleanup");
    T_CHECK(ran >= min_cases, "only %d cases ran", ran);
    return 0;
}

static int grads_vs_reference(const char *file, const char *key, const char *engine, int min_cases) {
    return grads_vs_reference_of(file, key, engine, min_cases, 0);
}

int test_grpo_reference_grads(void) { return grads_vs_reference(FIX "/grpo/cases.json", "cases", "", 5); }

/* Full mode (issue 11) against the reference's full gradient (nothing detached), and
 * --loss sft in both modes: the prompt's 130 captured positions in pages of 7, sweep
 * chunks of 11 and capture chunks of 5 (none divides another or the prompt). */
int test_grpo_reference_full(void) {
    const char *eng = "--page-size 7 --sweep-chunk 11 --capture-chunk 5";
    if (grads_vs_reference(FIX "/grpo/full_cases.json", "cases", eng, 5)) return 1;
    return grads_vs_reference(FIX "/grpo/full_cases.json", "sft_cases", eng, 5);
}

/* Finite differences of the fp64 loss (the reference, fd_full.json) through the row of
 * an embedding that only the prompt uses and through Gated DeltaNet weights, against
 * the tool's full-mode gradient entries; and that row's prefix-frozen gradient is 0. */
int test_grpo_full_fd(void) {
    cJSON *j = load_json(FIX "/grpo/fd_full.json");
    T_CHECK(j != NULL, "cannot read fd_full.json");
    char tmp[512];
    T_CHECK(t_make_tmpdir(tmp, sizeof tmp) == 0, "tmpdir");
    int checked = 0;
    for (int full = 0; full < 2; full++) {
        char out[700], extra[1200], cmd[4096];
        snprintf(out, sizeof out, "%s/g%d.safetensors", tmp, full);
        snprintf(extra, sizeof extra, "--page-size 7 --sweep-chunk 23 --capture-chunk 9 --mode %s --out '%s'",
                 full ? "full" : "prefix-frozen", out);
        build_cmd(cmd, sizeof cmd, "grad", cJSON_GetObjectItem(j, "args"), extra);
        int rc;
        char *log = t_run_capture(cmd, &rc);
        T_CHECK(rc == 0, "grad failed: %s", log ? log : "");
        free(log);
        ls_st_file f;
        T_OK(ls_st_open(&f, out));
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItem(j, "entries")) {
            const char *name = cJSON_GetObjectItem(e, "tensor")->valuestring;
            int64_t idx = (int64_t)cJSON_GetObjectItem(e, "flat_index")->valuedouble;
            double fd = cJSON_GetObjectItem(e, "fd")->valuedouble;
            const ls_st_tensor *t = ls_st_find(&f, name);
            T_CHECK(t && idx < t->numel, "%s: no entry %lld", name, (long long)idx);
            float *x = malloc((size_t)t->numel * sizeof(float));
            T_OK(ls_st_read_f32(t, x, t->numel, name));
            double got = x[idx];
            free(x);
            int embed = strstr(name, "embed_tokens") != NULL;
            if (!full) { /* prefix-frozen: a prompt-only embedding row has no gradient at all */
                if (embed)
                    T_CHECK(got == 0.0, "%s[%lld]: prefix-frozen gradient %g, expected exactly 0", name,
                            (long long)idx, got);
                continue;
            }
            /* float32 gradient vs the fp64 difference quotient */
            double err = fabs(got - fd), tol = 1e-4 * fabs(fd) + 1e-7;
            printf("  %-44s [%5lld] full mode %+.7e, finite difference %+.7e, |diff| %.2e (tol %.1e)\n", name,
                   (long long)idx, got, fd, err, tol);
            T_CHECK(err <= tol, "%s[%lld]: %g vs finite difference %g", name, (long long)idx, got, fd);
            T_CHECK(!embed || got != 0.0, "the full-mode gradient of a prompt-only row is zero");
            checked++;
        }
        ls_st_close(&f);
    }
    cJSON_Delete(j);
    T_CHECK(t_remove_dir(tmp) == 0, "cleanup");
    T_CHECK(checked >= 8, "only %d entries checked", checked);
    return 0;
}

/* The AdamW trajectories of `file`: `longstraw step <args> ENGINE` (--steps as
 * --num-iterations) against the reference's per-step loss and grad norm and final
 * weights. */
static int trajectories_vs_reference(const char *file, const char *engine) {
    cJSON *j = load_json(file);
    T_CHECK(j != NULL, "cannot read %s", file);
    char tmp[512];
    T_CHECK(t_make_tmpdir(tmp, sizeof tmp) == 0, "tmpdir");
    int ran = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "trajectories")) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        const cJSON *args = cJSON_GetObjectItem(c, "args");
        const char *adapter = NULL;
        for (int k = 0; k + 1 < cJSON_GetArraySize(args); k++)
            if (!strcmp(cJSON_GetArrayItem(args, k)->valuestring, "--adapter"))
                adapter = cJSON_GetArrayItem(args, k + 1)->valuestring;
        char out[700], extra[1200], cmd[4096], path[800];
        snprintf(out, sizeof out, "%s/%s", tmp, name);
        snprintf(extra, sizeof extra, "%s --out '%s'", engine, out);
        build_cmd(cmd, sizeof cmd, "step", args, extra);
        int rc;
        char *log = t_run_capture(cmd, &rc);
        T_CHECK(rc == 0, "%s: step failed: %s", name, log ? log : "");
        free(log);
        snprintf(path, sizeof path, "%s/receipt.json", out);
        char *text;
        T_OK(ls_read_file(path, &text, NULL));
        cJSON *r = cJSON_Parse(text);
        free(text);
        const cJSON *it = cJSON_GetObjectItem(r, "iterations");
        const cJSON *wl = cJSON_GetObjectItem(c, "loss"), *wg = cJSON_GetObjectItem(c, "grad_norm");
        T_CHECK(cJSON_GetArraySize(it) == cJSON_GetArraySize(wl) && cJSON_GetArraySize(wl) == 5, "5 steps");
        for (int s = 0; s < 5; s++) {
            double l = cJSON_GetObjectItem(cJSON_GetArrayItem(it, s), "loss")->valuedouble;
            double gn = cJSON_GetObjectItem(cJSON_GetArrayItem(it, s), "grad_norm")->valuedouble;
            double rl = cJSON_GetArrayItem(wl, s)->valuedouble, rg = cJSON_GetArrayItem(wg, s)->valuedouble;
            printf("  %s step %d: loss %+.7f (ref %+.7f), grad norm %.6f (ref %.6f)\n", name, s + 1, l, rl, gn, rg);
            T_CHECK(fabs(l - rl) <= 1e-4 * fmax(1.0, fabs(rl)), "step %d loss %.8g vs %.8g", s + 1, l, rl);
            /* step 1 runs on exactly the reference's weights: a tight match. Later steps
             * run on weights that differ by float rounding: in the clipped LoRA
             * trajectory the adapters after 3 steps match the reference to 4.3e-5 per
             * tensor, and the C gradient at the reference's own step-3 adapters matches
             * its grad norm to 2.8e-5, yet the grad norms at step 4 (0.32, much smaller
             * than the terms that cancel in it) differ by 1.0e-3: that cancellation
             * amplifies the weight difference. Without clipping (epsilon 0.99 / 100) the
             * norms stay 1-4 and agree within 7.6e-6 at every step. 2e-3 was 1e-3 before
             * LoRA side branches (merged weights drifted 6e-4 there). Final W - W0 is
             * checked at 1e-3 below (2.0e-4). */
            double gtol = s == 0 ? 1e-5 : 2e-3;
            T_CHECK(fabs(gn - rg) <= gtol * rg, "step %d grad norm %.8g vs %.8g", s + 1, gn, rg);
        }
        cJSON_Delete(r);
        char want[800], got[800];
        snprintf(want, sizeof want, "%s/%s", FIX, cJSON_GetObjectItem(c, "final")->valuestring);
        /* full fine-tune: the checkpoint, W0 = the model; LoRA: the adapters, W0 = the initial adapters */
        char base[800];
        snprintf(got, sizeof got, "%s/%s", out, adapter ? "adapter_model.safetensors" : "model.safetensors");
        snprintf(base, sizeof base, "%s/%s", FIX, adapter ? adapter : "next_dense/model.safetensors");
        double worst;
        int64_t n;
        if (compare_files(got, want, base, 1e-3, &worst, &n)) return 1;
        printf("  %s: final weights, %lld tensors, worst relative error of W - W0 %.2e\n", name, (long long)n, worst);
        ran++;
    }
    cJSON_Delete(j);
    T_CHECK(t_remove_dir(tmp) == 0, "cleanup");
    T_CHECK(ran >= 2, "trajectories ran: %d", ran);
    return 0;
}

int test_grpo_reference_trajectory(void) { return trajectories_vs_reference(FIX "/grpo/cases.json", ""); }

/* Full mode (the prompt recaptured with each step's weights, the sweep every
 * iteration): GRPO full fine-tune and LoRA SFT, 5 steps each. */
int test_grpo_reference_full_trajectory(void) {
    return trajectories_vs_reference(FIX "/grpo/full_cases.json", "--page-size 7 --sweep-chunk 11 --capture-chunk 5");
}

/* `grad --mode full` (capture, dState, reverse sweep) against the naive full graph
 * (`--no-capture --mode full`: each member's whole sequence under one tape, nothing
 * detached) through the tool, on the four fixtures (both layouts, dense and MoE), full
 * fine-tune and LoRA, β = 0.05 with clipping both ways, pages of 7 and sweep chunks of
 * 13 (130 captured positions). Bound 4× the fixture's own float floor measured in the
 * same run (testutil.h): prefix-frozen capture against prefix-frozen naive, the same
 * comparison with nothing new in it (q35_moe's MoE routing makes it ~1e-4). */
int test_grpo_full_vs_naive_tool(void) {
    static const char *fx[4] = {"next_dense", "next_moe", "q35_dense", "q35_moe"};
    char tmp[512];
    T_CHECK(t_make_tmpdir(tmp, sizeof tmp) == 0, "tmpdir");
    int ran = 0;
    for (int f = 0; f < 4; f++)
        for (int lora = 0; lora < 2; lora++) {
            char out[4][700];
            for (int k = 0; k < 4; k++) { /* 0 full, 1 naive full, 2 prefix-frozen, 3 naive prefix-frozen */
                char cmd[4096];
                snprintf(out[k], sizeof out[k], "%s/%s_%d_%d.safetensors", tmp, fx[f], lora, k);
                snprintf(cmd, sizeof cmd,
                         "cd '%s' && '%s' grad --model %s --group %s/group_train.json --ref-model %s --beta 0.05 "
                         "--epsilon-high 0.28 --page-size 7 --sweep-chunk 13 --capture-chunk 9 --mode %s %s %s "
                         "--out '%s' 2>&1",
                         FIX, LS_CLI_PATH, fx[f], fx[f], f == 0 ? "next_dense_ref" : fx[f], k < 2 ? "full" : "prefix-frozen",
                         k % 2 ? "--no-capture" : "", lora ? "--lora-rank 4 --lora-alpha 8 --lora-seed 3" : "", out[k]);
                int rc;
                char *log = t_run_capture(cmd, &rc);
                T_CHECK(rc == 0, "%s: %s", cmd, log ? log : "");
                free(log);
            }
            double floor, worst;
            int64_t n;
            if (compare_files(out[2], out[3], NULL, T_FLOOR_NOISE_MAX, &floor, &n)) return 1;
            /* 4× the floor: float32 schedules differ by up to ~2.6× their measured floor
             * here between builds (Release vs ASan code generation), 1.7× between
             * OpenBLAS's Prescott, Sandybridge, Haswell, SkylakeX and Zen kernels. min
             * 1e-6: 8 float32 epsilons */
            double tol = t_floor_bound(floor, 4, 1e-6);
            if (compare_files(out[0], out[1], NULL, tol, &worst, &n)) return 1;
            printf("  %-10s %-4s full mode vs the naive full graph: worst tensor %.2e over %lld (prefix-frozen floor "
                   "%.2e, bound %.1e)\n",
                   fx[f], lora ? "LoRA" : "full", worst, (long long)n, floor, tol);
            ran++;
        }
    T_CHECK(t_remove_dir(tmp) == 0, "cleanup");
    T_CHECK(ran == 8, "ran %d", ran);
    return 0;
}

/* The MLA + DSA + MoE family (issue 12) against its own fp64 reference (mla_ref.py):
 * the GRPO cases (grpo, dapo with β and a reference model at temperature 0.7, dr_grpo
 * unscaled; GLM-5 F32, GLM-5.2 IndexCache BF16, DeepSeek-V3.2 YaRN), prefix-frozen and
 * full mode, with the prompt in pages of 7 captured in chunks of 5 and swept in chunks
 * of 11 (top-k selections crossing pages and chunks), and by the naive mode (each
 * member's whole sequence under a tape; in full mode nothing detached). */
int test_mla_reference_grads(void) {
    if (grads_vs_reference_of(FIX "/mla_grpo/cases.json", "cases", "--page-size 7 --capture-chunk 5 --sweep-chunk 11",
                              6, 0))
        return 1;
    return grads_vs_reference_of(FIX "/mla_grpo/cases.json", "cases", "--no-capture", 6, 0);
}

/* The indexer KL loss (--indexer-kl-coef) against mla_ref.py's: the gradient of GRPO +
 * coef·KL (the indexers' tensors carry the KL's alone) to 1e-3 relative per tensor, the
 * GRPO loss and the KL's value to 1e-5, by capture (pages of 7, chunks of 5) and naive. */
int test_mla_reference_indexer_kl(void) {
    if (grads_vs_reference_of(FIX "/mla_grpo/cases.json", "kl_cases", "--page-size 7 --capture-chunk 5", 3, 0))
        return 1;
    return grads_vs_reference_of(FIX "/mla_grpo/cases.json", "kl_cases", "--no-capture", 3, 0);
}
