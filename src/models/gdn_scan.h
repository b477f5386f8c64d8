/*
 * gdn_scan.h — the Gated DeltaNet recurrence over a shard, summarised so that shards run
 * at once and are joined afterwards (issue 22's state scan; gdn_scan.c has the algebra).
 * Internal to src/models/.
 */
#ifndef LONGSTRAW_MODELS_GDN_SCAN_H
#define LONGSTRAW_MODELS_GDN_SCAN_H

#include "longstraw/backend.h"
#include "longstraw/kernels.h"

/* The shard q, k [T,H_k,d_k], v [T,H_v,d_v], beta, g [T,H_v] run from the zero state:
 * o0 [T,H_v,d_v] (=) its outputs, S0 [H_v,d_k,d_v] (=) its final state; and the map
 * from the state it really starts from: u [T,H_v,d_k] (=) the correction vectors,
 * M [H_v,d_k,d_k] (=) the transition. Scratch from sc, released. */
ls_status ls_gdn_shard_fwd(const ls_backend *be, float *o0, float *S0, float *u, float *M, const float *q,
                           const float *k, const float *v, const float *beta, const float *g, int64_t T,
                           ls_gdr_dims dm, ls_arena *sc);
/* Join a summarised shard to the state S_in [H_v,d_k,d_v] it starts from: o (+=) u·S_in
 * per head (o NULL: skipped), S_out (=) M·S_in + S0 (NULL: skipped; may be S0 itself). */
void ls_gdn_shard_apply(const ls_backend *be, float *o, float *S_out, const float *u, const float *M,
                        const float *S0, const float *S_in, int64_t T, ls_gdr_dims dm);

#endif
