/*
 * eval.h — held-out evaluation on a built-in task (issue 19): for each prompt length
 * and needle depth, held-out prompts (task.h: answers training never draws) are
 * captured, a response is decoded greedily from the captured state, and exact match
 * and the shaped score are measured. `longstraw eval` and `train --eval-every` run it;
 * under CP every rank calls it with the same options (the prompts are the same on every
 * rank, the tokens rank 0's).
 */
#ifndef LONGSTRAW_EVAL_H
#define LONGSTRAW_EVAL_H

#include "longstraw/group.h"
#include "longstraw/score.h"
#include "longstraw/task.h"
#include "longstraw/tokenizer.h"

/* A task prompt of about `tokens` tokens under `tok` (the byte length is adjusted until
 * the count is within 2% + 2 below it): the item, and g->prompt / g->P / g->prompt_text
 * (the group's responses untouched). */
ls_status ls_task_prompt(const ls_task *t, const ls_tokenizer *tok, int64_t tokens, double depth, int held_out,
                         ls_rng *rng, ls_task_item *it, ls_group *g);
/* Whether the task can make a prompt of `tokens` with this tokenizer: its shortest prompt
 * (ls_task_min_bytes, drawn from a copy of rng) is not longer; else the refusal naming
 * the minimum that ls_task_prompt would give. Cheap: no prompt of that length is made. */
ls_status ls_task_check_length(const ls_task *t, const ls_tokenizer *tok, int64_t tokens, int held_out,
                               const ls_rng *rng);

#define LS_EVAL_MAX_LENGTHS 32
#define LS_EVAL_MAX_DEPTHS 32

typedef struct {
    ls_task task;
    int64_t lengths[LS_EVAL_MAX_LENGTHS]; /* prompt lengths in tokens */
    int n_lengths;
    double depths[LS_EVAL_MAX_DEPTHS]; /* needle depths: prompt k of a length at depths[k % n] */
    int n_depths;
    int64_t num_prompts;    /* per length */
    uint64_t seed;          /* prompts of length L: this seed and L (the same whatever else is asked) */
    int64_t max_new_tokens; /* 0: the answer's tokens + 2 */
    ls_score_opts so;       /* page size, state dtype, forward (threads, CP) */
    int progress;           /* a progress bar on stderr (rank 0) */
} ls_eval_opts;

/* Lengths {16384}, depths {0, 0.25, 0.5, 0.75, 1}, 16 prompts, seed 0. */
void ls_eval_opts_default(ls_eval_opts *o);
/* "N[,N...]" lengths and "D[,D...]" depths (each in [0, 1]) into o; errors name the entry. */
ls_status ls_eval_parse_lengths(ls_eval_opts *o, const char *list);
ls_status ls_eval_parse_depths(ls_eval_opts *o, const char *list);

typedef struct {
    int64_t length; /* the requested length */
    int64_t tokens; /* the prompt's tokens */
    double depth, placed; /* the requested depth level and where the needle went */
    double exact, score;
    char answer[64];
    char *response; /* decoded, malloc'd */
} ls_eval_row;

typedef struct {
    ls_eval_row *rows; /* [n] length-major, then prompt */
    int64_t n;
    double exact_match, score; /* means over the rows */
    double seconds;
} ls_eval_result;

ls_status ls_eval_run(const ls_model *m, const ls_tokenizer *tok, const ls_eval_opts *o, ls_arenas *ar,
                      ls_eval_result *res);
void ls_eval_result_free(ls_eval_result *r);
/* Means of exact match over the rows of one length (depth < 0: every depth) or of one
 * depth level (length < 0: every length); NAN when none. */
double ls_eval_mean(const ls_eval_result *r, int64_t length, double depth, int score, int64_t *n);
/* The JSON document, newline-terminated and malloc'd (NULL: out of memory):
 * {"task", "haystack", "exact_match", "score", "num_prompts", "by_length": {"L":
 * {"exact_match", "score", "n", "by_depth": {"D": {...}}}}, "by_depth": {...},
 * "prompts": [...], "seconds", ...} (`model` written as given). */
char *ls_eval_json(const ls_eval_result *r, const ls_eval_opts *o, const char *model);

#endif
