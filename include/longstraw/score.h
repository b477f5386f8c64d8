/*
 * score.h — per-token log-probs of every member of a group: capture the prompt once
 * and continue each member from the read-only state, or (no_capture) run each
 * member's whole sequence in one plain forward (the reference path).
 */
#ifndef LONGSTRAW_SCORE_H
#define LONGSTRAW_SCORE_H

#include "longstraw/group.h"
#include "longstraw/model.h"

typedef struct {
    int no_capture;
    int64_t page_size;   /* default 64 */
    ls_dtype state_dtype; /* F32 or BF16 */
    ls_fwd_opts fwd;
} ls_score_opts;

void ls_score_opts_default(ls_score_opts *o);

typedef struct {
    double capture_s, score_s;
    size_t prompt_bytes; /* prompt arena bytes after capture */
} ls_score_stats;

/* out[i][t] = log p(y_{i,t+1} | prompt, y_{i,1..t}); out[i] from the score arena.
 * The prompt state lives in the prompt arena until the call returns (then reset). */
ls_status ls_score_group(const ls_hybrid_model *m, const ls_group *g, const ls_score_opts *o,
                         ls_arenas *ar, float **out, ls_score_stats *stats);

#endif
