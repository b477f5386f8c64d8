/*
 * test_probe_resume.c — nothing lost on a bad resume or a bad input (issue 18 §3): the
 * probe's cases, each refused with a message naming both values, RUN/ left as it was.
 *   safety_resume_identity: `train --resume RUN` with another --model (another
 *     architecture, or the same one at another path), another LoRA rank, alpha or
 *     targets, or LoRA on a full fine-tune is refused before anything is written
 *     (through the CLI and through ls_train_run); the run's own flags still resume.
 *   safety_resume_ep:       an --ep 2 run resumed with --ep 1 says it was saved with
 *     --ep 2 and what to pass (needs MPI).
 *   safety_optim_state:     NaN / negative moments in optimizer.safetensors are
 *     refused naming file, tensor, element and value; --adam-eps 0 and other invalid
 *     AdamW settings are refused by the CLI and by the library; a step that would
 *     write a non-finite weight (finite inputs: a huge first moment over a zero second
 *     moment) is skipped and reported, never saved.
 *   safety_unknown_tensors: a checkpoint with tensors its config.json does not
 *     describe (3 layers on disk, 2 in the config) is refused naming them, in both
 *     families; the documented skips (MTP, Qwen3.5's vision tower) still load.
 *   safety_resume_state:    trainer_state.json disagreeing with its directory
 *     ("update": 7 in checkpoint-3, or another adam_step) is refused naming both;
 *     checkpoint-99999999999999999999 and checkpoint-007 are refused by name, not read
 *     as INT64_MAX / 7; a user's checkpoint-best is left alone.
 *   safety_plan_indexer_full: `plan --indexer-kl --mode full` is refused with the
 *     message `grad` gives for the pair.
 * "RUN/ as it was": every file's bytes compared before and after, except RUN/.lock
 * (it holds the pid of the last process that took the lock) and, for a refusal found
 * while loading (after the trace opened), the trace files (a refused attempt appends
 * its start/end lines).
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "longstraw/checkpoint.h"
#include "longstraw/family.h"
#include "longstraw/grpo.h"
#include "longstraw/safetensors.h"
#include "longstraw/trainer.h"
#include "testutil.h"

int test_safety_resume_identity(void);
int test_safety_resume_ep(void);
int test_safety_optim_state(void);
int test_safety_unknown_tensors(void);
int test_safety_resume_state(void);
int test_safety_plan_indexer_full(void);

#define FIX LS_SOURCE_DIR "/tests/reference/fixtures"


/* ---- a directory's bytes, to compare before and after ------------------------------ */

typedef struct {
    char **line; /* "relpath size hash" per file, "relpath/" per directory */
    int n, cap;
} snap;

static uint64_t fnv(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 1099511628211ull;
    return h;
}

static int snap_add(snap *s, const char *text) {
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        char **g = realloc(s->line, (size_t)cap * sizeof *g);
        if (!g) return -1;
        s->line = g, s->cap = cap;
    }
    return (s->line[s->n++] = strdup(text)) ? 0 : -1;
}

/* Every entry under root/rel except .lock and (skip_trace) trace.*.jsonl. */
static int snap_walk(snap *s, const char *root, const char *rel, int skip_trace) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s%s%s", root, rel[0] ? "/" : "", rel);
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *e;
    int r = 0;
    while (r == 0 && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, ".lock")) continue;
        if (skip_trace && !strncmp(e->d_name, "trace.", 6)) continue;
        char sub[4096], path[8200], text[8400];
        snprintf(sub, sizeof sub, "%s%s%s", rel, rel[0] ? "/" : "", e->d_name);
        snprintf(path, sizeof path, "%s/%s", root, sub);
        struct stat st;
        if (lstat(path, &st) != 0) r = -1;
        else if (S_ISDIR(st.st_mode)) {
            snprintf(text, sizeof text, "%s/", sub);
            r = snap_add(s, text);
            if (r == 0) r = snap_walk(s, root, sub, skip_trace);
        } else {
            size_t len = 0;
            char *b = t_read_file(path, &len);
            if (!b) r = -1;
            else {
                snprintf(text, sizeof text, "%s %zu %016llx", sub, len, (unsigned long long)fnv(b, len));
                r = snap_add(s, text);
            }
            free(b);
        }
    }
    closedir(d);
    return r;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The directory as one sorted text (malloc'd), NULL on a read error. */
static char *snapshot(const char *root, int skip_trace) {
    snap s = {0};
    char *out = NULL;
    if (snap_walk(&s, root, "", skip_trace) == 0 && s.n > 0) {
        qsort(s.line, (size_t)s.n, sizeof *s.line, cmp_str);
        size_t len = 1;
        for (int i = 0; i < s.n; i++) len += strlen(s.line[i]) + 1;
        if ((out = malloc(len))) {
            out[0] = 0;
            for (int i = 0; i < s.n; i++) strcat(strcat(out, s.line[i]), "\n");
        }
    }
    for (int i = 0; i < s.n; i++) free(s.line[i]);
    free(s.line);
    return out;
}

/* `longstraw ARGS` is refused (rc != 0), its output holds every needle (NULL-ended),
 * and run/ is byte for byte as it was. */
static int expect_refused(const char *run, int skip_trace, const char *args, ...) {
    char *before = snapshot(run, skip_trace);
    T_CHECK(before, "cannot snapshot %s", run);
    int rc;
    char *out = t_run_fmt(&rc, "%s %s", LS_CLI_PATH, args);
    char *after = snapshot(run, skip_trace);
    int ok = rc != 0 && out && after && !strcmp(before, after);
    va_list ap;
    va_start(ap, args);
    for (const char *nd; ok && (nd = va_arg(ap, const char *));)
        if (!strstr(out, nd)) {
            fprintf(stderr, "  missing in the message: \"%s\"\n", nd);
            ok = 0;
        }
    va_end(ap);
    if (!ok)
        fprintf(stderr, "  `longstraw %s`: rc %d\n  output: %s\n  %s\n", args, rc, out ? out : "(none)",
                after && !strcmp(before, after) ? "run directory unchanged" : "THE RUN DIRECTORY CHANGED");
    if (after && strcmp(before, after)) fprintf(stderr, "  before:\n%s  after:\n%s", before, after);
    free(before);
    free(after);
    free(out);
    T_CHECK(ok, "`longstraw %s` was not refused cleanly", args);
    return 0;
}

/* ---- fixtures ---------------------------------------------------------------------- */

/* dir/name: a model of the fixture's config (all have 97 ids). */
static int init_model(const char *dir, const char *fixture, int seed, const char *name) {
    char cfg[700], m[700];
    snprintf(cfg, sizeof cfg, "%s/%s/config.json", FIX, fixture);
    snprintf(m, sizeof m, "%s/%s", dir, name);
    return t_write_model(cfg, m, seed);
}

/* dir/d.jsonl: `lines` groups of ids (G = 3). */
static int make_data(const char *dir, int lines) {
    char path[1024];
    snprintf(path, sizeof path, "%s/d.jsonl", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    static const int R[3] = {3, 6, 2};
    for (int l = 0; l < lines; l++) {
        fputs("{\"prompt\": [", f);
        for (int i = 0; i < 40 + 9 * l; i++) fprintf(f, "%s%d", i ? ", " : "", (i * 31 + l * 7 + 3) % 97);
        fputs("], \"responses\": [", f);
        for (int g = 0; g < 3; g++) {
            fputs(g ? ", [" : "[", f);
            for (int t = 0; t < R[g]; t++) fprintf(f, "%s%d", t ? ", " : "", (t * 13 + g * 5 + l) % 97);
            fputc(']', f);
        }
        fputs("], \"rewards\": [1, 0, 0.5]}\n", f);
    }
    return fclose(f);
}

/* `longstraw train ARGS` succeeds (output returned in *out when wanted). */
static int train_ok(const char *args, char **out) {
    int rc;
    char *o = t_run_fmt(&rc, "%s train %s", LS_CLI_PATH, args);
    if (rc != 0) fprintf(stderr, "  `train %s`: rc %d\n%s\n", args, rc, o ? o : "");
    if (out) *out = o;
    else free(o);
    return rc;
}

/* Rewrite a JSON object file with field `key` set to a number (or removed when remove). */
static int json_set(const char *path, const char *key, double v, int remove) {
    char *text = t_read_file(path, NULL);
    cJSON *o = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!o) return -1;
    if (remove) cJSON_DeleteItemFromObjectCaseSensitive(o, key);
    else if (cJSON_GetObjectItemCaseSensitive(o, key)) cJSON_ReplaceItemInObjectCaseSensitive(o, key, cJSON_CreateNumber(v));
    else cJSON_AddNumberToObject(o, key, v);
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    if (!s) return -1;
    FILE *f = fopen(path, "w");
    int r = f && fputs(s, f) >= 0 ? 0 : -1;
    if (f && fclose(f) != 0) r = -1;
    free(s);
    return r;
}

/* ---- 1. the run's identity --------------------------------------------------------- */

int test_safety_resume_identity(void) {
    char dir[512], run[1024], lrun[1024], args[4096], absA[4096], absB[4096], absA2[4096];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    T_CHECK(init_model(dir, "next_dense", 1, "A") == 0 && init_model(dir, "q35_dense", 2, "B") == 0 &&
                make_data(dir, 3) == 0, "setup");
    int rc;
    free(t_run_fmt(&rc, "cp -a %s/A %s/A2", dir, dir));
    T_CHECK(rc == 0, "cp");
    snprintf(run, sizeof run, "%s/run", dir);
    snprintf(lrun, sizeof lrun, "%s/lrun", dir);
    snprintf(args, sizeof args, "--model %s/A --data %s/d.jsonl --out %s --updates 2 --save-every 1 --save-total-limit 5 --quiet",
             dir, dir, run);
    T_CHECK(train_ok(args, NULL) == 0, "the full fine-tune run");
    snprintf(args, sizeof args, "--model %s/A --data %s/d.jsonl --out %s --updates 2 --save-every 1 --lora-rank 2 "
             "--lora-targets q_proj,in_proj_qkvz --lr 1e-2 --quiet", dir, dir, lrun);
    T_CHECK(train_ok(args, NULL) == 0, "the LoRA run");
    snprintf(args, sizeof args, "%s/A", dir);
    T_CHECK(realpath(args, absA), "realpath A");
    snprintf(args, sizeof args, "%s/B", dir);
    T_CHECK(realpath(args, absB), "realpath B");
    snprintf(args, sizeof args, "%s/A2", dir);
    T_CHECK(realpath(args, absA2), "realpath A2");

    /* another architecture: both models named, nothing written (before: rc 0, and
     * checkpoints whose config.json was B's over A's weights) */
    snprintf(args, sizeof args, "train --resume %s --model %s/B --updates 4 --quiet", run, dir);
    if (expect_refused(run, 0, args, absA, absB, "a resume continues the run's own model", (char *)NULL)) return 1;
    /* the same architecture at another path: another base model */
    snprintf(args, sizeof args, "train --resume %s --model %s/A2 --updates 4 --quiet", run, dir);
    if (expect_refused(run, 0, args, absA, absA2, (char *)NULL)) return 1;
    /* LoRA on a full fine-tune */
    snprintf(args, sizeof args, "train --resume %s --lora-rank 2 --updates 4 --quiet", run);
    if (expect_refused(run, 0, args, "every weight (a full fine-tune)", "LoRA", (char *)NULL)) return 1;
    /* the LoRA run: another rank (before: ignored silently), alpha, targets */
    snprintf(args, sizeof args, "train --resume %s --lora-rank 4 --updates 4 --quiet", lrun);
    if (expect_refused(lrun, 0, args, "rank 2", "--lora-rank 4", (char *)NULL)) return 1;
    snprintf(args, sizeof args, "train --resume %s --lora-alpha 32 --updates 4 --quiet", lrun);
    if (expect_refused(lrun, 0, args, "lora_alpha 16", "--lora-alpha 32", (char *)NULL)) return 1;
    snprintf(args, sizeof args, "train --resume %s --lora-targets q_proj --updates 4 --quiet", lrun);
    if (expect_refused(lrun, 0, args, "--lora-targets q_proj,in_proj_qkvz", "--lora-targets q_proj:", (char *)NULL))
        return 1;
    /* a run from before trainer_state.json recorded the model: RUN/args.json names it */
    char st[2048];
    snprintf(st, sizeof st, "%s/checkpoint-2/trainer_state.json", run);
    T_CHECK(json_set(st, "model", 0, 1) == 0 && json_set(st, "family", 0, 1) == 0, "edit %s", st);
    snprintf(args, sizeof args, "train --resume %s --model %s/A2 --updates 4 --quiet", run, dir);
    if (expect_refused(run, 0, args, absA, absA2, (char *)NULL)) return 1;

    /* the library refuses it too (the CLI only asks) */
    ls_train_opts o;
    ls_train_opts_default(&o);
    char model[1024], data[1024];
    snprintf(model, sizeof model, "%s/B", dir);
    snprintf(data, sizeof data, "%s/d.jsonl", dir);
    o.model = model, o.data = data, o.out = run, o.resume = 1, o.updates = 4;
    ls_train_result res;
    char *before = snapshot(run, 0);
    ls_status s = ls_train_run(&o, &res);
    char *after = snapshot(run, 0);
    int same = before && after && !strcmp(before, after);
    free(before);
    free(after);
    T_CHECK(s == LS_ERR_ARG && strstr(ls_err_msg(), absB) && res.updates == 0,
            "ls_train_run resuming with another model: %s \"%s\"", ls_status_name(s), ls_err_msg());
    T_CHECK(same, "ls_train_run's refused resume changed the run directory");

    /* control: the run's own flags continue it */
    snprintf(args, sizeof args, "--resume %s --updates 3 --quiet", run);
    T_CHECK(train_ok(args, NULL) == 0, "resume with the run's own model");
    snprintf(args, sizeof args, "--resume %s --updates 3 --quiet", lrun);
    T_CHECK(train_ok(args, NULL) == 0, "resume of the LoRA run");
    snprintf(args, sizeof args, "%s/checkpoint-3/adapter_model.safetensors", lrun);
    T_CHECK(access(args, F_OK) == 0, "the LoRA run did not continue");
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* ---- 1b. the --ep layout ------------------------------------------------------------- */

int test_safety_resume_ep(void) {
    if (!LS_MPIEXEC[0]) T_SKIP("built without MPI");
    char dir[512], run[1024], args[4096];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    T_CHECK(init_model(dir, "mla_glm", 3, "C") == 0 && make_data(dir, 2) == 0, "setup");
    snprintf(run, sizeof run, "%s/erun", dir);
    int rc;
    char *out = t_run_fmt(&rc, LS_MPI_ENV "%s --oversubscribe --allow-run-as-root -np 2 %s train --model %s/C --data %s/d.jsonl "
                   "--out %s --updates 1 --ep 2 --threads 1 --quiet", LS_MPIEXEC, LS_CLI_PATH, dir, dir, run);
    T_CHECK(rc == 0, "the --ep 2 run: %s", out ? out : "");
    free(out);
    /* one rank: said as the run's --ep, with what to pass (before: tensor "exp_avg.0" is missing) */
    snprintf(args, sizeof args, "train --resume %s --ep 1 --updates 2 --quiet", run);
    if (expect_refused(run, 0, args, "saved with --ep 2", "resume it with --ep 2", (char *)NULL)) return 1;
    /* a checkpoint from before trainer_state.json recorded --ep: the optimizer file says it */
    char st[2048];
    snprintf(st, sizeof st, "%s/checkpoint-1/trainer_state.json", run);
    T_CHECK(json_set(st, "ep", 0, 1) == 0, "edit %s", st);
    snprintf(args, sizeof args, "train --resume %s --ep 1 --updates 2 --quiet", run);
    if (expect_refused(run, 1, args, "exp_avg.0", "saved with expert parallelism", "--ep", (char *)NULL)) return 1;
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* ---- 2. optimizer state and AdamW settings ---------------------------------------- */

/* Rewrite an optimizer file: f(name, values, n) edits each tensor; metadata kept. */
static int rewrite_optim(const char *path, void (*edit)(const char *name, float *x, int64_t n)) {
    ls_st_file f;
    if (ls_st_open(&f, path) != LS_OK) return -1;
    int64_t n = ls_st_count(&f);
    float **bufs = calloc((size_t)n, sizeof *bufs);
    ls_st_writer w;
    ls_st_writer_init(&w);
    ls_status s = bufs ? LS_OK : LS_ERR_NOMEM;
    for (int64_t i = 0; i < n && s == LS_OK; i++) {
        const ls_st_tensor *t = ls_st_at(&f, i);
        if (!(bufs[i] = malloc((size_t)(t->numel > 0 ? t->numel : 1) * sizeof(float)))) s = LS_ERR_NOMEM;
        if (s == LS_OK) s = ls_st_read_f32(t, bufs[i], t->numel, NULL);
        if (s == LS_OK) edit(t->name, bufs[i], t->numel);
        if (s == LS_OK) s = ls_st_writer_add_f32(&w, t->name, LS_DTYPE_F32, t->ndim, t->shape, bufs[i]);
    }
    const char *keys[2] = {"step", "tensors"};
    for (int k = 0; k < 2 && s == LS_OK; k++) s = ls_st_writer_add_meta(&w, keys[k], ls_st_meta_get(&f, keys[k]));
    ls_st_close(&f);
    if (s == LS_OK) s = ls_st_write(&w, path);
    ls_st_writer_free(&w);
    for (int64_t i = 0; bufs && i < n; i++) free(bufs[i]);
    free(bufs);
    return s == LS_OK ? 0 : -1;
}

static void poison_nan(const char *name, float *x, int64_t n) {
    if (!strcmp(name, "exp_avg.3") && n > 5) x[5] = NAN;
}
static void poison_negative(const char *name, float *x, int64_t n) {
    if (!strcmp(name, "exp_avg_sq.0") && n > 0) x[0] = -1.0f;
}
/* valid (finite, exp_avg_sq >= 0) but explosive: the next step's m̂ / (sqrt(v̂) + eps) overflows */
static void huge_first_moment(const char *name, float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = !strncmp(name, "exp_avg_sq.", 11) ? 0.0f : 1e38f;
}

/* 1 when every tensor of a safetensors file is finite and equal to another's */
static int same_finite(const char *a, const char *b) {
    ls_st_file fa, fb;
    if (ls_st_open(&fa, a) != LS_OK) return 0;
    if (ls_st_open(&fb, b) != LS_OK) {
        ls_st_close(&fa);
        return 0;
    }
    int ok = ls_st_count(&fa) == ls_st_count(&fb) && ls_st_count(&fa) > 0;
    for (int64_t i = 0; ok && i < ls_st_count(&fa); i++) {
        const ls_st_tensor *ta = ls_st_at(&fa, i), *tb = ls_st_find(&fb, ta->name);
        ok = tb && t_st_same_f32(ta, tb) == 1;
        float *x = ok ? malloc((size_t)(ta->numel + 1) * sizeof(float)) : NULL;
        ok = ok && x && ls_st_read_f32(ta, x, ta->numel, NULL) == LS_OK && (ta->numel == 0 || t_all_finite_f(x, ta->numel));
        free(x);
    }
    ls_st_close(&fa);
    ls_st_close(&fb);
    return ok;
}

int test_safety_optim_state(void) {
    char dir[512], run[1024], args[4096], opt[2048], keep[2048];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    T_CHECK(init_model(dir, "next_dense", 4, "A") == 0 && make_data(dir, 3) == 0, "setup");
    snprintf(run, sizeof run, "%s/run", dir);
    snprintf(args, sizeof args, "--model %s/A --data %s/d.jsonl --out %s --updates 2 --save-every 1 --save-total-limit 5 --quiet",
             dir, dir, run);
    T_CHECK(train_ok(args, NULL) == 0, "the run");
    snprintf(opt, sizeof opt, "%s/checkpoint-2/optimizer.safetensors", run);
    snprintf(keep, sizeof keep, "%s/optimizer.keep", dir);
    T_OK(ls_copy_file_atomic(opt, keep));

    /* NaN and a negative second moment: refused naming file, tensor, element, value
     * (before: loaded, NaN weights saved with "0 skipped") */
    T_CHECK(rewrite_optim(opt, poison_nan) == 0, "poison");
    snprintf(args, sizeof args, "train --resume %s --updates 3 --quiet", run);
    if (expect_refused(run, 1, args, opt, "tensor \"exp_avg.3\"", "invalid value nan at element 5", (char *)NULL))
        return 1;
    T_OK(ls_copy_file_atomic(keep, opt));
    T_CHECK(rewrite_optim(opt, poison_negative) == 0, "poison");
    if (expect_refused(run, 1, args, opt, "tensor \"exp_avg_sq.0\"", "invalid value -1 at element 0", ">= 0", (char *)NULL))
        return 1;
    T_OK(ls_copy_file_atomic(keep, opt));

    /* --adam-eps 0 (before: rc 0 and a NaN embed_tokens): refused at parse, and by the library */
    snprintf(args, sizeof args, "train --resume %s --updates 3 --adam-eps 0 --quiet", run);
    if (expect_refused(run, 0, args, "--adam-eps", "must be > 0", (char *)NULL)) return 1;
    int rc;
    char *out = t_run_fmt(&rc, "%s train --model %s/A --data %s/d.jsonl --out %s/fresh --adam-eps 0 --quiet", LS_CLI_PATH, dir,
                   dir, dir);
    snprintf(args, sizeof args, "%s/fresh", dir);
    T_CHECK(rc == 2 && out && strstr(out, "--adam-eps") && access(args, F_OK) != 0, "--adam-eps 0: rc %d %s", rc,
            out ? out : "");
    free(out);
    static const struct {
        const char *field, *needle;
        double v;
    } bad[] = {{"adam_eps", "--adam-eps 0", 0}, {"adam_eps", "--adam-eps -1e-08", -1e-8},
               {"beta1", "--adam-beta1 1", 1}, {"beta2", "--adam-beta2 -0.1", -0.1},
               {"weight_decay", "--weight-decay -1", -1}, {"lr", "--lr nan", NAN}, {"lr", "--lr inf", INFINITY},
               {"max_grad_norm", "--max-grad-norm -1", -1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ls_grpo_opts g;
        ls_grpo_opts_default(&g);
        double *f = !strcmp(bad[i].field, "adam_eps") ? &g.adam_eps : !strcmp(bad[i].field, "beta1") ? &g.beta1
                    : !strcmp(bad[i].field, "beta2") ? &g.beta2 : !strcmp(bad[i].field, "weight_decay") ? &g.weight_decay
                    : !strcmp(bad[i].field, "lr") ? &g.lr : &g.max_grad_norm;
        *f = bad[i].v;
        ls_status s = ls_grpo_opts_check(&g);
        T_CHECK(s == LS_ERR_ARG && strstr(ls_err_msg(), bad[i].needle), "%s = %g: %s \"%s\" (want \"%s\")", bad[i].field,
                bad[i].v, ls_status_name(s), ls_err_msg(), bad[i].needle);
    }
    ls_grpo_opts g;
    ls_grpo_opts_default(&g);
    T_OK(ls_grpo_opts_check(&g));
    ls_train_opts o;
    ls_train_opts_default(&o);
    char model[1024], data[1024], fresh[1024];
    snprintf(model, sizeof model, "%s/A", dir);
    snprintf(data, sizeof data, "%s/d.jsonl", dir);
    snprintf(fresh, sizeof fresh, "%s/fresh_lib", dir);
    o.model = model, o.data = data, o.out = fresh, o.updates = 1;
    o.o.adam_eps = 0;
    ls_train_result res;
    ls_status s = ls_train_run(&o, &res);
    T_CHECK(s == LS_ERR_ARG && strstr(ls_err_msg(), "--adam-eps 0") && access(fresh, F_OK) != 0,
            "ls_train_run with adam_eps 0: %s \"%s\"", ls_status_name(s), ls_err_msg());

    /* a step that would write a non-finite weight from finite inputs: skipped and
     * reported, the checkpoint keeps the last good weights (before: inf weights
     * saved, "0 skipped") */
    T_CHECK(rewrite_optim(opt, huge_first_moment) == 0, "rewrite");
    out = t_run_fmt(&rc, "%s train --resume %s --updates 3 --lr 1 --quiet", LS_CLI_PATH, run);
    int ok = rc == 0 && out && strstr(out, "update 3/3 SKIPPED: the step would write a non-finite value into") &&
             strstr(out, "(1 skipped)");
    if (!ok) fprintf(stderr, "  resume with explosive moments: rc %d\n%s\n", rc, out ? out : "");
    free(out);
    T_CHECK(ok, "the non-finite step was not skipped and reported");
    char a[2048], b[2048];
    snprintf(a, sizeof a, "%s/checkpoint-3/model.safetensors", run);
    snprintf(b, sizeof b, "%s/checkpoint-2/model.safetensors", run);
    T_CHECK(same_finite(a, b), "checkpoint-3's weights are not checkpoint-2's finite ones");
    snprintf(a, sizeof a, "%s/metrics.jsonl", run);
    char *m = t_read_file(a, NULL);
    char *last = m ? strstr(m, "{\"update\": 2,") : NULL;
    T_CHECK(last && strstr(last, "\"skipped\": true"), "metrics.jsonl does not mark update 3 skipped: %s", m ? m : "");
    free(m);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* ---- 3. tensors the config does not describe -------------------------------------- */

/* dir/to: from's model.safetensors with config.json = from's with num_hidden_layers
 * `layers` (and `key` = kv when key non-NULL). */
static int cut_config(const char *dir, const char *from, const char *to, int layers, const char *key, double kv) {
    int rc;
    free(t_run_fmt(&rc, "rm -rf %s/%s && mkdir %s/%s && cp %s/%s/model.safetensors %s/%s/ && cp %s/%s/config.json %s/%s/", dir,
            to, dir, to, dir, from, dir, to, dir, from, dir, to));
    if (rc != 0) return -1;
    char path[2048];
    snprintf(path, sizeof path, "%s/%s/config.json", dir, to);
    if (json_set(path, "num_hidden_layers", layers, 0) != 0) return -1;
    return key ? json_set(path, key, kv, 0) : 0;
}

/* dir/to: from with extra tensors (names NULL-ended) added to model.safetensors */
static int add_tensors(const char *dir, const char *from, const char *to, const char *const *names) {
    char src[2048], dst[2048];
    int rc;
    free(t_run_fmt(&rc, "rm -rf %s/%s && cp -a %s/%s %s/%s", dir, to, dir, from, dir, to));
    if (rc != 0) return -1;
    snprintf(src, sizeof src, "%s/%s/model.safetensors", dir, from);
    snprintf(dst, sizeof dst, "%s/%s/model.safetensors", dir, to);
    ls_st_file f;
    if (ls_st_open(&f, src) != LS_OK) return -1;
    ls_st_writer w;
    ls_st_writer_init(&w);
    int64_t n = ls_st_count(&f);
    float **bufs = calloc((size_t)n + 1, sizeof *bufs), extra[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    ls_status s = bufs ? LS_OK : LS_ERR_NOMEM;
    for (int64_t i = 0; i < n && s == LS_OK; i++) {
        const ls_st_tensor *t = ls_st_at(&f, i);
        if (!(bufs[i] = malloc((size_t)(t->numel + 1) * sizeof(float)))) s = LS_ERR_NOMEM;
        if (s == LS_OK) s = ls_st_read_f32(t, bufs[i], t->numel, NULL);
        if (s == LS_OK) s = ls_st_writer_add_f32(&w, t->name, LS_DTYPE_F32, t->ndim, t->shape, bufs[i]);
    }
    for (int k = 0; names[k] && s == LS_OK; k++) s = ls_st_writer_add_f32(&w, names[k], LS_DTYPE_F32, 1, shape, extra);
    if (s == LS_OK) s = ls_st_write(&w, dst);
    ls_st_writer_free(&w);
    for (int64_t i = 0; bufs && i < n; i++) free(bufs[i]);
    free(bufs);
    ls_st_close(&f);
    return s == LS_OK ? 0 : -1;
}

/* Loading dir/name: LS_OK wanted (needle NULL), or LS_ERR_FORMAT naming needle. */
static int expect_load(const char *dir, const char *name, const char *needle) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ls_arenas ar;
    ls_arenas_init(&ar);
    ls_model m;
    ls_status s = ls_model_load(&m, path, NULL, &ar.a[LS_ARENA_FIXED]);
    ls_arenas_free(&ar);
    if (!needle) T_CHECK(s == LS_OK, "%s: %s \"%s\"", name, ls_status_name(s), ls_err_msg());
    else
        T_CHECK(s == LS_ERR_FORMAT && strstr(ls_err_msg(), needle) && strstr(ls_err_msg(), "does not describe"),
                "%s: %s \"%s\" (want LS_ERR_FORMAT naming %s)", name, ls_status_name(s), ls_err_msg(), needle);
    return 0;
}

int test_safety_unknown_tensors(void) {
    char dir[512], cfg[1024];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    /* the hybrid family: a 3-layer model (no layer_types: full_attention_interval) */
    snprintf(cfg, sizeof cfg, "%s/c3.json", dir);
    FILE *f = fopen(cfg, "w");
    T_CHECK(f, "write %s", cfg);
    fputs("{\"model_type\": \"qwen3_next\", \"vocab_size\": 97, \"hidden_size\": 32, \"num_hidden_layers\": 3,"
          " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 16, \"linear_num_key_heads\": 2,"
          " \"linear_num_value_heads\": 2, \"linear_key_head_dim\": 8, \"linear_value_head_dim\": 8,"
          " \"intermediate_size\": 48, \"num_experts\": 0, \"full_attention_interval\": 2}", f);
    T_CHECK(fclose(f) == 0, "write");
    int rc;
    char h3[700];
    snprintf(h3, sizeof h3, "%s/h3", dir);
    T_CHECK(t_write_model(cfg, h3, 5) == 0, "a model from %s", cfg);
    char *out;
    if (expect_load(dir, "h3", NULL)) return 1;
    T_CHECK(cut_config(dir, "h3", "h2", 2, NULL, 0) == 0, "h2");
    if (expect_load(dir, "h2", "model.layers.2.")) return 1;
    /* through the tool: `step` (before: rc 0, layer 2 dropped from its output) */
    out = t_run_fmt(&rc, "%s step --model %s/h2 --group %s/next_dense/group_train.json --out %s/h2step", LS_CLI_PATH, dir, FIX, dir);
    int ok = rc != 0 && out && strstr(out, "model.layers.2.") && strstr(out, "does not describe");
    if (!ok) fprintf(stderr, "  step on h2: rc %d %s\n", rc, out ? out : "");
    free(out);
    T_CHECK(ok, "step loaded a checkpoint with an undescribed layer");
    /* one stray tensor, named */
    static const char *const stray[] = {"model.layers.0.mlp.extra_proj.weight", NULL};
    T_CHECK(add_tensors(dir, "h3", "hx", stray) == 0, "hx");
    if (expect_load(dir, "hx", "model.layers.0.mlp.extra_proj.weight")) return 1;
    /* the documented skips still load: the MTP module, Qwen3.5's vision tower */
    static const char *const skips[] = {"mtp.fc.weight", "mtp.layers.0.input_layernorm.weight",
                                        "model.visual.blocks.0.norm1.weight", NULL};
    T_CHECK(add_tensors(dir, "h3", "hs", skips) == 0, "hs");
    if (expect_load(dir, "hs", NULL)) return 1;

    /* the MLA family: mla_glm has 3 layers; 2 in the config refuses layer 2, unless
     * num_nextn_predict_layers makes it the MTP layer (spec §5: skipped) */
    T_CHECK(init_model(dir, "mla_glm", 6, "g3") == 0, "init mla");
    if (expect_load(dir, "g3", NULL)) return 1;
    T_CHECK(cut_config(dir, "g3", "g2", 2, NULL, 0) == 0, "g2");
    if (expect_load(dir, "g2", "model.layers.2.")) return 1;
    T_CHECK(cut_config(dir, "g3", "g2m", 2, "num_nextn_predict_layers", 1) == 0, "g2m");
    if (expect_load(dir, "g2m", NULL)) return 1;
    T_CHECK(add_tensors(dir, "g3", "gx", stray) == 0, "gx");
    if (expect_load(dir, "gx", "model.layers.0.mlp.extra_proj.weight")) return 1;
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* ---- 4. trainer state vs its directory, checkpoint names -------------------------- */

int test_safety_resume_state(void) {
    char dir[512], run[1024], args[4096], st[2048], keep[2048], p[2048];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    T_CHECK(init_model(dir, "next_dense", 7, "A") == 0 && make_data(dir, 3) == 0, "setup");
    snprintf(run, sizeof run, "%s/run", dir);
    snprintf(args, sizeof args, "--model %s/A --data %s/d.jsonl --out %s --updates 3 --save-every 1 --save-total-limit 5 --quiet",
             dir, dir, run);
    T_CHECK(train_ok(args, NULL) == 0, "the run");
    snprintf(st, sizeof st, "%s/checkpoint-3/trainer_state.json", run);
    snprintf(keep, sizeof keep, "%s/state.keep", dir);
    T_OK(ls_copy_file_atomic(st, keep));

    /* "update": 7 inside checkpoint-3 (before: updates 4-7 skipped, rc 0) */
    T_CHECK(json_set(st, "update", 7, 0) == 0, "edit");
    snprintf(args, sizeof args, "train --resume %s --updates 8 --quiet", run);
    if (expect_refused(run, 0, args, "\"update\" is 7", "checkpoint-3", (char *)NULL)) return 1;
    /* another adam_step than the optimizer file's */
    T_OK(ls_copy_file_atomic(keep, st));
    T_CHECK(json_set(st, "adam_step", 5, 0) == 0, "edit");
    if (expect_refused(run, 1, args, "optimizer step 3", "\"adam_step\": 5", (char *)NULL)) return 1;
    T_OK(ls_copy_file_atomic(keep, st));

    /* checkpoint-99999999999999999999 (before: read as INT64_MAX): refused by name */
    snprintf(p, sizeof p, "%s/checkpoint-99999999999999999999", run);
    T_CHECK(mkdir(p, 0755) == 0, "mkdir");
    if (expect_refused(run, 0, args, "checkpoint-99999999999999999999", "out of range", (char *)NULL)) return 1;
    int64_t last = 0;
    char ck[2048];
    ls_status s = ls_ckpt_latest(run, &last, ck, sizeof ck);
    T_CHECK(s == LS_ERR_FORMAT && strstr(ls_err_msg(), "checkpoint-99999999999999999999"), "ls_ckpt_latest: %s \"%s\"",
            ls_status_name(s), ls_err_msg());
    T_CHECK(rmdir(p) == 0, "rmdir");
    /* checkpoint-007 would be read as checkpoint-7, a directory that is not there */
    snprintf(p, sizeof p, "%s/checkpoint-007", run);
    T_CHECK(mkdir(p, 0755) == 0, "mkdir");
    if (expect_refused(run, 0, args, "checkpoint-007", "checkpoint-7", (char *)NULL)) return 1;
    T_CHECK(rmdir(p) == 0, "rmdir");
    /* a user's own checkpoint-best is not a checkpoint: left alone */
    snprintf(p, sizeof p, "%s/checkpoint-best", run);
    T_CHECK(mkdir(p, 0755) == 0, "mkdir");
    T_OK(ls_ckpt_latest(run, &last, ck, sizeof ck));
    T_CHECK(last == 3, "latest %lld, want 3", (long long)last);
    /* control: the intact run continues */
    snprintf(args, sizeof args, "--resume %s --updates 4 --quiet", run);
    T_CHECK(train_ok(args, NULL) == 0, "resume");
    struct stat sb;
    T_CHECK(stat(p, &sb) == 0 && S_ISDIR(sb.st_mode), "checkpoint-best was removed");
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* ---- 5. plan refuses what grad refuses ------------------------------------------- */

/* The text after "longstraw CMD: " on the first line that has it (malloc'd). */
static char *message_of(const char *out, const char *cmd) {
    char pre[64];
    snprintf(pre, sizeof pre, "longstraw %s: ", cmd);
    const char *p = out ? strstr(out, pre) : NULL;
    if (!p) return NULL;
    p += strlen(pre);
    return strndup(p, strcspn(p, "\n"));
}

int test_safety_plan_indexer_full(void) {
    int rc1, rc2, rc3;
    char *plan = t_run_fmt(&rc1, "%s plan --config %s/mla_glm/config.json --prompt 100 --indexer-kl --mode full", LS_CLI_PATH, FIX);
    char *grad = t_run_fmt(&rc2, "%s grad --model %s/mla_glm --group %s/mla_glm/group.json --out /nonexistent/g.safetensors "
                    "--indexer-kl-coef 1 --mode full", LS_CLI_PATH, FIX, FIX);
    char *ctl = t_run_fmt(&rc3, "%s plan --config %s/mla_glm/config.json --prompt 100 --indexer-kl", LS_CLI_PATH, FIX);
    char *mp = message_of(plan, "plan"), *mg = message_of(grad, "grad");
    int ok = rc1 == 2 && rc2 == 2 && rc3 == 0 && mp && mg && !strcmp(mp, mg) && strstr(mp, "--mode full");
    if (!ok)
        fprintf(stderr, "  plan: rc %d %s\n  grad: rc %d %s\n  plan without --mode full: rc %d\n", rc1, plan ? plan : "",
                rc2, grad ? grad : "", rc3);
    free(plan), free(grad), free(ctl), free(mp), free(mg);
    T_CHECK(ok, "plan did not refuse --indexer-kl --mode full as grad does");
    return 0;
}
