/*
 * mla_tape.h — what a branch forward of the MLA family saves for its backward (private
 * to src/models). Everything lives in the tape arena (the branch arena) and dies when
 * it is reset after the member's backward (DESIGN §3–4). The family table passes it as
 * the opaque ls_branch_tape.
 */
#ifndef LONGSTRAW_MLA_TAPE_H
#define LONGSTRAW_MLA_TAPE_H

#include "decoder.h"
#include "longstraw/cp.h"
#include "longstraw/mla.h"

typedef struct {
    ls_dec_tape dec;               /* the skeleton's: layer input, norms, residual, dense FFN */
    float *cq_raw, *rstd_q, *cq;   /* [T, rq] q_a_proj output, [T], the q latent */
    float *q;                      /* [T, H, dn+dr] q_b_proj output, q_pe rotated */
    float *lat_raw, *rstd_kv;      /* [T, rkv] the KV latent before its norm, [T] */
    float *own;                    /* [T, rkv+dr] the call's latent rows [c_kv ; k_pe] */
    float *qa;                     /* [T, H, rkv+dr] absorbed queries [W_UKᵀ q_nope ; q_pe] */
    const int32_t *sel;            /* [T, kk] selected positions (a shared layer: its full layer's) */
    const int32_t *sel_local;      /* under CP: the selection as this rank's local rows */
    float *o, *lse;                /* [T, H, rkv] attention over the latents, [T, H] */
    float *ov;                     /* [T, H·dv] per-head W_UV outputs (o_proj input) */
    float *s;                      /* MoE: [T, E] sigmoid scores */
    int32_t *esel;                 /* [T, K] chosen experts */
    float *wt;                     /* [T, K] their gates */
    float *sh_gu, *sh_act;         /* shared experts: [T, 2Is], [T, Is] */
} mla_layer_tape;

typedef struct {
    ls_dec_branch h;               /* the driver's: rows, ids, targets, final norm, LM head */
    int64_t kk;                    /* the selection's row stride: min(index_topk, pos0 + T) */
    const ls_prompt_state *st;     /* the read-only prefix (NULL: none) */
    const ls_comm *cp;             /* the prefix is split over the ranks of cp (NULL: one rank) */
    int own_rank;                  /* under CP: the rank that attended the branch's own rows */
    int64_t nkeys;                 /* under CP: positions < nkeys were paged keys */
    mla_layer_tape *layers;        /* [n_layers] */
} mla_tape;

/* Shared by the forward and the backward (mla.c): the indexer's per-query inputs of full
 * layer l, qI [T, nI, dI] (rope dims first, rotated) and weights wq [T, nI] (nI^−½ in). */
void ls_mla_index_queries(const ls_mla_model *m, int l, const float *xn, const float *cq, int64_t T, int64_t pos0,
                          float *qI, float *wq);
/* The index keys kI [T, dI] of full layer l: LayerNorm(wk x) (eps below, spec §3), RoPE on
 * the first dims; kpre [T, dI] (NULL: not kept) gets wk x, the norm's input. */
#define LS_MLA_INDEX_NORM_EPS 1e-6f
void ls_mla_index_keys(const ls_mla_model *m, int l, const float *xn, int64_t T, int64_t pos0, float *kI,
                       float *kpre);

/* ---- pieces of a layer the CP capture and the layer-major sweep run apart (mla.c) ----
 * The mixer's projections of T rows (spec §2): the buffers a call keeps, given by the
 * caller (rstd_q, rstd_kv NULL: not kept). */
typedef struct {
    float *cq_raw, *cq; /* [T, rq] q_a x, its norm */
    float *q;           /* [T, H, dn+dr] */
    float *lat_raw;     /* [T, rkv] the latent before its norm */
    float *own;         /* [T, rkv+dr] the call's latent rows */
    float *qa;          /* [T, H, rkv+dr] the absorbed queries */
    float *rstd_q, *rstd_kv;
} mla_proj;
/* The query path at positions pos0..: p's cq_raw, cq, q, qa (and rstd_q when given). */
void ls_mla_q_proj(const ls_mla_model *m, int l, const float *xn, int64_t T, int64_t pos0, const mla_proj *p);
/* The latent rows, rounded as pages of dtype dt round theirs: p's lat_raw, own (rstd_kv). */
ls_status ls_mla_kv_proj(const ls_mla_model *m, int l, const float *xn, int64_t T, int64_t pos0, ls_dtype dt,
                         const mla_proj *p, ls_arena *sc);
/* x [T, D] += o_proj(W_UV ō) from the attention o [T, H, rkv]; ov [T, H·dv] (=). */
void ls_mla_out_proj(const ls_mla_model *m, int l, float *x, const float *o, float *ov, int64_t T);
/* The MoE block of layer l on rows xn (x +=), recorded into tp (tape arena ta) when given. */
ls_status ls_mla_moe_fwd(const ls_mla_model *m, int l, float *x, const float *xn, int64_t T, mla_layer_tape *tp,
                         ls_arena *ta, ls_arena *sc);
/* Each of T queries' causal top-kk over index keys `keys` (n = the queries' first
 * position) and their own keys kI [T, dI]: sel [T, kk]. */
ls_status ls_mla_select_rows(const ls_mla_model *m, const float *qI, const float *wq, const ls_kv_prefix *keys,
                             const float *kI, int64_t T, int32_t *sel, int64_t kk, ls_arena *sc);
/* A selection (positions) as this rank's local rows (own rows after the paged ones when
 * own), compacted, −1 after. */
void ls_mla_cp_local_sel(const ls_prompt_state *st, const int32_t *sel, int32_t *loc, int64_t T, int64_t kk,
                         int64_t pos0, int64_t nkeys, int own);
/* The CP gathers of a layer over the rank's rows (mla.c's mla_cp_layer): the index keys into
 * one page table over the prompt (ls_mla_cp_index_table), the latent rows attended and
 * merged into the rank's queries as they pass (ls_mla_gather_latent). */
typedef struct {
    const ls_mla_model *m;
    const ls_prompt_state *st;
    const int64_t *lo;   /* [segments] every segment's first position */
    const int64_t *xoff; /* [st->nseg] the rank's segments' rows in its residual */
    const int32_t *hsel; /* [w1 − w0, kk] the wave's selection (host-readable) */
    int64_t w0, w1;      /* the wave: the rank's rows [w0, w1) */
    const float *Q;      /* [rows of the wave, H, rkv+dr] */
    float *O, *LSE;      /* [rows of the wave, H, rkv], [.., H] */
    int32_t *loc, *hloc; /* [Cq, kk] a query chunk's rows in a block (the backend's, its host view) */
    float *ob, *lb;      /* [Cq, H, rkv], [Cq, H] the block's partial */
    void **ip;           /* index keys: [pages] the prompt's pages (full layer), filled by the gather */
    int64_t kk, Cq;
    ls_arena *sc;
    /* the sweep's backward (ls_mla_gather_latent_grad): ∂L/∂ō of the wave's rows, their
     * ∂L/∂(queries) (+=), a query chunk's share */
    const float *DOB;
    float *DQA, *dqb;
} ls_mla_gather;
ls_status ls_mla_gather_index(void *ctx, int seg, void *const *k, void *const *v, int64_t nb, int64_t rows,
                              int64_t row0);
ls_status ls_mla_gather_latent(void *ctx, int seg, void *const *k, void *const *v, int64_t nb, int64_t rows,
                               int64_t row0);
ls_status ls_mla_gather_latent_grad(void *ctx, int seg, void *const *k, void *const *v, float *const *dk,
                                    float *const *dv, int64_t nb, int64_t rows, int64_t row0);
ls_status ls_mla_cp_index_table(const ls_mla_model *m, const ls_prompt_state *st, int l, const ls_dist_segs *segs,
                                const int64_t *lo, int64_t bp, ls_mla_gather *G, ls_arena *sc);
/* The layer-major full-mode sweep under CP (mla_sweep.c; decoder.h's cp_sweep_layer) and
 * what one of the rank's positions keeps in it. */
ls_status ls_mla_cp_sweep_layer(const ls_dec_model *dm, const ls_dec_grad *g, ls_prompt_state *st,
                                const ls_prompt_state *hst, int l, const float *x, float *dx, const ls_fwd_opts *o,
                                ls_arena *ta, ls_arena *sc);
size_t ls_mla_cp_sweep_bytes(const ls_config *c);

/* Pieces of the layer's backward (mla_bwd.c), which the layer-major CP sweep runs apart:
 * the output side (o_proj, W_UV) into dob = ∂L/∂ō; the query path from dqa = ∂L/∂(absorbed
 * queries), the latent rows' from down = ∂L/∂(own rows), both into dxn (+=); the MoE
 * block's from dres (dxn +=). Gradients (+=) into gw. */
ls_status ls_mla_out_bwd(const ls_mla_model *m, int l, ls_mla_layer *gw, const float *dy, const float *ov,
                         const float *o, float *dob, int64_t T, ls_arena *sc);
ls_status ls_mla_q_bwd(const ls_mla_model *m, int l, ls_mla_layer *gw, const float *dqa, const float *q,
                       const float *cq, const float *cq_raw, const float *rstd_q, const float *xn, float *dxn,
                       int64_t T, int64_t pos0, ls_arena *sc);
ls_status ls_mla_kv_bwd(const ls_mla_model *m, int l, ls_mla_layer *gw, float *down, const float *lat_raw,
                        const float *rstd_kv, const float *xn, float *dxn, int64_t T, int64_t pos0, ls_arena *sc);
ls_status ls_mla_moe_bwd(const ls_mla_model *m, int l, ls_mla_layer *gw, const mla_layer_tape *tp, const float *dres,
                         float *dxn, int64_t T, ls_arena *sc);

/* The family as the model driver runs it (decoder.h); mp: its per-pass state. */
typedef struct {
    int32_t *sel, *loc; /* [T, kk] the most recent full layer's selection, as this rank's rows under CP */
    int64_t kk;
    int sel_layer;      /* the layer-major sweep: the full layer whose selection sel holds (−1: none) */
} ls_mla_pass;
ls_dec_model ls_mla_dec(const ls_mla_model *m, ls_mla_pass *mp);
/* its layer backward (mla_bwd.c) */
ls_status ls_mla_layer_bwd(const ls_dec_model *dm, const ls_dec_grad *g, const ls_dec_branch *tape, int l, float *dx,
                           const ls_dec_dstate *dc, ls_arena *sc);

#endif
