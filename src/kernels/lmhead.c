/*
 * lmhead.c — LM head fused with the log-softmax, in row chunks: logits for
 * `chunk_rows` tokens at a time ([chunk_rows, V] in scratch), never [T, V].
 */
#include <cblas.h>
#include <math.h>

#include "longstraw/kernels.h"

ls_status ls_lmhead_logprobs_fwd(float *logprob, float *lse, const float *h, const float *W,
                                 const int32_t *target, int64_t T, int64_t D, int64_t V,
                                 float temperature, int64_t chunk_rows, ls_arena *scratch) {
    if (T <= 0) return LS_OK;
    if (chunk_rows <= 0) chunk_rows = 32;
    if (chunk_rows > T) chunk_rows = T;
    ls_arena_mark mk = ls_arena_get_mark(scratch);
    float *logits = ls_arena_alloc(scratch, (size_t)chunk_rows * (size_t)V * sizeof(float)); /* [rows, V] */
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
            double s = 0;
            for (int64_t j = 0; j < V; j++) s += exp((double)(row[j] - m));
            double l = (double)m + log(s);
            logprob[t0 + r] = (float)((double)row[target[t0 + r]] - l);
            if (lse) lse[t0 + r] = (float)l;
        }
    }
    ls_arena_release(scratch, mk);
    return LS_OK;
}
