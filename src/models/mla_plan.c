/*
 * mla_plan.c — the MLA + DSA + MoE family's prompt-state inventory and parameter count
 * from its config (specs/mla-dsa-moe.md §2, §3, §5). Every product is checked: at the
 * lengths this family is for (GLM-5.2: 1M positions, 78 layers) a wrapped size would
 * print a small, wrong plan.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/mla.h"
#include "longstraw/hybrid.h"
#include "longstraw/cp.h"

static int mul(size_t a, size_t b, size_t *o) { return ls_mul_size(a, b, o); }
static int mul3(size_t a, size_t b, size_t c, size_t *o) { return mul(a, b, o) || mul(*o, c, o); }
static int add(size_t *acc, size_t v) { return ls_add_size(*acc, v, acc); }

ls_status ls_mla_state_plan(ls_mla_plan_t *p, const ls_config *cfg, int64_t prompt_len, int64_t page_size,
                            ls_dtype dtype, int cp, ls_cp_layout layout, int64_t capture_chunk) {
    if (cfg->family != &ls_mla_family) return ls_err(LS_ERR_ARG, "not an MLA-family config (%s)", cfg->model_type);
    /* the state's own plan (what ls_state_init allocates: pages, tables, the fullest rank),
     * broken down here into latent and index-key pages */
    ls_state_plan_t sp;
    LS_TRY(ls_state_plan(&sp, cfg, prompt_len, page_size, dtype, cp, layout, 0));
    memset(p, 0, sizeof *p);
    const ls_mla_config *m = ls_mla_cfg(cfg);
    p->positions = sp.positions;
    p->page_size = page_size;
    p->cp = cp;
    p->layout = layout;
    p->pages = sp.pages;
    p->pages_per_rank = sp.pages_per_rank;
    p->n_mla = ls_cfg_count_kind(cfg, LS_LAYER_MLA);
    p->n_index = ls_cfg_count_index_full(cfg);
    p->capture_chunk = capture_chunk;
    size_t esz = ls_dtype_size(dtype), ppr = (size_t)p->pages_per_rank, lpage, ipage;
    /* a latent page: S positions of [c_kv (kv_lora_rank) ; k_pe (qk_rope)]; an index page:
     * S positions of k_I (index_head_dim); each page right-sized and aligned (ls_state_plan
     * checked every product) */
    lpage = ls_align_up((size_t)page_size * (size_t)(m->kv_lora_rank + m->qk_rope) * esz);
    ipage = ls_align_up((size_t)page_size * (size_t)m->index_head_dim * esz);
    p->latent_layer_bytes_per_rank = ppr * lpage;
    p->index_layer_bytes_per_rank = ppr * ipage;
    p->latent_bytes_per_rank = p->latent_layer_bytes_per_rank * (size_t)p->n_mla;
    p->index_bytes_per_rank = p->index_layer_bytes_per_rank * (size_t)p->n_index;
    LS_ASSERT(p->latent_bytes_per_rank + p->index_bytes_per_rank == sp.kv_bytes_per_rank,
              "latent + index-key pages %zu + %zu, the state plan's pages %zu", p->latent_bytes_per_rank,
              p->index_bytes_per_rank, sp.kv_bytes_per_rank);
    p->table_bytes_per_rank = sp.table_bytes_per_rank;
    p->total_bytes_per_rank = sp.total_bytes_per_rank;
    if (cfg->n_experts > 0 && capture_chunk > 0 &&
        (mul3((size_t)capture_chunk, (size_t)cfg->top_k, (size_t)cfg->hidden, &p->routed_bytes_per_rank) ||
         mul3(p->routed_bytes_per_rank, 2, sizeof(float), &p->routed_bytes_per_rank)))
        return ls_err(LS_ERR_ARG, "capture chunk %lld: the MoE routed buffers overflow", (long long)capture_chunk);
    return LS_OK;
}

int ls_mla_param_count(const ls_config *c, size_t *out) {
    const ls_mla_config *m = ls_mla_cfg(c);
    size_t D = (size_t)c->hidden, H = (size_t)c->n_heads, dn = (size_t)m->qk_nope, dr = (size_t)m->qk_rope;
    size_t dv = (size_t)m->v_head, rq = (size_t)m->q_lora_rank, rkv = (size_t)m->kv_lora_rank;
    size_t nI = (size_t)m->index_heads, dI = (size_t)m->index_head_dim, E = (size_t)c->n_experts;
    size_t n = 0, t;
    for (int64_t i = 0; i < c->n_layers; i++) {
        int e = 0;
        e |= add(&n, 2 * D); /* input_layernorm, post_attention_layernorm */
        /* q_a_proj, q_a_layernorm, q_b_proj */
        e |= mul(rq, D, &t) || add(&n, t) || add(&n, rq) || mul3(H, dn + dr, rq, &t) || add(&n, t);
        e |= mul(rkv + dr, D, &t) || add(&n, t) || add(&n, rkv); /* kv_a_proj_with_mqa, kv_a_layernorm */
        e |= mul3(H, dn + dv, rkv, &t) || add(&n, t);           /* kv_b_proj */
        e |= mul3(D, H, dv, &t) || add(&n, t);                  /* o_proj */
        if (m->index_full[i]) /* indexer: wq_b (from the q latent), wk, k_norm (weight, bias), weights_proj */
            e |= mul3(nI, dI, rq, &t) || add(&n, t) || mul(dI, D, &t) || add(&n, t) || add(&n, 2 * dI) ||
                 mul(nI, D, &t) || add(&n, t);
        if (c->moe[i]) { /* gate, bias, routed experts, shared experts */
            size_t Im = (size_t)c->moe_inter, Is = Im * (size_t)m->n_shared_experts;
            e |= mul(E, D, &t) || add(&n, t) || add(&n, E) || mul3(E, 3 * Im, D, &t) || add(&n, t) ||
                 mul3(3, Is, D, &t) || add(&n, t);
        } else {
            e |= mul3(3, (size_t)c->intermediate, D, &t) || add(&n, t);
        }
        if (e) return 1;
    }
    if (mul((size_t)c->vocab, D, &t) || add(&n, t) || add(&n, D) || (!c->tie_embeddings && add(&n, t))) return 1;
    *out = n;
    return 0;
}

ls_status ls_mla_write_random(const char *config_path, const char *dir, uint64_t seed, ls_dtype dtype) {
    ls_config cfg;
    LS_TRY(ls_config_load(&cfg, config_path));
    if (cfg.family != &ls_mla_family) return ls_err(LS_ERR_ARG, "%s: not an MLA-family config", config_path);
    size_t params = 0;
    if (ls_mla_param_count(&cfg, &params) || params > ((size_t)1 << 31))
        return ls_err(LS_ERR_ARG, "%s: %zu parameters: `init` writes test-sized checkpoints (at most 2^31 weights)",
                      config_path, params);
    ls_hf_tensor_spec *sp = NULL;
    int64_t n = 0;
    LS_TRY(ls_mla_hf_specs(&cfg, &sp, &n));
    ls_status s = ls_write_random_checkpoint(config_path, dir, seed, dtype, sp, n);
    free(sp);
    return s;
}

/* ---- rotary frequencies and the softmax scale (spec §2) --------------------------- */

void ls_mla_rope_freqs(const ls_config *c, double *inv_freq, int *low, int *high) {
    const ls_mla_config *m = ls_mla_cfg(c);
    int dr = m->qk_rope, half = dr / 2;
    double base = c->rope_theta;
    for (int i = 0; i < half; i++) inv_freq[i] = pow(base, -2.0 * i / (double)dr);
    if (m->yarn_factor <= 1.0) {
        if (low) *low = 0;
        if (high) *high = 0;
        return;
    }
    /* the dims whose wavelength fits beta times into the original context keep their
     * frequency; the slow ones are divided by the factor; a linear ramp between */
    double orig = (double)m->yarn_orig_max, pi = acos(-1.0);
#define CORR(r) ((double)dr * log(orig / (2.0 * pi * (r))) / (2.0 * log(base)))
    int lo = (int)floor(CORR(m->yarn_beta_fast)), hi = (int)ceil(CORR(m->yarn_beta_slow));
#undef CORR
    lo = lo < 0 ? 0 : lo > dr - 1 ? dr - 1 : lo;
    hi = hi < 0 ? 0 : hi > dr - 1 ? dr - 1 : hi;
    if (lo == hi) hi = lo + 1; /* a zero-width ramp would divide by zero */
    for (int i = 0; i < half; i++) {
        double ramp = ((double)i - lo) / (double)(hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        inv_freq[i] = inv_freq[i] / m->yarn_factor * ramp + inv_freq[i] * (1.0 - ramp);
    }
    if (low) *low = lo;
    if (high) *high = hi;
}

double ls_mla_softmax_scale(const ls_config *c) {
    const ls_mla_config *m = ls_mla_cfg(c);
    double s = 1.0 / sqrt((double)(m->qk_nope + m->qk_rope));
    if (m->yarn_factor > 1.0) {
        double mm = 0.1 * m->yarn_mscale_all_dim * log(m->yarn_factor) + 1.0;
        s *= mm * mm;
    }
    return s;
}

/* `plan` (plan.h): latent pages per MLA layer, index-key pages per full indexer layer,
 * the MoE routed-hidden buffers of a capture chunk, and the fixed and grad terms of a
 * full fine-tune (per rank under expert parallelism). */
size_t ls_mla_cp_wave_bytes(const ls_config *c, int full) {
    const ls_mla_config *mc = ls_mla_cfg(c);
    size_t H = (size_t)c->n_heads, rkv = (size_t)mc->kv_lora_rank, dk = rkv + (size_t)mc->qk_rope;
    size_t f = H * dk + H * rkv + H;
    if (full) f += (size_t)mc->index_heads * (size_t)mc->index_head_dim + (size_t)mc->index_heads;
    return f * sizeof(float);
}

/* A layer of a CP capture (mla.c mla_cp_layer), the scratch beyond the shard residual:
 * the selection of the rank's positions (kept across layers) and their index keys, one
 * wave's per-position buffers (ls_mla_cp_wave_bytes over ls_cp_waves' positions), the
 * other ranks' index keys gathered whole with the prompt's page table, one query chunk's
 * block selection and partial, and the larger of the two gathers' round buffers. */
static size_t cp_capture_bytes(const ls_config *cfg, const ls_plan_request *rq, const ls_mla_plan_t *p) {
    if (rq->cp <= 1) return 0;
    const ls_mla_config *m = ls_mla_cfg(cfg);
    size_t S = (size_t)rq->page_size, esz = ls_dtype_size(rq->dtype), C = 2048;
    size_t tr = (size_t)p->pages_per_rank * S, H = (size_t)cfg->n_heads, rkv = (size_t)m->kv_lora_rank;
    size_t dk = rkv + (size_t)m->qk_rope, dI = (size_t)m->index_head_dim;
    size_t kk = (size_t)(m->index_topk < rq->prompt ? m->index_topk : rq->prompt);
    size_t lpage = S * dk * esz, ipage = S * dI * esz, remote = (size_t)(p->pages - p->pages_per_rank);
    int64_t nw, W = ls_cp_waves((int64_t)tr, (int64_t)C, rq->cp_wave, ls_mla_cp_wave_bytes(cfg, p->n_index > 0), &nw);
    size_t wr = (size_t)W < tr ? (size_t)W : tr, cq = C < wr ? C : wr;
    int64_t bp = (int64_t)C / rq->page_size > 0 ? (int64_t)C / rq->page_size : 1;
    int slots = rq->layout == LS_CP_ZIGZAG ? 2 : 1;
    size_t gl = ls_dist_gather_bytes(bp, rq->cp, slots, lpage, 0), gi = ls_dist_gather_bytes(bp, rq->cp, slots, ipage, 0);
    double b = (double)tr * (double)kk * 4 + (double)wr * (double)ls_mla_cp_wave_bytes(cfg, p->n_index > 0) +
               (p->n_index ? (double)tr * (double)dI * 4 + (double)remote * (double)ipage +
                                 (double)p->pages * sizeof(void *)
                           : 0) +
               (double)cq * (double)(kk + H * rkv + H) * 4 + (double)(gl > gi ? gl : gi);
    return b < 0x1p63 ? (size_t)b : SIZE_MAX;
}

/* Full mode under CP, the layer-major sweep (mla_sweep.c), scratch beyond the capture's
 * kinds: the selection of the rank's positions (kept while the layers sharing it run), one
 * wave's per-position buffers, one query chunk's selection and shares. */
static size_t cp_sweep_bytes(const ls_config *cfg, const ls_plan_request *rq, const ls_mla_plan_t *p) {
    if (rq->cp <= 1 || !rq->sweep_chunk) return 0;
    const ls_mla_config *m = ls_mla_cfg(cfg);
    size_t C = 2048, tr = (size_t)p->pages_per_rank * (size_t)rq->page_size, H = (size_t)cfg->n_heads;
    size_t rkv = (size_t)m->kv_lora_rank, dk = rkv + (size_t)m->qk_rope;
    size_t kk = (size_t)(m->index_topk < rq->prompt ? m->index_topk : rq->prompt);
    int64_t nw, W = ls_cp_waves((int64_t)tr, (int64_t)C, rq->cp_wave, ls_mla_cp_sweep_wave_bytes(cfg), &nw);
    size_t wr = (size_t)W < tr ? (size_t)W : tr, cq = C < wr ? C : wr;
    double b = (double)tr * (double)kk * 4 + (double)wr * (double)ls_mla_cp_sweep_wave_bytes(cfg) +
               (double)cq * (double)(kk + H * rkv + H + H * dk) * 4;
    return b < 0x1p63 ? (size_t)b : SIZE_MAX;
}

ls_status ls_mla_plan_doc(ls_plan_doc *d, const ls_config *cfg, const ls_plan_request *rq) {
    const char *path = rq->path;
    int ep = rq->ep, ikl = rq->aux_loss;
    ls_mla_plan_t p;
    ls_state_plan_t sp; /* the family's state plan: full mode's dState and chunk table */
    LS_TRY(ls_mla_state_plan(&p, cfg, rq->prompt, rq->page_size, rq->dtype, rq->cp, rq->layout, 2048));
    LS_TRY(ls_state_plan(&sp, cfg, rq->prompt, rq->page_size, rq->dtype, rq->cp, rq->layout, rq->sweep_chunk));
    if (ep > 1 && (cfg->n_experts == 0 || cfg->n_experts % ep != 0))
        return ls_err(LS_ERR_ARG, "%s: n_routed_experts %d does not split over --ep %d ranks", path, cfg->n_experts, ep);
    size_t params = 0, frozen = 0, experts = 0, w_bytes = 0, m_bytes = 0, g_bytes = 0, total = p.total_bytes_per_rank;
    ls_mla_tensor *tl = NULL;
    int64_t nt = 0;
    ls_status pc = ls_mla_param_count(cfg, &params) ? LS_ERR_ARG : LS_OK;
    if (pc == LS_OK && params <= ((size_t)1 << 40) && ls_mla_tensors(cfg, 0, cfg->n_experts, &tl, &nt) == LS_OK)
        for (int64_t i = 0; i < nt; i++) {
            size_t n = (size_t)(tl[i].shape[0] * tl[i].shape[1]);
            if (tl[i].frozen && !(ikl && strstr(tl[i].name, ".indexer."))) frozen += n;
            if (tl[i].expert >= 0) experts += n;
        }
    free(tl);
    size_t all = params; /* every rank holds the rest and E/ep experts */
    if (ep > 1 && params > 0) params -= experts - experts / (size_t)ep;
    if (pc != LS_OK || ls_mul_size(params, 4, &w_bytes) || ls_mul_size(params - frozen, 8, &m_bytes) ||
        ls_mul_size(params - frozen, 4, &g_bytes) ||
        ls_add_size(total, sp.dstate_bytes_per_rank + sp.ckpt_bytes_per_rank, &total) ||
        ls_add_size(total, sp.sweep_input_bytes_per_rank, &total))
        return ls_err(LS_ERR_ARG, "%s: the parameter count's byte size overflows 64 bits", path);
    size_t cp_attn = cp_capture_bytes(cfg, rq, &p), cp_sweep = cp_sweep_bytes(cfg, rq, &p);
    const char *dts = rq->dtype == LS_DTYPE_BF16 ? "bf16" : "f32";
    ls_plan_str(d, "family", "mla");
    ls_plan_str(d, "model_type", cfg->model_type);
    ls_plan_i64(d, "prompt", rq->prompt);
    ls_plan_i64(d, "captured_positions", p.positions);
    ls_plan_i64(d, "page_size", rq->page_size);
    ls_plan_i64(d, "ep", ep);
    ls_plan_i64(d, "experts_per_rank", cfg->n_experts / ep);
    ls_plan_size(d, "parameters_all_ranks", all);
    ls_plan_i64(d, "cp", rq->cp);
    ls_plan_str(d, "cp_layout", ls_cp_layout_name(rq->layout));
    ls_plan_str(d, "state_dtype", dts);
    ls_plan_i64(d, "mla_layers", p.n_mla);
    ls_plan_i64(d, "index_layers", p.n_index);
    ls_plan_i64(d, "pages_per_layer", p.pages);
    ls_plan_i64(d, "pages_per_rank", p.pages_per_rank);
    ls_plan_size(d, "latent_bytes_per_layer_per_rank", p.latent_layer_bytes_per_rank);
    ls_plan_size(d, "index_bytes_per_layer_per_rank", p.index_layer_bytes_per_rank);
    ls_plan_size(d, "latent_bytes_per_rank", p.latent_bytes_per_rank);
    ls_plan_size(d, "index_bytes_per_rank", p.index_bytes_per_rank);
    ls_plan_size(d, "table_bytes_per_rank", p.table_bytes_per_rank);
    ls_plan_size(d, "total_bytes_per_rank", total);
    ls_plan_size(d, "routed_bytes_per_rank", p.routed_bytes_per_rank);
    ls_plan_i64(d, "capture_chunk", p.capture_chunk);
    ls_plan_size(d, "cp_capture_bytes_per_rank", sp.cp_capture_bytes_per_rank);
    ls_plan_size(d, "cp_attn_bytes_per_rank", cp_attn);
    ls_plan_size(d, "cp_sweep_bytes_per_rank", cp_sweep);
    ls_plan_str(d, "mode", rq->sweep_chunk ? "full" : "prefix-frozen");
    ls_plan_i64(d, "sweep_chunk", rq->sweep_chunk);
    ls_plan_size(d, "dstate_bytes_per_rank", sp.dstate_bytes_per_rank);
    ls_plan_size(d, "ckpt_bytes_per_rank", sp.ckpt_bytes_per_rank);
    ls_plan_size(d, "sweep_input_bytes_per_rank", sp.sweep_input_bytes_per_rank);
    ls_plan_size(d, "parameters", params);
    ls_plan_size(d, "trainable_parameters", params - frozen);
    ls_plan_size(d, "weights_bytes_f32", w_bytes);
    ls_plan_size(d, "adamw_bytes", m_bytes);
    ls_plan_size(d, "grad_bytes", g_bytes);

    ls_plan_text(d, "prompt state plan: %s (%s, MLA + DSA indexer + MoE)", path, cfg->model_type);
    ls_plan_text(d, "  prompt P = %lld tokens, captured positions = %lld, page size S = %lld, CP = %d (%s), state dtype %s",
                 (long long)rq->prompt, (long long)p.positions, (long long)rq->page_size, rq->cp,
                 ls_cp_layout_name(rq->layout), dts);
    ls_plan_text(d, "  layers: %d MLA, of which %d run their own indexer (the others reuse its selection)", p.n_mla,
                 p.n_index);
    ls_plan_text(d, "  pages (S positions each): %lld in all, %lld per rank; per position an MLA layer keeps the latent +",
                 (long long)p.pages, (long long)p.pages_per_rank);
    ls_plan_text(d, "    rope key (%lld + %d values), a full indexer layer the index key (%d values)",
                 (long long)ls_mla_cfg(cfg)->kv_lora_rank, ls_mla_cfg(cfg)->qk_rope, ls_mla_cfg(cfg)->index_head_dim);
    ls_plan_text(d, "%s", "");
    ls_plan_text(d, "  %-40s %20s %12s", "per rank", "bytes", "GiB");
    const double mib = 1024.0 * 1024.0;
    ls_plan_row(d, p.latent_bytes_per_rank, "latent pages (%d MLA layers x %.2f MiB)", p.n_mla,
                (double)p.latent_layer_bytes_per_rank / mib);
    ls_plan_row(d, p.index_bytes_per_rank, "index-key pages (%d layers x %.2f MiB)", p.n_index,
                (double)p.index_layer_bytes_per_rank / mib);
    ls_plan_row(d, p.table_bytes_per_rank, "page tables + layer headers");
    if (rq->sweep_chunk) {
        ls_plan_row(d, sp.dstate_bytes_per_rank, "full mode: dState (f32, latent pages)");
        ls_plan_row(d, sp.ckpt_bytes_per_rank, "full mode: sweep chunks of %lld", (long long)rq->sweep_chunk);
        if (sp.sweep_input_bytes_per_rank)
            ls_plan_row(d, sp.sweep_input_bytes_per_rank, "full mode under CP: layer inputs");
    }
    ls_plan_row(d, total, "prompt arena total");
    if (rq->cp > 1) {
        ls_plan_row(d, sp.cp_capture_bytes_per_rank, "CP capture: shard residual (scratch)");
        ls_plan_row(d, cp_attn, "CP capture: attention buffers (scratch)");
        if (cp_sweep) ls_plan_row(d, cp_sweep, "CP sweep: layer buffers (scratch)");
    }
    ls_plan_row(d, p.routed_bytes_per_rank, "MoE routed hidden (chunk of %lld, f32)", (long long)p.capture_chunk);
    char what[320];
    int o = 0;
    if (ep > 1)
        o = snprintf(what, sizeof what, " per rank with EP %d: %d of %d routed experts; %zu on all ranks", ep,
                     cfg->n_experts / ep, cfg->n_experts, all);
    snprintf(what + o, sizeof what - (size_t)o, ", MTP layers excluded; %zu of the %s: no gradient, no moments", frozen,
             ikl ? "correction biases" : "indexers and correction biases");
    ls_plan_live_terms(d, params, w_bytes, m_bytes, g_bytes, what);
    return LS_OK;
}

/* FLOPs the MLA family's capture executes for n tokens: every projection (q_a, q_b, the
 * W_UK absorption, kv_a, W_UV, o_proj; on full indexer layers wq, wk, weights), the
 * indexer's scores (2·nI·dI per query × causal key), the sparse attention
 * (2·(rkv+dr) + 2·rkv per head × selected key) and the FFNs; the last layer computes only
 * what later tokens read (kv_a, and wk on a full indexer layer). */
double ls_mla_capture_flops(const ls_config *c, int64_t n) {
    const ls_mla_config *m = ls_mla_cfg(c);
    double D = (double)c->hidden, N = (double)n, H = (double)c->n_heads, f = 0;
    double rq = (double)m->q_lora_rank, rkv = (double)m->kv_lora_rank, dn = m->qk_nope, dr = m->qk_rope, dv = m->v_head;
    double nI = m->index_heads, dI = m->index_head_dim, k = (double)m->index_topk;
    double sel = 0; /* Σ_t min(k, t + 1) */
    for (int64_t t = 0; t < n; t++) sel += (double)(t + 1) < k ? (double)(t + 1) : k;
    for (int l = 0; l < c->n_layers; l++) {
        if (l == c->n_layers - 1) { /* its latent rows and index keys only */
            f += 2 * N * D * (rkv + dr) + (m->index_full[l] ? 2 * N * D * dI : 0);
            continue;
        }
        f += 2 * N * (D * rq + rq * H * (dn + dr) + H * dn * rkv + D * (rkv + dr) + H * rkv * dv + H * dv * D);
        if (m->index_full[l]) f += 2 * N * (rq * nI * dI + D * dI + D * nI) + 2 * nI * dI * (N * (N + 1) / 2);
        f += sel * H * (2 * (rkv + dr) + 2 * rkv);
        if (c->moe[l])
            f += 2 * N * D * c->n_experts + 2 * N * c->top_k * 3 * D * (double)c->moe_inter +
                 2 * N * 3 * D * (double)c->moe_inter * m->n_shared_experts;
        else
            f += 2 * N * 3 * D * (double)c->intermediate;
    }
    return f;
}
