/*
 * test_reliability.c — issue 34: nothing lost on a signal during eval, no silent
 * truncation, no hang on bad state. Each test fails on the tool before its fix.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "longstraw/comm.h"
#include "longstraw/config.h"
#include "longstraw/files.h"
#include "longstraw/safetensors.h"
#include "longstraw/task.h"
#include "longstraw/tokenizer.h"
#include "testutil.h"

int test_rel_signal_in_eval(void);
int test_rel_stdout_errors(void);
int test_rel_rng_zero(void);
int test_rel_multikey_distractors(void);
int test_rel_report_inputs(void);
int test_rel_eval_refusals(void);
int test_rel_eval_nonfinite(void);
int test_rel_refusal_leaves_run(void);
int test_rel_lora_base_digest(void);
int test_rel_startup(void);
int test_rel_non_utf8_paths(void);

/* dir/m: a tiny hybrid model of the byte-level vocabulary (the built-in tasks'). */
static int byte_model(const char *dir, char *m, size_t cap) {
    static const char tiny[] =
        "{\"model_type\": \"qwen3_next\", \"vocab_size\": 260, \"hidden_size\": 32, \"num_hidden_layers\": 2,"
        " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 16, \"linear_num_key_heads\": 2,"
        " \"linear_num_value_heads\": 2, \"linear_key_head_dim\": 8, \"linear_value_head_dim\": 8,"
        " \"intermediate_size\": 48, \"num_experts\": 0, \"full_attention_interval\": 2}";
    char cfg[700];
    snprintf(cfg, sizeof cfg, "%s/c.json", dir);
    snprintf(m, cap, "%s/m", dir);
    return ls_write_file_atomic(cfg, tiny, strlen(tiny)) != LS_OK || t_write_model(cfg, m, 7) != 0;
}

static int count_lines(const char *path) {
    char *t = t_read_file(path, NULL);
    int n = 0;
    for (char *p = t; p && *p; p++) n += *p == '\n';
    free(t);
    return t ? n : -1;
}

/* dir/m (byte_model) and one finished SFT update of it in dir/run (`extra`: more flags). */
static int model_and_run(const char *dir, char *m, size_t cap, const char *extra) {
    if (byte_model(dir, m, cap)) return 1;
    int rc;
    char *o = t_run_fmt(&rc, "%s train --model %s --out %s/run --loss sft --task passkey --prompt-len 300 --updates 1 "
                             "--threads 1 --quiet %s", LS_CLI_PATH, m, dir, extra);
    if (rc != 0) fprintf(stderr, "  train: %s\n", o ? o : "");
    free(o);
    return rc != 0;
}

/* 1. SIGTERM while train evaluates its held-out prompts after update 1: the update is
 * kept (its checkpoint and its metrics line), the exit is 143 with the resume advice. */
int test_rel_signal_in_eval(void) {
    char dir[512], m[700], err[700], cmd[8192], path[900];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    T_CHECK(byte_model(dir, m, sizeof m) == 0, "model");
    snprintf(err, sizeof err, "%s/stderr", dir);
    /* the signal once the second evaluation (after update 1's step) has begun: the trace
     * writes each phase's start at once */
    snprintf(cmd, sizeof cmd,
             "%s train --model %s --out %s/run --loss sft --task passkey --prompt-len 300 --updates 3 --lr 1e-3 "
             "--eval-prompts 2 --eval-prompt-len 30000 --max-new-tokens 2 --threads 1 --quiet >/dev/null 2>%s & p=$!; "
             "for i in $(seq 3000); do n=$(grep -c 'phase_begin.*\"phase\": \"eval\"' %s/run/trace.0.jsonl 2>/dev/null); "
             "[ \"${n:-0}\" -ge 2 ] && break; sleep 0.02; done; kill -TERM $p; wait $p; echo rc=$?",
             LS_CLI_PATH, m, dir, err, dir);
    int rc;
    char *o = t_run_capture(cmd, &rc);
    int status = -1;
    const char *r = o ? strstr(o, "rc=") : NULL;
    if (r) status = atoi(r + 3);
    free(o);
    char *e = t_read_file(err, NULL);
    printf("  exit %d; %.400s\n", status, e ? e : "");
    snprintf(path, sizeof path, "%s/run/checkpoint-1/trainer_state.json", dir);
    struct stat sb;
    int ck = stat(path, &sb) == 0;
    snprintf(path, sizeof path, "%s/run/metrics.jsonl", dir);
    int lines = count_lines(path);
    int advice = e && strstr(e, "after update 1") && strstr(e, "--resume");
    free(e);
    T_CHECK(status == 143, "exit status %d, expected 143 (SIGTERM)", status);
    T_CHECK(ck, "the finished update was not checkpointed (no checkpoint-1)");
    T_CHECK(lines == 1, "metrics.jsonl has %d lines, expected the finished update's 1", lines);
    T_CHECK(advice, "no --resume advice naming update 1 on stderr");
    t_remove_dir(dir);
    return 0;
}

/* 2. A write error on stdout (a full disk: /dev/full) fails the command, naming stdout,
 * instead of exiting 0 with the document cut or empty. */
int test_rel_stdout_errors(void) {
    char d[700], dir[512], m[700];
    snprintf(d, sizeof d, "%s/tests/reference/fixtures/next_moe", LS_SOURCE_DIR);
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    T_CHECK(byte_model(dir, m, sizeof m) == 0, "model");
    const char *what[3] = {"logprobs", "eval", "plan"};
    char cmd[3][2000];
    snprintf(cmd[0], sizeof cmd[0], "%s logprobs --model %s --group %s/group_train.json --threads 1", LS_CLI_PATH, d, d);
    snprintf(cmd[1], sizeof cmd[1], "%s eval --model %s --prompt-len 300 --num-prompts 1 --max-new-tokens 2 --threads 1 --quiet",
             LS_CLI_PATH, m);
    snprintf(cmd[2], sizeof cmd[2], "%s plan --model %s --prompt 100 --json", LS_CLI_PATH, d);
    for (int k = 0; k < 3; k++) {
        int rc;
        char *o = t_run_fmt(&rc, "(%s > /dev/full)", cmd[k]);
        int named = o && strstr(o, "stdout");
        printf("  %s > /dev/full: exit %d: %.200s", what[k], rc, o ? o : "");
        free(o);
        T_CHECK(rc != 0 && named, "%s > /dev/full: exit %d (expected a failure naming stdout)", what[k], rc);
        o = t_run_fmt(&rc, "(%s > /dev/null)", cmd[k]);
        free(o);
        T_CHECK(rc == 0, "%s > /dev/null: exit %d", what[k], rc);
    }
    t_remove_dir(dir);
    return 0;
}

/* 3. An all-zero generator state: the resume is refused naming the field (it hung in the
 * passkey generator, deaf to SIGTERM), and every generator gives up in bounded time. */
int test_rel_rng_zero(void) {
    char dir[512], m[700], path[900], cmd[4096];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    T_CHECK(model_and_run(dir, m, sizeof m, "") == 0, "a model and a run");
    int rc;
    char *o;
    snprintf(path, sizeof path, "%s/run/checkpoint-1/trainer_state.json", dir);
    snprintf(cmd, sizeof cmd, "sed -i 's/\"rng\": *\\[[^]]*\\]/\"rng\": [\"0\", \"0\", \"0\", \"0\"]/' %s && grep -q '\"rng\": \\[\"0\"' %s",
             path, path);
    o = t_run_capture(cmd, &rc);
    free(o);
    T_CHECK(rc == 0, "could not zero the rng of %s", path);
    o = t_run_fmt(&rc, "timeout -k 5 60 %s train --resume %s/run --updates 2 --quiet", LS_CLI_PATH, dir);
    printf("  resume: exit %d: %.300s\n", rc, o ? o : "");
    int named = o && strstr(o, "\"rng\"") && strstr(o, "trainer_state.json");
    free(o);
    T_CHECK(rc != 0 && rc != 124 && rc != 137, "resume from an all-zero rng: exit %d (hung: 124/137)", rc);
    T_CHECK(named, "the refusal does not name trainer_state.json's \"rng\"");
    /* the generators themselves: a degenerate state ends in an error, not a loop */
    const char *tasks[3] = {"passkey", "multikey", "vartrack"};
    for (int k = 0; k < 3; k++) { /* (a constant draw is held out or not: one of the two must fail) */
        ls_task t;
        T_OK(ls_task_parse(&t, tasks[k], NULL));
        int failed = 0;
        for (int held = 0; held < 2; held++) {
            ls_rng zero = {{0, 0, 0, 0}};
            ls_task_item it;
            memset(&it, 0, sizeof it);
            double t0 = ls_now();
            ls_status s = ls_task_make(&t, &it, ls_task_min_bytes(&t) + 64, 0.5, held, &zero);
            ls_task_item_free(&it);
            T_CHECK(ls_now() - t0 < 30, "%s from an all-zero state took %.1f s", tasks[k], ls_now() - t0);
            failed += s != LS_OK;
        }
        T_CHECK(failed >= 1, "%s: an all-zero state made both a training and a held-out item", tasks[k]);
    }
    t_remove_dir(dir);
    return 0;
}

/* 11b. A training prompt of the multikey task never holds a held-out key, not even as a
 * distractor (the held-out prompts' answers would be learnt). */
int test_rel_multikey_distractors(void) {
    ls_task t;
    T_OK(ls_task_parse(&t, "multikey", NULL));
    ls_rng r;
    ls_rng_seed(&r, 11);
    int leaks = 0, items = 400;
    for (int i = 0; i < items; i++) {
        ls_task_item it;
        memset(&it, 0, sizeof it);
        T_OK(ls_task_make(&t, &it, ls_task_min_bytes(&t) + 200, 0.3, 0, &r));
        /* every five-digit key in the prompt */
        for (const char *p = it.prompt; (p = strstr(p, " is ")) != NULL; p += 4) {
            char key[8] = {0};
            if (sscanf(p + 4, "%5[0-9]", key) == 1 && strlen(key) == 5 && ls_task_held_out(key)) leaks++;
        }
        ls_task_item_free(&it);
    }
    T_CHECK(leaks == 0, "%d held-out keys in %d training prompts of the multikey task", leaks, items);
    return 0;
}

/* 4. `report RUN` reads regular files only: a FIFO metrics.jsonl or trace, a link to
 * /dev/zero, is refused by name at once (it blocked, or read until memory ran out). */
int test_rel_report_inputs(void) {
    char dir[512], m[700];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    T_CHECK(model_and_run(dir, m, sizeof m, "") == 0, "a model and a run");
    int rc;
    char *o;
    const char *file[2] = {"metrics.jsonl", "trace.0.jsonl"}, *make[2] = {"mkfifo %s/run/%s", "ln -s /dev/zero %s/run/%s"};
    for (int f = 0; f < 2; f++)
        for (int k = 0; k < 2; k++) {
            char saved[1000], cmd[2400];
            snprintf(saved, sizeof saved, "%s/run/%s.saved", dir, file[f]);
            snprintf(cmd, sizeof cmd, "mv %s/run/%s %s && ", dir, file[f], saved);
            snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), make[k], dir, file[f]);
            o = t_run_capture(cmd, &rc);
            free(o);
            T_CHECK(rc == 0, "%s", cmd);
            o = t_run_fmt(&rc, "timeout -k 2 20 %s report %s/run", LS_CLI_PATH, dir);
            int named = o && strstr(o, file[f]) && strstr(o, "not a regular file");
            printf("  %s as %s: exit %d\n", file[f], k ? "a link to /dev/zero" : "a FIFO", rc);
            free(o);
            T_CHECK(rc != 0 && rc != 124 && rc != 137 && named, "report with %s %s: exit %d (124/137: it hung)", file[f],
                    k ? "a link to /dev/zero" : "a FIFO", rc);
            snprintf(cmd, sizeof cmd, "rm -f %s/run/%s && mv %s %s/run/%s", dir, file[f], saved, dir, file[f]);
            o = t_run_capture(cmd, &rc);
            free(o);
        }
    o = t_run_fmt(&rc, "%s report %s/run", LS_CLI_PATH, dir);
    free(o);
    T_CHECK(rc == 0, "report of the intact run: exit %d", rc);
    t_remove_dir(dir);
    return 0;
}

/* 5, 6. What eval (and train's held-out prompts) cannot do is refused before anything is
 * allocated, naming why: prompts that cannot fit this machine's memory (the plan's check,
 * as for capture), a length below the task's shortest prompt (it ran longer prompts under
 * the asked label), a length or depth given twice (counted twice; dropped from by_depth),
 * --eval-prompts 0 (silently 16 with --eval-every). */
int test_rel_eval_refusals(void) {
    char dir[512], m[700];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    T_CHECK(byte_model(dir, m, sizeof m) == 0, "model");
    static const struct {
        const char *args, *want;
    } cases[] = {
        {"eval --model %s --prompt-len 1073741824 --num-prompts 1", "will not fit"},
        {"train --model %s --out %s/r1 --loss sft --task passkey --prompt-len 300 --eval-prompts 1 "
         "--eval-prompt-len 1073741824", "will not fit"},
        {"eval --model %s --prompt-len 20 --num-prompts 1", "below the passkey task's minimum"},
        {"train --model %s --out %s/r2 --loss sft --task passkey --prompt-len 100 --updates 1", "below the passkey task's minimum"},
        {"eval --model %s --prompt-len 300,300 --num-prompts 1", "repeats entry 1"},
        {"eval --model %s --prompt-len 300 --depths 0.5,0.5000001 --num-prompts 2", "same depth as entry 1"},
        {"train --model %s --out %s/r3 --loss sft --task passkey --prompt-len 300 --eval-prompts 0 --eval-every 1",
         "--eval-prompts"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char args[2000];
        snprintf(args, sizeof args, cases[c].args, m, dir);
        int rc;
        double t0 = ls_now();
        char *o = t_run_fmt(&rc, "timeout -k 2 60 %s %s --threads 1 --quiet", LS_CLI_PATH, args);
        double dt = ls_now() - t0;
        int said = o && strstr(o, cases[c].want);
        printf("  %s: exit %d in %.2f s: %.160s", cases[c].want, rc, dt, o ? o : "");
        free(o);
        T_CHECK(rc != 0 && rc != 124 && rc != 137 && said && dt < 30, "`longstraw %s`: exit %d after %.1f s (want a refusal "
                "saying \"%s\")", args, rc, dt, cases[c].want);
    }
    /* and what is allowed still runs: the task's minimum, two lengths, distinct depths */
    int rc;
    char *o = t_run_fmt(&rc, "%s eval --model %s --prompt-len 300,320 --depths 0.25,0.75 --num-prompts 2 "
                             "--max-new-tokens 2 --threads 1 --quiet", LS_CLI_PATH, m);
    T_CHECK(rc == 0, "a valid eval: exit %d: %s", rc, o ? o : "");
    free(o);
    t_remove_dir(dir);
    return 0;
}

static ls_dtype huge_lm_head(const char *name, float *v, int64_t n, void *ctx) {
    (void)ctx;
    if (strstr(name, "lm_head")) /* logits of ±3e38 · O(1) terms: Inf − Inf */
        for (int64_t k = 0; k < n; k++) v[k] = k % 2 ? 3e38f : -3e38f;
    return LS_DTYPE_F32;
}

/* 7. eval on a model whose forward overflows (finite LM-head weights of ±3e38: the
 * logits Inf and NaN) is refused, as logprobs refuses it, not answered with garbage and exit 0. */
int test_rel_eval_nonfinite(void) {
    char dir[512], m[700], big[800];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    T_CHECK(byte_model(dir, m, sizeof m) == 0, "model");
    snprintf(big, sizeof big, "%s/big", dir);
    T_CHECK(t_copy_model(m, big, huge_lm_head, NULL) == 0, "a copy of %s with a huge LM head", m);
    int rc;
    char *o = t_run_fmt(&rc, "%s eval --model %s --prompt-len 300 --num-prompts 1 --max-new-tokens 2 --threads 1 --quiet",
                        LS_CLI_PATH, big);
    int said = o && strstr(o, "not finite");
    printf("  eval: exit %d: %.300s\n", rc, o ? o : "");
    free(o);
    T_CHECK(rc != 0 && said, "eval of a model whose forward overflows: exit %d (want a refusal: logits not finite)", rc);
    t_remove_dir(dir);
    return 0;
}

/* md5 of every file of dir (names and contents), sorted: what "unchanged" means */
static char *dir_digest(const char *dir) {
    int rc;
    char *o = t_run_fmt(&rc, "cd %s && find . -type f | LC_ALL=C sort | xargs -r md5sum", dir);
    if (rc != 0) {
        free(o);
        return NULL;
    }
    return o;
}

/* 10. A refused command leaves the run directory byte-identical: a resume that names
 * another model (refused before the trace opens) and one whose checkpoint is damaged
 * (refused after the model loaded) — RUN/.lock was rewritten with the new pid, the trace
 * got the attempt's lines. */
int test_rel_refusal_leaves_run(void) {
    char dir[512], m[700], run[700], path[900];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    T_CHECK(model_and_run(dir, m, sizeof m, "") == 0, "a model and a run");
    snprintf(run, sizeof run, "%s/run", dir);
    int rc;
    char *o;
    /* refusal 1: another model */
    char *before = dir_digest(run);
    T_CHECK(before, "digest of %s", run);
    o = t_run_fmt(&rc, "%s train --resume %s --model %s/tests/reference/fixtures/next_moe --updates 2 --quiet",
                  LS_CLI_PATH, run, LS_SOURCE_DIR);
    printf("  resume with another model: exit %d: %.200s\n", rc, o ? o : "");
    free(o);
    char *after = dir_digest(run);
    int same = after && !strcmp(before, after);
    if (!same) printf("  before:\n%s  after:\n%s", before, after ? after : "");
    free(after);
    T_CHECK(rc != 0 && same, "a resume refused for its model: exit %d, run directory %s", rc,
            same ? "unchanged" : "changed");
    free(before);
    /* refusal 2: the checkpoint's generator state damaged (found after the model is loaded) */
    snprintf(path, sizeof path, "%s/checkpoint-1/trainer_state.json", run);
    o = t_run_fmt(&rc, "sed -i 's/\"rng\": *\\[[^]]*\\]/\"rng\": [\"0\", \"0\", \"0\", \"0\"]/' %s", path);
    free(o);
    before = dir_digest(run);
    T_CHECK(before, "digest of %s", run);
    o = t_run_fmt(&rc, "%s train --resume %s --updates 2 --quiet", LS_CLI_PATH, run);
    printf("  resume from a damaged checkpoint: exit %d: %.200s\n", rc, o ? o : "");
    free(o);
    after = dir_digest(run);
    same = after && !strcmp(before, after);
    if (!same) printf("  before:\n%s  after:\n%s", before, after ? after : "");
    free(after);
    free(before);
    T_CHECK(rc != 0 && same, "a resume refused for its checkpoint: exit %d, run directory %s", rc,
            same ? "unchanged" : "changed");
    /* refusal 3: a fresh run refused (a prompt too short for the task) leaves no .lock, no trace */
    char run2[800];
    snprintf(run2, sizeof run2, "%s/run2", dir);
    o = t_run_fmt(&rc, "%s train --model %s --out %s --loss sft --task passkey --prompt-len 100 --updates 1 --quiet",
                  LS_CLI_PATH, m, run2);
    free(o);
    char *left = dir_digest(run2);
    int empty = left && !left[0];
    free(left);
    T_CHECK(rc != 0 && empty, "a refused fresh run: exit %d, %s left files behind", rc, run2);
    t_remove_dir(dir);
    return 0;
}

/* 8. A LoRA resume after the base model's weights were replaced at the same path is
 * refused (the adapters belong to the weights they were trained on); with the same
 * weights it goes on. */
int test_rel_lora_base_digest(void) {
    char dir[512], m[700], cfg[700];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    T_CHECK(model_and_run(dir, m, sizeof m, "--lora-rank 2") == 0, "a model and a LoRA run");
    int rc;
    char *o = t_run_fmt(&rc, "%s train --resume %s/run --updates 2 --quiet", LS_CLI_PATH, dir);
    T_CHECK(rc == 0, "resume on the same base: %s", o ? o : "");
    free(o);
    snprintf(cfg, sizeof cfg, "%s/c.json", dir); /* the same config, other weights, at the same path */
    T_CHECK(t_write_model(cfg, m, 8) == 0, "rewrite %s", m);
    o = t_run_fmt(&rc, "%s train --resume %s/run --updates 3 --quiet", LS_CLI_PATH, dir);
    int said = o && strstr(o, "base_digest") && strstr(o, "replaced");
    printf("  resume on replaced base weights: exit %d: %.300s\n", rc, o ? o : "");
    free(o);
    T_CHECK(rc != 0 && said, "a LoRA resume on replaced base weights: exit %d (want a refusal naming the digest)", rc);
    t_remove_dir(dir);
    return 0;
}

/* 9. The start-up re-exec keeps the process's name (it was "exe": `pgrep longstraw` found
 * nothing) and OpenBLAS's kernel line prints once (it printed twice: first the kernels
 * being dropped); an OPENBLAS_CORETYPE that OpenBLAS rejects is not reported as the
 * user's choice; a build without MPI started by mpirun as several ranks refuses. */
int test_rel_startup(void) {
    char d[700];
    snprintf(d, sizeof d, "%s/tests/reference/fixtures/next_moe", LS_SOURCE_DIR);
    char dir[512], m[700];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    T_CHECK(byte_model(dir, m, sizeof m) == 0, "model");
    int rc;
    /* OMP_WAIT_POLICY unset: the tool sets it and starts itself again (an evaluation of
     * ~20 s here, killed after 1 s: its name is read while it runs) */
    char *o = t_run_fmt(&rc, "env -u OMP_WAIT_POLICY %s eval --model %s --prompt-len 30000 --num-prompts 200 --quiet "
                             "--threads 1 >/dev/null 2>&1 & p=$!; sleep 1; cat /proc/$p/comm; kill $p; wait $p",
                        LS_CLI_PATH, m);
    int named = o && !strncmp(o, "longstraw", 9);
    printf("  name after the re-exec: %.40s", o ? o : "");
    free(o);
    T_CHECK(named, "the process is not named longstraw after its re-exec");
    o = t_run_fmt(&rc, "env -u OMP_WAIT_POLICY OPENBLAS_VERBOSE=2 %s --version", LS_CLI_PATH);
    int lines = 0;
    for (const char *p = o; p && (p = strstr(p, "Core: ")); p += 6) lines++;
    printf("  OPENBLAS_VERBOSE=2: %d \"Core:\" line(s)\n", lines);
    free(o);
    T_CHECK(rc == 0 && lines == 1, "OPENBLAS_VERBOSE=2: %d lines \"Core: ...\" (want 1), exit %d", lines, rc);
    o = t_run_fmt(&rc, "OPENBLAS_CORETYPE=NoSuchCore %s logprobs --model %s --group %s/group_train.json --stats "
                       "--threads 1 2>&1 >/dev/null | grep 'chosen by'", LS_CLI_PATH, d, d);
    int user = o && strstr(o, "chosen by user");
    printf("  a rejected OPENBLAS_CORETYPE: %.200s", o ? o : "");
    free(o);
    T_CHECK(rc == 0 && !user, "a core OpenBLAS rejected is reported as the user's choice");
    if (!ls_comm_have_mpi()) {
        o = t_run_fmt(&rc, "OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 %s --version", LS_CLI_PATH);
        int said = o && strstr(o, "built without MPI");
        printf("  without MPI under a 2-rank launcher: exit %d: %.200s", rc, o ? o : "");
        free(o);
        T_CHECK(rc != 0 && said, "a build without MPI started as one of 2 ranks: exit %d (want a refusal)", rc);
    }
    t_remove_dir(dir);
    return 0;
}

/* 1 when the file is valid UTF-8 (no ill-formed subpart, no NUL) */
static int utf8_file_ok(const char *path) {
    size_t n = 0, adv;
    char *t = t_read_file(path, &n);
    if (!t) return 0;
    int ok = 1;
    for (size_t i = 0; i < n && ok; i += adv) ok = ls_tok_utf8_seq((const unsigned char *)t + i, n - i, &adv) && t[i];
    free(t);
    return ok;
}

/* 11a. Paths that are not UTF-8 (a Latin-1 directory name) keep eval's JSON and the
 * report's SVGs valid: the bytes become U+FFFD in them. */
int test_rel_non_utf8_paths(void) {
    char dir[512], m[700], bad[800], run[800], path[1000];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    T_CHECK(byte_model(dir, m, sizeof m) == 0, "model");
    snprintf(bad, sizeof bad, "%s/mod\xe8le", dir); /* "modèle" in Latin-1 */
    snprintf(run, sizeof run, "%s/r\xe9sultat", dir);
    int rc;
    char *o = t_run_fmt(&rc, "cp -r %s '%s'", m, bad);
    free(o);
    T_CHECK(rc == 0, "copy to %s", bad);
    snprintf(path, sizeof path, "%s/e.json", dir);
    o = t_run_fmt(&rc, "%s eval --model '%s' --prompt-len 300 --num-prompts 1 --max-new-tokens 2 --threads 1 --quiet "
                       "--out %s > /dev/null", LS_CLI_PATH, bad, path);
    T_CHECK(rc == 0, "eval: %s", o ? o : "");
    free(o);
    char *t = t_read_file(path, NULL);
    cJSON *j = t ? cJSON_Parse(t) : NULL;
    free(t);
    int parsed = j != NULL;
    cJSON_Delete(j);
    T_CHECK(parsed && utf8_file_ok(path), "%s: eval's JSON is %s", path, parsed ? "not valid UTF-8" : "not JSON");
    o = t_run_fmt(&rc, "%s train --model '%s' --out '%s' --loss sft --task passkey --prompt-len 300 --updates 1 "
                       "--eval-prompts 1 --max-new-tokens 2 --threads 1 --quiet && %s report '%s' > /dev/null",
                  LS_CLI_PATH, bad, run, LS_CLI_PATH, run);
    T_CHECK(rc == 0, "train + report: %s", o ? o : "");
    free(o);
    const char *files[] = {"eval.json", "metrics.svg", "memory.svg", "eval.svg"};
    int checked = 0;
    for (size_t k = 0; k < sizeof files / sizeof *files; k++) {
        snprintf(path, sizeof path, "%s/%s", run, files[k]);
        if (access(path, F_OK) != 0) continue;
        checked++;
        T_CHECK(utf8_file_ok(path), "%s is not valid UTF-8", files[k]);
    }
    printf("  eval's JSON and %d files of the run valid UTF-8\n", checked);
    T_CHECK(checked >= 3, "only %d of eval.json, metrics.svg, memory.svg, eval.svg were written", checked);
    t_remove_dir(dir);
    return 0;
}
