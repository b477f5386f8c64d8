/*
 * grpo.h — the GRPO objective (DESIGN §7) and the update as a four-phase
 * transaction (DESIGN §3): capture → score (old and reference log-probs) → replay
 * each member under a tape and backpropagate → finalize gradients and one AdamW call.
 */
#ifndef LONGSTRAW_GRPO_H
#define LONGSTRAW_GRPO_H

#include "longstraw/family.h"
#include "longstraw/group.h"
#include "longstraw/score.h"

typedef enum { LS_LOSS_GRPO = 0, LS_LOSS_DAPO, LS_LOSS_DR_GRPO } ls_loss_type;
typedef enum { LS_SCALE_GROUP = 0, LS_SCALE_BATCH, LS_SCALE_NONE } ls_scale_rewards;

typedef struct {
    /* objective */
    double eps_low, eps_high; /* clip range [1 − eps_low, 1 + eps_high] */
    double beta;              /* k3 KL weight */
    ls_loss_type loss;
    ls_scale_rewards scale;
    int64_t max_completion_length; /* dr_grpo normaliser; 0 = max R_i */
    int num_iterations;            /* μ: updates on the same group, old log-probs from the first */
    /* optimizer */
    double lr, weight_decay, beta1, beta2, adam_eps, max_grad_norm; /* max_grad_norm 0 = off */
    /* engine */
    int no_capture;       /* naive mode: each member's whole sequence under a tape */
    int full;             /* exact gradient through the prompt (--mode full; DESIGN §3) */
    int64_t sweep_chunk;  /* full mode: positions per reverse-sweep chunk */
    int sft;              /* --loss sft: mean NLL of the response tokens (no rewards, scores, reference) */
    /* the indexer KL loss (MLA family, prefix-frozen): coef · (1/N) Σ over the batch's N
     * response tokens and the full indexer layers of KL(attention ‖ index scores),
     * trained into the indexers alone (policy aux); 0 = off */
    double aux_loss_coef;
    int64_t page_size;
    ls_dtype state_dtype;
    ls_fwd_opts fwd;      /* capture chunk, LM-head rows, temperature, communicator */
} ls_grpo_opts;

void ls_grpo_opts_default(ls_grpo_opts *o);
/* Refuse options no update can run with, naming the flag and value: AdamW's lr
 * (finite, >= 0), eps (finite, > 0), betas in [0, 1), weight decay and max grad norm
 * (finite, >= 0); the clip range, beta, temperature, iterations, the indexer KL
 * coefficient, and the indexer KL loss with full mode (not built). Every training
 * command and `plan` ask this, and ls_grpo_update_batch checks it first. */
ls_status ls_grpo_opts_check(const ls_grpo_opts *o);
/* The sweep chunk the prompt state is planned and cut with: o->sweep_chunk in full
 * mode with capture, 0 otherwise (no checkpoints, no dState). */
int64_t ls_grpo_sweep_chunk(const ls_grpo_opts *o);

/* Advantages A[G] from rewards (DESIGN §7): (r − mean)/(std + 1e-4) with Bessel's
 * correction (group, batch), or r − mean (none). */
void ls_grpo_advantages(double *A, const double *rewards, int G, ls_scale_rewards scale);

/* Token terms of one member: loss contribution (already weighted by w) returned; dl[t] =
 * ∂L/∂logπ_θ(t) (=); counters for the metrics. ref may be NULL (β = 0). */
typedef struct {
    double loss, kl_sum, clip_low, clip_high, tokens;
    double aux_loss; /* Σ of the family's auxiliary loss (the indexer KL) over the replayed queries (unweighted) */
} ls_grpo_terms;
void ls_grpo_member_terms(float *dl, ls_grpo_terms *acc, const float *lp, const float *old,
                          const float *ref, int64_t R, double A, double w, const ls_grpo_opts *o);

typedef struct {
    double loss, reward_mean, reward_std, adv_mean, adv_std; /* reward_std: mean of per-group stds (TRL) */
    double clip_low, clip_high, kl, entropy, grad_norm;
    double aux_loss; /* the auxiliary loss (the indexer KL) per response token (0 when off) */
    double len_mean;
    int64_t len_min, len_max;
    int P, G;         /* of the first group */
    int n_seq;        /* responses in the update */
    int n_rewarded;   /* of which with rewards */
    int skipped;      /* a non-finite loss or gradient: no optimizer step was taken */
    char skip_reason[384];
    double t_ref, t_capture, t_rollout, t_score, t_replay, t_sweep, t_optim, t_total;
    int n_iter;                                 /* iterations run */
    double iter_loss[64], iter_grad_norm[64];   /* per iteration (first 64) */
    size_t prompt_bytes;
    size_t sweep_peak[LS_ARENA_COUNT]; /* full mode: each arena's peak during the sweeps */
} ls_grpo_metrics;

/* AdamW state: first and second moments of the trainable tensors, parallel to the
 * policy's w/g lists (same `what`), zeroed, from `fixed`. */
typedef struct {
    ls_param *m, *v;
    int64_t n;
    int64_t step;
} ls_adamw;

ls_status ls_adamw_init(ls_adamw *a, const ls_policy *p, ls_arena *fixed);

/* Rollouts (issue 4 §2): called once per group on the first iteration, right after
 * the policy's prompt state of group `gi` is captured and before anything is scored.
 * It fills g->G, g->resp, g->R (malloc'd: ls_group_free releases them) and
 * g->rewards, sampling from `st` (read-only; forks go in the branch arena). */
typedef struct {
    ls_status (*fn)(void *ctx, int gi, ls_group *g, const ls_model *policy, const ls_prompt_state *st,
                    ls_arenas *ar);
    void *ctx;
} ls_rollout_hook;

/* One update over n_groups groups (TRL's batch of n_groups·G completions): each group
 * is captured, rolled out (hook non-NULL), scored and replayed in turn — one prompt
 * state and one tape alive at a time — then one optimizer call. The normalisers
 * count the whole batch (grpo: 1/(N·R_i), dapo: 1/ΣR, dr_grpo: 1/(N·L)); scale =
 * batch uses the std of every reward. G >= 2 per group. A non-finite loss or
 * gradient, or a step that would write a non-finite weight or moment, skips the
 * optimizer call (mt->skipped, mt->skip_reason), weights and moments untouched, and
 * returns LS_OK; the caller zeroes the gradients
 * (p->fam->policy_zero_grad) before the next. Under CP (o->fwd.comm with several
 * ranks) every rank calls this with the same groups; the gradients of the
 * replicated parameters are summed across ranks before the optimizer, so every rank
 * ends with the same weights. */
ls_status ls_grpo_update_batch(ls_policy *p, ls_adamw *adam, ls_group *groups, int n_groups,
                               const ls_rollout_hook *rollout, const ls_grpo_opts *o, ls_arenas *ar,
                               ls_grpo_metrics *mt);

/* A 64-bit hash of the tensors' bytes (FNV-1a's step over words in four lanes; the
 * receipt's trainable-tensor hash). */
uint64_t ls_params_hash(const struct ls_backend *be, const ls_param *ps, int64_t n);

/* One transaction over one group (a skipped step is an error here). The gradients
 * must be zero; with merged LoRA they receive ∂L/∂W_eff, projected onto the adapters
 * after the replay. When `adam` is NULL the update stops after the gradients (no
 * clipping, no step): that is `longstraw grad`. The reference is p->ref (needed
 * when β ≠ 0). */
/* How the transaction scores (and captures for sampling): no full-mode state. */
ls_score_opts ls_grpo_score_opts(const ls_grpo_opts *o);
/* The update's metrics in the one order every writer uses (metrics.jsonl, the receipt,
 * the C API): put(user, key, value) for loss, reward, reward_std, [advantage_mean when
 * with_advantage], kl, entropy, [aux_name's value when aux_name is non-NULL],
 * clip_ratio/low_mean, clip_ratio/high_mean, completions/mean_length, /min_length,
 * /max_length, grad_norm. */
void ls_grpo_metrics_each(const ls_grpo_metrics *mt, int with_advantage, const char *aux_name,
                          void (*put)(void *user, const char *key, double v), void *user);
/* A group defines o's objective: "rewards" or "advantages" and G >= 2 (GRPO; SFT needs
 * neither). Messages name `label` (the group file). */
ls_status ls_grpo_group_check(const ls_group *g, const ls_grpo_opts *o, const char *label);

ls_status ls_grpo_update(ls_policy *p, ls_adamw *adam, const ls_group *g, const ls_grpo_opts *o, ls_arenas *ar,
                         ls_grpo_metrics *mt);

#endif
