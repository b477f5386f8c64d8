/*
 * hybrid_init.c — random checkpoints with HF names (for tests, benchmarks and the
 * demo). Initialisation follows specs/hybrid-qwen3next.md §8.3: decays that keep
 * the recurrent state alive, non-zero norm weights so the (1+w) convention matters.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/cp.h"
#include "longstraw/family.h"
#include "longstraw/hybrid.h"
#include "longstraw/safetensors.h"
#include "hybrid_tape.h"

static void fill(float *x, int64_t n, const ls_hf_tensor_spec *sp, ls_rng *r) {
    int64_t fan_in = sp->ndim >= 2 ? sp->shape[sp->ndim - 1] : 1;
    for (int64_t i = 0; i < n; i++) {
        double v = 0;
        switch (sp->init) {
        case LS_INIT_LINEAR: v = ls_rng_normal(r) / sqrt((double)fan_in); break;
        case LS_INIT_EMBED: v = ls_rng_normal(r); break;
        case LS_INIT_NORM0: v = 0.1 * ls_rng_normal(r); break;
        case LS_INIT_NORM1: v = 1.0 + 0.1 * ls_rng_normal(r); break;
        case LS_INIT_CONV: v = ls_rng_uniform(r) - 0.5; break;
        case LS_INIT_ALOG: v = log(0.05 + 0.95 * ls_rng_uniform(r)); break;
        case LS_INIT_DTBIAS: v = 0.5 * ls_rng_normal(r); break;
        case LS_INIT_BIAS0: v = 0.01 * ls_rng_normal(r); break;
        }
        x[i] = (float)v;
    }
}

ls_status ls_write_random_checkpoint(const char *config_path, const char *dir, uint64_t seed, ls_dtype dtype,
                                     const ls_hf_tensor_spec *sp, int64_t n) {
    ls_arena data; /* holds every tensor until the writer has written them */
    ls_arena_init(&data, "init", 0);
    ls_st_writer w;
    ls_st_writer_init(&w);
    ls_rng rng;
    ls_rng_seed(&rng, seed);
    ls_status s = LS_OK;
    for (int64_t i = 0; i < n && s == LS_OK; i++) {
        int64_t numel = 1;
        for (int d = 0; d < sp[i].ndim; d++) numel *= sp[i].shape[d];
        float *x = ls_arena_alloc(&data, (size_t)numel * sizeof(float));
        if (!x) {
            s = LS_ERR_NOMEM;
            break;
        }
        fill(x, numel, &sp[i], &rng);
        /* A_log, plain norm weights and biases stay f32, as the checkpoints store them
         * (hybrid spec §7.2; mla spec §4: the correction bias is fp32) */
        ls_init_kind k = sp[i].init;
        ls_dtype tdt = (k == LS_INIT_ALOG || k == LS_INIT_NORM1 || k == LS_INIT_BIAS0) ? LS_DTYPE_F32 : dtype;
        s = ls_st_writer_add_f32(&w, sp[i].name, tdt, sp[i].ndim, sp[i].shape, x);
    }
    if (s == LS_OK) s = ls_st_writer_add_meta(&w, "format", "pt");
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (s == LS_OK) s = ls_st_write(&w, path);
    char cfg_out[4096];
    snprintf(cfg_out, sizeof cfg_out, "%s/config.json", dir);
    if (s == LS_OK) s = ls_copy_file_atomic(config_path, cfg_out);
    ls_st_writer_free(&w);
    ls_arena_free(&data);
    return s;
}

ls_status ls_hybrid_write_random(const char *config_path, const char *dir, uint64_t seed,
                                 ls_dtype dtype) {
    ls_config cfg;
    LS_TRY(ls_config_load(&cfg, config_path));
    if (cfg.family != &ls_hybrid_family) /* names the family and what is missing */
        return ls_family_for(&cfg, config_path) ? LS_ERR_ARG : LS_ERR_UNSUPPORTED;
    ls_hf_tensor_spec *sp = NULL;
    int64_t n = 0;
    LS_TRY(ls_hybrid_hf_specs(&cfg, &sp, &n));
    ls_status s = ls_write_random_checkpoint(config_path, dir, seed, dtype, sp, n);
    free(sp);
    return s;
}

/* `plan` (plan.h): K/V pages of the full-attention layers, the Gated DeltaNet states,
 * full mode's dState and sweep checkpoints, and the fixed and grad terms of a full
 * fine-tune in f32. */
ls_status ls_hybrid_plan_doc(ls_plan_doc *d, const ls_config *cfg, const ls_plan_request *rq) {
    const char *path = rq->path;
    if (rq->aux_loss)
        return ls_err(LS_ERR_UNSUPPORTED, "--indexer-kl: %s is %s, which has no DSA indexer", path, cfg->model_type);
    if (rq->ep > 1)
        return ls_err(LS_ERR_UNSUPPORTED, "--ep %d: expert parallelism is built for the MLA family only (%s is %s)",
                      rq->ep, path, cfg->model_type);
    ls_state_plan_t p;
    LS_TRY(ls_state_plan(&p, cfg, rq->prompt, rq->page_size, rq->dtype, rq->cp, rq->layout, rq->sweep_chunk));
    ls_hf_tensor_spec *sp = NULL;
    int64_t nsp = 0;
    size_t params = 0, w_bytes = 0, m_bytes = 0;
    int over = 0;
    if (ls_hybrid_hf_specs(cfg, &sp, &nsp) == LS_OK) {
        for (int64_t i = 0; i < nsp && !over; i++) {
            size_t n = 1;
            for (int k = 0; k < sp[i].ndim && !over; k++) over = ls_mul_size(n, (size_t)sp[i].shape[k], &n);
            over = over || ls_add_size(params, n, &params);
        }
        free(sp);
    }
    if (over || ls_mul_size(params, 4, &w_bytes) || ls_mul_size(params, 8, &m_bytes))
        return ls_err(LS_ERR_ARG, "%s: the parameter count's byte size overflows 64 bits", path);
    size_t kv_layer_page =
        p.n_attn ? p.kv_bytes_per_rank / (size_t)p.n_attn / (size_t)(p.pages_per_rank ? p.pages_per_rank : 1) : 0;
    int full = rq->sweep_chunk > 0;
    const char *dts = rq->dtype == LS_DTYPE_BF16 ? "bf16" : "f32";
    ls_plan_i64(d, "prompt", rq->prompt);
    ls_plan_i64(d, "captured_positions", p.positions);
    ls_plan_i64(d, "page_size", rq->page_size);
    ls_plan_i64(d, "cp", p.cp);
    ls_plan_str(d, "cp_layout", ls_cp_layout_name(rq->layout));
    ls_plan_str(d, "state_dtype", dts);
    ls_plan_i64(d, "attention_layers", p.n_attn);
    ls_plan_i64(d, "gdn_layers", p.n_gdn);
    ls_plan_i64(d, "pages_per_layer", p.pages);
    ls_plan_i64(d, "pages_per_rank", p.pages_per_rank);
    ls_plan_i64(d, "page_objects_per_rank", (long long)p.pages_per_rank * p.n_attn * 2);
    ls_plan_size(d, "kv_bytes_per_rank", p.kv_bytes_per_rank);
    ls_plan_size(d, "gdn_bytes_per_rank", p.gdn_bytes_per_rank);
    ls_plan_size(d, "table_bytes_per_rank", p.table_bytes_per_rank);
    ls_plan_size(d, "total_bytes_per_rank", p.total_bytes_per_rank);
    ls_plan_size(d, "cp_capture_bytes_per_rank", p.cp_capture_bytes_per_rank);
    /* a CP capture's layer keeps per-position buffers for one wave of the rank's positions
     * (ls_cp_waves: --cp-wave, else as many as LS_CP_WAVE_BYTES hold). The GDN state scan
     * (hybrid.c): the outputs, z and correction vectors (one wave; with several, a snapshot
     * of the state per wave instead); an attention layer: q, gate, output and lse, one
     * query chunk's partial, the gather's round buffers */
    int64_t tr = p.pages_per_rank * rq->page_size, nws, nwa;
    ls_cp_waves(tr, 2048, rq->cp_wave, ls_hybrid_cp_scan_wave_bytes(cfg), &nws);
    int64_t wa = ls_cp_waves(tr, 2048, rq->cp_wave, ls_hybrid_cp_attn_wave_bytes(cfg), &nwa);
    const ls_hybrid_config *hcf = ls_hybrid_cfg(cfg);
    size_t sn = (size_t)hcf->H_v * (size_t)hcf->d_k * (size_t)hcf->d_v, mn = (size_t)hcf->H_v * (size_t)hcf->d_k * hcf->d_k;
    size_t scan = p.cp > 1 && p.n_gdn > 0
                      ? (nws == 1 ? (size_t)tr * ls_hybrid_cp_scan_wave_bytes(cfg) : (size_t)nws * (sn + mn) * sizeof(float))
                      : 0;
    ls_plan_size(d, "cp_scan_bytes_per_rank", scan);
    size_t attn = 0;
    if (p.cp > 1 && p.n_attn > 0) {
        size_t qd = (size_t)cfg->n_heads * (size_t)cfg->head_dim, C = 2048, rows = (size_t)(wa < tr ? wa : tr);
        size_t pb = (size_t)rq->page_size * (size_t)cfg->n_kv * (size_t)cfg->head_dim * ls_dtype_size(rq->dtype);
        int64_t bp = (int64_t)C / rq->page_size > 0 ? (int64_t)C / rq->page_size : 1;
        attn = rows * ls_hybrid_cp_attn_wave_bytes(cfg) + (C < rows ? C : rows) * (qd + (size_t)cfg->n_heads) * sizeof(float) +
               ls_dist_gather_bytes(bp, p.cp, rq->layout == LS_CP_ZIGZAG ? 2 : 1, pb, pb);
    }
    ls_plan_size(d, "cp_attn_bytes_per_rank", attn);
    /* full mode under CP: the layer-major sweep's per-position buffers of one layer over the
     * rank's positions (hybrid_sweep.c) when one wave holds them, else the chunk-major sweep
     * runs (0 here) */
    int64_t nwsw;
    ls_cp_waves(tr, 2048, rq->cp_wave, ls_hybrid_cp_sweep_bytes(cfg), &nwsw);
    size_t sweep = p.cp > 1 && full && nwsw == 1 ? (size_t)tr * ls_hybrid_cp_sweep_bytes(cfg) : 0;
    ls_plan_size(d, "cp_sweep_bytes_per_rank", sweep);
    ls_plan_str(d, "mode", full ? "full" : "prefix-frozen");
    ls_plan_i64(d, "sweep_chunk", p.sweep_chunk);
    ls_plan_i64(d, "sweep_chunks_per_rank", p.sweep_chunks_per_rank);
    ls_plan_size(d, "dstate_bytes_per_rank", p.dstate_bytes_per_rank);
    ls_plan_size(d, "ckpt_bytes_per_rank", p.ckpt_bytes_per_rank);
    ls_plan_size(d, "sweep_input_bytes_per_rank", p.sweep_input_bytes_per_rank);
    ls_plan_size(d, "parameters", params);
    ls_plan_size(d, "weights_bytes_f32", w_bytes);
    ls_plan_size(d, "adamw_bytes", m_bytes);
    ls_plan_size(d, "grad_bytes", w_bytes);

    ls_plan_text(d, "prompt state plan: %s (%s)", path, cfg->model_type);
    ls_plan_text(d, "  prompt P = %lld tokens, captured positions = %lld, page size S = %lld, CP = %d (%s), state dtype %s",
                 (long long)rq->prompt, (long long)p.positions, (long long)rq->page_size, p.cp,
                 ls_cp_layout_name(rq->layout), dts);
    ls_plan_text(d, "  layers: %d full attention, %d Gated DeltaNet", p.n_attn, p.n_gdn);
    ls_plan_text(d, "  pages (S positions each): %lld in all, %lld per rank; each page is one K and one V block",
                 (long long)p.pages, (long long)p.pages_per_rank);
    ls_plan_text(d, "    of %zu bytes per attention layer (%lld page blocks per rank)", kv_layer_page / 2,
                 (long long)p.pages_per_rank * p.n_attn * 2);
    ls_plan_text(d, "%s", "");
    ls_plan_text(d, "  %-40s %20s %12s", "per rank", "bytes", "GiB");
    ls_plan_row(d, p.kv_bytes_per_rank, "K/V pages (full attention)");
    ls_plan_row(d, p.gdn_bytes_per_rank, "GDN conv tail + recurrent state");
    ls_plan_row(d, p.table_bytes_per_rank, "page tables + layer headers");
    if (full) {
        ls_plan_row(d, p.dstate_bytes_per_rank, "full mode: dState (f32 dK/dV, dS)");
        ls_plan_row(d, p.ckpt_bytes_per_rank, "full mode: %lld sweep checkpoints", (long long)p.sweep_chunks_per_rank);
        if (p.sweep_input_bytes_per_rank) ls_plan_row(d, p.sweep_input_bytes_per_rank, "full mode under CP: layer inputs");
    }
    ls_plan_row(d, p.total_bytes_per_rank, "prompt arena total");
    if (p.cp > 1) ls_plan_row(d, p.cp_capture_bytes_per_rank, "CP capture: shard residual (scratch)");
    if (scan) ls_plan_row(d, scan, "CP capture: GDN scan buffers (scratch)");
    if (attn) ls_plan_row(d, attn, "CP capture: attention buffers (scratch)");
    if (sweep) ls_plan_row(d, sweep, "CP sweep: layer buffers (scratch)");
    ls_plan_live_terms(d, params, w_bytes, m_bytes, w_bytes, "");
    ls_plan_text(d, "  (branch: one member's tape, grows with R_i, not P; score: 4 bytes per response token)");
    return LS_OK;
}

/* FLOPs the hybrid's capture executes for n tokens: every projection (the last layer's
 * FFN is skipped, as capture skips it, and a last attention layer computes only its keys
 * and values), attention (4·hd per query-head × visible key) and the chunked gated delta
 * rule's matrix products. */
double ls_hybrid_capture_flops(const ls_config *c, int64_t n) {
    const ls_hybrid_config *hc = ls_hybrid_cfg(c);
    double D = (double)c->hidden, f = 0, N = (double)n;
    double kd = (double)ls_cfg_key_dim(c), vd = (double)ls_cfg_value_dim(c), cd = (double)ls_cfg_conv_dim(c);
    for (int l = 0; l < c->n_layers; l++) {
        if (c->kind[l] == LS_LAYER_GDN) {
            f += 2 * N * D * (cd + vd + 2 * hc->H_v) + 2 * N * vd * D;          /* in / out projections */
            double dk = hc->d_k, dv = hc->d_v, C = 64;
            f += N * hc->H_v * (3 * 2 * dk * dv + 2 * C * (2 * dk + dv) + C * (dk + dv)); /* chunked GDR */
            (void)kd;
        } else if (l == c->n_layers - 1) { /* only what later tokens read: k, v */
            f += 2 * N * D * 2 * (double)c->n_kv * c->head_dim;
        } else {
            double qd = (double)c->n_heads * c->head_dim, kvd = (double)c->n_kv * c->head_dim;
            f += 2 * N * D * (2 * qd + 2 * kvd) + 2 * N * qd * D;
            f += 4.0 * c->head_dim * c->n_heads * (N * (N + 1) / 2); /* causal scores + PV */
        }
        if (l == c->n_layers - 1) continue; /* capture skips the last FFN */
        if (c->moe[l]) {
            f += 2 * N * D * c->n_experts + 2 * N * c->top_k * 3 * D * (double)c->moe_inter;
            if (c->shared_inter) f += 2 * N * 3 * D * (double)c->shared_inter + 2 * N * D;
        } else {
            f += 2 * N * 3 * D * (double)c->intermediate;
        }
    }
    return f;
}
