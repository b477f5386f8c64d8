/*
 * main.c — the `longstraw` tool: dispatch to one file per command.
 */
#include <errno.h>
#include <signal.h>
#include <unistd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "longstraw/flags.h"
#include "longstraw/files.h"
#include "longstraw/reward.h"
#include "longstraw/trace.h"
#include "longstraw/trainer.h"
#include "longstraw/runtime.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"init", cmd_init, "write a random checkpoint (config.json + model.safetensors)"},
    {"logprobs", cmd_logprobs, "per-token log-probs of a group's responses (capture + continuation)"},
    {"plan", cmd_plan, "predict the prompt-state inventory per layer kind and rank"},
    {"grad", cmd_grad, "gradient of the GRPO loss over a group (no step)"},
    {"step", cmd_step, "one GRPO update: capture, score, replay, AdamW; writes the new checkpoint"},
    {"train", cmd_train, "the training loop: JSONL groups or rollouts, checkpoints, resume, metrics"},
    {"eval", cmd_eval, "held-out exact match of a checkpoint on a built-in task, by prompt length and depth"},
    {"report", cmd_report, "receipt table of a run and RUN/memory.svg (live bytes per arena over time)"},
    {"demo", cmd_demo, "a small model learns a 16K-token passkey task: GRPO with rollouts, held-out exact match"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: longstraw <command> [options]    (longstraw <command> --help for details)\n\n"
               "LongStraw: long-context GRPO with a captured prompt state.\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
}

static int run(int argc, char **argv);

/* What a command printed reached its destination: a write error on stdout (a full disk,
 * a closed file) fails the command, naming stdout, instead of a cut or empty document
 * with exit 0. fflush and fclose are checked too: a buffered write fails only there. */
static int stdout_checked(const char *cmd, int rc) {
    errno = 0;
    int flush = fflush(stdout), e = errno, err = ferror(stdout);
    int closed = fclose(stdout);
    if (closed != 0 && !flush) e = errno;
    if (rc != 0 || (!flush && !err && !closed)) return rc;
    if (!cmd || !strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help") || !strcmp(cmd, "--version"))
        cmd = "longstraw";
    fprintf(stderr, "longstraw %s: writing the output to stdout failed (%s): the output is incomplete\n",
            cmd, e ? strerror(e) : "a write error");
    return 1;
}

/* Under CP a signal ends this rank at once, saying which rank and in which phase:
 * mpirun sends SIGTERM to every rank when one fails or is killed, and an update cannot
 * finish without all of them. Checkpoints and outputs are written atomically by rank
 * 0 after every phase, so nothing partial is left; a resumed run continues from the
 * last complete checkpoint. Only async-signal-safe calls here. */
static int fault_rank, fault_size;
/* what to do next, by command: only train (and the demo's train) has --resume */
static const char *fault_advice = " (nothing partial was written: run the command again)";
static void put(const char *s) {
    ssize_t w = write(2, s, strlen(s));
    (void)w;
}
static void put_int(int v) {
    char b[16];
    int n = 0;
    if (v < 0) put("-"), v = -v;
    do b[sizeof b - 1 - n++] = (char)('0' + v % 10); while ((v /= 10) && n < 15);
    ssize_t w = write(2, b + sizeof b - n, (size_t)n);
    (void)w;
}
static void on_fault_signal(int sig) {
    put("longstraw: rank "), put_int(fault_rank), put(" of "), put_int(fault_size), put(": signal "), put_int(sig);
    put(" in phase \""), put(ls_trace_current_phase()), put("\": ending this rank"), put(fault_advice), put("\n");
    /* rank 0's reward process, if any: one that ignores SIGTERM does not outlive us */
    ls_reward_cmd_kill_group(ls_train_reward_pgid(), 0.5);
    _exit(128 + sig);
}

static int report(const char *cmd, ls_status s) {
    if (s == LS_OK) return 0;
    fprintf(stderr, "longstraw %s: %s\n", cmd, ls_err_msg());
    return 1;
}

int cli_parse_i64(const char *cmd, const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    return report(cmd, ls_flag_i64(flag, s, lo, hi, out));
}

int cli_parse_dtype(const char *cmd, const char *flag, const char *s, ls_dtype *out) {
    return report(cmd, ls_flag_dtype(flag, s, out));
}

int cli_parse_mode(const char *cmd, const char *s, int *full) { return report(cmd, ls_flag_mode(s, full)); }

int cli_parse_layout(const char *cmd, const char *s, ls_cp_layout *out) { return report(cmd, ls_flag_layout(s, out)); }

int cli_rank(void) {
    ls_comm *w = ls_comm_world();
    return w ? ls_comm_rank(w) : 0;
}

const ls_comm *cli_cp_comm(void) {
    ls_comm *w = ls_comm_world();
    return w && ls_comm_size(w) > 1 ? w : NULL;
}

int cli_parallel(const char *cmd, int64_t ep, const ls_comm **cp, const ls_comm **epc) {
    *cp = cli_cp_comm(), *epc = NULL;
    if (ep <= 1) return 0;
    static ls_comm *cpc, *epg; /* for the process's lifetime */
    ls_status s = ls_comm_parallel(ls_comm_world(), ep, &cpc, &epg);
    if (s == LS_ERR_ARG) return cli_usage_error(cmd, "%s", ls_err_msg());
    if (s != LS_OK) return cli_fail(cmd, s);
    *cp = ls_comm_size(cpc) > 1 ? cpc : NULL;
    *epc = epg;
    return 0;
}

int cli_fail(const char *cmd, ls_status s) {
    const ls_comm *cp = cli_cp_comm();
    if (!cp) {
        fprintf(stderr, "longstraw %s: %s: %s\n", cmd, ls_status_name(s), ls_err_msg());
        return 1;
    }
    /* under CP the other ranks wait in a collective for this one: end them all, saying
     * where (outputs are written by rank 0 only after every phase, atomically) */
    fprintf(stderr, "longstraw %s: rank %d of %d failed in phase \"%s\": %s: %s; ending every rank\n", cmd,
            ls_comm_rank(cp), ls_comm_size(cp), ls_trace_current_phase(), ls_status_name(s), ls_err_msg());
    fflush(stderr);
    ls_comm_abort(cp, 1);
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "longstraw %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see longstraw %s --help)\n", cmd);
    va_end(ap);
    return 2;
}

int main(int argc, char **argv) {
    ls_runtime_setup(argv);
    /* MPI starts only under a launcher (mpirun sets these): a plain `longstraw` is one
     * rank without MPI_Init, so it starts fast and may launch mpirun itself (demo --cp) */
    ls_comm *world = NULL;
    int launched = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
    ls_status cs = launched ? ls_comm_init(&argc, &argv, &world) : LS_OK;
    if (cs != LS_OK) {
        fprintf(stderr, "longstraw: cannot start the communicator: %s\n", ls_err_msg());
        return 1;
    }
    if (world && ls_comm_size(world) > 1) {
        fault_rank = ls_comm_rank(world), fault_size = ls_comm_size(world);
        if (argc > 1 && !strcmp(argv[1], "train"))
            fault_advice = " (the run directory holds only complete checkpoints; continue with --resume)";
        else if (argc > 1 && !strcmp(argv[1], "demo"))
            fault_advice = " (the run directory holds only complete checkpoints; continue with longstraw train "
                           "--resume OUT/run)";
        signal(SIGTERM, on_fault_signal);
        signal(SIGINT, on_fault_signal);
        /* before any command's first collective: every rank the same program and command
         * line (the commands check their input files next), else every rank refuses */
        ls_status s = ls_check_same_inputs(world, argc, argv, NULL, 0);
        if (s != LS_OK) return cli_fail(argc > 1 ? argv[1] : "longstraw", s);
    }
    int rc = stdout_checked(argc > 1 ? argv[1] : "longstraw", run(argc, argv));
    ls_comm_finalize();
    return rc;
}

static int run(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("longstraw 0.1.0\n");
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "longstraw: unknown command \"%s\"\n\n", argv[1]);
    usage(stderr);
    return 2;
}
