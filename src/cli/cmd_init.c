/*
 * cmd_init.c — `longstraw init`: a random checkpoint with the HF tensor names of
 * the config's layout, for tests and demos. config.json is copied verbatim.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "longstraw/model.h"
#include "longstraw/safetensors.h"

static void help(void) {
    printf("usage: longstraw init --config CFG.json --out DIR [--seed N] [--dtype f32|bf16]\n\n"
           "Write DIR/config.json (a copy of CFG.json) and DIR/model.safetensors with random\n"
           "weights under the HF names of the config's layout (qwen3_next fused projections,\n"
           "or Qwen3.5 split projections under model.language_model.).\n\n"
           "  --config FILE   HF config.json (qwen3_next, qwen3_5, qwen3_5_text, qwen3_5_moe[_text])\n"
           "  --out DIR       output directory (created if missing)\n"
           "  --seed N        RNG seed (default 0)\n"
           "  --dtype T       stored dtype: f32 or bf16 (default f32)\n"
           "  --help          this text\n");
}

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
        }
        x[i] = (float)v;
    }
}

static int write_config_copy(const char *src, const char *dir) {
    char *text = NULL;
    size_t len = 0;
    ls_status s = ls_read_file(src, &text, &len);
    if (s != LS_OK) return cli_fail("init", s);
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    int ok = f && fwrite(text, 1, len, f) == len;
    if (f && fclose(f) != 0) ok = 0;
    free(text);
    if (!ok || rename(tmp, path) != 0) {
        fprintf(stderr, "longstraw init: cannot write %s: %s\n", path, strerror(errno));
        remove(tmp);
        return 1;
    }
    return 0;
}

int cmd_init(int argc, char **argv) {
    static const struct option opts[] = {{"config", required_argument, 0, 'c'},
                                         {"out", required_argument, 0, 'o'},
                                         {"seed", required_argument, 0, 's'},
                                         {"dtype", required_argument, 0, 'd'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *config = NULL, *out = NULL;
    int64_t seed = 0;
    ls_dtype dt = LS_DTYPE_F32;
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case 'c': config = optarg; break;
        case 'o': out = optarg; break;
        case 's': if (cli_parse_i64("init", "--seed", optarg, 0, INT64_MAX, &seed)) return 2; break;
        case 'd': if (cli_parse_dtype("init", "--dtype", optarg, &dt)) return 2; break;
        case 'h': help(); return 0;
        default: return cli_usage_error("init", "bad option");
        }
    }
    if (optind < argc) return cli_usage_error("init", "unexpected argument \"%s\"", argv[optind]);
    if (!config || !out) return cli_usage_error("init", "--config and --out are required");
    ls_config cfg;
    ls_status s = ls_config_load(&cfg, config);
    if (s != LS_OK) return cli_fail("init", s);
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "longstraw init: cannot create %s: %s\n", out, strerror(errno));
        return 1;
    }
    ls_hf_tensor_spec *sp = NULL;
    int64_t n = 0;
    s = ls_hybrid_hf_specs(&cfg, &sp, &n);
    if (s != LS_OK) return cli_fail("init", s);
    ls_arena data;
    ls_arena_init(&data, "init", 0);
    ls_st_writer w;
    ls_st_writer_init(&w);
    ls_rng rng;
    ls_rng_seed(&rng, (uint64_t)seed);
    int rc = 1;
    for (int64_t i = 0; i < n; i++) {
        int64_t numel = 1;
        for (int d = 0; d < sp[i].ndim; d++) numel *= sp[i].shape[d];
        float *x = ls_arena_alloc(&data, (size_t)numel * sizeof(float));
        if (!x) {
            s = LS_ERR_NOMEM;
            goto fail;
        }
        fill(x, numel, &sp[i], &rng);
        /* A_log and the gated norm stay f32 as real Qwen3.5 checkpoints store them (spec §7.2). */
        ls_dtype tdt = (sp[i].init == LS_INIT_ALOG || sp[i].init == LS_INIT_NORM1) ? LS_DTYPE_F32 : dt;
        s = ls_st_writer_add_f32(&w, sp[i].name, tdt, sp[i].ndim, sp[i].shape, x);
        if (s != LS_OK) goto fail;
    }
    s = ls_st_writer_add_meta(&w, "format", "pt");
    if (s != LS_OK) goto fail;
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    s = ls_st_write(&w, path);
    if (s != LS_OK) goto fail;
    rc = write_config_copy(config, out);
    if (rc == 0)
        fprintf(stderr, "longstraw init: wrote %s (%lld tensors) and %s/config.json\n", path, (long long)n, out);
    goto done;
fail:
    rc = cli_fail("init", s);
done:
    ls_st_writer_free(&w);
    ls_arena_free(&data);
    free(sp);
    return rc;
}
