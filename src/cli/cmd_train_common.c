/*
 * cmd_train_common.c — the objective, optimizer and engine flags shared by
 * `longstraw grad` and `longstraw step`, and the receipt writer.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_train.h"

void cli_train_help(void) {
    printf("objective (DESIGN §7):\n"
           "  --loss L               grpo (default; rewards, clipped ratios, KL) | sft: the mean\n"
           "                         negative log-likelihood of the response tokens given the prompt\n"
           "                         (no rewards, no scoring, no reference; a group may hold one response)\n"
           "  --mode M               prefix-frozen (default: the prompt state is a constant) | full: the\n"
           "                         exact gradient through the prompt too, at memory of the order of the\n"
           "                         prompt state (dState + checkpoints, a reverse sweep after the replay)\n"
           "  --sweep-chunk N        full mode: positions per reverse-sweep chunk (default 512): one\n"
           "                         chunk's tape is alive at a time, one checkpoint per chunk\n"
           "  --epsilon E            clip range low: ratios below 1-E clip (default 0.2)\n"
           "  --epsilon-high E       clip range high: above 1+E clip (default = --epsilon)\n"
           "  --beta B               weight of the k3 KL to the reference (default 0)\n"
           "  --ref-model DIR        reference policy (needed when --beta > 0)\n"
           "  --loss-type T          grpo (per-member mean, default) | dapo (token mean) | dr_grpo\n"
           "  --max-completion-length L  dr_grpo normaliser (default: --max-new-tokens with rollouts,\n"
           "                         else the longest response)\n"
           "  --scale-rewards S      group (default) | batch | none\n"
           "  --temperature T        logits divided by T before the log-softmax (default 1)\n"
           "  --num-iterations N     optimizer steps on the same groups, old log-probs from the first\n"
           "                         (step, train)\n"
           "  --indexer-kl-coef C    MLA family, full fine-tune, prefix-frozen: also train the DSA\n"
           "                         indexers by C x the mean over response tokens of the sum over\n"
           "                         full indexer layers of KL(head-averaged attention || softmax of the\n"
           "                         index scores) over the selected keys (DeepSeek-V3.2's sparse-stage\n"
           "                         indexer loss; default 0: indexers frozen)\n"
           "optimizer (AdamW, torch semantics; no decay on norms, A_log, dt_bias):\n"
           "  --lr LR (1e-6)  --weight-decay WD (0)  --adam-beta1 B1 (0.9)  --adam-beta2 B2 (0.999)\n"
           "  --adam-eps EPS (1e-8)  --max-grad-norm N (1.0; 0 disables clipping)\n"
           "what is trained (default: every weight):\n"
           "  --lora-rank R          LoRA adapters of rank R on --lora-targets, base frozen; the\n"
           "                         reference policy is then the base with adapters off\n"
           "  --lora-alpha A         LoRA scaling alpha (scale alpha/R; default 16)\n"
           "  --lora-targets LIST    projections to adapt (default: attention q/k/v/o_proj and the\n"
           "                         linear-attention in/out projections of the checkpoint's layout:\n"
           "                         in_proj_qkvz,in_proj_ba (Qwen3-Next) or in_proj_qkv,in_proj_z,\n"
           "                         in_proj_b,in_proj_a (Qwen3.5), out_proj)\n"
           "  --lora-seed N          seed of new adapters (default 0)\n"
           "  --adapter FILE         start from existing PEFT adapters (safetensors)\n"
           "engine:\n");
    printf("  --no-capture           naive mode: each member's whole sequence under a tape\n"
           "  --capture-chunk N (2048)  --page-size S (64)  --state-dtype f32|bf16 (f32)\n"
           "  --threads N            worker threads (default: all cores)\n"
           "  --backend B            where the ops run: cpu (default), strict (the CPU's ops over\n"
           "                         memory host code cannot read: the device boundary tested) or\n"
           "                         cuda[:N] (a GPU)\n"
           "  --state-on P           where the prompt state lives: device (default: the backend's\n"
           "                         memory) or host (host memory, one layer at a time staged to\n"
           "                         the device; grad and step)\n"
           "  --force                run even when the plan says the update will not fit in this\n"
           "                         machine's memory (it is refused before anything is allocated)\n"
           "context parallelism: under `mpirun -np N` the CP degree is N (the prompt's pages split\n"
           "  across the ranks); the flags are the same, rank 0 alone writes the outputs.\n"
           "  --cp-layout L          zigzag (rank r: blocks r and 2N-1-r of 2N; default) or\n"
           "                         contiguous (rank r: block r of N)\n"
           "  --cp-wave N            a layer of the CP capture keeps its per-position buffers for\n"
           "                         at most N of the rank's positions at a time (default: as many\n"
           "                         as 1 GiB holds; `plan --cp-wave N` prints the buffers)\n"
           "expert parallelism (the MLA family): under `mpirun -np W`, W = CP x EP\n"
           "  --ep N                 split the routed experts over N ranks (default 1): ranks\n"
           "                         c·N .. c·N+N-1 share CP rank c's pages and hold E/N experts each;\n"
           "                         outputs carry every expert (gathered to rank 0)\n");
}

enum {
    OPT_EPS = 1000, OPT_EPS_HIGH, OPT_BETA, OPT_REF, OPT_LOSS, OPT_MAXLEN, OPT_SCALE, OPT_TEMP, OPT_ITERS,
    OPT_LR, OPT_WD, OPT_B1, OPT_B2, OPT_AEPS, OPT_MAXGN, OPT_NOCAP, OPT_CHUNK, OPT_PAGE, OPT_SDT, OPT_THREADS,
    OPT_ADAPTER, OPT_LRANK, OPT_LALPHA, OPT_LTARGETS, OPT_LSEED, OPT_FORCE, OPT_LAYOUT, OPT_OBJ, OPT_MODE, OPT_SWEEP,
    OPT_EP, OPT_IKL, OPT_BACKEND, OPT_STATE_ON, OPT_CPWAVE
};

const struct option cli_train_options[] = {
    {"epsilon", required_argument, 0, OPT_EPS},       {"epsilon-high", required_argument, 0, OPT_EPS_HIGH},
    {"beta", required_argument, 0, OPT_BETA},         {"ref-model", required_argument, 0, OPT_REF},
    {"loss-type", required_argument, 0, OPT_LOSS},    {"max-completion-length", required_argument, 0, OPT_MAXLEN},
    {"scale-rewards", required_argument, 0, OPT_SCALE}, {"temperature", required_argument, 0, OPT_TEMP},
    {"num-iterations", required_argument, 0, OPT_ITERS}, {"lr", required_argument, 0, OPT_LR},
    {"weight-decay", required_argument, 0, OPT_WD},   {"adam-beta1", required_argument, 0, OPT_B1},
    {"adam-beta2", required_argument, 0, OPT_B2},     {"adam-eps", required_argument, 0, OPT_AEPS},
    {"max-grad-norm", required_argument, 0, OPT_MAXGN}, {"no-capture", no_argument, 0, OPT_NOCAP},
    {"capture-chunk", required_argument, 0, OPT_CHUNK}, {"page-size", required_argument, 0, OPT_PAGE},
    {"state-dtype", required_argument, 0, OPT_SDT},   {"threads", required_argument, 0, OPT_THREADS},
    {"adapter", required_argument, 0, OPT_ADAPTER},   {"lora-rank", required_argument, 0, OPT_LRANK},
    {"lora-alpha", required_argument, 0, OPT_LALPHA}, {"lora-targets", required_argument, 0, OPT_LTARGETS},
    {"lora-seed", required_argument, 0, OPT_LSEED},   {"force", no_argument, 0, OPT_FORCE},
    {"cp-layout", required_argument, 0, OPT_LAYOUT},  {"loss", required_argument, 0, OPT_OBJ},
    {"mode", required_argument, 0, OPT_MODE},         {"sweep-chunk", required_argument, 0, OPT_SWEEP},
    {"ep", required_argument, 0, OPT_EP},             {"indexer-kl-coef", required_argument, 0, OPT_IKL},
    {"backend", required_argument, 0, OPT_BACKEND},   {"state-on", required_argument, 0, OPT_STATE_ON},
    {"cp-wave", required_argument, 0, OPT_CPWAVE},
};
const int cli_train_n_options = (int)(sizeof cli_train_options / sizeof cli_train_options[0]);

int cli_parse_state_on(const char *cmd, const char *arg) {
    if (!strcmp(arg, "device")) return 0;
    if (!strcmp(arg, "host")) return 1;
    fprintf(stderr, "longstraw %s: --state-on: \"%s\" is not device or host\n", cmd, arg);
    return -1;
}

int cli_parse_f64(const char *cmd, const char *flag, const char *s, double lo, double hi, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end) {
        fprintf(stderr, "longstraw %s: %s: \"%s\" is not a number\n", cmd, flag, s);
        return 1;
    }
    if (!(v >= lo && v <= hi)) {
        fprintf(stderr, "longstraw %s: %s: %g is out of range [%g, %g]\n", cmd, flag, v, lo, hi);
        return 1;
    }
    *out = v;
    return 0;
}

void cli_train_init(cli_train *t) {
    memset(t, 0, sizeof *t);
    ls_grpo_opts_default(&t->o);
    t->eps_high_set = 0;
    t->lora_alpha = 16;
    t->lora_targets = NULL; /* default: the attention and linear-attention projections of the model's layout */
    t->ep = 1;
}

int cli_train_parse(const char *cmd, cli_train *t, int ch, const char *arg) {
    ls_grpo_opts *o = &t->o;
    int64_t v;
    double d;
    switch (ch) {
    case OPT_EPS: if (cli_parse_f64(cmd, "--epsilon", arg, 0, 1, &o->eps_low)) return 2; break;
    case OPT_EPS_HIGH:
        if (cli_parse_f64(cmd, "--epsilon-high", arg, 0, 1e6, &o->eps_high)) return 2;
        t->eps_high_set = 1;
        break;
    case OPT_BETA: if (cli_parse_f64(cmd, "--beta", arg, 0, 1e6, &o->beta)) return 2; break;
    case OPT_REF: t->ref_model = arg; break;
    case OPT_LOSS:
        if (!strcmp(arg, "grpo")) o->loss = LS_LOSS_GRPO;
        else if (!strcmp(arg, "dapo")) o->loss = LS_LOSS_DAPO;
        else if (!strcmp(arg, "dr_grpo")) o->loss = LS_LOSS_DR_GRPO;
        else {
            fprintf(stderr, "longstraw %s: --loss-type: \"%s\" is not grpo, dapo or dr_grpo\n", cmd, arg);
            return 2;
        }
        break;
    case OPT_OBJ:
        if (!strcmp(arg, "grpo") || !strcmp(arg, "sft")) o->sft = !strcmp(arg, "sft");
        else {
            fprintf(stderr, "longstraw %s: --loss: \"%s\" is not grpo or sft\n", cmd, arg);
            return 2;
        }
        break;
    case OPT_MODE: if (cli_parse_mode(cmd, arg, &o->full)) return 2; break;
    case OPT_SWEEP: if (cli_parse_i64(cmd, "--sweep-chunk", arg, 1, 1 << 24, &o->sweep_chunk)) return 2; break;
    case OPT_MAXLEN:
        if (cli_parse_i64(cmd, "--max-completion-length", arg, 1, INT64_MAX / 2, &o->max_completion_length)) return 2;
        break;
    case OPT_SCALE:
        if (!strcmp(arg, "group")) o->scale = LS_SCALE_GROUP;
        else if (!strcmp(arg, "batch")) o->scale = LS_SCALE_BATCH;
        else if (!strcmp(arg, "none")) o->scale = LS_SCALE_NONE;
        else {
            fprintf(stderr, "longstraw %s: --scale-rewards: \"%s\" is not group, batch or none\n", cmd, arg);
            return 2;
        }
        break;
    case OPT_TEMP:
        if (cli_parse_f64(cmd, "--temperature", arg, 1e-6, 1e6, &d)) return 2;
        o->fwd.temperature = (float)d;
        break;
    case OPT_ITERS:
        if (cli_parse_i64(cmd, "--num-iterations", arg, 1, 1000, &v)) return 2;
        o->num_iterations = (int)v;
        break;
    case OPT_LR: if (cli_parse_f64(cmd, "--lr", arg, 0, 1e3, &o->lr)) return 2; break;
    case OPT_WD: if (cli_parse_f64(cmd, "--weight-decay", arg, 0, 1e3, &o->weight_decay)) return 2; break;
    case OPT_B1: if (cli_parse_f64(cmd, "--adam-beta1", arg, 0, 0.999999999, &o->beta1)) return 2; break;
    case OPT_B2: if (cli_parse_f64(cmd, "--adam-beta2", arg, 0, 0.999999999, &o->beta2)) return 2; break;
    case OPT_AEPS:
        if (cli_parse_f64(cmd, "--adam-eps", arg, 0, 1, &o->adam_eps)) return 2;
        if (o->adam_eps <= 0) { /* 0 makes 0/0 = NaN of every weight whose moments are 0 */
            fprintf(stderr, "longstraw %s: --adam-eps: %g must be > 0 (it keeps the step finite where the second "
                            "moment is 0)\n", cmd, o->adam_eps);
            return 2;
        }
        break;
    case OPT_MAXGN: if (cli_parse_f64(cmd, "--max-grad-norm", arg, 0, 1e12, &o->max_grad_norm)) return 2; break;
    case OPT_NOCAP: o->no_capture = 1; break;
    case OPT_CHUNK: if (cli_parse_i64(cmd, "--capture-chunk", arg, 1, 1 << 24, &o->fwd.capture_chunk)) return 2; break;
    case OPT_PAGE: if (cli_parse_i64(cmd, "--page-size", arg, 1, 1 << 20, &o->page_size)) return 2; break;
    case OPT_SDT: if (cli_parse_dtype(cmd, "--state-dtype", arg, &o->state_dtype)) return 2; break;
    case OPT_LAYOUT: if (cli_parse_layout(cmd, arg, &o->fwd.cp_layout)) return 2; break;
    case OPT_CPWAVE: if (cli_parse_i64(cmd, "--cp-wave", arg, 1, (int64_t)1 << 40, &o->fwd.cp_wave)) return 2; break;
    case OPT_THREADS: if (cli_parse_i64(cmd, "--threads", arg, 1, 4096, &t->threads)) return 2; break;
    case OPT_ADAPTER: t->adapter = arg; break;
    case OPT_LRANK: if (cli_parse_i64(cmd, "--lora-rank", arg, 1, 1 << 16, &t->lora_rank)) return 2; break;
    case OPT_LALPHA: if (cli_parse_f64(cmd, "--lora-alpha", arg, 1e-9, 1e9, &t->lora_alpha)) return 2; break;
    case OPT_LTARGETS: t->lora_targets = arg; break;
    case OPT_FORCE: t->force = 1; break;
    case OPT_LSEED: if (cli_parse_i64(cmd, "--lora-seed", arg, 0, INT64_MAX, &t->lora_seed)) return 2; break;
    case OPT_EP: if (cli_parse_i64(cmd, "--ep", arg, 1, 4096, &t->ep)) return 2; break;
    case OPT_IKL:
        if (cli_parse_f64(cmd, "--indexer-kl-coef", arg, 0, 1e6, &t->o.aux_loss_coef)) return 2;
        break;
    case OPT_BACKEND: t->backend = arg; break;
    case OPT_STATE_ON:
        if ((t->state_on_host = cli_parse_state_on(cmd, arg)) < 0) return 2;
        break;
    default: return -1; /* not ours */
    }
    return 0;
}

int cli_train_finish(const char *cmd, cli_train *t) {
    if (!t->eps_high_set) t->o.eps_high = t->o.eps_low;
    if (t->adapter && t->lora_rank) {
        fprintf(stderr, "longstraw %s: give --adapter or --lora-rank, not both\n", cmd);
        return 2;
    }
    if (t->o.beta > 0 && !t->ref_model && !t->adapter && !t->lora_rank) {
        fprintf(stderr, "longstraw %s: --beta %g needs --ref-model DIR (the reference policy; with LoRA the base serves)\n", cmd, t->o.beta);
        return 2;
    }
    if (ls_grpo_opts_check(&t->o) != LS_OK) { /* the library's own check: one message for every command */
        fprintf(stderr, "longstraw %s: %s\n", cmd, ls_err_msg());
        return 2;
    }
    if (t->o.aux_loss_coef > 0 && (t->adapter || t->lora_rank)) {
        fprintf(stderr, "longstraw %s: --indexer-kl-coef trains the indexers' own weights: not with LoRA (--lora-rank, "
                        "--adapter)\n", cmd);
        return 2;
    }
    ls_set_threads((int)t->threads);
    /* CP degree = world size / --ep; the expert-parallel ranks hold E/ep experts each */
    return cli_parallel(cmd, t->ep, &t->o.fwd.comm, &t->ep_comm) ? 2 : 0;
}


ls_policy_spec cli_policy_spec(const char *model, const cli_train *t) {
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

ls_status cli_trainable_open(ls_trainable *p, const char *model, const cli_train *t, int with_adam, ls_arenas *ar) {
    ls_policy_spec spec = cli_policy_spec(model, t);
    return ls_trainable_open(p, &spec, with_adam, ar);
}
