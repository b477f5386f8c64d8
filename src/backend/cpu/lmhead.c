/*
 * lmhead.c — LM head fused with the log-softmax, in row chunks: logits for
 * `chunk_rows` tokens at a time ([chunk_rows, V] in scratch), never [T, V].
 * The backward and the entropy recompute the logits chunk by chunk the same way.
 */
#include <cblas.h>
#include <math.h>

#include "longstraw/kernels.h"

/* Normalise chunk_rows as the forward does and take a [chunk_rows, V] f32 logits buffer from
 * `scratch` (the caller releases it); NULL with ls_err set on overflow or out of memory. */
static float *logits_chunk_alloc(ls_arena *scratch, int64_t *chunk_rows, int64_t T, int64_t D,
                                 int64_t V, float temperature) {
    LS_ASSERT(V > 0 && D > 0 && temperature > 0.0f, "lmhead: D=%lld V=%lld temperature=%g",
              (long long)D, (long long)V, (double)temperature);
    LS_ASSERT(D <= INT32_MAX && V <= INT32_MAX, "sgemm dims exceed int");
    if (*chunk_rows <= 0) *chunk_rows = 32;
    if (*chunk_rows > T) *chunk_rows = T;
    size_t bytes;
    if (ls_mul_size((size_t)*chunk_rows, (size_t)V, &bytes) ||
        ls_mul_size(bytes, sizeof(float), &bytes)) {
        ls_err(LS_ERR_NOMEM, "lmhead: logits chunk [%lld, %lld] overflows size_t",
               (long long)*chunk_rows, (long long)V);
        return NULL;
    }
    return ls_arena_alloc(scratch, bytes);
}

/* One pass over the logits in row chunks: log-prob of the target and lse (when
 * logprob is non-NULL) and the entropy −Σ p·log p = log s − Σ e_v·(z_v − max)/s with
 * e_v = exp(z_v − max), s = Σ e_v (when entropy is non-NULL); double per row. */
static ls_status lmhead_pass(float *logprob, float *lse, float *entropy, const float *h, const float *W,
                             const int32_t *target, int64_t T, int64_t D, int64_t V, float temperature,
                             int64_t chunk_rows, ls_arena *scratch) {
    if (T <= 0) return LS_OK;
    ls_arena_mark mk = ls_arena_get_mark(scratch);
    float *logits = logits_chunk_alloc(scratch, &chunk_rows, T, D, V, temperature); /* [rows, V] */
    if (!logits) return LS_ERR_NOMEM;
    float inv_temp = 1.0f / temperature;
    for (int64_t t0 = 0; t0 < T; t0 += chunk_rows) {
        int64_t n = T - t0 < chunk_rows ? T - t0 : chunk_rows;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)V, (int)D, inv_temp,
                    h + t0 * D, (int)D, W, (int)D, 0.0f, logits, (int)V);
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < n; r++) {
            const float *row = logits + r * V;
            float m = -INFINITY;
            for (int64_t j = 0; j < V; j++) m = row[j] > m ? row[j] : m;
            double sum = 0, sz = 0;
            for (int64_t j = 0; j < V; j++) {
                double d = (double)row[j] - (double)m, e = exp(d);
                sum += e;
                sz += e * d;
            }
            double l = (double)m + log(sum);
            if (logprob) logprob[t0 + r] = (float)((double)row[target[t0 + r]] - l);
            if (lse) lse[t0 + r] = (float)l;
            if (entropy) entropy[t0 + r] = (float)(log(sum) - sz / sum);
        }
    }
    ls_arena_release(scratch, mk);
    return LS_OK;
}

ls_status ls_lmhead_fwd(float *logprob, float *lse, float *entropy, const float *h, const float *W,
                        const int32_t *target, int64_t T, int64_t D, int64_t V, float temperature,
                        int64_t chunk_rows, ls_arena *scratch) {
    return lmhead_pass(logprob, lse, entropy, h, W, target, T, D, V, temperature, chunk_rows, scratch);
}

ls_status ls_lmhead_logprobs_fwd(float *logprob, float *lse, const float *h, const float *W,
                                 const int32_t *target, int64_t T, int64_t D, int64_t V,
                                 float temperature, int64_t chunk_rows, ls_arena *scratch) {
    return lmhead_pass(logprob, lse, NULL, h, W, target, T, D, V, temperature, chunk_rows, scratch);
}

ls_status ls_lmhead_entropy(float *entropy, const float *h, const float *W, int64_t T, int64_t D,
                            int64_t V, float temperature, int64_t chunk_rows, ls_arena *scratch) {
    return lmhead_pass(NULL, NULL, entropy, h, W, NULL, T, D, V, temperature, chunk_rows, scratch);
}

/* dh[T,D] (=), dW[V,D] (+=; NULL skips). With z = h·Wᵀ/τ (recomputed per chunk) and the saved
 * lse, logprob[t] = z[t, target] − lse[t], so
 *   dz[t,v] = dlogprob[t]·(onehot(target[t])_v − exp(z[t,v] − lse[t])),
 *   dh[t] = dz[t]·W/τ,   dW += dzᵀ·h/τ   (1/τ folded into dz before the two sgemms).
 * Scratch: one [chunk_rows, V] f32 chunk from `scratch`, released before return. */
ls_status ls_lmhead_logprobs_bwd(float *dh, float *dW, const float *dlogprob, const float *h,
                                 const float *W, const int32_t *target, const float *lse,
                                 int64_t T, int64_t D, int64_t V, float temperature,
                                 int64_t chunk_rows, ls_arena *scratch) {
    if (T <= 0) return LS_OK;
    ls_arena_mark mk = ls_arena_get_mark(scratch);
    float *dz = logits_chunk_alloc(scratch, &chunk_rows, T, D, V, temperature); /* [rows, V] */
    if (!dz) return LS_ERR_NOMEM;
    float inv_temp = 1.0f / temperature;
    for (int64_t t0 = 0; t0 < T; t0 += chunk_rows) {
        int64_t n = T - t0 < chunk_rows ? T - t0 : chunk_rows;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)V, (int)D, inv_temp,
                    h + t0 * D, (int)D, W, (int)D, 0.0f, dz, (int)V);
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < n; r++) {
            float *row = dz + r * V; /* logits in, dz/τ out */
            double l = lse[t0 + r];
            double g = (double)dlogprob[t0 + r] * (double)inv_temp;
            int32_t tg = target[t0 + r];
            double zt = row[tg];
            for (int64_t j = 0; j < V; j++) row[j] = (float)(-g * exp((double)row[j] - l));
            row[tg] = (float)(g * -expm1(zt - l)); /* g·(1 − p): no cancellation as p → 1 */
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)D, (int)V, 1.0f, dz,
                    (int)V, W, (int)D, 0.0f, dh + t0 * D, (int)D);
        if (dW)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)V, (int)D, (int)n, 1.0f, dz,
                        (int)V, h + t0 * D, (int)D, 1.0f, dW, (int)D);
    }
    ls_arena_release(scratch, mk);
    return LS_OK;
}
