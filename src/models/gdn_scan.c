/*
 * gdn_scan.c — the Gated DeltaNet recurrence over a shard of positions, summarised so
 * that shards can run at once and be joined afterwards (issue 22: a state scan instead
 * of relaying the state rank to rank, as LASP-2, ZeCO and FLA's context parallelism do).
 *
 * Per value head the recurrence S_t = e^{g_t}(I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ
 * (S [d_k, d_v], o_t = scale·S_tᵀ q_t) is affine in the state it starts from: with
 * M_t = Π_{s≤t} e^{g_s}(I − β_s k_s k_sᵀ) [d_k, d_k],
 *     S_t = M_t S_in + S⁰_t,   o_t = o⁰_t + S_inᵀ u_t,   u_t = scale·M_tᵀ q_t,
 * where S⁰, o⁰ are the shard run from the zero state. M_t and u_t are the same
 * recurrence run from the identity with v = 0 (a state of d_k columns): two runs of the
 * chunked kernel, no new kernel. ls_gdn_shard_apply joins a shard to the state it
 * actually starts from: o += u·S_in per head, S_out = M S_in + S⁰ — GEMMs.
 */
#include <string.h>

#include "gdn_scan.h"

ls_status ls_gdn_shard_fwd(const ls_backend *be, float *o0, float *S0, float *u, float *M, const float *q,
                           const float *k, const float *v, const float *beta, const float *g, int64_t T,
                           ls_gdr_dims dm, ls_arena *sc) {
    int64_t Hv = dm.H_v, dk = dm.d_k, dv = dm.d_v;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    /* from the zero state: o⁰, S⁰ */
    ls_op_zero(be, S0, Hv * dk * dv);
    LS_TRY(ls_op_gdr_chunk_fwd(be, o0, NULL, S0, q, k, v, beta, g, T, dm, sc));
    /* from the identity with no values: u, M */
    float *zero_v = ls_arena_calloc(sc, (size_t)(T * Hv * dk > 0 ? T * Hv * dk : 1), sizeof(float));
    size_t mb = (size_t)(Hv * dk * dk) * sizeof(float);
    float *eye = ls_host_view(be, sc, M, mb, 0); /* the identity, written on the host and placed */
    if (!zero_v || !eye) return LS_ERR_NOMEM;
    memset(eye, 0, mb);
    for (int64_t h = 0; h < Hv; h++)
        for (int64_t i = 0; i < dk; i++) eye[(h * dk + i) * dk + i] = 1.0f;
    ls_host_view_done(be, sc, M, eye, mb, 1);
    ls_gdr_dims di = dm;
    di.d_v = dm.d_k;
    LS_TRY(ls_op_gdr_chunk_fwd(be, u, NULL, M, q, k, zero_v, beta, g, T, di, sc));
    ls_arena_release(sc, mk);
    return LS_OK;
}

void ls_gdn_shard_apply(const ls_backend *be, float *o, float *S_out, const float *u, const float *M,
                        const float *S0, const float *S_in, int64_t T, ls_gdr_dims dm) {
    int64_t Hv = dm.H_v, dk = dm.d_k, dv = dm.d_v;
    for (int64_t h = 0; h < Hv; h++) {
        const float *Si = S_in + h * dk * dv;
        /* o[t, h, :] += u[t, h, :] · S_in[h]  ([T, d_k] × [d_k, d_v], rows H_v·d apart) */
        if (o && T > 0) ls_op_gemm(be, 0, 0, T, dv, dk, 1.0f, u + h * dk, Hv * dk, Si, dv, 1.0f, o + h * dv, Hv * dv);
        /* S_out[h] = M[h] · S_in[h] + S⁰[h] */
        if (S_out) {
            if (S_out != S0) ls_op_copy(be, S_out + h * dk * dv, S0 + h * dk * dv, dk * dv);
            ls_op_gemm(be, 0, 0, dk, dv, dk, 1.0f, M + h * dk * dk, dk, Si, dv, 1.0f, S_out + h * dk * dv, dv);
        }
    }
}
