/*
 * test_mla.c — the second family's kernels and config-derived constants
 * (specs/mla-dsa-moe.md §2, §3):
 *  - the table rotary embedding in both pairings equals a double-precision rotation,
 *    and its backward equals central finite differences of sum(r ⊙ R·x);
 *  - YaRN: DeepSeek-V3.2's correction dims are 10 and 23 and its softmax scale
 *    0.135234; GLM-5's scale is 0.0625 (the spec's numbers);
 *  - the indexer's causal top-k equals a sort by (score desc, position asc), with many
 *    exact ties at the cutoff and queries that keep every key.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/kernels.h"
#include "longstraw/mla.h"
#include "testutil.h"

int test_mla_rope_table(void);
int test_mla_yarn_scale(void);
int test_dsa_topk(void);

/* double reference of one rotation */
static void rope_ref(double *y, const float *x, int64_t T, int heads, int hd, int off, int half, const double *f,
                     int inter, int64_t pos0) {
    for (int64_t t = 0; t < T; t++)
        for (int h = 0; h < heads; h++) {
            const float *v = x + (t * heads + h) * hd;
            double *o = y + (t * heads + h) * hd;
            for (int d = 0; d < hd; d++) o[d] = v[d];
            for (int i = 0; i < half; i++) {
                int a = off + (inter ? 2 * i : i), b = off + (inter ? 2 * i + 1 : i + half);
                double ang = (double)(pos0 + t) * f[i];
                o[a] = v[a] * cos(ang) - v[b] * sin(ang);
                o[b] = v[b] * cos(ang) + v[a] * sin(ang);
            }
        }
}

int test_mla_rope_table(void) {
    ls_rng r;
    ls_rng_seed(&r, 11);
    const int64_t T = 5, pos0 = 1000003;
    const int heads = 3, hd = 24, off = 8, half = 6;
    double f[6];
    for (int i = 0; i < half; i++) f[i] = pow(10000.0, -2.0 * i / (2.0 * half)) * (i % 2 ? 0.3 : 1.0);
    int64_t n = T * heads * hd;
    float *x = malloc((size_t)n * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
    float *rr = malloc((size_t)n * sizeof(float)), *g = malloc((size_t)n * sizeof(float));
    double *yr = malloc((size_t)n * sizeof(double));
    for (int inter = 0; inter < 2; inter++) {
        for (int64_t i = 0; i < n; i++) x[i] = (float)ls_rng_normal(&r), rr[i] = (float)ls_rng_normal(&r);
        memcpy(y, x, (size_t)n * sizeof(float));
        ls_rope_table_fwd(y, T, heads, hd, off, half, f, inter, pos0);
        rope_ref(yr, x, T, heads, hd, off, half, f, inter, pos0);
        double e = 0;
        for (int64_t i = 0; i < n; i++) e = fmax(e, fabs(y[i] - yr[i]));
        /* backward: d/dx sum(r ⊙ R x) = Rᵀ r, against central differences of the loss */
        memcpy(g, rr, (size_t)n * sizeof(float));
        ls_rope_table_bwd(g, T, heads, hd, off, half, f, inter, pos0);
        double efd = 0, h = 1e-2;
        for (int64_t i = 0; i < n; i++) {
            double lp = 0, lm = 0;
            float save = x[i];
            for (int s = 0; s < 2; s++) {
                x[i] = save + (float)(s ? -h : h);
                rope_ref(yr, x, T, heads, hd, off, half, f, inter, pos0);
                double l = 0;
                for (int64_t j = 0; j < n; j++) l += (double)rr[j] * yr[j];
                if (s) lm = l;
                else lp = l;
            }
            x[i] = save;
            efd = fmax(efd, fabs((lp - lm) / (2 * h) - g[i]));
        }
        printf("  %s pairs: forward vs double %.2e, backward vs finite differences %.2e\n",
               inter ? "interleaved" : "half-split", e, efd);
        T_CHECK(e <= 2e-6 && efd <= 2e-5, "rope table (%s): %g, %g", inter ? "interleaved" : "half-split", e, efd);
    }
    free(x), free(y), free(rr), free(g), free(yr);
    return 0;
}

int test_mla_yarn_scale(void) {
    ls_config c;
    T_OK(ls_config_load(&c, LS_SOURCE_DIR "/examples/deepseek_v3_2.json"));
    double f[32];
    int lo, hi;
    ls_mla_rope_freqs(&c, f, &lo, &hi);
    double s = ls_mla_softmax_scale(&c);
    printf("  DeepSeek-V3.2: YaRN correction dims %d..%d, softmax scale %.6f; inv_freq[0] %.6g, [31] %.6g\n", lo,
           hi, s, f[0], f[31]);
    T_CHECK(lo == 10 && hi == 23, "correction dims %d, %d (spec: 10, 23)", lo, hi);
    T_CHECK(fabs(s - 0.135234) <= 1e-6, "softmax scale %.7f (spec: 0.135234)", s);
    /* fast dims keep their frequency, slow ones are divided by the factor */
    T_CHECK(f[0] == 1.0 && fabs(f[31] - pow(10000.0, -62.0 / 64.0) / 40.0) <= 1e-18, "yarn ends");
    T_OK(ls_config_load(&c, LS_SOURCE_DIR "/examples/glm_5_2.json"));
    s = ls_mla_softmax_scale(&c);
    ls_mla_rope_freqs(&c, f, &lo, &hi);
    printf("  GLM-5.2: softmax scale %.6f, no YaRN (inv_freq[1] = 8e6^(-1/32) = %.6g)\n", s, f[1]);
    T_CHECK(s == 0.0625 && lo == 0 && hi == 0 && fabs(f[1] - pow(8e6, -2.0 / 64.0)) <= 1e-15, "glm scale %g", s);
    return 0;
}

static const float *g_s; /* the row the comparison sorts */
static int by_score_then_pos(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    if (g_s[i] != g_s[j]) return g_s[i] > g_s[j] ? -1 : 1;
    return i < j ? -1 : 1;
}
static int ascending(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

int test_dsa_topk(void) {
    ls_rng r;
    ls_rng_seed(&r, 5);
    const int64_t T = 40, pos0 = 17, n = pos0 + T, k = 7;
    float *s = malloc((size_t)(T * n) * sizeof(float));
    /* ReLU-like scores on a coarse grid: many exact zeros and exact ties */
    for (int64_t i = 0; i < T * n; i++) {
        double v = ls_rng_normal(&r);
        s[i] = v < 0 ? 0.0f : (float)(floor(v * 4) / 4);
    }
    int32_t *sel = malloc((size_t)(T * k) * sizeof(int32_t));
    int64_t *cnt = malloc((size_t)T * sizeof(int64_t));
    ls_arena sc;
    ls_arena_init(&sc, "scratch", 0);
    T_OK(ls_dsa_topk(sel, cnt, s, T, n, pos0, k, &sc));
    int idx[64], ties = 0;
    for (int64_t t = 0; t < T; t++) {
        int64_t m = pos0 + t + 1, want = m < k ? m : k;
        for (int j = 0; j < m; j++) idx[j] = j;
        g_s = s + t * n;
        qsort(idx, (size_t)m, sizeof(int), by_score_then_pos);
        ties += want < m && g_s[idx[want - 1]] == g_s[idx[want]];
        qsort(idx, (size_t)want, sizeof(int), ascending);
        T_CHECK(cnt[t] == want, "query %lld kept %lld, expected %lld", (long long)t, (long long)cnt[t], (long long)want);
        for (int64_t j = 0; j < k; j++)
            T_CHECK(sel[t * k + j] == (j < want ? idx[j] : -1), "query %lld, slot %lld: %d vs %d", (long long)t,
                    (long long)j, sel[t * k + j], j < want ? idx[j] : -1);
    }
    /* a short context keeps everything: k beyond every query's causal keys */
    int32_t *all = malloc((size_t)(T * 100) * sizeof(int32_t));
    T_OK(ls_dsa_topk(all, cnt, s, T, n, pos0, 100, &sc));
    for (int64_t t = 0; t < T; t++) T_CHECK(cnt[t] == pos0 + t + 1 && all[t * 100 + t] == t, "k > keys");
    printf("  %lld queries, k = %lld: equal to the sorted reference; %d rows with a tie at the cutoff\n",
           (long long)T, (long long)k, ties);
    T_CHECK(ties >= 5, "only %d tie rows: the tie rule is not exercised", ties);
    ls_arena_free(&sc);
    free(s), free(sel), free(cnt), free(all);
    return 0;
}
