/*
 * hybrid_hf.c — the HF tensor inventory of a hybrid config (specs/hybrid-qwen3next.md
 * §6), used to write random checkpoints with the names real models ship.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "longstraw/hybrid.h"

typedef struct {
    ls_hf_tensor_spec *v;
    int64_t n, cap;
} spec_list;

static ls_status add(spec_list *l, ls_init_kind init, int ndim, int64_t d0, int64_t d1, int64_t d2,
                     const char *fmt, ...) __attribute__((format(printf, 7, 8)));

static ls_status add(spec_list *l, ls_init_kind init, int ndim, int64_t d0, int64_t d1, int64_t d2,
                     const char *fmt, ...) {
    if (l->n == l->cap) {
        int64_t cap = l->cap ? 2 * l->cap : 64;
        ls_hf_tensor_spec *nv = realloc(l->v, (size_t)cap * sizeof *nv);
        if (!nv) return ls_err(LS_ERR_NOMEM, "out of memory listing tensors");
        l->v = nv;
        l->cap = cap;
    }
    ls_hf_tensor_spec *s = &l->v[l->n++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->name, sizeof s->name, fmt, ap);
    va_end(ap);
    s->ndim = ndim;
    s->shape[0] = d0;
    s->shape[1] = d1;
    s->shape[2] = d2;
    s->init = init;
    return LS_OK;
}

static ls_status specs(const ls_config *c, spec_list *l) {
    const ls_hybrid_config *hc = ls_hybrid_cfg(c);
    int64_t D = c->hidden, V = c->vocab, hd = c->head_dim;
    int64_t kd = ls_cfg_key_dim(c), vd = ls_cfg_value_dim(c), cd = ls_cfg_conv_dim(c);
    int64_t Hk = hc->H_k, Hv = hc->H_v, r = Hv / Hk;
    const char *p = hc->layout == LS_LAYOUT_QWEN3_5 ? "model.language_model." : "model.";
    LS_TRY(add(l, LS_INIT_EMBED, 2, V, D, 0, "%sembed_tokens.weight", p));
    LS_TRY(add(l, LS_INIT_NORM0, 1, D, 0, 0, "%snorm.weight", p));
    if (!c->tie_embeddings) LS_TRY(add(l, LS_INIT_LINEAR, 2, V, D, 0, "lm_head.weight"));
    for (int64_t i = 0; i < c->n_layers; i++) {
        char b[96];
        snprintf(b, sizeof b, "%slayers.%lld", p, (long long)i);
        LS_TRY(add(l, LS_INIT_NORM0, 1, D, 0, 0, "%s.input_layernorm.weight", b));
        LS_TRY(add(l, LS_INIT_NORM0, 1, D, 0, 0, "%s.post_attention_layernorm.weight", b));
        if (c->kind[i] == LS_LAYER_GDN) {
            if (hc->layout == LS_LAYOUT_QWEN3_NEXT) {
                LS_TRY(add(l, LS_INIT_LINEAR, 2, 2 * kd + 2 * vd, D, 0, "%s.linear_attn.in_proj_qkvz.weight", b));
                LS_TRY(add(l, LS_INIT_LINEAR, 2, Hk * 2 * r, D, 0, "%s.linear_attn.in_proj_ba.weight", b));
            } else {
                LS_TRY(add(l, LS_INIT_LINEAR, 2, cd, D, 0, "%s.linear_attn.in_proj_qkv.weight", b));
                LS_TRY(add(l, LS_INIT_LINEAR, 2, vd, D, 0, "%s.linear_attn.in_proj_z.weight", b));
                LS_TRY(add(l, LS_INIT_LINEAR, 2, Hv, D, 0, "%s.linear_attn.in_proj_b.weight", b));
                LS_TRY(add(l, LS_INIT_LINEAR, 2, Hv, D, 0, "%s.linear_attn.in_proj_a.weight", b));
            }
            LS_TRY(add(l, LS_INIT_CONV, 3, cd, 1, hc->conv_k, "%s.linear_attn.conv1d.weight", b));
            LS_TRY(add(l, LS_INIT_ALOG, 1, Hv, 0, 0, "%s.linear_attn.A_log", b));
            LS_TRY(add(l, LS_INIT_DTBIAS, 1, Hv, 0, 0, "%s.linear_attn.dt_bias", b));
            LS_TRY(add(l, LS_INIT_NORM1, 1, hc->d_v, 0, 0, "%s.linear_attn.norm.weight", b));
            LS_TRY(add(l, LS_INIT_LINEAR, 2, D, vd, 0, "%s.linear_attn.out_proj.weight", b));
        } else {
            int64_t qd = c->n_heads * hd, kvd = c->n_kv * hd;
            LS_TRY(add(l, LS_INIT_LINEAR, 2, 2 * qd, D, 0, "%s.self_attn.q_proj.weight", b));
            LS_TRY(add(l, LS_INIT_LINEAR, 2, kvd, D, 0, "%s.self_attn.k_proj.weight", b));
            LS_TRY(add(l, LS_INIT_LINEAR, 2, kvd, D, 0, "%s.self_attn.v_proj.weight", b));
            LS_TRY(add(l, LS_INIT_LINEAR, 2, D, qd, 0, "%s.self_attn.o_proj.weight", b));
            LS_TRY(add(l, LS_INIT_NORM0, 1, hd, 0, 0, "%s.self_attn.q_norm.weight", b));
            LS_TRY(add(l, LS_INIT_NORM0, 1, hd, 0, 0, "%s.self_attn.k_norm.weight", b));
        }
        if (!c->moe[i]) {
            LS_TRY(add(l, LS_INIT_LINEAR, 2, c->intermediate, D, 0, "%s.mlp.gate_proj.weight", b));
            LS_TRY(add(l, LS_INIT_LINEAR, 2, c->intermediate, D, 0, "%s.mlp.up_proj.weight", b));
            LS_TRY(add(l, LS_INIT_LINEAR, 2, D, c->intermediate, 0, "%s.mlp.down_proj.weight", b));
            continue;
        }
        LS_TRY(add(l, LS_INIT_LINEAR, 2, c->n_experts, D, 0, "%s.mlp.gate.weight", b));
        for (int e = 0; e < c->n_experts; e++) {
            LS_TRY(add(l, LS_INIT_LINEAR, 2, c->moe_inter, D, 0, "%s.mlp.experts.%d.gate_proj.weight", b, e));
            LS_TRY(add(l, LS_INIT_LINEAR, 2, c->moe_inter, D, 0, "%s.mlp.experts.%d.up_proj.weight", b, e));
            LS_TRY(add(l, LS_INIT_LINEAR, 2, D, c->moe_inter, 0, "%s.mlp.experts.%d.down_proj.weight", b, e));
        }
        if (c->shared_inter > 0) {
            LS_TRY(add(l, LS_INIT_LINEAR, 2, c->shared_inter, D, 0, "%s.mlp.shared_expert.gate_proj.weight", b));
            LS_TRY(add(l, LS_INIT_LINEAR, 2, c->shared_inter, D, 0, "%s.mlp.shared_expert.up_proj.weight", b));
            LS_TRY(add(l, LS_INIT_LINEAR, 2, D, c->shared_inter, 0, "%s.mlp.shared_expert.down_proj.weight", b));
            LS_TRY(add(l, LS_INIT_LINEAR, 2, 1, D, 0, "%s.mlp.shared_expert_gate.weight", b));
        }
    }
    return LS_OK;
}

ls_status ls_hybrid_hf_specs(const ls_config *c, ls_hf_tensor_spec **out, int64_t *n) {
    spec_list l = {NULL, 0, 0};
    ls_status s = specs(c, &l);
    if (s != LS_OK) {
        free(l.v);
        return s;
    }
    *out = l.v;
    *n = l.n;
    return LS_OK;
}
