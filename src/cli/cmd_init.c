/*
 * cmd_init.c — `longstraw init`: a random checkpoint with the HF tensor names of
 * the config's layout, for tests and demos. config.json is copied verbatim.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "longstraw/config.h"
#include "longstraw/family.h"

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
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "longstraw init: cannot create %s: %s\n", out, strerror(errno));
        return 1;
    }
    ls_config cfg; /* the family decides the tensors */
    ls_status s = ls_config_load(&cfg, config);
    const ls_family *fam = s == LS_OK ? ls_family_for(&cfg, config) : NULL;
    if (s == LS_OK) s = fam ? fam->write_random(config, out, (uint64_t)seed, dt) : LS_ERR_UNSUPPORTED;
    if (s != LS_OK) return cli_fail("init", s);
    fprintf(stderr, "longstraw init: wrote %s/model.safetensors and %s/config.json\n", out, out);
    return 0;
}
