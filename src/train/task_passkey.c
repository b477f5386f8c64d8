/*
 * task_passkey.c — the passkey-retrieval task: filler haystack, key at a depth,
 * question at the end, exact-match reward.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/task.h"

static const char *const filler[] = {
    "The grass is green. ", "The sky is blue. ", "The sun is yellow. ", "Here we go. ",
    "There and back again. ", "The river flows to the sea. ", "A quiet wind moves the trees. ",
};
static const char *const head = "There is important information hidden inside a lot of irrelevant text. "
                                "Find it and memorise it. I will quiz you about it.\n\n";
static const char *const tail = "\n\nWhat is the pass key? The pass key is";

ls_status ls_passkey_make(ls_passkey_item *it, size_t prompt_bytes, double depth, ls_rng *rng) {
    memset(it, 0, sizeof *it);
    if (prompt_bytes < 256) return ls_err(LS_ERR_ARG, "passkey prompt length %zu is below 256 bytes", prompt_bytes);
    if (depth > 1) return ls_err(LS_ERR_ARG, "passkey depth %g is outside [0, 1]", depth);
    if (depth < 0) depth = ls_rng_uniform(rng);
    snprintf(it->answer, sizeof it->answer, "%05u", (unsigned)(10000 + ls_rng_u64(rng) % 90000));
    char needle[96];
    int nl = snprintf(needle, sizeof needle, "The pass key is %s. Remember it. %s is the pass key. ", it->answer,
                      it->answer);
    size_t fixed = strlen(head) + strlen(tail) + (size_t)nl;
    size_t hay = prompt_bytes > fixed ? prompt_bytes - fixed : 0;
    char *p = malloc(prompt_bytes + 128);
    if (!p) return ls_err(LS_ERR_NOMEM, "cannot allocate a %zu-byte prompt", prompt_bytes);
    size_t n = 0, at = (size_t)(depth * (double)hay), written = 0;
    int placed = 0;
    memcpy(p + n, head, strlen(head));
    n += strlen(head);
    while (written < hay || !placed) {
        if (!placed && written >= at) {
            memcpy(p + n, needle, (size_t)nl);
            n += (size_t)nl;
            placed = 1;
            it->depth = hay ? (double)written / (double)hay : 0;
            continue;
        }
        const char *s = filler[ls_rng_u64(rng) % (sizeof filler / sizeof filler[0])];
        size_t sl = strlen(s);
        if (written + sl > hay) { /* pad to the exact length with spaces */
            size_t k = hay - written;
            memset(p + n, ' ', k);
            n += k;
            written = hay;
            continue;
        }
        memcpy(p + n, s, sl);
        n += sl;
        written += sl;
    }
    memcpy(p + n, tail, strlen(tail));
    n += strlen(tail);
    p[n] = 0;
    it->prompt = p;
    it->prompt_len = n;
    return LS_OK;
}

void ls_passkey_free(ls_passkey_item *it) {
    free(it->prompt);
    it->prompt = NULL;
}

double ls_answer_reward(const char *ans, const char *r, size_t len) {
    size_t i = 0, k = strlen(ans);
    while (i < len && isspace((unsigned char)r[i])) i++;
    if (len - i < k || memcmp(r + i, ans, k) != 0) return 0.0;
    if (k && isdigit((unsigned char)ans[k - 1]) && i + k < len && isdigit((unsigned char)r[i + k])) return 0.0;
    return 1.0;
}

double ls_passkey_reward(const ls_passkey_item *it, const char *r, size_t len) {
    return ls_answer_reward(it->answer, r, len);
}

double ls_passkey_reward_shaped(const ls_passkey_item *it, const char *r, size_t len) {
    if (ls_passkey_reward(it, r, len) == 1.0) return 1.0;
    size_t i = 0, k = strlen(it->answer), digits = 0, match = 0;
    while (i < len && isspace((unsigned char)r[i])) i++;
    for (size_t j = 0; j < k && i + j < len; j++) {
        digits += isdigit((unsigned char)r[i + j]) != 0;
        match += r[i + j] == it->answer[j];
    }
    return 0.2 * (double)digits / (double)k + 0.3 * (double)match / (double)k;
}
