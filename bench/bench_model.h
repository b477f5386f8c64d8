/*
 * bench_model.h — the benchmarks' random checkpoint (either family): write `cfg_json` and random
 * weights (seed 1, stored as `dtype`) into a fresh temporary directory (its path in
 * dir, which must hold a mkdtemp template), and remove it afterwards.
 */
#ifndef LS_BENCH_MODEL_H
#define LS_BENCH_MODEL_H

#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdlib.h>

#include <string.h>

#include "longstraw/config.h"
#include "longstraw/family.h"
#include "longstraw/runtime.h"

/* The small hybrid config of issue 2: hidden 512, 8 layers (full attention at 3 and
 * 7), 4 query heads × 128, 2 KV heads, GDN 4 key / 8 value heads × 64, vocab 4096. */
#define BENCH_SMALL_DENSE                                                                                         \
    "{\"model_type\": \"qwen3_next\", \"vocab_size\": 4096, \"hidden_size\": 512, \"num_hidden_layers\": 8,"       \
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 128, \"partial_rotary_factor\": 0.25,"   \
    " \"rope_theta\": 10000000, \"linear_num_key_heads\": 4, \"linear_num_value_heads\": 8,"                         \
    " \"linear_key_head_dim\": 64, \"linear_value_head_dim\": 64, \"intermediate_size\": 1536,"                     \
    " \"num_experts\": 0, \"full_attention_interval\": 4}"

/* The small MLA + DSA + MoE config beside it (GLM-5.2 layout): hidden 512, 8 layers (the
 * first dense, then 8 routed experts top-2 + 1 shared), MLA with 8 heads (q latent 256,
 * KV latent 128, nope 64 + rope 32, v 64), a lightning indexer of 8 × 64 on layers 0, 2,
 * 4, 6 (the others share its top-512), vocab 4096. */
#define BENCH_SMALL_MLA                                                                                           \
    "{\"model_type\": \"glm_moe_dsa\", \"vocab_size\": 4096, \"hidden_size\": 512, \"num_hidden_layers\": 8,"       \
    " \"num_attention_heads\": 8, \"num_key_value_heads\": 8, \"q_lora_rank\": 256, \"kv_lora_rank\": 128,"          \
    " \"qk_nope_head_dim\": 64, \"qk_rope_head_dim\": 32, \"v_head_dim\": 64, \"index_n_heads\": 8,"                  \
    " \"index_head_dim\": 64, \"index_topk\": 512, \"index_topk_freq\": 2, \"index_skip_topk_offset\": 1,"            \
    " \"indexer_rope_interleave\": true, \"intermediate_size\": 1536, \"n_routed_experts\": 8,"                       \
    " \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 512, \"n_shared_experts\": 1,"                          \
    " \"first_k_dense_replace\": 1, \"routed_scaling_factor\": 2.5, \"norm_topk_prob\": true,"                        \
    " \"scoring_func\": \"sigmoid\", \"topk_method\": \"noaux_tc\", \"n_group\": 1, \"topk_group\": 1,"               \
    " \"rope_theta\": 1000000, \"rms_norm_eps\": 1e-5, \"max_position_embeddings\": 1048576}"

/* "BLAS: <library>; <core> kernels (chosen by ...), sgemm N GFLOP/s on T threads" */
static inline void bench_print_blas(void) {
    char line[512];
    ls_blas_describe(line, sizeof line);
    printf("BLAS: %s\n", line);
}

/* bench_print_blas in a child process (it measures an sgemm, which starts the thread
 * pool: see bench_write_model_forked). */
static inline void bench_print_blas_forked(void) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        bench_print_blas();
        fflush(NULL);
        _exit(0);
    }
    if (pid > 0) waitpid(pid, NULL, 0);
}

static inline int bench_write_into(const char *prog, const char *dir, const char *cfg_json, ls_dtype dtype) {
    char path[512];
    snprintf(path, sizeof path, "%s/in.json", dir);
    FILE *f = fopen(path, "w");
    if (!f || fputs(cfg_json, f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "%s: cannot write %s\n", prog, path);
        return 1;
    }
    ls_config cfg; /* the family the config names writes the weights */
    ls_status st = ls_config_load(&cfg, path);
    const ls_family *fam = st == LS_OK ? ls_family_for(&cfg, path) : NULL;
    if (st == LS_OK) st = fam ? fam->write_random(path, dir, 1, dtype) : LS_ERR_UNSUPPORTED;
    if (st != LS_OK) {
        fprintf(stderr, "%s: %s\n", prog, ls_err_msg());
        return 1;
    }
    return 0;
}

/* dir (a mkdtemp template) made; 0 on success */
static inline int bench_mkdtemp(const char *prog, char *dir) {
    if (mkdtemp(dir)) return 0;
    fprintf(stderr, "%s: cannot create a temporary directory from %s\n", prog, dir);
    return 1;
}

static inline int bench_write_model(const char *prog, char *dir, const char *cfg_json, ls_dtype dtype) {
    return bench_mkdtemp(prog, dir) || bench_write_into(prog, dir, cfg_json, dtype);
}

/* bench_write_model in a child process: a program that forks its runs must not start
 * OpenMP's thread pool before it forks (libgomp cannot run in the child of a process
 * whose pool exists: the child waits for workers it does not have). */
static inline int bench_write_model_forked(const char *prog, char *dir, const char *cfg_json, ls_dtype dtype) {
    if (bench_mkdtemp(prog, dir)) return 1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) _exit(bench_write_into(prog, dir, cfg_json, dtype));
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) return 1;
    return !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static inline int bench_remove_model(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : 1;
}

#endif
