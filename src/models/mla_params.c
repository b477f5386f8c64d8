/*
 * mla_params.c — the MLA + DSA + MoE family's tensors (specs/mla-dsa-moe.md §5) as one
 * list: every HF tensor with its shape, init kind and the slot (and offset) it lives in.
 * Loading, export, the parameter list, gradient sets and `init`'s tensor specs all walk
 * it, so they cannot disagree. Tensors keep their HF layout in f32; gate and up
 * projections are fused row blocks [gate ; up] and experts are stacked, so each HF
 * tensor is one contiguous slice of its slot. Errors name the file and the tensor.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/cp.h"
#include "longstraw/mla.h"
#include "longstraw/safetensors.h"

typedef struct {
    ls_mla_tensor *t; /* NULL: count only */
    int64_t n;
    int err;
} tlist;

static void add(tlist *l, int layer, size_t field, int64_t off, ls_init_kind init, int frozen, int ndim, int64_t d0,
                int64_t d1, const char *fmt, ...) __attribute__((format(printf, 10, 11)));
static void add(tlist *l, int layer, size_t field, int64_t off, ls_init_kind init, int frozen, int ndim, int64_t d0,
                int64_t d1, const char *fmt, ...) {
    if (l->t) {
        ls_mla_tensor *t = &l->t[l->n];
        memset(t, 0, sizeof *t);
        va_list ap;
        va_start(ap, fmt);
        if (vsnprintf(t->name, sizeof t->name, fmt, ap) >= (int)sizeof t->name) l->err = 1;
        va_end(ap);
        t->ndim = ndim, t->shape[0] = d0, t->shape[1] = ndim > 1 ? d1 : 1;
        t->init = init, t->layer = layer, t->field = field, t->off = off, t->frozen = frozen;
        t->no_decay = ndim == 1, t->expert = -1;
    }
    l->n++;
}

#define LF(f) offsetof(ls_mla_layer, f)
#define MF(f) offsetof(ls_mla_model, f)

static void walk(const ls_config *c, int64_t e0, int64_t ne, tlist *l) {
    const ls_mla_config *m = ls_mla_cfg(c);
    int64_t D = c->hidden, H = c->n_heads, dn = m->qk_nope, dr = m->qk_rope, dv = m->v_head;
    int64_t rq = m->q_lora_rank, rkv = m->kv_lora_rank, nI = m->index_heads, dI = m->index_head_dim;
    const char *p = "model.layers.";
    add(l, -1, MF(embed), 0, LS_INIT_EMBED, 0, 2, c->vocab, D, "model.embed_tokens.weight");
    for (int i = 0; i < c->n_layers; i++) {
        add(l, i, LF(input_norm), 0, LS_INIT_NORM1, 0, 1, D, 0, "%s%d.input_layernorm.weight", p, i);
        add(l, i, LF(q_a), 0, LS_INIT_LINEAR, 0, 2, rq, D, "%s%d.self_attn.q_a_proj.weight", p, i);
        add(l, i, LF(q_a_norm), 0, LS_INIT_NORM1, 0, 1, rq, 0, "%s%d.self_attn.q_a_layernorm.weight", p, i);
        add(l, i, LF(q_b), 0, LS_INIT_LINEAR, 0, 2, H * (dn + dr), rq, "%s%d.self_attn.q_b_proj.weight", p, i);
        add(l, i, LF(kv_a), 0, LS_INIT_LINEAR, 0, 2, rkv + dr, D, "%s%d.self_attn.kv_a_proj_with_mqa.weight", p, i);
        add(l, i, LF(kv_a_norm), 0, LS_INIT_NORM1, 0, 1, rkv, 0, "%s%d.self_attn.kv_a_layernorm.weight", p, i);
        add(l, i, LF(kv_b), 0, LS_INIT_LINEAR, 0, 2, H * (dn + dv), rkv, "%s%d.self_attn.kv_b_proj.weight", p, i);
        add(l, i, LF(o_proj), 0, LS_INIT_LINEAR, 0, 2, D, H * dv, "%s%d.self_attn.o_proj.weight", p, i);
        if (m->index_full[i]) {
            add(l, i, LF(idx_wq), 0, LS_INIT_LINEAR, 1, 2, nI * dI, rq, "%s%d.self_attn.indexer.wq_b.weight", p, i);
            add(l, i, LF(idx_wk), 0, LS_INIT_LINEAR, 1, 2, dI, D, "%s%d.self_attn.indexer.wk.weight", p, i);
            add(l, i, LF(idx_knorm_w), 0, LS_INIT_NORM1, 1, 1, dI, 0, "%s%d.self_attn.indexer.k_norm.weight", p, i);
            add(l, i, LF(idx_knorm_b), 0, LS_INIT_BIAS0, 1, 1, dI, 0, "%s%d.self_attn.indexer.k_norm.bias", p, i);
            add(l, i, LF(idx_weights), 0, LS_INIT_LINEAR, 1, 2, nI, D, "%s%d.self_attn.indexer.weights_proj.weight", p,
                i);
        }
        add(l, i, LF(post_norm), 0, LS_INIT_NORM1, 0, 1, D, 0, "%s%d.post_attention_layernorm.weight", p, i);
        if (c->moe[i]) {
            int64_t Im = c->moe_inter, Is = c->moe_inter * m->n_shared_experts;
            add(l, i, LF(router), 0, LS_INIT_LINEAR, 0, 2, c->n_experts, D, "%s%d.mlp.gate.weight", p, i);
            add(l, i, LF(router_bias), 0, LS_INIT_BIAS0, 1, 1, c->n_experts, 0, "%s%d.mlp.gate.e_score_correction_bias",
                p, i);
            for (int e = (int)e0; e < e0 + ne; e++) { /* stacked from e0 */
                int64_t g = (e - e0) * 2 * Im * D;
                add(l, i, LF(exp_gu), g, LS_INIT_LINEAR, 0, 2, Im, D, "%s%d.mlp.experts.%d.gate_proj.weight", p, i, e);
                add(l, i, LF(exp_gu), g + Im * D, LS_INIT_LINEAR, 0, 2, Im, D, "%s%d.mlp.experts.%d.up_proj.weight", p,
                    i, e);
                add(l, i, LF(exp_down), (e - e0) * D * Im, LS_INIT_LINEAR, 0, 2, D, Im,
                    "%s%d.mlp.experts.%d.down_proj.weight", p, i, e);
                for (int k = 1; l->t && k <= 3; k++) l->t[l->n - k].expert = e;
            }
            if (Is > 0) {
                add(l, i, LF(sh_gu), 0, LS_INIT_LINEAR, 0, 2, Is, D, "%s%d.mlp.shared_experts.gate_proj.weight", p, i);
                add(l, i, LF(sh_gu), Is * D, LS_INIT_LINEAR, 0, 2, Is, D, "%s%d.mlp.shared_experts.up_proj.weight", p,
                    i);
                add(l, i, LF(sh_down), 0, LS_INIT_LINEAR, 0, 2, D, Is, "%s%d.mlp.shared_experts.down_proj.weight", p, i);
            }
        } else {
            int64_t I = c->intermediate;
            add(l, i, LF(mlp_gu), 0, LS_INIT_LINEAR, 0, 2, I, D, "%s%d.mlp.gate_proj.weight", p, i);
            add(l, i, LF(mlp_gu), I * D, LS_INIT_LINEAR, 0, 2, I, D, "%s%d.mlp.up_proj.weight", p, i);
            add(l, i, LF(mlp_down), 0, LS_INIT_LINEAR, 0, 2, D, I, "%s%d.mlp.down_proj.weight", p, i);
        }
    }
    add(l, -1, MF(final_norm), 0, LS_INIT_NORM1, 0, 1, D, 0, "model.norm.weight");
    if (!c->tie_embeddings) add(l, -1, MF(lm_head), 0, LS_INIT_LINEAR, 0, 2, c->vocab, D, "lm_head.weight");
}

ls_status ls_mla_tensors(const ls_config *c, int64_t e0, int64_t ne, ls_mla_tensor **out, int64_t *n) {
    tlist l = {0};
    walk(c, e0, ne, &l);
    l.t = malloc((size_t)(l.n > 0 ? l.n : 1) * sizeof *l.t);
    if (!l.t) return ls_err(LS_ERR_NOMEM, "out of memory listing the tensors of %s", c->model_type);
    l.n = 0;
    walk(c, e0, ne, &l);
    if (l.err) {
        free(l.t);
        return ls_err(LS_ERR_ARG, "%s: a tensor name is longer than %zu bytes", c->model_type,
                      sizeof l.t->name - 1);
    }
    *out = l.t, *n = l.n;
    return LS_OK;
}

ls_status ls_mla_hf_specs(const ls_config *c, ls_hf_tensor_spec **out, int64_t *n) {
    ls_mla_tensor *t;
    LS_TRY(ls_mla_tensors(c, 0, c->n_experts, &t, n));
    ls_hf_tensor_spec *sp = calloc((size_t)(*n > 0 ? *n : 1), sizeof *sp);
    if (!sp) {
        free(t);
        return ls_err(LS_ERR_NOMEM, "out of memory listing the tensors of %s", c->model_type);
    }
    for (int64_t i = 0; i < *n; i++) {
        snprintf(sp[i].name, sizeof sp[i].name, "%s", t[i].name);
        sp[i].ndim = t[i].ndim, sp[i].shape[0] = t[i].shape[0], sp[i].shape[1] = t[i].ndim > 1 ? t[i].shape[1] : 0;
        sp[i].init = t[i].init;
    }
    free(t);
    *out = sp;
    return LS_OK;
}

static float **slot(const ls_mla_model *m, int layer, size_t field) {
    return layer < 0 ? (float **)((char *)m + field) : (float **)((char *)&m->layers[layer] + field);
}

float *ls_mla_at(const ls_mla_model *m, const ls_mla_tensor *t) {
    float *b = *slot(m, t->layer, t->field);
    return b ? b + t->off : NULL;
}

static int64_t numel(const ls_mla_tensor *t) { return t->shape[0] * t->shape[1]; }

/* Every slot of dst sized by its tensors (the largest off + numel) and zeroed where
 * keep(tensor) says so for a tensor of the slot; other slots are `share`'s (NULL: left
 * NULL). The tied LM head is the embedding. */
static ls_status alloc_slots(ls_mla_model *dst, ls_arena *arena, ls_mla_keep_fn keep, const void *ctx,
                             const ls_mla_model *share) {
    const ls_config *c = &dst->cfg;
    if (!(dst->layers = ls_arena_host_calloc(arena, (size_t)c->n_layers, sizeof(ls_mla_layer)))) return LS_ERR_NOMEM;
    for (int64_t i = 0; i < dst->n_tensors; i++) {
        const ls_mla_tensor *t = &dst->tensors[i];
        if (*slot(dst, t->layer, t->field)) continue;
        int64_t need = t->off + numel(t); /* the slot's size: its tensors' furthest end (all in its layer) */
        int kept = !keep || keep(t, ctx);
        for (int64_t j = i + 1; t->layer >= 0 && j < dst->n_tensors && dst->tensors[j].layer == t->layer; j++)
            if (dst->tensors[j].field == t->field) {
                if (dst->tensors[j].off + numel(&dst->tensors[j]) > need)
                    need = dst->tensors[j].off + numel(&dst->tensors[j]);
                kept |= !keep || keep(&dst->tensors[j], ctx);
            }
        if (!kept) {
            if (share) *slot(dst, t->layer, t->field) = *slot(share, t->layer, t->field);
            continue;
        }
        float *b = ls_arena_calloc(arena, (size_t)need, sizeof(float));
        if (!b) return ls_err(LS_ERR_NOMEM, "out of memory for %s (%lld values)", t->name, (long long)need);
        *slot(dst, t->layer, t->field) = b;
    }
    if (c->tie_embeddings) dst->lm_head = dst->embed;
    return LS_OK;
}

static int not_frozen(const ls_mla_tensor *t, const void *ctx) {
    (void)ctx;
    return !t->frozen;
}

ls_status ls_mla_alloc_subset(const ls_mla_model *src, ls_mla_model *dst, ls_arena *arena, ls_mla_keep_fn keep,
                              const void *ctx, const ls_mla_model *share) {
    memset(dst, 0, sizeof *dst);
    dst->cfg = src->cfg;
    dst->be = src->be;
    dst->tensors = src->tensors, dst->n_tensors = src->n_tensors;
    dst->inv_freq = src->inv_freq, dst->scale = src->scale, dst->n_params = src->n_params;
    dst->ep = src->ep, dst->e0 = src->e0, dst->n_local_experts = src->n_local_experts;
    return alloc_slots(dst, arena, keep, ctx, share);
}

ls_status ls_mla_alloc_like(const ls_mla_model *src, ls_mla_model *dst, ls_arena *arena, int grads) {
    return ls_mla_alloc_subset(src, dst, arena, grads ? not_frozen : NULL, NULL, NULL);
}

void ls_mla_copy_slots(const ls_mla_model *src, ls_mla_model *dst) {
    for (int64_t i = 0; i < dst->n_tensors; i++) {
        const ls_mla_tensor *t = &dst->tensors[i];
        float *d = ls_mla_at(dst, t), *s0 = ls_mla_at(src, t);
        if (d && s0 && d != s0) ls_op_copy(dst->be, d, s0, numel(t));
    }
}

/* FP8 releases (e4m3 weights with weight_scale_inv blocks) are refused up front. */
static ls_status refuse_fp8(const ls_st_model *st) {
    for (int64_t i = 0; i < ls_st_model_count(st); i++) {
        const ls_st_tensor *t = ls_st_model_at(st, i);
        const char *dt = ls_st_dtype_name(t->st_dtype);
        if (strncmp(dt, "F8", 2) == 0 || strstr(t->name, "weight_scale_inv"))
            return ls_err(LS_ERR_UNSUPPORTED,
                          "%s: tensor \"%s\" is %s: FP8 checkpoints are not supported (they would need their "
                          "weight_scale_inv blocks dequantised); use the BF16 release or dequantise to BF16 first",
                          t->file, t->name, strstr(t->name, "weight_scale_inv") ? "an FP8 block scale" : dt);
    }
    return LS_OK;
}

/* Tensor t of the checkpoint into dst (be's memory, through a host view): shape checked,
 * NaN/Inf refused (ls_st_read_weights). */
static ls_status read_tensor(const ls_backend *be, const ls_st_model *st, const ls_mla_tensor *t, float *dst) {
    const ls_st_tensor *f = ls_st_model_find(st, t->name);
    if (!f) return ls_err(LS_ERR_FORMAT, "%s: checkpoint has no tensor \"%s\"", st->dir, t->name);
    LS_TRY(ls_st_check_shape(f, t->ndim, t->shape, t->name));
    size_t bytes = (size_t)numel(t) * sizeof(float);
    float *h = ls_host_view(be, NULL, dst, bytes, 0);
    if (!h) return ls_err(LS_ERR_NOMEM, "cannot allocate %lld floats for %s", (long long)numel(t), t->name);
    ls_status s = ls_st_read_weights(f, h, numel(t), t->name);
    ls_host_view_done(be, NULL, dst, h, bytes, s == LS_OK);
    return s;
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* A layer of the multi-token-prediction module: model.layers.<i>.* with i in
 * [num_hidden_layers, + num_nextn_predict_layers) (specs/mla-dsa-moe.md §5: used for
 * speculative decoding only, never read here). */
static int is_mtp_layer(const ls_config *c, const char *name) {
    const char *p = "model.layers.";
    if (strncmp(name, p, strlen(p)) != 0) return 0;
    char *end;
    long i = strtol(name + strlen(p), &end, 10);
    return *end == '.' && i >= c->n_layers && i < c->n_layers + ls_mla_cfg(c)->n_mtp;
}

/* Every tensor of the checkpoint is one the config describes (any expert: the other
 * --ep ranks read theirs) or an MTP layer; anything else means config.json does not
 * describe these weights (a third layer on disk with two in the config was silently
 * dropped) and is refused naming the tensors. */
static ls_status unknown_tensors(const ls_st_model *st, const ls_config *c) {
    ls_mla_tensor *all;
    int64_t nall;
    LS_TRY(ls_mla_tensors(c, 0, c->n_experts, &all, &nall));
    const char **names = malloc((size_t)(nall > 0 ? nall : 1) * sizeof *names);
    if (!names) {
        free(all);
        return ls_err(LS_ERR_NOMEM, "out of memory listing the tensors of %s", c->model_type);
    }
    for (int64_t i = 0; i < nall; i++) names[i] = all[i].name;
    qsort(names, (size_t)nall, sizeof *names, cmp_name);
    int64_t bad = 0;
    char list[512] = "";
    size_t off = 0;
    for (int64_t i = 0; i < ls_st_model_count(st); i++) {
        const char *nm = ls_st_model_at(st, i)->name;
        if (bsearch(&nm, names, (size_t)nall, sizeof *names, cmp_name) || is_mtp_layer(c, nm)) continue;
        if (bad++ < 3 && off < sizeof list)
            off += (size_t)snprintf(list + off, sizeof list - off, "%s%s", off ? ", " : "", nm);
    }
    free(names);
    free(all);
    if (!bad) return LS_OK;
    return ls_err(LS_ERR_FORMAT, "%s: %lld tensor%s that config.json (%s, %lld layers + %d MTP) does not describe: %s%s; "
                                 "refusing weights the config does not match (only the MTP layers model.layers.%lld.. "
                                 "(num_nextn_predict_layers) are skipped)", st->dir, (long long)bad, bad == 1 ? "" : "s",
                  c->model_type, (long long)c->n_layers, ls_mla_cfg(c)->n_mtp, list, bad > 3 ? ", ..." : "",
                  (long long)c->n_layers);
}

ls_status ls_mla_load(ls_mla_model *m, const char *dir, const ls_comm *ep, ls_arena *fixed) {
    memset(m, 0, sizeof *m);
    m->be = ls_arena_backend(fixed);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    LS_TRY(ls_config_load(&m->cfg, path));
    const ls_config *c = &m->cfg;
    if (c->family != &ls_mla_family) return ls_err(LS_ERR_ARG, "%s: not an MLA-family checkpoint", path);
    int N = ep ? ls_comm_size(ep) : 1;
    if (c->n_experts % N != 0)
        return ls_err(LS_ERR_ARG, "%s: n_routed_experts %d does not split over --ep %d ranks", path, c->n_experts, N);
    m->ep = N > 1 ? ep : NULL;
    m->n_local_experts = c->n_experts / N;
    m->e0 = (N > 1 ? ls_comm_rank(ep) : 0) * m->n_local_experts;
    ls_mla_tensor *tl;
    int64_t nt;
    LS_TRY(ls_mla_tensors(c, m->e0, m->n_local_experts, &tl, &nt));
    ls_mla_tensor *keep = ls_arena_host_alloc(fixed, (size_t)nt * sizeof *keep);
    m->inv_freq = ls_arena_alloc(fixed, (size_t)(ls_mla_cfg(c)->qk_rope / 2 + 1) * sizeof(double));
    if (!keep || !m->inv_freq) {
        free(tl);
        return LS_ERR_NOMEM;
    }
    memcpy(keep, tl, (size_t)nt * sizeof *keep);
    free(tl);
    m->tensors = keep, m->n_tensors = nt;
    size_t fb = (size_t)(ls_mla_cfg(c)->qk_rope / 2 + 1) * sizeof(double);
    double *freqs = ls_host_view(m->be, NULL, m->inv_freq, fb, 0); /* computed on the host, then placed */
    if (!freqs) return ls_err(LS_ERR_NOMEM, "cannot allocate the rope frequencies");
    ls_mla_rope_freqs(c, freqs, NULL, NULL);
    ls_host_view_done(m->be, NULL, m->inv_freq, freqs, fb, 1);
    m->scale = (float)ls_mla_softmax_scale(c);
    ls_st_model st;
    LS_TRY(ls_st_model_open(&st, dir));
    ls_status s = refuse_fp8(&st);
    if (s == LS_OK) s = unknown_tensors(&st, c);
    for (int64_t i = 0; i < nt && s == LS_OK; i++) { /* every tensor present and shaped before any allocation */
        const ls_st_tensor *f = ls_st_model_find(&st, keep[i].name);
        s = f ? ls_st_check_shape(f, keep[i].ndim, keep[i].shape, keep[i].name)
              : ls_err(LS_ERR_FORMAT, "%s: checkpoint has no tensor \"%s\"", st.dir, keep[i].name);
    }
    if (s == LS_OK) s = alloc_slots(m, fixed, NULL, NULL, NULL);
    for (int64_t i = 0; i < nt && s == LS_OK; i++) { /* MTP layers are not in the list: never read (allowed above) */
        s = read_tensor(m->be, &st, &keep[i], ls_mla_at(m, &keep[i]));
        m->n_params += (size_t)numel(&keep[i]);
    }
    ls_st_model_close(&st);
    return s;
}

ls_status ls_mla_params(const ls_mla_model *m, ls_param **out, int64_t *n) {
    ls_param *v = malloc((size_t)(m->n_tensors > 0 ? m->n_tensors : 1) * sizeof *v);
    if (!v) return ls_err(LS_ERR_NOMEM, "cannot list %lld parameters", (long long)m->n_tensors);
    *n = 0;
    for (int64_t i = 0; i < m->n_tensors; i++) {
        const ls_mla_tensor *t = &m->tensors[i];
        if (!t->frozen) v[(*n)++] = (ls_param){ls_mla_at(m, t), numel(t), t->no_decay, t->name};
    }
    *out = v;
    return LS_OK;
}

/* One tensor of an export: its data (borrowed, or `own` when gathered). */
typedef struct {
    const ls_mla_tensor *t;
    const float *p;
    float *own;
} out_tensor;

/* The element offset of global expert tensor t in a model holding experts from e0. */
static int64_t local_off(const ls_mla_tensor *t, const ls_config *c, int64_t e0) {
    int64_t unit = t->field == offsetof(ls_mla_layer, exp_gu) ? 2 * c->moe_inter * c->hidden : c->hidden * c->moe_inter;
    return t->off - e0 * unit;
}

ls_status ls_mla_export(const ls_mla_model *m, const ls_st_sink *to, ls_dtype dtype, const char *meta_key,
                        const char *meta_value) {
    const ls_config *c = &m->cfg;
    int N = m->ep ? ls_comm_size(m->ep) : 1, r = m->ep ? ls_comm_rank(m->ep) : 0;
    if (N == 1 && !to) return LS_OK;
    if (N > 1) { /* only the EP group whose rank 0 writes gathers the experts */
        float writes = to && r == 0 ? 1.0f : 0.0f;
        LS_TRY(ls_dist_max_f32(m->ep, &writes, 1));
        if (writes == 0.0f) return LS_OK;
    }
    ls_mla_tensor *all = NULL; /* the full list: every expert */
    int64_t nall = 0;
    LS_TRY(ls_mla_tensors(c, 0, c->n_experts, &all, &nall));
    out_tensor *ot = calloc((size_t)(nall > 0 ? nall : 1), sizeof *ot);
    int64_t zmax = 0;
    ls_status s = ot ? LS_OK : LS_ERR_NOMEM;
    for (int64_t i = 0; i < nall && s == LS_OK; i++) {
        const ls_mla_tensor *t = &all[i];
        ot[i].t = t;
        int owner = t->expert >= 0 ? (int)(t->expert / m->n_local_experts) : r;
        float *b = *slot(m, t->layer, t->field); /* NULL: not in this set (a frozen tensor of a gradient set) */
        if (owner == r) { /* held here: the slot's buffer at the local offset */
            ot[i].p = b ? b + (t->expert >= 0 ? local_off(t, c, m->e0) : t->off) : NULL;
            if (ot[i].p && !ls_host_direct(m->be)) { /* the writer and the gather read host memory */
                if (!(ot[i].own = ls_host_view(m->be, NULL, (void *)ot[i].p, (size_t)numel(t) * sizeof(float), 1)))
                    s = LS_ERR_NOMEM;
                ot[i].p = ot[i].own;
            }
            if (s == LS_OK && t->expert >= 0 && owner != 0 && ot[i].p) /* an expert not the writer's: to the ep group's rank 0 */
                s = ls_dist_ep_gather(m->ep, ot[i].p, NULL, numel(t), owner);
        } else if (r == 0 && b) { /* the ep group's rank 0 gathers every expert */
            if (!(ot[i].own = malloc((size_t)numel(t) * sizeof(float)))) s = LS_ERR_NOMEM;
            if (s == LS_OK) s = ls_dist_ep_gather(m->ep, NULL, ot[i].own, numel(t), owner);
            ot[i].p = ot[i].own;
        }
        if (!ot[i].p && numel(t) > zmax) zmax = numel(t);
    }
    ls_st_writer w;
    ls_st_writer_init(&w);
    float *zeros = NULL; /* frozen tensors of a gradient set */
    if (s == LS_OK && to && r == 0 && !(zeros = calloc((size_t)(zmax > 0 ? zmax : 1), sizeof(float)))) s = LS_ERR_NOMEM;
    for (int64_t i = 0; i < nall && s == LS_OK && to && r == 0; i++) {
        const ls_mla_tensor *t = ot[i].t;
        s = ls_st_writer_add_f32(&w, t->name, t->ndim == 1 ? LS_DTYPE_F32 : dtype, t->ndim, t->shape,
                                 ot[i].p ? ot[i].p : zeros);
    }
    if (s == LS_OK && to && r == 0) s = ls_st_writer_add_meta(&w, "format", "pt");
    if (s == LS_OK && to && r == 0 && meta_key) s = ls_st_writer_add_meta(&w, meta_key, meta_value);
    if (s == LS_OK && to && r == 0) s = ls_st_emit(&w, to);
    ls_st_writer_free(&w);
    for (int64_t i = 0; ot && i < nall; i++) free(ot[i].own);
    free(ot);
    free(zeros);
    free(all);
    return s;
}
