/*
 * safetensors.h — checkpoint I/O in the safetensors format
 * (https://github.com/huggingface/safetensors): an 8-byte little-endian header
 * length N, N bytes of UTF-8 JSON {name: {"dtype", "shape", "data_offsets"},
 * "__metadata__": {str: str}}, then the data buffer (offsets relative to its start,
 * row-major, little-endian).
 *
 * Reader: ls_st_open maps the whole file read-only (mmap PROT_READ, MAP_PRIVATE) and
 * validates every length, offset, shape and dtype before anything is handed out.
 * Only the parsed header (names, shapes, offsets, metadata) is kept, in malloc'd
 * memory — it is read once at load time, not on a hot path. Tensor data is never
 * copied until ls_st_read_f32 converts it into a caller's buffer.
 *
 * Model: ls_st_model_open opens a HF model directory — model.safetensors, or
 * model.safetensors.index.json plus the shards it names — with one name lookup
 * across all shards (sorted array + binary search).
 *
 * Writer: ls_st_writer collects tensors (borrowed pointers, no copies) and metadata;
 * ls_st_write writes the file atomically (temp file, fsync, rename, fsync dir).
 */
#ifndef LONGSTRAW_SAFETENSORS_H
#define LONGSTRAW_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "longstraw/core.h"

#define LS_ST_MAX_DIMS 8
/* Headers above this are rejected (the reference implementation's limit). */
#define LS_ST_MAX_HEADER ((int64_t)100000000)

/* Every dtype the safetensors format defines. Only F32/BF16/F16/F64 convert to
 * f32; the others parse (a checkpoint holding them still opens) but
 * ls_st_read_f32 reports LS_ERR_UNSUPPORTED for them. */
typedef enum {
    LS_ST_F32 = 0,
    LS_ST_BF16,
    LS_ST_F16,
    LS_ST_F64,
    LS_ST_BOOL,
    LS_ST_U8,
    LS_ST_I8,
    LS_ST_I16,
    LS_ST_U16,
    LS_ST_I32,
    LS_ST_U32,
    LS_ST_I64,
    LS_ST_U64,
    LS_ST_F8_E5M2,
    LS_ST_F8_E4M3,
    LS_ST_F8_E8M0,
    LS_ST_F6_E2M3, /* 6 bits per element, packed */
    LS_ST_F6_E3M2,
    LS_ST_F4, /* 4 bits per element, packed */
    LS_ST_C64,
    LS_ST_DTYPE_COUNT
} ls_st_dtype;

const char *ls_st_dtype_name(ls_st_dtype t);            /* "F32", "F8_E4M3", ... */
int ls_st_dtype_parse(const char *s, ls_st_dtype *out); /* 0 on success */
int ls_st_dtype_bits(ls_st_dtype t);                    /* bits per element */
/* The compute dtype for F32/BF16/F16/F64: returns 1 and sets *out; 0 otherwise. */
int ls_st_dtype_to_ls(ls_st_dtype t, ls_dtype *out);
ls_st_dtype ls_st_dtype_from_ls(ls_dtype t);

/* One tensor of an open file. All pointers point into the owning ls_st_file and
 * stay valid until ls_st_close. */
typedef struct {
    const char *name;
    const char *file;     /* path of the file holding it (for messages) */
    ls_st_dtype st_dtype; /* dtype as stored */
    int supported;        /* 1: st_dtype is F32/BF16/F16/F64, `dtype` valid */
    ls_dtype dtype;       /* compute dtype; meaningful only when supported */
    int ndim;             /* 0 (scalar) .. LS_ST_MAX_DIMS */
    int64_t shape[LS_ST_MAX_DIMS];
    int64_t numel;  /* product of shape (1 for a scalar, 0 if any dim is 0) */
    int64_t nbytes; /* == data_offsets[1] - data_offsets[0] */
    int64_t offset; /* data_offsets[0], relative to the data buffer */
    /* Inside the read-only mapping. Aligned to the element size for files whose
     * header length is a multiple of 8 and whose data is laid out by descending
     * element size (ours, the reference writer's); foreign files may be unaligned
     * (ls_st_read_f32 copes). */
    const void *data;
} ls_st_tensor;

typedef struct {
    char *path;
    const uint8_t *map; /* whole file, PROT_READ / MAP_PRIVATE */
    size_t map_size;
    int64_t header_len;    /* N */
    const uint8_t *data;   /* map + 8 + N */
    int64_t data_size;     /* map_size - 8 - N */
    ls_st_tensor *tensors; /* (n_tensors) sorted by name; malloc */
    int64_t n_tensors;
    char **meta_keys;   /* (n_meta) "__metadata__", sorted by key; malloc */
    char **meta_values; /* (n_meta) */
    int64_t n_meta;
} ls_st_file;

/* Map and validate `path`. On failure *f is left zeroed (nothing to close) and the
 * message names the file, the tensor and the offending value.
 * Memory: header metadata from malloc; data stays in the mapping.
 * Note: like every mmap reader, truncating the file while it is open raises SIGBUS. */
ls_status ls_st_open(ls_st_file *f, const char *path);
void ls_st_close(ls_st_file *f); /* safe on a zeroed or already-closed file */

static inline int64_t ls_st_count(const ls_st_file *f) { return f->n_tensors; }
/* i-th tensor in name order, 0 <= i < ls_st_count(f). */
const ls_st_tensor *ls_st_at(const ls_st_file *f, int64_t i);
/* NULL when absent. O(log n). */
const ls_st_tensor *ls_st_find(const ls_st_file *f, const char *name);
/* "__metadata__" value for key, or NULL. */
const char *ls_st_meta_get(const ls_st_file *f, const char *key);

/* Convert the tensor into dst (numel_expected f32s). LS_ERR_FORMAT when the tensor
 * holds a different number of elements, LS_ERR_UNSUPPORTED when its dtype is not
 * F32/BF16/F16/F64. `ctx` (may be NULL) prefixes the message, e.g. "layer 3 q_proj". */
ls_status ls_st_read_f32(const ls_st_tensor *t, float *dst, int64_t numel_expected, const char *ctx);
/* ls_st_read_f32 for a model's weights: a NaN or Inf in them is refused here (LS_ERR_FORMAT,
 * naming the file, the tensor and the element) instead of surfacing as a NaN loss later. */
ls_status ls_st_read_weights(const ls_st_tensor *t, float *dst, int64_t numel_expected, const char *ctx);
/* LS_ERR_FORMAT unless the tensor has exactly this shape. */
ls_status ls_st_check_shape(const ls_st_tensor *t, int ndim, const int64_t *shape, const char *ctx);

/* ---- model directories ---------------------------------------------------- */
#define LS_ST_SINGLE_NAME "model.safetensors"
#define LS_ST_INDEX_NAME "model.safetensors.index.json"

typedef struct {
    char *dir;         /* the path given to ls_st_model_open (directory or file) */
    ls_st_file *files; /* (n_files) one per distinct shard; malloc */
    int64_t n_files;
    const ls_st_tensor **by_name; /* (n_tensors) sorted by name; malloc */
    int64_t n_tensors;
} ls_st_model;

/* `path` is a model directory holding model.safetensors (preferred when both
 * exist, as HF transformers does) or model.safetensors.index.json; or a path to a
 * single .safetensors file. With an index, only the tensors its weight_map names are
 * visible, and each must exist in its shard. Errors name the directory, index,
 * shard and tensor. On failure *m is left zeroed. Memory: malloc (header metadata). */
ls_status ls_st_model_open(ls_st_model *m, const char *path);
void ls_st_model_close(ls_st_model *m);
const ls_st_tensor *ls_st_model_find(const ls_st_model *m, const char *name); /* O(log n) */
static inline int64_t ls_st_model_count(const ls_st_model *m) { return m->n_tensors; }
const ls_st_tensor *ls_st_model_at(const ls_st_model *m, int64_t i); /* name order */

/* ---- writer ----------------------------------------------------------------- */
typedef struct {
    char *name;
    ls_st_dtype dtype; /* stored dtype */
    int ndim;
    int64_t shape[LS_ST_MAX_DIMS];
    int64_t numel, nbytes;
    const float *src_f32; /* converted to dtype while writing, or */
    const void *src_raw;  /* written as is (nbytes) */
} ls_st_wtensor;

typedef struct {
    ls_st_wtensor *t; /* malloc */
    int64_t n, cap;
    char **meta_keys, **meta_values;
    int64_t n_meta, cap_meta;
} ls_st_writer;

void ls_st_writer_init(ls_st_writer *w);
void ls_st_writer_free(ls_st_writer *w);
/* Add a tensor given as f32, stored as `dtype` (converted during ls_st_write).
 * The writer BORROWS src: it must stay valid and unchanged until ls_st_write
 * returns (no copy, so writing a checkpoint needs no second copy of the weights).
 * src may be NULL when numel is 0. Names must be unique (checked by ls_st_write). */
ls_status ls_st_writer_add_f32(ls_st_writer *w, const char *name, ls_dtype dtype, int ndim,
                               const int64_t *shape, const float *src);
/* Add raw little-endian bytes of any safetensors dtype; nbytes must match the shape.
 * Borrowed like add_f32. */
ls_status ls_st_writer_add_raw(ls_st_writer *w, const char *name, ls_st_dtype dtype, int ndim,
                               const int64_t *shape, const void *data, size_t nbytes);
/* "__metadata__" entry (both strings copied); a repeated key is an error. */
ls_status ls_st_writer_add_meta(ls_st_writer *w, const char *key, const char *value);
/* Write the file atomically: `path`.tmp.<pid>, fflush + fsync, rename over `path`,
 * fsync the directory. On any error the temp file is removed and `path` is left as
 * it was (except when only the final directory fsync fails: the new file is then in
 * place and the message says "written, but ..."). Data is laid out by descending element size then name (as
 * the reference writer does), and the header is space-padded to a multiple of 8 bytes, so every tensor's data
 * is aligned to its element size. Memory: the JSON header and a 512 KiB conversion buffer from malloc, freed
 * before returning. */
ls_status ls_st_write(const ls_st_writer *w, const char *path);

/* Where a writer's tensors go: the file `path` (ls_st_write), or, with path NULL, a
 * host's callback once per tensor with its f32 values as added (borrowed for the call;
 * the stored dtype is the file's business), in the order added — the C API's in-memory
 * gradient. Metadata goes to files only. */
typedef ls_status (*ls_st_tensor_fn)(void *user, const char *name, int ndim, const int64_t *shape,
                                     const float *data);
typedef struct {
    const char *path;
    ls_st_tensor_fn fn;
    void *user;
} ls_st_sink;
/* The file sink of `path` (a compound literal: it lives as long as the enclosing block). */
#define LS_ST_FILE(p) (&(ls_st_sink){.path = (p)})
/* ls_st_write for a file sink; for a callback sink each tensor in turn (f32 ones only:
 * a raw tensor of another dtype is LS_ERR_UNSUPPORTED), stopping at the first error. */
ls_status ls_st_emit(const ls_st_writer *w, const ls_st_sink *to);

#endif
