/*
 * cmd_train.c — `longstraw train`: its flags, a resume's saved flags, and the signals;
 * the loop itself is the library's (trainer.h, src/train/trainer.c).
 */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <sys/file.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_train.h"
#include "longstraw/eval.h"
#include "longstraw/files.h"
#include "longstraw/reward.h"
#include "longstraw/trace.h"
#include "longstraw/train_args.h"
#include "longstraw/trainer.h"

static void help(void) {
    printf("usage: longstraw train --model DIR --out RUN/ (--data FILE.jsonl | --rollout --task T |\n"
           "                        --loss sft --task T) [options]\n"
           "       longstraw train --resume RUN/ [options that override the saved ones]\n\n"
           "GRPO training: one transaction per update (capture each prompt once, score, replay\n"
           "each response under a tape, one AdamW call). Writes RUN/metrics.jsonl (one line per\n"
           "update, TRL's metric names), RUN/trace.<rank>.jsonl (see `longstraw report`),\n"
           "RUN/checkpoint-<U>/ (weights, optimizer state, data position; committed atomically)\n"
           "and RUN/receipt.json.\n\n"
           "data:\n"
           "  --model DIR            checkpoint directory (config.json + safetensors)\n"
           "  --out RUN              run directory (created; must not hold checkpoints unless --resume)\n"
           "  --data FILE            JSONL, one group per line: {\"prompt\": ids|text, \"responses\":\n"
           "                         [ids|text, ...], \"rewards\": [...]} (or \"advantages\"); with\n"
           "                         --rollout only \"prompt\" (and an optional \"answer\") is read\n"
           "  --tokenizer FILE       tokenizer.json for text (default with --task: plain bytes)\n"
           "  --updates N            number of updates (default: one pass over --data; 10 with --task)\n"
           "  --groups-per-update K  groups per update (default 1); the data wraps around\n"
           "  --seed N               sampling and task seed (default 0)\n"
           "  --no-validate          skip checking every line before the first update\n");
    printf("rollouts:\n"
           "  --rollout              sample the responses from the captured prompt state\n"
           "  --num-generations G    responses per prompt (default 8)\n"
           "  --max-new-tokens N     response length limit (default 32)\n"
           "  --top-p P              nucleus sampling mass (default 1); --temperature sets both the\n"
           "                         sampling and the scoring temperature (TRL semantics)\n"
           "  --stop LIST            stop tokens, ids or token strings, comma separated (default:\n"
           "                         <|endoftext|> and <|im_end|> when the tokenizer has them)\n"
           "  --task T               built-in prompts (RULER-like; held-out answers never drawn):\n"
           "                         passkey (one key in the haystack), multikey (four keys under\n"
           "                         words, one asked for), vartrack (a chain of assignments: every\n"
           "                         variable holding a value); exact-match reward, or T-shaped:\n"
           "                         partial credit (docs/architecture.md)\n"
           "  --haystack H           the task's haystack: repeat (filler sentences, default) or varied\n"
           "  --prompt-len N         task prompt length in tokens (default 16384)\n"
           "  --reward-cmd CMD       rewards from a process: one JSON line {\"prompt\",\"response\",\n"
           "                         \"index\",\"group\"} in, one number per line out\n"
           "  --reward-timeout S     seconds to wait for each answer (default 60)\n"
           "  (--loss sft with --task: each group is a task prompt with its answer as the one\n"
           "                         response: long-context retrieval SFT, no rollouts)\n"
           "held-out evaluation (metrics.jsonl \"eval/nll\": mean NLL per response token;\n"
           "\"eval/exact_match\", \"eval/score\", \"eval/exact_match/<L>\": greedy answers, as `longstraw eval`):\n"
           "  --eval-data FILE       held-out JSONL groups (responses; rewards are not needed)\n"
           "  --eval-lines N         with --task: N held-out items from their own seed\n"
           "  --eval-prompts K       with --task: K held-out prompts per length, answered greedily\n"
           "                         (default 16 when --eval-every is given with --task, else 0)\n"
           "  --eval-prompt-len L    their prompt lengths, N[,N...] (default --prompt-len)\n"
           "  --eval-every N         evaluate before the first update and after every N-th (default 1)\n"
           "checkpoints and output:\n"
           "  --save-every N         checkpoint every N updates (default 50; the last is always saved)\n"
           "  --save-total-limit K   keep the newest K checkpoints (default 2)\n"
           "  --resume RUN           continue from RUN's newest checkpoint with the saved flags\n"
           "                         (Ctrl-C or SIGTERM: a capture stops at its next chunk, else the\n"
           "                         update in flight finishes; the finished updates are checkpointed\n"
           "                         and the status is 130 / 143; under mpirun every rank stops at once)\n"
           "  --quiet                no progress bar\n"
           "  --trace-layers N       layer events in the trace for the first N updates of this\n"
           "                         process (default 3; -1 every update; phases are always traced)\n"
           "  --help                 this text\n\n");
    cli_train_help();
}

typedef ls_train_args train_args; /* the library's table and parser (train_args.h) */

enum { O_RUN = 2000, O_HELP = 3000 };

static int parse_args(train_args *a, int argc, char **argv) {
    struct option opts[96];
    int n = 0;
    LS_ASSERT(ls_run_flag_count + cli_train_n_options + 1 < 96, "option table too small");
    for (int i = 0; i < ls_run_flag_count; i++)
        opts[n++] = (struct option){ls_run_flag_table[i].name,
                                    ls_run_flag_table[i].takes_value ? required_argument : no_argument, 0, O_RUN + i};
    opts[n++] = (struct option){"help", no_argument, 0, O_HELP};
    for (int i = 0; i < cli_train_n_options; i++) opts[n++] = cli_train_option(i);
    opts[n] = (struct option){0, 0, 0, 0};
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (ch == O_HELP || ch == 'h') {
            help();
            return 1;
        }
        if (ch >= O_RUN && ch < O_RUN + ls_run_flag_count) {
            int known = 0;
            const char *name = ls_run_flag_table[ch - O_RUN].name;
            if (ls_train_args_set(a, name, optarg, &known) != LS_OK) {
                /* the task's and lengths' own messages read as usage errors, the numbers' as before */
                if (!strcmp(name, "task") || !strcmp(name, "haystack") || !strcmp(name, "eval-prompt-len"))
                    return cli_usage_error("train", "%s", ls_err_msg());
                fprintf(stderr, "longstraw train: %s\n", ls_err_msg());
                return 2;
            }
            continue;
        }
        int r = ch == '?' ? -1 : cli_train_parse("train", &a->t, ch, optarg);
        if (r == 2) return 2;
        if (r < 0) return cli_usage_error("train", "bad option");
    }
    if (optind < argc) return cli_usage_error("train", "unexpected argument \"%s\"", argv[optind]);
    return 0;
}

static void args_default(train_args *a) { ls_train_args_default(a); }

/* Ctrl-C / SIGTERM on one rank: said at once on stderr; a capture stops at its next
 * chunk, anything else finishes the update in flight; then a checkpoint of the
 * finished updates, and exit 128 + signal. A second signal says so, ends the reward
 * process and takes the default action (the last checkpoint is still intact). Under
 * CP main.c's handler applies instead (every rank ends at once, naming the phase). */
static volatile sig_atomic_t stop_requested;
static void say(const char *m) {
    ssize_t w = write(2, m, strlen(m));
    (void)w;
}
static void on_stop(int sig) {
    if (!stop_requested) {
        stop_requested = sig;
        ls_request_stop(sig);
        say("longstraw train: signal received: stopping at the next capture chunk or after this update, then a "
            "checkpoint (send it again to stop at once)\n");
        return;
    }
    say("longstraw train: second signal: stopping now, with the reward process; the last checkpoint is intact\n");
    /* SIGTERM to its process group, SIGKILL after a grace period: one that ignores
     * SIGTERM does not outlive us */
    ls_reward_cmd_kill_group(ls_train_reward_pgid(), LS_REWARD_KILL_GRACE_S);
    signal(sig, SIG_DFL);
    raise(sig);
    _exit(128 + sig); /* as PID 1 (a container's init) a signal at its default action is ignored */
}

static int check_flags(train_args *a) {
    if (ls_train_args_check(a) != LS_OK) return cli_usage_error("train", "%s", ls_err_msg());
    return 0;
}

static int run_train(int argc, char **argv) {
    train_args a;
    args_default(&a);
    int r = parse_args(&a, argc, argv);
    if (r) return r == 1 ? 0 : r;
    int nargc = 0;
    char **nargv = NULL;
    if (a.resume) { /* the saved flags first, then the given ones */
        ls_status s = ls_train_saved_args(a.resume, argc, argv, &nargc, &nargv);
        if (s != LS_OK) return cli_fail("train", s);
        const char *resume = a.resume;
        args_default(&a);
        if ((r = parse_args(&a, nargc, nargv))) return r == 1 ? 0 : r;
        if (ls_train_same_run(resume, a.r.out) != LS_OK) return cli_usage_error("train", "%s", ls_err_msg());
        a.r.out = resume;
    }
    if ((r = check_flags(&a))) return r;
    { /* under mpirun: every rank the same (saved and given) flags and the same files */
        const char *in[] = {a.r.model, a.r.data, a.r.eval_data, a.r.tokenizer, a.t.ref_model, a.t.adapter};
        ls_status s = ls_check_same_inputs(cli_cp_comm(), a.resume ? nargc : argc, a.resume ? nargv : argv, in,
                                           (int)(sizeof in / sizeof in[0]));
        if (s != LS_OK) {
            r = cli_fail("train", s);
            for (int i = 0; i < nargc; i++) free(nargv[i]);
            free(nargv);
            return r;
        }
    }
    if (cli_train_finish("train", &a.t)) return 2;
    if (a.t.state_on_host) { /* rollouts decode from forks of the state: not staged */
        fprintf(stderr, "longstraw train: --state-on host is built for grad, step and logprobs; train keeps the "
                        "prompt state on the device (drop the flag)\n");
        return 2;
    }
    ls_progress_enable(!a.quiet && cli_rank() == 0);
    ls_train_opts o;
    ls_train_args_opts(&a, a.resume ? nargc : argc, a.resume ? nargv : argv, &o);
    stop_requested = 0;
    ls_clear_stop();
    if (!cli_cp_comm()) { /* under CP main.c's handler ends every rank at once */
        signal(SIGINT, on_stop);
        signal(SIGTERM, on_stop);
    }
    ls_train_result res;
    ls_status s = ls_train_run(&o, &res);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    int rc = s != LS_OK ? cli_fail("train", s) : res.stop_signal ? 128 + res.stop_signal : 0;
    for (int i = 0; i < nargc; i++) free(nargv[i]);
    free(nargv);
    return rc;
}

int cmd_train(int argc, char **argv) { return run_train(argc, argv); }
