/*
 * cmd_plan.c — `longstraw plan`: the prompt-state inventory predicted from a config
 * (DESIGN §4): per layer kind and per rank, in bytes and GiB.
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include <stdlib.h>

#include "longstraw/config.h"
#include "longstraw/grpo.h"
#include "longstraw/family.h"
#include "longstraw/state.h"

static void help(void) {
    printf("usage: longstraw plan (--model DIR | --config FILE) --prompt P [options]\n\n"
           "Predict the prompt state a capture of P tokens keeps (x_1..x_{P-1}).\n\n"
           "  --model DIR          model directory (reads DIR/config.json)\n"
           "  --config FILE        an HF config.json\n"
           "  --prompt P           prompt length in tokens (required)\n"
           "  --page-size S        positions per K/V page (default 64)\n"
           "  --cp N               context-parallel ranks sharing the pages (default 1)\n"
           "  --cp-layout L        zigzag (rank r: blocks r and 2N-1-r of 2N; default) or\n"
           "                       contiguous (rank r: block r of N)\n"
           "  --cp-wave N          the CP capture: a layer's per-position buffers for at most\n"
           "                       N of the rank's positions at a time (default: as 1 GiB holds)\n"
           "  --state-dtype T      K/V page storage: bf16 or f32 (default bf16)\n"
           "  --mode M             prefix-frozen (default) or full: adds the exact-gradient mode's\n"
           "                       dState (f32 dK/dV pages, d(S, conv tail)) and sweep checkpoints\n"
           "  --sweep-chunk N      full mode: positions per reverse-sweep chunk (default 512)\n"
           "  --indexer-kl         MLA family: the indexers trained too (--indexer-kl-coef > 0): their\n"
           "                       moments and gradients counted\n"
           "  --ep N               MLA family: the routed experts split over N expert-parallel ranks\n"
           "                       (weights, moments and gradients per rank hold E/N experts)\n"
           "  --state-on P         where the prompt state lives on a device backend: device\n"
           "                       (default) or host (host memory, a layer at a time staged to\n"
           "                       the device); the device and host bytes per rank\n"
           "  --json               print JSON instead of a table\n"
           "  --help               this text\n");
}

int cmd_plan(int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"config", required_argument, 0, 'c'},
                                         {"prompt", required_argument, 0, 'p'},
                                         {"page-size", required_argument, 0, 's'},
                                         {"cp", required_argument, 0, 'r'},
                                         {"state-dtype", required_argument, 0, 'd'},
                                         {"cp-layout", required_argument, 0, 'l'},
                                         {"mode", required_argument, 0, 'M'},
                                         {"sweep-chunk", required_argument, 0, 'w'},
                                         {"ep", required_argument, 0, 'e'},
                                         {"cp-wave", required_argument, 0, 'W'},
                                         {"indexer-kl", no_argument, 0, 'k'},
                                         {"json", no_argument, 0, 'j'},
                                         {"state-on", required_argument, 0, 'O'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *model = NULL, *config = NULL;
    int64_t P = -1, S = 64, cp = 1;
    ls_dtype dt = LS_DTYPE_BF16;
    ls_cp_layout lay = LS_CP_ZIGZAG;
    int full = 0;
    int64_t sweep = 512, ep = 1, wave = 0;
    int json = 0, ikl = 0, ch, on_host = 0;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case 'm': model = optarg; break;
        case 'c': config = optarg; break;
        case 'p': if (cli_parse_i64("plan", "--prompt", optarg, 1, INT64_MAX / 2, &P)) return 2; break;
        case 's': if (cli_parse_i64("plan", "--page-size", optarg, 1, 1 << 20, &S)) return 2; break;
        case 'r': if (cli_parse_i64("plan", "--cp", optarg, 1, 65536, &cp)) return 2; break;
        case 'd': if (cli_parse_dtype("plan", "--state-dtype", optarg, &dt)) return 2; break;
        case 'l': if (cli_parse_layout("plan", optarg, &lay)) return 2; break;
        case 'M': if (cli_parse_mode("plan", optarg, &full)) return 2; break;
        case 'w': if (cli_parse_i64("plan", "--sweep-chunk", optarg, 1, INT64_MAX / 4, &sweep)) return 2; break;
        case 'k': ikl = 1; break;
        case 'e': if (cli_parse_i64("plan", "--ep", optarg, 1, 4096, &ep)) return 2; break;
        case 'W': if (cli_parse_i64("plan", "--cp-wave", optarg, 1, (int64_t)1 << 40, &wave)) return 2; break;
        case 'j': json = 1; break;
        case 'O':
            if ((on_host = cli_parse_state_on("plan", optarg)) < 0) return 2;
            break;
        case 'h': help(); return 0;
        default: return cli_usage_error("plan", "bad option");
        }
    }
    if (optind < argc) return cli_usage_error("plan", "unexpected argument \"%s\"", argv[optind]);
    if (!model == !config) return cli_usage_error("plan", "give exactly one of --model or --config");
    if (P < 0) return cli_usage_error("plan", "--prompt is required");
    char path[4096];
    if (model) snprintf(path, sizeof path, "%s/config.json", model);
    else snprintf(path, sizeof path, "%s", config);
    ls_config cfg;
    ls_plan_request rq = {.path = path, .prompt = P, .page_size = S, .dtype = dt, .cp = (int)cp, .layout = lay, .cp_wave = wave,
                          .sweep_chunk = full ? sweep : 0, .ep = (int)ep, .aux_loss = ikl};
    if (ls_plan_check(&rq) != LS_OK) {
        fprintf(stderr, "longstraw plan: %s\n", ls_err_msg());
        return 2;
    }
    ls_plan_doc *doc = calloc(1, sizeof *doc);
    if (!doc) return cli_fail("plan", ls_err(LS_ERR_NOMEM, "out of memory"));
    ls_status s = ls_config_load(&cfg, path);
    if (s != LS_OK || !ls_family_for(&cfg, path)) {
        free(doc);
        return cli_fail("plan", s != LS_OK ? s : LS_ERR_UNSUPPORTED);
    }
    s = ls_plan_make(doc, &cfg, &rq, on_host);
    if (s == LS_OK) ls_plan_write(stdout, doc, json);
    free(doc);
    if (s == LS_ERR_UNSUPPORTED) /* a flag this family has no use for: a usage error, as the flags' own */
        return cli_usage_error("plan", "%s", ls_err_msg());
    return s == LS_OK ? 0 : cli_fail("plan", s);
}
