/*
 * config.h — the hybrid model's configuration, parsed from an HF config.json
 * (model_type qwen3_next; qwen3_5 / qwen3_5_moe with text_config; qwen3_5_text /
 * qwen3_5_moe_text). Field meanings: specs/hybrid-qwen3next.md §1.
 */
#ifndef LONGSTRAW_CONFIG_H
#define LONGSTRAW_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "longstraw/core.h"

#define LS_MAX_LAYERS 1024

typedef enum { LS_LAYER_GDN = 0, LS_LAYER_ATTN = 1, LS_LAYER_MLA = 2 } ls_layer_kind;
/* Which model family a config belongs to (the family table that reads it). */
typedef enum { LS_FAMILY_HYBRID = 0, LS_FAMILY_MLA = 1 } ls_family_kind;

/* The compressed-attention MoE family (specs/mla-dsa-moe.md §1): GLM-5.x glm_moe_dsa,
 * DeepSeek-V3.2 deepseek_v32. MLA in every layer; a DSA lightning indexer in every
 * "full" layer (IndexCache: the others reuse the last full layer's selection). */
typedef struct {
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
/* Weight-name layout of the checkpoint family (spec §6). */
typedef enum { LS_LAYOUT_QWEN3_NEXT = 0, LS_LAYOUT_QWEN3_5 = 1 } ls_layout;

typedef struct {
    char model_type[64];      /* the text model's model_type */
    ls_layout layout;
    int64_t vocab, hidden, n_layers;
    int n_heads, n_kv, head_dim, rot_dim; /* full attention */
    double rope_theta, partial_rotary;
    int H_k, H_v, d_k, d_v, conv_k;       /* Gated DeltaNet */
    int64_t intermediate;                 /* dense MLP width */
    int n_experts, top_k, norm_topk;
    int64_t moe_inter, shared_inter;
    float eps;
    int tie_embeddings;
    uint8_t kind[LS_MAX_LAYERS]; /* ls_layer_kind per layer */
    uint8_t moe[LS_MAX_LAYERS];  /* 1 = sparse MoE FFN, 0 = dense SwiGLU */
    ls_family_kind family;
    ls_mla_config mla;           /* family LS_FAMILY_MLA */
} ls_config;

/* Parse config.json text; `path` names the file in error messages. */
ls_status ls_config_parse(ls_config *c, const char *text, const char *path);
ls_status ls_config_load(ls_config *c, const char *path);
/* Read a whole file into a NUL-terminated malloc'd buffer (caller frees). */
ls_status ls_read_file(const char *path, char **out, size_t *len);
/* Write `len` bytes to `path` atomically: `path`.tmp.<pid>, fsync, rename. A crash
 * leaves either the old file or the new one, never a half-written one. */
ls_status ls_write_file_atomic(const char *path, const void *data, size_t len);
/* Close an open_memstream stream over (*buf, *len), write its text to `path` with
 * ls_write_file_atomic and free the buffer. */
ls_status ls_write_memstream(const char *path, FILE *f, char **buf, size_t *len);
/* 1-based line number of byte `off` in `text` (for error messages). */
long ls_line_of(const char *text, long off);
/* Copy a file with ls_write_file_atomic. */
ls_status ls_copy_file_atomic(const char *src, const char *dst);

static inline int64_t ls_cfg_key_dim(const ls_config *c) { return (int64_t)c->H_k * c->d_k; }
static inline int64_t ls_cfg_value_dim(const ls_config *c) { return (int64_t)c->H_v * c->d_v; }
static inline int64_t ls_cfg_conv_dim(const ls_config *c) {
    return 2 * ls_cfg_key_dim(c) + ls_cfg_value_dim(c);
}
int ls_cfg_count_kind(const ls_config *c, ls_layer_kind k);

#endif
