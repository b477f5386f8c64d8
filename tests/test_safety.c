/*
 * test_safety.c — what a user's file system or input can do to the tool, and what
 * it must not do back:
 *   safety_ckpt_no_follow:   removing a stale .checkpoint-N.tmp, replacing a
 *     checkpoint and --save-total-limit pruning unlink symlinks as links and never
 *     delete anything outside RUN/.
 *   safety_output_regular_only: the atomic writers (ls_write_file_atomic, ls_st_write)
 *     refuse to replace a FIFO, directory, socket, device or symlink, never write
 *     through a symlink planted at the temp path, and say when --out's parent is not
 *     a directory; ls_make_dir refuses a path that is not a directory.
 *   safety_nan_weights:      a NaN or Inf weight is refused at load, naming the file,
 *     the tensor, the value and the element.
 *   safety_plan_overflow:    ls_state_plan and `longstraw plan` refuse a prompt whose
 *     byte counts overflow 64 bits (the CLI exits 1, nothing on stdout); every plan
 *     it does return is exact (no wrapped products).
 *   safety_skip_reported:    a test that cannot run (tokenizer_vs_js without node, or
 *     with npm's registry unreachable) is reported "skipped" and exits 77, not "ok" and 0.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include "longstraw/checkpoint.h"
#include "longstraw/config.h"
#include "longstraw/hybrid.h"
#include "longstraw/safetensors.h"
#include "longstraw/state.h"
#include "testutil.h"

#ifndef LS_SOURCE_DIR
#define LS_SOURCE_DIR "."
#endif

int test_safety_ckpt_no_follow(void);
int test_safety_output_regular_only(void);
int test_safety_nan_weights(void);
int test_safety_plan_overflow(void);
int test_safety_skip_reported(void);
int test_safety_prompt_too_big(void);

static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* 1 when `path` is a regular file holding exactly `text` */
static int holds(const char *path, const char *text) {
    struct stat st;
    char *got = NULL;
    if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode) || ls_read_file(path, &got, NULL) != LS_OK) return 0;
    int same = strcmp(got, text) == 0;
    free(got);
    return same;
}

static int exists_l(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

/* OUT/precious (a file) and OUT/sub/precious: the victims a followed link would delete */
static int make_victims(const char *out) {
    char p[1200];
    if (mkdir(out, 0755) != 0) return -1;
    snprintf(p, sizeof p, "%s/precious", out);
    if (write_text(p, "keep me\n") != 0) return -1;
    snprintf(p, sizeof p, "%s/sub", out);
    if (mkdir(p, 0755) != 0) return -1;
    snprintf(p, sizeof p, "%s/sub/precious", out);
    return write_text(p, "keep me too\n");
}

static int victims_intact(const char *out) {
    char p[1200], q[1200];
    snprintf(p, sizeof p, "%s/precious", out);
    snprintf(q, sizeof q, "%s/sub/precious", out);
    return holds(p, "keep me\n") && holds(q, "keep me too\n");
}

/* A checkpoint directory holding a file, a link to OUT, a link to OUT/precious and a subdirectory. */
static int make_ckpt_with_links(const char *ck, const char *out) {
    char p[1200], t[1200];
    if (mkdir(ck, 0755) != 0) return -1;
    snprintf(p, sizeof p, "%s/model.safetensors", ck);
    if (write_text(p, "weights\n") != 0) return -1;
    snprintf(p, sizeof p, "%s/linkdir", ck);
    if (symlink(out, p) != 0) return -1;
    snprintf(p, sizeof p, "%s/linkfile", ck);
    snprintf(t, sizeof t, "%s/precious", out);
    if (symlink(t, p) != 0) return -1;
    snprintf(p, sizeof p, "%s/nested", ck);
    if (mkdir(p, 0755) != 0) return -1;
    snprintf(p, sizeof p, "%s/nested/linkdir", ck);
    return symlink(out, p);
}

int test_safety_ckpt_no_follow(void) {
    char dir[512], run[700], out[700], p[2048], tmp[1200], ck[1200];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    snprintf(run, sizeof run, "%s/run", dir);
    snprintf(out, sizeof out, "%s/outside", dir);
    T_CHECK(mkdir(run, 0755) == 0 && make_victims(out) == 0, "setup");

    /* 1. a stale .checkpoint-5.tmp that is a symlink to a directory outside RUN:
     *    listing (resume) removes the link, not what it points to */
    snprintf(p, sizeof p, "%s/.checkpoint-5.tmp", run);
    T_CHECK(symlink(out, p) == 0, "symlink");
    int64_t last = 0;
    T_OK(ls_ckpt_latest(run, &last, ck, sizeof ck));
    T_CHECK(last == -1, "latest %lld in a run without checkpoints", (long long)last);
    T_CHECK(victims_intact(out), "removing a stale .tmp symlink deleted files outside the run directory");
    T_CHECK(!exists_l(p), "the stale .tmp symlink is still there");

    /* 2. ls_ckpt_begin over a .tmp symlink: the link goes, a real directory is made */
    T_CHECK(symlink(out, p) == 0, "symlink");
    T_OK(ls_ckpt_begin(run, 5, tmp, sizeof tmp));
    struct stat st;
    T_CHECK(lstat(tmp, &st) == 0 && S_ISDIR(st.st_mode), "%s is not a fresh directory", tmp);
    T_CHECK(victims_intact(out), "ls_ckpt_begin deleted files outside the run directory");
    T_OK(ls_ckpt_commit(run, 5, tmp, ck, sizeof ck));

    /* 3. a stale .tmp directory holding links (and a nested directory with a link) */
    snprintf(p, sizeof p, "%s/.checkpoint-6.tmp", run);
    T_CHECK(make_ckpt_with_links(p, out) == 0, "setup .tmp with links");
    T_OK(ls_ckpt_begin(run, 6, tmp, sizeof tmp));
    T_CHECK(victims_intact(out), "emptying a stale .tmp followed a link inside it");
    snprintf(p, sizeof p, "%s/linkdir", tmp);
    T_CHECK(!exists_l(p), "the stale .tmp was not emptied");
    T_OK(ls_ckpt_commit(run, 6, tmp, ck, sizeof ck));

    /* 4. replacing checkpoint-6 whose directory holds links */
    snprintf(p, sizeof p, "%s/checkpoint-6/linkdir", run);
    T_CHECK(symlink(out, p) == 0, "symlink");
    snprintf(p, sizeof p, "%s/checkpoint-6/nested", run);
    T_CHECK(mkdir(p, 0755) == 0, "mkdir");
    snprintf(p, sizeof p, "%s/checkpoint-6/nested/linkfile", run);
    snprintf(tmp, sizeof tmp, "%s/precious", out);
    T_CHECK(symlink(tmp, p) == 0, "symlink");
    T_OK(ls_ckpt_begin(run, 6, tmp, sizeof tmp));
    snprintf(p, sizeof p, "%s/new", tmp);
    T_CHECK(write_text(p, "new\n") == 0, "write");
    T_OK(ls_ckpt_commit(run, 6, tmp, ck, sizeof ck));
    T_CHECK(victims_intact(out), "replacing a checkpoint followed a link inside it");
    snprintf(p, sizeof p, "%s/checkpoint-6/new", run);
    T_CHECK(holds(p, "new\n"), "checkpoint-6 was not replaced");

    /* 5. pruning: checkpoint-1 holds links, checkpoint-2 is itself a link to OUT */
    snprintf(p, sizeof p, "%s/checkpoint-1", run);
    T_CHECK(make_ckpt_with_links(p, out) == 0, "setup checkpoint-1");
    snprintf(p, sizeof p, "%s/checkpoint-2", run);
    T_CHECK(symlink(out, p) == 0, "symlink");
    T_OK(ls_ckpt_prune(run, 1));
    T_CHECK(victims_intact(out), "pruning deleted files outside the run directory");
    snprintf(p, sizeof p, "%s/checkpoint-1", run);
    T_CHECK(!exists_l(p), "checkpoint-1 was not pruned");
    snprintf(p, sizeof p, "%s/checkpoint-2", run);
    T_CHECK(!exists_l(p), "the checkpoint-2 link was not pruned");
    snprintf(p, sizeof p, "%s/checkpoint-5", run);
    T_CHECK(!exists_l(p), "checkpoint-5 was not pruned");
    snprintf(p, sizeof p, "%s/checkpoint-6/new", run);
    T_CHECK(holds(p, "new\n"), "the newest checkpoint was pruned");
    T_OK(ls_ckpt_latest(run, &last, ck, sizeof ck));
    T_CHECK(last == 6, "latest %lld after pruning, want 6", (long long)last);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* ls_write_file_atomic and ls_st_write on `path` both refuse with LS_ERR_ARG and a
 * message holding `what` and the path; the thing at `path` is left as it was. */
static int expect_refused(const char *path, const char *what) {
    struct stat before, after;
    T_CHECK(lstat(path, &before) == 0, "%s: not there", path);
    ls_status s = ls_write_file_atomic(path, "x\n", 2);
    T_CHECK(s == LS_ERR_ARG && strstr(ls_err_msg(), what) && strstr(ls_err_msg(), path),
            "ls_write_file_atomic over %s: %s, \"%s\" (want LS_ERR_ARG, \"%s\")", path, ls_status_name(s),
            ls_err_msg(), what);
    ls_st_writer w;
    ls_st_writer_init(&w);
    float v[3] = {1, 2, 3};
    int64_t shape[1] = {3};
    T_OK(ls_st_writer_add_f32(&w, "w", LS_DTYPE_F32, 1, shape, v));
    s = ls_st_write(&w, path);
    ls_st_writer_free(&w);
    T_CHECK(s == LS_ERR_ARG && strstr(ls_err_msg(), what) && strstr(ls_err_msg(), path),
            "ls_st_write over %s: %s, \"%s\" (want LS_ERR_ARG, \"%s\")", path, ls_status_name(s), ls_err_msg(),
            what);
    T_CHECK(lstat(path, &after) == 0 && after.st_ino == before.st_ino && after.st_mode == before.st_mode,
            "%s was replaced", path);
    char tmp[2100];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    T_CHECK(!exists_l(tmp), "temp file %s left behind", tmp);
    return 0;
}

int test_safety_output_regular_only(void) {
    char dir[512], p[2048], q[1200], tmp[2100];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");

    /* a FIFO: refused (before, rename replaced it; opening it would block) */
    snprintf(p, sizeof p, "%s/fifo", dir);
    T_CHECK(mkfifo(p, 0644) == 0, "mkfifo: %s", strerror(errno));
    if (expect_refused(p, "is a FIFO, not a regular file: refusing to replace it")) return 1;
    /* a directory */
    snprintf(p, sizeof p, "%s/adir", dir);
    T_CHECK(mkdir(p, 0755) == 0, "mkdir");
    if (expect_refused(p, "is a directory, not a regular file")) return 1;
    /* a socket */
    snprintf(p, sizeof p, "%s/sock", dir);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(p) < sizeof sa.sun_path) {
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s", p);
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        T_CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "bind: %s", strerror(errno));
        close(fd);
        if (expect_refused(p, "is a socket, not a regular file")) return 1;
    }
    /* a character device (a private /dev/null; needs CAP_MKNOD, else not checked) */
    snprintf(p, sizeof p, "%s/null", dir);
    if (mknod(p, S_IFCHR | 0666, makedev(1, 3)) == 0) {
        if (expect_refused(p, "is a character device, not a regular file")) return 1;
    } else {
        printf("  (no character-device case: mknod: %s)\n", strerror(errno));
    }
    /* a symlink to a regular file: refused, and the target is untouched */
    snprintf(q, sizeof q, "%s/target", dir);
    T_CHECK(write_text(q, "target\n") == 0, "write");
    snprintf(p, sizeof p, "%s/link", dir);
    T_CHECK(symlink(q, p) == 0, "symlink");
    if (expect_refused(p, "is a symbolic link")) return 1;
    T_CHECK(holds(q, "target\n"), "the link's target was changed");

    /* a symlink planted at the temp path is not written through */
    snprintf(p, sizeof p, "%s/out.json", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", p, (long)getpid());
    T_CHECK(symlink(q, tmp) == 0, "symlink");
    T_OK(ls_write_file_atomic(p, "new\n", 4));
    T_CHECK(holds(p, "new\n"), "%s does not hold the new text", p);
    T_CHECK(holds(q, "target\n"), "ls_write_file_atomic wrote through a symlink at its temp path");
    T_CHECK(!exists_l(tmp), "temp path left behind");
    snprintf(p, sizeof p, "%s/out.safetensors", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", p, (long)getpid());
    T_CHECK(symlink(q, tmp) == 0, "symlink");
    ls_st_writer w;
    ls_st_writer_init(&w);
    float v[2] = {1, 2};
    int64_t shape[1] = {2};
    T_OK(ls_st_writer_add_f32(&w, "w", LS_DTYPE_F32, 1, shape, v));
    ls_status s = ls_st_write(&w, p);
    T_CHECK(s == LS_OK, "ls_st_write with a symlink at the temp path: %s", ls_err_msg());
    T_CHECK(holds(q, "target\n"), "ls_st_write wrote through a symlink at its temp path");

    /* positive controls: a new file, and replacing a regular file */
    snprintf(p, sizeof p, "%s/plain.txt", dir);
    T_OK(ls_write_file_atomic(p, "one\n", 4));
    T_OK(ls_write_file_atomic(p, "two\n", 4));
    T_CHECK(holds(p, "two\n"), "plain file not replaced");
    T_OK(ls_st_write(&w, p));
    ls_st_file f;
    T_OK(ls_st_open(&f, p));
    T_CHECK(ls_st_count(&f) == 1, "re-read: %lld tensors", (long long)ls_st_count(&f));
    ls_st_close(&f);

    /* step --out FILE: the writers say the parent is not a directory */
    snprintf(q, sizeof q, "%s/notadir", dir);
    T_CHECK(write_text(q, "x\n") == 0, "write");
    snprintf(p, sizeof p, "%s/model.safetensors", q);
    s = ls_st_write(&w, p);
    ls_st_writer_free(&w);
    T_CHECK(s == LS_ERR_ARG && strstr(ls_err_msg(), q) && strstr(ls_err_msg(), "is not a directory"),
            "ls_st_write under a file: %s \"%s\"", ls_status_name(s), ls_err_msg());
    snprintf(p, sizeof p, "%s/receipt.json", q);
    s = ls_write_file_atomic(p, "{}\n", 3);
    T_CHECK(s == LS_ERR_ARG && strstr(ls_err_msg(), q) && strstr(ls_err_msg(), "is not a directory"),
            "ls_write_file_atomic under a file: %s \"%s\"", ls_status_name(s), ls_err_msg());
    /* ls_make_dir: a file, a FIFO, a dangling link refused; a directory or a link to one kept */
    s = ls_make_dir(q);
    T_CHECK(s == LS_ERR_ARG && strstr(ls_err_msg(), q) && strstr(ls_err_msg(), "a regular file, not a directory"),
            "ls_make_dir on a file: %s \"%s\"", ls_status_name(s), ls_err_msg());
    snprintf(p, sizeof p, "%s/fifo", dir);
    s = ls_make_dir(p);
    T_CHECK(s == LS_ERR_ARG && strstr(ls_err_msg(), "a FIFO, not a directory"), "ls_make_dir on a FIFO: \"%s\"",
            ls_err_msg());
    snprintf(p, sizeof p, "%s/dangling", dir);
    T_CHECK(symlink("/nonexistent/longstraw", p) == 0, "symlink");
    T_CHECK(ls_make_dir(p) == LS_ERR_ARG, "ls_make_dir on a dangling link");
    snprintf(p, sizeof p, "%s/newdir", dir);
    T_OK(ls_make_dir(p));
    T_OK(ls_make_dir(p));
    snprintf(q, sizeof q, "%s/dirlink", dir);
    T_CHECK(symlink(p, q) == 0, "symlink");
    T_OK(ls_make_dir(q));
    snprintf(p, sizeof p, "%s/notadir/sub", dir);
    s = ls_make_dir(p);
    T_CHECK(s == LS_ERR_ARG && strstr(ls_err_msg(), "is not a directory"), "ls_make_dir under a file: \"%s\"",
            ls_err_msg());
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* Copy the next_dense fixture into dir with tensor `bad` stored as `dtype` and element
 * `k` of it set to `value`; everything else as F32. */
typedef struct {
    const char *bad;
    ls_dtype dtype;
    int64_t k;
    float value;
    int found;
} poison;

static ls_dtype poison_one(const char *name, float *v, int64_t n, void *ctx) {
    poison *p = ctx;
    if (strcmp(name, p->bad) != 0) return LS_DTYPE_F32;
    if ((p->found = p->k < n)) v[p->k] = p->value;
    return p->dtype;
}

static int poisoned_copy(const char *dir, const char *bad, ls_dtype dtype, int64_t k, float value) {
    char src[1024];
    snprintf(src, sizeof src, "%s/tests/reference/fixtures/next_dense", LS_SOURCE_DIR);
    poison p = {bad, dtype, k, value, 0};
    T_CHECK(t_copy_model(src, dir, poison_one, &p) == 0, "copy of %s", src);
    T_CHECK(p.found || !bad[0], "no tensor %s with element %lld in the fixture", bad, (long long)k);
    return 0;
}

int test_safety_nan_weights(void) {
    static const struct {
        const char *tensor;
        ls_dtype dtype;
        int64_t k;
        float value;
        const char *word;
    } cases[] = {
        {"model.layers.1.self_attn.q_proj.weight", LS_DTYPE_F32, 1000, NAN, "(nan)"},
        {"model.layers.2.mlp.down_proj.weight", LS_DTYPE_BF16, 32 * 48 - 1, -INFINITY, "(-inf)"},
        {"model.embed_tokens.weight", LS_DTYPE_F16, 0, INFINITY, "(inf)"},
        {"model.norm.weight", LS_DTYPE_F32, 7, NAN, "(nan)"},
    };
    char dir[512];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    /* control: the clean copy loads */
    if (poisoned_copy(dir, "", LS_DTYPE_F32, 0, 0)) return 1;
    ls_arenas ar;
    ls_arenas_init(&ar);
    ls_hybrid_model m;
    T_OK(ls_hybrid_load(&m, dir, &ar.a[LS_ARENA_FIXED]));
    ls_arenas_free(&ar);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        if (poisoned_copy(dir, cases[c].tensor, cases[c].dtype, cases[c].k, cases[c].value)) return 1;
        ls_arenas_init(&ar);
        ls_status s = ls_hybrid_load(&m, dir, &ar.a[LS_ARENA_FIXED]);
        ls_arenas_free(&ar);
        char want[512], file[700];
        snprintf(want, sizeof want, "tensor %s holds a non-finite value %s at element %lld", cases[c].tensor,
                 cases[c].word, (long long)cases[c].k);
        snprintf(file, sizeof file, "%s/model.safetensors: ", dir);
        T_CHECK(s == LS_ERR_FORMAT && strstr(ls_err_msg(), want) && strstr(ls_err_msg(), file),
                "%s: %s \"%s\" (want LS_ERR_FORMAT, \"%s%s\")", cases[c].tensor, ls_status_name(s), ls_err_msg(),
                file, want);
    }
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* Run `longstraw args` with stdout captured in *out and stderr in *err (malloc'd). */
static int run_split(const char *args, char **out, char **err) {
    char dir[512], errf[700], cmd[4096];
    *out = *err = NULL;
    if (t_make_tmpdir(dir, sizeof dir) != 0) return -1;
    snprintf(errf, sizeof errf, "%s/stderr", dir);
    snprintf(cmd, sizeof cmd, "%s %s 2>'%s'", LS_CLI_PATH, args, errf);
    int rc = -1;
    *out = t_run_capture(cmd, &rc);
    if (ls_read_file(errf, err, NULL) != LS_OK) *err = NULL;
    t_remove_dir(dir);
    return rc;
}

int test_safety_plan_overflow(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/examples/qwen3_5_27b.json", LS_SOURCE_DIR);
    ls_config cfg;
    T_OK(ls_config_load(&cfg, path));
    /* every returned plan is exact: kv = 2 · n_attn · pages_per_rank · page bytes, no wrap */
    int refused = 0, planned = 0;
    static const int64_t sizes[] = {1, 64, 4096};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (int e = 1; e <= 62; e++) {
            int64_t P = (int64_t)1 << e, S = sizes[si];
            ls_state_plan_t p;
            ls_status s = ls_state_plan(&p, &cfg, P, S, LS_DTYPE_BF16, 1, LS_CP_CONTIGUOUS, 0);
            if (s != LS_OK) {
                char want[128];
                snprintf(want, sizeof want, "prompt length %lld with page size %lld", (long long)P, (long long)S);
                T_CHECK(s == LS_ERR_ARG && strstr(ls_err_msg(), want), "P=%lld S=%lld: %s \"%s\"", (long long)P,
                        (long long)S, ls_status_name(s), ls_err_msg());
                refused++;
                continue;
            }
            planned++;
            T_CHECK(p.n_attn > 0 && p.pages_per_rank > 0, "P=%lld: no attention layers or pages", (long long)P);
            long double pages = (long double)p.pages_per_rank, want_kv = 2.0L * p.n_attn * pages *
                                                                         (long double)(S * cfg.n_kv * cfg.head_dim * 2);
            T_CHECK((long double)p.kv_bytes_per_rank == want_kv, "P=%lld S=%lld: kv bytes %zu, exact %.0Lf (wrapped)",
                    (long long)P, (long long)S, p.kv_bytes_per_rank, want_kv);
            long double sum = (long double)p.kv_bytes_per_rank + p.table_bytes_per_rank + p.gdn_bytes_per_rank;
            T_CHECK((long double)p.total_bytes_per_rank == sum && p.table_bytes_per_rank >= (size_t)p.pages_per_rank * 8,
                    "P=%lld S=%lld: total %zu is not the sum %.0Lf", (long long)P, (long long)S,
                    p.total_bytes_per_rank, sum);
        }
    printf("  ls_state_plan: %d plans exact, %d sizes refused as overflowing\n", planned, refused);
    T_CHECK(planned > 0 && refused > 0, "planned %d, refused %d: the sweep missed a side", planned, refused);

    /* the CLI: exit 1, the message names the prompt length and page size, nothing on stdout */
    static const char *args[] = {"--prompt 1152921504606846975 --page-size 64", /* INT64_MAX/8 */
                                 "--prompt 4611686018427387903 --page-size 1 --json",
                                 "--prompt 1152921504606846975 --page-size 64 --cp 2 --state-dtype f32"};
    for (size_t i = 0; i < sizeof args / sizeof args[0]; i++) {
        char a[2048], *out, *err;
        snprintf(a, sizeof a, "plan --config %s %s", path, args[i]);
        int rc = run_split(a, &out, &err);
        long long P = 0, S = 0;
        sscanf(args[i], "--prompt %lld --page-size %lld", &P, &S);
        char want[128];
        snprintf(want, sizeof want, "prompt length %lld with page size %lld", P, S);
        int ok = rc == 1 && out && out[0] == 0 && err && strstr(err, want) && strstr(err, "overflow");
        if (!ok)
            fprintf(stderr, "  `longstraw %s`: rc %d\n  stdout: %.300s\n  stderr: %.300s\n", a, rc, out ? out : "",
                    err ? err : "");
        free(out);
        free(err);
        T_CHECK(ok, "plan did not refuse an overflowing size cleanly");
    }
    /* a large plan that fits still prints */
    char a[2048], *out, *err;
    snprintf(a, sizeof a, "plan --config %s --prompt 1099511627776 --page-size 64 --json", path);
    int rc = run_split(a, &out, &err);
    int ok = rc == 0 && out && strstr(out, "\"kv_bytes_per_rank\"");
    free(out);
    free(err);
    T_CHECK(ok, "plan of a 2^40-token prompt: rc %d", rc);
    return 0;
}

int test_safety_skip_reported(void) {
    /* tokenizer_vs_js with no node/npm on PATH cannot run: it must say "skipped" and
     * exit 77 (CTest SKIP_RETURN_CODE), not print "ok" and exit 0 */
    char self[1024], cmd[3000];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    T_CHECK(n > 0 && !memchr(self, '\'', (size_t)n), "cannot find the test binary");
    self[n] = 0;
    snprintf(cmd, sizeof cmd, "PATH=/nonexistent-longstraw '%s' tokenizer_vs_js 2>&1", self);
    int rc = -1;
    char *out = t_run_capture(cmd, &rc);
    int ok = rc == T_SKIP_CODE && out && strstr(out, "skipped") && strstr(out, "SKIP:") && strstr(out, "0 passed");
    if (!ok) fprintf(stderr, "  rc %d, output:\n%s\n", rc, out ? out : "(none)");
    free(out);
    T_CHECK(ok, "a test that cannot run was not reported as skipped (exit 77)");

    /* the same with npm installed but its registry unreachable (a fresh package cache) */
    out = t_run_capture("command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1", &rc);
    free(out);
    if (rc != 0) {
        printf("  (no unreachable-registry case: node/npm not installed)\n");
        return 0;
    }
    char dir[512];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0 && !strchr(dir, '\''), "tmpdir");
    snprintf(cmd, sizeof cmd,
             "LS_NPM_CACHE='%s/npm' NPM_CONFIG_REGISTRY=http://127.0.0.1:9/ NPM_CONFIG_CACHE='%s/npm-cache' "
             "NPM_CONFIG_OFFLINE=false '%s' tokenizer_vs_js 2>&1",
             dir, dir, self);
    out = t_run_capture(cmd, &rc);
    ok = rc == T_SKIP_CODE && out && strstr(out, "cannot reach the registry") && strstr(out, "skipped");
    if (!ok) fprintf(stderr, "  unreachable registry: rc %d, output:\n%s\n", rc, out ? out : "(none)");
    free(out);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    T_CHECK(ok, "tokenizer_vs_js with an unreachable npm registry was not reported as skipped (exit 77)");
    return 0;
}

/* A prompt that cannot fit is refused before anything sized by it is allocated: the
 * message gives the plan's numbers and the machine's memory, nothing is captured, and
 * --force is the way past it (not run here: it would start the capture). */
int test_safety_prompt_too_big(void) {
    char dir[512], cmd[4096];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    /* the built-in task takes the length as a flag (a byte-vocabulary model for it);
     * refused within a second: nothing of the 477 GiB plan was allocated or captured */
    char cfg[800], m[800];
    snprintf(cfg, sizeof cfg, "%s/cfg.json", dir);
    snprintf(m, sizeof m, "%s/m", dir);
    snprintf(cmd, sizeof cmd, "sed 's/\"vocab_size\": 97/\"vocab_size\": 300/' %s/tests/reference/fixtures/q35_moe/config.json > %s",
             LS_SOURCE_DIR, cfg);
    T_CHECK(system(cmd) == 0 && t_write_model(cfg, m, 0) == 0, "a byte-vocabulary model from %s", cfg);
    snprintf(cmd, sizeof cmd,
             "%s train --model %s --out %s/run --rollout --task passkey --prompt-len 1000000000 "
             "--updates 1 --quiet 2>&1; echo \"rc=$?\"", LS_CLI_PATH, m, dir);
    int rc;
    double t0 = ls_now();
    char *o = t_run_capture(cmd, &rc);
    double dt = ls_now() - t0;
    printf("  %.2f s: %.400s\n", dt, o ? o : "");
    int refused = o && strstr(o, "will not fit") && strstr(o, "GiB of memory") &&
                  strstr(o, "pages per attention layer") && strstr(o, "--force") && strstr(o, "rc=1");
    if (!refused) fprintf(stderr, "  output: %s\n", o ? o : "(none)");
    free(o);
    T_CHECK(refused, "not refused with the plan's numbers");
    T_CHECK(dt < 30, "took %.1f s (it should refuse before the capture)", dt);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}
