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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "longstraw/kernels.h"
#include "longstraw/mla.h"
#include "longstraw/safetensors.h"
#include "testutil.h"

int test_mla_rope_table(void);
int test_mla_yarn_scale(void);
int test_dsa_topk(void);
int test_mla_load(void);
int test_mla_route(void);
int test_dsa_scores(void);
int test_mla_attn(void);
int test_mla_reference_logprobs(void);
int test_mla_receipt_plan(void);
int test_mla_bf16_chunking(void);

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
/* larger first, NaN below everything (−inf included), −0 equal to +0, ties to the lower position */
static int by_score_then_pos(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    float x = g_s[i], y = g_s[j];
    if (isnan(x) != isnan(y)) return isnan(x) ? 1 : -1;
    if (!isnan(x) && x != y) return x > y ? -1 : 1;
    return i < j ? -1 : 1;
}
static int ascending(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* One top-k case against the sorted reference; returns the rows with a tie at the cutoff,
 * or −1 after a failed check. */
static int topk_case(const float *s, int64_t T, int64_t pos0, int64_t k, ls_arena *sc) {
    const int64_t n = pos0 + T;
    int32_t *sel = malloc((size_t)(T * k) * sizeof(int32_t));
    int64_t *cnt = malloc((size_t)T * sizeof(int64_t));
    int *idx = malloc((size_t)n * sizeof(int));
    int ties = 0, bad = 0;
    if (ls_dsa_topk(sel, cnt, s, T, n, pos0, k, sc) != LS_OK) bad = 1;
    for (int64_t t = 0; t < T && !bad; t++) {
        int64_t m = pos0 + t + 1, want = m < k ? m : k;
        for (int j = 0; j < m; j++) idx[j] = j;
        g_s = s + t * n;
        qsort(idx, (size_t)m, sizeof(int), by_score_then_pos);
        ties += want < m && by_score_then_pos(&idx[want - 1], &idx[want]) < 0 &&
                (g_s[idx[want - 1]] == g_s[idx[want]] || (isnan(g_s[idx[want - 1]]) && isnan(g_s[idx[want]])));
        qsort(idx, (size_t)want, sizeof(int), ascending);
        if (cnt[t] != want) {
            printf("  query %lld kept %lld, expected %lld\n", (long long)t, (long long)cnt[t], (long long)want);
            bad = 1;
        }
        for (int64_t j = 0; j < k && !bad; j++)
            if (sel[t * k + j] != (j < want ? idx[j] : -1)) {
                printf("  query %lld, slot %lld: %d vs %d\n", (long long)t, (long long)j, sel[t * k + j],
                       j < want ? idx[j] : -1);
                bad = 1;
            }
    }
    free(sel), free(cnt), free(idx);
    return bad ? -1 : ties;
}

int test_dsa_topk(void) {
    ls_rng r;
    ls_rng_seed(&r, 5);
    ls_arena sc;
    ls_arena_init(&sc, "scratch", 0);
    int64_t T = 40, pos0 = 17, n = pos0 + T, k = 7;
    float *s = malloc((size_t)(T * n) * sizeof(float));
    /* ReLU-like scores on a coarse grid: many exact zeros and exact ties */
    for (int64_t i = 0; i < T * n; i++) {
        double v = ls_rng_normal(&r);
        s[i] = v < 0 ? 0.0f : (float)(floor(v * 4) / 4);
    }
    int ties = topk_case(s, T, pos0, k, &sc);
    T_CHECK(ties >= 0, "ReLU-like scores: not the sorted reference's selection");
    /* a short context keeps everything: k beyond every query's causal keys */
    int64_t *cnt = malloc((size_t)T * sizeof(int64_t));
    int32_t *all = malloc((size_t)(T * 100) * sizeof(int32_t));
    T_OK(ls_dsa_topk(all, cnt, s, T, n, pos0, 100, &sc));
    for (int64_t t = 0; t < T; t++) T_CHECK(cnt[t] == pos0 + t + 1 && all[t * 100 + t] == t, "k > keys");
    printf("  %lld queries, k = %lld: equal to the sorted reference; %d rows with a tie at the cutoff\n",
           (long long)T, (long long)k, ties);
    T_CHECK(ties >= 5, "only %d tie rows: the tie rule is not exercised", ties);
    free(s), free(cnt), free(all);
    /* rows long enough for the vector path (and a tail): both signs on a grid, ±0 in
     * equal numbers, NaN, ±inf — every case of the order keys; ~9% of the values are
     * positive, so the cutoff (k ≈ 12% of the keys) falls among the zeros of both signs */
    T = 24, pos0 = 281, n = pos0 + T, k = 37;
    s = malloc((size_t)(T * n) * sizeof(float));
    int specials = 0;
    for (int64_t i = 0; i < T * n; i++) {
        double u = ls_rng_uniform(&r), v = ls_rng_normal(&r);
        s[i] = u < 0.06 ? 0.0f : u < 0.12 ? -0.0f : u < 0.14 ? NAN : u < 0.16 ? -INFINITY : u < 0.17 ? INFINITY
                                                                                       : (float)(floor((v - 1.3) * 8) / 8);
        specials += u < 0.17;
    }
    ties = topk_case(s, T, pos0, k, &sc);
    T_CHECK(ties >= 0, "signed scores with ±0, NaN, ±inf: not the sorted reference's selection");
    printf("  %lld queries over up to %lld keys, k = %lld, %d special values: equal to the sorted reference; %d "
           "tie rows\n", (long long)T, (long long)n, (long long)k, specials, ties);
    T_CHECK(ties >= 5, "only %d tie rows in the signed case", ties);
    /* all NaN / all −inf rows: the lowest positions */
    for (int64_t i = 0; i < T * n; i++) s[i] = i % 2 ? NAN : -INFINITY;
    T_CHECK(topk_case(s, T, pos0, k, &sc) >= 0, "rows of NaN and −inf");
    free(s);
    ls_arena_free(&sc);
    return 0;
}

/* The family's checkpoints load (F32 and BF16, MTP layers skipped, tied embeddings):
 * every tensor of the reference's fixtures lands where the layout says (spot values
 * against the file, experts stacked in order), the count equals the config's; FP8 and
 * a missing tensor are refused by name. */
int test_mla_load(void) {
    static const char *fx[] = {"mla_glm", "mla_glm_ic", "mla_dsv32", "mla_glm_types"};
    for (size_t f = 0; f < sizeof fx / sizeof fx[0]; f++) {
        char dir[1024], mp[1100];
        snprintf(dir, sizeof dir, "%s/tests/reference/fixtures/%s", LS_SOURCE_DIR, fx[f]);
        snprintf(mp, sizeof mp, "%s/model.safetensors", dir);
        ls_arena fixed;
        ls_arena_init(&fixed, "fixed", 0);
        ls_mla_model m;
        T_OK(ls_mla_load(&m, dir, NULL, &fixed));
        size_t want;
        T_CHECK(ls_mla_param_count(&m.cfg, &want) == 0 && m.n_params == want,
                "%s: read %zu weights, the config has %zu", fx[f], m.n_params, want);
        ls_st_file st;
        T_OK(ls_st_open(&st, mp));
        int64_t last = m.cfg.n_layers - 1, E = m.cfg.n_experts, Im = m.cfg.moe_inter, D = m.cfg.hidden;
        char name[200];
        snprintf(name, sizeof name, "model.layers.%lld.self_attn.kv_b_proj.weight", (long long)last);
        const ls_st_tensor *t = ls_st_find(&st, name);
        T_CHECK(t, "%s: %s", fx[f], name);
        float *x = malloc((size_t)t->numel * sizeof(float));
        T_OK(ls_st_read_f32(t, x, t->numel, name));
        T_CHECK(memcmp(x, m.layers[last].kv_b, (size_t)t->numel * sizeof(float)) == 0, "%s: kv_b", fx[f]);
        free(x);
        if (m.cfg.moe[last] && E > 1) { /* the last expert's down_proj sits at (E−1)·D·Im */
            snprintf(name, sizeof name, "model.layers.%lld.mlp.experts.%lld.down_proj.weight", (long long)last,
                     (long long)(E - 1));
            t = ls_st_find(&st, name);
            T_CHECK(t, "%s: %s", fx[f], name);
            x = malloc((size_t)t->numel * sizeof(float));
            T_OK(ls_st_read_f32(t, x, t->numel, name));
            T_CHECK(memcmp(x, m.layers[last].exp_down + (E - 1) * D * Im, (size_t)t->numel * sizeof(float)) == 0,
                    "%s: expert stacking", fx[f]);
            free(x);
        }
        T_CHECK(!m.cfg.tie_embeddings || m.lm_head == m.embed, "%s: tied head", fx[f]);
        printf("  %-14s loaded: %zu weights, %lld layers (%d with an indexer)%s\n", fx[f], m.n_params,
               (long long)m.cfg.n_layers, ls_cfg_count_index_full(&m.cfg), m.cfg.tie_embeddings ? ", tied" : "");
        ls_st_close(&st);
        ls_arena_free(&fixed);
    }
    /* refusals */
    char tmp[512], cmd[4096];
    T_CHECK(t_make_tmpdir(tmp, sizeof tmp) == 0, "tmpdir");
    snprintf(cmd, sizeof cmd, "cp %s/tests/reference/fixtures/mla_glm/config.json %s/config.json", LS_SOURCE_DIR, tmp);
    T_CHECK(system(cmd) == 0, "copy");
    { /* one F8_E4M3 tensor */
        char path[700];
        snprintf(path, sizeof path, "%s/model.safetensors", tmp);
        const char *hdr = "{\"model.embed_tokens.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[97,32],\"data_offsets\":[0,3104]}}";
        uint64_t hl = strlen(hdr);
        FILE *fp = fopen(path, "wb");
        T_CHECK(fp, "write");
        fwrite(&hl, 8, 1, fp);
        fwrite(hdr, 1, hl, fp);
        for (int i = 0; i < 3104; i++) fputc(0, fp);
        fclose(fp);
    }
    ls_arena fixed;
    ls_arena_init(&fixed, "fixed", 0);
    ls_mla_model m;
    ls_status s = ls_mla_load(&m, tmp, NULL, &fixed);
    T_CHECK(s == LS_ERR_UNSUPPORTED && strstr(ls_err_msg(), "FP8") && strstr(ls_err_msg(), "embed_tokens"),
            "FP8: %d %s", s, ls_err_msg());
    printf("  FP8 refused: %s\n", ls_err_msg());
    snprintf(cmd, sizeof cmd,
             "cp %s/tests/reference/fixtures/mla_glm/model.safetensors %s/ && sed -i 's/\"num_hidden_layers\": 3/"
             "\"num_hidden_layers\": 4/' %s/config.json",
             LS_SOURCE_DIR, tmp, tmp);
    T_CHECK(system(cmd) == 0, "copy");
    s = ls_mla_load(&m, tmp, NULL, &fixed);
    T_CHECK(s == LS_ERR_FORMAT && strstr(ls_err_msg(), "model.layers.3."), "missing layer: %d %s", s, ls_err_msg());
    printf("  missing tensor refused: %s\n", ls_err_msg());
    ls_arena_free(&fixed);
    T_CHECK(t_remove_dir(tmp) == 0, "cleanup");
    return 0;
}

/* naive routing in double: groups and experts by (score desc, index asc) */
static double g_key[1024];
static int by_key_desc(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    if (g_key[i] != g_key[j]) return g_key[i] > g_key[j] ? -1 : 1;
    return i - j;
}

static void route_naive(int *sel, double *wt, const float *lg, const float *bias, int E, int K, int G, int TG, int norm,
                        double sc) {
    double s[1024], sb[1024];
    int keep[1024], idx[1024];
    for (int e = 0; e < E; e++) s[e] = 1 / (1 + exp(-(double)lg[e])), sb[e] = s[e] + bias[e], keep[e] = 1;
    if (G > 1 && TG < G) {
        int per = E / G;
        for (int g = 0; g < G; g++) {
            for (int j = 0; j < per; j++) idx[j] = g * per + j, g_key[g * per + j] = sb[g * per + j];
            qsort(idx, (size_t)per, sizeof(int), by_key_desc);
            keep[g] = 0;
            s[1023 - g] = sb[idx[0]] + (per > 1 ? sb[idx[1]] : 0); /* scratch: group scores at the top */
        }
        for (int g = 0; g < G; g++) idx[g] = g, g_key[g] = s[1023 - g];
        qsort(idx, (size_t)G, sizeof(int), by_key_desc);
        int kg[1024] = {0};
        for (int j = 0; j < TG; j++) kg[idx[j]] = 1;
        for (int e = 0; e < E; e++) keep[e] = kg[e / per];
    }
    int n = 0;
    for (int e = 0; e < E; e++)
        if (keep[e]) idx[n++] = e, g_key[e] = sb[e];
    qsort(idx, (size_t)n, sizeof(int), by_key_desc);
    double tot = 0;
    for (int j = 0; j < K; j++) sel[j] = idx[j], tot += 1 / (1 + exp(-(double)lg[idx[j]]));
    for (int j = 0; j < K; j++) {
        double sj = 1 / (1 + exp(-(double)lg[sel[j]]));
        wt[j] = (norm ? sj / (tot + 1e-20) : sj) * sc;
    }
}

/* MoE routing (spec §4) against the naive version, with and without groups, with the
 * correction bias moving the selection; its backward against finite differences of
 * sum(r ⊙ gates) (selection held fixed), and zero for unchosen experts. */
int test_mla_route(void) {
    ls_rng r;
    ls_rng_seed(&r, 9);
    const int64_t T = 30;
    const int E = 16, K = 4;
    float lg[30 * 16], bias[16], wt[30 * 4], s[30 * 16], dl[30 * 16], dw[30 * 4];
    int32_t sel[30 * 4];
    for (int cfg = 0; cfg < 3; cfg++) {
        int G = cfg == 0 ? 1 : 4, TG = cfg == 2 ? 4 : 2, norm = cfg != 1;
        double sc = cfg == 1 ? 1.0 : 2.5;
        for (int64_t i = 0; i < T * E; i++) lg[i] = (float)(2 * ls_rng_normal(&r));
        for (int e = 0; e < E; e++) bias[e] = (float)(0.3 * ls_rng_normal(&r));
        ls_mla_route_fwd(sel, wt, s, lg, bias, T, E, K, G, TG, norm, sc);
        double ew = 0;
        int moved = 0;
        for (int64_t t = 0; t < T; t++) {
            int ns[16], nb[16];
            double nw[16];
            route_naive(ns, nw, lg + t * E, bias, E, K, G, TG, norm, sc);
            for (int j = 0; j < K; j++) {
                T_CHECK(sel[t * K + j] == ns[j], "config %d, token %lld, slot %d: expert %d vs %d", cfg, (long long)t, j,
                        sel[t * K + j], ns[j]);
                ew = fmax(ew, fabs(wt[t * K + j] - nw[j]));
            }
            float zero[16] = {0};
            route_naive(nb, nw, lg + t * E, zero, E, K, G, TG, norm, sc);
            for (int j = 0; j < K; j++) moved += nb[j] != ns[j];
        }
        /* backward: FD of L = sum(r ⊙ wt) through the logits, the selection fixed */
        for (int64_t i = 0; i < T * K; i++) dw[i] = (float)ls_rng_normal(&r);
        ls_mla_route_bwd(dl, dw, s, sel, T, E, K, norm, sc);
        double efd = 0, h = 1e-3;
        int zeros_ok = 1;
        for (int64_t t = 0; t < T; t++)
            for (int e = 0; e < E; e++) {
                int chosen = 0;
                for (int j = 0; j < K; j++) chosen |= sel[t * K + j] == e;
                if (!chosen) {
                    zeros_ok &= dl[t * E + e] == 0.0f;
                    continue;
                }
                double l[2];
                for (int sgn = 0; sgn < 2; sgn++) { /* the gates of this token, the selection held */
                    float save = lg[t * E + e];
                    lg[t * E + e] = save + (float)(sgn ? -h : h);
                    double tot = 0, w[4];
                    for (int j = 0; j < K; j++) tot += 1 / (1 + exp(-(double)lg[t * E + sel[t * K + j]]));
                    l[sgn] = 0;
                    for (int j = 0; j < K; j++) {
                        double sj = 1 / (1 + exp(-(double)lg[t * E + sel[t * K + j]]));
                        w[j] = (norm ? sj / (tot + 1e-20) : sj) * sc;
                        l[sgn] += dw[t * K + j] * w[j];
                    }
                    lg[t * E + e] = save;
                }
                efd = fmax(efd, fabs((l[0] - l[1]) / (2 * h) - dl[t * E + e]));
            }
        printf("  routing (%d groups, keep %d, %s): selection equal to the naive one, gates %.2e, backward vs FD %.2e; "
               "the bias moved %d picks\n",
               G, TG, norm ? "renormalised" : "raw", ew, efd, moved);
        T_CHECK(ew <= 1e-6 && efd <= 1e-4 && zeros_ok, "config %d: gates %g, fd %g, zeros %d", cfg, ew, efd, zeros_ok);
        T_CHECK(moved > 0, "config %d: the bias never changed a selection: not exercised", cfg);
    }
    return 0;
}

/* The indexer's scores over bf16 pages of index keys against a double computation, and
 * LayerNorm against its definition. */
int test_dsa_scores(void) {
    ls_rng r;
    ls_rng_seed(&r, 13);
    const int64_t T = 6, n = 45, S = 8;
    const int nI = 3, dI = 16;
    float q[6 * 3 * 16], w[6 * 3], kf[45 * 16], sc[6 * 45];
    for (int i = 0; i < T * nI * dI; i++) q[i] = (float)ls_rng_normal(&r);
    for (int i = 0; i < T * nI; i++) w[i] = (float)ls_rng_normal(&r);
    for (int i = 0; i < n * dI; i++) kf[i] = (float)ls_rng_normal(&r);
    int64_t np = (n + S - 1) / S;
    void *pages[8];
    ls_bf16 store[8 * 8 * 16];
    for (int64_t p = 0; p < np; p++) pages[p] = store + p * S * dI;
    ls_convert_from_f32(store, LS_DTYPE_BF16, kf, (size_t)(n * dI));
    ls_kv_prefix keys = {n, S, LS_DTYPE_BF16, pages, pages};
    ls_arena a;
    ls_arena_init(&a, "scratch", 0);
    float scale = 0.25f;
    T_OK(ls_dsa_scores(sc, q, w, &keys, T, nI, dI, scale, &a));
    double e = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t s = 0; s < n; s++) {
            double ref = 0;
            for (int j = 0; j < nI; j++) {
                double dot = 0;
                for (int d = 0; d < dI; d++) dot += (double)q[(t * nI + j) * dI + d] * ls_bf16_to_f32(store[s * dI + d]);
                ref += w[t * nI + j] * (dot > 0 ? dot : 0);
            }
            e = fmax(e, fabs(sc[t * n + s] - scale * ref));
        }
    float x[3 * 16], y[3 * 16], lw[16], lb[16];
    for (int i = 0; i < 48; i++) x[i] = (float)(3 + ls_rng_normal(&r));
    for (int i = 0; i < 16; i++) lw[i] = (float)(1 + 0.1 * ls_rng_normal(&r)), lb[i] = (float)(0.1 * ls_rng_normal(&r));
    ls_layernorm_fwd(y, x, lw, lb, 3, 16, 1e-6f);
    double el = 0;
    for (int i = 0; i < 3; i++) {
        double mu = 0, v = 0;
        for (int d = 0; d < 16; d++) mu += x[i * 16 + d] / 16.0;
        for (int d = 0; d < 16; d++) v += (x[i * 16 + d] - mu) * (x[i * 16 + d] - mu) / 16.0;
        for (int d = 0; d < 16; d++) el = fmax(el, fabs(y[i * 16 + d] - ((x[i * 16 + d] - mu) / sqrt(v + 1e-6) * lw[d] + lb[d])));
    }
    printf("  indexer scores over bf16 pages: max |diff| %.2e; LayerNorm %.2e\n", e, el);
    T_CHECK(e <= 1e-5 && el <= 1e-5, "scores %g, layernorm %g", e, el);
    /* a long prefix (10 key blocks): with 2 threads the threads split the key blocks, with
     * one the blocks run in turn; the same bits either way (the top-k must not depend on
     * the thread count), and against double */
    {
        const int64_t T2 = 5, n2 = 2333, S2 = 64, np2 = (n2 + S2 - 1) / S2;
        float *q2 = malloc((size_t)(T2 * nI * dI) * sizeof(float)), *w2 = malloc((size_t)(T2 * nI) * sizeof(float));
        float *k2 = malloc((size_t)(np2 * S2 * dI) * sizeof(float));
        float *s1 = malloc((size_t)(T2 * n2) * sizeof(float)), *s2 = malloc((size_t)(T2 * n2) * sizeof(float));
        void **pg = malloc((size_t)np2 * sizeof(void *));
        for (int64_t i = 0; i < T2 * nI * dI; i++) q2[i] = (float)ls_rng_normal(&r);
        for (int64_t i = 0; i < T2 * nI; i++) w2[i] = (float)ls_rng_normal(&r);
        for (int64_t i = 0; i < np2 * S2 * dI; i++) k2[i] = (float)ls_rng_normal(&r);
        for (int64_t p = 0; p < np2; p++) pg[p] = k2 + p * S2 * dI;
        ls_kv_prefix keys2 = {n2, S2, LS_DTYPE_F32, pg, pg};
        int threads = ls_get_threads();
        ls_set_threads(1);
        T_OK(ls_dsa_scores(s1, q2, w2, &keys2, T2, nI, dI, scale, &a));
        ls_set_threads(2);
        T_OK(ls_dsa_scores(s2, q2, w2, &keys2, T2, nI, dI, scale, &a));
        ls_set_threads(threads);
        double e2 = 0;
        for (int64_t t = 0; t < T2; t++)
            for (int64_t j = 0; j < n2; j += 7) {
                double ref = 0;
                for (int h = 0; h < nI; h++) {
                    double dot = 0;
                    for (int d = 0; d < dI; d++) dot += (double)q2[(t * nI + h) * dI + d] * k2[j * dI + d];
                    ref += w2[t * nI + h] * (dot > 0 ? dot : 0);
                }
                e2 = fmax(e2, fabs(s1[t * n2 + j] - scale * ref));
            }
        int same = memcmp(s1, s2, (size_t)(T2 * n2) * sizeof(float)) == 0;
        printf("  %lld keys: 1 and 2 threads %s; max |diff| vs double %.2e\n", (long long)n2,
               same ? "bit for bit equal" : "DIFFER", e2);
        T_CHECK(same && e2 <= 1e-5, "long prefix: threads %s, diff %g", same ? "agree" : "differ", e2);
        free(q2), free(w2), free(k2), free(s1), free(s2), free(pg);
    }
    ls_arena_free(&a);
    return 0;
}

/* naive sparse MLA attention in double: o[t,h] = Σ_sel softmax(scale·q·key)·c_kv */
typedef struct {
    float *q, *own, *pref, *r;
    const int32_t *sel;
    int64_t k, T, pos0;
    int H, rkv, dr;
    float scale;
} mla_ctx;

static const float *mla_row(const mla_ctx *c, int64_t p) {
    int dk = c->rkv + c->dr;
    return p >= c->pos0 ? c->own + (p - c->pos0) * dk : c->pref + p * dk;
}

static double mla_loss(const mla_ctx *c, double *o_out) {
    int dk = c->rkv + c->dr;
    double L = 0;
    for (int64_t t = 0; t < c->T; t++)
        for (int h = 0; h < c->H; h++) {
            const float *qh = c->q + (t * c->H + h) * dk;
            double sc[64], mx = -INFINITY, z = 0;
            int64_t n = 0;
            for (; n < c->k && c->sel[t * c->k + n] >= 0; n++) {
                const float *kr = mla_row(c, c->sel[t * c->k + n]);
                double s = 0;
                for (int d = 0; d < dk; d++) s += (double)qh[d] * kr[d];
                sc[n] = s * c->scale;
                mx = sc[n] > mx ? sc[n] : mx;
            }
            for (int64_t j = 0; j < n; j++) z += exp(sc[j] - mx);
            for (int d = 0; d < c->rkv; d++) {
                double od = 0;
                for (int64_t j = 0; j < n; j++) od += exp(sc[j] - mx) / z * mla_row(c, c->sel[t * c->k + j])[d];
                if (o_out) o_out[(t * c->H + h) * c->rkv + d] = od;
                L += od * c->r[(t * c->H + h) * c->rkv + d];
            }
        }
    return L;
}

/* Sparse MLA attention (absorbed form) against a double computation over the same
 * selections, keys from f32 pages below pos0 and own rows above; its backward (dq, the
 * own rows, the prompt pages' rows) against central differences of sum(r ⊙ o). */
int test_mla_attn(void) {
    ls_rng rg;
    ls_rng_seed(&rg, 21);
    const int64_t T = 5, pos0 = 11, k = 6, S = 4;
    const int H = 2, rkv = 6, dr = 4, dk = rkv + dr;
    int64_t n = pos0 + T, npg = (pos0 + S - 1) / S;
    float q[5 * 2 * 10], own[5 * 10], pref[12 * 10], r[5 * 2 * 6];
    int32_t sel[5 * 6];
    for (int i = 0; i < T * H * dk; i++) q[i] = (float)ls_rng_normal(&rg);
    for (int i = 0; i < T * dk; i++) own[i] = (float)ls_rng_normal(&rg);
    for (int i = 0; i < npg * S * dk; i++) pref[i] = (float)ls_rng_normal(&rg);
    for (int i = 0; i < T * H * rkv; i++) r[i] = (float)ls_rng_normal(&rg);
    for (int64_t t = 0; t < T; t++) { /* a causal subset in ascending order: every 2nd key, then the own one */
        int64_t c = 0;
        for (int64_t p = t % 2; p <= pos0 + t && c < k - 1; p += 2) sel[t * k + c++] = (int32_t)p;
        sel[t * k + c++] = (int32_t)(pos0 + t);
        while (c < k) sel[t * k + c++] = -1;
    }
    void *pages[3];
    for (int64_t p = 0; p < npg; p++) pages[p] = pref + p * S * dk;
    ls_kv_prefix pf = {pos0, S, LS_DTYPE_F32, pages, pages};
    float o[5 * 2 * 6], lse[5 * 2], dq[5 * 2 * 10], down[5 * 10], dpref[12 * 10], dout[5 * 2 * 6];
    float scale = 0.3f;
    T_OK(ls_mla_attn_fwd(o, lse, q, own, &pf, sel, k, T, H, rkv, dr, pos0, scale));
    mla_ctx c = {q, own, pref, r, sel, k, T, pos0, H, rkv, dr, scale};
    double oref[5 * 2 * 6], e = 0;
    mla_loss(&c, oref);
    for (int i = 0; i < T * H * rkv; i++) e = fmax(e, fabs(o[i] - oref[i]));
    memcpy(dout, r, sizeof r);
    memset(dpref, 0, sizeof dpref);
    void *dpages[3];
    for (int64_t p = 0; p < npg; p++) dpages[p] = dpref + p * S * dk;
    T_OK(ls_mla_attn_bwd(dq, down, dpages, dout, o, lse, q, own, &pf, sel, k, T, H, rkv, dr, pos0, scale));
    double efd = 0, h = 1e-3;
    float *xs[3] = {q, own, pref}, *gs[3] = {dq, down, dpref};
    int64_t ns[3] = {T * H * dk, T * dk, pos0 * dk};
    for (int a = 0; a < 3; a++)
        for (int64_t i = 0; i < ns[a]; i++) {
            float save = xs[a][i];
            xs[a][i] = save + (float)h;
            double lp = mla_loss(&c, NULL);
            xs[a][i] = save - (float)h;
            double lm = mla_loss(&c, NULL);
            xs[a][i] = save;
            efd = fmax(efd, fabs((lp - lm) / (2 * h) - gs[a][i]));
        }
    printf("  sparse MLA attention (absorbed, %lld keys, %d heads): forward vs double %.2e, backward (q, own rows, "
           "prompt pages) vs finite differences %.2e\n", (long long)n, H, e, efd);
    T_CHECK(e <= 1e-6 && efd <= 1e-4, "mla attention: forward %g, backward %g", e, efd);
    return 0;
}

/* `longstraw logprobs` on the four checkpoints of the independent fp64 reference
 * (tests/reference/mla_ref.py: GLM-5 F32, GLM-5.2 IndexCache BF16, DeepSeek-V3.2 with
 * YaRN and half-split indexer RoPE, mlp_layer_types/indexer_types with tied embeddings;
 * prompts of 60–130 tokens, index_topk 5–12: the top-k is active) against its expected
 * log-probs, to 1e-4: by capture (default pages; pages of 7 captured in chunks of 5, so
 * selections cross pages and chunks) and by the plain forward (--no-capture). */
int test_mla_reference_logprobs(void) {
    static const char *fx[] = {"mla_glm", "mla_glm_ic", "mla_dsv32", "mla_glm_types"};
    static const char *eng[] = {"", "--page-size 7 --capture-chunk 5", "--no-capture"};
    const char *fix = LS_SOURCE_DIR "/tests/reference/fixtures";
    for (size_t f = 0; f < sizeof fx / sizeof fx[0]; f++) {
        char path[1024], cmd[4096];
        snprintf(path, sizeof path, "%s/%s/expected.json", fix, fx[f]);
        char *want_txt = t_read_file(path, NULL);
        cJSON *want = want_txt ? cJSON_Parse(want_txt) : NULL;
        free(want_txt);
        T_CHECK(want != NULL, "cannot read %s", path);
        const cJSON *wl = cJSON_GetObjectItem(want, "logprobs");
        for (size_t e = 0; e < sizeof eng / sizeof eng[0]; e++) {
            snprintf(cmd, sizeof cmd, "'%s' logprobs --model '%s/%s' --group '%s/%s/group.json' %s", LS_CLI_PATH, fix,
                     fx[f], fix, fx[f], eng[e]);
            int rc;
            char *out = t_run_capture(cmd, &rc);
            cJSON *got = out && rc == 0 ? cJSON_Parse(out) : NULL;
            T_CHECK(got != NULL, "%s %s: rc %d: %s", fx[f], eng[e], rc, out ? out : "");
            free(out);
            const cJSON *gl = cJSON_GetObjectItem(got, "logprobs");
            T_CHECK(cJSON_GetArraySize(gl) == cJSON_GetArraySize(wl), "%s: %d members, the reference %d", fx[f],
                    cJSON_GetArraySize(gl), cJSON_GetArraySize(wl));
            double worst = 0;
            int64_t n = 0;
            for (int i = 0; i < cJSON_GetArraySize(wl); i++) {
                const cJSON *a = cJSON_GetArrayItem(gl, i), *b = cJSON_GetArrayItem(wl, i);
                T_CHECK(cJSON_GetArraySize(a) == cJSON_GetArraySize(b), "%s: member %d length", fx[f], i);
                for (int t = 0; t < cJSON_GetArraySize(b); t++, n++) {
                    double d = fabs(cJSON_GetArrayItem(a, t)->valuedouble - cJSON_GetArrayItem(b, t)->valuedouble);
                    if (!(d <= worst)) worst = d;
                }
            }
            T_CHECK(n >= 10 && worst <= 1e-4, "%s %s: log-probs differ from the fp64 reference by %.3e (tolerance 1e-4)",
                    fx[f], eng[e], worst);
            printf("  %-14s %-34s %lld log-probs, worst |diff| vs fp64 %.2e\n", fx[f], eng[0] && eng[e][0] ? eng[e] : "(capture, defaults)",
                   (long long)n, worst);
            cJSON_Delete(got);
        }
        cJSON_Delete(want);
    }
    return 0;
}

/* Every tensor of the input checkpoint `in` is in `out`; those the policy keeps frozen
 * (the indexers, e_score_correction_bias) equal bit for bit, and at least one trained one
 * moved. */
static int frozen_kept(const char *in, const char *out) {
    ls_st_model a;
    ls_st_file b;
    T_OK(ls_st_model_open(&a, in));
    T_OK(ls_st_open(&b, out));
    int frozen = 0, moved = 0;
    for (int64_t i = 0; i < ls_st_model_count(&a); i++) {
        const ls_st_tensor *ta = ls_st_model_at(&a, i), *tb = ls_st_find(&b, ta->name);
        int same = t_st_same_f32(ta, tb);
        T_CHECK(same >= 0, "%s: %s missing, resized or unreadable", out, ta->name);
        if (strstr(ta->name, ".indexer.") || strstr(ta->name, "e_score_correction_bias")) {
            T_CHECK(same, "%s: frozen tensor %s changed (a step must write it back as loaded)", out, ta->name);
            frozen++;
        } else {
            moved += !same;
        }
    }
    T_CHECK(frozen > 0 && moved > 0, "%s: %d frozen tensors, %d moved", out, frozen, moved);
    ls_st_model_close(&a);
    ls_st_close(&b);
    return 0;
}

/* The receipt's prompt arena equals `plan`'s per-rank total byte for byte on a real run
 * of this family: `step` on GLM-5.2's IndexCache fixture (shared layers keep no index
 * keys), prefix-frozen and full mode (the f32 dState of the latent pages), bf16 and f32
 * pages of 7. The stepped checkpoint keeps the frozen tensors as loaded (they were once
 * written as zeros). */
int test_mla_receipt_plan(void) {
    const char *fix = LS_SOURCE_DIR "/tests/reference/fixtures";
    char dir[512], cmd[4096];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    for (int full = 0; full < 2; full++)
        for (int bf = 0; bf < 2; bf++) {
            const char *mode = full ? "--mode full --sweep-chunk 11" : "";
            const char *dt = bf ? "bf16" : "f32";
            snprintf(cmd, sizeof cmd,
                     "'%s' step --model '%s/mla_glm_ic' --group '%s/mla_glm_ic/group_train.json' --page-size 7 "
                     "--state-dtype %s %s --out '%s/s%d%d' 2>&1",
                     LS_CLI_PATH, fix, fix, dt, mode, dir, full, bf);
            int rc;
            char *out = t_run_capture(cmd, &rc);
            T_CHECK(rc == 0, "step failed: %s", out ? out : "");
            free(out);
            char path[1024], in[1024];
            snprintf(path, sizeof path, "%s/s%d%d/model.safetensors", dir, full, bf);
            snprintf(in, sizeof in, "%s/mla_glm_ic", fix);
            if (frozen_kept(in, path)) return 1;
            snprintf(path, sizeof path, "%s/s%d%d/receipt.json", dir, full, bf);
            char *txt = t_read_file(path, NULL);
            cJSON *r = txt ? cJSON_Parse(txt) : NULL;
            free(txt);
            const cJSON *rk = r ? cJSON_GetArrayItem(cJSON_GetObjectItem(r, "ranks"), 0) : NULL;
            T_CHECK(rk != NULL, "%s: no ranks", path);
            double peak = cJSON_GetObjectItem(rk, "prompt_peak_bytes")->valuedouble;
            cJSON_Delete(r);
            snprintf(cmd, sizeof cmd,
                     "'%s' plan --model '%s/mla_glm_ic' --prompt 72 --page-size 7 --state-dtype %s %s --json", LS_CLI_PATH,
                     fix, dt, mode);
            out = t_run_capture(cmd, &rc);
            cJSON *pl = out && rc == 0 ? cJSON_Parse(out) : NULL;
            free(out);
            T_CHECK(pl != NULL, "plan failed");
            double want = cJSON_GetObjectItem(pl, "total_bytes_per_rank")->valuedouble;
            cJSON_Delete(pl);
            printf("  %s, %s pages: receipt prompt arena %.0f bytes, plan %.0f\n", full ? "full mode" : "prefix-frozen", dt,
                   peak, want);
            T_CHECK(peak == want && peak > 0, "prompt arena %.0f, plan %.0f", peak, want);
        }
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* bf16 pages: the call's own latent rows and index keys are rounded as the pages round
 * theirs, so the selection cannot depend on where capture chunks end (before that, a
 * chunk of 5 against one chunk moved log-probs by 0.34 on mla_glm_ic: near-tie picks of
 * later layers flipped). Chunks of 5 against one chunk: within 2e-3 (the hybrid's bf16
 * bound). */
int test_mla_bf16_chunking(void) {
    static const char *fx[] = {"mla_glm", "mla_glm_ic", "mla_dsv32"};
    const char *fix = LS_SOURCE_DIR "/tests/reference/fixtures";
    for (size_t f = 0; f < sizeof fx / sizeof fx[0]; f++) {
        cJSON *lp[2];
        for (int c = 0; c < 2; c++) {
            char cmd[4096];
            snprintf(cmd, sizeof cmd,
                     "'%s' logprobs --model '%s/%s' --group '%s/%s/group.json' --page-size 7 --state-dtype bf16 "
                     "--capture-chunk %d",
                     LS_CLI_PATH, fix, fx[f], fix, fx[f], c ? 4096 : 5);
            int rc;
            char *out = t_run_capture(cmd, &rc);
            lp[c] = out && rc == 0 ? cJSON_Parse(out) : NULL;
            free(out);
            T_CHECK(lp[c] != NULL, "%s: logprobs failed", fx[f]);
        }
        const cJSON *a = cJSON_GetObjectItem(lp[0], "logprobs"), *b = cJSON_GetObjectItem(lp[1], "logprobs");
        double worst = 0;
        for (int i = 0; i < cJSON_GetArraySize(a); i++)
            for (int t = 0; t < cJSON_GetArraySize(cJSON_GetArrayItem(a, i)); t++) {
                double d = fabs(cJSON_GetArrayItem(cJSON_GetArrayItem(a, i), t)->valuedouble -
                                cJSON_GetArrayItem(cJSON_GetArrayItem(b, i), t)->valuedouble);
                if (!(d <= worst)) worst = d;
            }
        printf("  %-12s bf16 pages, capture chunks of 5 vs one chunk: max |diff| %.2e\n", fx[f], worst);
        T_CHECK(worst <= 2e-3, "%s: bf16 log-probs move by %g with the capture chunk", fx[f], worst);
        cJSON_Delete(lp[0]);
        cJSON_Delete(lp[1]);
    }
    return 0;
}
