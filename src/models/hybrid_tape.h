/*
 * hybrid_tape.h — what a branch forward saves for its backward (private to
 * src/models). Every pointer lives in the tape arena (the branch arena) and dies
 * when that arena is reset after the member's backward (DESIGN §3–4).
 */
#ifndef LONGSTRAW_HYBRID_TAPE_H
#define LONGSTRAW_HYBRID_TAPE_H

#include "decoder.h"
#include "longstraw/hybrid.h"

typedef struct {
    ls_dec_tape dec; /* the skeleton's: layer input, norms, residual after the mixer, dense FFN */
    /* Gated DeltaNet: the recurrence runs on [seg0, T) with a tape; rows < seg0 are
     * the detached prompt part of the naive mode (seg0 = 0 for a branch). */
    int64_t seg0;
    float *qkv;    /* [T, conv_dim] pre-conv */
    float *cpre;   /* [T, conv_dim] conv pre-activation */
    float *tail0;  /* [W−1, conv_dim] conv tail at seg0 */
    float *qn, *kn; /* [T, H_k, d_k] L2-normalised */
    float *rq, *rk; /* [T·H_k] saved 1/norm */
    float *y;      /* [T, conv_dim] post conv+SiLU (q, k raw; v) */
    float *z;      /* [T, value_dim] */
    float *ba;     /* [T, 2·H_v] b | a */
    float *beta, *g; /* [T, H_v] */
    float *S0;     /* [H_v, d_k, d_v] state at seg0 */
    float *tape_h; /* [ceil((T−seg0)/64), H_v, d_k, d_v] */
    float *o;      /* [T, H_v, d_v] recurrence output */
    float *grstd;  /* [T·H_v] gated-norm rstd */
    float *on;     /* [T, value_dim] gated-norm output (out_proj input) */
    /* gated attention */
    float *qraw, *kraw; /* [T, n_h·hd], [T, n_kv·hd] before q/k norm */
    float *rsq, *rsk;   /* [T·n_h], [T·n_kv] */
    float *qr, *kr; /* after norm + RoPE: [T, n_h, hd], [T, n_kv, hd] */
    float *v;       /* attention [T, n_kv, hd]; GDN [T, H_v, d_v] (recurrence input) */
    float *gate;   /* [T, n_h·hd] */
    float *ao;     /* [T, n_h·hd] attention output */
    float *lse;    /* [T, n_h] */
    float *aog;    /* [T, n_h·hd] ao ⊙ σ(gate) (o_proj input) */
    ls_kv_prefix prefix;
    int has_prefix;
    const ls_comm *cp; /* the prefix is this rank's share of a split prompt state (cp.h) */
    /* a sweep chunk under CP: its queries also read the earlier segments of other ranks
     * (cp_seg: the chunk's segment), streamed in blocks of cp_block pages, in forward and
     * again in backward (which sends their dK/dV back to their owners) */
    const ls_prompt_state *cp_sweep;
    int cp_seg;
    int64_t cp_block;
    /* FFN */
    float *probs;  /* MoE: [T, E] router softmax */
    int32_t *sel;  /* [T, K] */
    float *wt;     /* [T, K] combine weights */
    float *sh_gu, *sh_act, *sh_out, *sh_s; /* shared expert: [T,2I_s], [T,I_s], [T,D], [T] logit */
} ls_layer_tape;

struct ls_branch_tape {
    ls_dec_branch h;       /* the driver's: rows, ids, targets, final norm, LM head */
    ls_layer_tape *layers; /* [n_layers] */
};

/* The family as the model driver runs it (decoder.h); hp: its per-pass state. */
typedef struct {
    float *S, *tail; /* a branch's private copy of a GDN layer's state and conv tail */
} ls_hybrid_pass;
ls_dec_model ls_hybrid_dec(const ls_hybrid_model *m, ls_hybrid_pass *hp);
/* Its backward hooks (hybrid_bwd.c): a layer; another rank's sweep chunk served; d(S,
 * conv tail) of every GDN layer sent to or received from a neighbouring chunk's owner. */
ls_status ls_hybrid_layer_bwd(const ls_dec_model *dm, const ls_dec_grad *g, const ls_dec_branch *tape, int l,
                              float *dx, const ls_dec_dstate *dc, ls_arena *sc);
ls_status ls_hybrid_sweep_serve(const ls_dec_model *dm, ls_prompt_state *st, int owner, int64_t lo, int l, int bwd,
                                const ls_fwd_opts *o, ls_arena *sc);
ls_status ls_hybrid_sweep_relay(const ls_dec_model *dm, ls_prompt_state *st, int peer, int send, int l);
/* Pages per transferred block under CP: about one capture chunk. */
int64_t ls_hybrid_cp_block(const ls_prompt_state *st, const ls_fwd_opts *o);
/* The bytes one of the rank's positions keeps in a wave of an attention layer's CP capture
 * (hybrid.c: q, gate, o, lse). */
size_t ls_hybrid_cp_attn_wave_bytes(const ls_config *c);
/* The same for a Gated DeltaNet layer's state scan (o, z, the correction vectors u). */
size_t ls_hybrid_cp_scan_wave_bytes(const ls_config *c);
/* Send this rank's pages of attention layer l that precede position `lo` to `dst`,
 * block by block (the sweep's recomputed forward of another rank's chunk reads them). */
ls_status ls_hybrid_cp_send_pages(const ls_prompt_state *st, int l, int dst, int64_t lo, int64_t bp, ls_arena *sc);

/* ---- a layer's pieces, which the CP capture and the layer-major sweep run apart ------
 * (hybrid.c; the layer functions compose them). The Gated DeltaNet mixer's input
 * projections of rows xn [T, D] (with their adapters): qkv [T, conv_dim] pre-conv, and
 * when given z [T, value_dim] and ba [T, 2·H_v]; its output: x [T, D] += out_proj(
 * gated_norm(o, z)), the norm's output into on (may be o), its rstd into grstd (NULL: not
 * kept). */
ls_status ls_hybrid_gdn_in_proj(const ls_hybrid_model *m, const ls_hybrid_layer *w, int l, const float *xn, int64_t T,
                                float *qkv, float *z, float *ba, ls_arena *sc);
ls_status ls_hybrid_gdn_out_proj(const ls_hybrid_model *m, const ls_hybrid_layer *w, int l, float *x, float *on,
                                 float *grstd, const float *o, const float *z, int64_t T, ls_arena *sc);
/* Gated attention's input projections of rows xn: q and gate [T, n_h·hd], q normed per
 * head into qr (may be q; rstd into rsq, NULL: not kept); k, v [T, n_kv·hd], k normed into
 * kr (rsk). Its output: x += o_proj(o ⊙ σ(gate)), the gated rows into og (may be o). */
ls_status ls_hybrid_attn_q_proj(const ls_hybrid_model *m, const ls_hybrid_layer *w, int layer, const float *xn,
                                int64_t T, float *q, float *gate, float *qr, float *rsq, ls_arena *sc);
ls_status ls_hybrid_attn_kv_proj(const ls_hybrid_model *m, const ls_hybrid_layer *w, int layer, const float *xn,
                                 int64_t T, float *k, float *v, float *kr, float *rsk, ls_arena *sc);
ls_status ls_hybrid_attn_out_proj(const ls_hybrid_model *m, const ls_hybrid_layer *w, int layer, float *x, float *og,
                                  const float *o, const float *gate, int64_t T, ls_arena *sc);
/* The sparse MoE block of layer l on rows xn [T, D] (x +=), recording into tp (tape
 * arena ta) when given; its backward from dres (dxn +=, gw's gradients +=). */
ls_status ls_hybrid_moe_fwd(const ls_hybrid_model *m, int l, float *x, const float *xn, int64_t T, ls_layer_tape *tp,
                            ls_arena *ta, ls_arena *sc);
ls_status ls_hybrid_moe_bwd(const ls_hybrid_model *m, int l, ls_hybrid_layer *gw, const ls_layer_tape *tp,
                            const float *dres, float *dxn, int64_t T, ls_arena *sc);
/* The merge of another rank's gathered block (ls_dist_pages_gather's fn) into the
 * queries of the rank's rows [w0, w1) after the block's segment, in query chunks of C. */
typedef struct {
    const ls_hybrid_model *m;
    const ls_prompt_state *st;
    const float *Q;      /* [rows of the wave, n_h, hd] the roped queries */
    float *O, *LSE;      /* [.., n_h, hd], [.., n_h] their merged outputs */
    float *ob, *lb;      /* a query chunk's partial over a block */
    const int64_t *xoff; /* the rank's segments' first rows */
    int64_t C, w0, w1;   /* query chunk; the wave: the rank's rows [w0, w1) */
    ls_arena *sc;
} ls_hybrid_gather;
ls_status ls_hybrid_gather_block(void *ctx, int seg, void *const *kp, void *const *vp, int64_t nb, int64_t rows,
                                 int64_t row0);
/* The full-mode sweep under CP, layer-major (hybrid_sweep.c; decoder.h's cp_sweep_layer)
 * and what one of the rank's positions keeps in it. */
ls_status ls_hybrid_cp_sweep_layer(const ls_dec_model *dm, const ls_dec_grad *g, ls_prompt_state *st,
                                   const ls_prompt_state *hst, int l, const float *x, float *dx, const ls_fwd_opts *o,
                                   ls_arena *ta, ls_arena *sc);
size_t ls_hybrid_cp_sweep_bytes(const ls_config *c);

/* ---- LoRA side branches, shared by the forward and the backward -------------------- */
#include <stddef.h>

#include "decoder.h"
#include "longstraw/lora.h"

/* After a base projection: rows [off, off+N) of internal tensor `fld` of `layer`
 * (lora.h). A no-op without adapters; returns on error. */
#define LORA_FWD(m, layer, fld, off, N, out, x, T, sc)                                                          \
    do {                                                                                                        \
        if ((m)->lora)                                                                                          \
            LS_TRY(ls_lora_linear_fwd((m)->lora, (layer), offsetof(ls_hybrid_layer, fld), (off), (N), (out), (x), \
                                      (T), (sc)));                                                              \
    } while (0)


/* The backward's: dx += s·(dy·B)·A and the adapters' gradients (their buffers are
 * written; the model holds its adapters const). */
#define LORA_BWD(m, layer, fld, off, N, dx, dy, x, T, sc)                                                        \
    do {                                                                                                         \
        if ((m)->lora)                                                                                           \
            LS_TRY(ls_lora_linear_bwd((ls_lora *)(m)->lora, (layer), offsetof(ls_hybrid_layer, fld), (off), (N),  \
                                      (dx), (dy), (x), (T), (sc)));                                              \
    } while (0)

/* A sub-block of a gradient tensor, or NULL when the tensor has no gradient buffer
 * (frozen under LoRA: its weight gradient is skipped, not computed). */
#define GOFF(p, off) ((p) ? (p) + (off) : NULL)

static inline ls_ffn_lora ffn_of(const ls_hybrid_model *m, int l, size_t gu, size_t down, int64_t gu_off,
                              int64_t down_off) {
    ls_ffn_lora f = {m->lora, l, gu, down, gu_off, down_off};
    return f;
}

#endif
