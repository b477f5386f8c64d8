/*
 * family.h — the seam between the transaction and a model family (DESIGN §5,
 * STYLE "A family is a table, not a type name"). A family is a table of functions
 * behind an opaque model handle: load, capture (extend a prompt state, no tape),
 * branch forward with or without a tape, branch backward, decode step, parameter
 * list, export, and the trainable set of a training command (the policy: full
 * fine-tune or adapters, its gradients and reference). The transaction, AdamW, the
 * trainer and the CLI's training commands see only this header; a family's own
 * structs live in src/models/<family>*.c and its header (hybrid.h for the hybrid).
 */
#ifndef LONGSTRAW_FAMILY_H
#define LONGSTRAW_FAMILY_H

#include <stddef.h>
#include <stdint.h>

#include "longstraw/comm.h"
#include "longstraw/config.h"
#include "longstraw/core.h"
#include "longstraw/plan.h"
#include "longstraw/safetensors.h"
#include "longstraw/state.h"

/* Runtime options of a forward. */
typedef struct {
    int64_t capture_chunk; /* tokens per capture chunk (default 2048) */
    /* CP capture: a layer's per-position buffers cover at most this many of the rank's
     * positions at a time (0: as many as LS_CP_WAVE_BYTES allow; ls_cp_waves) */
    int64_t cp_wave;
    int64_t lmhead_rows;   /* LM-head row chunk (default 64) */
    float temperature;     /* logits divided before the log-softmax (default 1) */
    /* Context parallelism (DESIGN §8): NULL or one rank = every page is local. With
     * several ranks the prompt state holds this rank's pages only; capture fills
     * them shard by shard and every attention over the prompt merges the ranks'
     * partial outputs by log-sum-exp. */
    const ls_comm *comm;
    ls_cp_layout cp_layout; /* how the prompt's pages split over the ranks (zigzag) */
    /* The indexer KL loss (MLA family, specs/mla-dsa-moe.md §3 "Indexer training"): a
     * branch backward adds the gradient of Σ over its queries (from out_from) and full
     * indexer layers of KL(attention ‖ softmax of index scores), weight 1 per query, to
     * the indexer tensors only, and that sum to *aux_loss_sum (the same on every rank).
     * 0: off. */
    int aux_loss;
    double *aux_loss_sum;
} ls_fwd_opts;
void ls_fwd_opts_default(ls_fwd_opts *o);

/* One trainable tensor (weights, gradients and moments are parallel lists of these). */
typedef struct {
    float *p;         /* the tensor's data (NULL: no buffer, e.g. a frozen weight's gradient) */
    int64_t n;        /* elements */
    int no_decay;     /* norms, A_log, dt_bias: no weight decay */
    const char *what; /* short description (PEFT tensor name for adapters) */
} ls_param;

typedef struct ls_family ls_family;
struct cJSON; /* a parsed config.json object (cJSON) */

/* A loaded model of some family: the handle the transaction holds. */
typedef struct {
    const ls_family *fam;
    void *impl; /* the family's own struct (ls_hybrid_model for the hybrid) */
} ls_model;

/* What a branch forward saves for its backward: family-defined, in the tape arena. */
typedef struct ls_branch_tape ls_branch_tape;

/* What a training command trains and against what. */
typedef struct {
    const char *model_dir; /* the checkpoint */
    const char *ref_dir;   /* reference checkpoint, or NULL (with adapters: the base) */
    const char *adapter;   /* PEFT adapters to continue, or NULL */
    int64_t lora_rank;     /* > 0: new adapters of this rank (adapter NULL) */
    double lora_alpha;
    const char *lora_targets; /* NULL: the family's default */
    uint64_t lora_seed;
    /* Expert parallelism (`--ep N`): the ranks of `ep` split the routed experts (NULL or
     * one rank: every expert here). */
    const ls_comm *ep;
    /* Train the family's auxiliary tensors by its auxiliary loss (family.h aux_loss; the
     * MLA family: the indexers by the indexer KL loss, full fine-tune): their tensors
     * join the trainable set (policy aux). */
    int aux_loss;
} ls_policy_spec;

/* The trainable set of an update: the policy the forward and backward run, its
 * gradient buffers (grad arena), the reference (impl NULL: none) and the trainable
 * tensors as parallel lists w[k] / g[k] (every weight for a full fine-tune, the
 * adapters with LoRA). `priv` is the family's. */
typedef struct {
    const ls_family *fam;
    const struct ls_backend *be; /* the backend holding w, g and the optimizer's moments */
    ls_model policy, ref, grad;
    ls_param *w, *g;
    int64_t n;
    int adapters; /* 1: the trainable tensors are adapters (PEFT files on export) */
    /* Expert parallelism: sharded[k] = 1 when g[k] is this rank's share of tensors split
     * over the ranks of ep (its routed experts; the global gradient norm sums those over
     * ep). NULL: nothing sharded. */
    const ls_comm *ep;
    const uint8_t *sharded;
    /* aux[k] = 1 when g[k] receives only the indexer KL loss's gradient (the transaction
     * scales those by its own weight); NULL: none. */
    const uint8_t *aux;
    void *priv;
} ls_policy;

struct ls_family {
    const char *name;
    /* Its auxiliary loss, by the metric name it is reported under ("indexer_kl": the MLA
     * family's DSA indexer KL, trained with --indexer-kl-coef), or NULL: none. A policy
     * spec's aux_loss and a forward's aux_loss ask for it. */
    const char *aux_loss;
    /* ---- the config: the model_types it reads (NULL-terminated) and their parser ---- */
    const char *const *model_types;
    /* The family's fields of config.json object o (the text model's: a wrapper's
     * text_config when `wrapped`), after ls_cfg_parse_common (config_fields.h). */
    ls_status (*parse_config)(ls_config *c, const struct cJSON *o, const char *model_type, int wrapped,
                              const char *path);
    /* 1 when this family reads checkpoints of the config's model_type */
    int (*accepts)(const ls_config *cfg);
    /* ep: the expert-parallel ranks (NULL or one: every expert on this rank) */
    ls_status (*load)(ls_model *m, const char *dir, const ls_comm *ep, ls_arena *fixed);
    const ls_config *(*config)(const ls_model *m);
    /* Capture ids[0..n) (x_1..x_{P−1}) into `st`, no tape (DESIGN §3). */
    ls_status (*capture)(const ls_model *m, ls_prompt_state *st, const int32_t *ids, int64_t n,
                         const ls_fwd_opts *o, ls_arena *scratch);
    /* Branch: ids[0..T) at positions st->n.. against the read-only `st` (NULL: the
     * plain forward); logprob[t − out_from] for t in [out_from, T); grad_from is the
     * first position whose path carries gradient (naive mode's detach point);
     * entropy optional; tape_out non-NULL records a tape in tape_arena. */
    ls_status (*branch_fwd)(const ls_model *m, const ls_prompt_state *st, const int32_t *ids, int64_t T,
                            int64_t out_from, int64_t grad_from, const int32_t *target, float *logprob,
                            float *entropy, ls_branch_tape **tape_out, const ls_fwd_opts *o, ls_arena *tape_arena,
                            ls_arena *scratch);
    /* Parameter gradients (+=) into `grad` (a gradient set of the same family). With
     * `dstate` (full mode) the gradient w.r.t. the prompt state the branch read is
     * added to dstate->full; NULL: prefix-frozen. */
    ls_status (*branch_bwd)(const ls_model *m, ls_model *grad, const ls_branch_tape *tape, const float *dlogprob,
                            ls_prompt_state *dstate, const ls_fwd_opts *o, ls_arena *scratch);
    /* Full mode, after every member's backward: the reverse prompt sweep (DESIGN §3)
     * over `st` (captured with ls_state_enable_full from ids[0..st->n)); parameter
     * gradients (+=) into `grad`; one chunk's tape in tape_arena at a time. */
    ls_status (*sweep)(const ls_model *m, ls_model *grad, ls_prompt_state *st, const int32_t *ids,
                       const ls_fwd_opts *o, ls_arena *tape_arena, ls_arena *scratch);
    /* One decode step of n sequences, each extending its own state by one token. */
    ls_status (*decode)(const ls_model *m, ls_prompt_state *const *sts, const int32_t *ids, int n, float *logits,
                        const ls_fwd_opts *o, ls_arena *scratch);
    /* The prompt state's layout: an empty state for `capacity` positions (this rank's
     * share under CP) from `arena`, and the plan that predicts its bytes per rank. */
    ls_status (*state_init)(ls_prompt_state *st, const ls_config *cfg, int64_t capacity, int64_t page_size,
                            ls_dtype dtype, const ls_comm *comm, ls_cp_layout layout, ls_arena *arena);
    ls_status (*state_plan)(ls_state_plan_t *p, const ls_config *cfg, int64_t prompt_len, int64_t page_size,
                            ls_dtype dtype, int cp, ls_cp_layout layout, int64_t sweep_chunk);
    /* What the prompt state keeps per layer (its page tables' rows, full mode's gradient
     * rows, a recurrent state) and the recurrent states' size (state.h): the state
     * module allocates what these say. */
    void (*state_layer)(const ls_config *cfg, int l, ls_state_layer *out);
    void (*state_recurrent)(const ls_config *cfg, ls_state_recurrent *out);
    /* Every distinct tensor, in a fixed order (*out malloc'd). */
    ls_status (*params)(const ls_model *m, ls_param **out, int64_t *n);
    /* Write a model's tensors (weights or a gradient set) under the checkpoint's names. */
    ls_status (*export)(const ls_model *m, const char *path, ls_dtype dtype, const char *meta_key,
                        const char *meta_value);
    /* ---- the trainable set -------------------------------------------------- */
    ls_status (*policy_open)(ls_policy *p, const ls_policy_spec *spec, ls_arenas *ar);
    void (*policy_close)(ls_policy *p);
    /* after the last backward of an update, before the gradients are read (merged
     * LoRA: project ∂L/∂W_eff onto the adapters) */
    void (*policy_grads_done)(ls_policy *p);
    /* after an optimizer step wrote p->w (merged LoRA: re-merge the policy) */
    void (*policy_step_done)(ls_policy *p);
    void (*policy_zero_grad)(ls_policy *p);
    /* Every buffer the backward accumulates into (before policy_grads_done: for merged
     * LoRA the full-weight ∂L/∂W_eff as well as the adapters'), *out malloc'd. */
    ls_status (*policy_grad_buffers)(const ls_policy *p, ls_param **out, int64_t *n);
    /* Weights into directory `dir` (model.safetensors + config.json, or PEFT adapter
     * files), every file atomic. With expert parallelism every rank calls it (a
     * collective: the experts are gathered) and only the ranks given a `dir` write. */
    ls_status (*policy_save)(const ls_policy *p, const ls_policy_spec *spec, const char *dir);
    /* Gradients of the trainable tensors: one safetensors file (LS_ST_FILE(path)) or
     * a callback per tensor (the C API). With expert parallelism every rank calls it and
     * only the one given a sink writes. */
    ls_status (*policy_save_grads)(const ls_policy *p, const ls_st_sink *to, const char *meta_key,
                                   const char *meta_value);
    /* M_live terms predicted from the config: gradient and fixed bytes (weights, and
     * AdamW moments of the trainable tensors when `optimizer`). */
    void (*policy_predict)(const ls_policy *p, int optimizer, size_t *grad, size_t *fixed);
    /* ---- without a checkpoint: from a config alone --------------------------- */
    /* A checkpoint of random weights (`init`, the demo from scratch) for the config at
     * config_path: model.safetensors + config.json in dir, seeded, stored in dtype. */
    ls_status (*write_random)(const char *config_path, const char *dir, uint64_t seed, ls_dtype dtype);
    /* The demo's model from scratch (`demo --family NAME`): its config.json text and a
     * few words on its layers for the demo's first line. */
    const char *demo_config;
    const char *demo_summary;
    /* `plan`: what a capture of rq->prompt tokens keeps per rank and the fixed and grad
     * terms of a full fine-tune, as the document the CLI prints (plan.h). */
    ls_status (*plan)(ls_plan_doc *d, const ls_config *cfg, const ls_plan_request *rq);
    /* The floating-point operations a capture of n tokens executes (benchmarks and
     * receipts divide by the time for the achieved rate). */
    double (*capture_flops)(const ls_config *cfg, int64_t n);
};

/* ---- the registry (src/models/family.c) ------------------------------------ */
/* The family that reads checkpoints of cfg's model_type; NULL with an error naming it. */
const ls_family *ls_family_for(const ls_config *cfg, const char *path);
/* The family that reads config.json files of this model_type (NULL: none); the
 * supported model_types, comma-separated, into buf (for messages). */
const ls_family *ls_family_for_type(const char *model_type);
void ls_family_type_names(char *buf, size_t cap);
/* The family called `name` ("hybrid", "mla"; NULL: the default, the first registered);
 * NULL with an error listing the names. */
const ls_family *ls_family_named(const char *name);
/* Load `dir` (config.json + safetensors) with the family its config names (ep: the
 * expert-parallel ranks, or NULL). */
ls_status ls_model_load(ls_model *m, const char *dir, const ls_comm *ep, ls_arena *fixed);
ls_status ls_policy_open(ls_policy *p, const ls_policy_spec *spec, ls_arenas *ar);
void ls_policy_close(ls_policy *p);

static inline const ls_config *ls_model_config(const ls_model *m) { return m->fam->config(m); }

#endif
