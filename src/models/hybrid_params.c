/*
 * hybrid_params.c — the parameter set of the hybrid family as a list (for the
 * optimizer and gradient norms), model-shaped buffer sets (gradients, moments), and
 * export of weights or gradients back to the checkpoint's own HF names and layout
 * (the inverse of hybrid_load.c: fused Qwen3-Next projections re-interleaved per
 * key head, q_proj's per-head [q | gate] rows restored).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/hybrid.h"
#include "longstraw/safetensors.h"

typedef void (*slot_fn)(float **slot, int64_t n, int no_decay, const char *what, void *ctx);

/* Visit every distinct parameter slot of `m` in a fixed order. */
static void visit(ls_hybrid_model *m, slot_fn fn, void *ctx) {
    const ls_config *c = &m->cfg;
    const ls_hybrid_config *hc = ls_hybrid_cfg(c);
    int64_t D = c->hidden, V = c->vocab, hd = c->head_dim;
    int64_t kd = ls_cfg_key_dim(c), vd = ls_cfg_value_dim(c), cd = ls_cfg_conv_dim(c);
    int64_t qd = (int64_t)c->n_heads * hd, kvd = (int64_t)c->n_kv * hd;
    (void)kd;
    fn(&m->embed, V * D, 0, "embed_tokens", ctx);
    fn(&m->final_norm, D, 1, "norm", ctx);
    if (!c->tie_embeddings) fn(&m->lm_head, V * D, 0, "lm_head", ctx);
    for (int64_t l = 0; l < c->n_layers; l++) {
        ls_hybrid_layer *w = &m->layers[l];
        fn(&w->input_norm, D, 1, "input_layernorm", ctx);
        fn(&w->post_norm, D, 1, "post_attention_layernorm", ctx);
        if (c->kind[l] == LS_LAYER_GDN) {
            fn(&w->gdn_in, (cd + vd + 2 * hc->H_v) * D, 0, "linear_attn.in_proj", ctx);
            fn(&w->conv_w, cd * hc->conv_k, 0, "linear_attn.conv1d", ctx);
            fn(&w->A_log, hc->H_v, 1, "linear_attn.A_log", ctx);
            fn(&w->dt_bias, hc->H_v, 1, "linear_attn.dt_bias", ctx);
            fn(&w->gnorm, hc->d_v, 1, "linear_attn.norm", ctx);
            fn(&w->gdn_out, D * vd, 0, "linear_attn.out_proj", ctx);
        } else {
            fn(&w->attn_in, (2 * qd + 2 * kvd) * D, 0, "self_attn.qkv", ctx);
            fn(&w->q_norm, hd, 1, "self_attn.q_norm", ctx);
            fn(&w->k_norm, hd, 1, "self_attn.k_norm", ctx);
            fn(&w->attn_out, D * qd, 0, "self_attn.o_proj", ctx);
        }
        if (!c->moe[l]) {
            fn(&w->mlp_gu, 2 * c->intermediate * D, 0, "mlp.gate_up", ctx);
            fn(&w->mlp_down, D * c->intermediate, 0, "mlp.down_proj", ctx);
        } else {
            int64_t E = c->n_experts, Im = c->moe_inter, Is = c->shared_inter;
            fn(&w->router, E * D, 0, "mlp.gate", ctx);
            fn(&w->exp_gu, E * 2 * Im * D, 0, "mlp.experts.gate_up", ctx);
            fn(&w->exp_down, E * D * Im, 0, "mlp.experts.down_proj", ctx);
            if (Is > 0) {
                fn(&w->sh_gu, 2 * Is * D, 0, "mlp.shared_expert.gate_up", ctx);
                fn(&w->sh_down, D * Is, 0, "mlp.shared_expert.down_proj", ctx);
                fn(&w->sh_gate, D, 0, "mlp.shared_expert_gate", ctx);
            }
        }
    }
}

typedef struct {
    ls_param *v;
    int64_t n;
} collect_ctx;

static void collect(float **slot, int64_t n, int no_decay, const char *what, void *vctx) {
    collect_ctx *cc = vctx;
    if (cc->v) cc->v[cc->n] = (ls_param){*slot, n, no_decay, what};
    cc->n++;
}

ls_status ls_hybrid_params(const ls_hybrid_model *m, ls_param **out, int64_t *n) {
    collect_ctx cc = {NULL, 0};
    visit((ls_hybrid_model *)m, collect, &cc); /* count; visit does not write through slots */
    cc.v = malloc((size_t)cc.n * sizeof(ls_param));
    if (!cc.v) return ls_err(LS_ERR_NOMEM, "cannot list %lld parameters", (long long)cc.n);
    cc.n = 0;
    visit((ls_hybrid_model *)m, collect, &cc);
    *out = cc.v;
    *n = cc.n;
    return LS_OK;
}

typedef struct {
    ls_arena *arena;
    int failed;
    const ls_hybrid_model *dst; /* with `keep`: only the slots it keeps */
    ls_hybrid_keep_fn keep;
    const void *keep_ctx;
    const ls_hybrid_model *alias; /* non-NULL: the other slots point at this model's tensors */
    int none;                     /* every slot NULL */
} alloc_ctx;

static void alloc_slot(float **slot, int64_t n, int no_decay, const char *what, void *vctx) {
    alloc_ctx *ac = vctx;
    if (ac->none) {
        *slot = NULL;
        return;
    }
    if (ac->keep) {
        const char *sp = (const char *)slot, *l0 = (const char *)ac->dst->layers;
        size_t lsz = sizeof(ls_hybrid_layer);
        int keep;
        const char *peer; /* the same slot in the alias model */
        if (sp >= l0 && sp < l0 + (size_t)ac->dst->cfg.n_layers * lsz) {
            keep = ac->keep(ac->keep_ctx, (int)((size_t)(sp - l0) / lsz), (size_t)(sp - l0) % lsz);
            peer = ac->alias ? (const char *)ac->alias->layers + (sp - l0) : NULL;
        } else {
            keep = slot == &ac->dst->lm_head && ac->keep(ac->keep_ctx, -1, 0);
            peer = ac->alias ? (const char *)ac->alias + (sp - (const char *)ac->dst) : NULL;
        }
        if (!keep) {
            *slot = peer ? *(float *const *)peer : NULL;
            return;
        }
    }
    *slot = ls_arena_calloc(ac->arena, (size_t)n, sizeof(float));
    if (!*slot) ac->failed = 1;
}

static ls_status alloc_like(const ls_hybrid_model *src, ls_hybrid_model *dst, ls_arena *arena, ls_hybrid_keep_fn keep,
                            const void *keep_ctx, const ls_hybrid_model *alias, int none) {
    memset(dst, 0, sizeof *dst);
    dst->cfg = src->cfg;
    dst->be = src->be;
    snprintf(dst->prefix, sizeof dst->prefix, "%s", src->prefix);
    dst->fused_gdn = src->fused_gdn;
    dst->fused_experts = src->fused_experts;
    dst->n_params = src->n_params;
    dst->layers = ls_arena_host_calloc(arena, (size_t)src->cfg.n_layers, sizeof(ls_hybrid_layer));
    if (!dst->layers) return LS_ERR_NOMEM;
    alloc_ctx ac = {arena, 0, dst, keep, keep_ctx, alias, none};
    visit(dst, alloc_slot, &ac);
    if (ac.failed) return LS_ERR_NOMEM;
    if (dst->cfg.tie_embeddings) dst->lm_head = dst->embed;
    return LS_OK;
}

ls_status ls_hybrid_alloc_like(const ls_hybrid_model *src, ls_hybrid_model *dst, ls_arena *arena) {
    return alloc_like(src, dst, arena, NULL, NULL, NULL, 0);
}

ls_status ls_hybrid_alloc_none(const ls_hybrid_model *src, ls_hybrid_model *dst, ls_arena *arena) {
    return alloc_like(src, dst, arena, NULL, NULL, NULL, 1);
}

ls_status ls_hybrid_alloc_subset(const ls_hybrid_model *src, ls_hybrid_model *dst, ls_arena *arena,
                                 ls_hybrid_keep_fn keep, const void *keep_ctx, const ls_hybrid_model *alias) {
    return alloc_like(src, dst, arena, keep, keep_ctx, alias, 0);
}

/* ---- export ------------------------------------------------------------------ */
typedef struct {
    ls_st_writer w;
    ls_arena tmp; /* host copies and re-laid-out tensors, alive until the write */
    const ls_backend *be; /* the model's: its tensors are read back through to_host */
    ls_dtype dtype;
    ls_status s;
    int host; /* the next put's data is already host memory (in tmp) */
} exporter;

static void put(exporter *ex, const float *data, int ndim, int64_t d0, int64_t d1, int64_t d2,
                const char *fmt, ...) __attribute__((format(printf, 7, 8)));

static void put(exporter *ex, const float *data, int ndim, int64_t d0, int64_t d1, int64_t d2,
                const char *fmt, ...) {
    if (ex->s != LS_OK) return;
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    int64_t shape[3] = {d0, d1, d2};
    if (!ex->host) { /* the writer reads host memory: the model's tensor through a host view */
        int64_t n = d0 * (ndim > 1 ? d1 : 1) * (ndim > 2 ? d2 : 1);
        if (!(data = ls_host_view(ex->be, &ex->tmp, (void *)data, (size_t)n * sizeof(float), 1))) {
            ex->s = LS_ERR_NOMEM;
            return;
        }
    }
    ex->host = 0;
    ex->s = ls_st_writer_add_f32(&ex->w, name, ex->dtype, ndim, shape, data);
}

static float *tmp_f(exporter *ex, int64_t n) {
    float *p = ls_arena_alloc(&ex->tmp, (size_t)n * sizeof(float));
    if (!p && ex->s == LS_OK) ex->s = LS_ERR_NOMEM;
    return p;
}

/* bytes of the model's memory into a host buffer of the exporter */
static void get(const exporter *ex, float *dst, const float *src, size_t bytes) {
    ex->be->i->to_host(ex->be, dst, src, bytes);
}

static void export_layer(exporter *ex, const ls_hybrid_model *m, int l) {
    const ls_config *c = &m->cfg;
    const ls_hybrid_config *hc = ls_hybrid_cfg(c);
    const ls_hybrid_layer *w = &m->layers[l];
    int64_t D = c->hidden, hd = c->head_dim, kd = ls_cfg_key_dim(c), vd = ls_cfg_value_dim(c);
    int64_t cd = ls_cfg_conv_dim(c), qd = (int64_t)c->n_heads * hd, kvd = (int64_t)c->n_kv * hd;
    int64_t Hk = hc->H_k, Hv = hc->H_v, dk = hc->d_k, dv = hc->d_v, r = Hv / Hk;
    char b[96];
    snprintf(b, sizeof b, "%slayers.%d", m->prefix, l);
    size_t row = (size_t)D * sizeof(float);
    put(ex, w->input_norm, 1, D, 0, 0, "%s.input_layernorm.weight", b);
    put(ex, w->post_norm, 1, D, 0, 0, "%s.post_attention_layernorm.weight", b);
    if (c->kind[l] == LS_LAYER_GDN) {
        if (m->fused_gdn) { /* re-interleave per key head (spec §2.1) */
            int64_t grp = 2 * dk + 2 * r * dv;
            float *qkvz = tmp_f(ex, Hk * grp * D), *bav = tmp_f(ex, Hk * 2 * r * D);
            if (!qkvz || !bav) return;
            for (int64_t g = 0; g < Hk; g++) {
                float *dst = qkvz + g * grp * D;
                get(ex, dst, w->gdn_in + (g * dk) * D, (size_t)dk * row);
                get(ex, dst + dk * D, w->gdn_in + (kd + g * dk) * D, (size_t)dk * row);
                get(ex, dst + 2 * dk * D, w->gdn_in + (2 * kd + g * r * dv) * D, (size_t)(r * dv) * row);
                get(ex, dst + (2 * dk + r * dv) * D, w->gdn_in + (cd + g * r * dv) * D, (size_t)(r * dv) * row);
                for (int64_t j = 0; j < r; j++) {
                    get(ex, bav + (g * 2 * r + j) * D, w->gdn_in + (cd + vd + g * r + j) * D, row);
                    get(ex, bav + (g * 2 * r + r + j) * D, w->gdn_in + (cd + vd + Hv + g * r + j) * D, row);
                }
            }
            ex->host = 1;
            put(ex, qkvz, 2, Hk * grp, D, 0, "%s.linear_attn.in_proj_qkvz.weight", b);
            ex->host = 1;
            put(ex, bav, 2, Hk * 2 * r, D, 0, "%s.linear_attn.in_proj_ba.weight", b);
        } else {
            put(ex, w->gdn_in, 2, cd, D, 0, "%s.linear_attn.in_proj_qkv.weight", b);
            put(ex, w->gdn_in + cd * D, 2, vd, D, 0, "%s.linear_attn.in_proj_z.weight", b);
            put(ex, w->gdn_in + (cd + vd) * D, 2, Hv, D, 0, "%s.linear_attn.in_proj_b.weight", b);
            put(ex, w->gdn_in + (cd + vd + Hv) * D, 2, Hv, D, 0, "%s.linear_attn.in_proj_a.weight", b);
        }
        put(ex, w->conv_w, 3, cd, 1, hc->conv_k, "%s.linear_attn.conv1d.weight", b);
        put(ex, w->A_log, 1, Hv, 0, 0, "%s.linear_attn.A_log", b);
        put(ex, w->dt_bias, 1, Hv, 0, 0, "%s.linear_attn.dt_bias", b);
        put(ex, w->gnorm, 1, dv, 0, 0, "%s.linear_attn.norm.weight", b);
        put(ex, w->gdn_out, 2, D, vd, 0, "%s.linear_attn.out_proj.weight", b);
    } else {
        float *qp = tmp_f(ex, 2 * qd * D);
        if (!qp) return;
        for (int64_t h = 0; h < c->n_heads; h++) { /* per head [q_h | gate_h] (spec §4.1) */
            get(ex, qp + (2 * h * hd) * D, w->attn_in + (h * hd) * D, (size_t)hd * row);
            get(ex, qp + (2 * h * hd + hd) * D, w->attn_in + (qd + h * hd) * D, (size_t)hd * row);
        }
        ex->host = 1;
        put(ex, qp, 2, 2 * qd, D, 0, "%s.self_attn.q_proj.weight", b);
        put(ex, w->attn_in + 2 * qd * D, 2, kvd, D, 0, "%s.self_attn.k_proj.weight", b);
        put(ex, w->attn_in + (2 * qd + kvd) * D, 2, kvd, D, 0, "%s.self_attn.v_proj.weight", b);
        put(ex, w->attn_out, 2, D, qd, 0, "%s.self_attn.o_proj.weight", b);
        put(ex, w->q_norm, 1, hd, 0, 0, "%s.self_attn.q_norm.weight", b);
        put(ex, w->k_norm, 1, hd, 0, 0, "%s.self_attn.k_norm.weight", b);
    }
    if (!c->moe[l]) {
        int64_t I = c->intermediate;
        put(ex, w->mlp_gu, 2, I, D, 0, "%s.mlp.gate_proj.weight", b);
        put(ex, w->mlp_gu + I * D, 2, I, D, 0, "%s.mlp.up_proj.weight", b);
        put(ex, w->mlp_down, 2, D, I, 0, "%s.mlp.down_proj.weight", b);
        return;
    }
    int64_t E = c->n_experts, Im = c->moe_inter, Is = c->shared_inter;
    put(ex, w->router, 2, E, D, 0, "%s.mlp.gate.weight", b);
    if (m->fused_experts) {
        put(ex, w->exp_gu, 3, E, 2 * Im, D, "%s.mlp.experts.gate_up_proj", b);
        put(ex, w->exp_down, 3, E, D, Im, "%s.mlp.experts.down_proj", b);
    } else {
        for (int64_t e = 0; e < E; e++) {
            const float *gu = w->exp_gu + e * 2 * Im * D;
            put(ex, gu, 2, Im, D, 0, "%s.mlp.experts.%lld.gate_proj.weight", b, (long long)e);
            put(ex, gu + Im * D, 2, Im, D, 0, "%s.mlp.experts.%lld.up_proj.weight", b, (long long)e);
            put(ex, w->exp_down + e * D * Im, 2, D, Im, 0, "%s.mlp.experts.%lld.down_proj.weight", b, (long long)e);
        }
    }
    if (Is > 0) {
        put(ex, w->sh_gu, 2, Is, D, 0, "%s.mlp.shared_expert.gate_proj.weight", b);
        put(ex, w->sh_gu + Is * D, 2, Is, D, 0, "%s.mlp.shared_expert.up_proj.weight", b);
        put(ex, w->sh_down, 2, D, Is, 0, "%s.mlp.shared_expert.down_proj.weight", b);
        put(ex, w->sh_gate, 2, 1, D, 0, "%s.mlp.shared_expert_gate.weight", b);
    }
}

ls_status ls_hybrid_export(const ls_hybrid_model *m, const ls_st_sink *to, ls_dtype dtype,
                           const char *meta_key, const char *meta_value) {
    const ls_config *c = &m->cfg;
    exporter ex;
    ls_st_writer_init(&ex.w);
    ls_arena_init(&ex.tmp, "export", 0);
    ex.be = m->be;
    ex.host = 0;
    ex.dtype = dtype;
    ex.s = LS_OK;
    put(&ex, m->embed, 2, c->vocab, c->hidden, 0, "%sembed_tokens.weight", m->prefix);
    put(&ex, m->final_norm, 1, c->hidden, 0, 0, "%snorm.weight", m->prefix);
    if (!c->tie_embeddings) put(&ex, m->lm_head, 2, c->vocab, c->hidden, 0, "lm_head.weight");
    for (int l = 0; l < c->n_layers && ex.s == LS_OK; l++) export_layer(&ex, m, l);
    if (ex.s == LS_OK) ex.s = ls_st_writer_add_meta(&ex.w, "format", "pt");
    if (ex.s == LS_OK && meta_key) ex.s = ls_st_writer_add_meta(&ex.w, meta_key, meta_value);
    if (ex.s == LS_OK) ex.s = ls_st_emit(&ex.w, to);
    ls_st_writer_free(&ex.w);
    ls_arena_free(&ex.tmp);
    return ex.s;
}
