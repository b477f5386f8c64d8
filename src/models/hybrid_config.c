/*
 * hybrid_config.c — the hybrid family's config.json (specs/hybrid-qwen3next.md §1):
 * model_type qwen3_next; qwen3_5 / qwen3_5_moe with text_config; qwen3_5_text /
 * qwen3_5_moe_text. The generic fields come from ls_cfg_parse_common.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "longstraw/config_fields.h"
#include "longstraw/hybrid.h"

static ls_status parse_text(ls_config *c, const cJSON *o, const char *mt, int is_q35, int is_moe35, const char *path) {
    int64_t v = 0;
    const int64_t BIG = (int64_t)1 << 40;
    LS_TRY(ls_cfg_parse_common(c, o, mt, path));
    ls_hybrid_cfg_mut(c)->layout = is_q35 ? LS_LAYOUT_QWEN3_5 : LS_LAYOUT_QWEN3_NEXT;
#define INT(key, dflt, req, lo, hi, dst) \
    LS_TRY(ls_cfg_get_int(o, key, dflt, req, lo, hi, &v, path)); \
    dst = v
    INT("head_dim", 256, 0, 2, 4096, c->head_dim);
    INT("linear_num_key_heads", 16, 0, 1, 4096, ls_hybrid_cfg_mut(c)->H_k);
    INT("linear_num_value_heads", 32, 0, 1, 4096, ls_hybrid_cfg_mut(c)->H_v);
    INT("linear_key_head_dim", 128, 0, 1, 4096, ls_hybrid_cfg_mut(c)->d_k);
    INT("linear_value_head_dim", 128, 0, 1, 4096, ls_hybrid_cfg_mut(c)->d_v);
    INT("linear_conv_kernel_dim", 4, 0, 1, 64, ls_hybrid_cfg_mut(c)->conv_k);
    INT("intermediate_size", 0, 0, 0, BIG, c->intermediate);
    INT("num_experts", is_q35 && !is_moe35 ? 0 : 512, 0, 0, 1 << 20, c->n_experts);
    INT("num_experts_per_tok", 10, 0, 1, 1 << 20, c->top_k);
    INT("moe_intermediate_size", 512, 0, 1, BIG, c->moe_inter);
    INT("shared_expert_intermediate_size", is_q35 ? 0 : 512, 0, 0, BIG, c->shared_inter);
    int64_t sparse_step;
    INT("decoder_sparse_step", 1, 0, 1, LS_MAX_LAYERS, sparse_step);
#undef INT
    if (is_q35 && !is_moe35) c->n_experts = 0; /* HF drops MoE fields of dense Qwen3.5 */
    if (c->n_heads % c->n_kv != 0)
        return ls_err(LS_ERR_FORMAT, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                      path, c->n_heads, c->n_kv);
    if (ls_hybrid_cfg_mut(c)->H_v % ls_hybrid_cfg_mut(c)->H_k != 0)
        return ls_err(LS_ERR_FORMAT, "%s: linear_num_value_heads %d is not a multiple of linear_num_key_heads %d",
                      path, ls_hybrid_cfg_mut(c)->H_v, ls_hybrid_cfg_mut(c)->H_k);
    if (c->n_experts > 0 && c->top_k > c->n_experts)
        return ls_err(LS_ERR_FORMAT, "%s: num_experts_per_tok %d exceeds num_experts %d", path,
                      c->top_k, c->n_experts);
    double eps;
    LS_TRY(ls_cfg_get_num(o, "rms_norm_eps", 1e-6, 0.0, 1.0, &eps, path));
    c->eps = (float)eps;
    LS_TRY(ls_cfg_get_bool(o, "tie_word_embeddings", 0, &c->tie_embeddings, path));
    LS_TRY(ls_cfg_get_bool(o, "norm_topk_prob", 1, &c->norm_topk, path));
    if (is_moe35) c->norm_topk = 1; /* Qwen3.5-MoE's router always renormalises (spec §1) */

    /* rope: top level, or inside rope_parameters (v5) / rope_scaling */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(o, "rope_parameters");
    if (rp && !cJSON_IsObject(rp) && !cJSON_IsNull(rp))
        return ls_err(LS_ERR_FORMAT, "%s: field \"rope_parameters\" must be an object", path);
    const cJSON *src = (rp && cJSON_IsObject(rp) && cJSON_GetObjectItemCaseSensitive(rp, "rope_theta")) ? rp : o;
    LS_TRY(ls_cfg_get_num(src, "rope_theta", 10000.0, 1.0, 1e12, &c->rope_theta, path));
    src = (rp && cJSON_IsObject(rp) && cJSON_GetObjectItemCaseSensitive(rp, "partial_rotary_factor")) ? rp : o;
    LS_TRY(ls_cfg_get_num(src, "partial_rotary_factor", 0.25, 0.0, 1.0, &c->partial_rotary, path));
    c->rot_dim = (int)(c->head_dim * c->partial_rotary);
    c->rot_dim -= c->rot_dim % 2;

    /* layer kinds: layer_types, else full_attention_interval */
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(o, "layer_types");
    if (lt && !cJSON_IsNull(lt)) {
        LS_TRY(ls_cfg_layer_words(lt, "layer_types", "full_attention", "linear_attention", c->n_layers, c->kind, path));
    } else {
        int64_t interval;
        LS_TRY(ls_cfg_get_int(o, "full_attention_interval", 4, 0, 1, LS_MAX_LAYERS, &interval, path));
        for (int64_t i = 0; i < c->n_layers; i++)
            c->kind[i] = ((i + 1) % interval == 0) ? LS_LAYER_ATTN : LS_LAYER_GDN;
    }
    /* MoE placement: (i+1) % decoder_sparse_step == 0 and not in mlp_only_layers */
    const cJSON *mol = cJSON_GetObjectItemCaseSensitive(o, "mlp_only_layers");
    if (mol && !cJSON_IsNull(mol) && !cJSON_IsArray(mol))
        return ls_err(LS_ERR_FORMAT, "%s: field \"mlp_only_layers\" must be an array", path);
    for (int64_t i = 0; i < c->n_layers; i++)
        c->moe[i] = c->n_experts > 0 && ((i + 1) % sparse_step == 0);
    if (mol && cJSON_IsArray(mol)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, mol) {
            if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= (double)c->n_layers ||
                e->valuedouble != floor(e->valuedouble))
                return ls_err(LS_ERR_FORMAT, "%s: mlp_only_layers entries must be layer indices in [0, %lld)",
                              path, (long long)c->n_layers);
            c->moe[(int64_t)e->valuedouble] = 0;
        }
    }
    for (int64_t i = 0; i < c->n_layers; i++)
        if (!c->moe[i] && c->intermediate <= 0)
            return ls_err(LS_ERR_FORMAT, "%s: layer %lld has a dense MLP but \"intermediate_size\" is missing or 0",
                          path, (long long)i);
    if (c->rot_dim > 1024)
        return ls_err(LS_ERR_FORMAT, "%s: rotary dimension %d too large", path, c->rot_dim);
    return LS_OK;
}


const char *const ls_hybrid_model_types[] = {"qwen3_next",   "qwen3_5",          "qwen3_5_text",
                                              "qwen3_5_moe", "qwen3_5_moe_text", NULL};

ls_status ls_hybrid_parse_config(ls_config *c, const cJSON *o, const char *type, int wrapped, const char *path) {
    /* a Qwen3.5 wrapper's text_config without its own model_type is the text model */
    if (wrapped && !strcmp(type, "qwen3_5")) type = "qwen3_5_text";
    if (wrapped && !strcmp(type, "qwen3_5_moe")) type = "qwen3_5_moe_text";
    int q35 = strncmp(type, "qwen3_5", 7) == 0, moe35 = strncmp(type, "qwen3_5_moe", 11) == 0;
    return parse_text(c, o, type, q35, moe35, path);
}

/* The prompt state's layout (family.h): a full-attention layer keeps K and V rows of
 * n_kv·hd (both with gradients in full mode), a Gated DeltaNet layer its recurrent state
 * S [H_v, d_k, d_v] and conv tail [W−1, conv_dim]. */
void ls_hybrid_state_layer(const ls_config *c, int l, ls_state_layer *out) {
    int64_t kv = c->kind[l] == LS_LAYER_ATTN ? (int64_t)c->n_kv * c->head_dim : 0;
    *out = (ls_state_layer){.row = {kv, kv}, .grad_row = {kv, kv}, .recurrent = c->kind[l] == LS_LAYER_GDN};
}

void ls_hybrid_state_recurrent(const ls_config *c, ls_state_recurrent *out) {
    const ls_hybrid_config *hc = ls_hybrid_cfg(c);
    *out = (ls_state_recurrent){.table = 1,
                                .rec_floats = (size_t)hc->H_v * (size_t)hc->d_k * (size_t)hc->d_v,
                                .tail_floats = (size_t)(hc->conv_k - 1) * (size_t)ls_cfg_conv_dim(c),
                                .sweep_inputs = 1};
}
