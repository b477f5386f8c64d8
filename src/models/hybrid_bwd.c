/*
 * hybrid_bwd.c — backward of a taped branch of the hybrid family (the reverse of
 * hybrid.c's layer functions, reading hybrid_tape.h). Parameter gradients
 * accumulate (+=) into a model-shaped set of buffers in the grad arena; every
 * transient comes from scratch and is released per layer. Prefix-frozen: the prompt
 * state is read-only and receives no gradient. Full mode (DESIGN §3): the kernels'
 * dstate0, dtail and dk_prefix/dv_prefix outputs collect the gradient of the prompt
 * state into its dState buffer, and the reverse sweep (ls_hybrid_sweep) carries it
 * back through the prompt chunk by chunk.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "hybrid_tape.h"
#include "longstraw/comm.h"
#include "longstraw/cp.h"
#include "longstraw/kernels.h"
#include "longstraw/lora.h"
#include "longstraw/trace.h"

#define ALLOC_F(arena, n) ((float *)ls_arena_alloc((arena), (size_t)(n) * sizeof(float)))
#define CALLOC_F(arena, n) ((float *)ls_arena_calloc((arena), (size_t)(n), sizeof(float)))
#define NEED(p)                          \
    do {                                 \
        if (!(p)) return LS_ERR_NOMEM;   \
    } while (0)


/* f32 bytes of one dK (or dV) page, unpadded: a block in a message. */
static size_t dpage_bytes(const ls_config *c, int64_t S) {
    return (size_t)S * (size_t)c->n_kv * (size_t)c->head_dim * sizeof(float);
}

/* What sweep_block needs of cp_sweep_bwd_remote's call. */
typedef struct {
    const ls_backend *be;
    const ls_config *c;
    const ls_layer_tape *tp;
    float *dq, *dqb; /* dq (+=), a block's share */
    const float *d_aog;
    int64_t T, S;
    ls_dtype dtype;
    ls_arena *sc;
} sweep_ctx;

/* A remote block of nb pages holding `rows` positions: its share of dq (+=) and its
 * dK/dV. */
static ls_status sweep_block(void *ctx, void *const *kp, void *const *vp, float *const *dkp, float *const *dvp,
                             int64_t nb, int64_t rows) {
    (void)nb;
    sweep_ctx *W = ctx;
    const ls_config *c = W->c;
    const ls_layer_tape *tp = W->tp;
    int64_t qd = (int64_t)c->n_heads * c->head_dim;
    ls_kv_prefix blk = {rows, W->S, W->dtype, kp, vp};
    LS_TRY(ls_op_attn_prefix_bwd(W->be, W->dqb, (void *const *)dkp, (void *const *)dvp, W->d_aog, tp->ao, tp->lse,
                                 tp->qr, &blk, W->T, c->n_heads, c->n_kv, c->head_dim,
                                 1.0f / sqrtf((float)c->head_dim), W->sc));
    ls_op_add_to(W->be, W->dq, W->dqb, W->T * qd);
    return LS_OK;
}

/* A sweep chunk under CP (tp->cp_sweep): the share of dq over every earlier segment of
 * another rank (dq +=), whose pages come again block by block; each block's dK/dV go
 * back to its owner (cp_sweep_serve's ls_dist_pages_send_grad adds them to its dState). */
static ls_status cp_sweep_bwd_remote(const ls_backend *be, const ls_config *c, const ls_layer_tape *tp, int l, float *dq,
                                     const float *d_aog, int64_t T, ls_arena *sc) {
    const ls_prompt_state *st = tp->cp_sweep;
    int64_t S = st->page_size, qd = (int64_t)c->n_heads * c->head_dim;
    size_t pb = (size_t)S * (size_t)c->n_kv * (size_t)c->head_dim * ls_dtype_size(st->dtype);
    ls_arena_mark mk = ls_arena_get_mark(sc);
    sweep_ctx W = {.be = be, .c = c, .tp = tp, .dq = dq, .dqb = ALLOC_F(sc, T * qd), .d_aog = d_aog, .T = T, .S = S,
                   .dtype = st->dtype, .sc = sc};
    NEED(W.dqb);
    for (int sg = 0; sg < tp->cp_seg; sg++) {
        int src;
        int64_t rlo, rhi;
        ls_state_segment(st, sg, &src, &rlo, &rhi);
        if (src == st->rank || rhi == rlo) continue;
        LS_TRY(ls_dist_pages_recv_grad(be, st->comm, rhi - rlo, S, pb, (int64_t)(dpage_bytes(c, S) / sizeof(float)),
                                       tp->cp_block, src, l, sweep_block, &W, sc));
    }
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* Gated DeltaNet mixer backward: dres[T,D] → dxn[T,D] (+=), weight grads (+=). */
static ls_status gdn_bwd(const ls_hybrid_model *m, int l, const ls_hybrid_layer *w, ls_hybrid_layer *gw,
                         const ls_layer_tape *tp, const float *dres, float *dxn, int64_t T,
                         const ls_dec_dstate *dc, ls_arena *sc) {
    const ls_config *c = &m->cfg;
    const ls_hybrid_config *hc = ls_hybrid_cfg(c);
    int64_t D = c->hidden, kd = ls_cfg_key_dim(c), vd = ls_cfg_value_dim(c), cd = ls_cfg_conv_dim(c);
    int Hv = hc->H_v;
    int64_t s0 = tp->seg0;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *d_on = ALLOC_F(sc, T * vd);  /* [T, value_dim] */
    float *d_o = ALLOC_F(sc, T * vd);   /* [T, H_v, d_v] */
    float *d_z = ALLOC_F(sc, T * vd);   /* [T, H_v, d_v] */
    float *dqn = CALLOC_F(sc, T * kd);  /* [T, H_k, d_k] */
    float *dkn = CALLOC_F(sc, T * kd);
    float *dv = CALLOC_F(sc, T * vd);   /* [T, H_v, d_v] */
    float *dbeta = CALLOC_F(sc, T * Hv); /* [T, H_v] */
    float *dg = CALLOC_F(sc, T * Hv);
    float *dba = ALLOC_F(sc, T * 2 * Hv); /* [T, 2·H_v] */
    float *dy = ALLOC_F(sc, T * cd);    /* [T, conv_dim] */
    float *dqkv = CALLOC_F(sc, T * cd); /* [T, conv_dim] */
    NEED(d_on && d_o && d_z && dqn && dkn && dv && dbeta && dg && dba && dy && dqkv);
    ls_layer_dstate *ds = dc->st ? &dc->st->full->d[l] : NULL;
    size_t rec_n = (size_t)Hv * (size_t)hc->d_k * (size_t)hc->d_v, conv_n = (size_t)(hc->conv_k - 1) * (size_t)cd;
    float *dS0 = ds ? ALLOC_F(sc, rec_n) : NULL, *dtail0 = ds ? ALLOC_F(sc, conv_n ? conv_n : 1) : NULL;
    NEED(!ds || (dS0 && dtail0));
    LS_ASSERT(!ds || s0 == 0, "full mode has no detach point");
    ls_op_linear_bwd(m->be, d_on, gw->gdn_out, dres, tp->on, w->gdn_out, T, vd, D, 0);
    LORA_BWD(m, l, gdn_out, 0, D, d_on, dres, tp->on, T, sc);
    ls_op_gated_rmsnorm_bwd(m->be, d_o, d_z, gw->gnorm, d_on, tp->o, tp->z, tp->grstd, w->gnorm, T * Hv, hc->d_v);
    ls_gdr_dims dm = {hc->H_k, hc->H_v, hc->d_k, hc->d_v, 1.0f / sqrtf((float)hc->d_k)};
    LS_TRY(ls_op_gdr_chunk_bwd(m->be, dqn + s0 * kd, dkn + s0 * kd, dv + s0 * vd, dbeta + s0 * Hv, dg + s0 * Hv, dS0,
                            d_o + s0 * vd, ds && dc->sweep ? ds->dS : NULL, tp->tape_h, tp->qn + s0 * kd, tp->kn + s0 * kd,
                            tp->v + s0 * vd, tp->beta + s0 * Hv, tp->g + s0 * Hv, T - s0, dm, sc));
    ls_op_gdn_prep_bwd(m->be, dy, dba, gw->A_log, gw->dt_bias, dqn, dkn, dv, dbeta, dg, tp->y, tp->rq, tp->rk, tp->ba,
                       tp->beta, tp->g, w->A_log, w->dt_bias, T, dm);
    ls_op_conv_bwd(m->be, dqkv + s0 * cd, gw->conv_w, dtail0, dy + s0 * cd, tp->cpre + s0 * cd, tp->qkv + s0 * cd,
                tp->tail0, w->conv_w, T - s0, cd, hc->conv_k);
    if (ds && dc->sweep) {
        /* the conv tail this chunk ended with is the last W−1 rows of [tail0; qkv]: its
         * incoming gradient goes to those rows (of the input, or of the starting tail) */
        int64_t Wm = hc->conv_k - 1;
        for (int64_t i = 0; i < Wm; i++) {
            int64_t row = T + i; /* in [tail0 (W−1 rows); qkv (T rows)] */
            float *to = row >= Wm ? dqkv + (row - Wm) * cd : dtail0 + row * cd;
            ls_op_add_to(m->be, to, ds->dtail + i * cd, cd);
        }
    }
    if (ds) { /* the state the branch started from: added (members); replaced (sweep) */
        if (dc->sweep) {
            ls_op_copy(m->be, ds->dS, dS0, (int64_t)rec_n);
            ls_op_copy(m->be, ds->dtail, dtail0, (int64_t)conv_n);
        } else {
            ls_op_add_to(m->be, ds->dS, dS0, (int64_t)rec_n);
            ls_op_add_to(m->be, ds->dtail, dtail0, (int64_t)conv_n);
        }
    }
    ls_op_linear_bwd(m->be, dxn, gw->gdn_in, dqkv, tp->dec.xn1, w->gdn_in, T, D, cd, 1);
    ls_op_linear_bwd(m->be, dxn, GOFF(gw->gdn_in, cd * D), d_z, tp->dec.xn1, w->gdn_in + cd * D, T, D, vd, 1);
    ls_op_linear_bwd(m->be, dxn, GOFF(gw->gdn_in, (cd + vd) * D), dba, tp->dec.xn1, w->gdn_in + (cd + vd) * D, T, D, 2 * Hv,
                  1);
    LORA_BWD(m, l, gdn_in, 0, cd, dxn, dqkv, tp->dec.xn1, T, sc);
    LORA_BWD(m, l, gdn_in, cd, vd, dxn, d_z, tp->dec.xn1, T, sc);
    LORA_BWD(m, l, gdn_in, cd + vd, 2 * Hv, dxn, dba, tp->dec.xn1, T, sc);
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* Gated attention backward: dres[T,D] → dxn[T,D] (+=). grad_from > 0 (naive mode)
 * detaches the K/V of earlier positions. */
static ls_status attn_bwd(const ls_hybrid_model *m, int l, const ls_hybrid_layer *w, ls_hybrid_layer *gw,
                          const ls_layer_tape *tp, const float *dres, float *dxn, int64_t T,
                          int64_t pos0, int64_t grad_from, const ls_dec_dstate *dc, ls_arena *sc) {
    const ls_config *c = &m->cfg;
    int64_t D = c->hidden, hd = c->head_dim, qd = (int64_t)c->n_heads * hd, kvd = (int64_t)c->n_kv * hd;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *d_aog = ALLOC_F(sc, T * qd);  /* [T, n_h·hd] */
    float *d_gate = ALLOC_F(sc, T * qd); /* [T, n_h·hd] */
    float *dq = ALLOC_F(sc, T * qd);     /* [T, n_h, hd] */
    float *dk = ALLOC_F(sc, T * kvd);    /* [T, n_kv, hd] */
    float *dv = ALLOC_F(sc, T * kvd);
    NEED(d_aog && d_gate && dq && dk && dv);
    ls_layer_dstate *ds = dc->st ? &dc->st->full->d[l] : NULL;
    void *const *dkp = ds && tp->has_prefix ? ds->dk : NULL, *const *dvp = ds && tp->has_prefix ? ds->dv : NULL;
    ls_op_linear_bwd(m->be, d_aog, gw->attn_out, dres, tp->aog, w->attn_out, T, qd, D, 0);
    LORA_BWD(m, l, attn_out, 0, D, d_aog, dres, tp->aog, T, sc);
    ls_op_sigmoid_mul_bwd(m->be, d_aog, d_gate, d_aog, tp->ao, tp->gate, T * qd); /* d_aog: now ∂L/∂ao */
    if (tp->cp && ls_comm_rank(tp->cp) != 0) { /* this rank's pages: its share of dq only */
        LS_TRY(ls_op_attn_prefix_bwd(m->be, dq, dkp, dvp, d_aog, tp->ao, tp->lse, tp->qr, &tp->prefix, T, c->n_heads,
                                  c->n_kv, (int)hd, 1.0f / sqrtf((float)hd), sc));
        ls_op_zero(m->be, dk, T * kvd);
        ls_op_zero(m->be, dv, T * kvd);
    } else {
        LS_TRY(ls_op_attn_bwd(m->be, dq, dk, dv, dkp, dvp, d_aog, tp->ao, tp->lse, tp->qr, tp->kr, tp->v,
                           tp->has_prefix ? &tp->prefix : NULL, T, c->n_heads, c->n_kv, (int)hd,
                           1.0f / sqrtf((float)hd), sc));
        if (tp->cp_sweep) LS_TRY(cp_sweep_bwd_remote(m->be, c, tp, l, dq, d_aog, T, sc));
    }
    if (tp->cp) { /* the shares of every rank's pages (and rank 0's own keys) summed: exact */
        LS_TRY(ls_dist_sum_f32(m->be, tp->cp, dq, T * c->n_heads * hd));
        LS_TRY(ls_dist_sum_f32(m->be, tp->cp, dk, T * kvd));
        LS_TRY(ls_dist_sum_f32(m->be, tp->cp, dv, T * kvd));
    }
    if (grad_from > 0) { /* naive mode: the prompt's K/V are detached */
        ls_op_zero(m->be, dk, grad_from * kvd);
        ls_op_zero(m->be, dv, grad_from * kvd);
    }
    if (ds && dc->sweep) { /* the chunk's own K/V are prompt positions: their incoming gradient */
        const ls_prompt_state *st = dc->st;
        for (int64_t t = 0; t < T; t++) {
            int64_t lp = ls_state_local_page(st, pos0 + t), off = ((pos0 + t) % st->page_size) * kvd;
            LS_ASSERT(lp >= 0, "sweep position %lld is not this rank's", (long long)(pos0 + t));
            ls_op_add_to(m->be, dk + t * kvd, (const float *)ds->dk[lp] + off, kvd);
            ls_op_add_to(m->be, dv + t * kvd, (const float *)ds->dv[lp] + off, kvd);
        }
    }
    ls_op_rope_bwd(m->be, dq, T, c->n_heads, (int)hd, c->rot_dim, c->rope_theta, pos0);
    ls_op_rope_bwd(m->be, dk, T, c->n_kv, (int)hd, c->rot_dim, c->rope_theta, pos0);
    ls_op_rmsnorm_bwd(m->be, dq, gw->q_norm, dq, tp->qraw, tp->rsq, w->q_norm, T * c->n_heads, hd);
    ls_op_rmsnorm_bwd(m->be, dk, gw->k_norm, dk, tp->kraw, tp->rsk, w->k_norm, T * c->n_kv, hd);
    ls_op_linear_bwd(m->be, dxn, gw->attn_in, dq, tp->dec.xn1, w->attn_in, T, D, qd, 1);
    ls_op_linear_bwd(m->be, dxn, GOFF(gw->attn_in, qd * D), d_gate, tp->dec.xn1, w->attn_in + qd * D, T, D, qd, 1);
    ls_op_linear_bwd(m->be, dxn, GOFF(gw->attn_in, 2 * qd * D), dk, tp->dec.xn1, w->attn_in + 2 * qd * D, T, D, kvd, 1);
    ls_op_linear_bwd(m->be, dxn, GOFF(gw->attn_in, (2 * qd + kvd) * D), dv, tp->dec.xn1, w->attn_in + (2 * qd + kvd) * D, T, D,
                  kvd, 1);
    LORA_BWD(m, l, attn_in, 0, qd, dxn, dq, tp->dec.xn1, T, sc);
    LORA_BWD(m, l, attn_in, qd, qd, dxn, d_gate, tp->dec.xn1, T, sc);
    LORA_BWD(m, l, attn_in, 2 * qd, kvd, dxn, dk, tp->dec.xn1, T, sc);
    LORA_BWD(m, l, attn_in, 2 * qd + kvd, kvd, dxn, dv, tp->dec.xn1, T, sc);
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* Sparse MoE backward (spec §5): experts are recomputed from the saved routing;
 * the router gets its gradient through the top-k combine weights. */
ls_status ls_hybrid_moe_bwd(const ls_hybrid_model *m, int l, ls_hybrid_layer *gw, const ls_layer_tape *tp,
                            const float *dres, float *dxn, int64_t T, ls_arena *sc) {
    const ls_config *c = &m->cfg;
    const ls_hybrid_layer *w = &m->layers[l];
    int64_t D = c->hidden, Im = c->moe_inter;
    int E = c->n_experts, K = c->top_k;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *dwt = CALLOC_F(sc, T * K);   /* [T, K] ∂L/∂combine weight */
    float *dlog = ALLOC_F(sc, T * E);   /* [T, E] ∂L/∂router logit */
    NEED(dwt && dlog);
    ls_dec_experts ex = {.D = D, .I = Im, .E = E, .K = K, .e0 = 0, .ne = E, .gu_w = w->exp_gu, .down_w = w->exp_down,
                         .dgu_w = gw->exp_gu, .ddown_w = gw->exp_down,
                         .lora = ffn_of(m, l, offsetof(ls_hybrid_layer, exp_gu), offsetof(ls_hybrid_layer, exp_down), 0, 0)};
    LS_TRY(ls_dec_experts_bwd(m->be, &ex, dwt, dxn, dres, tp->dec.xn2, tp->sel, tp->wt, T, sc));
    ls_op_moe_route_bwd(m->be, dlog, dwt, tp->probs, tp->sel, tp->wt, T, E, K, c->norm_topk);
    ls_op_linear_bwd(m->be, dxn, gw->router, dlog, tp->dec.xn2, w->router, T, D, E, 1);
    LORA_BWD(m, l, router, 0, E, dxn, dlog, tp->dec.xn2, T, sc);
    if (c->shared_inter > 0) {
        int64_t Is = c->shared_inter;
        float *dsh = ALLOC_F(sc, T * D); /* [T, D] */
        float *ds = ALLOC_F(sc, T);      /* [T] ∂L/∂gate logit */
        NEED(dsh && ds);
        ls_op_gated_add_rows_bwd(m->be, dsh, ds, dres, tp->sh_s, tp->sh_out, T, D);
        ls_ffn_lora fl = ffn_of(m, l, offsetof(ls_hybrid_layer, sh_gu), offsetof(ls_hybrid_layer, sh_down), 0, 0);
        LS_TRY(ls_dec_swiglu_bwd(m->be, dxn, gw->sh_gu, gw->sh_down, dsh, tp->dec.xn2, tp->sh_gu, tp->sh_act, w->sh_gu, w->sh_down,
                          T, D, Is, 1, &fl, sc));
        ls_op_linear_bwd(m->be, dxn, gw->sh_gate, ds, tp->dec.xn2, w->sh_gate, T, D, 1, 1);
        LORA_BWD(m, l, sh_gate, 0, 1, dxn, ds, tp->dec.xn2, T, sc);
    }
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* The hybrid's parts of a layer's backward for the skeleton (decoder.h). */
typedef struct {
    const ls_hybrid_model *m;
    int l;
    ls_hybrid_layer *gw;
    const ls_branch_tape *tb;
    const ls_dec_dstate *dc;
} part_ctx;

static ls_status part_mixer_bwd(const ls_dec_layer *d, const float *dres, float *dxn) {
    const part_ctx *p = d->ctx;
    const ls_hybrid_layer *w = &p->m->layers[p->l];
    const ls_layer_tape *tp = &p->tb->layers[p->l];
    if (p->m->cfg.kind[p->l] == LS_LAYER_GDN) return gdn_bwd(p->m, p->l, w, p->gw, tp, dres, dxn, d->T, p->dc, d->sc);
    return attn_bwd(p->m, p->l, w, p->gw, tp, dres, dxn, d->T, p->tb->h.pos0, p->tb->h.grad_from, p->dc, d->sc);
}

static ls_status part_moe_bwd(const ls_dec_layer *d, const float *dres, float *dxn) {
    const part_ctx *p = d->ctx;
    return ls_hybrid_moe_bwd(p->m, p->l, p->gw, &p->tb->layers[p->l], dres, dxn, d->T, d->sc);
}

/* One layer: dx[T,D] holds ∂L/∂(layer output) on entry, ∂L/∂(layer input) on exit. */
static ls_status layer_bwd(const ls_hybrid_model *m, ls_hybrid_model *grad, int l,
                           const ls_branch_tape *tb, float *dx, const ls_dec_dstate *dc, ls_arena *sc) {
    const ls_config *c = &m->cfg;
    const ls_hybrid_layer *w = &m->layers[l];
    ls_hybrid_layer *gw = &grad->layers[l];
    part_ctx pc = {m, l, gw, tb, dc};
    ls_dec_layer d = {.be = m->be, .T = tb->h.T, .D = c->hidden, .I = c->intermediate, .eps = c->eps,
                      .norm = LS_NORM_ZERO_CENTRED, .input_norm = w->input_norm, .post_norm = w->post_norm,
                      .d_input_norm = gw->input_norm, .d_post_norm = gw->post_norm, .mixer_bwd = part_mixer_bwd,
                      .moe_bwd = c->moe[l] ? part_moe_bwd : NULL, .gu_w = w->mlp_gu, .down_w = w->mlp_down,
                      .dgu_w = gw->mlp_gu, .ddown_w = gw->mlp_down,
                      .lora = ffn_of(m, l, offsetof(ls_hybrid_layer, mlp_gu), offsetof(ls_hybrid_layer, mlp_down), 0, 0),
                      .saved = &tb->layers[l].dec, .sc = sc, .ctx = &pc};
    return ls_dec_layer_bwd(&d, dx);
}

ls_status ls_hybrid_layer_bwd(const ls_dec_model *dm, const ls_dec_grad *g, const ls_dec_branch *tape, int l,
                              float *dx, const ls_dec_dstate *dc, ls_arena *sc) {
    return layer_bwd(dm->fam, g->fam, l, (const ls_branch_tape *)tape, dx, dc, sc);
}

static ls_dec_grad grad_of(ls_hybrid_model *grad) {
    return (ls_dec_grad){grad->embed, grad->final_norm, grad->lm_head, grad};
}

ls_status ls_hybrid_branch_bwd(const ls_hybrid_model *m, ls_hybrid_model *grad, const ls_branch_tape *tb,
                               const float *dlogprob, ls_prompt_state *dstate, ls_arena *scratch) {
    LS_ASSERT(!dstate || dstate->full, "the prompt state has no gradient buffer (full mode)");
    ls_dec_dstate dc = {dstate, 0, NULL};
    ls_hybrid_pass hp;
    ls_dec_model dm = ls_hybrid_dec(m, &hp);
    ls_dec_grad g = grad_of(grad);
    return ls_dec_branch_bwd(&dm, &g, &tb->h, dlogprob, &dc, scratch);
}

/* Another rank's sweep chunk at position `lo` (owner `owner`), layer l: what it reads of
 * this rank — an attention layer's pages before `lo` in the chunk's forward (bwd 0; the
 * driver walks the layers in order), then again in its backward (bwd 1, reverse order),
 * each block answered by its dK/dV, which are added to this rank's dState. The same
 * program order as the owner's. */
ls_status ls_hybrid_sweep_serve(const ls_dec_model *dm, ls_prompt_state *st, int owner, int64_t lo, int l, int bwd,
                                const ls_fwd_opts *o, ls_arena *sc) {
    const ls_config *c = dm->cfg;
    if (c->kind[l] != LS_LAYER_ATTN) return LS_OK;
    int64_t S = st->page_size, bp = ls_hybrid_cp_block(st, o), kvn = S * (int64_t)c->n_kv * c->head_dim;
    if (!bwd) return ls_hybrid_cp_send_pages(st, l, owner, lo, bp, sc);
    size_t pb = (size_t)kvn * ls_dtype_size(st->dtype);
    ls_layer_dstate *ds = &st->full->d[l];
    for (int k = 0; k < st->nseg; k++) { /* earlier segments, prompt order */
        if (st->seg_hi[k] == st->seg_lo[k] || st->seg_hi[k] > lo) continue;
        int64_t lp = st->seg_lpage[k];
        LS_TRY(ls_dist_pages_send_grad(dm->be, st->comm, st->attn[l].k_pages + lp, st->attn[l].v_pages + lp, ds->dk + lp,
                                       ds->dv + lp, st->seg_hi[k] - st->seg_lo[k], S, pb, kvn, bp, owner, l, sc));
    }
    return LS_OK;
}

ls_status ls_hybrid_sweep_relay(const ls_dec_model *dm, ls_prompt_state *st, int peer, int send, int l) {
    const ls_config *c = dm->cfg;
    if (c->kind[l] != LS_LAYER_GDN) return LS_OK;
    const ls_hybrid_config *hc = ls_hybrid_cfg(c);
    size_t conv_n = (size_t)(hc->conv_k - 1) * (size_t)ls_cfg_conv_dim(c);
    size_t rec_n = (size_t)hc->H_v * (size_t)hc->d_k * (size_t)hc->d_v;
    ls_layer_dstate *d = &st->full->d[l];
    ls_dist_part parts[2] = {{d->dS, rec_n * sizeof(float)}, {d->dtail, conv_n * sizeof(float)}};
    return send ? ls_dist_relay_send(dm->be, st->comm, parts, 2, peer, l)
                : ls_dist_relay_recv(dm->be, st->comm, parts, 2, peer, l);
}

ls_status ls_hybrid_sweep(const ls_hybrid_model *m, ls_hybrid_model *grad, ls_prompt_state *st, const int32_t *ids,
                          const ls_fwd_opts *o, ls_arena *tape_arena, ls_arena *scratch) {
    ls_hybrid_pass hp;
    ls_dec_model dm = ls_hybrid_dec(m, &hp);
    ls_dec_grad g = grad_of(grad);
    return ls_dec_sweep(&dm, &g, st, ids, o, tape_arena, scratch);
}
