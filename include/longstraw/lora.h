/*
 * lora.h — LoRA adapters on the hybrid family, in PEFT's format and semantics
 * (tests/reference/README.md "LoRA"): an adapted HF weight W [out, in] — named and
 * laid out as the checkpoint stores it — becomes W_eff = W + (alpha/r)·B·A with
 * A [r, in] and B [out, r] (r per module, from A's shape). Adapter tensors are named
 * `base_model.model.<HF weight name without .weight>.lora_{A,B}.weight`. The delta is
 * added in the on-disk row order (for Qwen3-Next's fused in_proj_qkvz / in_proj_ba the
 * per-key-head interleaved order), then placed through the same HF → internal row
 * mapping as hybrid_load.c. Only 2-D `.weight` tensors can be targets: embed_tokens is
 * rejected, and so are HF v5 fused experts (3-D gate_up_proj / down_proj); the tied
 * LM head is not a separate weight.
 *
 * Usage per step: ls_lora_merge(L, base, eff) → forward/backward of `eff` with a
 * full-weight gradient set dW → ls_lora_backward(L, dW) → optimizer on ls_lora_params.
 */
#ifndef LONGSTRAW_LORA_H
#define LONGSTRAW_LORA_H

#include <stdint.h>

#include "longstraw/core.h"
#include "longstraw/hybrid.h"

typedef struct ls_lora ls_lora; /* opaque; everything inside from the given arenas */

/* ---- any family: its adaptable weights and where they live ---------------------------- */
/* One 2-D HF weight a family offers as a LoRA target: HF rows [0, out) map onto rows
 * row0.. of slot `field` (offsetof in the family's layer struct) of layer `layer` (−1: the
 * LM head) when map is LS_LORA_MAP_RANGE; the hybrid family also has per-head maps. */
#define LS_LORA_MAP_RANGE 0
typedef struct {
    char name[192]; /* HF name without ".weight" */
    int layer;
    size_t field;
    int map;
    int64_t row0, out, in;
    int64_t order; /* position in the model's layer order (set by the library) */
} ls_lora_target;

/* A model-shaped set of tensors of some family: its layer structs (layer_size bytes each)
 * and LM head, where merge writes and backward reads. */
typedef struct {
    char *layers;
    size_t layer_size;
    float *lm_head;
    int n_layers;
} ls_lora_view;

/* ls_lora_load / ls_lora_new over a family's targets (in layer order); `layout` describes
 * the checkpoint in errors; `be` is the base model's backend. */
ls_status ls_lora_load_targets(ls_lora **out, const ls_lora_target *targets, int64_t ntargets, const ls_config *cfg,
                               const ls_backend *be, const char *layout, const char *path, double alpha, ls_arena *fixed, ls_arena *grad);
ls_status ls_lora_new_targets(ls_lora **out, const ls_lora_target *targets, int64_t ntargets, const ls_config *cfg,
                              const ls_backend *be, const char *names, int rank, double alpha, uint64_t seed, ls_arena *fixed,
                              ls_arena *grad);
/* dst's adapted tensors += (alpha/r)·B·A (dst holds the base values already). */
void ls_lora_merge_view(const ls_lora *L, const ls_lora_view *dst);
/* The adapters' gradients (+=) from ∂L/∂W_eff in dW (ls_lora_backward). */
void ls_lora_backward_view(ls_lora *L, const ls_lora_view *dW);
/* adapter_config.json as PEFT writes it (the fields a loader needs), atomically. */
ls_status ls_lora_write_config(const char *path, const ls_lora *L);

/* Adapters from a PEFT safetensors file; each module must name a 2-D HF weight the model
 * holds (in the checkpoint's own layout: m->prefix, m->fused_gdn, m->fused_experts), with
 * A [r, in] and B [out, r] matching its shape; errors name the tensor. Modules are kept in
 * the model's layer order, as ls_lora_new keeps them. Weights from `fixed`; adapter gradients (zeroed) from `grad`. */
ls_status ls_lora_load(ls_lora **out, const ls_hybrid_model *m, const char *path, double alpha,
                       ls_arena *fixed, ls_arena *grad);

/* New adapters on every 2-D HF weight whose last module component (e.g. q_proj,
 * in_proj_qkvz, out_proj, gate_proj — per-expert projections included, `gate` is the
 * router) is in the comma list `targets`; rank r, PEFT init: A ~ U(−1/sqrt(in),
 * 1/sqrt(in)) (kaiming-uniform a=sqrt(5)), B = 0, drawn from ls_rng seeded by `seed`.
 * Modules are kept in checkpoint (layer) order. A target that matches nothing is an
 * error naming it. Memory as ls_lora_load. */
ls_status ls_lora_new(ls_lora **out, const ls_hybrid_model *m, const char *targets, int rank,
                      double alpha, uint64_t seed, ls_arena *fixed, ls_arena *grad);

/* dst (same shape as base, e.g. from ls_hybrid_alloc_like) = base + (alpha/r)·B·A on every
 * adapted weight (rows placed through the HF→internal row mapping), base elsewhere
 * (copied). dst == base merges in place. No allocation besides a small malloc'd list. */
void ls_lora_merge(const ls_lora *L, const ls_hybrid_model *base, ls_hybrid_model *dst);

/* Given full-weight gradients dW in the internal layout (∂L/∂W_eff), accumulate (+=)
 * dA = (alpha/r)·Bᵀ·dW_hf and dB = (alpha/r)·dW_hf·Aᵀ (dW_hf = dW gathered in HF row
 * order). Only the adapted rows of dW are read. */
void ls_lora_backward(ls_lora *L, const ls_hybrid_model *dW);

/* Parallel lists (same order: per module A then B) of adapter weights and gradients,
 * for the optimizer (no_decay = 0: adapters get weight decay as in the reference;
 * `what` = the PEFT tensor name). Arrays malloc'd by the callee (caller frees each);
 * w or g may be NULL when not wanted. The Adam moments belong to the optimizer. */
ls_status ls_lora_params(const ls_lora *L, ls_param **w, ls_param **g, int64_t *n);
void ls_lora_zero_grad(ls_lora *L);

/* Write adapter weights (grads = 0) or gradients (grads = 1) under PEFT names, f32, to
 * `to` (a file, atomically — LS_ST_FILE(path) — or a callback; ls_st_emit), with
 * "format": "pt" and an optional metadata key/value (meta_key NULL: none). */
ls_status ls_lora_export(const ls_lora *L, int grads, const ls_st_sink *to, const char *meta_key,
                         const char *meta_value);

/* Side branches (the policy = base + adapters without a merged copy): after the base
 * projection out[T, N] = x[T, K]·W[off .. off+N)ᵀ of internal tensor `field` of `layer`
 * (rows off .. off+N of it; layer −1 = LM head), add s·(x·Aᵀ)·Bᵀ on the rows adapters
 * cover. The backward adds dx += s·(dy·B)·A and accumulates dA, dB (+=) from the
 * projection's input x. Transients from `sc`. ls_lora_side_ok: no adapter on the LM
 * head (whose fused log-prob kernel has no side branch): side mode is possible. */
int ls_lora_side_ok(const ls_lora *L);
ls_status ls_lora_linear_fwd(const ls_lora *L, int layer, size_t field, int64_t off, int64_t N, float *out,
                             const float *x, int64_t T, ls_arena *sc);
ls_status ls_lora_linear_bwd(ls_lora *L, int layer, size_t field, int64_t off, int64_t N, float *dx,
                             const float *dy, const float *x, int64_t T, ls_arena *sc);

int64_t ls_lora_count(const ls_lora *L); /* adapted modules */
double ls_lora_alpha(const ls_lora *L); /* the alpha given at load / new */
int64_t ls_lora_rank(const ls_lora *L);  /* r of the first module (PEFT's "r") */
/* Does some module adapt internal tensor `field` (offsetof(ls_hybrid_layer, ...)) of
 * `layer`? layer −1 is the LM head (field ignored). */
int ls_lora_adapts(const ls_lora *L, int layer, size_t field);
/* HF weight name (without ".weight") of module i, or NULL when i is out of range. */
const char *ls_lora_module_name(const ls_lora *L, int64_t i);

#endif
