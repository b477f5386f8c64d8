/*
 * cp_merge.c — the log-sum-exp merge of attention partials across ranks, and the partial
 * sums and maxima CP composes with (cp.h).
 */
#include <math.h>
#include <string.h>

#include "longstraw/cp.h"
#include "longstraw/family.h"
#include "longstraw/backend.h"

ls_status ls_cp_merge(const ls_backend *be, float *o_dev, float *lse_dev, int64_t rows, int hd, const ls_comm *comm,
                      ls_arena *scratch) {
    if (!comm || ls_comm_size(comm) == 1) return LS_OK;
    ls_arena_mark mk = ls_arena_get_mark(scratch);
    const int64_t w = hd + 1;
    size_t ob = (size_t)(rows * hd) * sizeof(float), lb = (size_t)rows * sizeof(float);
    float *o = ls_host_view(be, scratch, o_dev, ob, 1), *lse = ls_host_view(be, scratch, lse_dev, lb, 1); /* host views */
    float *m = ls_arena_host_alloc(scratch, (size_t)rows * sizeof(float));       /* [rows] global max */
    float *buf = ls_arena_host_alloc(scratch, (size_t)(rows * w) * sizeof(float)); /* [rows, hd + 1]: n | a */
    if (!m || !buf || !o || !lse) {
        ls_arena_release(scratch, mk);
        return ls_err(LS_ERR_NOMEM, "CP merge of %lld rows", (long long)rows);
    }
    memcpy(m, lse, (size_t)rows * sizeof(float));
    ls_status s = ls_comm_allreduce_f32(comm, m, rows, LS_REDUCE_MAX);
    if (s == LS_OK) {
#pragma omp parallel for schedule(static) if (rows * hd > 65536)
        for (int64_t i = 0; i < rows; i++) {
            float e = m[i] == -INFINITY ? 0.0f : expf(lse[i] - m[i]); /* e^{ℓ_r − m}; 0 for an empty partial */
            for (int d = 0; d < hd; d++) buf[i * w + d] = e * o[i * hd + d];
            buf[i * w + hd] = e;
        }
        s = ls_comm_allreduce_f32(comm, buf, rows * w, LS_REDUCE_SUM);
    }
    if (s == LS_OK) {
#pragma omp parallel for schedule(static) if (rows * hd > 65536)
        for (int64_t i = 0; i < rows; i++) {
            float a = buf[i * w + hd];
            if (!(a > 0)) { /* no rank saw a key */
                memset(o + i * hd, 0, (size_t)hd * sizeof(float));
                lse[i] = -INFINITY;
                continue;
            }
            float inv = 1.0f / a;
            for (int d = 0; d < hd; d++) o[i * hd + d] = buf[i * w + d] * inv;
            lse[i] = m[i] + logf(a);
        }
    }
    ls_host_view_done(be, scratch, o_dev, o, ob, s == LS_OK);
    ls_host_view_done(be, scratch, lse_dev, lse, lb, s == LS_OK);
    ls_arena_release(scratch, mk);
    return s;
}

ls_status ls_dist_sum_f32(const ls_backend *be, const ls_comm *comm, float *x, int64_t n) {
    size_t b = (size_t)n * sizeof(float);
    float *h = ls_host_view(be, NULL, x, b, 1);
    if (!h) return ls_err(LS_ERR_NOMEM, "staging a sum of %lld floats", (long long)n);
    ls_status s = ls_comm_allreduce_f32(comm, h, n, LS_REDUCE_SUM);
    ls_host_view_done(be, NULL, x, h, b, s == LS_OK);
    return s;
}

ls_status ls_dist_sum_f64(const ls_comm *comm, double *x, int64_t n) {
    return ls_comm_allreduce_f64(comm, x, n, LS_REDUCE_SUM);
}

ls_status ls_dist_max_f32(const ls_comm *comm, float *x, int64_t n) {
    return ls_comm_allreduce_f32(comm, x, n, LS_REDUCE_MAX);
}

ls_status ls_dist_sum_params(const ls_backend *be, const ls_comm *comm, const ls_param *g, int64_t n) {
    ls_status s = LS_OK;
    for (int64_t k = 0; k < n && s == LS_OK; k++)
        if (g[k].p) s = ls_dist_sum_f32(be, comm, g[k].p, g[k].n);
    return s;
}

ls_status ls_dist_bcast_params(const ls_backend *be, const ls_comm *comm, const ls_param *g, int64_t n, int root) {
    ls_status s = LS_OK;
    for (int64_t k = 0; k < n && s == LS_OK; k++) {
        if (!g[k].p) continue;
        ls_dist_part part = {g[k].p, (size_t)g[k].n * sizeof(float)};
        s = ls_dist_bcast_parts(be, comm, &part, 1, root);
    }
    return s;
}
