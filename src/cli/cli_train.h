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
} cli_train;

extern const struct option cli_train_options[];
extern const int cli_train_n_options;

void cli_train_help(void);
void cli_train_init(cli_train *t);
/* 0: consumed; 2: bad value (message printed); −1: not a training flag. */
int cli_train_parse(const char *cmd, cli_train *t, int ch, const char *arg);
int cli_train_finish(const char *cmd, cli_train *t);
int cli_parse_f64(const char *cmd, const char *flag, const char *s, double lo, double hi, double *out);
/* The trainable set of a training command (family.h): the checkpoint's family opens
 * the policy (full fine-tune, or LoRA adapters on the frozen base), its gradients and
 * reference; the AdamW moments when wanted. */
typedef struct {
    ls_policy_spec spec;
    ls_policy p;
    ls_adamw adam;
    const ls_config *cfg; /* the policy's */
} cli_policy;
ls_status cli_policy_setup(cli_policy *p, const char *model, cli_train *t, int with_adam, ls_arenas *ar);
void cli_policy_close(cli_policy *p);
/* Refuse, before anything sized by P is allocated, an update whose predicted live
 * memory (the plan's prompt state per rank + fixed + gradients, times the ranks on
 * this machine) exceeds 90% of the machine's memory; the message gives the plan's
 * numbers and the machine's. t->force skips the check. */
ls_status cli_check_fits(const cli_policy *pol, const cli_train *t, int64_t P, int optimizer);
/* Close an open_memstream stream over (*buf, *len), write its text to `path`
 * atomically (ls_write_file_atomic) and free the buffer. */
ls_status cli_write_memstream(const char *path, FILE *f, char **buf, size_t *len);

/* The receipt: phases, arena peaks beside the M_live terms predicted from the config
 * (DESIGN §1), metrics, and the trainable tensors' hash on every rank. */
ls_status cli_write_receipt(const char *path, const char *cmd, const cli_policy *pol, const ls_group *g,
                            const ls_grpo_opts *o, const ls_grpo_metrics *mt, const ls_arenas *ar);

#endif
