/*
 * api.c — the embeddable C API (api.h): contexts, policies and results over the library's
 * transaction (grpo.h), the trainable set (trainer.h) and the training flags (flags.h).
 * Nothing here prints: every failure becomes the context's error message.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "longstraw/api.h"
#include "longstraw/backend.h"
#include "longstraw/comm.h"
#include "longstraw/files.h"
#include "longstraw/flags.h"
#include "longstraw/safetensors.h"
#include "longstraw/plan.h"
#include "longstraw/rollout.h"
#include "longstraw/score.h"
#include "longstraw/trace.h"
#include "longstraw/train_args.h"
#include "longstraw/trainer.h"
#include "core/rt.h"

struct ls_ctx {
    int threads;
    ls_rt rt;        /* what the library's calls read as "current" while this context's run */
    ls_rt *rt_prev;  /* the thread's runtime before the outermost entry */
    int depth;       /* entries (a reward or log callback may call into the context again) */
    char err[4096];
    char reward_err[1024]; /* a reward callback's message (ls_api_reward_error) */
    const ls_comm *world; /* several ranks: the CP communicator; else NULL */
    int64_t split_ep;     /* the EP degree the groups below were split for (0: none yet) */
    ls_comm *cp_group, *ep_group;
};

typedef struct {
    char *name;
    int ndim;
    int64_t shape[4];
    float *data;
} result_array;

struct ls_result {
    result_array *a;
    int64_t n;
    char *json;
};

struct ls_api_policy {
    ls_ctx *ctx;
    const ls_comm *cp, *ep; /* the ranks sharing pages (NULL: one) and experts (NULL: no EP) */
    char *model;
    char **strings; /* copies of the flag values the base flags point to */
    int n_strings;
    ls_train_flags base;
    const ls_backend *be;
    ls_arenas ar;
    ls_trainable t;
    int opened, adam_ready;
};

static char g_first_error[4096]; /* ls_ctx_new's failure only (no context yet) */

/* MPI, once started by a context, ends with the process (a finalized MPI cannot restart,
 * so not with the context); ls_comm_finalize leaves a world the host started alone. */
static void finalize_at_exit(void) { ls_comm_finalize(); }

int ls_api_version(void) { return LS_API_VERSION; }
const char *ls_api_last_error(void) { return g_first_error; }
const char *ls_ctx_error(const ls_ctx *c) { return c ? c->err : g_first_error; }
int ls_ctx_rank(const ls_ctx *c) { return c && c->world ? ls_comm_rank(c->world) : 0; }
int ls_ctx_world_size(const ls_ctx *c) { return c && c->world ? ls_comm_size(c->world) : 1; }

/* Every call runs on its context's runtime (core/rt.h: stop request, trace, progress,
 * thread count) and sets the process's OpenMP/BLAS threads from it. */
static void ctx_enter(ls_ctx *c) {
    if (c->depth++ == 0) {
        c->rt_prev = ls_rt_enter(&c->rt);
        c->rt.stop = 0; /* a stop request is for the call in flight (ls_ctx_request_stop) */
    }
    ls_set_threads(c->threads);
}
static void ctx_leave(ls_ctx *c) {
    if (--c->depth == 0) ls_rt_leave(c->rt_prev);
}

/* The status of a failed call into the context's message; returns s. */
static ls_status fail(ls_ctx *c, ls_status s) {
    if (s != LS_OK) snprintf(c->err, sizeof c->err, "%s", ls_err_msg());
    return s;
}

ls_ctx *ls_ctx_new(int threads) {
    ls_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(g_first_error, sizeof g_first_error, "out of memory creating a context");
        return NULL;
    }
    c->threads = threads;
    ls_rt_init(&c->rt);
    /* under a launcher, CP runs over the world (MPI started here unless the host did) */
    int launched = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
    if (launched && ls_comm_have_mpi()) {
        ls_comm *w = NULL;
        if (ls_comm_init(NULL, NULL, &w) != LS_OK) {
            snprintf(g_first_error, sizeof g_first_error, "cannot start the communicator: %s", ls_err_msg());
            free(c);
            return NULL;
        }
        c->world = w && ls_comm_size(w) > 1 ? w : NULL;
        static int registered;
        if (!registered) registered = atexit(finalize_at_exit) == 0;
    }
    return c;
}

/* The CP and EP groups of an EP degree (1: the world, none): split once per degree, a
 * collective — every rank makes the same calls, as with the CLI. */
static ls_status ctx_parallel(ls_ctx *c, int64_t ep, const ls_comm **cp, const ls_comm **epc) {
    *cp = c->world, *epc = NULL;
    if (ep <= 1) return LS_OK;
    if (c->split_ep != ep) {
        ls_comm_free(c->cp_group);
        ls_comm_free(c->ep_group);
        c->cp_group = c->ep_group = NULL;
        c->split_ep = 0;
        LS_TRY(ls_comm_parallel(c->world, ep, &c->cp_group, &c->ep_group));
        c->split_ep = ep;
    }
    *cp = ls_comm_size(c->cp_group) > 1 ? c->cp_group : NULL;
    *epc = c->ep_group;
    return LS_OK;
}

void ls_ctx_free(ls_ctx *c) {
    if (!c) return;
    ls_comm_free(c->cp_group);
    ls_comm_free(c->ep_group);
    ls_rt_release(&c->rt);
    free(c);
}

void ls_ctx_request_stop(ls_ctx *c, int sig) {
    if (c) c->rt.stop = sig > 0 ? sig : 2; /* sig_atomic_t: safe from a signal handler or another thread */
}

void ls_ctx_set_progress(ls_ctx *c, ls_api_progress_fn fn, void *user) {
    if (!c) return;
    c->rt.progress.fn = fn;
    c->rt.progress.user = user;
    ctx_enter(c);
    ls_progress_enable(fn != NULL);
    ctx_leave(c);
}

/* ---- results ---- */

static ls_result *result_new(void) {
    ls_result *r = calloc(1, sizeof *r);
    return r;
}

static ls_status result_add(ls_result *r, const char *name, int ndim, const int64_t *shape, const float *src) {
    result_array *na = realloc(r->a, (size_t)(r->n + 1) * sizeof *na);
    if (!na) return ls_err(LS_ERR_NOMEM, "out of memory for the result %s", name);
    r->a = na;
    result_array *a = &r->a[r->n];
    memset(a, 0, sizeof *a);
    int64_t numel = 1;
    a->ndim = ndim < 4 ? ndim : 4;
    for (int d = 0; d < a->ndim; d++) numel *= (a->shape[d] = shape[d]);
    a->name = strdup(name);
    a->data = malloc((size_t)(numel > 0 ? numel : 1) * sizeof(float));
    if (!a->name || !a->data) {
        free(a->name);
        free(a->data);
        return ls_err(LS_ERR_NOMEM, "out of memory for the result %s", name);
    }
    if (numel > 0) memcpy(a->data, src, (size_t)numel * sizeof(float));
    r->n++;
    return LS_OK;
}

int64_t ls_result_count(const ls_result *r) { return r ? r->n : 0; }
const char *ls_result_name(const ls_result *r, int64_t i) { return r && i >= 0 && i < r->n ? r->a[i].name : NULL; }
int ls_result_ndim(const ls_result *r, int64_t i) { return r && i >= 0 && i < r->n ? r->a[i].ndim : 0; }
const int64_t *ls_result_shape(const ls_result *r, int64_t i) { return r && i >= 0 && i < r->n ? r->a[i].shape : NULL; }
const float *ls_result_data(const ls_result *r, int64_t i) { return r && i >= 0 && i < r->n ? r->a[i].data : NULL; }
const char *ls_result_json(const ls_result *r) { return r && r->json ? r->json : "{}"; }

void ls_result_free(ls_result *r) {
    if (!r) return;
    for (int64_t i = 0; i < r->n; i++) {
        free(r->a[i].name);
        free(r->a[i].data);
    }
    free(r->a);
    free(r->json);
    free(r);
}

/* A call's end: r on success; else the context's message set, r freed, NULL. */
static ls_result *finish(ls_ctx *c, ls_status s, ls_result *r) {
    ctx_leave(c); /* every result-returning call entered its context */
    if (s == LS_OK) return r;
    fail(c, s);
    ls_result_free(r);
    return NULL;
}

/* ---- flags ---- */

/* Flags fixed when the policy opens (they decide what is trained and where). */
static int open_only(const char *name) {
    static const char *const f[] = {"lora-rank", "lora-alpha", "lora-targets", "lora-seed", "adapter",
                                    "ref-model", "backend",    "state-on",     "ep",        "threads"};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (ls_flag_name_is(name, f[i])) return 1;
    return 0;
}

static ls_status apply_flags(ls_train_flags *t, int n, const char *const *names, const char *const *values,
                             int at_open) {
    for (int i = 0; i < n; i++) {
        if (!names || !names[i]) return ls_err(LS_ERR_ARG, "flag %d has no name", i);
        if (!at_open && open_only(names[i]))
            return ls_err(LS_ERR_ARG, "--%s is fixed when the policy is opened (pass it to ctx.policy)", names[i]);
        int known = 0;
        LS_TRY(ls_train_flag_set(t, names[i], values ? values[i] : NULL, &known));
        if (!known) return ls_err(LS_ERR_ARG, "%s: not a training flag (see longstraw grad --help)", names[i]);
    }
    return LS_OK;
}

/* The base flags with a call's flags on top, finished and set to run. */
static ls_status call_flags(ls_api_policy *p, int n, const char *const *names, const char *const *values,
                            ls_train_flags *t) {
    *t = p->base;
    LS_TRY(apply_flags(t, n, names, values, 0));
    LS_TRY(ls_train_flags_finish(t));
    t->o.fwd.comm = p->cp;
    t->ep_comm = p->ep;
    return LS_OK;
}

/* ---- policies ---- */

static void policy_free(ls_api_policy *p) {
    if (!p) return;
    if (p->opened) ls_trainable_close(&p->t);
    ls_arenas_free(&p->ar);
    if (p->be) ls_backend_close(p->be);
    for (int i = 0; i < p->n_strings; i++) free(p->strings[i]);
    free(p->strings);
    free(p->model);
    free(p);
}

/* Needs no context (api.h: a policy may outlive its context's handle, to be freed). */
void ls_api_policy_close(ls_api_policy *p) { policy_free(p); }

ls_api_policy *ls_api_policy_open(ls_ctx *c, const char *model_dir, int n, const char *const *names,
                                  const char *const *values) {
    if (!c) return NULL;
    c->err[0] = 0;
    ls_api_policy *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(c->err, sizeof c->err, "out of memory opening %s", model_dir ? model_dir : "(null)");
        return NULL;
    }
    ctx_enter(c);
    p->ctx = c;
    ls_arenas_init(&p->ar);
    ls_train_flags_init(&p->base);
    ls_status s = model_dir ? LS_OK : ls_err(LS_ERR_ARG, "no model directory given");
    if (s == LS_OK && !(p->model = strdup(model_dir))) s = ls_err(LS_ERR_NOMEM, "out of memory");
    /* the flags keep pointers: they point into copies of the values (NULL stays NULL) */
    if (s == LS_OK && n > 0 && !(p->strings = calloc((size_t)n, sizeof *p->strings)))
        s = ls_err(LS_ERR_NOMEM, "out of memory");
    p->n_strings = n > 0 && p->strings ? n : 0;
    for (int i = 0; s == LS_OK && i < n; i++)
        if (values && values[i] && !(p->strings[i] = strdup(values[i]))) s = ls_err(LS_ERR_NOMEM, "out of memory");
    if (s == LS_OK) s = apply_flags(&p->base, n, names, (const char *const *)p->strings, 1);
    ls_train_flags t;
    if (s == LS_OK) {
        t = p->base;
        s = ls_train_flags_finish(&t);
    }
    if (s == LS_OK) s = ctx_parallel(c, p->base.ep, &p->cp, &p->ep);
    p->base.ep_comm = p->ep;
    if (s == LS_OK) s = ls_backend_open(p->base.backend, &p->be);
    if (s == LS_OK) {
        ls_arenas_set_backend(&p->ar, p->be);
        if (p->base.state_on_host) ls_arena_set_backend(&p->ar.a[LS_ARENA_PROMPT], ls_backend_cpu());
        ls_policy_spec spec = ls_train_flags_spec(p->model, &p->base);
        s = ls_trainable_open(&p->t, &spec, 0, &p->ar);
        p->opened = s == LS_OK;
    }
    if (s != LS_OK) {
        fail(c, s);
        policy_free(p);
        p = NULL;
    }
    ctx_leave(c);
    return p;
}

static ls_status parse_group(ls_api_policy *p, const char *json, ls_group *g) {
    memset(g, 0, sizeof *g);
    if (!json) return ls_err(LS_ERR_ARG, "no group given");
    return ls_group_parse_ex(g, json, "group", p->t.cfg->vocab, NULL, 0);
}

/* A call on one group: the context's error cleared, the flags applied, the group parsed. */
static ls_status begin_group_call(ls_api_policy *p, const char *group_json, int n, const char *const *names,
                                  const char *const *values, ls_train_flags *t, ls_group *g) {
    p->ctx->err[0] = 0;
    ctx_enter(p->ctx);
    memset(g, 0, sizeof *g);
    LS_TRY(call_flags(p, n, names, values, t));
    return parse_group(p, group_json, g);
}

ls_result *ls_api_policy_logprobs(ls_api_policy *p, const char *group_json, int n, const char *const *names,
                                  const char *const *values) {
    if (!p) return NULL;
    ls_ctx *c = p->ctx;
    ls_train_flags t;
    ls_group g;
    ls_result *r = NULL;
    ls_status s = begin_group_call(p, group_json, n, names, values, &t, &g);
    float **lp = NULL;
    if (s == LS_OK && !(lp = ls_arena_alloc(&p->ar.a[LS_ARENA_SCORE], (size_t)g.G * sizeof(float *))))
        s = ls_err(LS_ERR_NOMEM, "out of memory");
    ls_score_opts so = ls_grpo_score_opts(&t.o);
    ls_score_stats st;
    if (s == LS_OK) s = ls_score_group(&p->t.p.policy, &g, &so, &p->ar, lp, &st);
    if (s == LS_OK) s = ls_score_check_finite(&g, lp);
    if (s == LS_OK && !(r = result_new())) s = ls_err(LS_ERR_NOMEM, "out of memory");
    for (int i = 0; s == LS_OK && i < g.G; i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "%d", i);
        s = result_add(r, nm, 1, &g.R[i], lp[i]);
    }
    ls_arena_reset(&p->ar.a[LS_ARENA_SCORE]);
    ls_group_free(&g);
    return finish(c, s, r);
}

typedef struct {
    FILE *f;
    int first;
} metric_out;
static void metric(void *user, const char *k, double v) {
    metric_out *m = user;
    fprintf(m->f, "%s\"%s\": ", m->first ? "" : ", ", k);
    ls_json_number(m->f, "%.10g", v);
    m->first = 0;
}

static char *metrics_json(const ls_grpo_metrics *mt, const ls_train_flags *t, const ls_api_policy *p) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    metric_out m = {f, 1};
    fputc('{', f);
    ls_grpo_metrics_each(mt, 0, t->o.aux_loss_coef > 0 ? p->t.p.fam->aux_loss : NULL, metric, &m);
    metric(&m, "learning_rate", t->o.lr);
    metric(&m, "num_sequences", mt->n_seq);
    metric(&m, "step", (double)p->t.adam.step);
    fprintf(f, ", \"skipped\": %s, \"time\": {\"capture\": %.4f, \"reference\": %.4f, \"score\": %.4f, "
               "\"replay\": %.4f, \"sweep\": %.4f, \"optimize\": %.4f, \"total\": %.4f}}",
            mt->skipped ? "true" : "false", mt->t_capture, mt->t_ref, mt->t_score, mt->t_replay, mt->t_sweep,
            mt->t_optim, mt->t_total);
    fclose(f);
    return buf;
}

/* The gradient, tensor by tensor, straight from the family's export into the result (what
 * `longstraw grad` would write to its file: the same names, shapes and values). */
static ls_status grad_to_result(void *user, const char *name, int ndim, const int64_t *shape, const float *data) {
    return result_add(user, name, ndim, shape, data);
}

static ls_status read_grads(ls_api_policy *p, ls_result *r) {
    ls_st_sink to = {.fn = grad_to_result, .user = r};
    if (!p->ep) return p->t.p.fam->policy_save_grads(&p->t.p, &to, NULL, NULL);
    /* EP: the experts gather to world rank 0, the one rank whose result holds the gradient */
    return p->t.p.fam->policy_save_grads(&p->t.p, ls_ctx_rank(p->ctx) == 0 ? &to : NULL, NULL, NULL);
}

ls_result *ls_api_policy_grad(ls_api_policy *p, const char *group_json, int n, const char *const *names,
                              const char *const *values) {
    if (!p) return NULL;
    ls_ctx *c = p->ctx;
    ls_train_flags t;
    ls_group g;
    ls_result *r = NULL;
    ls_grpo_metrics mt;
    ls_status s = begin_group_call(p, group_json, n, names, values, &t, &g);
    if (s == LS_OK && !t.force) s = ls_check_fits(&p->t, &t.o, g.P, 0);
    if (s == LS_OK) s = ls_grpo_group_check(&g, &t.o, "group");
    if (s == LS_OK) p->t.p.fam->policy_zero_grad(&p->t.p);
    if (s == LS_OK) s = ls_grpo_update(&p->t.p, NULL, &g, &t.o, &p->ar, &mt);
    if (s == LS_OK && mt.skipped)
        s = ls_err(LS_ERR_ARG, "%s; no gradient (the forward or backward overflowed: NaN/Inf weights, rewards or "
                               "activations)", mt.skip_reason);
    if (s == LS_OK && !(r = result_new())) s = ls_err(LS_ERR_NOMEM, "out of memory");
    if (s == LS_OK) s = read_grads(p, r);
    if (s == LS_OK && !(r->json = metrics_json(&mt, &t, p))) s = ls_err(LS_ERR_NOMEM, "out of memory");
    ls_group_free(&g);
    return finish(c, s, r);
}

ls_result *ls_api_policy_step(ls_api_policy *p, int n_groups, const char *const *groups_json, int n,
                              const char *const *names, const char *const *values) {
    if (!p) return NULL;
    ls_ctx *c = p->ctx;
    c->err[0] = 0;
    ctx_enter(c);
    ls_train_flags t;
    ls_group *g = n_groups > 0 ? calloc((size_t)n_groups, sizeof *g) : NULL;
    ls_result *r = NULL;
    ls_grpo_metrics mt;
    ls_status s = call_flags(p, n, names, values, &t);
    if (s == LS_OK && (n_groups < 1 || !groups_json)) s = ls_err(LS_ERR_ARG, "step needs at least one group");
    if (s == LS_OK && !g) s = ls_err(LS_ERR_NOMEM, "out of memory");
    for (int k = 0; s == LS_OK && k < n_groups; k++) {
        char label[32];
        snprintf(label, sizeof label, "group %d", k);
        s = parse_group(p, groups_json[k], &g[k]);
        if (s == LS_OK) s = ls_grpo_group_check(&g[k], &t.o, label);
        if (s == LS_OK && !t.force) s = ls_check_fits(&p->t, &t.o, g[k].P, 1);
    }
    if (s == LS_OK && !p->adam_ready) {
        s = ls_adamw_init(&p->t.adam, &p->t.p, &p->ar.a[LS_ARENA_FIXED]);
        p->adam_ready = s == LS_OK;
    }
    if (s == LS_OK) p->t.p.fam->policy_zero_grad(&p->t.p);
    if (s == LS_OK) s = ls_grpo_update_batch(&p->t.p, &p->t.adam, g, n_groups, NULL, &t.o, &p->ar, &mt);
    if (s == LS_OK && !(r = result_new())) s = ls_err(LS_ERR_NOMEM, "out of memory");
    if (s == LS_OK && !(r->json = metrics_json(&mt, &t, p))) s = ls_err(LS_ERR_NOMEM, "out of memory");
    for (int k = 0; g && k < n_groups; k++) ls_group_free(&g[k]);
    free(g);
    return finish(c, s, r);
}

/* Sampling's own flags, or a training flag (temperature, the engine's). */
static int rollout_flag(const char *k) {
    static const char *const own[] = {"num-generations", "max-new-tokens", "top-p", "seed", "stop"};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (ls_flag_name_is(k, own[i])) return 1;
    for (int i = 0; i < ls_train_flag_count; i++)
        if (ls_flag_name_is(k, ls_train_flag_table[i].name)) return 1;
    return 0;
}

ls_result *ls_api_policy_rollouts(ls_api_policy *p, const char *group_json, int n, const char *const *names,
                                  const char *const *values) {
    if (!p) return NULL;
    ls_ctx *c = p->ctx;
    c->err[0] = 0;
    ctx_enter(c);
    ls_train_args a;
    ls_train_args_default(&a);
    a.t = p->base;
    ls_status s = LS_OK;
    for (int i = 0; s == LS_OK && i < n; i++) {
        int known = 0;
        const char *k = names ? names[i] : NULL;
        if (!k) s = ls_err(LS_ERR_ARG, "flag %d has no name", i);
        else if (open_only(k)) s = ls_err(LS_ERR_ARG, "--%s is fixed when the policy is opened", k);
        else if (!rollout_flag(k)) s = ls_err(LS_ERR_ARG, "%s: not a flag of rollouts", k);
        else s = ls_train_args_set(&a, k, values ? values[i] : NULL, &known);
    }
    if (s == LS_OK) s = ls_train_flags_finish(&a.t);
    a.t.o.fwd.comm = p->cp;
    a.t.ep_comm = p->ep;
    ls_group g;
    memset(&g, 0, sizeof g);
    if (s == LS_OK) s = group_json ? ls_group_parse_ex(&g, group_json, "group", p->t.cfg->vocab, NULL,
                                                       LS_GROUP_PROMPT_ONLY)
                                   : ls_err(LS_ERR_ARG, "no prompt given");
    if (s == LS_OK && g.P < 2) s = ls_err(LS_ERR_ARG, "group: field \"prompt\" has %lld token(s): at least 2 needed",
                                          (long long)g.P);
    if (s == LS_OK && a.t.o.no_capture) s = ls_err(LS_ERR_ARG, "rollouts sample from the captured state: not with no_capture");
    if (s == LS_OK && p->t.cfg->vocab > (1 << 24))
        s = ls_err(LS_ERR_UNSUPPORTED, "vocab %lld: token ids above 2^24 do not fit the result's f32 arrays",
                   (long long)p->t.cfg->vocab);
    int32_t stop_ids[16];
    ls_sample_opts so;
    ls_sample_opts_default(&so);
    so.temperature = a.t.o.fwd.temperature;
    so.top_p = (float)a.r.top_p;
    so.max_new_tokens = a.r.max_new_tokens;
    so.stop = stop_ids;
    if (s == LS_OK && a.r.stop) s = ls_stop_tokens_parse(a.r.stop, NULL, p->t.cfg->vocab, stop_ids, 16, &so.n_stop);
    int G = (int)a.r.num_generations;
    int64_t maxn = a.r.max_new_tokens;
    int32_t **resp = s == LS_OK ? calloc((size_t)G, sizeof *resp) : NULL;
    float **lps = s == LS_OK ? calloc((size_t)G, sizeof *lps) : NULL;
    int64_t *R = s == LS_OK ? calloc((size_t)G, sizeof *R) : NULL;
    if (s == LS_OK && (!resp || !lps || !R)) s = ls_err(LS_ERR_NOMEM, "out of memory");
    for (int i = 0; s == LS_OK && i < G; i++)
        if (!(resp[i] = malloc((size_t)maxn * sizeof(int32_t))) || !(lps[i] = malloc((size_t)maxn * sizeof(float))))
            s = ls_err(LS_ERR_NOMEM, "out of memory");
    ls_score_opts sc = ls_grpo_score_opts(&a.t.o); /* no_capture refused above */
    ls_prompt_state st;
    ls_arena_reset(&p->ar.a[LS_ARENA_PROMPT]);
    if (s == LS_OK) s = ls_score_capture(&p->t.p.policy, &g, &sc, &p->ar, &st);
    ls_rng rng;
    ls_rng_seed(&rng, (uint64_t)a.r.seed);
    if (s == LS_OK)
        s = ls_generate_group(&p->t.p.policy, &st, g.prompt[g.P - 1], G, &so, &rng, resp, lps, R, &a.t.o.fwd,
                              &p->ar.a[LS_ARENA_BRANCH], &p->ar.a[LS_ARENA_SCRATCH]);
    ls_arena_reset(&p->ar.a[LS_ARENA_PROMPT]);
    ls_result *r = NULL;
    if (s == LS_OK && !(r = result_new())) s = ls_err(LS_ERR_NOMEM, "out of memory");
    for (int i = 0; s == LS_OK && i < G; i++) {
        char nm[32];
        float *ids = malloc((size_t)(R[i] > 0 ? R[i] : 1) * sizeof(float));
        if (!ids) s = ls_err(LS_ERR_NOMEM, "out of memory");
        for (int64_t t = 0; s == LS_OK && t < R[i]; t++) ids[t] = (float)resp[i][t];
        snprintf(nm, sizeof nm, "%d", i);
        if (s == LS_OK) s = result_add(r, nm, 1, &R[i], ids);
        snprintf(nm, sizeof nm, "logprobs.%d", i);
        if (s == LS_OK) s = result_add(r, nm, 1, &R[i], lps[i]);
        free(ids);
    }
    for (int i = 0; i < G && resp; i++) free(resp[i]);
    for (int i = 0; i < G && lps; i++) free(lps[i]);
    free(resp);
    free(lps);
    free(R);
    ls_group_free(&g);
    return finish(c, s, r);
}

int ls_api_policy_save(ls_api_policy *p, const char *dir) {
    if (!p) return 1;
    p->ctx->err[0] = 0;
    ctx_enter(p->ctx);
    ls_status s = dir ? LS_OK : ls_err(LS_ERR_ARG, "no output directory given");
    int root = ls_ctx_rank(p->ctx) == 0;
    if (s == LS_OK && root) s = ls_make_dir(dir);
    if (s == LS_OK && (root || p->ep)) /* EP: every rank takes part (the experts gather to rank 0) */
        s = p->t.p.fam->policy_save(&p->t.p, &p->t.spec, root ? dir : NULL);
    ctx_leave(p->ctx);
    return fail(p->ctx, s) != LS_OK;
}

/* ---- the training loop ---- */

typedef struct {
    ls_ctx *c;
    ls_api_reward_fn fn;
    void *user;
    ls_api_log_fn log;
    void *log_user;
} train_hooks;

static ls_status reward_bridge(void *user, const char *prompt, size_t plen, const char *const *resp, const size_t *lens,
                               int n, int64_t group_id, double *rewards) {
    train_hooks *h = user;
    h->c->reward_err[0] = 0;
    if (h->fn(h->user, prompt, plen, resp, lens, n, group_id, rewards) == 0) return LS_OK;
    return ls_err(LS_ERR_ARG, "the reward function failed on group %lld: %s", (long long)group_id,
                  h->c->reward_err[0] ? h->c->reward_err : "(no message)");
}

static void log_bridge(void *user, const char *line) {
    train_hooks *h = user;
    if (h->log) h->log(h->log_user, line);
}

void ls_api_reward_error(ls_ctx *c, const char *message) {
    if (c) snprintf(c->reward_err, sizeof c->reward_err, "%s", message ? message : "");
}

ls_result *ls_api_train(ls_ctx *c, int n, const char *const *names, const char *const *values,
                        ls_api_reward_fn reward, void *reward_user, ls_api_log_fn log, void *log_user) {
    if (!c) return NULL;
    c->err[0] = 0;
    ctx_enter(c);
    /* the command line it stands for: saved as RUN/args.json (a resume replays it, from the
     * CLI too) and merged with a resume's saved flags as the CLI does */
    int argc = 1;
    char **argv = calloc((size_t)(2 * (n > 0 ? n : 0) + 2), sizeof *argv);
    ls_status s = argv ? LS_OK : ls_err(LS_ERR_NOMEM, "out of memory");
    if (s == LS_OK && !(argv[0] = strdup("train"))) s = ls_err(LS_ERR_NOMEM, "out of memory");
    for (int i = 0; s == LS_OK && i < n; i++) {
        if (!names || !names[i]) {
            s = ls_err(LS_ERR_ARG, "flag %d has no name", i);
            break;
        }
        int tv = ls_train_args_takes_value(names[i]);
        if (tv < 0) {
            s = ls_err(LS_ERR_ARG, "%s: not a flag of train (see longstraw train --help)", names[i]);
            break;
        }
        const char *v = values ? values[i] : NULL;
        if (!tv && !ls_flag_on(v)) continue; /* a switch turned off: left out */
        size_t l = strlen(names[i]);
        char *f = malloc(l + 3);
        if (!f) {
            s = ls_err(LS_ERR_NOMEM, "out of memory");
            break;
        }
        f[0] = f[1] = '-';
        for (size_t k = 0; k <= l; k++) f[k + 2] = names[i][k] == '_' ? '-' : names[i][k];
        argv[argc++] = f;
        if (tv && v && !(argv[argc++] = strdup(v))) s = ls_err(LS_ERR_NOMEM, "out of memory");
    }
    ls_train_args a;
    ls_train_args_default(&a);
    if (s == LS_OK) s = ls_train_args_parse(&a, argc, argv);
    int nargc = 0;
    char **nargv = NULL;
    if (s == LS_OK && a.resume) {
        const char *resume = a.resume;
        s = ls_train_saved_args(resume, argc, argv, &nargc, &nargv);
        ls_train_args_default(&a);
        if (s == LS_OK) s = ls_train_args_parse(&a, nargc, nargv);
        if (s == LS_OK) s = ls_train_same_run(resume, a.r.out);
        a.r.out = resume;
        a.resume = resume;
    }
    train_hooks h = {c, reward, reward_user, log, log_user};
    if (s == LS_OK && reward) a.r.reward_fn = reward_bridge, a.r.reward_user = &h;
    if (s == LS_OK) s = ls_train_args_check(&a);
    if (s == LS_OK) s = ls_train_flags_finish(&a.t);
    if (s == LS_OK) s = ctx_parallel(c, a.t.ep, &a.t.o.fwd.comm, &a.t.ep_comm);
    if (s == LS_OK && a.t.state_on_host)
        s = ls_err(LS_ERR_ARG, "--state-on host is built for grad, step and logprobs; train keeps the prompt state "
                               "on the device (drop the flag)");
    ls_train_result res;
    memset(&res, 0, sizeof res);
    if (s == LS_OK) {
        ls_set_threads(a.t.threads ? (int)a.t.threads : c->threads);
        ls_train_opts o;
        ls_train_args_opts(&a, a.resume ? nargc : argc, a.resume ? nargv : argv, &o);
        o.log_fn = log_bridge, o.log_user = &h;
        s = ls_train_run(&o, &res);
    }
    ls_result *r = NULL;
    if (s == LS_OK && !(r = result_new())) s = ls_err(LS_ERR_NOMEM, "out of memory");
    if (s == LS_OK) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        if (!f) s = ls_err(LS_ERR_NOMEM, "out of memory");
        else {
            fprintf(f, "{\"updates\": %lld, \"skipped\": %d, \"stop_signal\": %d, \"out\": ", (long long)res.updates,
                    res.skipped, res.stop_signal);
            ls_json_string(f, a.r.out ? a.r.out : "");
            fputc('}', f);
            fclose(f);
            r->json = buf;
        }
    }
    for (int i = 0; argv && i < argc; i++) free(argv[i]);
    free(argv);
    for (int i = 0; i < nargc; i++) free(nargv[i]);
    free(nargv);
    return finish(c, s, r);
}

/* ---- plan ---- */

ls_result *ls_api_plan(ls_ctx *c, const char *model, int n, const char *const *names, const char *const *values) {
    if (!c) return NULL;
    c->err[0] = 0;
    ctx_enter(c);
    char path[4096];
    struct stat st;
    ls_status s = model ? LS_OK : ls_err(LS_ERR_ARG, "no model directory or config given");
    if (s == LS_OK) {
        if (stat(model, &st) == 0 && S_ISDIR(st.st_mode)) snprintf(path, sizeof path, "%s/config.json", model);
        else snprintf(path, sizeof path, "%s", model);
    }
    ls_plan_flags pf;
    ls_plan_flags_init(&pf);
    for (int i = 0; s == LS_OK && i < n; i++) {
        const char *k = names ? names[i] : NULL;
        int known = 0;
        if (!k) {
            s = ls_err(LS_ERR_ARG, "flag %d has no name", i);
            break;
        }
        s = ls_plan_flag_set(&pf, k, values ? values[i] : NULL, &known);
        if (s == LS_OK && !known) s = ls_err(LS_ERR_ARG, "%s: not a flag of plan (see longstraw plan --help)", k);
    }
    if (s == LS_OK && pf.rq.prompt < 0) s = ls_err(LS_ERR_ARG, "plan needs prompt= (the prompt's length in tokens)");
    ls_plan_request rq = ls_plan_flags_request(&pf, path);
    ls_plan_doc *doc = s == LS_OK ? calloc(1, sizeof *doc) : NULL;
    if (s == LS_OK && !doc) s = ls_err(LS_ERR_NOMEM, "out of memory");
    ls_config cfg;
    if (s == LS_OK) s = ls_config_load(&cfg, path);
    if (s == LS_OK) s = ls_plan_make(doc, &cfg, &rq, pf.on_host);
    ls_result *r = NULL;
    if (s == LS_OK && !(r = result_new())) s = ls_err(LS_ERR_NOMEM, "out of memory");
    if (s == LS_OK) {
        size_t len = 0;
        FILE *f = open_memstream(&r->json, &len);
        if (!f) s = ls_err(LS_ERR_NOMEM, "out of memory");
        else {
            ls_plan_write(f, doc, 1);
            fclose(f);
        }
    }
    free(doc);
    return finish(c, s, r);
}
