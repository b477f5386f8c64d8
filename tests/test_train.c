/*
 * test_train.c — the training loop (trainer.h) and `longstraw train` / `longstraw demo`:
 *  - one update of the loop on a JSONL line equals `step` on the same group (the step
 *    path is checked against the fp64 reference in test_grpo_ref.c);
 *  - SIGKILL in the middle of a checkpoint write: the previous checkpoint is intact,
 *    --resume continues from it and ends with the same weights, optimizer state and
 *    metrics as an uninterrupted run; the same for LoRA adapters and their moments;
 *  - a step with a non-finite gradient is skipped and leaves weights and moments as
 *    they were;
 *  - malformed data is rejected naming the file, line and field;
 *  - rollouts with a reward process and text data; a failed update keeps the finished
 *    ones; long-context SFT; the demo prints its receipt.
 * Where a test is about the loop it calls ls_train_run in this process (t_train_opts,
 * t_train_logged): train_matches_step (`step` stays the command: the end-to-end
 * comparison), train_nan_step_skipped, train_rejects_bad_data, train_rollout_reward_cmd,
 * train_lora_resume, train_error_keeps_progress, train_sft_passkey. The binary runs
 * where the command itself is under test: its messages and usage errors, a resume from
 * the flags saved in RUN/args.json (train_lora_resume's last resume), and the tests
 * that signal a process — train_sigkill_resume and train_sigint_checkpoints (SIGKILL /
 * SIGINT to a running `train`, whose handler turns SIGINT into exit status 130) — and
 * demo_receipt (the `demo` command).
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "longstraw/config.h"
#include "longstraw/safetensors.h"
#include "longstraw/tokenizer.h"
#include "longstraw/trace.h"
#include "longstraw/trainer.h"
#include "testutil.h"

int test_train_matches_step(void);
int test_train_sigkill_resume(void);
int test_train_nan_step_skipped(void);
int test_train_rejects_bad_data(void);
int test_train_rollout_reward_cmd(void);
int test_demo_receipt(void);
int test_train_lora_resume(void);
int test_train_sigint_checkpoints(void);
int test_train_error_keeps_progress(void);
int test_train_sft_passkey(void);


static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return 1;
    fputs(text, f);
    return fclose(f) != 0;
}

/* A group line of ids: prompt of P tokens, responses of the given lengths, rewards. */
static void group_line(FILE *f, int P, int G, const int *R, const double *rw, int seed, const char *adv) {
    fputs("{\"prompt\": [", f);
    for (int i = 0; i < P; i++) fprintf(f, "%s%d", i ? ", " : "", (i * 31 + seed * 7 + 3) % 97);
    fputs("], \"responses\": [", f);
    for (int g = 0; g < G; g++) {
        fputs(g ? ", [" : "[", f);
        for (int t = 0; t < R[g]; t++) fprintf(f, "%s%d", t ? ", " : "", (t * 13 + g * 5 + seed) % 97);
        fputc(']', f);
    }
    if (adv) fprintf(f, "], \"advantages\": %s}\n", adv);
    else {
        fputs("], \"rewards\": [", f);
        for (int g = 0; g < G; g++) fprintf(f, "%s%g", g ? ", " : "", rw[g]);
        fputs("]}\n", f);
    }
}

static int make_data(const char *path, int lines, int nan_line) {
    FILE *f = fopen(path, "w");
    if (!f) return 1;
    static const int R[4] = {3, 6, 2, 5};
    static const double rw[4] = {1.0, 0.0, 0.5, 0.25};
    for (int l = 0; l < lines; l++)
        group_line(f, 40 + 9 * l, 3 + (l % 2), R, rw, l,
                   l != nan_line ? NULL : l % 2 ? "[1e300, -1e300, 1e300, -1e300]" : "[1e300, -1e300, 1e300]");
    return fclose(f) != 0;
}

/* max |a − b| over every tensor of two safetensors files with the same names; −1 when
 * they differ in names or sizes. */
static double st_diff(const char *a, const char *b) {
    ls_st_file fa, fb;
    if (ls_st_open(&fa, a) != LS_OK) return -1;
    if (ls_st_open(&fb, b) != LS_OK) {
        ls_st_close(&fa);
        return -1;
    }
    double worst = ls_st_count(&fa) == ls_st_count(&fb) && ls_st_count(&fa) > 0 ? 0 : -1;
    for (int64_t i = 0; i < ls_st_count(&fa) && worst >= 0; i++) {
        const ls_st_tensor *ta = ls_st_at(&fa, i), *tb = ls_st_find(&fb, ta->name);
        if (!tb || tb->numel != ta->numel) {
            worst = -1;
            break;
        }
        float *x = malloc((size_t)(ta->numel + 1) * sizeof(float)), *y = malloc((size_t)(ta->numel + 1) * sizeof(float));
        if (x && y && ls_st_read_f32(ta, x, ta->numel, NULL) == LS_OK && ls_st_read_f32(tb, y, tb->numel, NULL) == LS_OK) {
            for (int64_t k = 0; k < ta->numel; k++) {
                double d = fabs((double)x[k] - (double)y[k]);
                if (!(d <= worst)) worst = d; /* NaN propagates as "larger" */
            }
        } else {
            worst = -1;
        }
        free(x);
        free(y);
    }
    ls_st_close(&fa);
    ls_st_close(&fb);
    return worst;
}

/* st_diff of dir/ra/checkpoint-<k>/file and dir/rb/checkpoint-<k>/file. */
static double ckpt_diff(const char *dir, const char *ra, const char *rb, int k, const char *file) {
    char a[900], b[900];
    snprintf(a, sizeof a, "%s/%s/checkpoint-%d/%s", dir, ra, k, file);
    snprintf(b, sizeof b, "%s/%s/checkpoint-%d/%s", dir, rb, k, file);
    return st_diff(a, b);
}

static int init_model(const char *dir, const char *config, int seed) {
    char m[700];
    snprintf(m, sizeof m, "%s/m", dir);
    return t_write_model(config, m, seed);
}

/* A temporary directory with a model of a fixture's config (all have 97 ids) at dir/m
 * (seed) and, when lines > 0, dir/d.jsonl of that many group lines. */
static int setup_fixture(const char *fixture, char *dir, size_t n, char *data, size_t dn, int seed, int lines,
                         int nan_line) {
    char cfg[700];
    if (t_make_tmpdir(dir, n) != 0) return 1;
    snprintf(cfg, sizeof cfg, "%s/tests/reference/fixtures/%s/config.json", LS_SOURCE_DIR, fixture);
    if (init_model(dir, cfg, seed) != 0) return 1;
    snprintf(data, dn, "%s/d.jsonl", dir);
    return lines > 0 ? make_data(data, lines, nan_line) : 0;
}

/* A temporary directory with a tiny model whose 260 ids cover the byte-level
 * tokenizer's 257 (dir/m) and that tokenizer (path in tok). */
static int setup_bytes(char *dir, size_t n, char *tok, size_t tn, int seed) {
    char cfg[700], *json;
    if (t_make_tmpdir(dir, n) != 0) return 1;
    snprintf(cfg, sizeof cfg, "%s/c.json", dir);
    if (write_text(cfg, "{\"model_type\": \"qwen3_next\", \"vocab_size\": 260, \"hidden_size\": 32, \"num_hidden_layers\": 2,"
                        " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 16,"
                        " \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 2, \"linear_key_head_dim\": 8,"
                        " \"linear_value_head_dim\": 8, \"intermediate_size\": 48, \"num_experts\": 0,"
                        " \"full_attention_interval\": 2}") != 0 ||
        init_model(dir, cfg, seed) != 0 || ls_tok_byte_level_json(&json) != LS_OK)
        return 1;
    snprintf(tok, tn, "%s/tokenizer.json", dir);
    int r = write_text(tok, json);
    free(json);
    return r;
}


/* Parse metrics.jsonl into an array of objects (cJSON, caller deletes). */
static cJSON *read_metrics(const char *run_dir) {
    char path[700], *text;
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    if (ls_read_file(path, &text, NULL) != LS_OK) return NULL;
    cJSON *arr = cJSON_CreateArray();
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        if (!o) {
            cJSON_Delete(arr);
            free(text);
            return NULL;
        }
        cJSON_AddItemToArray(arr, o);
    }
    free(text);
    return arr;
}

static double num(const cJSON *o, const char *k) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(e) ? e->valuedouble : NAN;
}

int test_train_matches_step(void) {
    char dir[512], data[700], grp[700], a[900], b[900];
    int rc;
    T_CHECK(setup_fixture("next_dense", dir, sizeof dir, data, sizeof data, 5, 2, -1) == 0, "setup");
    /* the first line alone as a group file */
    snprintf(grp, sizeof grp, "%s/g.json", dir);
    FILE *f = fopen(grp, "w");
    static const int R[4] = {3, 6, 2, 5};
    static const double rw[4] = {1.0, 0.0, 0.5, 0.25};
    group_line(f, 40, 3, R, rw, 0, NULL);
    fclose(f);
    const char *flags = "--lr 1e-3 --beta 0 --epsilon 0.2 --max-grad-norm 0.5 --threads 2";
    /* the loop with those flags (and --updates 1), on 2 threads as `step` runs */
    ls_train_opts o;
    ls_train_result res;
    char model[600], run[600], *log;
    t_train_opts(&o, model, sizeof model, run, sizeof run, dir, "run", data);
    o.updates = 1;
    o.o.lr = 1e-3;
    o.o.beta = 0;
    o.o.eps_low = o.o.eps_high = 0.2;
    o.o.max_grad_norm = 0.5;
    /* the command line `train` saves as RUN/args.json */
    char *argv[] = {"train", "--model", model, "--data", data, "--out", run, "--updates", "1", "--quiet",
                    "--lr", "1e-3", "--beta", "0", "--epsilon", "0.2", "--max-grad-norm", "0.5", "--threads", "2"};
    o.argc = (int)(sizeof argv / sizeof argv[0]);
    o.argv = argv;
    int threads = ls_get_threads();
    ls_set_threads(2);
    ls_status st = t_train_logged(&o, &res, &log);
    ls_set_threads(threads);
    T_CHECK(st == LS_OK && res.updates == 1 && res.skipped == 0 && log && strstr(log, "update 1/1"),
            "train: %s (%s), %lld updates, %d skipped: %s", ls_status_name(st), st ? ls_err_msg() : "",
            (long long)res.updates, res.skipped, log ? log : "");
    free(log);
    char *out = t_run_fmt(&rc, "%s step --model %s/m --group %s --out %s/step %s", LS_CLI_PATH, dir, grp, dir, flags);
    T_CHECK(rc == 0, "step: %s", out ? out : "");
    free(out);
    snprintf(a, sizeof a, "%s/run/checkpoint-1/model.safetensors", dir);
    snprintf(b, sizeof b, "%s/step/model.safetensors", dir);
    double d = st_diff(a, b);
    printf("  train (1 update) vs step on the same group: max |ΔW| = %.3g\n", d);
    T_CHECK(d >= 0 && d <= 1e-7, "train vs step: %g", d);
    /* what a run directory holds */
    static const char *files[] = {"args.json", "metrics.jsonl", "trace.0.jsonl", "receipt.json",
                                  "checkpoint-1/optimizer.safetensors", "checkpoint-1/trainer_state.json",
                                  "checkpoint-1/config.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(a, sizeof a, "%s/run/%s", dir, files[i]);
        T_CHECK(access(a, R_OK) == 0, "missing %s", a);
    }
    snprintf(a, sizeof a, "%s/run", dir);
    cJSON *m = read_metrics(a);
    T_CHECK(m && cJSON_GetArraySize(m) == 1, "metrics lines");
    static const char *names[] = {"reward", "reward_std", "kl", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean",
                                  "completions/mean_length", "grad_norm", "step_time"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        T_CHECK(isfinite(num(cJSON_GetArrayItem(m, 0), names[i])), "metric %s missing", names[i]);
    T_CHECK(fabs(num(cJSON_GetArrayItem(m, 0), "reward") - 0.5) <= 1e-12, "reward mean of (1, 0, 0.5)");
    T_CHECK(fabs(num(cJSON_GetArrayItem(m, 0), "completions/mean_length") - 11.0 / 3) <= 1e-6, "mean length");
    cJSON_Delete(m);
    /* a second run into the same directory must not silently start over: refused,
     * pointing at --resume, before any update */
    t_train_opts(&o, model, sizeof model, run, sizeof run, dir, "run", data);
    o.updates = 1;
    st = ls_train_run(&o, &res);
    T_CHECK(st == LS_ERR_ARG && strstr(ls_err_msg(), "already holds") && strstr(ls_err_msg(), "--resume") &&
                res.updates == 0, "rerun into a run dir: %s: %s, %lld updates", ls_status_name(st), ls_err_msg(),
            (long long)res.updates);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

int test_train_sigkill_resume(void) {
    char dir[512], data[700], a[900], b[900];
    int rc;
    T_CHECK(setup_fixture("next_dense", dir, sizeof dir, data, sizeof data, 6, 3, -1) == 0, "setup");
    /* 5 updates over 3 lines (the data wraps), two groups per update, a checkpoint
     * after every update */
    const char *flags = "--updates 5 --groups-per-update 2 --save-every 1 --save-total-limit 5 --lr 2e-3 --quiet --threads 2";
    char *out = t_run_fmt(&rc, "%s train --model %s/m --data %s --out %s/A %s", LS_CLI_PATH, dir, data, dir, flags);
    T_CHECK(rc == 0, "uninterrupted run: %s", out ? out : "");
    free(out);
    /* the same run, killed while it writes checkpoint-3 */
    pid_t pid = fork();
    T_CHECK(pid >= 0, "fork");
    if (pid == 0) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "exec %s train --model %s/m --data %s --out %s/B %s >/dev/null 2>&1", LS_CLI_PATH, dir,
                 data, dir, flags);
        setenv("LONGSTRAW_TEST_CHECKPOINT_PAUSE_MS", "400", 1);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    snprintf(a, sizeof a, "%s/B/.checkpoint-3.tmp/model.safetensors", dir);
    int seen = 0;
    for (int i = 0; i < 6000 && !seen; i++) { /* up to 60 s */
        seen = access(a, F_OK) == 0;
        if (!seen) usleep(10000);
    }
    T_CHECK(seen, "checkpoint-3 never started");
    T_CHECK(kill(pid, SIGKILL) == 0, "kill");
    int st;
    T_CHECK(waitpid(pid, &st, 0) == pid && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "not killed by SIGKILL");
    snprintf(a, sizeof a, "%s/B/checkpoint-3", dir);
    T_CHECK(access(a, F_OK) != 0, "a checkpoint-3 exists although its writer was killed");
    snprintf(a, sizeof a, "%s/B/checkpoint-2/trainer_state.json", dir);
    T_CHECK(access(a, R_OK) == 0, "the previous checkpoint is incomplete");
    double d = ckpt_diff(dir, "A", "B", 2, "model.safetensors");
    T_CHECK(d >= 0 && d <= 1e-6, "checkpoint-2 differs from the uninterrupted run's: %g", d);
    /* resume: the saved flags, nothing else */
    out = t_run_fmt(&rc, "%s train --resume %s/B", LS_CLI_PATH, dir);
    T_CHECK(rc == 0 && out && strstr(out, "resumed from") && strstr(out, "update 2"), "resume: rc %d %s", rc,
            out ? out : "");
    free(out);
    snprintf(a, sizeof a, "%s/B/.checkpoint-3.tmp", dir);
    T_CHECK(access(a, F_OK) != 0, "the stale partial checkpoint was not removed");
    static const char *files[] = {"model.safetensors", "optimizer.safetensors"};
    for (int k = 0; k < 2; k++) {
        d = ckpt_diff(dir, "A", "B", 5, files[k]);
        printf("  killed during checkpoint-3 + resumed vs uninterrupted: %s max diff %.3g\n", files[k], d);
        T_CHECK(d >= 0 && d <= 1e-6, "%s differs after resume: %g", files[k], d);
    }
    snprintf(a, sizeof a, "%s/A", dir);
    snprintf(b, sizeof b, "%s/B", dir);
    cJSON *ma = read_metrics(a), *mb = read_metrics(b);
    T_CHECK(ma && mb && cJSON_GetArraySize(ma) == 5 && cJSON_GetArraySize(mb) == 5, "metrics: 5 lines each");
    for (int u = 0; u < 5; u++) {
        const cJSON *x = cJSON_GetArrayItem(ma, u), *y = cJSON_GetArrayItem(mb, u);
        T_CHECK(num(x, "update") == u && num(y, "update") == u, "metrics line %d is update %g", u, num(y, "update"));
        double dl = fabs(num(x, "loss") - num(y, "loss")), dg = fabs(num(x, "grad_norm") - num(y, "grad_norm"));
        T_CHECK(dl <= 1e-7 && dg <= 1e-6 * fmax(1, num(x, "grad_norm")), "update %d: loss %g vs %g", u, num(x, "loss"),
                num(y, "loss"));
        T_CHECK(num(y, "data_position") == 2 * (u + 1), "update %d data position %g", u, num(y, "data_position"));
    }
    cJSON_Delete(ma);
    cJSON_Delete(mb);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

int test_train_nan_step_skipped(void) {
    char dir[512], data[700], a[900], b[900];
    /* line 2's advantages overflow float in the token terms: an infinite gradient */
    T_CHECK(setup_fixture("next_dense", dir, sizeof dir, data, sizeof data, 7, 3, 1) == 0, "setup");
    { /* through the library: the skip is in its result and the metrics */
        ls_train_opts o;
        ls_train_result res;
        char model[600], run[600];
        t_train_opts(&o, model, sizeof model, run, sizeof run, dir, "run", data);
        o.save_every = 1;
        o.save_total_limit = 5;
        o.o.lr = 1e-3;
        T_OK(ls_train_run(&o, &res));
        T_CHECK(res.updates == 3 && res.skipped == 1 && !res.stop_signal, "ls_train_run: %lld updates, %d skipped",
                (long long)res.updates, res.skipped);
    }
    snprintf(a, sizeof a, "%s/run/checkpoint-1/model.safetensors", dir);
    snprintf(b, sizeof b, "%s/run/checkpoint-2/model.safetensors", dir);
    double d = st_diff(a, b);
    T_CHECK(d == 0, "the skipped step changed the weights: %g", d);
    snprintf(a, sizeof a, "%s/run/checkpoint-1/optimizer.safetensors", dir);
    snprintf(b, sizeof b, "%s/run/checkpoint-2/optimizer.safetensors", dir);
    d = st_diff(a, b);
    T_CHECK(d == 0, "the skipped step changed the optimizer moments: %g", d);
    snprintf(a, sizeof a, "%s/run/checkpoint-3/model.safetensors", dir);
    snprintf(b, sizeof b, "%s/run/checkpoint-2/model.safetensors", dir);
    d = st_diff(a, b);
    T_CHECK(d > 0, "the step after the skip did not train");
    snprintf(a, sizeof a, "%s/run", dir);
    cJSON *m = read_metrics(a);
    T_CHECK(m && cJSON_GetArraySize(m) == 3, "metrics lines");
    T_CHECK(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 1), "skipped")) &&
                cJSON_IsFalse(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 2), "skipped")),
            "skipped flags");
    T_CHECK(num(cJSON_GetArrayItem(m, 1), "step") == 1 && num(cJSON_GetArrayItem(m, 2), "step") == 2,
            "optimizer steps 1, 1, 2");
    cJSON_Delete(m);
    /* a run whose last update is skipped still writes a receipt that is JSON (and the
     * command says so) */
    {
        ls_train_opts o;
        ls_train_result res;
        char model[600], run[600], *log;
        t_train_opts(&o, model, sizeof model, run, sizeof run, dir, "run2", data);
        o.updates = 2;
        ls_status st = t_train_logged(&o, &res, &log);
        T_CHECK(st == LS_OK && res.updates == 2 && res.skipped == 1 && log && strstr(log, "update 2/2 SKIPPED"),
                "run2: %s, %lld updates, %d skipped: %s", ls_status_name(st), (long long)res.updates, res.skipped,
                log ? log : "");
        free(log);
    }
    snprintf(a, sizeof a, "%s/run2/receipt.json", dir);
    char *text;
    T_OK(ls_read_file(a, &text, NULL));
    cJSON *rj = cJSON_Parse(text);
    T_CHECK(rj != NULL, "receipt after a skipped update is not JSON: %s", text);
    cJSON_Delete(rj);
    free(text);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

int test_train_rejects_bad_data(void) {
    char dir[512], data[700];
    int rc;
    T_CHECK(setup_fixture("next_dense", dir, sizeof dir, data, sizeof data, 8, 0, -1) == 0, "setup");
    static const struct { const char *line, *needle; } bad[] = {
        {"{\"prompt\": [1, 2, 3], \"responses\": [[1]], \"rewards\": [1]}", "\"responses\" has 1 entry: GRPO needs G >= 2"},
        {"{\"prompt\": [1, 2, 3], \"responses\": [[1], [4, 200]], \"rewards\": [1, 0]}",
         "\"responses[1]\"[1] = 200 is not a token id in [0, 97)"},
        {"{\"prompt\": [1, 2, 3], \"responses\": [[1], []], \"rewards\": [1, 0]}", "\"responses[1]\" is empty"},
        {"{\"prompt\": [1, 2, 3], \"responses\": [[1], [2]]}", "needs \"rewards\" or \"advantages\""},
        {"{\"prompt\": [1, 2, 3], \"responses\": [[1], [2]], \"rewards\": [1]}", "\"rewards\" has 1 entries, expected 2"},
        {"{\"prompt\": \"some text\", \"responses\": [[1], [2]], \"rewards\": [1, 0]}", "\"prompt\" is text: give a tokenizer"},
        {"{\"prompt\": [1, 2, 3], \"responses\": [[1], [2]], \"rewards\": [1, \"x\"]}", "\"rewards\"[1] must be a finite number"},
        {"{\"prompt\": [1, 2, 3], \"responses\": [[1], [2]], \"rewards\": [1, 0]", "invalid JSON"},
        {"{\"prompt\": [1, 2, 3], \"responses\": [[1], [2.5]], \"rewards\": [1, 0]}", "\"responses[1]\"[0] = 2.5 is not a token id"},
        {"{\"prompt\": [1, 2, 3], \"responses\": [], \"rewards\": []}", "\"responses\" must be a non-empty array"},
        {"[1, 2, 3]", "top level must be a JSON object"},
        {"{\"prompt\": [1, 2, 3], \"responses\": [\"a\\u0000b\", [2]], \"rewards\": [1, 0]}", "holds \\u0000 (NUL)"},
        {"{\"responses\": [[1], [2]], \"rewards\": [1, 0]}", "missing field \"prompt\""},
    };
    snprintf(data, sizeof data, "%s/d.jsonl", dir);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        /* the bad group sits on line 3, after a good one and a blank line */
        FILE *f = fopen(data, "w");
        T_CHECK(f != NULL, "data");
        fputs("{\"prompt\": [1, 2, 3], \"responses\": [[1], [2]], \"rewards\": [1, 0]}\n\n", f);
        fprintf(f, "%s\n", bad[i].line);
        fclose(f);
        ls_train_opts o;
        ls_train_result res = {0};
        char model[600], run[600], rname[32], where[800];
        snprintf(rname, sizeof rname, "run%zu", i);
        t_train_opts(&o, model, sizeof model, run, sizeof run, dir, rname, data);
        ls_status st = ls_train_run(&o, &res);
        snprintf(where, sizeof where, "%s:3: ", data);
        T_CHECK((st == LS_ERR_FORMAT || st == LS_ERR_ARG) && strstr(ls_err_msg(), where) && strstr(ls_err_msg(), bad[i].needle),
                "case %zu: %s, wanted \"%s%s\", got %s", i, ls_status_name(st), where, bad[i].needle, ls_err_msg());
        T_CHECK(res.updates == 0, "case %zu: the bad line was found only after %lld updates", i, (long long)res.updates);
    }
    T_CHECK(write_text(data, "\n\n") == 0, "empty data");
    {
        ls_train_opts o;
        ls_train_result res = {0};
        char model[600], run[600];
        t_train_opts(&o, model, sizeof model, run, sizeof run, dir, "runE", data);
        ls_status st = ls_train_run(&o, &res);
        T_CHECK(st != LS_OK && strstr(ls_err_msg(), "no groups") && res.updates == 0, "empty data: %s: %s",
                ls_status_name(st), ls_err_msg());
    }
    char *out;
    /* the command line's own refusals */
    out = t_run_fmt(&rc, "%s train --resume %s/nowhere", LS_CLI_PATH, dir);
    T_CHECK(rc == 1 && out && strstr(out, "nowhere/args.json"), "resume of nothing: %s", out ? out : "");
    free(out);
    out = t_run_fmt(&rc, "%s train --model %s/m --out %s/runF --task passkey", LS_CLI_PATH, dir, dir);
    T_CHECK(rc == 2 && out && strstr(out, "add --rollout"), "task without rollout: %s", out ? out : "");
    free(out);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

int test_train_rollout_reward_cmd(void) {
    char dir[512], data[700], tok[700];
    T_CHECK(setup_bytes(dir, sizeof dir, tok, sizeof tok, 9) == 0, "setup");
    snprintf(data, sizeof data, "%s/prompts.jsonl", dir);
    T_CHECK(write_text(data, "{\"prompt\": \"The capital of France is\"}\n{\"prompt\": \"Zwei plus zwei ist \\u00e9gal\"}\n"
                             "{\"prompt\": \"def f(x):\\n    return\"}\n") == 0, "prompts");
    /* reward = the item's index within its group: mean (G−1)/2, group std known */
    ls_train_opts o;
    ls_train_result res;
    char model[600], run[600];
    t_train_opts(&o, model, sizeof model, run, sizeof run, dir, "run", data);
    o.tokenizer = tok;
    o.rollout = 1;
    o.num_generations = 4;
    o.max_new_tokens = 5;
    o.updates = 2;
    o.groups_per_update = 2;
    o.o.fwd.temperature = 1.0f;
    o.top_p = 0.95;
    o.o.lr = 1e-3;
    o.trace_layers = 1;
    o.reward_cmd = "sed -u -e 's/.*\"index\": *\\([0-9]*\\).*/\\1/'";
    ls_status st = ls_train_run(&o, &res);
    T_CHECK(st == LS_OK && res.updates == 2 && res.skipped == 0, "rollout train: %s: %s, %lld updates, %d skipped",
            ls_status_name(st), ls_err_msg(), (long long)res.updates, res.skipped);
    char path[800];
    snprintf(path, sizeof path, "%s/run", dir);
    cJSON *m = read_metrics(path);
    T_CHECK(m && cJSON_GetArraySize(m) == 2, "metrics");
    for (int u = 0; u < 2; u++) {
        const cJSON *line = cJSON_GetArrayItem(m, u);
        double r = num(line, "reward"), sd = num(line, "reward_std"), len = num(line, "completions/mean_length");
        T_CHECK(fabs(r - 1.5) <= 1e-12 && fabs(sd - sqrt(5.0 / 3.0)) <= 1e-7, "update %d reward %g ± %g", u, r, sd);
        T_CHECK(len >= 1 && len <= 5 && num(line, "num_sequences") == 8, "update %d length %g", u, len);
        T_CHECK(num(line, "data_position") == 2 * (u + 1), "data position");
    }
    cJSON_Delete(m);
    /* the trace has rollout and reward phases */
    char *trace;
    snprintf(path, sizeof path, "%s/run/trace.0.jsonl", dir);
    T_OK(ls_read_file(path, &trace, NULL));
    T_CHECK(strstr(trace, "\"phase\": \"rollout\"") && strstr(trace, "\"phase\": \"reward\"") &&
                strstr(trace, "\"ev\": \"layer_end\"") && strstr(trace, "\"pass\": \"bwd\""),
            "trace phases");
    /* --trace-layers 1: layer events for the first update only */
    int late = 0;
    for (char *l = strtok(trace, "\n"); l; l = strtok(NULL, "\n"))
        late += strstr(l, "\"ev\": \"layer_end\"") && !strstr(l, "\"update\": 0,");
    T_CHECK(late == 0, "%d layer events after the first update despite --trace-layers 1", late);
    free(trace);
    /* rewards from each prompt's "answer" (exact match), and the built-in passkey task
     * with the built-in byte-level tokenizer: rewards are 0 or 1 */
    snprintf(path, sizeof path, "%s/answers.jsonl", dir);
    T_CHECK(write_text(path, "{\"prompt\": \"2 + 2 =\", \"answer\": \"4\"}\n{\"prompt\": \"Say a\", \"answer\": \"a\"}\n") == 0,
            "answers");
    const char *runs[2] = {"run3: answers.jsonl with tokenizer.json", "run4: the passkey task, prompt length 400"};
    for (int k = 0; k < 2; k++) {
        char answers[700];
        snprintf(answers, sizeof answers, "%s/answers.jsonl", dir);
        t_train_opts(&o, model, sizeof model, run, sizeof run, dir, k ? "run4" : "run3", k ? NULL : answers);
        o.tokenizer = k ? NULL : tok;
        o.task = k ? "passkey" : NULL;
        o.prompt_len = k ? 400 : o.prompt_len;
        o.rollout = 1;
        o.num_generations = 3;
        o.max_new_tokens = 4;
        o.updates = 2;
        st = ls_train_run(&o, &res);
        T_CHECK(st == LS_OK && res.updates == 2, "%s: %s: %s", runs[k], ls_status_name(st), ls_err_msg());
        m = read_metrics(run);
        T_CHECK(m && cJSON_GetArraySize(m) == 2, "%s: metrics", runs[k]);
        for (int u = 0; u < 2; u++) {
            double r3 = 3 * num(cJSON_GetArrayItem(m, u), "reward"); /* mean of three 0/1 rewards */
            T_CHECK(fabs(r3 - round(r3)) <= 1e-9 && r3 >= 0 && r3 <= 3, "%s: reward %g", runs[k], r3 / 3);
        }
        cJSON_Delete(m);
    }
    /* a reward process that answers nonsense is an error naming it */
    t_train_opts(&o, model, sizeof model, run, sizeof run, dir, "run2", data);
    o.tokenizer = tok;
    o.rollout = 1;
    o.num_generations = 2;
    o.max_new_tokens = 2;
    o.updates = 1;
    o.reward_cmd = "sed -u s/.*/abc/";
    st = ls_train_run(&o, &res);
    T_CHECK(st != LS_OK && strstr(ls_err_msg(), "abc") && res.updates == 0, "bad reward answer: %s: %s, %lld updates",
            ls_status_name(st), ls_err_msg(), (long long)res.updates);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

int test_demo_receipt(void) {
    char dir[512], path[800];
    int rc;
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    char *out = t_run_fmt(&rc, "%s demo --out %s/demo --prompt-len 700 --updates 2 --num-generations 4 --quiet --threads 2",
                    LS_CLI_PATH, dir);
    T_CHECK(rc == 0 && out && strstr(out, "predicted vs measured") && strstr(out, "replay") &&
                strstr(out, "memory.svg") && strstr(out, "update 2/2"),
            "demo: rc %d %s", rc, out ? out : "");
    /* the learning it shows: held-out exact match before and after, the reward's trend */
    T_CHECK(strstr(out, "held-out     exact match") && strstr(out, "before ->") && strstr(out, "reward       ") &&
                strstr(out, "eval.svg"), "demo summary: %s", out);
    static const char *files[] = {"model/config.json", "model/model.safetensors", "tokenizer.json", "run/eval.json",
                                  "run/metrics.svg", "run/checkpoint-2/model.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        struct stat fst;
        snprintf(path, sizeof path, "%s/demo/%s", dir, files[i]);
        T_CHECK(stat(path, &fst) == 0 && fst.st_size > 0, "demo left no %s", path);
    }
    /* the receipt's M_live terms: the prompt state and the gradients are exactly what
     * the config predicts */
    const char *pv = strstr(out, "predicted vs measured");
    T_CHECK(pv != NULL, "no predicted vs measured block");
    static const char *terms[] = {"\n  prompt ", "\n  grad ", "\n  fixed "};
    for (int k = 0; k < 3; k++) {
        const char *line = strstr(pv, terms[k]);
        T_CHECK(line != NULL, "receipt: no %s row", terms[k] + 3);
        const char *eol = strchr(line + 1, '\n');
        T_CHECK(eol && eol - line > 6 && strncmp(eol - 5, "1.000", 5) == 0, "receipt: %s predicted != measured: %.*s",
                terms[k] + 3, eol ? (int)(eol - line) : 40, line + 1);
    }
    free(out);
    snprintf(path, sizeof path, "%s/demo/run/memory.svg", dir);
    char *svg;
    T_OK(ls_read_file(path, &svg, NULL));
    T_CHECK(strncmp(svg, "<svg", 4) == 0 || strncmp(svg, "<?xml", 5) == 0, "svg header");
    free(svg);
    /* rerunning replaces the demo's run; a foreign directory is refused */
    out = t_run_fmt(&rc, "%s demo --out %s/demo --prompt-len 600 --updates 1 --num-generations 2 --quiet", LS_CLI_PATH, dir);
    T_CHECK(rc == 0, "demo rerun: %s", out ? out : "");
    free(out);
    out = t_run_fmt(&rc, "%s demo --out %s --updates 1 --quiet", LS_CLI_PATH, dir);
    T_CHECK(rc == 1 && out && strstr(out, "not a demo directory"), "foreign dir: %s", out ? out : "");
    free(out);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* test_train_lora_resume's runs: `train --model dir/m --data DATA --out dir/<run> --updates U
 * --lora-rank 2 --lora-targets T --lr 1e-2 --save-every 1 --quiet`. */
static void lora_opts(ls_train_opts *o, char *model, size_t mn, char *run, size_t rn, const char *dir,
                      const char *run_name, const char *data, const char *targets, int64_t updates) {
    t_train_opts(o, model, mn, run, rn, dir, run_name, data);
    o->updates = updates;
    o->spec.lora_rank = 2;
    o->spec.lora_targets = targets;
    o->o.lr = 1e-2;
    o->save_every = 1;
}

/* LoRA: a run stopped after 2 updates and resumed to 3 ends with the adapters and
 * adapter moments of an uninterrupted 3-update run; the resumed checkpoint's
 * adapter_config.json keeps r and the targets. The runs are the library's; the last
 * resume is the command's, from the flags RUN/args.json holds. */
int test_train_lora_resume(void) {
    /* next_dense: new and loaded adapters list their modules in the same order;
     * q35_moe (split projections): new ones in layer order, loaded ones in name order,
     * so the optimizer state must be matched by name */
    static const char *fixtures[2] = {"next_dense", "q35_moe"};
    static const char *targets[2] = {"q_proj,in_proj_qkvz", "in_proj_z,in_proj_a,q_proj,gate_proj"};
    for (int f = 0; f < 2; f++) {
        char dir[512], data[700], b[900], model[600], run[600], *log;
        int rc;
        ls_train_opts o;
        ls_train_result res;
        T_CHECK(setup_fixture(fixtures[f], dir, sizeof dir, data, sizeof data, 10, 3, -1) == 0, "setup");
        lora_opts(&o, model, sizeof model, run, sizeof run, dir, "A", data, targets[f], 3);
        ls_status st = ls_train_run(&o, &res);
        T_CHECK(st == LS_OK && res.updates == 3, "run A: %s: %s", ls_status_name(st), ls_err_msg());
        /* B saves its command line (RUN/args.json), as `train` does: the command resumes it below */
        lora_opts(&o, model, sizeof model, run, sizeof run, dir, "B", data, targets[f], 2);
        char *argv[] = {"train", "--model", model, "--data", data, "--out", run, "--updates", "2", "--lora-rank", "2",
                        "--lora-targets", (char *)targets[f], "--lr", "1e-2", "--save-every", "1", "--quiet"};
        o.argc = (int)(sizeof argv / sizeof argv[0]);
        o.argv = argv;
        st = ls_train_run(&o, &res);
        T_CHECK(st == LS_OK && res.updates == 2, "run B: %s: %s", ls_status_name(st), ls_err_msg());
        /* resume B to 3 updates (the same directory, with a slash): its saved flags with
         * --updates 3 after them are what it saves, as `train --resume B/ --updates 3` does */
        lora_opts(&o, model, sizeof model, run, sizeof run, dir, "B/", data, targets[f], 3);
        o.resume = 1;
        char *more[] = {"train", "--updates", "3"}, **nargv = NULL;
        int nargc = 0;
        T_OK(ls_train_saved_args(run, 3, more, &nargc, &nargv));
        o.argc = nargc;
        o.argv = nargv;
        st = t_train_logged(&o, &res, &log);
        for (int i = 0; i < nargc; i++) free(nargv[i]);
        free(nargv);
        T_CHECK(st == LS_OK && res.updates == 1 && log && strstr(log, "update 3/3"), "%s: resume B: %s (%s): %s",
                fixtures[f], ls_status_name(st), st ? ls_err_msg() : "", log ? log : "");
        free(log);
        /* the override is saved with the run: a plain resume by the command now has
         * nothing left to do */
        char *out = t_run_fmt(&rc, "%s train --resume %s/B", LS_CLI_PATH, dir); /* no slash now */
        T_CHECK(rc == 0 && out && strstr(out, "3 updates already done (--updates 3)"), "second resume: %s",
                out ? out : "");
        free(out);
        static const char *files[] = {"adapter_model.safetensors", "optimizer.safetensors"};
        for (int k = 0; k < 2; k++) {
            double d = ckpt_diff(dir, "A", "B", 3, files[k]);
            printf("  %s LoRA, resumed vs uninterrupted: %s max diff %.3g\n", fixtures[f], files[k], d);
            T_CHECK(d >= 0 && d <= 1e-6, "%s: LoRA %s after resume differs: %g", fixtures[f], files[k], d);
        }
        snprintf(b, sizeof b, "%s/B/checkpoint-3/adapter_config.json", dir);
        char *text;
        T_OK(ls_read_file(b, &text, NULL));
        T_CHECK(strstr(text, "\"r\": 2") && strstr(text, "\"q_proj\""), "adapter config: %s", text);
        free(text);
        T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    }
    return 0;
}

/* Ctrl-C: the update in flight finishes, a checkpoint is written for it, the exit
 * status is 128 + SIGINT, and --resume continues from there. */
int test_train_sigint_checkpoints(void) {
    char dir[512], data[700], path[900];
    int rc;
    T_CHECK(setup_fixture("next_dense", dir, sizeof dir, data, sizeof data, 11, 3, -1) == 0, "setup");
    pid_t pid = fork();
    T_CHECK(pid >= 0, "fork");
    if (pid == 0) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "exec %s train --model %s/m --data %s --out %s/run --updates 100000 --save-every 100000 "
                 "--quiet >/dev/null 2>&1", LS_CLI_PATH, dir, data, dir);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    snprintf(path, sizeof path, "%s/run/metrics.jsonl", dir);
    int lines = 0;
    for (int i = 0; i < 6000 && lines < 3; i++) { /* up to 60 s for three updates */
        char *text;
        lines = 0;
        if (ls_read_file(path, &text, NULL) == LS_OK) {
            for (char *c = text; *c; c++) lines += *c == '\n';
            free(text);
        }
        if (lines < 3) usleep(10000);
    }
    T_CHECK(lines >= 3, "no progress");
    T_CHECK(kill(pid, SIGINT) == 0, "kill");
    int st;
    T_CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGINT, "exit status %d", st);
    snprintf(path, sizeof path, "%s/run", dir);
    cJSON *m = read_metrics(path);
    T_CHECK(m && cJSON_GetArraySize(m) >= 3, "metrics");
    int done = cJSON_GetArraySize(m);
    cJSON_Delete(m);
    snprintf(path, sizeof path, "%s/run/checkpoint-%d/trainer_state.json", dir, done);
    T_CHECK(access(path, R_OK) == 0, "no checkpoint for the %d finished updates", done);
    char *out = t_run_fmt(&rc, "%s train --resume %s/run --updates %d", LS_CLI_PATH, dir, done + 1);
    char want[64];
    snprintf(want, sizeof want, "update %d/%d", done + 1, done + 1);
    T_CHECK(rc == 0 && out && strstr(out, want), "resume after Ctrl-C: %s", out ? out : "");
    free(out);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* A failure inside an update (here the reward process dies at its 9th answer, in the
 * third update) checkpoints the updates already finished before the error is
 * reported; a second trainer on a run directory in use is refused. */
int test_train_error_keeps_progress(void) {
    char dir[512], data[700], path[900], tok[700], model[600], run[600], *log;
    T_CHECK(setup_bytes(dir, sizeof dir, tok, sizeof tok, 12) == 0, "setup");
    snprintf(data, sizeof data, "%s/p.jsonl", dir);
    T_CHECK(write_text(data, "{\"prompt\": [1, 2, 3, 4]}\n{\"prompt\": \"hello there\"}\n") == 0, "prompts");
    ls_train_opts o;
    ls_train_result res;
    t_train_opts(&o, model, sizeof model, run, sizeof run, dir, "run", data);
    o.tokenizer = tok;
    o.rollout = 1;
    o.num_generations = 4;
    o.max_new_tokens = 3;
    o.updates = 5;
    o.save_every = 100;
    o.reward_cmd = "n=0; while read l; do n=$((n+1)); [ $n -gt 8 ] && exit 3; echo $n; done";
    ls_status st = t_train_logged(&o, &res, &log);
    T_CHECK(st != LS_OK && strstr(ls_err_msg(), "exited with status 3") && res.updates == 2 && log &&
                strstr(log, "the 2 finished updates are in checkpoint-2"),
            "%s: %s, %lld updates: %s", ls_status_name(st), ls_err_msg(), (long long)res.updates, log ? log : "");
    free(log);
    snprintf(path, sizeof path, "%s/run/checkpoint-2/trainer_state.json", dir);
    char *text;
    T_OK(ls_read_file(path, &text, NULL));
    T_CHECK(strstr(text, "\"update\": 2") && strstr(text, "\"data_position\": 2"), "trainer state: %s", text);
    free(text);
    /* a run directory in use: hold its lock from here, as a running trainer would (a
     * second open file description: flock refuses it even in this process) */
    snprintf(path, sizeof path, "%s/run/.lock", dir);
    int fd = open(path, O_RDWR);
    T_CHECK(fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0, "lock");
    o.resume = 1;
    st = ls_train_run(&o, &res);
    T_CHECK(st != LS_OK && strstr(ls_err_msg(), "in use by another longstraw train") && res.updates == 0,
            "locked run: %s: %s", ls_status_name(st), ls_err_msg());
    close(fd);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* Long-context SFT through the same transaction (issue 11): `train --loss sft --task
 * passkey --mode full` on passkey prompts with the key as the response lowers the
 * mean NLL of held-out items (drawn from their own seed), which `report` draws in
 * RUN/metrics.svg; the same in prefix-frozen mode. */
int test_train_sft_passkey(void) {
    char dir[512], tok[700];
    T_CHECK(setup_bytes(dir, sizeof dir, tok, sizeof tok, 7) == 0, "setup");
    for (int full = 0; full < 2; full++) {
        int rc;
        ls_train_opts o; /* the library's loop (trainer.h), as `train --loss sft --task passkey` runs it */
        ls_train_result res;
        char model[600], rd[600], rname[16];
        snprintf(rname, sizeof rname, "run%d", full);
        t_train_opts(&o, model, sizeof model, rd, sizeof rd, dir, rname, NULL);
        o.task = "passkey";
        o.o.sft = 1;
        o.o.full = full;
        o.prompt_len = 300;
        o.updates = 24;
        o.groups_per_update = 4;
        o.o.lr = 3e-3;
        o.eval_lines = 6;
        o.eval_every = 8;
        o.o.sweep_chunk = 70;
        o.o.page_size = 16;
        T_OK(ls_train_run(&o, &res));
        T_CHECK(res.updates == 24 && res.skipped == 0, "ls_train_run: %lld updates, %d skipped", (long long)res.updates,
                res.skipped);
        char *out;
        cJSON *m = read_metrics(rd);
        T_CHECK(m && cJSON_GetArraySize(m) == 24, "metrics lines");
        double before = num(cJSON_GetArrayItem(m, 0), "eval/nll_before");
        double after = num(cJSON_GetArrayItem(m, 23), "eval/nll");
        int evals = 0;
        for (int i = 0; i < 24; i++) evals += !isnan(num(cJSON_GetArrayItem(m, i), "eval/nll"));
        printf("  sft (%s): held-out NLL per token %.4f before, %.4f after 24 updates (%d evaluations)\n",
               full ? "full" : "prefix-frozen", before, after, evals);
        T_CHECK(evals == 3, "%d evaluations, expected 3 (every 8 updates)", evals);
        T_CHECK(before > 0 && after < 0.8 * before, "held-out NLL did not fall: %g -> %g", before, after);
        cJSON_Delete(m);
        out = t_run_fmt(&rc, "%s report %s", LS_CLI_PATH, rd);
        T_CHECK(rc == 0 && out && strstr(out, "metrics.svg"), "report: %s", out ? out : "");
        free(out);
        char svg[700];
        snprintf(svg, sizeof svg, "%s/metrics.svg", rd);
        char *text = t_read_file(svg, NULL);
        T_CHECK(text && strstr(text, "held-out NLL") && strstr(text, "<polyline"), "metrics.svg lacks the curve");
        free(text);
    }
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}
