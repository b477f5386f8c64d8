/*
 * rows.h — per-row pieces that the CPU backend's loops and the CUDA backend's kernels
 * share, written once so the two compute the same thing in the same order: the hybrid's
 * softmax top-k routing of a token, the MLA family's group-limited selection of a token,
 * and the log-sum-exp merge of two attention partials of a row.
 */
#ifndef LONGSTRAW_BACKEND_ROWS_H
#define LONGSTRAW_BACKEND_ROWS_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define LS_HD __host__ __device__
#else
#define LS_HD
#endif

/* Groups the MLA routing can hold (DeepSeek-V3.2 and GLM-5.x use 8 or 1). */
#define LS_ROUTE_MAX_GROUPS 256

/* The hybrid's routing of one token (ls_moe_route): p[E] (=) = softmax(lg) in double;
 * K passes each taking the largest untaken probability (ties to the lower index);
 * wt[K] their probabilities, renormalised to sum 1 when norm_topk. */
static inline LS_HD void ls_moe_route_row(float *p, int32_t *sel, float *wt, const float *lg, int E, int K,
                                          int norm_topk) {
    float mx = -INFINITY;
    for (int e = 0; e < E; e++) mx = lg[e] > mx ? lg[e] : mx;
    double s = 0;
    for (int e = 0; e < E; e++) s += exp((double)(lg[e] - mx));
    for (int e = 0; e < E; e++) p[e] = (float)(exp((double)(lg[e] - mx)) / s);
    double tot = 0;
    for (int j = 0; j < K; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= sel[i] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        sel[j] = best;
        wt[j] = p[best];
        tot += p[best];
    }
    if (norm_topk)
        for (int j = 0; j < K; j++) wt[j] = (float)(wt[j] / tot);
}

/* The MLA family's selection for one token (ls_mla_route_fwd) from s = σ(logits) and sb =
 * s + bias [E] (double): among the topk_group groups (of n_group) whose two best sb sum
 * highest (ties to the lower group), the K largest sb (ties to the lower index; keep[E]
 * is scratch, set to 1 on entry); o[K] in selection order, wt[K] from the unbiased s,
 * renormalised (sum + 1e-20) when norm, times scaling. 0, or −1 when the kept groups hold
 * fewer than K experts. */
static inline LS_HD int ls_mla_route_pick(int32_t *o, float *wt, const double *s, const double *sb, unsigned char *keep,
                                          int E, int K, int n_group, int topk_group, int norm, double scaling) {
    if (n_group > 1 && topk_group < n_group) {
        int per = E / n_group;
        double gs[LS_ROUTE_MAX_GROUPS];
        unsigned char gk[LS_ROUTE_MAX_GROUPS];
        for (int gi = 0; gi < n_group; gi++) { /* the group's two best */
            double b1 = -INFINITY, b2 = -INFINITY;
            for (int e = gi * per; e < (gi + 1) * per; e++) {
                if (sb[e] > b1) b2 = b1, b1 = sb[e];
                else if (sb[e] > b2) b2 = sb[e];
            }
            gs[gi] = per > 1 ? b1 + b2 : b1;
            gk[gi] = 0;
        }
        for (int j = 0; j < topk_group; j++) {
            int best = -1;
            for (int gi = 0; gi < n_group; gi++)
                if (!gk[gi] && (best < 0 || gs[gi] > gs[best])) best = gi;
            gk[best] = 1;
        }
        for (int e = 0; e < E; e++) keep[e] = gk[e / per];
    }
    double tot = 0;
    for (int j = 0; j < K; j++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (keep[e] && (best < 0 || sb[e] > sb[best])) best = e;
        if (best < 0) return -1;
        keep[best] = 0;
        o[j] = best;
        tot += s[best];
    }
    for (int j = 0; j < K; j++) wt[j] = (float)((norm ? s[o[j]] / (tot + 1e-20) : s[o[j]]) * scaling);
    return 0;
}

/* The hybrid router's backward for one token (ls_moe_route_bwd): dl[E] (=) from dwt[K] and
 * the forward's p[E], sel[K], wt[K]; dp[E] is scratch (doubles). */
static inline LS_HD void ls_moe_route_bwd_row(float *dl, const float *dwt, const float *p, const int32_t *sel,
                                              const float *wt, int E, int K, int norm_topk, double *dp) {
    for (int e = 0; e < E; e++) dp[e] = 0;
    if (norm_topk) {
        double Z = 0, Sw = 0;
        for (int j = 0; j < K; j++) Z += p[sel[j]];
        for (int j = 0; j < K; j++) Sw += (double)dwt[j] * wt[j];
        for (int j = 0; j < K; j++) dp[sel[j]] = (dwt[j] - Sw) / Z;
    } else {
        for (int j = 0; j < K; j++) dp[sel[j]] = dwt[j];
    }
    double s = 0;
    for (int e = 0; e < E; e++) s += dp[e] * p[e];
    for (int e = 0; e < E; e++) dl[e] = (float)(p[e] * (dp[e] - s));
}

/* The MLA router's backward for one token (ls_mla_route_bwd): dl[E] (=) from dwt[K], the
 * saved σ st[E] and the selection o[K]. */
static inline LS_HD void ls_mla_route_bwd_row(float *dl, const float *dwt, const float *st, const int32_t *o, int E,
                                              int K, int norm, double scaling) {
    for (int e = 0; e < E; e++) dl[e] = 0.0f;
    double Z = 1e-20, dot = 0;
    for (int j = 0; j < K; j++) Z += st[o[j]], dot += (double)dwt[j] * st[o[j]];
    for (int j = 0; j < K; j++) {
        double sj = st[o[j]], ds = norm ? scaling * ((double)dwt[j] / Z - dot / (Z * Z)) : scaling * (double)dwt[j];
        dl[o[j]] = (float)(ds * sj * (1.0 - sj));
    }
}

/* One row of the log-sum-exp merge (ls_attn_merge): (x [hd], *lse) ← the merge of itself
 * and (y, lse2); both empty (−inf): unchanged. */
static inline LS_HD void ls_attn_merge_row(float *x, float *lse, const float *y, float lse2, int hd) {
    double a = *lse, b = lse2, m = a > b ? a : b;
    if (m == -INFINITY) return;
    double wa = exp(a - m), wb = exp(b - m), inv = 1.0 / (wa + wb);
    float fa = (float)(wa * inv), fb = (float)(wb * inv);
    for (int d = 0; d < hd; d++) x[d] = fa * x[d] + fb * y[d];
    *lse = (float)(m + log(wa + wb));
}

#endif
