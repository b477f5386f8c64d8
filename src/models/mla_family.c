/*
 * mla_family.c — the MLA + DSA + MoE family's table (family.h) and its trainable set:
 * a full fine-tune of every tensor the GRPO loss reaches (the indexer and
 * e_score_correction_bias are frozen: the loss gives them no gradient, spec §8.4, §8.6,
 * so they carry no gradient buffer and no optimizer state).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/mla.h"
#include "longstraw/safetensors.h"

static const ls_mla_model *M(const ls_model *m) { return (const ls_mla_model *)m->impl; }

static int mla_accepts(const ls_config *cfg) { return cfg->family == LS_FAMILY_MLA && cfg->n_layers > 0; }

static ls_status mla_load(ls_model *m, const char *dir, ls_arena *fixed) {
    ls_mla_model *h = ls_arena_calloc(fixed, 1, sizeof *h);
    if (!h) return LS_ERR_NOMEM;
    LS_TRY(ls_mla_load(h, dir, fixed));
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

static ls_status full_mode_missing(const ls_config *c) {
    return ls_err(LS_ERR_UNSUPPORTED, "%s: --mode full (the exact gradient) is not built for the MLA family yet",
                  c->model_type);
}

static ls_status mla_branch_bwd(const ls_model *m, ls_model *grad, const ls_branch_tape *tape, const float *dl,
                                ls_prompt_state *dstate, const ls_fwd_opts *o, ls_arena *scratch) {
    (void)o;
    if (dstate) return full_mode_missing(&M(m)->cfg);
    return ls_mla_branch_bwd(M(m), (ls_mla_model *)grad->impl, tape, dl, scratch);
}

static ls_status mla_sweep(const ls_model *m, ls_model *grad, ls_prompt_state *st, const int32_t *ids,
                           const ls_fwd_opts *o, ls_arena *tape_arena, ls_arena *scratch) {
    (void)grad, (void)st, (void)ids, (void)o, (void)tape_arena, (void)scratch;
    return full_mode_missing(&M(m)->cfg);
}

static ls_status mla_decode(const ls_model *m, ls_prompt_state *const *sts, const int32_t *ids, int n, float *logits,
                            const ls_fwd_opts *o, ls_arena *scratch) {
    return ls_mla_decode(M(m), sts, ids, n, logits, o, scratch);
}

static ls_status mla_params(const ls_model *m, ls_param **out, int64_t *n) { return ls_mla_params(M(m), out, n); }

static ls_status mla_export(const ls_model *m, const char *path, ls_dtype dtype, const char *meta_key,
                            const char *meta_value) {
    return ls_mla_export(M(m), path, dtype, meta_key, meta_value);
}

ls_model ls_mla_handle(ls_mla_model *m) { return (ls_model){&ls_mla_family, m}; }

/* ---- the trainable set --------------------------------------------------------- */

typedef struct {
    ls_mla_model base, ref, grad;
} mla_policy;

static mla_policy *MP(const ls_policy *p) { return (mla_policy *)p->priv; }

static ls_status mla_policy_open(ls_policy *p, const ls_policy_spec *sp, ls_arenas *ar) {
    memset(p, 0, sizeof *p);
    if (sp->adapter || sp->lora_rank > 0)
        return ls_err(LS_ERR_UNSUPPORTED, "%s: LoRA adapters are not built for the MLA family yet (full fine-tune "
                                          "only)", sp->model_dir);
    mla_policy *mp = calloc(1, sizeof *mp);
    if (!mp) return ls_err(LS_ERR_NOMEM, "cannot allocate a policy");
    p->priv = mp;
    p->fam = &ls_mla_family;
    ls_arena *fixed = &ar->a[LS_ARENA_FIXED], *ga = &ar->a[LS_ARENA_GRAD];
    LS_TRY(ls_mla_load(&mp->base, sp->model_dir, fixed));
    p->ref = (ls_model){&ls_mla_family, NULL};
    if (sp->ref_dir) {
        LS_TRY(ls_mla_load(&mp->ref, sp->ref_dir, fixed));
        const ls_config *a = &mp->ref.cfg, *b = &mp->base.cfg;
        if (a->vocab != b->vocab || a->n_layers != b->n_layers || a->hidden != b->hidden ||
            mp->ref.n_tensors != mp->base.n_tensors)
            return ls_err(LS_ERR_ARG, "reference %s: its config differs from the model %s", sp->ref_dir, sp->model_dir);
        p->ref = ls_mla_handle(&mp->ref);
    }
    LS_TRY(ls_mla_alloc_like(&mp->base, &mp->grad, ga, 1));
    p->policy = ls_mla_handle(&mp->base);
    p->grad = ls_mla_handle(&mp->grad);
    int64_t n2 = 0;
    LS_TRY(ls_mla_params(&mp->base, &p->w, &p->n));
    LS_TRY(ls_mla_params(&mp->grad, &p->g, &n2));
    LS_ASSERT(n2 == p->n, "parameter lists differ");
    return LS_OK;
}

static void mla_policy_close(ls_policy *p) {
    free(p->w);
    free(p->g);
    free(p->priv);
    memset(p, 0, sizeof *p);
}

static void mla_grads_done(ls_policy *p) { (void)p; }
static void mla_step_done(ls_policy *p) { (void)p; }

static ls_status mla_grad_buffers(const ls_policy *p, ls_param **out, int64_t *n) {
    return ls_mla_params(&MP(p)->grad, out, n);
}

static void mla_zero_grad(ls_policy *p) {
    for (int64_t k = 0; k < p->n; k++) memset(p->g[k].p, 0, (size_t)p->g[k].n * sizeof(float));
}

static ls_status mla_policy_save(const ls_policy *p, const ls_policy_spec *sp, const char *dir) {
    char path[4096], src[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    LS_TRY(ls_mla_export(&MP(p)->base, path, LS_DTYPE_F32, NULL, NULL));
    snprintf(src, sizeof src, "%s/config.json", sp->model_dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    return ls_copy_file_atomic(src, path);
}

static ls_status mla_policy_save_grads(const ls_policy *p, const char *path, const char *meta_key,
                                       const char *meta_value) {
    return ls_mla_export(&MP(p)->grad, path, LS_DTYPE_F32, meta_key, meta_value);
}

static void mla_policy_predict(const ls_policy *p, int optimizer, size_t *grad, size_t *fixed) {
    const mla_policy *mp = MP(p);
    size_t trainable = 0;
    for (int64_t k = 0; k < p->n; k++) trainable += (size_t)p->w[k].n;
    *grad = 4 * trainable;
    *fixed = 4 * mp->base.n_params + (optimizer ? 8 * trainable : 0);
}

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
};
