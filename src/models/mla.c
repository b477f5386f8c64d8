/*
 * mla.c — the MLA + DSA + MoE family's layers forward (specs/mla-dsa-moe.md §2–§4) and
 * its hooks of the model driver (decoder.h: capture, CP capture, decode, branches are
 * the driver's). One layer function serves every pass: capture passes an append
 * target, a branch none. Attention is sparse and absorbed: the indexer of a full layer
 * picks each query's top-k positions (a shared IndexCache layer reuses them), and every
 * head attends over those positions' latent rows [c_kv ; k_pe], the value being c_kv;
 * W_UV is applied per head after the sum. With a tape every buffer the backward reads
 * comes from the tape arena (mla_tape.h); without one, transients come from scratch.
 */
#include <math.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

#include "longstraw/cp.h"
#include "decoder.h"
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
    ls_prompt_state *append;   /* capture / decode: append this call's latent rows and index keys */
    int32_t *sel;              /* [T, kk]: the most recent full layer's selection (a full layer writes it) */
    int64_t kk;                /* its row stride: min(index_topk, pos0 + T) */
    mla_layer_tape *tp;        /* NULL: no tape */
    ls_arena *ta, *sc;
    /* Context parallelism (spec §6): the pages are split over the ranks of cp. Every rank
     * proposes its top-kk keys per query, the global top-kk is chosen from them, each
     * rank attends over the chosen keys it holds and the partials merge by log-sum-exp.
     * qroot: the rank that computed the queries (capture: the chunk's owner, which
     * broadcasts them), −1 when every rank computed them (branches, decode). own_rank:
     * the rank that scores and attends the call's own rows (capture: the owner; branches
     * and decode: 0). Keys of positions < nkeys are paged. */
    const ls_comm *cp;
    int qroot, own_rank;
    int64_t nkeys;
    int32_t *sel_local;        /* [T, kk] the selection as this rank's local rows (the tape keeps it) */
} mla_ctx;

static ls_kv_prefix prefix_of(const ls_prompt_state *st, int l) {
    if (st) return ls_state_prefix(st, l);
    ls_kv_prefix none = {0, 1, LS_DTYPE_F32, NULL, NULL};
    return none;
}

/* The indexer's per-query inputs of full layer l (spec §3): qI [T, nI, dI] (rope dims
 * first) and the per-head weights wq [T, nI] (nI^−½ included). */
void ls_mla_index_queries(const ls_mla_model *m, int l, const float *xn, const float *cq, int64_t T, int64_t pos0,
                          float *qI, float *wq) {
    const ls_config *c = &m->cfg;
    const ls_mla_config *mc = ls_mla_cfg(c);
    const ls_mla_layer *w = &m->layers[l];
    int nI = mc->index_heads, dI = mc->index_head_dim;
    ls_op_linear_fwd(m->be, qI, cq, w->idx_wq, T, mc->q_lora_rank, (int64_t)nI * dI, 0);
    ls_op_rope_table_fwd(m->be, qI, T, nI, dI, 0, mc->qk_rope / 2, m->inv_freq, mc->indexer_rope_interleave, pos0);
    ls_op_linear_fwd(m->be, wq, xn, w->idx_weights, T, c->hidden, nI, 0);
    float ws = 1.0f / sqrtf((float)nI);
    ls_op_scale(m->be, wq, ws, T * nI);
}

void ls_mla_index_keys(const ls_mla_model *m, int l, const float *xn, int64_t T, int64_t pos0, float *kI,
                       float *kpre) {
    const ls_config *c = &m->cfg;
    const ls_mla_config *mc = ls_mla_cfg(c);
    const ls_mla_layer *w = &m->layers[l];
    int dI = mc->index_head_dim;
    float *pre = kpre ? kpre : kI;
    ls_op_linear_fwd(m->be, pre, xn, w->idx_wk, T, c->hidden, dI, 0);
    ls_op_layernorm_fwd(m->be, kI, pre, w->idx_knorm_w, w->idx_knorm_b, T, dI, LS_MLA_INDEX_NORM_EPS);
    ls_op_rope_table_fwd(m->be, kI, T, 1, dI, 0, mc->qk_rope / 2, m->inv_freq, mc->indexer_rope_interleave, pos0);
}

/* Scores [nb, np] of queries (qI, wq) against positions [0, np) of index-key pages
 * `keys`, in row blocks, and of the same queries against own keys [nown, dI]: rows of
 * `row` [nb, np + nown]. */
static ls_status score_rows(const ls_backend *be, float *row, const float *qI, const float *wq, int64_t nb, const ls_kv_prefix *keys,
                            const float *own, int64_t nown, int nI, int dI, ls_arena *sc) {
    ls_arena_mark mk = ls_arena_get_mark(sc);
    int64_t np = keys->n, w = np + nown;
    float scale = 1.0f / sqrtf((float)dI);
    float *sp = ALLOC_F(sc, nb * (np > 0 ? np : 1)), *so = ALLOC_F(sc, nb * (nown > 0 ? nown : 1));
    NEED(sp && so);
    if (np > 0) LS_TRY(ls_op_dsa_scores(be, sp, qI, wq, keys, nb, nI, dI, scale, sc));
    if (nown > 0) {
        void *own_page[1] = {(void *)own};
        ls_kv_prefix ok = {nown, nown, LS_DTYPE_F32, own_page, NULL};
        LS_TRY(ls_op_dsa_scores(be, so, qI, wq, &ok, nb, nI, dI, scale, sc));
    }
    ls_op_copy_rows(be, row, w, sp, np, nb, np);
    ls_op_copy_rows(be, row + np, w, so, nown, nb, nown);
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* One rank, full layer l: each query's causal top-kk over the prefix's index keys and
 * the call's own keys kI [T, dI] (into L->sel). */
static ls_status select_local(const ls_mla_model *m, int l, const float *qI, const float *wq, const float *kI,
                              mla_ctx *L) {
    const ls_mla_config *mc = ls_mla_cfg(&m->cfg);
    int64_t T = L->T, pos0 = L->pos0, n = pos0 + T;
    int nI = mc->index_heads, dI = mc->index_head_dim;
    ls_arena *sc = L->sc;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    ls_kv_prefix pre = prefix_of(L->st, l);
    ls_kv_prefix keys = {pos0, pre.page_size, pre.dtype, pre.v_pages, NULL}; /* the prefix's index keys */
    int64_t tb = INDEX_BLOCK_VALUES / n;
    tb = tb < 1 ? 1 : tb > T ? T : tb;
    float *row = ALLOC_F(sc, tb * n);
    int64_t *count = ls_arena_alloc(sc, (size_t)tb * sizeof(int64_t));
    NEED(row && count);
    for (int64_t t0 = 0; t0 < T; t0 += tb) { /* rows [t0, t1): keys 0 .. pos0 + t1 − 1 */
        int64_t t1 = t0 + tb < T ? t0 + tb : T, nb = t1 - t0;
        LS_TRY(score_rows(m->be, row, qI + t0 * nI * dI, wq + t0 * nI, nb, &keys, kI, t1, nI, dI, sc));
        LS_TRY(ls_op_dsa_topk(m->be, L->sel + t0 * L->kk, count, row, nb, pos0 + t1, pos0 + t0, L->kk, sc));
    }
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* ---- context parallelism ------------------------------------------------------------ */

/* A held position's local row (page · S + offset; −1: another rank's); the position of
 * local row li (ls_state_held_before counts them). */
static int64_t local_row(const ls_prompt_state *st, int64_t pos) {
    int64_t lp = ls_state_local_page(st, pos);
    return lp < 0 ? -1 : lp * st->page_size + pos % st->page_size;
}

static int64_t held_position(const ls_prompt_state *st, int64_t li) {
    for (int k = 0; k < st->nseg; k++) {
        int64_t len = st->seg_hi[k] - st->seg_lo[k];
        if (li < len) return st->seg_lo[k] + li;
        li -= len;
    }
    return -1;
}

/* The global top-kk of the T queries at positions pos0.. over every rank's keys (spec
 * §6 step A): each rank's top-kk among the keys it holds (paged positions < nkeys, and
 * the own keys kI on the own-rows rank) with their positions; one all-gather; the best
 * kk of the union by (score desc, position asc), ascending in L->sel — exactly the one-
 * rank selection, since a key among the global top kk is among its rank's top kk. */
static ls_status cp_select(const ls_mla_model *m, int l, const float *qI, const float *wq, const float *kI,
                           mla_ctx *L) {
    const ls_mla_config *mc = ls_mla_cfg(&m->cfg);
    const ls_prompt_state *st = L->st;
    int nI = mc->index_heads, dI = mc->index_head_dim, rank = ls_comm_rank(L->cp);
    int64_t T = L->T, kk = L->kk, nloc = ls_state_held_before(st, L->nkeys), nown = rank == L->own_rank ? T : 0;
    ls_arena *sc = L->sc;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    ls_kv_prefix pre = ls_state_prefix(st, l);
    ls_kv_prefix keys = {nloc, st->page_size, st->dtype, pre.v_pages, NULL};
    ls_topk_cand *mine = ls_arena_host_alloc(sc, (size_t)(T * kk) * sizeof(ls_topk_cand));
    float *row = ALLOC_F(sc, nloc + nown + 1);
    int32_t *ls = ls_arena_alloc(sc, (size_t)kk * sizeof(int32_t));
    int64_t *dcnt = ls_arena_alloc(sc, sizeof(int64_t));
    /* the candidates are formed on the host: a query's scores, picks and count read back
     * (host views: themselves on a host-memory backend) */
    int host = m->be->host_mem;
    float *hrow = host ? row : ls_arena_host_alloc(sc, (size_t)(nloc + nown + 1) * sizeof(float));
    int32_t *hls = host ? ls : ls_arena_host_alloc(sc, (size_t)kk * sizeof(int32_t));
    NEED(mine && row && ls && dcnt && hrow && hls);
    for (int64_t t = 0; t < T; t++) {
        int64_t qp = L->pos0 + t, vloc = ls_state_held_before(st, qp + 1 < L->nkeys ? qp + 1 : L->nkeys);
        int64_t vown = nown ? t + 1 : 0, n = vloc + vown, cnt = 0;
        ls_topk_cand *c = mine + t * kk;
        for (int64_t j = 0; j < kk; j++) c[j] = (ls_topk_cand){0.0f, -1};
        if (n == 0) continue;
        ls_kv_prefix kv = keys;
        kv.n = vloc;
        LS_TRY(score_rows(m->be, row, qI + t * nI * dI, wq + t * nI, 1, &kv, kI, vown, nI, dI, sc));
        LS_TRY(ls_op_dsa_topk(m->be, ls, dcnt, row, 1, n, n - 1, kk, sc));
        m->be->i->to_host(m->be, &cnt, dcnt, sizeof cnt);
        if (!host) {
            m->be->i->to_host(m->be, hrow, row, (size_t)n * sizeof(float));
            m->be->i->to_host(m->be, hls, ls, (size_t)cnt * sizeof(int32_t));
        }
        for (int64_t j = 0; j < cnt; j++)
            c[j] = (ls_topk_cand){hrow[hls[j]],
                                  (int32_t)(hls[j] < vloc ? held_position(st, hls[j]) : L->pos0 + hls[j] - vloc)};
    }
    LS_TRY(ls_dist_topk_merge(m->be, L->sel, mine, T, kk, L->cp, sc));
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* The selection as this rank's local rows (paged keys: page · S + offset; own rows after
 * the nloc paged ones, on the own-rows rank), compacted, −1 after. */
static void cp_local_sel(const ls_prompt_state *st, const int32_t *sel, int32_t *loc, int64_t T, int64_t kk,
                         int64_t pos0, int64_t nkeys, int own) {
    int64_t nloc = ls_state_held_before(st, nkeys);
    for (int64_t t = 0; t < T; t++) {
        int64_t k = 0;
        for (int64_t j = 0; j < kk && sel[t * kk + j] >= 0; j++) {
            int64_t p = sel[t * kk + j], li = p < nkeys ? local_row(st, p) : own ? nloc + p - pos0 : -1;
            if (li >= 0) loc[t * kk + k++] = (int32_t)li;
        }
        for (; k < kk; k++) loc[t * kk + k] = -1;
    }
}

/* Capture under CP: the chunk's owner broadcasts its queries (absorbed [T, H, rkv+dr];
 * on a full layer also the indexer's qI and weights) to every rank. */
static ls_status cp_share_queries(const ls_backend *be, const ls_comm *cp, int root, float *qa, float *qI, float *wq, int64_t na, int64_t ni,
                                  int64_t nw) {
    ls_dist_part q[3] = {{qa, (size_t)na * sizeof(float)}, {qI, (size_t)ni * sizeof(float)},
                         {wq, (size_t)nw * sizeof(float)}};
    return ls_dist_bcast_parts(be, cp, q, 3, root);
}

/* Under CP (spec §6 step B): this rank's partial over the selected keys it holds (own
 * rows on the own-rows rank), merged with every rank's by log-sum-exp: o [T, H, rkv] and
 * lse [T, H] the whole attention's, on every rank. L->sel_local (tape arena with a tape)
 * gets the selection as local rows. */
static ls_status cp_attend(const ls_mla_model *m, int l, const float *qa, const float *own, float *o, float *lse,
                           mla_ctx *L) {
    const ls_mla_config *mc = ls_mla_cfg(&m->cfg);
    const ls_prompt_state *st = L->st;
    int64_t T = L->T, kk = L->kk, rkv = mc->kv_lora_rank, nloc = ls_state_held_before(st, L->nkeys);
    int H = m->cfg.n_heads, mine = ls_comm_rank(L->cp) == L->own_rank;
    if (mc->index_full[l]) { /* shared layers reuse their full layer's local rows */
        if (L->tp) L->sel_local = ls_arena_alloc(L->ta, (size_t)(T * kk) * sizeof(int32_t));
        NEED(L->sel_local);
        /* positions to local rows on the host: the selection read back, the rows placed */
        size_t sb = (size_t)(T * kk) * sizeof(int32_t);
        ls_arena_mark mk = ls_arena_get_mark(L->sc);
        int32_t *hsel = ls_host_view(m->be, L->sc, L->sel, sb, 1), *hloc = ls_host_view(m->be, L->sc, L->sel_local, sb, 0);
        NEED(hsel && hloc);
        cp_local_sel(st, hsel, hloc, T, kk, L->pos0, L->nkeys, mine);
        ls_host_view_done(m->be, L->sc, L->sel_local, hloc, sb, 1);
        ls_arena_release(L->sc, mk);
    }
    LS_ASSERT(L->sel_local, "layer %d: no selection to share", l);
    ls_kv_prefix pre = ls_state_prefix(st, l);
    pre.n = nloc;
    LS_TRY(ls_op_mla_attn_fwd(m->be, o, lse, qa, mine ? own : NULL, &pre, L->sel_local, kk, T, H, (int)rkv, mc->qk_rope, nloc,
                           m->scale));
    return ls_cp_merge(m->be, o, lse, T * H, (int)rkv, L->cp, L->sc);
}

/* MLA mixer of layer l (spec §2, absorbed form): x[T, D] += o_proj(W_UV · attention). */
static ls_status mla_mixer(const ls_mla_model *m, int l, float *x, const float *xn, mla_ctx *L) {
    const ls_config *c = &m->cfg;
    const ls_mla_config *mc = ls_mla_cfg(c);
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
    ls_op_linear_fwd(m->be, cq_raw, xn, w->q_a, T, D, rq, 0);
    ls_op_rmsnorm_plain_fwd(m->be, cq, rstd_q, cq_raw, w->q_a_norm, T, rq, c->eps);
    ls_op_linear_fwd(m->be, q, cq, w->q_b, T, rq, H * dq, 0);
    ls_op_rope_table_fwd(m->be, q, T, H, (int)dq, dn, half, m->inv_freq, mc->rope_interleave, pos0);
    /* KV path: the latent row [RMSNorm(a[:rkv]) ; RoPE(a[rkv:])], shared by every head */
    ls_op_linear_fwd(m->be, kva, xn, w->kv_a, T, D, dk, 0);
    ls_op_copy_rows(m->be, lat_raw, rkv, kva, dk, T, rkv);
    ls_op_rmsnorm_plain_fwd(m->be, lat, rstd_kv, lat_raw, w->kv_a_norm, T, rkv, c->eps);
    ls_op_copy_rows(m->be, own, dk, lat, rkv, T, rkv);
    ls_op_copy_rows(m->be, own + rkv, dk, kva + rkv, dk, T, dr);
    ls_op_rope_table_fwd(m->be, own, T, 1, (int)dk, (int)rkv, half, m->inv_freq, mc->rope_interleave, pos0);
    /* the call's own latent rows rounded as the pages round theirs (bf16 pages): every key
     * and value then reads the same whether it is still the call's or paged already, so
     * capture chunking, the CP split and decode order cannot move a near-tie selection of
     * a later layer (the backward passes straight through the rounding) */
    if (L->st && L->st->dtype != LS_DTYPE_F32) ls_op_round_to(m->be, own, T * dk, L->st->dtype);
    /* absorbed queries: q̃[h] = W_UK[h]ᵀ q_nope[h] (W_UK[h] = kv_b rows h·(dn+dv) ..+dn) */
    for (int h = 0; h < H; h++) {
        ls_op_gemm(m->be, 0, 0, (int)T, (int)rkv, dn, 1.0f, q + h * dq, (int)(H * dq),
                    w->kv_b + h * hb * rkv, (int)rkv, 0.0f, qa + h * dk, (int)(H * dk));
        ls_op_copy_rows(m->be, qa + h * dk + rkv, H * dk, q + h * dq + dn, H * dq, T, dr);
    }
    /* selection: a full layer's own indexer, or the most recent full layer's */
    float *kI = NULL;
    int full = mc->index_full[l];
    if (full) {
        if (tp) { /* the tape keeps every full layer's picks (shared layers point at them) */
            L->sel = ls_arena_alloc(A, (size_t)(T * L->kk) * sizeof(int32_t));
            NEED(L->sel);
        }
        int nI = mc->index_heads, dI = mc->index_head_dim;
        float *qI = ALLOC_F(sc, T * nI * dI), *wq = ALLOC_F(sc, T * nI);
        kI = ALLOC_F(sc, T * dI);
        NEED(qI && wq && kI);
        ls_mla_index_keys(m, l, xn, T, pos0, kI, NULL);
        /* the call's own index keys rounded as the pages round theirs: a selection is then a
         * function of the keys alone, whatever the chunking, the CP split or decode order
         * (near ties flip under bf16 otherwise, spec §7.3) */
        if (L->st && L->st->dtype != LS_DTYPE_F32) ls_op_round_to(m->be, kI, T * mc->index_head_dim, L->st->dtype);
        ls_mla_index_queries(m, l, xn, cq, T, pos0, qI, wq);
        if (L->cp) {
            if (L->qroot >= 0) LS_TRY(cp_share_queries(m->be, L->cp, L->qroot, qa, qI, wq, T * H * dk, T * nI * dI, T * nI));
            LS_TRY(cp_select(m, l, qI, wq, kI, L));
        } else {
            LS_TRY(select_local(m, l, qI, wq, kI, L));
        }
    } else if (L->cp && L->qroot >= 0) {
        LS_TRY(cp_share_queries(m->be, L->cp, L->qroot, qa, NULL, NULL, T * H * dk, 0, 0));
    }
    LS_ASSERT(L->sel, "layer %d shares the selection of a full indexer layer, and none came before it", l);
    if (L->cp) {
        float *lse_cp = lse ? lse : ALLOC_F(sc, T * H); /* the merge needs one */
        NEED(lse_cp);
        LS_TRY(cp_attend(m, l, qa, own, o, lse_cp, L));
        if (tp) tp->sel_local = L->sel_local;
    } else {
        ls_kv_prefix pre = prefix_of(L->st, l);
        LS_TRY(ls_op_mla_attn_fwd(m->be, o, lse, qa, own, &pre, L->sel, L->kk, T, H, (int)rkv, dr, pos0, m->scale));
    }
    /* per head o[h] = W_UV[h] ō[h], then o_proj into the residual */
    for (int h = 0; h < H; h++)
        ls_op_gemm(m->be, 0, 1, (int)T, dv, (int)rkv, 1.0f, o + h * rkv, (int)(H * rkv),
                    w->kv_b + (h * hb + dn) * rkv, (int)rkv, 0.0f, ov + h * dv, H * dv);
    ls_op_linear_fwd(m->be, x, ov, w->o_proj, T, (int64_t)H * dv, D, 1);
    /* the call's rows into the state, on the rank holding their positions (under CP: the
     * chunk's owner in capture, the tail rank in decode) */
    if (L->append && (!L->cp || ls_state_local_page(L->append, pos0) >= 0))
        LS_TRY(ls_state_append_kv(L->append, l, own, kI, T));
    if (tp) {
        tp->cq_raw = cq_raw, tp->rstd_q = rstd_q, tp->cq = cq, tp->q = q, tp->lat_raw = lat_raw;
        tp->rstd_kv = rstd_kv, tp->own = own, tp->qa = qa, tp->sel = L->sel, tp->o = o, tp->lse = lse, tp->ov = ov;
    }
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* MoE block (spec §4): x[T, D] += Σ_chosen g_e·E_e(xn) + Shared(xn). */
static ls_status moe(const ls_mla_model *m, int l, float *x, const float *xn, mla_ctx *L) {
    const ls_config *c = &m->cfg;
    const ls_mla_config *mc = ls_mla_cfg(c);
    const ls_mla_layer *w = &m->layers[l];
    int64_t T = L->T, D = c->hidden, Im = c->moe_inter, Is = Im * mc->n_shared_experts;
    int E = c->n_experts, K = c->top_k;
    mla_layer_tape *tp = L->tp;
    ls_arena *A = tp ? L->ta : L->sc, *sc = L->sc;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *s = ALLOC_F(A, T * E), *wt = ALLOC_F(A, T * K), *logits = ALLOC_F(sc, T * E);
    int32_t *sel = ls_arena_alloc(A, (size_t)(T * K) * sizeof(int32_t));
    NEED(s && wt && logits && sel);
    ls_op_linear_fwd(m->be, logits, xn, w->router, T, D, E, 0);
    ls_op_mla_route_fwd(m->be, sel, wt, s, logits, w->router_bias, T, E, K, mc->n_group, mc->topk_group, c->norm_topk,
                     mc->routed_scaling);
    /* expert parallelism: this rank's experts into y [T, D], their outputs back to the
     * tokens' slice owners by all-to-all and the sums all-gathered (every rank routes the
     * same tokens: the dense part is replicated, so the rows need not go out) */
    float *y = m->ep ? ls_arena_calloc(sc, (size_t)(T * D), sizeof(float)) : x;
    NEED(y);
    ls_dec_experts ex = {.D = D, .I = Im, .E = E, .K = K, .e0 = m->e0, .ne = m->n_local_experts, .gu_w = w->exp_gu,
                         .down_w = w->exp_down};
    LS_TRY(ls_dec_experts_fwd(m->be, &ex, y, xn, sel, wt, T, sc));
    if (m->ep) {
        LS_TRY(ls_dist_ep_combine(m->be, y, T, D, sel, K, m->n_local_experts, m->ep, sc));
        ls_op_add_to(m->be, x, y, T * D);
    }
    if (Is > 0) {
        float *sgu = tp ? ALLOC_F(A, T * 2 * Is) : NULL, *sact = tp ? ALLOC_F(A, T * Is) : NULL;
        NEED(!tp || (sgu && sact));
        LS_TRY(ls_dec_swiglu_fwd(m->be, x, sgu, sact, xn, T, D, Is, w->sh_gu, w->sh_down, 1, NULL, sc));
        if (tp) tp->sh_gu = sgu, tp->sh_act = sact;
    }
    if (tp) tp->s = s, tp->esel = sel, tp->wt = wt;
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* Capture under CP, on a rank that does not own the chunk: its part of layer l's
 * attention for the owner's queries (received), the same collectives in the same order
 * as the owner's mla_mixer. */
static ls_status cp_assist(const ls_mla_model *m, int l, mla_ctx *L) {
    const ls_mla_config *mc = ls_mla_cfg(&m->cfg);
    int64_t T = L->T, dk = mc->kv_lora_rank + mc->qk_rope;
    int H = m->cfg.n_heads, nI = mc->index_heads, dI = mc->index_head_dim, full = mc->index_full[l];
    ls_arena_mark mk = ls_arena_get_mark(L->sc);
    float *qa = ALLOC_F(L->sc, T * H * dk), *o = ALLOC_F(L->sc, T * H * mc->kv_lora_rank), *lse = ALLOC_F(L->sc, T * H);
    float *qI = full ? ALLOC_F(L->sc, T * nI * dI) : NULL, *wq = full ? ALLOC_F(L->sc, T * nI) : NULL;
    NEED(qa && o && lse && (!full || (qI && wq)));
    LS_TRY(cp_share_queries(m->be, L->cp, L->qroot, qa, qI, wq, T * H * dk, full ? T * nI * dI : 0, full ? T * nI : 0));
    if (full) LS_TRY(cp_select(m, l, qI, wq, NULL, L));
    LS_TRY(cp_attend(m, l, qa, NULL, o, lse, L));
    ls_arena_release(L->sc, mk);
    return LS_OK;
}

/* The family's parts of a layer for the skeleton (decoder.h): the MLA mixer and the MoE block. */
typedef struct {
    const ls_mla_model *m;
    int l;
    mla_ctx *L;
} part_ctx;

static ls_status part_mixer(const ls_dec_layer *d, float *x, const float *xn) {
    const part_ctx *p = d->ctx;
    return mla_mixer(p->m, p->l, x, xn, p->L);
}

static ls_status part_moe(const ls_dec_layer *d, float *x, const float *xn) {
    const part_ctx *p = d->ctx;
    return moe(p->m, p->l, x, xn, p->L);
}

/* One decoder layer on x[T, D]: h += MLA(norm(h)); h += FFN(norm(h)). */
static ls_status layer_fwd(const ls_mla_model *m, int l, float *x, int skip_ffn, mla_ctx *L) {
    const ls_config *c = &m->cfg;
    const ls_mla_layer *w = &m->layers[l];
    part_ctx pc = {m, l, L};
    ls_dec_layer d = {.be = m->be, .T = L->T, .D = c->hidden, .I = c->intermediate, .eps = c->eps,
                      .norm = LS_NORM_PLAIN, .input_norm = w->input_norm, .post_norm = w->post_norm,
                      .mixer = part_mixer, .moe = c->moe[l] ? part_moe : NULL, .gu_w = w->mlp_gu,
                      .down_w = w->mlp_down, .tp = L->tp ? &L->tp->dec : NULL, .ta = L->ta, .sc = L->sc, .ctx = &pc};
    return ls_dec_layer_fwd(&d, x, skip_ffn);
}

static int64_t sel_stride(const ls_config *c, int64_t pos0, int64_t T) {
    const ls_mla_config *mc = ls_mla_cfg(c);
    return mc->index_topk < pos0 + T ? mc->index_topk : pos0 + T;
}

/* The CP part of a layer context: the keys' communicator, who computed the queries,
 * who handles the call's own rows, which keys are paged. */
static void set_cp(mla_ctx *L, const ls_prompt_state *st, int qroot, int own_rank, int64_t nkeys, int32_t *sel_local) {
    if (!st || st->nranks <= 1) return;
    L->cp = st->comm, L->qroot = qroot, L->own_rank = own_rank, L->nkeys = nkeys, L->sel_local = sel_local;
}

/* ---- the family's hooks of the model driver (decoder.h) --------------------------------
 * Capture under CP (spec §6, DESIGN §8) is chunk-major: at every layer of a chunk all
 * ranks score the chunk's queries against the keys they hold, choose the global top-k,
 * attend over their share of it and merge. The chunk's own rows are the owner's, in f32
 * as in one-rank capture (bf16 pages round only what came before), appended after. */

static ls_status mla_begin(const ls_dec_model *dm, const ls_dec_pass *p) {
    ls_mla_pass *mp = dm->pass_data;
    mp->kk = sel_stride(dm->cfg, p->pos0, p->T);
    size_t b = (size_t)(p->T * mp->kk) * sizeof(int32_t);
    int taping = p->tape != NULL, cp = p->view && p->view->nranks > 1;
    int want_sel = p->kind != LS_DEC_BRANCH || !taping;     /* with a tape, the full layers keep theirs */
    int want_loc = p->kind != LS_DEC_BRANCH || (!taping && cp);
    mp->sel = want_sel ? ls_arena_alloc(p->sc, b) : NULL;
    mp->loc = want_loc ? ls_arena_alloc(p->sc, b) : NULL;
    NEED((mp->sel || !want_sel) && (mp->loc || !want_loc));
    return LS_OK;
}

static ls_dec_branch *mla_tape_new(const ls_dec_model *dm, const ls_dec_pass *p, ls_arena *A) {
    mla_tape *tb = ls_arena_host_calloc(A, 1, sizeof *tb);
    if (!tb || !(tb->layers = ls_arena_host_calloc(A, (size_t)dm->cfg->n_layers, sizeof(mla_layer_tape)))) return NULL;
    tb->kk = sel_stride(dm->cfg, p->pos0, p->T);
    tb->st = p->view;
    if (p->view && p->view->nranks > 1) tb->cp = p->view->comm, tb->own_rank = 0, tb->nkeys = p->pos0;
    return &tb->h;
}

static ls_status mla_layer_fwd(const ls_dec_model *dm, const ls_dec_pass *p, int l, float *x, int skip) {
    const ls_mla_model *m = dm->fam;
    ls_mla_pass *mp = dm->pass_data;
    ls_prompt_state *st = p->st;
    switch (p->kind) {
    case LS_DEC_EXTEND: { /* capture, or a decode step of one sequence */
        mla_ctx L = {p->T, p->pos0, st, st, mp->sel, mp->kk, NULL, NULL, p->sc, NULL, -1, -1, 0, NULL};
        set_cp(&L, st, -1, 0, p->pos0, mp->loc);
        return layer_fwd(m, l, x, skip, &L);
    }
    case LS_DEC_CP_CAPTURE: { /* x NULL: another rank's chunk, assisted */
        mla_ctx L = {p->T, p->pos0, st, x ? st : NULL, mp->sel, mp->kk, NULL, NULL, p->sc, NULL, -1, -1, 0, NULL};
        set_cp(&L, st, p->owner, p->owner, p->pos0, mp->loc); /* the owner's rows are its own (f32) until appended */
        return x ? layer_fwd(m, l, x, skip, &L) : cp_assist(m, l, &L);
    }
    case LS_DEC_BRANCH: {
        mla_tape *tb = p->tape;
        mla_ctx L = {p->T, p->pos0, p->view, NULL, mp->sel, mp->kk, tb ? &tb->layers[l] : NULL, p->ta, p->sc, NULL,
                     -1, -1, 0, NULL};
        set_cp(&L, p->view, -1, 0, p->pos0, mp->loc); /* every rank runs the branch; rank 0 attends its own rows */
        LS_TRY(layer_fwd(m, l, x, skip, &L));
        mp->sel = L.sel, mp->loc = L.sel_local; /* a full layer's picks, for the shared layers after it */
        return LS_OK;
    }
    case LS_DEC_DECODE:
        break;
    }
    LS_ASSERT(0, "the MLA family decodes sequence by sequence (no batched pass)");
    return LS_ERR_UNSUPPORTED;
}

ls_dec_model ls_mla_dec(const ls_mla_model *m, ls_mla_pass *mp) {
    return (ls_dec_model){.be = m->be, .cfg = &m->cfg, .norm = LS_NORM_PLAIN, .embed = m->embed,
                          .final_norm = m->final_norm, .lm_head = m->lm_head, .fam = m, .pass_data = mp,
                          .sweep_every_rank = 1, .begin = mla_begin, .tape_new = mla_tape_new,
                          .layer_fwd = mla_layer_fwd, .layer_bwd = ls_mla_layer_bwd};
}

/* ---- the family's entries: the driver's ------------------------------------------------ */

ls_status ls_mla_capture(const ls_mla_model *m, ls_prompt_state *st, const int32_t *ids, int64_t n,
                         const ls_fwd_opts *o, ls_arena *scratch) {
    ls_mla_pass mp;
    ls_dec_model dm = ls_mla_dec(m, &mp);
    return ls_dec_capture(&dm, st, ids, n, o, scratch);
}

ls_status ls_mla_decode(const ls_mla_model *m, ls_prompt_state *const *sts, const int32_t *ids, int n, float *logits,
                        const ls_fwd_opts *o, ls_arena *scratch) {
    ls_mla_pass mp;
    ls_dec_model dm = ls_mla_dec(m, &mp);
    return ls_dec_decode(&dm, sts, ids, n, logits, o, scratch);
}

ls_status ls_mla_branch_fwd(const ls_mla_model *m, const ls_prompt_state *st, const int32_t *ids, int64_t T,
                            int64_t out_from, int64_t grad_from, const int32_t *target, float *logprob, float *entropy,
                            ls_branch_tape **tape_out, const ls_fwd_opts *o, ls_arena *tape_arena, ls_arena *scratch) {
    ls_mla_pass mp;
    ls_dec_model dm = ls_mla_dec(m, &mp);
    return ls_dec_branch_fwd(&dm, st, ids, T, out_from, grad_from, target, logprob, entropy, (ls_dec_branch **)tape_out,
                             o, tape_arena, scratch, -1);
}
