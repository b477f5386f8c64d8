/*
 * grpo.c — the GRPO objective (DESIGN §7) and the update transaction (DESIGN §3):
 *   1. reference: capture the prompt under the reference weights, score, free;
 *   2. capture the policy's prompt state (no tape);
 *   3. score old log-probs (unless the group file gives them);
 *   4. replay members one at a time under a tape, backpropagate into the grad
 *      arena, reset the branch arena — one tape alive at a time;
 *   5. finalize: gradient norm, clipping, one AdamW call.
 * Normalisers are fixed before the replay, so serial accumulation is exact.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/backend.h"
#include "longstraw/grpo.h"
#include "longstraw/cp.h"
#include "longstraw/trace.h"

void ls_grpo_opts_default(ls_grpo_opts *o) {
    memset(o, 0, sizeof *o);
    o->eps_low = 0.2;
    o->eps_high = 0.2;
    o->beta = 0.0;
    o->loss = LS_LOSS_GRPO;
    o->scale = LS_SCALE_GROUP;
    o->num_iterations = 1;
    o->lr = 1e-6;
    o->weight_decay = 0.0;
    o->beta1 = 0.9;
    o->beta2 = 0.999;
    o->adam_eps = 1e-8;
    o->max_grad_norm = 1.0;
    o->page_size = 64;
    o->state_dtype = LS_DTYPE_F32;
    o->sweep_chunk = 512;
    ls_fwd_opts_default(&o->fwd);
}

ls_status ls_grpo_opts_check(const ls_grpo_opts *o) {
    /* AdamW (torch semantics): eps keeps the step finite where the second moment is 0
     * (eps 0 turned untouched rows into 0/0 = NaN), betas are decay rates below 1 */
    if (!(o->lr >= 0 && isfinite(o->lr))) return ls_err(LS_ERR_ARG, "--lr %g: the learning rate must be finite and >= 0", o->lr);
    if (!(o->adam_eps > 0 && isfinite(o->adam_eps)))
        return ls_err(LS_ERR_ARG, "--adam-eps %g: must be finite and > 0 (it keeps the step finite where the second "
                                  "moment is 0)", o->adam_eps);
    if (!(o->beta1 >= 0 && o->beta1 < 1)) return ls_err(LS_ERR_ARG, "--adam-beta1 %g: must be in [0, 1)", o->beta1);
    if (!(o->beta2 >= 0 && o->beta2 < 1)) return ls_err(LS_ERR_ARG, "--adam-beta2 %g: must be in [0, 1)", o->beta2);
    if (!(o->weight_decay >= 0 && isfinite(o->weight_decay)))
        return ls_err(LS_ERR_ARG, "--weight-decay %g: must be finite and >= 0", o->weight_decay);
    if (!(o->max_grad_norm >= 0 && isfinite(o->max_grad_norm)))
        return ls_err(LS_ERR_ARG, "--max-grad-norm %g: must be finite and >= 0 (0 disables clipping)", o->max_grad_norm);
    if (!(o->eps_low >= 0 && o->eps_low <= 1)) return ls_err(LS_ERR_ARG, "--epsilon %g: must be in [0, 1]", o->eps_low);
    if (!(o->eps_high >= 0 && isfinite(o->eps_high)))
        return ls_err(LS_ERR_ARG, "--epsilon-high %g: must be finite and >= 0", o->eps_high);
    if (!(o->beta >= 0 && isfinite(o->beta))) return ls_err(LS_ERR_ARG, "--beta %g: must be finite and >= 0", o->beta);
    if (!(o->fwd.temperature > 0 && isfinite(o->fwd.temperature)))
        return ls_err(LS_ERR_ARG, "--temperature %g: must be finite and > 0", (double)o->fwd.temperature);
    if (o->num_iterations < 1) return ls_err(LS_ERR_ARG, "--num-iterations %d: must be >= 1", o->num_iterations);
    if (!(o->aux_loss_coef >= 0 && isfinite(o->aux_loss_coef)))
        return ls_err(LS_ERR_ARG, "--indexer-kl-coef %g: must be finite and >= 0", o->aux_loss_coef);
    if (o->aux_loss_coef > 0 && o->full)
        return ls_err(LS_ERR_UNSUPPORTED, "--indexer-kl-coef runs in prefix-frozen mode (its gradient through the "
                                          "prompt's index keys, which --mode full would need, is not built)");
    return LS_OK;
}

int64_t ls_grpo_sweep_chunk(const ls_grpo_opts *o) { return o->full && !o->no_capture ? o->sweep_chunk : 0; }

void ls_grpo_advantages(double *A, const double *r, int G, ls_scale_rewards scale) {
    double mean = 0, var = 0;
    for (int i = 0; i < G; i++) mean += r[i];
    mean /= G;
    for (int i = 0; i < G; i++) var += (r[i] - mean) * (r[i] - mean);
    double sd = G > 1 ? sqrt(var / (G - 1)) : 0.0; /* Bessel, as torch.std / TRL */
    for (int i = 0; i < G; i++) A[i] = scale == LS_SCALE_NONE ? r[i] - mean : (r[i] - mean) / (sd + 1e-4);
    /* rewards whose mean or std overflows give no usable advantage: NaN, so the loss
     * is NaN and the update is skipped (weights untouched) */
    if (!isfinite(mean) || !isfinite(sd))
        for (int i = 0; i < G; i++) A[i] = NAN;
}

void ls_grpo_member_terms(float *dl, ls_grpo_terms *acc, const float *lp, const float *old,
                          const float *ref, int64_t R, double A, double w, const ls_grpo_opts *o) {
    double lo = 1.0 - o->eps_low, hi = 1.0 + o->eps_high;
    for (int64_t t = 0; t < R; t++) {
        double l = lp[t], rho = exp(l - (double)old[t]);
        double c = rho < lo ? lo : rho > hi ? hi : rho;
        double un = rho * A, cl = c * A;
        /* −min(ρA, clip(ρ)A): the gradient flows through whichever is smaller; a
         * clipped ratio has none (clamp's gradient is zero outside [lo, hi]) */
        double term = -(un <= cl ? un : cl), dterm = un <= cl ? -un : (c == rho ? -un : 0.0);
        double dk = 0;
        if (ref && o->beta != 0) {
            double d = (double)ref[t] - l, e = exp(d);
            double k3 = e - d - 1.0;
            term += o->beta * k3;
            dk = o->beta * (1.0 - e);
            acc->kl_sum += k3;
        }
        acc->loss += w * term;
        dl[t] = (float)(w * (dterm + dk));
        acc->clip_low += (rho < lo && A < 0);
        acc->clip_high += (rho > hi && A > 0);
        acc->tokens += 1;
    }
}

ls_status ls_adamw_init(ls_adamw *a, const ls_policy *p, ls_arena *fixed) {
    memset(a, 0, sizeof *a);
    a->m = ls_arena_host_calloc(fixed, (size_t)(p->n > 0 ? p->n : 1), sizeof(ls_param));
    a->v = ls_arena_host_calloc(fixed, (size_t)(p->n > 0 ? p->n : 1), sizeof(ls_param));
    if (!a->m || !a->v) return LS_ERR_NOMEM;
    for (int64_t k = 0; k < p->n; k++) {
        a->m[k] = a->v[k] = p->w[k];
        a->m[k].p = ls_arena_calloc(fixed, (size_t)p->w[k].n, sizeof(float));
        a->v[k].p = ls_arena_calloc(fixed, (size_t)p->w[k].n, sizeof(float));
        if (!a->m[k].p || !a->v[k].p) return LS_ERR_NOMEM;
    }
    a->n = p->n;
    return LS_OK;
}

/* ---- the transaction ------------------------------------------------------------ */

/* How the transaction scores (and the reference captures): no full-mode state. */
void ls_grpo_metrics_each(const ls_grpo_metrics *mt, int with_advantage, const char *aux_name,
                          void (*put)(void *user, const char *key, double v), void *user) {
    put(user, "loss", mt->loss);
    put(user, "reward", mt->reward_mean);
    put(user, "reward_std", mt->reward_std);
    if (with_advantage) put(user, "advantage_mean", mt->adv_mean);
    put(user, "kl", mt->kl);
    put(user, "entropy", mt->entropy);
    if (aux_name) put(user, aux_name, mt->aux_loss);
    put(user, "clip_ratio/low_mean", mt->clip_low);
    put(user, "clip_ratio/high_mean", mt->clip_high);
    put(user, "completions/mean_length", mt->len_mean);
    put(user, "completions/min_length", (double)mt->len_min);
    put(user, "completions/max_length", (double)mt->len_max);
    put(user, "grad_norm", mt->grad_norm);
}

ls_score_opts ls_grpo_score_opts(const ls_grpo_opts *o) {
    return (ls_score_opts){o->no_capture, o->page_size, o->state_dtype, o->fwd, 0};
}

ls_status ls_grpo_group_check(const ls_group *g, const ls_grpo_opts *o, const char *label) {
    if (o->sft) return LS_OK;
    if (!g->rewards && !g->advantages)
        return ls_err(LS_ERR_FORMAT, "%s: needs \"rewards\" or \"advantages\" to define the objective (or --loss sft)",
                      label);
    if (g->G < 2)
        return ls_err(LS_ERR_FORMAT, "%s: field \"responses\" has %d entry: GRPO needs G >= 2 responses per group",
                      label, g->G);
    return LS_OK;
}

/* The global gradient norm: with expert parallelism the sharded tensors' squares are
 * summed over the ranks holding the other shares (every rank then clips alike). */
static ls_status grad_norm(const ls_policy *p, double *out) {
    double s[2] = {0, 0}; /* replicated, sharded */
    for (int64_t k = 0; k < p->n; k++) {
        double sk = 0;
        ls_op_sumsq(p->be, &sk, p->g[k].p, p->g[k].n);
        s[p->sharded && p->sharded[k]] += sk;
    }
    if (p->ep && p->sharded) LS_TRY(ls_comm_allreduce_f64(p->ep, &s[1], 1, LS_REDUCE_SUM));
    *out = sqrt(s[0] + s[1]);
    return LS_OK;
}

static float tensor_decay(const ls_param *w, const ls_grpo_opts *o) {
    return (o->weight_decay != 0 && !w->no_decay) ? (float)(1.0 - o->lr * o->weight_decay) : 1.0f;
}

/* Clip (torch.nn.utils.clip_grad_norm_ semantics) and one AdamW step — unless it
 * would write a non-finite weight or moment anywhere (finite gradients can still do
 * that: a huge first moment over a zero second moment, an overflowing product): then
 * nothing is written, the step count stays, and *skipped says where (one pass that
 * only checks, then the pass that writes). With expert parallelism every rank of the
 * group learns whether any rank would, so they skip together. */
static ls_status optimize(ls_policy *p, ls_adamw *adam, const ls_grpo_opts *o, double gnorm, char *skipped,
                          size_t cap) {
    ls_adamw_hp c = {.clip = 1.0, .lr = o->lr, .eps = o->adam_eps, .b1 = (float)o->beta1, .b2 = (float)o->beta2};
    if (o->max_grad_norm > 0) {
        double coef = o->max_grad_norm / (gnorm + 1e-6);
        if (coef < 1.0) c.clip = coef;
    }
    int64_t step = adam->step + 1;
    c.bc1 = 1.0 - pow(o->beta1, (double)step);
    c.bc2 = 1.0 - pow(o->beta2, (double)step);
    LS_ASSERT(adam->n == p->n, "optimizer holds %lld moments for %lld tensors", (long long)adam->n, (long long)p->n);
    skipped[0] = 0;
    int64_t bad_k = -1;
    for (int64_t k = 0; k < p->n && bad_k < 0; k++) {
        int64_t i;
        float at[3];
        const float *w = p->w[k].p;
        ls_op_adamw_check(p->be, &i, at, &c, tensor_decay(&p->w[k], o), w, p->g[k].p, adam->m[k].p, adam->v[k].p,
                          p->w[k].n);
        if (i < 0) continue;
        bad_k = k;
        float wi; /* the weight in question, read back for the message */
        p->be->i->to_host(p->be, &wi, w + i, sizeof wi);
        snprintf(skipped, cap, "the step would write a non-finite value into %s (element %lld: weight %g -> %g, "
                 "exp_avg %g, exp_avg_sq %g)", p->w[k].what ? p->w[k].what : "a trainable tensor", (long long)i,
                 (double)wi, (double)at[0], (double)at[1], (double)at[2]);
    }
    if (p->ep && p->sharded) { /* the other ranks' shares: skip together */
        float any = bad_k >= 0 ? 1.0f : 0.0f;
        LS_TRY(ls_comm_allreduce_f32(p->ep, &any, 1, LS_REDUCE_MAX));
        if (any > 0 && bad_k < 0) {
            snprintf(skipped, cap, "the step would write a non-finite value into an expert of another --ep rank");
            bad_k = 0;
        }
    }
    if (bad_k >= 0) return LS_OK;
    adam->step = step;
    for (int64_t k = 0; k < p->n; k++)
        ls_op_adamw_step(p->be, &c, tensor_decay(&p->w[k], o), p->w[k].p, p->g[k].p, adam->m[k].p, adam->v[k].p,
                         p->w[k].n);
    p->fam->policy_step_done(p);
    return LS_OK;
}

/* Per-group results that live in the score arena for the whole update. */
typedef struct {
    double *A;   /* [G] advantages */
    float **old; /* [G] → [R_i] old log-probs */
    float **rlp; /* [G] → [R_i] reference log-probs (β ≠ 0) */
} group_scores;

static ls_status check_group(const ls_group *g, int gi, const ls_grpo_opts *o) {
    if (o->sft) { /* any number of responses, no rewards */
        if (g->G < 1) return ls_err(LS_ERR_ARG, "group %d has no response", gi);
        for (int i = 0; i < g->G; i++)
            if (g->R[i] < 1) return ls_err(LS_ERR_ARG, "group %d, response %d is empty", gi, i);
        return LS_OK;
    }
    if (g->G < 2)
        return ls_err(LS_ERR_ARG, "group %d has %d response%s: GRPO needs G >= 2 (advantages are relative to the group)",
                      gi, g->G, g->G == 1 ? "" : "s");
    if (!g->advantages && !g->rewards)
        return ls_err(LS_ERR_ARG, "group %d has neither \"rewards\" nor \"advantages\"", gi);
    for (int i = 0; i < g->G; i++)
        if (g->R[i] < 1) return ls_err(LS_ERR_ARG, "group %d, response %d is empty", gi, i);
    return LS_OK;
}

/* Score-arena buffers of one group: old (unless given) and reference log-probs. */
static ls_status alloc_scores(group_scores *gs, const ls_group *g, const ls_grpo_opts *o, ls_arena *sa) {
    int G = g->G;
    gs->A = ls_arena_alloc(sa, (size_t)G * sizeof(double));
    gs->old = ls_arena_calloc(sa, (size_t)G, sizeof(float *));
    gs->rlp = ls_arena_calloc(sa, (size_t)G, sizeof(float *));
    if (!gs->A || !gs->old || !gs->rlp) return LS_ERR_NOMEM;
    for (int i = 0; i < G; i++) {
        gs->old[i] = g->old_logprobs ? g->old_logprobs[i] : ls_arena_alloc(sa, (size_t)g->R[i] * sizeof(float));
        if (!gs->old[i]) return LS_ERR_NOMEM;
        if (o->beta != 0 && !(gs->rlp[i] = ls_arena_alloc(sa, (size_t)g->R[i] * sizeof(float)))) return LS_ERR_NOMEM;
    }
    return LS_OK;
}

/* Advantages of every group. scale = batch: r − group mean over the std of the
 * whole batch (TRL's scale_rewards="batch"). */
static void advantages(group_scores *gs, const ls_group *gr, int n, ls_scale_rewards scale) {
    double sd = 0;
    if (scale == LS_SCALE_BATCH) {
        double mean = 0, var = 0;
        int64_t N = 0;
        for (int k = 0; k < n; k++)
            for (int i = 0; i < gr[k].G && gr[k].rewards; i++) mean += gr[k].rewards[i], N++;
        mean /= N > 0 ? (double)N : 1.0;
        for (int k = 0; k < n; k++)
            for (int i = 0; i < gr[k].G && gr[k].rewards; i++) var += (gr[k].rewards[i] - mean) * (gr[k].rewards[i] - mean);
        sd = N > 1 ? sqrt(var / (double)(N - 1)) : 0.0;
    }
    for (int k = 0; k < n; k++) {
        const ls_group *g = &gr[k];
        if (g->advantages) {
            memcpy(gs[k].A, g->advantages, (size_t)g->G * sizeof(double));
        } else if (scale == LS_SCALE_BATCH) { /* r − group mean, over the batch's std */
            ls_grpo_advantages(gs[k].A, g->rewards, g->G, LS_SCALE_NONE);
            for (int i = 0; i < g->G; i++) gs[k].A[i] /= sd + 1e-4;
        } else {
            ls_grpo_advantages(gs[k].A, g->rewards, g->G, scale);
        }
    }
}

/* The loss is Σ_groups Σ_i c·u_i·Σ_t term: u_i is known when member i is replayed,
 * the batch constant c only once every response is known (rollouts sample group by
 * group), so c scales the finished gradient. grpo u = 1/R_i, c = 1/N; dapo u = 1,
 * c = 1/ΣR; dr_grpo u = 1, c = 1/(N·L). */
static double member_weight(const ls_grpo_opts *o, int64_t R) {
    return o->loss == LS_LOSS_GRPO && !o->sft ? 1.0 / (double)R : 1.0;
}

/* SFT (--loss sft): −Σ_t log p(y_t); the batch constant 1/ΣR makes it the mean NLL per
 * response token over the batch (TRL's SFTTrainer, completion-only loss). */
static void sft_terms(float *dl, ls_grpo_terms *acc, const float *lp, int64_t R) {
    for (int64_t t = 0; t < R; t++) {
        acc->loss -= lp[t];
        dl[t] = -1.0f;
        acc->tokens += 1;
    }
}

static double batch_constant(const ls_group *gr, int n, ls_loss_type loss, int sft, int64_t max_len) {
    int64_t N = 0, tot = 0, mx = 0;
    for (int k = 0; k < n; k++)
        for (int i = 0; i < gr[k].G; i++) {
            N++;
            tot += gr[k].R[i];
            mx = gr[k].R[i] > mx ? gr[k].R[i] : mx;
        }
    if (max_len <= 0) max_len = mx;
    if (sft) return 1.0 / (double)tot;
    switch (loss) {
    case LS_LOSS_DAPO: return 1.0 / (double)tot;
    case LS_LOSS_DR_GRPO: return 1.0 / ((double)N * (double)max_len);
    default: return 1.0 / (double)N;
    }
}

static void batch_metrics(ls_grpo_metrics *mt, const ls_group *gr, const group_scores *gs, int n) {
    int64_t N = 0, nr = 0;
    double len = 0, rsum = 0, rstd = 0, asum = 0;
    mt->len_min = INT64_MAX;
    for (int k = 0; k < n; k++) {
        const ls_group *g = &gr[k];
        double gm = 0, gv = 0;
        for (int i = 0; i < g->G; i++) {
            N++;
            len += (double)g->R[i];
            asum += gs[k].A[i];
            mt->len_min = g->R[i] < mt->len_min ? g->R[i] : mt->len_min;
            mt->len_max = g->R[i] > mt->len_max ? g->R[i] : mt->len_max;
            if (g->rewards) gm += g->rewards[i] / g->G;
        }
        if (!g->rewards) continue;
        for (int i = 0; i < g->G; i++) gv += (g->rewards[i] - gm) * (g->rewards[i] - gm);
        rsum += gm * g->G;
        rstd += g->G > 1 ? sqrt(gv / (g->G - 1)) : 0; /* TRL: mean of the per-group stds */
        nr++;
        mt->n_rewarded += g->G;
    }
    mt->G = n > 0 ? gr[0].G : 0;
    mt->P = 0; /* the longest prompt of the batch */
    for (int k = 0; k < n; k++) mt->P = gr[k].P > mt->P ? (int)gr[k].P : mt->P;
    mt->n_seq = (int)N;
    mt->len_mean = N ? len / (double)N : 0;
    mt->reward_mean = mt->n_rewarded ? rsum / (double)mt->n_rewarded : 0;
    mt->reward_std = nr ? rstd / (double)nr : 0;
    mt->adv_mean = N ? asum / (double)N : 0;
    if (mt->len_min == INT64_MAX) mt->len_min = 0;
}

/* Reference log-probs of group g: capture its own prompt state on top of whatever the
 * prompt arena holds, score, release. */
static ls_status reference(const ls_model *ref, const ls_group *g, const ls_grpo_opts *o, ls_arenas *ar,
                           float **rlp) {
    ls_arena *pr = &ar->a[LS_ARENA_PROMPT];
    ls_arena_mark pm = ls_arena_get_mark(pr);
    ls_prompt_state st;
    ls_score_opts so = ls_grpo_score_opts(o);
    ls_status s = LS_OK;
    ls_trace_phase_begin("reference");
    if (!o->no_capture) s = ls_score_capture(ref, g, &so, ar, &st);
    if (s == LS_OK) s = ls_score_members(ref, g, o->no_capture ? NULL : &st, &so, ar, rlp);
    ls_trace_phase_end("reference");
    ls_arena_release(pr, pm);
    return s;
}

static int64_t sum_R(const ls_group *g) {
    int64_t t = 0;
    for (int i = 0; i < g->G; i++) t += g->R[i];
    return t;
}

/* Replay the members of one group under a tape, one at a time; accumulates the
 * gradient (weights u_i) and the token terms. */
static ls_status replay(ls_policy *p, const ls_group *g, const group_scores *gs,
                        ls_prompt_state *stp, const ls_grpo_opts *o, ls_arenas *ar, ls_grpo_terms *acc,
                        double *ent_sum) {
    ls_arena *sa = &ar->a[LS_ARENA_SCORE], *br = &ar->a[LS_ARENA_BRANCH];
    ls_arena_mark sm = ls_arena_get_mark(sa);
    int64_t rmax = 0;
    for (int i = 0; i < g->G; i++) rmax = g->R[i] > rmax ? g->R[i] : rmax;
    float *lp = ls_arena_alloc(sa, (size_t)rmax * sizeof(float)), *dl = ls_arena_alloc(sa, (size_t)rmax * sizeof(float));
    float *ent = ls_arena_alloc(sa, (size_t)rmax * sizeof(float));
    if (!lp || !dl || !ent) return LS_ERR_NOMEM;
    ls_status s = LS_OK;
    ls_trace_phase_begin("replay");
    ls_progress_begin("replay", sum_R(g));
    for (int i = 0; i < g->G && s == LS_OK; i++) {
        ls_arena_mark bm = ls_arena_get_mark(br);
        int32_t *ids;
        int64_t T, from;
        ls_branch_tape *tape = NULL;
        ls_trace_set_member(i);
        s = ls_score_member_ids(g, i, o->no_capture, br, &ids, &T, &from);
        /* naive mode detaches the prompt at `from` (prefix-frozen) or nothing (full) */
        if (s == LS_OK)
            s = p->fam->branch_fwd(&p->policy, stp, ids, T, from, o->full ? 0 : from, g->resp[i], lp, ent, &tape,
                                   &o->fwd, br, &ar->a[LS_ARENA_SCRATCH]);
        if (s == LS_OK) {
            if (o->sft)
                sft_terms(dl, acc, lp, g->R[i]);
            else
                ls_grpo_member_terms(dl, acc, lp, gs->old[i], o->beta != 0 ? gs->rlp[i] : NULL, g->R[i], gs->A[i],
                                     member_weight(o, g->R[i]), o);
            for (int64_t t = 0; t < g->R[i]; t++) *ent_sum += ent[t];
            ls_fwd_opts fo = o->fwd; /* the indexer KL loss adds its sum to acc */
            fo.aux_loss = o->aux_loss_coef > 0, fo.aux_loss_sum = &acc->aux_loss;
            s = p->fam->branch_bwd(&p->policy, &p->grad, tape, dl, o->full && stp ? stp : NULL, &fo,
                                   &ar->a[LS_ARENA_SCRATCH]);
        }
        ls_arena_release(br, bm);
        ls_progress_add(g->R[i]);
    }
    ls_trace_set_member(-1);
    ls_progress_end();
    ls_trace_phase_end("replay");
    ls_arena_release(sa, sm);
    return s;
}

/* Every gradient buffer summed across the ranks (reduce + broadcast: identical bits). */
static ls_status sum_grad_buffers(const ls_policy *p, const ls_comm *c) {
    ls_param *g = NULL;
    int64_t n = 0;
    LS_TRY(p->fam->policy_grad_buffers(p, &g, &n));
    ls_status s = ls_dist_sum_params(p->be, c, g, n);
    free(g);
    return s;
}

/* One group of one iteration: capture; on the first iteration the rollout, the
 * reference and the old log-probs; then the replay. The prompt state dies here. */
static ls_status run_group(ls_policy *p, ls_group *g, int gi, group_scores *gs, int first,
                           const ls_rollout_hook *rollout, const ls_grpo_opts *o, ls_arenas *ar, ls_grpo_terms *acc,
                           double *ent_sum, ls_grpo_metrics *mt) {
    ls_arena *pr = &ar->a[LS_ARENA_PROMPT];
    ls_score_opts so = ls_grpo_score_opts(o);
    ls_status s = LS_OK;
    if (first && !rollout && o->beta != 0 && !o->sft)
        LS_TRY(reference(&p->ref, g, o, ar, gs->rlp)); /* before: peak stays P */
    double t0 = ls_now();
    ls_arena_mark pm = ls_arena_get_mark(pr);
    ls_prompt_state st;
    ls_prompt_state *stp = NULL;
    if (!o->no_capture) {
        ls_trace_phase_begin("capture");
        ls_progress_begin("capture", g->P - 1);
        so.sweep_chunk = ls_grpo_sweep_chunk(o); /* full mode: checkpoints and the dState buffer */
        s = ls_score_capture(&p->policy, g, &so, ar, &st);
        so.sweep_chunk = 0;
        ls_progress_end();
        ls_trace_phase_end("capture");
        stp = &st;
        size_t pb = pr->cur - pm.cur;
        mt->prompt_bytes = pb > mt->prompt_bytes ? pb : mt->prompt_bytes;
    }
    mt->t_capture += ls_now() - t0;
    if (s == LS_OK && first && rollout) {
        t0 = ls_now();
        s = rollout->fn(rollout->ctx, gi, g, &p->policy, stp, ar);
        if (s == LS_OK) s = check_group(g, gi, o);
        if (s == LS_OK) s = alloc_scores(gs, g, o, &ar->a[LS_ARENA_SCORE]);
        if (s == LS_OK) advantages(gs, g, 1, o->scale);
        mt->t_rollout += ls_now() - t0;
        t0 = ls_now();
        /* the reference needs the responses: its state goes on top of the policy's */
        if (s == LS_OK && o->beta != 0) s = reference(&p->ref, g, o, ar, gs->rlp);
        mt->t_ref += ls_now() - t0;
    }
    t0 = ls_now();
    if (s == LS_OK && first && !g->old_logprobs && !o->sft) {
        ls_trace_phase_begin("score");
        s = ls_score_members(&p->policy, g, stp, &so, ar, gs->old);
        ls_trace_phase_end("score");
    }
    mt->t_score += ls_now() - t0;
    t0 = ls_now();
    if (s == LS_OK) s = replay(p, g, gs, stp, o, ar, acc, ent_sum);
    mt->t_replay += ls_now() - t0;
    t0 = ls_now();
    if (s == LS_OK && o->full && stp) { /* the gradient through the prompt, chunk by chunk back */
        ls_trace_phase_begin("sweep");
        ls_progress_begin("sweep", g->P - 1);
        const ls_comm *cp = o->fwd.comm && ls_comm_size(o->fwd.comm) > 1 ? o->fwd.comm : NULL;
        /* Under CP the replay left the same gradient on every rank, but each rank's
         * sweep adds only its own chunks' part: rank 0 keeps what came before, the
         * others start from zero, and one SUM makes the whole on every rank. */
        if (cp && ls_comm_rank(cp) != 0) p->fam->policy_zero_grad(p);
        size_t keep[LS_ARENA_COUNT]; /* the sweep's own peaks (the run-wide ones restored after) */
        for (int a = 0; a < LS_ARENA_COUNT; a++) keep[a] = ar->a[a].peak, ls_arena_reset_peak(&ar->a[a]);
        s = p->fam->sweep(&p->policy, &p->grad, stp, g->prompt, &o->fwd, &ar->a[LS_ARENA_BRANCH],
                          &ar->a[LS_ARENA_SCRATCH]);
        for (int a = 0; a < LS_ARENA_COUNT; a++) {
            size_t pk = ar->a[a].peak;
            mt->sweep_peak[a] = pk > mt->sweep_peak[a] ? pk : mt->sweep_peak[a];
            ar->a[a].peak = keep[a] > pk ? keep[a] : pk;
        }
        if (s == LS_OK && cp) s = sum_grad_buffers(p, cp);
        ls_progress_end();
        ls_trace_phase_end("sweep");
    }
    mt->t_sweep += ls_now() - t0;
    ls_arena_release(pr, pm);
    return s;
}

/* g[k] *= c, or c_aux where aux[k] (the indexer KL loss's tensors; aux may be NULL). */
static void scale_params(const ls_backend *be, const ls_param *gp, int64_t n, double c, const uint8_t *aux,
                         double c_aux) {
    for (int64_t k = 0; k < n; k++) ls_op_scale(be, gp[k].p, (float)(aux && aux[k] ? c_aux : c), gp[k].n);
}

/* A 64-bit hash of the trainable tensors' bytes (NULL buffers skipped), for telling
 * whether ranks hold the same bits: FNV-1a's step (xor, multiply by an odd constant: a
 * bijection of the state, so a single changed word always changes the hash) over 8-byte
 * words in four interleaved lanes, so the multiplies overlap (the byte-wise FNV-1a it
 * replaced read 0.6 GB/s, 1% of a CP rank's update); a tensor's tail bytes one by one. */
static void hash_bytes(uint64_t h[4], const unsigned char *q, int64_t m) {
    const uint64_t P = 1099511628211ull;
    int64_t i = 0;
    for (; i + 32 <= m; i += 32) {
        uint64_t w[4];
        memcpy(w, q + i, sizeof w);
        for (int j = 0; j < 4; j++) h[j] = (h[j] ^ w[j]) * P;
    }
    for (; i < m; i++) h[0] = (h[0] ^ q[i]) * P;
}

uint64_t ls_params_hash(const ls_backend *be, const ls_param *ps, int64_t n) {
    uint64_t h[4] = {1469598103934665603ull, 0x9e3779b97f4a7c15ull, 0xc2b2ae3d27d4eb4full, 0x165667b19e3779f9ull};
    unsigned char buf[1 << 14]; /* the tensors read back in pieces (host memory: read in place) */
    for (int64_t k = 0; k < n; k++) {
        const unsigned char *b = (const unsigned char *)ps[k].p;
        int64_t bytes = ps[k].n * (int64_t)sizeof(float);
        for (int64_t o = 0; b && o < bytes; o += (int64_t)sizeof buf) {
            int64_t m = bytes - o < (int64_t)sizeof buf ? bytes - o : (int64_t)sizeof buf;
            const unsigned char *q = b + o;
            if (!be->host_mem) be->i->to_host(be, buf, q, (size_t)m), q = buf;
            hash_bytes(h, q, m);
        }
    }
    uint64_t r = h[0];
    for (int j = 1; j < 4; j++) r = (r ^ (h[j] >> 29) ^ h[j]) * 1099511628211ull;
    return r;
}

/* Gradient finalization under CP (DESIGN §8). The attention merge's backward sums the
 * ranks' contributions inside every layer, so each rank's replay ends with the whole
 * gradient of the replicated parameters; they agree bit for bit when every rank
 * computed the same way. A hash tells; if any rank differs (e.g. other thread counts
 * reordered a sum) rank 0's gradients are broadcast, so every rank takes the same
 * step whatever happened. */
static ls_status finalize_grads(const ls_policy *p, const ls_comm *c) {
    int N = c ? ls_comm_size(c) : 1;
    if (N <= 1) return LS_OK;
    uint64_t h = ls_params_hash(p->be, p->g, p->n), *all = calloc((size_t)N, sizeof *all);
    if (!all) return ls_err(LS_ERR_NOMEM, "cannot gather %d gradient hashes", N);
    ls_status s = ls_comm_allgather(c, &h, all, sizeof h);
    int same = 1;
    for (int r = 1; r < N && s == LS_OK; r++) same &= all[r] == all[0];
    free(all);
    if (s != LS_OK || same) return s;
    ls_trace_event("grad_broadcast", "\"reason\": \"gradient hashes differ across ranks\"");
    if (s == LS_OK) s = ls_dist_bcast_params(p->be, c, p->g, p->n, 0);
    return s;
}

ls_status ls_grpo_update_batch(ls_policy *p, ls_adamw *adam, ls_group *groups, int n_groups,
                               const ls_rollout_hook *rollout, const ls_grpo_opts *o, ls_arenas *ar,
                               ls_grpo_metrics *mt) {
    ls_arena *sa = &ar->a[LS_ARENA_SCORE];
    double t_start = ls_now(), t0;
    memset(mt, 0, sizeof *mt);
    if (n_groups < 1) return ls_err(LS_ERR_ARG, "an update needs at least one group");
    LS_TRY(ls_grpo_opts_check(o));
    if (o->sft && o->beta != 0)
        return ls_err(LS_ERR_ARG, "--loss sft has no reference term: --beta must be 0 (got %g)", o->beta);
    if (o->sft && rollout) return ls_err(LS_ERR_ARG, "--loss sft trains on given responses: not with rollouts");
    if (o->full && !p->fam->sweep) return ls_err(LS_ERR_UNSUPPORTED, "family %s has no full-mode sweep", p->fam->name);
    if (o->aux_loss_coef > 0 && !p->aux)
        return ls_err(LS_ERR_ARG, "the indexer KL loss needs the indexers in the trainable set (policy opened without it)");
    if (o->beta != 0 && !p->ref.impl) return ls_err(LS_ERR_ARG, "beta = %g needs a reference policy", o->beta);
    if (!adam && o->num_iterations != 1) return ls_err(LS_ERR_ARG, "gradients only: num_iterations must be 1");
    if (rollout && o->no_capture) return ls_err(LS_ERR_ARG, "rollouts sample from a captured prompt state: not with no_capture");
    if (rollout && n_groups > 1 && o->scale == LS_SCALE_BATCH)
        return ls_err(LS_ERR_ARG, "scale_rewards = batch needs every reward before the first replay, but rollouts "
                                  "sample group by group: use group or none, or one group per update");
    ls_arena_mark score_mark = ls_arena_get_mark(sa);
    group_scores *gs = ls_arena_calloc(sa, (size_t)n_groups, sizeof *gs);
    ls_status s = gs ? LS_OK : LS_ERR_NOMEM;
    for (int k = 0; !rollout && k < n_groups && s == LS_OK; k++) {
        s = check_group(&groups[k], k, o);
        if (s == LS_OK) s = alloc_scores(&gs[k], &groups[k], o, sa);
    }
    if (s == LS_OK && !rollout && !o->sft) advantages(gs, groups, n_groups, o->scale);
    for (int it = 0; it < o->num_iterations && s == LS_OK; it++) {
        ls_grpo_terms acc = {0};
        double ent_sum = 0;
        for (int k = 0; k < n_groups && s == LS_OK; k++)
            s = run_group(p, &groups[k], k, &gs[k], it == 0, rollout, o, ar, &acc, &ent_sum, mt);
        if (s != LS_OK) break;
        if (it == 0) batch_metrics(mt, groups, gs, n_groups);
        t0 = ls_now();
        ls_trace_phase_begin("optimize");
        p->fam->policy_grads_done(p);
        s = finalize_grads(p, o->fwd.comm);
        if (s != LS_OK) {
            ls_trace_phase_end("optimize");
            break;
        }
        double c = batch_constant(groups, n_groups, o->loss, o->sft, o->max_completion_length);
        int64_t ntok = 0; /* the indexer KL loss is a mean over the batch's response tokens */
        for (int k = 0; k < n_groups; k++) ntok += sum_R(&groups[k]);
        double caux = ntok > 0 ? o->aux_loss_coef / (double)ntok : 0;
        scale_params(p->be, p->g, p->n, c, p->aux, caux);
        mt->loss = c * acc.loss;
        mt->aux_loss = ntok > 0 ? acc.aux_loss / (double)ntok : 0;
        mt->kl = acc.tokens > 0 ? acc.kl_sum / acc.tokens : 0;
        mt->clip_low = acc.tokens > 0 ? acc.clip_low / acc.tokens : 0;
        mt->clip_high = acc.tokens > 0 ? acc.clip_high / acc.tokens : 0;
        mt->entropy = acc.tokens > 0 ? ent_sum / acc.tokens : 0;
        s = grad_norm(p, &mt->grad_norm);
        if (s != LS_OK) {
            ls_trace_phase_end("optimize");
            break;
        }
        if (it < 64) mt->iter_loss[it] = mt->loss, mt->iter_grad_norm[it] = mt->grad_norm;
        mt->n_iter = it + 1;
        if (!isfinite(mt->grad_norm) || !isfinite(mt->loss)) {
            /* a NaN or Inf anywhere (rewards, log-probs, loss, gradients) reaches the
             * loss or the norm: skip the step, weights and optimizer state untouched */
            mt->skipped = 1;
            snprintf(mt->skip_reason, sizeof mt->skip_reason, "non-finite %s (loss %g, grad norm %g)",
                     isfinite(mt->loss) ? "gradient" : "loss", mt->loss, mt->grad_norm);
            ls_trace_event("optimizer",
                           "\"update\": %lld, \"iteration\": %d, \"step\": %lld, \"grad_norm\": null, \"lr\": %g, "
                           "\"skipped\": true",
                           (long long)ls_trace_update(), it, adam ? (long long)adam->step : 0LL, o->lr);
            ls_trace_phase_end("optimize");
            mt->t_optim += ls_now() - t0;
            break;
        }
        if (adam) {
            s = optimize(p, adam, o, mt->grad_norm, mt->skip_reason, sizeof mt->skip_reason);
            if (s == LS_OK && mt->skip_reason[0]) { /* reported as the non-finite-gradient skip is */
                mt->skipped = 1;
                ls_trace_event("optimizer",
                               "\"update\": %lld, \"iteration\": %d, \"step\": %lld, \"grad_norm\": %.9g, \"lr\": %g, "
                               "\"skipped\": true",
                               (long long)ls_trace_update(), it, (long long)adam->step, mt->grad_norm, o->lr);
            }
            if (s != LS_OK || mt->skipped) {
                ls_trace_phase_end("optimize");
                mt->t_optim += ls_now() - t0;
                break;
            }
            ls_trace_event("optimizer",
                           "\"update\": %lld, \"iteration\": %d, \"step\": %lld, \"grad_norm\": %.9g, \"lr\": %g, "
                           "\"skipped\": false",
                           (long long)ls_trace_update(), it, (long long)adam->step, mt->grad_norm, o->lr);
            if (it + 1 < o->num_iterations) p->fam->policy_zero_grad(p);
        }
        ls_trace_phase_end("optimize");
        mt->t_optim += ls_now() - t0;
    }
    ls_arena_release(sa, score_mark);
    mt->t_total = ls_now() - t_start;
    return s;
}

ls_status ls_grpo_update(ls_policy *p, ls_adamw *adam, const ls_group *g, const ls_grpo_opts *o, ls_arenas *ar,
                         ls_grpo_metrics *mt) {
    ls_group copy = *g; /* the batch form may fill groups (rollouts); without a hook it does not */
    ls_status s = ls_grpo_update_batch(p, adam, &copy, 1, NULL, o, ar, mt);
    if (s == LS_OK && mt->skipped) s = ls_err(LS_ERR_ARG, "%s; weights left untouched", mt->skip_reason);
    return s;
}
