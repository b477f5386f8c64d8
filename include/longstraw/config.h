/*
 * config.h — a model's configuration, parsed from an HF config.json: the fields every
 * family has here, the family's own in its part (io/config.c finds the family by
 * model_type in the registry; the family's parse_config reads the rest). Field
 * meanings: specs/hybrid-qwen3next.md §1, specs/mla-dsa-moe.md §1.
 */
#ifndef LONGSTRAW_CONFIG_H
#define LONGSTRAW_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "longstraw/core.h"

#define LS_MAX_LAYERS 1024

/* Room for a family's own fields (ls_config.ext). */
#define LS_CONFIG_EXT_BYTES (LS_MAX_LAYERS + 1024)

struct ls_family;

/* What every family's config has; the family that parsed it (the registry's entry for
 * its model_type) keeps its own fields in `ext`, read through the family's accessor
 * (ls_hybrid_cfg in model.h, ls_mla_cfg in mla.h). A config is plain data: copied by
 * value, compared by bytes (the parser starts from zeros). */
typedef struct {
    char model_type[64];      /* the text model's model_type */
    const struct ls_family *family;
    int64_t vocab, hidden, n_layers;
    int n_heads, n_kv, head_dim, rot_dim; /* attention heads (the family says which layers attend how) */
    double rope_theta, partial_rotary;
    int64_t intermediate;                 /* dense MLP width */
    int n_experts, top_k, norm_topk;
    int64_t moe_inter, shared_inter;
    float eps;
    int tie_embeddings;
    uint8_t kind[LS_MAX_LAYERS]; /* the family's layer kind per layer */
    uint8_t moe[LS_MAX_LAYERS];  /* 1 = sparse MoE FFN, 0 = dense SwiGLU */
    _Alignas(8) unsigned char ext[LS_CONFIG_EXT_BYTES]; /* the family's fields */
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

/* Layers of kind k (the family's kind numbers). */
int ls_cfg_count_kind(const ls_config *c, int k);

#endif
