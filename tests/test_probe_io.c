/*
 * test_probe_io.c — issue 18 §3, "nothing lost on a bad input": the probe's cases,
 * run as an outside checker runs them (the tool, its exit status, its messages, what
 * it left on disk), plus the library calls behind them.
 *   probe_ranks_same_inputs: ranks started with other arguments (--model, --capture-
 *     chunk, --mode, --cp-layout, demo's --updates) or reading other files (the same
 *     command line in another directory) refuse on every rank, naming the argument or
 *     the file, instead of hanging or computing silently wrong results (MPI; 77 without).
 *   probe_run_files_no_follow: RUN/.lock, RUN/trace.0.jsonl and RUN/metrics.jsonl that
 *     are symbolic links out of the run (or a FIFO) are refused and the outside file is
 *     untouched; the lock message reads "(pid N)".
 *   probe_trace_write_fails: a trace write that fails (a file size limit: EFBIG) ends
 *     the run with an error naming the trace, the finished updates checkpointed and the
 *     trace ending with a whole line; ls_trace_status reports it.
 *   probe_nonfinite_output: a forward that overflows (MLP weights × 1e30) makes
 *     `logprobs` fail naming the member and position, never print NaN; `grad` writes
 *     nothing; ls_json_number writes null for NaN/Inf.
 *   probe_reward_kill: a reward process that ignores SIGTERM does not survive a double
 *     SIGINT, with the tool as an ordinary process and as PID 1 (unshare --pid, when
 *     allowed here); ls_reward_cmd_kill_group SIGKILLs the group after its grace.
 *   probe_fifo_inputs: a FIFO given as model.safetensors, config.json, a group file, a
 *     tokenizer, data, an adapter or a checkpoint's optimizer.safetensors is refused by
 *     name at once (before: open() blocked forever).
 *   probe_messages: grad/step/logprobs take the --tokenizer they advise; --data DIR
 *     names the directory; a reference of another family names both; grad killed under
 *     mpirun advises running it again, not --resume.
 * LONGSTRAW_TEST_CLI=PATH runs these against another build of the tool (how the
 * failures before the fixes were shown).
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "longstraw/checkpoint.h"
#include "longstraw/config.h"
#include "longstraw/files.h"
#include "longstraw/reward.h"
#include "longstraw/safetensors.h"
#include "longstraw/tokenizer.h"
#include "longstraw/trace.h"
#include "testutil.h"

#ifndef LS_SOURCE_DIR
#define LS_SOURCE_DIR "."
#endif
#ifndef LS_MPIEXEC
#define LS_MPIEXEC ""
#endif
#ifndef LS_MPI_ENV
#define LS_MPI_ENV ""
#endif

int test_probe_ranks_same_inputs(void);
int test_probe_run_files_no_follow(void);
int test_probe_trace_write_fails(void);
int test_probe_nonfinite_output(void);
int test_probe_reward_kill(void);
int test_probe_fifo_inputs(void);
int test_probe_messages(void);

#define FIX LS_SOURCE_DIR "/tests/reference/fixtures"
#define MPIRUN "env " LS_MPI_ENV LS_MPIEXEC " --oversubscribe --allow-run-as-root"

static const char *cli(void) {
    const char *e = getenv("LONGSTRAW_TEST_CLI");
    return e && e[0] ? e : LS_CLI_PATH;
}

/* Run a shell command (stderr with stdout); output malloc'd, exit status in *rc. */
static char *run(int *rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *run(int *rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *out = t_run_vfmt(rc, fmt, ap);
    va_end(ap);
    return out ? out : strdup(""); /* never NULL: callers strstr it */
}

static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static int exists_l(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

/* 1 when `path` is a regular file holding exactly `text`. */
static int holds(const char *path, const char *text) {
    size_t n;
    char *got = t_read_file(path, &n);
    int same = got && n == strlen(text) && memcmp(got, text, n) == 0;
    free(got);
    return same;
}

/* dir/d.jsonl: the next_dense training group as one JSONL line. */
static int make_data(const char *dir, char *data, size_t cap) {
    char *text = t_read_file(FIX "/next_dense/group_train.json", NULL);
    cJSON *g = text ? cJSON_Parse(text) : NULL;
    free(text);
    char *line = g ? cJSON_PrintUnformatted(g) : NULL;
    cJSON_Delete(g);
    snprintf(data, cap, "%s/d.jsonl", dir);
    int r = line ? write_text(data, line) : -1;
    if (r == 0) {
        FILE *f = fopen(data, "a");
        r = f && fputc('\n', f) != EOF && fclose(f) == 0 ? 0 : -1;
    }
    free(line);
    return r;
}

/* A tiny model whose 260 ids cover the byte-level tokenizer's (dir/m) and that
 * tokenizer (dir/tok.json). */
static int make_bytes_model(const char *dir) {
    char cfg[700], tok[700], *json = NULL;
    snprintf(cfg, sizeof cfg, "%s/c.json", dir);
    snprintf(tok, sizeof tok, "%s/tok.json", dir);
    if (write_text(cfg, "{\"model_type\": \"qwen3_next\", \"vocab_size\": 260, \"hidden_size\": 32, \"num_hidden_layers\": 2,"
                        " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 16,"
                        " \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 2, \"linear_key_head_dim\": 8,"
                        " \"linear_value_head_dim\": 8, \"intermediate_size\": 48, \"num_experts\": 0,"
                        " \"full_attention_interval\": 2}") != 0 ||
        ls_tok_byte_level_json(&json) != LS_OK || write_text(tok, json) != 0) {
        free(json);
        return -1;
    }
    free(json);
    char m[1200];
    snprintf(m, sizeof m, "%s/m", dir);
    return t_write_model(cfg, m, 3);
}

static int mpi_built(void) { return LS_MPIEXEC[0] != 0; }

/* dst = the safetensors file src with tensor `name`'s elements [0, n) (n < 0: all)
 * multiplied by `factor`; 0 on success. */
static int copy_scaled(const char *src, const char *dst, const char *const *names, int n_names, int64_t n, float factor) {
    ls_st_file f;
    ls_st_writer w;
    ls_st_writer_init(&w);
    if (ls_st_open(&f, src) != LS_OK) return -1;
    int64_t nt = ls_st_count(&f);
    float **bufs = calloc((size_t)nt, sizeof *bufs);
    int bad = !bufs;
    for (int64_t i = 0; i < nt && !bad; i++) {
        const ls_st_tensor *t = ls_st_at(&f, i);
        float *v = bufs[i] = malloc((size_t)(t->numel + 1) * sizeof(float));
        bad = !v || ls_st_read_f32(t, v, t->numel, NULL) != LS_OK;
        for (int k = 0; k < n_names && !bad; k++)
            if (!strcmp(t->name, names[k]))
                for (int64_t e = 0; e < (n < 0 || n > t->numel ? t->numel : n); e++) v[e] *= factor;
        /* the writer borrows v until ls_st_write */
        if (!bad) bad = ls_st_writer_add_f32(&w, t->name, LS_DTYPE_F32, t->ndim, t->shape, v) != LS_OK;
    }
    if (!bad) bad = ls_st_write(&w, dst) != LS_OK;
    if (bad) fprintf(stderr, "  copy_scaled %s: %s\n", src, ls_err_msg());
    ls_st_writer_free(&w);
    for (int64_t i = 0; bufs && i < nt; i++) free(bufs[i]);
    free(bufs);
    ls_st_close(&f);
    return bad ? -1 : 0;
}

/* ---- 1. ranks given different inputs ---------------------------------------------- */

/* `cmd` (an mpirun line) must fail (not hang: timeout's 124) with the refusal naming `what`. */
static int expect_ranks_refused(const char *cmd, const char *what, const char *label) {
    int rc;
    char *out = run(&rc, "timeout -k 5 60 %s", cmd);
    int ok = rc != 0 && rc != 124 && strstr(out, "were not given the same command and inputs") && strstr(out, what);
    if (!ok) fprintf(stderr, "  %s: rc %d (124: hung), want a refusal naming %s:\n%s\n", label, rc, what, out);
    free(out);
    return ok ? 0 : 1;
}

int test_probe_ranks_same_inputs(void) {
    if (!mpi_built()) T_SKIP("this build has no MPI");
    char dir[512], c[8192];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    const char *L = cli();
    int bad = 0;
    /* another model: the tool hung in a collective the other rank never entered */
    snprintf(c, sizeof c, MPIRUN " -np 1 %s logprobs --model " FIX "/next_dense --group " FIX "/next_dense/group.json : "
             "-np 1 %s logprobs --model " FIX "/q35_dense --group " FIX "/next_dense/group.json", L, L);
    bad |= expect_ranks_refused(c, "(after \"--model\")", "--model A : --model B");
    /* another capture chunk: silently other numbers */
    snprintf(c, sizeof c, MPIRUN " -np 1 %s logprobs --model " FIX "/next_dense --group " FIX "/next_dense/group.json "
             "--capture-chunk 16 : -np 1 %s logprobs --model " FIX "/next_dense --group " FIX "/next_dense/group.json "
             "--capture-chunk 8", L, L);
    bad |= expect_ranks_refused(c, "(after \"--capture-chunk\")", "--capture-chunk 16 : 8");
    snprintf(c, sizeof c, MPIRUN " -np 1 %s grad --model " FIX "/next_dense --group " FIX "/next_dense/group_train.json "
             "--out %s/g.st --mode full : -np 1 %s grad --model " FIX "/next_dense --group " FIX "/next_dense/group_train.json "
             "--out %s/g.st --mode prefix-frozen", L, dir, L, dir);
    bad |= expect_ranks_refused(c, "(after \"--mode\")", "grad --mode full : prefix-frozen");
    snprintf(c, sizeof c, MPIRUN " -np 1 %s step --model " FIX "/next_dense --group " FIX "/next_dense/group_train.json "
             "--out %s/s --cp-layout zigzag : -np 1 %s step --model " FIX "/next_dense --group " FIX "/next_dense/group_train.json "
             "--out %s/s --cp-layout contiguous", L, dir, L, dir);
    bad |= expect_ranks_refused(c, "(after \"--cp-layout\")", "step --cp-layout zigzag : contiguous");
    snprintf(c, sizeof c, MPIRUN " -np 1 %s demo --out %s/demo --updates 1 --prompt-len 300 --quiet : "
             "-np 1 %s demo --out %s/demo --updates 2 --prompt-len 300 --quiet", L, dir, L, dir);
    bad |= expect_ranks_refused(c, "(after \"--updates\")", "demo --updates 1 : 2");
    char p[1200];
    snprintf(p, sizeof p, "%s/demo", dir);
    T_CHECK(!exists_l(p), "the refused demo wrote %s", p);
    /* the same command line in two directories whose files differ: a group file, a
     * model's weights, training data */
    int rc;
    char *out = run(&rc, "cd %s && mkdir -p r0 r1 && cp -r " FIX "/next_dense r0/m && cp -r " FIX "/next_dense r1/m && "
                    "cp " FIX "/next_dense/group_train.json r0/g.json && cp " FIX "/next_dense/group_train.json r1/g.json && "
                    "sed -i 's/\"rewards\"/\"advantages\"/' r1/g.json", dir);
    T_CHECK(rc == 0, "setup: %s", out);
    free(out);
    const char *sh = "sh -c 'cd %s/r$OMPI_COMM_WORLD_RANK && exec %s %s'";
    char inner[2048];
    snprintf(inner, sizeof inner, sh, dir, L, "grad --model m --group g.json --out g.st");
    snprintf(c, sizeof c, MPIRUN " -np 2 %s", inner);
    bad |= expect_ranks_refused(c, "reads another g.json than rank 0", "grad: another g.json");
    snprintf(p, sizeof p, "%s/r1/m/model.safetensors", dir);
    {
        static const char *const one[] = {"model.norm.weight"}; /* one weight of one rank's copy */
        T_CHECK(copy_scaled(FIX "/next_dense/model.safetensors", p, one, 1, 1, 1.0001f) == 0, "modified copy");
    }
    snprintf(inner, sizeof inner, sh, dir, L, "logprobs --model m --group " FIX "/next_dense/group.json");
    snprintf(c, sizeof c, MPIRUN " -np 2 %s", inner);
    bad |= expect_ranks_refused(c, "reads another m/model.safetensors than rank 0", "logprobs: another model.safetensors");
    /* train: the data differ (here in white space only: the bytes are compared) */
    out = run(&rc, "cd %s && printf '{\"prompt\": [1, 2, 3], \"responses\": [[4], [5, 6]], \"rewards\": [1, 0]}\\n' > r0/d.jsonl && "
                   "printf '{\"prompt\": [1, 2, 3], \"responses\": [[4], [5, 7]], \"rewards\": [1, 0]}\\n' > r1/d.jsonl", dir);
    T_CHECK(rc == 0, "setup: %s", out);
    free(out);
    out = run(&rc, "cp %s/r0/m/model.safetensors %s/r1/m/", dir, dir); /* the models agree again */
    T_CHECK(rc == 0, "setup: %s", out);
    free(out);
    snprintf(inner, sizeof inner, sh, dir, L, "train --model m --data d.jsonl --out run --updates 1 --quiet");
    snprintf(c, sizeof c, MPIRUN " -np 2 %s", inner);
    bad |= expect_ranks_refused(c, "reads another d.jsonl than rank 0", "train: another d.jsonl");
    snprintf(p, sizeof p, "%s/r0/run/checkpoint-1", dir);
    T_CHECK(!exists_l(p), "the refused train wrote %s", p);
    /* and the same inputs still run */
    out = run(&rc, "timeout 120 " MPIRUN " -np 2 %s logprobs --model " FIX "/next_dense --group " FIX "/next_dense/group.json", L);
    T_CHECK(rc == 0 && strstr(out, "{\"logprobs\": [["), "the same inputs on 2 ranks: rc %d %s", rc, out);
    free(out);
    T_CHECK(!bad, "ranks given different inputs were not all refused (above)");
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* ---- 2. run files are not followed out of the run directory ----------------------------- */

/* train into dir/run whose `name` was planted by the caller: refused naming it, nothing
 * written to `outside` (which must still hold `text`). */
static int expect_run_refused(const char *dir, const char *data, const char *name, const char *outside,
                              const char *text, const char *what) {
    int rc;
    char *out = run(&rc, "timeout -k 5 60 %s train --model " FIX "/next_dense --data %s --out %s/run --updates 1 --quiet", cli(),
                    data, dir);
    int ok = rc == 1 && strstr(out, name) && strstr(out, what) && (!outside || holds(outside, text));
    if (!ok)
        fprintf(stderr, "  planted %s: rc %d, outside %s: %s\n  output: %s\n", name, rc, outside ? outside : "-",
                outside && holds(outside, text) ? "intact" : "WRITTEN", out);
    free(out);
    return ok ? 0 : 1;
}

int test_probe_run_files_no_follow(void) {
    char dir[512], data[700], run_dir[700], p[1200], o[1200];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0 && make_data(dir, data, sizeof data) == 0, "setup");
    snprintf(run_dir, sizeof run_dir, "%s/run", dir);
    snprintf(o, sizeof o, "%s/outside", dir);
    int bad = 0;
    static const char *const names[] = {".lock", "trace.0.jsonl", "metrics.jsonl"};
    for (int k = 0; k < 3; k++) {
        T_CHECK(t_remove_dir(run_dir) == 0 || !exists_l(run_dir), "clean");
        T_CHECK(mkdir(run_dir, 0755) == 0, "mkdir");
        /* an outside file the run must not write: with content, and (metrics) empty */
        const char *text = k == 2 ? "" : "precious\n";
        T_CHECK(write_text(o, text) == 0, "outside");
        snprintf(p, sizeof p, "%s/%s", run_dir, names[k]);
        T_CHECK(symlink(o, p) == 0, "symlink");
        bad |= expect_run_refused(dir, data, names[k], o, text, "symbolic link");
    }
    /* a FIFO as the trace: refused at once, never opened for writing */
    T_CHECK(t_remove_dir(run_dir) == 0 && mkdir(run_dir, 0755) == 0, "clean");
    snprintf(p, sizeof p, "%s/trace.0.jsonl", run_dir);
    T_CHECK(mkfifo(p, 0644) == 0, "mkfifo");
    bad |= expect_run_refused(dir, data, "trace.0.jsonl", NULL, NULL, "FIFO");
    /* the lock message: "(pid 12345)", not "(pid 12345\n)" */
    T_CHECK(t_remove_dir(run_dir) == 0, "clean");
    int rc;
    char *out = run(&rc, "%s train --model " FIX "/next_dense --data %s --out %s --updates 1 --quiet", cli(), data, run_dir);
    T_CHECK(rc == 0, "train: %s", out);
    free(out);
    snprintf(p, sizeof p, "%s/.lock", run_dir);
    int fd = open(p, O_RDWR);
    T_CHECK(fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0 && ftruncate(fd, 0) == 0 && write(fd, "12345\n", 6) == 6, "hold the lock");
    out = run(&rc, "%s train --resume %s --updates 2 --quiet", cli(), run_dir);
    close(fd);
    if (!(rc == 1 && strstr(out, "in use by another longstraw train (pid 12345)"))) {
        fprintf(stderr, "  locked run: rc %d, want \"(pid 12345)\" on one line: %s\n", rc, out);
        bad = 1;
    }
    free(out);
    T_CHECK(!bad, "a run file planted as a link or FIFO was used, or the lock message is broken (above)");
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* ---- 3. a failed trace write is an error ------------------------------------------------ */

/* Run argv (argv[0]: the program) with RLIMIT_FSIZE = limit bytes and SIGXFSZ ignored
 * (writes past the limit fail with EFBIG), stdout+stderr to `log`; its exit status. */
static int run_with_fsize(char *const *argv, rlim_t limit, const char *log) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) _exit(120);
        dup2(fd, 1);
        dup2(fd, 2);
        struct rlimit rl = {limit, limit};
        signal(SIGXFSZ, SIG_IGN);
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(121);
        execv(argv[0], argv);
        _exit(122);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Every line of `path` ends with '\n' and parses as JSON; the number of lines. */
static int64_t whole_json_lines(const char *path) {
    size_t n;
    char *text = t_read_file(path, &n);
    if (!text || n == 0 || text[n - 1] != '\n') {
        free(text);
        return -1;
    }
    int64_t k = 0;
    for (char *l = strtok(text, "\n"); l; l = strtok(NULL, "\n"), k++) {
        cJSON *o = cJSON_Parse(l);
        if (!o) k = INT64_MIN;
        cJSON_Delete(o);
    }
    free(text);
    return k;
}

int test_probe_trace_write_fails(void) {
    char dir[512], data[700], runp[700], log[700], p[1200];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0 && make_data(dir, data, sizeof data) == 0, "setup");
    snprintf(runp, sizeof runp, "%s/run", dir);
    snprintf(log, sizeof log, "%s/log.txt", dir);
    /* the library: events past a 4 KiB limit fail; the status says so, the file ends
     * with a whole line (in a child: the limit is process-wide) */
    snprintf(p, sizeof p, "%s/t.jsonl", dir);
    pid_t pid = fork();
    T_CHECK(pid >= 0, "fork");
    if (pid == 0) {
        struct rlimit rl = {4096, 4096};
        signal(SIGXFSZ, SIG_IGN);
        ls_arenas ar;
        ls_arenas_init(&ar);
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0 || ls_trace_open(p, 0, &ar, "test") != LS_OK) _exit(2);
        for (int i = 0; i < 200; i++) ls_trace_event("probe", "\"i\": %d, \"pad\": \"%s\"", i, "................................");
        int r = ls_trace_status() != LS_OK && strstr(ls_err_msg(), p) && strstr(ls_err_msg(), "cannot write the trace") ? 0 : 3;
        if (ls_trace_close() == LS_OK) r = 4;
        _exit(r);
    }
    int st;
    T_CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st), "child");
    T_CHECK(WEXITSTATUS(st) == 0, "ls_trace_status after a failed write: child status %d (2 setup, 3 status OK or "
                                  "unnamed, 4 close OK)", WEXITSTATUS(st));
    int64_t lines = whole_json_lines(p);
    T_CHECK(lines > 5, "the library's trace does not end with a whole line (%lld lines)", (long long)lines);
    /* the tool: `train` whose trace outgrows a 64 KiB file size limit (the LoRA
     * checkpoints, metrics and args stay below it) */
    char *argv[] = {(char *)cli(), "train", "--model", FIX "/next_dense", "--data", data, "--out", runp, "--updates", "12",
                    "--save-every", "100", "--trace-layers", "-1", "--lora-rank", "2", "--quiet", NULL};
    int rc = run_with_fsize(argv, 64 << 10, log);
    char *out = t_read_file(log, NULL);
    T_CHECK(rc == 1 && out && strstr(out, "trace.0.jsonl") && strstr(out, "cannot write the trace"),
            "train with a trace that cannot be written: rc %d (want 1, naming the trace): %s", rc, out ? out : "");
    free(out);
    snprintf(p, sizeof p, "%s/trace.0.jsonl", runp);
    lines = whole_json_lines(p);
    T_CHECK(lines > 0, "the trace is cut mid-line or holds a line that is not JSON (%lld)", (long long)lines);
    int64_t last = -1;
    char ck[1200];
    T_OK(ls_ckpt_latest(runp, &last, ck, sizeof ck));
    T_CHECK(last >= 1 && last < 12, "the finished updates were not checkpointed (latest %lld)", (long long)last);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* ---- 4. non-finite outputs ------------------------------------------------------------- */

int test_probe_nonfinite_output(void) {
    char dir[512], p[1200];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    /* next_dense with layer 0's MLP up and gate projections × 1e30: silu(g)·u overflows */
    snprintf(p, sizeof p, "%s/huge", dir);
    T_CHECK(mkdir(p, 0755) == 0, "mkdir");
    snprintf(p, sizeof p, "%s/huge/config.json", dir);
    T_OK(ls_copy_file_atomic(FIX "/next_dense/config.json", p));
    snprintf(p, sizeof p, "%s/huge/model.safetensors", dir);
    static const char *const mlp[] = {"model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.gate_proj.weight"};
    T_CHECK(copy_scaled(FIX "/next_dense/model.safetensors", p, mlp, 2, -1, 1e30f) == 0, "the huge checkpoint");
    int rc;
    char err[1200];
    snprintf(err, sizeof err, "%s/err.txt", dir);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s logprobs --model %s/huge --group " FIX "/next_dense/group.json 2>%s", cli(), dir, err);
    char *out = t_run_capture(cmd, &rc);
    char *msg = t_read_file(err, NULL);
    T_CHECK(out && msg, "run");
    int printed_nan = strstr(out, "nan") || strstr(out, "inf") || strstr(out, "NaN") || strstr(out, "Inf");
    cJSON *doc = out[0] ? cJSON_Parse(out) : NULL;
    T_CHECK(!printed_nan && (!out[0] || doc), "logprobs printed what JSON cannot hold: %.200s", out);
    cJSON_Delete(doc);
    T_CHECK(rc != 0, "logprobs of an overflowing forward exited 0: %.200s", out);
    T_CHECK(strstr(msg, "member 0") && strstr(msg, "token 0") && strstr(msg, "NaN"),
            "the error does not name the member and position: %s", msg);
    free(out);
    free(msg);
    /* grad: nothing written */
    out = run(&rc, "%s grad --model %s/huge --group " FIX "/next_dense/group_train.json --out %s/g.safetensors", cli(), dir, dir);
    snprintf(p, sizeof p, "%s/g.safetensors", dir);
    T_CHECK(rc != 0 && !exists_l(p), "grad of an overflowing forward: rc %d, %s written: %s", rc,
            exists_l(p) ? "a gradient" : "nothing", out);
    free(out);
    /* the JSON writer */
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    T_CHECK(m, "memstream");
    ls_json_number(m, NULL, NAN);
    fputc(' ', m);
    ls_json_number(m, "%.9g", -INFINITY);
    fputc(' ', m);
    ls_json_number(m, "%.9g", 1.5);
    fclose(m);
    T_CHECK(!strcmp(buf, "null null 1.5"), "ls_json_number: \"%s\"", buf);
    free(buf);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* ---- 5. a reward process that ignores SIGTERM --------------------------------------- */

/* pids of live (not zombie) processes whose command line contains `tag`. */
static int live_with(const char *tag, pid_t *pids, int cap) {
    DIR *d = opendir("/proc");
    int n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0 || pid == getpid()) continue;
        char path[64], buf[4096];
        snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t k = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        for (size_t i = 0; i < k; i++)
            if (!buf[i]) buf[i] = ' ';
        buf[k] = 0;
        if (!strstr(buf, tag)) continue;
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        f = fopen(path, "r");
        char state = '?';
        if (f) {
            if (fscanf(f, "%*d (%*[^)]) %c", &state) != 1) state = '?';
            fclose(f);
        }
        if (state == 'Z' || state == 'X') continue;
        if (n < cap) pids[n] = (pid_t)pid;
        n++;
    }
    closedir(d);
    return n;
}

/* Live (not zombie) members of process group pg. */
static int group_alive(int pg) {
    DIR *d = opendir("/proc");
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        char *end, path[64], buf[1024];
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0) continue;
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t k = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[k] = 0;
        char *r = strrchr(buf, ')'), state;
        int ppid, pgrp;
        if (r && sscanf(r + 1, " %c %d %d", &state, &ppid, &pgrp) == 3 && pgrp == pg && state != 'Z' && state != 'X') n++;
    }
    if (d) closedir(d);
    return n;
}

static void kill_all_with(const char *tag) {
    pid_t p[64];
    int n = live_with(tag, p, 64);
    for (int i = 0; i < n && i < 64; i++) kill(p[i], SIGKILL);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void nap(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* The parent process id of `pid` (from /proc), or -1. */
static pid_t parent_of(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    int pp = -1;
    if (f) {
        if (fscanf(f, "%*d (%*[^)]) %*c %d", &pp) != 1) pp = -1;
        fclose(f);
    }
    return (pid_t)pp;
}

/* `train --rollout --reward-cmd 'sh SCRIPT'` (as PID 1 of a new PID namespace when
 * pid1), a double SIGINT once the script is answering; 0 when the tool ended within 15 s
 * and no process of the script is alive 1 s after. */
static int double_sigint(const char *dir, int pid1, const char *label) {
    char script[700], asked[700], runp[700], model[700], rcmd[800], log[700];
    snprintf(script, sizeof script, "%s/r%d.sh", dir, pid1);
    snprintf(asked, sizeof asked, "%s/asked%d", dir, pid1);
    snprintf(runp, sizeof runp, "%s/run%d", dir, pid1);
    snprintf(model, sizeof model, "%s/m", dir);
    snprintf(log, sizeof log, "%s/log%d.txt", dir, pid1);
    char body[1600];
    snprintf(body, sizeof body,
             "trap '' TERM\n"
             "while read l; do touch %s; i=0; while [ $i -lt 900 ]; do i=$((i+1)); sleep 0.1; done; echo 1; done\n", asked);
    if (write_text(script, body) != 0) return 1;
    snprintf(rcmd, sizeof rcmd, "sh %s", script);
    char *argv[32];
    int k = 0;
    if (pid1) argv[k++] = "unshare", argv[k++] = "--pid", argv[k++] = "--fork";
    argv[k++] = (char *)cli();
    char *rest[] = {"train", "--model", model, "--out", runp, "--rollout", "--task", "passkey", "--prompt-len", "300",
                    "--num-generations", "2", "--max-new-tokens", "2", "--updates", "3", "--reward-cmd", rcmd, "--quiet"};
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++) argv[k++] = rest[i];
    argv[k] = NULL;
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
        execvp(argv[0], argv);
        _exit(127);
    }
    int bad = 0, st = 0;
    double t0 = now_s();
    while (!exists_l(asked) && now_s() - t0 < 120 && waitpid(pid, &st, WNOHANG) == 0) nap(0.05);
    if (!exists_l(asked)) {
        char *o = t_read_file(log, NULL);
        fprintf(stderr, "  %s: the reward process was never asked: %s\n", label, o ? o : "");
        free(o);
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        kill_all_with(script);
        return 1;
    }
    /* the tool: unshare's child (PID 1 inside) */
    pid_t tool = pid;
    if (pid1) {
        tool = -1;
        DIR *d = opendir("/proc");
        for (struct dirent *e; d && (e = readdir(d));) {
            long q = strtol(e->d_name, NULL, 10);
            if (q > 0 && parent_of((pid_t)q) == pid) tool = (pid_t)q;
        }
        if (d) closedir(d);
    }
    if (tool <= 0) {
        fprintf(stderr, "  %s: cannot find the tool's process\n", label);
        bad = 1;
    } else {
        kill(tool, SIGINT);
        nap(0.3);
        kill(tool, SIGINT);
    }
    t0 = now_s();
    int ended = 0;
    while (now_s() - t0 < 15 && !(ended = waitpid(pid, &st, WNOHANG) == pid)) nap(0.05);
    if (!ended) {
        fprintf(stderr, "  %s: the tool did not end within 15 s of the second SIGINT\n", label);
        bad = 1;
        kill(pid, SIGKILL);
        if (tool > 0) kill(tool, SIGKILL);
        waitpid(pid, &st, 0);
    }
    nap(1.0);
    pid_t left[8];
    int n = live_with(script, left, 8);
    if (n != 0) {
        fprintf(stderr, "  %s: %d process(es) of the reward command survived the double SIGINT (pid %d)\n", label, n,
                n > 0 ? (int)left[0] : -1);
        bad = 1;
    }
    kill_all_with(script);
    if (bad) {
        char *o = t_read_file(log, NULL);
        fprintf(stderr, "  %s output: %s\n", label, o ? o : "");
        free(o);
    }
    return bad;
}

int test_probe_reward_kill(void) {
    char dir[512], p[700];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0 && make_bytes_model(dir) == 0, "setup");
    /* the library: SIGTERM ignored, SIGKILL after the grace, the group gone */
    snprintf(p, sizeof p, "%s/lib-started", dir);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "trap '' TERM; touch %s; while :; do sleep 0.1; done", p);
    ls_reward_cmd *rc;
    T_OK(ls_reward_cmd_start(&rc, cmd));
    double t0 = now_s();
    while (!exists_l(p) && now_s() - t0 < 20) nap(0.02);
    T_CHECK(exists_l(p), "the command did not start");
    int pg = ls_reward_cmd_pgid(rc);
    t0 = now_s();
    ls_reward_cmd_kill_group(pg, 0.3);
    double dt = now_s() - t0;
    int gone = group_alive(pg) == 0; /* zombies left to an init that does not reap them count as gone */
    if (!gone) kill(-pg, SIGKILL);
    ls_reward_cmd_stop(rc);
    T_CHECK(gone, "ls_reward_cmd_kill_group left process group %d alive", pg);
    T_CHECK(dt >= 0.25 && dt < 5, "ls_reward_cmd_kill_group took %.2f s (grace 0.3 s)", dt);
    /* the tool */
    int bad = double_sigint(dir, 0, "train (an ordinary process)");
    int r;
    char *out = run(&r, "unshare --pid --fork true");
    free(out);
    if (r == 0) bad |= double_sigint(dir, 1, "train as PID 1 (unshare --pid --fork)");
    else printf("  (PID 1 case not run: unshare --pid is not allowed here)\n");
    T_CHECK(!bad, "a reward process that ignores SIGTERM outlived a double SIGINT (above)");
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* ---- 6. FIFOs as inputs ------------------------------------------------------------------ */

static int expect_fifo_refused(const char *cmd, const char *name, const char *label) {
    int rc;
    double t0 = now_s();
    char *out = run(&rc, "timeout -k 5 30 %s", cmd);
    int ok = rc == 1 && strstr(out, name) && strstr(out, "FIFO");
    if (!ok)
        fprintf(stderr, "  %s: rc %d after %.1f s (124: blocked in open), want a refusal naming %s as a FIFO: %s\n", label,
                rc, now_s() - t0, name, out);
    free(out);
    return ok ? 0 : 1;
}

int test_probe_fifo_inputs(void) {
    char dir[512], data[700], p[1200], c[4096], q[1200];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0 && make_data(dir, data, sizeof data) == 0 && make_bytes_model(dir) == 0,
            "setup");
    const char *L = cli();
    int bad = 0, rc;
    /* model.safetensors, then config.json */
    char *out = run(&rc, "cd %s && mkdir f1 f2 && cp " FIX "/next_dense/config.json f1/ && mkfifo f1/model.safetensors && "
                         "cp " FIX "/next_dense/model.safetensors f2/ && mkfifo f2/config.json && mkfifo fifo", dir);
    T_CHECK(rc == 0, "setup: %s", out);
    free(out);
    snprintf(c, sizeof c, "%s logprobs --model %s/f1 --group " FIX "/next_dense/group.json", L, dir);
    bad |= expect_fifo_refused(c, "f1/model.safetensors", "model.safetensors");
    snprintf(c, sizeof c, "%s logprobs --model %s/f2 --group " FIX "/next_dense/group.json", L, dir);
    bad |= expect_fifo_refused(c, "f2/config.json", "config.json");
    snprintf(p, sizeof p, "%s/fifo", dir);
    snprintf(c, sizeof c, "%s logprobs --model " FIX "/next_dense --group %s", L, p);
    bad |= expect_fifo_refused(c, p, "the group file");
    snprintf(c, sizeof c, "%s train --model " FIX "/next_dense --data %s --out %s/runA --quiet", L, p, dir);
    bad |= expect_fifo_refused(c, p, "--data");
    snprintf(c, sizeof c, "%s train --model %s/m --data %s --tokenizer %s --out %s/runB --quiet", L, dir, data, p, dir);
    bad |= expect_fifo_refused(c, p, "--tokenizer");
    snprintf(c, sizeof c, "%s grad --model " FIX "/next_dense --group " FIX "/next_dense/group_train.json --adapter %s --out %s/g.st",
             L, p, dir);
    bad |= expect_fifo_refused(c, p, "--adapter");
    /* a checkpoint's optimizer state, on resume */
    out = run(&rc, "%s train --model " FIX "/next_dense --data %s --out %s/runC --updates 1 --lora-rank 2 --quiet", L, data, dir);
    T_CHECK(rc == 0, "train: %s", out);
    free(out);
    snprintf(q, sizeof q, "%s/runC/checkpoint-1/optimizer.safetensors", dir);
    T_CHECK(unlink(q) == 0 && mkfifo(q, 0644) == 0, "optimizer FIFO");
    snprintf(c, sizeof c, "%s train --resume %s/runC --updates 2 --quiet", L, dir);
    bad |= expect_fifo_refused(c, "optimizer.safetensors", "a checkpoint's optimizer.safetensors");
    T_CHECK(!bad, "a FIFO given as an input blocked or was not named (above)");
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* ---- 7. messages ----------------------------------------------------------------------- */

int test_probe_messages(void) {
    char dir[512], data[700], p[1200];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0 && make_data(dir, data, sizeof data) == 0 && make_bytes_model(dir) == 0,
            "setup");
    const char *L = cli();
    int bad = 0, rc;
    /* a group given as text: the commands that advise --tokenizer take it */
    snprintf(p, sizeof p, "%s/text.json", dir);
    T_CHECK(write_text(p, "{\"prompt\": \"The capital of France is\", \"responses\": [\" Paris\", \" Lyon, maybe\"], "
                          "\"rewards\": [1, 0]}") == 0, "text group");
    char *out = run(&rc, "%s logprobs --model %s/m --group %s", L, dir, p);
    if (!(rc == 1 && strstr(out, "--tokenizer"))) {
        fprintf(stderr, "  logprobs of a text group without a tokenizer: rc %d %s\n", rc, out);
        bad = 1;
    }
    free(out);
    out = run(&rc, "%s logprobs --model %s/m --group %s --tokenizer %s/tok.json", L, dir, p, dir);
    cJSON *doc = rc == 0 ? cJSON_Parse(out) : NULL;
    cJSON *lp = doc ? cJSON_GetObjectItem(doc, "logprobs") : NULL;
    if (!(lp && cJSON_GetArraySize(lp) == 2 && cJSON_GetArraySize(cJSON_GetArrayItem(lp, 0)) == 6)) {
        fprintf(stderr, "  logprobs --tokenizer: rc %d %s\n", rc, out);
        bad = 1;
    }
    cJSON_Delete(doc);
    free(out);
    for (int step = 0; step < 2; step++) {
        out = run(&rc, "%s %s --model %s/m --group %s --tokenizer %s/tok.json --out %s/%s", L, step ? "step" : "grad", dir, p,
                  dir, dir, step ? "stepped" : "g.safetensors");
        if (rc != 0) {
            fprintf(stderr, "  %s --tokenizer: rc %d %s\n", step ? "step" : "grad", rc, out);
            bad = 1;
        }
        free(out);
    }
    /* --data DIR */
    out = run(&rc, "%s train --model " FIX "/next_dense --data %s --out %s/run --quiet", L, dir, dir);
    if (!(rc == 1 && strstr(out, dir) && strstr(out, "is a directory"))) {
        fprintf(stderr, "  --data DIR: rc %d %s\n", rc, out);
        bad = 1;
    }
    free(out);
    /* a reference of another family, both ways */
    for (int k = 0; k < 2; k++) {
        const char *pol = k ? FIX "/mla_glm" : FIX "/next_dense", *ref = k ? FIX "/next_dense" : FIX "/mla_glm";
        out = run(&rc, "%s grad --model %s --group %s/group_train.json --out %s/g2.st --beta 0.1 --ref-model %s", L, pol, pol,
                  dir, ref);
        if (!(rc == 1 && strstr(out, "same family") && strstr(out, pol) && strstr(out, ref) && !strstr(out, "(no message)"))) {
            fprintf(stderr, "  --ref-model of another family: rc %d %s\n", rc, out);
            bad = 1;
        }
        free(out);
    }
    /* grad killed under mpirun: no --resume to advise */
    if (mpi_built()) {
        snprintf(p, sizeof p, "%s/long.json", dir);
        FILE *f = fopen(p, "w");
        T_CHECK(f, "long group");
        fprintf(f, "{\"prompt\": [");
        for (int i = 0; i < 40000; i++) fprintf(f, "%s%d", i ? ", " : "", (i * 7919) % 97);
        fprintf(f, "], \"responses\": [[1, 2], [3]], \"rewards\": [1, 0]}\n");
        T_CHECK(fclose(f) == 0, "long group");
        /* rank 1 is killed (SIGTERM) once it is capturing; mpirun then ends rank 0 */
        char log[700], cmd[4096];
        snprintf(log, sizeof log, "%s/mpi.log", dir);
        snprintf(cmd, sizeof cmd, "exec " MPIRUN " -np 2 %s grad --model " FIX "/next_dense --group %s --out %s/g3.st "
                 "--threads 1 >%s 2>&1", L, p, dir, log);
        pid_t pid = fork();
        T_CHECK(pid >= 0, "fork");
        if (pid == 0) {
            execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
            _exit(127);
        }
        pid_t ranks[4];
        double t0 = now_s();
        int n = 0;
        while (now_s() - t0 < 60 && (n = live_with(p, ranks, 4)) < 3) nap(0.05); /* mpirun and two ranks */
        nap(1.5);
        /* the ranks are the processes whose parent is not our child (mpirun is) */
        n = live_with(p, ranks, 4);
        int killed = 0;
        for (int i = 0; i < n && i < 4 && !killed; i++)
            if (ranks[i] != pid && parent_of(ranks[i]) == pid) killed = kill(ranks[i], SIGTERM) == 0;
        int st = 0, ended = 0;
        t0 = now_s();
        while (now_s() - t0 < 60 && !(ended = waitpid(pid, &st, WNOHANG) == pid)) nap(0.05);
        if (!ended) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
        }
        kill_all_with(p);
        out = t_read_file(log, NULL);
        if (!out) out = strdup("");
        if (!(killed && ended && strstr(out, "signal 15") && strstr(out, "run the command again") && !strstr(out, "--resume"))) {
            fprintf(stderr, "  grad killed under mpirun (killed %d, ended %d): %s\n", killed, ended, out);
            bad = 1;
        }
        free(out);
    } else {
        printf("  (grad killed under mpirun not run: this build has no MPI)\n");
    }
    T_CHECK(!bad, "messages (above)");
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}
