/*
 * task.h — built-in long-context task (issue 4 §4): passkey retrieval. A five-digit
 * key is hidden at a chosen depth in a haystack of filler sentences and asked for at
 * the end; the reward is exact match of the key at the start of the response.
 */
#ifndef LONGSTRAW_TASK_H
#define LONGSTRAW_TASK_H

#include <stddef.h>

#include "longstraw/core.h"

typedef struct {
    char *prompt;      /* malloc'd, NUL-terminated */
    size_t prompt_len; /* bytes */
    char answer[16];   /* the key, digits only */
    double depth;      /* where the key sits, as a fraction of the haystack */
} ls_passkey_item;

/* A prompt of about `prompt_bytes` bytes (≥ 256) with the key at `depth` ∈ [0, 1]
 * (negative: uniform random). Deterministic given the RNG state. */
ls_status ls_passkey_make(ls_passkey_item *it, size_t prompt_bytes, double depth, ls_rng *rng);
void ls_passkey_free(ls_passkey_item *it);
/* 1 when the response, after leading whitespace, starts with `answer` and a numeric
 * answer is not followed by another digit ("12345" does not match "123456"); else 0.
 * The exact-match reward of the passkey task and of JSONL "answer" fields. */
double ls_answer_reward(const char *answer, const char *response, size_t len);
/* ls_answer_reward against the item's key. */
double ls_passkey_reward(const ls_passkey_item *it, const char *response, size_t len);

/* Exact match scores 1; otherwise partial credit below 0.5: 0.2 × the fraction of the
 * first len(key) characters (after leading whitespace) that are digits + 0.3 × the
 * fraction equal to the key's digit at that position. A random-weight model almost
 * never hits the key, so the exact reward is constant and its advantages zero; the
 * shaped one gives the demo a gradient. */
double ls_passkey_reward_shaped(const ls_passkey_item *it, const char *response, size_t len);

#endif
