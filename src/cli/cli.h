/*
 * cli.h — shared helpers of the `longstraw` command-line tool: checked number
 * parsing (never silent clamping), error reporting, common flags.
 */
#ifndef LONGSTRAW_CLI_H
#define LONGSTRAW_CLI_H

#include <stdint.h>

#include "longstraw/comm.h"
#include "longstraw/core.h"
#include "longstraw/state.h"

int cmd_init(int argc, char **argv);
int cmd_logprobs(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_grad(int argc, char **argv);
int cmd_step(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_demo(int argc, char **argv);

/* Parse an integer flag value in [lo, hi]; prints "longstraw CMD: --flag: ..." and
 * returns nonzero on failure. */
int cli_parse_i64(const char *cmd, const char *flag, const char *s, int64_t lo, int64_t hi,
                  int64_t *out);
int cli_parse_dtype(const char *cmd, const char *flag, const char *s, ls_dtype *out);
/* --mode prefix-frozen|full (*full = 0 or 1) */
int cli_parse_mode(const char *cmd, const char *s, int *full);
/* --cp-layout contiguous|zigzag */
int cli_parse_layout(const char *cmd, const char *s, ls_cp_layout *out);
/* Print "longstraw CMD: <status>: <message>" and return exit code 1. Under CP
 * (several ranks) the message names the rank and the phase, and every rank ends. */
int cli_fail(const char *cmd, ls_status s);
/* This process's rank in the world (0 without MPI); rank 0 alone writes stdout and outputs. */
int cli_rank(void);
/* The world when it has several ranks (the CP degree is the world size), else NULL. */
const ls_comm *cli_cp_comm(void);
/* --ep N: the world split into CP groups (ranks r ≡ e mod N: the same experts) and EP
 * groups (ranks c·N .. c·N+N−1: the same prompt pages); *cp NULL with one CP rank,
 * *epc NULL when ep is 1. Nonzero (usage error printed) when the world does not split. */
int cli_parallel(const char *cmd, int64_t ep, const ls_comm **cp, const ls_comm **epc);
/* Print a usage error and return exit code 2. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* --state-on device|host: 0 device, 1 host, −1 (message printed) anything else */
int cli_parse_state_on(const char *cmd, const char *arg);

#endif
