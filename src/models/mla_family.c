/*
 * mla_family.c — the MLA + DSA + MoE family's table (family.h) and its trainable set:
 * a full fine-tune of every tensor the GRPO loss reaches (the indexer and
 * e_score_correction_bias are frozen: the loss gives them no gradient, spec §8.4, §8.6,
 * so they carry no gradient buffer and no optimizer state), or merged LoRA adapters.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/lora.h"
#include "longstraw/mla.h"
#include "longstraw/safetensors.h"

static const ls_mla_model *M(const ls_model *m) { return (const ls_mla_model *)m->impl; }

static int mla_accepts(const ls_config *cfg) { return cfg->family == &ls_mla_family && cfg->n_layers > 0; }

static ls_status mla_load(ls_model *m, const char *dir, const ls_comm *ep, ls_arena *fixed) {
    ls_mla_model *h = ls_arena_host_calloc(fixed, 1, sizeof *h);
    if (!h) return LS_ERR_NOMEM;
    LS_TRY(ls_mla_load(h, dir, ep, fixed));
    *m = ls_mla_handle(h);
    return LS_OK;
}

static const ls_config *mla_config(const ls_model *m) { return &M(m)->cfg; }

static ls_status mla_capture(const ls_model *m, ls_prompt_state *st, const int32_t *ids, int64_t n,
                             const ls_fwd_opts *o, ls_arena *scratch) {
    return ls_mla_capture(M(m), st, ids, n, o, scratch);
}

static ls_status mla_branch_fwd(const ls_model *m, const ls_prompt_state *st, const int32_t *ids, int64_t T,
                                int64_t out_from, int64_t grad_from, const int32_t *target, float *logprob,
                                float *entropy, ls_branch_tape **tape_out, const ls_fwd_opts *o, ls_arena *tape_arena,
                                ls_arena *scratch) {
    return ls_mla_branch_fwd(M(m), st, ids, T, out_from, grad_from, target, logprob, entropy, tape_out, o, tape_arena,
                             scratch);
}

static ls_status mla_branch_bwd(const ls_model *m, ls_model *grad, const ls_branch_tape *tape, const float *dl,
                                ls_prompt_state *dstate, const ls_fwd_opts *o, ls_arena *scratch) {
    return ls_mla_branch_bwd(M(m), (ls_mla_model *)grad->impl, tape, dl, dstate, o, scratch);
}

static ls_status mla_sweep(const ls_model *m, ls_model *grad, ls_prompt_state *st, const int32_t *ids,
                           const ls_fwd_opts *o, ls_arena *tape_arena, ls_arena *scratch) {
    return ls_mla_sweep(M(m), (ls_mla_model *)grad->impl, st, ids, o, tape_arena, scratch);
}

static ls_status mla_decode(const ls_model *m, ls_prompt_state *const *sts, const int32_t *ids, int n, float *logits,
                            const ls_fwd_opts *o, ls_arena *scratch) {
    return ls_mla_decode(M(m), sts, ids, n, logits, o, scratch);
}

static ls_status mla_params(const ls_model *m, ls_param **out, int64_t *n) { return ls_mla_params(M(m), out, n); }

static ls_status mla_export(const ls_model *m, const char *path, ls_dtype dtype, const char *meta_key,
                            const char *meta_value) {
    return ls_mla_export(M(m), LS_ST_FILE(path), dtype, meta_key, meta_value);
}

ls_model ls_mla_handle(ls_mla_model *m) { return (ls_model){&ls_mla_family, m}; }

/* ---- the trainable set --------------------------------------------------------- */

/* LoRA targets: every 2-D tensor the loss reaches except the embedding (the router
 * `gate` and per-expert projections included); HF rows are the rows of its slot from
 * off / in. */
static ls_status lora_targets(const ls_mla_model *m, ls_lora_target **out, int64_t *n) {
    ls_lora_target *t = calloc((size_t)(m->n_tensors > 0 ? m->n_tensors : 1), sizeof *t);
    if (!t) return ls_err(LS_ERR_NOMEM, "cannot list the LoRA targets");
    *n = 0;
    for (int64_t i = 0; i < m->n_tensors; i++) {
        const ls_mla_tensor *x = &m->tensors[i];
        if (x->ndim != 2 || x->frozen || !strcmp(x->name, "model.embed_tokens.weight")) continue;
        ls_lora_target *g = &t[(*n)++];
        size_t len = strlen(x->name) - strlen(".weight");
        memcpy(g->name, x->name, len);
        g->name[len] = 0;
        g->layer = x->layer, g->field = x->field, g->map = LS_LORA_MAP_RANGE;
        g->row0 = x->off / x->shape[1], g->out = x->shape[0], g->in = x->shape[1];
    }
    *out = t;
    return LS_OK;
}

static ls_lora_view view_of(const ls_mla_model *m) {
    ls_lora_view v = {(char *)m->layers, sizeof(ls_mla_layer), m->lm_head, (int)m->cfg.n_layers};
    return v;
}

/* A slot an adapter writes (its tensor's slot, or the LM head's). */
static int adapted(const ls_mla_tensor *t, const void *ctx) {
    return !t->frozen && ls_lora_adapts(ctx, t->layer, t->layer < 0 ? 0 : t->field) &&
           (t->layer >= 0 || !strcmp(t->name, "lm_head.weight"));
}

typedef struct {
    ls_mla_model base, ref, grad, merged;
    ls_lora *lora;    /* NULL: a full fine-tune */
    uint8_t *sharded; /* [n] expert parallelism: 1 for this rank's routed experts */
    uint8_t *aux;     /* [n] the indexer KL loss: 1 for the indexers' tensors */
} mla_policy;

static mla_policy *MP(const ls_policy *p) { return (mla_policy *)p->priv; }

/* The merged policy: base + (alpha/r)·B·A on every adapted slot (a copy), base elsewhere. */
static void remerge(mla_policy *mp) {
    ls_mla_copy_slots(&mp->base, &mp->merged);
    ls_lora_view v = view_of(&mp->merged);
    ls_lora_merge_view(mp->lora, &v);
}

/* LoRA: merged adapters on the MLA projections by default (kv_b_proj is used in the
 * absorbed form, W_UK on the query side and W_UV after the attention, so the family
 * merges every adapter instead of running side branches); gradients ∂L/∂W_eff of the
 * adapted slots only, projected onto A and B after the backward. */
static ls_status open_lora(ls_policy *p, mla_policy *mp, const ls_policy_spec *sp, ls_arena *fixed, ls_arena *ga) {
    ls_lora_target *tg = NULL;
    int64_t ntg = 0;
    LS_TRY(lora_targets(&mp->base, &tg, &ntg));
    const char *targets = sp->lora_targets ? sp->lora_targets : "q_a_proj,q_b_proj,kv_a_proj_with_mqa,kv_b_proj,o_proj";
    char layout[160];
    snprintf(layout, sizeof layout, "%s, per-expert projections", mp->base.cfg.model_type);
    ls_status s = sp->adapter ? ls_lora_load_targets(&mp->lora, tg, ntg, &mp->base.cfg, mp->base.be, layout, sp->adapter,
                                                     sp->lora_alpha, fixed, ga)
                              : ls_lora_new_targets(&mp->lora, tg, ntg, &mp->base.cfg, mp->base.be, targets, (int)sp->lora_rank,
                                                    sp->lora_alpha, sp->lora_seed, fixed, ga);
    free(tg);
    LS_TRY(s);
    for (int64_t i = 0; mp->base.ep && i < mp->base.n_tensors; i++) {
        const ls_mla_tensor *t = &mp->base.tensors[i];
        if (t->expert >= 0 && ls_lora_adapts(mp->lora, t->layer, t->field))
            return ls_err(LS_ERR_UNSUPPORTED, "LoRA on the routed experts (%s) with --ep is not built: adapt the "
                                              "attention projections, or run without --ep", t->name);
    }
    LS_TRY(ls_mla_alloc_subset(&mp->base, &mp->grad, ga, adapted, mp->lora, NULL));
    LS_TRY(ls_mla_alloc_subset(&mp->base, &mp->merged, fixed, adapted, mp->lora, &mp->base));
    remerge(mp);
    p->adapters = 1;
    p->policy = ls_mla_handle(&mp->merged);
    if (!p->ref.impl) p->ref = ls_mla_handle(&mp->base); /* the base with adapters off */
    return ls_lora_params(mp->lora, &p->w, &p->g, &p->n);
}

/* A tensor of a layer's DSA indexer (what the indexer KL loss trains). */
static int is_indexer(const ls_mla_tensor *t) {
    static const size_t f[5] = {offsetof(ls_mla_layer, idx_wq), offsetof(ls_mla_layer, idx_wk),
                                offsetof(ls_mla_layer, idx_knorm_w), offsetof(ls_mla_layer, idx_knorm_b),
                                offsetof(ls_mla_layer, idx_weights)};
    for (int i = 0; t->layer >= 0 && i < 5; i++)
        if (t->field == f[i]) return 1;
    return 0;
}

static ls_status mla_policy_open(ls_policy *p, const ls_policy_spec *sp, ls_arenas *ar) {
    memset(p, 0, sizeof *p);
    mla_policy *mp = calloc(1, sizeof *mp);
    if (!mp) return ls_err(LS_ERR_NOMEM, "cannot allocate a policy");
    p->priv = mp;
    p->fam = &ls_mla_family;
    ls_arena *fixed = &ar->a[LS_ARENA_FIXED], *ga = &ar->a[LS_ARENA_GRAD];
    LS_TRY(ls_mla_load(&mp->base, sp->model_dir, sp->ep, fixed));
    p->be = mp->base.be;
    p->ref = (ls_model){&ls_mla_family, NULL};
    if (sp->ref_dir) {
        LS_TRY(ls_mla_load(&mp->ref, sp->ref_dir, sp->ep, fixed));
        const ls_config *a = &mp->ref.cfg, *b = &mp->base.cfg;
        if (a->vocab != b->vocab || a->n_layers != b->n_layers || a->hidden != b->hidden ||
            mp->ref.n_tensors != mp->base.n_tensors)
            return ls_err(LS_ERR_ARG, "reference %s: its config differs from the model %s", sp->ref_dir, sp->model_dir);
        p->ref = ls_mla_handle(&mp->ref);
    }
    p->grad = ls_mla_handle(&mp->grad);
    p->ep = mp->base.ep;
    if (sp->aux_loss && (sp->adapter || sp->lora_rank > 0))
        return ls_err(LS_ERR_ARG, "--indexer-kl-coef trains the indexers' own weights, which LoRA keeps frozen: use a "
                                  "full fine-tune (without --lora-rank / --adapter)");
    if (sp->adapter || sp->lora_rank > 0) return open_lora(p, mp, sp, fixed, ga);
    if (sp->aux_loss) { /* the indexers join the trainable set (the correction bias stays frozen) */
        int any = 0;
        for (int64_t i = 0; i < mp->base.n_tensors; i++) {
            ls_mla_tensor *t = (ls_mla_tensor *)&mp->base.tensors[i]; /* the policy's own list (fixed arena) */
            if (is_indexer(t)) t->frozen = 0, any = 1;
        }
        if (!any) return ls_err(LS_ERR_ARG, "--indexer-kl-coef: %s has no indexer tensors", sp->model_dir);
    }
    LS_TRY(ls_mla_alloc_like(&mp->base, &mp->grad, ga, 1));
    p->policy = ls_mla_handle(&mp->base);
    int64_t n2 = 0;
    LS_TRY(ls_mla_params(&mp->base, &p->w, &p->n));
    LS_TRY(ls_mla_params(&mp->grad, &p->g, &n2));
    LS_ASSERT(n2 == p->n, "parameter lists differ");
    if (mp->base.ep) { /* the routed experts' gradients are this rank's shares (the norm sums them over ep) */
        if (!(mp->sharded = calloc((size_t)(p->n > 0 ? p->n : 1), 1))) return LS_ERR_NOMEM;
        for (int64_t i = 0, k = 0; i < mp->base.n_tensors; i++)
            if (!mp->base.tensors[i].frozen) mp->sharded[k++] = mp->base.tensors[i].expert >= 0;
        p->sharded = mp->sharded;
    }
    if (sp->aux_loss) { /* the indexers' gradients come from the indexer KL loss alone */
        if (!(mp->aux = calloc((size_t)(p->n > 0 ? p->n : 1), 1))) return LS_ERR_NOMEM;
        for (int64_t i = 0, k = 0; i < mp->base.n_tensors; i++)
            if (!mp->base.tensors[i].frozen) mp->aux[k++] = (uint8_t)is_indexer(&mp->base.tensors[i]);
        p->aux = mp->aux;
    }
    return LS_OK;
}

static void mla_policy_close(ls_policy *p) {
    if (p->priv) free(MP(p)->sharded), free(MP(p)->aux);
    free(p->w);
    free(p->g);
    free(p->priv);
    memset(p, 0, sizeof *p);
}

static void mla_grads_done(ls_policy *p) {
    mla_policy *mp = MP(p);
    if (!mp->lora) return;
    ls_lora_view v = view_of(&mp->grad); /* ∂L/∂W_eff → adapters */
    ls_lora_backward_view(mp->lora, &v);
}

static void mla_step_done(ls_policy *p) {
    if (MP(p)->lora) remerge(MP(p));
}

/* Every buffer a backward writes: the gradient set's allocated tensors (with LoRA the
 * adapted slots' ∂L/∂W_eff), then the adapters'. */
static ls_status mla_grad_buffers(const ls_policy *p, ls_param **out, int64_t *n) {
    const mla_policy *mp = MP(p);
    ls_param *all = NULL;
    int64_t nf = 0;
    LS_TRY(ls_mla_params(&mp->grad, &all, &nf));
    ls_param *v = realloc(all, (size_t)(nf + (mp->lora ? p->n : 0) + 1) * sizeof *v);
    if (!v) {
        free(all);
        return ls_err(LS_ERR_NOMEM, "cannot list the gradient buffers");
    }
    *n = 0;
    for (int64_t k = 0; k < nf; k++)
        if (v[k].p) v[(*n)++] = v[k];
    for (int64_t k = 0; mp->lora && k < p->n; k++) v[(*n)++] = p->g[k];
    *out = v;
    return LS_OK;
}

static void mla_zero_grad(ls_policy *p) {
    ls_param *g = NULL;
    int64_t n = 0;
    if (mla_grad_buffers(p, &g, &n) == LS_OK)
        for (int64_t k = 0; k < n; k++) ls_op_zero(p->be, g[k].p, g[k].n);
    free(g);
}

static ls_status mla_policy_save(const ls_policy *p, const ls_policy_spec *sp, const char *dir) {
    const mla_policy *mp = MP(p);
    char path[4096], src[4096];
    if (!dir && (mp->lora || !mp->base.ep)) return LS_OK; /* nothing to gather: adapters are replicated */
    if (!dir) return ls_mla_export(&mp->base, NULL, LS_DTYPE_F32, NULL, NULL); /* EP: take part */
    if (mp->lora) { /* PEFT layout */
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
        LS_TRY(ls_lora_export(mp->lora, 0, LS_ST_FILE(path), NULL, NULL));
        snprintf(path, sizeof path, "%s/adapter_config.json", dir);
        return ls_lora_write_config(path, mp->lora);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    LS_TRY(ls_mla_export(&mp->base, LS_ST_FILE(path), LS_DTYPE_F32, NULL, NULL));
    snprintf(src, sizeof src, "%s/config.json", sp->model_dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    return ls_copy_file_atomic(src, path);
}

static ls_status mla_policy_save_grads(const ls_policy *p, const ls_st_sink *to, const char *meta_key,
                                       const char *meta_value) {
    const mla_policy *mp = MP(p);
    if (mp->lora) return to ? ls_lora_export(mp->lora, 1, to, meta_key, meta_value) : LS_OK;
    return ls_mla_export(&mp->grad, to, LS_DTYPE_F32, meta_key, meta_value);
}

static void mla_policy_predict(const ls_policy *p, int optimizer, size_t *grad, size_t *fixed) {
    const mla_policy *mp = MP(p);
    size_t trainable = 0, copies = 0;
    for (int64_t k = 0; k < p->n; k++) trainable += (size_t)p->w[k].n;
    ls_param *g = NULL;
    int64_t n = 0;
    if (mp->lora && ls_mla_params(&mp->grad, &g, &n) == LS_OK)
        for (int64_t k = 0; k < n; k++) copies += g[k].p ? (size_t)g[k].n : 0;
    free(g);
    /* weights (+ merged copies of the adapted slots), the trainable tensors' moments */
    *grad = 4 * (trainable + copies);
    *fixed = 4 * (mp->base.n_params + copies) + (optimizer ? 8 * trainable : 0) + (mp->lora ? 4 * trainable : 0);
}

/* `demo --family mla`: the compressed-attention MoE layout (GLM-5.2 style: MLA with a q and a KV
 * latent, a DSA lightning indexer on layers 0 and 2 that layers 1 and 3 share, a dense
 * first layer, then 8 routed experts (top 2) + 1 shared), 5.9 M parameters, the same
 * 257 byte-level ids. index_topk 512 of the 16K prompt: the sparse attention is active. */
static const char demo_config[] =
    "{\n"
    "  \"model_type\": \"glm_moe_dsa\",\n"
    "  \"vocab_size\": 257,\n"
    "  \"hidden_size\": 256,\n"
    "  \"num_hidden_layers\": 4,\n"
    "  \"num_attention_heads\": 4,\n"
    "  \"num_key_value_heads\": 4,\n"
    "  \"q_lora_rank\": 128,\n"
    "  \"kv_lora_rank\": 64,\n"
    "  \"qk_nope_head_dim\": 32,\n"
    "  \"qk_rope_head_dim\": 16,\n"
    "  \"v_head_dim\": 32,\n"
    "  \"index_n_heads\": 4,\n"
    "  \"index_head_dim\": 32,\n"
    "  \"index_topk\": 512,\n"
    "  \"indexer_types\": [\"full\", \"shared\", \"full\", \"shared\"],\n"
    "  \"indexer_rope_interleave\": true,\n"
    "  \"intermediate_size\": 512,\n"
    "  \"n_routed_experts\": 8,\n"
    "  \"num_experts_per_tok\": 2,\n"
    "  \"moe_intermediate_size\": 128,\n"
    "  \"n_shared_experts\": 1,\n"
    "  \"first_k_dense_replace\": 1,\n"
    "  \"routed_scaling_factor\": 2.5,\n"
    "  \"norm_topk_prob\": true,\n"
    "  \"scoring_func\": \"sigmoid\",\n"
    "  \"topk_method\": \"noaux_tc\",\n"
    "  \"n_group\": 1,\n"
    "  \"topk_group\": 1,\n"
    "  \"rope_theta\": 1000000,\n"
    "  \"rms_norm_eps\": 1e-5,\n"
    "  \"max_position_embeddings\": 1048576,\n"
    "  \"tie_word_embeddings\": false\n"
    "}\n";

const ls_family ls_mla_family = {
    .name = "mla",
    .accepts = mla_accepts,
    .load = mla_load,
    .config = mla_config,
    .capture = mla_capture,
    .branch_fwd = mla_branch_fwd,
    .branch_bwd = mla_branch_bwd,
    .sweep = mla_sweep,
    .policy_grad_buffers = mla_grad_buffers,
    .decode = mla_decode,
    .state_init = ls_state_init,
    .state_plan = ls_state_plan,
    .params = mla_params,
    .export = mla_export,
    .policy_open = mla_policy_open,
    .policy_close = mla_policy_close,
    .policy_grads_done = mla_grads_done,
    .policy_step_done = mla_step_done,
    .policy_zero_grad = mla_zero_grad,
    .policy_save = mla_policy_save,
    .policy_save_grads = mla_policy_save_grads,
    .policy_predict = mla_policy_predict,
    .write_random = ls_mla_write_random,
    .demo_config = demo_config,
    .plan = ls_mla_plan_doc,
    .capture_flops = ls_mla_capture_flops,
    .model_types = ls_mla_model_types,
    .parse_config = ls_mla_parse_config,
    .state_layer = ls_mla_state_layer,
    .state_recurrent = ls_mla_state_recurrent,
    .aux_loss = "indexer_kl",
    .demo_summary = "MLA + DSA indexer (2 full, 2 shared), 1 dense + 3 MoE",
};
