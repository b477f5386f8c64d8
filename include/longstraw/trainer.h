/*
 * trainer.h — the training loop as a library (issue 4, moved out of the CLI in issue
 * 10): JSONL groups (ids or text) or rollouts on a built-in task or JSONL prompts,
 * rewards from the task, the data's "answer" or a reward process, several groups per
 * update, the run lock, crash-safe checkpoints with resume, metrics and traces.
 * Also the pieces every training command shares: the trainable set with its AdamW
 * state, the memory check against the plan, and the receipt.
 *
 * Under context parallelism (o.fwd.comm with several ranks) every rank calls
 * ls_train_run with the same options: rank 0 alone writes RUN/ (lock, args.json,
 * checkpoints, metrics.jsonl, receipt.json), every rank writes RUN/trace.<rank>.jsonl.
 */
#ifndef LONGSTRAW_TRAINER_H
#define LONGSTRAW_TRAINER_H

#include <stdio.h>

#include "longstraw/family.h"
#include "longstraw/grpo.h"

/* ---- the trainable set of a command ---------------------------------------------- */
typedef struct {
    ls_policy_spec spec;
    ls_policy p;
    ls_adamw adam; /* moments only when opened with_adam */
    const ls_config *cfg; /* the policy's */
} ls_trainable;

ls_status ls_trainable_open(ls_trainable *t, const ls_policy_spec *spec, int with_adam, ls_arenas *ar);
void ls_trainable_close(ls_trainable *t);

/* Refuse, before anything sized by P is allocated, an update whose predicted live
 * memory (the plan's prompt state per rank — twice with a reference — + fixed +
 * gradients, times the ranks on this machine) exceeds 90% of the machine's memory;
 * the message gives the plan's numbers and the machine's. */
ls_status ls_check_fits(const ls_trainable *t, const ls_grpo_opts *o, int64_t P, int optimizer);
/* The same for a greedy evaluation of prompts of up to P tokens with a loaded model whose
 * weights take `fixed` bytes (eval, train's held-out prompts). */
ls_status ls_check_fits_eval(const ls_model *m, const ls_score_opts *so, int64_t P, size_t fixed);

/* receipt.json of an update (collective under CP: every rank calls it; rank 0 writes):
 * phases, arena peaks, the M_live terms predicted beside measured, every rank's
 * prompt-arena peak beside the plan's per-rank row, peak RSS and trainable hash, and
 * the metrics under TRL's names. */
ls_status ls_receipt_write(const char *path, const char *cmd, const ls_trainable *t, const ls_group *g,
                           const ls_grpo_opts *o, const ls_grpo_metrics *mt, const ls_arenas *ar);

/* ---- the loop ---------------------------------------------------------------------- */
typedef struct {
    const char *model, *out;  /* checkpoint, run directory */
    const char *data;         /* JSONL groups (or prompts with rollout), or NULL with a task */
    const char *tokenizer;    /* tokenizer.json for text (a task defaults to plain bytes) */
    const char *task;         /* a built-in task (task.h: passkey, multikey, vartrack[-shaped]) or NULL */
    const char *haystack;     /* the task's haystack: "repeat" (NULL) or "varied" */
    const char *reward_cmd;   /* reward process (rollouts) or NULL */
    const char *stop;         /* stop tokens, ids or token strings, comma separated */
    int64_t updates;          /* 0: one pass over the data (10 with a task) */
    int64_t groups_per_update, save_every, save_total_limit, seed, num_generations, max_new_tokens, prompt_len;
    int64_t trace_layers;     /* layer events for the first N updates (−1: all) */
    double top_p, reward_timeout;
    int rollout, no_validate;
    int force;                /* skip the memory check */
    /* held-out evaluation: the mean NLL per response token of held-out groups under the
     * current weights ("eval/nll" in metrics.jsonl), before the first update and after
     * every eval_every-th: eval_data (JSONL groups) or, with a task, eval_lines items
     * drawn from their own seed (never the training items) */
    const char *eval_data;
    int64_t eval_lines, eval_every;
    /* with a task: eval_prompts held-out prompts per length of eval_prompt_len ("N[,N...]";
     * NULL: prompt_len), decoded greedily (eval.h), before the first update and after
     * every eval_every-th: "eval/exact_match", "eval/score", "eval/exact_match/<L>" */
    int64_t eval_prompts;
    const char *eval_prompt_len;
    int resume;               /* continue RUN's newest checkpoint (else RUN must hold none) */
    const char *backend;      /* where the ops run (backend.h ls_backend_open; NULL: cpu) */
    ls_grpo_opts o;           /* objective, optimizer, engine, communicator */
    ls_policy_spec spec;      /* what is trained (model_dir: set from `model` or the checkpoint) */
    int argc;                 /* the command line saved as RUN/args.json (0: none) */
    char **argv;
    /* Rewards from the host (the API's Python reward functions) instead of reward_cmd or the
     * task: the same call as ls_reward_cmd_score, on rank 0 (NULL: none). */
    ls_status (*reward_fn)(void *user, const char *prompt, size_t prompt_len, const char *const *responses,
                           const size_t *response_lens, int n, int64_t group_id, double *rewards);
    void *reward_user;
    /* Progress and status lines (rank 0): to log_fn when set, else to stderr. */
    void (*log_fn)(void *user, const char *line);
    void *log_user;
} ls_train_opts;

void ls_train_opts_default(ls_train_opts *o);

typedef struct {
    int64_t updates;  /* updates this call ran */
    int skipped;      /* of which skipped (non-finite) */
    int stop_signal;  /* a stop requested (ls_request_stop) ended the run early: the signal */
} ls_train_result;

/* Run the loop. A stop requested with ls_request_stop (the CLI's signal handler) is
 * honoured at the next capture chunk or update boundary: the finished updates are
 * checkpointed and res->stop_signal is set (LS_OK). On an error the finished updates
 * are checkpointed before the error is returned. Progress lines go to o->log_fn, else to
 * stderr (rank 0). */
ls_status ls_train_run(const ls_train_opts *o, ls_train_result *res);

/* The process group of the running trainer's reward process (0 when none), for a
 * signal handler that must end it. */
int ls_train_reward_pgid(void);

/* argv' = ["train", RUN/args.json..., argv[1..]...]: a resume's saved flags first, then
 * the given ones (later flags override). Strings malloc'd (free each, then the array). */
ls_status ls_train_saved_args(const char *run, int argc, char **argv, int *nargc, char ***nargv);
/* A resume's run directory and the --out given with it (NULL: none) name the same
 * directory (same device and inode: "RUN" and "./RUN/" agree); else LS_ERR_ARG. */
ls_status ls_train_same_run(const char *resume, const char *out);

#endif
