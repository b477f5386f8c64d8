/*
 * fuzz_group.c — libFuzzer harness for the GRPO group reader (ls_group_parse_ex), the
 * reader of one group file / one JSONL line of `longstraw train`. Vocabulary of 300 ids:
 * the byte-level tokenizer's ids (0..256) are valid, while the JSON id path can still
 * go out of range.
 *
 * The first byte picks the mode (and is consumed), as `longstraw train` calls it:
 *   byte % 3 == 0: no tokenizer, flags 0             (a group file given as ids)
 *   byte % 3 == 1: byte-level tokenizer, LS_GROUP_TRAIN        (JSONL training data)
 *   byte % 3 == 2: byte-level tokenizer, LS_GROUP_PROMPT_ONLY  (prompts for rollouts)
 * Seeds start with '0', '1' or '2' (48, 49, 50).
 *
 * Oracles: a rejection names the label and leaves the group cleared (every pointer
 * NULL, prompt_text and answer included). An accepted group: prompt of P >= 1 ids in
 * [0, vocab); prompt_text non-NULL iff "prompt" was a string, then equal to it and to
 * the decoded ids (the byte-level tokenizer has no normalizer: lossless); id prompts
 * equal to the JSON ids; answer non-NULL iff "answer" was a string, and equal to it.
 * TRAIN: G >= 2 and rewards or advantages. PROMPT_ONLY: no responses (G = 0, nothing
 * allocated). Otherwise G >= 1 = the length of "responses", every response non-empty
 * with ids in range (text responses decode back to their text), optional numbers finite.
 * With a tokenizer, the syntax-only check (LS_GROUP_SYNTAX, what `train` runs over every
 * line before the first update) must accept every input the full reader accepts.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "fuzz_common.h"
#include "longstraw/group.h"
#include "longstraw/tokenizer.h"

#define LABEL "fuzz/data.jsonl:17"
#define VOCAB 300

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The byte-level tokenizer of `longstraw demo`, loaded at the first call and kept. */
static const ls_tokenizer *tokenizer(void) {
    static ls_tokenizer *tok;
    if (!tok) {
        char *json = NULL;
        if (ls_tok_byte_level_json(&json) != LS_OK || ls_tok_load_json(&tok, json, strlen(json), "byte-level") != LS_OK) {
            fprintf(stderr, "fuzz_group: the byte-level tokenizer does not load: %s\n", ls_err_msg());
            abort();
        }
        free(json);
        FUZZ_CHECK(ls_tok_vocab_size(tok) == 257 && ls_tok_vocab_size(tok) <= VOCAB, "vocab size %lld",
                   (long long)ls_tok_vocab_size(tok));
    }
    return tok;
}

static void check_ids(const int32_t *ids, int64_t n, const char *what) {
    FUZZ_CHECK(n >= 1 && ids, "%s: %lld ids", what, (long long)n);
    for (int64_t i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < VOCAB, "%s[%lld] = %d", what, (long long)i, ids[i]);
}

/* The ids parsed from JSON item `j`: a string must decode back to itself, an array
 * must hold exactly these ids. */
static void check_same(const cJSON *j, const int32_t *ids, int64_t n, const ls_tokenizer *tok, const char *what) {
    if (cJSON_IsString(j)) {
        FUZZ_CHECK(tok, "%s: text accepted without a tokenizer", what);
        char *dec = NULL;
        size_t len = 0;
        ls_status s = ls_tok_decode(tok, ids, n, &dec, &len);
        FUZZ_CHECK(s == LS_OK, "%s: the ids do not decode: %s", what, ls_err_msg());
        FUZZ_CHECK(len == strlen(j->valuestring) && memcmp(dec, j->valuestring, len) == 0,
                   "%s: decode(encode(text)) != text (%zu vs %zu bytes)", what, len, strlen(j->valuestring));
        free(dec);
    } else {
        FUZZ_CHECK(cJSON_IsArray(j) && cJSON_GetArraySize(j) == n, "%s: %lld ids from a JSON %s of %d", what,
                   (long long)n, cJSON_IsArray(j) ? "array" : "non-array", cJSON_GetArraySize(j));
        int64_t i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, j) {
            FUZZ_CHECK(cJSON_IsNumber(e) && e->valuedouble == (double)ids[i], "%s[%lld] = %d, JSON has %g", what,
                       (long long)i, ids[i], cJSON_IsNumber(e) ? e->valuedouble : NAN);
            i++;
        }
    }
}

static void check_accepted(const ls_group *g, const char *text, const ls_tokenizer *tok, int flags) {
    cJSON *root = cJSON_ParseWithOpts(text, NULL, 1);
    FUZZ_CHECK(cJSON_IsObject(root), "accepted text that is not one JSON object");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    FUZZ_CHECK(p, "accepted without \"prompt\"");

    check_ids(g->prompt, g->P, "prompt");
    FUZZ_CHECK((g->prompt_text != NULL) == cJSON_IsString(p), "prompt_text %s but \"prompt\" is %s",
               g->prompt_text ? "set" : "NULL", cJSON_IsString(p) ? "a string" : "not a string");
    if (g->prompt_text) FUZZ_CHECK(strcmp(g->prompt_text, p->valuestring) == 0, "prompt_text differs from \"prompt\"");
    check_same(p, g->prompt, g->P, tok, "prompt");

    const cJSON *an = cJSON_GetObjectItemCaseSensitive(root, "answer");
    FUZZ_CHECK((g->answer != NULL) == cJSON_IsString(an), "answer %s but \"answer\" is %s", g->answer ? "set" : "NULL",
               cJSON_IsString(an) ? "a string" : "not a string");
    if (g->answer) FUZZ_CHECK(strcmp(g->answer, an->valuestring) == 0, "answer differs from \"answer\"");

    if (flags & LS_GROUP_PROMPT_ONLY) {
        FUZZ_CHECK(g->G == 0 && !g->resp && !g->R && !g->rewards && !g->advantages && !g->old_logprobs,
                   "prompt-only group with G = %d or response fields", g->G);
        cJSON_Delete(root);
        return;
    }
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "responses");
    FUZZ_CHECK(g->G >= 1 && g->resp && g->R, "G = %d", g->G);
    FUZZ_CHECK(cJSON_IsArray(rs) && cJSON_GetArraySize(rs) == g->G, "G = %d but \"responses\" has %d", g->G,
               cJSON_GetArraySize(rs));
    if (flags & LS_GROUP_TRAIN)
        FUZZ_CHECK(g->G >= 2 && (g->rewards || g->advantages), "train group: G = %d, rewards %p, advantages %p", g->G,
                   (void *)g->rewards, (void *)g->advantages);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, rs) {
        char what[32];
        snprintf(what, sizeof what, "responses[%d]", i);
        check_ids(g->resp[i], g->R[i], what);
        check_same(e, g->resp[i], g->R[i], tok, what);
        if (g->old_logprobs)
            for (int64_t t = 0; t < g->R[i]; t++)
                FUZZ_CHECK(isfinite(g->old_logprobs[i][t]), "old_logprobs[%d][%lld] = %g", i, (long long)t,
                           (double)g->old_logprobs[i][t]);
        if (g->rewards) FUZZ_CHECK(isfinite(g->rewards[i]), "rewards[%d]", i);
        if (g->advantages) FUZZ_CHECK(isfinite(g->advantages[i]), "advantages[%d]", i);
        i++;
    }
    cJSON_Delete(root);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int mode = data[0] % 3;
    const ls_tokenizer *tok = mode ? tokenizer() : NULL;
    int flags = mode == 1 ? LS_GROUP_TRAIN : mode == 2 ? LS_GROUP_PROMPT_ONLY : 0;
    char *text = fuzz_strndup(data + 1, size - 1);
    ls_group g;
    memset(&g, 0xA5, sizeof g); /* the reader must initialise every field itself */
    ls_status s = ls_group_parse_ex(&g, text, LABEL, VOCAB, tok, flags);
    if (s != LS_OK) {
        fuzz_check_rejection(s, LABEL);
        /* ls_group_parse_ex frees a partial group on failure and zeroes it */
        FUZZ_CHECK(!g.prompt && !g.resp && !g.R && !g.rewards && !g.advantages && !g.old_logprobs && !g.prompt_text &&
                       !g.answer && g.P == 0 && g.G == 0,
                   "a rejected group was not cleared");
    } else {
        check_accepted(&g, text, tok, flags);
    }
    ls_group_free(&g);
    if (tok) {
        /* the quick pre-training check (LS_GROUP_SYNTAX: text not tokenized) must accept
         * whatever the full reader accepts; it may accept more (tokenizer errors) */
        ls_group q;
        memset(&q, 0xA5, sizeof q);
        ls_status sq = ls_group_parse_ex(&q, text, LABEL, VOCAB, NULL, flags | LS_GROUP_SYNTAX);
        FUZZ_CHECK(!(s == LS_OK && sq != LS_OK), "the syntax check rejects what the reader accepts: %s", ls_err_msg());
        if (sq != LS_OK) fuzz_check_rejection(sq, LABEL);
        ls_group_free(&q);
    }
    free(text);
    return 0;
}
