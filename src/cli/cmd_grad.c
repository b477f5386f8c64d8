/*
 * cmd_grad.c — `longstraw grad` and `longstraw step`: one GRPO transaction over a
 * group. `grad` writes the gradient of the loss w.r.t. every trainable tensor under
 * the checkpoint's HF names without stepping; `step` runs the update and writes the
 * updated checkpoint and receipt.json.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_train.h"
#include "longstraw/backend.h"
#include "longstraw/files.h"
#include "longstraw/tokenizer.h"

static void help(const char *cmd) {
    if (!strcmp(cmd, "grad"))
        printf("usage: longstraw grad --model DIR --group FILE.json --out G.safetensors [options]\n\n"
               "Gradient of the GRPO loss w.r.t. every trainable tensor (f32, the checkpoint's HF\n"
               "names and layout), computed as a transaction: capture the prompt once, score,\n"
               "replay each response under a tape. No optimizer step.\n\n"
               "  --model DIR            checkpoint directory\n"
               "  --group FILE           group file with \"rewards\" or \"advantages\" (--loss sft: neither)\n"
               "  --out FILE             gradient safetensors (written atomically)\n"
               "  --receipt FILE         also write the receipt JSON\n"
               "  --tokenizer FILE       tokenizer.json: the group's prompt and responses may be text\n");
    else
        printf("usage: longstraw step --model DIR --group FILE.json --out DIR2 [options]\n\n"
               "One GRPO update (capture, score, replay, one AdamW call from a fresh optimizer\n"
               "state) and write DIR2/model.safetensors (f32), DIR2/config.json and\n"
               "DIR2/receipt.json, each atomically (temp file, fsync, rename).\n\n"
               "  --model DIR            checkpoint directory\n"
               "  --group FILE           group file with \"rewards\" or \"advantages\"\n"
               "  --out DIR2             output directory (created if missing)\n"
               "  --tokenizer FILE       tokenizer.json: the group's prompt and responses may be text\n");
    printf("  --help                 this text\n\n");
    cli_train_help();
}

static int run(const char *cmd, int argc, char **argv) {
    int is_step = !strcmp(cmd, "step");
    enum { O_MODEL = 1, O_GROUP, O_OUT, O_RECEIPT, O_HELP, O_TOK };
    struct option opts[64];
    int n = 0;
    opts[n++] = (struct option){"model", required_argument, 0, O_MODEL};
    opts[n++] = (struct option){"group", required_argument, 0, O_GROUP};
    opts[n++] = (struct option){"out", required_argument, 0, O_OUT};
    opts[n++] = (struct option){"receipt", required_argument, 0, O_RECEIPT};
    opts[n++] = (struct option){"help", no_argument, 0, O_HELP};
    opts[n++] = (struct option){"tokenizer", required_argument, 0, O_TOK};
    LS_ASSERT(n + cli_train_n_options < 64, "option table too small");
    for (int i = 0; i < cli_train_n_options; i++) opts[n++] = cli_train_option(i);
    opts[n] = (struct option){0, 0, 0, 0};
    const char *model = NULL, *group = NULL, *out = NULL, *receipt = NULL, *tokenizer = NULL;
    cli_train t;
    cli_train_init(&t);
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case O_MODEL: model = optarg; break;
        case O_GROUP: group = optarg; break;
        case O_OUT: out = optarg; break;
        case O_RECEIPT: receipt = optarg; break;
        case O_TOK: tokenizer = optarg; break;
        case O_HELP:
        case 'h': help(cmd); return 0;
        default: {
            int r = ch == '?' ? -1 : cli_train_parse(cmd, &t, ch, optarg);
            if (r == 2) return 2;
            if (r < 0) return cli_usage_error(cmd, "bad option");
        }
        }
    }
    if (optind < argc) return cli_usage_error(cmd, "unexpected argument \"%s\"", argv[optind]);
    if (!model || !group || !out) return cli_usage_error(cmd, "--model, --group and --out are required");
    if (!is_step && t.o.num_iterations != 1) return cli_usage_error(cmd, "--num-iterations applies to step only");
    { /* under mpirun every rank reads the same files (main.c compared the command lines) */
        const char *in[] = {model, group, tokenizer, t.ref_model, t.adapter};
        ls_status cs = ls_check_same_inputs(cli_cp_comm(), argc, argv, in, 5);
        if (cs != LS_OK) return cli_fail(cmd, cs);
    }
    if (cli_train_finish(cmd, &t)) return 2;

    const ls_backend *be;
    ls_status bs = ls_backend_open(t.backend, &be);
    if (bs != LS_OK) return cli_fail(cmd, bs);
    ls_arenas ar;
    ls_arenas_init(&ar);
    ls_arenas_set_backend(&ar, be);
    if (t.state_on_host) ls_arena_set_backend(&ar.a[LS_ARENA_PROMPT], ls_backend_cpu()); /* staged per layer */
    ls_trainable pol;
    memset(&pol, 0, sizeof pol);
    ls_group g;
    memset(&g, 0, sizeof g);
    ls_tokenizer *tok = NULL;
    int rc = 1;
    /* a bad --out fails before the update, not after it */
    ls_status s = is_step && cli_rank() == 0 ? ls_make_dir(out) : LS_OK;
    if (s == LS_OK) s = cli_trainable_open(&pol, model, &t, is_step, &ar);
    if (s == LS_OK && tokenizer) s = ls_tok_load(&tok, tokenizer);
    if (s == LS_OK) s = ls_group_load_ex(&g, group, pol.cfg->vocab, tok, 0);
    if (s == LS_OK && !t.force) s = ls_check_fits(&pol, &t.o, g.P, is_step);
    if (s == LS_OK) s = ls_grpo_group_check(&g, &t.o, group);
    ls_grpo_metrics mt;
    if (s == LS_OK) s = ls_grpo_update(&pol.p, is_step ? &pol.adam : NULL, &g, &t.o, &ar, &mt);
    if (s == LS_OK && !is_step && mt.skipped) /* a non-finite gradient is not an output */
        s = ls_err(LS_ERR_ARG, "%s; nothing written (the forward or backward overflowed: NaN/Inf weights, rewards "
                               "or activations)", mt.skip_reason);
    if (s != LS_OK) goto fail;
    int root = cli_rank() == 0; /* rank 0 alone writes outputs (the receipt gathers every rank) */
    if (!is_step) {
        char lossbuf[64];
        snprintf(lossbuf, sizeof lossbuf, "%.10g", mt.loss);
        /* with expert parallelism every rank takes part (the experts are gathered) */
        if (root || t.ep_comm) s = pol.p.fam->policy_save_grads(&pol.p, root ? LS_ST_FILE(out) : NULL, "loss", lossbuf);
        if (s == LS_OK && receipt) s = ls_receipt_write(receipt, cmd, &pol, &g, &t.o, &mt, &ar);
    } else {
        char path[4096];
        if (root || t.ep_comm) s = pol.p.fam->policy_save(&pol.p, &pol.spec, root ? out : NULL);
        snprintf(path, sizeof path, "%s/receipt.json", out);
        if (s == LS_OK) s = ls_receipt_write(receipt ? receipt : path, cmd, &pol, &g, &t.o, &mt, &ar);
    }
    if (s != LS_OK) goto fail;
    if (root && t.o.aux_loss_coef > 0) fprintf(stderr, "longstraw %s: indexer KL %.9g per response token\n", cmd, mt.aux_loss);
    if (root) fprintf(stderr, "longstraw %s: loss %.6g, grad norm %.6g, clip low/high %.3f/%.3f, kl %.4g, %.2fs\n", cmd,
            mt.loss, mt.grad_norm, mt.clip_low, mt.clip_high, mt.kl, mt.t_total);
    rc = 0;
    goto done;
fail:
    rc = cli_fail(cmd, s);
done:
    ls_trainable_close(&pol);
    ls_group_free(&g);
    ls_tok_free(tok);
    ls_arenas_free(&ar);
    ls_backend_close(be);
    return rc;
}

int cmd_grad(int argc, char **argv) { return run("grad", argc, argv); }
int cmd_step(int argc, char **argv) { return run("step", argc, argv); }
