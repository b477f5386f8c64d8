/*
 * gates.c — the CPU kernels of the small element-wise and routing steps the layers
 * share (they were loops inside the models): the sigmoid gate of the attention
 * output, the gated shared-expert add, the Gated DeltaNet's gate/normalisation
 * prologue, the batched one-token decode of the conv and the recurrence, MoE routing
 * by softmax top-k and the grouping of routed rows by expert, and the general
 * product. Each computes exactly what the loop it replaces computed (same operations
 * in the same order), so every result is bit-identical to before.
 */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "backend/rows.h"
#include "backend/cpu/vec.h"
#include "longstraw/kernels.h"

static float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

void ls_add_to(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

void ls_copy_rows(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t width) {
    for (int64_t r = 0; r < rows; r++) memcpy(dst + r * ld_dst, src + r * ld_src, (size_t)width * sizeof(float));
}

void ls_round_to(float *x, int64_t n, ls_dtype dtype) {
    if (dtype == LS_DTYPE_F32) return;
    LS_ASSERT(ls_dtype_size(dtype) == sizeof(uint16_t), "round_to: a %zu-byte dtype", ls_dtype_size(dtype));
    uint16_t tmp[256];
    for (int64_t i = 0; i < n; i += 256) {
        int64_t m = n - i < 256 ? n - i : 256;
        ls_convert_from_f32(tmp, dtype, x + i, (size_t)m);
        ls_convert_to_f32(x + i, tmp, dtype, (size_t)m);
    }
}

void ls_store_as(void *dst, const float *src, int64_t n, ls_dtype dtype) {
    if (n > 0) ls_convert_from_f32(dst, dtype, src, (size_t)n);
}

void ls_gemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
             const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)M,
                (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

/* (blocks of whole vectors: an element's arithmetic does not depend on n) */
#define SIGMUL_BLOCK 4096
void ls_sigmoid_mul_fwd(float *y, const float *x, const float *gate, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t b = 0; b < n; b += SIGMUL_BLOCK) {
        int64_t m = n - b < SIGMUL_BLOCK ? n - b : SIGMUL_BLOCK;
        float sg[SIGMUL_BLOCK];
        ls_sigmoid_n(sg, gate + b, m, 0);
        for (int64_t i = 0; i < m; i++) y[b + i] = x[b + i] * sg[i]; /* (y may be x) */
    }
}

void ls_sigmoid_mul_bwd(float *dx, float *dgate, const float *dy, const float *x, const float *gate, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float s = ls_sigmoidf(gate[i]), d = dy[i];
        dgate[i] = d * x[i] * s * (1.0f - s);
        dx[i] = d * s;
    }
}

void ls_gated_add_rows(float *x, const float *logit, const float *y, int64_t T, int64_t D) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        float s = ls_sigmoidf(logit[t]);
        for (int64_t d = 0; d < D; d++) x[t * D + d] += s * y[t * D + d];
    }
}

void ls_gated_add_rows_bwd(float *dy, float *dlogit, const float *dx, const float *logit, const float *y, int64_t T,
                           int64_t D) {
    for (int64_t t = 0; t < T; t++) {
        float sg = ls_sigmoidf(logit[t]);
        double dot = 0;
        for (int64_t d = 0; d < D; d++) {
            dot += (double)dx[t * D + d] * y[t * D + d];
            dy[t * D + d] = sg * dx[t * D + d];
        }
        dlogit[t] = (float)(dot * sg * (1.0f - sg));
    }
}

void ls_gdn_prep_fwd(float *q, float *k, float *v, float *beta, float *g, float *rq, float *rk, const float *y,
                     const float *ba, const float *A_log, const float *dt_bias, int64_t T, ls_gdr_dims dm) {
    int64_t kd = (int64_t)dm.H_k * dm.d_k, vd = (int64_t)dm.H_v * dm.d_v, cd = 2 * kd + vd;
    int Hv = dm.H_v, Hk = dm.H_k;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float *yt = y + t * cd;
        ls_l2norm_fwd(q + t * kd, rq ? rq + t * Hk : NULL, yt, Hk, dm.d_k, 1e-6f);
        ls_l2norm_fwd(k + t * kd, rk ? rk + t * Hk : NULL, yt + kd, Hk, dm.d_k, 1e-6f);
        memcpy(v + t * vd, yt + 2 * kd, (size_t)vd * sizeof(float));
        for (int h = 0; h < Hv; h++) {
            float bb = ba[t * 2 * Hv + h], aa = ba[t * 2 * Hv + Hv + h];
            beta[t * Hv + h] = ls_sigmoidf(bb);
            g[t * Hv + h] = -expf(A_log[h]) * softplusf(aa + dt_bias[h]);
        }
    }
}

void ls_gdn_prep_bwd(float *dy, float *dba, float *dA_log, float *ddt_bias, const float *dq, const float *dk,
                     const float *dv, const float *dbeta, const float *dg, const float *y, const float *rq,
                     const float *rk, const float *ba, const float *beta, const float *g, const float *A_log,
                     const float *dt_bias, int64_t T, ls_gdr_dims dm) {
    int64_t kd = (int64_t)dm.H_k * dm.d_k, vd = (int64_t)dm.H_v * dm.d_v, cd = 2 * kd + vd;
    int Hv = dm.H_v, Hk = dm.H_k;
    /* gates (spec §2.3): β = σ(b); g = −e^{A_log}·softplus(a + dt_bias); the per-head
     * sums run in token order */
    for (int64_t t = 0; t < T; t++) {
        const float *bat = ba + t * 2 * Hv;
        for (int h = 0; h < Hv; h++) {
            float bt = beta[t * Hv + h];
            dba[t * 2 * Hv + h] = dbeta[t * Hv + h] * bt * (1.0f - bt);
            float gg = dg[t * Hv + h];
            float da = gg * -expf(A_log[h]) * ls_sigmoidf(bat[Hv + h] + dt_bias[h]);
            dba[t * 2 * Hv + Hv + h] = da;
            if (ddt_bias) ddt_bias[h] += da;
            if (dA_log) dA_log[h] += gg * g[t * Hv + h];
        }
    }
    /* L2 norms of q, k and the v copy, back into the conv output rows */
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        float *dyt = dy + t * cd;
        const float *yt = y + t * cd;
        ls_l2norm_bwd(dyt, dq + t * kd, yt, rq + t * Hk, Hk, dm.d_k);
        ls_l2norm_bwd(dyt + kd, dk + t * kd, yt + kd, rk + t * Hk, Hk, dm.d_k);
        memcpy(dyt + 2 * kd, dv + t * vd, (size_t)vd * sizeof(float));
    }
}

void ls_conv_step_seqs(float *y, float *const *tails, const float *x, const float *w, int64_t n, int64_t C,
                       int64_t W) {
#pragma omp parallel for schedule(static) if (n > 1)
    for (int64_t i = 0; i < n; i++) ls_conv_fwd(y + i * C, NULL, tails[i], x + i * C, w, 1, C, W);
}

void ls_gdr_step_seqs(float *o, float *const *states, const float *q, const float *k, const float *v,
                      const float *beta, const float *g, int64_t n, ls_gdr_dims dm) {
    int64_t kd = (int64_t)dm.H_k * dm.d_k, vd = (int64_t)dm.H_v * dm.d_v;
#pragma omp parallel for schedule(static) if (n > 1)
    for (int64_t i = 0; i < n; i++)
        ls_gdr_serial_fwd(o + i * vd, states[i], q + i * kd, k + i * kd, v + i * vd, beta + i * dm.H_v,
                          g + i * dm.H_v, 1, dm);
}

void ls_moe_route(float *probs, int32_t *sel, float *wt, const float *logits, int64_t T, int E, int K, int norm_topk) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) ls_moe_route_row(probs + t * E, sel + t * K, wt + t * K, logits + t * E, E, K, norm_topk);
}

ls_status ls_moe_group(int64_t *count, int64_t *rows, const int32_t *sel, int64_t T, int E, int K, ls_arena *sc) {
    memset(count, 0, (size_t)(E + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < T * K; i++) count[sel[i] + 1]++;
    for (int e = 0; e < E; e++) count[e + 1] += count[e];
    ls_arena_mark mk = ls_arena_get_mark(sc);
    int64_t *fill = ls_arena_calloc(sc, (size_t)E, sizeof(int64_t));
    if (!fill) return LS_ERR_NOMEM;
    for (int64_t i = 0; i < T * K; i++) rows[count[sel[i]] + fill[sel[i]]++] = i;
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* ---- the routed rows of an expert (both families' MoE) ------------------------------ */
void ls_moe_gather(float *xs, const float *x, const int64_t *rows, int64_t n, int64_t D, int K) {
    for (int64_t i = 0; i < n; i++) memcpy(xs + i * D, x + (rows[i] / K) * D, (size_t)D * sizeof(float));
}

void ls_moe_scatter_add(float *y, const float *ys, const int64_t *rows, const float *wt, int64_t n, int64_t D, int K) {
    for (int64_t i = 0; i < n; i++) {
        float *yt = y + (rows[i] / K) * D;
        const float *yi = ys + i * D;
        if (wt) {
            float p = wt[rows[i]];
            for (int64_t d = 0; d < D; d++) yt[d] += p * yi[d];
        } else {
            for (int64_t d = 0; d < D; d++) yt[d] += yi[d];
        }
    }
}

void ls_moe_combine_bwd(float *dys, float *dwt, const float *dy, const float *ys, const int64_t *rows, const float *wt,
                        int64_t n, int64_t D, int K) {
    for (int64_t i = 0; i < n; i++) {
        const float *dr = dy + (rows[i] / K) * D;
        double dot = 0;
        for (int64_t d = 0; d < D; d++) {
            dot += (double)dr[d] * ys[i * D + d];
            dys[i * D + d] = wt[rows[i]] * dr[d];
        }
        dwt[rows[i]] = (float)dot;
    }
}

/* combine weights → selected probabilities (→ renormalisation) → softmax → logits */
void ls_moe_route_bwd(float *dlogits, const float *dwt, const float *probs, const int32_t *sel, const float *wt,
                      int64_t T, int E, int K, int norm_topk) {
    LS_ASSERT(E <= 1024, "too many experts for the router backward: %d", E);
    double dp[1024];
    for (int64_t t = 0; t < T; t++)
        ls_moe_route_bwd_row(dlogits + t * E, dwt + t * K, probs + t * E, sel + t * K, wt + t * K, E, K, norm_topk, dp);
}
