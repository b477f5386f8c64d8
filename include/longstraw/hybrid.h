/*
 * hybrid.h — the hybrid family (Qwen3-Next / Qwen3.5: Gated DeltaNet + gated full
 * attention, dense SwiGLU or sparse MoE). Both HF weight layouts load into one
 * internal layout (fused projections, see ls_hybrid_layer). The family exposes:
 * load, capture (extend the prompt state, no tape) and branch forward (continue
 * from a read-only prompt state, or from nothing = the plain forward).
 */
#ifndef LONGSTRAW_HYBRID_H
#define LONGSTRAW_HYBRID_H

#include "longstraw/backend.h"
#include "longstraw/config.h"
#include "longstraw/core.h"
#include "longstraw/family.h"
#include "longstraw/state.h"

/* The family's layer kinds (ls_config.kind). */
enum { LS_LAYER_GDN = 0, LS_LAYER_ATTN = 1 };
/* Weight-name layout of the checkpoint (spec §6). */
typedef enum { LS_LAYOUT_QWEN3_NEXT = 0, LS_LAYOUT_QWEN3_5 = 1 } ls_layout;

/* The family's own config fields (ls_config.ext; spec §1; may_alias: read where
 * ls_config keeps bytes). */
typedef struct __attribute__((may_alias)) {
    ls_layout layout;
    int H_k, H_v, d_k, d_v, conv_k; /* Gated DeltaNet */
} ls_hybrid_config;
_Static_assert(sizeof(ls_hybrid_config) <= LS_CONFIG_EXT_BYTES, "ls_hybrid_config outgrew ls_config.ext");

static inline ls_hybrid_config *ls_hybrid_cfg_mut(ls_config *c) { return (ls_hybrid_config *)(void *)c->ext; }
static inline const ls_hybrid_config *ls_hybrid_cfg(const ls_config *c) {
    return (const ls_hybrid_config *)(const void *)c->ext;
}
static inline int64_t ls_cfg_key_dim(const ls_config *c) {
    return (int64_t)ls_hybrid_cfg(c)->H_k * ls_hybrid_cfg(c)->d_k;
}
static inline int64_t ls_cfg_value_dim(const ls_config *c) {
    return (int64_t)ls_hybrid_cfg(c)->H_v * ls_hybrid_cfg(c)->d_v;
}
static inline int64_t ls_cfg_conv_dim(const ls_config *c) { return 2 * ls_cfg_key_dim(c) + ls_cfg_value_dim(c); }

/* Internal per-layer weights, all f32 in the fixed arena; [out, in] row-major. */
typedef struct {
    float *input_norm; /* [D] zero-centred (1+w) */
    float *post_norm;  /* [D] */
    /* Gated DeltaNet (spec §2) */
    float *gdn_in;  /* [conv_dim + value_dim + 2·H_v, D]: rows q(all heads) | k | v | z | b | a */
    float *conv_w;  /* [conv_dim, W] */
    float *A_log;   /* [H_v] */
    float *dt_bias; /* [H_v] */
    float *gnorm;   /* [d_v] plain w */
    float *gdn_out; /* [D, value_dim] */
    /* gated attention (spec §4) */
    float *attn_in;  /* [2·n_h·hd + 2·n_kv·hd, D]: rows q(all heads) | gate(all heads) | k | v */
    float *q_norm;   /* [hd] (1+w) */
    float *k_norm;   /* [hd] (1+w) */
    float *attn_out; /* [D, n_h·hd] */
    /* dense SwiGLU */
    float *mlp_gu;   /* [2·I, D]: gate rows then up rows */
    float *mlp_down; /* [D, I] */
    /* sparse MoE (spec §5) */
    float *router;   /* [E, D] */
    float *exp_gu;   /* [E, 2·I_m, D] */
    float *exp_down; /* [E, D, I_m] */
    float *sh_gu;    /* [2·I_s, D] */
    float *sh_down;  /* [D, I_s] */
    float *sh_gate;  /* [D] */
} ls_hybrid_layer;

typedef struct ls_lora ls_lora;

typedef struct {
    ls_config cfg;
    const ls_backend *be; /* where its tensors live and its ops run (backend.h) */
    /* LoRA side branches (lora.h): non-NULL, every adapted projection adds s·B·A·x to
     * the frozen weights' output and the backward feeds the adapters; the struct is then
     * a view of the base (same tensors) — the policy beside the base as reference */
    const ls_lora *lora;
    float *embed;      /* [V, D] */
    float *final_norm; /* [D] */
    float *lm_head;    /* [V, D] (= embed when tied) */
    ls_hybrid_layer *layers; /* [n_layers] */
    size_t n_params;
    /* How the checkpoint was laid out, so exports use the same names (hybrid_load.c). */
    char prefix[32];   /* "model." or "model.language_model." */
    int fused_gdn;     /* Qwen3-Next in_proj_qkvz / in_proj_ba */
    int fused_experts; /* HF v5 experts.gate_up_proj / down_proj */
} ls_hybrid_model;

/* Load config.json + safetensors (single file or sharded) from `dir`; weights are
 * converted to f32 into `fixed` (the fixed arena). */
ls_status ls_hybrid_load(ls_hybrid_model *m, const char *dir, ls_arena *fixed);

/* Capture: stream ids[0..n) (x_1..x_{P−1}) through all layers in chunks, with no
 * tape, extending `st` (DESIGN §3). Transients come from `scratch` and die per chunk. */
ls_status ls_hybrid_capture(const ls_hybrid_model *m, ls_prompt_state *st, const int32_t *ids,
                            int64_t n, const ls_fwd_opts *o, ls_arena *scratch);

/* Extend `st` by ids[0..n) as capture does; when `logits` is non-NULL also return the
 * temperature-scaled logits [V] of the last token (the decode step of sampling). */
ls_status ls_hybrid_extend(const ls_hybrid_model *m, ls_prompt_state *st, const int32_t *ids,
                           int64_t n, float *logits, const ls_fwd_opts *o, ls_arena *scratch);

/* One decode step of n sequences at once: sequence i extends its own state sts[i]
 * (e.g. a fork, ls_state_fork) by the token ids[i]; logits[i·V .. (i+1)·V) = its next
 * token's logits divided by the temperature. Projections, FFNs and the LM head run as
 * one batch of n rows (matrix products instead of n matrix-vector passes over the
 * weights); the conv, delta rule and attention run per row against each state. */
ls_status ls_hybrid_decode(const ls_hybrid_model *m, ls_prompt_state *const *sts, const int32_t *ids, int n,
                           float *logits, const ls_fwd_opts *o, ls_arena *scratch);

/* Branch: run ids[0..T) at positions st->n .. st->n+T−1 against the read-only state
 * `st` (NULL = empty prefix: the plain forward) and write, for t in [out_from, T),
 * logprob[t − out_from] = log p(target[t − out_from] | ids[0..t]). Working memory
 * comes from `work` (branch or scratch arena) and is released before return. */
ls_status ls_hybrid_branch_logprobs(const ls_hybrid_model *m, const ls_prompt_state *st,
                                    const int32_t *ids, int64_t T, int64_t out_from,
                                    const int32_t *target, float *logprob, const ls_fwd_opts *o,
                                    ls_arena *work);

/* Branch forward as ls_hybrid_branch_logprobs, optionally recording a tape.
 * tape_out non-NULL: every buffer the backward needs is kept in `tape_arena` (the
 * branch arena) and *tape_out set; NULL: no tape, transients from `scratch`.
 * grad_from: the first position whose path carries gradient — 0 for a branch; P−1
 * for the naive full-sequence mode, where the prompt part is detached at the same
 * points as a captured state (attention K/V and the GDN state and conv tail of
 * earlier positions receive no gradient). entropy[T − out_from] optional. `ids`
 * and `target` must stay alive until the backward. */
ls_status ls_hybrid_branch_fwd(const ls_hybrid_model *m, const ls_prompt_state *st,
                               const int32_t *ids, int64_t T, int64_t out_from, int64_t grad_from,
                               const int32_t *target, float *logprob, float *entropy,
                               ls_branch_tape **tape_out, const ls_fwd_opts *o,
                               ls_arena *tape_arena, ls_arena *scratch);
/* Backward of a taped branch: dlogprob[T − out_from] = ∂L/∂logprob; parameter
 * gradients accumulate (+=) into `grad` (a model-shaped set of buffers, see
 * ls_hybrid_alloc_like). dstate NULL: the prompt state receives no gradient
 * (prefix-frozen). Otherwise (full mode) the gradient w.r.t. the prompt state the
 * branch read accumulates into dstate->full (dK/dV of its pages, d(S, conv tail)). */
ls_status ls_hybrid_branch_bwd(const ls_hybrid_model *m, ls_hybrid_model *grad,
                               const ls_branch_tape *tape, const float *dlogprob,
                               ls_prompt_state *dstate, ls_arena *scratch);
/* The reverse prompt sweep (full mode, DESIGN §3), after every member's backward:
 * the prompt's sweep chunks from last to first, each recomputed with a tape from its
 * checkpoint and the pages before it (ids: the captured prompt tokens) and
 * backpropagated with the gradient its state receives; parameter gradients
 * accumulate into `grad`. One chunk's tape (in tape_arena) is alive at a time. */
ls_status ls_hybrid_sweep(const ls_hybrid_model *m, ls_hybrid_model *grad, ls_prompt_state *st, const int32_t *ids,
                          const ls_fwd_opts *o, ls_arena *tape_arena, ls_arena *scratch);

/* ---- parameters --------------------------------------------------------------- */
/* Every distinct trainable tensor of the internal layout, in a fixed order (the tied
 * LM head is not listed twice). *out malloc'd. */
ls_status ls_hybrid_params(const ls_hybrid_model *m, ls_param **out, int64_t *n);
/* A model-shaped set of zeroed buffers (gradients, optimizer moments) from `arena`,
 * aliasing lm_head to embed when tied. */
ls_status ls_hybrid_alloc_like(const ls_hybrid_model *src, ls_hybrid_model *dst, ls_arena *arena);
/* The same shape with every tensor NULL: the gradient set of LoRA side branches, where
 * no base weight gets a gradient (the backward skips every dW). */
ls_status ls_hybrid_alloc_none(const ls_hybrid_model *src, ls_hybrid_model *dst, ls_arena *arena);
/* Which tensors a subset allocation keeps: internal tensor `field`
 * (offsetof(ls_hybrid_layer, ...)) of `layer`, layer −1 = the LM head. */
typedef int (*ls_hybrid_keep_fn)(const void *ctx, int layer, size_t field);
/* The same shape with buffers (zeroed) only where keep() says so; the other tensors
 * are NULL, or alias's tensors when alias is given. */
ls_status ls_hybrid_alloc_subset(const ls_hybrid_model *src, ls_hybrid_model *dst, ls_arena *arena,
                                 ls_hybrid_keep_fn keep, const void *keep_ctx, const ls_hybrid_model *alias);
/* (lora.c, over ls_hybrid_alloc_subset: the parameter code does not call LoRA's.)
 * Gradient buffers for LoRA: only the tensors some adapter adapts get one (zeroed);
 * the others stay NULL and the backward skips their weight gradients — the frozen
 * weights cost neither gradient memory nor the dW products. */
ls_status ls_hybrid_alloc_grad_lora(const ls_hybrid_model *src, ls_hybrid_model *dst, ls_arena *arena,
                                    const ls_lora *lora);
/* The LoRA policy's tensors: own (uninitialised) buffers for the adapted tensors, which
 * ls_lora_merge fills with base + delta; every other tensor points at `base`'s (shared,
 * never written: the merge skips a tensor whose source and destination coincide). */
ls_status ls_hybrid_alloc_merged_lora(const ls_hybrid_model *base, ls_hybrid_model *dst, ls_arena *arena,
                                      const ls_lora *lora);
/* Write `m` (weights or gradients in the internal layout) as HF tensors under the
 * checkpoint's own names and layout (fused or split, per-expert or fused experts),
 * as `dtype`, to `to`: a file, atomically (LS_ST_FILE(path)), or a callback (ls_st_emit). */
ls_status ls_hybrid_export(const ls_hybrid_model *m, const ls_st_sink *to, ls_dtype dtype,
                           const char *meta_key, const char *meta_value);

/* One tensor of the HF checkpoint layout, for writing random checkpoints (`init`). */
typedef enum {
    LS_INIT_LINEAR = 0, /* N(0, fan_in^-1/2) */
    LS_INIT_EMBED,      /* N(0, 1) */
    LS_INIT_NORM0,      /* zero-centred norm weight: N(0, 0.1) */
    LS_INIT_NORM1,      /* plain norm weight: 1 + N(0, 0.1) */
    LS_INIT_CONV,       /* U(−0.5, 0.5) */
    LS_INIT_ALOG,       /* log U(0.05, 1): decays that keep the state alive (spec §8.3) */
    LS_INIT_DTBIAS,     /* N(0, 0.5) */
    LS_INIT_BIAS0,      /* small bias: N(0, 0.01), stored f32 (e_score_correction_bias, k_norm.bias) */
} ls_init_kind;

typedef struct {
    char name[160];
    int ndim;
    int64_t shape[3];
    ls_init_kind init;
} ls_hf_tensor_spec;

/* Every tensor name and shape an HF checkpoint of this config holds, in the
 * config's layout (fused Qwen3-Next or split Qwen3.5). *out is malloc'd. */
ls_status ls_hybrid_hf_specs(const ls_config *c, ls_hf_tensor_spec **out, int64_t *n);

/* Write `dir`/model.safetensors with random weights (ls_init_kind per tensor, seeded)
 * stored as `dtype` (A_log and the gated norm stay f32), and copy `config_path` to
 * `dir`/config.json; both atomically. `dir` must exist. */
ls_status ls_hybrid_write_random(const char *config_path, const char *dir, uint64_t seed,
                                 ls_dtype dtype);
/* The family's `plan` document (family.h). */
ls_status ls_hybrid_plan_doc(ls_plan_doc *d, const ls_config *cfg, const ls_plan_request *rq);
double ls_hybrid_capture_flops(const ls_config *cfg, int64_t n);
/* Its config.json (hybrid_config.c; family.h, slot parse_config) and the model_types it reads. */
struct cJSON;
ls_status ls_hybrid_parse_config(ls_config *c, const struct cJSON *o, const char *type, int wrapped, const char *path);
extern const char *const ls_hybrid_model_types[];
void ls_hybrid_state_layer(const ls_config *c, int l, ls_state_layer *out);
void ls_hybrid_state_recurrent(const ls_config *c, ls_state_recurrent *out);
/* The same for a list of tensors of any family: dir/model.safetensors (norm weights,
 * A_log and biases stay f32) and config.json. */
ls_status ls_write_random_checkpoint(const char *config_path, const char *dir, uint64_t seed, ls_dtype dtype,
                                     const ls_hf_tensor_spec *sp, int64_t n);

/* ---- the family table (hybrid_family.c) ----------------------------------------- */
extern const ls_family ls_hybrid_family;
/* A handle on a hybrid model (not copied: `m` must outlive it). */
ls_model ls_hybrid_handle(ls_hybrid_model *m);
/* A trainable set over models the caller owns (tests, benchmarks): `policy` runs the
 * forward and backward, `grad` receives the gradients, `ref` may be NULL; with `lora`
 * the adapters are trained on the frozen `lora_base` (policy = lora_base + adapters,
 * by side branches when policy->lora is set, else merged into `policy`). Release with
 * ls_policy_close (frees the lists, not the models). */
ls_status ls_hybrid_policy_wrap(ls_policy *p, ls_hybrid_model *policy, const ls_hybrid_model *ref,
                                ls_hybrid_model *grad, ls_lora *lora, const ls_hybrid_model *lora_base);
/* The hybrid model behind a policy's handle (tests). */
static inline ls_hybrid_model *ls_hybrid_of(const ls_model *m) { return (ls_hybrid_model *)m->impl; }

#endif
