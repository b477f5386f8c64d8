/*
 * eval.c — held-out evaluation on a built-in task (eval.h): capture each held-out
 * prompt, decode greedily from the captured state, score the text.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/eval.h"
#include "longstraw/rollout.h"
#include "longstraw/trace.h"

static ls_status below_minimum(const ls_task *t, int64_t target, int64_t n) {
    char name[64];
    return ls_err(LS_ERR_ARG, "a prompt length of %lld tokens is below the %s task's minimum: its shortest prompt is "
                              "%lld tokens with this tokenizer (ask for at least that)",
                  (long long)target, ls_task_name(t, name, sizeof name), (long long)n);
}

ls_status ls_task_check_length(const ls_task *t, const ls_tokenizer *tok, int64_t target, int held_out,
                               const ls_rng *rng) {
    ls_rng r = *rng; /* (a copy: the caller's draws are not changed) */
    ls_task_item it;
    LS_TRY(ls_task_make(t, &it, ls_task_min_bytes(t), -1.0, held_out, &r));
    int32_t *ids;
    int64_t n;
    ls_status s = ls_tok_encode(tok, it.prompt, it.prompt_len, &ids, &n);
    ls_task_item_free(&it);
    if (s != LS_OK) return s;
    free(ids);
    return n > target ? below_minimum(t, target, n) : LS_OK;
}

ls_status ls_task_prompt(const ls_task *t, const ls_tokenizer *tok, int64_t target, double depth, int held_out,
                         ls_rng *rng, ls_task_item *it, ls_group *g) {
    double bytes = (double)target, min = (double)ls_task_min_bytes(t);
    for (int attempt = 0;; attempt++) {
        ls_rng save = *rng;
        LS_TRY(ls_task_make(t, it, bytes < min ? (size_t)min : (size_t)bytes, depth, held_out, rng));
        int32_t *ids;
        int64_t n;
        ls_status s = ls_tok_encode(tok, it->prompt, it->prompt_len, &ids, &n);
        if (s != LS_OK) {
            ls_task_item_free(it);
            return s;
        }
        if (bytes <= min && n > target) { /* the task's shortest prompt is longer than asked */
            free(ids);
            ls_task_item_free(it);
            return below_minimum(t, target, n);
        }
        if ((n <= target && n >= target - target / 50 - 2) || attempt == 6 || n < 1) {
            g->prompt = ids;
            g->P = n;
            g->prompt_text = strdup(it->prompt);
            return g->prompt_text ? LS_OK : LS_ERR_NOMEM;
        }
        free(ids);
        ls_task_item_free(it);
        bytes = bytes * (double)target / (double)n * (n > target ? 0.995 : 1.0);
        *rng = save; /* the same answer and depth, another length */
    }
}

void ls_eval_opts_default(ls_eval_opts *o) {
    memset(o, 0, sizeof *o);
    ls_task_parse(&o->task, "passkey", NULL);
    o->lengths[0] = 16384;
    o->n_lengths = 1;
    static const double d[] = {0, 0.25, 0.5, 0.75, 1};
    memcpy(o->depths, d, sizeof d);
    o->n_depths = 5;
    o->num_prompts = 16;
    ls_score_opts_default(&o->so);
}

/* Comma-separated numbers; each parsed by strtod and checked by the caller. */
static ls_status parse_list(const char *what, const char *list, double *out, int cap, int *n) {
    *n = 0;
    const char *p = list;
    for (;;) {
        char *end;
        double v = strtod(p, &end);
        if (end == p || (*end && *end != ','))
            return ls_err(LS_ERR_ARG, "%s \"%s\": entry %d is not a number", what, list, *n + 1);
        if (*n == cap) return ls_err(LS_ERR_ARG, "%s \"%s\": at most %d entries", what, list, cap);
        out[(*n)++] = v;
        if (!*end) return LS_OK;
        p = end + 1;
    }
}

ls_status ls_eval_parse_lengths(ls_eval_opts *o, const char *list) {
    double v[LS_EVAL_MAX_LENGTHS];
    int n;
    LS_TRY(parse_list("--prompt-len", list, v, LS_EVAL_MAX_LENGTHS, &n));
    for (int i = 0; i < n; i++) {
        if (!(v[i] >= 16 && v[i] <= (double)(1 << 30)) || v[i] != floor(v[i]))
            return ls_err(LS_ERR_ARG, "--prompt-len \"%s\": entry %d (%g) is not a whole number in [16, 2^30]", list,
                          i + 1, v[i]);
        o->lengths[i] = (int64_t)v[i];
        for (int j = 0; j < i; j++) /* (each length's prompts would be counted twice) */
            if (o->lengths[j] == o->lengths[i])
                return ls_err(LS_ERR_ARG, "--prompt-len \"%s\": entry %d (%lld) repeats entry %d", list, i + 1,
                              (long long)o->lengths[i], j + 1);
    }
    o->n_lengths = n;
    return LS_OK;
}

ls_status ls_eval_parse_depths(ls_eval_opts *o, const char *list) {
    double v[LS_EVAL_MAX_DEPTHS];
    int n;
    LS_TRY(parse_list("--depths", list, v, LS_EVAL_MAX_DEPTHS, &n));
    for (int i = 0; i < n; i++) {
        if (!(v[i] >= 0 && v[i] <= 1))
            return ls_err(LS_ERR_ARG, "--depths \"%s\": entry %d (%g) is outside [0, 1]", list, i + 1, v[i]);
        for (int j = 0; j < i; j++) { /* one "by_depth" key per depth ("%g") */
            char a[32], b[32];
            snprintf(a, sizeof a, "%g", v[i]);
            snprintf(b, sizeof b, "%g", v[j]);
            if (!strcmp(a, b))
                return ls_err(LS_ERR_ARG, "--depths \"%s\": entry %d is the same depth as entry %d (%s in the results)",
                              list, i + 1, j + 1, a);
        }
    }
    memcpy(o->depths, v, (size_t)n * sizeof *v);
    o->n_depths = n;
    return LS_OK;
}

/* One held-out prompt: capture, greedy decode, score. */
static ls_status eval_one(const ls_model *m, const ls_tokenizer *tok, const ls_eval_opts *o, ls_rng *rng,
                          int64_t length, double depth, ls_arenas *ar, ls_eval_row *row) {
    ls_task_item it;
    ls_group g;
    memset(&g, 0, sizeof g);
    LS_TRY(ls_task_prompt(&o->task, tok, length, depth, 1, rng, &it, &g));
    row->length = length, row->tokens = g.P, row->depth = depth, row->placed = it.depth;
    snprintf(row->answer, sizeof row->answer, "%s", it.answer);
    int64_t maxn = o->max_new_tokens;
    ls_status s = LS_OK;
    if (maxn <= 0) { /* the answer's tokens (after a space) and two more */
        char text[80];
        snprintf(text, sizeof text, " %s", it.answer);
        int32_t *ids;
        int64_t n = 0;
        s = ls_tok_encode(tok, text, strlen(text), &ids, &n);
        if (s == LS_OK) free(ids);
        maxn = n + 2;
    }
    ls_arena *prompt = &ar->a[LS_ARENA_PROMPT], *br = &ar->a[LS_ARENA_BRANCH];
    ls_arena_mark pm = ls_arena_get_mark(prompt), bm = ls_arena_get_mark(br);
    ls_prompt_state st;
    if (s == LS_OK) s = ls_score_capture(m, &g, &o->so, ar, &st);
    int32_t *out = ls_arena_host_alloc(br, (size_t)maxn * sizeof(int32_t));
    float *lp = ls_arena_host_alloc(br, (size_t)maxn * sizeof(float));
    if (s == LS_OK && (!out || !lp)) s = LS_ERR_NOMEM;
    int64_t len = 0;
    ls_sample_opts so;
    ls_sample_opts_default(&so);
    so.temperature = 0; /* greedy: no draw from the RNG */
    so.max_new_tokens = maxn;
    ls_rng unused;
    ls_rng_seed(&unused, 0);
    if (s == LS_OK)
        s = ls_generate_group(m, &st, g.prompt[g.P - 1], 1, &so, &unused, &out, &lp, &len, &o->so.fwd, br,
                              &ar->a[LS_ARENA_SCRATCH]);
    size_t tl = 0;
    char *text = NULL;
    if (s == LS_OK && ls_tok_decode(tok, out, len, &text, &tl) != LS_OK) { /* ids beyond the tokenizer */
        text = strdup("\xEF\xBF\xBD");
        tl = 3;
    }
    if (s == LS_OK && !text) s = LS_ERR_NOMEM;
    if (s == LS_OK) {
        row->exact = ls_task_exact(&o->task, &it, text, tl);
        row->score = ls_task_score(&o->task, &it, text, tl);
        if (!(row->response = ls_utf8_clean(text, tl))) s = LS_ERR_NOMEM;
    }
    free(text);
    ls_arena_release(br, bm);
    ls_arena_release(prompt, pm);
    ls_task_item_free(&it);
    ls_group_free(&g);
    return s;
}

ls_status ls_eval_run(const ls_model *m, const ls_tokenizer *tok, const ls_eval_opts *o, ls_arenas *ar,
                      ls_eval_result *res) {
    memset(res, 0, sizeof *res);
    if (o->n_lengths < 1 || o->n_depths < 1 || o->num_prompts < 1)
        return ls_err(LS_ERR_ARG, "evaluation needs at least one prompt length, depth and prompt");
    int64_t n = (int64_t)o->n_lengths * o->num_prompts;
    res->rows = calloc((size_t)n, sizeof *res->rows);
    if (!res->rows) return LS_ERR_NOMEM;
    double t0 = ls_now();
    int64_t tokens = 0;
    for (int l = 0; l < o->n_lengths; l++) tokens += o->lengths[l] * o->num_prompts;
    ls_trace_phase_begin("eval");
    if (o->progress) ls_progress_begin("eval", tokens);
    ls_status s = LS_OK;
    for (int l = 0; l < o->n_lengths && s == LS_OK; l++) {
        /* this length's prompts from (seed, length) alone: asking for more lengths does
         * not change them */
        ls_rng rng;
        ls_rng_seed(&rng, o->seed * 0x9e3779b97f4a7c15ull ^ (uint64_t)o->lengths[l] ^ 0x5eed0e7a1ull);
        for (int64_t k = 0; k < o->num_prompts && s == LS_OK; k++) {
            if (ls_stop_requested()) { /* a stop waits at most one prompt */
                s = ls_err(LS_ERR_INTERRUPTED, "stopped by signal %d during the evaluation, after %lld of %lld prompts",
                           ls_stop_requested(), (long long)res->n, (long long)n);
                break;
            }
            s = eval_one(m, tok, o, &rng, o->lengths[l], o->depths[k % o->n_depths], ar, &res->rows[res->n]);
            if (s == LS_OK) {
                res->exact_match += res->rows[res->n].exact;
                res->score += res->rows[res->n].score;
                res->n++;
            }
            if (o->progress) ls_progress_add(o->lengths[l]);
        }
    }
    if (o->progress) ls_progress_end();
    ls_trace_phase_end("eval");
    if (res->n) res->exact_match /= (double)res->n, res->score /= (double)res->n;
    res->seconds = ls_now() - t0;
    if (s != LS_OK) ls_eval_result_free(res);
    return s;
}

void ls_eval_result_free(ls_eval_result *r) {
    for (int64_t i = 0; r->rows && i < r->n; i++) free(r->rows[i].response);
    free(r->rows);
    memset(r, 0, sizeof *r);
}

double ls_eval_mean(const ls_eval_result *r, int64_t length, double depth, int score, int64_t *n) {
    double sum = 0;
    int64_t k = 0;
    for (int64_t i = 0; i < r->n; i++) {
        const ls_eval_row *w = &r->rows[i];
        if ((length >= 0 && w->length != length) || (depth >= 0 && w->depth != depth)) continue;
        sum += score ? w->score : w->exact;
        k++;
    }
    if (n) *n = k;
    return k ? sum / (double)k : NAN;
}

static cJSON *cell(const ls_eval_result *r, int64_t length, double depth) {
    int64_t n;
    cJSON *c = cJSON_CreateObject();
    double em = ls_eval_mean(r, length, depth, 0, &n), sc = ls_eval_mean(r, length, depth, 1, NULL);
    cJSON_AddNumberToObject(c, "exact_match", n ? em : 0);
    cJSON_AddNumberToObject(c, "score", n ? sc : 0);
    cJSON_AddNumberToObject(c, "n", (double)n);
    return c;
}

char *ls_eval_json(const ls_eval_result *r, const ls_eval_opts *o, const char *model) {
    char name[32], key[64];
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "task", ls_task_name(&o->task, name, sizeof name));
    cJSON_AddStringToObject(doc, "haystack", ls_haystack_name(o->task.haystack));
    char *mclean = model ? ls_utf8_clean(model, strlen(model)) : NULL; /* a path need not be UTF-8; JSON must */
    if (mclean) cJSON_AddStringToObject(doc, "model", mclean);
    free(mclean);
    cJSON_AddNumberToObject(doc, "seed", (double)o->seed);
    cJSON_AddNumberToObject(doc, "num_prompts", (double)r->n);
    cJSON_AddNumberToObject(doc, "exact_match", r->exact_match);
    cJSON_AddNumberToObject(doc, "score", r->score);
    cJSON *bl = cJSON_AddObjectToObject(doc, "by_length");
    for (int l = 0; l < o->n_lengths; l++) {
        snprintf(key, sizeof key, "%lld", (long long)o->lengths[l]);
        if (cJSON_GetObjectItemCaseSensitive(bl, key)) continue; /* a length given twice */
        cJSON *c = cell(r, o->lengths[l], -1);
        cJSON *bd = cJSON_AddObjectToObject(c, "by_depth");
        for (int d = 0; d < o->n_depths && d < o->num_prompts; d++) { /* the depths that got prompts */
            snprintf(key, sizeof key, "%g", o->depths[d]);
            if (!cJSON_GetObjectItemCaseSensitive(bd, key)) cJSON_AddItemToObject(bd, key, cell(r, o->lengths[l], o->depths[d]));
        }
        snprintf(key, sizeof key, "%lld", (long long)o->lengths[l]);
        cJSON_AddItemToObject(bl, key, c);
    }
    cJSON *bd = cJSON_AddObjectToObject(doc, "by_depth");
    for (int d = 0; d < o->n_depths && d < o->num_prompts; d++) {
        snprintf(key, sizeof key, "%g", o->depths[d]);
        if (!cJSON_GetObjectItemCaseSensitive(bd, key)) cJSON_AddItemToObject(bd, key, cell(r, -1, o->depths[d]));
    }
    cJSON *pr = cJSON_AddArrayToObject(doc, "prompts");
    for (int64_t i = 0; i < r->n; i++) {
        const ls_eval_row *w = &r->rows[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "length", (double)w->length);
        cJSON_AddNumberToObject(e, "tokens", (double)w->tokens);
        cJSON_AddNumberToObject(e, "depth", w->depth);
        cJSON_AddNumberToObject(e, "placed_depth", round(w->placed * 1e4) / 1e4);
        cJSON_AddStringToObject(e, "answer", w->answer);
        cJSON_AddStringToObject(e, "response", w->response ? w->response : "");
        cJSON_AddNumberToObject(e, "exact", w->exact);
        cJSON_AddNumberToObject(e, "score", round(w->score * 1e6) / 1e6);
        cJSON_AddItemToArray(pr, e);
    }
    cJSON_AddNumberToObject(doc, "seconds", round(r->seconds * 1e3) / 1e3);
    char *text = cJSON_Print(doc);
    cJSON_Delete(doc);
    size_t n = text ? strlen(text) : 0;
    char *line = text ? realloc(text, n + 2) : NULL; /* one document, one trailing newline */
    if (!line) {
        free(text);
        return NULL;
    }
    line[n] = '\n', line[n + 1] = 0;
    return line;
}
