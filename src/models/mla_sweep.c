/*
 * mla_sweep.c — the MLA family's full-mode sweep under context parallelism, layer-major
 * (issue 22; decoder.h's cp_sweep_layer; the hybrid's is hybrid_sweep.c). Every rank runs
 * layer l's backward over all of its positions, from the layer inputs the CP capture kept,
 * l from the top; what crosses ranks moves in the capture's rounds, transposed:
 *  - the selection of the layer's full indexer layer (a shared layer's is the full layer
 *    below it) is recomputed exactly as the capture made it — own index keys, the other
 *    ranks' earlier ones gathered into one page table, each chunk's top-k — and kept for
 *    the rank's positions while the layers sharing it run;
 *  - in waves of the rank's positions (ls_cp_waves, --cp-wave; every rank makes as many):
 *    the absorbed queries, the attention over the selected rows the rank holds, the other
 *    ranks' latent rows gathered and merged (ls_mla_gather_latent); per chunk the layer's
 *    second half and its backward down to ∂L/∂ō, the attention's backward over the own
 *    rows (their gradient into the dState pages); the gathered rows again with gradients
 *    (ls_dist_pages_gather_grad: each block's gradient back to its holder); the query
 *    path's backward;
 *  - after the last wave, with every query's share in the dState pages, the latent rows'
 *    backward of the rank's positions.
 * The first norm's backward takes the two parts of the mixer's input gradient apart
 * (ls_dec_norm1_bwd). The layer's parameter gradients are the rank's positions' share.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "longstraw/cp.h"
#include "longstraw/kernels.h"
#include "mla_tape.h"

#define ALLOC_F(arena, n) ((float *)ls_arena_alloc((arena), (size_t)(n) * sizeof(float)))
#define CALLOC_F(arena, n) ((float *)ls_arena_calloc((arena), (size_t)(n), sizeof(float)))
#define NEED(p)                        \
    do {                               \
        if (!(p)) return LS_ERR_NOMEM; \
    } while (0)

/* Nothing is kept for all of the rank's positions beyond what the capture keeps (the
 * selection): the per-position buffers come in waves. */
size_t ls_mla_cp_sweep_bytes(const ls_config *c) {
    (void)c;
    return 0;
}

/* What one of a wave's positions keeps: absorbed queries and their gradient, the attention
 * output, its lse and its gradient, the query path's q, c_q before and after its norm. */
size_t ls_mla_cp_sweep_wave_bytes(const ls_config *c) {
    const ls_mla_config *mc = ls_mla_cfg(c);
    size_t H = (size_t)c->n_heads, rkv = (size_t)mc->kv_lora_rank, dk = rkv + (size_t)mc->qk_rope;
    size_t dq = (size_t)mc->qk_nope + (size_t)mc->qk_rope, rq = (size_t)mc->q_lora_rank;
    return (2 * H * dk + 2 * H * rkv + H + H * dq + 2 * rq + 1) * sizeof(float);
}

typedef struct {
    const ls_mla_model *m;
    ls_mla_layer *gw;
    ls_prompt_state *st;
    int l;
    int64_t r, T, p0, w0;  /* the chunk at hand: rows [r, r + T) from position p0; the wave's first row */
    mla_layer_tape *tp;
    float *Q, *O, *LSE, *DOB, *DQA, *QF, *CQ, *CQRAW, *RSQ; /* the wave's rows */
    float *ov;
    const int32_t *hsel;   /* [rows, kk] the rank's selection (host-readable) */
    int32_t *loc, *hloc;   /* [Cq, kk] a query chunk's selection as local rows */
    int64_t kk, Cq;
    ls_kv_prefix pre;      /* the rank's pages of the layer (all of its positions) */
    ls_arena *sc;
} msweep;

static ls_status part_moe(const ls_dec_layer *d, float *x, const float *xn) {
    msweep *S = d->ctx;
    return ls_mla_moe_fwd(S->m, S->l, x, xn, d->T, S->tp, d->ta, d->sc);
}

static ls_status part_moe_bwd(const ls_dec_layer *d, const float *dres, float *dxn) {
    msweep *S = d->ctx;
    return ls_mla_moe_bwd(S->m, S->l, S->gw, S->tp, dres, dxn, d->T, d->sc);
}

/* Forward: x += o_proj(W_UV ō) of the chunk's rows (their attention done beforehand). */
static ls_status attn_part(const ls_dec_layer *d, float *x, const float *xn) {
    (void)xn;
    msweep *S = d->ctx;
    const ls_config *c = &S->m->cfg;
    int64_t rkv = ls_mla_cfg(c)->kv_lora_rank, q = S->r - S->w0;
    S->ov = ALLOC_F(d->ta, S->T * c->n_heads * ls_mla_cfg(c)->v_head);
    NEED(S->ov);
    ls_mla_out_proj(S->m, S->l, x, S->O + q * c->n_heads * rkv, S->ov, S->T);
    return LS_OK;
}

/* The own selected rows of query rows [q, q + T) of the wave (chunk position p0) as local
 * rows, on the backend. */
static void own_rows(msweep *S, int64_t q, int64_t T, int64_t p0) {
    const ls_prompt_state *st = S->st;
    ls_mla_cp_local_sel(st, S->hsel + (S->w0 + q) * S->kk, S->hloc, T, S->kk, p0, st->capacity, 0);
    ls_host_view_done(S->m->be, S->sc, S->loc, S->hloc, (size_t)(T * S->kk) * sizeof(int32_t), 1);
}

/* Backward from dres: o_proj and W_UV into ∂L/∂ō (kept), the attention over the own rows:
 * ∂L/∂(queries)'s share (=), the own rows' gradient into the dState pages (+=). The query
 * and latent paths are later. */
static ls_status attn_part_bwd(const ls_dec_layer *d, const float *dres, float *dxn) {
    (void)dxn;
    msweep *S = d->ctx;
    const ls_mla_model *m = S->m;
    const ls_config *c = &m->cfg;
    const ls_mla_config *mc = ls_mla_cfg(c);
    int H = c->n_heads, rkv = mc->kv_lora_rank, dr = mc->qk_rope;
    int64_t dk = rkv + dr, q0 = S->r - S->w0;
    LS_TRY(ls_mla_out_bwd(m, S->l, S->gw, dres, S->ov, S->O + q0 * H * rkv, S->DOB + q0 * H * rkv, S->T, d->sc));
    void *const *dpre = S->st->full->d[S->l].dk;
    for (int64_t t0 = 0; t0 < S->T; t0 += S->Cq) {
        int64_t T = S->T - t0 < S->Cq ? S->T - t0 : S->Cq, q = q0 + t0;
        own_rows(S, q, T, S->p0 + t0);
        LS_TRY(ls_op_mla_attn_bwd(m->be, S->DQA + q * H * dk, NULL, dpre, S->DOB + q * H * rkv, S->O + q * H * rkv,
                                  S->LSE + q * H, S->Q + q * H * dk, NULL, &S->pre, S->loc, S->kk, T, H, rkv, dr,
                                  S->pre.n, m->scale));
    }
    return LS_OK;
}

/* The selection of full indexer layer f for the rank's rows, from its input x [rows, D],
 * into sel [rows, kk] — as the CP capture makes it (mla.c's mla_cp_layer). fst: the state
 * with layer f's index-key pages. */
static ls_status select_layer(const ls_mla_model *m, const ls_prompt_state *fst, int f, const float *x, int32_t *sel,
                              int64_t kk, const int64_t *xoff, int64_t Tr, const ls_fwd_opts *o, ls_arena *sc) {
    const ls_config *c = &m->cfg;
    const ls_mla_config *mc = ls_mla_cfg(c);
    const ls_mla_layer *w = &m->layers[f];
    const ls_backend *be = m->be;
    int64_t D = c->hidden, rq = mc->q_lora_rank, S = fst->page_size, C = o->capture_chunk > 0 ? o->capture_chunk : 2048;
    int nI = mc->index_heads, dI = mc->index_head_dim;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    ls_dist_segs segs;
    int64_t *lo;
    LS_TRY(ls_dec_cp_segs(fst, f, 1, sc, &segs, &lo));
    ls_mla_gather G = {.m = m, .st = fst, .lo = lo, .xoff = xoff, .kk = kk, .sc = sc};
    LS_TRY(ls_mla_cp_index_table(m, fst, f, &segs, lo, C / S > 0 ? C / S : 1, &G, sc));
    int k;
    int64_t c0, T, r0;
    for (k = 0, c0 = -1; ls_dec_cp_chunk(fst, xoff, C, 0, Tr, &k, &c0, &T, &r0);) {
        ls_arena_mark m2 = ls_arena_get_mark(sc);
        int64_t p0 = c0 - T;
        float *xn = ALLOC_F(sc, T * D), *cqr = ALLOC_F(sc, T * rq), *cq = ALLOC_F(sc, T * rq);
        float *qI = ALLOC_F(sc, T * nI * dI), *wq = ALLOC_F(sc, T * nI), *kI = ALLOC_F(sc, T * dI);
        NEED(xn && cqr && cq && qI && wq && kI);
        ls_op_rmsnorm_plain_fwd(be, xn, NULL, x + r0 * D, w->input_norm, T, D, c->eps);
        ls_op_linear_fwd(be, cqr, xn, w->q_a, T, D, rq, 0);
        ls_op_rmsnorm_plain_fwd(be, cq, NULL, cqr, w->q_a_norm, T, rq, c->eps);
        ls_mla_index_queries(m, f, xn, cq, T, p0, qI, wq);
        ls_mla_index_keys(m, f, xn, T, p0, kI, NULL);
        if (fst->dtype != LS_DTYPE_F32) ls_op_round_to(be, kI, T * dI, fst->dtype);
        ls_kv_prefix keys = {p0, S, fst->dtype, G.ip, NULL};
        LS_TRY(ls_mla_select_rows(m, qI, wq, &keys, kI, T, sel + r0 * kk, kk, sc));
        ls_arena_release(sc, m2);
    }
    ls_arena_release(sc, mk);
    return LS_OK;
}

ls_status ls_mla_cp_sweep_layer(const ls_dec_model *dm, const ls_dec_grad *g, ls_prompt_state *st,
                                const ls_prompt_state *hst, int l, const float *x, float *dx, const ls_fwd_opts *o,
                                ls_arena *ta, ls_arena *sc) {
    const ls_mla_model *m = dm->fam;
    ls_mla_pass *mp = dm->pass_data;
    const ls_config *c = &m->cfg;
    const ls_mla_config *mc = ls_mla_cfg(c);
    const ls_mla_layer *w = &m->layers[l];
    ls_mla_layer *gw = &((ls_mla_model *)g->fam)->layers[l];
    const ls_backend *be = m->be;
    int64_t D = c->hidden, rq = mc->q_lora_rank, rkv = mc->kv_lora_rank, S = st->page_size, n = st->capacity;
    int H = c->n_heads, dn = mc->qk_nope, dr = mc->qk_rope;
    int64_t dq = dn + dr, dk = rkv + dr, kk = mp->kk, C = o->capture_chunk > 0 ? o->capture_chunk : 2048;
    int64_t Tr = 0, xoff[LS_STATE_MAX_SEGS];
    for (int k = 0; k < st->nseg; k++) xoff[k] = Tr, Tr += st->seg_hi[k] - st->seg_lo[k];
    ls_arena_mark mk = ls_arena_get_mark(sc), tm = ls_arena_get_mark(ta);
    /* 1. the selection this layer reads: its full layer's, kept while the layers sharing it run */
    int f = l;
    while (f > 0 && !mc->index_full[f]) f--;
    LS_ASSERT(mc->index_full[f], "layer %d shares the selection of a full indexer layer, and none comes before it", l);
    if (mp->sel_layer != f) {
        const ls_prompt_state *fst = st;
        ls_state_stage *sg = NULL; /* a state in host memory: layer f's pages staged for it */
        if (f != l && !ls_state_resident(hst, be)) {
            LS_TRY(ls_state_stage_new(&sg, (ls_prompt_state *)hst, be, LS_STAGE_PAGES, sc));
            if (sg) fst = ls_state_stage_in(sg, f, n, -1);
        }
        const float *xf = f == l ? x : hst->full->xres + (size_t)f * (size_t)(Tr * D); /* layer f's input */
        if (f != l && !ls_state_resident(hst, be)) { /* (host memory: copied in) */
            float *xd = ALLOC_F(sc, (Tr > 0 ? Tr : 1) * D);
            NEED(xd);
            if (Tr > 0) be->i->to_device(be, xd, xf, (size_t)(Tr * D) * sizeof(float));
            xf = xd;
        }
        LS_TRY(select_layer(m, fst, f, xf, mp->sel, kk, xoff, Tr, o, sc));
        mp->sel_layer = f;
        ls_arena_release(sc, mk);
    }
    int64_t nw, W = ls_cp_waves(ls_state_fullest_positions(st), C, o->cp_wave, ls_mla_cp_sweep_wave_bytes(c), &nw);
    int64_t Wn = W < Tr ? W : (Tr > 0 ? Tr : 1), Cq = C < Wn ? C : Wn;
    msweep M = {.m = m, .gw = gw, .st = st, .l = l, .kk = kk, .Cq = Cq, .sc = sc};
    M.Q = ALLOC_F(sc, Wn * H * dk), M.DQA = ALLOC_F(sc, Wn * H * dk), M.O = ALLOC_F(sc, Wn * H * rkv);
    M.DOB = ALLOC_F(sc, Wn * H * rkv), M.LSE = ALLOC_F(sc, Wn * H), M.QF = ALLOC_F(sc, Wn * H * dq);
    M.CQ = ALLOC_F(sc, Wn * rq), M.CQRAW = ALLOC_F(sc, Wn * rq), M.RSQ = ALLOC_F(sc, Wn);
    M.loc = ls_arena_alloc(sc, (size_t)(Cq * kk) * sizeof(int32_t));
    M.hloc = ls_host_view(be, sc, M.loc, (size_t)(Cq * kk) * sizeof(int32_t), 0);
    M.hsel = ls_host_view(be, sc, mp->sel, (size_t)((Tr > 0 ? Tr : 1) * kk) * sizeof(int32_t), 1);
    NEED(M.Q && M.DQA && M.O && M.DOB && M.LSE && M.QF && M.CQ && M.CQRAW && M.RSQ && M.loc && M.hloc && M.hsel);
    M.pre = ls_state_prefix(st, l);
    M.pre.n = ls_state_held_before(st, n);
    ls_dist_segs segs; /* the latent pages, and their gradient tables */
    int64_t *lo;
    LS_TRY(ls_dec_cp_segs(st, l, 0, sc, &segs, &lo));
    void ***dkt = ls_arena_host_alloc(sc, (size_t)segs.n * sizeof(void **));
    NEED(dkt);
    for (int sg = 0; sg < segs.n; sg++)
        dkt[sg] = segs.k[sg] ? st->full->d[l].dk + (segs.k[sg] - st->attn[l].k_pages) : NULL;
    segs.dk = dkt;
    ls_mla_gather G = {m, st, lo, xoff, NULL, 0, 0, M.Q, M.O, M.LSE, M.loc, M.hloc, ALLOC_F(sc, Cq * H * rkv),
                       ALLOC_F(sc, Cq * H), NULL, kk, Cq, sc, M.DOB, M.DQA, ALLOC_F(sc, Cq * H * dk)};
    NEED(G.ob && G.lb && G.dqb);
    ls_dec_layer d = {.be = be, .D = D, .I = c->intermediate, .eps = c->eps, .norm = LS_NORM_PLAIN,
                      .input_norm = w->input_norm, .post_norm = w->post_norm, .d_input_norm = gw->input_norm,
                      .d_post_norm = gw->post_norm, .mixer = attn_part, .mixer_bwd = attn_part_bwd,
                      .moe = c->moe[l] ? part_moe : NULL, .moe_bwd = c->moe[l] ? part_moe_bwd : NULL,
                      .gu_w = w->mlp_gu, .down_w = w->mlp_down, .dgu_w = gw->mlp_gu, .ddown_w = gw->mlp_down,
                      .ta = ta, .sc = sc, .ctx = &M};
    size_t lb = (size_t)(S * dk) * ls_dtype_size(st->dtype);
    int64_t bp = C / S > 0 ? C / S : 1;
    int k;
    int64_t c0, T, r0;
    for (int64_t wv = 0; wv < nw; wv++) {
        M.w0 = G.w0 = wv * W < Tr ? wv * W : Tr, G.w1 = (wv + 1) * W < Tr ? (wv + 1) * W : Tr;
        G.hsel = M.hsel + M.w0 * kk;
        /* 2. the wave's queries, the attention over the rank's selected rows, the others' as they pass */
        for (k = 0, c0 = -1; ls_dec_cp_chunk(st, xoff, C, G.w0, G.w1, &k, &c0, &T, &r0);) {
            ls_arena_mark m2 = ls_arena_get_mark(sc);
            int64_t q0 = r0 - M.w0, p0 = c0 - T;
            float *xn = ALLOC_F(sc, T * D);
            NEED(xn);
            mla_proj pj = {M.CQRAW + q0 * rq, M.CQ + q0 * rq, M.QF + q0 * H * dq, NULL, NULL, M.Q + q0 * H * dk,
                           M.RSQ + q0, NULL};
            d.T = T;
            ls_dec_norm1_fwd(&d, xn, x + r0 * D);
            ls_mla_q_proj(m, l, xn, T, p0, &pj);
            for (int64_t t0 = 0; t0 < T; t0 += Cq) {
                int64_t Tq = T - t0 < Cq ? T - t0 : Cq, q = q0 + t0;
                own_rows(&M, q, Tq, p0 + t0);
                LS_TRY(ls_op_mla_attn_fwd(be, M.O + q * H * rkv, M.LSE + q * H, M.Q + q * H * dk, NULL, &M.pre, M.loc,
                                          kk, Tq, H, (int)rkv, dr, M.pre.n, m->scale));
            }
            ls_arena_release(sc, m2);
        }
        LS_TRY(ls_dist_pages_gather(be, st->comm, &segs, S, lb, 0, bp, l, ls_mla_gather_latent, &G, sc));
        /* 3. per chunk: the layer's second half and its backward, the attention's over the own rows */
        for (k = 0, c0 = -1; ls_dec_cp_chunk(st, xoff, C, G.w0, G.w1, &k, &c0, &T, &r0);) {
            M.r = r0, M.T = T, M.p0 = c0 - T, d.T = T;
            M.tp = ls_arena_host_calloc(ta, 1, sizeof *M.tp);
            float *xc = ALLOC_F(ta, T * D);
            NEED(M.tp && xc);
            d.tp = &M.tp->dec, d.saved = &M.tp->dec;
            ls_op_copy(be, xc, x + r0 * D, T * D);
            LS_TRY(ls_dec_layer_fwd(&d, xc, l == c->n_layers - 1)); /* the last layer's FFN feeds the head only */
            LS_TRY(ls_dec_layer_bwd(&d, dx + r0 * D));
            ls_arena_release(ta, tm);
        }
        /* 4. the gathered rows again: the queries' shares, the rows' gradient to their holders */
        LS_TRY(ls_dist_pages_gather_grad(be, st->comm, &segs, S, lb, 0, S * dk, 0, bp, l, ls_mla_gather_latent_grad, &G,
                                         sc));
        /* 5. per chunk: the query path's backward */
        for (k = 0, c0 = -1; ls_dec_cp_chunk(st, xoff, C, G.w0, G.w1, &k, &c0, &T, &r0);) {
            ls_arena_mark m2 = ls_arena_get_mark(sc);
            int64_t q0 = r0 - M.w0;
            float *xn = ALLOC_F(sc, T * D), *dxn = CALLOC_F(sc, T * D);
            NEED(xn && dxn);
            d.T = T;
            ls_dec_norm1_fwd(&d, xn, x + r0 * D);
            LS_TRY(ls_mla_q_bwd(m, l, gw, M.DQA + q0 * H * dk, M.QF + q0 * H * dq, M.CQ + q0 * rq, M.CQRAW + q0 * rq,
                                M.RSQ + q0, xn, dxn, T, c0 - T, sc));
            LS_TRY(ls_dec_norm1_bwd(&d, dx + r0 * D, dxn, x + r0 * D));
            ls_arena_release(sc, m2);
        }
    }
    /* 6. every query's share in: the latent rows' backward of the rank's positions */
    ls_layer_dstate *ds = &st->full->d[l];
    for (k = 0, c0 = -1; ls_dec_cp_chunk(st, xoff, C, 0, Tr, &k, &c0, &T, &r0);) {
        ls_arena_mark m2 = ls_arena_get_mark(sc);
        int64_t p0 = c0 - T;
        float *xn = ALLOC_F(sc, T * D), *dxn = CALLOC_F(sc, T * D), *down = ALLOC_F(sc, T * dk);
        mla_proj pj = {NULL, NULL, NULL, ALLOC_F(sc, T * rkv), ALLOC_F(sc, T * dk), NULL, NULL, ALLOC_F(sc, T)};
        NEED(xn && dxn && down && pj.lat_raw && pj.own && pj.rstd_kv);
        for (int64_t t = 0; t < T; t++) {
            int64_t lp = ls_state_local_page(st, p0 + t);
            ls_op_copy(be, down + t * dk, (const float *)ds->dk[lp] + ((p0 + t) % S) * dk, dk);
        }
        d.T = T;
        ls_dec_norm1_fwd(&d, xn, x + r0 * D);
        LS_TRY(ls_mla_kv_proj(m, l, xn, T, p0, st->dtype, &pj, sc));
        LS_TRY(ls_mla_kv_bwd(m, l, gw, down, pj.lat_raw, pj.rstd_kv, xn, dxn, T, p0, sc));
        LS_TRY(ls_dec_norm1_bwd(&d, dx + r0 * D, dxn, x + r0 * D));
        ls_arena_release(sc, m2);
    }
    ls_arena_release(ta, tm);
    ls_arena_release(sc, mk);
    return LS_OK;
}
