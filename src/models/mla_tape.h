/*
 * mla_tape.h — what a branch forward of the MLA family saves for its backward (private
 * to src/models). Everything lives in the tape arena (the branch arena) and dies when
 * it is reset after the member's backward (DESIGN §3–4). The family table passes it as
 * the opaque ls_branch_tape.
 */
#ifndef LONGSTRAW_MLA_TAPE_H
#define LONGSTRAW_MLA_TAPE_H

#include "decoder.h"
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

/* The family as the model driver runs it (decoder.h); mp: its per-pass state. */
typedef struct {
    int32_t *sel, *loc; /* [T, kk] the most recent full layer's selection, as this rank's rows under CP */
    int64_t kk;
} ls_mla_pass;
ls_dec_model ls_mla_dec(const ls_mla_model *m, ls_mla_pass *mp);
/* its layer backward (mla_bwd.c) */
ls_status ls_mla_layer_bwd(const ls_dec_model *dm, const ls_dec_grad *g, const ls_dec_branch *tape, int l, float *dx,
                           const ls_dec_dstate *dc, ls_arena *sc);

#endif
