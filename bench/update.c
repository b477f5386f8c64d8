/*
 * bench/update.c — one GRPO update (capture → score → replay → AdamW) by LongStraw
 * in prefix-frozen mode, in full mode (the exact gradient through the prompt: dState,
 * checkpoints, reverse sweep) and in the naive mode (each member's whole sequence
 * under a tape), side by side in one run, on the small hybrid config (hidden 512,
 * 8 layers, 2 full attention, vocab 4096). Each configuration runs in a forked child
 * so that its peak RSS is its own; peaks are reported both as the arenas' accounting
 * and as process RSS. The naive mode keeps one member's graph at a time, so its
 * memory does not depend on G: it runs only for the G of --naive-groups.
 *
 *   build/bench/update [--prompts 1024,4096,16384,32768] [--groups 2,8] [--response 128]
 *                      [--no-naive-above P] [--naive-groups 2,8] [--no-full]
 *                      [--sweep-chunk N] [--threads N] [--family hybrid|mla]
 *
 * --family mla: the small MLA + DSA + MoE config of bench_model.h instead.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_model.h"
#include "longstraw/grpo.h"

static const char *cfg = BENCH_SMALL_DENSE; /* bench_model.h */

typedef struct {
    double seconds;
    double arena_bytes; /* sum of arena peaks */
    double rss;
    int ok;
} result;

/* mode 0: prefix-frozen, 1: full, 2: naive (prefix-frozen graph) */
static result run_one(const char *dir, int64_t P, int G, int64_t R, int mode, int64_t sweep) {
    int fd[2];
    result res = {0, 0, 0, 0};
    if (pipe(fd) != 0) return res;
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        ls_arenas ar;
        ls_arenas_init(&ar);
        ls_policy pol;
        ls_adamw adam;
        result r = {0, 0, 0, 0};
        ls_policy_spec spec = {.model_dir = dir};
        if (ls_policy_open(&pol, &spec, &ar) == LS_OK && ls_adamw_init(&adam, &pol, &ar.a[LS_ARENA_FIXED]) == LS_OK) {
            ls_group g;
            memset(&g, 0, sizeof g);
            g.P = P;
            g.G = G;
            g.prompt = malloc((size_t)P * sizeof(int32_t));
            g.resp = calloc((size_t)G, sizeof(int32_t *));
            g.R = calloc((size_t)G, sizeof(int64_t));
            g.rewards = calloc((size_t)G, sizeof(double));
            ls_rng rng;
            ls_rng_seed(&rng, (uint64_t)P);
            for (int64_t t = 0; t < P; t++) g.prompt[t] = (int32_t)(ls_rng_u64(&rng) % 4096u);
            for (int i = 0; i < G; i++) {
                g.R[i] = R;
                g.resp[i] = malloc((size_t)R * sizeof(int32_t));
                for (int64_t t = 0; t < R; t++) g.resp[i][t] = (int32_t)(ls_rng_u64(&rng) % 4096u);
                g.rewards[i] = (double)(i % 3);
            }
            ls_grpo_opts o;
            ls_grpo_opts_default(&o);
            o.no_capture = mode == 2;
            o.full = mode == 1;
            o.sweep_chunk = sweep;
            o.state_dtype = LS_DTYPE_BF16;
            ls_grpo_metrics mt;
            double t0 = ls_now();
            if (ls_grpo_update(&pol, &adam, &g, &o, &ar, &mt) == LS_OK) {
                r.seconds = ls_now() - t0;
                for (int a = 0; a < LS_ARENA_COUNT; a++) r.arena_bytes += (double)ar.a[a].peak;
                r.rss = (double)ls_peak_rss_bytes();
                r.ok = 1;
            } else {
                fprintf(stderr, "update: %s\n", ls_err_msg());
            }
        }
        if (write(fd[1], &r, sizeof r) != (ssize_t)sizeof r) _exit(1);
        _exit(0);
    }
    close(fd[1]);
    if (read(fd[0], &res, sizeof res) != (ssize_t)sizeof res) res.ok = 0;
    close(fd[0]);
    int st;
    waitpid(pid, &st, 0);
    return res;
}

int main(int argc, char **argv) {
    ls_runtime_setup(argv);
    static const struct option opts[] = {{"prompts", required_argument, 0, 'p'}, {"groups", required_argument, 0, 'g'},
                                         {"response", required_argument, 0, 'r'}, {"no-naive-above", required_argument, 0, 'n'},
                                         {"threads", required_argument, 0, 't'}, {"help", no_argument, 0, 'h'},
                                         {"naive-groups", required_argument, 0, 'N'}, {"no-full", no_argument, 0, 'F'},
                                         {"sweep-chunk", required_argument, 0, 's'}, {"family", required_argument, 0, 'f'},
                                         {0, 0, 0, 0}};
    char prompts[256] = "1024,4096,16384,32768", groups[64] = "2,8", ngroups[64] = "2,8";
    int64_t R = 128, naive_max = INT64_MAX, sweep;
    int threads = 0, ch, no_full = 0;
    {
        ls_grpo_opts d;
        ls_grpo_opts_default(&d);
        sweep = d.sweep_chunk;
    }
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case 'p': snprintf(prompts, sizeof prompts, "%s", optarg); break;
        case 'g': snprintf(groups, sizeof groups, "%s", optarg); break;
        case 'r': R = atoll(optarg); break;
        case 'n': naive_max = atoll(optarg); break;
        case 't': threads = atoi(optarg); break;
        case 'N': snprintf(ngroups, sizeof ngroups, ",%s,", optarg); break;
        case 'F': no_full = 1; break;
        case 's': sweep = atoll(optarg); break;
        case 'f':
            if (strcmp(optarg, "hybrid") && strcmp(optarg, "mla")) {
                fprintf(stderr, "update: --family hybrid|mla\n");
                return 2;
            }
            cfg = strcmp(optarg, "mla") ? BENCH_SMALL_DENSE : BENCH_SMALL_MLA;
            break;
        case 'h':
            printf("usage: update [--prompts P,...] [--groups G,...] [--response R] [--no-naive-above P]\n"
                   "              [--naive-groups G,...] [--no-full] [--sweep-chunk N] [--threads N]\n"
                   "              [--family hybrid|mla]\n");
            return 0;
        default: return 2;
        }
    }
    if (R < 1 || sweep < 1) {
        fprintf(stderr, "update: --response and --sweep-chunk must be >= 1\n");
        return 2;
    }
    if (ngroups[0] != ',') { /* the default: every G */
        char t[64];
        snprintf(t, sizeof t, ",%s,", ngroups);
        snprintf(ngroups, sizeof ngroups, "%s", t);
    }
    ls_set_threads(threads);
    char dir[] = "/tmp/ls_bench_update_XXXXXX";
    /* the runs are forked children: nothing here may start OpenMP's thread pool first */
    if (bench_write_model_forked("update", dir, cfg, LS_DTYPE_BF16)) return 1;
    bench_print_blas_forked();
    printf("GRPO update, small %s config, R = %lld, %d threads, bf16 prompt pages, full mode's sweep chunk %lld\n",
           strstr(cfg, "glm_moe_dsa") ? "MLA + DSA + MoE" : "hybrid", (long long)R, ls_get_threads(), (long long)sweep);
    printf("| P | G | prefix-frozen s | full s | full / prefix-frozen time | naive s | prefix-frozen RSS MiB | "
           "full RSS MiB | full / prefix-frozen RSS | naive RSS MiB | naive / full RSS | prefix-frozen arenas MiB | "
           "full arenas MiB | naive arenas MiB |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    char pcopy[256];
    snprintf(pcopy, sizeof pcopy, "%s", prompts);
    const double MiB = 1024.0 * 1024.0;
    for (char *sp = NULL, *tp = strtok_r(pcopy, ",", &sp); tp; tp = strtok_r(NULL, ",", &sp)) {
        int64_t P = atoll(tp);
        char gcopy[64];
        snprintf(gcopy, sizeof gcopy, "%s", groups);
        for (char *sg = NULL, *tg = strtok_r(gcopy, ",", &sg); tg; tg = strtok_r(NULL, ",", &sg)) {
            int G = atoi(tg);
            char key[32];
            snprintf(key, sizeof key, ",%d,", G);
            result a = run_one(dir, P, G, R, 0, sweep);
            result f = no_full ? (result){0, 0, 0, 0} : run_one(dir, P, G, R, 1, sweep);
            result b = P <= naive_max && strstr(ngroups, key) ? run_one(dir, P, G, R, 2, sweep) : (result){0, 0, 0, 0};
            char fs[32] = "–", ft[32] = "–", fr[32] = "–", frr[32] = "–", fa[32] = "–";
            char ns[32] = "–", nr[32] = "–", nfr[32] = "–", na[32] = "–";
            if (f.ok) {
                snprintf(fs, sizeof fs, "%.2f", f.seconds);
                snprintf(ft, sizeof ft, "%.2f×", f.seconds / a.seconds);
                snprintf(fr, sizeof fr, "%.0f", f.rss / MiB);
                snprintf(frr, sizeof frr, "%.2f×", f.rss / a.rss);
                snprintf(fa, sizeof fa, "%.0f", f.arena_bytes / MiB);
            }
            if (b.ok) {
                snprintf(ns, sizeof ns, "%.2f", b.seconds);
                snprintf(nr, sizeof nr, "%.0f", b.rss / MiB);
                snprintf(na, sizeof na, "%.0f", b.arena_bytes / MiB);
                if (f.ok) snprintf(nfr, sizeof nfr, "%.1f×", b.rss / f.rss);
            }
            printf("| %lld | %d | %.2f | %s | %s | %s | %.0f | %s | %s | %s | %s | %.0f | %s | %s |\n", (long long)P, G,
                   a.seconds, fs, ft, ns, a.rss / MiB, fr, frr, nr, nfr, a.arena_bytes / MiB, fa, na);
            fflush(stdout);
        }
    }
    return bench_remove_model(dir);
}
