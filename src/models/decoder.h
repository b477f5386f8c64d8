/*
 * decoder.h — what both families share, written once: the model driver (issue 33:
 * capture, CP capture, decode, branch forward and backward, the full-mode sweep over
 * the family's layer hooks), the decoder layer skeleton (issue 20: pre-norm, the
 * family's mixer, residual; post-norm, a dense SwiGLU or the family's MoE, residual)
 * forward and backward, the SwiGLU feed-forward on rows (dense MLP, shared experts, one
 * routed expert) with its optional LoRA side branches, and the routed experts of an MoE
 * layer. Everything runs through the model's backend (backend.h). Internal to src/models/.
 */
#ifndef LONGSTRAW_MODELS_DECODER_H
#define LONGSTRAW_MODELS_DECODER_H

#include <stddef.h>
#include <stdint.h>

#include "longstraw/backend.h"
#include "longstraw/cp.h"
#include "longstraw/family.h"
#include "longstraw/state.h"
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
/* The layer's first norm alone: xn [T, D] (=) norm1(x) (no tape). */
void ls_dec_norm1_fwd(const ls_dec_layer *d, float *xn, const float *x);
/* The layer's second half alone on x [T, D] after its mixer: x += FFN(norm2(x)) (no tape). */
ls_status ls_dec_ffn_fwd(const ls_dec_layer *d, float *x);
/* The first norm's backward alone: dx [T, D] += ∂/∂x of norm1(x) applied to dxn, its
 * weight's gradient (+=). The norm is linear in dxn, so a mixer's input gradient may come
 * in parts (the layer-major sweep's). A tape whose x_mid is NULL (skip_ffn) has no FFN:
 * ls_dec_layer_bwd runs the mixer's part only. */
ls_status ls_dec_norm1_bwd(const ls_dec_layer *d, float *dx, const float *dxn, const float *x);

/* ---- the model skeleton (issue 33): one driver for both families ----------------------
 * Capture (one rank, and under context parallelism), decode, a branch forward with or
 * without a tape, its backward and the full-mode sweep are written once, here: the
 * embedding, the chunking of the prompt, the schedules over the ranks, the final norm
 * and the LM head, the tape's head. A family keeps its layers (mixer, MoE, the state
 * they read and write) behind the hooks of ls_dec_model. */

/* What every branch tape begins with (a family's tape struct has it as its first member). */
typedef struct {
    int64_t T, out_from, grad_from, pos0;
    const int32_t *ids;    /* [T] the backend's copy, alive until backward */
    const int32_t *target; /* [T − out_from] */
    float *x_final;        /* [T − out_from, D] final-norm input */
    float *rstd_f;         /* [T − out_from] */
    float *h_final;        /* [T − out_from, D] LM-head input */
    float *lse;            /* [T − out_from] */
    float temperature;
    int64_t lmhead_rows;
    /* a prefix in host memory (--state-on host): its stage, re-staged layer by layer in
     * the backward (NULL: the prefix is where the ops read it) */
    ls_state_stage *stage;
} ls_dec_branch;

typedef enum {
    LS_DEC_EXTEND,     /* capture or a decode step of one sequence: chunks appended to st */
    LS_DEC_CP_CAPTURE, /* capture of a state split over ranks (st->nranks > 1): begin only, over
                        * the rank's positions (T); the layers are cp_layer's */
    LS_DEC_DECODE,     /* batched decode: row i continues seqs[i] (ls_dec_model.batched_decode) */
    LS_DEC_BRANCH      /* a branch against the read-only view (or a sweep chunk, sweep >= 0) */
} ls_dec_pass_kind;

/* One pass of the driver over rows [pos0, pos0 + T) as the family's layer hook sees it. */
typedef struct {
    ls_dec_pass_kind kind;
    int64_t T, pos0, grad_from;
    ls_prompt_state *st;          /* EXTEND / CP_CAPTURE: the state written (EXTEND: its n = pos0) */
    const ls_prompt_state *view;  /* BRANCH: the read-only prefix (NULL: none) */
    ls_prompt_state *const *seqs; /* DECODE */
    int sweep;                    /* BRANCH: the layout segment of a sweep chunk, −1: a branch */
    void *tape; /* the family's tape (NULL: none) */
    const ls_fwd_opts *o;
    ls_arena *ta, *sc; /* tape arena (with a tape), scratch */
} ls_dec_pass;

/* Where the prompt state's gradient goes (full mode); st NULL when prefix-frozen. A
 * branch adds its dState; a sweep chunk (sweep = 1) also reads the incoming gradient of
 * its own positions and of the state it ended with. aux_sum: the MLA family's indexer
 * KL loss sum (NULL: no such loss). */
typedef struct {
    ls_prompt_state *st;
    int sweep;
    double *aux_sum;
} ls_dec_dstate;

/* A gradient set as the driver sees it: the shared tensors (NULL: not trained) and the
 * family's own struct for its layers. */
typedef struct {
    float *embed, *final_norm, *lm_head;
    void *fam;
} ls_dec_grad;

typedef struct ls_dec_model ls_dec_model;
struct ls_dec_model {
    const ls_backend *be;
    const ls_config *cfg;
    ls_norm_kind norm; /* of the final norm */
    const float *embed, *final_norm, *lm_head;
    const void *fam;   /* the family's model */
    void *pass_data;   /* the family's per-pass state (begin writes it, layer_fwd reads it) */
    int batched_decode;  /* a decode step runs all sequences' rows in one pass */
    int sweep_every_rank; /* under CP every rank recomputes every sweep chunk (else the
                           * owner does, serving the others and relaying d(state)) */
    /* The pass's family buffers, before its rows are embedded (NULL: none). */
    ls_status (*begin)(const ls_dec_model *dm, const ls_dec_pass *p);
    /* A tape for a branch: the family's struct (ls_dec_branch first), its layers' tapes,
     * all host bookkeeping of arena A; the driver fills the head. */
    ls_dec_branch *(*tape_new)(const ls_dec_model *dm, const ls_dec_pass *p, ls_arena *A);
    /* Layer l on x [T, D]; skip_ffn: the mixer only (capture's last layer). */
    ls_status (*layer_fwd)(const ls_dec_model *dm, const ls_dec_pass *p, int l, float *x, int skip_ffn);
    /* CP capture, layer-major: layer l over all of this rank's positions at once (x the
     * rank's residual stream [its positions, D], its segments one after another), with
     * what it needs of the other ranks exchanged collectively (the hybrid's Gated
     * DeltaNet: a state scan; attention: gathered pages). st: the state as the ops read
     * it (a host state's stage, layer l's pages and recurrent state staged); hst: the
     * state itself (where the sweep checkpoints go). */
    ls_status (*cp_layer)(const ls_dec_model *dm, ls_prompt_state *st, ls_prompt_state *hst, int l, float *x,
                          int skip_ffn, const ls_fwd_opts *o, ls_arena *sc);
    /* Layer l's backward: dx [T, D] ∂L/∂(output) → ∂L/∂(input), gradients (+=). */
    ls_status (*layer_bwd)(const ls_dec_model *dm, const ls_dec_grad *g, const ls_dec_branch *tape, int l, float *dx,
                           const ls_dec_dstate *dc, ls_arena *sc);
    /* Sweep under CP without sweep_every_rank, per layer: serve another rank's chunk at
     * `lo` (its forward: bwd 0, layers in order; then its backward: bwd 1, in reverse),
     * and relay layer l's d(state) to (send) or from the owner of a neighbouring chunk. */
    ls_status (*sweep_serve)(const ls_dec_model *dm, ls_prompt_state *st, int owner, int64_t lo, int l, int bwd,
                             const ls_fwd_opts *o, ls_arena *sc);
    ls_status (*sweep_relay)(const ls_dec_model *dm, ls_prompt_state *st, int peer, int send, int l);
    /* The full-mode sweep under CP, layer-major (NULL: the chunk-major sweep above): layer
     * l's backward over all of this rank's positions at once — x [rows, D] its input there
     * (the state's xres), dx [rows, D] ∂L/∂(its output) → ∂L/∂(its input) — parameter
     * gradients (+=) for the rank's positions, the pages' dK/dV to their holders; what it
     * needs of other ranks exchanged collectively. st as the ops read it (a host state's
     * stage: layer l's pages, gradient pages, d(state)), hst the state itself (its sweep
     * checkpoints, host memory when staged). cp_sweep_bytes: what one of the rank's
     * positions keeps in it (more than a wave holds: the chunk-major sweep runs). */
    ls_status (*cp_sweep_layer)(const ls_dec_model *dm, const ls_dec_grad *g, ls_prompt_state *st,
                                const ls_prompt_state *hst, int l, const float *x, float *dx, const ls_fwd_opts *o,
                                ls_arena *ta, ls_arena *sc);
    size_t (*cp_sweep_bytes)(const ls_config *c);
};

/* The rank's chunks of a CP capture in its rows [r0, r1) (rows: its positions, its
 * segments one after another), cut as the capture cuts them and at r0, r1: *k its
 * segment, *c0 the chunk's end (its first position is *c0 − *T), *T the count, *r its
 * first row; 0 past the end. Start with *k = 0, *c0 = −1. */
int ls_dec_cp_chunk(const ls_prompt_state *st, const int64_t *xoff, int64_t C, int64_t r0, int64_t r1, int *k,
                    int64_t *c0, int64_t *T, int64_t *r);
/* The layout's segments of layer l as a gather sees them (cp.h): every segment's owner
 * and positions, this rank's segments' K page tables (and V's when with_v; NULLs for the
 * other ranks' segments); *lo (NULL: not wanted) every segment's first position. Host
 * memory of sc. */
ls_status ls_dec_cp_segs(const ls_prompt_state *st, int l, int with_v, ls_arena *sc, ls_dist_segs *g, int64_t **lo);

/* Capture ids[0..n) into st (under CP: the whole prompt, once). */
ls_status ls_dec_capture(const ls_dec_model *dm, ls_prompt_state *st, const int32_t *ids, int64_t n,
                         const ls_fwd_opts *o, ls_arena *sc);
/* Extend st by ids[0..n) chunk by chunk; logits (NULL: none, a capture) of the last token
 * [vocab], scaled by 1/temperature. */
ls_status ls_dec_extend(const ls_dec_model *dm, ls_prompt_state *st, const int32_t *ids, int64_t n, float *logits,
                        const ls_fwd_opts *o, ls_arena *sc);
/* One decode step of n sequences: ids[i] continues sts[i]; logits [n, vocab]. */
ls_status ls_dec_decode(const ls_dec_model *dm, ls_prompt_state *const *sts, const int32_t *ids, int n,
                        float *logits, const ls_fwd_opts *o, ls_arena *sc);
/* A branch (family.h's branch_fwd); sweep >= 0: a sweep chunk of that layout segment. */
ls_status ls_dec_branch_fwd(const ls_dec_model *dm, const ls_prompt_state *view, const int32_t *ids, int64_t T,
                            int64_t out_from, int64_t grad_from, const int32_t *target, float *logprob,
                            float *entropy, ls_dec_branch **tape_out, const ls_fwd_opts *o, ls_arena *tape_arena,
                            ls_arena *sc, int sweep);
ls_status ls_dec_branch_bwd(const ls_dec_model *dm, const ls_dec_grad *g, const ls_dec_branch *tape,
                            const float *dlogprob, const ls_dec_dstate *dc, ls_arena *sc);
/* The full-mode sweep (DESIGN §3): every chunk of the prompt from last to first, a
 * taped branch against the pages before it, backward into g and the state's dState;
 * under CP layer-major when ls_dec_sweep_layer_major says so (the family's
 * cp_sweep_layer, its inputs kept, its all-position buffers within a wave). */
int ls_dec_sweep_layer_major(const ls_dec_model *dm, const ls_prompt_state *st, const ls_fwd_opts *o);
ls_status ls_dec_sweep(const ls_dec_model *dm, const ls_dec_grad *g, ls_prompt_state *st, const int32_t *ids,
                       const ls_fwd_opts *o, ls_arena *tape_arena, ls_arena *sc);

#endif
