/*
 * test_cli.c — the `longstraw` tool end to end: --help everywhere, flag errors,
 * `plan` on the Qwen3.5-27B layout (the numbers issue 2 names), `init` + `logprobs`
 * with capture vs --no-capture, and clean errors on bad group files.
 */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/config.h"
#include "longstraw/safetensors.h"
#include "testutil.h"

int test_cli_help_and_flags(void);
int test_cli_plan_27b(void);
int test_cli_init_logprobs(void);
int test_cli_grad_step(void);

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
    int64_t n;
    double d = compare_lp(cap, plain, &n);
    printf("  CLI capture vs --no-capture: max diff %.2e over %lld tokens\n", d, (long long)n);
    T_CHECK(n == 88 && d <= 1e-5, "capture vs plain %.3e over %lld tokens", d, (long long)n);
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
