/*
 * cmd_train_common.c — the objective, optimizer and engine flags shared by
 * `longstraw grad` and `longstraw step`, and the receipt writer.
 */
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

/* The training flags are the library's table (flags.h); getopt codes 1000 + index. */
enum { OPT_BASE = 1000 };

struct option cli_train_option(int i) {
    const ls_train_flag *f = &ls_train_flag_table[i];
    return (struct option){f->name, f->takes_value ? required_argument : no_argument, 0, OPT_BASE + i};
}

static int report(const char *cmd, ls_status s) {
    if (s == LS_OK) return 0;
    fprintf(stderr, "longstraw %s: %s\n", cmd, ls_err_msg());
    return 1;
}

int cli_parse_state_on(const char *cmd, const char *arg) {
    int host = 0;
    return report(cmd, ls_flag_state_on("--state-on", arg, &host)) ? -1 : host;
}

int cli_parse_f64(const char *cmd, const char *flag, const char *s, double lo, double hi, double *out) {
    return report(cmd, ls_flag_f64(flag, s, lo, hi, out));
}

void cli_train_init(cli_train *t) { ls_train_flags_init(t); }

int cli_train_parse(const char *cmd, cli_train *t, int ch, const char *arg) {
    if (ch < OPT_BASE || ch >= OPT_BASE + ls_train_flag_count) return -1; /* not ours */
    int known = 0;
    return report(cmd, ls_train_flag_set(t, ls_train_flag_table[ch - OPT_BASE].name, arg, &known)) ? 2 : 0;
}

int cli_train_finish(const char *cmd, cli_train *t) {
    if (report(cmd, ls_train_flags_finish(t))) return 2;
    ls_set_threads((int)t->threads);
    /* CP degree = world size / --ep; the expert-parallel ranks hold E/ep experts each */
    return cli_parallel(cmd, t->ep, &t->o.fwd.comm, &t->ep_comm) ? 2 : 0;
}


ls_policy_spec cli_policy_spec(const char *model, const cli_train *t) { return ls_train_flags_spec(model, t); }

ls_status cli_trainable_open(ls_trainable *p, const char *model, const cli_train *t, int with_adam, ls_arenas *ar) {
    ls_policy_spec spec = cli_policy_spec(model, t);
    return ls_trainable_open(p, &spec, with_adam, ar);
}
