/*
 * flags.c — the training flags' table and parser (flags.h): shared by the command line
 * (src/cli) and the API (src/api), so both take the same names, defaults and ranges.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/flags.h"

ls_status ls_flag_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || errno || end == s || *end) return ls_err(LS_ERR_ARG, "%s: \"%s\" is not an integer", flag, s ? s : "");
    if (v < lo || v > hi)
        return ls_err(LS_ERR_ARG, "%s: %lld is out of range [%lld, %lld]", flag, v, (long long)lo, (long long)hi);
    *out = v;
    return LS_OK;
}

ls_status ls_flag_f64(const char *flag, const char *s, double lo, double hi, double *out) {
    char *end = NULL;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || errno || end == s || *end) return ls_err(LS_ERR_ARG, "%s: \"%s\" is not a number", flag, s ? s : "");
    if (!(v >= lo && v <= hi)) return ls_err(LS_ERR_ARG, "%s: %g is out of range [%g, %g]", flag, v, lo, hi);
    *out = v;
    return LS_OK;
}

ls_status ls_flag_dtype(const char *flag, const char *s, ls_dtype *out) {
    if (s && !strcmp(s, "f32")) *out = LS_DTYPE_F32;
    else if (s && !strcmp(s, "bf16")) *out = LS_DTYPE_BF16;
    else return ls_err(LS_ERR_ARG, "%s: \"%s\" is not a dtype (expected f32 or bf16)", flag, s ? s : "");
    return LS_OK;
}

ls_status ls_flag_mode(const char *s, int *full) {
    if (s && (!strcmp(s, "prefix-frozen") || !strcmp(s, "full"))) {
        *full = !strcmp(s, "full");
        return LS_OK;
    }
    return ls_err(LS_ERR_ARG, "--mode: \"%s\" is not a mode (expected prefix-frozen or full)", s ? s : "");
}

ls_status ls_flag_layout(const char *s, ls_cp_layout *out) {
    if (s && ls_cp_layout_parse(s, out) == 0) return LS_OK;
    return ls_err(LS_ERR_ARG, "--cp-layout: \"%s\" is not a layout (expected contiguous or zigzag)", s ? s : "");
}

ls_status ls_flag_state_on(const char *flag, const char *s, int *on_host) {
    if (s && (!strcmp(s, "device") || !strcmp(s, "host"))) {
        *on_host = !strcmp(s, "host");
        return LS_OK;
    }
    return ls_err(LS_ERR_ARG, "%s: \"%s\" is not device or host", flag, s ? s : "");
}

const ls_train_flag ls_train_flag_table[] = {
    {"epsilon", 1},       {"epsilon-high", 1},  {"beta", 1},          {"ref-model", 1},
    {"loss-type", 1},     {"max-completion-length", 1},               {"scale-rewards", 1},
    {"temperature", 1},   {"num-iterations", 1}, {"lr", 1},           {"weight-decay", 1},
    {"adam-beta1", 1},    {"adam-beta2", 1},    {"adam-eps", 1},      {"max-grad-norm", 1},
    {"no-capture", 0},    {"capture-chunk", 1}, {"page-size", 1},     {"state-dtype", 1},
    {"threads", 1},       {"adapter", 1},       {"lora-rank", 1},     {"lora-alpha", 1},
    {"lora-targets", 1},  {"lora-seed", 1},     {"force", 0},         {"cp-layout", 1},
    {"loss", 1},          {"mode", 1},          {"sweep-chunk", 1},   {"ep", 1},
    {"indexer-kl-coef", 1}, {"backend", 1},     {"state-on", 1},      {"cp-wave", 1},
};
const int ls_train_flag_count = (int)(sizeof ls_train_flag_table / sizeof ls_train_flag_table[0]);

void ls_train_flags_init(ls_train_flags *t) {
    memset(t, 0, sizeof *t);
    ls_grpo_opts_default(&t->o);
    t->lora_alpha = 16;
    t->lora_targets = NULL; /* default: the attention and linear-attention projections of the model's layout */
    t->ep = 1;
}

int ls_flag_name_is(const char *name, const char *flag) {
    for (; *name && *flag; name++, flag++)
        if (*name != *flag && !(*name == '_' && *flag == '-')) return 0;
    return *name == *flag;
}

int ls_flag_on(const char *v) { return !v || !(strcmp(v, "0") == 0 || strcmp(v, "false") == 0 || strcmp(v, "False") == 0); }

ls_status ls_train_flag_set(ls_train_flags *t, const char *name, const char *arg, int *known) {
    ls_grpo_opts *o = &t->o;
    const char *f = NULL;
    for (int i = 0; i < ls_train_flag_count && !f; i++)
        if (ls_flag_name_is(name, ls_train_flag_table[i].name)) f = ls_train_flag_table[i].name;
    *known = f != NULL;
    if (!f) return LS_OK;
    int64_t v;
    double d;
    char flag[48];
    snprintf(flag, sizeof flag, "--%s", f);
    if (!strcmp(f, "no-capture")) return o->no_capture = ls_flag_on(arg), LS_OK;
    if (!strcmp(f, "force")) return t->force = ls_flag_on(arg), LS_OK;
    if (!arg) return ls_err(LS_ERR_ARG, "%s needs a value", flag);
    if (!strcmp(f, "epsilon")) return ls_flag_f64(flag, arg, 0, 1, &o->eps_low);
    if (!strcmp(f, "epsilon-high")) {
        t->eps_high_set = 1;
        return ls_flag_f64(flag, arg, 0, 1e6, &o->eps_high);
    }
    if (!strcmp(f, "beta")) return ls_flag_f64(flag, arg, 0, 1e6, &o->beta);
    if (!strcmp(f, "ref-model")) return t->ref_model = arg, LS_OK;
    if (!strcmp(f, "loss-type")) {
        if (!strcmp(arg, "grpo")) o->loss = LS_LOSS_GRPO;
        else if (!strcmp(arg, "dapo")) o->loss = LS_LOSS_DAPO;
        else if (!strcmp(arg, "dr_grpo")) o->loss = LS_LOSS_DR_GRPO;
        else return ls_err(LS_ERR_ARG, "--loss-type: \"%s\" is not grpo, dapo or dr_grpo", arg);
        return LS_OK;
    }
    if (!strcmp(f, "loss")) {
        if (strcmp(arg, "grpo") && strcmp(arg, "sft"))
            return ls_err(LS_ERR_ARG, "--loss: \"%s\" is not grpo or sft", arg);
        o->sft = !strcmp(arg, "sft");
        return LS_OK;
    }
    if (!strcmp(f, "mode")) return ls_flag_mode(arg, &o->full);
    if (!strcmp(f, "sweep-chunk")) return ls_flag_i64(flag, arg, 1, 1 << 24, &o->sweep_chunk);
    if (!strcmp(f, "max-completion-length")) return ls_flag_i64(flag, arg, 1, INT64_MAX / 2, &o->max_completion_length);
    if (!strcmp(f, "scale-rewards")) {
        if (!strcmp(arg, "group")) o->scale = LS_SCALE_GROUP;
        else if (!strcmp(arg, "batch")) o->scale = LS_SCALE_BATCH;
        else if (!strcmp(arg, "none")) o->scale = LS_SCALE_NONE;
        else return ls_err(LS_ERR_ARG, "--scale-rewards: \"%s\" is not group, batch or none", arg);
        return LS_OK;
    }
    if (!strcmp(f, "temperature")) {
        LS_TRY(ls_flag_f64(flag, arg, 1e-6, 1e6, &d));
        o->fwd.temperature = (float)d;
        return LS_OK;
    }
    if (!strcmp(f, "num-iterations")) {
        LS_TRY(ls_flag_i64(flag, arg, 1, 1000, &v));
        o->num_iterations = (int)v;
        return LS_OK;
    }
    if (!strcmp(f, "lr")) return ls_flag_f64(flag, arg, 0, 1e3, &o->lr);
    if (!strcmp(f, "weight-decay")) return ls_flag_f64(flag, arg, 0, 1e3, &o->weight_decay);
    if (!strcmp(f, "adam-beta1")) return ls_flag_f64(flag, arg, 0, 0.999999999, &o->beta1);
    if (!strcmp(f, "adam-beta2")) return ls_flag_f64(flag, arg, 0, 0.999999999, &o->beta2);
    if (!strcmp(f, "adam-eps")) {
        LS_TRY(ls_flag_f64(flag, arg, 0, 1, &o->adam_eps));
        if (o->adam_eps <= 0) /* 0 makes 0/0 = NaN of every weight whose moments are 0 */
            return ls_err(LS_ERR_ARG, "--adam-eps: %g must be > 0 (it keeps the step finite where the second moment "
                                      "is 0)", o->adam_eps);
        return LS_OK;
    }
    if (!strcmp(f, "max-grad-norm")) return ls_flag_f64(flag, arg, 0, 1e12, &o->max_grad_norm);
    if (!strcmp(f, "capture-chunk")) return ls_flag_i64(flag, arg, 1, 1 << 24, &o->fwd.capture_chunk);
    if (!strcmp(f, "page-size")) return ls_flag_i64(flag, arg, 1, 1 << 20, &o->page_size);
    if (!strcmp(f, "state-dtype")) return ls_flag_dtype(flag, arg, &o->state_dtype);
    if (!strcmp(f, "cp-layout")) return ls_flag_layout(arg, &o->fwd.cp_layout);
    if (!strcmp(f, "cp-wave")) return ls_flag_i64(flag, arg, 1, (int64_t)1 << 40, &o->fwd.cp_wave);
    if (!strcmp(f, "threads")) return ls_flag_i64(flag, arg, 1, 4096, &t->threads);
    if (!strcmp(f, "adapter")) return t->adapter = arg, LS_OK;
    if (!strcmp(f, "lora-rank")) return ls_flag_i64(flag, arg, 1, 1 << 16, &t->lora_rank);
    if (!strcmp(f, "lora-alpha")) return ls_flag_f64(flag, arg, 1e-9, 1e9, &t->lora_alpha);
    if (!strcmp(f, "lora-targets")) return t->lora_targets = arg, LS_OK;
    if (!strcmp(f, "lora-seed")) return ls_flag_i64(flag, arg, 0, INT64_MAX, &t->lora_seed);
    if (!strcmp(f, "ep")) return ls_flag_i64(flag, arg, 1, 4096, &t->ep);
    if (!strcmp(f, "indexer-kl-coef")) return ls_flag_f64(flag, arg, 0, 1e6, &o->aux_loss_coef);
    if (!strcmp(f, "backend")) return t->backend = arg, LS_OK;
    if (!strcmp(f, "state-on")) return ls_flag_state_on(flag, arg, &t->state_on_host);
    LS_ASSERT(0, "training flag %s has no parser", f);
    return LS_OK;
}

ls_status ls_train_flags_finish(ls_train_flags *t) {
    if (!t->eps_high_set) t->o.eps_high = t->o.eps_low;
    if (t->adapter && t->lora_rank) return ls_err(LS_ERR_ARG, "give --adapter or --lora-rank, not both");
    if (t->o.beta > 0 && !t->ref_model && !t->adapter && !t->lora_rank)
        return ls_err(LS_ERR_ARG, "--beta %g needs --ref-model DIR (the reference policy; with LoRA the base serves)",
                      t->o.beta);
    LS_TRY(ls_grpo_opts_check(&t->o)); /* the library's own check: one message for every command */
    if (t->o.aux_loss_coef > 0 && (t->adapter || t->lora_rank))
        return ls_err(LS_ERR_ARG, "--indexer-kl-coef trains the indexers' own weights: not with LoRA (--lora-rank, "
                                  "--adapter)");
    return LS_OK;
}

ls_policy_spec ls_train_flags_spec(const char *model, const ls_train_flags *t) {
    return (ls_policy_spec){.model_dir = model,
                            .ref_dir = t->ref_model,
                            .adapter = t->adapter,
                            .lora_rank = t->lora_rank,
                            .lora_alpha = t->lora_alpha,
                            .lora_targets = t->lora_targets,
                            .lora_seed = (uint64_t)t->lora_seed,
                            .ep = t->ep_comm,
                            .aux_loss = t->o.aux_loss_coef > 0};
}
