/*
 * bench/capture.c — prompt-capture throughput beside a cblas_sgemm roofline
 * measured in the same run (this machine is shared and noisy: compare ratios).
 *
 *   build/bench/capture [--moe | --family mla] [--prompts 4096,16384,65536] [--threads N] [--chunk C]
 *
 * --family mla: the small MLA + DSA + MoE config of bench_model.h (GLM-5.2 layout).
 * Model: the small hybrid config of issue 2 — hidden 512, 8 layers (full attention
 * at layers 3 and 7), vocab 4096; --moe swaps the dense MLP for 8 experts (top 2)
 * plus a shared expert. FLOPs counted are those capture executes: every projection
 * (the last layer's FFN is skipped, as capture skips it), attention (4·hd per
 * query-head × visible key) and the chunked gated delta rule's matrix products.
 */
#include <cblas.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_model.h"
#include "longstraw/mla.h"
#include "longstraw/model.h"
#include "longstraw/state.h"

static const char *dense_cfg = BENCH_SMALL_DENSE; /* bench_model.h */
static const char *moe_cfg =
    "{\"model_type\": \"qwen3_next\", \"vocab_size\": 4096, \"hidden_size\": 512, \"num_hidden_layers\": 8,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 128, \"partial_rotary_factor\": 0.25,"
    " \"rope_theta\": 10000000, \"linear_num_key_heads\": 4, \"linear_num_value_heads\": 8,"
    " \"linear_key_head_dim\": 64, \"linear_value_head_dim\": 64, \"intermediate_size\": 1536,"
    " \"num_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 512,"
    " \"shared_expert_intermediate_size\": 512, \"norm_topk_prob\": true, \"full_attention_interval\": 4}";

static double sgemm_gflops(int n) {
    float *a = malloc((size_t)n * n * sizeof(float)), *b = malloc((size_t)n * n * sizeof(float)),
          *c = malloc((size_t)n * n * sizeof(float));
    for (int64_t i = 0; i < (int64_t)n * n; i++) {
        a[i] = (float)(i % 7) * 0.1f;
        b[i] = (float)(i % 5) * 0.1f;
    }
    double best = 1e30;
    for (int r = 0; r < 4; r++) {
        double t0 = ls_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double t = ls_now() - t0;
        if (r > 0 && t < best) best = t; /* first call warms up */
    }
    free(a);
    free(b);
    free(c);
    return 2.0 * n * (double)n * n / best / 1e9;
}

/* FLOPs the MLA family's capture executes for n tokens: every projection (q_a, q_b, the
 * W_UK absorption, kv_a, W_UV, o_proj; on full indexer layers wq, wk, weights), the
 * indexer's scores (2·nI·dI per query × causal key), the sparse attention
 * (2·(rkv+dr) + 2·rkv per head × selected key) and the FFNs (the last one skipped). */
static double mla_capture_flops(const ls_config *c, int64_t n) {
    const ls_mla_config *m = &c->mla;
    double D = (double)c->hidden, N = (double)n, H = (double)c->n_heads, f = 0;
    double rq = (double)m->q_lora_rank, rkv = (double)m->kv_lora_rank, dn = m->qk_nope, dr = m->qk_rope, dv = m->v_head;
    double nI = m->index_heads, dI = m->index_head_dim, k = (double)m->index_topk;
    double sel = 0; /* Σ_t min(k, t + 1) */
    for (int64_t t = 0; t < n; t++) sel += (double)(t + 1) < k ? (double)(t + 1) : k;
    for (int l = 0; l < c->n_layers; l++) {
        f += 2 * N * (D * rq + rq * H * (dn + dr) + H * dn * rkv + D * (rkv + dr) + H * rkv * dv + H * dv * D);
        if (m->index_full[l]) f += 2 * N * (rq * nI * dI + D * dI + D * nI) + 2 * nI * dI * (N * (N + 1) / 2);
        f += sel * H * (2 * (rkv + dr) + 2 * rkv);
        if (l == c->n_layers - 1) continue;
        if (c->moe[l])
            f += 2 * N * D * c->n_experts + 2 * N * c->top_k * 3 * D * (double)c->moe_inter +
                 2 * N * 3 * D * (double)c->moe_inter * m->n_shared_experts;
        else
            f += 2 * N * 3 * D * (double)c->intermediate;
    }
    return f;
}

/* FLOPs capture executes for n tokens (see file comment). */
static double capture_flops(const ls_config *c, int64_t n) {
    double D = (double)c->hidden, f = 0, N = (double)n;
    double kd = (double)ls_cfg_key_dim(c), vd = (double)ls_cfg_value_dim(c), cd = (double)ls_cfg_conv_dim(c);
    for (int l = 0; l < c->n_layers; l++) {
        if (c->kind[l] == LS_LAYER_GDN) {
            f += 2 * N * D * (cd + vd + 2 * c->H_v) + 2 * N * vd * D;          /* in / out projections */
            double dk = c->d_k, dv = c->d_v, C = 64;
            f += N * c->H_v * (3 * 2 * dk * dv + 2 * C * (2 * dk + dv) + C * (dk + dv)); /* chunked GDR */
            (void)kd;
        } else {
            double qd = (double)c->n_heads * c->head_dim, kvd = (double)c->n_kv * c->head_dim;
            f += 2 * N * D * (2 * qd + 2 * kvd) + 2 * N * qd * D;
            f += 4.0 * c->head_dim * c->n_heads * (N * (N + 1) / 2); /* causal scores + PV */
        }
        if (l == c->n_layers - 1) continue; /* capture skips the last FFN */
        if (c->moe[l]) {
            f += 2 * N * D * c->n_experts + 2 * N * c->top_k * 3 * D * (double)c->moe_inter;
            if (c->shared_inter) f += 2 * N * 3 * D * (double)c->shared_inter + 2 * N * D;
        } else {
            f += 2 * N * 3 * D * (double)c->intermediate;
        }
    }
    return f;
}

int main(int argc, char **argv) {
    ls_prefer_passive_omp(argv);
    static const struct option opts[] = {{"moe", no_argument, 0, 'm'},       {"prompts", required_argument, 0, 'p'},
                                         {"family", required_argument, 0, 'f'},
                                         {"threads", required_argument, 0, 't'}, {"chunk", required_argument, 0, 'c'},
                                         {"help", no_argument, 0, 'h'},      {0, 0, 0, 0}};
    int moe = 0, threads = 0, ch, mla = 0;
    int64_t chunk = 2048;
    char prompts[256] = "4096,16384,65536";
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case 'm': moe = 1; break;
        case 'p': snprintf(prompts, sizeof prompts, "%s", optarg); break;
        case 't': threads = atoi(optarg); break;
        case 'c': chunk = atoll(optarg); break;
        case 'f':
            if (strcmp(optarg, "hybrid") && strcmp(optarg, "mla")) {
                fprintf(stderr, "capture: --family hybrid|mla\n");
                return 2;
            }
            mla = !strcmp(optarg, "mla");
            break;
        case 'h':
            printf("usage: capture [--moe | --family mla] [--prompts P1,P2,...] [--threads N] [--chunk C]\n");
            return 0;
        default: return 2;
        }
    }
    if (chunk < 1) {
        fprintf(stderr, "capture: --chunk must be >= 1\n");
        return 2;
    }
    ls_set_threads(threads);
    char dir[] = "/tmp/ls_bench_capture_XXXXXX";
    if (bench_write_model("capture", dir, mla ? BENCH_SMALL_MLA : moe ? moe_cfg : dense_cfg, LS_DTYPE_BF16)) return 1;
    ls_arenas ar;
    ls_arenas_init(&ar);
    ls_model mdl;
    if (ls_model_load(&mdl, dir, NULL, &ar.a[LS_ARENA_FIXED]) != LS_OK) {
        fprintf(stderr, "capture: %s\n", ls_err_msg());
        return 1;
    }
    const ls_config *cfg = ls_model_config(&mdl);
    if (mla)
        printf("capture benchmark: MLA + DSA + MoE, hidden 512, 8 layers (4 full indexer, top-512), 8 experts top-2 + "
               "shared, vocab 4096, %d threads, chunk %lld\n", ls_get_threads(), (long long)chunk);
    else
        printf("capture benchmark: hidden 512, 8 layers (2 full attention), vocab 4096, %s, %d threads, chunk %lld\n",
               moe ? "MoE 8 experts top-2 + shared" : "dense SwiGLU", ls_get_threads(), (long long)chunk);
    printf("| P | capture s | tokens/s | GFLOP/s | sgemm GFLOP/s (same run) | ratio |\n|---|---|---|---|---|---|\n");
    ls_fwd_opts o;
    ls_fwd_opts_default(&o);
    o.capture_chunk = chunk;
    for (char *tok = strtok(prompts, ","); tok; tok = strtok(NULL, ",")) {
        int64_t P = atoll(tok);
        if (P < 2) continue;
        int32_t *ids = malloc((size_t)P * sizeof(int32_t));
        ls_rng r;
        ls_rng_seed(&r, (uint64_t)P);
        for (int64_t i = 0; i < P; i++) ids[i] = (int32_t)(ls_rng_u64(&r) % 4096u);
        double sg = sgemm_gflops(2048);
        ls_prompt_state st;
        ls_arena_reset(&ar.a[LS_ARENA_PROMPT]);
        if (mdl.fam->state_init(&st, cfg, P - 1, 64, LS_DTYPE_BF16, NULL, LS_CP_CONTIGUOUS, &ar.a[LS_ARENA_PROMPT]) != LS_OK)
            return 1;
        double t0 = ls_now();
        if (mdl.fam->capture(&mdl, &st, ids, P - 1, &o, &ar.a[LS_ARENA_SCRATCH]) != LS_OK) {
            fprintf(stderr, "capture: %s\n", ls_err_msg());
            return 1;
        }
        double t = ls_now() - t0;
        double gf = (mla ? mla_capture_flops(cfg, P - 1) : capture_flops(cfg, P - 1)) / t / 1e9;
        printf("| %lld | %.2f | %.0f | %.1f | %.1f | %.2f |\n", (long long)P, t, (double)(P - 1) / t, gf, sg, gf / sg);
        fflush(stdout);
        free(ids);
    }
    ls_arenas_free(&ar);
    return bench_remove_model(dir);
}
