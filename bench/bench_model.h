/*
 * bench_model.h — the benchmarks' random checkpoint: write `cfg_json` and random
 * weights (seed 1, stored as `dtype`) into a fresh temporary directory (its path in
 * dir, which must hold a mkdtemp template), and remove it afterwards.
 */
#ifndef LS_BENCH_MODEL_H
#define LS_BENCH_MODEL_H

#include <stdio.h>
#include <stdlib.h>

#include "longstraw/model.h"

/* The small hybrid config of issue 2: hidden 512, 8 layers (full attention at 3 and
 * 7), 4 query heads × 128, 2 KV heads, GDN 4 key / 8 value heads × 64, vocab 4096. */
#define BENCH_SMALL_DENSE                                                                                         \
    "{\"model_type\": \"qwen3_next\", \"vocab_size\": 4096, \"hidden_size\": 512, \"num_hidden_layers\": 8,"       \
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 128, \"partial_rotary_factor\": 0.25,"   \
    " \"rope_theta\": 10000000, \"linear_num_key_heads\": 4, \"linear_num_value_heads\": 8,"                         \
    " \"linear_key_head_dim\": 64, \"linear_value_head_dim\": 64, \"intermediate_size\": 1536,"                     \
    " \"num_experts\": 0, \"full_attention_interval\": 4}"

static inline int bench_write_model(const char *prog, char *dir, const char *cfg_json, ls_dtype dtype) {
    if (!mkdtemp(dir)) {
        fprintf(stderr, "%s: cannot create a temporary directory from %s\n", prog, dir);
        return 1;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/in.json", dir);
    FILE *f = fopen(path, "w");
    if (!f || fputs(cfg_json, f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "%s: cannot write %s\n", prog, path);
        return 1;
    }
    if (ls_hybrid_write_random(path, dir, 1, dtype) != LS_OK) {
        fprintf(stderr, "%s: %s\n", prog, ls_err_msg());
        return 1;
    }
    return 0;
}

static inline int bench_remove_model(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : 1;
}

#endif
