/*
 * cmd_demo.c — `longstraw demo`: the main job on an embedded default. Writes the
 * starting model — the embedded SFT checkpoint (demo_asset.c: a small hybrid model
 * taught the passkey task at a short prompt), or random weights (--from-scratch; the
 * only choice for --family mla, the MLA + DSA + MoE family) — and the byte-level
 * tokenizer, runs GRPO updates with rollouts on the passkey task at a long prompt with
 * the held-out exact match measured before, during and after, then prints the receipt
 * table (`longstraw report`), the before/after numbers and where the pictures are.
 */
#define _XOPEN_SOURCE 700
#include <cjson/cJSON.h>
#include <errno.h>
#include <ftw.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "demo_asset.h"
#include "longstraw/config.h"
#include "longstraw/family.h"
#include "longstraw/tokenizer.h"

static const char MARKER[] = ".longstraw-demo";

static void help(void) {
    ls_demo_blob mb, cb;
    int have = ls_demo_sft(&mb, &cb);
    printf("usage: longstraw demo [options]\n\n"
           "A small model learns a long-context skill. Writes the starting model and a byte-level\n"
           "tokenizer into OUT/: %s.\n"
           "Then GRPO at a long prompt on the passkey task (a five-digit key hidden in a long\n"
           "haystack, asked for at the end; exact-match reward): each update captures one prompt,\n"
           "samples G responses from the captured state, scores and replays them. The held-out\n"
           "exact match (greedy answers to prompts whose keys training never draws) is measured\n"
           "before the first update, during and after. Prints the per-update reward, the receipt,\n"
           "the exact match before and after, and where the pictures are. Nothing is downloaded.\n\n",
           have ? "the embedded SFT checkpoint (a 4-layer hybrid, 2 Gated DeltaNet + 2 gated\n"
                  "attention layers, taught the task at 256- then 1024-token prompts; scripts/make-demo-sft.sh\n"
                  "reproduces it), or random weights with --from-scratch"
                : "random weights (this build has no embedded SFT checkpoint: assets/demo-sft.tar.xz\n"
                  "was missing; scripts/make-demo-sft.sh makes it)");
    printf("  --out DIR            demo directory (default longstraw-demo; rerunning replaces its run/)\n"
           "  --prompt-len N       prompt length in tokens (default 16384)\n"
           "  --updates N          GRPO updates (default 20)\n"
           "  --groups-per-update K  prompts per update (default 2; 1 from scratch)\n"
           "  --num-generations G  responses per prompt (default 8)\n"
           "  --max-new-tokens N   response length limit (default 8)\n"
           "  --lr LR              AdamW learning rate (default 1e-3)\n"
           "  --eval-prompts K     held-out prompts per evaluation (default 12; 0: none)\n"
           "  --eval-every N       evaluate after every N-th update too (default 10)\n"
           "  --seed N             model, task and sampling seed (default 1)\n"
           "  --threads N          worker threads per rank (default: all cores, over the ranks)\n"
           "  --from-scratch       start from random weights (shaped reward: a random model never\n"
           "                       hits a key, so exact match would give no gradient)\n"
           "  --family F           hybrid (default: Gated DeltaNet + gated attention, Qwen3-Next\n"
           "                       layout) or mla (MLA + DSA indexer + MoE, GLM-5.2 layout; from\n"
           "                       scratch)\n"
           "  --cp N               context parallelism over N ranks: runs itself under mpirun -np N\n"
           "                       (the same as `mpirun -np N longstraw demo`; default 1)\n"
           "  --quiet              no progress bar\n"
           "  --help               this text\n\n"
           "Afterwards: longstraw train --help for the real loop (this demo is a `train` call),\n"
           "longstraw eval --help to measure a checkpoint, scripts/recipe.sh for the whole recipe.\n");
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static ls_status prepare_dir(const char *out) {
    char marker[4200], run[4200];
    snprintf(marker, sizeof marker, "%s/%s", out, MARKER);
    snprintf(run, sizeof run, "%s/run", out);
    struct stat st;
    if (stat(out, &st) == 0) {
        if (access(marker, F_OK) != 0)
            return ls_err(LS_ERR_ARG, "%s exists and is not a demo directory (no %s): choose another --out", out, MARKER);
        if (stat(run, &st) == 0 && nftw(run, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
            return ls_err(LS_ERR_IO, "%s: cannot remove the previous run: %s", run, strerror(errno));
    } else if (mkdir(out, 0755) != 0) {
        return ls_err(LS_ERR_IO, "%s: cannot create: %s", out, strerror(errno));
    }
    return ls_write_file_atomic(marker, "longstraw demo directory: `longstraw demo` may replace run/\n", 60);
}

/* OUT/model (the embedded SFT checkpoint, or random weights), OUT/demo_config.json,
 * OUT/tokenizer.json. */
/* The family of the embedded SFT checkpoint (NULL: this build has none). */
static const ls_family *embedded_family(void) {
    ls_demo_blob mb, cb;
    if (!ls_demo_sft(&mb, &cb)) return NULL;
    char *text = malloc(cb.len + 1);
    if (!text) return NULL;
    memcpy(text, cb.data, cb.len);
    text[cb.len] = 0;
    ls_config cfg;
    const ls_family *f = ls_config_parse(&cfg, text, "the demo's embedded config.json") == LS_OK
                             ? ls_family_for(&cfg, "the demo's embedded config.json")
                             : NULL;
    free(text);
    return f;
}

static ls_status write_inputs(const char *out, uint64_t seed, const ls_family *fam, int scratch) {
    char path[4400], model[4200];
    snprintf(model, sizeof model, "%s/model", out);
    if (mkdir(model, 0755) != 0 && errno != EEXIST) return ls_err(LS_ERR_IO, "%s: cannot create: %s", model, strerror(errno));
    ls_demo_blob mb, cb;
    if (!scratch && ls_demo_sft(&mb, &cb)) {
        snprintf(path, sizeof path, "%s/demo_config.json", out);
        LS_TRY(ls_write_file_atomic(path, cb.data, cb.len));
        snprintf(path, sizeof path, "%s/config.json", model);
        LS_TRY(ls_write_file_atomic(path, cb.data, cb.len));
        snprintf(path, sizeof path, "%s/model.safetensors", model);
        LS_TRY(ls_write_file_atomic(path, mb.data, mb.len));
    } else {
        snprintf(path, sizeof path, "%s/demo_config.json", out);
        LS_TRY(ls_write_file_atomic(path, fam->demo_config, strlen(fam->demo_config)));
        LS_TRY(fam->write_random(path, model, seed, LS_DTYPE_F32));
    }
    char *json;
    LS_TRY(ls_tok_byte_level_json(&json));
    snprintf(path, sizeof path, "%s/tokenizer.json", out);
    ls_status s = ls_write_file_atomic(path, json, strlen(json));
    free(json);
    return s;
}

/* What the run's metrics say: held-out exact match before the first update and after
 * the last, the mean reward over the first and the last k updates. */
typedef struct {
    double em_before, em_after, r_first, r_last;
    int k, n;
} demo_summary;

static void summarise(const char *run, demo_summary *d) {
    char path[4400];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    memset(d, 0, sizeof *d);
    d->em_before = d->em_after = -1;
    char *text = NULL;
    if (ls_read_file(path, &text, NULL) != LS_OK) return;
    double rw[4096];
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(o, "eval/exact_match_before");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "eval/exact_match");
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(o, "reward");
        if (cJSON_IsNumber(b)) d->em_before = b->valuedouble;
        if (cJSON_IsNumber(a)) d->em_after = a->valuedouble;
        if (cJSON_IsNumber(r) && d->n < 4096) rw[d->n++] = r->valuedouble;
        cJSON_Delete(o);
    }
    free(text);
    d->k = d->n >= 10 ? 5 : d->n / 2;
    for (int i = 0; i < d->k; i++) d->r_first += rw[i] / d->k, d->r_last += rw[d->n - d->k + i] / d->k;
}

/* --cp N: the same command under `mpirun -np N` (this binary, the flags but --cp). */
static int relaunch(int argc, char **argv, int n, int64_t threads) {
    const char *mpi = LS_MPIEXEC;
    if (!mpi[0]) {
        fprintf(stderr, "longstraw demo: --cp %d needs the MPI build (this longstraw was built without MPI)\n", n);
        return 2;
    }
    char self[4096], np[16], thr[32];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) return cli_fail("demo", ls_err(LS_ERR_IO, "cannot find this program: %s", strerror(errno)));
    self[len] = '\0';
    snprintf(np, sizeof np, "%d", n);
    /* each rank its share of the cores unless --threads says otherwise */
    int per = ls_num_cores() / n > 0 ? ls_num_cores() / n : 1;
    snprintf(thr, sizeof thr, "%lld", threads ? (long long)threads : (long long)per);
    char **av = calloc((size_t)argc + 16, sizeof *av);
    if (!av) return cli_fail("demo", LS_ERR_NOMEM);
    int k = 0;
    av[k++] = (char *)mpi, av[k++] = "--oversubscribe";
    if (geteuid() == 0) av[k++] = "--allow-run-as-root"; /* the user asked for the ranks; containers run as root */
    av[k++] = "-np", av[k++] = np, av[k++] = self, av[k++] = "demo";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--cp") || !strcmp(argv[i], "--threads")) {
            i++;
            continue;
        }
        if (!strncmp(argv[i], "--cp=", 5) || !strncmp(argv[i], "--threads=", 10)) continue;
        av[k++] = argv[i];
    }
    av[k++] = "--threads", av[k++] = thr;
    av[k] = NULL;
    fprintf(stderr, "longstraw demo: running under %s -np %d (%s threads per rank)\n", mpi, n, thr);
    fflush(stderr);
    execv(mpi, av);
    ls_status s = ls_err(LS_ERR_IO, "cannot run %s: %s", mpi, strerror(errno));
    free(av);
    return cli_fail("demo", s);
}

int cmd_demo(int argc, char **argv) {
    static const struct option opts[] = {
        {"out", required_argument, 0, 'o'},     {"prompt-len", required_argument, 0, 'p'},
        {"updates", required_argument, 0, 'u'}, {"num-generations", required_argument, 0, 'g'},
        {"max-new-tokens", required_argument, 0, 'n'}, {"lr", required_argument, 0, 'l'},
        {"seed", required_argument, 0, 's'},    {"threads", required_argument, 0, 't'},
        {"quiet", no_argument, 0, 'q'},         {"help", no_argument, 0, 'h'},
        {"cp", required_argument, 0, 'c'},     {"family", required_argument, 0, 'f'},
        {"from-scratch", no_argument, 0, 'S'}, {"eval-prompts", required_argument, 0, 'k'},
        {"eval-every", required_argument, 0, 'e'}, {"groups-per-update", required_argument, 0, 'G'},
        {0, 0, 0, 0}};
    const char *out = "longstraw-demo", *lr = NULL;
    int64_t plen = 16384, updates = 20, G = 8, maxnew = 8, seed = 1, threads = 0, cpn = 1, evk = 12, eve = 10, gpu = 0;
    int quiet = 0, ch, scratch = 0;
    const char *family = NULL;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case 'o': out = optarg; break;
        case 'p': if (cli_parse_i64("demo", "--prompt-len", optarg, 300, 1 << 24, &plen)) return 2; break;
        case 'u': if (cli_parse_i64("demo", "--updates", optarg, 1, 1 << 20, &updates)) return 2; break;
        case 'g': if (cli_parse_i64("demo", "--num-generations", optarg, 2, 1024, &G)) return 2; break;
        case 'n': if (cli_parse_i64("demo", "--max-new-tokens", optarg, 1, 1 << 16, &maxnew)) return 2; break;
        case 'l': lr = optarg; break;
        case 's': if (cli_parse_i64("demo", "--seed", optarg, 0, INT64_MAX, &seed)) return 2; break;
        case 't': if (cli_parse_i64("demo", "--threads", optarg, 1, 4096, &threads)) return 2; break;
        case 'q': quiet = 1; break;
        case 'c': if (cli_parse_i64("demo", "--cp", optarg, 1, 4096, &cpn)) return 2; break;
        case 'S': scratch = 1; break;
        case 'k': if (cli_parse_i64("demo", "--eval-prompts", optarg, 0, 1 << 16, &evk)) return 2; break;
        case 'e': if (cli_parse_i64("demo", "--eval-every", optarg, 1, 1 << 20, &eve)) return 2; break;
        case 'G': if (cli_parse_i64("demo", "--groups-per-update", optarg, 1, 1024, &gpu)) return 2; break;
        case 'f':
            if (!ls_family_named(optarg)) return cli_usage_error("demo", "--family: %s", ls_err_msg());
            family = optarg;
            break;
        case 'h': help(); return 0;
        default: return cli_usage_error("demo", "bad option");
        }
    }
    if (optind < argc) return cli_usage_error("demo", "unexpected argument \"%s\"", argv[optind]);
    ls_demo_blob mb, cb;
    const ls_family *emb = embedded_family(), *fam = family ? ls_family_named(family) : emb ? emb : ls_family_named(NULL);
    if (!fam) return cli_fail("demo", LS_ERR_UNSUPPORTED);
    if (!ls_demo_sft(&mb, &cb) || fam != emb) scratch = 1; /* the embedded checkpoint is of one family */
    if (!lr) lr = "1e-3";
    if (!gpu) gpu = scratch ? 1 : 2; /* two prompts an update: half the prompt-to-prompt spread of the reward */
    const ls_comm *cp = cli_cp_comm();
    if (cpn > 1 && !cp) return relaunch(argc, argv, (int)cpn, threads);
    if (cpn > 1 && ls_comm_size(cp) != cpn)
        return cli_usage_error("demo", "--cp %lld inside a run of %d ranks", (long long)cpn, ls_comm_size(cp));
    int root = cli_rank() == 0;
    double t0 = ls_now();
    ls_status s = LS_OK;
    if (root) s = prepare_dir(out); /* rank 0 writes the inputs; the others wait for them */
    if (root && s == LS_OK) s = write_inputs(out, (uint64_t)seed, fam, scratch);
    if (s != LS_OK) return cli_fail("demo", s);
    if (cp && (s = ls_comm_barrier(cp)) != LS_OK) return cli_fail("demo", s);
    if (root)
        fprintf(stderr, "longstraw demo: model %s/model (4 layers: %s, %s), passkey prompts of %lld tokens, G = %lld, "
                        "%lld updates\n",
                out, scratch ? fam->demo_summary : LS_DEMO_SFT_SUMMARY,
                scratch ? "random weights" : "after SFT on the passkey task at 256- and 1024-token prompts",
                (long long)plen, (long long)G, (long long)updates);
    char model[4200], tok[4200], run[4200], s_plen[32], s_upd[32], s_g[32], s_n[32], s_seed[32], s_thr[32], s_k[32],
        s_e[32], s_gpu[32];
    snprintf(model, sizeof model, "%s/model", out);
    snprintf(tok, sizeof tok, "%s/tokenizer.json", out);
    snprintf(run, sizeof run, "%s/run", out);
    snprintf(s_plen, sizeof s_plen, "%lld", (long long)plen);
    snprintf(s_upd, sizeof s_upd, "%lld", (long long)updates);
    snprintf(s_g, sizeof s_g, "%lld", (long long)G);
    snprintf(s_n, sizeof s_n, "%lld", (long long)maxnew);
    snprintf(s_seed, sizeof s_seed, "%lld", (long long)seed);
    snprintf(s_thr, sizeof s_thr, "%lld", (long long)threads);
    snprintf(s_k, sizeof s_k, "%lld", (long long)evk);
    snprintf(s_e, sizeof s_e, "%lld", (long long)eve);
    snprintf(s_gpu, sizeof s_gpu, "%lld", (long long)gpu);
    char *targv[48];
    int k = 0;
    /* from scratch the exact-match reward is always 0 (no gradient): partial credit then */
    const char *fixed[] = {"train", "--model", model, "--tokenizer", tok, "--out", run, "--rollout",
                           "--task", scratch ? "passkey-shaped" : "passkey", "--prompt-len", s_plen,
                           "--num-generations", s_g, "--max-new-tokens", s_n, "--updates", s_upd, "--seed", s_seed,
                           "--lr", lr, "--save-every", s_upd, "--max-grad-norm", "1.0", "--groups-per-update", s_gpu};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) targv[k++] = (char *)fixed[i];
    if (evk > 0) targv[k++] = "--eval-prompts", targv[k++] = s_k, targv[k++] = "--eval-every", targv[k++] = s_e;
    if (threads) targv[k++] = "--threads", targv[k++] = s_thr;
    if (quiet) targv[k++] = "--quiet";
    targv[k] = NULL;
    int rc = cmd_train(k, targv);
    if (rc != 0 || !root) return rc;
    char *rargv[] = {"report", run, NULL};
    printf("\n");
    rc = cmd_report(2, rargv);
    if (rc != 0) return rc;
    demo_summary d;
    summarise(run, &d);
    printf("\nlongstraw demo: done in %.1fs.\n", ls_now() - t0);
    if (d.k > 0)
        printf("  reward       %.3f (mean of the first %d updates) -> %.3f (the last %d)%s\n", d.r_first, d.k, d.r_last,
               d.k, scratch ? " (shaped: partial credit for digits)" : " (exact match of the G samples of each prompt)");
    if (d.em_before >= 0 && d.em_after >= 0)
        printf("  held-out     exact match %.3f before -> %.3f after, at %lld-token prompts (%lld prompts whose keys\n"
               "               training never draws, answered greedily; %s/eval.svg by needle depth)\n",
               d.em_before, d.em_after, (long long)plen, (long long)evk, run);
    printf("  receipt      %s/receipt.json\n"
           "  metrics      %s/metrics.jsonl (one line per update, TRL names), %s/metrics.svg (curves)\n"
           "  trace        %s/trace.<rank>.jsonl (docs/trace.md)\n"
           "  memory       %s/memory.svg (live bytes per arena, phases marked; open in a browser)\n"
           "  checkpoint   %s/checkpoint-%lld/ (weights, optimizer state, data position)\n",
           run, run, run, run, run, run, (long long)updates);
    return 0;
}
