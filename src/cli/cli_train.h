/*
 * cli_train.h — flags shared by `grad` and `step` (objective, optimizer, engine).
 */
#ifndef LONGSTRAW_CLI_TRAIN_H
#define LONGSTRAW_CLI_TRAIN_H

#include <getopt.h>
#include <stdio.h>
#include <math.h>

#include "cli.h"
#include "longstraw/grpo.h"
#include "longstraw/flags.h"
#include "longstraw/trainer.h"

typedef ls_train_flags cli_train; /* the library's table and parser (flags.h) */

/* getopt entry of training flag i of ls_train_flag_table (cli_train_n_options of them) */
struct option cli_train_option(int i);
#define cli_train_n_options ls_train_flag_count

void cli_train_help(void);
void cli_train_init(cli_train *t);
/* 0: consumed; 2: bad value (message printed); −1: not a training flag. */
int cli_train_parse(const char *cmd, cli_train *t, int ch, const char *arg);
int cli_train_finish(const char *cmd, cli_train *t);
int cli_parse_f64(const char *cmd, const char *flag, const char *s, double lo, double hi, double *out);
/* What the flags say is trained (model_dir = model). */
ls_policy_spec cli_policy_spec(const char *model, const cli_train *t);
/* The trainable set of a grad/step command from its flags (trainer.h). */
ls_status cli_trainable_open(ls_trainable *p, const char *model, const cli_train *t, int with_adam, ls_arenas *ar);

#endif
