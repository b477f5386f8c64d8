/*
 * flags.h — the training flags of `grad`, `step` and `train` (objective, optimizer, what
 * is trained, engine) as a library table: one parser for the command line and the C/Python
 * API (api.h), so names, defaults, ranges and messages are the same everywhere.
 *
 * A flag is named as on the command line without the dashes ("max-grad-norm"); the API's
 * keyword spelling ("max_grad_norm") is accepted too. Errors are ls_err messages naming the
 * flag and the value ("--lr: \"x\" is not a number"); nothing is printed.
 */
#ifndef LONGSTRAW_FLAGS_H
#define LONGSTRAW_FLAGS_H

#include "longstraw/grpo.h"
#include "longstraw/trainer.h"

/* name == flag, where name may spell '-' as '_' ("max_grad_norm" is "max-grad-norm"). */
int ls_flag_name_is(const char *name, const char *flag);
/* A switch's value: NULL (given bare) or anything but "0"/"false"/"False" is on. */
int ls_flag_on(const char *value);

/* Checked values: LS_ERR_ARG "FLAG: ..." on anything but a number in [lo, hi]. */
ls_status ls_flag_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out);
ls_status ls_flag_f64(const char *flag, const char *s, double lo, double hi, double *out);
ls_status ls_flag_dtype(const char *flag, const char *s, ls_dtype *out);   /* f32 | bf16 */
ls_status ls_flag_mode(const char *s, int *full);                           /* prefix-frozen | full */
ls_status ls_flag_layout(const char *s, ls_cp_layout *out);                 /* contiguous | zigzag */
ls_status ls_flag_state_on(const char *flag, const char *s, int *on_host);  /* device | host */

typedef struct {
    ls_grpo_opts o;
    const char *ref_model;
    int64_t threads;
    int eps_high_set;
    /* LoRA: adapter FILE, or new adapters from lora_rank / lora_targets */
    const char *adapter;
    int64_t lora_rank;
    double lora_alpha;
    const char *lora_targets;
    int64_t lora_seed;
    int force;              /* run even when the plan says it will not fit */
    int64_t ep;             /* expert-parallel degree (1: none) */
    const ls_comm *ep_comm; /* its ranks (NULL: one; set by the caller from ep) */
    const char *backend;    /* NULL: cpu */
    int state_on_host;      /* the prompt state in host memory, staged per layer */
} ls_train_flags;

/* One training flag. */
typedef struct {
    const char *name;   /* "max-grad-norm" */
    int takes_value;    /* 0: a switch ("force", "no-capture") */
} ls_train_flag;

extern const ls_train_flag ls_train_flag_table[];
extern const int ls_train_flag_count;

void ls_train_flags_init(ls_train_flags *t);
/* Set flag `name` (table spelling, '_' for '-' accepted) to `value` (NULL for a switch; a
 * switch given a value takes "0"/"false" as off, anything else as on). Strings are kept by
 * pointer: they must outlive t. *known = 0 (and LS_OK) when name is not a training flag. */
ls_status ls_train_flag_set(ls_train_flags *t, const char *name, const char *value, int *known);
/* After the last flag: defaults that depend on others, and the checks across flags. */
ls_status ls_train_flags_finish(ls_train_flags *t);
/* What the flags say is trained (model_dir = model). */
ls_policy_spec ls_train_flags_spec(const char *model, const ls_train_flags *t);

#endif
