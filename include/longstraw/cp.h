/*
 * cp.h — context-parallel composition (DESIGN §8): attention over a prompt whose
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

#endif
