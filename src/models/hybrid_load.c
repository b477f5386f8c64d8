/*
 * hybrid_load.c — HF checkpoint → internal layout (specs/hybrid-qwen3next.md §2.1,
 * §4.1, §6). Qwen3-Next's grouped in_proj_qkvz / in_proj_ba are de-interleaved per
 * key head; Qwen3.5's split in_proj_qkv/z/b/a are stacked; q_proj's per-head
 * [q | gate] rows are split into all-q then all-gate. Every tensor's shape is
 * checked before it is read; errors name the tensor.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/family.h"
#include "longstraw/hybrid.h"
#include "longstraw/safetensors.h"

typedef struct {
    ls_st_model st;
    const char *prefix; /* "model." or "model.language_model." */
    ls_arena *fixed;
    const ls_backend *be; /* the fixed arena's: where the weights go */
    size_t n_params;
    int fused_gdn, fused_experts;
    uint8_t *used; /* [ls_st_model_count] 1: read (unknown_tensors reports the rest) */
} loader;

/* The position of t in the model's name order (binary search). */
static int64_t tensor_index(const loader *L, const ls_st_tensor *t) {
    int64_t lo = 0, hi = ls_st_model_count(&L->st) - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(ls_st_model_at(&L->st, mid)->name, t->name);
        if (c == 0) return mid;
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

/* Tensors a checkpoint may hold that the text model does not read (specs/
 * hybrid-qwen3next.md §6): the multi-token-prediction module (mtp.*), Qwen3.5's vision
 * tower (model.visual.*), and lm_head.weight beside tied embeddings. */
static int documented_skip(const ls_config *c, const char *name) {
    return !strncmp(name, "mtp.", 4) || !strncmp(name, "model.visual.", 13) ||
           (c->tie_embeddings && !strcmp(name, "lm_head.weight"));
}

/* Every tensor of the checkpoint was read or is a documented skip: anything else
 * means config.json does not describe these weights (3 layers on disk, 2 in the
 * config silently dropped layer 2), and is refused naming the tensors. */
static ls_status unknown_tensors(const loader *L, const ls_config *c) {
    int64_t n = ls_st_model_count(&L->st), bad = 0;
    char names[512] = "";
    size_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        const char *nm = ls_st_model_at(&L->st, i)->name;
        if (L->used[i] || documented_skip(c, nm)) continue;
        if (bad++ < 3 && off < sizeof names)
            off += (size_t)snprintf(names + off, sizeof names - off, "%s%s", off ? ", " : "", nm);
    }
    if (!bad) return LS_OK;
    return ls_err(LS_ERR_FORMAT, "%s: %lld tensor%s that config.json (%s, %lld layers) does not describe: %s%s; refusing "
                                 "weights the config does not match (only mtp.*, model.visual.* and a tied lm_head.weight "
                                 "are skipped)", L->st.dir, (long long)bad, bad == 1 ? "" : "s", c->model_type,
                  (long long)c->n_layers, names, bad > 3 ? ", ..." : "");
}

static float *falloc(loader *L, int64_t n) {
    return ls_arena_alloc(L->fixed, (size_t)n * sizeof(float));
}

static const ls_st_tensor *find(loader *L, const char *name, int required) {
    const ls_st_tensor *t = ls_st_model_find(&L->st, name);
    if (!t && required) ls_err(LS_ERR_FORMAT, "%s: checkpoint has no tensor \"%s\"", L->st.dir, name);
    return t;
}

/* n floats from host memory src into the model's weights at dst (the backend's memory) */
static void put(loader *L, float *dst, const float *src, int64_t n) {
    L->be->i->to_device(L->be, dst, src, (size_t)n * sizeof(float));
}

/* Read tensor `name` of the given shape (ndim ≤ 3) into dst (the backend's memory; through
 * a host buffer when that is not host memory); a NaN or Inf in it is refused here, naming
 * the tensor, instead of surfacing as a NaN loss later. */
static ls_status read_any(loader *L, const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2, float *dst,
                         int dst_on_host) {
    const ls_st_tensor *t = find(L, name, 1);
    if (!t) return LS_ERR_FORMAT;
    int64_t shape[3] = {d0, d1, d2};
    LS_TRY(ls_st_check_shape(t, ndim, shape, name));
    int64_t n = d0 * (ndim > 1 ? d1 : 1) * (ndim > 2 ? d2 : 1);
    size_t bytes = (size_t)n * sizeof(float);
    float *h = dst_on_host ? dst : ls_host_view(L->be, NULL, dst, bytes, 0);
    if (!h) return ls_err(LS_ERR_NOMEM, "cannot allocate %lld floats for %s", (long long)n, name);
    ls_status s = ls_st_read_weights(t, h, n, name);
    if (!dst_on_host) ls_host_view_done(L->be, NULL, dst, h, bytes, s == LS_OK);
    if (s != LS_OK) return s;
    int64_t at = tensor_index(L, t);
    if (at >= 0) L->used[at] = 1;
    L->n_params += (size_t)n;
    return LS_OK;
}
static ls_status read_t(loader *L, const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2, float *dst) {
    return read_any(L, name, ndim, d0, d1, d2, dst, 0);
}

/* Read into a temporary malloc'd buffer (load time only). */
static ls_status read_tmp(loader *L, const char *name, int ndim, int64_t d0, int64_t d1,
                          int64_t d2, float **out) {
    int64_t n = d0 * (ndim > 1 ? d1 : 1) * (ndim > 2 ? d2 : 1);
    float *buf = malloc((size_t)n * sizeof(float));
    if (!buf) return ls_err(LS_ERR_NOMEM, "cannot allocate %lld floats for %s", (long long)n, name);
    ls_status s = read_any(L, name, ndim, d0, d1, d2, buf, 1);
    if (s != LS_OK) {
        free(buf);
        return s;
    }
    *out = buf;
    return LS_OK;
}

#define NAME(buf, ...) snprintf(buf, sizeof buf, __VA_ARGS__)

static ls_status load_gdn(loader *L, const ls_config *c, int l, ls_hybrid_layer *w) {
    const ls_hybrid_config *hc = ls_hybrid_cfg(c);
    char n[256];
    int64_t D = c->hidden, kd = ls_cfg_key_dim(c), vd = ls_cfg_value_dim(c), cd = ls_cfg_conv_dim(c);
    int Hk = hc->H_k, Hv = hc->H_v, dk = hc->d_k, dv = hc->d_v, r = Hv / Hk;
    int64_t rows = cd + vd + 2 * Hv;
    w->gdn_in = falloc(L, rows * D); /* [q | k | v | z | b | a, D] */
    w->conv_w = falloc(L, cd * hc->conv_k);
    w->A_log = falloc(L, Hv);
    w->dt_bias = falloc(L, Hv);
    w->gnorm = falloc(L, dv);
    w->gdn_out = falloc(L, D * vd);
    if (!w->gdn_in || !w->conv_w || !w->A_log || !w->dt_bias || !w->gnorm || !w->gdn_out)
        return LS_ERR_NOMEM;
    const char *p = L->prefix;
    NAME(n, "%slayers.%d.linear_attn.in_proj_qkvz.weight", p, l);
    if (find(L, n, 0)) {
        L->fused_gdn = 1;
        /* Qwen3-Next: per key head g, rows [q_g (d_k) | k_g (d_k) | v (r·d_v) | z (r·d_v)] (§2.1) */
        int64_t grp = 2 * dk + 2 * (int64_t)r * dv;
        float *src = NULL;
        LS_TRY(read_tmp(L, n, 2, Hk * grp, D, 0, &src));
        for (int g = 0; g < Hk; g++) {
            const float *s = src + g * grp * D;
            put(L, w->gdn_in + (g * dk) * D, s, dk * D);
            put(L, w->gdn_in + (kd + g * dk) * D, s + dk * D, dk * D);
            put(L, w->gdn_in + (2 * kd + (int64_t)g * r * dv) * D, s + 2 * dk * D, (int64_t)r * dv * D);
            put(L, w->gdn_in + (cd + (int64_t)g * r * dv) * D, s + (2 * dk + (int64_t)r * dv) * D, (int64_t)r * dv * D);
        }
        free(src);
        NAME(n, "%slayers.%d.linear_attn.in_proj_ba.weight", p, l);
        LS_TRY(read_tmp(L, n, 2, (int64_t)Hk * 2 * r, D, 0, &src));
        for (int g = 0; g < Hk; g++)
            for (int j = 0; j < r; j++) {
                int h = g * r + j;
                put(L, w->gdn_in + (cd + vd + h) * D, src + ((int64_t)g * 2 * r + j) * D, D);
                put(L, w->gdn_in + (cd + vd + Hv + h) * D, src + ((int64_t)g * 2 * r + r + j) * D, D);
            }
        free(src);
    } else {
        /* Qwen3.5: split projections, already head-major [all q | all k | all v] */
        NAME(n, "%slayers.%d.linear_attn.in_proj_qkv.weight", p, l);
        LS_TRY(read_t(L, n, 2, cd, D, 0, w->gdn_in));
        NAME(n, "%slayers.%d.linear_attn.in_proj_z.weight", p, l);
        LS_TRY(read_t(L, n, 2, vd, D, 0, w->gdn_in + cd * D));
        NAME(n, "%slayers.%d.linear_attn.in_proj_b.weight", p, l);
        LS_TRY(read_t(L, n, 2, Hv, D, 0, w->gdn_in + (cd + vd) * D));
        NAME(n, "%slayers.%d.linear_attn.in_proj_a.weight", p, l);
        LS_TRY(read_t(L, n, 2, Hv, D, 0, w->gdn_in + (cd + vd + Hv) * D));
    }
    NAME(n, "%slayers.%d.linear_attn.conv1d.weight", p, l);
    const ls_st_tensor *ct = find(L, n, 1);
    if (!ct) return LS_ERR_FORMAT;
    if (ct->ndim == 2)
        LS_TRY(read_t(L, n, 2, cd, hc->conv_k, 0, w->conv_w));
    else
        LS_TRY(read_t(L, n, 3, cd, 1, hc->conv_k, w->conv_w));
    NAME(n, "%slayers.%d.linear_attn.A_log", p, l);
    LS_TRY(read_t(L, n, 1, Hv, 0, 0, w->A_log));
    NAME(n, "%slayers.%d.linear_attn.dt_bias", p, l);
    LS_TRY(read_t(L, n, 1, Hv, 0, 0, w->dt_bias));
    NAME(n, "%slayers.%d.linear_attn.norm.weight", p, l);
    LS_TRY(read_t(L, n, 1, dv, 0, 0, w->gnorm));
    NAME(n, "%slayers.%d.linear_attn.out_proj.weight", p, l);
    LS_TRY(read_t(L, n, 2, D, vd, 0, w->gdn_out));
    return LS_OK;
}

static ls_status load_attn(loader *L, const ls_config *c, int l, ls_hybrid_layer *w) {
    char n[256];
    int64_t D = c->hidden, hd = c->head_dim, qd = (int64_t)c->n_heads * hd, kvd = (int64_t)c->n_kv * hd;
    w->attn_in = falloc(L, (2 * qd + 2 * kvd) * D);
    w->q_norm = falloc(L, hd);
    w->k_norm = falloc(L, hd);
    w->attn_out = falloc(L, D * qd);
    if (!w->attn_in || !w->q_norm || !w->k_norm || !w->attn_out) return LS_ERR_NOMEM;
    const char *p = L->prefix;
    float *src = NULL;
    NAME(n, "%slayers.%d.self_attn.q_proj.weight", p, l);
    LS_TRY(read_tmp(L, n, 2, 2 * qd, D, 0, &src));
    for (int h = 0; h < c->n_heads; h++) { /* per head [q_h | gate_h] (§4.1) */
        put(L, w->attn_in + (h * hd) * D, src + (2 * h * hd) * D, hd * D);
        put(L, w->attn_in + (qd + h * hd) * D, src + (2 * h * hd + hd) * D, hd * D);
    }
    free(src);
    NAME(n, "%slayers.%d.self_attn.k_proj.weight", p, l);
    LS_TRY(read_t(L, n, 2, kvd, D, 0, w->attn_in + 2 * qd * D));
    NAME(n, "%slayers.%d.self_attn.v_proj.weight", p, l);
    LS_TRY(read_t(L, n, 2, kvd, D, 0, w->attn_in + (2 * qd + kvd) * D));
    NAME(n, "%slayers.%d.self_attn.q_norm.weight", p, l);
    LS_TRY(read_t(L, n, 1, hd, 0, 0, w->q_norm));
    NAME(n, "%slayers.%d.self_attn.k_norm.weight", p, l);
    LS_TRY(read_t(L, n, 1, hd, 0, 0, w->k_norm));
    NAME(n, "%slayers.%d.self_attn.o_proj.weight", p, l);
    LS_TRY(read_t(L, n, 2, D, qd, 0, w->attn_out));
    return LS_OK;
}

/* SwiGLU weights under `base` ("...mlp" or "...mlp.shared_expert") into gu [2I, D], down [D, I]. */
static ls_status load_swiglu(loader *L, const char *base, int64_t D, int64_t I, float *gu,
                             float *down) {
    char n[320];
    NAME(n, "%s.gate_proj.weight", base);
    LS_TRY(read_t(L, n, 2, I, D, 0, gu));
    NAME(n, "%s.up_proj.weight", base);
    LS_TRY(read_t(L, n, 2, I, D, 0, gu + I * D));
    NAME(n, "%s.down_proj.weight", base);
    return read_t(L, n, 2, D, I, 0, down);
}

static ls_status load_ffn(loader *L, const ls_config *c, int l, ls_hybrid_layer *w) {
    char base[256], n[320];
    int64_t D = c->hidden;
    NAME(base, "%slayers.%d.mlp", L->prefix, l);
    if (!c->moe[l]) {
        int64_t I = c->intermediate;
        w->mlp_gu = falloc(L, 2 * I * D);
        w->mlp_down = falloc(L, D * I);
        if (!w->mlp_gu || !w->mlp_down) return LS_ERR_NOMEM;
        return load_swiglu(L, base, D, I, w->mlp_gu, w->mlp_down);
    }
    int64_t E = c->n_experts, Im = c->moe_inter;
    w->router = falloc(L, E * D);
    w->exp_gu = falloc(L, E * 2 * Im * D);
    w->exp_down = falloc(L, E * D * Im);
    if (!w->router || !w->exp_gu || !w->exp_down) return LS_ERR_NOMEM;
    NAME(n, "%s.gate.weight", base);
    LS_TRY(read_t(L, n, 2, E, D, 0, w->router));
    NAME(n, "%s.experts.gate_up_proj", base);
    if (find(L, n, 0)) { /* fused (HF v5 layout): [E, 2·I, D] gate rows then up; [E, D, I] */
        L->fused_experts = 1;
        LS_TRY(read_t(L, n, 3, E, 2 * Im, D, w->exp_gu));
        NAME(n, "%s.experts.down_proj", base);
        LS_TRY(read_t(L, n, 3, E, D, Im, w->exp_down));
    } else {
        for (int64_t e = 0; e < E; e++) {
            char eb[300];
            NAME(eb, "%s.experts.%lld", base, (long long)e);
            LS_TRY(load_swiglu(L, eb, D, Im, w->exp_gu + e * 2 * Im * D, w->exp_down + e * D * Im));
        }
    }
    if (c->shared_inter > 0) {
        int64_t Is = c->shared_inter;
        w->sh_gu = falloc(L, 2 * Is * D);
        w->sh_down = falloc(L, D * Is);
        w->sh_gate = falloc(L, D);
        if (!w->sh_gu || !w->sh_down || !w->sh_gate) return LS_ERR_NOMEM;
        NAME(n, "%s.shared_expert", base);
        LS_TRY(load_swiglu(L, n, D, Is, w->sh_gu, w->sh_down));
        NAME(n, "%s.shared_expert_gate.weight", base);
        LS_TRY(read_t(L, n, 2, 1, D, 0, w->sh_gate));
    }
    return LS_OK;
}

static ls_status load_all(loader *L, ls_hybrid_model *m) {
    ls_config *c = &m->cfg;
    const ls_hybrid_config *hc = ls_hybrid_cfg(c);
    int64_t D = c->hidden, V = c->vocab;
    char n[256];
    /* Prefix by what the checkpoint holds (a text-only Qwen3.5 may sit under "model."). */
    const char *prefixes[2] = {hc->layout == LS_LAYOUT_QWEN3_5 ? "model.language_model." : "model.",
                               hc->layout == LS_LAYOUT_QWEN3_5 ? "model." : "model.language_model."};
    L->prefix = prefixes[0];
    NAME(n, "%sembed_tokens.weight", prefixes[1]);
    if (!find(L, "model.language_model.embed_tokens.weight", 0) && !find(L, "model.embed_tokens.weight", 0))
        return ls_err(LS_ERR_FORMAT, "%s: checkpoint has no tensor \"%sembed_tokens.weight\"", L->st.dir,
                      prefixes[0]);
    NAME(n, "%sembed_tokens.weight", prefixes[0]);
    if (!find(L, n, 0)) L->prefix = prefixes[1];
    m->embed = falloc(L, V * D);
    m->final_norm = falloc(L, D);
    m->layers = ls_arena_host_calloc(L->fixed, (size_t)c->n_layers, sizeof(ls_hybrid_layer));
    if (!m->embed || !m->final_norm || !m->layers) return LS_ERR_NOMEM;
    NAME(n, "%sembed_tokens.weight", L->prefix);
    LS_TRY(read_t(L, n, 2, V, D, 0, m->embed));
    NAME(n, "%snorm.weight", L->prefix);
    LS_TRY(read_t(L, n, 1, D, 0, 0, m->final_norm));
    if (c->tie_embeddings) {
        m->lm_head = m->embed;
    } else {
        m->lm_head = falloc(L, V * D);
        if (!m->lm_head) return LS_ERR_NOMEM;
        LS_TRY(read_t(L, "lm_head.weight", 2, V, D, 0, m->lm_head));
    }
    for (int l = 0; l < c->n_layers; l++) {
        ls_hybrid_layer *w = &m->layers[l];
        w->input_norm = falloc(L, D);
        w->post_norm = falloc(L, D);
        if (!w->input_norm || !w->post_norm) return LS_ERR_NOMEM;
        NAME(n, "%slayers.%d.input_layernorm.weight", L->prefix, l);
        LS_TRY(read_t(L, n, 1, D, 0, 0, w->input_norm));
        NAME(n, "%slayers.%d.post_attention_layernorm.weight", L->prefix, l);
        LS_TRY(read_t(L, n, 1, D, 0, 0, w->post_norm));
        if (c->kind[l] == LS_LAYER_GDN)
            LS_TRY(load_gdn(L, c, l, w));
        else
            LS_TRY(load_attn(L, c, l, w));
        LS_TRY(load_ffn(L, c, l, w));
    }
    return LS_OK;
}

ls_status ls_hybrid_load(ls_hybrid_model *m, const char *dir, ls_arena *fixed) {
    memset(m, 0, sizeof *m);
    m->be = ls_arena_backend(fixed);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    LS_TRY(ls_config_load(&m->cfg, path));
    if (m->cfg.family != &ls_hybrid_family) {
        const ls_family *f = ls_family_for(&m->cfg, path); /* sets the message when none reads it */
        return f ? ls_err(LS_ERR_ARG, "%s: model_type \"%s\" belongs to the \"%s\" family, not the hybrid (Gated DeltaNet) one", path,
                          m->cfg.model_type, f->name)
                 : LS_ERR_UNSUPPORTED;
    }
    loader L;
    memset(&L, 0, sizeof L);
    L.fixed = fixed;
    L.be = m->be;
    LS_TRY(ls_st_model_open(&L.st, dir));
    L.used = calloc((size_t)(ls_st_model_count(&L.st) > 0 ? ls_st_model_count(&L.st) : 1), 1);
    ls_status s = L.used ? load_all(&L, m) : LS_ERR_NOMEM;
    if (s == LS_OK) s = unknown_tensors(&L, &m->cfg);
    free(L.used);
    m->n_params = L.n_params;
    m->fused_gdn = L.fused_gdn;
    m->fused_experts = L.fused_experts;
    snprintf(m->prefix, sizeof m->prefix, "%s", L.prefix ? L.prefix : "model.");
    if (s != LS_OK) ls_err_ctx(s, "loading %s", dir);
    ls_st_model_close(&L.st);
    return s;
}
