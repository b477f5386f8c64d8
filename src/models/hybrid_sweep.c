/*
 * hybrid_sweep.c — the full-mode sweep under context parallelism, layer-major (issue 22;
 * decoder.h's cp_sweep_layer). The chunk-major sweep walks the prompt's chunks last to
 * first through every layer, so under CP only the owner of the current chunk computes and
 * the d(state) of every Gated DeltaNet layer relays rank to rank. Here every rank runs
 * layer l's backward over all of its positions at once, from the layer inputs the CP
 * capture kept (ls_state_full.xres), from the last layer down; what crosses ranks is
 * exchanged collectively, the transpose of the CP capture's exchanges:
 *  - attention: the forward is recomputed as the capture computes it (own pages, then the
 *    other ranks' earlier pages gathered round by round and merged); the backward of the
 *    queries runs over the own pages per chunk and over the gathered blocks again, whose
 *    dK/dV go back to their holders in the same rounds (ls_dist_pages_gather_grad); only
 *    then, with every query's share in the dState pages, the keys' and values' backward.
 *  - Gated DeltaNet: a transposed state scan. Pass 1 recomputes each sweep chunk from its
 *    checkpoint (the true state), the layer's second half and backward to the outputs'
 *    gradient d_o, and each chunk's summary of how its outputs read the state it starts
 *    from: with u_t = scale·M_tᵀ q_t (the identity run, gdn_scan.h) ∂L/∂S_in = Σ_t u_t
 *    d_o_tᵀ + Mᵀ ∂L/∂S_out. One exchange of every segment's (G, M) gives each rank the
 *    gradient of the state its segments end with; pass 2 runs the recurrence's backward
 *    chunk by chunk from it (the chunk-major sweep's kernels), and the conv's W − 1 rows
 *    read across a segment boundary get their gradient in a second small exchange before
 *    the input projections' backward.
 * The layer's parameter gradients are the rank's positions' share (the transaction sums
 * them over ranks, grpo.c). Every rank makes the same collectives in the same order.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "gdn_scan.h"
#include "hybrid_tape.h"
#include "longstraw/cp.h"
#include "longstraw/kernels.h"
#include "longstraw/lora.h"

#define ALLOC_F(arena, n) ((float *)ls_arena_alloc((arena), (size_t)(n) * sizeof(float)))
#define CALLOC_F(arena, n) ((float *)ls_arena_calloc((arena), (size_t)(n), sizeof(float)))
#define NEED(p)                        \
    do {                               \
        if (!(p)) return LS_ERR_NOMEM; \
    } while (0)

size_t ls_hybrid_cp_sweep_bytes(const ls_config *c) {
    const ls_hybrid_config *hc = ls_hybrid_cfg(c);
    size_t qd = (size_t)c->n_heads * (size_t)c->head_dim, kvd = (size_t)c->n_kv * (size_t)c->head_dim;
    size_t attn = 6 * qd + 2 * (size_t)c->n_heads + 3 * kvd + (size_t)c->n_kv; /* q, q raw, gate, o, d_o, dq; lse, rstd; k, k raw, v */
    size_t gdn = (size_t)ls_cfg_conv_dim(c) + 2 * (size_t)hc->H_v + 2 * (size_t)ls_cfg_value_dim(c); /* qkv, ba, d_o, d_z */
    return (attn > gdn ? attn : gdn) * sizeof(float);
}

/* One layer of the sweep: the rank's rows (its segments one after another) and the sweep
 * chunks it walks (ls_state_full's, cut in each segment). */
typedef struct {
    const ls_hybrid_model *m;
    ls_hybrid_layer *gw;
    ls_prompt_state *st;       /* as the ops read it (a host state's stage) */
    const ls_prompt_state *hst; /* the state itself: its sweep checkpoints */
    int l;
    int64_t Tr, xoff[LS_STATE_MAX_SEGS];
    int64_t *row;  /* [n_chunks] each chunk's first row */
    int *seg;      /* [n_chunks] its segment (st->seg_*) */
    ls_dec_layer d; /* the skeleton's view of the layer (T set per chunk) */
    ls_arena *ta, *sc;
    ls_arena_mark tm; /* the tape arena as the layer found it: a chunk's tape is released to it */
    /* the chunk at hand: rows [r, r + T), positions from p0; its tape */
    int64_t r, T, p0;
    ls_layer_tape *tp;
    /* attention's per-position buffers [Tr, ..] and the chunk's gated rows */
    float *QR, *QRAW, *RSQ, *GT, *O, *LSE, *DAO, *DQ, *KR, *KRAW, *RSK, *V, *og;
    /* Gated DeltaNet: qkv (then its gradient), ba (then its), d_o, d_z; per chunk G, M */
    float *QKV, *BA, *DO, *DZ, *Gc, *Mc;
    float *o, *z, *on, *grstd, *u; /* the chunk's forward (pass 1) */
} sweep_layer;

/* n floats of a sweep checkpoint (the state's memory: the backend's, or the host's when
 * the state is staged) into dst (the backend's). */
static void ckpt_in(const sweep_layer *S, float *dst, const float *src, int64_t n) {
    const ls_backend *be = S->m->be;
    if (ls_state_resident(S->hst, be)) ls_op_copy(be, dst, src, n);
    else if (n > 0) be->i->to_device(be, dst, src, (size_t)n * sizeof(float));
}

/* The skeleton's parts: the MoE block recorded on the chunk's tape. */
static ls_status part_moe(const ls_dec_layer *d, float *x, const float *xn) {
    sweep_layer *S = d->ctx;
    return ls_hybrid_moe_fwd(S->m, S->l, x, xn, d->T, S->tp, d->ta, d->sc);
}

static ls_status part_moe_bwd(const ls_dec_layer *d, const float *dres, float *dxn) {
    sweep_layer *S = d->ctx;
    return ls_hybrid_moe_bwd(S->m, S->l, S->gw, S->tp, dres, dxn, d->T, d->sc);
}

/* Chunk j of the rank's sweep chunks as the chunk at hand, with a fresh tape. */
static ls_status chunk_begin(sweep_layer *S, int64_t j) {
    const ls_sweep_chunk *ch = &S->st->full->chunks[j];
    S->r = S->row[j], S->T = ch->hi - ch->lo, S->p0 = ch->lo, S->d.T = S->T;
    S->tp = ls_arena_host_calloc(S->ta, 1, sizeof *S->tp);
    NEED(S->tp);
    S->d.tp = &S->tp->dec, S->d.saved = &S->tp->dec;
    return LS_OK;
}

/* The layer on the chunk's rows from its input x (copied: the skeleton writes in place),
 * the FFN and the mixer's part backward from dx (∂L/∂output → ∂L/∂input, the mixer's
 * deferred part not yet in). */
static ls_status chunk_layer(sweep_layer *S, const float *x, float *dx) {
    int64_t D = S->d.D;
    float *xc = ALLOC_F(S->ta, S->T * D);
    NEED(xc);
    ls_op_copy(S->m->be, xc, x + S->r * D, S->T * D);
    LS_TRY(ls_dec_layer_fwd(&S->d, xc, S->l == S->m->cfg.n_layers - 1)); /* the last layer's FFN feeds the head only */
    return ls_dec_layer_bwd(&S->d, dx + S->r * D);
}

/* ---- attention ------------------------------------------------------------------------ */

/* Forward: x += o_proj(O ⊙ σ(gate)) of the chunk's rows (its attention done beforehand). */
static ls_status attn_part(const ls_dec_layer *d, float *x, const float *xn) {
    (void)xn;
    sweep_layer *S = d->ctx;
    const ls_config *c = &S->m->cfg;
    int64_t qd = (int64_t)c->n_heads * c->head_dim;
    S->og = ALLOC_F(S->ta, S->T * qd);
    NEED(S->og);
    return ls_hybrid_attn_out_proj(S->m, &S->m->layers[S->l], S->l, x, S->og, S->O + S->r * qd, S->GT + S->r * qd, S->T,
                                   d->sc);
}

/* Backward from dres: the output projection, the gate (and its projection: dxn +=), the
 * attention over the rank's own earlier pages and the chunk's keys — dq's share into DQ,
 * the pages' dK/dV (+=), the chunk's own keys' dK/dV added at their positions. */
static ls_status attn_part_bwd(const ls_dec_layer *d, const float *dres, float *dxn) {
    sweep_layer *S = d->ctx;
    const ls_hybrid_model *m = S->m;
    const ls_config *c = &m->cfg;
    const ls_hybrid_layer *w = &m->layers[S->l];
    ls_hybrid_layer *gw = S->gw;
    ls_prompt_state *st = S->st;
    const ls_backend *be = m->be;
    int l = S->l, H = c->n_heads, hd = c->head_dim;
    int64_t T = S->T, D = c->hidden, qd = (int64_t)H * hd, kvd = (int64_t)c->n_kv * hd, r = S->r;
    ls_arena_mark mk = ls_arena_get_mark(d->sc);
    float *d_aog = ALLOC_F(d->sc, T * qd), *d_gate = ALLOC_F(d->sc, T * qd);
    float *dk = ALLOC_F(d->sc, T * kvd), *dv = ALLOC_F(d->sc, T * kvd);
    NEED(d_aog && d_gate && dk && dv);
    ls_op_linear_bwd(be, d_aog, gw->attn_out, dres, S->og, w->attn_out, T, qd, D, 0);
    LORA_BWD(m, l, attn_out, 0, D, d_aog, dres, S->og, T, d->sc);
    ls_op_sigmoid_mul_bwd(be, S->DAO + r * qd, d_gate, d_aog, S->O + r * qd, S->GT + r * qd, T * qd);
    ls_layer_dstate *ds = &st->full->d[l];
    int64_t n = st->n;
    st->n = S->p0;
    ls_kv_prefix pre = ls_state_prefix(st, l);
    st->n = n;
    LS_TRY(ls_op_attn_bwd(be, S->DQ + r * qd, dk, dv, ds->dk, ds->dv, S->DAO + r * qd, S->O + r * qd, S->LSE + r * H,
                          S->QR + r * qd, S->KR + r * kvd, S->V + r * kvd, &pre, T, H, c->n_kv, hd,
                          1.0f / sqrtf((float)hd), d->sc));
    for (int64_t t = 0; t < T; t++) { /* the chunk's own keys are pages too: later queries add there */
        int64_t lp = ls_state_local_page(st, S->p0 + t), off = ((S->p0 + t) % st->page_size) * kvd;
        LS_ASSERT(lp >= 0, "sweep position %lld is not this rank's", (long long)(S->p0 + t));
        ls_op_add_to(be, (float *)ds->dk[lp] + off, dk + t * kvd, kvd);
        ls_op_add_to(be, (float *)ds->dv[lp] + off, dv + t * kvd, kvd);
    }
    ls_op_linear_bwd(be, dxn, GOFF(gw->attn_in, qd * D), d_gate, S->tp->dec.xn1, w->attn_in + qd * D, T, D, qd, 1);
    LORA_BWD(m, l, attn_in, qd, qd, dxn, d_gate, S->tp->dec.xn1, T, d->sc);
    ls_arena_release(d->sc, mk);
    return LS_OK;
}

/* What a gathered block's backward needs. */
typedef struct {
    sweep_layer *S;
    float *dqb; /* a query chunk's share over the block */
    int64_t C;
} grad_ctx;

/* Another rank's earlier block: the share of dq of every later row of this rank (DQ +=)
 * and the block's dK/dV (dk/dv +=, sent back to its holder by the gather). */
static ls_status grad_block(void *ctx, int seg, void *const *kp, void *const *vp, float *const *dk, float *const *dv,
                            int64_t nb, int64_t rows, int64_t row0) {
    (void)nb, (void)row0;
    grad_ctx *G = ctx;
    sweep_layer *S = G->S;
    const ls_config *c = &S->m->cfg;
    const ls_prompt_state *st = S->st;
    int H = c->n_heads, hd = c->head_dim;
    int64_t qd = (int64_t)H * hd, lo, hi;
    int owner;
    ls_state_segment(st, seg, &owner, &lo, &hi);
    ls_kv_prefix blk = {rows, st->page_size, st->dtype, kp, vp};
    for (int k = 0; k < st->nseg; k++) {
        if (st->seg_lo[k] < hi) continue; /* not after the block's segment */
        int64_t e = S->xoff[k] + st->seg_hi[k] - st->seg_lo[k];
        for (int64_t r = S->xoff[k], T; r < e; r += T) {
            T = e - r < G->C ? e - r : G->C;
            LS_TRY(ls_op_attn_prefix_bwd(S->m->be, G->dqb, (void *const *)dk, (void *const *)dv, S->DAO + r * qd,
                                         S->O + r * qd, S->LSE + r * H, S->QR + r * qd, &blk, T, H, c->n_kv, hd,
                                         1.0f / sqrtf((float)hd), S->sc));
            ls_op_add_to(S->m->be, S->DQ + r * qd, G->dqb, T * qd);
        }
    }
    return LS_OK;
}

static ls_status sweep_attn(sweep_layer *S, const float *X, float *dX, const ls_fwd_opts *o) {
    const ls_hybrid_model *m = S->m;
    const ls_config *c = &m->cfg;
    const ls_hybrid_layer *w = &m->layers[S->l];
    ls_hybrid_layer *gw = S->gw;
    ls_prompt_state *st = S->st;
    const ls_backend *be = m->be;
    int l = S->l, H = c->n_heads, Hk = c->n_kv, hd = c->head_dim;
    int64_t D = c->hidden, qd = (int64_t)H * hd, kvd = (int64_t)Hk * hd, Tr = S->Tr > 0 ? S->Tr : 1;
    int64_t nck = st->full->n_chunks, C = o->capture_chunk > 0 ? o->capture_chunk : 2048, n0 = st->n;
    float scale = 1.0f / sqrtf((float)hd);
    S->QR = ALLOC_F(S->sc, Tr * qd), S->QRAW = ALLOC_F(S->sc, Tr * qd), S->GT = ALLOC_F(S->sc, Tr * qd);
    S->O = ALLOC_F(S->sc, Tr * qd), S->DAO = ALLOC_F(S->sc, Tr * qd), S->DQ = ALLOC_F(S->sc, Tr * qd);
    S->RSQ = ALLOC_F(S->sc, Tr * H), S->LSE = ALLOC_F(S->sc, Tr * H);
    S->KR = ALLOC_F(S->sc, Tr * kvd), S->KRAW = ALLOC_F(S->sc, Tr * kvd), S->V = ALLOC_F(S->sc, Tr * kvd);
    S->RSK = ALLOC_F(S->sc, Tr * Hk);
    NEED(S->QR && S->QRAW && S->GT && S->O && S->DAO && S->DQ && S->RSQ && S->LSE && S->KR && S->KRAW && S->V && S->RSK);
    /* 1. the forward as the capture runs it: projections, the own pages and keys */
    for (int64_t j = 0; j < nck; j++) {
        LS_TRY(chunk_begin(S, j));
        int64_t r = S->r, T = S->T;
        ls_arena_mark mk = ls_arena_get_mark(S->sc);
        float *xn = ALLOC_F(S->sc, T * D);
        NEED(xn);
        ls_dec_norm1_fwd(&S->d, xn, X + r * D);
        LS_TRY(ls_hybrid_attn_q_proj(m, w, l, xn, T, S->QRAW + r * qd, S->GT + r * qd, S->QR + r * qd, S->RSQ + r * H,
                                     S->sc));
        LS_TRY(ls_hybrid_attn_kv_proj(m, w, l, xn, T, S->KRAW + r * kvd, S->V + r * kvd, S->KR + r * kvd,
                                      S->RSK + r * Hk, S->sc));
        ls_op_rope_fwd(be, S->QR + r * qd, T, H, hd, c->rot_dim, c->rope_theta, S->p0);
        ls_op_rope_fwd(be, S->KR + r * kvd, T, Hk, hd, c->rot_dim, c->rope_theta, S->p0);
        st->n = S->p0;
        ls_kv_prefix pre = ls_state_prefix(st, l);
        st->n = n0;
        LS_TRY(ls_op_attn_fwd(be, S->O + r * qd, S->LSE + r * H, S->QR + r * qd, S->KR + r * kvd, S->V + r * kvd, &pre,
                              T, H, Hk, hd, scale, S->sc));
        ls_arena_release(S->sc, mk);
        ls_arena_release(S->ta, S->tm);
    }
    /* 2. the other ranks' earlier pages, merged */
    ls_dist_segs segs;
    LS_TRY(ls_dec_cp_segs(st, l, 1, S->sc, &segs, NULL));
    void ***dkt = ls_arena_host_alloc(S->sc, 2 * (size_t)segs.n * sizeof(void **)), ***dvt = dkt ? dkt + segs.n : NULL;
    NEED(dkt);
    for (int sg = 0; sg < segs.n; sg++) { /* own segments' gradient tables, at their page offset */
        dkt[sg] = segs.k[sg] ? st->full->d[l].dk + (segs.k[sg] - st->attn[l].k_pages) : NULL;
        dvt[sg] = segs.k[sg] ? st->full->d[l].dv + (segs.k[sg] - st->attn[l].k_pages) : NULL;
    }
    segs.dk = dkt, segs.dv = dvt;
    int64_t Cq = C < Tr ? C : Tr, bp = ls_hybrid_cp_block(st, o);
    ls_hybrid_gather gc = {m, st, S->QR, S->O, S->LSE, ALLOC_F(S->sc, Cq * qd), ALLOC_F(S->sc, Cq * H), S->xoff, Cq, 0,
                           S->Tr, S->sc};
    NEED(gc.ob && gc.lb);
    size_t pb = (size_t)st->page_size * (size_t)kvd * ls_dtype_size(st->dtype);
    LS_TRY(ls_dist_pages_gather(be, st->comm, &segs, st->page_size, pb, pb, bp, l, ls_hybrid_gather_block, &gc, S->sc));
    /* 3. per chunk: the layer's second half and its backward, the gate, the own attention */
    for (int64_t j = 0; j < nck; j++) {
        LS_TRY(chunk_begin(S, j));
        LS_TRY(chunk_layer(S, X, dX));
        ls_arena_release(S->ta, S->tm);
    }
    /* 4. the gathered blocks again: dq's share, their dK/dV back to their holders */
    grad_ctx G = {S, gc.ob, Cq};
    LS_TRY(ls_dist_pages_gather_grad(be, st->comm, &segs, st->page_size, pb, pb, st->page_size * kvd,
                                     st->page_size * kvd, bp, l, grad_block,
                                     &G, S->sc));
    /* 5. per chunk, every share in: the queries' and keys' backward, the projections */
    ls_layer_dstate *ds = &st->full->d[l];
    for (int64_t j = 0; j < nck; j++) {
        LS_TRY(chunk_begin(S, j));
        int64_t r = S->r, T = S->T;
        ls_arena_mark mk = ls_arena_get_mark(S->sc);
        float *xn = ALLOC_F(S->sc, T * D), *dxn = CALLOC_F(S->sc, T * D);
        float *dq = S->DQ + r * qd, *dk = ALLOC_F(S->sc, T * kvd), *dv = ALLOC_F(S->sc, T * kvd);
        NEED(xn && dxn && dk && dv);
        for (int64_t t = 0; t < T; t++) { /* every query's share of the chunk's keys and values */
            int64_t lp = ls_state_local_page(st, S->p0 + t), off = ((S->p0 + t) % st->page_size) * kvd;
            ls_op_copy(be, dk + t * kvd, (const float *)ds->dk[lp] + off, kvd);
            ls_op_copy(be, dv + t * kvd, (const float *)ds->dv[lp] + off, kvd);
        }
        ls_op_rope_bwd(be, dq, T, H, hd, c->rot_dim, c->rope_theta, S->p0);
        ls_op_rope_bwd(be, dk, T, Hk, hd, c->rot_dim, c->rope_theta, S->p0);
        ls_op_rmsnorm_bwd(be, dq, gw->q_norm, dq, S->QRAW + r * qd, S->RSQ + r * H, w->q_norm, T * H, hd);
        ls_op_rmsnorm_bwd(be, dk, gw->k_norm, dk, S->KRAW + r * kvd, S->RSK + r * Hk, w->k_norm, T * Hk, hd);
        ls_dec_norm1_fwd(&S->d, xn, X + r * D);
        ls_op_linear_bwd(be, dxn, gw->attn_in, dq, xn, w->attn_in, T, D, qd, 1);
        ls_op_linear_bwd(be, dxn, GOFF(gw->attn_in, 2 * qd * D), dk, xn, w->attn_in + 2 * qd * D, T, D, kvd, 1);
        ls_op_linear_bwd(be, dxn, GOFF(gw->attn_in, (2 * qd + kvd) * D), dv, xn, w->attn_in + (2 * qd + kvd) * D, T, D,
                         kvd, 1);
        LORA_BWD(m, l, attn_in, 0, qd, dxn, dq, xn, T, S->sc);
        LORA_BWD(m, l, attn_in, 2 * qd, kvd, dxn, dk, xn, T, S->sc);
        LORA_BWD(m, l, attn_in, 2 * qd + kvd, kvd, dxn, dv, xn, T, S->sc);
        LS_TRY(ls_dec_norm1_bwd(&S->d, dX + r * D, dxn, X + r * D));
        ls_arena_release(S->sc, mk);
        ls_arena_release(S->ta, S->tm);
    }
    return LS_OK;
}

/* ---- Gated DeltaNet ------------------------------------------------------------------- */

/* Forward of pass 1 from the chunk's checkpoint (the true state): projections (qkv and ba
 * kept for pass 2), conv, the recurrence and the identity run (u, the chunk's M), the
 * gated norm and the output projection: x +=. */
static ls_status gdn_part(const ls_dec_layer *d, float *x, const float *xn) {
    sweep_layer *S = d->ctx;
    const ls_hybrid_model *m = S->m;
    const ls_config *c = &m->cfg;
    const ls_hybrid_config *hc = ls_hybrid_cfg(c);
    const ls_hybrid_layer *w = &m->layers[S->l];
    const ls_backend *be = m->be;
    int64_t T = S->T, r = S->r, kd = ls_cfg_key_dim(c), vd = ls_cfg_value_dim(c), cd = ls_cfg_conv_dim(c);
    int64_t Hv = hc->H_v, dk = hc->d_k, sn = Hv * dk * hc->d_v, mn = Hv * dk * dk, tl = (hc->conv_k - 1) * cd;
    ls_gdr_dims gd = {hc->H_k, hc->H_v, hc->d_k, hc->d_v, 1.0f / sqrtf((float)hc->d_k)}, gi = gd;
    gi.d_v = gd.d_k;
    int64_t j = ls_state_ckpt_at(S->st, S->p0);
    LS_ASSERT(j >= 0, "no sweep checkpoint at %lld", (long long)S->p0);
    const ls_gdn_state *ck = &S->hst->full->ckpt[j * c->n_layers + S->l];
    ls_arena *A = S->ta;
    S->o = ALLOC_F(A, T * vd), S->z = ALLOC_F(A, T * vd), S->on = ALLOC_F(A, T * vd), S->grstd = ALLOC_F(A, T * Hv);
    S->u = ALLOC_F(A, T * Hv * dk);
    NEED(S->o && S->z && S->on && S->grstd && S->u);
    ls_arena_mark mk = ls_arena_get_mark(d->sc);
    float *y = ALLOC_F(d->sc, T * cd), *q = ALLOC_F(d->sc, T * kd), *k = ALLOC_F(d->sc, T * kd);
    float *v = ALLOC_F(d->sc, T * vd), *beta = ALLOC_F(d->sc, T * Hv), *g = ALLOC_F(d->sc, T * Hv);
    float *tail = ALLOC_F(d->sc, tl > 0 ? tl : 1), *Sst = ALLOC_F(d->sc, sn);
    float *zv = CALLOC_F(d->sc, T * Hv * dk), *M = S->Mc + j * mn;
    NEED(y && q && k && v && beta && g && tail && Sst && zv);
    float *qkv = S->QKV + r * cd, *ba = S->BA + r * 2 * Hv;
    LS_TRY(ls_hybrid_gdn_in_proj(m, w, S->l, xn, T, qkv, S->z, ba, d->sc));
    ckpt_in(S, tail, ck->conv_tail, tl);
    ls_op_conv_fwd(be, y, NULL, tail, qkv, w->conv_w, T, cd, hc->conv_k);
    ls_op_gdn_prep_fwd(be, q, k, v, beta, g, NULL, NULL, y, ba, w->A_log, w->dt_bias, T, gd);
    ckpt_in(S, Sst, ck->S, sn);
    LS_TRY(ls_op_gdr_chunk_fwd(be, S->o, NULL, Sst, q, k, v, beta, g, T, gd, d->sc));
    /* the identity run: M (the chunk's transition) and u */
    float *eye = ls_host_view(be, d->sc, M, (size_t)mn * sizeof(float), 0);
    NEED(eye);
    memset(eye, 0, (size_t)mn * sizeof(float));
    for (int64_t h = 0; h < Hv; h++)
        for (int64_t i = 0; i < dk; i++) eye[(h * dk + i) * dk + i] = 1.0f;
    ls_host_view_done(be, d->sc, M, eye, (size_t)mn * sizeof(float), 1);
    LS_TRY(ls_op_gdr_chunk_fwd(be, S->u, NULL, M, q, k, zv, beta, g, T, gi, d->sc));
    LS_TRY(ls_hybrid_gdn_out_proj(m, w, S->l, x, S->on, S->grstd, S->o, S->z, T, d->sc));
    ls_arena_release(d->sc, mk);
    return LS_OK;
}

/* Its backward to the outputs' gradient: d_o and d_z kept, the chunk's G = Σ u d_oᵀ. */
static ls_status gdn_part_bwd(const ls_dec_layer *d, const float *dres, float *dxn) {
    (void)dxn; /* the input side is pass 2's */
    sweep_layer *S = d->ctx;
    const ls_hybrid_model *m = S->m;
    const ls_config *c = &m->cfg;
    const ls_hybrid_config *hc = ls_hybrid_cfg(c);
    const ls_hybrid_layer *w = &m->layers[S->l];
    const ls_backend *be = m->be;
    int64_t T = S->T, r = S->r, D = c->hidden, vd = ls_cfg_value_dim(c), Hv = hc->H_v, dk = hc->d_k, dv = hc->d_v;
    ls_arena_mark mk = ls_arena_get_mark(d->sc);
    float *d_on = ALLOC_F(d->sc, T * vd);
    NEED(d_on);
    ls_op_linear_bwd(be, d_on, S->gw->gdn_out, dres, S->on, w->gdn_out, T, vd, D, 0);
    LORA_BWD(m, S->l, gdn_out, 0, D, d_on, dres, S->on, T, d->sc);
    float *d_o = S->DO + r * vd;
    ls_op_gated_rmsnorm_bwd(be, d_o, S->DZ + r * vd, S->gw->gnorm, d_on, S->o, S->z, S->grstd, w->gnorm, T * Hv, dv);
    int64_t j = ls_state_ckpt_at(S->st, S->p0);
    float *G = S->Gc + j * Hv * dk * dv;
    for (int64_t h = 0; h < Hv; h++) /* G[h] = Σ_t u[t, h]ᵀ d_o[t, h]  ([d_k, T] × [T, d_v]) */
        ls_op_gemm(be, 1, 0, dk, dv, T, 1.0f, S->u + h * dk, Hv * dk, d_o + h * dv, Hv * dv, 0.0f, G + h * dk * dv, dv);
    ls_arena_release(d->sc, mk);
    return LS_OK;
}

/* dS_in = G + Mᵀ dS_out per value head (in place into G; dS_out, M unchanged). */
static void transpose_apply(const ls_backend *be, float *G, const float *M, const float *dS_out, ls_gdr_dims gd) {
    int64_t dk = gd.d_k, dv = gd.d_v;
    for (int64_t h = 0; h < gd.H_v; h++)
        ls_op_gemm(be, 1, 0, dk, dv, dk, 1.0f, M + h * dk * dk, dk, dS_out + h * dk * dv, dv, 1.0f, G + h * dk * dv, dv);
}

static ls_status sweep_gdn(sweep_layer *S, const float *X, float *dX) {
    const ls_hybrid_model *m = S->m;
    const ls_config *c = &m->cfg;
    const ls_hybrid_config *hc = ls_hybrid_cfg(c);
    const ls_hybrid_layer *w = &m->layers[S->l];
    ls_hybrid_layer *gw = S->gw;
    ls_prompt_state *st = S->st;
    const ls_backend *be = m->be;
    int l = S->l, L_ = c->n_layers;
    int64_t D = c->hidden, kd = ls_cfg_key_dim(c), vd = ls_cfg_value_dim(c), cd = ls_cfg_conv_dim(c);
    int64_t Hv = hc->H_v, dk = hc->d_k, dv = hc->d_v, Wm = hc->conv_k - 1, Tr = S->Tr > 0 ? S->Tr : 1;
    int64_t sn = Hv * dk * dv, mn = Hv * dk * dk, tl = Wm * cd > 0 ? Wm * cd : 1, nck = st->full->n_chunks;
    ls_gdr_dims gd = {hc->H_k, hc->H_v, hc->d_k, hc->d_v, 1.0f / sqrtf((float)hc->d_k)};
    ls_layer_dstate *ds = &st->full->d[l];
    int nseg = ls_state_segments(st);
    S->QKV = ALLOC_F(S->sc, Tr * cd), S->BA = ALLOC_F(S->sc, Tr * 2 * Hv);
    S->DO = ALLOC_F(S->sc, Tr * vd), S->DZ = ALLOC_F(S->sc, Tr * vd);
    S->Gc = ALLOC_F(S->sc, (nck > 0 ? nck : 1) * sn), S->Mc = ALLOC_F(S->sc, (nck > 0 ? nck : 1) * mn);
    float *Gs = ALLOC_F(S->sc, nseg * sn), *Ms = ALLOC_F(S->sc, nseg * mn), *dSo = ALLOC_F(S->sc, nseg * sn);
    float *DT = CALLOC_F(S->sc, nseg * tl), *tmp = ALLOC_F(S->sc, mn > sn ? mn : sn);
    int64_t *lo = ls_arena_host_alloc(S->sc, 2 * (size_t)nseg * sizeof(int64_t));
    int *own = ls_arena_host_alloc(S->sc, (size_t)nseg * sizeof(int)), *gseg = ls_arena_host_alloc(S->sc, LS_STATE_MAX_SEGS * sizeof(int));
    NEED(S->QKV && S->BA && S->DO && S->DZ && S->Gc && S->Mc && Gs && Ms && dSo && DT && tmp && lo && own && gseg);
    int64_t *hi = lo + nseg;
    for (int sg = 0; sg < nseg; sg++) ls_state_segment(st, sg, &own[sg], &lo[sg], &hi[sg]);
    for (int k = 0; k < st->nseg; k++) { /* each own segment's index among all */
        gseg[k] = -1;
        for (int sg = 0; sg < nseg; sg++)
            if (own[sg] == st->rank && lo[sg] == st->seg_lo[k] && hi[sg] == st->seg_hi[k]) gseg[k] = sg;
        LS_ASSERT(gseg[k] >= 0, "rank %d: segment [%lld, %lld) not in the layout", st->rank, (long long)st->seg_lo[k],
                  (long long)st->seg_hi[k]);
    }
    /* 1. pass 1 per chunk: the layer from its checkpoint, backward to d_o; G and M */
    for (int64_t j = 0; j < nck; j++) {
        LS_TRY(chunk_begin(S, j));
        LS_TRY(chunk_layer(S, X, dX));
        ls_arena_release(S->ta, S->tm);
    }
    /* 2. the transposed scan: each own segment's (G, M) from its chunks, last to first */
    for (int k = 0; k < st->nseg; k++) {
        int sg = gseg[k];
        int first = 1;
        for (int64_t j = nck - 1; j >= 0; j--) {
            if (S->seg[j] != k) continue;
            float *G = Gs + sg * sn, *M = Ms + sg * mn;
            if (first) { /* the last chunk: its own */
                ls_op_copy(be, G, S->Gc + j * sn, sn);
                ls_op_copy(be, M, S->Mc + j * mn, mn);
                first = 0;
                continue;
            }
            /* prepend chunk j: G = G_j + M_jᵀ G; M = M · M_j */
            ls_op_copy(be, tmp, G, sn);
            ls_op_copy(be, G, S->Gc + j * sn, sn);
            transpose_apply(be, G, S->Mc + j * mn, tmp, gd);
            ls_op_copy(be, tmp, M, mn);
            for (int64_t h = 0; h < Hv; h++)
                ls_op_gemm(be, 0, 0, dk, dk, dk, 1.0f, tmp + h * dk * dk, dk, S->Mc + j * mn + h * dk * dk, dk, 0.0f,
                           M + h * dk * dk, dk);
        }
    }
    ls_status s = LS_OK;
    for (int sg = 0; sg < nseg && s == LS_OK; sg++) {
        if (hi[sg] == lo[sg]) continue;
        ls_dist_part parts[2] = {{Gs + sg * sn, (size_t)sn * sizeof(float)}, {Ms + sg * mn, (size_t)mn * sizeof(float)}};
        s = ls_dist_bcast_parts(be, st->comm, parts, 2, own[sg]);
    }
    if (s != LS_OK) return s;
    /* dSo[sg]: the gradient of the state segment sg ends with (the last: the branches') */
    ls_op_copy(be, dSo + (nseg - 1) * sn, ds->dS, sn);
    for (int sg = nseg - 1; sg > 0; sg--) {
        float *to = dSo + (sg - 1) * sn;
        if (hi[sg] == lo[sg]) {
            ls_op_copy(be, to, dSo + sg * sn, sn);
            continue;
        }
        ls_op_copy(be, to, Gs + sg * sn, sn);
        transpose_apply(be, to, Ms + sg * mn, dSo + sg * sn, gd);
    }
    /* 3. pass 2 per own segment, chunks last to first: the recurrence's backward from the
     * true d(state), prep and conv; qkv's and ba's rows turn into their gradients */
    for (int k = 0; k < st->nseg; k++) {
        int sg = gseg[k];
        ls_arena_mark mk = ls_arena_get_mark(S->sc);
        float *dST = ALLOC_F(S->sc, sn), *dtl = CALLOC_F(S->sc, tl);
        NEED(dST && dtl);
        ls_op_copy(be, dST, dSo + sg * sn, sn);
        for (int64_t j = nck - 1; j >= 0; j--) {
            if (S->seg[j] != k) continue;
            LS_TRY(chunk_begin(S, j));
            int64_t r = S->r, T = S->T;
            const ls_gdn_state *ck = &S->hst->full->ckpt[j * L_ + l];
            ls_arena *A = S->ta;
            float *cpre = ALLOC_F(A, T * cd), *y = ALLOC_F(A, T * cd), *q = ALLOC_F(A, T * kd), *kk = ALLOC_F(A, T * kd);
            float *v = ALLOC_F(A, T * vd), *beta = ALLOC_F(A, T * Hv), *g = ALLOC_F(A, T * Hv);
            float *rq = ALLOC_F(A, T * hc->H_k), *rk = ALLOC_F(A, T * hc->H_k), *o = ALLOC_F(A, T * vd);
            float *tail0 = ALLOC_F(A, tl), *tail = ALLOC_F(A, tl), *Sst = ALLOC_F(A, sn);
            float *tape_h = ALLOC_F(A, ((T + 63) / 64) * sn);
            float *dq = CALLOC_F(A, T * kd), *dkk = CALLOC_F(A, T * kd), *dvv = CALLOC_F(A, T * vd);
            float *dbeta = CALLOC_F(A, T * Hv), *dg = CALLOC_F(A, T * Hv), *dy = ALLOC_F(A, T * cd);
            float *dqkv = CALLOC_F(A, T * cd), *dba = ALLOC_F(A, T * 2 * Hv), *dS0 = ALLOC_F(A, sn), *dtail0 = ALLOC_F(A, tl);
            NEED(cpre && y && q && kk && v && beta && g && rq && rk && o && tail0 && tail && Sst && tape_h && dq && dkk &&
                 dvv && dbeta && dg && dy && dqkv && dba && dS0 && dtail0);
            float *qkv = S->QKV + r * cd, *ba = S->BA + r * 2 * Hv;
            ckpt_in(S, tail0, ck->conv_tail, Wm * cd);
            ls_op_copy(be, tail, tail0, Wm * cd);
            ls_op_conv_fwd(be, y, cpre, tail, qkv, w->conv_w, T, cd, hc->conv_k);
            ls_op_gdn_prep_fwd(be, q, kk, v, beta, g, rq, rk, y, ba, w->A_log, w->dt_bias, T, gd);
            ckpt_in(S, Sst, ck->S, sn);
            LS_TRY(ls_op_gdr_chunk_fwd(be, o, tape_h, Sst, q, kk, v, beta, g, T, gd, S->sc));
            LS_TRY(ls_op_gdr_chunk_bwd(be, dq, dkk, dvv, dbeta, dg, dS0, S->DO + r * vd, dST, tape_h, q, kk, v, beta, g, T,
                                       gd, S->sc));
            ls_op_gdn_prep_bwd(be, dy, dba, gw->A_log, gw->dt_bias, dq, dkk, dvv, dbeta, dg, y, rq, rk, ba, beta, g,
                               w->A_log, w->dt_bias, T, gd);
            ls_op_conv_bwd(be, dqkv, gw->conv_w, dtail0, dy, cpre, qkv, tail0, w->conv_w, T, cd, hc->conv_k);
            /* the conv tail the chunk ended with is the last W−1 rows of [tail0; qkv] */
            for (int64_t i = 0; i < Wm; i++) {
                int64_t row = T + i;
                float *to = row >= Wm ? dqkv + (row - Wm) * cd : dtail0 + row * cd;
                ls_op_add_to(be, to, dtl + i * cd, cd);
            }
            ls_op_copy(be, qkv, dqkv, T * cd); /* the rows are done with: their gradient from here */
            ls_op_copy(be, ba, dba, T * 2 * Hv);
            ls_op_copy(be, dST, dS0, sn);
            ls_op_copy(be, dtl, dtail0, Wm * cd);
            ls_arena_release(S->ta, S->tm);
        }
        ls_op_copy(be, DT + sg * tl, dtl, Wm * cd); /* the rows before the segment: its owner's, below */
        ls_arena_release(S->sc, mk);
    }
    /* 4. the rows before each segment: their gradient to their holders */
    for (int sg = 0; sg < nseg && s == LS_OK && Wm > 0; sg++) {
        if (hi[sg] == lo[sg]) continue;
        ls_dist_part part = {DT + sg * tl, (size_t)(Wm * cd) * sizeof(float)};
        s = ls_dist_bcast_parts(be, st->comm, &part, 1, own[sg]);
    }
    if (s != LS_OK) return s;
    /* (a pre-conv row's gradient feeds its input projection only: added by position, and the
     * branches' gradient of the prompt's last rows, the conv tail at its end, likewise) */
    for (int sg = 0; sg <= nseg; sg++) {
        if (sg < nseg && hi[sg] == lo[sg]) continue;
        int64_t at = sg < nseg ? lo[sg] : st->n;
        const float *dt = sg < nseg ? DT + sg * tl : ds->dtail;
        for (int64_t i = 0; i < Wm; i++) { /* row i: position at − Wm + i */
            int64_t p = at - Wm + i;
            for (int k = 0; k < st->nseg && p >= 0; k++)
                if (p >= st->seg_lo[k] && p < st->seg_hi[k])
                    ls_op_add_to(be, S->QKV + (S->xoff[k] + p - st->seg_lo[k]) * cd, dt + i * cd, cd);
        }
    }
    /* 5. per chunk: the input projections' backward, the first norm's */
    for (int64_t j = 0; j < nck; j++) {
        LS_TRY(chunk_begin(S, j));
        int64_t r = S->r, T = S->T;
        ls_arena_mark mk = ls_arena_get_mark(S->sc);
        float *xn = ALLOC_F(S->sc, T * D), *dxn = CALLOC_F(S->sc, T * D);
        NEED(xn && dxn);
        float *dqkv = S->QKV + r * cd, *dz = S->DZ + r * vd, *dba = S->BA + r * 2 * Hv;
        ls_dec_norm1_fwd(&S->d, xn, X + r * D);
        ls_op_linear_bwd(be, dxn, gw->gdn_in, dqkv, xn, w->gdn_in, T, D, cd, 1);
        ls_op_linear_bwd(be, dxn, GOFF(gw->gdn_in, cd * D), dz, xn, w->gdn_in + cd * D, T, D, vd, 1);
        ls_op_linear_bwd(be, dxn, GOFF(gw->gdn_in, (cd + vd) * D), dba, xn, w->gdn_in + (cd + vd) * D, T, D, 2 * Hv, 1);
        LORA_BWD(m, l, gdn_in, 0, cd, dxn, dqkv, xn, T, S->sc);
        LORA_BWD(m, l, gdn_in, cd, vd, dxn, dz, xn, T, S->sc);
        LORA_BWD(m, l, gdn_in, cd + vd, 2 * Hv, dxn, dba, xn, T, S->sc);
        LS_TRY(ls_dec_norm1_bwd(&S->d, dX + r * D, dxn, X + r * D));
        ls_arena_release(S->sc, mk);
        ls_arena_release(S->ta, S->tm);
    }
    return LS_OK;
}

ls_status ls_hybrid_cp_sweep_layer(const ls_dec_model *dm, const ls_dec_grad *g, ls_prompt_state *st,
                                   const ls_prompt_state *hst, int l, const float *x, float *dx, const ls_fwd_opts *o,
                                   ls_arena *ta, ls_arena *sc) {
    const ls_hybrid_model *m = dm->fam;
    const ls_config *c = &m->cfg;
    const ls_hybrid_layer *w = &m->layers[l];
    ls_hybrid_layer *gw = &((ls_hybrid_model *)g->fam)->layers[l];
    ls_arena_mark mk = ls_arena_get_mark(sc), tm = ls_arena_get_mark(ta);
    int gdn = c->kind[l] == LS_LAYER_GDN;
    sweep_layer S = {.m = m, .gw = gw, .st = st, .hst = hst, .l = l, .ta = ta, .sc = sc, .tm = tm};
    int64_t nck = st->full->n_chunks;
    for (int k = 0; k < st->nseg; k++) S.xoff[k] = S.Tr, S.Tr += st->seg_hi[k] - st->seg_lo[k];
    S.row = ls_arena_host_alloc(sc, (size_t)(nck > 0 ? nck : 1) * sizeof(int64_t));
    S.seg = ls_arena_host_alloc(sc, (size_t)(nck > 0 ? nck : 1) * sizeof(int));
    NEED(S.row && S.seg);
    for (int64_t j = 0; j < nck; j++) {
        int64_t p = st->full->chunks[j].lo;
        S.seg[j] = -1;
        for (int k = 0; k < st->nseg; k++)
            if (p >= st->seg_lo[k] && p < st->seg_hi[k]) S.seg[j] = k, S.row[j] = S.xoff[k] + p - st->seg_lo[k];
        LS_ASSERT(S.seg[j] >= 0, "sweep chunk at %lld outside rank %d's segments", (long long)p, st->rank);
    }
    S.d = (ls_dec_layer){.be = m->be, .D = c->hidden, .I = c->intermediate, .eps = c->eps,
                         .norm = LS_NORM_ZERO_CENTRED, .input_norm = w->input_norm, .post_norm = w->post_norm,
                         .d_input_norm = gw->input_norm, .d_post_norm = gw->post_norm,
                         .mixer = gdn ? gdn_part : attn_part, .mixer_bwd = gdn ? gdn_part_bwd : attn_part_bwd,
                         .moe = c->moe[l] ? part_moe : NULL, .moe_bwd = c->moe[l] ? part_moe_bwd : NULL,
                         .gu_w = w->mlp_gu, .down_w = w->mlp_down, .dgu_w = gw->mlp_gu, .ddown_w = gw->mlp_down,
                         .lora = ffn_of(m, l, offsetof(ls_hybrid_layer, mlp_gu), offsetof(ls_hybrid_layer, mlp_down), 0, 0),
                         .ta = ta, .sc = sc, .ctx = &S};
    ls_status s = gdn ? sweep_gdn(&S, x, dx) : sweep_attn(&S, x, dx, o);
    ls_arena_release(ta, tm);
    ls_arena_release(sc, mk);
    return s;
}
