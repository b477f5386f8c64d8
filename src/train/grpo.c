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
#include <stdlib.h>
#include <string.h>

#include "longstraw/grpo.h"

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
    ls_fwd_opts_default(&o->fwd);
}

void ls_grpo_advantages(double *A, const double *r, int G, ls_scale_rewards scale) {
    double mean = 0, var = 0;
    for (int i = 0; i < G; i++) mean += r[i];
    mean /= G;
    for (int i = 0; i < G; i++) var += (r[i] - mean) * (r[i] - mean);
    double sd = G > 1 ? sqrt(var / (G - 1)) : 0.0; /* Bessel, as torch.std / TRL */
    for (int i = 0; i < G; i++) A[i] = scale == LS_SCALE_NONE ? r[i] - mean : (r[i] - mean) / (sd + 1e-4);
}

void ls_grpo_normalisers(double *w, const int64_t *R, int G, ls_loss_type loss, int64_t max_len) {
    int64_t tot = 0, mx = 0;
    for (int i = 0; i < G; i++) {
        tot += R[i];
        mx = R[i] > mx ? R[i] : mx;
    }
    if (max_len <= 0) max_len = mx;
    for (int i = 0; i < G; i++) {
        switch (loss) {
        case LS_LOSS_GRPO: w[i] = 1.0 / ((double)G * (double)R[i]); break;
        case LS_LOSS_DAPO: w[i] = 1.0 / (double)tot; break;
        case LS_LOSS_DR_GRPO: w[i] = 1.0 / ((double)G * (double)max_len); break;
        }
    }
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

ls_status ls_adamw_init(ls_adamw *a, const ls_hybrid_model *like, ls_arena *fixed) {
    memset(a, 0, sizeof *a);
    a->has_moments = 1;
    LS_TRY(ls_hybrid_alloc_like(like, &a->m, fixed));
    return ls_hybrid_alloc_like(like, &a->v, fixed);
}

void ls_adamw_init_lora(ls_adamw *a) { memset(a, 0, sizeof *a); }

/* The trainable tensors as parallel lists (weights, gradients, Adam m, v): every
 * weight for a full fine-tune, the adapters with LoRA. m/v may be NULL. */
static ls_status trainable(ls_hybrid_model *policy, ls_hybrid_model *grad, ls_adamw *adam, const ls_grpo_opts *o,
                           ls_param **p, ls_param **g, ls_param **m, ls_param **v, int64_t *n) {
    if (o->lora) return ls_lora_params(o->lora, p, g, m, v, n);
    int64_t n1 = 0, n2 = 0, n3 = 0, n4 = 0;
    *p = *g = NULL;
    if (m) *m = NULL;
    if (v) *v = NULL;
    LS_TRY(ls_hybrid_params(policy, p, &n1));
    LS_TRY(ls_hybrid_params(grad, g, &n2));
    if (m) LS_TRY(ls_hybrid_params(&adam->m, m, &n3));
    if (v) LS_TRY(ls_hybrid_params(&adam->v, v, &n4));
    LS_ASSERT(n1 == n2 && (!m || n1 == n3) && (!v || n1 == n4), "parameter lists differ");
    *n = n1;
    return LS_OK;
}

/* ---- the transaction ------------------------------------------------------------ */

/* The token ids a member runs: [x_P, y_1..y_{R−1}] against a state, or the whole
 * [x_1..x_P, y_1..y_{R−1}] in naive mode; targets are y_1..y_R either way. */
static ls_status member_ids(const ls_group *g, int i, int naive, ls_arena *a, int32_t **ids,
                            int64_t *T, int64_t *out_from) {
    int64_t P = g->P, R = g->R[i];
    *T = naive ? P + R - 1 : R;
    *out_from = naive ? P - 1 : 0;
    *ids = ls_arena_alloc(a, (size_t)*T * sizeof(int32_t));
    if (!*ids) return LS_ERR_NOMEM;
    if (naive) {
        memcpy(*ids, g->prompt, (size_t)P * sizeof(int32_t));
        memcpy(*ids + P, g->resp[i], (size_t)(R - 1) * sizeof(int32_t));
    } else {
        (*ids)[0] = g->prompt[P - 1];
        memcpy(*ids + 1, g->resp[i], (size_t)(R - 1) * sizeof(int32_t));
    }
    return LS_OK;
}

/* Capture x_1..x_{P−1} of `m` into a fresh state in the prompt arena. */
static ls_status capture(const ls_hybrid_model *m, const ls_group *g, const ls_grpo_opts *o, ls_arenas *ar,
                         ls_prompt_state *st) {
    LS_TRY(ls_state_init(st, &m->cfg, g->P - 1, o->page_size, o->state_dtype, &ar->a[LS_ARENA_PROMPT]));
    return ls_hybrid_capture(m, st, g->prompt, g->P - 1, &o->fwd, &ar->a[LS_ARENA_SCRATCH]);
}

/* Score every member under `m` (no tape): out[i][R_i] must be allocated. */
static ls_status score_all(const ls_hybrid_model *m, const ls_group *g, const ls_grpo_opts *o, ls_arenas *ar,
                           const ls_prompt_state *st, float **out) {
    ls_arena *br = &ar->a[LS_ARENA_BRANCH];
    for (int i = 0; i < g->G; i++) {
        ls_arena_mark mk = ls_arena_get_mark(br);
        int32_t *ids;
        int64_t T, from;
        LS_TRY(member_ids(g, i, o->no_capture, br, &ids, &T, &from));
        LS_TRY(ls_hybrid_branch_fwd(m, st, ids, T, from, 0, g->resp[i], out[i], NULL, NULL, &o->fwd, NULL,
                                    &ar->a[LS_ARENA_SCRATCH]));
        ls_arena_release(br, mk);
    }
    return LS_OK;
}

static double grad_norm(const ls_param *gp, int64_t n) {
    double s = 0;
    for (int64_t k = 0; k < n; k++) {
        const float *g = gp[k].p;
        double sk = 0;
#pragma omp parallel for schedule(static) reduction(+ : sk) if (gp[k].n > 65536)
        for (int64_t i = 0; i < gp[k].n; i++) sk += (double)g[i] * g[i];
        s += sk;
    }
    return sqrt(s);
}

/* Clip (torch.nn.utils.clip_grad_norm_ semantics) and one AdamW step (torch AdamW:
 * decoupled decay first, bias-corrected moments, eps outside the sqrt). */
static ls_status optimize(ls_hybrid_model *policy, ls_hybrid_model *grad, ls_adamw *adam, const ls_grpo_opts *o,
                          double gnorm) {
    ls_param *pp = NULL, *gp = NULL, *mp = NULL, *vp = NULL;
    int64_t n = 0;
    ls_status s = trainable(policy, grad, adam, o, &pp, &gp, &mp, &vp, &n);
    if (s == LS_OK) {
        double clip = 1.0;
        if (o->max_grad_norm > 0) {
            double coef = o->max_grad_norm / (gnorm + 1e-6);
            if (coef < 1.0) clip = coef;
        }
        adam->step++;
        double bc1 = 1.0 - pow(o->beta1, (double)adam->step), bc2 = 1.0 - pow(o->beta2, (double)adam->step);
        float b1 = (float)o->beta1, b2 = (float)o->beta2;
        for (int64_t k = 0; k < n; k++) {
            float decay = (o->weight_decay != 0 && !pp[k].no_decay) ? (float)(1.0 - o->lr * o->weight_decay) : 1.0f;
            float *p = pp[k].p, *gr = gp[k].p, *m = mp[k].p, *v = vp[k].p;
#pragma omp parallel for schedule(static) if (pp[k].n > 65536)
            for (int64_t i = 0; i < pp[k].n; i++) {
                float gi = (float)(gr[i] * clip);
                m[i] = b1 * m[i] + (1.0f - b1) * gi;
                v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
                double mh = m[i] / bc1, vh = v[i] / bc2;
                p[i] = (float)((double)(p[i] * decay) - o->lr * mh / (sqrt(vh) + o->adam_eps));
            }
        }
        /* LoRA: the policy is base + adapters; merge the updated adapters */
        if (o->lora) ls_lora_merge(o->lora, o->lora_base, policy);
    }
    free(pp);
    free(gp);
    free(mp);
    free(vp);
    return s;
}

ls_status ls_grpo_update(ls_hybrid_model *policy, const ls_hybrid_model *ref, ls_hybrid_model *grad,
                         ls_adamw *adam, const ls_group *g, const ls_grpo_opts *o, ls_arenas *ar,
                         ls_grpo_metrics *mt) {
    ls_arena *sa = &ar->a[LS_ARENA_SCORE], *br = &ar->a[LS_ARENA_BRANCH], *pr = &ar->a[LS_ARENA_PROMPT];
    int G = g->G;
    double t_start = ls_now(), t0;
    memset(mt, 0, sizeof *mt);
    mt->P = (int)g->P;
    mt->G = G;
    if (G < 1) return ls_err(LS_ERR_ARG, "a group needs at least one response");
    if (!g->advantages && !g->rewards)
        return ls_err(LS_ERR_ARG, "the group has neither \"rewards\" nor \"advantages\"");
    if (o->beta != 0 && !ref) return ls_err(LS_ERR_ARG, "beta = %g needs a reference policy", o->beta);
    if (!adam && o->num_iterations != 1) return ls_err(LS_ERR_ARG, "gradients only: num_iterations must be 1");
    if (o->num_iterations < 1) return ls_err(LS_ERR_ARG, "num_iterations must be >= 1");
    ls_arena_mark score_mark = ls_arena_get_mark(sa);
    /* score arena: advantages, normalisers, old / ref log-probs, per-member scratch */
    double *A = ls_arena_alloc(sa, (size_t)G * sizeof(double));
    double *w = ls_arena_alloc(sa, (size_t)G * sizeof(double));
    float **old = ls_arena_calloc(sa, (size_t)G, sizeof(float *));
    float **rlp = ls_arena_calloc(sa, (size_t)G, sizeof(float *));
    if (!A || !w || !old || !rlp) return LS_ERR_NOMEM;
    int64_t rmax = 0;
    for (int i = 0; i < G; i++) {
        old[i] = g->old_logprobs ? g->old_logprobs[i] : ls_arena_alloc(sa, (size_t)g->R[i] * sizeof(float));
        if (!old[i]) return LS_ERR_NOMEM;
        if (o->beta != 0 && !(rlp[i] = ls_arena_alloc(sa, (size_t)g->R[i] * sizeof(float)))) return LS_ERR_NOMEM;
        rmax = g->R[i] > rmax ? g->R[i] : rmax;
        mt->len_mean += (double)g->R[i] / G;
        mt->len_min = (i == 0 || g->R[i] < mt->len_min) ? g->R[i] : mt->len_min;
        mt->len_max = g->R[i] > mt->len_max ? g->R[i] : mt->len_max;
    }
    float *lp = ls_arena_alloc(sa, (size_t)rmax * sizeof(float)), *dl = ls_arena_alloc(sa, (size_t)rmax * sizeof(float));
    float *ent = ls_arena_alloc(sa, (size_t)rmax * sizeof(float));
    if (!lp || !dl || !ent) return LS_ERR_NOMEM;
    if (g->advantages) memcpy(A, g->advantages, (size_t)G * sizeof(double));
    else ls_grpo_advantages(A, g->rewards, G, o->scale);
    ls_grpo_normalisers(w, g->R, G, o->loss, o->max_completion_length);
    if (g->rewards) {
        for (int i = 0; i < G; i++) mt->reward_mean += g->rewards[i] / G;
        for (int i = 0; i < G; i++) mt->reward_std += (g->rewards[i] - mt->reward_mean) * (g->rewards[i] - mt->reward_mean);
        mt->reward_std = G > 1 ? sqrt(mt->reward_std / (G - 1)) : 0;
    }
    for (int i = 0; i < G; i++) mt->adv_mean += A[i] / G;

    /* 1. reference log-probs: its own prompt state, captured, used, freed */
    t0 = ls_now();
    if (o->beta != 0) {
        ls_arena_mark pm = ls_arena_get_mark(pr);
        ls_prompt_state st;
        if (!o->no_capture) LS_TRY(capture(ref, g, o, ar, &st));
        LS_TRY(score_all(ref, g, o, ar, o->no_capture ? NULL : &st, rlp));
        ls_arena_release(pr, pm);
    }
    mt->t_ref = ls_now() - t0;

    if (o->lora && !o->lora_base) return ls_err(LS_ERR_ARG, "LoRA needs its base model");
    ls_param *gp = NULL, *wp = NULL, *fg = NULL;
    int64_t ngp = 0, nfg = 0;
    LS_TRY(trainable(policy, grad, adam, o, &wp, &gp, NULL, NULL, &ngp));
    free(wp);
    LS_TRY(ls_hybrid_params(grad, &fg, &nfg)); /* the full-weight gradient buffers */
    ls_status s = LS_OK;
    for (int it = 0; it < o->num_iterations && s == LS_OK; it++) {
        /* 2. capture the policy's prompt state */
        t0 = ls_now();
        ls_arena_mark pm = ls_arena_get_mark(pr);
        ls_prompt_state st;
        const ls_prompt_state *stp = NULL;
        if (!o->no_capture) {
            s = capture(policy, g, o, ar, &st);
            stp = &st;
            mt->prompt_bytes = pr->cur - pm.cur;
        }
        mt->t_capture += ls_now() - t0;
        /* 3. old log-probs (first iteration) */
        t0 = ls_now();
        if (s == LS_OK && it == 0 && !g->old_logprobs) s = score_all(policy, g, o, ar, stp, old);
        mt->t_score += ls_now() - t0;
        /* 4. replay, one member under a tape at a time */
        t0 = ls_now();
        ls_grpo_terms acc = {0, 0, 0, 0, 0};
        double ent_sum = 0;
        for (int i = 0; i < G && s == LS_OK; i++) {
            ls_arena_mark bm = ls_arena_get_mark(br);
            int32_t *ids;
            int64_t T, from;
            ls_branch_tape *tape = NULL;
            s = member_ids(g, i, o->no_capture, br, &ids, &T, &from);
            if (s == LS_OK)
                s = ls_hybrid_branch_fwd(policy, stp, ids, T, from, from, g->resp[i], lp, ent, &tape, &o->fwd, br,
                                         &ar->a[LS_ARENA_SCRATCH]);
            if (s == LS_OK) {
                ls_grpo_member_terms(dl, &acc, lp, old[i], o->beta != 0 ? rlp[i] : NULL, g->R[i], A[i], w[i], o);
                for (int64_t t = 0; t < g->R[i]; t++) ent_sum += ent[t];
                s = ls_hybrid_branch_bwd(policy, grad, tape, dl, &ar->a[LS_ARENA_SCRATCH]);
            }
            ls_arena_release(br, bm);
        }
        ls_arena_release(pr, pm);
        mt->t_replay += ls_now() - t0;
        if (s != LS_OK) break;
        if (o->lora) ls_lora_backward(o->lora, grad); /* ∂L/∂W_eff → adapters */
        mt->loss = acc.loss;
        mt->kl = acc.tokens > 0 ? acc.kl_sum / acc.tokens : 0;
        mt->clip_low = acc.tokens > 0 ? acc.clip_low / acc.tokens : 0;
        mt->clip_high = acc.tokens > 0 ? acc.clip_high / acc.tokens : 0;
        mt->entropy = acc.tokens > 0 ? ent_sum / acc.tokens : 0;
        /* 5. finalize: one optimizer call */
        t0 = ls_now();
        mt->grad_norm = grad_norm(gp, ngp);
        if (it < 64) mt->iter_loss[it] = mt->loss, mt->iter_grad_norm[it] = mt->grad_norm;
        mt->n_iter = it + 1;
        if (!isfinite(mt->grad_norm) || !isfinite(mt->loss)) {
            s = ls_err(LS_ERR_ARG, "non-finite %s in update (loss %g, grad norm %g); weights left untouched",
                       isfinite(mt->loss) ? "gradient" : "loss", mt->loss, mt->grad_norm);
            break;
        }
        if (adam) {
            s = optimize(policy, grad, adam, o, mt->grad_norm);
            if (it + 1 < o->num_iterations) {
                for (int64_t k = 0; k < nfg; k++) memset(fg[k].p, 0, (size_t)fg[k].n * sizeof(float));
                if (o->lora) ls_lora_zero_grad(o->lora);
            }
        }
        mt->t_optim += ls_now() - t0;
    }
    free(gp);
    free(fg);
    ls_arena_release(sa, score_mark);
    mt->t_total = ls_now() - t_start;
    return s;
}
