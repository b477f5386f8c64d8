/*
 * hybrid.c — the hybrid family's layers forward (specs/hybrid-qwen3next.md §2, §4, §5)
 * and its hooks of the model driver (decoder.h: capture, CP capture, decode, branches
 * are the driver's). One layer function serves every pass: capture passes the state's
 * own GDN buffers and an append target, a branch passes private copies and none. With a
 * tape, every buffer the backward reads comes from the tape arena and is kept
 * (hybrid_tape.h); without one, transients come from scratch and are released.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "gdn_scan.h"
#include "hybrid_tape.h"
#include "longstraw/cp.h"
#include "longstraw/kernels.h"
#include "longstraw/lora.h"
#include "longstraw/trace.h"

#define ALLOC_F(arena, n) ((float *)ls_arena_alloc((arena), (size_t)(n) * sizeof(float)))
#define NEED(p)                          \
    do {                                 \
        if (!(p)) return LS_ERR_NOMEM;   \
    } while (0)

/* Untaped spans of at most this many tokens take the token-serial delta rule (the
 * chunked form's 64-row blocks cost more than they save for a decode step). */
#define GDN_SERIAL_MAX_T 4


/* Per-call context of one layer. */
typedef struct {
    int64_t T, pos0;
    int64_t seg0;               /* GDN/conv split (naive mode's detach point); 0 otherwise */
    const ls_kv_prefix *prefix; /* attention: read-only prefix or NULL */
    ls_prompt_state *append;    /* capture: append this call's K/V */
    float *S, *tail;            /* GDN state and conv tail, advanced in place */
    ls_layer_tape *tp;          /* NULL: no tape */
    ls_arena *ta;               /* tape arena (tp != NULL) */
    ls_arena *sc;               /* scratch */
    /* batched decode (ls_hybrid_decode): row i of the T rows is one token of its own
     * sequence, continuing seqs[i]; the mixers run per row, everything else batched */
    ls_prompt_state *const *seqs;
    int layer;
    int decode; /* extend/decode (no tape): short spans take the token-serial delta rule.
                 * Never set in a branch, so scoring (untaped) and replay (taped) of the
                 * same tokens compute bit-identical log-probs: ratios are exactly 1 at
                 * the first iteration. */
    /* a branch against a prompt state split over ranks: attention over the prefix is
     * this rank's partial, merged across the ranks (cp.h); NULL otherwise */
    const ls_comm *cp;
    /* the full-mode sweep under CP: after the attention over this rank's pages, the earlier
     * ranks' pages stream past in blocks of cp_block pages and merge in (NULL otherwise) */
    const ls_prompt_state *cp_capture;
    int64_t cp_block;
    int cp_seg; /* the layout segment (ls_state_segment) the chunk belongs to */
} layer_ctx;

/* What merge_block needs of cp_merge_earlier's call. */
typedef struct {
    const ls_backend *be;
    const ls_config *c;
    const float *q;
    float *o, *lse, *ob, *lb; /* the merged output and a block's partial */
    int64_t T, S;
    ls_dtype dtype;
    ls_arena *sc;
} merge_ctx;

/* A remote block of nb pages holding `rows` positions: its partial, merged in. */
static ls_status merge_block(void *ctx, void *const *kp, void *const *vp, float *const *dk, float *const *dv,
                             int64_t nb, int64_t rows) {
    (void)dk, (void)dv, (void)nb;
    merge_ctx *M = ctx;
    const ls_config *c = M->c;
    ls_kv_prefix blk = {rows, M->S, M->dtype, kp, vp};
    LS_TRY(ls_op_attn_prefix_fwd(M->be, M->ob, M->lb, M->q, &blk, M->T, c->n_heads, c->n_kv, c->head_dim,
                                 1.0f / sqrtf((float)c->head_dim), M->sc));
    ls_op_attn_merge(M->be, M->o, M->lse, M->ob, M->lb, M->T, c->n_heads, c->head_dim);
    return LS_OK;
}

/* The full-mode sweep's recomputed forward of a chunk under CP: merge into o [T, n_h, hd] /
 * lse [T, n_h] (the attention of the chunk's queries q over this rank's earlier pages and
 * its own keys) the pages of every earlier segment another rank holds (segments before
 * `seg`, in prompt order) of attention layer l, received block by block — never a
 * remote page beyond its block (the owners send them, ls_hybrid_cp_send_pages). */
static ls_status cp_merge_earlier(const ls_backend *be, const ls_prompt_state *st, int l, int seg, const float *q,
                                  float *o, float *lse, int64_t T, int64_t bp, ls_arena *sc) {
    const ls_config *c = st->cfg;
    int64_t S = st->page_size, qd = (int64_t)c->n_heads * c->head_dim;
    size_t pb = (size_t)S * (size_t)c->n_kv * (size_t)c->head_dim * ls_dtype_size(st->dtype);
    ls_arena_mark mk = ls_arena_get_mark(sc);
    merge_ctx M = {.be = be, .c = c, .q = q, .o = o, .lse = lse, .ob = ALLOC_F(sc, T * qd),
                   .lb = ALLOC_F(sc, T * c->n_heads), .T = T, .S = S, .dtype = st->dtype, .sc = sc};
    NEED(M.ob && M.lb);
    for (int s = 0; s < seg; s++) {
        int src;
        int64_t rlo, rhi;
        ls_state_segment(st, s, &src, &rlo, &rhi);
        if (src == st->rank || rhi == rlo) continue; /* own pages are in the prefix already */
        LS_TRY(ls_dist_pages_recv(be, st->comm, rhi - rlo, S, pb, bp, src, l, merge_block, &M, sc));
    }
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* The Gated DeltaNet mixer's input projections of rows xn [T, D] (with their adapters):
 * qkv [T, conv_dim] pre-conv, and when given z [T, value_dim] and ba [T, 2·H_v]. */
ls_status ls_hybrid_gdn_in_proj(const ls_hybrid_model *m, const ls_hybrid_layer *w, int l, const float *xn, int64_t T,
                             float *qkv, float *z, float *ba, ls_arena *sc) {
    const ls_config *c = &m->cfg;
    int64_t D = c->hidden, cd = ls_cfg_conv_dim(c), vd = ls_cfg_value_dim(c), Hv = ls_hybrid_cfg(c)->H_v;
    ls_op_linear_fwd(m->be, qkv, xn, w->gdn_in, T, D, cd, 0);
    if (z) ls_op_linear_fwd(m->be, z, xn, w->gdn_in + cd * D, T, D, vd, 0);
    if (ba) ls_op_linear_fwd(m->be, ba, xn, w->gdn_in + (cd + vd) * D, T, D, 2 * Hv, 0);
    LORA_FWD(m, l, gdn_in, 0, cd, qkv, xn, T, sc);
    if (z) LORA_FWD(m, l, gdn_in, cd, vd, z, xn, T, sc);
    if (ba) LORA_FWD(m, l, gdn_in, cd + vd, 2 * Hv, ba, xn, T, sc);
    return LS_OK;
}

/* Its output: x [T, D] += out_proj(gated_norm(o, z)) (with the adapter); the norm's output
 * into on (may be o itself), its rstd into grstd (NULL: not kept). */
ls_status ls_hybrid_gdn_out_proj(const ls_hybrid_model *m, const ls_hybrid_layer *w, int l, float *x, float *on,
                              float *grstd, const float *o, const float *z, int64_t T, ls_arena *sc) {
    const ls_config *c = &m->cfg;
    const ls_hybrid_config *hc = ls_hybrid_cfg(c);
    int64_t D = c->hidden, vd = ls_cfg_value_dim(c);
    ls_op_gated_rmsnorm_fwd(m->be, on, grstd, o, z, w->gnorm, T * hc->H_v, hc->d_v, c->eps);
    ls_op_linear_fwd(m->be, x, on, w->gdn_out, T, vd, D, 1);
    LORA_FWD(m, l, gdn_out, 0, D, x, on, T, sc);
    return LS_OK;
}

/* Gated DeltaNet mixer (spec §2): x[T,D] += out_proj(gated_norm(GDR(conv(qkv)), z)). */
static ls_status gdn_mixer(const ls_hybrid_model *m, const ls_hybrid_layer *w, float *x,
                           const float *xn, layer_ctx *L) {
    const ls_config *c = &m->cfg;
    const ls_hybrid_config *hc = ls_hybrid_cfg(c);
    int64_t T = L->T, kd = ls_cfg_key_dim(c), vd = ls_cfg_value_dim(c);
    int64_t cd = ls_cfg_conv_dim(c), Wm = hc->conv_k - 1;
    int Hv = hc->H_v, Hk = hc->H_k;
    ls_layer_tape *tp = L->tp;
    ls_arena *A = tp ? L->ta : L->sc;
    ls_arena_mark mk = ls_arena_get_mark(L->sc);
    float *qkv = ALLOC_F(A, T * cd);  /* [T, conv_dim] pre-conv */
    float *cpre = tp ? ALLOC_F(A, T * cd) : NULL; /* [T, conv_dim] */
    float *y = ALLOC_F(A, T * cd);    /* [T, conv_dim] post conv+SiLU */
    float *z = ALLOC_F(A, T * vd);    /* [T, H_v, d_v] */
    float *ba = ALLOC_F(A, T * 2 * Hv); /* [T, 2·H_v]: b | a */
    float *q = ALLOC_F(A, T * kd);    /* [T, H_k, d_k] */
    float *k = ALLOC_F(A, T * kd);    /* [T, H_k, d_k] */
    float *v = ALLOC_F(A, T * vd);    /* [T, H_v, d_v] */
    float *beta = ALLOC_F(A, T * Hv); /* [T, H_v] */
    float *g = ALLOC_F(A, T * Hv);    /* [T, H_v] */
    float *o = ALLOC_F(A, T * vd);    /* [T, H_v, d_v] */
    float *on = tp ? ALLOC_F(A, T * vd) : o; /* [T, H_v, d_v] gated norm output */
    float *rq = tp ? ALLOC_F(A, T * Hk) : NULL, *rk = tp ? ALLOC_F(A, T * Hk) : NULL;
    float *grstd = tp ? ALLOC_F(A, T * Hv) : NULL;
    NEED(qkv && y && z && ba && q && k && v && beta && g && o && on);
    NEED(!tp || (cpre && rq && rk && grstd));
    LS_TRY(ls_hybrid_gdn_in_proj(m, w, L->layer, xn, T, qkv, z, ba, L->sc));
    int64_t s0 = L->seg0;
    if (s0 > 0) ls_op_conv_fwd(m->be, y, cpre, L->tail, qkv, w->conv_w, s0, cd, hc->conv_k);
    if (tp) {
        tp->tail0 = ALLOC_F(A, Wm * cd > 0 ? Wm * cd : 1);
        NEED(tp->tail0);
        ls_op_copy(m->be, tp->tail0, L->tail, Wm * cd);
    }
    /* batched decode: row i continues sequence i's conv tail and recurrent state */
    float **seq_st = L->seqs ? ls_arena_host_alloc(L->sc, 2 * (size_t)T * sizeof(float *)) : NULL;
    NEED(!L->seqs || seq_st);
    for (int64_t i = 0; L->seqs && i < T; i++)
        seq_st[i] = L->seqs[i]->gdn[L->layer].conv_tail, seq_st[T + i] = L->seqs[i]->gdn[L->layer].S;
    if (L->seqs)
        ls_op_conv_step_seqs(m->be, y, seq_st, qkv, w->conv_w, T, cd, hc->conv_k);
    else
        ls_op_conv_fwd(m->be, y + s0 * cd, cpre ? cpre + s0 * cd : NULL, L->tail, qkv + s0 * cd, w->conv_w, T - s0, cd,
                       hc->conv_k);
    ls_gdr_dims dm = {hc->H_k, hc->H_v, hc->d_k, hc->d_v, 1.0f / sqrtf((float)hc->d_k)};
    ls_op_gdn_prep_fwd(m->be, q, k, v, beta, g, rq, rk, y, ba, w->A_log, w->dt_bias, T, dm);
    size_t sn = (size_t)Hv * (size_t)hc->d_k * (size_t)hc->d_v;
    if (s0 > 0) LS_TRY(ls_op_gdr_chunk_fwd(m->be, o, NULL, L->S, q, k, v, beta, g, s0, dm, L->sc));
    float *tape_h = NULL;
    if (tp) {
        tp->S0 = ALLOC_F(A, sn);
        tape_h = ALLOC_F(A, ((T - s0 + 63) / 64 > 0 ? (T - s0 + 63) / 64 : 1) * (int64_t)sn);
        NEED(tp->S0 && tape_h);
        ls_op_copy(m->be, tp->S0, L->S, (int64_t)sn);
    }
    if (L->seqs) { /* one recurrence step per sequence, the sequences side by side */
        ls_op_gdr_step_seqs(m->be, o, seq_st + T, q, k, v, beta, g, T, dm);
    } else if (L->decode && T - s0 <= GDN_SERIAL_MAX_T) { /* decoding: no chunk to amortise */
        ls_op_gdr_serial_fwd(m->be, o + s0 * vd, L->S, q + s0 * kd, k + s0 * kd, v + s0 * vd, beta + s0 * Hv, g + s0 * Hv,
                          T - s0, dm);
    } else {
        LS_TRY(ls_op_gdr_chunk_fwd(m->be, o + s0 * vd, tape_h, L->S, q + s0 * kd, k + s0 * kd, v + s0 * vd, beta + s0 * Hv,
                                g + s0 * Hv, T - s0, dm, L->sc));
    }
    LS_TRY(ls_hybrid_gdn_out_proj(m, w, L->layer, x, on, grstd, o, z, T, L->sc));
    if (tp) {
        tp->seg0 = s0;
        tp->qkv = qkv, tp->cpre = cpre, tp->y = y, tp->z = z, tp->ba = ba;
        tp->qn = q, tp->kn = k, tp->rq = rq, tp->rk = rk;
        tp->beta = beta, tp->g = g, tp->tape_h = tape_h, tp->o = o, tp->grstd = grstd, tp->on = on;
        tp->v = v;
    }
    ls_arena_release(L->sc, mk);
    return LS_OK;
}

/* Gated attention's input projections of rows xn [T, D] (with their adapters): q, gate
 * [T, n_h·hd], k, v [T, n_kv·hd]; q and k normed per head into qr, kr (may be q, k
 * themselves), their rstd into rsq, rsk (NULL: not kept). attn_q_proj and attn_kv_proj
 * are its two halves (the CP capture's waves run them apart). */
ls_status ls_hybrid_attn_q_proj(const ls_hybrid_model *m, const ls_hybrid_layer *w, int layer, const float *xn,
                             int64_t T, float *q, float *gate, float *qr, float *rsq, ls_arena *sc) {
    const ls_config *c = &m->cfg;
    int64_t D = c->hidden, qd = (int64_t)c->n_heads * c->head_dim;
    ls_op_linear_fwd(m->be, q, xn, w->attn_in, T, D, qd, 0);
    ls_op_linear_fwd(m->be, gate, xn, w->attn_in + qd * D, T, D, qd, 0);
    LORA_FWD(m, layer, attn_in, 0, qd, q, xn, T, sc);
    LORA_FWD(m, layer, attn_in, qd, qd, gate, xn, T, sc);
    ls_op_rmsnorm_fwd(m->be, qr, rsq, q, w->q_norm, T * c->n_heads, c->head_dim, c->eps);
    return LS_OK;
}

ls_status ls_hybrid_attn_kv_proj(const ls_hybrid_model *m, const ls_hybrid_layer *w, int layer, const float *xn,
                              int64_t T, float *k, float *v, float *kr, float *rsk, ls_arena *sc) {
    const ls_config *c = &m->cfg;
    int64_t D = c->hidden, qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv * c->head_dim;
    ls_op_linear_fwd(m->be, k, xn, w->attn_in + 2 * qd * D, T, D, kvd, 0);
    ls_op_linear_fwd(m->be, v, xn, w->attn_in + (2 * qd + kvd) * D, T, D, kvd, 0);
    LORA_FWD(m, layer, attn_in, 2 * qd, kvd, k, xn, T, sc);
    LORA_FWD(m, layer, attn_in, 2 * qd + kvd, kvd, v, xn, T, sc);
    ls_op_rmsnorm_fwd(m->be, kr, rsk, k, w->k_norm, T * c->n_kv, c->head_dim, c->eps);
    return LS_OK;
}

static ls_status attn_in_proj(const ls_hybrid_model *m, const ls_hybrid_layer *w, int layer, const float *xn,
                              int64_t T, float *q, float *gate, float *k, float *v, float *qr, float *kr, float *rsq,
                              float *rsk, ls_arena *sc) {
    LS_TRY(ls_hybrid_attn_q_proj(m, w, layer, xn, T, q, gate, qr, rsq, sc));
    return ls_hybrid_attn_kv_proj(m, w, layer, xn, T, k, v, kr, rsk, sc);
}

/* Its output: x [T, D] += o_proj(o ⊙ σ(gate)) (with the adapter); the gated rows into og
 * (may be o itself). */
ls_status ls_hybrid_attn_out_proj(const ls_hybrid_model *m, const ls_hybrid_layer *w, int layer, float *x, float *og,
                               const float *o, const float *gate, int64_t T, ls_arena *sc) {
    const ls_config *c = &m->cfg;
    int64_t D = c->hidden, qd = (int64_t)c->n_heads * c->head_dim;
    ls_op_sigmoid_mul_fwd(m->be, og, o, gate, T * qd);
    ls_op_linear_fwd(m->be, x, og, w->attn_out, T, qd, D, 1);
    LORA_FWD(m, layer, attn_out, 0, D, x, og, T, sc);
    return LS_OK;
}

/* Gated full attention (spec §4): x[T,D] += o_proj(attn(q,k,v) ⊙ σ(gate)). */
static ls_status attn_mixer(const ls_hybrid_model *m, const ls_hybrid_layer *w, int layer,
                            float *x, const float *xn, layer_ctx *L) {
    const ls_config *c = &m->cfg;
    int64_t T = L->T, qd = (int64_t)c->n_heads * c->head_dim;
    int64_t kvd = (int64_t)c->n_kv * c->head_dim;
    ls_layer_tape *tp = L->tp;
    ls_arena *A = tp ? L->ta : L->sc;
    ls_arena_mark mk = ls_arena_get_mark(L->sc);
    float *q = ALLOC_F(A, T * qd);    /* [T, n_h, hd] */
    float *gate = ALLOC_F(A, T * qd); /* [T, n_h·hd] */
    float *k = ALLOC_F(A, T * kvd);   /* [T, n_kv, hd] */
    float *v = ALLOC_F(A, T * kvd);   /* [T, n_kv, hd] */
    float *o = ALLOC_F(A, T * qd);    /* [T, n_h, hd] */
    float *qr = tp ? ALLOC_F(A, T * qd) : q;   /* normed + roped copies when taping */
    float *kr = tp ? ALLOC_F(A, T * kvd) : k;
    float *og = tp ? ALLOC_F(A, T * qd) : o;
    float *rsq = tp ? ALLOC_F(A, T * c->n_heads) : NULL, *rsk = tp ? ALLOC_F(A, T * c->n_kv) : NULL;
    float *lse = tp ? ALLOC_F(A, T * c->n_heads) : NULL;
    NEED(q && gate && k && v && o && qr && kr && og);
    NEED(!tp || (rsq && rsk && lse));
    LS_TRY(attn_in_proj(m, w, layer, xn, T, q, gate, k, v, qr, kr, rsq, rsk, L->sc));
    float scale = 1.0f / sqrtf((float)c->head_dim);
    if (L->seqs) { /* one token per sequence: its position, its pages */
        /* under CP every rank attends over its pages of each sequence; the rank holding
         * the prompt's end also holds the sequences' own keys (ls_state_fork) */
        const ls_prompt_state *s0 = L->seqs[0];
        const ls_comm *cp = T > 0 && s0->nranks > 1 ? s0->comm : NULL;
        int owner = !cp || s0->rank == s0->tail_rank;
        float *lb = cp ? ALLOC_F(L->sc, T * c->n_heads) : NULL; /* [T, n_h] partials' lse */
        NEED(!cp || lb);
        for (int64_t i = 0; i < T; i++) {
            ls_prompt_state *st = L->seqs[i];
            ls_op_rope_fwd(m->be, qr + i * qd, 1, c->n_heads, c->head_dim, c->rot_dim, c->rope_theta, st->n);
            ls_op_rope_fwd(m->be, kr + i * kvd, 1, c->n_kv, c->head_dim, c->rot_dim, c->rope_theta, st->n);
            ls_kv_prefix pre = ls_state_prefix(st, layer);
            if (owner)
                LS_TRY(ls_op_attn_fwd(m->be, o + i * qd, lb ? lb + i * c->n_heads : NULL, qr + i * qd, kr + i * kvd, v + i * kvd,
                                   &pre, 1, c->n_heads, c->n_kv, c->head_dim, scale, L->sc));
            else
                LS_TRY(ls_op_attn_prefix_fwd(m->be, o + i * qd, lb + i * c->n_heads, qr + i * qd, &pre, 1, c->n_heads, c->n_kv,
                                          c->head_dim, scale, L->sc));
            if (owner) LS_TRY(ls_state_append_kv(st, layer, kr + i * kvd, v + i * kvd, 1));
        }
        if (cp) LS_TRY(ls_cp_merge(m->be, o, lb, T * c->n_heads, c->head_dim, cp, L->sc));
    } else {
        ls_op_rope_fwd(m->be, qr, T, c->n_heads, c->head_dim, c->rot_dim, c->rope_theta, L->pos0);
        ls_op_rope_fwd(m->be, kr, T, c->n_kv, c->head_dim, c->rot_dim, c->rope_theta, L->pos0);
        if (L->cp) { /* this rank's pages (+ the own keys on rank 0), then the merge */
            float *lb = lse ? lse : ALLOC_F(L->sc, T * c->n_heads); /* [T, n_h] */
            NEED(lb);
            if (ls_comm_rank(L->cp) == 0)
                LS_TRY(ls_op_attn_fwd(m->be, o, lb, qr, kr, v, L->prefix, T, c->n_heads, c->n_kv, c->head_dim, scale, L->sc));
            else
                LS_TRY(ls_op_attn_prefix_fwd(m->be, o, lb, qr, L->prefix, T, c->n_heads, c->n_kv, c->head_dim, scale, L->sc));
            LS_TRY(ls_cp_merge(m->be, o, lb, T * c->n_heads, c->head_dim, L->cp, L->sc));
        } else if (L->cp_capture) { /* this rank's pages and own keys, then the earlier ranks' */
            float *lb = lse ? lse : ALLOC_F(L->sc, T * c->n_heads); /* [T, n_h]: merged (kept with a tape) */
            NEED(lb);
            LS_TRY(ls_op_attn_fwd(m->be, o, lb, qr, kr, v, L->prefix, T, c->n_heads, c->n_kv, c->head_dim, scale, L->sc));
            LS_TRY(cp_merge_earlier(m->be, L->cp_capture, layer, L->cp_seg, qr, o, lb, T, L->cp_block, L->sc));
        } else {
            LS_TRY(ls_op_attn_fwd(m->be, o, lse, qr, kr, v, L->prefix, T, c->n_heads, c->n_kv, c->head_dim, scale, L->sc));
        }
        if (L->append) LS_TRY(ls_state_append_kv(L->append, layer, kr, v, T));
    }
    LS_TRY(ls_hybrid_attn_out_proj(m, w, layer, x, og, o, gate, T, L->sc));
    if (tp) {
        tp->qraw = q, tp->kraw = k, tp->rsq = rsq, tp->rsk = rsk, tp->qr = qr, tp->kr = kr, tp->v = v;
        tp->gate = gate, tp->ao = o, tp->lse = lse, tp->aog = og;
        tp->has_prefix = L->prefix != NULL;
        tp->cp = L->cp;
        tp->cp_sweep = L->cp_capture, tp->cp_seg = L->cp_seg, tp->cp_block = L->cp_block;
        if (L->prefix) tp->prefix = *L->prefix;
    }
    ls_arena_release(L->sc, mk);
    return LS_OK;
}

/* Sparse MoE block (spec §5): x[T,D] += Σ_top-k p̂_e·E_e(xn) + σ(xn·w_sg)·Shared(xn). */
static ls_status moe_ffn(const ls_hybrid_model *m, const ls_hybrid_layer *w, float *x,
                         const float *xn, layer_ctx *L) {
    const ls_config *c = &m->cfg;
    int64_t T = L->T, D = c->hidden, Im = c->moe_inter;
    int E = c->n_experts, K = c->top_k;
    ls_layer_tape *tp = L->tp;
    ls_arena *A = tp ? L->ta : L->sc, *sc = L->sc;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *probs = ALLOC_F(A, T * E);        /* [T, E] */
    int32_t *sel = ls_arena_alloc(A, (size_t)(T * K) * sizeof(int32_t)); /* [T, K] */
    float *wt = ALLOC_F(A, T * K);           /* [T, K] */
    float *logits = ALLOC_F(sc, T * E);      /* [T, E] */
    NEED(probs && sel && wt && logits);
    ls_op_linear_fwd(m->be, logits, xn, w->router, T, D, E, 0);
    LORA_FWD(m, L->layer, router, 0, E, logits, xn, T, sc);
    ls_op_moe_route(m->be, probs, sel, wt, logits, T, E, K, c->norm_topk);
    ls_dec_experts ex = {.D = D, .I = Im, .E = E, .K = K, .e0 = 0, .ne = E, .gu_w = w->exp_gu, .down_w = w->exp_down,
                         .lora = ffn_of(m, L->layer, offsetof(ls_hybrid_layer, exp_gu),
                                        offsetof(ls_hybrid_layer, exp_down), 0, 0)};
    LS_TRY(ls_dec_experts_fwd(m->be, &ex, x, xn, sel, wt, T, sc));
    if (c->shared_inter > 0) {
        int64_t Is = c->shared_inter;
        float *sh = ALLOC_F(A, T * D); /* [T, D] */
        float *sg = ALLOC_F(A, T);     /* [T] gate logit */
        float *sgu = tp ? ALLOC_F(A, T * 2 * Is) : NULL, *sact = tp ? ALLOC_F(A, T * Is) : NULL;
        NEED(sh && sg && (!tp || (sgu && sact)));
        ls_ffn_lora fl = ffn_of(m, L->layer, offsetof(ls_hybrid_layer, sh_gu), offsetof(ls_hybrid_layer, sh_down), 0, 0);
        LS_TRY(ls_dec_swiglu_fwd(m->be, sh, sgu, sact, xn, T, D, Is, w->sh_gu, w->sh_down, 0, &fl, sc));
        ls_op_linear_fwd(m->be, sg, xn, w->sh_gate, T, D, 1, 0);
        LORA_FWD(m, L->layer, sh_gate, 0, 1, sg, xn, T, sc);
        ls_op_gated_add_rows(m->be, x, sg, sh, T, D);
        if (tp) tp->sh_gu = sgu, tp->sh_act = sact, tp->sh_out = sh, tp->sh_s = sg;
    }
    if (tp) tp->probs = probs, tp->sel = sel, tp->wt = wt;
    ls_arena_release(sc, mk);
    return LS_OK;
}

ls_status ls_hybrid_moe_fwd(const ls_hybrid_model *m, int l, float *x, const float *xn, int64_t T, ls_layer_tape *tp,
                            ls_arena *ta, ls_arena *sc) {
    layer_ctx L = {T, 0, 0, NULL, NULL, NULL, NULL, tp, ta, sc, NULL, l, 0, NULL, NULL, 0, 0};
    return moe_ffn(m, &m->layers[l], x, xn, &L);
}

/* The hybrid's parts of a layer for the skeleton (decoder.h): the Gated DeltaNet or
 * gated-attention mixer, and the sparse MoE block. */
typedef struct {
    const ls_hybrid_model *m;
    int l;
    layer_ctx *L;
} part_ctx;

static ls_status part_mixer(const ls_dec_layer *d, float *x, const float *xn) {
    const part_ctx *p = d->ctx;
    const ls_hybrid_layer *w = &p->m->layers[p->l];
    return p->m->cfg.kind[p->l] == LS_LAYER_GDN ? gdn_mixer(p->m, w, x, xn, p->L)
                                                : attn_mixer(p->m, w, p->l, x, xn, p->L);
}

static ls_status part_moe(const ls_dec_layer *d, float *x, const float *xn) {
    const part_ctx *p = d->ctx;
    return moe_ffn(p->m, &p->m->layers[p->l], x, xn, p->L);
}

/* The skeleton's view of layer l (decoder.h) over the pass L (pc: its parts' context). */
static ls_dec_layer dec_layer(const ls_hybrid_model *m, int l, layer_ctx *L, part_ctx *pc) {
    const ls_config *c = &m->cfg;
    const ls_hybrid_layer *w = &m->layers[l];
    *pc = (part_ctx){m, l, L};
    return (ls_dec_layer){.be = m->be, .T = L->T, .D = c->hidden, .I = c->intermediate, .eps = c->eps,
                          .norm = LS_NORM_ZERO_CENTRED, .input_norm = w->input_norm, .post_norm = w->post_norm,
                          .mixer = part_mixer, .moe = c->moe[l] ? part_moe : NULL, .gu_w = w->mlp_gu,
                          .down_w = w->mlp_down,
                          .lora = ffn_of(m, l, offsetof(ls_hybrid_layer, mlp_gu), offsetof(ls_hybrid_layer, mlp_down), 0, 0),
                          .tp = L->tp ? &L->tp->dec : NULL, .ta = L->ta, .sc = L->sc, .ctx = pc};
}

/* One decoder layer on x[T,D] (spec §5): mixer then FFN, each with its residual. */
static ls_status layer_fwd(const ls_hybrid_model *m, int l, float *x, int skip_ffn, layer_ctx *L) {
    part_ctx pc;
    ls_dec_layer d = dec_layer(m, l, L, &pc);
    return ls_dec_layer_fwd(&d, x, skip_ffn);
}

/* A capture's last layer when it is gated attention and nothing reads its output (no
 * logits wanted): only what later tokens read — the rows' keys and values (norm1, the
 * k/v projections, k's norm and rope) appended to the pages. Its queries, the attention
 * over the whole prefix (quadratic in P) and o_proj would feed only the skipped FFN. */
static ls_status attn_state_only(const ls_hybrid_model *m, int l, const float *x, layer_ctx *L) {
    const ls_config *c = &m->cfg;
    int64_t T = L->T, D = c->hidden, kvd = (int64_t)c->n_kv * c->head_dim;
    ls_arena_mark mk = ls_arena_get_mark(L->sc);
    float *xn = ALLOC_F(L->sc, T * D), *k = ALLOC_F(L->sc, T * kvd), *v = ALLOC_F(L->sc, T * kvd);
    NEED(xn && k && v);
    part_ctx pc;
    ls_dec_layer d = dec_layer(m, l, L, &pc);
    ls_dec_norm1_fwd(&d, xn, x);
    LS_TRY(ls_hybrid_attn_kv_proj(m, &m->layers[l], l, xn, T, k, v, k, NULL, L->sc));
    ls_op_rope_fwd(m->be, k, T, c->n_kv, c->head_dim, c->rot_dim, c->rope_theta, L->pos0);
    LS_TRY(ls_state_append_kv(L->append, l, k, v, T));
    ls_arena_release(L->sc, mk);
    return LS_OK;
}

/* Full mode: save the GDN state of layer l (or every GDN layer, l < 0) as the
 * checkpoint of the sweep chunk starting at st->n, if one does. */
static void save_ckpt(const ls_prompt_state *st, int64_t pos, int l) {
    int64_t j = ls_state_ckpt_at(st, pos);
    if (j < 0) return;
    const ls_config *c = st->cfg;
    const ls_hybrid_config *hc = ls_hybrid_cfg(c);
    size_t conv_n = (size_t)(hc->conv_k - 1) * (size_t)ls_cfg_conv_dim(c);
    size_t rec_n = (size_t)hc->H_v * (size_t)hc->d_k * (size_t)hc->d_v;
    for (int k = l < 0 ? 0 : l; k < (l < 0 ? c->n_layers : l + 1); k++) {
        if (c->kind[k] != LS_LAYER_GDN) continue;
        ls_gdn_state *ck = &st->full->ckpt[j * c->n_layers + k];
        const ls_backend *be = ls_arena_backend(st->arena);
        ls_op_copy(be, ck->S, st->gdn[k].S, (int64_t)rec_n);
        ls_op_copy(be, ck->conv_tail, st->gdn[k].conv_tail, (int64_t)conv_n);
    }
}

/* ---- capture under context parallelism (DESIGN §8; the schedule is the driver's,
 * decoder.c, layer-major; every layer runs over all of the rank's positions, hy_cp_layer)
 *  - Gated DeltaNet: a state scan; every rank ends with the state at the prompt's end.
 *  - Attention: the rank's own part first, then the other ranks' earlier pages gathered
 *    round by round (hy_cp_attn_layer).
 * The full-mode sweep's recomputed forward streams an owner's earlier pages past a chunk
 * (cp_merge_earlier above, ls_hybrid_cp_send_pages on the owner's side). */

int64_t ls_hybrid_cp_block(const ls_prompt_state *st, const ls_fwd_opts *o) {
    int64_t C = o->capture_chunk > 0 ? o->capture_chunk : 2048, b = C / st->page_size;
    return b > 0 ? b : 1;
}

/* (the receiver keeps no remote page beyond one block) */
ls_status ls_hybrid_cp_send_pages(const ls_prompt_state *st, int l, int dst, int64_t lo, int64_t bp, ls_arena *sc) {
    const ls_config *c = st->cfg;
    size_t pb = (size_t)st->page_size * (size_t)c->n_kv * (size_t)c->head_dim * ls_dtype_size(st->dtype);
    for (int k = 0; k < st->nseg; k++) { /* earlier segments, prompt order */
        if (st->seg_hi[k] == st->seg_lo[k] || st->seg_hi[k] > lo) continue;
        LS_TRY(ls_dist_pages_send(ls_arena_backend(st->arena), st->comm, st->attn[l].k_pages + st->seg_lpage[k],
                                  st->attn[l].v_pages + st->seg_lpage[k], st->seg_hi[k] - st->seg_lo[k],
                                  st->page_size, pb, bp, dst, l, sc));
    }
    return LS_OK;
}

/* ---- the family's hooks of the model driver (decoder.h) -------------------------------- */

static size_t conv_floats(const ls_config *c) {
    return (size_t)(ls_hybrid_cfg(c)->conv_k - 1) * (size_t)ls_cfg_conv_dim(c);
}

static size_t rec_floats(const ls_config *c) {
    const ls_hybrid_config *hc = ls_hybrid_cfg(c);
    return (size_t)hc->H_v * (size_t)hc->d_k * (size_t)hc->d_v;
}

/* a branch's private copy of a GDN layer's state, written in place by the layer */
static ls_status hy_begin(const ls_dec_model *dm, const ls_dec_pass *p) {
    if (p->kind != LS_DEC_BRANCH) return LS_OK;
    ls_hybrid_pass *hp = dm->pass_data;
    size_t conv_n = conv_floats(dm->cfg);
    hp->S = ALLOC_F(p->sc, rec_floats(dm->cfg));
    hp->tail = ALLOC_F(p->sc, conv_n ? conv_n : 1);
    NEED(hp->S && hp->tail);
    return LS_OK;
}

static ls_dec_branch *hy_tape_new(const ls_dec_model *dm, const ls_dec_pass *p, ls_arena *A) {
    (void)p;
    ls_branch_tape *tb = ls_arena_host_calloc(A, 1, sizeof *tb);
    if (!tb || !(tb->layers = ls_arena_host_calloc(A, (size_t)dm->cfg->n_layers, sizeof(ls_layer_tape)))) return NULL;
    return &tb->h;
}

static ls_status hy_layer_fwd(const ls_dec_model *dm, const ls_dec_pass *p, int l, float *x, int skip) {
    const ls_hybrid_model *m = dm->fam;
    const ls_config *c = &m->cfg;
    int gdn = c->kind[l] == LS_LAYER_GDN;
    ls_prompt_state *st = p->st;
    switch (p->kind) {
    case LS_DEC_EXTEND: {
        if (gdn) save_ckpt(st, p->pos0, l);
        ls_kv_prefix pre = ls_state_prefix(st, l);
        layer_ctx L = {p->T, p->pos0, 0, gdn ? NULL : &pre, st, st->gdn ? st->gdn[l].S : NULL,
                       st->gdn ? st->gdn[l].conv_tail : NULL, NULL, NULL, p->sc, NULL, l, 1, NULL, NULL, 0, 0};
        /* skip: the last layer, whose output nothing reads (decoder.c) */
        if (skip && !gdn && l == c->n_layers - 1) return attn_state_only(m, l, x, &L);
        return layer_fwd(m, l, x, skip, &L);
    }
    case LS_DEC_CP_CAPTURE: /* every layer of a CP capture is hy_cp_layer's */
        LS_ASSERT(0, "layer %d: a CP capture runs its layers over all of the rank's positions", l);
        return LS_ERR_ARG;
    case LS_DEC_DECODE: {
        layer_ctx L = {p->T, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL, p->sc, p->seqs, l, 1, NULL, NULL, 0, 0};
        return layer_fwd(m, l, x, skip, &L);
    }
    case LS_DEC_BRANCH:
        break;
    }
    const ls_prompt_state *v = p->view;
    ls_hybrid_pass *hp = dm->pass_data;
    ls_branch_tape *tb = p->tape ? (ls_branch_tape *)p->tape : NULL;
    ls_kv_prefix pre;
    const ls_kv_prefix *pp = NULL;
    if (gdn) { /* the branch continues from the prompt's state (a copy: the state is read-only) */
        if (v) {
            ls_op_copy(m->be, hp->S, v->gdn[l].S, (int64_t)rec_floats(c));
            ls_op_copy(m->be, hp->tail, v->gdn[l].conv_tail, (int64_t)conv_floats(c));
        } else {
            ls_op_zero(m->be, hp->S, (int64_t)rec_floats(c));
            ls_op_zero(m->be, hp->tail, (int64_t)conv_floats(c));
        }
    } else if (v) {
        pre = ls_state_prefix(v, l);
        pp = &pre;
    }
    int cp = v && v->nranks > 1;
    layer_ctx L = {p->T, p->pos0, p->grad_from, pp, NULL, hp->S, hp->tail, tb ? &tb->layers[l] : NULL, p->ta, p->sc,
                   NULL, l, 0, cp && p->sweep < 0 ? v->comm : NULL, cp && p->sweep >= 0 && !gdn ? v : NULL,
                   cp ? ls_hybrid_cp_block(v, p->o) : 0, p->sweep};
    return layer_fwd(m, l, x, skip, &L);
}

/* ---- an attention layer of a CP capture over all of the rank's positions (issue 22) ---
 * In waves of the rank's positions (ls_cp_waves: q, gate, o and lse kept for at most W
 * positions; every rank makes as many). Pass A, per chunk of the wave: norm, projections,
 * q/k norms, rope, the attention over the rank's own earlier pages and the chunk's keys
 * (its pages written). The gather: round by round, block b of every segment another rank
 * reads reaches every rank in one all-gather (ls_dist_pages_gather) and is merged, by
 * log-sum-exp, into the wave's positions after that segment (all of them: the block is
 * wholly earlier, no mask). Pass B, per chunk: the gate, the out projection, the FFN.
 * With several waves every page is written first (the K/V projections of all of the
 * rank's positions: the other ranks read them in every wave) and a wave's chunks project
 * their K/V again for their own causal part. No rank waits on another's compute but for
 * the rounds' balance. */

ls_status ls_hybrid_gather_block(void *ctx, int seg, void *const *kp, void *const *vp, int64_t nb, int64_t rows,
                                 int64_t row0) {
    (void)nb, (void)row0;
    ls_hybrid_gather *G = ctx;
    const ls_config *c = &G->m->cfg;
    const ls_prompt_state *st = G->st;
    int64_t qd = (int64_t)c->n_heads * c->head_dim, lo;
    int owner;
    int64_t hi;
    ls_state_segment(st, seg, &owner, &lo, &hi);
    ls_kv_prefix blk = {rows, st->page_size, st->dtype, kp, vp};
    float scale = 1.0f / sqrtf((float)c->head_dim);
    for (int k = 0; k < st->nseg; k++) {
        if (st->seg_lo[k] < hi) continue; /* not after the block's segment */
        int64_t a = G->xoff[k] > G->w0 ? G->xoff[k] : G->w0, e = G->xoff[k] + st->seg_hi[k] - st->seg_lo[k];
        e = e < G->w1 ? e : G->w1;
        for (int64_t r = a, T; r < e; r += T) {
            T = e - r < G->C ? e - r : G->C;
            int64_t q = r - G->w0;
            LS_TRY(ls_op_attn_prefix_fwd(G->m->be, G->ob, G->lb, G->Q + q * qd, &blk, T, c->n_heads, c->n_kv,
                                         c->head_dim, scale, G->sc));
            ls_op_attn_merge(G->m->be, G->O + q * qd, G->LSE + q * c->n_heads, G->ob, G->lb, T, c->n_heads,
                             c->head_dim);
        }
    }
    return LS_OK;
}

size_t ls_hybrid_cp_scan_wave_bytes(const ls_config *c) {
    const ls_hybrid_config *hc = ls_hybrid_cfg(c);
    return ((size_t)2 * (size_t)ls_cfg_value_dim(c) + (size_t)hc->H_v * (size_t)hc->d_k) * sizeof(float);
}

size_t ls_hybrid_cp_attn_wave_bytes(const ls_config *c) {
    return ((size_t)3 * (size_t)c->n_heads * (size_t)c->head_dim + (size_t)c->n_heads) * sizeof(float);
}

static ls_status hy_cp_attn_layer(const ls_hybrid_model *m, ls_prompt_state *st, int l, float *x, int skip_ffn,
                                  const ls_fwd_opts *o, ls_arena *sc) {
    const ls_config *c = &m->cfg;
    const ls_hybrid_layer *w = &m->layers[l];
    const ls_backend *be = m->be;
    int64_t D = c->hidden, qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv * c->head_dim;
    int64_t H = c->n_heads, C = o->capture_chunk > 0 ? o->capture_chunk : 2048;
    int64_t Tr = 0, xoff[LS_STATE_MAX_SEGS];
    for (int k = 0; k < st->nseg; k++) xoff[k] = Tr, Tr += st->seg_hi[k] - st->seg_lo[k];
    int64_t nw, W = ls_cp_waves(ls_state_fullest_positions(st), C, o->cp_wave, ls_hybrid_cp_attn_wave_bytes(c), &nw);
    int64_t Wn = W < Tr ? W : (Tr > 0 ? Tr : 1);
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *Q = ALLOC_F(sc, Wn * qd), *G = ALLOC_F(sc, Wn * qd), *O = ALLOC_F(sc, Wn * qd), *LSE = ALLOC_F(sc, Wn * H);
    NEED(Q && G && O && LSE);
    layer_ctx Lc = {0, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL, sc, NULL, l, 1, NULL, NULL, 0, 0};
    part_ctx pc = {m, l, &Lc};
    ls_dec_layer d = {.be = be, .D = D, .I = c->intermediate, .eps = c->eps, .norm = LS_NORM_ZERO_CENTRED,
                      .input_norm = w->input_norm, .post_norm = w->post_norm, .mixer = part_mixer,
                      .moe = c->moe[l] ? part_moe : NULL, .gu_w = w->mlp_gu, .down_w = w->mlp_down,
                      .lora = ffn_of(m, l, offsetof(ls_hybrid_layer, mlp_gu), offsetof(ls_hybrid_layer, mlp_down), 0, 0),
                      .sc = sc, .ctx = &pc};
    float scale = 1.0f / sqrtf((float)c->head_dim);
    int k;
    int64_t c0, T, r0;
    /* several waves, or the last layer (skip_ffn: its output feeds nothing, so only its keys
     * and values are made — attn_state_only's work): every page first (the other ranks
     * read them in every wave) */
    for (k = 0, c0 = -1; (nw > 1 || skip_ffn) && ls_dec_cp_chunk(st, xoff, C, 0, Tr, &k, &c0, &T, &r0);) {
        ls_arena_mark m2 = ls_arena_get_mark(sc);
        float *xn = ALLOC_F(sc, T * D), *kk = ALLOC_F(sc, T * kvd), *v = ALLOC_F(sc, T * kvd);
        NEED(xn && kk && v);
        d.T = T;
        ls_dec_norm1_fwd(&d, xn, x + r0 * D);
        LS_TRY(ls_hybrid_attn_kv_proj(m, w, l, xn, T, kk, v, kk, NULL, sc));
        ls_op_rope_fwd(be, kk, T, c->n_kv, c->head_dim, c->rot_dim, c->rope_theta, c0 - T);
        st->n = c0 - T;
        LS_TRY(ls_state_append_kv(st, l, kk, v, T));
        ls_arena_release(sc, m2);
    }
    if (skip_ffn) { /* the same on every rank: no collective is left unpaired */
        ls_arena_release(sc, mk);
        return LS_OK;
    }
    ls_dist_segs segs;
    LS_TRY(ls_dec_cp_segs(st, l, 1, sc, &segs, NULL));
    int64_t Cq = C < Wn ? C : Wn;
    ls_hybrid_gather gc = {m, st, Q, O, LSE, ALLOC_F(sc, Cq * qd), ALLOC_F(sc, Cq * H), xoff, Cq, 0, 0, sc};
    NEED(gc.ob && gc.lb);
    size_t pb = (size_t)st->page_size * (size_t)kvd * ls_dtype_size(st->dtype);
    ls_status s = LS_OK;
    for (int64_t wv = 0; wv < nw && s == LS_OK; wv++) {
        gc.w0 = wv * W < Tr ? wv * W : Tr, gc.w1 = (wv + 1) * W < Tr ? (wv + 1) * W : Tr;
        /* 1. pass A */
        for (k = 0, c0 = -1; ls_dec_cp_chunk(st, xoff, C, gc.w0, gc.w1, &k, &c0, &T, &r0);) {
            int64_t p0 = c0 - T, q0 = r0 - gc.w0;
            ls_arena_mark m2 = ls_arena_get_mark(sc);
            float *xn = ALLOC_F(sc, T * D), *kk = ALLOC_F(sc, T * kvd), *v = ALLOC_F(sc, T * kvd);
            NEED(xn && kk && v);
            float *q = Q + q0 * qd;
            d.T = T;
            ls_dec_norm1_fwd(&d, xn, x + r0 * D);
            LS_TRY(attn_in_proj(m, w, l, xn, T, q, G + q0 * qd, kk, v, q, kk, NULL, NULL, sc));
            ls_op_rope_fwd(be, q, T, c->n_heads, c->head_dim, c->rot_dim, c->rope_theta, p0);
            ls_op_rope_fwd(be, kk, T, c->n_kv, c->head_dim, c->rot_dim, c->rope_theta, p0);
            st->n = p0;
            ls_kv_prefix pre = ls_state_prefix(st, l); /* this rank's earlier pages */
            LS_TRY(ls_op_attn_fwd(be, O + q0 * qd, LSE + q0 * H, q, kk, v, &pre, T, c->n_heads, c->n_kv, c->head_dim,
                                  scale, sc));
            if (nw == 1) LS_TRY(ls_state_append_kv(st, l, kk, v, T));
            ls_arena_release(sc, m2);
        }
        /* 2. the gather: the other ranks' earlier pages, merged */
        LS_TRY(ls_dist_pages_gather(be, st->comm, &segs, st->page_size, pb, pb, ls_hybrid_cp_block(st, o), l,
                                    ls_hybrid_gather_block, &gc, sc));
        /* 3. pass B */
        for (k = 0, c0 = -1; s == LS_OK && ls_dec_cp_chunk(st, xoff, C, gc.w0, gc.w1, &k, &c0, &T, &r0);) {
            int64_t q0 = r0 - gc.w0;
            float *xr = x + r0 * D;
            s = ls_hybrid_attn_out_proj(m, w, l, xr, O + q0 * qd, O + q0 * qd, G + q0 * qd, T, sc);
            if (s == LS_OK && !skip_ffn) {
                Lc.T = T, Lc.pos0 = c0 - T;
                d.T = T;
                s = ls_dec_ffn_fwd(&d, xr);
            }
        }
    }
    ls_arena_release(sc, mk);
    return s;
}

/* ---- a Gated DeltaNet layer of a CP capture as a state scan (issue 22) -----------------
 * Instead of relaying the recurrent state rank to rank (a wavefront), every rank runs its
 * segments of the layer at once from the zero state, recording each segment's
 * transition (gdn_scan.h); one exchange of the segments' (M, S⁰) in prompt order gives
 * every rank the state each of its segments starts from, and its outputs are corrected.
 * The conv's W − 1 rows before each segment (pre-conv projections) come up front: each
 * owner computes its segments' last rows and they are exchanged the same way. Pass A:
 * norm, projections, conv, the two shard runs (outputs, correction vectors and z kept
 * for the rank's positions); the exchange; pass B: the correction, the gated norm, the
 * out projection and the FFN. */
static ls_status hy_cp_layer(const ls_dec_model *dm, ls_prompt_state *st, ls_prompt_state *hst, int l, float *x,
                             int skip_ffn, const ls_fwd_opts *o, ls_arena *sc) {
    const ls_hybrid_model *m = dm->fam;
    const ls_config *c = &m->cfg;
    if (c->kind[l] != LS_LAYER_GDN) return hy_cp_attn_layer(m, st, l, x, skip_ffn, o, sc);
    const ls_hybrid_config *hc = ls_hybrid_cfg(c);
    const ls_hybrid_layer *w = &m->layers[l];
    const ls_backend *be = m->be;
    int64_t D = c->hidden, kd = ls_cfg_key_dim(c), vd = ls_cfg_value_dim(c), cd = ls_cfg_conv_dim(c);
    int64_t Wm = hc->conv_k - 1, Hv = hc->H_v, dk = hc->d_k, dv = hc->d_v, C = o->capture_chunk > 0 ? o->capture_chunk : 2048;
    int64_t sn = Hv * dk * dv, mn = Hv * dk * dk, tl = Wm * cd > 0 ? Wm * cd : 1;
    ls_gdr_dims gd = {hc->H_k, hc->H_v, hc->d_k, hc->d_v, 1.0f / sqrtf((float)hc->d_k)}, gi = gd;
    gi.d_v = gd.d_k; /* the identity run: a state of d_k columns */
    int nseg = ls_state_segments(st), L_ = c->n_layers;
    int64_t Tr = 0, xoff[LS_STATE_MAX_SEGS];
    for (int k = 0; k < st->nseg; k++) xoff[k] = Tr, Tr += st->seg_hi[k] - st->seg_lo[k];
    /* one wave: o, u and z of the rank's positions kept from pass A; several: pass A keeps
     * only the state at each wave's start (a snapshot) and pass B runs each wave again from
     * the true state (ls_cp_waves) */
    int64_t nw, W = ls_cp_waves(ls_state_fullest_positions(st), C, o->cp_wave, ls_hybrid_cp_scan_wave_bytes(c), &nw);
    int64_t Kp = nw == 1 ? (Tr > 0 ? Tr : 1) : 1;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *O = ALLOC_F(sc, Kp * vd), *U = ALLOC_F(sc, Kp * Hv * dk), *Z = ALLOC_F(sc, Kp * vd);
    float *snS = nw > 1 ? ALLOC_F(sc, nw * sn) : NULL, *snM = nw > 1 ? ALLOC_F(sc, nw * mn) : NULL;
    float *snT = nw > 1 ? ALLOC_F(sc, nw * tl) : NULL;
    NEED(nw == 1 || (snS && snM && snT));
    float *tout = ALLOC_F(sc, nseg * tl), *tin = ALLOC_F(sc, (nseg + 1) * tl);
    float *Ms = ALLOC_F(sc, nseg * mn), *S0s = ALLOC_F(sc, nseg * sn), *Sin = ALLOC_F(sc, (nseg + 1) * sn);
    int64_t *lo = ls_arena_host_alloc(sc, 2 * (size_t)nseg * sizeof(int64_t));
    int *own = ls_arena_host_alloc(sc, (size_t)nseg * sizeof(int));
    NEED(O && U && Z && tout && tin && Ms && S0s && Sin && lo && own);
    int64_t *hi = lo + nseg;
    for (int sg = 0; sg < nseg; sg++) ls_state_segment(st, sg, &own[sg], &lo[sg], &hi[sg]);
    /* the layer as the skeleton runs its norms and FFN (decoder.h), per chunk */
    layer_ctx Lc = {0, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL, sc, NULL, l, 1, NULL, NULL, 0, 0};
    part_ctx pc = {m, l, &Lc};
    ls_dec_layer d = {.be = be, .D = D, .I = c->intermediate, .eps = c->eps, .norm = LS_NORM_ZERO_CENTRED,
                      .input_norm = w->input_norm, .post_norm = w->post_norm, .mixer = part_mixer,
                      .moe = c->moe[l] ? part_moe : NULL, .gu_w = w->mlp_gu, .down_w = w->mlp_down,
                      .lora = ffn_of(m, l, offsetof(ls_hybrid_layer, mlp_gu), offsetof(ls_hybrid_layer, mlp_down), 0, 0),
                      .sc = sc, .ctx = &pc};
    /* 1. the conv rows before each segment: every owned segment's last Wm pre-conv rows */
    ls_status s = LS_OK;
    ls_op_zero(be, tout, nseg * tl);
    for (int k = 0; k < st->nseg && s == LS_OK; k++) {
        int sg = 0;
        while (lo[sg] != st->seg_lo[k]) sg++;
        int64_t n = hi[sg] - lo[sg], r = n < Wm ? n : Wm;
        if (r <= 0) continue;
        ls_arena_mark m2 = ls_arena_get_mark(sc);
        float *xn = ALLOC_F(sc, r * D);
        NEED(xn);
        d.T = r;
        ls_dec_norm1_fwd(&d, xn, x + (xoff[k] + n - r) * D);
        LS_TRY(ls_hybrid_gdn_in_proj(m, w, l, xn, r, tout + sg * tl + (Wm - r) * cd, NULL, NULL, sc));
        ls_arena_release(sc, m2);
    }
    for (int sg = 0; sg < nseg && s == LS_OK; sg++) {
        if (hi[sg] == lo[sg] || st->nranks <= 1) continue;
        ls_dist_part part = {tout + sg * tl, (size_t)Wm * cd * sizeof(float)};
        s = ls_dist_bcast_parts(be, st->comm, &part, 1, own[sg]);
    }
    if (s != LS_OK) return s;
    /* tin[sg]: the rows before segment sg (the state's own tail before the first); tin[sg+1]
     * = the last Wm rows of tin[sg] followed by segment sg's rows */
    ls_op_copy(be, tin, st->gdn[l].conv_tail, Wm * cd);
    for (int sg = 0; sg < nseg; sg++) {
        int64_t n = hi[sg] - lo[sg];
        float *a = tin + sg * tl, *b = tin + (sg + 1) * tl;
        if (n >= Wm) {
            ls_op_copy(be, b, tout + sg * tl, Wm * cd);
        } else {
            if (Wm - n > 0) ls_op_copy(be, b, a + n * cd, (Wm - n) * cd);
            if (n > 0) ls_op_copy(be, b + (Wm - n) * cd, tout + sg * tl + (Wm - n) * cd, n * cd);
        }
    }
    /* 2. pass A: each owned segment from the zero state and from the identity */
    float *S0 = ALLOC_F(sc, sn), *M = ALLOC_F(sc, mn), *I0 = ALLOC_F(sc, mn), *tail = ALLOC_F(sc, tl);
    /* the sweep checkpoints (full mode) of this layer: from zero in pass A, corrected after
     * the scan, then put where the state keeps them */
    int64_t nck = hst->full ? (hst->full->n_chunks > 0 ? hst->full->n_chunks : 1) : 0;
    float *Mck = nck ? ALLOC_F(sc, nck * mn) : NULL, *Sck = nck ? ALLOC_F(sc, nck * sn) : NULL;
    float *Tck = nck ? ALLOC_F(sc, nck * tl) : NULL;
    NEED(S0 && M && I0 && tail && (!nck || (Mck && Sck && Tck)));
    float *eye = ls_host_view(be, sc, I0, (size_t)mn * sizeof(float), 0); /* the identity, per value head */
    NEED(eye);
    memset(eye, 0, (size_t)mn * sizeof(float));
    for (int64_t h = 0; h < Hv; h++)
        for (int64_t i = 0; i < dk; i++) eye[(h * dk + i) * dk + i] = 1.0f;
    ls_host_view_done(be, sc, I0, eye, (size_t)mn * sizeof(float), 1);
    int cur = -1, cs = 0, k;
    int64_t c0, T, r0;
    for (int64_t wv = 0; wv < nw && s == LS_OK; wv++) {
        int64_t w0 = wv * W < Tr ? wv * W : Tr, w1 = (wv + 1) * W < Tr ? (wv + 1) * W : Tr;
        for (k = 0, c0 = -1; s == LS_OK && ls_dec_cp_chunk(st, xoff, C, w0, w1, &k, &c0, &T, &r0);) {
            int64_t p0 = c0 - T, j = ls_state_ckpt_at(hst, p0);
            if (k != cur) { /* a segment's first chunk: the previous one's summary kept */
                if (cur >= 0) ls_op_copy(be, Ms + cs * mn, M, mn), ls_op_copy(be, S0s + cs * sn, S0, sn);
                for (cur = k, cs = 0; lo[cs] != st->seg_lo[k];) cs++;
                ls_op_zero(be, S0, sn);
                ls_op_copy(be, M, I0, mn);
                ls_op_copy(be, tail, tin + cs * tl, Wm * cd);
            }
            if (nw > 1 && r0 == w0) { /* the wave's first chunk: where pass B starts it again */
                ls_op_copy(be, snS + wv * sn, S0, sn);
                ls_op_copy(be, snM + wv * mn, M, mn);
                ls_op_copy(be, snT + wv * tl, tail, Wm * cd);
            }
            if (j >= 0) { /* the sweep's checkpoint: from zero now, corrected after the scan */
                ls_op_copy(be, Sck + j * sn, S0, sn);
                ls_op_copy(be, Tck + j * tl, tail, Wm * cd);
                ls_op_copy(be, Mck + j * mn, M, mn);
            }
            ls_arena_mark m2 = ls_arena_get_mark(sc);
            float *xn = ALLOC_F(sc, T * D), *qkv = ALLOC_F(sc, T * cd), *y = ALLOC_F(sc, T * cd);
            float *ba = ALLOC_F(sc, T * 2 * Hv), *q = ALLOC_F(sc, T * kd), *kk = ALLOC_F(sc, T * kd);
            float *v = ALLOC_F(sc, T * vd), *beta = ALLOC_F(sc, T * Hv), *g = ALLOC_F(sc, T * Hv);
            float *zv = ls_arena_calloc(sc, (size_t)(T * Hv * dk), sizeof(float));
            /* one wave: o, u, z kept; several: o and u thrown away (pass B recomputes) */
            float *oa = nw == 1 ? O + r0 * vd : ALLOC_F(sc, T * vd), *ua = nw == 1 ? U + r0 * Hv * dk : ALLOC_F(sc, T * Hv * dk);
            NEED(xn && qkv && y && ba && q && kk && v && beta && g && zv && oa && ua);
            d.T = T;
            ls_dec_norm1_fwd(&d, xn, x + r0 * D);
            LS_TRY(ls_hybrid_gdn_in_proj(m, w, l, xn, T, qkv, nw == 1 ? Z + r0 * vd : NULL, ba, sc));
            ls_op_conv_fwd(be, y, NULL, tail, qkv, w->conv_w, T, cd, hc->conv_k);
            ls_op_gdn_prep_fwd(be, q, kk, v, beta, g, NULL, NULL, y, ba, w->A_log, w->dt_bias, T, gd);
            s = ls_op_gdr_chunk_fwd(be, oa, NULL, S0, q, kk, v, beta, g, T, gd, sc);
            if (s == LS_OK) s = ls_op_gdr_chunk_fwd(be, ua, NULL, M, q, kk, zv, beta, g, T, gi, sc);
            ls_arena_release(sc, m2);
        }
    }
    if (cur >= 0) ls_op_copy(be, Ms + cs * mn, M, mn), ls_op_copy(be, S0s + cs * sn, S0, sn);
    if (s != LS_OK) return s;
    /* 3. the scan: every segment's (M, S⁰) on every rank, composed in prompt order */
    for (int sg = 0; sg < nseg && s == LS_OK; sg++) {
        if (hi[sg] == lo[sg] || st->nranks <= 1) continue;
        ls_dist_part parts[2] = {{Ms + sg * mn, (size_t)mn * sizeof(float)}, {S0s + sg * sn, (size_t)sn * sizeof(float)}};
        s = ls_dist_bcast_parts(be, st->comm, parts, 2, own[sg]);
    }
    if (s != LS_OK) return s;
    ls_op_copy(be, Sin, st->gdn[l].S, sn);
    for (int sg = 0; sg < nseg; sg++) {
        if (hi[sg] == lo[sg]) {
            ls_op_copy(be, Sin + (sg + 1) * sn, Sin + sg * sn, sn);
            continue;
        }
        ls_op_copy(be, Sin + (sg + 1) * sn, S0s + sg * sn, sn);
        ls_gdn_shard_apply(be, NULL, Sin + (sg + 1) * sn, NULL, Ms + sg * mn, Sin + (sg + 1) * sn, Sin + sg * sn, 0, gd);
    }
    ls_op_copy(be, st->gdn[l].S, Sin + nseg * sn, sn); /* the state at the prompt's end, on every rank */
    ls_op_copy(be, st->gdn[l].conv_tail, tin + nseg * tl, Wm * cd);
    /* 4. pass B: the correction (one wave) or the wave run again from the true state
     * (several), the gated norm, the out projection, the FFN */
    cur = -1;
    for (int64_t wv = 0; wv < nw && s == LS_OK; wv++) {
        int64_t w0 = wv * W < Tr ? wv * W : Tr, w1 = (wv + 1) * W < Tr ? (wv + 1) * W : Tr;
        for (k = 0, c0 = -1; s == LS_OK && ls_dec_cp_chunk(st, xoff, C, w0, w1, &k, &c0, &T, &r0);) {
            int64_t p0 = c0 - T, j = ls_state_ckpt_at(hst, p0);
            if (k != cur || r0 == w0) {
                for (cur = k, cs = 0; lo[cs] != st->seg_lo[k];) cs++;
                if (nw > 1 && p0 == lo[cs]) { /* the segment's true starting state */
                    ls_op_copy(be, S0, Sin + cs * sn, sn);
                    ls_op_copy(be, tail, tin + cs * tl, Wm * cd);
                } else if (nw > 1) { /* a wave starting inside it: the snapshot, corrected */
                    ls_op_copy(be, S0, snS + wv * sn, sn);
                    ls_gdn_shard_apply(be, NULL, S0, NULL, snM + wv * mn, S0, Sin + cs * sn, 0, gd);
                    ls_op_copy(be, tail, snT + wv * tl, Wm * cd);
                }
            }
            if (j >= 0) { /* checkpoint = M(c0)·S_in + S⁰(c0), into the state (host memory: copied there) */
                ls_gdn_state *ck = &hst->full->ckpt[j * L_ + l];
                ls_gdn_shard_apply(be, NULL, Sck + j * sn, NULL, Mck + j * mn, Sck + j * sn, Sin + cs * sn, 0, gd);
                if (ls_state_resident(hst, be)) {
                    ls_op_copy(be, ck->S, Sck + j * sn, sn);
                    ls_op_copy(be, ck->conv_tail, Tck + j * tl, Wm * cd);
                } else {
                    be->i->to_host(be, ck->S, Sck + j * sn, (size_t)sn * sizeof(float));
                    if (Wm * cd > 0) be->i->to_host(be, ck->conv_tail, Tck + j * tl, (size_t)(Wm * cd) * sizeof(float));
                }
            }
            float *xr = x + r0 * D;
            ls_arena_mark m2 = ls_arena_get_mark(sc);
            if (nw == 1) {
                float *oc = O + r0 * vd;
                ls_gdn_shard_apply(be, oc, NULL, U + r0 * Hv * dk, NULL, NULL, Sin + cs * sn, T, gd);
                LS_TRY(ls_hybrid_gdn_out_proj(m, w, l, xr, oc, NULL, oc, Z + r0 * vd, T, sc));
            } else {
                float *xn = ALLOC_F(sc, T * D), *qkv = ALLOC_F(sc, T * cd), *y = ALLOC_F(sc, T * cd);
                float *ba = ALLOC_F(sc, T * 2 * Hv), *q = ALLOC_F(sc, T * kd), *kk = ALLOC_F(sc, T * kd);
                float *v = ALLOC_F(sc, T * vd), *beta = ALLOC_F(sc, T * Hv), *g = ALLOC_F(sc, T * Hv);
                float *oc = ALLOC_F(sc, T * vd), *z = ALLOC_F(sc, T * vd);
                NEED(xn && qkv && y && ba && q && kk && v && beta && g && oc && z);
                d.T = T;
                ls_dec_norm1_fwd(&d, xn, xr);
                LS_TRY(ls_hybrid_gdn_in_proj(m, w, l, xn, T, qkv, z, ba, sc));
                ls_op_conv_fwd(be, y, NULL, tail, qkv, w->conv_w, T, cd, hc->conv_k);
                ls_op_gdn_prep_fwd(be, q, kk, v, beta, g, NULL, NULL, y, ba, w->A_log, w->dt_bias, T, gd);
                LS_TRY(ls_op_gdr_chunk_fwd(be, oc, NULL, S0, q, kk, v, beta, g, T, gd, sc));
                LS_TRY(ls_hybrid_gdn_out_proj(m, w, l, xr, oc, NULL, oc, z, T, sc));
            }
            ls_arena_release(sc, m2);
            if (!skip_ffn) {
                Lc.T = T, Lc.pos0 = p0;
                d.T = T;
                s = ls_dec_ffn_fwd(&d, xr);
            }
        }
    }
    ls_arena_release(sc, mk);
    return s;
}

ls_dec_model ls_hybrid_dec(const ls_hybrid_model *m, ls_hybrid_pass *hp) {
    return (ls_dec_model){.be = m->be, .cfg = &m->cfg, .norm = LS_NORM_ZERO_CENTRED, .embed = m->embed,
                          .final_norm = m->final_norm, .lm_head = m->lm_head, .fam = m, .pass_data = hp,
                          .batched_decode = 1, .begin = hy_begin, .tape_new = hy_tape_new,
                          .layer_fwd = hy_layer_fwd, .cp_layer = hy_cp_layer,
                          .layer_bwd = ls_hybrid_layer_bwd,
                          .sweep_serve = ls_hybrid_sweep_serve, .sweep_relay = ls_hybrid_sweep_relay,
                          .cp_sweep_layer = ls_hybrid_cp_sweep_layer, .cp_sweep_bytes = ls_hybrid_cp_sweep_bytes};
}

/* ---- the family's entries: the driver's ------------------------------------------------ */

ls_status ls_hybrid_extend(const ls_hybrid_model *m, ls_prompt_state *st, const int32_t *ids, int64_t n, float *logits,
                           const ls_fwd_opts *o, ls_arena *scratch) {
    ls_hybrid_pass hp;
    ls_dec_model dm = ls_hybrid_dec(m, &hp);
    return ls_dec_extend(&dm, st, ids, n, logits, o, scratch);
}

ls_status ls_hybrid_capture(const ls_hybrid_model *m, ls_prompt_state *st, const int32_t *ids,
                            int64_t n, const ls_fwd_opts *o, ls_arena *scratch) {
    ls_hybrid_pass hp;
    ls_dec_model dm = ls_hybrid_dec(m, &hp);
    return ls_dec_capture(&dm, st, ids, n, o, scratch);
}

ls_status ls_hybrid_decode(const ls_hybrid_model *m, ls_prompt_state *const *sts, const int32_t *ids, int n,
                           float *logits, const ls_fwd_opts *o, ls_arena *scratch) {
    ls_hybrid_pass hp;
    ls_dec_model dm = ls_hybrid_dec(m, &hp);
    return ls_dec_decode(&dm, sts, ids, n, logits, o, scratch);
}

ls_status ls_hybrid_branch_fwd(const ls_hybrid_model *m, const ls_prompt_state *st, const int32_t *ids, int64_t T,
                               int64_t out_from, int64_t grad_from, const int32_t *target, float *logprob,
                               float *entropy, ls_branch_tape **tape_out, const ls_fwd_opts *o,
                               ls_arena *tape_arena, ls_arena *scratch) {
    ls_hybrid_pass hp;
    ls_dec_model dm = ls_hybrid_dec(m, &hp);
    return ls_dec_branch_fwd(&dm, st, ids, T, out_from, grad_from, target, logprob, entropy,
                             (ls_dec_branch **)tape_out, o, tape_arena, scratch, -1);
}

ls_status ls_hybrid_branch_logprobs(const ls_hybrid_model *m, const ls_prompt_state *st,
                                    const int32_t *ids, int64_t T, int64_t out_from,
                                    const int32_t *target, float *logprob, const ls_fwd_opts *o,
                                    ls_arena *work) {
    return ls_hybrid_branch_fwd(m, st, ids, T, out_from, 0, target, logprob, NULL, NULL, o, NULL, work);
}
