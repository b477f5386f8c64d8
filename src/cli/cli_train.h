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
} cli_train;

extern const struct option cli_train_options[];
extern const int cli_train_n_options;

void cli_train_help(void);
void cli_train_init(cli_train *t);
/* 0: consumed; 2: bad value (message printed); −1: not a training flag. */
int cli_train_parse(const char *cmd, cli_train *t, int ch, const char *arg);
int cli_train_finish(const char *cmd, cli_train *t);
int cli_parse_f64(const char *cmd, const char *flag, const char *s, double lo, double hi, double *out);
/* The models of a training command: the loaded checkpoint (`base`), the policy
 * (base, or base + LoRA adapters merged), the reference (--ref-model, or the base
 * with LoRA), gradients and, when wanted, the AdamW state. Sets t->o.lora/lora_base. */
typedef struct {
    ls_hybrid_model base, ref, grad, merged;
    ls_hybrid_model *policy;
    const ls_hybrid_model *refp;
    ls_lora *lora;
    ls_adamw adam;
} cli_policy;
ls_status cli_policy_setup(cli_policy *p, const char *model, cli_train *t, int with_adam, ls_arenas *ar);
/* The trainable tensors' optimizer moments, as parallel lists (malloc'd, caller frees). */
ls_status cli_policy_moments(cli_policy *p, ls_param **m, ls_param **v, int64_t *n);
/* Close an open_memstream stream over (*buf, *len), write its text to `path`
 * atomically (ls_write_file_atomic) and free the buffer. */
ls_status cli_write_memstream(const char *path, FILE *f, char **buf, size_t *len);
/* adapter_config.json as PEFT writes it (the fields a loader needs). */
ls_status cli_write_adapter_config(const char *path, const cli_train *t, const ls_lora *lora);

/* M_live terms predicted from the config (DESIGN §1): gradient bytes, fixed bytes
 * (weights, and the AdamW moments when `optimizer`; with LoRA side branches the base
 * plus adapters and their moments). A LoRA on the LM head (merged mode) also holds the
 * copies and gradients of the adapted tensors, which this leaves out. */
void cli_predict_bytes(const ls_hybrid_model *base, const ls_lora *lora, int optimizer, size_t *grad, size_t *fixed);
ls_status cli_write_receipt(const char *path, const char *cmd, const ls_hybrid_model *m, const ls_group *g,
                            const ls_grpo_opts *o, const ls_grpo_metrics *mt, const ls_arenas *ar);

#endif
