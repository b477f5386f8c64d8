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
#include "longstraw/trainer.h"

typedef struct {
    ls_grpo_opts o;
    const char *ref_model;
    int64_t threads;
    int eps_high_set;
    /* LoRA: --adapter FILE, or new adapters from --lora-rank/--lora-targets */
    const char *adapter;
    int64_t lora_rank;
    double lora_alpha;
    const char *lora_targets;
    int64_t lora_seed;
    int force; /* run even when the plan says it will not fit */
    int64_t ep;               /* --ep: expert-parallel degree (1: none) */
    const ls_comm *ep_comm;   /* its ranks (NULL: one) */
    const char *backend;      /* --backend (NULL: cpu) */
    int state_on_host;        /* --state-on host: the prompt state in host memory, staged per layer */
} cli_train;


extern const struct option cli_train_options[];
extern const int cli_train_n_options;

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
