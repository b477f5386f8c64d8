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

/* In place: o [rows, hd], lse [rows] this rank's partial → the global output and
 * log-sum-exp over every rank's keys (identical bits on every rank). An empty
 * partial has lse = −inf. Transients (rows·(hd + 2) floats) from `scratch`. */
ls_status ls_cp_merge(float *o, float *lse, int64_t rows, int hd, const ls_comm *comm, ls_arena *scratch);

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
ls_status ls_dist_topk_merge(int32_t *sel, const ls_topk_cand *mine, int64_t T, int64_t k, const ls_comm *comm,
                             ls_arena *scratch);

/* The expert-parallel combine (specs/mla-dsa-moe.md §7): y [T, W] holds this rank's
 * share of each token's routed outputs (zero rows where none of the token's experts
 * sel [T, K] is among the n_local this rank holds: experts [rank·n_local, +n_local));
 * the shares go to the owner of each token's slice (all-to-all), are summed there in
 * rank order (the same bits whatever the timing), and the sums all-gathered: y (=) the
 * whole on every rank. */
ls_status ls_dist_ep_combine(float *y, int64_t T, int64_t W, const int32_t *sel, int K, int64_t n_local,
                             const ls_comm *ep, ls_arena *scratch);

#endif
