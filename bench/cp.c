/*
 * bench/cp.c — context parallelism side by side in one run: the same GRPO update
 * (`longstraw step`) on one rank and on N ranks under mpirun, on the small hybrid
 * config (hidden 512, 8 layers, 2 full attention, vocab 4096) with one random
 * checkpoint and one group file. It spawns the tool itself, so what is measured is
 * what a user runs; each rank uses one thread, so N ranks use N cores.
 *
 *   build/bench/cp [--prompt 32768] [--ranks 1,2,4] [--group-size 2] [--response 128]
 *                  [--state-dtype bf16] [--cli PATH] [--mpirun PATH] [--mpirun-one] [--keep]
 *
 * From each run's receipt.json it reports the capture and update times, the per-rank
 * prompt arena peak (max over ranks) beside the plan's prediction, the per-rank peak
 * RSS, and whether every rank's trainable_hash agrees; then it compares each run's
 * model.safetensors with N = 1's tensor by tensor (‖W_N − W_1‖ / ‖W_1‖, max over
 * tensors, and the same difference over the size of the update, ‖W_1 − W_0‖).
 * Exit status: 0 when every run succeeded, its ranks agree and its weights are
 * finite and comparable; 1 otherwise; 2 for bad arguments.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include "bench_model.h"
#include "longstraw/safetensors.h"

extern char **environ;

static const char *cfg = BENCH_SMALL_DENSE; /* bench_model.h */
#define CP_VOCAB 4096u                      /* vocab_size of BENCH_SMALL_DENSE */
#define CP_MAX_RUNS 16
#define CP_MAX_RANKS 256
#define CP_PATH 1024

typedef struct {
    int n;   /* ranks */
    int threads; /* per rank (1, or N for the one-rank run beside N ranks: the fair comparison) */
    int mpi; /* launched through mpirun (always for n > 1) */
    int contiguous; /* --cp-layout contiguous (else zigzag, the default) */
    char label[32];
    char out[CP_PATH]; /* OUT_N */
    int ok;            /* the tool exited 0 and its receipt parsed */
    int hashes_agree;
    double wall_s; /* spawn to exit: load, capture, update, write */
    double capture_s, total_s, sweep_s; /* sweep: full mode's reverse sweep (0 otherwise) */
    double prompt_peak, predicted, rss; /* max over ranks, bytes */
} cp_run;

typedef struct {
    int64_t tensors;
    double max_rel;    /* max over tensors of ‖W_N − W_1‖ / ‖W_1‖ */
    double max_rel_up; /* max over tensors of ‖W_N − W_1‖ / ‖W_1 − W_0‖ */
    char worst[256], worst_up[256];
} cp_diff;

/* ---- arguments ---------------------------------------------------------------- */

static int cp_parse_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "cp: %s: expected an integer in [%lld, %lld], got '%s'\n", flag, (long long)lo,
                (long long)hi, s);
        return 1;
    }
    *out = v;
    return 0;
}

/* "1,2,4" → ranks[]; each in [1, CP_MAX_RANKS], no repeats. */
static int cp_parse_ranks(const char *s, int *ranks, int *count) {
    char copy[256];
    if (snprintf(copy, sizeof copy, "%s", s) >= (int)sizeof copy) {
        fprintf(stderr, "cp: --ranks: list too long\n");
        return 1;
    }
    *count = 0;
    for (char *sp = NULL, *tok = strtok_r(copy, ",", &sp); tok; tok = strtok_r(NULL, ",", &sp)) {
        int64_t v;
        if (cp_parse_i64("--ranks", tok, 1, CP_MAX_RANKS, &v)) return 1;
        for (int i = 0; i < *count; i++)
            if (ranks[i] == (int)v) {
                fprintf(stderr, "cp: --ranks: %lld given twice\n", (long long)v);
                return 1;
            }
        if (*count == CP_MAX_RUNS - 1) {
            fprintf(stderr, "cp: --ranks: at most %d entries\n", CP_MAX_RUNS - 1);
            return 1;
        }
        ranks[(*count)++] = (int)v;
    }
    if (*count == 0) {
        fprintf(stderr, "cp: --ranks: empty list\n");
        return 1;
    }
    return 0;
}

/* The first executable `name` on PATH into out; 0 when found. */
static int cp_find_on_path(const char *name, char *out, size_t cap) {
    const char *path = getenv("PATH");
    if (!path) return 1;
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", path);
    for (char *sp = NULL, *d = strtok_r(copy, ":", &sp); d; d = strtok_r(NULL, ":", &sp)) {
        if ((size_t)snprintf(out, cap, "%s/%s", *d ? d : ".", name) >= cap) continue;
        if (access(out, X_OK) == 0) return 0;
    }
    return 1;
}

/* The tool beside the bench directory: dirname(argv[0]) + "/../longstraw" (the
 * running executable's directory when argv[0] holds no slash). */
static void cp_default_cli(const char *argv0, char *out, size_t cap) {
    char self[CP_PATH] = "";
    if (strchr(argv0, '/')) {
        snprintf(self, sizeof self, "%s", argv0);
    } else {
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        self[n > 0 ? n : 0] = '\0';
    }
    char *slash = strrchr(self, '/');
    if (slash) *slash = '\0';
    snprintf(out, cap, "%s/../longstraw", slash ? self : ".");
}

/* ---- inputs -------------------------------------------------------------------- */

/* The group file the tool reads: {"prompt": [P ids], "responses": [G × [R ids]],
 * "rewards": [G]} (tests/reference/fixtures/next_dense/group_train.json); ids
 * uniform below the vocab, rewards i mod 3 so that the advantages are nonzero. */
static int cp_write_group(const char *path, int64_t P, int64_t G, int64_t R) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "cp: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    ls_rng rng;
    ls_rng_seed(&rng, (uint64_t)P);
    fputs("{\"prompt\": [", f);
    for (int64_t t = 0; t < P; t++) fprintf(f, "%s%u", t ? "," : "", (unsigned)(ls_rng_u64(&rng) % CP_VOCAB));
    fputs("],\n \"responses\": [", f);
    for (int64_t i = 0; i < G; i++) {
        fputs(i ? ",\n  [" : "\n  [", f);
        for (int64_t t = 0; t < R; t++) fprintf(f, "%s%u", t ? "," : "", (unsigned)(ls_rng_u64(&rng) % CP_VOCAB));
        fputs("]", f);
    }
    fputs("],\n \"rewards\": [", f);
    for (int64_t i = 0; i < G; i++) fprintf(f, "%s%d", i ? ", " : "", (int)(i % 3));
    fputs("]}\n", f);
    if (ferror(f) | (fclose(f) != 0)) {
        fprintf(stderr, "cp: cannot write %s\n", path);
        return 1;
    }
    return 0;
}

/* ---- one run -------------------------------------------------------------------- */

/* Print the last `tail` bytes of the run's log to stderr. */
static void cp_print_tail(const char *log, long tail) {
    FILE *f = fopen(log, "r");
    if (!f) return;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        fseek(f, n > tail ? n - tail : 0, SEEK_SET);
    }
    char buf[4096];
    size_t k;
    fprintf(stderr, "---- %s (tail) ----\n", log);
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, k, stderr);
    fprintf(stderr, "----\n");
    fclose(f);
}

/* The file into a NUL-terminated malloc'd buffer, or NULL. */
static char *cp_slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
        if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
            free(buf);
            buf = NULL;
        } else {
            buf[n] = '\0';
        }
    }
    fclose(f);
    return buf;
}

static int cp_num(const cJSON *obj, const char *key, const char *where, const char *path, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(v)) {
        fprintf(stderr, "cp: %s: %s%s is missing or not a number\n", path, where, key);
        return 1;
    }
    *out = v->valuedouble;
    return 0;
}

/* Fill r from OUT_N/receipt.json: phases_s.capture/total, cp == N, and from
 * ranks[] (N entries) the max prompt_peak_bytes / prompt_predicted_bytes /
 * peak_rss_bytes and whether every trainable_hash is the same. */
static int cp_read_receipt(cp_run *r) {
    char path[CP_PATH + 32];
    snprintf(path, sizeof path, "%s/receipt.json", r->out);
    char *text = cp_slurp(path);
    if (!text) {
        fprintf(stderr, "cp: cannot read %s\n", path);
        return 1;
    }
    cJSON *root = cJSON_Parse(text);
    free(text);
    int bad = 0;
    double cp = 0;
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(root, "phases_s");
    const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(root, "ranks");
    if (!root || !cJSON_IsObject(ph) || !cJSON_IsArray(ranks)) {
        fprintf(stderr, "cp: %s: not JSON with \"phases_s\" and \"ranks\"\n", path);
        cJSON_Delete(root);
        return 1;
    }
    bad |= cp_num(ph, "capture", "phases_s.", path, &r->capture_s);
    bad |= cp_num(ph, "total", "phases_s.", path, &r->total_s);
    r->sweep_s = 0;
    if (cJSON_GetObjectItemCaseSensitive(ph, "sweep")) bad |= cp_num(ph, "sweep", "phases_s.", path, &r->sweep_s);
    bad |= cp_num(root, "cp", "", path, &cp);
    if (!bad && (cp != r->n || cJSON_GetArraySize(ranks) != r->n)) {
        fprintf(stderr, "cp: %s: \"cp\" %g and %d entries in \"ranks\", expected %d\n", path, cp,
                cJSON_GetArraySize(ranks), r->n);
        bad = 1;
    }
    const char *hash0 = NULL;
    r->hashes_agree = 1;
    r->prompt_peak = r->predicted = r->rss = 0;
    for (int i = 0; !bad && i < r->n; i++) {
        const cJSON *k = cJSON_GetArrayItem(ranks, i);
        double peak = 0, pred = 0, rss = 0;
        bad |= cp_num(k, "prompt_peak_bytes", "ranks[].", path, &peak);
        bad |= cp_num(k, "prompt_predicted_bytes", "ranks[].", path, &pred);
        bad |= cp_num(k, "peak_rss_bytes", "ranks[].", path, &rss);
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(k, "trainable_hash");
        if (!cJSON_IsString(h)) {
            fprintf(stderr, "cp: %s: ranks[%d].trainable_hash is missing or not a string\n", path, i);
            bad = 1;
            break;
        }
        if (!hash0) hash0 = h->valuestring;
        if (strcmp(hash0, h->valuestring) != 0) r->hashes_agree = 0;
        if (peak > r->prompt_peak) r->prompt_peak = peak;
        if (pred > r->predicted) r->predicted = pred;
        if (rss > r->rss) r->rss = rss;
    }
    cJSON_Delete(root);
    return bad;
}

/* Spawn the tool for r (through mpirun when r->mpi), output into DIR/run_<label>.log,
 * wait, and read its receipt. Returns 0 when it ran and the receipt parsed. */
static int cp_run_one(cp_run *r, const char *cli, const char *mpirun, const char *dir, const char *state_dtype,
                      const char *mode) {
    char model[CP_PATH], group[CP_PATH], log[CP_PATH + 32], np[16], threads[16];
    snprintf(threads, sizeof threads, "%d", r->threads);
    /* the run's threads: the tool's --threads covers OpenMP; OpenBLAS reads its own variable */
    setenv("OMP_NUM_THREADS", threads, 1);
    setenv("OPENBLAS_NUM_THREADS", threads, 1);
    snprintf(model, sizeof model, "%s", dir);
    snprintf(group, sizeof group, "%s/group.json", dir);
    snprintf(log, sizeof log, "%s/run_%s.log", dir, r->label);
    snprintf(np, sizeof np, "%d", r->n);
    const char *argv[32];
    int a = 0;
    if (r->mpi) {
        argv[a++] = mpirun;
        argv[a++] = "--oversubscribe";
        argv[a++] = "--allow-run-as-root";
        argv[a++] = "-np";
        argv[a++] = np;
    }
    const char *tool[] = {cli,           "step",      "--model",   model, "--group", group, "--out", r->out,
                          "--state-dtype", state_dtype, "--threads", threads, "--mode", mode, "--cp-layout",
                          r->contiguous ? "contiguous" : "zigzag"};
    for (size_t i = 0; i < sizeof tool / sizeof tool[0]; i++) argv[a++] = tool[i];
    argv[a] = NULL;

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
    posix_spawn_file_actions_addclose(&fa, STDIN_FILENO);
    pid_t pid;
    double t0 = ls_now();
    int rc = posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        fprintf(stderr, "cp: cannot start %s: %s\n", argv[0], strerror(rc));
        return 1;
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) {
            fprintf(stderr, "cp: waitpid: %s\n", strerror(errno));
            return 1;
        }
    r->wall_s = ls_now() - t0;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        if (WIFEXITED(st))
            fprintf(stderr, "cp: N = %s: %s exited with status %d\n", r->label, argv[0], WEXITSTATUS(st));
        else
            fprintf(stderr, "cp: N = %s: %s killed by signal %d\n", r->label, argv[0], WTERMSIG(st));
        cp_print_tail(log, 3000);
        return 1;
    }
    if (cp_read_receipt(r)) {
        cp_print_tail(log, 3000);
        return 1;
    }
    r->ok = 1;
    return 0;
}

/* ---- weights across N ---------------------------------------------------------------- */

static int cp_read_tensor(const ls_st_tensor *t, float **buf, int64_t *cap) {
    if (t->numel > *cap) {
        if ((uint64_t)t->numel > SIZE_MAX / sizeof(float)) return 1;
        float *nb = realloc(*buf, (size_t)t->numel * sizeof(float));
        if (!nb) return 1;
        *buf = nb;
        *cap = t->numel;
    }
    return ls_st_read_f32(t, *buf, t->numel, t->name) != LS_OK;
}

/* Compare W_N (path) with W_1 (ref) and the starting weights W_0 (base), tensor by
 * tensor in double precision. Fails when the tensor sets or sizes differ, a tensor
 * is missing, or a difference is not finite (NaN included). */
static int cp_compare(const char *ref, const char *path, const char *base, cp_diff *d) {
    ls_st_file fr, fn, f0;
    memset(d, 0, sizeof *d);
    if (ls_st_open(&fr, ref) != LS_OK) {
        fprintf(stderr, "cp: %s\n", ls_err_msg());
        return 1;
    }
    if (ls_st_open(&fn, path) != LS_OK) {
        fprintf(stderr, "cp: %s\n", ls_err_msg());
        ls_st_close(&fr);
        return 1;
    }
    if (ls_st_open(&f0, base) != LS_OK) {
        fprintf(stderr, "cp: %s\n", ls_err_msg());
        ls_st_close(&fr);
        ls_st_close(&fn);
        return 1;
    }
    float *a = NULL, *b = NULL, *w0 = NULL;
    int64_t ca = 0, cb = 0, c0 = 0;
    int bad = 0;
    if (ls_st_count(&fn) != ls_st_count(&fr)) {
        fprintf(stderr, "cp: %s holds %lld tensors, %s %lld\n", path, (long long)ls_st_count(&fn), ref,
                (long long)ls_st_count(&fr));
        bad = 1;
    }
    for (int64_t i = 0; !bad && i < ls_st_count(&fr); i++) {
        const ls_st_tensor *tr = ls_st_at(&fr, i);
        const ls_st_tensor *tn = ls_st_find(&fn, tr->name), *t0 = ls_st_find(&f0, tr->name);
        if (!tn || !t0 || tn->numel != tr->numel || t0->numel != tr->numel) {
            fprintf(stderr, "cp: tensor %s is missing or of another size in %s or %s\n", tr->name, path, base);
            bad = 1;
            break;
        }
        if (cp_read_tensor(tr, &a, &ca) || cp_read_tensor(tn, &b, &cb) || cp_read_tensor(t0, &w0, &c0)) {
            fprintf(stderr, "cp: cannot read tensor %s: %s\n", tr->name, ls_err_msg());
            bad = 1;
            break;
        }
        double nd = 0, nr = 0, nu = 0; /* ‖W_N − W_1‖², ‖W_1‖², ‖W_1 − W_0‖² */
        for (int64_t k = 0; k < tr->numel; k++) {
            double x = (double)b[k] - a[k], u = (double)a[k] - w0[k];
            nd += x * x;
            nr += (double)a[k] * a[k];
            nu += u * u;
        }
        double rel = nr > 0 ? sqrt(nd / nr) : (nd == 0 ? 0 : INFINITY);
        double rel_up = nu > 0 ? sqrt(nd / nu) : (nd == 0 ? 0 : INFINITY);
        if (!isfinite(rel) || !isfinite(rel_up) || !isfinite(nr)) {
            fprintf(stderr, "cp: tensor %s: non-finite difference between %s and %s\n", tr->name, path, ref);
            bad = 1;
        }
        if (!(rel <= d->max_rel)) {
            d->max_rel = rel;
            snprintf(d->worst, sizeof d->worst, "%s", tr->name);
        }
        if (!(rel_up <= d->max_rel_up)) {
            d->max_rel_up = rel_up;
            snprintf(d->worst_up, sizeof d->worst_up, "%s", tr->name);
        }
        d->tensors++;
    }
    if (!bad && d->tensors == 0) {
        fprintf(stderr, "cp: %s: no tensors compared\n", ref);
        bad = 1;
    }
    free(a);
    free(b);
    free(w0);
    ls_st_close(&fr);
    ls_st_close(&fn);
    ls_st_close(&f0);
    return bad;
}

/* The table's N column: "1", "1 (mpirun -np 1)", "2", "4 (oversubscribed)". */
static void cp_row_name(const cp_run *r, int cores, char *out, size_t cap) {
    snprintf(out, cap, "%d × %d thr%s%s%s", r->n, r->threads, r->n == 1 && r->mpi ? " (mpirun -np 1)" : "",
             r->contiguous ? " contiguous" : "", r->n * r->threads > cores ? " (oversubscribed)" : "");
}

/* ---- main ------------------------------------------------------------------------------ */

static void cp_usage(FILE *f) {
    fprintf(f,
            "usage: cp [--prompt P (32768)] [--ranks LIST (1,2,4)] [--group-size G (2)] [--response R (128)]\n"
            "          [--state-dtype f32|bf16 (bf16)] [--family hybrid|mla] [--mode prefix-frozen|full]\n"
            "          [--cli PATH] [--mpirun PATH] [--mpirun-one] [--contiguous] [--keep]\n"
            "\n"
            "One GRPO update (`longstraw step`) on the small config of the family for each rank\n"
            "count N: N = 1 with one thread runs the tool directly (the weights' reference; added\n"
            "when LIST lacks it); for each N > 1, one rank with N threads beside N ranks of one\n"
            "thread under `mpirun -np N` — the fair comparison on one machine — and their CP\n"
            "efficiency (time of 1 rank x N threads / time of N ranks x 1 thread: capture, the\n"
            "whole update, and in full mode the sweep). Prints times, per-rank prompt arena\n"
            "peaks and RSS from each receipt, and each run's weights against N = 1's.\n"
            "\n"
            "  --cli PATH     the tool (default: <dir of this program>/../longstraw)\n"
            "  --mpirun PATH  default: mpirun on PATH; without one only N = 1 runs\n"
            "  --mpirun-one   also run N = 1 under `mpirun -np 1`\n"
            "  --contiguous   also run every N > 1 with --cp-layout contiguous (zigzag, the\n"
            "                 default, always runs)\n"
            "  --keep         keep the temporary directory (model, group, outputs, logs)\n");
}

int main(int argc, char **argv) {
    ls_runtime_setup(argv); /* the tool it starts chooses the same kernels (its receipts name them) */
    static const struct option opts[] = {
        {"prompt", required_argument, 0, 'p'}, {"ranks", required_argument, 0, 'n'},
        {"group-size", required_argument, 0, 'g'}, {"response", required_argument, 0, 'r'},
        {"state-dtype", required_argument, 0, 's'}, {"cli", required_argument, 0, 'c'},
        {"mpirun", required_argument, 0, 'm'}, {"mpirun-one", no_argument, 0, 'o'},
        {"keep", no_argument, 0, 'k'}, {"contiguous", no_argument, 0, 'z'}, {"help", no_argument, 0, 'h'},
        {"family", required_argument, 0, 'f'}, {"mode", required_argument, 0, 'M'},
        {0, 0, 0, 0}};
    int64_t P = 32768, G = 2, R = 128;
    int ranks[CP_MAX_RUNS], n_ranks = 0, keep = 0, mpirun_one = 0, contiguous = 0, ch;
    char cli[CP_PATH] = "", mpirun[CP_PATH] = "", state_dtype[8] = "bf16";
    const char *family = "hybrid", *mode = "prefix-frozen";
    if (cp_parse_ranks("1,2,4", ranks, &n_ranks)) return 2;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case 'p': if (cp_parse_i64("--prompt", optarg, 1, INT32_MAX, &P)) return 2; break;
        case 'n': if (cp_parse_ranks(optarg, ranks, &n_ranks)) return 2; break;
        case 'g': if (cp_parse_i64("--group-size", optarg, 2, 4096, &G)) return 2; break;
        case 'r': if (cp_parse_i64("--response", optarg, 1, INT32_MAX, &R)) return 2; break;
        case 's':
            if (strcmp(optarg, "f32") != 0 && strcmp(optarg, "bf16") != 0) {
                fprintf(stderr, "cp: --state-dtype: expected f32 or bf16, got '%s'\n", optarg);
                return 2;
            }
            snprintf(state_dtype, sizeof state_dtype, "%s", optarg);
            break;
        case 'c': snprintf(cli, sizeof cli, "%s", optarg); break;
        case 'm': snprintf(mpirun, sizeof mpirun, "%s", optarg); break;
        case 'o': mpirun_one = 1; break;
        case 'k': keep = 1; break;
        case 'z': contiguous = 1; break;
        case 'f':
            if (strcmp(optarg, "hybrid") != 0 && strcmp(optarg, "mla") != 0) {
                fprintf(stderr, "cp: --family: expected hybrid or mla, got '%s'\n", optarg);
                return 2;
            }
            family = !strcmp(optarg, "mla") ? "mla" : "hybrid";
            cfg = !strcmp(optarg, "mla") ? BENCH_SMALL_MLA : BENCH_SMALL_DENSE;
            break;
        case 'M':
            if (strcmp(optarg, "prefix-frozen") != 0 && strcmp(optarg, "full") != 0) {
                fprintf(stderr, "cp: --mode: expected prefix-frozen or full, got '%s'\n", optarg);
                return 2;
            }
            mode = !strcmp(optarg, "full") ? "full" : "prefix-frozen";
            break;
        case 'h': cp_usage(stdout); return 0;
        default: cp_usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "cp: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!*cli) cp_default_cli(argv[0], cli, sizeof cli);
    if (access(cli, X_OK) != 0) {
        fprintf(stderr, "cp: the tool %s is not an executable (build it, or give --cli PATH)\n", cli);
        return 2;
    }
    int have_mpi = 1;
    if (*mpirun) {
        if (access(mpirun, X_OK) != 0) {
            fprintf(stderr, "cp: --mpirun: %s is not an executable\n", mpirun);
            return 2;
        }
    } else if (cp_find_on_path("mpirun", mpirun, sizeof mpirun) != 0) {
        have_mpi = 0;
    }

    /* The runs: N = 1 directly first (the reference), optionally N = 1 under mpirun,
     * then every N > 1 in the order given. */
    cp_run runs[2 * CP_MAX_RUNS + 1];
    int n_runs = 0, skipped = 0;
    memset(runs, 0, sizeof runs);
    runs[n_runs++] = (cp_run){.n = 1, .threads = 1, .mpi = 0, .label = "1"};
    if (mpirun_one && have_mpi) runs[n_runs++] = (cp_run){.n = 1, .threads = 1, .mpi = 1, .label = "1-mpirun"};
    for (int i = 0; i < n_ranks; i++) {
        if (ranks[i] == 1) continue;
        if (!have_mpi) {
            skipped++;
            continue;
        }
        runs[n_runs] = (cp_run){.n = 1, .threads = ranks[i], .mpi = 0}; /* its fair baseline */
        snprintf(runs[n_runs].label, sizeof runs[n_runs].label, "1x%d", ranks[i]);
        n_runs++;
        for (int z = 0; z <= contiguous; z++) {
            runs[n_runs] = (cp_run){.n = ranks[i], .threads = 1, .mpi = 1, .contiguous = z};
            snprintf(runs[n_runs].label, sizeof runs[n_runs].label, "%d%s", ranks[i], z ? "-contiguous" : "");
            n_runs++;
        }
    }

    /* Open MPI's shared-memory transport without single-copy (CMA is refused in
     * containers), and root allowed (each run sets its threads: cp_run_one). */
    setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);

    char dir[] = "/tmp/ls_bench_cp_XXXXXX";
    if (bench_write_model("cp", dir, cfg, LS_DTYPE_BF16)) return 1;
    char group[CP_PATH];
    snprintf(group, sizeof group, "%s/group.json", dir);
    if (cp_write_group(group, P, G, R)) {
        if (!keep) bench_remove_model(dir);
        return 1;
    }
    int fail = 0;
    for (int i = 0; i < n_runs; i++) snprintf(runs[i].out, sizeof runs[i].out, "%s/out_%s", dir, runs[i].label);

    int cores = ls_num_cores();
    bench_print_blas();
    printf("Context parallelism: `longstraw step --mode %s`, small %s config (bf16 weights), P = %lld, G = %lld,\n"
           "R = %lld, %s prompt state, %d cores; tool %s\n",
           mode, family, (long long)P, (long long)G, (long long)R, state_dtype, cores, cli);
    if (!have_mpi)
        printf("mpirun not found on PATH (give --mpirun PATH): running N = 1 only, %d run(s) skipped\n", skipped);
    else
        printf("mpirun: %s\n", mpirun);
    fflush(stdout);

    /* A failed run does not stop the others: every row that ran is printed. */
    for (int i = 0; i < n_runs; i++) {
        fprintf(stderr, "cp: running N = %s ...\n", runs[i].label);
        if (cp_run_one(&runs[i], cli, mpirun, dir, state_dtype, mode) || !runs[i].hashes_agree) fail = 1;
        fprintf(stderr, "cp: N = %s %s in %.1f s\n", runs[i].label, runs[i].ok ? "done" : "failed", runs[i].wall_s);
    }

    const double MiB = 1024.0 * 1024.0;
    const cp_run *ref = &runs[0];
    printf("\n| N | wall s | capture s | update total s | capture speed-up | prompt arena peak / rank MiB |"
           " ratio to N=1 | predicted / rank MiB | peak RSS / rank MiB | trainable_hash agree |\n"
           "|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < n_runs; i++) {
        const cp_run *r = &runs[i];
        char name[64];
        cp_row_name(r, cores, name, sizeof name);
        if (!r->ok) {
            printf("| %s | failed | – | – | – | – | – | – | – | – |\n", name);
            continue;
        }
        char speed[32] = "–", ratio[32] = "–";
        if (ref->ok) {
            snprintf(speed, sizeof speed, "%.2f×", ref->capture_s / r->capture_s);
            snprintf(ratio, sizeof ratio, "%.3f", r->prompt_peak / ref->prompt_peak);
        }
        printf("| %s | %.1f | %.2f | %.2f | %s | %.1f | %s | %.1f | %.0f | %s |\n", name, r->wall_s, r->capture_s,
               r->total_s, speed, r->prompt_peak / MiB, ratio, r->predicted / MiB, r->rss / MiB,
               r->hashes_agree ? "yes" : "NO");
    }
    /* CP efficiency: each N ranks x 1 thread against 1 rank x N threads, same machine, same run */
    printf("\nCP efficiency (time of 1 rank x N threads / time of N ranks x 1 thread; 1.0: CP costs nothing):\n"
           "| N | layout | capture | whole update |%s\n|---|---|---|---|%s\n",
           !strcmp(mode, "full") ? " sweep |" : "", !strcmp(mode, "full") ? "---|" : "");
    for (int i = 0; i < n_runs; i++) {
        const cp_run *r = &runs[i], *b = NULL;
        if (r->n == 1 || !r->ok) continue;
        for (int j = 0; j < n_runs; j++)
            if (runs[j].n == 1 && runs[j].threads == r->n && runs[j].ok) b = &runs[j];
        if (!b) continue;
        char sw[32] = "";
        if (!strcmp(mode, "full")) snprintf(sw, sizeof sw, " %.2f |", r->sweep_s > 0 ? b->sweep_s / r->sweep_s : 0.0);
        printf("| %d | %s | %.2f | %.2f |%s\n", r->n, r->contiguous ? "contiguous" : "zigzag", b->capture_s / r->capture_s,
               b->total_s / r->total_s, sw);
    }
    printf("\nwall s: spawn to exit (load, capture, update, write). Times are from one run on a shared machine.\n");
    printf("On this %d-core machine N > %d runs oversubscribed (more ranks than cores): its times are not a\n"
           "speed measurement, only its memory and its weights are.\n",
           cores, cores);

    /* Weights across N against N = 1's. */
    if (ref->ok && n_runs > 1) {
        char refst[CP_PATH + 32], basest[CP_PATH + 32];
        snprintf(refst, sizeof refst, "%s/model.safetensors", ref->out);
        snprintf(basest, sizeof basest, "%s/model.safetensors", dir);
        printf("\nUpdated weights against N = 1's, tensor by tensor (W_0: the starting checkpoint):\n"
               "| N | tensors | max ‖W_N − W_1‖ / ‖W_1‖ | worst tensor | max ‖W_N − W_1‖ / ‖W_1 − W_0‖ | worst tensor |\n"
               "|---|---|---|---|---|---|\n");
        for (int i = 1; i < n_runs; i++) {
            const cp_run *r = &runs[i];
            if (!r->ok) continue;
            char path[CP_PATH + 32], name[64];
            snprintf(path, sizeof path, "%s/model.safetensors", r->out);
            cp_row_name(r, cores, name, sizeof name);
            cp_diff d;
            if (cp_compare(refst, path, basest, &d)) {
                printf("| %s | comparison failed | – | – | – | – |\n", name);
                fail = 1;
                continue;
            }
            printf("| %s | %lld | %.3g | %s | %.3g | %s |\n", name, (long long)d.tensors, d.max_rel,
                   *d.worst ? d.worst : "–", d.max_rel_up, *d.worst_up ? d.worst_up : "–");
        }
    }
    fflush(stdout);

    if (keep)
        printf("\nkept %s\n", dir);
    else if (bench_remove_model(dir))
        fail = 1;
    return fail ? 1 : 0;
}
