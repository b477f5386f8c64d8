/*
 * test_cli.c — the `longstraw` tool end to end: --help everywhere, flag errors,
 * `plan` on the Qwen3.5-27B layout (the numbers issue 2 names), `init` + `logprobs`
 * with capture vs --no-capture, and clean errors on bad group files.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/config.h"
#include "longstraw/mla.h"
#include "longstraw/safetensors.h"
#include "test_family.h"
#include "testutil.h"

int test_cli_help_and_flags(void);
int test_cli_plan_27b(void);
int test_cli_init_logprobs(void);
int test_cli_grad_step(void);
int test_mla_config_plan(void);

static char *run(const char *cmd, int *rc) {
    char full[8192];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    return t_run_capture(full, rc);
}

int test_cli_help_and_flags(void) {
    static const char *cmds[] = {"", "init", "logprobs", "plan", "grad", "step", "train", "report", "demo"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char cmd[1024];
        int rc;
        snprintf(cmd, sizeof cmd, "%s %s --help", LS_CLI_PATH, cmds[i]);
        char *out = run(cmd, &rc);
        T_CHECK(out && rc == 0 && strstr(out, "usage"), "%s --help: rc %d", cmds[i], rc);
        free(out);
    }
    static const struct { const char *args, *needle; } bad[] = {
        {"plan --config x.json --prompt abc", "--prompt: \"abc\" is not an integer"},
        {"plan --config x.json --prompt 0", "--prompt: 0 is out of range"},
        {"plan --config x.json --prompt 10 --state-dtype f8", "--state-dtype"},
        {"plan --prompt 10", "exactly one of --model or --config"},
        {"logprobs --model m", "--group is required"},
        {"logprobs --model m --group g --threads -1", "--threads"},
        {"logprobs --model m --group g --page-size 0", "--page-size"},
        {"nosuchcommand", "unknown command"},
        {"init --config", "requires an argument"},
        {"grad --model m --group g --out o --loss-type ppo", "--loss-type: \"ppo\""},
        {"grad --model m --group g --out o --beta 0.1", "needs --ref-model"},
        {"grad --model m --group g --out o --mode exact", "--mode: \"exact\" is not a mode"},
        {"grad --model m --group g --out o --loss ppo", "--loss: \"ppo\" is not grpo or sft"},
        {"grad --model m --group g --out o --mode full --sweep-chunk 0", "--sweep-chunk: 0 is out of range"},
        {"grad --model m --group g --out o --epsilon 2", "--epsilon: 2 is out of range"},
        {"step --model m --group g --out o --lr x", "--lr: \"x\" is not a number"},
        {"step --model m --group g --out o --adapter a --lora-rank 4", "not both"},
        {"grad --model m --group g --out o --num-iterations 2", "step only"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char cmd[1024];
        int rc;
        snprintf(cmd, sizeof cmd, "%s %s", LS_CLI_PATH, bad[i].args);
        char *out = run(cmd, &rc);
        T_CHECK(out && rc == 2 && strstr(out, bad[i].needle), "`%s`: rc %d, output: %s", bad[i].args, rc,
                out ? out : "(none)");
        free(out);
    }
    return 0;
}

int test_cli_plan_27b(void) {
    char cmd[2048];
    int rc;
    snprintf(cmd, sizeof cmd, "%s plan --config %s/examples/qwen3_5_27b.json --prompt 2088960 --page-size 64 --cp 8 "
             "--state-dtype bf16 --json", LS_CLI_PATH, LS_SOURCE_DIR);
    char *out = t_run_capture(cmd, &rc);
    T_CHECK(out && rc == 0, "plan rc %d", rc);
    cJSON *j = cJSON_Parse(out);
    free(out);
    T_CHECK(j, "plan output is not JSON");
    double pages = cJSON_GetObjectItem(j, "pages_per_layer")->valuedouble;
    double per_rank = cJSON_GetObjectItem(j, "pages_per_rank")->valuedouble;
    double kv = cJSON_GetObjectItem(j, "kv_bytes_per_rank")->valuedouble;
    cJSON_Delete(j);
    double gib = kv / (1024.0 * 1024 * 1024);
    printf("  Qwen3.5-27B, P=2,088,960, S=64, CP=8, bf16: %.0f pages, %.0f per rank, %.2f GiB K/V per rank\n",
           pages, per_rank, gib);
    T_CHECK(pages == 32640 && per_rank == 4080, "pages %.0f per rank %.0f", pages, per_rank);
    T_CHECK(fabs(gib - 15.9375) < 1e-9, "K/V per rank %.6f GiB, expected 15.94", gib);
    return 0;
}

/* Max |a - b| over two {"logprobs": [[...]]} documents; INFINITY on mismatch. */
static double compare_lp(const char *a, const char *b, int64_t *n) {
    cJSON *ja = cJSON_Parse(a), *jb = cJSON_Parse(b);
    double m = INFINITY;
    *n = 0;
    if (ja && jb) {
        const cJSON *la = cJSON_GetObjectItem(ja, "logprobs"), *lb = cJSON_GetObjectItem(jb, "logprobs");
        if (cJSON_GetArraySize(la) == cJSON_GetArraySize(lb) && cJSON_GetArraySize(la) > 0) {
            m = 0;
            for (int i = 0; i < cJSON_GetArraySize(la); i++) {
                const cJSON *ra = cJSON_GetArrayItem(la, i), *rb = cJSON_GetArrayItem(lb, i);
                if (cJSON_GetArraySize(ra) != cJSON_GetArraySize(rb)) {
                    m = INFINITY;
                    break;
                }
                for (int t = 0; t < cJSON_GetArraySize(ra); t++) {
                    double d = fabs(cJSON_GetArrayItem(ra, t)->valuedouble - cJSON_GetArrayItem(rb, t)->valuedouble);
                    if (!(d <= m)) m = d;
                    (*n)++;
                }
            }
        }
    }
    cJSON_Delete(ja);
    cJSON_Delete(jb);
    return m;
}

/* The perturbation floor (testutil.h) of scoring `group` on the checkpoint `mdir`, through
 * the library: the plain forward and the capture (chunks of 100, pages of 7, as the tool
 * runs them below) each against itself on the model with every weight one ulp away; the
 * worst over every log-prob, or -1 on failure. */
static double perturbation_floor(const char *mdir, const char *group) {
    ls_arenas ar;
    ls_arenas_init(&ar);
    ls_hybrid_model m, mp;
    ls_group g;
    double f = -1;
    if (ls_hybrid_load(&m, mdir, &ar.a[LS_ARENA_FIXED]) != LS_OK ||
        ls_hybrid_load(&mp, mdir, &ar.a[LS_ARENA_FIXED]) != LS_OK || t_hybrid_perturb(&mp, 5) != LS_OK)
        goto done;
    if (ls_group_load(&g, group, m.cfg.vocab) != LS_OK) goto done;
    f = 0;
    for (int v = 0; v < 2 && f >= 0; v++) {
        ls_score_opts o;
        ls_score_opts_default(&o);
        o.no_capture = v == 0;
        o.fwd.capture_chunk = 100;
        o.page_size = 7;
        float *a[8], *b[8];
        if (g.G > 8 || t_score_group(&m, &g, &o, &ar, a, NULL) != LS_OK ||
            t_score_group(&mp, &g, &o, &ar, b, NULL) != LS_OK) {
            f = -1;
            break;
        }
        for (int i = 0; i < g.G; i++) {
            double d = t_max_abs_diff_f(a[i], b[i], g.R[i]);
            if (!(d <= f)) f = d;
        }
        ls_arena_reset(&ar.a[LS_ARENA_SCORE]);
    }
    ls_group_free(&g);
done:
    if (f < 0) fprintf(stderr, "  floor: %s\n", ls_err_msg());
    ls_arenas_free(&ar);
    return isfinite(f) ? f : -1;
}

int test_cli_init_logprobs(void) {
    char dir[512], cmd[4096], path[700];
    int rc;
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    snprintf(cmd, sizeof cmd, "%s init --config %s/tests/reference/fixtures/q35_moe/config.json --seed 3 --dtype bf16 --out %s/m",
             LS_CLI_PATH, LS_SOURCE_DIR, dir);
    char *out = run(cmd, &rc);
    T_CHECK(rc == 0, "init: %s", out ? out : "");
    free(out);
    /* a group of 300 prompt tokens and three responses */
    snprintf(path, sizeof path, "%s/g.json", dir);
    FILE *f = fopen(path, "w");
    T_CHECK(f != NULL, "write group");
    fputs("{\"prompt\": [", f);
    for (int i = 0; i < 300; i++) fprintf(f, "%s%d", i ? ", " : "", (i * 37 + 11) % 97);
    fputs("], \"responses\": [[5], [1, 2, 3, 4, 5, 6, 7], [", f);
    for (int i = 0; i < 80; i++) fprintf(f, "%s%d", i ? ", " : "", (i * 13 + 5) % 97);
    fputs("]]}\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s logprobs --model %s/m --group %s --threads 2 --capture-chunk 100 --page-size 7",
             LS_CLI_PATH, dir, path);
    char *cap = t_run_capture(cmd, &rc);
    T_CHECK(cap && rc == 0, "logprobs rc %d", rc);
    snprintf(cmd, sizeof cmd, "%s logprobs --model %s/m --group %s --no-capture", LS_CLI_PATH, dir, path);
    char *plain = t_run_capture(cmd, &rc);
    T_CHECK(plain && rc == 0, "logprobs --no-capture rc %d", rc);
    /* two float32 schedules: the bound is 4x the floor measured here (testutil.h), the
     * worst of the capture against itself with four other chunk and page sizes (equal in
     * exact arithmetic; held under T_FLOOR_NOISE_MAX, so a chunking bug cannot raise it)
     * and each schedule against itself on the model with every weight one ulp away.
     * min 1e-6: two ulps of a log-prob in [4, 8) */
    double floor = 0;
    static const char *alts[] = {"--capture-chunk 37 --page-size 5", "--capture-chunk 300 --page-size 64",
                                 "--capture-chunk 16 --page-size 7", "--capture-chunk 53 --page-size 13"};
    for (int v = 0; v < 4; v++) {
        snprintf(cmd, sizeof cmd, "%s logprobs --model %s/m --group %s --threads 1 %s", LS_CLI_PATH, dir, path, alts[v]);
        char *cap2 = t_run_capture(cmd, &rc);
        T_CHECK(cap2 && rc == 0, "logprobs (other chunks) rc %d", rc);
        int64_t n2;
        double f2 = compare_lp(cap2, cap, &n2);
        free(cap2);
        T_CHECK(n2 == 88 && f2 <= T_FLOOR_NOISE_MAX, "other capture chunks move log-probs by %.3e: not rounding", f2);
        floor = f2 > floor ? f2 : floor;
    }
    snprintf(cmd, sizeof cmd, "%s/m", dir);
    double pf = perturbation_floor(cmd, path);
    T_CHECK(pf >= 0, "the perturbation floor could not be measured");
    floor = pf > floor ? pf : floor;
    int64_t n;
    double d = compare_lp(cap, plain, &n);
    double tol = t_floor_bound(floor, 4, 1e-6);
    printf("  CLI capture vs --no-capture: max diff %.2e over %lld tokens (floor %.2e, bound %.2e)\n", d, (long long)n,
           floor, tol);
    T_CHECK(n == 88 && d <= tol, "capture vs plain %.3e over %lld tokens (bound %.2e: 4x the floor %.2e)", d,
            (long long)n, tol, floor);
    free(cap);
    free(plain);
    /* bad inputs: id out of range, missing file, broken checkpoint dir */
    f = fopen(path, "w");
    fputs("{\"prompt\": [1, 2, 97], \"responses\": [[1]]}", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s logprobs --model %s/m --group %s", LS_CLI_PATH, dir, path);
    out = run(cmd, &rc);
    T_CHECK(rc == 1 && out && strstr(out, "\"prompt\"[2] = 97"), "out-of-vocab id: rc %d %s", rc, out ? out : "");
    free(out);
    snprintf(cmd, sizeof cmd, "%s logprobs --model %s/nothing --group %s", LS_CLI_PATH, dir, path);
    out = run(cmd, &rc);
    T_CHECK(rc == 1 && out && strstr(out, "nothing/config.json"), "missing model: rc %d %s", rc, out ? out : "");
    free(out);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* grad and step end to end: outputs exist, load, and the receipt carries what it promises. */
int test_cli_grad_step(void) {
    char dir[512], cmd[4096], path[800];
    int rc;
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    snprintf(cmd, sizeof cmd, "%s init --config %s/tests/reference/fixtures/next_moe/config.json --seed 4 --out %s/m",
             LS_CLI_PATH, LS_SOURCE_DIR, dir);
    char *out = run(cmd, &rc);
    T_CHECK(rc == 0, "init: %s", out ? out : "");
    free(out);
    snprintf(path, sizeof path, "%s/g.json", dir);
    FILE *f = fopen(path, "w");
    T_CHECK(f != NULL, "group");
    fputs("{\"prompt\": [", f);
    for (int i = 0; i < 150; i++) fprintf(f, "%s%d", i ? ", " : "", (i * 31 + 7) % 97);
    fputs("], \"responses\": [[3, 4, 5], [9, 8, 7, 6, 5], [1]], \"rewards\": [1, 0, 0.5]}\n", f);
    fclose(f);
    static const char *variants[] = {"", "--lora-rank 2 --lora-targets q_proj,in_proj_qkvz,gate_proj --lora-alpha 4"};
    static const char *files[] = {"model.safetensors", "adapter_model.safetensors"};
    for (int v = 0; v < 2; v++) {
        snprintf(cmd, sizeof cmd, "%s grad --model %s/m --group %s --out %s/g%d.safetensors --receipt %s/r%d.json %s",
                 LS_CLI_PATH, dir, path, dir, v, dir, v, variants[v]);
        out = run(cmd, &rc);
        T_CHECK(rc == 0, "grad %d: %s", v, out ? out : "");
        free(out);
        snprintf(cmd, sizeof cmd, "%s step --model %s/m --group %s --out %s/s%d --lr 1e-3 --num-iterations 2 %s",
                 LS_CLI_PATH, dir, path, dir, v, variants[v]);
        out = run(cmd, &rc);
        T_CHECK(rc == 0, "step %d: %s", v, out ? out : "");
        free(out);
        char rp[900], fp[900];
        snprintf(rp, sizeof rp, "%s/s%d/receipt.json", dir, v);
        snprintf(fp, sizeof fp, "%s/s%d/%s", dir, v, files[v]);
        char *text;
        T_OK(ls_read_file(rp, &text, NULL));
        cJSON *r = cJSON_Parse(text);
        free(text);
        T_CHECK(r, "receipt is not JSON");
        static const char *keys[] = {"phases_s", "arena_peak_bytes", "process_peak_rss_bytes", "m_live", "P", "G", "R",
                                     "metrics", "iterations"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            T_CHECK(cJSON_GetObjectItem(r, keys[k]), "receipt lacks %s", keys[k]);
        const cJSON *ml = cJSON_GetObjectItem(cJSON_GetObjectItem(r, "m_live"), "prompt");
        T_CHECK(cJSON_GetObjectItem(ml, "predicted")->valuedouble == cJSON_GetObjectItem(ml, "measured")->valuedouble,
                "prompt arena predicted != measured");
        T_CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(r, "iterations")) == 2, "two iterations");
        cJSON_Delete(r);
        ls_st_file sf;
        T_OK(ls_st_open(&sf, fp));
        T_CHECK(ls_st_count(&sf) > 0, "empty output");
        ls_st_close(&sf);
    }
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

static double jnum(const cJSON *j, const char *k) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, k);
    return cJSON_IsNumber(e) ? e->valuedouble : -1;
}

/* The MLA + DSA + MoE family's config and plan (issue 12 §1, §7): GLM-5.2 (IndexCache:
 * 21 of 78 layers run their own indexer) at 65,536 captured positions per rank in bf16
 * holds 72 MiB of latent pages per MLA layer + 16 MiB of index keys per full indexer
 * layer = 5.8125 GiB per rank (the seed's inventory); the parameter counts match the
 * published totals (GLM-5 744B, DeepSeek-V3.2 671B without MTP); bad fields are refused
 * by name; the family's weights are refused with what is missing. */
int test_mla_config_plan(void) {
    ls_config c;
    const ls_mla_config *mc = ls_mla_cfg(&c); /* the family's fields of c, whatever c holds */
    T_OK(ls_config_load(&c, LS_SOURCE_DIR "/examples/glm_5_2.json"));
    T_CHECK(c.family == &ls_mla_family && c.n_layers == 78 && ls_cfg_count_kind(&c, LS_LAYER_MLA) == 78, "glm layers");
    T_CHECK(ls_cfg_count_index_full(&c) == 21, "%d full indexer layers, expected 21", ls_cfg_count_index_full(&c));
    static const int full_at[] = {0, 1, 2, 6, 10, 74};
    for (size_t i = 0; i < sizeof full_at / sizeof full_at[0]; i++)
        T_CHECK(mc->index_full[full_at[i]], "layer %d should run its own indexer", full_at[i]);
    T_CHECK(!mc->index_full[3] && !mc->index_full[5] && !mc->index_full[77], "shared layers");
    T_CHECK(!c.moe[0] && !c.moe[2] && c.moe[3] && c.moe[77], "dense first 3 layers, MoE after");
    T_CHECK(mc->indexer_rope_interleave && c.rope_theta == 8e6 && mc->yarn_factor == 0, "glm rope");
    T_OK(ls_config_load(&c, LS_SOURCE_DIR "/examples/deepseek_v3_2.json"));
    T_CHECK(c.family == &ls_mla_family && ls_cfg_count_index_full(&c) == 61, "deepseek: every layer full");
    T_CHECK(!mc->indexer_rope_interleave && mc->yarn_factor == 40 && mc->yarn_orig_max == 4096 &&
                mc->n_group == 8 && mc->topk_group == 4 && mc->routed_scaling == 2.5,
            "deepseek yarn / groups");
    /* the inventory: 65,536 positions per rank over 8 ranks */
    char cmd[2048];
    int rc;
    snprintf(cmd, sizeof cmd, "%s plan --config %s/examples/glm_5_2.json --prompt 524289 --cp 8 --json", LS_CLI_PATH,
             LS_SOURCE_DIR);
    char *out = t_run_capture(cmd, &rc);
    cJSON *j = out && rc == 0 ? cJSON_Parse(out) : NULL;
    T_CHECK(j, "plan --json: rc %d: %s", rc, out ? out : "");
    const double MiB = 1024.0 * 1024.0, GiB = MiB * 1024.0;
    double lat = jnum(j, "latent_bytes_per_layer_per_rank"), idx = jnum(j, "index_bytes_per_layer_per_rank");
    double tot = jnum(j, "latent_bytes_per_rank") + jnum(j, "index_bytes_per_rank");
    printf("  GLM-5.2 at 65,536 positions per rank (bf16): %.2f MiB per MLA layer, %.2f MiB per index-key set, "
           "%.4f GiB per rank (+ %.0f bytes of tables)\n",
           lat / MiB, idx / MiB, tot / GiB, jnum(j, "table_bytes_per_rank"));
    T_CHECK(lat == 72 * MiB && idx == 16 * MiB, "per-layer rows %.0f, %.0f", lat, idx);
    T_CHECK(tot == 5.8125 * GiB, "per-rank total %.0f, expected 5.8125 GiB", tot);
    T_CHECK(jnum(j, "index_layers") == 21 && jnum(j, "pages_per_rank") == 1024, "index layers / pages");
    double pglm = jnum(j, "parameters");
    cJSON_Delete(j);
    free(out);
    snprintf(cmd, sizeof cmd, "%s plan --config %s/examples/deepseek_v3_2.json --prompt 4097 --json", LS_CLI_PATH,
             LS_SOURCE_DIR);
    out = t_run_capture(cmd, &rc);
    j = out && rc == 0 ? cJSON_Parse(out) : NULL;
    T_CHECK(j, "plan --json (deepseek): rc %d", rc);
    double pds = jnum(j, "parameters");
    cJSON_Delete(j);
    free(out);
    printf("  parameters: GLM-5 %.1fB (published 744B), DeepSeek-V3.2 %.1fB (published 671B + 14B MTP)\n", pglm / 1e9,
           pds / 1e9);
    T_CHECK(fabs(pglm / 744e9 - 1) < 0.005 && fabs(pds / 671e9 - 1) < 0.005, "parameter counts %.4g, %.4g", pglm,
            pds);
    /* the fp64 reference's checkpoints of the family (tests/reference/make_mla_fixtures.py,
     * written from the spec): the config reader's layers, indexer layers and parameter
     * count against the tensors they hold (MTP layers excluded) */
    static const char *mfx[] = {"mla_glm", "mla_glm_ic", "mla_dsv32", "mla_glm_types"};
    for (size_t f = 0; f < sizeof mfx / sizeof mfx[0]; f++) {
        char cp[1024], mp[1024];
        snprintf(cp, sizeof cp, "%s/tests/reference/fixtures/%s/config.json", LS_SOURCE_DIR, mfx[f]);
        snprintf(mp, sizeof mp, "%s/tests/reference/fixtures/%s/model.safetensors", LS_SOURCE_DIR, mfx[f]);
        T_OK(ls_config_load(&c, cp));
        size_t params = 0;
        T_CHECK(ls_mla_param_count(&c, &params) == 0, "%s: parameter count", mfx[f]);
        ls_st_file st;
        T_OK(ls_st_open(&st, mp));
        int64_t held = 0, idx_layers = 0, last = -1;
        for (int64_t i = 0; i < ls_st_count(&st); i++) {
            const ls_st_tensor *t = ls_st_at(&st, i);
            const char *L = strstr(t->name, "layers.");
            int64_t layer = L ? atoll(L + 7) : -1;
            if (layer >= c.n_layers) continue; /* MTP */
            held += t->numel;
            if (strstr(t->name, "indexer.wk.weight") && layer != last) idx_layers++, last = layer;
        }
        ls_st_close(&st);
        printf("  %-14s %lld parameters in the checkpoint, %zu from the config; %lld indexer layers, %d from the "
               "config\n", mfx[f], (long long)held, params, (long long)idx_layers, ls_cfg_count_index_full(&c));
        T_CHECK((int64_t)params == held, "%s: %zu parameters from the config, the checkpoint holds %lld", mfx[f], params,
                (long long)held);
        T_CHECK(idx_layers == ls_cfg_count_index_full(&c), "%s: indexer layers", mfx[f]);
        /* `init` writes the same tensors, names and shapes, as the reference's checkpoint */
        char dir0[512], cmd0[4096], got[700];
        T_CHECK(t_make_tmpdir(dir0, sizeof dir0) == 0, "tmpdir");
        snprintf(cmd0, sizeof cmd0, "%s init --config %s --out %s --dtype bf16 --seed 3 2>&1", LS_CLI_PATH, cp, dir0);
        char *o0 = t_run_capture(cmd0, &rc);
        T_CHECK(rc == 0, "init %s: %s", mfx[f], o0 ? o0 : "");
        free(o0);
        snprintf(got, sizeof got, "%s/model.safetensors", dir0);
        ls_st_file a, b;
        T_OK(ls_st_open(&a, got));
        T_OK(ls_st_open(&b, mp));
        int64_t same = 0;
        for (int64_t i = 0; i < ls_st_count(&b); i++) {
            const ls_st_tensor *tb = ls_st_at(&b, i), *ta = ls_st_find(&a, tb->name);
            const char *L = strstr(tb->name, "layers.");
            if (L && atoll(L + 7) >= c.n_layers) continue; /* MTP: not written */
            T_CHECK(ta && ta->ndim == tb->ndim, "%s: init lacks %s (or its rank differs)", mfx[f], tb->name);
            for (int d = 0; d < tb->ndim; d++) T_CHECK(ta->shape[d] == tb->shape[d], "%s: %s shape", mfx[f], tb->name);
            same++;
        }
        T_CHECK(same == ls_st_count(&a), "%s: init wrote %lld tensors, the reference %lld", mfx[f],
                (long long)ls_st_count(&a), (long long)same);
        ls_st_close(&a);
        ls_st_close(&b);
        T_CHECK(t_remove_dir(dir0) == 0, "cleanup");
    }
    /* refusals name the field */
    static const struct { const char *edit, *needle; } bad[] = {
        {"s/\"index_skip_topk_offset\": 3/\"index_skip_topk_offset\": 0/", "layer 0 is a shared indexer layer"},
        {"s/\"index_head_dim\": 128/\"index_head_dim\": 32/", "index_head_dim 32"},
        {"s/\"n_group\": 1,/\"n_group\": 3,/", "n_group 3"},
        {"s/\"kv_lora_rank\": 512,//", "kv_lora_rank"},
        {"s/\"scoring_func\": \"sigmoid\"/\"scoring_func\": \"softmax\"/", "scoring_func"},
    };
    char dir[512];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "sed '%s' %s/examples/glm_5_2.json > %s/c.json && %s plan --config %s/c.json --prompt 100 2>&1",
                 bad[i].edit, LS_SOURCE_DIR, dir, LS_CLI_PATH, dir);
        out = t_run_capture(cmd, &rc);
        T_CHECK(out && rc != 0 && strstr(out, bad[i].needle), "`%s`: rc %d: %s", bad[i].edit, rc, out ? out : "");
        free(out);
    }
    /* a config without weights: refused naming what is missing, before anything is allocated */
    snprintf(cmd, sizeof cmd, "mkdir -p %s/m && cp %s/examples/glm_5_2.json %s/m/config.json && %s logprobs --model %s/m "
             "--group x.json 2>&1", dir, LS_SOURCE_DIR, dir, LS_CLI_PATH, dir);
    out = t_run_capture(cmd, &rc);
    T_CHECK(out && rc != 0 && strstr(out, "safetensors") && !strstr(out, "memory"), "logprobs on glm_moe_dsa: rc %d: %s",
            rc, out ? out : "");
    free(out);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}
