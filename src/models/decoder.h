/*
 * decoder.h — the decoder layer both families fill, written once (issue 20): the
 * layer skeleton (pre-norm, the family's mixer, residual; post-norm, a dense SwiGLU or
 * the family's MoE, residual) forward and backward, the SwiGLU feed-forward on rows
 * (dense MLP, shared experts, one routed expert) with its optional LoRA side branches,
 * and the routed experts of an MoE layer (gather each expert's rows, run it, combine
 * by the router's weights). Everything runs through the model's backend (backend.h).
 * Internal to src/models/.
 */
#ifndef LONGSTRAW_MODELS_DECODER_H
#define LONGSTRAW_MODELS_DECODER_H

#include <stddef.h>
#include <stdint.h>

#include "longstraw/backend.h"
#include "longstraw/lora.h"

/* Which adapters an FFN's two projections carry (rows [gu_off, +2I) of internal tensor
 * `gu` and [down_off, +D) of `down` of `layer`, lora.h); lora NULL: none. The model holds
 * its adapters const: the backward writes only their gradient buffers. */
typedef struct {
    const ls_lora *lora;
    int layer;
    size_t gu, down;
    int64_t gu_off, down_off;
} ls_ffn_lora;

/* SwiGLU on rows xs [n, D] with fused [gate ; up] rows gu_w [2I, D] and down_w [D, I]:
 * out [n, D] (= or += when accumulate) down(SiLU(gate) ⊙ up). gu [n, 2I] and act [n, I]
 * are kept when given (a tape), else taken from scratch. fl NULL: no adapters. */
ls_status ls_dec_swiglu_fwd(const ls_backend *be, float *out, float *gu, float *act, const float *xs, int64_t n,
                            int64_t D, int64_t I, const float *gu_w, const float *down_w, int accumulate,
                            const ls_ffn_lora *fl, ls_arena *sc);
/* Its backward from dout [n, D]: dxs [n, D] (= or +=), dgu_w and ddown_w (+=; NULL skips),
 * the adapters' gradients; gu and act are the forward's. */
ls_status ls_dec_swiglu_bwd(const ls_backend *be, float *dxs, float *dgu_w, float *ddown_w, const float *dout,
                            const float *xs, const float *gu, const float *act, const float *gu_w, const float *down_w,
                            int64_t n, int64_t D, int64_t I, int accumulate, const ls_ffn_lora *fl, ls_arena *sc);

/* The routed experts [e0, e0 + ne) of one MoE layer that this rank holds (all of them
 * without expert parallelism): weights stacked from e0, gradients (NULL: none) likewise. */
typedef struct {
    int64_t D, I; /* hidden size, expert intermediate size */
    int E, K;     /* experts, experts per token */
    int64_t e0, ne;
    const float *gu_w, *down_w; /* [ne, 2I, D], [ne, D, I] */
    float *dgu_w, *ddown_w;     /* gradients of the same shape, or NULL */
    /* adapters: gu and down name the stacked tensors (offsets are per expert), lora NULL: none */
    ls_ffn_lora lora;
} ls_dec_experts;

/* y [T, D] += Σ_k wt[t, k]·E_sel[t,k](xn[t]) over this rank's experts, expert by expert in
 * index order; sel, wt [T, K] from the router. */
ls_status ls_dec_experts_fwd(const ls_backend *be, const ls_dec_experts *ex, float *y, const float *xn,
                             const int32_t *sel, const float *wt, int64_t T, ls_arena *sc);
/* The backward from dy [T, D] = ∂L/∂y, the experts recomputed from the forward's xn:
 * dwt [T, K] (=, only the slots routed to this rank's experts; the caller zeroes the
 * others), dxn [T, D] (+=), the experts' weight and adapter gradients (+=). */
ls_status ls_dec_experts_bwd(const ls_backend *be, const ls_dec_experts *ex, float *dwt, float *dxn, const float *dy,
                             const float *xn, const int32_t *sel, const float *wt, int64_t T, ls_arena *sc);

/* ---- the device boundary of a family's entries ---------------------------------------
 * What the family table takes and gives (token ids, targets, log-probs, entropies, their
 * gradients, logits) is host memory; every op takes the backend's. These stage it across
 * once per entry. On a host-memory backend (the CPU's) they are the identity: no copy. */
/* ids [n] as the backend's memory: ids itself, or a copy from arena a. */
const int32_t *ls_dec_ids_in(const ls_backend *be, ls_arena *a, const int32_t *ids, int64_t n);
/* x [n] floats as the backend's memory (a gradient given by the host): x, or a copy. */
const float *ls_dec_in(const ls_backend *be, ls_arena *a, const float *x, int64_t n);
/* Where an op writes an output of n floats the host reads at `out` (NULL: none): out
 * itself, or n floats of arena a; ls_dec_out_done copies it back. */
float *ls_dec_out(const ls_backend *be, ls_arena *a, float *out, int64_t n);
void ls_dec_out_done(const ls_backend *be, float *out, const float *buf, int64_t n);

/* ---- the layer skeleton -------------------------------------------------------------- */
typedef enum {
    LS_NORM_ZERO_CENTRED, /* y = x·rsqrt(mean(x²)+eps)·(1+w) (the hybrid family) */
    LS_NORM_PLAIN         /* y = x·rsqrt(mean(x²)+eps)·w (the MLA family) */
} ls_norm_kind;

/* What the skeleton keeps for a layer's backward (inside the family's layer tape). */
typedef struct {
    float *x_in, *xn1, *rstd1;  /* [T, D] layer input, input-norm output, [T] */
    float *x_mid, *xn2, *rstd2; /* [T, D] residual after the mixer, post-norm output, [T] */
    float *gu, *act;            /* dense FFN: [T, 2I], [T, I] */
} ls_dec_tape;

typedef struct ls_dec_layer ls_dec_layer;
/* A family's part of a layer: forward x [T, D] (+=) part(xn); backward dxn (+=) the
 * gradient w.r.t. xn from dres = ∂L/∂(the part's output), its weights' (+=). */
typedef ls_status (*ls_dec_part)(const ls_dec_layer *d, float *x, const float *xn);
typedef ls_status (*ls_dec_part_bwd)(const ls_dec_layer *d, const float *dres, float *dxn);

/* One layer as the skeleton runs it: the family fills the norms, its mixer, its MoE
 * (NULL: the dense SwiGLU from gu_w/down_w with the adapters in `lora`) and `ctx`. */
struct ls_dec_layer {
    const ls_backend *be;
    int64_t T, D, I; /* tokens, hidden size, dense FFN intermediate size */
    float eps;
    ls_norm_kind norm;
    const float *input_norm, *post_norm; /* [D] */
    float *d_input_norm, *d_post_norm;   /* backward: their gradients (+=; NULL skips) */
    ls_dec_part mixer, moe;
    ls_dec_part_bwd mixer_bwd, moe_bwd;
    const float *gu_w, *down_w; /* dense FFN [2I, D], [D, I] */
    float *dgu_w, *ddown_w;     /* backward: their gradients (+=; NULL skips) */
    ls_ffn_lora lora;
    ls_dec_tape *tp;           /* forward: record here (NULL: no tape) */
    const ls_dec_tape *saved;  /* backward: what the forward recorded */
    ls_arena *ta, *sc;     /* tape arena (with tp), scratch */
    void *ctx;             /* the family's */
};

/* x [T, D] through the layer; skip_ffn: the mixer only (capture's last layer). */
ls_status ls_dec_layer_fwd(const ls_dec_layer *d, float *x, int skip_ffn);
/* dx [T, D] = ∂L/∂(layer output) → ∂L/∂(layer input) in place, weights' gradients (+=). */
ls_status ls_dec_layer_bwd(const ls_dec_layer *d, float *dx);

#endif
