/*
 * hybrid.c — forward of the hybrid family (specs/hybrid-qwen3next.md §2, §4, §5):
 * capture (extend the prompt state chunk by chunk, no tape) and branch (continue
 * from a read-only state; with no state it is the plain forward). One layer
 * function serves both: capture passes the state's own GDN buffers and an append
 * target, a branch passes private copies and no append target.
 */
#include <math.h>
#include <string.h>

#include "longstraw/kernels.h"
#include "longstraw/model.h"

void ls_fwd_opts_default(ls_fwd_opts *o) {
    o->capture_chunk = 2048;
    o->lmhead_rows = 64;
    o->temperature = 1.0f;
}

#define ALLOC_F(arena, n) ((float *)ls_arena_alloc((arena), (size_t)(n) * sizeof(float)))
#define NEED(p)                          \
    do {                                 \
        if (!(p)) return LS_ERR_NOMEM;   \
    } while (0)

static float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* Gated DeltaNet mixer (spec §2): x[T,D] += out_proj(gated_norm(GDR(conv(qkv)), z)).
 * S [H_v,d_k,d_v] and tail [W−1,conv_dim] are advanced in place. */
static ls_status gdn_mixer(const ls_hybrid_model *m, const ls_hybrid_layer *w, float *x,
                           const float *xn, int64_t T, float *S, float *tail, ls_arena *sc) {
    const ls_config *c = &m->cfg;
    int64_t D = c->hidden, kd = ls_cfg_key_dim(c), vd = ls_cfg_value_dim(c), cd = ls_cfg_conv_dim(c);
    int Hv = c->H_v;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *qkv = ALLOC_F(sc, T * cd);  /* [T, conv_dim] pre-conv */
    float *y = ALLOC_F(sc, T * cd);    /* [T, conv_dim] post conv+SiLU */
    float *z = ALLOC_F(sc, T * vd);    /* [T, H_v, d_v] */
    float *ba = ALLOC_F(sc, T * 2 * Hv); /* [T, 2·H_v]: b | a */
    float *q = ALLOC_F(sc, T * kd);    /* [T, H_k, d_k] */
    float *k = ALLOC_F(sc, T * kd);    /* [T, H_k, d_k] */
    float *v = ALLOC_F(sc, T * vd);    /* [T, H_v, d_v] */
    float *beta = ALLOC_F(sc, T * Hv); /* [T, H_v] */
    float *g = ALLOC_F(sc, T * Hv);    /* [T, H_v] */
    float *o = ALLOC_F(sc, T * vd);    /* [T, H_v, d_v] */
    NEED(qkv && y && z && ba && q && k && v && beta && g && o);
    ls_linear_fwd(qkv, xn, w->gdn_in, T, D, cd, 0);
    ls_linear_fwd(z, xn, w->gdn_in + cd * D, T, D, vd, 0);
    ls_linear_fwd(ba, xn, w->gdn_in + (cd + vd) * D, T, D, 2 * Hv, 0);
    ls_conv_fwd(y, NULL, tail, qkv, w->conv_w, T, cd, c->conv_k);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float *yt = y + t * cd;
        ls_l2norm_fwd(q + t * kd, NULL, yt, c->H_k, c->d_k, 1e-6f);
        ls_l2norm_fwd(k + t * kd, NULL, yt + kd, c->H_k, c->d_k, 1e-6f);
        memcpy(v + t * vd, yt + 2 * kd, (size_t)vd * sizeof(float));
        for (int h = 0; h < Hv; h++) {
            float bb = ba[t * 2 * Hv + h], aa = ba[t * 2 * Hv + Hv + h];
            beta[t * Hv + h] = 1.0f / (1.0f + expf(-bb));
            g[t * Hv + h] = -expf(w->A_log[h]) * softplusf(aa + w->dt_bias[h]);
        }
    }
    ls_gdr_dims dm = {c->H_k, c->H_v, c->d_k, c->d_v, 1.0f / sqrtf((float)c->d_k)};
    LS_TRY(ls_gdr_chunk_fwd(o, NULL, S, q, k, v, beta, g, T, dm, sc));
    ls_gated_rmsnorm_fwd(o, NULL, o, z, w->gnorm, T * Hv, c->d_v, c->eps);
    ls_linear_fwd(x, o, w->gdn_out, T, vd, D, 1);
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* Gated full attention (spec §4): x[T,D] += o_proj(attn(q,k,v) ⊙ σ(gate)). Reads the
 * prefix (may be NULL); appends this call's K/V to `append` when non-NULL. */
static ls_status attn_mixer(const ls_hybrid_model *m, const ls_hybrid_layer *w, int layer,
                            float *x, const float *xn, int64_t T, int64_t pos0,
                            const ls_kv_prefix *prefix, ls_prompt_state *append, ls_arena *sc) {
    const ls_config *c = &m->cfg;
    int64_t D = c->hidden, qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv * c->head_dim;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *q = ALLOC_F(sc, T * qd);    /* [T, n_h, hd] */
    float *gate = ALLOC_F(sc, T * qd); /* [T, n_h·hd] */
    float *k = ALLOC_F(sc, T * kvd);   /* [T, n_kv, hd] */
    float *v = ALLOC_F(sc, T * kvd);   /* [T, n_kv, hd] */
    float *o = ALLOC_F(sc, T * qd);    /* [T, n_h, hd] */
    NEED(q && gate && k && v && o);
    ls_linear_fwd(q, xn, w->attn_in, T, D, qd, 0);
    ls_linear_fwd(gate, xn, w->attn_in + qd * D, T, D, qd, 0);
    ls_linear_fwd(k, xn, w->attn_in + 2 * qd * D, T, D, kvd, 0);
    ls_linear_fwd(v, xn, w->attn_in + (2 * qd + kvd) * D, T, D, kvd, 0);
    ls_rmsnorm_fwd(q, NULL, q, w->q_norm, T * c->n_heads, c->head_dim, c->eps);
    ls_rmsnorm_fwd(k, NULL, k, w->k_norm, T * c->n_kv, c->head_dim, c->eps);
    ls_rope_fwd(q, T, c->n_heads, c->head_dim, c->rot_dim, c->rope_theta, pos0);
    ls_rope_fwd(k, T, c->n_kv, c->head_dim, c->rot_dim, c->rope_theta, pos0);
    LS_TRY(ls_attn_fwd(o, NULL, q, k, v, prefix, T, c->n_heads, c->n_kv, c->head_dim,
                       1.0f / sqrtf((float)c->head_dim), sc));
    if (append) LS_TRY(ls_state_append_kv(append, layer, k, v, T));
#pragma omp parallel for schedule(static) if (T * qd > 65536)
    for (int64_t i = 0; i < T * qd; i++) o[i] *= 1.0f / (1.0f + expf(-gate[i]));
    ls_linear_fwd(x, o, w->attn_out, T, qd, D, 1);
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* SwiGLU expert on rows xs[n,D]: out[n,D] = down(SiLU(gate(xs)) ⊙ up(xs)). */
static ls_status swiglu_ffn(float *out, const float *xs, int64_t n, int64_t D, int64_t I,
                            const float *gu_w, const float *down_w, ls_arena *sc) {
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *gu = ALLOC_F(sc, n * 2 * I); /* [n, 2I] */
    float *act = ALLOC_F(sc, n * I);    /* [n, I] */
    NEED(gu && act);
    ls_linear_fwd(gu, xs, gu_w, n, D, 2 * I, 0);
    ls_swiglu_fwd(act, gu, n, I);
    ls_linear_fwd(out, act, down_w, n, I, D, 0);
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* Sparse MoE block (spec §5): x[T,D] += Σ_top-k p̂_e·E_e(xn) + σ(xn·w_sg)·Shared(xn). */
static ls_status moe_ffn(const ls_hybrid_model *m, const ls_hybrid_layer *w, float *x,
                         const float *xn, int64_t T, ls_arena *sc) {
    const ls_config *c = &m->cfg;
    int64_t D = c->hidden, Im = c->moe_inter;
    int E = c->n_experts, K = c->top_k;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *logits = ALLOC_F(sc, T * E);      /* [T, E] */
    int32_t *sel = ls_arena_alloc(sc, (size_t)(T * K) * sizeof(int32_t)); /* [T, K] */
    float *wt = ALLOC_F(sc, T * K);          /* [T, K] */
    int64_t *count = ls_arena_calloc(sc, (size_t)E + 1, sizeof(int64_t));
    int64_t *rows = ls_arena_alloc(sc, (size_t)(T * K) * sizeof(int64_t)); /* token·K+slot by expert */
    NEED(logits && sel && wt && count && rows);
    ls_linear_fwd(logits, xn, w->router, T, D, E, 0);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        float *lg = logits + t * E;
        float mx = -INFINITY;
        for (int e = 0; e < E; e++) mx = lg[e] > mx ? lg[e] : mx;
        double s = 0;
        for (int e = 0; e < E; e++) s += exp((double)(lg[e] - mx));
        for (int e = 0; e < E; e++) lg[e] = (float)(exp((double)(lg[e] - mx)) / s); /* probs */
        double tot = 0;
        for (int j = 0; j < K; j++) { /* top-k by selection; ties → lower index */
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= sel[t * K + i] == e;
                if (!taken && (best < 0 || lg[e] > lg[best])) best = e;
            }
            sel[t * K + j] = best;
            wt[t * K + j] = lg[best];
            tot += lg[best];
        }
        if (c->norm_topk)
            for (int j = 0; j < K; j++) wt[t * K + j] = (float)(wt[t * K + j] / tot);
    }
    for (int64_t i = 0; i < T * K; i++) count[sel[i] + 1]++;
    for (int e = 0; e < E; e++) count[e + 1] += count[e];
    {
        int64_t *fill = ls_arena_calloc(sc, (size_t)E, sizeof(int64_t));
        NEED(fill);
        for (int64_t i = 0; i < T * K; i++) rows[count[sel[i]] + fill[sel[i]]++] = i;
    }
    int64_t maxn = 0;
    for (int e = 0; e < E; e++) maxn = count[e + 1] - count[e] > maxn ? count[e + 1] - count[e] : maxn;
    float *xs = ALLOC_F(sc, maxn * D); /* [n_e, D] gathered rows */
    float *ys = ALLOC_F(sc, maxn * D); /* [n_e, D] expert output */
    NEED(xs && ys);
    for (int e = 0; e < E; e++) {
        int64_t n = count[e + 1] - count[e];
        if (n == 0) continue;
        const int64_t *r = rows + count[e];
        for (int64_t i = 0; i < n; i++) memcpy(xs + i * D, xn + (r[i] / K) * D, (size_t)D * sizeof(float));
        LS_TRY(swiglu_ffn(ys, xs, n, D, Im, w->exp_gu + (int64_t)e * 2 * Im * D,
                          w->exp_down + (int64_t)e * D * Im, sc));
        for (int64_t i = 0; i < n; i++) {
            float p = wt[r[i]];
            float *xt = x + (r[i] / K) * D;
            const float *yi = ys + i * D;
            for (int64_t d = 0; d < D; d++) xt[d] += p * yi[d];
        }
    }
    if (c->shared_inter > 0) {
        float *sh = ALLOC_F(sc, T * D); /* [T, D] */
        float *sg = ALLOC_F(sc, T);     /* [T] */
        NEED(sh && sg);
        LS_TRY(swiglu_ffn(sh, xn, T, D, c->shared_inter, w->sh_gu, w->sh_down, sc));
        ls_linear_fwd(sg, xn, w->sh_gate, T, D, 1, 0);
#pragma omp parallel for schedule(static)
        for (int64_t t = 0; t < T; t++) {
            float s = 1.0f / (1.0f + expf(-sg[t]));
            for (int64_t d = 0; d < D; d++) x[t * D + d] += s * sh[t * D + d];
        }
    }
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* One decoder layer on x[T,D] (spec §5): mixer then FFN, each with its residual. */
static ls_status layer_fwd(const ls_hybrid_model *m, int l, float *x, int64_t T, int64_t pos0,
                           const ls_kv_prefix *prefix, ls_prompt_state *append, float *S,
                           float *tail, int skip_ffn, ls_arena *sc) {
    const ls_config *c = &m->cfg;
    const ls_hybrid_layer *w = &m->layers[l];
    int64_t D = c->hidden;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *xn = ALLOC_F(sc, T * D); /* [T, D] */
    NEED(xn);
    ls_rmsnorm_fwd(xn, NULL, x, w->input_norm, T, D, c->eps);
    if (c->kind[l] == LS_LAYER_GDN)
        LS_TRY(gdn_mixer(m, w, x, xn, T, S, tail, sc));
    else
        LS_TRY(attn_mixer(m, w, l, x, xn, T, pos0, prefix, append, sc));
    if (!skip_ffn) {
        ls_rmsnorm_fwd(xn, NULL, x, w->post_norm, T, D, c->eps);
        if (c->moe[l]) {
            LS_TRY(moe_ffn(m, w, x, xn, T, sc));
        } else {
            float *f = ALLOC_F(sc, T * D); /* [T, D] */
            NEED(f);
            LS_TRY(swiglu_ffn(f, xn, T, D, c->intermediate, w->mlp_gu, w->mlp_down, sc));
#pragma omp parallel for schedule(static) if (T * D > 65536)
            for (int64_t i = 0; i < T * D; i++) x[i] += f[i];
        }
    }
    ls_arena_release(sc, mk);
    return LS_OK;
}

ls_status ls_hybrid_capture(const ls_hybrid_model *m, ls_prompt_state *st, const int32_t *ids,
                            int64_t n, const ls_fwd_opts *o, ls_arena *scratch) {
    const ls_config *c = &m->cfg;
    int64_t D = c->hidden, C = o->capture_chunk > 0 ? o->capture_chunk : 2048;
    for (int64_t c0 = 0; c0 < n; c0 += C) {
        int64_t T = n - c0 < C ? n - c0 : C;
        ls_arena_mark mk = ls_arena_get_mark(scratch);
        float *x = ALLOC_F(scratch, T * D); /* [T, D] residual stream of this chunk */
        NEED(x);
        ls_embed_fwd(x, ids + c0, m->embed, T, D);
        for (int l = 0; l < c->n_layers; l++) {
            ls_kv_prefix pre = ls_state_prefix(st, l);
            /* The last layer's FFN feeds only the LM head, which capture never runs. */
            int last = l == c->n_layers - 1;
            LS_TRY(layer_fwd(m, l, x, T, st->n, c->kind[l] == LS_LAYER_ATTN ? &pre : NULL, st,
                             st->gdn[l].S, st->gdn[l].conv_tail, last, scratch));
        }
        ls_state_advance(st, T);
        ls_arena_release(scratch, mk);
    }
    return LS_OK;
}

ls_status ls_hybrid_branch_logprobs(const ls_hybrid_model *m, const ls_prompt_state *st,
                                    const int32_t *ids, int64_t T, int64_t out_from,
                                    const int32_t *target, float *logprob, const ls_fwd_opts *o,
                                    ls_arena *work) {
    const ls_config *c = &m->cfg;
    int64_t D = c->hidden, pos0 = st ? st->n : 0;
    size_t conv_n = (size_t)(c->conv_k - 1) * (size_t)ls_cfg_conv_dim(c);
    size_t rec_n = (size_t)c->H_v * (size_t)c->d_k * (size_t)c->d_v;
    LS_ASSERT(out_from >= 0 && out_from <= T, "out_from %lld outside [0, %lld]", (long long)out_from,
              (long long)T);
    ls_arena_mark mk = ls_arena_get_mark(work);
    float *x = ALLOC_F(work, T * D);  /* [T, D] */
    float *S = ALLOC_F(work, rec_n);  /* private copy of a GDN layer's state */
    float *tail = ALLOC_F(work, conv_n);
    NEED(x && S && tail);
    ls_embed_fwd(x, ids, m->embed, T, D);
    for (int l = 0; l < c->n_layers; l++) {
        ls_kv_prefix pre;
        const ls_kv_prefix *pp = NULL;
        if (c->kind[l] == LS_LAYER_GDN) {
            if (st) {
                memcpy(S, st->gdn[l].S, rec_n * sizeof(float));
                memcpy(tail, st->gdn[l].conv_tail, conv_n * sizeof(float));
            } else {
                memset(S, 0, rec_n * sizeof(float));
                memset(tail, 0, conv_n * sizeof(float));
            }
        } else if (st) {
            pre = ls_state_prefix(st, l);
            pp = &pre;
        }
        LS_TRY(layer_fwd(m, l, x, T, pos0, pp, NULL, S, tail, 0, work));
    }
    float *xo = x + out_from * D; /* [T − out_from, D] rows that predict a target */
    ls_rmsnorm_fwd(xo, NULL, xo, m->final_norm, T - out_from, D, c->eps);
    LS_TRY(ls_lmhead_logprobs_fwd(logprob, NULL, xo, m->lm_head, target, T - out_from, D, c->vocab,
                                  o->temperature, o->lmhead_rows, work));
    ls_arena_release(work, mk);
    return LS_OK;
}
