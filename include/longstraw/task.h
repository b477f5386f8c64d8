/*
 * task.h — built-in long-context tasks modelled on RULER's synthetic categories
 * (issue 19), generated from a seed at any prompt length:
 *
 *   passkey    single needle: a five-digit key hidden at a depth, asked for at the end
 *   multikey   multi-key needle: four keys, each under its own word, one of them asked for
 *   vartrack   variable tracking: a chain of assignments (a value into a variable, that
 *              variable into the next, ...) spread through the haystack; asked for every
 *              variable that holds the value, in the order they were assigned
 *
 * Each over a haystack of repeated filler sentences or of varied generated text, with
 * the (first) needle at a chosen depth. The reward is exact match of the answer at the
 * start of the response; NAME-shaped tasks give partial credit (ls_task_score).
 *
 * Held-out prompts never appear in training: answers are split by a hash into a
 * training part (7/8) and a held-out part (1/8); training items draw only training
 * answers, held-out items (eval) only held-out ones, whatever the seeds.
 */
#ifndef LONGSTRAW_TASK_H
#define LONGSTRAW_TASK_H

#include <stddef.h>

#include "longstraw/core.h"

typedef enum { LS_TASK_PASSKEY, LS_TASK_MULTIKEY, LS_TASK_VARTRACK } ls_task_kind;
typedef enum { LS_HAY_REPEAT, LS_HAY_VARIED } ls_haystack;

typedef struct {
    ls_task_kind kind;
    ls_haystack haystack;
    int shaped; /* the training reward is ls_task_score, not exact match */
} ls_task;

/* "passkey", "multikey", "vartrack", each optionally with "-shaped"; haystack "repeat"
 * (NULL: repeat) or "varied". Errors name the value and the accepted ones. */
ls_status ls_task_parse(ls_task *t, const char *name, const char *haystack);
/* The task's name as ls_task_parse takes it ("multikey-shaped") and its haystack's. */
const char *ls_task_name(const ls_task *t, char *buf, size_t cap);
const char *ls_haystack_name(ls_haystack h);

typedef struct {
    char *prompt;      /* malloc'd, NUL-terminated */
    size_t prompt_len; /* bytes */
    char answer[64];   /* what the response must start with (after leading whitespace) */
    double depth;      /* where the (asked / first) needle sits, as a fraction of the haystack */
} ls_task_item;

/* A prompt of exactly `prompt_bytes` bytes (at least ls_task_min_bytes) with the asked
 * needle (vartrack: the chain's first assignment, the rest spread over what follows)
 * at `depth` ∈ [0, 1] (negative: uniform random); `held_out` picks the answer's part.
 * Deterministic given the RNG state. */
ls_status ls_task_make(const ls_task *t, ls_task_item *it, size_t prompt_bytes, double depth, int held_out,
                       ls_rng *rng);
size_t ls_task_min_bytes(const ls_task *t);
void ls_task_item_free(ls_task_item *it);
/* 1 when `answer` belongs to the held-out part. */
int ls_task_held_out(const char *answer);

/* Exact match of the item's answer (1 or 0): after leading whitespace the response
 * starts with the answer and does not continue it (no digit after a numeric answer; no
 * further letter or name after vartrack's list). */
double ls_task_exact(const ls_task *t, const ls_task_item *it, const char *response, size_t len);
/* Exact match scores 1; otherwise partial credit below 0.5: passkey and multikey
 * 0.2 × the fraction of the first len(key) characters that are digits + 0.3 × the
 * fraction equal to the key's digit there; vartrack 0.45 × the fraction of the names
 * given in their place. */
double ls_task_score(const ls_task *t, const ls_task_item *it, const char *response, size_t len);
/* The training reward: ls_task_score for a shaped task, else ls_task_exact. */
double ls_task_reward(const ls_task *t, const ls_task_item *it, const char *response, size_t len);

/* 1 when the response, after leading whitespace, starts with `answer` and a numeric
 * answer is not followed by another digit ("12345" does not match "123456"); else 0.
 * The exact-match reward of JSONL "answer" fields. */
double ls_answer_reward(const char *answer, const char *response, size_t len);

#endif
