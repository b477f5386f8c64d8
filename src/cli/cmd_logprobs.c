/*
 * cmd_logprobs.c — `longstraw logprobs`: per-token log-probs of each response of a
 * group, by capture + continuation (default) or one plain forward per member.
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "longstraw/backend.h"
#include "longstraw/files.h"
#include "longstraw/runtime.h"
#include "longstraw/score.h"
#include "longstraw/tokenizer.h"

static void help(void) {
    printf("usage: longstraw logprobs --model DIR --group FILE.json [options]\n\n"
           "Print {\"logprobs\": [[...], ...]}: log p(y_t | prompt, y_<t) for every token of\n"
           "every response, computed by capturing the prompt once and continuing each\n"
           "response from the captured state.\n\n"
           "  --model DIR          checkpoint directory (config.json + safetensors)\n"
           "  --group FILE         group file {\"prompt\": [ids], \"responses\": [[ids], ...]}\n"
           "  --tokenizer FILE     tokenizer.json: the group's prompt and responses may be text\n"
           "  --no-capture         one plain forward over prompt+response per member (reference)\n"
           "  --capture-chunk N    tokens per capture chunk (default 2048)\n"
           "  --page-size S        positions per K/V page (default 64)\n"
           "  --state-dtype T      K/V page storage: f32 or bf16 (default f32)\n"
           "  --threads N          worker threads (default: all cores)\n"
           "  --cp-layout L        under mpirun: zigzag (default) or contiguous page split\n"
           "  --cp-wave N          under mpirun: a layer of the capture keeps its per-position\n"
           "                       buffers for at most N of the rank's positions at a time\n"
           "                       (default: as many as 1 GiB holds)\n"
           "  --ep N               under mpirun -np W: split the routed experts over N ranks (MLA\n"
           "                       family; W = CP x EP; default 1)\n"
           "  --backend B          where the ops run: cpu (default), strict (the CPU's ops over memory\n"
           "                       the host cannot read: a test of the device boundary) or cuda[:N]\n"
           "  --state-on P         where the prompt state lives: device (default) or host (host\n"
           "                       memory, one layer at a time staged to the device)\n"
           "  --stats              print timing, arena peaks and the BLAS (core, sgemm rate) to stderr\n"
           "  --help               this text\n");
}

int cmd_logprobs(int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"group", required_argument, 0, 'g'},
                                         {"no-capture", no_argument, 0, 'n'},
                                         {"capture-chunk", required_argument, 0, 'c'},
                                         {"page-size", required_argument, 0, 's'},
                                         {"state-dtype", required_argument, 0, 'd'},
                                         {"threads", required_argument, 0, 't'},
                                         {"cp-layout", required_argument, 0, 'l'},
                                         {"cp-wave", required_argument, 0, 'W'},
                                         {"stats", no_argument, 0, 'S'},
                                         {"ep", required_argument, 0, 'e'},
                                         {"tokenizer", required_argument, 0, 'k'},
                                         {"backend", required_argument, 0, 'B'},
                                         {"state-on", required_argument, 0, 'O'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *model = NULL, *group = NULL, *tokenizer = NULL, *backend = "cpu";
    ls_score_opts so;
    ls_score_opts_default(&so);
    int64_t threads = 0, v, epn = 1;
    int stats = 0, ch, state_host = 0;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case 'm': model = optarg; break;
        case 'g': group = optarg; break;
        case 'k': tokenizer = optarg; break;
        case 'B': backend = optarg; break;
        case 'O':
            if ((state_host = cli_parse_state_on("logprobs", optarg)) < 0) return 2;
            break;
        case 'n': so.no_capture = 1; break;
        case 'c':
            if (cli_parse_i64("logprobs", "--capture-chunk", optarg, 1, 1 << 24, &v)) return 2;
            so.fwd.capture_chunk = v;
            break;
        case 's':
            if (cli_parse_i64("logprobs", "--page-size", optarg, 1, 1 << 20, &v)) return 2;
            so.page_size = v;
            break;
        case 'd': if (cli_parse_dtype("logprobs", "--state-dtype", optarg, &so.state_dtype)) return 2; break;
        case 't': if (cli_parse_i64("logprobs", "--threads", optarg, 1, 4096, &threads)) return 2; break;
        case 'S': stats = 1; break;
        case 'e': if (cli_parse_i64("logprobs", "--ep", optarg, 1, 4096, &epn)) return 2; break;
        case 'l': if (cli_parse_layout("logprobs", optarg, &so.fwd.cp_layout)) return 2; break;
        case 'W': if (cli_parse_i64("logprobs", "--cp-wave", optarg, 1, (int64_t)1 << 40, &so.fwd.cp_wave)) return 2; break;
        case 'h': help(); return 0;
        default: return cli_usage_error("logprobs", "bad option");
        }
    }
    if (optind < argc) return cli_usage_error("logprobs", "unexpected argument \"%s\"", argv[optind]);
    if (!model) return cli_usage_error("logprobs", "--model is required");
    if (!group) return cli_usage_error("logprobs", "--group is required");
    ls_set_threads((int)threads);
    { /* under mpirun every rank reads the same files (main.c compared the command lines) */
        const char *in[] = {model, group, tokenizer};
        ls_status cs = ls_check_same_inputs(cli_cp_comm(), argc, argv, in, 3);
        if (cs != LS_OK) return cli_fail("logprobs", cs);
    }
    /* CP degree = world size / --ep: each CP rank holds its share of the pages, each EP rank
     * E/ep of the routed experts */
    const ls_comm *ep = NULL;
    if (cli_parallel("logprobs", epn, &so.fwd.comm, &ep)) return 2;

    const ls_backend *be;
    ls_status bs = ls_backend_open(backend, &be);
    if (bs != LS_OK) return cli_fail("logprobs", bs);
    ls_arenas ar;
    ls_arenas_init(&ar);
    ls_arenas_set_backend(&ar, be);
    if (state_host) ls_arena_set_backend(&ar.a[LS_ARENA_PROMPT], ls_backend_cpu()); /* staged per layer */
    ls_model m;
    ls_group g;
    memset(&g, 0, sizeof g);
    ls_tokenizer *tok = NULL;
    int rc = 1;
    double t0 = ls_now();
    ls_status s = ls_model_load(&m, model, ep, &ar.a[LS_ARENA_FIXED]);
    if (s != LS_OK) goto fail;
    double t_load = ls_now() - t0;
    if (tokenizer && (s = ls_tok_load(&tok, tokenizer)) != LS_OK) goto fail;
    s = ls_group_load_ex(&g, group, ls_model_config(&m)->vocab, tok, 0);
    if (s != LS_OK) goto fail;
    float **lp = ls_arena_alloc(&ar.a[LS_ARENA_SCORE], (size_t)g.G * sizeof(float *));
    if (!lp) {
        s = LS_ERR_NOMEM;
        goto fail;
    }
    ls_score_stats st;
    s = ls_score_group(&m, &g, &so, &ar, lp, &st);
    if (s == LS_OK) s = ls_score_check_finite(&g, lp); /* NaN/Inf is an error, never printed */
    if (s != LS_OK) goto fail;
    if (cli_rank() != 0) { /* rank 0 alone prints: one JSON document, as with one rank */
        rc = 0;
        goto done;
    }
    printf("{\"logprobs\": [");
    for (int i = 0; i < g.G; i++) {
        printf(i ? ", [" : "[");
        for (int64_t t = 0; t < g.R[i]; t++) {
            if (t) printf(", ");
            ls_json_number(stdout, "%.9g", (double)lp[i][t]);
        }
        printf("]");
    }
    printf("]}\n");
    if (stats) {
        fprintf(stderr, "load %.3fs  capture %.3fs (%lld tokens)  score %.3fs  prompt state %zu bytes\n",
                t_load, st.capture_s, (long long)(so.no_capture ? 0 : g.P - 1), st.score_s, st.prompt_bytes);
        for (int i = 0; i < LS_ARENA_COUNT; i++)
            fprintf(stderr, "  arena %-8s peak %zu bytes\n", ls_arena_id_name((ls_arena_id)i), ar.a[i].peak);
        fprintf(stderr, "  process peak RSS %zu bytes\n", ls_peak_rss_bytes());
        char blas[512];
        ls_blas_describe(blas, sizeof blas);
        fprintf(stderr, "  BLAS %s\n", blas);
    }
    rc = 0;
    goto done;
fail:
    rc = cli_fail("logprobs", s);
done:
    ls_group_free(&g);
    ls_tok_free(tok);
    ls_arenas_free(&ar);
    ls_backend_close(be);
    return rc;
}
