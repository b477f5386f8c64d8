/*
 * hybrid_init.c — random checkpoints with HF names (for tests, benchmarks and the
 * demo). Initialisation follows specs/hybrid-qwen3next.md §8.3: decays that keep
 * the recurrent state alive, non-zero norm weights so the (1+w) convention matters.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/family.h"
#include "longstraw/model.h"
#include "longstraw/safetensors.h"

static void fill(float *x, int64_t n, const ls_hf_tensor_spec *sp, ls_rng *r) {
    int64_t fan_in = sp->ndim >= 2 ? sp->shape[sp->ndim - 1] : 1;
    for (int64_t i = 0; i < n; i++) {
        double v = 0;
        switch (sp->init) {
        case LS_INIT_LINEAR: v = ls_rng_normal(r) / sqrt((double)fan_in); break;
        case LS_INIT_EMBED: v = ls_rng_normal(r); break;
        case LS_INIT_NORM0: v = 0.1 * ls_rng_normal(r); break;
        case LS_INIT_NORM1: v = 1.0 + 0.1 * ls_rng_normal(r); break;
        case LS_INIT_CONV: v = ls_rng_uniform(r) - 0.5; break;
        case LS_INIT_ALOG: v = log(0.05 + 0.95 * ls_rng_uniform(r)); break;
        case LS_INIT_DTBIAS: v = 0.5 * ls_rng_normal(r); break;
        case LS_INIT_BIAS0: v = 0.01 * ls_rng_normal(r); break;
        }
        x[i] = (float)v;
    }
}

ls_status ls_write_random_checkpoint(const char *config_path, const char *dir, uint64_t seed, ls_dtype dtype,
                                     const ls_hf_tensor_spec *sp, int64_t n) {
    ls_arena data; /* holds every tensor until the writer has written them */
    ls_arena_init(&data, "init", 0);
    ls_st_writer w;
    ls_st_writer_init(&w);
    ls_rng rng;
    ls_rng_seed(&rng, seed);
    ls_status s = LS_OK;
    for (int64_t i = 0; i < n && s == LS_OK; i++) {
        int64_t numel = 1;
        for (int d = 0; d < sp[i].ndim; d++) numel *= sp[i].shape[d];
        float *x = ls_arena_alloc(&data, (size_t)numel * sizeof(float));
        if (!x) {
            s = LS_ERR_NOMEM;
            break;
        }
        fill(x, numel, &sp[i], &rng);
        /* A_log, plain norm weights and biases stay f32, as the checkpoints store them
         * (hybrid spec §7.2; mla spec §4: the correction bias is fp32) */
        ls_init_kind k = sp[i].init;
        ls_dtype tdt = (k == LS_INIT_ALOG || k == LS_INIT_NORM1 || k == LS_INIT_BIAS0) ? LS_DTYPE_F32 : dtype;
        s = ls_st_writer_add_f32(&w, sp[i].name, tdt, sp[i].ndim, sp[i].shape, x);
    }
    if (s == LS_OK) s = ls_st_writer_add_meta(&w, "format", "pt");
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (s == LS_OK) s = ls_st_write(&w, path);
    char cfg_out[4096];
    snprintf(cfg_out, sizeof cfg_out, "%s/config.json", dir);
    if (s == LS_OK) s = ls_copy_file_atomic(config_path, cfg_out);
    ls_st_writer_free(&w);
    ls_arena_free(&data);
    return s;
}

ls_status ls_hybrid_write_random(const char *config_path, const char *dir, uint64_t seed,
                                 ls_dtype dtype) {
    ls_config cfg;
    LS_TRY(ls_config_load(&cfg, config_path));
    if (cfg.family != LS_FAMILY_HYBRID) /* names the family and what is missing */
        return ls_family_for(&cfg, config_path) ? LS_ERR_ARG : LS_ERR_UNSUPPORTED;
    ls_hf_tensor_spec *sp = NULL;
    int64_t n = 0;
    LS_TRY(ls_hybrid_hf_specs(&cfg, &sp, &n));
    ls_status s = ls_write_random_checkpoint(config_path, dir, seed, dtype, sp, n);
    free(sp);
    return s;
}
