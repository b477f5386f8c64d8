/*
 * rollout.h — sampling responses from a captured prompt state (issue 4 §2): the same
 * capture serves sampling, scoring and replay. Each member continues a private fork
 * of the read-only state (ls_state_fork), one token per decode step.
 */
#ifndef LONGSTRAW_ROLLOUT_H
#define LONGSTRAW_ROLLOUT_H

#include "longstraw/family.h"

typedef struct {
    float temperature; /* 0 = greedy */
    float top_p;       /* nucleus mass in (0, 1]; 1 = full distribution */
    int64_t max_new_tokens;
    const int32_t *stop; /* stop token ids (the stop token is kept as the last token) */
    int n_stop;
} ls_sample_opts;

void ls_sample_opts_default(ls_sample_opts *o);

/* --stop's list: comma-separated token ids, or token strings of `tok` (NULL: ids only),
 * each below vocab, at most `cap` of them, into ids[*n]. Messages name --stop. */
struct ls_tokenizer;
ls_status ls_stop_tokens_parse(const char *stop, const struct ls_tokenizer *tok, int64_t vocab, int32_t *ids, int cap,
                               int *n);

/* Draw one token from logits[V] (already divided by the temperature, or raw when
 * temperature = 0: argmax). *logprob = log-probability of the token under the full
 * temperature-scaled distribution (what scoring computes). `work` holds V floats
 * and V ints for the nucleus sort. */
int32_t ls_sample_token(const float *logits, int64_t V, float top_p, int greedy, ls_rng *rng,
                        float *work, int32_t *iwork, float *logprob);

/* Generate one response continuing `prompt_state` (x_1..x_{P−1} captured) from the
 * last prompt token x_P: out[0..*len) (capacity max_new_tokens), logprobs[0..*len)
 * the sampling-time log-probs. The prompt state is read-only; the member's fork and
 * its new pages live in `branch` and are released before return. */
ls_status ls_generate(const ls_model *m, const ls_prompt_state *prompt_state, int32_t last_token,
                      const ls_sample_opts *so, ls_rng *rng, int32_t *out, float *logprobs, int64_t *len,
                      const ls_fwd_opts *fo, ls_arena *branch, ls_arena *scratch);

/* G responses at once, all continuing `prompt_state` from x_P: out[i][0..len[i]) and
 * logprobs[i][..] (capacity max_new_tokens each). Each member decodes on its own fork
 * (branch arena, released before return); every step runs the live members as one
 * batch (the family's decode step), and a member that emits a stop token leaves the batch.
 * Tokens are drawn from `rng` member by member within each step. */
ls_status ls_generate_group(const ls_model *m, const ls_prompt_state *prompt_state, int32_t last_token,
                            int G, const ls_sample_opts *so, ls_rng *rng, int32_t **out, float **logprobs,
                            int64_t *len, const ls_fwd_opts *fo, ls_arena *branch, ls_arena *scratch);

#endif
