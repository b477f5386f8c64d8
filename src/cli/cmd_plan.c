/*
 * cmd_plan.c — `longstraw plan`: the prompt-state inventory predicted from a config
 * (DESIGN §4): per layer kind and per rank, in bytes and GiB.
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include <stdlib.h>

#include "longstraw/config.h"
#include "longstraw/grpo.h"
#include "longstraw/mla.h"
#include "longstraw/model.h"
#include "longstraw/state.h"

static void help(void) {
    printf("usage: longstraw plan (--model DIR | --config FILE) --prompt P [options]\n\n"
           "Predict the prompt state a capture of P tokens keeps (x_1..x_{P-1}).\n\n"
           "  --model DIR          model directory (reads DIR/config.json)\n"
           "  --config FILE        an HF config.json\n"
           "  --prompt P           prompt length in tokens (required)\n"
           "  --page-size S        positions per K/V page (default 64)\n"
           "  --cp N               context-parallel ranks sharing the pages (default 1)\n"
           "  --cp-layout L        contiguous (rank r: block r of N) or zigzag (rank r: blocks\n"
           "                       r and 2N-1-r of 2N); default contiguous\n"
           "  --state-dtype T      K/V page storage: bf16 or f32 (default bf16)\n"
           "  --mode M             prefix-frozen (default) or full: adds the exact-gradient mode's\n"
           "                       dState (f32 dK/dV pages, d(S, conv tail)) and sweep checkpoints\n"
           "  --sweep-chunk N      full mode: positions per reverse-sweep chunk (default 512)\n"
           "  --indexer-kl         MLA family: the indexers trained too (--indexer-kl-coef > 0): their\n"
           "                       moments and gradients counted\n"
           "  --ep N               MLA family: the routed experts split over N expert-parallel ranks\n"
           "                       (weights, moments and gradients per rank hold E/N experts)\n"
           "  --json               print JSON instead of a table\n"
           "  --help               this text\n");
}

static double gib(size_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }
static double mib(size_t b) { return (double)b / (1024.0 * 1024.0); }

/* The fixed and grad terms of M_live (DESIGN §1) for a full fine-tune in f32. */
static void print_live_terms(size_t params, size_t w_bytes, size_t m_bytes, size_t g_bytes, int width,
                             const char *what) {
    printf("\n  other M_live terms, full fine-tune in f32 (%zu parameters%s):\n", params, what);
    printf("  %-*s %20zu %12.2f\n", width, "fixed: weights", w_bytes, gib(w_bytes));
    printf("  %-*s %20zu %12.2f\n", width, "fixed: AdamW moments", m_bytes, gib(m_bytes));
    printf("  %-*s %20zu %12.2f\n", width, "grad", g_bytes, gib(g_bytes));
}

/* The MLA + DSA + MoE family (mla.h): latent pages per MLA layer, index-key pages per
 * full indexer layer, the MoE routed-hidden buffers of a capture chunk. */
static int plan_mla(const ls_config *cfg, const char *path, int64_t P, int64_t S, ls_dtype dt, int cp,
                    ls_cp_layout lay, int64_t sweep, int ep, int ikl, int json) {
    ls_mla_plan_t p;
    ls_state_plan_t sp; /* the family's state plan: full mode's dState and chunk table */
    ls_status s = ls_mla_state_plan(&p, cfg, P, S, dt, cp, lay, 2048);
    if (s == LS_OK) s = ls_state_plan(&sp, cfg, P, S, dt, cp, lay, sweep);
    if (s != LS_OK) return cli_fail("plan", s);
    if (ep > 1 && (cfg->n_experts == 0 || cfg->n_experts % ep != 0))
        return cli_fail("plan", ls_err(LS_ERR_ARG, "%s: n_routed_experts %d does not split over --ep %d ranks", path,
                                       cfg->n_experts, ep));
    size_t params = 0, frozen = 0, experts = 0, w_bytes = 0, m_bytes = 0, g_bytes = 0, total = p.total_bytes_per_rank;
    ls_mla_tensor *tl = NULL;
    int64_t nt = 0;
    ls_status pc = ls_mla_param_count(cfg, &params);
    if (pc == LS_OK && params <= ((size_t)1 << 40) && ls_mla_tensors(cfg, 0, cfg->n_experts, &tl, &nt) == LS_OK)
        for (int64_t i = 0; i < nt; i++) {
            size_t n = (size_t)(tl[i].shape[0] * tl[i].shape[1]);
            if (tl[i].frozen && !(ikl && strstr(tl[i].name, ".indexer."))) frozen += n;
            if (tl[i].expert >= 0) experts += n;
        }
    free(tl);
    size_t all = params; /* every rank holds the rest and E/ep experts */
    if (ep > 1 && params > 0) params -= experts - experts / (size_t)ep;
    if (pc != LS_OK || ls_mul_size(params, 4, &w_bytes) ||
        ls_mul_size(params - frozen, 8, &m_bytes) || ls_mul_size(params - frozen, 4, &g_bytes) ||
        ls_add_size(total, sp.dstate_bytes_per_rank + sp.ckpt_bytes_per_rank, &total))
        return cli_fail("plan", ls_err(LS_ERR_ARG, "%s: the parameter count's byte size overflows 64 bits", path));
    const char *dts = dt == LS_DTYPE_BF16 ? "bf16" : "f32";
    if (json) {
        printf("{\"family\": \"mla\", \"model_type\": \"%s\", \"prompt\": %lld, \"captured_positions\": %lld, "
               "\"page_size\": %lld, \"ep\": %d, \"experts_per_rank\": %d, \"parameters_all_ranks\": %zu, \"cp\": %d, \"cp_layout\": \"%s\", \"state_dtype\": \"%s\", "
               "\"mla_layers\": %d, \"index_layers\": %d, \"pages_per_layer\": %lld, \"pages_per_rank\": %lld, "
               "\"latent_bytes_per_layer_per_rank\": %zu, \"index_bytes_per_layer_per_rank\": %zu, "
               "\"latent_bytes_per_rank\": %zu, \"index_bytes_per_rank\": %zu, \"table_bytes_per_rank\": %zu, "
               "\"total_bytes_per_rank\": %zu, \"routed_bytes_per_rank\": %zu, \"capture_chunk\": %lld, "
               "\"mode\": \"%s\", \"sweep_chunk\": %lld, \"dstate_bytes_per_rank\": %zu, \"ckpt_bytes_per_rank\": %zu, "
               "\"parameters\": %zu, \"trainable_parameters\": %zu, \"weights_bytes_f32\": %zu, \"adamw_bytes\": %zu, "
               "\"grad_bytes\": %zu}\n",
               cfg->model_type, (long long)P, (long long)p.positions, (long long)S, ep, cfg->n_experts / ep, all, cp,
               ls_cp_layout_name(lay), dts,
               p.n_mla, p.n_index, (long long)p.pages, (long long)p.pages_per_rank, p.latent_layer_bytes_per_rank,
               p.index_layer_bytes_per_rank, p.latent_bytes_per_rank, p.index_bytes_per_rank, p.table_bytes_per_rank,
               total, p.routed_bytes_per_rank, (long long)p.capture_chunk, sweep ? "full" : "prefix-frozen",
               (long long)sweep, sp.dstate_bytes_per_rank, sp.ckpt_bytes_per_rank, params, params - frozen, w_bytes,
               m_bytes, g_bytes);
        return 0;
    }
    printf("prompt state plan: %s (%s, MLA + DSA indexer + MoE)\n", path, cfg->model_type);
    printf("  prompt P = %lld tokens, captured positions = %lld, page size S = %lld, CP = %d (%s), state dtype %s\n",
           (long long)P, (long long)p.positions, (long long)S, cp, ls_cp_layout_name(lay), dts);
    printf("  layers: %d MLA, of which %d run their own indexer (the others reuse its selection)\n", p.n_mla,
           p.n_index);
    printf("  pages (S positions each): %lld in all, %lld per rank; per position an MLA layer keeps the latent +\n"
           "    rope key (%lld + %d values), a full indexer layer the index key (%d values)\n",
           (long long)p.pages, (long long)p.pages_per_rank, (long long)cfg->mla.kv_lora_rank, cfg->mla.qk_rope,
           cfg->mla.index_head_dim);
    printf("\n  %-40s %20s %12s\n", "per rank", "bytes", "GiB");
    char row[96];
    snprintf(row, sizeof row, "latent pages (%d MLA layers x %.2f MiB)", p.n_mla, mib(p.latent_layer_bytes_per_rank));
    printf("  %-40s %20zu %12.4f\n", row, p.latent_bytes_per_rank, gib(p.latent_bytes_per_rank));
    snprintf(row, sizeof row, "index-key pages (%d layers x %.2f MiB)", p.n_index, mib(p.index_layer_bytes_per_rank));
    printf("  %-40s %20zu %12.4f\n", row, p.index_bytes_per_rank, gib(p.index_bytes_per_rank));
    printf("  %-40s %20zu %12.4f\n", "page tables + layer headers", p.table_bytes_per_rank, gib(p.table_bytes_per_rank));
    if (sweep) {
        printf("  %-40s %20zu %12.4f\n", "full mode: dState (f32, latent pages)", sp.dstate_bytes_per_rank,
               gib(sp.dstate_bytes_per_rank));
        snprintf(row, sizeof row, "full mode: sweep chunks of %lld", (long long)sweep);
        printf("  %-40s %20zu %12.4f\n", row, sp.ckpt_bytes_per_rank, gib(sp.ckpt_bytes_per_rank));
    }
    printf("  %-40s %20zu %12.4f\n", "prompt arena total", total, gib(total));
    snprintf(row, sizeof row, "MoE routed hidden (chunk of %lld, f32)", (long long)p.capture_chunk);
    printf("  %-40s %20zu %12.4f\n", row, p.routed_bytes_per_rank, gib(p.routed_bytes_per_rank));
    char what[320];
    int o = 0;
    if (ep > 1)
        o = snprintf(what, sizeof what, " per rank with EP %d: %d of %d routed experts; %zu on all ranks", ep,
                     cfg->n_experts / ep, cfg->n_experts, all);
    snprintf(what + o, sizeof what - (size_t)o, ", MTP layers excluded; %zu of the %s: no gradient, no moments", frozen,
             ikl ? "correction biases" : "indexers and correction biases");
    print_live_terms(params, w_bytes, m_bytes, g_bytes, 40, what);
    return 0;
}

int cmd_plan(int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"config", required_argument, 0, 'c'},
                                         {"prompt", required_argument, 0, 'p'},
                                         {"page-size", required_argument, 0, 's'},
                                         {"cp", required_argument, 0, 'r'},
                                         {"state-dtype", required_argument, 0, 'd'},
                                         {"cp-layout", required_argument, 0, 'l'},
                                         {"mode", required_argument, 0, 'M'},
                                         {"sweep-chunk", required_argument, 0, 'w'},
                                         {"ep", required_argument, 0, 'e'},
                                         {"indexer-kl", no_argument, 0, 'k'},
                                         {"json", no_argument, 0, 'j'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *model = NULL, *config = NULL;
    int64_t P = -1, S = 64, cp = 1;
    ls_dtype dt = LS_DTYPE_BF16;
    ls_cp_layout lay = LS_CP_CONTIGUOUS;
    int full = 0;
    int64_t sweep = 512, ep = 1;
    int json = 0, ikl = 0, ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case 'm': model = optarg; break;
        case 'c': config = optarg; break;
        case 'p': if (cli_parse_i64("plan", "--prompt", optarg, 1, INT64_MAX / 2, &P)) return 2; break;
        case 's': if (cli_parse_i64("plan", "--page-size", optarg, 1, 1 << 20, &S)) return 2; break;
        case 'r': if (cli_parse_i64("plan", "--cp", optarg, 1, 65536, &cp)) return 2; break;
        case 'd': if (cli_parse_dtype("plan", "--state-dtype", optarg, &dt)) return 2; break;
        case 'l': if (cli_parse_layout("plan", optarg, &lay)) return 2; break;
        case 'M': if (cli_parse_mode("plan", optarg, &full)) return 2; break;
        case 'w': if (cli_parse_i64("plan", "--sweep-chunk", optarg, 1, INT64_MAX / 4, &sweep)) return 2; break;
        case 'k': ikl = 1; break;
        case 'e': if (cli_parse_i64("plan", "--ep", optarg, 1, 4096, &ep)) return 2; break;
        case 'j': json = 1; break;
        case 'h': help(); return 0;
        default: return cli_usage_error("plan", "bad option");
        }
    }
    if (optind < argc) return cli_usage_error("plan", "unexpected argument \"%s\"", argv[optind]);
    if (!model == !config) return cli_usage_error("plan", "give exactly one of --model or --config");
    if (P < 0) return cli_usage_error("plan", "--prompt is required");
    { /* what `grad`/`step`/`train` would refuse, refused here the same way (the library's check) */
        ls_grpo_opts o;
        ls_grpo_opts_default(&o);
        o.full = full;
        o.sweep_chunk = sweep;
        o.indexer_kl_coef = ikl ? 1.0 : 0.0;
        if (ls_grpo_opts_check(&o) != LS_OK) {
            fprintf(stderr, "longstraw plan: %s\n", ls_err_msg());
            return 2;
        }
    }
    char path[4096];
    if (model) snprintf(path, sizeof path, "%s/config.json", model);
    else snprintf(path, sizeof path, "%s", config);
    ls_config cfg;
    ls_status s = ls_config_load(&cfg, path);
    if (s != LS_OK) return cli_fail("plan", s);
    if (cfg.family == LS_FAMILY_MLA) {
        return plan_mla(&cfg, path, P, S, dt, (int)cp, lay, full ? sweep : 0, (int)ep, ikl, json);
    }
    if (ikl) return cli_usage_error("plan", "--indexer-kl: %s is %s, which has no DSA indexer", path, cfg.model_type);
    if (ep > 1)
        return cli_usage_error("plan", "--ep %lld: expert parallelism is built for the MLA family only (%s is %s)",
                               (long long)ep, path, cfg.model_type);
    const ls_family *fam = ls_family_for(&cfg, path);
    if (!fam) return cli_fail("plan", LS_ERR_UNSUPPORTED);
    ls_state_plan_t p;
    s = fam->state_plan(&p, &cfg, P, S, dt, (int)cp, lay, full ? sweep : 0);
    if (s != LS_OK) return cli_fail("plan", s);
    /* fixed and grad terms of M_live (DESIGN §1) for a full fine-tune in f32 */
    ls_hf_tensor_spec *sp = NULL;
    int64_t nsp = 0;
    size_t params = 0, w_bytes = 0, m_bytes = 0;
    int over = 0;
    if (ls_hybrid_hf_specs(&cfg, &sp, &nsp) == LS_OK) {
        for (int64_t i = 0; i < nsp && !over; i++) {
            size_t n = 1;
            for (int d = 0; d < sp[i].ndim && !over; d++) over = ls_mul_size(n, (size_t)sp[i].shape[d], &n);
            over = over || ls_add_size(params, n, &params);
        }
        free(sp);
    }
    if (over || ls_mul_size(params, 4, &w_bytes) || ls_mul_size(params, 8, &m_bytes))
        return cli_fail("plan", ls_err(LS_ERR_ARG, "%s: the parameter count's byte size overflows 64 bits", path));
    size_t kv_layer_page = p.n_attn ? p.kv_bytes_per_rank / (size_t)p.n_attn / (size_t)(p.pages_per_rank ? p.pages_per_rank : 1) : 0;
    if (json) {
        printf("{\"prompt\": %lld, \"captured_positions\": %lld, \"page_size\": %lld, \"cp\": %d, "
               "\"cp_layout\": \"%s\", "
               "\"state_dtype\": \"%s\", \"attention_layers\": %d, \"gdn_layers\": %d, "
               "\"pages_per_layer\": %lld, \"pages_per_rank\": %lld, \"page_objects_per_rank\": %lld, "
               "\"kv_bytes_per_rank\": %zu, \"gdn_bytes_per_rank\": %zu, \"table_bytes_per_rank\": %zu, "
               "\"total_bytes_per_rank\": %zu, \"cp_capture_bytes_per_rank\": %zu, \"mode\": \"%s\", "
               "\"sweep_chunk\": %lld, \"sweep_chunks_per_rank\": %lld, \"dstate_bytes_per_rank\": %zu, "
               "\"ckpt_bytes_per_rank\": %zu, \"parameters\": %zu, "
               "\"weights_bytes_f32\": %zu, "
               "\"adamw_bytes\": %zu, \"grad_bytes\": %zu}\n",
               (long long)P, (long long)p.positions, (long long)S, p.cp, ls_cp_layout_name(lay),
               dt == LS_DTYPE_BF16 ? "bf16" : "f32", p.n_attn, p.n_gdn, (long long)p.pages, (long long)p.pages_per_rank,
               (long long)p.pages_per_rank * p.n_attn * 2, p.kv_bytes_per_rank, p.gdn_bytes_per_rank,
               p.table_bytes_per_rank, p.total_bytes_per_rank, p.cp_capture_bytes_per_rank,
               full ? "full" : "prefix-frozen", (long long)p.sweep_chunk, (long long)p.sweep_chunks_per_rank,
               p.dstate_bytes_per_rank, p.ckpt_bytes_per_rank, params, w_bytes, m_bytes,
               w_bytes);
        return 0;
    }
    printf("prompt state plan: %s (%s)\n", path, cfg.model_type);
    printf("  prompt P = %lld tokens, captured positions = %lld, page size S = %lld, CP = %d (%s), state dtype %s\n",
           (long long)P, (long long)p.positions, (long long)S, p.cp, ls_cp_layout_name(lay),
           dt == LS_DTYPE_BF16 ? "bf16" : "f32");
    printf("  layers: %d full attention, %d Gated DeltaNet\n", p.n_attn, p.n_gdn);
    printf("  pages (S positions each): %lld in all, %lld per rank; each page is one K and one V block\n"
           "    of %zu bytes per attention layer (%lld page blocks per rank)\n",
           (long long)p.pages, (long long)p.pages_per_rank, kv_layer_page / 2,
           (long long)p.pages_per_rank * p.n_attn * 2);
    printf("\n  %-34s %20s %12s\n", "per rank", "bytes", "GiB");
    printf("  %-34s %20zu %12.2f\n", "K/V pages (full attention)", p.kv_bytes_per_rank, gib(p.kv_bytes_per_rank));
    printf("  %-34s %20zu %12.4f\n", "GDN conv tail + recurrent state", p.gdn_bytes_per_rank, gib(p.gdn_bytes_per_rank));
    printf("  %-34s %20zu %12.4f\n", "page tables + layer headers", p.table_bytes_per_rank, gib(p.table_bytes_per_rank));
    if (full) {
        printf("  %-34s %20zu %12.2f\n", "full mode: dState (f32 dK/dV, dS)", p.dstate_bytes_per_rank,
               gib(p.dstate_bytes_per_rank));
        char row[64];
        snprintf(row, sizeof row, "full mode: %lld sweep checkpoints", (long long)p.sweep_chunks_per_rank);
        printf("  %-34s %20zu %12.4f\n", row, p.ckpt_bytes_per_rank, gib(p.ckpt_bytes_per_rank));
    }
    printf("  %-34s %20zu %12.2f\n", "prompt arena total", p.total_bytes_per_rank, gib(p.total_bytes_per_rank));
    if (p.cp > 1)
        printf("  %-34s %20zu %12.2f\n", "CP capture: shard residual (scratch)", p.cp_capture_bytes_per_rank,
               gib(p.cp_capture_bytes_per_rank));
    print_live_terms(params, w_bytes, m_bytes, w_bytes, 34, "");
    printf("  (branch: one member's tape, grows with R_i, not P; score: 4 bytes per response token)\n");
    return 0;
}
