/*
 * group.c — group-file parsing and validation (cJSON).
 */
#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/config.h"
#include "longstraw/group.h"
#include "longstraw/tokenizer.h"

static ls_status parse_ids(const cJSON *a, const char *path, const char *field, int64_t vocab,
                           int32_t **out, int64_t *n) {
    if (!cJSON_IsArray(a)) return ls_err(LS_ERR_FORMAT, "%s: \"%s\" must be an array of token ids", path, field);
    int64_t len = cJSON_GetArraySize(a);
    if (len < 1) return ls_err(LS_ERR_FORMAT, "%s: \"%s\" is empty", path, field);
    int32_t *ids = malloc((size_t)len * sizeof(int32_t));
    if (!ids) return ls_err(LS_ERR_NOMEM, "%s: cannot allocate %lld ids", path, (long long)len);
    int64_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 ||
            e->valuedouble >= (double)vocab) {
            free(ids);
            if (!cJSON_IsNumber(e)) return ls_err(LS_ERR_FORMAT, "%s: \"%s\"[%lld] is not a number", path, field, (long long)i);
            return ls_err(LS_ERR_FORMAT, "%s: \"%s\"[%lld] = %g is not a token id in [0, %lld)", path,
                          field, (long long)i, e->valuedouble, (long long)vocab);
        }
        ids[i++] = (int32_t)e->valuedouble;
    }
    *out = ids;
    *n = len;
    return LS_OK;
}

/* A field that is an id array, or text when a tokenizer is given. */
static ls_status parse_seq(const cJSON *a, const char *path, const char *field, int64_t vocab,
                           const ls_tokenizer *tok, int flags, int32_t **out, int64_t *n, char **text) {
    if (!cJSON_IsString(a)) return parse_ids(a, path, field, vocab, out, n);
    if (flags & LS_GROUP_SYNTAX) { /* checked, not tokenized */
        *out = NULL;
        *n = 0;
        return a->valuestring[0] ? LS_OK : ls_err(LS_ERR_FORMAT, "%s: \"%s\" is an empty string", path, field);
    }
    if (!tok)
        return ls_err(LS_ERR_ARG, "%s: \"%s\" is text: give a tokenizer (--tokenizer tokenizer.json) or token ids",
                      path, field);
    size_t len = strlen(a->valuestring);
    ls_status s = ls_tok_encode(tok, a->valuestring, len, out, n);
    if (s != LS_OK) return ls_err_ctx(s, "%s: \"%s\"", path, field);
    if (*n < 1) {
        free(*out);
        *out = NULL;
        return ls_err(LS_ERR_FORMAT, "%s: \"%s\" is empty (no tokens)", path, field);
    }
    for (int64_t i = 0; i < *n; i++)
        if ((*out)[i] >= vocab) {
            ls_status e = ls_err(LS_ERR_ARG, "%s: \"%s\": token %lld has id %d, outside the model's vocabulary [0, %lld)",
                                 path, field, (long long)i, (*out)[i], (long long)vocab);
            free(*out);
            *out = NULL;
            return e;
        }
    if (text && !(*text = strdup(a->valuestring))) return LS_ERR_NOMEM;
    return LS_OK;
}

static ls_status parse_numbers(const cJSON *a, const char *path, const char *field, int64_t want,
                               double *out) {
    if (!cJSON_IsArray(a)) return ls_err(LS_ERR_FORMAT, "%s: \"%s\" must be an array of numbers", path, field);
    if (cJSON_GetArraySize(a) != want)
        return ls_err(LS_ERR_FORMAT, "%s: \"%s\" has %d entries, expected %lld (one per response)", path,
                      field, cJSON_GetArraySize(a), (long long)want);
    int64_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble))
            return ls_err(LS_ERR_FORMAT, "%s: \"%s\"[%lld] must be a finite number", path, field, (long long)i);
        out[i++] = e->valuedouble;
    }
    return LS_OK;
}

static ls_status parse_root(ls_group *g, const cJSON *root, const char *path, int64_t vocab,
                            const ls_tokenizer *tok, int flags) {
    if (!cJSON_IsObject(root)) return ls_err(LS_ERR_FORMAT, "%s: top level must be a JSON object", path);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!p) return ls_err(LS_ERR_FORMAT, "%s: missing field \"prompt\"", path);
    LS_TRY(parse_seq(p, path, "prompt", vocab, tok, flags, &g->prompt, &g->P, &g->prompt_text));
    const cJSON *an = cJSON_GetObjectItemCaseSensitive(root, "answer");
    if (an && !cJSON_IsNull(an)) {
        if (!cJSON_IsString(an)) return ls_err(LS_ERR_FORMAT, "%s: \"answer\" must be a string", path);
        if (!(g->answer = strdup(an->valuestring))) return LS_ERR_NOMEM;
    }
    if (flags & LS_GROUP_PROMPT_ONLY) return LS_OK; /* responses come from rollouts */
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "responses");
    if (!rs) return ls_err(LS_ERR_FORMAT, "%s: missing field \"responses\"", path);
    if (!cJSON_IsArray(rs) || cJSON_GetArraySize(rs) < 1)
        return ls_err(LS_ERR_FORMAT, "%s: \"responses\" must be a non-empty array of id arrays or strings", path);
    if ((flags & LS_GROUP_TRAIN) && cJSON_GetArraySize(rs) < 2)
        return ls_err(LS_ERR_FORMAT, "%s: \"responses\" has 1 entry: GRPO needs G >= 2 responses per group "
                                     "(advantages are relative to the group)", path);
    g->G = cJSON_GetArraySize(rs);
    g->resp = calloc((size_t)g->G, sizeof(int32_t *));
    g->R = calloc((size_t)g->G, sizeof(int64_t));
    if (!g->resp || !g->R) return ls_err(LS_ERR_NOMEM, "%s: out of memory for %d responses", path, g->G);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, rs) {
        char field[64];
        snprintf(field, sizeof field, "responses[%d]", i);
        LS_TRY(parse_seq(e, path, field, vocab, tok, flags, &g->resp[i], &g->R[i], NULL));
        i++;
    }
    const cJSON *rw = cJSON_GetObjectItemCaseSensitive(root, "rewards");
    if (rw && !cJSON_IsNull(rw)) {
        g->rewards = malloc((size_t)g->G * sizeof(double));
        if (!g->rewards) return ls_err(LS_ERR_NOMEM, "%s: out of memory for \"rewards\"", path);
        LS_TRY(parse_numbers(rw, path, "rewards", g->G, g->rewards));
    }
    const cJSON *ad = cJSON_GetObjectItemCaseSensitive(root, "advantages");
    if (ad && !cJSON_IsNull(ad)) {
        g->advantages = malloc((size_t)g->G * sizeof(double));
        if (!g->advantages) return ls_err(LS_ERR_NOMEM, "%s: out of memory for \"advantages\"", path);
        LS_TRY(parse_numbers(ad, path, "advantages", g->G, g->advantages));
    }
    if ((flags & LS_GROUP_TRAIN) && !g->rewards && !g->advantages)
        return ls_err(LS_ERR_FORMAT, "%s: needs \"rewards\" or \"advantages\" to define the objective", path);
    const cJSON *ol = cJSON_GetObjectItemCaseSensitive(root, "old_logprobs");
    if (ol && !cJSON_IsNull(ol)) {
        if (!cJSON_IsArray(ol) || cJSON_GetArraySize(ol) != g->G)
            return ls_err(LS_ERR_FORMAT, "%s: \"old_logprobs\" must be an array of %d arrays", path, g->G);
        g->old_logprobs = calloc((size_t)g->G, sizeof(float *));
        if (!g->old_logprobs) return ls_err(LS_ERR_NOMEM, "%s: out of memory for \"old_logprobs\"", path);
        i = 0;
        cJSON_ArrayForEach(e, ol) {
            char field[64];
            snprintf(field, sizeof field, "old_logprobs[%d]", i);
            if ((flags & LS_GROUP_SYNTAX) && g->R[i] == 0) { /* a text response: its length is not known here */
                i++;
                continue;
            }
            double *tmp = malloc((size_t)g->R[i] * sizeof(double));
            g->old_logprobs[i] = malloc((size_t)g->R[i] * sizeof(float));
            if (!tmp || !g->old_logprobs[i]) {
                free(tmp);
                return LS_ERR_NOMEM;
            }
            ls_status s = parse_numbers(e, path, field, g->R[i], tmp);
            /* any finite value: perturbed or off-policy log-probs may exceed 0 slightly.
             * They are stored as float: a finite double beyond FLT_MAX (-1e300) would
             * become -inf there, so it is rejected here (found by fuzz/fuzz_group). */
            for (int64_t t = 0; s == LS_OK && t < g->R[i]; t++) {
                if (!(fabs(tmp[t]) <= FLT_MAX)) {
                    s = ls_err(LS_ERR_FORMAT, "%s: \"%s\"[%lld] = %g is outside the float range", path, field,
                               (long long)t, tmp[t]);
                    break;
                }
                g->old_logprobs[i][t] = (float)tmp[t];
            }
            free(tmp);
            LS_TRY(s);
            i++;
        }
    }
    return LS_OK;
}

ls_status ls_group_parse(ls_group *g, const char *text, const char *path, int64_t vocab) {
    return ls_group_parse_ex(g, text, path, vocab, NULL, 0);
}

/* Offset of an escaped NUL (\u0000) inside a JSON string of `text`, or −1. cJSON keeps
 * no string lengths: the text after it would be dropped silently. */
static long escaped_nul(const char *text) {
    for (const char *p = text; (p = strstr(p, "\\u0000")) != NULL; p++) {
        size_t bs = 0; /* the escape is real when an even number of backslashes precede it */
        while (p - (long)bs > text && p[-(long)bs - 1] == '\\') bs++;
        if (bs % 2 == 0) return (long)(p - text);
    }
    return -1;
}

ls_status ls_group_parse_ex(ls_group *g, const char *text, const char *path, int64_t vocab,
                            const ls_tokenizer *tok, int flags) {
    memset(g, 0, sizeof *g);
    long nul = escaped_nul(text);
    if (nul >= 0)
        return ls_err(LS_ERR_FORMAT, "%s: a string holds \\u0000 (NUL) near byte %ld (line %ld): not supported in text",
                      path, nul, ls_line_of(text, nul));
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1); /* 1: nothing may follow the object */
    if (!root) {
        const char *at = end ? end : cJSON_GetErrorPtr();
        long off = at ? (long)(at - text) : -1L;
        return ls_err(LS_ERR_FORMAT, "%s: invalid JSON near byte %ld (line %ld)", path, off, ls_line_of(text, off));
    }
    ls_status s = parse_root(g, root, path, vocab, tok, flags);
    cJSON_Delete(root);
    if (s != LS_OK) ls_group_free(g);
    return s;
}

ls_status ls_group_load(ls_group *g, const char *path, int64_t vocab) {
    return ls_group_load_ex(g, path, vocab, NULL, 0);
}

ls_status ls_group_load_ex(ls_group *g, const char *path, int64_t vocab, const ls_tokenizer *tok, int flags) {
    char *text = NULL;
    memset(g, 0, sizeof *g);
    LS_TRY(ls_read_file(path, &text, NULL));
    ls_status s = ls_group_parse_ex(g, text, path, vocab, tok, flags);
    free(text);
    return s;
}

void ls_group_free(ls_group *g) {
    for (int i = 0; g->resp && i < g->G; i++) free(g->resp[i]);
    for (int i = 0; g->old_logprobs && i < g->G; i++) free(g->old_logprobs[i]);
    free(g->prompt);
    free(g->resp);
    free(g->R);
    free(g->rewards);
    free(g->advantages);
    free(g->old_logprobs);
    free(g->prompt_text);
    free(g->answer);
    memset(g, 0, sizeof *g);
}
