/*
 * trainer.c — the training loop (trainer.h). Each update is one GRPO transaction over
 * groups_per_update groups, read from JSONL (ids or text) or sampled from the policy
 * (rollouts) on a built-in task or JSONL prompts, with rewards from the task, the
 * data's "answer" or a reward process. Writes RUN/metrics.jsonl, RUN/trace.<rank>.jsonl,
 * checkpoints (checkpoint.h) and RUN/receipt.json.
 */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "longstraw/checkpoint.h"
#include "longstraw/eval.h"
#include "longstraw/files.h"
#include "longstraw/reward.h"
#include "longstraw/rollout.h"
#include "longstraw/task.h"
#include "longstraw/tokenizer.h"
#include "longstraw/trace.h"
#include "longstraw/trainer.h"
#include "longstraw/backend.h"
#include "core/rt.h"

void ls_train_opts_default(ls_train_opts *a) {
    memset(a, 0, sizeof *a);
    ls_grpo_opts_default(&a->o);
    a->spec.lora_alpha = 16;
    a->groups_per_update = 1;
    a->save_every = 50;
    a->save_total_limit = 2;
    a->num_generations = 8;
    a->max_new_tokens = 32;
    a->top_p = 1.0;
    a->prompt_len = 16384;
    a->reward_timeout = 60;
    a->trace_layers = 3;
    a->eval_every = 1;
}


/* The process runtime's reward process group, for the CLI's signal handler. */
int ls_train_reward_pgid(void) { return ls_rt_process()->reward_pgid; }

/* ---- the saved command line (RUN/args.json) ----------------------------------------- */

/* Flags whose value is a path: saved absolute, so a resume from another directory
 * finds the same files (the reward command runs in the resume's directory). */
static int is_path_flag(const char *f) {
    static const char *const flags[] = {"--model", "--data", "--tokenizer", "--out", "--ref-model", "--adapter"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strcmp(f, flags[i])) return 1;
    return 0;
}

/* RUN/args.json: the command line without --resume, paths made absolute. A resume
 * rewrites it with the merged flags, so its overrides (e.g. --updates) stick. */
static ls_status save_args(const char *run, int argc, char **argv) {
    cJSON *arr = cJSON_CreateArray();
    if (!arr) return LS_ERR_NOMEM;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--resume")) {
            i++; /* and its value */
            continue;
        }
        if (!strncmp(argv[i], "--resume=", 9)) continue;
        cJSON_AddItemToArray(arr, cJSON_CreateString(argv[i]));
        char abs[PATH_MAX];
        if (is_path_flag(argv[i]) && i + 1 < argc) {
            i++;
            cJSON_AddItemToArray(arr, cJSON_CreateString(realpath(argv[i], abs) ? abs : argv[i]));
        }
    }
    char *text = cJSON_Print(arr), path[4096];
    cJSON_Delete(arr);
    if (!text) return LS_ERR_NOMEM;
    snprintf(path, sizeof path, "%s/args.json", run);
    ls_status s = ls_write_file_atomic(path, text, strlen(text));
    free(text);
    return s;
}

/* One trainer per run directory: an exclusive lock on RUN/.lock for the whole run
 * (released by the kernel however the process ends). *created: the file was made here
 * (a refused command removes it again). The holder's pid is written only once the run
 * goes ahead (lock_note_pid): a refused command leaves RUN/ as it found it. */
static ls_status lock_run(const char *run, int *fd, int *created) {
    char path[4200];
    snprintf(path, sizeof path, "%s/.lock", run);
    struct stat sb;
    *created = lstat(path, &sb) != 0 && errno == ENOENT;
    LS_TRY(ls_open_in_place(path, O_RDWR, fd)); /* a symbolic link planted there is refused, not written through */
    if (flock(*fd, LOCK_EX | LOCK_NB) != 0) {
        char pid[32] = "";
        ssize_t n = read(*fd, pid, sizeof pid - 1);
        while (n > 0 && (pid[n - 1] == '\n' || pid[n - 1] == ' ')) n--; /* "(pid N)", not "(pid N\n)" */
        pid[n > 0 ? n : 0] = 0;
        close(*fd);
        *fd = -1;
        *created = 0; /* (the other process's) */
        return ls_err(LS_ERR_ARG, "%s is in use by another longstraw train (pid %s)", run, pid[0] ? pid : "?");
    }
    return LS_OK;
}

static void lock_note_pid(int fd) {
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || write(fd, pid, (size_t)n) != n) { /* informational only */
    }
}

/* Parse a JSON file whose top level must be an array (is_array) or an object. */
static ls_status read_json(const char *path, int is_array, cJSON **out) {
    char *text = NULL;
    LS_TRY(ls_read_file(path, &text, NULL));
    *out = cJSON_Parse(text);
    free(text);
    if (is_array ? cJSON_IsArray(*out) : cJSON_IsObject(*out)) return LS_OK;
    cJSON_Delete(*out);
    *out = NULL;
    return ls_err(LS_ERR_FORMAT, "%s: not valid JSON, or its top level is not %s", path, is_array ? "an array" : "an object");
}

/* argv' = ["train", saved..., given...]: later flags override. Strings malloc'd. */
ls_status ls_train_same_run(const char *resume, const char *out) {
    struct stat s1, s2;
    if (!out) return LS_OK;
    if (stat(out, &s1) != 0 || stat(resume, &s2) != 0 || s1.st_dev != s2.st_dev || s1.st_ino != s2.st_ino)
        return ls_err(LS_ERR_ARG, "--resume %s with --out %s: they must be the same run", resume, out);
    return LS_OK;
}

ls_status ls_train_saved_args(const char *run, int argc, char **argv, int *nargc, char ***nargv) {
    char path[4096];
    snprintf(path, sizeof path, "%s/args.json", run);
    cJSON *arr;
    LS_TRY(read_json(path, 1, &arr));
    int n = cJSON_GetArraySize(arr);
    char **v = calloc((size_t)(n + argc + 1), sizeof(char *));
    if (!v) {
        cJSON_Delete(arr);
        return LS_ERR_NOMEM;
    }
    int k = 0;
    v[k++] = strdup("train");
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        if (!cJSON_IsString(e)) {
            ls_status bad = ls_err(LS_ERR_FORMAT, "%s: entry %d is not a string", path, k - 1);
            cJSON_Delete(arr);
            for (int i = 0; i < k; i++) free(v[i]);
            free(v);
            return bad;
        }
        v[k++] = strdup(e->valuestring);
    }
    cJSON_Delete(arr);
    for (int i = 1; i < argc; i++) v[k++] = strdup(argv[i]);
    *nargc = k;
    *nargv = v;
    return LS_OK;
}

/* ---- JSONL data ------------------------------------------------------------------------ */

typedef struct {
    char *buf;
    int64_t n;       /* non-blank lines */
    size_t *off;     /* [n] start of each */
    int64_t *lineno; /* [n] 1-based line number */
} jsonl;

static ls_status jsonl_open(jsonl *d, const char *path) {
    memset(d, 0, sizeof *d);
    size_t len;
    LS_TRY(ls_read_file(path, &d->buf, &len));
    int64_t cap = 0, line = 1;
    for (size_t i = 0; i < len; line++) {
        size_t j = i;
        while (j < len && d->buf[j] != '\n') j++;
        size_t k = i;
        while (k < j && isspace((unsigned char)d->buf[k])) k++;
        if (k < j) {
            if (d->n == cap) {
                cap = cap ? 2 * cap : 256;
                size_t *o = realloc(d->off, (size_t)cap * sizeof(size_t));
                int64_t *l = realloc(d->lineno, (size_t)cap * sizeof(int64_t));
                if (o) d->off = o;
                if (l) d->lineno = l;
                if (!o || !l) return LS_ERR_NOMEM;
            }
            d->off[d->n] = i;
            d->lineno[d->n++] = line;
        }
        if (j < len) d->buf[j] = 0; /* each line becomes its own string */
        i = j + 1;
    }
    if (d->n == 0) return ls_err(LS_ERR_FORMAT, "%s: no groups (the file is empty)", path);
    return LS_OK;
}

static void jsonl_free(jsonl *d) {
    free(d->buf);
    free(d->off);
    free(d->lineno);
    memset(d, 0, sizeof *d);
}

/* ---- the run --------------------------------------------------------------------------- */

typedef struct {
    ls_train_opts *a; /* a private copy of the caller's options (setup fills defaults) */
    ls_trainable pol;
    ls_arenas ar;
    ls_tokenizer *tok;
    jsonl data;
    ls_reward_cmd *rcmd;
    ls_rng rng;
    int64_t update;   /* updates done */
    int64_t data_pos; /* next line (or passkey item) */
    int64_t epoch;
    ls_sample_opts so;
    int32_t stop_ids[16];
    ls_task task;           /* the built-in task (a->task) */
    ls_task_item *items;    /* [groups_per_update] the task items of this update */
    ls_eval_opts ev;        /* held-out task evaluation (ev.num_prompts 0: none) */
    ls_eval_result ev_res, ev_res0; /* after this update / before the first (n 0: not measured) */
    FILE *metrics;
    char run[4096];
    char adapter[4400]; /* a resumed LoRA run's adapters (checkpoint path) */
    char model_abs[PATH_MAX]; /* the base model's resolved path (trainer_state.json "model") */
    uint64_t base_digest;     /* LoRA: its weights' digest (trainer_state.json "base_digest") */
    int base_digest_set;
    int lock_fd, lock_created;
    size_t pred_grad, pred_fixed;
    int64_t max_prompt; /* the longest id prompt in the data (validation), for the memory check */
    ls_group *eval;     /* [n_eval] held-out groups */
    int64_t n_eval;
    double eval_nll, eval_nll0; /* this update's / before the first update's (NAN: not measured) */
} trainer;

static const ls_comm *tr_comm(const trainer *tr) {
    const ls_comm *c = tr->a->o.fwd.comm;
    return c && ls_comm_size(c) > 1 ? c : NULL;
}

static int tr_rank(const trainer *tr) { return tr_comm(tr) ? ls_comm_rank(tr_comm(tr)) : 0; }

/* Expert parallelism: the ranks holding the other experts (NULL: none). The world is
 * CP × EP; the CP groups' ranks 0 are together one EP group, the one world rank 0 is
 * in (src/cli/main.c: cli_parallel). */
static const ls_comm *tr_ep(const trainer *tr) {
    const ls_comm *e = tr->a->spec.ep;
    return e && ls_comm_size(e) > 1 ? e : NULL;
}

/* World rank 0: the one rank that writes RUN/ and runs the reward process. */
static int tr_root(const trainer *tr) { return tr_rank(tr) == 0 && (!tr_ep(tr) || ls_comm_rank(tr_ep(tr)) == 0); }

/* A progress or status line (with its newline) to the caller's log_fn, else stderr. */
static void say(const trainer *tr, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const trainer *tr, const char *fmt, ...) {
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (tr->a->log_fn) tr->a->log_fn(tr->a->log_user, line);
    else fputs(line, stderr);
}

/* The world rank (trace file names). */
static int tr_world_rank(void) { return ls_comm_world() ? ls_comm_rank(ls_comm_world()) : 0; }

/* bytes from world rank 0 to every rank: over the EP group of the CP groups' ranks 0,
 * then over each CP group. */
static ls_status tr_bcast(const trainer *tr, void *buf, size_t bytes) {
    if (tr_ep(tr) && tr_rank(tr) == 0) LS_TRY(ls_comm_bcast(tr_ep(tr), buf, bytes, 0));
    return tr_comm(tr) ? ls_comm_bcast(tr_comm(tr), buf, bytes, 0) : LS_OK;
}

/* Every line checked before the first update (JSON, fields, ids, G, rewards; text is not
 * tokenized here), so a typo on line 90,000 does not end a run hours in. */
static ls_status validate_data(trainer *tr) {
    double t0 = ls_now();
    /* without a tokenizer text is an error, found here too */
    int flags = (tr->tok ? LS_GROUP_SYNTAX : 0) | (tr->a->rollout ? LS_GROUP_PROMPT_ONLY : tr->a->o.sft ? 0 : LS_GROUP_TRAIN);
    for (int64_t i = 0; i < tr->data.n; i++) {
        char label[4200];
        snprintf(label, sizeof label, "%s:%lld", tr->a->data, (long long)tr->data.lineno[i]);
        ls_group g;
        ls_status s = ls_group_parse_ex(&g, tr->data.buf + tr->data.off[i], label, tr->pol.cfg->vocab, NULL, flags);
        if (s == LS_OK && g.P > tr->max_prompt) tr->max_prompt = g.P; /* id prompts (text: known only when encoded) */
        ls_group_free(&g);
        if (s != LS_OK) return ls_err_ctx(s, "checking the data before training (--no-validate skips this)");
    }
    double dt = ls_now() - t0;
    if (dt > 1.0)
        say(tr, "longstraw train: checked %lld lines of %s in %.1fs\n", (long long)tr->data.n, tr->a->data, dt);
    return LS_OK;
}

/* Stop tokens: --stop (ids or token strings) or the tokenizer's end-of-text tokens. */
static ls_status stop_tokens(trainer *tr) {
    tr->so.stop = tr->stop_ids;
    tr->so.n_stop = 0;
    if (!tr->a->stop) {
        static const char *const eos[] = {"<|endoftext|>", "<|im_end|>"};
        for (int i = 0; i < 2 && tr->tok; i++) {
            int32_t id = ls_tok_token_id(tr->tok, eos[i]);
            if (id >= 0 && id < tr->pol.cfg->vocab) tr->stop_ids[tr->so.n_stop++] = id;
        }
        return LS_OK;
    }
    return ls_stop_tokens_parse(tr->a->stop, tr->tok, tr->pol.cfg->vocab, tr->stop_ids, 16, &tr->so.n_stop);
}

/* SFT on the task: the answer as the question asks for it, ended as a sentence
 * (" 12345."), is the one response: the model learns where the answer stops too (exact
 * match refuses "12345" followed by more digits or names). */
static ls_status task_answer_response(trainer *tr, const ls_task_item *it, ls_group *g) {
    char text[80];
    snprintf(text, sizeof text, " %s.", it->answer);
    int32_t *ids;
    int64_t n;
    LS_TRY(ls_tok_encode(tr->tok, text, strlen(text), &ids, &n));
    g->G = 1;
    g->resp = malloc(sizeof(int32_t *));
    g->R = malloc(sizeof(int64_t));
    if (!g->resp || !g->R) {
        free(ids);
        return LS_ERR_NOMEM;
    }
    g->resp[0] = ids, g->R[0] = n;
    return LS_OK;
}

static ls_status next_group(trainer *tr, int k, ls_group *g) {
    memset(g, 0, sizeof *g);
    if (tr->a->task && !tr->a->data) {
        /* training items: answers from the training part only (task.h), depth uniform */
        ls_status s = ls_task_prompt(&tr->task, tr->tok, tr->a->prompt_len, -1.0, 0, &tr->rng, &tr->items[k], g);
        if (s == LS_OK && tr->a->o.sft) s = task_answer_response(tr, &tr->items[k], g);
        tr->data_pos++;
        return s;
    }
    int64_t i = tr->data_pos % tr->data.n;
    char label[4200];
    snprintf(label, sizeof label, "%s:%lld", tr->a->data, (long long)tr->data.lineno[i]);
    ls_status s = ls_group_parse_ex(g, tr->data.buf + tr->data.off[i], label, tr->pol.cfg->vocab, tr->tok,
                                    tr->a->rollout ? LS_GROUP_PROMPT_ONLY : tr->a->o.sft ? 0 : LS_GROUP_TRAIN);
    if (s == LS_OK && g->P < 2) s = ls_err(LS_ERR_FORMAT, "%s: \"prompt\" needs at least 2 tokens", label);
    if (s == LS_OK && tr->a->rollout && !tr->rcmd && !g->answer)
        s = ls_err(LS_ERR_ARG, "%s: no \"answer\" to reward the rollouts against (or give --reward-cmd)", label);
    tr->data_pos++;
    if (tr->data_pos % tr->data.n == 0) tr->epoch++;
    return s;
}


/* Decode a sampled response; an id the tokenizer does not know (models pad their
 * vocabulary beyond the tokenizer's) becomes U+FFFD instead of an error. */
static ls_status decode_lenient(const ls_tokenizer *tok, const int32_t *ids, int64_t n, char **out, size_t *len) {
    if (ls_tok_decode(tok, ids, n, out, len) == LS_OK) return LS_OK;
    size_t cap = 16 * (size_t)n + 1, k = 0;
    char *buf = malloc(cap);
    if (!buf) return LS_ERR_NOMEM;
    for (int64_t i = 0; i < n; i++) {
        char *piece;
        size_t pl;
        if (ls_tok_decode(tok, ids + i, 1, &piece, &pl) != LS_OK) {
            piece = strdup("\xEF\xBF\xBD");
            pl = 3;
            if (!piece) {
                free(buf);
                return LS_ERR_NOMEM;
            }
        }
        if (k + pl + 1 > cap) {
            cap = 2 * (k + pl + 1);
            char *t = realloc(buf, cap);
            if (!t) {
                free(piece);
                free(buf);
                return LS_ERR_NOMEM;
            }
            buf = t;
        }
        memcpy(buf + k, piece, pl);
        k += pl;
        free(piece);
    }
    buf[k] = 0;
    *out = buf;
    *len = k;
    return LS_OK;
}

/* The held-out groups: --eval-data's lines, or --eval-lines task items drawn from
 * their own seed (the training items' RNG is untouched). */
static ls_status load_eval(trainer *tr) {
    const ls_train_opts *a = tr->a;
    if (!a->eval_data && !a->eval_lines) return LS_OK;
    jsonl d;
    memset(&d, 0, sizeof d);
    if (a->eval_data) LS_TRY(jsonl_open(&d, a->eval_data));
    tr->n_eval = a->eval_data ? d.n : a->eval_lines;
    tr->eval = calloc((size_t)(tr->n_eval > 0 ? tr->n_eval : 1), sizeof *tr->eval);
    ls_status s = tr->eval ? LS_OK : LS_ERR_NOMEM;
    if (s == LS_OK && tr->n_eval == 0) s = ls_err(LS_ERR_FORMAT, "%s: no held-out line", a->eval_data);
    ls_rng keep = tr->rng;
    ls_rng_seed(&tr->rng, (uint64_t)a->seed ^ 0x9e3779b97f4a7c15ull);
    for (int64_t i = 0; i < tr->n_eval && s == LS_OK; i++) {
        ls_group *g = &tr->eval[i];
        if (a->eval_data) {
            char label[4200];
            snprintf(label, sizeof label, "%s:%lld", a->eval_data, (long long)d.lineno[i]);
            s = ls_group_parse_ex(g, d.buf + d.off[i], label, tr->pol.cfg->vocab, tr->tok, 0);
            if (s == LS_OK && g->P < 2) s = ls_err(LS_ERR_FORMAT, "%s: \"prompt\" needs at least 2 tokens", label);
        } else {
            ls_task_item it;
            s = ls_task_prompt(&tr->task, tr->tok, a->prompt_len, -1.0, 1, &tr->rng, &it, g);
            if (s == LS_OK) s = task_answer_response(tr, &it, g);
            ls_task_item_free(&it);
        }
    }
    tr->rng = keep;
    jsonl_free(&d);
    return s;
}

/* Mean NLL per response token of the held-out groups under the current weights. */
static ls_status evaluate(trainer *tr, double *nll) {
    const ls_grpo_opts *o = &tr->a->o;
    ls_score_opts so = {0, o->page_size, o->state_dtype, o->fwd, 0};
    ls_arena *sa = &tr->ar.a[LS_ARENA_SCORE];
    double tot = 0, ntok = 0;
    ls_status s = LS_OK;
    ls_trace_phase_begin("eval");
    for (int64_t k = 0; k < tr->n_eval && s == LS_OK; k++) {
        const ls_group *g = &tr->eval[k];
        ls_arena_mark mk = ls_arena_get_mark(sa);
        float **lp = ls_arena_alloc(sa, (size_t)g->G * sizeof(float *));
        s = lp ? ls_score_group(&tr->pol.p.policy, g, &so, &tr->ar, lp, NULL) : LS_ERR_NOMEM;
        for (int i = 0; i < g->G && s == LS_OK; i++)
            for (int64_t t = 0; t < g->R[i]; t++) tot -= lp[i][t], ntok += 1;
        ls_arena_release(sa, mk);
    }
    ls_trace_phase_end("eval");
    *nll = ntok > 0 ? tot / ntok : NAN;
    return s;
}

/* The held-out task evaluation (eval.h) under the current weights, into *r; rank 0
 * writes it as RUN/eval.json (the newest one: `longstraw report` draws its heat map). */
static ls_status evaluate_task(trainer *tr, ls_eval_result *r) {
    ls_eval_result_free(r);
    if (!tr->ev.num_prompts) return LS_OK;
    LS_TRY(ls_eval_run(&tr->pol.p.policy, tr->tok, &tr->ev, &tr->ar, r));
    if (!tr_root(tr)) return LS_OK;
    char path[4200], what[4200];
    snprintf(path, sizeof path, "%s/eval.json", tr->a->out);
    snprintf(what, sizeof what, "%s after update %lld", tr->a->out, (long long)tr->update + (r == &tr->ev_res));
    char *text = ls_eval_json(r, &tr->ev, what);
    if (!text) return LS_ERR_NOMEM;
    ls_status s = ls_write_file_atomic(path, text, strlen(text));
    free(text);
    return s;
}

/* "held-out exact match 0.750 (16384: 0.750, 32768: 0.500)" */
static const char *eval_line(const trainer *tr, const ls_eval_result *r, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "held-out exact match %.3f", r->exact_match);
    for (int l = 0; l < tr->ev.n_lengths && tr->ev.n_lengths > 1 && n > 0 && (size_t)n < cap; l++)
        n += snprintf(buf + n, cap - (size_t)n, "%s%lld: %.3f%s", l ? ", " : " (", (long long)tr->ev.lengths[l],
                      ls_eval_mean(r, tr->ev.lengths[l], -1, 0, NULL), l + 1 == tr->ev.n_lengths ? ")" : "");
    return buf;
}

/* Expert parallelism: every CP group decoded the group on its own (the same weights,
 * RNG and, through the experts' combine, the same logits), so the samples agree;
 * checked, since the experts' sums mix the EP ranks' rows and a difference (another
 * thread count on one rank) would make the update's data disagree silently. */
static ls_status ep_same_samples(const trainer *tr, const ls_group *g) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < g->G; i++)
        for (int64_t t = 0; t < g->R[i]; t++) h = (h ^ (uint64_t)(uint32_t)g->resp[i][t]) * 1099511628211ull;
    int N = ls_comm_size(tr_ep(tr));
    uint64_t *all = malloc((size_t)N * sizeof *all);
    if (!all) return LS_ERR_NOMEM;
    ls_status s = ls_comm_allgather(tr_ep(tr), &h, all, sizeof h);
    for (int r = 1; r < N && s == LS_OK; r++)
        if (all[r] != all[0])
            s = ls_err(LS_ERR_ARG, "--ep: rank %d of the expert-parallel group sampled other responses than rank 0 "
                                        "(logits differ between ranks: run every rank with the same OMP_NUM_THREADS)", r);
    free(all);
    return s;
}

/* The rollout hook (ls_rollout_hook): G samples from the captured state, then rewards. */
static ls_status rollout(void *ctx, int gi, ls_group *g, const ls_model *policy, const ls_prompt_state *st,
                         ls_arenas *ar) {
    trainer *tr = ctx;
    int G = (int)tr->a->num_generations;
    int64_t maxn = tr->a->max_new_tokens;
    ls_trace_phase_begin("rollout");
    int layers = ls_trace_layers(0);
    ls_progress_begin("rollout", (int64_t)G * maxn);
    g->G = G;
    g->resp = calloc((size_t)G, sizeof(int32_t *));
    g->R = calloc((size_t)G, sizeof(int64_t));
    g->rewards = calloc((size_t)G, sizeof(double));
    float *lp = malloc((size_t)G * (size_t)maxn * sizeof(float));
    float **lps = malloc((size_t)G * sizeof(float *));
    ls_status s = g->resp && g->R && g->rewards && lp && lps ? LS_OK : LS_ERR_NOMEM;
    for (int i = 0; i < G && s == LS_OK; i++) {
        lps[i] = lp + (int64_t)i * maxn;
        if (!(g->resp[i] = malloc((size_t)maxn * sizeof(int32_t)))) s = LS_ERR_NOMEM;
    }
    /* all G members decode together, one batched step per token */
    if (s == LS_OK)
        s = ls_generate_group(policy, st, g->prompt[g->P - 1], G, &tr->so, &tr->rng, g->resp, lps, g->R, &tr->a->o.fwd,
                              &ar->a[LS_ARENA_BRANCH], &ar->a[LS_ARENA_SCRATCH]);
    free(lp);
    free(lps);
    ls_progress_end();
    ls_trace_layers(layers);
    ls_trace_phase_end("rollout");
    if (s != LS_OK) return s;
    /* rewards on the decoded text, by rank 0 (its reward process), sent to every rank */
    ls_trace_phase_begin("reward");
    if (tr_ep(tr)) LS_TRY(ep_same_samples(tr, g));
    if (!tr_root(tr)) {
        s = tr_bcast(tr, g->rewards, (size_t)G * sizeof(double));
        ls_trace_phase_end("reward");
        return s;
    }
    char **text = calloc((size_t)G, sizeof(char *));
    size_t *len = calloc((size_t)G, sizeof(size_t));
    if (!text || !len) s = LS_ERR_NOMEM;
    for (int i = 0; i < G && s == LS_OK; i++) s = decode_lenient(tr->tok, g->resp[i], g->R[i], &text[i], &len[i]);
    int host = tr->rcmd || tr->a->reward_fn; /* rewards from outside: they get text */
    if (s == LS_OK && host && !g->prompt_text) /* id prompts: the process still gets text */
        s = decode_lenient(tr->tok, g->prompt, g->P, &g->prompt_text, &(size_t){0});
    if (s == LS_OK && host) {
        const char *pt = g->prompt_text ? g->prompt_text : "";
        int64_t gid = tr->update * tr->a->groups_per_update + gi;
        s = tr->rcmd ? ls_reward_cmd_score(tr->rcmd, pt, strlen(pt), (const char *const *)text, len, G, gid, g->rewards)
                     : tr->a->reward_fn(tr->a->reward_user, pt, strlen(pt), (const char *const *)text, len, G, gid,
                                        g->rewards);
        for (int i = 0; s == LS_OK && !tr->rcmd && i < G; i++)
            if (!isfinite(g->rewards[i]))
                s = ls_err(LS_ERR_ARG, "the reward function gave %g for response %d of group %lld: rewards must be "
                                       "finite", g->rewards[i], i, (long long)gid);
    } else if (s == LS_OK) {
        for (int i = 0; i < G; i++) {
            const ls_task_item *it = tr->a->data ? NULL : &tr->items[gi];
            g->rewards[i] = it ? ls_task_reward(&tr->task, it, text[i], len[i]) : ls_answer_reward(g->answer, text[i], len[i]);
        }
    }
    if (s == LS_OK && gi == 0 && text) /* one sample per update on the trace, for a human reading it */
        ls_trace_event("sample", "\"update\": %lld, \"reward\": %g, \"tokens\": %lld", (long long)tr->update,
                       g->rewards[0], (long long)g->R[0]);
    for (int i = 0; text && i < G; i++) free(text[i]);
    free(text);
    free(len);
    { /* sent even after a failure here: the other ranks wait for it (cli_fail ends them) */
        ls_status b = tr_bcast(tr, g->rewards, (size_t)G * sizeof(double));
        if (s == LS_OK) s = b;
    }
    ls_trace_phase_end("reward");
    return s;
}

static void zero_grads(trainer *tr) { tr->pol.p.fam->policy_zero_grad(&tr->pol.p); }

/* ---- checkpoints and trainer state ----------------------------------------------------- */

/* A JSON string literal of s (malloc'd; "null" for NULL), or NULL when out of memory. */
static char *json_string(const char *s) {
    if (!s) return strdup("null");
    cJSON *j = cJSON_CreateString(s);
    char *t = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    return t;
}

static int is_weights_name(const char *n) {
    size_t l = strlen(n);
    return l > 12 && !strcmp(n + l - 12, ".safetensors");
}

/* The base model's weights as one digest (files.h's ls_file_digest of each *.safetensors
 * of dir, in name order, with its name and size): a LoRA run's adapters belong to them. */
static ls_status weights_digest(const char *dir, uint64_t *out) {
    char **names;
    size_t n;
    LS_TRY(ls_dir_names(dir, is_weights_name, &names, &n));
    uint64_t h = 0xcbf29ce484222325ull;
    ls_status s = LS_OK;
    for (size_t i = 0; i < n && s == LS_OK; i++) {
        char path[PATH_MAX + 300];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        uint64_t fd = 0;
        int64_t size = 0;
        s = ls_file_digest(path, &fd, &size);
        for (const char *c = names[i]; *c; c++) h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
        h = (h ^ fd) * 0x100000001b3ull;
        h = (h ^ (uint64_t)size) * 0x100000001b3ull;
    }
    ls_dir_names_free(names, n);
    *out = h;
    return s;
}

/* trainer_state.json: where the run is (counters, RNG) and what it trains — the base
 * model's path, its family, the LoRA targets as given (null: the family's default)
 * and the --ep degree — which a resume must not change (check_resume). */
static ls_status write_state(trainer *tr, const char *path) {
    char *model = json_string(tr->model_abs[0] ? tr->model_abs : tr->a->model);
    char *targets = json_string(tr->a->spec.lora_targets);
    char *family = json_string(tr->pol.p.fam->name);
    const ls_comm *ep = tr->a->spec.ep;
    char *buf = NULL;
    size_t blen = 0;
    FILE *f = model && targets && family ? open_memstream(&buf, &blen) : NULL;
    if (!f) {
        free(model), free(targets), free(family);
        return LS_ERR_NOMEM;
    }
    fprintf(f, "{\n  \"format\": 1,\n  \"update\": %lld,\n  \"data_position\": %lld,\n  \"epoch\": %lld,\n"
               "  \"adam_step\": %lld,\n  \"rng\": [\"%016" PRIx64 "\", \"%016" PRIx64 "\", \"%016" PRIx64 "\", \"%016" PRIx64 "\"],\n"
               "  \"model\": %s,\n  \"family\": %s,\n  \"lora_targets\": %s,\n  \"ep\": %d",
            (long long)tr->update, (long long)tr->data_pos, (long long)tr->epoch, (long long)tr->pol.adam.step,
            tr->rng.s[0], tr->rng.s[1], tr->rng.s[2], tr->rng.s[3], model, family, targets, ep ? ls_comm_size(ep) : 1);
    /* LoRA: the base weights the adapters were trained on, which a resume must find again */
    if (tr->pol.p.adapters && tr->base_digest_set) fprintf(f, ",\n  \"base_digest\": \"%016" PRIx64 "\"", tr->base_digest);
    fprintf(f, "\n}\n");
    free(model), free(targets), free(family);
    return ls_write_memstream(path, f, &buf, &blen);
}

static ls_status state_int(const cJSON *root, const char *path, const char *field, int64_t *out) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, field);
    if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 9e15)
        return ls_err(LS_ERR_FORMAT, "%s: field \"%s\" must be a non-negative integer", path, field);
    *out = (int64_t)e->valuedouble;
    return LS_OK;
}

/* A checkpoint's trainer_state.json. The fields after rng are absent in checkpoints
 * written before they were recorded: then model/family are "", ep 0, has_targets 0. */
typedef struct {
    int64_t update, data_pos, epoch, adam_step;
    uint64_t rng[4];
    char model[PATH_MAX], family[64], targets[1024];
    int has_targets, targets_default; /* "lora_targets" present; null (the default) */
    int64_t ep;
    char base_digest[32]; /* "" in checkpoints from before it was recorded */
} ckpt_state;

static ls_status state_str(const cJSON *root, const char *path, const char *field, char *out, size_t cap,
                           int *present, int *is_null) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, field);
    out[0] = 0;
    if (present) *present = e != NULL;
    if (is_null) *is_null = cJSON_IsNull(e);
    if (!e || (is_null && cJSON_IsNull(e))) return LS_OK;
    if (!cJSON_IsString(e) || strlen(e->valuestring) >= cap)
        return ls_err(LS_ERR_FORMAT, "%s: field \"%s\" must be a string (below %zu bytes)", path, field, cap);
    snprintf(out, cap, "%s", e->valuestring);
    return LS_OK;
}

/* Parse DIR/trainer_state.json of checkpoint-<expect>: its "update" must be expect —
 * a state that disagrees with its directory's name is refused, naming both, rather than
 * trusted (it would skip or repeat updates). */
static ls_status parse_state(const char *dir, int64_t expect, ckpt_state *st) {
    char path[4200];
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    memset(st, 0, sizeof *st);
    cJSON *root;
    LS_TRY(read_json(path, 0, &root));
    ls_status s = state_int(root, path, "update", &st->update);
    if (s == LS_OK && st->update != expect)
        s = ls_err(LS_ERR_FORMAT, "%s: \"update\" is %lld but its directory is checkpoint-%lld (the state after %lld "
                                  "updates): the checkpoint disagrees with itself; refusing to resume from it (move it "
                                  "away to resume from an earlier checkpoint)", path, (long long)st->update,
                   (long long)expect, (long long)expect);
    if (s == LS_OK) s = state_int(root, path, "data_position", &st->data_pos);
    if (s == LS_OK) s = state_int(root, path, "epoch", &st->epoch);
    if (s == LS_OK) s = state_int(root, path, "adam_step", &st->adam_step);
    const cJSON *rng = cJSON_GetObjectItemCaseSensitive(root, "rng");
    for (int i = 0; s == LS_OK && i < 4; i++) {
        const cJSON *e = cJSON_GetArrayItem(rng, i);
        char *end = NULL;
        errno = 0;
        if (cJSON_IsString(e)) st->rng[i] = strtoull(e->valuestring, &end, 16);
        if (!cJSON_IsString(e) || !end || *end || end == e->valuestring || errno)
            s = ls_err(LS_ERR_FORMAT, "%s: field \"rng\"[%d] must be a hex string", path, i);
    }
    if (s == LS_OK && !(st->rng[0] | st->rng[1] | st->rng[2] | st->rng[3]))
        s = ls_err(LS_ERR_FORMAT, "%s: field \"rng\" is all zeros, a state the generator never leaves (it would draw "
                                  "the same value forever): the file was damaged or edited; refusing to resume from it",
                   path);
    if (s == LS_OK) s = state_str(root, path, "model", st->model, sizeof st->model, NULL, NULL);
    if (s == LS_OK) s = state_str(root, path, "family", st->family, sizeof st->family, NULL, NULL);
    if (s == LS_OK)
        s = state_str(root, path, "lora_targets", st->targets, sizeof st->targets, &st->has_targets, &st->targets_default);
    if (s == LS_OK) s = state_str(root, path, "base_digest", st->base_digest, sizeof st->base_digest, NULL, NULL);
    if (s == LS_OK && cJSON_GetObjectItemCaseSensitive(root, "ep")) {
        s = state_int(root, path, "ep", &st->ep);
        if (s == LS_OK && st->ep < 1) s = ls_err(LS_ERR_FORMAT, "%s: field \"ep\" must be >= 1", path);
    }
    cJSON_Delete(root);
    return s;
}

static ls_status read_state(trainer *tr, const char *dir, int64_t expect, int64_t *adam_step) {
    ckpt_state st;
    LS_TRY(parse_state(dir, expect, &st));
    tr->update = st.update;
    tr->data_pos = st.data_pos;
    tr->epoch = st.epoch;
    *adam_step = st.adam_step;
    for (int i = 0; i < 4; i++) tr->rng.s[i] = st.rng[i];
    return LS_OK;
}

/* ---- what a resume may not change ---------------------------------------------------- */

/* 1 when the comma-separated lists a and b name the same set (order and repeats aside). */
static int same_names(const char *a, const char *b) {
    for (int pass = 0; pass < 2; pass++) {
        const char *x = pass ? b : a, *y = pass ? a : b;
        for (const char *p = x; *p;) {
            size_t n = strcspn(p, ",");
            int found = 0;
            for (const char *q = y; *q && !found;) {
                size_t m = strcspn(q, ",");
                found = m == n && !strncmp(p, q, n);
                q += m + (q[m] == ',');
            }
            if (!found && n > 0) return 0;
            p += n + (p[n] == ',');
        }
    }
    return 1;
}

/* The first field in which two model configs differ, as "field A vs B", into out;
 * 0 when they describe the same model. */
static int config_diff(const ls_config *x, const ls_config *y, char *out, size_t cap) {
#define CMP_I(f, key)                                                                                    \
    if (x->f != y->f) return snprintf(out, cap, "%s %lld vs %lld", key, (long long)x->f, (long long)y->f), 1
    if (strcmp(x->model_type, y->model_type))
        return snprintf(out, cap, "model_type %s vs %s", x->model_type, y->model_type), 1;
    if (x->family != y->family)
        return snprintf(out, cap, "family %s vs %s", x->family ? x->family->name : "none",
                        y->family ? y->family->name : "none"), 1;
    CMP_I(vocab, "vocab_size");
    CMP_I(hidden, "hidden_size");
    CMP_I(n_layers, "num_hidden_layers");
    CMP_I(n_heads, "num_attention_heads");
    CMP_I(n_kv, "num_key_value_heads");
    CMP_I(head_dim, "head_dim");
    CMP_I(intermediate, "intermediate_size");
    CMP_I(n_experts, "experts");
    CMP_I(moe_inter, "moe_intermediate_size");
    CMP_I(shared_inter, "shared expert width");
    CMP_I(tie_embeddings, "tie_word_embeddings");
#undef CMP_I
    for (int64_t l = 0; l < x->n_layers && l < LS_MAX_LAYERS; l++)
        if (x->kind[l] != y->kind[l] || x->moe[l] != y->moe[l])
            return snprintf(out, cap, "layer %lld's kind", (long long)l), 1;
    if (memcmp(x, y, sizeof *x)) return snprintf(out, cap, "another field of config.json"), 1;
    return 0;
}

/* The run's --model as RUN/args.json saved it (the last one given; resolved), for
 * checkpoints written before trainer_state.json recorded it; "" when not found. */
static ls_status saved_model(const char *run, char *out, size_t cap) {
    char path[4200];
    snprintf(path, sizeof path, "%s/args.json", run);
    out[0] = 0;
    if (access(path, F_OK) != 0) return LS_OK;
    cJSON *arr;
    LS_TRY(read_json(path, 1, &arr));
    const char *model = NULL;
    for (int i = 0; i + 1 < cJSON_GetArraySize(arr); i++) {
        const cJSON *f = cJSON_GetArrayItem(arr, i), *v = cJSON_GetArrayItem(arr, i + 1);
        if (cJSON_IsString(f) && cJSON_IsString(v) && !strcmp(f->valuestring, "--model")) model = v->valuestring;
        if (cJSON_IsString(f) && !strncmp(f->valuestring, "--model=", 8)) model = f->valuestring + 8;
    }
    char abs[PATH_MAX];
    if (model) snprintf(out, cap, "%s", realpath(model, abs) ? abs : model);
    cJSON_Delete(arr);
    return LS_OK;
}

/* A resume continues the run it finds: refused, naming both values, before anything in
 * RUN/ is written, when the options would train something else — another base model
 * (path or config), family, LoRA rank, alpha or targets, full fine-tune vs LoRA, or
 * --ep degree — or when the checkpoint disagrees with itself (parse_state). Before
 * this, such a resume ran, wrote checkpoints whose config.json did not match their
 * weights and pruned the good ones. */
static ls_status check_resume(trainer *tr, const char *ckpt, int64_t last) {
    const ls_train_opts *a = tr->a;
    ckpt_state st;
    LS_TRY(parse_state(ckpt, last, &st));
    char path[4400], diff[256];
    /* the base model: the run's own (its recorded path), with the checkpoint's config */
    if (!realpath(a->model, tr->model_abs)) return ls_err(LS_ERR_IO, "--model %s: %s", a->model, strerror(errno));
    if (!st.model[0]) LS_TRY(saved_model(a->out, st.model, sizeof st.model)); /* a checkpoint from before "model" */
    if (st.model[0] && strcmp(st.model, tr->model_abs))
        return ls_err(LS_ERR_ARG, "%s trains --model %s, but this resume gives --model %s: a resume continues the run's "
                                  "own model (train another in a new run, with another --out)", a->out, st.model,
                      tr->model_abs);
    ls_config given, saved;
    snprintf(path, sizeof path, "%s/config.json", a->model);
    LS_TRY(ls_config_load(&given, path));
    const ls_family *fam = ls_family_for(&given, path);
    if (!fam) return LS_ERR_UNSUPPORTED;
    if (st.family[0] && strcmp(st.family, fam->name))
        return ls_err(LS_ERR_ARG, "%s trains a model of the %s family, but --model %s is of the %s family (%s)", a->out,
                      st.family, a->model, fam->name, given.model_type);
    snprintf(path, sizeof path, "%s/config.json", ckpt); /* full fine-tunes carry it */
    if (access(path, F_OK) == 0) {
        LS_TRY(ls_config_load(&saved, path));
        if (config_diff(&saved, &given, diff, sizeof diff))
            return ls_err(LS_ERR_ARG, "%s holds another model than --model %s: %s (checkpoint vs --model); a resume "
                                      "continues the run's own model", ckpt, a->model, diff);
    }
    /* what is trained: every weight, or the checkpoint's adapters (rank, alpha, targets) */
    int lora = a->spec.adapter || a->spec.lora_rank > 0;
    snprintf(path, sizeof path, "%s/adapter_config.json", ckpt);
    int saved_lora = access(path, F_OK) == 0;
    if (saved_lora != lora)
        return ls_err(LS_ERR_ARG, "%s holds %s, but this resume trains %s: a resume trains what the run trains", ckpt,
                      saved_lora ? "LoRA adapters (adapter_config.json)" : "every weight (a full fine-tune)",
                      lora ? "LoRA adapters (--lora-rank / --adapter)" : "every weight (no --lora-rank)");
    if (saved_lora && st.base_digest[0] && tr->base_digest_set) {
        char now[32];
        snprintf(now, sizeof now, "%016" PRIx64, tr->base_digest);
        if (strcmp(now, st.base_digest))
            return ls_err(LS_ERR_ARG, "%s: the base model's weights at %s are not those the run's adapters were trained "
                                      "on (\"base_digest\" %s in %s/trainer_state.json, %s now): they were replaced; a resume "
                                      "continues on the same base weights", a->out, tr->model_abs, st.base_digest,
                          ckpt, now);
    }
    if (saved_lora) {
        cJSON *ac;
        LS_TRY(read_json(path, 0, &ac));
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(ac, "r"), *al = cJSON_GetObjectItemCaseSensitive(ac, "lora_alpha");
        const cJSON *tm = cJSON_GetObjectItemCaseSensitive(ac, "target_modules"), *e;
        char mods[1024] = "";
        size_t off = 0;
        cJSON_ArrayForEach(e, tm) {
            if (cJSON_IsString(e) && off < sizeof mods)
                off += (size_t)snprintf(mods + off, sizeof mods - off, "%s%s", off ? "," : "", e->valuestring);
        }
        ls_status s = LS_OK;
        if (!cJSON_IsNumber(r) || !cJSON_IsNumber(al))
            s = ls_err(LS_ERR_FORMAT, "%s: \"r\" and \"lora_alpha\" must be numbers", path);
        else if (a->spec.lora_rank > 0 && (double)a->spec.lora_rank != r->valuedouble)
            s = ls_err(LS_ERR_ARG, "%s: the run's adapters have rank %g, but this resume gives --lora-rank %lld: a resume "
                                   "continues the run's adapters", path, r->valuedouble, (long long)a->spec.lora_rank);
        else if (!(fabs(a->spec.lora_alpha - al->valuedouble) <= 1e-9 * fabs(al->valuedouble)))
            s = ls_err(LS_ERR_ARG, "%s: the run's adapters have lora_alpha %g, but this resume gives --lora-alpha %g: a "
                                   "resume continues the run's adapters", path, al->valuedouble, a->spec.lora_alpha);
        else if (st.has_targets && (st.targets_default != !a->spec.lora_targets ||
                                    (a->spec.lora_targets && !same_names(st.targets, a->spec.lora_targets))))
            s = ls_err(LS_ERR_ARG, "%s adapts --lora-targets %s, but this resume gives --lora-targets %s: a resume "
                                   "continues the run's adapters", a->out, st.targets_default ? "(the default)" : st.targets,
                       a->spec.lora_targets ? a->spec.lora_targets : "(the default)");
        else if (!st.has_targets && a->spec.lora_targets && !same_names(mods, a->spec.lora_targets))
            s = ls_err(LS_ERR_ARG, "%s: the run's adapters are on %s, but this resume gives --lora-targets %s: a resume "
                                   "continues the run's adapters", path, mods, a->spec.lora_targets);
        cJSON_Delete(ac);
        LS_TRY(s);
    }
    /* expert parallelism: the optimizer file's layout follows it */
    int ep = a->spec.ep ? ls_comm_size(a->spec.ep) : 1;
    if (st.ep > 0 && st.ep != ep)
        return ls_err(LS_ERR_ARG, "%s was saved with --ep %lld (the routed experts split over %lld ranks), but this resume "
                                  "has --ep %d: resume it with --ep %lld, under mpirun -np <a multiple of %lld> (ranks = "
                                  "CP x EP)", ckpt, (long long)st.ep, (long long)st.ep, ep, (long long)st.ep,
                      (long long)st.ep);
    return LS_OK;
}

/* Test hook: LONGSTRAW_TEST_CHECKPOINT_PAUSE_MS=N sleeps N ms after each file of a
 * checkpoint, so a test can SIGKILL the writer in the middle (tests/test_train.c). */
static void test_pause(void) {
    const char *e = getenv("LONGSTRAW_TEST_CHECKPOINT_PAUSE_MS");
    long ms = e ? strtol(e, NULL, 10) : 0;
    if (ms > 0 && ms < 600000) usleep((useconds_t)ms * 1000);
}

static ls_status save_checkpoint(trainer *tr) {
    /* world rank 0 alone writes RUN/; with --ep the other ranks of its EP group (the CP
     * groups' ranks 0) send it their experts and their moments */
    if (tr_rank(tr) != 0) return LS_OK;
    int root = tr_root(tr);
    char tmp[4200], dir[4200], path[4400];
    double t0 = ls_now();
    ls_trace_phase_begin("checkpoint");
    ls_status s = root ? ls_ckpt_begin(tr->run, tr->update, tmp, sizeof tmp) : LS_OK;
    ls_policy_spec sp = tr->pol.spec;
    sp.model_dir = tr->a->model; /* config.json from the run's model (a resumed policy may come from a checkpoint) */
    /* collective under --ep: called on every rank of the group, a path on the writer
     * while nothing failed (none: the others learn it and nothing is gathered) */
    int write = root && s == LS_OK;
    ls_status w = tr->pol.p.fam->policy_save(&tr->pol.p, &sp, write ? tmp : NULL);
    if (s == LS_OK) s = w;
    test_pause();
    write = root && s == LS_OK;
    snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp);
    w = ls_optim_save(tr->pol.p.be, write ? path : NULL, tr->pol.adam.m, tr->pol.adam.v, tr->pol.adam.n, tr->pol.adam.step,
                      tr->pol.p.adapters, tr->pol.p.sharded, tr_ep(tr));
    if (s == LS_OK) s = w;
    if (!root) {
        ls_trace_phase_end("checkpoint");
        return s;
    }
    test_pause();
    snprintf(path, sizeof path, "%s/trainer_state.json", tmp);
    if (s == LS_OK) s = write_state(tr, path); /* last: the commit point is the rename below */
    if (s == LS_OK) s = ls_ckpt_commit(tr->run, tr->update, tmp, dir, sizeof dir);
    if (s == LS_OK) s = ls_ckpt_prune(tr->run, (int)tr->a->save_total_limit);
    ls_trace_phase_end("checkpoint");
    if (s == LS_OK) {
        ls_trace_event("checkpoint", "\"update\": %lld, \"path\": \"checkpoint-%lld\", \"s\": %.3f", (long long)tr->update,
                       (long long)tr->update, ls_now() - t0);
        say(tr, "  checkpoint %s (%.1fs)\n", dir, ls_now() - t0);
    }
    return s;
}

/* Keep the metrics of updates [0, upto) only: a resumed run rewrites what came after
 * its checkpoint. The file is rewritten atomically. */
static ls_status trim_metrics(const char *path, int64_t upto) {
    char *text = NULL;
    size_t len = 0;
    if (access(path, F_OK) != 0) return LS_OK;
    LS_TRY(ls_read_file(path, &text, &len));
    size_t keep = 0;
    for (size_t i = 0; i < len;) {
        size_t j = i;
        while (j < len && text[j] != '\n') j++;
        if (j == len) break; /* a cut last line */
        long long u = -1;
        const char *k = strstr(text + i, "\"update\": ");
        if (k && k < text + j) u = strtoll(k + 10, NULL, 10);
        if (u < 0 || u >= upto) break;
        keep = j + 1;
        i = j + 1;
    }
    ls_status s = keep == len ? LS_OK : ls_write_file_atomic(path, text, keep);
    free(text);
    return s;
}

static void json_metric(FILE *f, const char *k, double v) {
    if (isfinite(v)) fprintf(f, ", \"%s\": %.8g", k, v);
    else fprintf(f, ", \"%s\": null", k);
}
static void put_metric(void *f, const char *k, double v) { json_metric(f, k, v); }

/* eval/exact_match and eval/score over every held-out prompt, and per length
 * eval/exact_match/<L> (each with `suffix` "_before": the evaluation before the first
 * update). */
static void eval_metrics(const trainer *tr, FILE *f, const ls_eval_result *r, const char *suffix) {
    if (!r->n) return;
    char key[96];
    snprintf(key, sizeof key, "eval/exact_match%s", suffix);
    json_metric(f, key, r->exact_match);
    snprintf(key, sizeof key, "eval/score%s", suffix);
    json_metric(f, key, r->score);
    for (int l = 0; l < tr->ev.n_lengths; l++) {
        snprintf(key, sizeof key, "eval/exact_match/%lld%s", (long long)tr->ev.lengths[l], suffix);
        json_metric(f, key, ls_eval_mean(r, tr->ev.lengths[l], -1, 0, NULL));
    }
}

static void write_metrics(trainer *tr, const ls_grpo_metrics *mt, double step_time, const ls_group *g, int n) {
    if (!tr->metrics) return; /* not rank 0 */
    int64_t ptok = 0, pmax = 0;
    for (int k = 0; k < n; k++) {
        ptok += g[k].P;
        pmax = g[k].P > pmax ? g[k].P : pmax;
    }
    FILE *f = tr->metrics;
    fprintf(f, "{\"update\": %lld, \"step\": %lld", (long long)tr->update, (long long)tr->pol.adam.step);
    ls_grpo_metrics_each(mt, 0, tr->a->o.aux_loss_coef > 0 ? tr->pol.p.fam->aux_loss : NULL, put_metric, f);
    json_metric(f, "learning_rate", tr->a->o.lr);
    json_metric(f, "step_time", step_time);
    if (!isnan(tr->eval_nll)) json_metric(f, "eval/nll", tr->eval_nll);
    if (!isnan(tr->eval_nll0)) json_metric(f, "eval/nll_before", tr->eval_nll0);
    eval_metrics(tr, f, &tr->ev_res, "");
    eval_metrics(tr, f, &tr->ev_res0, "_before");
    fprintf(f, ", \"num_sequences\": %d, \"prompt_tokens\": %lld, \"max_prompt_tokens\": %lld, \"epoch\": %lld, \"data_position\": %lld, "
               "\"skipped\": %s, \"time\": {\"capture\": %.4f, \"rollout\": %.4f, \"reference\": %.4f, "
               "\"score\": %.4f, \"replay\": %.4f, \"sweep\": %.4f, \"optimize\": %.4f}}\n",
            mt->n_seq, (long long)ptok, (long long)pmax, (long long)tr->epoch, (long long)tr->data_pos, mt->skipped ? "true" : "false",
            mt->t_capture, mt->t_rollout, mt->t_ref, mt->t_score, mt->t_replay, mt->t_sweep, mt->t_optim);
    fflush(f);
    fsync(fileno(f));
}

static void trace_update_end(trainer *tr, const ls_group *g, const ls_grpo_metrics *mt) {
    if (!ls_trace_on()) return;
    ls_state_plan_t plan;
    const ls_comm *cp = tr_comm(tr);
    tr->pol.p.fam->state_plan(&plan, tr->pol.cfg, g->P, tr->a->o.page_size, tr->a->o.state_dtype, cp ? ls_comm_size(cp) : 1,
                               tr->a->o.fwd.cp_layout, ls_grpo_sweep_chunk(&tr->a->o));
    char R[512];
    int off = 0;
    for (int i = 0; i < g->G && off < (int)sizeof R - 24; i++) off += snprintf(R + off, sizeof R - (size_t)off, "%s%lld", i ? ", " : "", (long long)g->R[i]);
    const ls_arenas *ar = &tr->ar;
    ls_trace_event("update_end",
                   "\"update\": %lld, \"P\": %lld, \"G\": %d, \"R\": [%s], \"predicted\": {\"prompt\": %zu, \"grad\": %zu, "
                   "\"fixed\": %zu}, \"measured\": {\"prompt\": %zu, \"grad\": %zu, \"fixed\": %zu, \"branch\": %zu, "
                   "\"score\": %zu, \"scratch\": %zu}, \"rss\": %zu",
                   (long long)tr->update, (long long)g->P, g->G, R, tr->a->o.no_capture ? (size_t)0 : plan.total_bytes_per_rank,
                   tr->pred_grad, tr->pred_fixed, mt->prompt_bytes, ar->a[LS_ARENA_GRAD].peak,
                   ar->a[LS_ARENA_FIXED].peak, ar->a[LS_ARENA_BRANCH].peak, ar->a[LS_ARENA_SCORE].peak,
                   ar->a[LS_ARENA_SCRATCH].peak, ls_peak_rss_bytes());
}

/* Everything before the first update: check flags, open files, load or resume. */
static ls_status setup(trainer *tr) {
    int argc = tr->a->argc;
    char **argv = tr->a->argv;
    ls_train_opts *a = tr->a;
    snprintf(tr->run, sizeof tr->run, "%s", a->out);
    /* under CP rank 0 alone writes RUN/ (lock, args, checkpoints, metrics, receipt);
     * every rank reads the checkpoint it resumes from and writes its own trace */
    int root = tr_root(tr);
    int64_t last = -1;
    char ckpt[4200] = "";
    LS_TRY(ls_grpo_opts_check(&a->o)); /* before RUN/ is made */
    if (root) {
        LS_TRY(ls_make_dir(a->out));
        LS_TRY(lock_run(a->out, &tr->lock_fd, &tr->lock_created)); /* before anything in RUN/ is touched */
        LS_TRY(ls_ckpt_latest(a->out, &last, ckpt, sizeof ckpt));
        if (!a->resume && last >= 0)
            return ls_err(LS_ERR_ARG, "%s already holds %s: continue it with --resume %s, or choose another --out",
                          a->out, ckpt, a->out);
        if (a->resume && last < 0)
            say(tr, "longstraw train: %s has no checkpoint yet: starting from the beginning\n", a->out);
        /* a resume that would train something else is refused before RUN/ is written */
        if (a->spec.adapter || a->spec.lora_rank > 0) { /* the base weights the adapters are trained on */
            LS_TRY(weights_digest(a->model, &tr->base_digest));
            tr->base_digest_set = 1;
        }
        if (last >= 0) LS_TRY(check_resume(tr, ckpt, last));
        else if (!realpath(a->model, tr->model_abs)) tr->model_abs[0] = 0; /* the loader names it */
    }
    /* the checkpoint to resume from, as rank 0 found it */
    LS_TRY(tr_bcast(tr, &last, sizeof last));
    LS_TRY(tr_bcast(tr, ckpt, sizeof ckpt));
    char path[4400];
    snprintf(path, sizeof path, "%s/trace.%d.jsonl", a->out, tr_world_rank());
    LS_TRY(ls_trace_open(path, tr_world_rank(), &tr->ar, "train"));
    ls_trace_phase_begin("load");
    /* weights: the checkpoint's (full fine-tune) or the base + the checkpoint's adapters */
    const char *model = a->model;
    if (last >= 0 && !a->spec.adapter && !a->spec.lora_rank) model = ckpt;
    if (last >= 0 && (a->spec.adapter || a->spec.lora_rank)) {
        snprintf(tr->adapter, sizeof tr->adapter, "%s/adapter_model.safetensors", ckpt);
        a->spec.adapter = tr->adapter;
        a->spec.lora_rank = 0;
    }
    ls_policy_spec spec = a->spec;
    spec.model_dir = model;
    LS_TRY(ls_trainable_open(&tr->pol, &spec, 1, &tr->ar));
    tr->pol.p.fam->policy_predict(&tr->pol.p, 1, &tr->pred_grad, &tr->pred_fixed);
    ls_rng_seed(&tr->rng, (uint64_t)a->seed);
    if (last >= 0) {
        int64_t state_step = 0, step = 0;
        LS_TRY(read_state(tr, ckpt, last, &state_step));
        snprintf(path, sizeof path, "%s/optimizer.safetensors", ckpt);
        LS_TRY(ls_optim_load(tr->pol.p.be, path, tr->pol.adam.m, tr->pol.adam.v, tr->pol.adam.n, &step, tr->pol.p.adapters,
                             tr->pol.p.sharded, tr_ep(tr)));
        if (step != state_step)
            return ls_err(LS_ERR_FORMAT, "%s: optimizer step %lld, but %s/trainer_state.json says \"adam_step\": %lld: the "
                                         "checkpoint disagrees with itself", path, (long long)step, ckpt,
                          (long long)state_step);
        tr->pol.adam.step = step;
        if (root) say(tr, "longstraw train: resumed from %s (update %lld, data position %lld, optimizer step %lld)\n", ckpt,
                (long long)tr->update, (long long)tr->data_pos, (long long)step);
    }
    /* tokenizer: given, or plain bytes for the built-in task */
    if (a->tokenizer || a->task) LS_TRY(ls_tok_load_for_model(&tr->tok, a->tokenizer, tr->pol.cfg->vocab));
    if (a->data) LS_TRY(jsonl_open(&tr->data, a->data));
    if (a->data && !a->no_validate) LS_TRY(validate_data(tr));
    if (a->task) LS_TRY(ls_task_parse(&tr->task, a->task, a->haystack));
    if (a->task && a->eval_prompts) { /* held-out task prompts, greedy, every eval_every updates */
        ls_eval_opts_default(&tr->ev);
        tr->ev.task = tr->task;
        tr->ev.num_prompts = a->eval_prompts;
        tr->ev.seed = (uint64_t)a->seed;
        tr->ev.lengths[0] = a->prompt_len;
        if (a->eval_prompt_len) LS_TRY(ls_eval_parse_lengths(&tr->ev, a->eval_prompt_len));
        tr->ev.so.page_size = a->o.page_size;
        tr->ev.so.state_dtype = a->o.state_dtype;
        tr->ev.so.fwd = a->o.fwd;
        tr->ev.so.fwd.temperature = 1;
    }
    LS_TRY(load_eval(tr));
    /* refuse a prompt that cannot fit before anything sized by it is allocated */
    if (!a->force) LS_TRY(ls_check_fits(&tr->pol, &a->o, a->task && !a->data ? a->prompt_len : tr->max_prompt, 1));
    for (int l = 0; !a->force && tr->ev.num_prompts && l < tr->ev.n_lengths; l++) /* the held-out prompts too */
        LS_TRY(ls_check_fits(&tr->pol, &a->o, tr->ev.lengths[l], 1));
    if (!a->updates) a->updates = a->data ? (tr->data.n + a->groups_per_update - 1) / a->groups_per_update : 10;
    if (a->reward_cmd && root) { /* one reward process: rank 0's, its rewards broadcast */
        LS_TRY(ls_reward_cmd_start(&tr->rcmd, a->reward_cmd));
        LS_TRY(ls_reward_cmd_set_timeout(tr->rcmd, a->reward_timeout));
        ls_rt_get()->reward_pgid = ls_reward_cmd_pgid(tr->rcmd);
    }
    ls_sample_opts_default(&tr->so);
    tr->so.temperature = a->o.fwd.temperature;
    tr->so.top_p = (float)a->top_p;
    tr->so.max_new_tokens = a->max_new_tokens;
    if (a->rollout) LS_TRY(stop_tokens(tr));
    /* dr_grpo normalises by the completion-length limit (TRL's max_completion_length):
     * with rollouts that is --max-new-tokens unless given */
    if (a->rollout && a->o.loss == LS_LOSS_DR_GRPO && a->o.max_completion_length == 0)
        a->o.max_completion_length = a->max_new_tokens;
    tr->items = calloc((size_t)a->groups_per_update, sizeof *tr->items);
    if (!tr->items) return LS_ERR_NOMEM;
    if (a->task && !a->data) { /* a length the task cannot make is refused now, before RUN/ is written */
        for (int l = -1; l < (tr->ev.num_prompts ? tr->ev.n_lengths : 0); l++) {
            ls_status ps = ls_task_check_length(&tr->task, tr->tok, l < 0 ? a->prompt_len : tr->ev.lengths[l], l >= 0,
                                                &tr->rng);
            if (ps != LS_OK) {
                char why[1024];
                snprintf(why, sizeof why, "%s", ls_err_msg());
                return ls_err(ps, "%s: %s", l < 0 ? "--prompt-len" : "--eval-prompt-len", why);
            }
        }
    }
    snprintf(path, sizeof path, "%s/metrics.jsonl", a->out);
    if (root) {
        /* everything is loaded and checked: only now is RUN/ written (a refused resume
         * leaves args.json, metrics and checkpoints as they were) */
        if (argc > 0) LS_TRY(save_args(a->out, argc, argv));
        LS_TRY(trim_metrics(path, tr->update));
        int mfd;
        LS_TRY(ls_open_in_place(path, O_WRONLY | O_APPEND, &mfd)); /* never through a symbolic link */
        if (!(tr->metrics = fdopen(mfd, "a"))) {
            close(mfd);
            return ls_err(LS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        }
    }
    ls_trace_phase_end("load");
    return ls_trace_status();
}

ls_status ls_train_run(const ls_train_opts *opts, ls_train_result *res) {
    memset(res, 0, sizeof *res);
    ls_train_opts own = *opts;
    ls_train_opts *a = &own;
    trainer trs, *tr = &trs;
    memset(tr, 0, sizeof *tr);
    tr->a = a;
    tr->lock_fd = -1;
    ls_arenas_init(&tr->ar);
    const ls_backend *be = NULL;
    ls_status s = ls_backend_open(a->backend, &be);
    if (s == LS_OK) ls_arenas_set_backend(&tr->ar, be);
    if (s == LS_OK) s = setup(tr);
    if (s != LS_OK) { /* refused: RUN/ as it was (the trace's lines of this attempt, a .lock made here) */
        ls_trace_abandon();
        if (tr->lock_created && tr->lock_fd >= 0) {
            char lp[4200];
            snprintf(lp, sizeof lp, "%s/.lock", a->out);
            unlink(lp);
        }
    } else if (tr->lock_fd >= 0) {
        lock_note_pid(tr->lock_fd);
    }
    ls_group *groups = calloc((size_t)a->groups_per_update, sizeof(ls_group));
    if (s == LS_OK && !groups) s = LS_ERR_NOMEM;
    ls_rollout_hook hook = {rollout, tr};
    ls_grpo_metrics mt;
    memset(&mt, 0, sizeof mt);
    int skipped = 0;
    int64_t first = tr->update;
    int root = tr_root(tr);
    if (s == LS_OK && tr->update >= a->updates && root)
        say(tr, "longstraw train: %lld updates already done (--updates %lld): nothing to do\n",
                (long long)tr->update, (long long)a->updates);
    int64_t saved = tr->update; /* updates the newest checkpoint holds */
    tr->eval_nll = tr->eval_nll0 = NAN;
    if (s == LS_OK && tr->n_eval && tr->update < a->updates) { /* where this run starts from */
        s = evaluate(tr, &tr->eval_nll0);
        if (s == LS_OK && root) say(tr, "held-out NLL %.4f per token before update %lld\n", tr->eval_nll0, (long long)tr->update + 1);
    }
    if (s == LS_OK && tr->ev.num_prompts && tr->update < a->updates) {
        s = evaluate_task(tr, &tr->ev_res0);
        char line[512];
        if (s == LS_OK && root) say(tr, "%s before update %lld\n", eval_line(tr, &tr->ev_res0, line, sizeof line), (long long)tr->update + 1);
    }
    int halted = 0; /* a stop before the first update: nothing to do, nothing lost */
    if (s != LS_OK && ls_stop_requested()) {
        if (root)
            say(tr, "longstraw train: stopped by signal %d in the held-out evaluation before update %lld; "
                            "nothing was changed (%s)\n", ls_stop_requested(), (long long)tr->update + 1,
                    tr->update > 0 ? "continue with --resume" : "run the command again");
        s = LS_OK, halted = 1;
    }
    int big = 0;                /* the group with the longest prompt, for receipts */
    for (; s == LS_OK && !halted && tr->update < a->updates; tr->update++) {
        double t0 = ls_now();
        ls_trace_set_update(tr->update);
        /* per-layer events cost a line per layer per member and chunk: keep the trace
         * bounded on long runs */
        ls_trace_layers(a->trace_layers < 0 || tr->update - first < a->trace_layers);
        /* what this update consumes, to give it back if it fails before its step */
        int64_t pos0 = tr->data_pos, epoch0 = tr->epoch, step0 = tr->pol.adam.step;
        ls_rng rng0 = tr->rng;
        for (int k = 0; k < (int)a->groups_per_update; k++) {
            ls_group_free(&groups[k]);
            if (a->task && !a->data) ls_task_item_free(&tr->items[k]);
        }
        for (int k = 0; k < (int)a->groups_per_update && s == LS_OK; k++) s = next_group(tr, k, &groups[k]);
        if (s == LS_OK) {
            zero_grads(tr);
            s = ls_grpo_update_batch(&tr->pol.p, &tr->pol.adam, groups,
                                     (int)a->groups_per_update, a->rollout ? &hook : NULL, &a->o, &tr->ar, &mt);
        }
        if (s != LS_OK) {
            /* a data, rollout or reward error (e.g. the reward process killed with the
             * job): the weights are those of the last finished update unless this one
             * stepped; then checkpoint what is finished so nothing done is lost */
            int stopped = s == LS_ERR_INTERRUPTED;
            char why[1024];
            snprintf(why, sizeof why, "%s", ls_err_msg());
            if (tr->pol.adam.step == step0) tr->data_pos = pos0, tr->epoch = epoch0, tr->rng = rng0;
            /* (not with --ep: saving is collective there, and the other ranks are elsewhere) */
            if (tr->pol.adam.step == step0 && tr->update > saved && !tr_ep(tr) && save_checkpoint(tr) == LS_OK && root)
                say(tr, "longstraw train: update %lld %s; the %lld finished updates are in checkpoint-%lld\n",
                        (long long)tr->update + 1, stopped ? "stopped" : "failed", (long long)tr->update,
                        (long long)tr->update);
            if (stopped) { /* a requested stop, not a failure */
                say(tr, "longstraw train: %s; continue with --resume %s\n", why, a->out);
                s = LS_OK;
            } else {
                s = ls_err(s, "%s", why);
            }
            break;
        }
        int64_t done1 = tr->update + 1;
        tr->eval_nll = NAN;
        int eval_now = done1 % a->eval_every == 0 || done1 == a->updates;
        if (tr->n_eval && eval_now) s = evaluate(tr, &tr->eval_nll);
        ls_eval_result_free(&tr->ev_res);
        if (s == LS_OK && tr->ev.num_prompts && eval_now) s = evaluate_task(tr, &tr->ev_res);
        if (s != LS_OK && ls_stop_requested()) {
            /* a stop in the held-out evaluation: the update is done and is kept (its metrics
             * line without the evaluation, its checkpoint), then the stop below ends the run */
            tr->eval_nll = NAN;
            ls_eval_result_free(&tr->ev_res);
            s = LS_OK;
        }
        if (s != LS_OK) break;
        double dt = ls_now() - t0;
        big = 0;
        for (int k = 1; k < (int)a->groups_per_update; k++) big = groups[k].P > groups[big].P ? k : big;
        write_metrics(tr, &mt, dt, groups, (int)a->groups_per_update);
        tr->eval_nll0 = NAN; /* written once, with the first update */
        ls_eval_result_free(&tr->ev_res0);
        trace_update_end(tr, &groups[big], &mt);
        if (mt.skipped) {
            skipped++;
            if (root) say(tr, "update %lld/%lld SKIPPED: %s; %s\n", (long long)tr->update + 1, (long long)a->updates,
                    mt.skip_reason, mt.n_iter > 1 ? "this iteration took no step (earlier iterations of the update did)"
                                                  : "weights and optimizer state untouched");
        } else if (root) {
            char ev[128] = "";
            if (!isnan(tr->eval_nll)) snprintf(ev, sizeof ev, "  held-out nll %.4f", tr->eval_nll);
            if (tr->ev_res.n) snprintf(ev + strlen(ev), sizeof ev - strlen(ev), "  held-out em %.3f", tr->ev_res.exact_match);
            if (a->o.sft)
                say(tr, "update %lld/%lld  nll %.4f  grad_norm %.4g%s  %.1fs\n", (long long)tr->update + 1,
                        (long long)a->updates, mt.loss, mt.grad_norm, ev, dt);
            else
                say(tr, "update %lld/%lld  reward %.4f ± %.4f  kl %.3g  entropy %.3f  len %.1f  grad_norm %.4g%s  %.1fs\n",
                        (long long)tr->update + 1, (long long)a->updates, mt.reward_mean, mt.reward_std, mt.kl,
                        mt.entropy, mt.len_mean, mt.grad_norm, ev, dt);
        }
        int64_t done = tr->update + 1;
        int stop = ls_stop_requested(); /* read once: the checkpoint and the message agree */
        if (done % a->save_every == 0 || done == a->updates || stop) {
            tr->update = done; /* a checkpoint holds the state after `done` updates */
            s = save_checkpoint(tr);
            tr->update = done - 1;
            if (s == LS_OK) saved = done;
        }
        if (s == LS_OK && (s = ls_trace_status()) != LS_OK) {
            /* a failed trace write ends the run like any failed write, with the finished
             * updates checkpointed (not with --ep: saving is collective there) */
            char why[1024];
            snprintf(why, sizeof why, "%s", ls_err_msg());
            tr->update = done;
            if (done > saved && !tr_ep(tr) && save_checkpoint(tr) == LS_OK && root)
                say(tr, "longstraw train: the %lld finished updates are in checkpoint-%lld\n", (long long)done,
                        (long long)done);
            s = ls_err(LS_ERR_IO, "%s", why);
            break;
        }
        if (stop && s == LS_OK) {
            if (root) say(tr, "longstraw train: stopped by signal %d after update %lld; continue with --resume %s\n", stop,
                    (long long)done, a->out);
            tr->update++;
            break;
        }
    }
    if (s == LS_OK && tr->update > first) {
        char path[4200];
        snprintf(path, sizeof path, "%s/receipt.json", a->out);
        s = ls_receipt_write(path, "train", &tr->pol, &groups[big], &a->o, &mt, &tr->ar);
        if (s == LS_OK && root)
            say(tr, "longstraw train: %lld updates (%d skipped) in %s; receipt %s, `longstraw report %s` for the table and memory.svg\n",
                    (long long)(tr->update - first), skipped, a->out, path, a->out);
    }
    res->updates = tr->update - first;
    res->skipped = skipped;
    res->stop_signal = s == LS_OK ? ls_stop_requested() : 0;
    ls_rt_get()->reward_pgid = 0;
    for (int k = 0; groups && k < (int)a->groups_per_update; k++) {
        ls_group_free(&groups[k]);
        if (tr->items) ls_task_item_free(&tr->items[k]);
    }
    free(groups);
    free(tr->items);
    for (int64_t k = 0; tr->eval && k < tr->n_eval; k++) ls_group_free(&tr->eval[k]);
    free(tr->eval);
    ls_eval_result_free(&tr->ev_res);
    ls_eval_result_free(&tr->ev_res0);
    ls_reward_cmd_stop(tr->rcmd);
    if (tr->metrics) fclose(tr->metrics);
    {
        ls_status ts = ls_trace_close(); /* its last event too is a write that can fail */
        if (s == LS_OK) s = ts;
    }
    if (tr->lock_fd >= 0) close(tr->lock_fd);
    jsonl_free(&tr->data);
    ls_trainable_close(&tr->pol);
    ls_tok_free(tr->tok);
    ls_arenas_free(&tr->ar);
    ls_backend_close(be);
    return s;
}
