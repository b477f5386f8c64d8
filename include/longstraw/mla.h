/*
 * mla.h — the compressed-attention MoE family (MLA + DSA lightning indexer + MoE:
 * GLM-5.x glm_moe_dsa, DeepSeek-V3.2 deepseek_v32; specs/mla-dsa-moe.md): its
 * prompt-state plan, parameter count and random checkpoints, its weights and their
 * loading and export, and the forward, backward, capture, decode and full-mode sweep
 * under CP and EP (docs/architecture.md, "The second family"). The family's table is
 * in src/models/mla_family.c; the transaction sees only family.h.
 */
#ifndef LONGSTRAW_MLA_H
#define LONGSTRAW_MLA_H

#include "longstraw/backend.h"
#include "longstraw/config.h"
#include "longstraw/family.h"
#include "longstraw/hybrid.h" /* ls_hf_tensor_spec, shared with the hybrid's inventory */
#include "longstraw/state.h"

/* The family's layer kind (ls_config.kind): MLA in every layer. */
enum { LS_LAYER_MLA = 2 };

/* The compressed-attention MoE family (specs/mla-dsa-moe.md §1): GLM-5.x glm_moe_dsa,
 * DeepSeek-V3.2 deepseek_v32. MLA in every layer; a DSA lightning indexer in every
 * "full" layer (IndexCache: the others reuse the last full layer's selection). */
typedef struct __attribute__((may_alias)) { /* ls_config.ext (may_alias: read where ls_config keeps bytes) */
    int64_t q_lora_rank;  /* the q latent's width (>= 1: a plain q_proj is refused) */
    int64_t kv_lora_rank; /* the cached latent's width */
    int qk_nope, qk_rope, v_head;
    int index_heads, index_head_dim;
    int64_t index_topk;
    int rope_interleave;         /* MLA's q_pe / k_pe pairs: 1 (both models; `rope_interleave`) */
    int indexer_rope_interleave; /* GLM: 1; DeepSeek-V3.2: 0 (half-split) */
    int n_shared_experts, n_group, topk_group;
    int n_mtp;                   /* num_nextn_predict_layers: MTP layers after the last (not loaded) */
    double routed_scaling;
    /* YaRN (rope_scaling type yarn; factor 0: none) */
    double yarn_factor, yarn_beta_fast, yarn_beta_slow, yarn_mscale, yarn_mscale_all_dim;
    int64_t yarn_orig_max;
    uint8_t index_full[LS_MAX_LAYERS]; /* 1: the layer runs its own indexer (and caches index keys) */
} ls_mla_config;
_Static_assert(sizeof(ls_mla_config) <= LS_CONFIG_EXT_BYTES, "ls_mla_config outgrew ls_config.ext");

/* The family's own config fields (ls_config.ext). */
static inline ls_mla_config *ls_mla_cfg_mut(ls_config *c) { return (ls_mla_config *)(void *)c->ext; }
static inline const ls_mla_config *ls_mla_cfg(const ls_config *c) {
    return (const ls_mla_config *)(const void *)c->ext;
}

/* The prompt state of this family per rank (spec §2 "Per-token MLA cache", §3): per
 * prompt position and MLA layer the normalised KV latent and the rotated shared rope
 * key (kv_lora_rank + qk_rope_head_dim values), per position and full-indexer layer the
 * index key (index_head_dim values), in pages of `page_size` positions split over `cp`
 * ranks by `layout` like the hybrid family's; plus the MoE routed-hidden buffers of one
 * capture chunk (the tokens sent to and received from their experts). */
typedef struct {
    int64_t positions, page_size, pages, pages_per_rank;
    int cp;
    ls_cp_layout layout;
    int n_mla, n_index;                  /* MLA layers; layers with their own indexer */
    size_t latent_layer_bytes_per_rank;  /* one MLA layer's latent + rope-key pages */
    size_t index_layer_bytes_per_rank;   /* one full layer's index-key pages */
    size_t latent_bytes_per_rank, index_bytes_per_rank, table_bytes_per_rank, total_bytes_per_rank;
    int64_t capture_chunk;
    size_t routed_bytes_per_rank; /* [chunk · top_k, D] f32 out and back */
} ls_mla_plan_t;

ls_status ls_mla_state_plan(ls_mla_plan_t *p, const ls_config *cfg, int64_t prompt_len, int64_t page_size,
                            ls_dtype dtype, int cp, ls_cp_layout layout, int64_t capture_chunk);

/* Every weight of the family's HF checkpoint (spec §5; MTP layers excluded). 0 on
 * success, nonzero when the count overflows. */
int ls_mla_param_count(const ls_config *cfg, size_t *out);

/* Every tensor name and shape of the family's HF checkpoint (spec §5; per-expert
 * names, MTP layers not written). *out malloc'd. */
ls_status ls_mla_hf_specs(const ls_config *c, ls_hf_tensor_spec **out, int64_t *n);
/* The weights, in f32, HF layout per spec §5 (rows × columns as stored). Gate and up
 * projections are fused row blocks [gate ; up] (their HF tensors are the two halves),
 * experts stacked. NULL: absent in this layer (the indexer in a shared IndexCache
 * layer; the dense MLP in an MoE layer and the reverse), or, in a gradient set, a
 * tensor that gets no gradient (the indexer, e_score_correction_bias). */
typedef struct {
    float *input_norm, *post_norm;            /* [D] */
    float *q_a, *q_a_norm, *q_b;              /* [rq, D], [rq], [H·(dn+dr), rq] */
    float *kv_a, *kv_a_norm;                  /* [rkv+dr, D], [rkv] */
    float *kv_b;                              /* [H·(dn+dv), rkv]: per head [k_nope (dn); v (dv)] rows */
    float *o_proj;                            /* [D, H·dv] */
    float *idx_wq, *idx_wk;                   /* [nI·dI, rq], [dI, D] */
    float *idx_knorm_w, *idx_knorm_b;         /* [dI], [dI] (LayerNorm) */
    float *idx_weights;                       /* [nI, D] */
    float *mlp_gu, *mlp_down;                 /* dense: [2I, D], [D, I] */
    float *router, *router_bias;              /* [E, D], [E] (selection only) */
    float *exp_gu, *exp_down;                 /* [E, 2Im, D], [E, D, Im] */
    float *sh_gu, *sh_down;                   /* [2Is, D], [D, Is]; Is = Im·n_shared */
} ls_mla_layer;

/* One HF tensor of the family and where it lives: slot `field` (offsetof in
 * ls_mla_layer of layer `layer`, or in ls_mla_model when layer is −1) at element `off`.
 * The one list load, export, the parameter list, gradient sets and `init` share. */
typedef struct {
    char name[128];
    int ndim;
    int64_t shape[2];
    ls_init_kind init;
    int layer;
    size_t field;
    int64_t off;
    int frozen;   /* no gradient from the GRPO loss: the indexer, the correction bias */
    int no_decay; /* norms and biases */
    int expert;   /* a routed expert's projection: its (global) index; −1 otherwise */
} ls_mla_tensor;

typedef struct {
    ls_config cfg;
    const ls_backend *be; /* where its tensors live and its ops run (backend.h) */
    float *embed;      /* [V, D] */
    float *final_norm; /* [D] */
    float *lm_head;    /* [V, D] (= embed when tied) */
    ls_mla_layer *layers;
    size_t n_params;   /* weights read */
    const ls_mla_tensor *tensors; /* the checkpoint's tensors (shared by a model's gradient set) */
    int64_t n_tensors;
    double *inv_freq;  /* [qk_rope / 2] rotary frequencies (YaRN included) */
    float scale;       /* attention softmax scale (ls_mla_softmax_scale) */
    /* Expert parallelism: this rank holds routed experts [e0, e0 + n_local_experts) of
     * every MoE layer (stacked from e0); the ranks of ep hold the others. */
    const ls_comm *ep;
    int64_t e0, n_local_experts;
} ls_mla_model;

/* The tensor list of a config with routed experts [e0, e0 + ne) only (*out malloc'd). */
ls_status ls_mla_tensors(const ls_config *c, int64_t e0, int64_t ne, ls_mla_tensor **out, int64_t *n);
/* Where tensor t of model m lives (NULL: not allocated, e.g. a frozen tensor's gradient). */
float *ls_mla_at(const ls_mla_model *m, const ls_mla_tensor *t);
/* A model-shaped set of zeroed buffers for `src`'s tensors (grads: not the frozen ones). */
ls_status ls_mla_alloc_like(const ls_mla_model *src, ls_mla_model *dst, ls_arena *arena, int grads);
/* The same for the slots holding a tensor `keep` accepts; the other slots are `share`'s
 * buffers (NULL: none). */
typedef int (*ls_mla_keep_fn)(const ls_mla_tensor *t, const void *ctx);
ls_status ls_mla_alloc_subset(const ls_mla_model *src, ls_mla_model *dst, ls_arena *arena, ls_mla_keep_fn keep,
                              const void *ctx, const ls_mla_model *share);
/* dst's own buffers (those not shared with src) = src's values. */
void ls_mla_copy_slots(const ls_mla_model *src, ls_mla_model *dst);

/* Load DIR (config.json + model.safetensors or a sharded index) into `fixed`: F32,
 * BF16 and F16 tensors; FP8 checkpoints refused (their weight_scale_inv blocks
 * would need dequantising); MTP layers (index >= num_hidden_layers) skipped; every
 * shape checked and NaN/Inf refused, naming the tensor. With `ep` of N > 1 ranks only
 * this rank's E/N routed experts are read. */
ls_status ls_mla_load(ls_mla_model *m, const char *dir, const ls_comm *ep, ls_arena *fixed);
/* Parameters (non-frozen tensors) in checkpoint order (*out malloc'd). */
ls_status ls_mla_params(const ls_mla_model *m, ls_param **out, int64_t *n);
/* Write every tensor under its HF name (zeros for a gradient set's frozen tensors).
 * With expert parallelism a collective over m->ep: the routed experts are gathered to
 * the ep group's rank 0, which writes when `to` is non-NULL (NULL: take part only). `to`:
 * a file (LS_ST_FILE(path)) or a callback (ls_st_emit). */
ls_status ls_mla_export(const ls_mla_model *m, const ls_st_sink *to, ls_dtype dtype, const char *meta_key,
                        const char *meta_value);

/* ---- forward and backward (mla.c, mla_bwd.c) -------------------------------------- */
typedef struct ls_branch_tape ls_branch_tape;
ls_status ls_mla_capture(const ls_mla_model *m, ls_prompt_state *st, const int32_t *ids, int64_t n,
                         const ls_fwd_opts *o, ls_arena *scratch);
ls_status ls_mla_branch_fwd(const ls_mla_model *m, const ls_prompt_state *st, const int32_t *ids, int64_t T,
                            int64_t out_from, int64_t grad_from, const int32_t *target, float *logprob, float *entropy,
                            ls_branch_tape **tape_out, const ls_fwd_opts *o, ls_arena *tape_arena, ls_arena *scratch);
/* Parameter gradients (+=) into `grad`; with `dstate` (full mode) the gradient w.r.t.
 * the latent rows the branch read is added to dstate's dState; o->aux_loss adds the
 * indexer KL loss's (ls_fwd_opts). */
ls_status ls_mla_branch_bwd(const ls_mla_model *m, ls_mla_model *grad, const ls_branch_tape *tape,
                            const float *dlogprob, ls_prompt_state *dstate, const ls_fwd_opts *o, ls_arena *scratch);
/* Full mode, after every member's backward: the reverse prompt sweep (sweep chunks last
 * to first, each recomputed under a tape against the pages before it and backpropagated
 * from the gradient its latent rows received); one chunk's tape at a time. */
ls_status ls_mla_sweep(const ls_mla_model *m, ls_mla_model *grad, ls_prompt_state *st, const int32_t *ids,
                       const ls_fwd_opts *o, ls_arena *tape_arena, ls_arena *scratch);
ls_status ls_mla_decode(const ls_mla_model *m, ls_prompt_state *const *sts, const int32_t *ids, int n, float *logits,
                        const ls_fwd_opts *o, ls_arena *scratch);
extern const ls_family ls_mla_family;
ls_model ls_mla_handle(ls_mla_model *m);

/* The rotary inverse frequencies of the config (qk_rope_head_dim / 2 of them, spec §2):
 * base^(−2i/dr), with YaRN's ramp between the correction dims when rope_scaling is yarn
 * (*low, *high report them; NULL skips). */
void ls_mla_rope_freqs(const ls_config *c, double *inv_freq, int *low, int *high);
/* The attention softmax scale σ = qk_head_dim^−½ · m² (m = 0.1·mscale_all_dim·ln(factor)
 * + 1 with YaRN, else 1). The indexer's scale has no m (spec §7.6). */
double ls_mla_softmax_scale(const ls_config *c);

/* `init`: dir/model.safetensors with random weights of those tensors (norm weights and
 * biases f32, the rest `dtype`) and dir/config.json. */
ls_status ls_mla_write_random(const char *config_path, const char *dir, uint64_t seed, ls_dtype dtype);
/* The family's `plan` document (family.h). */
ls_status ls_mla_plan_doc(ls_plan_doc *d, const ls_config *cfg, const ls_plan_request *rq);
double ls_mla_capture_flops(const ls_config *cfg, int64_t n);
/* The bytes one of the rank's positions keeps in a wave of a CP capture's layer (mla.c
 * mla_cp_layer): absorbed queries, outputs, log-sum-exps, and on a full indexer layer
 * (full) the indexer's queries and weights. */
size_t ls_mla_cp_wave_bytes(const ls_config *cfg, int full);
/* The same for the full-mode sweep's layer-major waves under CP (mla_sweep.c): absorbed
 * queries and their gradient, outputs and their gradient, log-sum-exps, the query path. */
size_t ls_mla_cp_sweep_wave_bytes(const ls_config *cfg);
/* Its config.json (mla_config.c; family.h, slot parse_config) and the model_types it reads. */
struct cJSON;
ls_status ls_mla_parse_config(ls_config *c, const struct cJSON *o, const char *mt, int wrapped, const char *path);
extern const char *const ls_mla_model_types[];
/* Layers of an MLA config that run their own indexer. */
int ls_cfg_count_index_full(const ls_config *c);
void ls_mla_state_layer(const ls_config *c, int l, ls_state_layer *out);
void ls_mla_state_recurrent(const ls_config *c, ls_state_recurrent *out);

#endif
