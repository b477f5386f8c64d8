/*
 * grpo.h — the GRPO objective (DESIGN §7) and the update as a four-phase
 * transaction (DESIGN §3): capture → score (old and reference log-probs) → replay
 * each member under a tape and backpropagate → finalize gradients and one AdamW call.
 */
#ifndef LONGSTRAW_GRPO_H
#define LONGSTRAW_GRPO_H

#include "longstraw/group.h"
#include "longstraw/lora.h"
#include "longstraw/model.h"

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
    int64_t page_size;
    ls_dtype state_dtype;
    ls_fwd_opts fwd;      /* capture chunk, LM-head rows, temperature */
    /* what is trained: NULL = every weight (full fine-tune); otherwise LoRA adapters on
     * the frozen `lora_base`, the policy being base + adapters merged (ls_lora_merge) */
    ls_lora *lora;
    const ls_hybrid_model *lora_base;
} ls_grpo_opts;

void ls_grpo_opts_default(ls_grpo_opts *o);

/* Advantages A[G] from rewards (DESIGN §7): (r − mean)/(std + 1e-4) with Bessel's
 * correction (group, batch), or r − mean (none). */
void ls_grpo_advantages(double *A, const double *rewards, int G, ls_scale_rewards scale);

/* Per-member weight of the token sum: grpo 1/(G·R_i), dapo 1/ΣR, dr_grpo 1/(G·L). */
void ls_grpo_normalisers(double *w, const int64_t *R, int G, ls_loss_type loss, int64_t max_len);

/* Token terms of one member: loss contribution (already weighted by w) returned; dl[t] =
 * ∂L/∂logπ_θ(t) (=); counters for the metrics. ref may be NULL (β = 0). */
typedef struct {
    double loss, kl_sum, clip_low, clip_high, tokens;
} ls_grpo_terms;
void ls_grpo_member_terms(float *dl, ls_grpo_terms *acc, const float *lp, const float *old,
                          const float *ref, int64_t R, double A, double w, const ls_grpo_opts *o);

typedef struct {
    double loss, reward_mean, reward_std, adv_mean, adv_std;
    double clip_low, clip_high, kl, entropy, grad_norm;
    double len_mean;
    int64_t len_min, len_max;
    int P, G;
    double t_ref, t_capture, t_score, t_replay, t_optim, t_total;
    int n_iter;                                 /* iterations run */
    double iter_loss[64], iter_grad_norm[64];   /* per iteration (first 64) */
    size_t prompt_bytes;
} ls_grpo_metrics;

/* AdamW state: first and second moments shaped like the model (fixed arena); with
 * LoRA the moments live with the adapters and only `step` is used. */
typedef struct {
    ls_hybrid_model m, v;
    int64_t step;
    int has_moments;
} ls_adamw;

ls_status ls_adamw_init(ls_adamw *a, const ls_hybrid_model *like, ls_arena *fixed);
void ls_adamw_init_lora(ls_adamw *a);

/* One transaction over one group. `grad` must be zeroed (ls_hybrid_alloc_like); with
 * LoRA it receives ∂L/∂W_eff, projected onto the adapters after the replay;
 * when `adam` is NULL the update stops after the gradients (no clipping, no step):
 * that is `longstraw grad`. `ref` may be NULL when β = 0. */
ls_status ls_grpo_update(ls_hybrid_model *policy, const ls_hybrid_model *ref, ls_hybrid_model *grad,
                         ls_adamw *adam, const ls_group *g, const ls_grpo_opts *o, ls_arenas *ar,
                         ls_grpo_metrics *mt);

#endif
