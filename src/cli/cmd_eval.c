/*
 * cmd_eval.c — `longstraw eval`: exact match (and the shaped score) of a checkpoint on
 * a built-in task's held-out prompts, at the given prompt lengths and needle depths,
 * answered greedily from the captured prompt state (eval.h). One JSON document on
 * stdout (rank 0 under mpirun), optionally also written to a file.
 */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_train.h"
#include "longstraw/backend.h"
#include "longstraw/eval.h"
#include "longstraw/config.h"
#include "longstraw/files.h"
#include "longstraw/trace.h"

static void help(void) {
    printf("usage: longstraw eval --model DIR [--task T] [--prompt-len N[,N...]] [--num-prompts K]\n"
           "                      [--seed S] [--tokenizer FILE] [options]\n\n"
           "Exact match of a checkpoint on a built-in task's held-out prompts (answers that\n"
           "training never draws), K prompts per length with the needle at the --depths in\n"
           "turn, each answered greedily from its captured prompt state. Prints one JSON\n"
           "document: \"exact_match\" (over all prompts), \"score\" (shaped), \"by_length\"\n"
           "({\"16384\": {\"exact_match\", \"score\", \"n\", \"by_depth\": {...}}}), \"by_depth\" and\n"
           "every prompt's answer and response (\"prompts\").\n\n"
           "  --model DIR          checkpoint directory (config.json + safetensors)\n"
           "  --adapter FILE       LoRA adapters on the model (a LoRA run's\n"
           "                       checkpoint-N/adapter_model.safetensors)\n"
           "  --lora-alpha A       their scaling alpha (default: \"lora_alpha\" of the\n"
           "                       adapter_config.json beside FILE, else 16)\n"
           "  --task T             passkey (default), multikey or vartrack (train --help)\n"
           "  --haystack H         repeat (default) or varied\n"
           "  --prompt-len LIST    prompt lengths in tokens, N[,N...] (default 16384)\n"
           "  --num-prompts K      prompts per length (default 16)\n"
           "  --depths LIST        needle depths in [0, 1], prompt k at entry k mod n\n"
           "                       (default 0,0.25,0.5,0.75,1)\n"
           "  --seed S             prompt seed (default 0); a length's prompts depend on S and\n"
           "                       the length only\n"
           "  --tokenizer FILE     tokenizer.json (default: the byte-level one of `demo`)\n"
           "  --max-new-tokens N   tokens decoded per prompt (default: the answer's + 2)\n"
           "  --out FILE           also write the JSON document to FILE (atomically; for\n"
           "                       `longstraw report --eval FILE`)\n"
           "  --capture-chunk N    tokens per capture chunk (default 2048)\n"
           "  --page-size S        positions per K/V page (default 64)\n"
           "  --state-dtype T      K/V page storage: f32 or bf16 (default f32)\n"
           "  --threads N          worker threads (default: all cores)\n"
           "  --backend B          where the ops run: cpu (default), strict (the device boundary\n"
           "                       tested on the CPU) or cuda[:N]\n"
           "  --cp-layout L        under mpirun: zigzag (default) or contiguous page split\n"
           "  --cp-wave N          under mpirun: per-position capture buffers for at most N of\n"
           "                       the rank's positions at a time (default: as 1 GiB holds)\n"
           "  --ep N               under mpirun -np W: split the routed experts over N ranks\n"
           "  --force              run even when the plan says the prompts will not fit in this\n"
           "                       machine's memory (refused before anything is allocated)\n"
           "  --quiet              no progress bar\n"
           "  --help               this text\n");
}

/* "lora_alpha" of the adapter_config.json beside an adapter file (what `train` wrote
 * with it), else PEFT's default 16. */
static double adapter_alpha(const char *adapter) {
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s", adapter);
    snprintf(path, sizeof path, "%s/adapter_config.json", dirname(dir));
    char *text = NULL;
    double a = 16;
    if (ls_read_file(path, &text, NULL) != LS_OK) return a;
    cJSON *j = cJSON_Parse(text);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "lora_alpha");
    if (cJSON_IsNumber(v) && v->valuedouble > 0) a = v->valuedouble;
    cJSON_Delete(j);
    free(text);
    return a;
}

int cmd_eval(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},     {"adapter", required_argument, 0, 'a'},
        {"task", required_argument, 0, 'T'},      {"haystack", required_argument, 0, 'H'},
        {"prompt-len", required_argument, 0, 'p'}, {"num-prompts", required_argument, 0, 'k'},
        {"depths", required_argument, 0, 'D'},    {"seed", required_argument, 0, 's'},
        {"tokenizer", required_argument, 0, 'z'}, {"max-new-tokens", required_argument, 0, 'n'},
        {"out", required_argument, 0, 'o'},       {"capture-chunk", required_argument, 0, 'c'},
        {"page-size", required_argument, 0, 'P'}, {"state-dtype", required_argument, 0, 'd'},
        {"threads", required_argument, 0, 't'},   {"cp-layout", required_argument, 0, 'l'},
        {"cp-wave", required_argument, 0, 'W'},
        {"ep", required_argument, 0, 'e'},        {"quiet", no_argument, 0, 'q'},
        {"lora-alpha", required_argument, 0, 'A'}, {"help", no_argument, 0, 'h'},
        {"backend", required_argument, 0, 'B'},   {"force", no_argument, 0, 'F'},
        {0, 0, 0, 0}};
    const char *c = "eval", *model = NULL, *adapter = NULL, *task = "passkey", *hay = NULL, *tokenizer = NULL,
               *out = NULL, *backend = NULL;
    ls_eval_opts o;
    ls_eval_opts_default(&o);
    int64_t threads = 0, v, epn = 1;
    double alpha = 0;
    int quiet = 0, ch, force = 0;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        ls_status ps = LS_OK;
        switch (ch) {
        case 'm': model = optarg; break;
        case 'a': adapter = optarg; break;
        case 'F': force = 1; break;
        case 'T': task = optarg; break;
        case 'H': hay = optarg; break;
        case 'p': ps = ls_eval_parse_lengths(&o, optarg); break;
        case 'D': ps = ls_eval_parse_depths(&o, optarg); break;
        case 'k': if (cli_parse_i64(c, "--num-prompts", optarg, 1, 1 << 20, &o.num_prompts)) return 2; break;
        case 's':
            if (cli_parse_i64(c, "--seed", optarg, 0, INT64_MAX, &v)) return 2;
            o.seed = (uint64_t)v;
            break;
        case 'z': tokenizer = optarg; break;
        case 'n': if (cli_parse_i64(c, "--max-new-tokens", optarg, 1, 1 << 16, &o.max_new_tokens)) return 2; break;
        case 'o': out = optarg; break;
        case 'c':
            if (cli_parse_i64(c, "--capture-chunk", optarg, 1, 1 << 24, &v)) return 2;
            o.so.fwd.capture_chunk = v;
            break;
        case 'P':
            if (cli_parse_i64(c, "--page-size", optarg, 1, 1 << 20, &v)) return 2;
            o.so.page_size = v;
            break;
        case 'd': if (cli_parse_dtype(c, "--state-dtype", optarg, &o.so.state_dtype)) return 2; break;
        case 't': if (cli_parse_i64(c, "--threads", optarg, 1, 4096, &threads)) return 2; break;
        case 'B': backend = optarg; break;
        case 'l': if (cli_parse_layout(c, optarg, &o.so.fwd.cp_layout)) return 2; break;
        case 'W': if (cli_parse_i64(c, "--cp-wave", optarg, 1, (int64_t)1 << 40, &o.so.fwd.cp_wave)) return 2; break;
        case 'e': if (cli_parse_i64(c, "--ep", optarg, 1, 4096, &epn)) return 2; break;
        case 'q': quiet = 1; break;
        case 'A': if (cli_parse_f64(c, "--lora-alpha", optarg, 1e-9, 1e9, &alpha)) return 2; break;
        case 'h': help(); return 0;
        default: return cli_usage_error(c, "bad option");
        }
        if (ps != LS_OK) return cli_usage_error(c, "%s", ls_err_msg());
    }
    if (optind < argc) return cli_usage_error(c, "unexpected argument \"%s\"", argv[optind]);
    if (!model) return cli_usage_error(c, "--model is required");
    if (ls_task_parse(&o.task, task, hay) != LS_OK)
        return cli_usage_error(c, "%s: %s", hay && strstr(ls_err_msg(), "haystack") ? "--haystack" : "--task", ls_err_msg());
    ls_set_threads((int)threads);
    {
        const char *in[] = {model, adapter, tokenizer};
        ls_status cs = ls_check_same_inputs(cli_cp_comm(), argc, argv, in, 3);
        if (cs != LS_OK) return cli_fail(c, cs);
    }
    const ls_comm *ep = NULL;
    if (cli_parallel(c, epn, &o.so.fwd.comm, &ep)) return 2;
    ls_progress_enable(!quiet && cli_rank() == 0);
    o.progress = 1;

    const ls_backend *be;
    ls_status bs = ls_backend_open(backend, &be);
    if (bs != LS_OK) return cli_fail(c, bs);
    ls_arenas ar;
    ls_arenas_init(&ar);
    ls_arenas_set_backend(&ar, be);
    ls_model m;
    ls_policy pol;
    memset(&pol, 0, sizeof pol);
    ls_tokenizer *tok = NULL;
    ls_eval_result res;
    memset(&res, 0, sizeof res);
    const ls_model *run = &m;
    ls_status s;
    if (adapter && alpha == 0) alpha = adapter_alpha(adapter);
    if (adapter) { /* the base with the adapters, as training runs it */
        ls_policy_spec spec = {.model_dir = model, .adapter = adapter, .lora_alpha = alpha, .ep = ep};
        s = ls_policy_open(&pol, &spec, &ar);
        run = &pol.policy;
    } else {
        s = ls_model_load(&m, model, ep, &ar.a[LS_ARENA_FIXED]);
    }
    if (s == LS_OK) s = ls_tok_load_for_model(&tok, tokenizer, ls_model_config(run)->vocab);
    for (int l = 0; s == LS_OK && !force && l < o.n_lengths; l++) /* before anything sized by a prompt */
        s = ls_check_fits_eval(run, &o.so, o.lengths[l] + o.max_new_tokens, ar.a[LS_ARENA_FIXED].peak);
    if (s == LS_OK) s = ls_eval_run(run, tok, &o, &ar, &res);
    int rc = 0;
    if (s != LS_OK) {
        rc = cli_fail(c, s);
    } else if (cli_rank() == 0) { /* one document: on stdout and, with --out, in the file */
        char *text = ls_eval_json(&res, &o, model);
        if (!text) s = LS_ERR_NOMEM;
        if (text) fputs(text, stdout), fflush(stdout);
        if (text && out) s = ls_write_file_atomic(out, text, strlen(text));
        free(text);
        if (s != LS_OK) rc = cli_fail(c, s);
        if (!quiet && rc == 0)
            fprintf(stderr, "longstraw eval: exact match %.3f (score %.3f) over %lld prompts in %.1fs\n",
                    res.exact_match, res.score, (long long)res.n, res.seconds);
    }
    ls_eval_result_free(&res);
    if (adapter) ls_policy_close(&pol);
    ls_tok_free(tok);
    ls_arenas_free(&ar);
    ls_backend_close(be);
    return rc;
}
