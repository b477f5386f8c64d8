/*
 * hybrid_family.c — the hybrid family's table (family.h): the transaction reaches
 * ls_hybrid_* only through these entries. Also the trainable set of a training
 * command for this family: full fine-tune, or LoRA adapters by side branches (the
 * policy = base + adapters applied after each frozen projection) or, for an
 * adapted LM head, merged into a copy of the adapted tensors.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/lora.h"
#include "longstraw/hybrid.h"
#include "longstraw/safetensors.h"

/* ---- the model entries -------------------------------------------------------- */

static const ls_hybrid_model *H(const ls_model *m) { return (const ls_hybrid_model *)m->impl; }

static int hy_accepts(const ls_config *cfg) { return cfg->family == &ls_hybrid_family && cfg->n_layers > 0; }

static ls_status no_ep(const ls_comm *ep, const char *dir) {
    if (ep && ls_comm_size(ep) > 1)
        return ls_err(LS_ERR_UNSUPPORTED, "%s: expert parallelism (--ep) is built for the MLA family only", dir);
    return LS_OK;
}

static ls_status hy_load(ls_model *m, const char *dir, const ls_comm *ep, ls_arena *fixed) {
    LS_TRY(no_ep(ep, dir));
    ls_hybrid_model *h = ls_arena_host_calloc(fixed, 1, sizeof *h);
    if (!h) return LS_ERR_NOMEM;
    LS_TRY(ls_hybrid_load(h, dir, fixed));
    *m = ls_hybrid_handle(h);
    return LS_OK;
}

static const ls_config *hy_config(const ls_model *m) { return &H(m)->cfg; }

static ls_status hy_capture(const ls_model *m, ls_prompt_state *st, const int32_t *ids, int64_t n,
                            const ls_fwd_opts *o, ls_arena *scratch) {
    return ls_hybrid_capture(H(m), st, ids, n, o, scratch);
}

static ls_status hy_branch_fwd(const ls_model *m, const ls_prompt_state *st, const int32_t *ids, int64_t T,
                               int64_t out_from, int64_t grad_from, const int32_t *target, float *logprob,
                               float *entropy, ls_branch_tape **tape_out, const ls_fwd_opts *o, ls_arena *tape_arena,
                               ls_arena *scratch) {
    return ls_hybrid_branch_fwd(H(m), st, ids, T, out_from, grad_from, target, logprob, entropy, tape_out, o,
                                tape_arena, scratch);
}

static ls_status hy_branch_bwd(const ls_model *m, ls_model *grad, const ls_branch_tape *tape, const float *dl,
                               ls_prompt_state *dstate, const ls_fwd_opts *o, ls_arena *scratch) {
    (void)o;
    return ls_hybrid_branch_bwd(H(m), (ls_hybrid_model *)grad->impl, tape, dl, dstate, scratch);
}

static ls_status hy_sweep(const ls_model *m, ls_model *grad, ls_prompt_state *st, const int32_t *ids,
                          const ls_fwd_opts *o, ls_arena *tape_arena, ls_arena *scratch) {
    return ls_hybrid_sweep(H(m), (ls_hybrid_model *)grad->impl, st, ids, o, tape_arena, scratch);
}

static ls_status hy_decode(const ls_model *m, ls_prompt_state *const *sts, const int32_t *ids, int n, float *logits,
                           const ls_fwd_opts *o, ls_arena *scratch) {
    return ls_hybrid_decode(H(m), sts, ids, n, logits, o, scratch);
}

static ls_status hy_params(const ls_model *m, ls_param **out, int64_t *n) { return ls_hybrid_params(H(m), out, n); }

static ls_status hy_export(const ls_model *m, const char *path, ls_dtype dtype, const char *meta_key,
                           const char *meta_value) {
    return ls_hybrid_export(H(m), LS_ST_FILE(path), dtype, meta_key, meta_value);
}

ls_model ls_hybrid_handle(ls_hybrid_model *m) { return (ls_model){&ls_hybrid_family, m}; }

/* ---- the trainable set --------------------------------------------------------- */

typedef struct {
    int owned;                 /* storage below filled by policy_open */
    ls_hybrid_model base, ref, grad, merged;
    ls_hybrid_model *policy, *gradp;
    const ls_hybrid_model *refp, *lora_base;
    ls_lora *lora;
} hy_policy;

static hy_policy *HP(const ls_policy *p) { return (hy_policy *)p->priv; }

/* The handles and trainable lists of a filled hy_policy. */
static ls_status finish_policy(ls_policy *p, hy_policy *hp) {
    p->fam = &ls_hybrid_family;
    p->priv = hp;
    p->be = hp->policy->be;
    p->policy = ls_hybrid_handle(hp->policy);
    p->grad = ls_hybrid_handle(hp->gradp);
    p->ref = hp->refp ? ls_hybrid_handle((ls_hybrid_model *)hp->refp) : (ls_model){&ls_hybrid_family, NULL};
    p->adapters = hp->lora != NULL;
    if (hp->lora) return ls_lora_params(hp->lora, &p->w, &p->g, &p->n);
    int64_t n2 = 0;
    LS_TRY(ls_hybrid_params(hp->policy, &p->w, &p->n));
    LS_TRY(ls_hybrid_params(hp->gradp, &p->g, &n2));
    LS_ASSERT(n2 == p->n, "parameter lists differ");
    return LS_OK;
}

ls_status ls_hybrid_policy_wrap(ls_policy *p, ls_hybrid_model *policy, const ls_hybrid_model *ref,
                                ls_hybrid_model *grad, ls_lora *lora, const ls_hybrid_model *lora_base) {
    memset(p, 0, sizeof *p);
    if (lora && !lora_base) return ls_err(LS_ERR_ARG, "LoRA needs its base model");
    hy_policy *hp = calloc(1, sizeof *hp);
    if (!hp) return ls_err(LS_ERR_NOMEM, "cannot allocate a policy");
    hp->policy = policy, hp->gradp = grad, hp->refp = ref, hp->lora = lora, hp->lora_base = lora_base;
    ls_status s = finish_policy(p, hp);
    if (s != LS_OK) ls_policy_close(p);
    return s;
}

static ls_status hy_policy_open(ls_policy *p, const ls_policy_spec *sp, ls_arenas *ar) {
    memset(p, 0, sizeof *p);
    hy_policy *hp = calloc(1, sizeof *hp);
    if (!hp) return ls_err(LS_ERR_NOMEM, "cannot allocate a policy");
    hp->owned = 1;
    p->priv = hp;
    LS_TRY(no_ep(sp->ep, sp->model_dir));
    if (sp->aux_loss)
        return ls_err(LS_ERR_ARG, "--indexer-kl-coef: %s is a hybrid (Gated DeltaNet) model, which has no DSA indexer",
                      sp->model_dir);
    p->fam = &ls_hybrid_family;
    ls_arena *fixed = &ar->a[LS_ARENA_FIXED], *ga = &ar->a[LS_ARENA_GRAD];
    LS_TRY(ls_hybrid_load(&hp->base, sp->model_dir, fixed));
    if (sp->ref_dir) {
        LS_TRY(ls_hybrid_load(&hp->ref, sp->ref_dir, fixed));
        const ls_config *a = &hp->ref.cfg, *b = &hp->base.cfg;
        if (a->vocab != b->vocab || a->n_layers != b->n_layers || a->hidden != b->hidden)
            return ls_err(LS_ERR_ARG, "reference %s: its config differs from the model %s", sp->ref_dir,
                          sp->model_dir);
        hp->refp = &hp->ref;
    }
    hp->policy = &hp->base;
    hp->gradp = &hp->grad;
    if (!sp->adapter && sp->lora_rank <= 0) {
        LS_TRY(ls_hybrid_alloc_like(&hp->base, &hp->grad, ga));
        return finish_policy(p, hp);
    }
    /* LoRA: base frozen (and the default reference), policy = base + adapters */
    const char *targets = sp->lora_targets ? sp->lora_targets
                          : hp->base.fused_gdn ? "q_proj,k_proj,v_proj,o_proj,in_proj_qkvz,in_proj_ba,out_proj"
                                               : "q_proj,k_proj,v_proj,o_proj,in_proj_qkv,in_proj_z,in_proj_b,"
                                                 "in_proj_a,out_proj";
    LS_TRY(sp->adapter ? ls_lora_load(&hp->lora, &hp->base, sp->adapter, sp->lora_alpha, fixed, ga)
                       : ls_lora_new(&hp->lora, &hp->base, targets, (int)sp->lora_rank, sp->lora_alpha,
                                     sp->lora_seed, fixed, ga));
    if (ls_lora_side_ok(hp->lora)) {
        /* side branches: the policy is the base plus adapters applied on the fly —
         * no merged copy, and no base weight gets a gradient buffer */
        LS_TRY(ls_hybrid_alloc_none(&hp->base, &hp->grad, ga));
        hp->merged = hp->base;
        hp->merged.lora = hp->lora;
    } else {
        /* an adapter on the LM head (its fused log-prob kernel has no side branch):
         * merge — a copy of the adapted tensors, gradients only for them */
        LS_TRY(ls_hybrid_alloc_grad_lora(&hp->base, &hp->grad, ga, hp->lora));
        LS_TRY(ls_hybrid_alloc_merged_lora(&hp->base, &hp->merged, fixed, hp->lora));
        ls_lora_merge(hp->lora, &hp->base, &hp->merged);
    }
    hp->policy = &hp->merged;
    hp->lora_base = &hp->base;
    if (!hp->refp) hp->refp = &hp->base;
    return finish_policy(p, hp);
}

static void hy_policy_close(ls_policy *p) {
    free(p->w);
    free(p->g);
    free(p->priv);
    memset(p, 0, sizeof *p);
}

/* merged LoRA only: the policy is a copy of base + adapters (side branches read the
 * adapters themselves and fed them directly) */
static int merged(const hy_policy *hp) { return hp->lora && !hp->policy->lora; }

static void hy_grads_done(ls_policy *p) {
    hy_policy *hp = HP(p);
    if (merged(hp)) ls_lora_backward(hp->lora, hp->gradp); /* ∂L/∂W_eff → adapters */
}

static void hy_step_done(ls_policy *p) {
    hy_policy *hp = HP(p);
    if (merged(hp)) ls_lora_merge(hp->lora, hp->lora_base, hp->policy);
}

/* Every buffer a backward accumulates into: the full-weight gradients (frozen ones,
 * NULL, left out), then the adapters'. */
static ls_status hy_grad_buffers(const ls_policy *p, ls_param **out, int64_t *n) {
    const hy_policy *hp = p->priv;
    ls_param *fg = NULL, *lw = NULL, *lg = NULL;
    int64_t nf = 0, nl = 0;
    LS_TRY(ls_hybrid_params(hp->gradp, &fg, &nf));
    if (hp->lora && ls_lora_params(hp->lora, &lw, &lg, &nl) != LS_OK) {
        free(fg);
        return LS_ERR_NOMEM;
    }
    free(lw);
    ls_param *all = malloc((size_t)(nf + nl + 1) * sizeof *all);
    *n = 0;
    for (int64_t k = 0; all && k < nf; k++)
        if (fg[k].p) all[(*n)++] = fg[k];
    for (int64_t k = 0; all && k < nl; k++) all[(*n)++] = lg[k];
    free(fg), free(lg);
    if (!all) return ls_err(LS_ERR_NOMEM, "cannot list the gradient buffers");
    *out = all;
    return LS_OK;
}

static void hy_zero_grad(ls_policy *p) {
    ls_param *g = NULL;
    int64_t n = 0;
    if (hy_grad_buffers(p, &g, &n) == LS_OK)
        for (int64_t k = 0; k < n; k++) ls_op_zero(p->be, g[k].p, g[k].n);
    free(g);
}

static ls_status hy_policy_save(const ls_policy *p, const ls_policy_spec *sp, const char *dir) {
    const hy_policy *hp = HP(p);
    char path[4096], src[4096];
    if (hp->lora) { /* PEFT layout: adapter_model.safetensors + adapter_config.json */
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
        LS_TRY(ls_lora_export(hp->lora, 0, LS_ST_FILE(path), NULL, NULL));
        snprintf(path, sizeof path, "%s/adapter_config.json", dir);
        return ls_lora_write_config(path, hp->lora);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    LS_TRY(ls_hybrid_export(hp->policy, LS_ST_FILE(path), LS_DTYPE_F32, NULL, NULL));
    snprintf(src, sizeof src, "%s/config.json", sp->model_dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    return ls_copy_file_atomic(src, path);
}

static ls_status hy_policy_save_grads(const ls_policy *p, const ls_st_sink *to, const char *meta_key,
                                      const char *meta_value) {
    const hy_policy *hp = HP(p);
    return hp->lora ? ls_lora_export(hp->lora, 1, to, meta_key, meta_value)
                    : ls_hybrid_export(hp->gradp, to, LS_DTYPE_F32, meta_key, meta_value);
}

static void hy_policy_predict(const ls_policy *p, int optimizer, size_t *grad, size_t *fixed) {
    const hy_policy *hp = HP(p);
    const ls_hybrid_model *base = hp->lora ? hp->lora_base : hp->policy;
    size_t params = 0, adapters = 0;
    ls_param *pp;
    int64_t np;
    if (ls_hybrid_params(base, &pp, &np) == LS_OK) {
        for (int64_t k = 0; k < np; k++) params += (size_t)pp[k].n;
        free(pp);
    }
    for (int64_t k = 0; hp->lora && k < p->n; k++) adapters += (size_t)p->w[k].n;
    if (!hp->lora) {
        *grad = 4 * params;
        *fixed = 4 * params * (optimizer ? 3 : 1);
    } else { /* side branches: adapter gradients only; base + adapters (+ their moments) */
        *grad = 4 * adapters;
        *fixed = 4 * params + 4 * adapters * (optimizer ? 3 : 1);
    }
}

/* 4 layers (3 Gated DeltaNet, 1 gated attention), 4.6 M parameters; its 257 ids are the
 * byte-level tokenizer's 257. */
static const char demo_config[] =
    "{\n"
    "  \"model_type\": \"qwen3_next\",\n"
    "  \"vocab_size\": 257,\n"
    "  \"hidden_size\": 256,\n"
    "  \"num_hidden_layers\": 4,\n"
    "  \"num_attention_heads\": 4,\n"
    "  \"num_key_value_heads\": 2,\n"
    "  \"head_dim\": 64,\n"
    "  \"partial_rotary_factor\": 0.25,\n"
    "  \"rope_theta\": 10000000,\n"
    "  \"linear_num_key_heads\": 4,\n"
    "  \"linear_num_value_heads\": 8,\n"
    "  \"linear_key_head_dim\": 32,\n"
    "  \"linear_value_head_dim\": 32,\n"
    "  \"linear_conv_kernel_dim\": 4,\n"
    "  \"intermediate_size\": 768,\n"
    "  \"num_experts\": 0,\n"
    "  \"full_attention_interval\": 4,\n"
    "  \"rms_norm_eps\": 1e-6,\n"
    "  \"tie_word_embeddings\": false\n"
    "}\n";

const ls_family ls_hybrid_family = {
    .name = "hybrid",
    .accepts = hy_accepts,
    .load = hy_load,
    .config = hy_config,
    .capture = hy_capture,
    .branch_fwd = hy_branch_fwd,
    .branch_bwd = hy_branch_bwd,
    .sweep = hy_sweep,
    .policy_grad_buffers = hy_grad_buffers,
    .decode = hy_decode,
    .state_init = ls_state_init,
    .state_plan = ls_state_plan,
    .params = hy_params,
    .export = hy_export,
    .policy_open = hy_policy_open,
    .policy_close = hy_policy_close,
    .policy_grads_done = hy_grads_done,
    .policy_step_done = hy_step_done,
    .policy_zero_grad = hy_zero_grad,
    .policy_save = hy_policy_save,
    .policy_save_grads = hy_policy_save_grads,
    .policy_predict = hy_policy_predict,
    .write_random = ls_hybrid_write_random,
    .demo_config = demo_config,
    .plan = ls_hybrid_plan_doc,
    .capture_flops = ls_hybrid_capture_flops,
    .model_types = ls_hybrid_model_types,
    .parse_config = ls_hybrid_parse_config,
    .state_layer = ls_hybrid_state_layer,
    .state_recurrent = ls_hybrid_state_recurrent,
    .demo_summary = "3 Gated DeltaNet + 1 gated attention",
};
