/*
 * train_args.c — `train`'s own flags (train_args.h): table, parser and checks shared by
 * the CLI (src/cli/cmd_train.c) and the API (src/api/api.c).
 */
#include <stdio.h>
#include <string.h>

#include "longstraw/eval.h"
#include "longstraw/task.h"
#include "longstraw/train_args.h"

const ls_train_flag ls_run_flag_table[] = {
    {"model", 1},          {"data", 1},           {"out", 1},           {"tokenizer", 1},
    {"updates", 1},        {"groups-per-update", 1}, {"seed", 1},       {"rollout", 0},
    {"num-generations", 1}, {"max-new-tokens", 1}, {"top-p", 1},        {"stop", 1},
    {"task", 1},           {"prompt-len", 1},     {"reward-cmd", 1},    {"reward-timeout", 1},
    {"save-every", 1},     {"save-total-limit", 1}, {"resume", 1},      {"quiet", 0},
    {"no-validate", 0},    {"trace-layers", 1},   {"eval-data", 1},     {"eval-lines", 1},
    {"eval-every", 1},     {"haystack", 1},       {"eval-prompts", 1},  {"eval-prompt-len", 1},
};
const int ls_run_flag_count = (int)(sizeof ls_run_flag_table / sizeof ls_run_flag_table[0]);

void ls_train_args_default(ls_train_args *a) {
    memset(a, 0, sizeof *a);
    ls_train_opts_default(&a->r);
    ls_train_flags_init(&a->t);
}

ls_status ls_train_args_set(ls_train_args *a, const char *name, const char *v, int *known) {
    const char *f = NULL;
    for (int i = 0; i < ls_run_flag_count && !f; i++)
        if (ls_flag_name_is(name, ls_run_flag_table[i].name)) f = ls_run_flag_table[i].name;
    if (!f) return ls_train_flag_set(&a->t, name, v, known);
    *known = 1;
    ls_train_opts *r = &a->r;
    char flag[48];
    snprintf(flag, sizeof flag, "--%s", f);
    if (!strcmp(f, "rollout")) return r->rollout = ls_flag_on(v), LS_OK;
    if (!strcmp(f, "quiet")) return a->quiet = ls_flag_on(v), LS_OK;
    if (!strcmp(f, "no-validate")) return r->no_validate = ls_flag_on(v), LS_OK;
    if (!v) return ls_err(LS_ERR_ARG, "%s needs a value", flag);
    if (!strcmp(f, "model")) return r->model = v, LS_OK;
    if (!strcmp(f, "data")) return r->data = v, LS_OK;
    if (!strcmp(f, "out")) return r->out = v, LS_OK;
    if (!strcmp(f, "tokenizer")) return r->tokenizer = v, LS_OK;
    if (!strcmp(f, "stop")) return r->stop = v, LS_OK;
    if (!strcmp(f, "reward-cmd")) return r->reward_cmd = v, LS_OK;
    if (!strcmp(f, "resume")) return a->resume = v, LS_OK;
    if (!strcmp(f, "eval-data")) return r->eval_data = v, LS_OK;
    if (!strcmp(f, "updates")) return ls_flag_i64(flag, v, 1, INT64_MAX / 4, &r->updates);
    if (!strcmp(f, "groups-per-update")) return ls_flag_i64(flag, v, 1, 1 << 20, &r->groups_per_update);
    if (!strcmp(f, "seed")) return ls_flag_i64(flag, v, 0, INT64_MAX, &r->seed);
    if (!strcmp(f, "num-generations")) return ls_flag_i64(flag, v, 2, 1 << 16, &r->num_generations);
    if (!strcmp(f, "max-new-tokens")) return ls_flag_i64(flag, v, 1, 1 << 24, &r->max_new_tokens);
    if (!strcmp(f, "top-p")) return ls_flag_f64(flag, v, 1e-9, 1, &r->top_p);
    if (!strcmp(f, "task") || !strcmp(f, "haystack")) {
        ls_task t;
        int task = !strcmp(f, "task");
        if (ls_task_parse(&t, task ? v : "passkey", task ? NULL : v) != LS_OK)
            return ls_err(LS_ERR_ARG, "%s: %s", flag, ls_err_msg());
        *(task ? &r->task : &r->haystack) = v;
        return LS_OK;
    }
    if (!strcmp(f, "eval-prompts")) return ls_flag_i64(flag, v, 1, 1 << 20, &r->eval_prompts);
    if (!strcmp(f, "eval-prompt-len")) {
        ls_eval_opts eo;
        ls_eval_opts_default(&eo);
        LS_TRY(ls_eval_parse_lengths(&eo, v));
        r->eval_prompt_len = v;
        return LS_OK;
    }
    if (!strcmp(f, "prompt-len")) return ls_flag_i64(flag, v, 64, INT64_MAX / 64, &r->prompt_len);
    if (!strcmp(f, "reward-timeout")) return ls_flag_f64(flag, v, 1e-3, 1e7, &r->reward_timeout);
    if (!strcmp(f, "save-every")) return ls_flag_i64(flag, v, 1, INT64_MAX / 4, &r->save_every);
    if (!strcmp(f, "save-total-limit")) return ls_flag_i64(flag, v, 1, 1 << 20, &r->save_total_limit);
    if (!strcmp(f, "eval-lines")) return ls_flag_i64(flag, v, 1, 1 << 20, &r->eval_lines);
    if (!strcmp(f, "eval-every")) {
        a->eval_every_set = 1;
        return ls_flag_i64(flag, v, 1, INT64_MAX / 4, &r->eval_every);
    }
    if (!strcmp(f, "trace-layers")) return ls_flag_i64(flag, v, -1, INT64_MAX / 4, &r->trace_layers);
    LS_ASSERT(0, "train flag %s has no parser", f);
    return LS_OK;
}

int ls_train_args_takes_value(const char *name) {
    for (int i = 0; i < ls_run_flag_count; i++)
        if (ls_flag_name_is(name, ls_run_flag_table[i].name)) return ls_run_flag_table[i].takes_value;
    for (int i = 0; i < ls_train_flag_count; i++)
        if (ls_flag_name_is(name, ls_train_flag_table[i].name)) return ls_train_flag_table[i].takes_value;
    return -1;
}

ls_status ls_train_args_parse(ls_train_args *a, int argc, char *const *argv) {
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0) return ls_err(LS_ERR_ARG, "unexpected argument \"%s\"", arg);
        char name[64];
        const char *eq = strchr(arg + 2, '='), *val = NULL;
        size_t n = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
        if (n >= sizeof name) return ls_err(LS_ERR_ARG, "%s: not a flag of train", arg);
        memcpy(name, arg + 2, n);
        name[n] = 0;
        int tv = ls_train_args_takes_value(name);
        if (tv < 0) return ls_err(LS_ERR_ARG, "--%s: not a flag of train (see longstraw train --help)", name);
        if (eq) val = eq + 1;
        else if (tv) {
            if (i + 1 >= argc) return ls_err(LS_ERR_ARG, "--%s needs a value", name);
            val = argv[++i];
        }
        int known = 0;
        LS_TRY(ls_train_args_set(a, name, val, &known));
    }
    return LS_OK;
}

ls_status ls_train_args_check(ls_train_args *a) {
    const ls_train_opts *r = &a->r;
    const ls_train_flags *t = &a->t;
    if (!r->model || !r->out) return ls_err(LS_ERR_ARG, "--model and --out are required");
    if (!r->data && !r->task) return ls_err(LS_ERR_ARG, "give --data FILE.jsonl, or --rollout --task passkey");
    if (r->task && !r->rollout && !t->o.sft)
        return ls_err(LS_ERR_ARG, "--task samples its responses: add --rollout (or train on its keys: --loss sft)");
    if (t->o.sft && r->rollout) return ls_err(LS_ERR_ARG, "--loss sft trains on given responses: not with --rollout");
    if (r->eval_lines && !r->task) return ls_err(LS_ERR_ARG, "--eval-lines draws held-out --task items: give --task");
    if (r->eval_lines && r->eval_data) return ls_err(LS_ERR_ARG, "give --eval-data or --eval-lines, not both");
    if ((r->eval_prompts || r->eval_prompt_len) && (!r->task || r->data))
        return ls_err(LS_ERR_ARG, "--eval-prompts and --eval-prompt-len evaluate a built-in --task: give --task");
    if (r->haystack && !r->task) return ls_err(LS_ERR_ARG, "--haystack is the haystack of a built-in --task: give --task");
    if ((r->reward_cmd || r->reward_fn) && !r->rollout)
        return ls_err(LS_ERR_ARG, "%s scores rollouts: add --rollout", r->reward_cmd ? "--reward-cmd" : "a reward function");
    if (r->reward_cmd && r->reward_fn) return ls_err(LS_ERR_ARG, "give --reward-cmd or a reward function, not both");
    if (r->rollout && t->o.no_capture)
        return ls_err(LS_ERR_ARG, "--rollout samples from the captured state: not with --no-capture");
    if (r->rollout && !r->tokenizer && !r->task)
        return ls_err(LS_ERR_ARG, "--rollout on --data needs --tokenizer (rewards read the decoded text)");
    if (a->eval_every_set && r->task && !r->data && !r->eval_lines && !r->eval_data && !r->eval_prompts)
        a->r.eval_prompts = 16; /* --eval-every with a task: its held-out exact match */
    return LS_OK;
}

void ls_train_args_opts(const ls_train_args *a, int argc, char **argv, ls_train_opts *o) {
    *o = a->r;
    o->force = a->t.force, o->resume = a->resume != NULL;
    o->backend = a->t.backend;
    o->o = a->t.o;
    o->spec = ls_train_flags_spec(NULL, &a->t); /* model_dir: the trainer's (the model or a checkpoint) */
    o->argc = argc;
    o->argv = argv;
}
