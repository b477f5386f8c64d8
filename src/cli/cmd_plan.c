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
                                         {"prompt", required_argument, 0, 'f'},
                                         {"page-size", required_argument, 0, 'f'},
                                         {"cp", required_argument, 0, 'f'},
                                         {"state-dtype", required_argument, 0, 'f'},
                                         {"cp-layout", required_argument, 0, 'f'},
                                         {"mode", required_argument, 0, 'f'},
                                         {"sweep-chunk", required_argument, 0, 'f'},
                                         {"ep", required_argument, 0, 'f'},
                                         {"cp-wave", required_argument, 0, 'f'},
                                         {"indexer-kl", no_argument, 0, 'f'},
                                         {"json", no_argument, 0, 'j'},
                                         {"state-on", required_argument, 0, 'f'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *model = NULL, *config = NULL;
    ls_plan_flags pf;
    ls_plan_flags_init(&pf);
    int json = 0, ch, at = 0;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", opts, &at)) != -1) {
        switch (ch) {
        case 'm': model = optarg; break;
        case 'c': config = optarg; break;
        case 'j': json = 1; break;
        case 'h': help(); return 0;
        case 'f': { /* the library's plan flags (plan.h): names, defaults, ranges and messages */
            int known = 0;
            if (ls_plan_flag_set(&pf, opts[at].name, optarg, &known) != LS_OK) {
                fprintf(stderr, "longstraw plan: %s\n", ls_err_msg());
                return 2;
            }
            break;
        }
        default: return cli_usage_error("plan", "bad option");
        }
    }
    if (optind < argc) return cli_usage_error("plan", "unexpected argument \"%s\"", argv[optind]);
    if (!model == !config) return cli_usage_error("plan", "give exactly one of --model or --config");
    if (pf.rq.prompt < 0) return cli_usage_error("plan", "--prompt is required");
    char path[4096];
    if (model) snprintf(path, sizeof path, "%s/config.json", model);
    else snprintf(path, sizeof path, "%s", config);
    ls_config cfg;
    ls_plan_request rq = ls_plan_flags_request(&pf, path);
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
    s = ls_plan_make(doc, &cfg, &rq, pf.on_host);
    if (s == LS_OK) ls_plan_write(stdout, doc, json);
    free(doc);
    if (s == LS_ERR_UNSUPPORTED) /* a flag this family has no use for: a usage error, as the flags' own */
        return cli_usage_error("plan", "%s", ls_err_msg());
    return s == LS_OK ? 0 : cli_fail("plan", s);
}
