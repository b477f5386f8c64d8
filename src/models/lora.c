/*
 * lora.c — LoRA adapters on the hybrid family (include/longstraw/lora.h;
 * tests/reference/README.md "LoRA"). Each adapted HF weight W [out, in] gets a row map:
 * a short list of segments (HF rows hf0..hf0+n ↔ internal rows row0..row0+n of one
 * internal tensor whose rows are `in` floats long). The segments are exactly the
 * HF → internal mapping of hybrid_load.c (and the inverse of ls_hybrid_export):
 *   Qwen3-Next in_proj_qkvz, per key head g: [q_g d_k | k_g d_k | v r·d_v | z r·d_v]
 *   Qwen3-Next in_proj_ba,   per key head g: [b r | a r]
 *   q_proj, per head h: [q_h hd | gate_h hd] → attn_in rows q(all) | gate(all) | k | v
 *   split projections, gate/up halves of mlp_gu / exp_gu[e] / sh_gu: one range each.
 * So merge and backward are a few sgemms per module on contiguous row blocks, with no
 * gather buffer: delta rows land straight in the internal tensor (ld = in).
 */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/lora.h"
#include "longstraw/safetensors.h"

#define PEFT_PREFIX "base_model.model."
#define SUFFIX_A ".lora_A.weight"
#define SUFFIX_B ".lora_B.weight"
#define NAME_CAP 512

/* How HF rows of a target map onto its internal tensor (LS_LORA_MAP_RANGE = 0: one range). */
enum { MAP_RANGE = LS_LORA_MAP_RANGE, MAP_QKVZ, MAP_BA, MAP_QPROJ };

typedef ls_lora_target lora_target;

typedef struct {
    int64_t hf0, row0, n; /* HF rows [hf0, hf0+n) ↔ internal rows [row0, row0+n) */
} lora_seg;

typedef struct {
    const char *name;   /* HF weight name without ".weight" */
    const char *name_a; /* PEFT tensor names */
    const char *name_b;
    int layer;
    size_t field;
    int64_t out, in, r;
    float scale; /* alpha / r */
    lora_seg *seg;
    int64_t nseg;
    float *A, *B;   /* (r, in), (out, r) — fixed arena */
    float *gA, *gB; /* gradients — grad arena */
} lora_mod;

struct ls_lora {
    const ls_backend *be; /* the base model's: where the side branches run */
    lora_mod *mod; /* (n) */
    int64_t n;
    double alpha;
    /* modules by layer (side branches look them up per projection): idx[start[l+1] ..
     * start[l+2]) are the modules of layer l, idx[start[0] .. start[1]) the LM head's */
    int64_t *idx, *start;
    int n_layers;
};

/* ---- the adaptable weights of a model ----------------------------------------------- */
typedef struct {
    lora_target *t; /* NULL: count only */
    int64_t n;
    int too_long;
} target_list;

static void add_target(target_list *tl, int layer, size_t field, int map, int64_t row0, int64_t out,
                       int64_t in, const char *fmt, ...) __attribute__((format(printf, 8, 9)));

static void add_target(target_list *tl, int layer, size_t field, int map, int64_t row0, int64_t out,
                       int64_t in, const char *fmt, ...) {
    if (tl->t) {
        lora_target *t = &tl->t[tl->n];
        va_list ap;
        va_start(ap, fmt);
        int len = vsnprintf(t->name, sizeof t->name, fmt, ap);
        va_end(ap);
        if (len < 0 || (size_t)len >= sizeof t->name) tl->too_long = 1;
        t->layer = layer;
        t->field = field;
        t->map = map;
        t->row0 = row0;
        t->out = out;
        t->in = in;
    }
    tl->n++;
}

#define LF(f) offsetof(ls_hybrid_layer, f)

/* Every 2-D `.weight` tensor of the checkpoint's layout except embed_tokens, in export
 * order (hybrid_params.c). Fused (3-D) experts are not listed. */
static void list_targets(const ls_hybrid_model *m, target_list *tl) {
    const ls_config *c = &m->cfg;
    const ls_hybrid_config *hc = ls_hybrid_cfg(c);
    int64_t D = c->hidden, hd = c->head_dim, vd = ls_cfg_value_dim(c), cd = ls_cfg_conv_dim(c);
    int64_t qd = (int64_t)c->n_heads * hd, kvd = (int64_t)c->n_kv * hd;
    int64_t Hk = hc->H_k, Hv = hc->H_v, dk = hc->d_k, dv = hc->d_v, r = Hk > 0 ? Hv / Hk : 0;
    const char *p = m->prefix;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->kind[l] == LS_LAYER_GDN) {
            if (m->fused_gdn) {
                add_target(tl, l, LF(gdn_in), MAP_QKVZ, 0, Hk * (2 * dk + 2 * r * dv), D,
                           "%slayers.%d.linear_attn.in_proj_qkvz", p, l);
                add_target(tl, l, LF(gdn_in), MAP_BA, 0, Hk * 2 * r, D, "%slayers.%d.linear_attn.in_proj_ba", p, l);
            } else {
                add_target(tl, l, LF(gdn_in), MAP_RANGE, 0, cd, D, "%slayers.%d.linear_attn.in_proj_qkv", p, l);
                add_target(tl, l, LF(gdn_in), MAP_RANGE, cd, vd, D, "%slayers.%d.linear_attn.in_proj_z", p, l);
                add_target(tl, l, LF(gdn_in), MAP_RANGE, cd + vd, Hv, D, "%slayers.%d.linear_attn.in_proj_b", p, l);
                add_target(tl, l, LF(gdn_in), MAP_RANGE, cd + vd + Hv, Hv, D, "%slayers.%d.linear_attn.in_proj_a",
                           p, l);
            }
            add_target(tl, l, LF(gdn_out), MAP_RANGE, 0, D, vd, "%slayers.%d.linear_attn.out_proj", p, l);
        } else {
            add_target(tl, l, LF(attn_in), MAP_QPROJ, 0, 2 * qd, D, "%slayers.%d.self_attn.q_proj", p, l);
            add_target(tl, l, LF(attn_in), MAP_RANGE, 2 * qd, kvd, D, "%slayers.%d.self_attn.k_proj", p, l);
            add_target(tl, l, LF(attn_in), MAP_RANGE, 2 * qd + kvd, kvd, D, "%slayers.%d.self_attn.v_proj", p, l);
            add_target(tl, l, LF(attn_out), MAP_RANGE, 0, D, qd, "%slayers.%d.self_attn.o_proj", p, l);
        }
        if (!c->moe[l]) {
            int64_t Id = c->intermediate; /* "I" is complex.h's, via cblas.h */
            add_target(tl, l, LF(mlp_gu), MAP_RANGE, 0, Id, D, "%slayers.%d.mlp.gate_proj", p, l);
            add_target(tl, l, LF(mlp_gu), MAP_RANGE, Id, Id, D, "%slayers.%d.mlp.up_proj", p, l);
            add_target(tl, l, LF(mlp_down), MAP_RANGE, 0, D, Id, "%slayers.%d.mlp.down_proj", p, l);
            continue;
        }
        int64_t E = c->n_experts, Im = c->moe_inter, Is = c->shared_inter;
        add_target(tl, l, LF(router), MAP_RANGE, 0, E, D, "%slayers.%d.mlp.gate", p, l);
        if (!m->fused_experts) {
            for (int64_t e = 0; e < E; e++) {
                add_target(tl, l, LF(exp_gu), MAP_RANGE, e * 2 * Im, Im, D, "%slayers.%d.mlp.experts.%lld.gate_proj",
                           p, l, (long long)e);
                add_target(tl, l, LF(exp_gu), MAP_RANGE, e * 2 * Im + Im, Im, D,
                           "%slayers.%d.mlp.experts.%lld.up_proj", p, l, (long long)e);
                add_target(tl, l, LF(exp_down), MAP_RANGE, e * D, D, Im, "%slayers.%d.mlp.experts.%lld.down_proj",
                           p, l, (long long)e);
            }
        }
        if (Is > 0) {
            add_target(tl, l, LF(sh_gu), MAP_RANGE, 0, Is, D, "%slayers.%d.mlp.shared_expert.gate_proj", p, l);
            add_target(tl, l, LF(sh_gu), MAP_RANGE, Is, Is, D, "%slayers.%d.mlp.shared_expert.up_proj", p, l);
            add_target(tl, l, LF(sh_down), MAP_RANGE, 0, D, Is, "%slayers.%d.mlp.shared_expert.down_proj", p, l);
            add_target(tl, l, LF(sh_gate), MAP_RANGE, 0, 1, D, "%slayers.%d.mlp.shared_expert_gate", p, l);
        }
    }
    if (!c->tie_embeddings) add_target(tl, -1, 0, MAP_RANGE, 0, c->vocab, D, "lm_head");
}

/* The list, malloc'd (caller frees). */
static ls_status make_targets(const ls_hybrid_model *m, lora_target **out, int64_t *n) {
    target_list tl = {NULL, 0, 0};
    list_targets(m, &tl);
    tl.t = malloc((size_t)(tl.n > 0 ? tl.n : 1) * sizeof(lora_target));
    if (!tl.t) return ls_err(LS_ERR_NOMEM, "cannot list %lld LoRA targets", (long long)tl.n);
    tl.n = 0;
    list_targets(m, &tl);
    if (tl.too_long) {
        free(tl.t);
        return ls_err(LS_ERR_ARG, "LoRA: a weight name of this model exceeds %zu characters",
                      sizeof tl.t->name - 1);
    }
    for (int64_t i = 0; i < tl.n; i++) tl.t[i].order = i;
    *out = tl.t;
    *n = tl.n;
    return LS_OK;
}

static int cmp_target(const void *a, const void *b) {
    return strcmp(((const lora_target *)a)->name, ((const lora_target *)b)->name);
}

/* Last module component: "model.layers.3.mlp.experts.1.gate_proj" → "gate_proj". */
static const char *leaf(const char *name) {
    const char *d = strrchr(name, '.');
    return d ? d + 1 : name;
}

/* Segments of HF rows → internal rows (spec §2.1, §4.1; hybrid_load.c), adjacent ones
 * merged. s NULL: count only (an upper bound). */
static int64_t make_segs(const ls_config *c, const lora_target *t, lora_seg *s) {
    const ls_hybrid_config *hc = ls_hybrid_cfg(c);
    int64_t hd = c->head_dim, kd = ls_cfg_key_dim(c), vd = ls_cfg_value_dim(c), cd = ls_cfg_conv_dim(c);
    int64_t qd = (int64_t)c->n_heads * hd, Hk = hc->H_k, Hv = hc->H_v, dk = hc->d_k, dv = hc->d_v;
    int64_t r = Hk > 0 ? Hv / Hk : 0, n = 0;
#define SEG(a, b, len)                                                                              \
    do {                                                                                            \
        if (s && n > 0 && s[n - 1].hf0 + s[n - 1].n == (a) && s[n - 1].row0 + s[n - 1].n == (b)) { \
            s[n - 1].n += (len);                                                                    \
        } else {                                                                                    \
            if (s) s[n] = (lora_seg){(a), (b), (len)};                                              \
            n++;                                                                                    \
        }                                                                                           \
    } while (0)
    switch (t->map) {
    case MAP_QKVZ: { /* per key head g: [q_g | k_g | v_g | z_g] */
        int64_t grp = 2 * dk + 2 * r * dv;
        for (int64_t g = 0; g < Hk; g++) {
            SEG(g * grp, g * dk, dk);
            SEG(g * grp + dk, kd + g * dk, dk);
            SEG(g * grp + 2 * dk, 2 * kd + g * r * dv, r * dv);
            SEG(g * grp + 2 * dk + r * dv, cd + g * r * dv, r * dv);
        }
        break;
    }
    case MAP_BA: /* per key head g: [b (r heads) | a (r heads)] */
        for (int64_t g = 0; g < Hk; g++) {
            SEG(g * 2 * r, cd + vd + g * r, r);
            SEG(g * 2 * r + r, cd + vd + Hv + g * r, r);
        }
        break;
    case MAP_QPROJ: /* per head h: [q_h | gate_h] */
        for (int64_t h = 0; h < c->n_heads; h++) {
            SEG(2 * h * hd, h * hd, hd);
            SEG(2 * h * hd + hd, qd + h * hd, hd);
        }
        break;
    default:
        SEG(0, t->row0, t->out);
        break;
    }
#undef SEG
    return n;
}

/* ---- modules ------------------------------------------------------------------------ */
static float *alloc_f(ls_arena *a, int64_t n1, int64_t n2) {
    size_t n;
    if (n1 < 0 || n2 < 0 || ls_mul_size((size_t)n1, (size_t)n2, &n)) {
        ls_err(LS_ERR_NOMEM, "LoRA: size %lld x %lld overflows", (long long)n1, (long long)n2);
        return NULL;
    }
    return ls_arena_calloc(a, n > 0 ? n : 1, sizeof(float));
}

static char *arena_str(ls_arena *a, const char *fmt1, const char *s, const char *fmt2) {
    size_t len = strlen(fmt1) + strlen(s) + strlen(fmt2) + 1;
    char *p = ls_arena_host_alloc(a, len);
    if (p) snprintf(p, len, "%s%s%s", fmt1, s, fmt2);
    return p;
}

/* Fill md for target t with rank r: names, row map, zeroed A, B, moments (fixed) and
 * gradients (grad). */
static ls_status init_module(lora_mod *md, const ls_config *cfg, const lora_target *t, int64_t r,
                             double alpha, ls_arena *fixed, ls_arena *grad) {
    if (r < 1 || r > INT_MAX || t->out > INT_MAX || t->in > INT_MAX)
        return ls_err(LS_ERR_ARG, "LoRA on %s.weight: rank %lld or shape [%lld, %lld] out of range", t->name,
                      (long long)r, (long long)t->out, (long long)t->in);
    memset(md, 0, sizeof *md);
    md->name = arena_str(fixed, "", t->name, "");
    md->name_a = arena_str(fixed, PEFT_PREFIX, t->name, SUFFIX_A);
    md->name_b = arena_str(fixed, PEFT_PREFIX, t->name, SUFFIX_B);
    md->layer = t->layer;
    md->field = t->field;
    md->out = t->out;
    md->in = t->in;
    md->r = r;
    md->scale = (float)(alpha / (double)r);
    int64_t ns = make_segs(cfg, t, NULL);
    md->seg = ls_arena_host_calloc(fixed, (size_t)(ns > 0 ? ns : 1), sizeof(lora_seg));
    if (!md->name || !md->name_a || !md->name_b || !md->seg) return LS_ERR_NOMEM;
    md->nseg = make_segs(cfg, t, md->seg);
    int64_t covered = 0;
    for (int64_t i = 0; i < md->nseg; i++) covered += md->seg[i].n;
    LS_ASSERT(covered == t->out, "%s: row map covers %lld of %lld rows", t->name, (long long)covered,
              (long long)t->out);
    md->A = alloc_f(fixed, r, t->in);
    md->B = alloc_f(fixed, t->out, r);
    md->gA = alloc_f(grad, r, t->in);
    md->gB = alloc_f(grad, t->out, r);
    if (!md->A || !md->B || !md->gA || !md->gB)
        return ls_err(LS_ERR_NOMEM, "LoRA on %s.weight: cannot allocate rank-%lld adapter", t->name, (long long)r);
    return LS_OK;
}

/* The internal tensor a module adapts, in the model set `v` (rows of md->in floats). */
static float *mod_tensor(const ls_lora_view *v, const lora_mod *md) {
    float *p;
    if (md->layer < 0) {
        p = v->lm_head;
    } else {
        LS_ASSERT(md->layer < v->n_layers && v->layers, "layer %d", md->layer);
        p = *(float *const *)(v->layers + (size_t)md->layer * v->layer_size + md->field);
    }
    LS_ASSERT(p != NULL, "LoRA: %s has no internal tensor in this model set", md->name);
    return p;
}

/* The hybrid model as a view. */
static ls_lora_view hybrid_view(const ls_hybrid_model *m) {
    ls_lora_view v = {(char *)m->layers, sizeof(ls_hybrid_layer), m->lm_head, (int)m->cfg.n_layers};
    return v;
}

static ls_status new_lora(ls_lora **out, const ls_backend *be, int64_t n, double alpha, ls_arena *fixed) {
    ls_lora *L = ls_arena_host_calloc(fixed, 1, sizeof(ls_lora));
    if (!L) return LS_ERR_NOMEM;
    L->be = be;
    L->mod = ls_arena_host_calloc(fixed, (size_t)(n > 0 ? n : 1), sizeof(lora_mod));
    if (!L->mod) return LS_ERR_NOMEM;
    L->n = n;
    L->alpha = alpha;
    *out = L;
    return LS_OK;
}

/* ---- load ----------------------------------------------------------------------------- */
/* n floats of tensor t into dst, the backend's memory (through a host view). */
static ls_status read_dev(const ls_backend *be, const ls_st_tensor *t, float *dst, int64_t n) {
    float *h = ls_host_view(be, NULL, dst, (size_t)n * sizeof(float), 0);
    if (!h) return ls_err(LS_ERR_NOMEM, "cannot allocate %lld floats for %s", (long long)n, t->name);
    ls_status s = ls_st_read_f32(t, h, n, t->name);
    ls_host_view_done(be, NULL, dst, h, (size_t)n * sizeof(float), s == LS_OK);
    return s;
}
static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* Module name of an adapter tensor ("<HF name without .weight>"), or an error naming it. */
static ls_status module_of(const char *path, const char *tname, char *mod, size_t cap, int *is_a) {
    size_t pl = strlen(PEFT_PREFIX), len = strlen(tname);
    if (strncmp(tname, PEFT_PREFIX, pl) != 0)
        return ls_err(LS_ERR_FORMAT, "%s: adapter tensor \"%s\" lacks the PEFT prefix \"%s\"", path, tname,
                      PEFT_PREFIX);
    *is_a = ends_with(tname, SUFFIX_A);
    if (!*is_a && !ends_with(tname, SUFFIX_B))
        return ls_err(LS_ERR_FORMAT, "%s: unexpected adapter tensor \"%s\" (expected <module>%s or <module>%s)", path,
                      tname, SUFFIX_A, SUFFIX_B);
    size_t ml = len - pl - strlen(SUFFIX_A); /* both suffixes have the same length */
    if (ml == 0 || ml >= cap) return ls_err(LS_ERR_FORMAT, "%s: adapter tensor \"%s\": bad module name", path, tname);
    memcpy(mod, tname + pl, ml);
    mod[ml] = 0;
    return LS_OK;
}

typedef struct {
    int64_t order;
    lora_mod mod;
} ordered_mod;

static int cmp_ordered(const void *a, const void *b) {
    int64_t x = ((const ordered_mod *)a)->order, y = ((const ordered_mod *)b)->order;
    return (x > y) - (x < y);
}

static ls_status load_pass2(ls_lora *L, const ls_config *cfg, const char *layout, const ls_st_file *f,
                            const char *path, double alpha, ls_arena *fixed, ls_arena *grad, const lora_target *tg,
                            int64_t ntg, ordered_mod *om);

static ls_status load_modules(ls_lora **out, const ls_config *cfg, const ls_backend *be, const char *layout, const ls_st_file *f,
                              const char *path, double alpha, ls_arena *fixed, ls_arena *grad, const lora_target *tg,
                              int64_t ntg) {
    char mod[NAME_CAP], other[NAME_CAP + 32];
    int64_t n = 0;
    /* pass 1: every tensor is a lora_A / lora_B with its partner present */
    for (int64_t i = 0; i < ls_st_count(f); i++) {
        const ls_st_tensor *t = ls_st_at(f, i);
        int is_a;
        LS_TRY(module_of(path, t->name, mod, sizeof mod, &is_a));
        snprintf(other, sizeof other, "%s%s%s", PEFT_PREFIX, mod, is_a ? SUFFIX_B : SUFFIX_A);
        if (!ls_st_find(f, other))
            return ls_err(LS_ERR_FORMAT, "%s: adapter tensor \"%s\" has no partner \"%s\"", path, t->name, other);
        n += is_a;
    }
    if (n == 0) return ls_err(LS_ERR_FORMAT, "%s: no LoRA adapter tensors (*%s) in the file", path, SUFFIX_A);
    ls_lora *L;
    LS_TRY(new_lora(&L, be, n, alpha, fixed));
    /* pass 2: the modules, then put in the model's layer order (as ls_lora_new keeps
     * them), so a run resumed from saved adapters sees its tensors in the same order */
    ordered_mod *om = malloc((size_t)n * sizeof *om);
    if (!om) return ls_err(LS_ERR_NOMEM, "%s: out of memory for %lld modules", path, (long long)n);
    ls_status s = load_pass2(L, cfg, layout, f, path, alpha, fixed, grad, tg, ntg, om);
    if (s == LS_OK) {
        qsort(om, (size_t)n, sizeof *om, cmp_ordered);
        for (int64_t i = 0; i < n; i++) L->mod[i] = om[i].mod;
        *out = L;
    }
    free(om);
    return s;
}

static ls_status load_pass2(ls_lora *L, const ls_config *cfg, const char *layout, const ls_st_file *f,
                            const char *path, double alpha, ls_arena *fixed, ls_arena *grad, const lora_target *tg,
                            int64_t ntg, ordered_mod *om) {
    char mod[NAME_CAP], other[NAME_CAP + 32];
    int64_t k = 0, n = L->n;
    for (int64_t i = 0; i < ls_st_count(f); i++) {
        const ls_st_tensor *ta = ls_st_at(f, i);
        int is_a;
        LS_TRY(module_of(path, ta->name, mod, sizeof mod, &is_a));
        if (!is_a) continue;
        snprintf(other, sizeof other, "%s%s%s", PEFT_PREFIX, mod, SUFFIX_B);
        const ls_st_tensor *tb = ls_st_find(f, other);
        lora_target key;
        if (strlen(mod) >= sizeof key.name)
            return ls_err(LS_ERR_FORMAT, "%s: adapter tensor \"%s\": module name too long", path, ta->name);
        memcpy(key.name, mod, strlen(mod) + 1);
        const lora_target *t = bsearch(&key, tg, (size_t)ntg, sizeof *tg, cmp_target);
        if (!t) {
            if (ends_with(mod, "embed_tokens"))
                return ls_err(LS_ERR_UNSUPPORTED, "%s: adapter tensor \"%s\": LoRA on embed_tokens is not supported",
                              path, ta->name);
            return ls_err(LS_ERR_FORMAT,
                          "%s: adapter tensor \"%s\" targets \"%s.weight\", which is not a 2-D weight of this model "
                          "(%s)", path, ta->name, mod, layout);
        }
        if (ta->ndim != 2 || tb->ndim != 2)
            return ls_err(LS_ERR_FORMAT, "%s: adapter tensor \"%s\" is %d-D, expected 2-D", path,
                          ta->ndim != 2 ? ta->name : tb->name, ta->ndim != 2 ? ta->ndim : tb->ndim);
        int64_t r = ta->shape[0];
        if (r < 1 || ta->shape[1] != t->in)
            return ls_err(LS_ERR_FORMAT, "%s: adapter tensor \"%s\" has shape [%lld, %lld], expected [r >= 1, %lld]",
                          path, ta->name, (long long)ta->shape[0], (long long)ta->shape[1], (long long)t->in);
        if (tb->shape[0] != t->out || tb->shape[1] != r)
            return ls_err(LS_ERR_FORMAT, "%s: adapter tensor \"%s\" has shape [%lld, %lld], expected [%lld, %lld]",
                          path, tb->name, (long long)tb->shape[0], (long long)tb->shape[1], (long long)t->out,
                          (long long)r);
        lora_mod *md = &om[k].mod;
        om[k++].order = t->order;
        LS_TRY(init_module(md, cfg, t, r, alpha, fixed, grad));
        LS_TRY(read_dev(L->be, ta, md->A, r * t->in));
        LS_TRY(read_dev(L->be, tb, md->B, t->out * r));
    }
    LS_ASSERT(k == n);
    return LS_OK;
}

/* The per-layer module index (fixed arena). */
static ls_status build_index(ls_lora *L, int n_layers, ls_arena *fixed) {
    L->n_layers = n_layers;
    L->start = ls_arena_host_calloc(fixed, (size_t)n_layers + 2, sizeof(int64_t));
    L->idx = ls_arena_host_alloc(fixed, (size_t)(L->n > 0 ? L->n : 1) * sizeof(int64_t));
    if (!L->start || !L->idx) return ls_err(LS_ERR_NOMEM, "LoRA: module index");
    for (int64_t i = 0; i < L->n; i++) L->start[L->mod[i].layer + 2]++; /* counts, layer −1 → slot 1 */
    for (int k = 1; k < n_layers + 2; k++) L->start[k] += L->start[k - 1];
    int64_t *fill = calloc((size_t)n_layers + 1, sizeof(int64_t));
    if (!fill) return ls_err(LS_ERR_NOMEM, "LoRA: module index");
    for (int64_t i = 0; i < L->n; i++) {
        int k = L->mod[i].layer + 1;
        L->idx[L->start[k] + fill[k]++] = i;
    }
    free(fill);
    return LS_OK;
}

/* A target list in layer order, numbered (order) and sorted by name for bsearch; the
 * caller's list is not changed. */
static ls_status sorted_targets(const lora_target *src, int64_t n, lora_target **out) {
    lora_target *tg = malloc((size_t)(n > 0 ? n : 1) * sizeof *tg);
    if (!tg) return ls_err(LS_ERR_NOMEM, "cannot list %lld LoRA targets", (long long)n);
    memcpy(tg, src, (size_t)n * sizeof *tg);
    for (int64_t i = 0; i < n; i++) tg[i].order = i;
    qsort(tg, (size_t)n, sizeof *tg, cmp_target);
    *out = tg;
    return LS_OK;
}

ls_status ls_lora_load_targets(ls_lora **out, const ls_lora_target *targets, int64_t ntargets, const ls_config *cfg,
                               const ls_backend *be, const char *layout, const char *path, double alpha, ls_arena *fixed, ls_arena *grad) {
    *out = NULL;
    if (!isfinite(alpha)) return ls_err(LS_ERR_ARG, "LoRA alpha %g is not finite", alpha);
    lora_target *tg = NULL;
    LS_TRY(sorted_targets(targets, ntargets, &tg));
    ls_st_file f;
    ls_status s = ls_st_open(&f, path);
    if (s != LS_OK) {
        free(tg);
        return s;
    }
    ls_arena_mark mf = ls_arena_get_mark(fixed), mg = ls_arena_get_mark(grad);
    s = load_modules(out, cfg, be, layout, &f, path, alpha, fixed, grad, tg, ntargets);
    if (s == LS_OK) s = build_index(*out, (int)cfg->n_layers, fixed);
    if (s != LS_OK) { /* give back whatever the failed load took */
        *out = NULL;
        ls_arena_release(fixed, mf);
        ls_arena_release(grad, mg);
    }
    ls_st_close(&f);
    free(tg);
    return s;
}

static void hybrid_layout(const ls_hybrid_model *m, char *buf, size_t cap) {
    snprintf(buf, cap, "prefix \"%s\", %s GDN projections, %s experts", m->prefix, m->fused_gdn ? "fused" : "split",
             m->fused_experts ? "fused 3-D" : "per-expert");
}

ls_status ls_lora_load(ls_lora **out, const ls_hybrid_model *m, const char *path, double alpha,
                       ls_arena *fixed, ls_arena *grad) {
    lora_target *tg;
    int64_t ntg;
    char layout[256];
    LS_TRY(make_targets(m, &tg, &ntg));
    hybrid_layout(m, layout, sizeof layout);
    ls_status s = ls_lora_load_targets(out, tg, ntg, &m->cfg, m->be, layout, path, alpha, fixed, grad);
    free(tg);
    return s;
}

/* ---- new ------------------------------------------------------------------------------ */
/* Split the comma list into malloc'd `buf` (names NUL-separated, trimmed); names[] into it. */
static ls_status parse_targets(const char *targets, char **buf, char ***names, int64_t *n) {
    *buf = NULL;
    *names = NULL;
    *n = 0;
    if (!targets) return ls_err(LS_ERR_ARG, "LoRA targets: none given");
    size_t len = strlen(targets);
    int64_t cap = 1;
    for (size_t i = 0; i < len; i++) cap += targets[i] == ',';
    char *b = malloc(len + 1);
    char **v = malloc((size_t)cap * sizeof(char *));
    if (!b || !v) {
        free(b);
        free(v);
        return ls_err(LS_ERR_NOMEM, "LoRA targets: out of memory");
    }
    memcpy(b, targets, len + 1);
    int64_t k = 0;
    for (char *p = b;;) {
        char *e = strchr(p, ',');
        if (e) *e = 0;
        while (*p == ' ' || *p == '\t') p++;
        size_t l = strlen(p);
        while (l > 0 && (p[l - 1] == ' ' || p[l - 1] == '\t')) p[--l] = 0;
        if (l == 0) {
            free(b);
            free(v);
            return ls_err(LS_ERR_ARG, "LoRA targets \"%s\": empty name in the comma list", targets);
        }
        v[k++] = p;
        if (!e) break;
        p = e + 1;
    }
    *buf = b;
    *names = v;
    *n = k;
    return LS_OK;
}

/* Is `word` one of the ", "-separated names in `list`? */
static int in_list(const char *list, const char *word) {
    size_t wl = strlen(word);
    for (const char *p = list; *p;) {
        const char *e = strstr(p, ", ");
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == wl && strncmp(p, word, wl) == 0) return 1;
        if (!e) break;
        p = e + 2;
    }
    return 0;
}

/* "q_proj, k_proj, ..." — the distinct leaf names of tg (for messages). */
static void leaf_names(const lora_target *tg, int64_t ntg, char *out, size_t cap) {
    size_t used = 0;
    out[0] = 0;
    for (int64_t i = 0; i < ntg; i++) {
        const char *lf = leaf(tg[i].name);
        if (in_list(out, lf)) continue;
        int w = snprintf(out + used, cap - used, "%s%s", used ? ", " : "", lf);
        if (w < 0 || (size_t)w >= cap - used) {
            out[used] = 0;
            break;
        }
        used += (size_t)w;
    }
}

static ls_status new_modules(ls_lora **out, const ls_config *cfg, const ls_backend *be, const char *targets, int rank, double alpha,
                             uint64_t seed, ls_arena *fixed, ls_arena *grad, const lora_target *tg, int64_t ntg,
                             char **names, int64_t nn) {
    int64_t n = 0;
    for (int64_t j = 0; j < nn; j++) {
        if (strcmp(names[j], "embed_tokens") == 0)
            return ls_err(LS_ERR_UNSUPPORTED, "LoRA target \"embed_tokens\": LoRA on embed_tokens is not supported");
        int64_t hits = 0;
        for (int64_t i = 0; i < ntg; i++) hits += strcmp(leaf(tg[i].name), names[j]) == 0;
        if (hits == 0) {
            char avail[1024];
            leaf_names(tg, ntg, avail, sizeof avail);
            return ls_err(LS_ERR_ARG, "LoRA target \"%s\" (from \"%s\") matches no 2-D weight of this model; "
                          "available: %s", names[j], targets, avail);
        }
    }
    for (int64_t i = 0; i < ntg; i++)
        for (int64_t j = 0; j < nn; j++)
            if (strcmp(leaf(tg[i].name), names[j]) == 0) {
                n++;
                break;
            }
    ls_lora *L;
    LS_TRY(new_lora(&L, be, n, alpha, fixed));
    ls_rng rng;
    ls_rng_seed(&rng, seed);
    int64_t k = 0;
    for (int64_t i = 0; i < ntg; i++) {
        int hit = 0;
        for (int64_t j = 0; j < nn && !hit; j++) hit = strcmp(leaf(tg[i].name), names[j]) == 0;
        if (!hit) continue;
        lora_mod *md = &L->mod[k++];
        LS_TRY(init_module(md, cfg, &tg[i], rank, alpha, fixed, grad));
        /* PEFT: kaiming_uniform_(A, a=sqrt(5)): gain sqrt(2/(1+5)), bound gain·sqrt(3/in) = 1/sqrt(in) */
        double bound = 1.0 / sqrt((double)md->in);
        size_t ab = (size_t)(md->r * md->in) * sizeof(float);
        float *a = ls_host_view(be, NULL, md->A, ab, 0); /* drawn on the host, then placed */
        if (!a) return ls_err(LS_ERR_NOMEM, "LoRA on %s.weight: cannot draw the adapter", md->name);
        for (int64_t e = 0; e < md->r * md->in; e++) a[e] = (float)((2.0 * ls_rng_uniform(&rng) - 1.0) * bound);
        ls_host_view_done(be, NULL, md->A, a, ab, 1);
        /* B stays 0 (zeroed at allocation): the merged model starts as the base */
    }
    LS_ASSERT(k == n);
    *out = L;
    return LS_OK;
}

ls_status ls_lora_new_targets(ls_lora **out, const ls_lora_target *tg, int64_t ntg, const ls_config *cfg,
                              const ls_backend *be, const char *targets, int rank, double alpha, uint64_t seed, ls_arena *fixed,
                              ls_arena *grad) {
    *out = NULL;
    if (rank < 1) return ls_err(LS_ERR_ARG, "LoRA rank %d: expected >= 1", rank);
    if (!isfinite(alpha)) return ls_err(LS_ERR_ARG, "LoRA alpha %g is not finite", alpha);
    char *buf, **names;
    int64_t nn;
    LS_TRY(parse_targets(targets, &buf, &names, &nn));
    ls_arena_mark mf = ls_arena_get_mark(fixed), mg = ls_arena_get_mark(grad);
    ls_status s = new_modules(out, cfg, be, targets, rank, alpha, seed, fixed, grad, tg, ntg, names, nn);
    if (s == LS_OK) s = build_index(*out, (int)cfg->n_layers, fixed);
    if (s != LS_OK) {
        *out = NULL;
        ls_arena_release(fixed, mf);
        ls_arena_release(grad, mg);
    }
    free(buf);
    free(names);
    return s;
}

ls_status ls_lora_new(ls_lora **out, const ls_hybrid_model *m, const char *targets, int rank,
                      double alpha, uint64_t seed, ls_arena *fixed, ls_arena *grad) {
    lora_target *tg;
    int64_t ntg;
    *out = NULL;
    LS_TRY(make_targets(m, &tg, &ntg));
    ls_status s = ls_lora_new_targets(out, tg, ntg, &m->cfg, m->be, targets, rank, alpha, seed, fixed, grad);
    free(tg);
    return s;
}

/* ---- merge / backward ----------------------------------------------------------------- */
/* dst = base, tensor by tensor (skipped when they are the same buffers). */
static void copy_model(const ls_hybrid_model *base, ls_hybrid_model *dst) {
    ls_param *pb = NULL, *pd = NULL;
    int64_t nb = 0, nd = 0;
    ls_status s1 = ls_hybrid_params(base, &pb, &nb), s2 = ls_hybrid_params(dst, &pd, &nd);
    LS_ASSERT(s1 == LS_OK && s2 == LS_OK, "listing parameters: %s", ls_err_msg());
    LS_ASSERT(nb == nd, "LoRA merge: base has %lld tensors, dst %lld", (long long)nb, (long long)nd);
    for (int64_t i = 0; i < nb; i++) {
        LS_ASSERT(pb[i].n == pd[i].n && pb[i].p && pd[i].p, "LoRA merge: %s differs in shape", pb[i].what);
        if (pb[i].p != pd[i].p) ls_op_copy(dst->be, pd[i].p, pb[i].p, pb[i].n);
    }
    free(pb);
    free(pd);
}

void ls_lora_merge_view(const ls_lora *L, const ls_lora_view *dst) {
    for (int64_t i = 0; i < L->n; i++) {
        const lora_mod *md = &L->mod[i];
        float *W = mod_tensor(dst, md); /* rows of md->in */
        int in = (int)md->in, r = (int)md->r;
        for (int64_t s = 0; s < md->nseg; s++) {
            const lora_seg *sg = &md->seg[s];
            /* W[row0 .. row0+n) += scale · B[hf0 .. hf0+n) · A    (n, in) */
            ls_op_gemm(L->be, 0, 0, (int)sg->n, in, r, md->scale, md->B + sg->hf0 * r,
                        r, md->A, in, 1.0f, W + sg->row0 * md->in, in);
        }
    }
}

void ls_lora_merge(const ls_lora *L, const ls_hybrid_model *base, ls_hybrid_model *dst) {
    LS_ASSERT(L && base && dst);
    if (dst != base) copy_model(base, dst);
    ls_lora_view v = hybrid_view(dst);
    ls_lora_merge_view(L, &v);
}

/* W_eff[rows] = W[rows] + s·B[rows]·A, so with G = ∂L/∂W_eff gathered in HF order:
 *   dA += s·Bᵀ·G  (r, in)   and   dB += s·G·Aᵀ  (out, r). Per segment the sums split. */
void ls_lora_backward_view(ls_lora *L, const ls_lora_view *dW) {
    for (int64_t i = 0; i < L->n; i++) {
        lora_mod *md = &L->mod[i];
        const float *G = mod_tensor(dW, md);
        int in = (int)md->in, r = (int)md->r;
        for (int64_t s = 0; s < md->nseg; s++) {
            const lora_seg *sg = &md->seg[s];
            const float *Gs = G + sg->row0 * md->in; /* (n, in) */
            const float *Bs = md->B + sg->hf0 * r;   /* (n, r) */
            ls_op_gemm(L->be, 1, 0, r, in, (int)sg->n, md->scale, Bs, r, Gs, in, 1.0f,
                        md->gA, in);
            ls_op_gemm(L->be, 0, 1, (int)sg->n, r, in, md->scale, Gs, in, md->A, in,
                        1.0f, md->gB + sg->hf0 * r, r);
        }
    }
}

void ls_lora_backward(ls_lora *L, const ls_hybrid_model *dW) {
    LS_ASSERT(L && dW);
    ls_lora_view v = hybrid_view(dW);
    ls_lora_backward_view(L, &v);
}

/* ---- parameters, export ------------------------------------------------------------------- */
ls_status ls_lora_params(const ls_lora *L, ls_param **w, ls_param **g, int64_t *n) {
    LS_ASSERT(L && n);
    int64_t cnt = 2 * L->n;
    ls_param **outs[2] = {w, g};
    ls_param *lists[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        if (!outs[k]) continue;
        lists[k] = malloc((size_t)(cnt > 0 ? cnt : 1) * sizeof(ls_param));
        if (!lists[k]) {
            for (int j = 0; j < k; j++) free(lists[j]);
            return ls_err(LS_ERR_NOMEM, "cannot list %lld LoRA tensors", (long long)cnt);
        }
    }
    for (int64_t i = 0; i < L->n; i++) {
        const lora_mod *md = &L->mod[i];
        float *const pa[2] = {md->A, md->gA}, *const pb[2] = {md->B, md->gB};
        for (int k = 0; k < 2; k++) {
            if (!lists[k]) continue;
            lists[k][2 * i] = (ls_param){pa[k], md->r * md->in, 0, md->name_a};
            lists[k][2 * i + 1] = (ls_param){pb[k], md->out * md->r, 0, md->name_b};
        }
    }
    for (int k = 0; k < 2; k++)
        if (outs[k]) *outs[k] = lists[k];
    *n = cnt;
    return LS_OK;
}

void ls_lora_zero_grad(ls_lora *L) {
    for (int64_t i = 0; i < L->n; i++) {
        lora_mod *md = &L->mod[i];
        ls_op_zero(L->be, md->gA, md->r * md->in);
        ls_op_zero(L->be, md->gB, md->out * md->r);
    }
}

ls_status ls_lora_export(const ls_lora *L, int grads, const ls_st_sink *to, const char *meta_key,
                         const char *meta_value) {
    ls_st_writer w;
    ls_st_writer_init(&w);
    ls_status s = LS_OK;
    ls_arena host; /* host copies of the tensors (the writer reads them at the write) */
    ls_arena_init(&host, "lora-export", 0);
    for (int64_t i = 0; i < L->n && s == LS_OK; i++) {
        const lora_mod *md = &L->mod[i];
        int64_t sa[2] = {md->r, md->in}, sb[2] = {md->out, md->r};
        const float *a = ls_host_view(L->be, &host, grads ? md->gA : md->A, (size_t)(sa[0] * sa[1]) * sizeof(float), 1);
        const float *b = ls_host_view(L->be, &host, grads ? md->gB : md->B, (size_t)(sb[0] * sb[1]) * sizeof(float), 1);
        if (!a || !b) {
            s = LS_ERR_NOMEM;
            break;
        }
        s = ls_st_writer_add_f32(&w, md->name_a, LS_DTYPE_F32, 2, sa, a);
        if (s == LS_OK) s = ls_st_writer_add_f32(&w, md->name_b, LS_DTYPE_F32, 2, sb, b);
    }
    if (s == LS_OK) s = ls_st_writer_add_meta(&w, "format", "pt");
    if (s == LS_OK && meta_key) s = ls_st_writer_add_meta(&w, meta_key, meta_value ? meta_value : "");
    if (s == LS_OK) s = ls_st_emit(&w, to);
    ls_st_writer_free(&w);
    ls_arena_free(&host);
    return s;
}

ls_status ls_lora_write_config(const char *path, const ls_lora *lora) {
    char *buf = NULL;
    size_t blen = 0;
    FILE *f = open_memstream(&buf, &blen);
    if (!f) return ls_err(LS_ERR_NOMEM, "%s: cannot build the adapter config", path);
    fprintf(f, "{\n  \"peft_type\": \"LORA\",\n  \"r\": %lld,\n  \"lora_alpha\": %g,\n  \"target_modules\": [",
            (long long)ls_lora_rank(lora), ls_lora_alpha(lora));
    /* the distinct last name components of the adapted weights, in first-seen order */
    int first = 1;
    for (int64_t i = 0; i < ls_lora_count(lora); i++) {
        const char *nm = ls_lora_module_name(lora, i), *dot = strrchr(nm, '.');
        const char *leaf = dot ? dot + 1 : nm;
        int seen = 0;
        for (int64_t j = 0; j < i && !seen; j++) {
            const char *o = ls_lora_module_name(lora, j), *od = strrchr(o, '.');
            seen = !strcmp(od ? od + 1 : o, leaf);
        }
        if (!seen) fprintf(f, "%s\"%s\"", first ? "" : ", ", leaf);
        first &= seen;
    }
    fprintf(f, "],\n  \"modules\": %lld,\n  \"lora_dropout\": 0.0,\n  \"bias\": \"none\"\n}\n",
            (long long)ls_lora_count(lora));
    return ls_write_memstream(path, f, &buf, &blen);
}

int64_t ls_lora_count(const ls_lora *L) { return L ? L->n : 0; }
double ls_lora_alpha(const ls_lora *L) { return L ? L->alpha : 0.0; }
int64_t ls_lora_rank(const ls_lora *L) { return L && L->n ? L->mod[0].r : 0; }
const char *ls_lora_module_name(const ls_lora *L, int64_t i) { return L && i >= 0 && i < L->n ? L->mod[i].name : NULL; }

int ls_lora_adapts(const ls_lora *L, int layer, size_t field) {
    for (int64_t i = 0; L && i < L->n; i++)
        if (L->mod[i].layer == layer && (layer < 0 || L->mod[i].field == field)) return 1;
    return 0;
}

/* ---- side branches: W·x + s·B·(A·x) without forming W + s·B·A ------------------------- */

int ls_lora_side_ok(const ls_lora *L) { return L && L->start && L->start[1] == L->start[0]; }

/* Internal rows [a, z) of segment sg that fall in [off, off + N); 0 when none. */
static int64_t seg_overlap(const lora_seg *sg, int64_t off, int64_t N, int64_t *a) {
    int64_t lo = sg->row0 > off ? sg->row0 : off, hi = sg->row0 + sg->n < off + N ? sg->row0 + sg->n : off + N;
    *a = lo;
    return hi > lo ? hi - lo : 0;
}

static int mod_hits(const lora_mod *md, size_t field, int64_t off, int64_t N) {
    if (md->field != field) return 0;
    int64_t a;
    for (int64_t s = 0; s < md->nseg; s++)
        if (seg_overlap(&md->seg[s], off, N, &a)) return 1;
    return 0;
}

ls_status ls_lora_linear_fwd(const ls_lora *L, int layer, size_t field, int64_t off, int64_t N, float *out,
                             const float *x, int64_t T, ls_arena *sc) {
    if (!L || T <= 0) return LS_OK;
    for (int64_t j = L->start[layer + 1]; j < L->start[layer + 2]; j++) {
        const lora_mod *md = &L->mod[L->idx[j]];
        if (!mod_hits(md, field, off, N)) continue;
        int in = (int)md->in, r = (int)md->r;
        ls_arena_mark mk = ls_arena_get_mark(sc);
        float *u = ls_arena_alloc(sc, (size_t)T * (size_t)r * sizeof(float)); /* (T, r) = x·Aᵀ */
        if (!u) return ls_err_ctx(LS_ERR_NOMEM, "LoRA side branch of %s", md->name);
        ls_op_gemm(L->be, 0, 1, (int)T, r, in, 1.0f, x, in, md->A, in, 0.0f, u, r);
        for (int64_t s = 0; s < md->nseg; s++) {
            int64_t a, n = seg_overlap(&md->seg[s], off, N, &a);
            if (!n) continue;
            const float *Bs = md->B + (md->seg[s].hf0 + (a - md->seg[s].row0)) * r; /* (n, r) */
            /* out[:, a − off .. +n) += s · u · Bsᵀ */
            ls_op_gemm(L->be, 0, 1, (int)T, (int)n, r, md->scale, u, r, Bs, r, 1.0f,
                        out + (a - off), (int)N);
        }
        ls_arena_release(sc, mk);
    }
    return LS_OK;
}

ls_status ls_lora_linear_bwd(ls_lora *L, int layer, size_t field, int64_t off, int64_t N, float *dx,
                             const float *dy, const float *x, int64_t T, ls_arena *sc) {
    if (!L || T <= 0) return LS_OK;
    for (int64_t j = L->start[layer + 1]; j < L->start[layer + 2]; j++) {
        lora_mod *md = &L->mod[L->idx[j]];
        if (!mod_hits(md, field, off, N)) continue;
        int in = (int)md->in, r = (int)md->r;
        ls_arena_mark mk = ls_arena_get_mark(sc);
        float *u = ls_arena_alloc(sc, (size_t)T * (size_t)r * sizeof(float));  /* (T, r) = x·Aᵀ */
        float *v = ls_arena_calloc(sc, (size_t)T * (size_t)r, sizeof(float)); /* (T, r) = dy·B over the rows */
        if (!u || !v) return ls_err_ctx(LS_ERR_NOMEM, "LoRA side branch of %s", md->name);
        ls_op_gemm(L->be, 0, 1, (int)T, r, in, 1.0f, x, in, md->A, in, 0.0f, u, r);
        for (int64_t s = 0; s < md->nseg; s++) {
            int64_t a, n = seg_overlap(&md->seg[s], off, N, &a);
            if (!n) continue;
            int64_t hf = md->seg[s].hf0 + (a - md->seg[s].row0);
            const float *dys = dy + (a - off); /* (T, n), stride N */
            ls_op_gemm(L->be, 0, 0, (int)T, r, (int)n, 1.0f, dys, (int)N, md->B + hf * r, r,
                        1.0f, v, r);
            /* dB[hf .. hf+n) += s · dysᵀ · u */
            ls_op_gemm(L->be, 1, 0, (int)n, r, (int)T, md->scale, dys, (int)N, u, r, 1.0f,
                        md->gB + hf * r, r);
        }
        /* dA += s · vᵀ · x;  dx += s · v · A */
        ls_op_gemm(L->be, 1, 0, r, in, (int)T, md->scale, v, r, x, in, 1.0f, md->gA, in);
        if (dx) ls_op_gemm(L->be, 0, 0, (int)T, in, r, md->scale, v, r, md->A, in, 1.0f, dx, in);
        ls_arena_release(sc, mk);
    }
    return LS_OK;
}

/* ---- model-shaped sets of the adapted tensors (over ls_hybrid_alloc_subset) ---------- */
static int adapted(const void *ctx, int layer, size_t field) { return ls_lora_adapts(ctx, layer, field); }

ls_status ls_hybrid_alloc_grad_lora(const ls_hybrid_model *src, ls_hybrid_model *dst, ls_arena *arena,
                                    const ls_lora *lora) {
    return ls_hybrid_alloc_subset(src, dst, arena, adapted, lora, NULL);
}

ls_status ls_hybrid_alloc_merged_lora(const ls_hybrid_model *base, ls_hybrid_model *dst, ls_arena *arena,
                                      const ls_lora *lora) {
    return ls_hybrid_alloc_subset(base, dst, arena, adapted, lora, base);
}
