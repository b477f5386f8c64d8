/*
 * mla_config.c — the MLA family's config.json: glm_moe_dsa / deepseek_v32
 * (specs/mla-dsa-moe.md §1, §8.5, §8.7). The generic fields come from
 * ls_cfg_parse_common.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "longstraw/config_fields.h"
#include "longstraw/mla.h"

/* glm_moe_dsa / deepseek_v32 (specs/mla-dsa-moe.md §1, §8.5, §8.7). */
ls_status ls_mla_parse_config(ls_config *c, const cJSON *o, const char *mt, int wrapped, const char *path) {
    (void)wrapped;
    int64_t v = 0;
    const int64_t BIG = (int64_t)1 << 40;
    int glm = strcmp(mt, "glm_moe_dsa") == 0;
    LS_TRY(ls_cfg_parse_common(c, o, mt, path));
    ls_mla_config *m = ls_mla_cfg_mut(c);
#define INT(key, dflt, req, lo, hi, dst) \
    LS_TRY(ls_cfg_get_int(o, key, dflt, req, lo, hi, &v, path)); \
    dst = v
    /* The indexer's query reads the q latent (spec §3): a plain q_proj layout (q_lora_rank
     * null) has no defined indexer query, so it is refused rather than guessed. */
    const cJSON *qr = cJSON_GetObjectItemCaseSensitive(o, "q_lora_rank");
    if (!qr || cJSON_IsNull(qr))
        return ls_err(LS_ERR_UNSUPPORTED, "%s: field \"q_lora_rank\" is %s: a plain q_proj (no q latent) leaves the "
                                          "DSA indexer's query undefined (specs/mla-dsa-moe.md §3); not supported",
                      path, qr ? "null" : "absent");
    INT("q_lora_rank", 0, 1, 1, 1 << 20, m->q_lora_rank);
    INT("kv_lora_rank", 0, 1, 1, 1 << 20, m->kv_lora_rank);
    INT("qk_nope_head_dim", 0, 1, 0, 4096, m->qk_nope);
    INT("qk_rope_head_dim", 0, 1, 2, 4096, m->qk_rope);
    INT("v_head_dim", 0, 1, 1, 4096, m->v_head);
    INT("index_n_heads", 0, 1, 1, 4096, m->index_heads);
    INT("index_head_dim", 0, 1, 1, 4096, m->index_head_dim);
    INT("index_topk", 0, 1, 1, BIG, m->index_topk);
    INT("intermediate_size", 0, 0, 0, BIG, c->intermediate);
    INT("n_routed_experts", 0, 0, 0, 1 << 20, c->n_experts);
    INT("num_experts_per_tok", 8, 0, 1, 1 << 20, c->top_k);
    INT("moe_intermediate_size", 0, 0, 0, BIG, c->moe_inter);
    INT("n_shared_experts", 0, 0, 0, 1024, m->n_shared_experts);
    INT("n_group", 1, 0, 1, 1 << 20, m->n_group);
    INT("topk_group", m->n_group, 0, 1, 1 << 20, m->topk_group);
    INT("num_nextn_predict_layers", 0, 0, 0, 64, m->n_mtp);
    int64_t first_dense, moe_freq, freq, offset;
    INT("first_k_dense_replace", 0, 0, 0, LS_MAX_LAYERS, first_dense);
    INT("moe_layer_freq", 1, 0, 1, LS_MAX_LAYERS, moe_freq);
    INT("index_topk_freq", 1, 0, 1, LS_MAX_LAYERS, freq);
    INT("index_skip_topk_offset", 2, 0, 0, LS_MAX_LAYERS, offset);
#undef INT
    c->head_dim = m->qk_nope + m->qk_rope;
    c->rot_dim = m->qk_rope;
    if (m->qk_rope % 2) return ls_err(LS_ERR_FORMAT, "%s: qk_rope_head_dim %d must be even", path, m->qk_rope);
    if (m->index_head_dim < m->qk_rope)
        return ls_err(LS_ERR_FORMAT, "%s: index_head_dim %d is below qk_rope_head_dim %d (its first %d dims are rope)",
                      path, m->index_head_dim, m->qk_rope, m->qk_rope);
    if (c->n_experts > 0 && c->top_k > c->n_experts)
        return ls_err(LS_ERR_FORMAT, "%s: num_experts_per_tok %d exceeds n_routed_experts %d", path, c->top_k,
                      c->n_experts);
    if (c->n_experts > 0 && (c->n_experts % m->n_group != 0 || m->topk_group > m->n_group))
        return ls_err(LS_ERR_FORMAT, "%s: n_routed_experts %d, n_group %d, topk_group %d: the experts must split "
                                     "into n_group groups and topk_group <= n_group", path, c->n_experts, m->n_group,
                      m->topk_group);
    double eps;
    LS_TRY(ls_cfg_get_num(o, "rms_norm_eps", 1e-6, 0.0, 1.0, &eps, path));
    c->eps = (float)eps;
    LS_TRY(ls_cfg_get_num(o, "routed_scaling_factor", 1.0, 0.0, 1e6, &m->routed_scaling, path));
    LS_TRY(ls_cfg_get_bool(o, "tie_word_embeddings", 0, &c->tie_embeddings, path));
    LS_TRY(ls_cfg_get_bool(o, "norm_topk_prob", 1, &c->norm_topk, path));
    LS_TRY(ls_cfg_get_bool(o, "indexer_rope_interleave", glm, &m->indexer_rope_interleave, path));
    LS_TRY(ls_cfg_get_bool(o, "rope_interleave", 1, &m->rope_interleave, path));
    const cJSON *sf = cJSON_GetObjectItemCaseSensitive(o, "scoring_func");
    if (sf && !cJSON_IsNull(sf) && !(cJSON_IsString(sf) && !strcmp(sf->valuestring, "sigmoid")))
        return ls_err(LS_ERR_UNSUPPORTED, "%s: field \"scoring_func\" must be \"sigmoid\" (spec §4)", path);
    /* rope: rope_parameters (v5) or rope_theta; rope_scaling {type yarn} */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(o, "rope_parameters");
    if (rp && !cJSON_IsObject(rp) && !cJSON_IsNull(rp))
        return ls_err(LS_ERR_FORMAT, "%s: field \"rope_parameters\" must be an object", path);
    const cJSON *src = (rp && cJSON_IsObject(rp) && cJSON_GetObjectItemCaseSensitive(rp, "rope_theta")) ? rp : o;
    LS_TRY(ls_cfg_get_num(src, "rope_theta", 10000.0, 1.0, 1e12, &c->rope_theta, path));
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(o, "rope_scaling");
    if (rs && cJSON_IsObject(rs)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rs, "type");
        if (!ty) ty = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "yarn") != 0)
            return ls_err(LS_ERR_UNSUPPORTED, "%s: rope_scaling of type \"%s\" is not supported (only yarn)", path,
                          cJSON_IsString(ty) ? ty->valuestring : "?");
        int64_t om;
        LS_TRY(ls_cfg_get_num(rs, "factor", 1.0, 1.0, 1e6, &m->yarn_factor, path));
        LS_TRY(ls_cfg_get_int(rs, "original_max_position_embeddings", 4096, 0, 1, BIG, &om, path));
        m->yarn_orig_max = om;
        LS_TRY(ls_cfg_get_num(rs, "beta_fast", 32.0, 0.0, 1e6, &m->yarn_beta_fast, path));
        LS_TRY(ls_cfg_get_num(rs, "beta_slow", 1.0, 0.0, 1e6, &m->yarn_beta_slow, path));
        LS_TRY(ls_cfg_get_num(rs, "mscale", 1.0, 0.0, 1e6, &m->yarn_mscale, path));
        LS_TRY(ls_cfg_get_num(rs, "mscale_all_dim", 0.0, 0.0, 1e6, &m->yarn_mscale_all_dim, path));
        double af;
        LS_TRY(ls_cfg_get_num(rs, "attention_factor", 1.0, 0.0, 1e6, &af, path));
        /* spec §2: cos/sin are not rescaled because mscale/mscale_all_dim = 1 */
        if (m->yarn_mscale != m->yarn_mscale_all_dim || af != 1.0)
            return ls_err(LS_ERR_UNSUPPORTED, "%s: rope_scaling with mscale %g != mscale_all_dim %g (or attention_factor "
                                              "%g != 1) rescales cos/sin: not supported", path, m->yarn_mscale,
                          m->yarn_mscale_all_dim, af);
    } else if (rs && !cJSON_IsNull(rs)) {
        return ls_err(LS_ERR_FORMAT, "%s: field \"rope_scaling\" must be an object", path);
    }
    for (int64_t i = 0; i < c->n_layers; i++) c->kind[i] = LS_LAYER_MLA;
    /* dense layers: mlp_layer_types, else first_k_dense_replace (and moe_layer_freq) */
    const cJSON *mlt = cJSON_GetObjectItemCaseSensitive(o, "mlp_layer_types");
    if (mlt && !cJSON_IsNull(mlt)) {
        LS_TRY(ls_cfg_layer_words(mlt, "mlp_layer_types", "sparse", "dense", c->n_layers, c->moe, path));
    } else {
        for (int64_t i = 0; i < c->n_layers; i++) c->moe[i] = i >= first_dense && i % moe_freq == 0;
    }
    for (int64_t i = 0; i < c->n_layers; i++) {
        if (c->moe[i] && (c->n_experts == 0 || c->moe_inter <= 0))
            return ls_err(LS_ERR_FORMAT, "%s: layer %lld is MoE but \"n_routed_experts\" or \"moe_intermediate_size\" "
                                         "is missing or 0", path, (long long)i);
        if (!c->moe[i] && c->intermediate <= 0)
            return ls_err(LS_ERR_FORMAT, "%s: layer %lld has a dense MLP but \"intermediate_size\" is missing or 0",
                          path, (long long)i);
    }
    /* IndexCache (spec §8.5): indexer_types, else index_topk_pattern, else the
     * freq/offset rule */
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, "indexer_types");
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(o, "index_topk_pattern");
    if ((!it || cJSON_IsNull(it)) && pat && !cJSON_IsNull(pat)) {
        /* a string of F/S, or an array of "F"/"S" ("full"/"shared") */
        int ok = cJSON_IsString(pat) ? (int64_t)strlen(pat->valuestring) == c->n_layers
                                     : cJSON_IsArray(pat) && cJSON_GetArraySize(pat) == c->n_layers;
        for (int64_t i = 0; ok && i < c->n_layers; i++) {
            const char *e = cJSON_IsString(pat) ? NULL : cJSON_GetStringValue(cJSON_GetArrayItem(pat, (int)i));
            char ch = cJSON_IsString(pat) ? pat->valuestring[i] : 0;
            if (ch == 'F' || (e && (!strcmp(e, "F") || !strcmp(e, "full")))) m->index_full[i] = 1;
            else if (ch == 'S' || (e && (!strcmp(e, "S") || !strcmp(e, "shared")))) m->index_full[i] = 0;
            else ok = 0;
        }
        if (!ok)
            return ls_err(LS_ERR_FORMAT, "%s: field \"index_topk_pattern\" must hold %lld entries of F or S", path,
                          (long long)c->n_layers);
    } else if (it && !cJSON_IsNull(it)) {
        LS_TRY(ls_cfg_layer_words(it, "indexer_types", "full", "shared", c->n_layers, m->index_full, path));
    } else {
        for (int64_t i = 0; i < c->n_layers; i++) {
            int64_t k = i - offset + 1;
            m->index_full[i] = (k > 0 ? k : 0) % freq == 0;
        }
    }
    if (!m->index_full[0])
        return ls_err(LS_ERR_FORMAT, "%s: layer 0 is a shared indexer layer: no earlier full layer to reuse", path);
    return LS_OK;
}


const char *const ls_mla_model_types[] = {"glm_moe_dsa", "deepseek_v32", NULL};

/* The prompt state's layout (family.h; specs/mla-dsa-moe.md §2, §3): every layer keeps
 * the latent row [c_kv ; k_pe] (with its gradient in full mode) and, on a full indexer
 * layer, the index key (no gradient: the selection is constant); no recurrent state. */
void ls_mla_state_layer(const ls_config *c, int l, ls_state_layer *out) {
    const ls_mla_config *mc = ls_mla_cfg(c);
    int64_t lat = (int64_t)mc->kv_lora_rank + mc->qk_rope, idx = mc->index_full[l] ? mc->index_head_dim : 0;
    *out = (ls_state_layer){.row = {lat, idx}, .grad_row = {lat, 0}, .recurrent = 0};
}

void ls_mla_state_recurrent(const ls_config *c, ls_state_recurrent *out) {
    (void)c;
    *out = (ls_state_recurrent){.table = 0, .sweep_inputs = 1};
}

int ls_cfg_count_index_full(const ls_config *c) {
    int n = 0;
    for (int64_t i = 0; i < c->n_layers; i++) n += ls_mla_cfg(c)->index_full[i];
    return n;
}
