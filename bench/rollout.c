/*
 * bench/rollout.c — sampling G responses from one captured prompt: each member
 * decoded on its own (G matrix-vector passes over the weights per token) against
 * the group decoded as one batch (ls_generate_group: one matrix product per token),
 * measured side by side in one run (the machine is shared: compare the ratio).
 *
 *   build/bench/rollout [--prompt P] [--groups 1,4,8,16] [--new N] [--threads N]
 *
 * Model: the small hybrid config of issue 2 — hidden 512, 8 layers (full attention
 * at layers 3 and 7), vocab 4096 — with f32 weights; greedy decoding of N tokens with
 * no stop token, so both paths do the same work and must produce the same tokens.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_model.h"
#include "longstraw/rollout.h"

static const char *cfg = BENCH_SMALL_DENSE; /* bench_model.h */

int main(int argc, char **argv) {
    ls_runtime_setup(argv);
    static const struct option opts[] = {{"prompt", required_argument, 0, 'p'}, {"groups", required_argument, 0, 'g'},
                                         {"new", required_argument, 0, 'n'},    {"threads", required_argument, 0, 't'},
                                         {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
    int64_t P = 4096, N = 32;
    int threads = 0, ch;
    char groups[256] = "1,4,8,16";
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case 'p': P = atoll(optarg); break;
        case 'g': snprintf(groups, sizeof groups, "%s", optarg); break;
        case 'n': N = atoll(optarg); break;
        case 't': threads = atoi(optarg); break;
        default:
            printf("usage: rollout [--prompt P (4096)] [--groups LIST (1,4,8,16)] [--new N (32)] [--threads N]\n");
            return ch == 'h' ? 0 : 2;
        }
    }
    if (P < 2 || N < 1) {
        fprintf(stderr, "rollout: --prompt must be >= 2 and --new >= 1\n");
        return 2;
    }
    ls_set_threads(threads);
    char dir[] = "/tmp/ls_bench_rollout_XXXXXX";
    if (bench_write_model("rollout", dir, cfg, LS_DTYPE_F32)) return 1;
    ls_arenas ar;
    ls_arenas_init(&ar);
    ls_model mh;
    if (ls_model_load(&mh, dir, NULL, &ar.a[LS_ARENA_FIXED]) != LS_OK) {
        fprintf(stderr, "rollout: %s\n", ls_err_msg());
        return 1;
    }
    int32_t *ids = malloc((size_t)P * sizeof(int32_t));
    ls_rng r;
    ls_rng_seed(&r, 5);
    for (int64_t i = 0; i < P; i++) ids[i] = (int32_t)(ls_rng_u64(&r) % 4096u);
    ls_fwd_opts fo;
    ls_fwd_opts_default(&fo);
    ls_prompt_state st;
    if (mh.fam->state_init(&st, ls_model_config(&mh), P - 1, 64, LS_DTYPE_BF16, NULL, LS_CP_CONTIGUOUS,
                           &ar.a[LS_ARENA_PROMPT]) != LS_OK ||
        mh.fam->capture(&mh, &st, ids, P - 1, &fo, &ar.a[LS_ARENA_SCRATCH]) != LS_OK) {
        fprintf(stderr, "rollout: %s\n", ls_err_msg());
        return 1;
    }
    bench_print_blas();
    printf("rollout benchmark: hidden 512, 8 layers (2 full attention), vocab 4096, f32 weights, bf16 pages, P = %lld, "
           "%lld greedy tokens per member, %d threads\n",
           (long long)P, (long long)N, ls_get_threads());
    printf("| G | one member at a time s | tokens/s | batched group s | tokens/s | speed-up | same tokens |\n"
           "|---|---|---|---|---|---|---|\n");
    ls_sample_opts so;
    ls_sample_opts_default(&so);
    so.temperature = 0; /* greedy: both paths must agree token for token */
    so.max_new_tokens = N;
    for (char *tok = strtok(groups, ","); tok; tok = strtok(NULL, ",")) {
        int G = atoi(tok);
        if (G < 1) continue;
        int32_t **a = malloc((size_t)G * sizeof *a), **b = malloc((size_t)G * sizeof *b);
        float **la = malloc((size_t)G * sizeof *la), **lb = malloc((size_t)G * sizeof *lb);
        int64_t *na = malloc((size_t)G * sizeof *na), *nb = malloc((size_t)G * sizeof *nb);
        for (int i = 0; i < G; i++) {
            a[i] = malloc((size_t)N * sizeof(int32_t)), b[i] = malloc((size_t)N * sizeof(int32_t));
            la[i] = malloc((size_t)N * sizeof(float)), lb[i] = malloc((size_t)N * sizeof(float));
        }
        ls_status s = LS_OK;
        double t0 = ls_now();
        for (int i = 0; i < G && s == LS_OK; i++)
            s = ls_generate(&mh, &st, ids[P - 1], &so, &r, a[i], la[i], &na[i], &fo, &ar.a[LS_ARENA_BRANCH],
                            &ar.a[LS_ARENA_SCRATCH]);
        double t_one = ls_now() - t0;
        t0 = ls_now();
        if (s == LS_OK)
            s = ls_generate_group(&mh, &st, ids[P - 1], G, &so, &r, b, lb, nb, &fo, &ar.a[LS_ARENA_BRANCH],
                                  &ar.a[LS_ARENA_SCRATCH]);
        double t_batch = ls_now() - t0;
        if (s != LS_OK) {
            fprintf(stderr, "rollout: %s\n", ls_err_msg());
            return 1;
        }
        int same = 1;
        for (int i = 0; i < G; i++) same &= na[i] == nb[i] && memcmp(a[i], b[i], (size_t)na[i] * sizeof(int32_t)) == 0;
        double toks = (double)G * (double)N;
        printf("| %d | %.3f | %.0f | %.3f | %.0f | %.2f× | %s |\n", G, t_one, toks / t_one, t_batch, toks / t_batch,
               t_one / t_batch, same ? "yes" : "NO");
        for (int i = 0; i < G; i++) free(a[i]), free(b[i]), free(la[i]), free(lb[i]);
        free(a), free(b), free(la), free(lb), free(na), free(nb);
    }
    free(ids);
    ls_arenas_free(&ar);
    return bench_remove_model(dir);
}
