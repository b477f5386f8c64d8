/*
 * cp.h — the distributed layer's named operations, which the models call (src/dist/;
 * comm.c alone names MPI).
 *
 * Context-parallel composition (DESIGN §8): attention over a prompt whose
 * pages are split across ranks. Each rank computes the partial (o_r, ℓ_r) of its own
 * pages (the rank holding the call's own keys adds them); the global output is
 *   m = max_r ℓ_r,  a = Σ_r e^{ℓ_r − m},  n = Σ_r e^{ℓ_r − m} o_r,  o = n / a,  ℓ = m + log a
 * — one MAX and one SUM all-reduce (n and a travel in one buffer). The backward is
 * local given the global (o, ℓ): each rank's share of dq comes from its own keys
 * (ls_attn_prefix_bwd), and the shares are summed.
 */
#ifndef LONGSTRAW_CP_H
#define LONGSTRAW_CP_H

#include <stdint.h>

#include "longstraw/comm.h"
#include "longstraw/core.h"
#include "longstraw/family.h"

/* Every operation below that moves the models' data takes the backend `be` whose memory
 * it is (NULL: host memory) and stages it through host memory when that backend keeps
 * its buffers away from the host (ls_host_view, backend.h); on the CPU nothing is copied. The
 * partial sums of f64 and maxima take host memory. */
struct ls_backend;

/* In place: o [rows, hd], lse [rows] this rank's partial → the global output and
 * log-sum-exp over every rank's keys (identical bits on every rank). An empty
 * partial has lse = −inf. Transients (rows·(hd + 2) floats) from `scratch`. */
ls_status ls_cp_merge(const struct ls_backend *be, float *o, float *lse, int64_t rows, int hd, const ls_comm *comm,
                      ls_arena *scratch);

/* The ring over pages (DESIGN §8). The pages holding positions [0, npos) of a
 * segment of attention layer `layer` (k[i], v[i]: page_size positions, page_bytes each,
 * in the state's dtype) travel from their holder to a reader in blocks of at most bp
 * pages, K | V of a block in one message, so the reader never holds more than one block
 * of another rank's pages. The reader handles each block in `fn`: nb pages holding
 * `rows` positions (dk/dv NULL without gradients). Scratch: one block's buffers (K | V,
 * and with gradients dK | dV in f32) and its page pointers. */
typedef ls_status (*ls_dist_pages_fn)(void *ctx, void *const *k, void *const *v, float *const *dk, float *const *dv,
                                      int64_t nb, int64_t rows);
ls_status ls_dist_pages_send(const struct ls_backend *be, const ls_comm *comm, void *const *k, void *const *v,
                             int64_t npos, int64_t page_size, size_t page_bytes, int64_t bp, int dst, int layer,
                             ls_arena *scratch);
ls_status ls_dist_pages_recv(const struct ls_backend *be, const ls_comm *comm, int64_t npos, int64_t page_size,
                             size_t page_bytes, int64_t bp, int src, int layer, ls_dist_pages_fn fn, void *ctx,
                             ls_arena *scratch);
/* With gradients (the full-mode sweep): the reader's fn adds into dk/dv (f32 pages of
 * grad_floats values, zeroed per block) the gradient of the block, which goes back to
 * the holder before the next block leaves; the holder adds it to its dk/dv (f32). */
ls_status ls_dist_pages_send_grad(const struct ls_backend *be, const ls_comm *comm, void *const *k, void *const *v,
                                  void *const *dk, void *const *dv, int64_t npos, int64_t page_size, size_t page_bytes,
                                  int64_t grad_floats, int64_t bp, int dst, int layer, ls_arena *scratch);
ls_status ls_dist_pages_recv_grad(const struct ls_backend *be, const ls_comm *comm, int64_t npos, int64_t page_size,
                                  size_t page_bytes, int64_t grad_floats, int64_t bp, int src, int layer,
                                  ls_dist_pages_fn fn, void *ctx, ls_arena *scratch);

/* The gather by rounds (the layer-major CP capture's attention layers): every rank
 * holds its segments' pages of one layer whole; in round b each rank contributes block b
 * (at most bp pages, K | V: k_bytes and v_bytes a page, v_bytes 0 for K alone) of each of its segments that a later segment of another rank
 * reads, and every rank receives all of them in one all-gather — the ranks meet in the
 * collective together, so none waits on a single sender while it computes. `fn` sees
 * every received block of another rank's segment `seg` (nb pages holding `rows`
 * positions, the first at `row0` of the segment), in round order then prompt order.
 * Scratch: ls_dist_gather_bytes. */
typedef ls_status (*ls_dist_seg_fn)(void *ctx, int seg, void *const *k, void *const *v, int64_t nb, int64_t rows,
                                    int64_t row0);
typedef struct {
    int n;                   /* the layout's segments, prompt order */
    const int *owner;        /* [n] their ranks */
    const int64_t *npos;     /* [n] their positions */
    void **const *k, **const *v; /* [n] this rank's segments' page tables (NULL: another rank's) */
    void **const *dk, **const *dv; /* ls_dist_pages_gather_grad: their gradient tables (f32), else NULL */
} ls_dist_segs;
ls_status ls_dist_pages_gather(const struct ls_backend *be, const ls_comm *comm, const ls_dist_segs *segs,
                               int64_t page_size, size_t k_bytes, size_t v_bytes, int64_t bp, int layer, ls_dist_seg_fn fn,
                               void *ctx, ls_arena *scratch);
/* The gather with gradients (the layer-major full-mode sweep): in each round `fn` also
 * gets a block's dK | dV pages (f32, grad_k and grad_v values a page, zeroed; grad_v 0:
 * no dV, NULL pointers) to add the gradient of its keys and values into; after the round
 * every rank's share of each block goes to the block's owner in one all-to-all, and the
 * owner adds them (in rank order) into its segments' segs->dk / segs->dv. */
typedef ls_status (*ls_dist_seg_grad_fn)(void *ctx, int seg, void *const *k, void *const *v, float *const *dk,
                                         float *const *dv, int64_t nb, int64_t rows, int64_t row0);
ls_status ls_dist_pages_gather_grad(const struct ls_backend *be, const ls_comm *comm, const ls_dist_segs *segs,
                                    int64_t page_size, size_t k_bytes, size_t v_bytes, int64_t grad_k, int64_t grad_v,
                                    int64_t bp, int layer, ls_dist_seg_grad_fn fn, void *ctx, ls_arena *scratch);
/* The pages per block of a gather over `ranks` ranks whose fullest rank sends `slots`
 * segments (the caller's bp, lowered so the round's buffers stay near 8 blocks' worth), and
 * the bytes its buffers take. */
int64_t ls_dist_gather_block(int64_t bp, int ranks, int slots);
size_t ls_dist_gather_bytes(int64_t bp, int ranks, int slots, size_t k_bytes, size_t v_bytes);

/* The state relay: a layer's recurrent state (at most 2 parts, such as the Gated
 * DeltaNet state and conv tail, or their gradients) from the owner of one segment to the
 * owner of the next. ls_dist_bcast_parts: any number of parts from `root` to every rank
 * (the final states; a chunk's queries from their owner). Parts of 0 bytes are skipped. */
typedef struct {
    void *p;
    size_t bytes;
} ls_dist_part;
ls_status ls_dist_relay_send(const struct ls_backend *be, const ls_comm *comm, const ls_dist_part *parts, int n, int dst,
                             int layer);
ls_status ls_dist_relay_recv(const struct ls_backend *be, const ls_comm *comm, const ls_dist_part *parts, int n, int src,
                             int layer);
ls_status ls_dist_bcast_parts(const struct ls_backend *be, const ls_comm *comm, const ls_dist_part *parts, int n,
                              int root);

/* The partial reductions CP composes with: each rank's share of a sum (dq over its own
 * pages, the MLA's query gradients) or of a maximum, combined in place, identical bits
 * on every rank. */
ls_status ls_dist_sum_f32(const struct ls_backend *be, const ls_comm *comm, float *x, int64_t n);
ls_status ls_dist_sum_f64(const ls_comm *comm, double *x, int64_t n);
/* Tensor lists (family.h ls_param: gradients, be's memory; NULL entries skipped): each
 * summed over the ranks (identical bits everywhere), or root's broadcast to every rank. */
ls_status ls_dist_sum_params(const struct ls_backend *be, const ls_comm *comm, const ls_param *g, int64_t n);
ls_status ls_dist_bcast_params(const struct ls_backend *be, const ls_comm *comm, const ls_param *g, int64_t n,
                               int root);
ls_status ls_dist_max_f32(const ls_comm *comm, float *x, int64_t n);

/* A key a rank proposes for a query's sparse selection: its score and position (−1:
 * none). */
typedef struct {
    float score;
    int32_t pos;
} ls_topk_cand;

/* The global top-k merge (specs/mla-dsa-moe.md §6 step A): mine [T, k] holds this rank's
 * best k keys per query (any order, pos −1 for none); one all-gather; sel [T, k] (=) the
 * best k of the union by (score descending, position ascending), in ascending
 * position, −1 after — exactly the one-rank selection, since a key among the global
 * top k is among its own rank's top k. Scratch: (ranks + 1)·T·k candidates. */
ls_status ls_dist_topk_merge(const struct ls_backend *be, int32_t *sel, const ls_topk_cand *mine, int64_t T, int64_t k,
                             const ls_comm *comm, ls_arena *scratch);

/* The expert-parallel combine (specs/mla-dsa-moe.md §7): y [T, W] holds this rank's
 * share of each token's routed outputs (zero rows where none of the token's experts
 * sel [T, K] is among the n_local this rank holds: experts [rank·n_local, +n_local));
 * the shares go to the owner of each token's slice (all-to-all), are summed there in
 * rank order (the same bits whatever the timing), and the sums all-gathered: y (=) the
 * whole on every rank. */
ls_status ls_dist_ep_combine(const struct ls_backend *be, float *y, int64_t T, int64_t W, const int32_t *sel, int K,
                             int64_t n_local, const ls_comm *ep, ls_arena *scratch);

/* The expert gather of an export: n floats of a tensor held by EP rank `owner` (mine,
 * read there) to the group's rank 0 (out, written there); a no-op elsewhere and when
 * the owner is rank 0. */
ls_status ls_dist_ep_gather(const ls_comm *ep, const float *mine, float *out, int64_t n, int owner);

/* The layer-major CP capture in waves (issue 22): a layer keeps per-position buffers
 * (queries, partial outputs; per_pos bytes a position) for at most W of the rank's
 * positions at a time, W = `forced` when > 0, else LS_CP_WAVE_BYTES / per_pos (at least
 * one capture chunk C). Every rank makes the same number of waves, *nw = ⌈fullest / W⌉
 * (fullest: the positions of the rank holding most), so their collectives pair up.
 * Returns W. */
#define LS_CP_WAVE_BYTES ((size_t)1 << 30)
int64_t ls_cp_waves(int64_t fullest, int64_t C, int64_t forced, size_t per_pos, int64_t *nw);

#endif
