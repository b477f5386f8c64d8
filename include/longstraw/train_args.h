/*
 * train_args.h — the flags of `longstraw train` (the loop's own: data, task, rollouts,
 * checkpoints, held-out evaluation) beside the training flags (flags.h), as a library
 * table: the CLI and the API (`ctx.train(...)` in Python) parse them alike. Errors are
 * ls_err messages naming the flag and value; nothing is printed.
 */
#ifndef LONGSTRAW_TRAIN_ARGS_H
#define LONGSTRAW_TRAIN_ARGS_H

#include "longstraw/flags.h"
#include "longstraw/trainer.h"

typedef struct {
    ls_train_opts r;
    const char *resume;
    int quiet;
    int eval_every_set;  /* eval-every given: with a task and no other held-out data, 16 task prompts */
    ls_train_flags t;    /* objective, optimizer, engine, what is trained */
} ls_train_args;

extern const ls_train_flag ls_run_flag_table[]; /* "model", "data", ... (help is the CLI's) */
extern const int ls_run_flag_count;

void ls_train_args_default(ls_train_args *a);
/* One flag of either table (name without dashes, '_' for '-'); *known = 0 when neither. */
ls_status ls_train_args_set(ls_train_args *a, const char *name, const char *value, int *known);
/* 1: flag `name` (either table) takes a value; 0: a switch; -1: not a flag of train. */
int ls_train_args_takes_value(const char *name);
/* argv[1..] as "--name value" / "--name=value" / "--switch" (argv[0] is the command). */
ls_status ls_train_args_parse(ls_train_args *a, int argc, char *const *argv);
/* The checks across flags (what `train` needs together) and the defaults that follow. */
ls_status ls_train_args_check(ls_train_args *a);
/* The loop's options from checked args; argc/argv: the command line to save in RUN. */
void ls_train_args_opts(const ls_train_args *a, int argc, char **argv, ls_train_opts *o);

#endif
