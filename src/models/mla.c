/*
 * mla.c — forward of the MLA + DSA + MoE family (specs/mla-dsa-moe.md §2–§4): capture
 * (extend the prompt state chunk by chunk, no tape), branch (continue from a read-only
 * state, with or without a tape; with no state it is the plain forward) and decode.
 * One layer function serves all of them: capture passes an append target, a branch
 * none. Attention is sparse and absorbed: the indexer of a full layer picks each
 * query's top-k positions (a shared IndexCache layer reuses them), and every head
 * attends over those positions' latent rows [c_kv ; k_pe], the value being c_kv; W_UV
 * is applied per head after the sum. With a tape every buffer the backward reads comes
 * from the tape arena (mla_tape.h); without one, transients come from scratch.
 */
#include <cblas.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "longstraw/kernels.h"
#include "longstraw/trace.h"
#include "mla_tape.h"

#define ALLOC_F(arena, n) ((float *)ls_arena_alloc((arena), (size_t)(n) * sizeof(float)))
#define NEED(p)                        \
    do {                               \
        if (!(p)) return LS_ERR_NOMEM; \
    } while (0)

/* Score rows of the indexer formed at once: about this many values. */
#define INDEX_BLOCK_VALUES ((int64_t)1 << 22)

/* Per-call context of one layer. */
typedef struct {
    int64_t T, pos0;
    const ls_prompt_state *st; /* pages of positions < pos0 (NULL: none) */
    ls_prompt_state *append;   /* capture: append this call's latent rows and index keys */
    int32_t *sel;              /* [T, kk]: the most recent full layer's selection (a full layer writes it) */
    int64_t kk;                /* its row stride: min(index_topk, pos0 + T) */
    mla_layer_tape *tp;        /* NULL: no tape */
    ls_arena *ta, *sc;
} mla_ctx;

static ls_kv_prefix prefix_of(const ls_prompt_state *st, int l) {
    if (st) return ls_state_prefix(st, l);
    ls_kv_prefix none = {0, 1, LS_DTYPE_F32, NULL, NULL};
    return none;
}

/* The lightning indexer of full layer l (spec §3): index keys kI [T, dI] (=, for the
 * state) and each query's causal top-kk over the prefix's index keys and its own. */
static ls_status indexer(const ls_mla_model *m, int l, const float *xn, const float *cq, float *kI, mla_ctx *L) {
    const ls_config *c = &m->cfg;
    const ls_mla_config *mc = &c->mla;
    const ls_mla_layer *w = &m->layers[l];
    int64_t T = L->T, D = c->hidden, rq = mc->q_lora_rank, pos0 = L->pos0;
    int nI = mc->index_heads, dI = mc->index_head_dim, half = mc->qk_rope / 2;
    ls_arena *sc = L->sc;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *qI = ALLOC_F(sc, T * nI * dI); /* [T, nI, dI] */
    float *wq = ALLOC_F(sc, T * nI);      /* [T, nI] per-head weights */
    NEED(qI && wq);
    ls_linear_fwd(qI, cq, w->idx_wq, T, rq, (int64_t)nI * dI, 0);
    ls_rope_table_fwd(qI, T, nI, dI, 0, half, m->inv_freq, mc->indexer_rope_interleave, pos0); /* rope dims first */
    ls_linear_fwd(kI, xn, w->idx_wk, T, D, dI, 0);
    ls_layernorm_fwd(kI, kI, w->idx_knorm_w, w->idx_knorm_b, T, dI, 1e-6f);
    ls_rope_table_fwd(kI, T, 1, dI, 0, half, m->inv_freq, mc->indexer_rope_interleave, pos0);
    ls_linear_fwd(wq, xn, w->idx_weights, T, D, nI, 0);
    float ws = 1.0f / sqrtf((float)nI), scale = 1.0f / sqrtf((float)dI);
    for (int64_t i = 0; i < T * nI; i++) wq[i] *= ws;
    ls_kv_prefix pre = prefix_of(L->st, l);
    ls_kv_prefix keys = {pos0, pre.page_size, pre.dtype, pre.v_pages, NULL}; /* the prefix's index keys */
    void *own_page[1] = {kI};
    ls_kv_prefix own = {T, T, LS_DTYPE_F32, own_page, NULL};
    int64_t n = pos0 + T, tb = INDEX_BLOCK_VALUES / n;
    tb = tb < 1 ? 1 : tb > T ? T : tb;
    float *sp = ALLOC_F(sc, tb * (pos0 > 0 ? pos0 : 1)), *so = ALLOC_F(sc, tb * T), *row = ALLOC_F(sc, tb * n);
    int64_t *count = ls_arena_alloc(sc, (size_t)tb * sizeof(int64_t));
    NEED(sp && so && row && count);
    for (int64_t t0 = 0; t0 < T; t0 += tb) { /* rows [t0, t1): keys 0 .. pos0 + t1 − 1 */
        int64_t t1 = t0 + tb < T ? t0 + tb : T, nb = t1 - t0, w1 = pos0 + t1;
        if (pos0 > 0) LS_TRY(ls_dsa_scores(sp, qI + t0 * nI * dI, wq + t0 * nI, &keys, nb, nI, dI, scale, sc));
        LS_TRY(ls_dsa_scores(so, qI + t0 * nI * dI, wq + t0 * nI, &own, nb, nI, dI, scale, sc));
        for (int64_t r = 0; r < nb; r++) {
            memcpy(row + r * w1, sp + r * pos0, (size_t)pos0 * sizeof(float));
            memcpy(row + r * w1 + pos0, so + r * T, (size_t)t1 * sizeof(float));
        }
        LS_TRY(ls_dsa_topk(L->sel + t0 * L->kk, count, row, nb, w1, pos0 + t0, L->kk, sc));
    }
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* MLA mixer of layer l (spec §2, absorbed form): x[T, D] += o_proj(W_UV · attention). */
static ls_status mla_mixer(const ls_mla_model *m, int l, float *x, const float *xn, mla_ctx *L) {
    const ls_config *c = &m->cfg;
    const ls_mla_config *mc = &c->mla;
    const ls_mla_layer *w = &m->layers[l];
    int64_t T = L->T, D = c->hidden, rq = mc->q_lora_rank, rkv = mc->kv_lora_rank, pos0 = L->pos0;
    int H = c->n_heads, dn = mc->qk_nope, dr = mc->qk_rope, dv = mc->v_head, half = dr / 2;
    int64_t dq = dn + dr, dk = rkv + dr, hb = dn + dv; /* a head's q width, the latent row, kv_b rows per head */
    mla_layer_tape *tp = L->tp;
    ls_arena *A = tp ? L->ta : L->sc, *sc = L->sc;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *cq_raw = ALLOC_F(A, T * rq), *cq = ALLOC_F(A, T * rq); /* [T, rq] */
    float *q = ALLOC_F(A, T * H * dq);                              /* [T, H, dn+dr] */
    float *kva = ALLOC_F(sc, T * dk);                               /* [T, rkv+dr] kv_a_proj output */
    float *lat_raw = ALLOC_F(A, T * rkv), *lat = ALLOC_F(sc, T * rkv);
    float *own = ALLOC_F(A, T * dk);                                /* [T, rkv+dr] */
    float *qa = ALLOC_F(A, T * H * dk);                             /* [T, H, rkv+dr] */
    float *o = ALLOC_F(A, T * H * rkv);                             /* [T, H, rkv] */
    float *ov = ALLOC_F(A, T * H * dv);                             /* [T, H·dv] */
    float *rstd_q = tp ? ALLOC_F(A, T) : NULL, *rstd_kv = tp ? ALLOC_F(A, T) : NULL;
    float *lse = tp ? ALLOC_F(A, T * H) : NULL;
    NEED(cq_raw && cq && q && kva && lat_raw && lat && own && qa && o && ov && (!tp || (rstd_q && rstd_kv && lse)));
    /* query path: c_q = RMSNorm(q_a x); q = q_b c_q, per head [q_nope (dn) ; q_pe (dr)] */
    ls_linear_fwd(cq_raw, xn, w->q_a, T, D, rq, 0);
    ls_rmsnorm_plain_fwd(cq, rstd_q, cq_raw, w->q_a_norm, T, rq, c->eps);
    ls_linear_fwd(q, cq, w->q_b, T, rq, H * dq, 0);
    ls_rope_table_fwd(q, T, H, (int)dq, dn, half, m->inv_freq, mc->rope_interleave, pos0);
    /* KV path: the latent row [RMSNorm(a[:rkv]) ; RoPE(a[rkv:])], shared by every head */
    ls_linear_fwd(kva, xn, w->kv_a, T, D, dk, 0);
    for (int64_t t = 0; t < T; t++) memcpy(lat_raw + t * rkv, kva + t * dk, (size_t)rkv * sizeof(float));
    ls_rmsnorm_plain_fwd(lat, rstd_kv, lat_raw, w->kv_a_norm, T, rkv, c->eps);
    for (int64_t t = 0; t < T; t++) {
        memcpy(own + t * dk, lat + t * rkv, (size_t)rkv * sizeof(float));
        memcpy(own + t * dk + rkv, kva + t * dk + rkv, (size_t)dr * sizeof(float));
    }
    ls_rope_table_fwd(own, T, 1, (int)dk, (int)rkv, half, m->inv_freq, mc->rope_interleave, pos0);
    /* absorbed queries: q̃[h] = W_UK[h]ᵀ q_nope[h] (W_UK[h] = kv_b rows h·(dn+dv) ..+dn) */
    for (int h = 0; h < H; h++) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)rkv, dn, 1.0f, q + h * dq, (int)(H * dq),
                    w->kv_b + h * hb * rkv, (int)rkv, 0.0f, qa + h * dk, (int)(H * dk));
        for (int64_t t = 0; t < T; t++)
            memcpy(qa + (t * H + h) * dk + rkv, q + (t * H + h) * dq + dn, (size_t)dr * sizeof(float));
    }
    /* selection: a full layer's own indexer, or the most recent full layer's */
    float *kI = NULL;
    if (mc->index_full[l]) {
        if (tp) { /* the tape keeps every full layer's picks (shared layers point at them) */
            L->sel = ls_arena_alloc(A, (size_t)(T * L->kk) * sizeof(int32_t));
            NEED(L->sel);
        }
        kI = ALLOC_F(sc, T * mc->index_head_dim);
        NEED(kI);
        LS_TRY(indexer(m, l, xn, cq, kI, L));
    }
    LS_ASSERT(L->sel, "layer %d shares the selection of a full indexer layer, and none came before it", l);
    ls_kv_prefix pre = prefix_of(L->st, l);
    LS_TRY(ls_mla_attn_fwd(o, lse, qa, own, &pre, L->sel, L->kk, T, H, (int)rkv, dr, pos0, m->scale));
    /* per head o[h] = W_UV[h] ō[h], then o_proj into the residual */
    for (int h = 0; h < H; h++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, dv, (int)rkv, 1.0f, o + h * rkv, (int)(H * rkv),
                    w->kv_b + (h * hb + dn) * rkv, (int)rkv, 0.0f, ov + h * dv, H * dv);
    ls_linear_fwd(x, ov, w->o_proj, T, (int64_t)H * dv, D, 1);
    if (L->append) LS_TRY(ls_state_append_kv(L->append, l, own, kI, T));
    if (tp) {
        tp->cq_raw = cq_raw, tp->rstd_q = rstd_q, tp->cq = cq, tp->q = q, tp->lat_raw = lat_raw;
        tp->rstd_kv = rstd_kv, tp->own = own, tp->qa = qa, tp->sel = L->sel, tp->o = o, tp->lse = lse, tp->ov = ov;
    }
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* SwiGLU on rows xs[n, D] with fused [gate ; up] rows gu_w [2I, D]: out (= or +=)
 * down(SiLU(gate) ⊙ up); gu [n, 2I] and act [n, I] kept when given. */
static ls_status swiglu(float *out, float *gu, float *act, const float *xs, int64_t n, int64_t D, int64_t NI,
                        const float *gu_w, const float *down_w, int accumulate, ls_arena *sc) {
    ls_arena_mark mk = ls_arena_get_mark(sc);
    if (!gu) gu = ALLOC_F(sc, n * 2 * NI);
    if (!act) act = ALLOC_F(sc, n * NI);
    NEED(gu && act);
    ls_linear_fwd(gu, xs, gu_w, n, D, 2 * NI, 0);
    ls_swiglu_fwd(act, gu, n, NI);
    ls_linear_fwd(out, act, down_w, n, NI, D, accumulate);
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* MoE block (spec §4): x[T, D] += Σ_chosen g_e·E_e(xn) + Shared(xn). */
static ls_status moe(const ls_mla_model *m, int l, float *x, const float *xn, mla_ctx *L) {
    const ls_config *c = &m->cfg;
    const ls_mla_config *mc = &c->mla;
    const ls_mla_layer *w = &m->layers[l];
    int64_t T = L->T, D = c->hidden, Im = c->moe_inter, Is = Im * mc->n_shared_experts;
    int E = c->n_experts, K = c->top_k;
    mla_layer_tape *tp = L->tp;
    ls_arena *A = tp ? L->ta : L->sc, *sc = L->sc;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *s = ALLOC_F(A, T * E), *wt = ALLOC_F(A, T * K), *logits = ALLOC_F(sc, T * E);
    int32_t *sel = ls_arena_alloc(A, (size_t)(T * K) * sizeof(int32_t));
    int64_t *count = ls_arena_alloc(sc, (size_t)(E + 1) * sizeof(int64_t));
    int64_t *rows = ls_arena_alloc(sc, (size_t)(T * K) * sizeof(int64_t));
    NEED(s && wt && logits && sel && count && rows);
    ls_linear_fwd(logits, xn, w->router, T, D, E, 0);
    ls_mla_route_fwd(sel, wt, s, logits, w->router_bias, T, E, K, mc->n_group, mc->topk_group, c->norm_topk,
                     mc->routed_scaling);
    LS_TRY(ls_moe_group(count, rows, sel, T, E, K, sc));
    int64_t maxn = 0;
    for (int e = 0; e < E; e++) maxn = count[e + 1] - count[e] > maxn ? count[e + 1] - count[e] : maxn;
    float *xs = ALLOC_F(sc, maxn * D), *ys = ALLOC_F(sc, maxn * D); /* [n_e, D] */
    NEED(xs && ys);
    for (int e = 0; e < E; e++) {
        int64_t n = count[e + 1] - count[e];
        if (n == 0) continue;
        const int64_t *r = rows + count[e];
        for (int64_t i = 0; i < n; i++) memcpy(xs + i * D, xn + (r[i] / K) * D, (size_t)D * sizeof(float));
        LS_TRY(swiglu(ys, NULL, NULL, xs, n, D, Im, w->exp_gu + (int64_t)e * 2 * Im * D,
                      w->exp_down + (int64_t)e * D * Im, 0, sc));
        for (int64_t i = 0; i < n; i++) {
            float g = wt[r[i]];
            float *xt = x + (r[i] / K) * D;
            for (int64_t d = 0; d < D; d++) xt[d] += g * ys[i * D + d];
        }
    }
    if (Is > 0) {
        float *sgu = tp ? ALLOC_F(A, T * 2 * Is) : NULL, *sact = tp ? ALLOC_F(A, T * Is) : NULL;
        NEED(!tp || (sgu && sact));
        LS_TRY(swiglu(x, sgu, sact, xn, T, D, Is, w->sh_gu, w->sh_down, 1, sc));
        if (tp) tp->sh_gu = sgu, tp->sh_act = sact;
    }
    if (tp) tp->s = s, tp->esel = sel, tp->wt = wt;
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* One decoder layer on x[T, D]: h += MLA(norm(h)); h += FFN(norm(h)). */
static ls_status layer_fwd(const ls_mla_model *m, int l, float *x, int skip_ffn, mla_ctx *L) {
    const ls_config *c = &m->cfg;
    const ls_mla_layer *w = &m->layers[l];
    int64_t T = L->T, D = c->hidden;
    mla_layer_tape *tp = L->tp;
    ls_arena *A = tp ? L->ta : L->sc;
    ls_arena_mark mk = ls_arena_get_mark(L->sc);
    float *xn = ALLOC_F(A, T * D); /* [T, D] */
    NEED(xn);
    if (tp) {
        tp->x_in = ALLOC_F(A, T * D), tp->rstd1 = ALLOC_F(A, T);
        NEED(tp->x_in && tp->rstd1);
        memcpy(tp->x_in, x, (size_t)(T * D) * sizeof(float));
        tp->xn1 = xn;
    }
    ls_rmsnorm_plain_fwd(xn, tp ? tp->rstd1 : NULL, x, w->input_norm, T, D, c->eps);
    LS_TRY(mla_mixer(m, l, x, xn, L));
    if (!skip_ffn) {
        float *xn2 = xn;
        if (tp) {
            tp->x_mid = ALLOC_F(A, T * D), tp->xn2 = xn2 = ALLOC_F(A, T * D), tp->rstd2 = ALLOC_F(A, T);
            NEED(tp->x_mid && tp->xn2 && tp->rstd2);
            memcpy(tp->x_mid, x, (size_t)(T * D) * sizeof(float));
        }
        ls_rmsnorm_plain_fwd(xn2, tp ? tp->rstd2 : NULL, x, w->post_norm, T, D, c->eps);
        if (c->moe[l]) {
            LS_TRY(moe(m, l, x, xn2, L));
        } else {
            int64_t NI = c->intermediate;
            float *gu = tp ? ALLOC_F(A, T * 2 * NI) : NULL, *act = tp ? ALLOC_F(A, T * NI) : NULL;
            NEED(!tp || (gu && act));
            LS_TRY(swiglu(x, gu, act, xn2, T, D, NI, w->mlp_gu, w->mlp_down, 1, L->sc));
            if (tp) tp->gu = gu, tp->act = act;
        }
    }
    ls_arena_release(L->sc, mk); /* with a tape, everything kept came from the tape arena */
    return LS_OK;
}

static int64_t sel_stride(const ls_config *c, int64_t pos0, int64_t T) {
    return c->mla.index_topk < pos0 + T ? c->mla.index_topk : pos0 + T;
}

/* Extend `st` by ids[0..n) chunk by chunk (capture; decode with logits of the last
 * token, scaled by 1/temperature). */
static ls_status extend(const ls_mla_model *m, ls_prompt_state *st, const int32_t *ids, int64_t n, float *logits,
                        const ls_fwd_opts *o, ls_arena *scratch) {
    const ls_config *c = &m->cfg;
    int64_t D = c->hidden, C = o->capture_chunk > 0 ? o->capture_chunk : 2048;
    if (st->nranks > 1)
        return ls_err(LS_ERR_UNSUPPORTED, "%s: context parallelism (several ranks) is not built for the MLA family yet",
                      c->model_type);
    for (int64_t c0 = 0, T; c0 < n; c0 += T) {
        T = ls_state_span_end(st, 0, st->n, st->n + n - c0, C) - st->n;
        int last_chunk = c0 + T == n;
        if (!logits && ls_stop_requested())
            return ls_err(LS_ERR_INTERRUPTED, "stopped by signal %d during capture, at position %lld of %lld",
                          ls_stop_requested(), (long long)st->n, (long long)(st->n + n - c0));
        ls_arena_mark mk = ls_arena_get_mark(scratch);
        int64_t kk = sel_stride(c, st->n, T);
        float *x = ALLOC_F(scratch, T * D);                                    /* [T, D] */
        int32_t *sel = ls_arena_alloc(scratch, (size_t)(T * kk) * sizeof(int32_t)); /* [T, kk] */
        NEED(x && sel);
        ls_embed_fwd(x, ids + c0, m->embed, T, D);
        for (int l = 0; l < c->n_layers; l++) {
            mla_ctx L = {T, st->n, st, st, sel, kk, NULL, NULL, scratch};
            int skip = l == c->n_layers - 1 && !(logits && last_chunk); /* it feeds only the LM head */
            LS_TRY(layer_fwd(m, l, x, skip, &L));
            ls_trace_layer_end(l, "fwd");
        }
        ls_state_advance(st, T);
        if (!logits) ls_progress_add(T);
        if (logits && last_chunk) {
            float *h = x + (T - 1) * D;
            ls_rmsnorm_plain_fwd(h, NULL, h, m->final_norm, 1, D, c->eps);
            ls_linear_fwd(logits, h, m->lm_head, 1, D, c->vocab, 0);
            float it = 1.0f / o->temperature;
            for (int64_t v = 0; v < c->vocab; v++) logits[v] *= it;
        }
        ls_arena_release(scratch, mk);
    }
    return LS_OK;
}

ls_status ls_mla_capture(const ls_mla_model *m, ls_prompt_state *st, const int32_t *ids, int64_t n,
                         const ls_fwd_opts *o, ls_arena *scratch) {
    return extend(m, st, ids, n, NULL, o, scratch);
}

ls_status ls_mla_decode(const ls_mla_model *m, ls_prompt_state *const *sts, const int32_t *ids, int n, float *logits,
                        const ls_fwd_opts *o, ls_arena *scratch) {
    for (int i = 0; i < n; i++) /* each sequence its own state: one token each */
        LS_TRY(extend(m, sts[i], ids + i, 1, logits + (int64_t)i * m->cfg.vocab, o, scratch));
    return LS_OK;
}

ls_status ls_mla_branch_fwd(const ls_mla_model *m, const ls_prompt_state *st, const int32_t *ids, int64_t T,
                            int64_t out_from, int64_t grad_from, const int32_t *target, float *logprob, float *entropy,
                            ls_branch_tape **tape_out, const ls_fwd_opts *o, ls_arena *tape_arena, ls_arena *scratch) {
    const ls_config *c = &m->cfg;
    int64_t D = c->hidden, pos0 = st ? st->n : 0, kk = sel_stride(c, pos0, T);
    LS_ASSERT(out_from >= 0 && out_from <= T, "out_from %lld outside [0, %lld]", (long long)out_from, (long long)T);
    LS_ASSERT(grad_from >= 0 && grad_from <= out_from, "grad_from %lld", (long long)grad_from);
    if (st && st->nranks > 1)
        return ls_err(LS_ERR_UNSUPPORTED, "%s: context parallelism (several ranks) is not built for the MLA family yet",
                      c->model_type);
    int taping = tape_out != NULL;
    ls_arena *A = taping ? tape_arena : scratch; /* what outlives a layer */
    ls_arena_mark mk = ls_arena_get_mark(scratch);
    mla_tape *tb = NULL;
    if (taping) {
        tb = ls_arena_calloc(A, 1, sizeof *tb);
        NEED(tb);
        tb->layers = ls_arena_calloc(A, (size_t)c->n_layers, sizeof(mla_layer_tape));
        NEED(tb->layers);
        tb->T = T, tb->out_from = out_from, tb->grad_from = grad_from, tb->pos0 = pos0, tb->kk = kk;
        tb->ids = ids, tb->target = target, tb->st = st, tb->temperature = o->temperature;
        tb->lmhead_rows = o->lmhead_rows;
    }
    float *x = ALLOC_F(A, T * D); /* [T, D] residual stream */
    int32_t *sel = taping ? NULL : ls_arena_alloc(scratch, (size_t)(T * kk) * sizeof(int32_t));
    NEED(x && (taping || sel));
    ls_embed_fwd(x, ids, m->embed, T, D);
    for (int l = 0; l < c->n_layers; l++) {
        mla_ctx L = {T, pos0, st, NULL, sel, kk, taping ? &tb->layers[l] : NULL, tape_arena, scratch};
        LS_TRY(layer_fwd(m, l, x, 0, &L));
        sel = L.sel; /* a full layer's picks, for the shared layers after it */
        ls_trace_layer_end(l, "fwd");
    }
    int64_t n = T - out_from;
    float *xo = x + out_from * D, *h = xo, *rstd = NULL; /* [n, D] rows that predict a target */
    if (n > 0) {
        if (taping) {
            h = ALLOC_F(A, n * D), rstd = ALLOC_F(A, n), tb->lse = ALLOC_F(A, n);
            NEED(h && rstd && tb->lse);
            tb->x_final = xo, tb->h_final = h, tb->rstd_f = rstd;
        }
        ls_rmsnorm_plain_fwd(h, rstd, xo, m->final_norm, n, D, c->eps);
        LS_TRY(ls_lmhead_fwd(logprob, taping ? tb->lse : NULL, entropy, h, m->lm_head, target, n, D, c->vocab,
                             o->temperature, o->lmhead_rows, scratch));
    }
    ls_arena_release(scratch, mk);
    if (taping) *tape_out = (ls_branch_tape *)tb;
    return LS_OK;
}
