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
     * rank attends over the chosen keys it holds and the partials merge by log-sum-exp
     * (branches and decode; a CP capture is mla_cp_layer's). own_rank: the rank that
     * scores and attends the call's own rows (0). Keys of positions < nkeys are paged. */
    const ls_comm *cp;
    int own_rank;
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

/* Each of T queries' (at positions pos0..) causal top-kk over index keys `keys` (its n =
 * pos0 positions, pages) and the call's own keys kI [T, dI]: sel [T, kk]. */
ls_status ls_mla_select_rows(const ls_mla_model *m, const float *qI, const float *wq, const ls_kv_prefix *keys,
                             const float *kI, int64_t T, int32_t *sel, int64_t kk, ls_arena *sc) {
    const ls_mla_config *mc = ls_mla_cfg(&m->cfg);
    int64_t pos0 = keys->n, n = pos0 + T;
    int nI = mc->index_heads, dI = mc->index_head_dim;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    int64_t tb = INDEX_BLOCK_VALUES / n;
    tb = tb < 1 ? 1 : tb > T ? T : tb;
    float *row = ALLOC_F(sc, tb * n);
    int64_t *count = ls_arena_alloc(sc, (size_t)tb * sizeof(int64_t));
    NEED(row && count);
    for (int64_t t0 = 0; t0 < T; t0 += tb) { /* rows [t0, t1): keys 0 .. pos0 + t1 − 1 */
        int64_t t1 = t0 + tb < T ? t0 + tb : T, nb = t1 - t0;
        LS_TRY(score_rows(m->be, row, qI + t0 * nI * dI, wq + t0 * nI, nb, keys, kI, t1, nI, dI, sc));
        LS_TRY(ls_op_dsa_topk(m->be, sel + t0 * kk, count, row, nb, pos0 + t1, pos0 + t0, kk, sc));
    }
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* One rank, full layer l: each query's causal top-kk over the prefix's index keys and
 * the call's own keys kI [T, dI] (into L->sel). */
static ls_status select_local(const ls_mla_model *m, int l, const float *qI, const float *wq, const float *kI,
                              mla_ctx *L) {
    ls_kv_prefix pre = prefix_of(L->st, l);
    ls_kv_prefix keys = {L->pos0, pre.page_size, pre.dtype, pre.v_pages, NULL}; /* the prefix's index keys */
    return ls_mla_select_rows(m, qI, wq, &keys, kI, L->T, L->sel, L->kk, L->sc);
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
 * §6 step A; branches and decode): each rank's top-kk among the keys it holds (paged positions < nkeys, and
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
void ls_mla_cp_local_sel(const ls_prompt_state *st, const int32_t *sel, int32_t *loc, int64_t T, int64_t kk,
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
        ls_mla_cp_local_sel(st, hsel, hloc, T, kk, L->pos0, L->nkeys, mine);
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


/* Query path (spec §2): c_q = RMSNorm(q_a x), q = q_b c_q per head [q_nope ; q_pe] (RoPE
 * at positions pos0..), and the absorbed queries q̃[h] = W_UK[h]ᵀ q_nope[h] beside q_pe:
 * p's cq_raw, cq, q, qa (and rstd_q when given). */
void ls_mla_q_proj(const ls_mla_model *m, int l, const float *xn, int64_t T, int64_t pos0, const mla_proj *p) {
    const ls_config *c = &m->cfg;
    const ls_mla_config *mc = ls_mla_cfg(c);
    const ls_mla_layer *w = &m->layers[l];
    int64_t D = c->hidden, rq = mc->q_lora_rank, rkv = mc->kv_lora_rank;
    int H = c->n_heads, dn = mc->qk_nope, dr = mc->qk_rope, half = dr / 2;
    int64_t dq = dn + dr, dk = rkv + dr, hb = dn + mc->v_head; /* a head's q width, the latent row, kv_b rows per head */
    ls_op_linear_fwd(m->be, p->cq_raw, xn, w->q_a, T, D, rq, 0);
    ls_op_rmsnorm_plain_fwd(m->be, p->cq, p->rstd_q, p->cq_raw, w->q_a_norm, T, rq, c->eps);
    ls_op_linear_fwd(m->be, p->q, p->cq, w->q_b, T, rq, H * dq, 0);
    ls_op_rope_table_fwd(m->be, p->q, T, H, (int)dq, dn, half, m->inv_freq, mc->rope_interleave, pos0);
    for (int h = 0; h < H; h++) {
        ls_op_gemm(m->be, 0, 0, (int)T, (int)rkv, dn, 1.0f, p->q + h * dq, (int)(H * dq),
                    w->kv_b + h * hb * rkv, (int)rkv, 0.0f, p->qa + h * dk, (int)(H * dk));
        ls_op_copy_rows(m->be, p->qa + h * dk + rkv, H * dk, p->q + h * dq + dn, H * dq, T, dr);
    }
}

/* The latent rows [RMSNorm(a[:rkv]) ; RoPE(a[rkv:])] of a = kv_a x at positions pos0..,
 * rounded as pages of dtype dt round theirs: p's lat_raw, own (and rstd_kv when given). */
ls_status ls_mla_kv_proj(const ls_mla_model *m, int l, const float *xn, int64_t T, int64_t pos0, ls_dtype dt,
                             const mla_proj *p, ls_arena *sc) {
    const ls_config *c = &m->cfg;
    const ls_mla_config *mc = ls_mla_cfg(c);
    const ls_mla_layer *w = &m->layers[l];
    int64_t D = c->hidden, rkv = mc->kv_lora_rank;
    int dr = mc->qk_rope, half = dr / 2;
    int64_t dk = rkv + dr;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *kva = ALLOC_F(sc, T * dk), *lat = ALLOC_F(sc, T * rkv); /* kv_a_proj output, the normed latent */
    NEED(kva && lat);
    ls_op_linear_fwd(m->be, kva, xn, w->kv_a, T, D, dk, 0);
    ls_op_copy_rows(m->be, p->lat_raw, rkv, kva, dk, T, rkv);
    ls_op_rmsnorm_plain_fwd(m->be, lat, p->rstd_kv, p->lat_raw, w->kv_a_norm, T, rkv, c->eps);
    ls_op_copy_rows(m->be, p->own, dk, lat, rkv, T, rkv);
    ls_op_copy_rows(m->be, p->own + rkv, dk, kva + rkv, dk, T, dr);
    ls_op_rope_table_fwd(m->be, p->own, T, 1, (int)dk, (int)rkv, half, m->inv_freq, mc->rope_interleave, pos0);
    /* the call's own latent rows rounded as the pages round theirs (bf16 pages): every key
     * and value then reads the same whether it is still the call's or paged already, so
     * capture chunking, the CP split and decode order cannot move a near-tie selection of
     * a later layer (the backward passes straight through the rounding) */
    if (dt != LS_DTYPE_F32) ls_op_round_to(m->be, p->own, T * dk, dt);
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* x [T, D] += o_proj(o[h] = W_UV[h] ō[h]) from the attention o [T, H, rkv]; ov [T, H·dv]
 * (=) the heads' outputs. */
void ls_mla_out_proj(const ls_mla_model *m, int l, float *x, const float *o, float *ov, int64_t T) {
    const ls_config *c = &m->cfg;
    const ls_mla_config *mc = ls_mla_cfg(c);
    const ls_mla_layer *w = &m->layers[l];
    int64_t rkv = mc->kv_lora_rank;
    int H = c->n_heads, dn = mc->qk_nope, dv = mc->v_head;
    int64_t hb = dn + dv;
    for (int h = 0; h < H; h++)
        ls_op_gemm(m->be, 0, 1, (int)T, dv, (int)rkv, 1.0f, o + h * rkv, (int)(H * rkv),
                    w->kv_b + (h * hb + dn) * rkv, (int)rkv, 0.0f, ov + h * dv, H * dv);
    ls_op_linear_fwd(m->be, x, ov, w->o_proj, T, (int64_t)H * dv, c->hidden, 1);
}

/* MLA mixer of layer l (spec §2, absorbed form): x[T, D] += o_proj(W_UV · attention). */
static ls_status mla_mixer(const ls_mla_model *m, int l, float *x, const float *xn, mla_ctx *L) {
    const ls_config *c = &m->cfg;
    const ls_mla_config *mc = ls_mla_cfg(c);
    int64_t T = L->T, rq = mc->q_lora_rank, rkv = mc->kv_lora_rank, pos0 = L->pos0;
    int H = c->n_heads, dn = mc->qk_nope, dr = mc->qk_rope, dv = mc->v_head;
    int64_t dq = dn + dr, dk = rkv + dr;
    mla_layer_tape *tp = L->tp;
    ls_arena *A = tp ? L->ta : L->sc, *sc = L->sc;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    mla_proj pj = {ALLOC_F(A, T * rq), ALLOC_F(A, T * rq), ALLOC_F(A, T * H * dq), ALLOC_F(A, T * rkv),
                   ALLOC_F(A, T * dk), ALLOC_F(A, T * H * dk), tp ? ALLOC_F(A, T) : NULL, tp ? ALLOC_F(A, T) : NULL};
    float *o = ALLOC_F(A, T * H * rkv);  /* [T, H, rkv] */
    float *ov = ALLOC_F(A, T * H * dv);  /* [T, H·dv] */
    float *lse = tp ? ALLOC_F(A, T * H) : NULL;
    NEED(pj.cq_raw && pj.cq && pj.q && pj.lat_raw && pj.own && pj.qa && o && ov &&
         (!tp || (pj.rstd_q && pj.rstd_kv && lse)));
    float *qa = pj.qa, *own = pj.own;
    ls_mla_q_proj(m, l, xn, T, pos0, &pj);
    LS_TRY(ls_mla_kv_proj(m, l, xn, T, pos0, L->st ? L->st->dtype : LS_DTYPE_F32, &pj, sc));
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
        ls_mla_index_queries(m, l, xn, pj.cq, T, pos0, qI, wq);
        if (L->cp)
            LS_TRY(cp_select(m, l, qI, wq, kI, L));
        else
            LS_TRY(select_local(m, l, qI, wq, kI, L));
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
    ls_mla_out_proj(m, l, x, o, ov, T); /* per head o[h] = W_UV[h] ō[h], then o_proj into the residual */
    /* the call's rows into the state, on the rank holding their positions (under CP: the
     * chunk's owner in capture, the tail rank in decode) */
    if (L->append && (!L->cp || ls_state_local_page(L->append, pos0) >= 0))
        LS_TRY(ls_state_append_kv(L->append, l, own, kI, T));
    if (tp) {
        tp->cq_raw = pj.cq_raw, tp->rstd_q = pj.rstd_q, tp->cq = pj.cq, tp->q = pj.q, tp->lat_raw = pj.lat_raw;
        tp->rstd_kv = pj.rstd_kv, tp->own = own, tp->qa = qa, tp->sel = L->sel, tp->o = o, tp->lse = lse, tp->ov = ov;
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

ls_status ls_mla_moe_fwd(const ls_mla_model *m, int l, float *x, const float *xn, int64_t T, mla_layer_tape *tp,
                         ls_arena *ta, ls_arena *sc) {
    mla_ctx L = {T, 0, NULL, NULL, NULL, 0, tp, ta, sc, NULL, -1, 0, NULL};
    return moe(m, l, x, xn, &L);
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

/* The skeleton's view of layer l (decoder.h) over the pass L (pc: its parts' context). */
static ls_dec_layer dec_layer(const ls_mla_model *m, int l, mla_ctx *L, part_ctx *pc) {
    const ls_config *c = &m->cfg;
    const ls_mla_layer *w = &m->layers[l];
    *pc = (part_ctx){m, l, L};
    return (ls_dec_layer){.be = m->be, .T = L->T, .D = c->hidden, .I = c->intermediate, .eps = c->eps,
                          .norm = LS_NORM_PLAIN, .input_norm = w->input_norm, .post_norm = w->post_norm,
                          .mixer = part_mixer, .moe = c->moe[l] ? part_moe : NULL, .gu_w = w->mlp_gu,
                          .down_w = w->mlp_down, .tp = L->tp ? &L->tp->dec : NULL, .ta = L->ta, .sc = L->sc,
                          .ctx = pc};
}

/* One decoder layer on x[T, D]: h += MLA(norm(h)); h += FFN(norm(h)). */
static ls_status layer_fwd(const ls_mla_model *m, int l, float *x, int skip_ffn, mla_ctx *L) {
    part_ctx pc;
    ls_dec_layer d = dec_layer(m, l, L, &pc);
    return ls_dec_layer_fwd(&d, x, skip_ffn);
}

/* A one-rank capture's last layer when nothing reads its output (no logits wanted): only
 * what later tokens read — the latent rows and, on a full indexer layer, the index keys
 * (each rounded as the pages round theirs), appended to the pages. Its queries, the
 * indexer's selection for its own rows, the sparse attention and o_proj would feed only
 * the skipped FFN. */
static ls_status mla_state_only(const ls_mla_model *m, int l, const float *x, mla_ctx *L) {
    const ls_config *c = &m->cfg;
    const ls_mla_config *mc = ls_mla_cfg(c);
    int64_t T = L->T, D = c->hidden, rkv = mc->kv_lora_rank, dk = rkv + mc->qk_rope, dI = mc->index_head_dim;
    ls_dtype dt = L->append->dtype;
    ls_arena_mark mk = ls_arena_get_mark(L->sc);
    float *xn = ALLOC_F(L->sc, T * D), *kI = mc->index_full[l] ? ALLOC_F(L->sc, T * dI) : NULL;
    mla_proj pj = {.lat_raw = ALLOC_F(L->sc, T * rkv), .own = ALLOC_F(L->sc, T * dk)};
    NEED(xn && pj.lat_raw && pj.own && (kI || !mc->index_full[l]));
    part_ctx pc;
    ls_dec_layer d = dec_layer(m, l, L, &pc);
    ls_dec_norm1_fwd(&d, xn, x);
    LS_TRY(ls_mla_kv_proj(m, l, xn, T, L->pos0, dt, &pj, L->sc));
    if (kI) {
        ls_mla_index_keys(m, l, xn, T, L->pos0, kI, NULL);
        if (dt != LS_DTYPE_F32) ls_op_round_to(m->be, kI, T * dI, dt);
    }
    LS_TRY(ls_state_append_kv(L->append, l, pj.own, kI, T));
    ls_arena_release(L->sc, mk);
    return LS_OK;
}

static int64_t sel_stride(const ls_config *c, int64_t pos0, int64_t T) {
    const ls_mla_config *mc = ls_mla_cfg(c);
    return mc->index_topk < pos0 + T ? mc->index_topk : pos0 + T;
}

/* The CP part of a layer context: the keys' communicator, who handles the call's own
 * rows, which keys are paged. */
static void set_cp(mla_ctx *L, const ls_prompt_state *st, int own_rank, int64_t nkeys, int32_t *sel_local) {
    if (!st || st->nranks <= 1) return;
    L->cp = st->comm, L->own_rank = own_rank, L->nkeys = nkeys, L->sel_local = sel_local;
}

/* ---- a layer of a CP capture over all of the rank's positions (issue 22) --------------
 * Layer-major, as the hybrid's (decoder.c): no rank waits for another's compute in prompt
 * order. Pass A, per chunk the rank owns: norm, the latent rows (and on a full layer the
 * index keys) into the pages. Selection, on a full layer: the other ranks' earlier index
 * keys are gathered whole (dI values a position, a fraction of a latent row) into one
 * page table over the prompt. Then in waves of the rank's positions (ls_cp_waves: the
 * per-position buffers bounded; every rank makes as many): per chunk, the absorbed
 * queries (and on a full layer the indexer's queries and weights, and each chunk's
 * selection, exactly as one rank selects: the same scores, the same ties; a shared layer
 * reads the last full layer's selection, kept for the rank's positions across layers);
 * each query attends over the selected rows the rank holds, then over the other ranks'
 * selected rows as their latent pages pass in rounds (ls_dist_pages_gather), merged by
 * log-sum-exp; pass B per chunk: W_UV, o_proj, the FFN or MoE. */

/* Pages holding n positions. */
static int64_t pages_for(int64_t n, int64_t S) { return (n + S - 1) / S; }


/* Index keys of another rank's segment: its block copied where the page table points. */
ls_status ls_mla_gather_index(void *ctx, int seg, void *const *k, void *const *v, int64_t nb, int64_t rows,
                              int64_t row0) {
    (void)v, (void)rows;
    const ls_mla_gather *G = ctx;
    const ls_prompt_state *st = G->st;
    const ls_mla_config *mc = ls_mla_cfg(&G->m->cfg);
    int64_t g0 = (G->lo[seg] + row0) / st->page_size, nf = st->page_size * mc->index_head_dim *
                                                               (int64_t)ls_dtype_size(st->dtype) / (int64_t)sizeof(float);
    for (int64_t i = 0; i < nb; i++)
        if (G->ip[g0 + i]) ls_op_copy(G->m->be, G->ip[g0 + i], k[i], nf);
    return LS_OK;
}

/* Latent rows of another rank's segment, positions [lo + row0, + rows): the wave's later
 * queries' selected rows among them attended, merged into (O, LSE). */
/* A block of another rank's latent rows, positions [lo + row0, + rows): the wave's later
 * queries' selected rows among them — attended and merged into (O, LSE); with dk (the
 * sweep's backward) their share of ∂L/∂(queries) into DQA (+=) and the rows' gradient
 * into dk (+=). */
static ls_status latent_block(const ls_mla_gather *G, int seg, void *const *k, float *const *dk, int64_t rows,
                              int64_t row0) {
    const ls_prompt_state *st = G->st;
    const ls_mla_config *mc = ls_mla_cfg(&G->m->cfg);
    int H = G->m->cfg.n_heads, rkv = mc->kv_lora_rank, dr = mc->qk_rope;
    int64_t dkw = rkv + dr, kk = G->kk, b0 = G->lo[seg] + row0, b1 = b0 + rows;
    ls_kv_prefix pre = {rows, st->page_size, st->dtype, k, NULL};
    size_t lb = (size_t)(G->Cq * kk) * sizeof(int32_t);
    for (int s = 0; s < st->nseg; s++) {
        if (st->seg_lo[s] < b1) continue; /* only later queries select these rows */
        int64_t a = G->xoff[s] > G->w0 ? G->xoff[s] : G->w0;
        int64_t e = G->xoff[s] + st->seg_hi[s] - st->seg_lo[s];
        e = e < G->w1 ? e : G->w1;
        for (int64_t r = a; r < e; r += G->Cq) {
            int64_t T = e - r < G->Cq ? e - r : G->Cq, any = 0, q = r - G->w0;
            for (int64_t t = 0; t < T; t++) { /* the selected positions in [b0, b1), as block rows */
                const int32_t *sl = G->hsel + (q + t) * kk;
                int32_t *lc = G->hloc + t * kk;
                int64_t j = 0;
                for (int64_t i = 0; i < kk && sl[i] >= 0; i++)
                    if (sl[i] >= b0 && sl[i] < b1) lc[j++] = (int32_t)(sl[i] - b0);
                any += j;
                for (; j < kk; j++) lc[j] = -1;
            }
            if (!any) continue;
            ls_host_view_done(G->m->be, G->sc, G->loc, G->hloc, lb, 1);
            if (dk) {
                LS_TRY(ls_op_mla_attn_bwd(G->m->be, G->dqb, NULL, (void *const *)dk, G->DOB + q * H * rkv,
                                          G->O + q * H * rkv, G->LSE + q * H, G->Q + q * H * dkw, NULL, &pre, G->loc,
                                          kk, T, H, rkv, dr, rows, G->m->scale));
                ls_op_add_to(G->m->be, G->DQA + q * H * dkw, G->dqb, T * H * dkw);
                continue;
            }
            LS_TRY(ls_op_mla_attn_fwd(G->m->be, G->ob, G->lb, G->Q + q * H * dkw, NULL, &pre, G->loc, kk, T, H, rkv, dr,
                                      rows, G->m->scale));
            ls_op_attn_merge(G->m->be, G->O + q * H * rkv, G->LSE + q * H, G->ob, G->lb, T, H, rkv);
        }
    }
    return LS_OK;
}

ls_status ls_mla_gather_latent(void *ctx, int seg, void *const *k, void *const *v, int64_t nb, int64_t rows,
                               int64_t row0) {
    (void)v, (void)nb;
    return latent_block(ctx, seg, k, NULL, rows, row0);
}

ls_status ls_mla_gather_latent_grad(void *ctx, int seg, void *const *k, void *const *v, float *const *dk,
                                    float *const *dv, int64_t nb, int64_t rows, int64_t row0) {
    (void)v, (void)dv, (void)nb;
    return latent_block(ctx, seg, k, dk, rows, row0);
}

ls_status ls_mla_cp_index_table(const ls_mla_model *m, const ls_prompt_state *st, int l, const ls_dist_segs *segs,
                                const int64_t *lo, int64_t bp, ls_mla_gather *G, ls_arena *sc) {
    const ls_mla_config *mc = ls_mla_cfg(&m->cfg);
    int64_t S = st->page_size, NP = pages_for(st->capacity, S), last = 0, dI = mc->index_head_dim;
    size_t ipb = (size_t)(S * dI) * ls_dtype_size(st->dtype);
    int nseg = segs->n;
    for (int k = 0; k < st->nseg; k++)
        if (st->seg_hi[k] > st->seg_lo[k] && st->seg_lo[k] > last) last = st->seg_lo[k];
    G->ip = ls_arena_host_calloc(sc, (size_t)NP, sizeof(void *));
    NEED(G->ip);
    int64_t need = 0; /* pages of other ranks' segments before the rank's last */
    for (int sg = 0; sg < nseg; sg++)
        if (segs->owner[sg] != st->rank && lo[sg] < last) need += pages_for(segs->npos[sg], S);
    char *ib = need ? ls_arena_alloc(sc, (size_t)need * ipb) : NULL;
    NEED(ib || !need);
    for (int sg = 0, j = 0; sg < nseg; sg++)
        for (int64_t i = 0; i < pages_for(segs->npos[sg], S); i++)
            if (segs->v[sg]) G->ip[lo[sg] / S + i] = segs->v[sg][i];
            else if (lo[sg] < last) G->ip[lo[sg] / S + i] = ib + (size_t)j++ * ipb;
    ls_dist_segs is = {nseg, segs->owner, segs->npos, segs->v, NULL, NULL, NULL};
    return ls_dist_pages_gather(m->be, st->comm, &is, S, ipb, 0, bp, l, ls_mla_gather_index, G, sc);
}

static ls_status mla_cp_layer(const ls_dec_model *dm, ls_prompt_state *st, ls_prompt_state *hst, int l, float *x,
                              int skip_ffn, const ls_fwd_opts *o, ls_arena *sc) {
    (void)hst;
    const ls_mla_model *m = dm->fam;
    const ls_mla_pass *mp = dm->pass_data;
    const ls_config *c = &m->cfg;
    const ls_mla_config *mc = ls_mla_cfg(c);
    const ls_mla_layer *w = &m->layers[l];
    const ls_backend *be = m->be;
    int64_t D = c->hidden, rq = mc->q_lora_rank, rkv = mc->kv_lora_rank, C = o->capture_chunk > 0 ? o->capture_chunk : 2048;
    int H = c->n_heads, dn = mc->qk_nope, dr = mc->qk_rope, dv = mc->v_head, nI = mc->index_heads, dI = mc->index_head_dim;
    int64_t dq = dn + dr, dk = rkv + dr, kk = mp->kk, S = st->page_size, n = st->capacity;
    int full = mc->index_full[l];
    size_t esz = ls_dtype_size(st->dtype);
    int64_t Tr = 0, xoff[LS_STATE_MAX_SEGS];
    for (int k = 0; k < st->nseg; k++) xoff[k] = Tr, Tr += st->seg_hi[k] - st->seg_lo[k];
    int64_t nw, W = ls_cp_waves(ls_state_fullest_positions(st), C, o->cp_wave, ls_mla_cp_wave_bytes(c, full), &nw);
    int64_t Wn = W < Tr ? W : (Tr > 0 ? Tr : 1), Cq = C < Wn ? C : Wn;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *Q = ALLOC_F(sc, Wn * H * dk), *O = ALLOC_F(sc, Wn * H * rkv), *LSE = ALLOC_F(sc, Wn * H);
    float *QI = full ? ALLOC_F(sc, Wn * nI * dI) : NULL, *WQ = full ? ALLOC_F(sc, Wn * nI) : NULL;
    float *KI = full ? ALLOC_F(sc, (Tr > 0 ? Tr : 1) * dI) : NULL; /* the rank's index keys, f32 as selection reads them */
    NEED(Q && O && LSE && (!full || (QI && WQ && KI)));
    ls_dist_segs segs; /* latent pages (K; gathered with no V bytes); on a full layer the index keys (V) */
    int64_t *lo;
    LS_TRY(ls_dec_cp_segs(st, l, full, sc, &segs, &lo));
    mla_ctx L = {0, 0, st, NULL, NULL, kk, NULL, NULL, sc, NULL, -1, 0, NULL};
    part_ctx pc = {m, l, &L};
    ls_dec_layer d = {.be = be, .D = D, .I = c->intermediate, .eps = c->eps, .norm = LS_NORM_PLAIN,
                      .input_norm = w->input_norm, .post_norm = w->post_norm, .mixer = part_mixer,
                      .moe = c->moe[l] ? part_moe : NULL, .gu_w = w->mlp_gu, .down_w = w->mlp_down, .sc = sc, .ctx = &pc};
    int k;
    int64_t c0, T, r0;
    /* 1. pass A: the latent rows and index keys of all of the rank's positions (the other
     * ranks read them before any wave) */
    for (k = 0, c0 = -1; ls_dec_cp_chunk(st, xoff, C, 0, Tr, &k, &c0, &T, &r0);) {
        ls_arena_mark m2 = ls_arena_get_mark(sc);
        float *xn = ALLOC_F(sc, T * D);
        mla_proj pj = {NULL, NULL, NULL, ALLOC_F(sc, T * rkv), ALLOC_F(sc, T * dk), NULL, NULL, NULL};
        NEED(xn && pj.lat_raw && pj.own);
        int64_t p0 = c0 - T;
        d.T = T;
        ls_dec_norm1_fwd(&d, xn, x + r0 * D);
        LS_TRY(ls_mla_kv_proj(m, l, xn, T, p0, st->dtype, &pj, sc));
        float *kI = full ? KI + r0 * dI : NULL;
        if (full) {
            ls_mla_index_keys(m, l, xn, T, p0, kI, NULL);
            if (st->dtype != LS_DTYPE_F32) ls_op_round_to(be, kI, T * dI, st->dtype);
        }
        st->n = p0;
        LS_TRY(ls_state_append_kv(st, l, pj.own, kI, T));
        ls_arena_release(sc, m2);
    }
    if (skip_ffn) { /* the last layer: its output feeds nothing (mla_state_only); the same on every rank */
        ls_arena_release(sc, mk);
        return LS_OK;
    }
    int64_t bp = C / S > 0 ? C / S : 1;
    int32_t *loc = ls_arena_alloc(sc, (size_t)(Cq * kk) * sizeof(int32_t));
    int32_t *hloc = ls_host_view(be, sc, loc, (size_t)(Cq * kk) * sizeof(int32_t), 0);
    NEED(loc && hloc);
    ls_mla_gather G = {m, st, lo, xoff, NULL, 0, 0, Q, O, LSE, loc, hloc, ALLOC_F(sc, Cq * H * rkv), ALLOC_F(sc, Cq * H),
                       NULL, kk, Cq, sc, NULL, NULL, NULL};
    NEED(G.ob && G.lb);
    /* 2. a full layer: the prompt's index keys in one page table, own pages where they
     * are, the other ranks' earlier ones gathered */
    if (full) LS_TRY(ls_mla_cp_index_table(m, st, l, &segs, lo, bp, &G, sc));
    ls_kv_prefix pre = ls_state_prefix(st, l);
    pre.n = ls_state_held_before(st, n);
    ls_status s = LS_OK;
    for (int64_t wv = 0; wv < nw && s == LS_OK; wv++) {
        G.w0 = wv * W < Tr ? wv * W : Tr, G.w1 = (wv + 1) * W < Tr ? (wv + 1) * W : Tr;
        /* 3. the wave's queries; on a full layer its selection */
        for (k = 0, c0 = -1; ls_dec_cp_chunk(st, xoff, C, G.w0, G.w1, &k, &c0, &T, &r0);) {
            ls_arena_mark m2 = ls_arena_get_mark(sc);
            int64_t q0 = r0 - G.w0, p0 = c0 - T;
            float *xn = ALLOC_F(sc, T * D);
            mla_proj pj = {ALLOC_F(sc, T * rq), ALLOC_F(sc, T * rq), ALLOC_F(sc, T * H * dq), NULL, NULL,
                           Q + q0 * H * dk, NULL, NULL};
            NEED(xn && pj.cq_raw && pj.cq && pj.q);
            d.T = T;
            ls_dec_norm1_fwd(&d, xn, x + r0 * D);
            ls_mla_q_proj(m, l, xn, T, p0, &pj);
            if (full) {
                ls_mla_index_queries(m, l, xn, pj.cq, T, p0, QI + q0 * nI * dI, WQ + q0 * nI);
                ls_kv_prefix keys = {p0, S, st->dtype, G.ip, NULL};
                LS_TRY(ls_mla_select_rows(m, QI + q0 * nI * dI, WQ + q0 * nI, &keys, KI + r0 * dI, T, mp->sel + r0 * kk, kk, sc));
            }
            ls_arena_release(sc, m2);
        }
        /* 4. attention: the selected rows the rank holds, then the other ranks' as they pass */
        ls_arena_mark m3 = ls_arena_get_mark(sc);
        G.hsel = ls_host_view(be, sc, mp->sel + G.w0 * kk, (size_t)((G.w1 - G.w0) * kk) * sizeof(int32_t), 1);
        NEED(G.hsel);
        for (k = 0, c0 = -1; ls_dec_cp_chunk(st, xoff, C, G.w0, G.w1, &k, &c0, &T, &r0);) {
            int64_t q0 = r0 - G.w0;
            for (int64_t t0 = 0; t0 < T; t0 += Cq) {
                int64_t Tq = T - t0 < Cq ? T - t0 : Cq;
                ls_mla_cp_local_sel(st, G.hsel + (q0 + t0) * kk, hloc, Tq, kk, c0 - T + t0, n, 0);
                ls_host_view_done(be, sc, loc, hloc, (size_t)(Tq * kk) * sizeof(int32_t), 1);
                LS_TRY(ls_op_mla_attn_fwd(be, O + (q0 + t0) * H * rkv, LSE + (q0 + t0) * H, Q + (q0 + t0) * H * dk, NULL,
                                          &pre, loc, kk, Tq, H, (int)rkv, dr, pre.n, m->scale));
            }
        }
        LS_TRY(ls_dist_pages_gather(be, st->comm, &segs, S, (size_t)(S * dk) * esz, 0, bp, l, ls_mla_gather_latent, &G, sc));
        ls_arena_release(sc, m3);
        /* 5. pass B */
        for (k = 0, c0 = -1; s == LS_OK && ls_dec_cp_chunk(st, xoff, C, G.w0, G.w1, &k, &c0, &T, &r0);) {
            ls_arena_mark m2 = ls_arena_get_mark(sc);
            float *xr = x + r0 * D, *ov = ALLOC_F(sc, T * H * dv);
            NEED(ov);
            ls_mla_out_proj(m, l, xr, O + (r0 - G.w0) * H * rkv, ov, T);
            ls_arena_release(sc, m2);
            if (!skip_ffn) {
                L.T = T, L.pos0 = c0 - T, d.T = T;
                s = ls_dec_ffn_fwd(&d, xr);
            }
        }
    }
    ls_arena_release(sc, mk);
    return s;
}

/* ---- the family's hooks of the model driver (decoder.h) --------------------------------
 * Capture under CP (spec §6, DESIGN §8) is layer-major: mla_cp_layer. */

static ls_status mla_begin(const ls_dec_model *dm, const ls_dec_pass *p) {
    ls_mla_pass *mp = dm->pass_data;
    int capture_cp = p->kind == LS_DEC_CP_CAPTURE; /* the rank's positions, layer-major (mla_cp_layer) */
    mp->kk = capture_cp ? sel_stride(dm->cfg, 0, p->st->capacity) : sel_stride(dm->cfg, p->pos0, p->T);
    size_t b = (size_t)(p->T * mp->kk) * sizeof(int32_t);
    int taping = p->tape != NULL, cp = p->view && p->view->nranks > 1;
    int want_sel = p->kind != LS_DEC_BRANCH || !taping;     /* with a tape, the full layers keep theirs */
    int want_loc = (p->kind != LS_DEC_BRANCH && !capture_cp) || (!taping && cp);
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
        mla_ctx L = {p->T, p->pos0, st, st, mp->sel, mp->kk, NULL, NULL, p->sc, NULL, -1, 0, NULL};
        set_cp(&L, st, 0, p->pos0, mp->loc);
        /* skip: the last layer, whose output nothing reads (decoder.c) */
        if (skip && !L.cp && l == m->cfg.n_layers - 1) return mla_state_only(m, l, x, &L);
        return layer_fwd(m, l, x, skip, &L);
    }
    case LS_DEC_CP_CAPTURE: /* every layer of a CP capture is mla_cp_layer's */
        LS_ASSERT(0, "layer %d: a CP capture runs its layers over all of the rank's positions", l);
        return LS_ERR_ARG;
    case LS_DEC_BRANCH: {
        mla_tape *tb = p->tape;
        mla_ctx L = {p->T, p->pos0, p->view, NULL, mp->sel, mp->kk, tb ? &tb->layers[l] : NULL, p->ta, p->sc, NULL,
                     -1, 0, NULL};
        set_cp(&L, p->view, 0, p->pos0, mp->loc); /* every rank runs the branch; rank 0 attends its own rows */
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
                          .sweep_every_rank = 1, .cp_layer = mla_cp_layer, .begin = mla_begin, .tape_new = mla_tape_new,
                          .layer_fwd = mla_layer_fwd, .layer_bwd = ls_mla_layer_bwd,
                          .cp_sweep_layer = ls_mla_cp_sweep_layer, .cp_sweep_bytes = ls_mla_cp_sweep_bytes};
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
