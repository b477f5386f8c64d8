/*
 * score.h — per-token log-probs of every member of a group (DESIGN §3 step 2): capture
 * the prompt once and continue each member from the read-only state, or (no_capture)
 * run each member's whole sequence in one plain forward (the reference path). The
 * `logprobs` command and the transaction's score phase both run these functions.
 */
#ifndef LONGSTRAW_SCORE_H
#define LONGSTRAW_SCORE_H

#include "longstraw/family.h"
#include "longstraw/group.h"

typedef struct {
    int no_capture;
    int64_t page_size;   /* default 64 */
    ls_dtype state_dtype; /* F32 or BF16 */
    ls_fwd_opts fwd;
    int64_t sweep_chunk; /* > 0: the state is captured for full mode (ls_state_enable_full) */
} ls_score_opts;

void ls_score_opts_default(ls_score_opts *o);

typedef struct {
    double capture_s, score_s;
    size_t prompt_bytes; /* prompt arena bytes after capture (this rank's) */
} ls_score_stats;

/* Capture x_1..x_{P−1} of `g` under `m` into a fresh state `st` from the prompt arena
 * (under CP, o->fwd.comm: this rank's pages only). */
ls_status ls_score_capture(const ls_model *m, const ls_group *g, const ls_score_opts *o, ls_arenas *ar,
                           ls_prompt_state *st);

/* The token ids member i runs: [x_P, y_1..y_{R−1}] against a state, or the whole
 * [x_1..x_P, y_1..y_{R−1}] when naive; targets are y_1..y_R either way. ids from `a`. */
ls_status ls_score_member_ids(const ls_group *g, int i, int naive, ls_arena *a, int32_t **ids, int64_t *T,
                              int64_t *out_from);

/* out[i][t] = log p(y_{i,t+1} | prompt, y_{i,1..t}) for every member, no tape; out[i]
 * allocated by the caller. st NULL: the plain forward of each whole sequence. */
ls_status ls_score_members(const ls_model *m, const ls_group *g, const ls_prompt_state *st,
                           const ls_score_opts *o, ls_arenas *ar, float **out);

/* Both, with out[i] from the score arena; the prompt state lives in the prompt arena
 * until the call returns (then released). */
ls_status ls_score_group(const ls_model *m, const ls_group *g, const ls_score_opts *o, ls_arenas *ar,
                         float **out, ls_score_stats *stats);

/* LS_OK when every out[i][t] is finite; else LS_ERR_ARG naming the first member and
 * response position whose log-prob is NaN or ±Inf (a forward that overflowed) and how
 * many are. A log-prob of a softmax over finite logits is finite, so any other value
 * is an error, never an output. */
ls_status ls_score_check_finite(const ls_group *g, float *const *out);

#endif
