/*
 * bench/capture.c — prompt-capture throughput beside a cblas_sgemm roofline
 * measured in the same run (this machine is shared and noisy: compare ratios).
 *
 *   build/bench/capture [--moe | --family mla] [--prompts 4096,16384,65536] [--threads N] [--chunk C]
 *   build/bench/capture --core-check [--prompts 4096] [...]
 *   build/bench/capture --model DIR [--rounds R] [--print-tps] [...]
 *
 * --model DIR: capture that checkpoint instead of the random one (bench/llama/compare.sh
 * times LongStraw and llama.cpp on the same model); --rounds R: best of R captures per
 * prompt length (default 1); --print-config: print the config.json of the benchmark's model
 * (after --family / --moe) and exit.
 *
 * --core-check: capture tokens/s at the first prompt length with OPENBLAS_CORETYPE
 * unset (the tool's own choice, ls_runtime_setup), forced to the strongest core the
 * CPU runs, and forced to the core the BLAS picks by itself, each in a fresh process,
 * interleaved over 3 rounds (the machine is shared: best of 3, ratios to the forced
 * best core).
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
#include <unistd.h>

#include "bench_model.h"
#include "longstraw/family.h"
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

/* One child run of this program at prompt length P under `env` (an `env` argument
 * list); its tokens/s, or -1. */
static double child_tps(const char *env, const char *self, const char *fam, int threads, int64_t chunk, int64_t P) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "env %s '%s' %s --threads %d --chunk %lld --prompts %lld --print-tps", env, self, fam,
             threads, (long long)chunk, (long long)P);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    double v = -1;
    if (fscanf(p, "%lf", &v) != 1) v = -1;
    if (pclose(p) != 0) v = -1;
    return v;
}

static int core_check(const char *fam, int threads, int64_t chunk, int64_t P) {
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 1;
    self[n] = 0;
    ls_blas_info b;
    ls_blas_info_get(&b);
    if (!b.cpu_core[0]) {
        printf("core check: this CPU runs nothing better than the SSE kernels: nothing to compare\n");
        return 0;
    }
    const char *unset = "-u OPENBLAS_CORETYPE -u LONGSTRAW_SET_OPENBLAS_CORETYPE -u LONGSTRAW_BLAS_OWN_CORETYPE";
    char best[128], own[128];
    snprintf(best, sizeof best, "-u LONGSTRAW_SET_OPENBLAS_CORETYPE OPENBLAS_CORETYPE=%s", b.cpu_core);
    snprintf(own, sizeof own, "-u LONGSTRAW_SET_OPENBLAS_CORETYPE OPENBLAS_CORETYPE=%s",
             b.blas_core[0] ? b.blas_core : b.core);
    double tu = 0, tb = 0, to = 0;
    for (int r = 0; r < 3; r++) {
        double u = child_tps(unset, self, fam, threads, chunk, P), x = child_tps(best, self, fam, threads, chunk, P),
               o = child_tps(own, self, fam, threads, chunk, P);
        if (u < 0 || x < 0 || o < 0) {
            fprintf(stderr, "capture: a child run failed\n");
            return 1;
        }
        if (u > tu) tu = u;
        if (x > tb) tb = x;
        if (o > to) to = o;
    }
    printf("| P = %lld, tokens/s (best of 3) | OPENBLAS_CORETYPE unset | forced %s (the CPU's best) | forced %s (the "
           "BLAS's own pick) |\n|---|---|---|---|\n| capture | %.0f | %.0f | %.0f |\n| ratio to forced best | %.2f | "
           "1.00 | %.2f |\n",
           (long long)P, b.cpu_core, b.blas_core[0] ? b.blas_core : b.core, tu, tb, to, tu / tb, to / tb);
    return 0;
}

int main(int argc, char **argv) {
    ls_runtime_setup(argv);
    static const struct option opts[] = {{"moe", no_argument, 0, 'm'},       {"prompts", required_argument, 0, 'p'},
                                         {"family", required_argument, 0, 'f'},
                                         {"threads", required_argument, 0, 't'}, {"chunk", required_argument, 0, 'c'},
                                         {"core-check", no_argument, 0, 'k'}, {"print-tps", no_argument, 0, 'T'},
                                         {"model", required_argument, 0, 'M'}, {"print-config", no_argument, 0, 'C'}, {"rounds", required_argument, 0, 'r'},
                                         {"help", no_argument, 0, 'h'},      {0, 0, 0, 0}};
    int moe = 0, threads = 0, ch, mla = 0, check = 0, print_tps = 0, rounds = 1;
    const char *model = NULL;
    int64_t chunk = 2048;
    char prompts[256] = "4096,16384,65536";
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case 'm': moe = 1; break;
        case 'k': check = 1; break;
        case 'T': print_tps = 1; break;
        case 'p': snprintf(prompts, sizeof prompts, "%s", optarg); break;
        case 't': threads = atoi(optarg); break;
        case 'c': chunk = atoll(optarg); break;
        case 'M': model = optarg; break;
        case 'C': printf("%s\n", mla ? BENCH_SMALL_MLA : moe ? moe_cfg : dense_cfg); return 0;
        case 'r': rounds = atoi(optarg); break;
        case 'f':
            if (strcmp(optarg, "hybrid") && strcmp(optarg, "mla")) {
                fprintf(stderr, "capture: --family hybrid|mla\n");
                return 2;
            }
            mla = !strcmp(optarg, "mla");
            break;
        case 'h':
            printf("usage: capture [--moe | --family mla] [--prompts P1,P2,...] [--threads N] [--chunk C] "
                   "[--core-check] [--model DIR] [--rounds R] [--print-tps] [--print-config]\n");
            return 0;
        default: return 2;
        }
    }
    if (chunk < 1 || rounds < 1) {
        fprintf(stderr, "capture: --chunk and --rounds must be >= 1\n");
        return 2;
    }
    ls_set_threads(threads);
    if (check)
        return core_check(mla ? "--family mla" : moe ? "--moe" : "", ls_get_threads(), chunk, atoll(prompts));
    char dir[4096] = "/tmp/ls_bench_capture_XXXXXX";
    if (model) snprintf(dir, sizeof dir, "%s", model);
    else if (bench_write_model("capture", dir, mla ? BENCH_SMALL_MLA : moe ? moe_cfg : dense_cfg, LS_DTYPE_BF16))
        return 1;
    ls_arenas ar;
    ls_arenas_init(&ar);
    ls_model mdl;
    if (ls_model_load(&mdl, dir, NULL, &ar.a[LS_ARENA_FIXED]) != LS_OK) {
        fprintf(stderr, "capture: %s\n", ls_err_msg());
        return 1;
    }
    const ls_config *cfg = ls_model_config(&mdl);
    if (!print_tps) bench_print_blas();
    if (!print_tps && model)
        printf("capture benchmark: %s (%s, %lld layers, hidden %lld), %d threads, chunk %lld\n", model, mdl.fam->name,
               (long long)cfg->n_layers, (long long)cfg->hidden, ls_get_threads(), (long long)chunk);
    else if (!print_tps && mla)
        printf("capture benchmark: MLA + DSA + MoE, hidden 512, 8 layers (4 full indexer, top-512), 8 experts top-2 + "
               "shared, vocab 4096, %d threads, chunk %lld\n", ls_get_threads(), (long long)chunk);
    else if (!print_tps)
        printf("capture benchmark: hidden 512, 8 layers (2 full attention), vocab 4096, %s, %d threads, chunk %lld\n",
               moe ? "MoE 8 experts top-2 + shared" : "dense SwiGLU", ls_get_threads(), (long long)chunk);
    if (!print_tps)
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
        for (int64_t i = 0; i < P; i++) ids[i] = (int32_t)(ls_rng_u64(&r) % (uint64_t)cfg->vocab);
        double sg = print_tps ? 0 : sgemm_gflops(2048);
        double t = 1e30;
        for (int rd = 0; rd < rounds; rd++) {
            ls_prompt_state st;
            ls_arena_reset(&ar.a[LS_ARENA_PROMPT]);
            if (mdl.fam->state_init(&st, cfg, P - 1, 64, LS_DTYPE_BF16, NULL, LS_CP_CONTIGUOUS,
                                    &ar.a[LS_ARENA_PROMPT]) != LS_OK)
                return 1;
            double t0 = ls_now();
            if (mdl.fam->capture(&mdl, &st, ids, P - 1, &o, &ar.a[LS_ARENA_SCRATCH]) != LS_OK) {
                fprintf(stderr, "capture: %s\n", ls_err_msg());
                return 1;
            }
            double dt = ls_now() - t0;
            if (dt < t) t = dt;
        }
        double gf = mdl.fam->capture_flops(cfg, P - 1) / t / 1e9;
        if (print_tps) printf("%.3f\n", (double)(P - 1) / t);
        else printf("| %lld | %.2f | %.0f | %.1f | %.1f | %.2f |\n", (long long)P, t, (double)(P - 1) / t, gf, sg, gf / sg);
        fflush(stdout);
        free(ids);
    }
    ls_arenas_free(&ar);
    return model ? 0 : bench_remove_model(dir);
}
