/*
 * test_eval.c — `longstraw eval` and the trainer's task evaluation (issue 19):
 *  - the JSON document: "exact_match" over every prompt, "by_length" / "by_depth"
 *    cells that are the means of their prompts, held-out answers only, the same
 *    document on a second run, a length's prompts independent of the other lengths;
 *  - under mpirun -np 2, 3, 4 the same responses as one rank (prompt lengths that
 *    divide neither the page size nor the rank count);
 *  - the training loop with held-out task prompts (`train --eval-every`; run here through
 *    the library, ls_train_run) writes the eval metrics and RUN/eval.json, equal to
 *    `longstraw eval` on the checkpoint it saved (eval's JSON is the command's contract,
 *    so that side stays the binary); `report` draws RUN/eval.svg and --eval FILE.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "longstraw/task.h"
#include "longstraw/trace.h"
#include "longstraw/trainer.h"
#include "testutil.h"

int test_eval_cli(void);
int test_cp_eval(void);
int test_train_eval_task(void);

/* A 4-layer hybrid (GDN, attention, GDN, attention) over the byte-level ids. */
static const char CONFIG[] =
    "{\"model_type\": \"qwen3_next\", \"vocab_size\": 257, \"hidden_size\": 64, \"num_hidden_layers\": 4,"
    " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 32, \"partial_rotary_factor\": 0.25,"
    " \"rope_theta\": 10000000, \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 2,"
    " \"linear_key_head_dim\": 16, \"linear_value_head_dim\": 16, \"linear_conv_kernel_dim\": 4,"
    " \"intermediate_size\": 128, \"num_experts\": 0, \"full_attention_interval\": 2, \"rms_norm_eps\": 1e-6,"
    " \"tie_word_embeddings\": false}";

static int make_model(const char *dir) {
    char path[700];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    T_CHECK(f && fputs(CONFIG, f) >= 0 && fclose(f) == 0, "write %s", path);
    char m[700];
    snprintf(m, sizeof m, "%s/m", dir);
    T_CHECK(t_write_model(path, m, 5) == 0, "model from %s", path);
    return 0;
}

/* The "prompts" array of an eval document as one string per prompt: answer|response. */
static int same_prompts(const cJSON *a, const cJSON *b, char *why, size_t cap) {
    const cJSON *pa = cJSON_GetObjectItem(a, "prompts"), *pb = cJSON_GetObjectItem(b, "prompts");
    if (cJSON_GetArraySize(pa) != cJSON_GetArraySize(pb) || cJSON_GetArraySize(pa) == 0)
        return snprintf(why, cap, "%d vs %d prompts", cJSON_GetArraySize(pa), cJSON_GetArraySize(pb)), 0;
    for (int i = 0; i < cJSON_GetArraySize(pa); i++) {
        const cJSON *x = cJSON_GetArrayItem(pa, i), *y = cJSON_GetArrayItem(pb, i);
        const char *fields[] = {"answer", "response"};
        for (int k = 0; k < 2; k++) {
            const cJSON *u = cJSON_GetObjectItem(x, fields[k]), *v = cJSON_GetObjectItem(y, fields[k]);
            if (!cJSON_IsString(u) || !cJSON_IsString(v) || strcmp(u->valuestring, v->valuestring))
                return snprintf(why, cap, "prompt %d: %s \"%s\" vs \"%s\"", i, fields[k],
                                cJSON_IsString(u) ? u->valuestring : "?", cJSON_IsString(v) ? v->valuestring : "?"), 0;
        }
        const char *nums[] = {"length", "tokens", "depth", "exact"};
        for (int k = 0; k < 4; k++)
            if (cJSON_GetObjectItem(x, nums[k])->valuedouble != cJSON_GetObjectItem(y, nums[k])->valuedouble)
                return snprintf(why, cap, "prompt %d: %s differs", i, nums[k]), 0;
    }
    return 1;
}

static double num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItem(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

int test_eval_cli(void) {
    char dir[512];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    if (make_model(dir)) return 1;
    int rc;
    char *out = t_run_fmt(&rc, "%s eval --model %s/m --task multikey --haystack varied --prompt-len 700,1100 "
                               "--num-prompts 4 --depths 0,0.5,1 --seed 3 --quiet --threads 1 --out %s/e.json 2>&1",
                          LS_CLI_PATH, dir, dir);
    cJSON *doc = out ? cJSON_Parse(out) : NULL;
    T_CHECK(rc == 0 && doc, "eval rc %d: %s", rc, out ? out : "");
    free(out);
    T_CHECK(num(doc, "num_prompts") == 8, "8 prompts, got %g", num(doc, "num_prompts"));
    const cJSON *pr = cJSON_GetObjectItem(doc, "prompts"), *bl = cJSON_GetObjectItem(doc, "by_length");
    T_CHECK(cJSON_GetArraySize(pr) == 8 && cJSON_GetArraySize(bl) == 2, "prompts and lengths");
    double em = 0, sc = 0, len_em[2] = {0, 0};
    for (int i = 0; i < 8; i++) {
        const cJSON *p = cJSON_GetArrayItem(pr, i);
        double e = num(p, "exact"), s = num(p, "score");
        T_CHECK((e == 0 || e == 1) && s >= e && s <= 1, "prompt %d: exact %g score %g", i, e, s);
        em += e, sc += s, len_em[i / 4] += e;
        T_CHECK(num(p, "length") == (i < 4 ? 700 : 1100), "length order");
        T_CHECK(num(p, "tokens") <= num(p, "length") && num(p, "tokens") >= num(p, "length") * 0.97, "tokens %g",
                num(p, "tokens"));
        static const double dep[3] = {0, 0.5, 1};
        T_CHECK(num(p, "depth") == dep[(i % 4) % 3], "prompt %d depth %g", i, num(p, "depth"));
        T_CHECK(fabs(num(p, "placed_depth") - num(p, "depth")) < 0.1, "placed %g", num(p, "placed_depth"));
        const char *ans = cJSON_GetObjectItem(p, "answer")->valuestring;
        T_CHECK(ls_task_held_out(ans), "answer %s is not a held-out one", ans);
    }
    T_CHECK(fabs(num(doc, "exact_match") - em / 8) < 1e-12 && fabs(num(doc, "score") - sc / 8) < 1e-12, "means");
    const cJSON *l700 = cJSON_GetObjectItem(bl, "700"), *l1100 = cJSON_GetObjectItem(bl, "1100");
    T_CHECK(l700 && l1100 && num(l700, "n") == 4 && fabs(num(l700, "exact_match") - len_em[0] / 4) < 1e-12 &&
                fabs(num(l1100, "exact_match") - len_em[1] / 4) < 1e-12, "by_length cells");
    const cJSON *bd = cJSON_GetObjectItem(l700, "by_depth");
    T_CHECK(cJSON_GetArraySize(bd) == 3 && num(cJSON_GetObjectItem(bd, "0"), "n") == 2 &&
                num(cJSON_GetObjectItem(bd, "0.5"), "n") == 1, "by_depth cells");
    T_CHECK(num(cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "by_depth"), "1"), "n") == 2, "by_depth over lengths");
    /* --out holds the same document; a second run prints the same prompts; the 1100
     * prompts alone are the same as beside the 700 ones */
    char path[700], why[512];
    snprintf(path, sizeof path, "%s/e.json", dir);
    char *saved = t_read_file(path, NULL);
    cJSON *sdoc = saved ? cJSON_Parse(saved) : NULL;
    T_CHECK(sdoc && same_prompts(doc, sdoc, why, sizeof why), "--out file: %s", why);
    free(saved);
    cJSON_Delete(sdoc);
    out = t_run_fmt(&rc, "%s eval --model %s/m --task multikey --haystack varied --prompt-len 1100 --num-prompts 4 "
                         "--depths 0,0.5,1 --seed 3 --quiet --threads 1 2>&1", LS_CLI_PATH, dir);
    cJSON *one = out ? cJSON_Parse(out) : NULL;
    T_CHECK(rc == 0 && one, "eval 1100: %s", out ? out : "");
    free(out);
    cJSON *tail = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(tail, "prompts");
    for (int i = 4; i < 8; i++) cJSON_AddItemToArray(arr, cJSON_Duplicate(cJSON_GetArrayItem(pr, i), 1));
    T_CHECK(same_prompts(one, tail, why, sizeof why), "1100 alone vs beside 700: %s", why);
    cJSON_Delete(tail);
    cJSON_Delete(one);
    /* another seed: other prompts */
    out = t_run_fmt(&rc, "%s eval --model %s/m --task multikey --haystack varied --prompt-len 700,1100 --num-prompts 4 "
                         "--depths 0,0.5,1 --seed 4 --quiet --threads 1 2>&1", LS_CLI_PATH, dir);
    one = out ? cJSON_Parse(out) : NULL;
    T_CHECK(rc == 0 && one && !same_prompts(doc, one, why, sizeof why), "seed 4 gave the prompts of seed 3");
    free(out);
    cJSON_Delete(one);
    /* the heat map of the file */
    out = t_run_fmt(&rc, "%s report --eval %s/e.json 2>&1", LS_CLI_PATH, dir);
    T_CHECK(out && rc == 0 && strstr(out, "e.svg"), "report --eval: %s", out ? out : "");
    free(out);
    snprintf(path, sizeof path, "%s/e.svg", dir);
    char *svg = t_read_file(path, NULL);
    T_CHECK(svg && strstr(svg, "</svg>") && strstr(svg, "multikey (varied haystack)") && strstr(svg, ">1100<"),
            "heat map");
    free(svg);
    cJSON_Delete(doc);
    /* usage errors name the flag and value */
    out = t_run_fmt(&rc, "%s eval --model %s/m --task needles 2>&1", LS_CLI_PATH, dir);
    T_CHECK(rc == 2 && out && strstr(out, "--task") && strstr(out, "needles"), "bad task: %s", out ? out : "");
    free(out);
    out = t_run_fmt(&rc, "%s eval --model %s/m --prompt-len 4096,x 2>&1", LS_CLI_PATH, dir);
    T_CHECK(rc == 2 && out && strstr(out, "--prompt-len") && strstr(out, "entry 2"), "bad length: %s", out ? out : "");
    free(out);
    out = t_run_fmt(&rc, "%s eval --model %s/m --depths 0,1.5 2>&1", LS_CLI_PATH, dir);
    T_CHECK(rc == 2 && out && strstr(out, "1.5"), "bad depth: %s", out ? out : "");
    free(out);
    out = t_run_fmt(&rc, "%s eval --task passkey 2>&1", LS_CLI_PATH);
    T_CHECK(rc == 2 && out && strstr(out, "--model"), "no model: %s", out ? out : "");
    free(out);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

#define MPI_ENV LS_MPI_ENV

/* 1 rank against 2, 3 and 4: the same greedy responses (the tokens are rank 0's; the
 * logits they come from are the CP merge's). */
int test_cp_eval(void) {
    if (!LS_MPIEXEC[0]) T_SKIP("built without MPI");
    char dir[512];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    if (make_model(dir)) return 1;
    cJSON *base = NULL;
    for (int np = 1; np <= 4; np++) {
        int rc;
        char *out = np == 1 ? t_run_fmt(&rc, "%s eval --model %s/m --task vartrack --prompt-len 433,517 --num-prompts 3 "
                                             "--page-size 16 --quiet --threads 1 2>%s/err", LS_CLI_PATH, dir, dir)
                            : t_run_fmt(&rc, MPI_ENV "%s --oversubscribe --allow-run-as-root -np %d %s eval --model %s/m "
                                             "--task vartrack --prompt-len 433,517 --num-prompts 3 --page-size 16 --quiet "
                                             "--threads 1 2>%s/err", LS_MPIEXEC, np, LS_CLI_PATH, dir, dir);
        cJSON *doc = out ? cJSON_Parse(out) : NULL;
        T_CHECK(rc == 0 && doc, "np %d: rc %d: %s", np, rc, out ? out : "");
        free(out);
        char why[512];
        if (!base) base = doc;
        else {
            T_CHECK(same_prompts(base, doc, why, sizeof why), "np %d vs 1: %s", np, why);
            cJSON_Delete(doc);
        }
    }
    cJSON_Delete(base);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* The loop as `train --model dir/m --out dir/<run> --rollout --task T --prompt-len 300
 * --eval-every 2 --eval-prompts 2 --max-new-tokens 4 --quiet` runs it (on one thread, as
 * the `eval` commands it is compared with). */
static void task_opts(ls_train_opts *o, char *model, size_t mn, char *run, size_t rn, const char *dir,
                      const char *run_name, const char *task) {
    t_train_opts(o, model, mn, run, rn, dir, run_name, NULL);
    o->rollout = 1;
    o->task = task;
    o->prompt_len = 300;
    o->eval_every = 2;
    o->eval_prompts = 2;
    o->max_new_tokens = 4;
}

int test_train_eval_task(void) {
    char dir[512], model[600], run[600], *log;
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    if (make_model(dir)) return 1;
    int rc, threads = ls_get_threads();
    ls_train_opts o;
    ls_train_result res;
    task_opts(&o, model, sizeof model, run, sizeof run, dir, "run", "passkey");
    o.updates = 3;
    o.num_generations = 2;
    o.o.lr = 1e-3;
    o.seed = 9;
    ls_set_threads(1);
    ls_status s = t_train_logged(&o, &res, &log);
    ls_set_threads(threads);
    T_CHECK(s == LS_OK && res.updates == 3 && log && strstr(log, "held-out exact match"), "train: %s (%s): %s",
            ls_status_name(s), s ? ls_err_msg() : "", log ? log : "");
    free(log);
    char path[700];
    snprintf(path, sizeof path, "%s/run/metrics.jsonl", dir);
    char *m = t_read_file(path, NULL);
    T_CHECK(m, "metrics");
    /* before (with update 1), after update 2 and after the last (3); not after update 1 */
    char *l2 = strchr(m, '\n'), *l3 = l2 ? strchr(l2 + 1, '\n') : NULL;
    T_CHECK(l2 && l3, "three lines");
    *l2 = 0, *l3 = 0;
    T_CHECK(strstr(m, "\"eval/exact_match_before\"") && strstr(m, "\"eval/exact_match/300_before\"") &&
                !strstr(m, "\"eval/exact_match\":"), "update 1 line: %s", m);
    T_CHECK(strstr(l2 + 1, "\"eval/exact_match\":") && strstr(l2 + 1, "\"eval/score\":") &&
                strstr(l2 + 1, "\"eval/exact_match/300\":"), "update 2 line: %s", l2 + 1);
    T_CHECK(strstr(l3 + 1, "\"eval/exact_match\":"), "update 3 line: %s", l3 + 1);
    free(m);
    /* RUN/eval.json is `longstraw eval` on the last checkpoint, with the run's seed */
    snprintf(path, sizeof path, "%s/run/eval.json", dir);
    char *ej = t_read_file(path, NULL);
    cJSON *a = ej ? cJSON_Parse(ej) : NULL;
    T_CHECK(a && num(a, "num_prompts") == 2, "RUN/eval.json: %s", ej ? ej : "(none)");
    free(ej);
    char *out = t_run_fmt(&rc, "%s eval --model %s/run/checkpoint-3 --prompt-len 300 --num-prompts 2 --seed 9 --quiet "
                               "--threads 1 2>&1", LS_CLI_PATH, dir);
    cJSON *b = out ? cJSON_Parse(out) : NULL;
    T_CHECK(rc == 0 && b, "eval: %s", out ? out : "");
    free(out);
    char why[512];
    T_CHECK(same_prompts(a, b, why, sizeof why), "train's evaluation vs eval of checkpoint-3: %s", why);
    cJSON_Delete(a);
    cJSON_Delete(b);
    out = t_run_fmt(&rc, "%s report %s/run 2>&1", LS_CLI_PATH, dir);
    T_CHECK(out && rc == 0 && strstr(out, "eval.svg") && strstr(out, "exact_match"), "report: %s", out ? out : "");
    free(out);
    struct stat st;
    snprintf(path, sizeof path, "%s/run/eval.svg", dir);
    T_CHECK(stat(path, &st) == 0, "RUN/eval.svg");
    /* LoRA: the run's evaluation is `eval --adapter` of its checkpoint (alpha read from
     * adapter_config.json) */
    task_opts(&o, model, sizeof model, run, sizeof run, dir, "lora", "passkey-shaped");
    o.updates = 2;
    o.num_generations = 4;
    o.o.lr = 0.1;
    o.spec.lora_rank = 2;
    o.spec.lora_alpha = 8;
    o.seed = 4;
    ls_set_threads(1);
    s = ls_train_run(&o, &res);
    ls_set_threads(threads);
    T_CHECK(s == LS_OK && res.updates == 2, "LoRA train: %s: %s", ls_status_name(s), ls_err_msg());
    snprintf(path, sizeof path, "%s/lora/eval.json", dir);
    ej = t_read_file(path, NULL);
    a = ej ? cJSON_Parse(ej) : NULL;
    free(ej);
    out = t_run_fmt(&rc, "%s eval --model %s/m --adapter %s/lora/checkpoint-2/adapter_model.safetensors --prompt-len 300 "
                         "--num-prompts 2 --seed 4 --quiet --threads 1 2>&1", LS_CLI_PATH, dir, dir);
    b = out ? cJSON_Parse(out) : NULL;
    T_CHECK(rc == 0 && a && b, "eval --adapter: %s", out ? out : "");
    free(out);
    T_CHECK(same_prompts(a, b, why, sizeof why), "LoRA run's evaluation vs eval --adapter: %s", why);
    cJSON_Delete(b);
    /* (the adapters matter: another alpha answers otherwise) */
    out = t_run_fmt(&rc, "%s eval --model %s/m --adapter %s/lora/checkpoint-2/adapter_model.safetensors --lora-alpha 16 "
                         "--prompt-len 300 --num-prompts 2 --seed 4 --quiet --threads 1 2>&1", LS_CLI_PATH, dir, dir);
    b = out ? cJSON_Parse(out) : NULL;
    T_CHECK(rc == 0 && b && !same_prompts(a, b, why, sizeof why), "alpha 16 answered as alpha 8: %s", out ? out : "");
    free(out);
    cJSON_Delete(a);
    cJSON_Delete(b);
    /* flags that need a task are refused without one */
    out = t_run_fmt(&rc, "%s train --model %s/m --out %s/r2 --data x.jsonl --eval-prompts 3 2>&1", LS_CLI_PATH, dir, dir);
    T_CHECK(rc == 2 && out && strstr(out, "--eval-prompts"), "eval-prompts without a task: %s", out ? out : "");
    free(out);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}
