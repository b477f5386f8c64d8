/*
 * backend.h — the seam between the models and the hardware that runs them (STYLE
 * "Seams"; ggml's ggml_backend_i is the model): a table of functions behind an opaque
 * handle, one folder per backend under src/backend/. The models call every op through
 * ls_op_<name>(be, ...) and never a kernel, BLAS or OpenMP directly, so a backend
 * that fills this table runs both families unchanged.
 *
 * The CPU backend (src/backend/cpu/, ls_backend_cpu) is today's kernels and the
 * reference every other backend is held to: each op's contract is the CPU kernel's
 * of the same name in kernels.h (argument order, = or +=, which pointer may be NULL,
 * which buffers may alias). Pointers given to an op are the backend's memory, except
 * the optimizer's hyper-parameters (hp) and the scalar results of sumsq and adamw_check
 * (out, bad, at), which are the host's.
 *
 * The list below (LS_BACKEND_OPS / LS_BACKEND_STATUS_OPS) is the only place an op's
 * signature is written: it makes the table's slots, the ls_op_* dispatchers and the
 * CPU backend's entries. Adding an op: one line here, its CPU kernel, its test.
 */
#ifndef LONGSTRAW_BACKEND_H
#define LONGSTRAW_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "longstraw/core.h"
#include "longstraw/kernels.h"

typedef struct ls_backend ls_backend;

/* The ops that cannot fail: X(name, (parameters), (arguments)). */
#define LS_BACKEND_OPS(X)                                                                                            \
    /* products: C[M,N] = alpha·op(A)·op(B) + beta·C, row-major, op = transpose when trans_* */                      \
    X(gemm, (int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,    \
             const float *B, int64_t ldb, float beta, float *C, int64_t ldc),                                        \
      (trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))                                              \
    X(add_to, (float *y, const float *x, int64_t n), (y, x, n)) /* y += x */                                         \
    X(copy_rows, (float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t width),        \
      (dst, ld_dst, src, ld_src, rows, width))                                                                       \
    X(round_to, (float *x, int64_t n, ls_dtype dtype), (x, n, dtype))                                                \
    X(store_as, (void *dst, const float *src, int64_t n, ls_dtype dtype), (dst, src, n, dtype))                     \
    X(linear_fwd, (float *out, const float *x, const float *W, int64_t T, int64_t K, int64_t N, int accumulate),     \
      (out, x, W, T, K, N, accumulate))                                                                              \
    X(linear_bwd,                                                                                                    \
      (float *dx, float *dW, const float *dout, const float *x, const float *W, int64_t T, int64_t K, int64_t N,     \
       int accumulate_dx),                                                                                           \
      (dx, dW, dout, x, W, T, K, N, accumulate_dx))                                                                  \
    X(embed_fwd, (float *out, const int32_t *ids, const float *table, int64_t T, int64_t D), (out, ids, table, T, D)) \
    X(embed_bwd, (float *dtable, const float *dout, const int32_t *ids, int64_t T, int64_t D),                       \
      (dtable, dout, ids, T, D))                                                                                     \
    /* norms */                                                                                                      \
    X(rmsnorm_fwd, (float *y, float *rstd, const float *x, const float *w, int64_t rows, int64_t D, float eps),      \
      (y, rstd, x, w, rows, D, eps))                                                                                 \
    X(rmsnorm_bwd,                                                                                                   \
      (float *dx, float *dw, const float *dy, const float *x, const float *rstd, const float *w, int64_t rows,       \
       int64_t D),                                                                                                   \
      (dx, dw, dy, x, rstd, w, rows, D))                                                                             \
    X(rmsnorm_plain_fwd, (float *y, float *rstd, const float *x, const float *w, int64_t rows, int64_t D, float eps), \
      (y, rstd, x, w, rows, D, eps))                                                                                 \
    X(rmsnorm_plain_bwd,                                                                                             \
      (float *dx, float *dw, const float *dy, const float *x, const float *rstd, const float *w, int64_t rows,       \
       int64_t D),                                                                                                   \
      (dx, dw, dy, x, rstd, w, rows, D))                                                                             \
    X(gated_rmsnorm_fwd,                                                                                             \
      (float *y, float *rstd, const float *x, const float *z, const float *w, int64_t rows, int64_t D, float eps),   \
      (y, rstd, x, z, w, rows, D, eps))                                                                              \
    X(gated_rmsnorm_bwd,                                                                                             \
      (float *dx, float *dz, float *dw, const float *dy, const float *x, const float *z, const float *rstd,          \
       const float *w, int64_t rows, int64_t D),                                                                     \
      (dx, dz, dw, dy, x, z, rstd, w, rows, D))                                                                      \
    X(layernorm_fwd, (float *y, const float *x, const float *w, const float *b, int64_t n, int64_t d, float eps),    \
      (y, x, w, b, n, d, eps))                                                                                       \
    X(layernorm_bwd,                                                                                                 \
      (float *dx, float *dw, float *db, const float *dy, const float *x, const float *w, int64_t n, int64_t d,       \
       float eps),                                                                                                   \
      (dx, dw, db, dy, x, w, n, d, eps))                                                                             \
    /* the causal depthwise conv (+ SiLU); conv_step_seqs: one token of each of n sequences, row i continuing        \
     * tails[i] */                                                                                                   \
    X(conv_fwd, (float *y, float *pre, float *tail, const float *x, const float *w, int64_t T, int64_t C, int64_t W), \
      (y, pre, tail, x, w, T, C, W))                                                                                 \
    X(conv_bwd,                                                                                                      \
      (float *dx, float *dw, float *dtail, const float *dy, const float *pre, const float *x, const float *tail_in,  \
       const float *w, int64_t T, int64_t C, int64_t W),                                                             \
      (dx, dw, dtail, dy, pre, x, tail_in, w, T, C, W))                                                              \
    X(conv_step_seqs, (float *y, float *const *tails, const float *x, const float *w, int64_t n, int64_t C, int64_t W), \
      (y, tails, x, w, n, C, W))                                                                                     \
    /* rotary embeddings: rotate-half partial (hybrid) and by frequency table (MLA, DSA) */                          \
    X(rope_fwd, (float *x, int64_t T, int heads, int hd, int rot, double theta, int64_t pos0),                       \
      (x, T, heads, hd, rot, theta, pos0))                                                                           \
    X(rope_bwd, (float *dx, int64_t T, int heads, int hd, int rot, double theta, int64_t pos0),                      \
      (dx, T, heads, hd, rot, theta, pos0))                                                                          \
    X(rope_table_fwd,                                                                                                \
      (float *x, int64_t T, int heads, int hd, int off, int half, const double *inv_freq, int interleaved,           \
       int64_t pos0),                                                                                                \
      (x, T, heads, hd, off, half, inv_freq, interleaved, pos0))                                                     \
    X(rope_table_bwd,                                                                                                \
      (float *dx, int64_t T, int heads, int hd, int off, int half, const double *inv_freq, int interleaved,          \
       int64_t pos0),                                                                                                \
      (dx, T, heads, hd, off, half, inv_freq, interleaved, pos0))                                                    \
    /* activations and gates */                                                                                      \
    X(swiglu_fwd, (float *out, const float *gu, int64_t T, int64_t n_inter), (out, gu, T, n_inter))                  \
    X(swiglu_bwd, (float *dgu, const float *dout, const float *gu, int64_t T, int64_t n_inter),                      \
      (dgu, dout, gu, T, n_inter))                                                                                   \
    X(sigmoid_mul_fwd, (float *y, const float *x, const float *gate, int64_t n), (y, x, gate, n))                    \
    X(sigmoid_mul_bwd, (float *dx, float *dgate, const float *dy, const float *x, const float *gate, int64_t n),     \
      (dx, dgate, dy, x, gate, n))                                                                                   \
    X(gated_add_rows, (float *x, const float *logit, const float *y, int64_t T, int64_t D), (x, logit, y, T, D))     \
    X(gated_add_rows_bwd,                                                                                            \
      (float *dy, float *dlogit, const float *dx, const float *logit, const float *y, int64_t T, int64_t D),         \
      (dy, dlogit, dx, logit, y, T, D))                                                                              \
    /* the Gated DeltaNet: gate/normalisation prologue, token-serial recurrence, batched decode step */              \
    X(gdn_prep_fwd,                                                                                                  \
      (float *q, float *k, float *v, float *beta, float *g, float *rq, float *rk, const float *y, const float *ba,   \
       const float *A_log, const float *dt_bias, int64_t T, ls_gdr_dims dm),                                         \
      (q, k, v, beta, g, rq, rk, y, ba, A_log, dt_bias, T, dm))                                                      \
    X(gdn_prep_bwd,                                                                                                  \
      (float *dy, float *dba, float *dA_log, float *ddt_bias, const float *dq, const float *dk, const float *dv,     \
       const float *dbeta, const float *dg, const float *y, const float *rq, const float *rk, const float *ba,       \
       const float *beta, const float *g, const float *A_log, const float *dt_bias, int64_t T, ls_gdr_dims dm),      \
      (dy, dba, dA_log, ddt_bias, dq, dk, dv, dbeta, dg, y, rq, rk, ba, beta, g, A_log, dt_bias, T, dm))             \
    X(gdr_serial_fwd,                                                                                                \
      (float *o, float *state, const float *q, const float *k, const float *v, const float *beta, const float *g,    \
       int64_t T, ls_gdr_dims dm),                                                                                   \
      (o, state, q, k, v, beta, g, T, dm))                                                                           \
    X(gdr_step_seqs,                                                                                                 \
      (float *o, float *const *states, const float *q, const float *k, const float *v, const float *beta,            \
       const float *g, int64_t n, ls_gdr_dims dm),                                                                   \
      (o, states, q, k, v, beta, g, n, dm))                                                                          \
    /* attention: the log-sum-exp merge of two partials; MLA / DSA pieces of the indexer KL loss */                  \
    X(attn_merge, (float *o, float *lse, const float *o2, const float *lse2, int64_t T, int n_h, int hd),            \
      (o, lse, o2, lse2, T, n_h, hd))                                                                                \
    X(mla_attn_probs,                                                                                                \
      (float *P, const float *q, const float *lse, const float *own, const ls_kv_prefix *prefix, const int32_t *sel, \
       int64_t k, int64_t T, int H, int rkv, int dr, int64_t pos0, float scale),                                     \
      (P, q, lse, own, prefix, sel, k, T, H, rkv, dr, pos0, scale))                                                  \
    X(dsa_sel_scores,                                                                                                \
      (float *score, const float *q, const float *w, const ls_kv_prefix *keys, const float *own, const int32_t *sel, \
       int64_t k, int64_t T, int nI, int dI, int64_t pos0, float scale),                                             \
      (score, q, w, keys, own, sel, k, T, nI, dI, pos0, scale))                                                      \
    X(dsa_sel_scores_bwd,                                                                                            \
      (float *dq, float *dw, float *down, const float *dS, const float *q, const float *w, const ls_kv_prefix *keys, \
       const float *own, const int32_t *sel, int64_t k, int64_t T, int nI, int dI, int64_t pos0, float scale),       \
      (dq, dw, down, dS, q, w, keys, own, sel, k, T, nI, dI, pos0, scale))                                           \
    /* MoE: routing by softmax top-k (hybrid), by sigmoid grouped top-k with bias (MLA) and its backward; an         \
     * expert's routed rows gathered, its output scattered by the combine weights, and that backward */              \
    X(moe_route, (float *probs, int32_t *sel, float *wt, const float *logits, int64_t T, int E, int K, int norm_topk), \
      (probs, sel, wt, logits, T, E, K, norm_topk))                                                                  \
    X(moe_route_bwd,                                                                                                 \
      (float *dlogits, const float *dwt, const float *probs, const int32_t *sel, const float *wt, int64_t T, int E,  \
       int K, int norm_topk),                                                                                        \
      (dlogits, dwt, probs, sel, wt, T, E, K, norm_topk))                                                            \
    X(moe_gather, (float *xs, const float *x, const int64_t *rows, int64_t n, int64_t D, int K),                     \
      (xs, x, rows, n, D, K))                                                                                        \
    X(moe_scatter_add,                                                                                               \
      (float *y, const float *ys, const int64_t *rows, const float *wt, int64_t n, int64_t D, int K),                \
      (y, ys, rows, wt, n, D, K))                                                                                    \
    X(moe_combine_bwd,                                                                                               \
      (float *dys, float *dwt, const float *dy, const float *ys, const int64_t *rows, const float *wt, int64_t n,    \
       int64_t D, int K),                                                                                            \
      (dys, dwt, dy, ys, rows, wt, n, D, K))                                                                         \
    X(mla_route_fwd,                                                                                                 \
      (int32_t *sel, float *wt, float *s_out, const float *logits, const float *bias, int64_t T, int E, int K,       \
       int n_group, int topk_group, int norm, double scaling),                                                       \
      (sel, wt, s_out, logits, bias, T, E, K, n_group, topk_group, norm, scaling))                                   \
    X(mla_route_bwd,                                                                                                 \
      (float *dlogits, const float *dwt, const float *s, const int32_t *sel, int64_t T, int E, int K, int norm,      \
       double scaling),                                                                                              \
      (dlogits, dwt, s, sel, T, E, K, norm, scaling))                                                                \
    /* the optimizer (hp: host memory), a gradient norm's share, a gradient's scaling */                             \
    X(adamw_step, (const ls_adamw_hp *hp, float decay, float *w, const float *g, float *m, float *v, int64_t n),     \
      (hp, decay, w, g, m, v, n))                                                                                    \
    X(adamw_check,                                                                                                   \
      (int64_t *bad, float *at, const ls_adamw_hp *hp, float decay, const float *w, const float *g, const float *m,  \
       const float *v, int64_t n),                                                                                   \
      (bad, at, hp, decay, w, g, m, v, n))                                                                           \
    X(sumsq, (double *out, const float *x, int64_t n), (out, x, n))                                                  \
    X(scale, (float *x, float c, int64_t n), (x, c, n))

/* The ops that return an ls_status (scratch exhausted, a stop requested, bad input). */
#define LS_BACKEND_STATUS_OPS(X)                                                                                     \
    X(moe_group, (int64_t *count, int64_t *rows, const int32_t *sel, int64_t T, int E, int K, ls_arena *sc),         \
      (count, rows, sel, T, E, K, sc))                                                                               \
    X(dsa_topk,                                                                                                      \
      (int32_t *sel, int64_t *count, const float *score, int64_t T, int64_t n, int64_t pos0, int64_t k,              \
       ls_arena *scratch),                                                                                           \
      (sel, count, score, T, n, pos0, k, scratch))                                                                   \
    X(dsa_scores,                                                                                                    \
      (float *score, const float *q, const float *w, const ls_kv_prefix *keys, int64_t T, int nI, int dI,            \
       float scale, ls_arena *scratch),                                                                              \
      (score, q, w, keys, T, nI, dI, scale, scratch))                                                                \
    X(gdr_chunk_fwd,                                                                                                 \
      (float *o, float *tape_h, float *state, const float *q, const float *k, const float *v, const float *beta,     \
       const float *g, int64_t T, ls_gdr_dims dm, ls_arena *scratch),                                                \
      (o, tape_h, state, q, k, v, beta, g, T, dm, scratch))                                                          \
    X(gdr_chunk_bwd,                                                                                                 \
      (float *dq, float *dk, float *dv, float *dbeta, float *dg, float *dstate0, const float *dout,                  \
       const float *dstate_T, const float *tape_h, const float *q, const float *k, const float *v, const float *beta, \
       const float *g, int64_t T, ls_gdr_dims dm, ls_arena *scratch),                                                \
      (dq, dk, dv, dbeta, dg, dstate0, dout, dstate_T, tape_h, q, k, v, beta, g, T, dm, scratch))                    \
    X(attn_fwd,                                                                                                      \
      (float *o, float *lse, const float *q, const float *k, const float *v, const ls_kv_prefix *prefix, int64_t T,  \
       int n_h, int n_kv, int hd, float scale, ls_arena *scratch),                                                   \
      (o, lse, q, k, v, prefix, T, n_h, n_kv, hd, scale, scratch))                                                   \
    X(attn_bwd,                                                                                                      \
      (float *dq, float *dk, float *dv, void *const *dk_prefix, void *const *dv_prefix, const float *dout,           \
       const float *o, const float *lse, const float *q, const float *k, const float *v, const ls_kv_prefix *prefix, \
       int64_t T, int n_h, int n_kv, int hd, float scale, ls_arena *scratch),                                        \
      (dq, dk, dv, dk_prefix, dv_prefix, dout, o, lse, q, k, v, prefix, T, n_h, n_kv, hd, scale, scratch))           \
    X(attn_prefix_fwd,                                                                                               \
      (float *o, float *lse, const float *q, const ls_kv_prefix *prefix, int64_t T, int n_h, int n_kv, int hd,       \
       float scale, ls_arena *scratch),                                                                              \
      (o, lse, q, prefix, T, n_h, n_kv, hd, scale, scratch))                                                         \
    X(attn_prefix_bwd,                                                                                               \
      (float *dq, void *const *dk_prefix, void *const *dv_prefix, const float *dout, const float *o,                 \
       const float *lse, const float *q, const ls_kv_prefix *prefix, int64_t T, int n_h, int n_kv, int hd,           \
       float scale, ls_arena *scratch),                                                                              \
      (dq, dk_prefix, dv_prefix, dout, o, lse, q, prefix, T, n_h, n_kv, hd, scale, scratch))                         \
    X(mla_attn_fwd,                                                                                                  \
      (float *o, float *lse, const float *q, const float *own, const ls_kv_prefix *prefix, const int32_t *sel,       \
       int64_t k, int64_t T, int H, int rkv, int dr, int64_t pos0, float scale),                                     \
      (o, lse, q, own, prefix, sel, k, T, H, rkv, dr, pos0, scale))                                                  \
    X(mla_attn_bwd,                                                                                                  \
      (float *dq, float *down, void *const *dprefix, const float *dout, const float *o, const float *lse,            \
       const float *q, const float *own, const ls_kv_prefix *prefix, const int32_t *sel, int64_t k, int64_t T,       \
       int H, int rkv, int dr, int64_t pos0, float scale),                                                           \
      (dq, down, dprefix, dout, o, lse, q, own, prefix, sel, k, T, H, rkv, dr, pos0, scale))                         \
    /* the LM head: log-probs, log-sum-exp and entropy in row chunks, and the backward */                            \
    X(lmhead_fwd,                                                                                                    \
      (float *logprob, float *lse, float *entropy, const float *h, const float *W, const int32_t *target, int64_t T, \
       int64_t D, int64_t V, float temperature, int64_t chunk_rows, ls_arena *scratch),                              \
      (logprob, lse, entropy, h, W, target, T, D, V, temperature, chunk_rows, scratch))                              \
    X(lmhead_logprobs_bwd,                                                                                           \
      (float *dh, float *dW, const float *dlogprob, const float *h, const float *W, const int32_t *target,           \
       const float *lse, int64_t T, int64_t D, int64_t V, float temperature, int64_t chunk_rows, ls_arena *scratch), \
      (dh, dW, dlogprob, h, W, target, lse, T, D, V, temperature, chunk_rows, scratch))

#define LS_BACKEND_PARAMS_(...) const ls_backend *be, __VA_ARGS__
#define LS_BACKEND_SLOT_(name, params, args) void(*name)(LS_BACKEND_PARAMS_ params);
#define LS_BACKEND_STATUS_SLOT_(name, params, args) ls_status(*name)(LS_BACKEND_PARAMS_ params);

/* A backend's table. */
typedef struct {
    const char *name; /* "cpu", "cuda" */
    /* ---- buffers: memory the arenas hand out, and copies in and out of it ---- */
    void *(*buf_alloc)(const ls_backend *be, size_t bytes, size_t align); /* NULL when out of memory */
    void (*buf_free)(const ls_backend *be, void *p, size_t bytes);
    void (*to_device)(const ls_backend *be, void *dst, const void *host_src, size_t bytes);
    void (*to_host)(const ls_backend *be, void *host_dst, const void *src, size_t bytes);
    void (*copy)(const ls_backend *be, void *dst, const void *src, size_t bytes);
    void (*zero)(const ls_backend *be, void *p, size_t bytes);
    /* ---- ops --------------------------------------------------------------- */
    LS_BACKEND_OPS(LS_BACKEND_SLOT_)
    LS_BACKEND_STATUS_OPS(LS_BACKEND_STATUS_SLOT_)
} ls_backend_i;

struct ls_backend {
    const ls_backend_i *i;
    const char *device; /* what it runs on, for plans and receipts ("host") */
    void *ctx;          /* the backend's own state */
    /* 1: its buffers are plain host memory that host code may read and write, and
     * host memory may be handed to its ops (the CPU backend). 0: only its ops, and
     * to_host / to_device / copy / zero, touch its buffers (CUDA, strict). */
    int host_mem;
};

/* The CPU backend (src/backend/cpu/): process-wide, no state of its own. */
const ls_backend *ls_backend_cpu(void);

/* The strict CPU backend (src/backend/strict/): the CPU's ops over buffers that host
 * code cannot touch. Every buffer is a mapping of its own, PROT_NONE except while one of
 * the backend's ops (or a copy in or out) runs, so a host read or write of its memory
 * outside an op faults at once. For tests of the device boundary: results equal the
 * CPU backend's bit for bit, much slower (two mprotect calls per buffer per op). */
const ls_backend *ls_backend_strict(void);
/* 1 when p lies in a live buffer of the strict backend. */
int ls_backend_strict_owns(const void *p);

/* The backend called `name` ("cpu", "strict", "cuda" or "cuda:N" for device N) into
 * *out; an error naming it and the choices when it is unknown or not built.
 * ls_backend_close releases what the open took (nothing for cpu and strict). */
ls_status ls_backend_open(const char *name, const ls_backend **out);
void ls_backend_close(const ls_backend *be);
/* Choices for --help and messages: "cpu|strict|cuda". */
#define LS_BACKEND_NAMES "cpu|strict|cuda"

/* The CUDA backend (src/backend/cuda/, built with cmake -DLS_CUDA=ON): device `device`
 * with its own stream and cuBLAS handle. LS_ERR_UNSUPPORTED when built without CUDA or
 * when no device is found. Ops run in order on the stream; to_host waits for them,
 * ls_backend_cuda_sync too. Ops it does not build yet leave their slots empty
 * (ls_backend_missing). */
ls_status ls_backend_cuda_open(int device, const ls_backend **out);
void ls_backend_cuda_close(const ls_backend *be);
void ls_backend_cuda_sync(const ls_backend *be);
/* 1 when this build has the CUDA backend; its table (NULL without), which needs no device
 * to be read: which slots are filled. */
int ls_backend_cuda_built(void);
const ls_backend_i *ls_backend_cuda_table(void);

/* How many ops the table has. */
#define LS_BACKEND_COUNT_(name, params, args) +1
#define LS_BACKEND_N_OPS (0 LS_BACKEND_OPS(LS_BACKEND_COUNT_) LS_BACKEND_STATUS_OPS(LS_BACKEND_COUNT_))

/* The ops whose slots `be` leaves empty, comma-separated into names (cap bytes, may be
 * NULL); their number. A model needs every slot filled. */
int ls_backend_missing(const ls_backend *be, char *names, size_t cap);

/* ls_op_<name>(be, ...): the op through the backend's table. */
#define LS_BACKEND_OP_(name, params, args)                                                                           \
    static inline void ls_op_##name(LS_BACKEND_PARAMS_ params) { be->i->name(be, LS_BACKEND_ARGS_ args); }
#define LS_BACKEND_STATUS_OP_(name, params, args)                                                                    \
    static inline ls_status ls_op_##name(LS_BACKEND_PARAMS_ params) { return be->i->name(be, LS_BACKEND_ARGS_ args); }
#define LS_BACKEND_ARGS_(...) __VA_ARGS__
LS_BACKEND_OPS(LS_BACKEND_OP_)
LS_BACKEND_STATUS_OPS(LS_BACKEND_STATUS_OP_)

/* ---- host views: the one way host code reads or fills the backend's memory ---------
 * A host view of `bytes` of be's memory p is p itself when the backend's memory is host
 * memory (the CPU's; be NULL means host memory too: nothing is copied), else a host copy
 * — from the host part of arena a (released with a's marks), or malloc'd when a is NULL —
 * read back from p when `read`. NULL only when out of memory (or p is NULL).
 * ls_host_view_done writes the view back into p when `write` and frees a malloc'd view. */
static inline int ls_host_direct(const ls_backend *be) { return !be || be->host_mem; }
static inline void *ls_host_view(const ls_backend *be, ls_arena *a, void *p, size_t bytes, int read) {
    if (ls_host_direct(be) || !p) return p;
    void *h = a ? ls_arena_host_alloc(a, bytes ? bytes : 1) : malloc(bytes ? bytes : 1);
    if (h && read && bytes) be->i->to_host(be, h, p, bytes);
    return h;
}
static inline void ls_host_view_done(const ls_backend *be, ls_arena *a, void *p, void *h, size_t bytes, int write) {
    if (h == p || !h) return;
    if (write && bytes) be->i->to_device(be, p, h, bytes);
    if (!a) free(h);
}

/* n floats copied / zeroed in the backend's memory (its buffer slots). */
static inline void ls_op_copy(const ls_backend *be, float *dst, const float *src, int64_t n) {
    be->i->copy(be, dst, src, (size_t)n * sizeof(float));
}
static inline void ls_op_zero(const ls_backend *be, float *p, int64_t n) { be->i->zero(be, p, (size_t)n * sizeof(float)); }

#endif
