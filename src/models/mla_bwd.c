/*
 * mla_bwd.c — backward of a taped MLA-family branch (prefix-frozen, DESIGN §3):
 * parameter gradients (+=) into a gradient set. The selections (indexer top-k, expert
 * choice) are constants: the indexer and e_score_correction_bias get no gradient from
 * the GRPO loss (the indexer only from the optional indexer KL loss), and experts are
 * recomputed from the saved routing. A gradient set may leave tensors NULL
 * (frozen): their gradient is skipped. Rows before the tape's grad_from (the naive
 * mode's prompt) pass no gradient as keys, so the plain forward over prompt + response
 * gives the prefix-frozen gradient too.
 */
#include <math.h>
#include <string.h>

#include "longstraw/comm.h"
#include "decoder.h"
#include "longstraw/cp.h"
#include "longstraw/kernels.h"
#include "longstraw/trace.h"
#include "mla_tape.h"

#define ALLOC_F(arena, n) ((float *)ls_arena_alloc((arena), (size_t)(n) * sizeof(float)))
#define CALLOC_F(arena, n) ((float *)ls_arena_calloc((arena), (size_t)(n), sizeof(float)))
#define NEED(p)                        \
    do {                               \
        if (!(p)) return LS_ERR_NOMEM; \
    } while (0)
/* tensor `base` + off of a gradient set, or NULL when the set leaves it out */
#define GOFF(base, off) ((base) ? (base) + (off) : NULL)

/* MoE backward: dres [T, D] = ∂L/∂(block output) → dxn (+=). */
ls_status ls_mla_moe_bwd(const ls_mla_model *m, int l, ls_mla_layer *gw, const mla_layer_tape *tp, const float *dres,
                         float *dxn, int64_t T, ls_arena *sc) {
    const ls_config *c = &m->cfg;
    const ls_mla_config *mc = ls_mla_cfg(c);
    const ls_mla_layer *w = &m->layers[l];
    int64_t D = c->hidden, Im = c->moe_inter, Is = Im * mc->n_shared_experts;
    int E = c->n_experts, K = c->top_k;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    /* [dwt (T·K) | the experts' ∂L/∂xn (T·D) under expert parallelism], combined over ep as
     * rows [T, K + D] */
    float *dwt = CALLOC_F(sc, T * K + (m->ep ? T * D : 0)), *dlog = ALLOC_F(sc, T * E);
    float *dxe = m->ep ? dwt + T * K : dxn, *rowsw = m->ep ? ALLOC_F(sc, T * (K + D)) : NULL;
    NEED(dwt && dlog && (!m->ep || rowsw));
    ls_dec_experts ex = {.D = D, .I = Im, .E = E, .K = K, .e0 = m->e0, .ne = m->n_local_experts, .gu_w = w->exp_gu,
                         .down_w = w->exp_down, .dgu_w = gw->exp_gu, .ddown_w = gw->exp_down};
    LS_TRY(ls_dec_experts_bwd(m->be, &ex, dwt, dxe, dres, tp->dec.xn2, tp->esel, tp->wt, T, sc));
    if (m->ep) { /* every rank's experts' shares, back to the tokens' slice owners and summed (forward's way) */
        ls_op_copy_rows(m->be, rowsw, K + D, dwt, K, T, K);
        ls_op_copy_rows(m->be, rowsw + K, K + D, dxe, D, T, D);
        LS_TRY(ls_dist_ep_combine(m->be, rowsw, T, K + D, tp->esel, K, m->n_local_experts, m->ep, sc));
        ls_op_copy_rows(m->be, dwt, K, rowsw, K + D, T, K);
        for (int64_t t = 0; t < T; t++) ls_op_add_to(m->be, dxn + t * D, rowsw + t * (K + D) + K, D);
    }
    ls_op_mla_route_bwd(m->be, dlog, dwt, tp->s, tp->esel, T, E, K, c->norm_topk, mc->routed_scaling);
    ls_op_linear_bwd(m->be, dxn, gw->router, dlog, tp->dec.xn2, w->router, T, D, E, 1);
    if (Is > 0)
        LS_TRY(ls_dec_swiglu_bwd(m->be, dxn, gw->sh_gu, gw->sh_down, dres, tp->dec.xn2, tp->sh_gu, tp->sh_act, w->sh_gu,
                                 w->sh_down, T, D, Is, 1, NULL, sc));
    ls_arena_release(sc, mk);
    return LS_OK;
}


/* The indexer KL loss of full layer l (spec §3 "Indexer training", sparse stage): for the
 * branch's queries t ≥ out_from, KL(p_t ‖ q_t) over the selected keys S_t, p_t the
 * attention's probabilities averaged over heads (detached), q_t = softmax over S_t of
 * the index scores; the indexer's inputs (x, c_q) and the prompt's index keys are
 * constants, so only the layer's indexer tensors get its gradient (weight 1 per query),
 * and Σ_t KL goes to *sum. Under CP a rank holds part of each S_t: one MAX and one SUM
 * all-reduce make the softmax's and the KL's sums global, and one SUM all-reduce the
 * queries' and own keys' gradients (every rank then forms the same weight gradients). */
static ls_status indexer_kl_bwd(const ls_mla_model *m, int l, ls_mla_layer *gw, const mla_tape *tb, double *sum,
                                ls_arena *sc) {
    const ls_config *c = &m->cfg;
    const ls_mla_config *mc = ls_mla_cfg(c);
    const ls_mla_layer *w = &m->layers[l];
    const mla_layer_tape *tp = &tb->layers[l];
    int64_t T = tb->h.T, D = c->hidden, rq = mc->q_lora_rank, kk = tb->kk, t0 = tb->h.out_from, nq = T - t0;
    int64_t pos0 = tb->h.pos0, dk = mc->kv_lora_rank + mc->qk_rope;
    int nI = mc->index_heads, dI = mc->index_head_dim, H = c->n_heads, half = mc->qk_rope / 2;
    if (nq <= 0) return LS_OK;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *qI = ALLOC_F(sc, nq * nI * dI), *wq = ALLOC_F(sc, nq * nI), *kpre = ALLOC_F(sc, T * dI);
    float *kI = ALLOC_F(sc, T * dI), *Is = ALLOC_F(sc, nq * kk), *P = ALLOC_F(sc, nq * kk);
    /* the softmax statistics are formed on the host: scores and probabilities read back
     * once (hIs, hP: themselves on a host-memory backend), the gradient sent back once */
    size_t sb = (size_t)(nq * kk) * sizeof(float);
    float *mx = ls_arena_host_alloc(sc, (size_t)nq * sizeof(float));
    double *st = ls_arena_host_alloc(sc, (size_t)(3 * nq) * sizeof(double)); /* [Σ exp(I − max) | Σ p(log p − I) | Σ p] */
    /* [dqI (nq·nI·dI) | dw (nq·nI) | the own keys' gradient (T·dI)]: one buffer, summed over cp */
    int64_t nb = nq * nI * dI + nq * nI + T * dI;
    float *dq = CALLOC_F(sc, nb), *dw = dq ? dq + nq * nI * dI : NULL, *dkI = dq ? dw + nq * nI : NULL;
    NEED(qI && wq && kpre && kI && Is && P && mx && st && dq);
    ls_mla_index_queries(m, l, tp->dec.xn1 + t0 * D, tp->cq + t0 * rq, nq, pos0 + t0, qI, wq);
    ls_mla_index_keys(m, l, tp->dec.xn1, T, pos0, kI, kpre); /* the own index keys, as the forward formed them */
    if (tb->st && tb->st->dtype != LS_DTYPE_F32) ls_op_round_to(m->be, kI, T * dI, tb->st->dtype);
    ls_kv_prefix lat = {0, 1, LS_DTYPE_F32, NULL, NULL};
    if (tb->st) lat = ls_state_prefix(tb->st, l);
    const int32_t *sel = tp->sel;
    int64_t apos0 = pos0; /* the own rows' origin in the selection */
    if (tb->cp) {
        lat.n = apos0 = ls_state_held_before(tb->st, tb->nkeys);
        sel = tp->sel_local;
    }
    int mine = !tb->cp || ls_comm_rank(tb->cp) == tb->own_rank; /* this rank holds the branch's own keys */
    ls_kv_prefix keys = {lat.n, lat.page_size, lat.dtype, lat.v_pages, NULL}; /* the index-key pages */
    float scale = 1.0f / sqrtf((float)dI);
    sel += t0 * kk;
    ls_op_dsa_sel_scores(m->be, Is, qI, wq, &keys, kI, sel, kk, nq, nI, dI, apos0, scale);
    ls_op_mla_attn_probs(m->be, P, tp->qa + t0 * H * dk, tp->lse + t0 * H, tp->own, &lat, sel, kk, nq, H, mc->kv_lora_rank,
                      mc->qk_rope, apos0, m->scale);
    float *hIs = ls_host_view(m->be, sc, Is, sb, 1), *hP = ls_host_view(m->be, sc, P, sb, 1);
    NEED(hIs && hP);
    for (int64_t i = 0; i < nq; i++) {
        float v = -INFINITY;
        for (int64_t j = 0; j < kk; j++) v = hIs[i * kk + j] > v ? hIs[i * kk + j] : v;
        mx[i] = v;
    }
    if (tb->cp) LS_TRY(ls_dist_max_f32(tb->cp, mx, nq));
    for (int64_t i = 0; i < nq; i++) {
        double z = 0, a = 0, b = 0;
        for (int64_t j = 0; j < kk; j++) {
            float sv = hIs[i * kk + j], p = hP[i * kk + j];
            if (sv == -INFINITY) continue;
            z += exp((double)sv - mx[i]);
            if (p > 0) {
                a += (double)p * (log((double)p) - sv);
                b += p;
            }
        }
        st[i] = z, st[nq + i] = a, st[2 * nq + i] = b;
    }
    if (tb->cp) LS_TRY(ls_dist_sum_f64(tb->cp, st, 3 * nq));
    for (int64_t i = 0; i < nq; i++) { /* KL = Σ p log p − Σ p (I − lse_I); ∂KL/∂I = q − p */
        LS_ASSERT(st[i] > 0, "layer %d: query %lld selected no key", l, (long long)(t0 + i)); /* its own is causal */
        double lse = mx[i] + log(st[i]);
        *sum += st[nq + i] + lse * st[2 * nq + i];
        for (int64_t j = 0; j < kk; j++) {
            float *g = hIs + i * kk + j; /* becomes ∂KL/∂I */
            *g = *g == -INFINITY ? 0.0f : (float)(exp((double)*g - lse) - (double)hP[i * kk + j]);
        }
    }
    ls_host_view_done(m->be, sc, Is, hIs, sb, 1);
    ls_op_dsa_sel_scores_bwd(m->be, dq, dw, mine ? dkI : NULL, Is, qI, wq, &keys, kI, sel, kk, nq, nI, dI, apos0, scale);
    if (tb->h.grad_from > 0) ls_op_zero(m->be, dkI, tb->h.grad_from * dI); /* naive: the prompt's keys */
    if (tb->cp) LS_TRY(ls_dist_sum_f32(m->be, tb->cp, dq, nb));
    /* qI = rope(wq_b c_q); w = weights_proj(x)·nI^−½; kI = rope(LayerNorm(wk x)) */
    ls_op_rope_table_bwd(m->be, dq, nq, nI, dI, 0, half, m->inv_freq, mc->indexer_rope_interleave, pos0 + t0);
    ls_op_linear_bwd(m->be, NULL, gw->idx_wq, dq, tp->cq + t0 * rq, w->idx_wq, nq, rq, (int64_t)nI * dI, 0);
    float ws = 1.0f / sqrtf((float)nI);
    ls_op_scale(m->be, dw, ws, nq * nI);
    ls_op_linear_bwd(m->be, NULL, gw->idx_weights, dw, tp->dec.xn1 + t0 * D, w->idx_weights, nq, D, nI, 0);
    ls_op_rope_table_bwd(m->be, dkI, T, 1, dI, 0, half, m->inv_freq, mc->indexer_rope_interleave, pos0);
    ls_op_layernorm_bwd(m->be, dkI, gw->idx_knorm_w, gw->idx_knorm_b, dkI, kpre, w->idx_knorm_w, T, dI, LS_MLA_INDEX_NORM_EPS);
    ls_op_linear_bwd(m->be, NULL, gw->idx_wk, dkI, tp->dec.xn1, w->idx_wk, T, D, dI, 0);
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* The output side's backward (spec §2): dy [T, D] = ∂L/∂(mixer output) through o_proj
 * (ov its input) and W_UV (o the attention) into dob [T, H, rkv] (=) ∂L/∂ō; their
 * gradients (+=). */
ls_status ls_mla_out_bwd(const ls_mla_model *m, int l, ls_mla_layer *gw, const float *dy, const float *ov,
                         const float *o, float *dob, int64_t T, ls_arena *sc) {
    const ls_config *c = &m->cfg;
    const ls_mla_config *mc = ls_mla_cfg(c);
    const ls_mla_layer *w = &m->layers[l];
    int64_t rkv = mc->kv_lora_rank;
    int H = c->n_heads, dn = mc->qk_nope, dv = mc->v_head;
    int64_t hb = dn + dv;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *dov = ALLOC_F(sc, T * H * dv); /* ∂L/∂(W_UV outputs) */
    NEED(dov);
    ls_op_linear_bwd(m->be, dov, gw->o_proj, dy, ov, w->o_proj, T, (int64_t)H * dv, c->hidden, 0);
    for (int h = 0; h < H; h++) { /* ov[h] = ō[h]·W_UV[h]ᵀ */
        const float *Wuv = w->kv_b + (h * hb + dn) * rkv;
        ls_op_gemm(m->be, 0, 0, (int)T, (int)rkv, dv, 1.0f, dov + h * dv, H * dv, Wuv, (int)rkv, 0.0f, dob + h * rkv,
                   (int)(H * rkv));
        if (gw->kv_b)
            ls_op_gemm(m->be, 1, 0, dv, (int)rkv, (int)T, 1.0f, dov + h * dv, H * dv, o + h * rkv, (int)(H * rkv), 1.0f,
                       gw->kv_b + (h * hb + dn) * rkv, (int)rkv);
    }
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* The query path's backward: dqa [T, H, rkv+dr] = ∂L/∂(absorbed queries) through W_UK, RoPE,
 * q_b, the q norm and q_a (q, cq, cq_raw, rstd_q the forward's; xn the layer's normed
 * input at positions pos0..) into dxn [T, D] (+=); their gradients (+=). */
ls_status ls_mla_q_bwd(const ls_mla_model *m, int l, ls_mla_layer *gw, const float *dqa, const float *q,
                       const float *cq, const float *cq_raw, const float *rstd_q, const float *xn, float *dxn,
                       int64_t T, int64_t pos0, ls_arena *sc) {
    const ls_config *c = &m->cfg;
    const ls_mla_config *mc = ls_mla_cfg(c);
    const ls_mla_layer *w = &m->layers[l];
    int64_t D = c->hidden, rq = mc->q_lora_rank, rkv = mc->kv_lora_rank;
    int H = c->n_heads, dn = mc->qk_nope, dr = mc->qk_rope, dv = mc->v_head, half = dr / 2;
    int64_t dq = dn + dr, dk = rkv + dr, hb = dn + dv;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *dqf = ALLOC_F(sc, T * H * dq), *dcq = ALLOC_F(sc, T * rq);
    NEED(dqf && dcq);
    for (int h = 0; h < H; h++) { /* qa[h] = [q_nope[h]·W_UK[h] ; q_pe[h]] */
        const float *Wuk = w->kv_b + h * hb * rkv;
        ls_op_gemm(m->be, 0, 1, (int)T, dn, (int)rkv, 1.0f, dqa + h * dk, (int)(H * dk), Wuk, (int)rkv, 0.0f,
                   dqf + h * dq, (int)(H * dq));
        if (gw->kv_b)
            ls_op_gemm(m->be, 1, 0, dn, (int)rkv, (int)T, 1.0f, q + h * dq, (int)(H * dq), dqa + h * dk, (int)(H * dk),
                       1.0f, gw->kv_b + h * hb * rkv, (int)rkv);
        ls_op_copy_rows(m->be, dqf + h * dq + dn, H * dq, dqa + h * dk + rkv, H * dk, T, dr);
    }
    ls_op_rope_table_bwd(m->be, dqf, T, H, (int)dq, dn, half, m->inv_freq, mc->rope_interleave, pos0);
    ls_op_linear_bwd(m->be, dcq, gw->q_b, dqf, cq, w->q_b, T, rq, (int64_t)H * dq, 0);
    ls_op_rmsnorm_plain_bwd(m->be, dcq, gw->q_a_norm, dcq, cq_raw, rstd_q, w->q_a_norm, T, rq);
    ls_op_linear_bwd(m->be, dxn, gw->q_a, dcq, xn, w->q_a, T, D, rq, 1);
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* The latent rows' backward: down [T, rkv+dr] = ∂L/∂(own rows) (overwritten) through RoPE,
 * the latent norm (lat_raw, rstd_kv the forward's) and kv_a into dxn [T, D] (+=). */
ls_status ls_mla_kv_bwd(const ls_mla_model *m, int l, ls_mla_layer *gw, float *down, const float *lat_raw,
                        const float *rstd_kv, const float *xn, float *dxn, int64_t T, int64_t pos0, ls_arena *sc) {
    const ls_config *c = &m->cfg;
    const ls_mla_config *mc = ls_mla_cfg(c);
    const ls_mla_layer *w = &m->layers[l];
    int64_t D = c->hidden, rkv = mc->kv_lora_rank;
    int dr = mc->qk_rope, half = dr / 2;
    int64_t dk = rkv + dr;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *dlat = ALLOC_F(sc, T * rkv), *dkva = ALLOC_F(sc, T * dk);
    NEED(dlat && dkva);
    ls_op_rope_table_bwd(m->be, down, T, 1, (int)dk, (int)rkv, half, m->inv_freq, mc->rope_interleave, pos0);
    ls_op_copy_rows(m->be, dlat, rkv, down, dk, T, rkv);
    ls_op_rmsnorm_plain_bwd(m->be, dlat, gw->kv_a_norm, dlat, lat_raw, rstd_kv, w->kv_a_norm, T, rkv);
    ls_op_copy_rows(m->be, dkva, dk, dlat, rkv, T, rkv);
    ls_op_copy_rows(m->be, dkva + rkv, dk, down + rkv, dk, T, dr);
    ls_op_linear_bwd(m->be, dxn, gw->kv_a, dkva, xn, w->kv_a, T, D, dk, 1);
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* The MLA mixer's backward: dy [T, D] = ∂L/∂(mixer output) → dxn [T, D] (=). */
static ls_status mixer_bwd(const ls_mla_model *m, int l, ls_mla_layer *gw, const mla_tape *tb, const float *dy,
                           float *dxn, const ls_dec_dstate *dc, ls_arena *sc) {
    const ls_config *c = &m->cfg;
    const ls_mla_config *mc = ls_mla_cfg(c);
    const mla_layer_tape *tp = &tb->layers[l];
    int64_t T = tb->h.T, D = c->hidden, rkv = mc->kv_lora_rank, pos0 = tb->h.pos0;
    int H = c->n_heads, dr = mc->qk_rope;
    int64_t dk = rkv + dr;
    if (dc->aux_sum && mc->index_full[l]) LS_TRY(indexer_kl_bwd(m, l, gw, tb, dc->aux_sum, sc));
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *dob = ALLOC_F(sc, T * H * rkv); /* ∂L/∂ō */
    float *dqa = ALLOC_F(sc, T * H * dk + T * dk), *down = dqa ? dqa + T * H * dk : NULL; /* queries | own rows */
    NEED(dob && dqa && down);
    LS_TRY(ls_mla_out_bwd(m, l, gw, dy, tp->ov, tp->o, dob, T, sc));
    ls_kv_prefix pre = {0, 1, LS_DTYPE_F32, NULL, NULL};
    if (tb->st) pre = ls_state_prefix(tb->st, l);
    const int32_t *sel = tp->sel;
    int64_t apos0 = pos0; /* the kernel's own-rows origin */
    if (tb->cp) { /* this rank's share: its local rows of the selection (spec §6 "Backward") */
        pre.n = apos0 = ls_state_held_before(tb->st, tb->nkeys);
        sel = tp->sel_local;
    }
    void *const *dpre = dc->st && tb->st ? dc->st->full->d[l].dk : NULL; /* the prompt rows' gradient (+=) */
    LS_TRY(ls_op_mla_attn_bwd(m->be, dqa, down, dpre, dob, tp->o, tp->lse, tp->qa, tp->own, &pre, sel, tb->kk, T, H, (int)rkv,
                           dr, apos0, m->scale));
    if (tb->h.grad_from > 0) /* the naive mode's prompt rows are keys without gradient */
        ls_op_zero(m->be, down, tb->h.grad_from * dk);
    if (dc->sweep) { /* a sweep chunk: its rows' gradient from every later query (on the rank holding them) */
        const ls_prompt_state *st = dc->st;
        for (int64_t t = 0; t < T; t++) {
            int64_t pos = pos0 + t, lp = ls_state_local_page(st, pos);
            LS_ASSERT(lp >= 0 || tb->cp, "position %lld is not held by this rank", (long long)pos);
            if (lp < 0) continue;
            ls_op_add_to(m->be, down + t * dk, (const float *)st->full->d[l].dk[lp] + (pos % st->page_size) * dk, dk);
        }
    }
    if (tb->cp) /* every rank's share of ∂L/∂q and ∂L/∂(own rows), summed: the whole on every rank */
        LS_TRY(ls_dist_sum_f32(m->be, tb->cp, dqa, T * H * dk + T * dk));
    ls_op_zero(m->be, dxn, T * D);
    LS_TRY(ls_mla_q_bwd(m, l, gw, dqa, tp->q, tp->cq, tp->cq_raw, tp->rstd_q, tp->dec.xn1, dxn, T, pos0, sc));
    LS_TRY(ls_mla_kv_bwd(m, l, gw, down, tp->lat_raw, tp->rstd_kv, tp->dec.xn1, dxn, T, pos0, sc));
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* The family's parts of a layer's backward for the skeleton (decoder.h). */
typedef struct {
    const ls_mla_model *m;
    int l;
    ls_mla_layer *gw;
    const mla_tape *tb;
    const ls_dec_dstate *dc;
} part_ctx;

static ls_status part_mixer_bwd(const ls_dec_layer *d, const float *dres, float *dxn) {
    const part_ctx *p = d->ctx;
    return mixer_bwd(p->m, p->l, p->gw, p->tb, dres, dxn, p->dc, d->sc);
}

static ls_status part_moe_bwd(const ls_dec_layer *d, const float *dres, float *dxn) {
    const part_ctx *p = d->ctx;
    return ls_mla_moe_bwd(p->m, p->l, p->gw, &p->tb->layers[p->l], dres, dxn, d->T, d->sc);
}

/* One layer: dx [T, D] holds ∂L/∂(layer output) on entry, ∂L/∂(layer input) on exit. */
static ls_status layer_bwd(const ls_mla_model *m, ls_mla_model *grad, int l, const mla_tape *tb, float *dx,
                           const ls_dec_dstate *dc, ls_arena *sc) {
    const ls_config *c = &m->cfg;
    const ls_mla_layer *w = &m->layers[l];
    ls_mla_layer *gw = &grad->layers[l];
    part_ctx pc = {m, l, gw, tb, dc};
    ls_dec_layer d = {.be = m->be, .T = tb->h.T, .D = c->hidden, .I = c->intermediate, .eps = c->eps,
                      .norm = LS_NORM_PLAIN, .input_norm = w->input_norm, .post_norm = w->post_norm,
                      .d_input_norm = gw->input_norm, .d_post_norm = gw->post_norm, .mixer_bwd = part_mixer_bwd,
                      .moe_bwd = c->moe[l] ? part_moe_bwd : NULL, .gu_w = w->mlp_gu, .down_w = w->mlp_down,
                      .dgu_w = gw->mlp_gu, .ddown_w = gw->mlp_down, .saved = &tb->layers[l].dec, .sc = sc,
                      .ctx = &pc};
    return ls_dec_layer_bwd(&d, dx);
}

ls_status ls_mla_layer_bwd(const ls_dec_model *dm, const ls_dec_grad *g, const ls_dec_branch *tape, int l, float *dx,
                           const ls_dec_dstate *dc, ls_arena *sc) {
    return layer_bwd(dm->fam, g->fam, l, (const mla_tape *)tape, dx, dc, sc);
}

static ls_dec_grad grad_of(ls_mla_model *grad) { return (ls_dec_grad){grad->embed, grad->final_norm, grad->lm_head, grad}; }

ls_status ls_mla_branch_bwd(const ls_mla_model *m, ls_mla_model *grad, const ls_branch_tape *tape,
                            const float *dlogprob, ls_prompt_state *dstate, const ls_fwd_opts *o, ls_arena *scratch) {
    LS_ASSERT(!dstate || dstate->full, "the prompt state has no gradient buffer (full mode)");
    LS_ASSERT(!(o && o->aux_loss) || o->aux_loss_sum, "the indexer KL loss needs a sum to add to");
    ls_dec_dstate dc = {dstate, 0, o && o->aux_loss ? o->aux_loss_sum : NULL};
    ls_mla_pass mp;
    ls_dec_model dm = ls_mla_dec(m, &mp);
    ls_dec_grad g = grad_of(grad);
    return ls_dec_branch_bwd(&dm, &g, &((const mla_tape *)tape)->h, dlogprob, &dc, scratch);
}

ls_status ls_mla_sweep(const ls_mla_model *m, ls_mla_model *grad, ls_prompt_state *st, const int32_t *ids,
                       const ls_fwd_opts *o, ls_arena *tape_arena, ls_arena *scratch) {
    /* Under CP layer-major (mla_sweep.c) when the driver says so; else every rank
     * recomputes every chunk (a branch against the pages before it, rank 0 attending its
     * rows) so that each adds the gradient of the pages it holds, the parameter gradient
     * then rank 0's alone (the caller sums over the ranks). */
    ls_mla_model none = *grad, *gm = grad; /* none: a gradient set without buffers */
    ls_arena_mark top = ls_arena_get_mark(scratch);
    ls_mla_pass mp = {.sel_layer = -1};
    ls_dec_model dm = ls_mla_dec(m, &mp);
    if (ls_dec_sweep_layer_major(&dm, st, o)) { /* mla_sweep.c: each rank its positions' share */
        int64_t Tr = st->full->xres_rows, topk = ls_mla_cfg(&m->cfg)->index_topk;
        mp.kk = topk < st->capacity ? topk : st->capacity; /* the selection's stride, as the capture's */
        mp.sel = ls_arena_alloc(scratch, (size_t)((Tr > 0 ? Tr : 1) * mp.kk) * sizeof(int32_t));
        NEED(mp.sel);
    } else if (st->nranks > 1 && st->rank != 0) {
        none.layers = ls_arena_host_calloc(scratch, (size_t)m->cfg.n_layers, sizeof(ls_mla_layer));
        NEED(none.layers);
        none.embed = none.final_norm = none.lm_head = NULL;
        gm = &none;
    }
    ls_dec_grad g = grad_of(gm);
    ls_status s = ls_dec_sweep(&dm, &g, st, ids, o, tape_arena, scratch);
    ls_arena_release(scratch, top);
    return s;
}
