/*
 * mla_load.c — an HF checkpoint of the MLA + DSA + MoE family → ls_mla_model
 * (specs/mla-dsa-moe.md §5). Tensors keep their HF layout in f32; experts are
 * stacked per layer. Every tensor's shape is checked before it is read; errors name
 * the file and the tensor.
 */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/mla.h"
#include "longstraw/safetensors.h"

typedef struct {
    ls_st_model st;
    ls_arena *fixed;
    size_t n;
} loader;

/* Read `name` of shape [d0] or [d0, d1] into a new f32 buffer of `fixed` (or into dst). */
static ls_status rd(loader *L, float **out, float *dst, int ndim, int64_t d0, int64_t d1, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
static ls_status rd(loader *L, float **out, float *dst, int ndim, int64_t d0, int64_t d1, const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const ls_st_tensor *t = ls_st_model_find(&L->st, name);
    if (!t) return ls_err(LS_ERR_FORMAT, "%s: checkpoint has no tensor \"%s\"", L->st.dir, name);
    int64_t shape[2] = {d0, d1}, n = d0 * (ndim > 1 ? d1 : 1);
    LS_TRY(ls_st_check_shape(t, ndim, shape, name));
    float *x = dst ? dst : ls_arena_alloc(L->fixed, (size_t)n * sizeof(float));
    if (!x) return LS_ERR_NOMEM;
    LS_TRY(ls_st_read_f32(t, x, n, name));
    for (int64_t i = 0; i < n; i++)
        if (!(fabsf(x[i]) <= FLT_MAX))
            return ls_err(LS_ERR_FORMAT, "%s: tensor %s holds a non-finite value at element %lld", t->file, t->name,
                          (long long)i);
    L->n += (size_t)n;
    if (out) *out = x;
    return LS_OK;
}

/* FP8 releases (e4m3 weights with weight_scale_inv blocks) are refused up front. */
static ls_status refuse_fp8(const loader *L) {
    for (int64_t i = 0; i < ls_st_model_count(&L->st); i++) {
        const ls_st_tensor *t = ls_st_model_at(&L->st, i);
        const char *dt = ls_st_dtype_name(t->st_dtype);
        if (strncmp(dt, "F8", 2) == 0 || strstr(t->name, "weight_scale_inv"))
            return ls_err(LS_ERR_UNSUPPORTED,
                          "%s: tensor \"%s\" is %s: FP8 checkpoints are not supported (they would need their "
                          "weight_scale_inv blocks dequantised); use the BF16 release or dequantise to BF16 first",
                          t->file, t->name, strstr(t->name, "weight_scale_inv") ? "an FP8 block scale" : dt);
    }
    return LS_OK;
}

static ls_status load_layer(loader *L, const ls_config *c, int64_t i, ls_mla_layer *w) {
    const ls_mla_config *m = &c->mla;
    int64_t D = c->hidden, H = c->n_heads, dn = m->qk_nope, dr = m->qk_rope, dv = m->v_head;
    int64_t rq = m->q_lora_rank, rkv = m->kv_lora_rank, nI = m->index_heads, dI = m->index_head_dim;
    long long li = (long long)i;
    const char *p = "model.layers.";
    LS_TRY(rd(L, &w->input_norm, NULL, 1, D, 0, "%s%lld.input_layernorm.weight", p, li));
    LS_TRY(rd(L, &w->post_norm, NULL, 1, D, 0, "%s%lld.post_attention_layernorm.weight", p, li));
    if (rq) {
        LS_TRY(rd(L, &w->q_a, NULL, 2, rq, D, "%s%lld.self_attn.q_a_proj.weight", p, li));
        LS_TRY(rd(L, &w->q_a_norm, NULL, 1, rq, 0, "%s%lld.self_attn.q_a_layernorm.weight", p, li));
        LS_TRY(rd(L, &w->q_b, NULL, 2, H * (dn + dr), rq, "%s%lld.self_attn.q_b_proj.weight", p, li));
    } else {
        LS_TRY(rd(L, &w->q_proj, NULL, 2, H * (dn + dr), D, "%s%lld.self_attn.q_proj.weight", p, li));
    }
    LS_TRY(rd(L, &w->kv_a, NULL, 2, rkv + dr, D, "%s%lld.self_attn.kv_a_proj_with_mqa.weight", p, li));
    LS_TRY(rd(L, &w->kv_a_norm, NULL, 1, rkv, 0, "%s%lld.self_attn.kv_a_layernorm.weight", p, li));
    LS_TRY(rd(L, &w->kv_b, NULL, 2, H * (dn + dv), rkv, "%s%lld.self_attn.kv_b_proj.weight", p, li));
    LS_TRY(rd(L, &w->o_proj, NULL, 2, D, H * dv, "%s%lld.self_attn.o_proj.weight", p, li));
    if (m->index_full[i]) {
        LS_TRY(rd(L, &w->idx_wq, NULL, 2, nI * dI, rq ? rq : D, "%s%lld.self_attn.indexer.wq_b.weight", p, li));
        LS_TRY(rd(L, &w->idx_wk, NULL, 2, dI, D, "%s%lld.self_attn.indexer.wk.weight", p, li));
        LS_TRY(rd(L, &w->idx_knorm_w, NULL, 1, dI, 0, "%s%lld.self_attn.indexer.k_norm.weight", p, li));
        LS_TRY(rd(L, &w->idx_knorm_b, NULL, 1, dI, 0, "%s%lld.self_attn.indexer.k_norm.bias", p, li));
        LS_TRY(rd(L, &w->idx_weights, NULL, 2, nI, D, "%s%lld.self_attn.indexer.weights_proj.weight", p, li));
    }
    if (!c->moe[i]) {
        int64_t I = c->intermediate;
        LS_TRY(rd(L, &w->mlp_gate, NULL, 2, I, D, "%s%lld.mlp.gate_proj.weight", p, li));
        LS_TRY(rd(L, &w->mlp_up, NULL, 2, I, D, "%s%lld.mlp.up_proj.weight", p, li));
        LS_TRY(rd(L, &w->mlp_down, NULL, 2, D, I, "%s%lld.mlp.down_proj.weight", p, li));
        return LS_OK;
    }
    int64_t E = c->n_experts, Im = c->moe_inter, Is = c->moe_inter * m->n_shared_experts;
    LS_TRY(rd(L, &w->router, NULL, 2, E, D, "%s%lld.mlp.gate.weight", p, li));
    LS_TRY(rd(L, &w->router_bias, NULL, 1, E, 0, "%s%lld.mlp.gate.e_score_correction_bias", p, li));
    w->exp_gate = ls_arena_alloc(L->fixed, (size_t)(E * Im * D) * sizeof(float));
    w->exp_up = ls_arena_alloc(L->fixed, (size_t)(E * Im * D) * sizeof(float));
    w->exp_down = ls_arena_alloc(L->fixed, (size_t)(E * D * Im) * sizeof(float));
    if (!w->exp_gate || !w->exp_up || !w->exp_down) return LS_ERR_NOMEM;
    for (int64_t e = 0; e < E; e++) { /* stacked: expert e at e·Im·D */
        LS_TRY(rd(L, NULL, w->exp_gate + e * Im * D, 2, Im, D, "%s%lld.mlp.experts.%lld.gate_proj.weight", p, li,
                  (long long)e));
        LS_TRY(rd(L, NULL, w->exp_up + e * Im * D, 2, Im, D, "%s%lld.mlp.experts.%lld.up_proj.weight", p, li,
                  (long long)e));
        LS_TRY(rd(L, NULL, w->exp_down + e * D * Im, 2, D, Im, "%s%lld.mlp.experts.%lld.down_proj.weight", p, li,
                  (long long)e));
    }
    if (Is > 0) {
        LS_TRY(rd(L, &w->sh_gate, NULL, 2, Is, D, "%s%lld.mlp.shared_experts.gate_proj.weight", p, li));
        LS_TRY(rd(L, &w->sh_up, NULL, 2, Is, D, "%s%lld.mlp.shared_experts.up_proj.weight", p, li));
        LS_TRY(rd(L, &w->sh_down, NULL, 2, D, Is, "%s%lld.mlp.shared_experts.down_proj.weight", p, li));
    }
    return LS_OK;
}

ls_status ls_mla_load(ls_mla_model *m, const char *dir, ls_arena *fixed) {
    memset(m, 0, sizeof *m);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    LS_TRY(ls_config_load(&m->cfg, path));
    if (m->cfg.family != LS_FAMILY_MLA) return ls_err(LS_ERR_ARG, "%s: not an MLA-family checkpoint", path);
    loader L = {.fixed = fixed};
    LS_TRY(ls_st_model_open(&L.st, dir));
    const ls_config *c = &m->cfg;
    ls_status s = refuse_fp8(&L);
    if (s == LS_OK) s = rd(&L, &m->embed, NULL, 2, c->vocab, c->hidden, "model.embed_tokens.weight");
    if (s == LS_OK) s = rd(&L, &m->final_norm, NULL, 1, c->hidden, 0, "model.norm.weight");
    if (s == LS_OK && c->tie_embeddings) m->lm_head = m->embed;
    else if (s == LS_OK) s = rd(&L, &m->lm_head, NULL, 2, c->vocab, c->hidden, "lm_head.weight");
    if (s == LS_OK && !(m->layers = ls_arena_calloc(fixed, (size_t)c->n_layers, sizeof(ls_mla_layer))))
        s = LS_ERR_NOMEM;
    for (int64_t i = 0; i < c->n_layers && s == LS_OK; i++) s = load_layer(&L, c, i, &m->layers[i]);
    m->n_params = L.n;
    ls_st_model_close(&L.st);
    return s;
}
