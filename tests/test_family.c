/*
 * test_family.c — see test_family.h.
 */
#include "test_family.h"

#include <stdlib.h>

#include "testutil.h"

ls_status t_grpo_update_lora(ls_hybrid_model *policy, const ls_hybrid_model *ref, ls_hybrid_model *grad,
                             ls_adamw *adam, ls_lora *lora, const ls_hybrid_model *base, const ls_group *g,
                             const ls_grpo_opts *o, ls_arenas *ar, ls_grpo_metrics *mt) {
    ls_policy p;
    LS_TRY(ls_hybrid_policy_wrap(&p, policy, ref, grad, lora, base));
    ls_status s = ls_grpo_update(&p, adam, g, o, ar, mt);
    ls_policy_close(&p);
    return s;
}

ls_status t_grpo_update(ls_hybrid_model *policy, const ls_hybrid_model *ref, ls_hybrid_model *grad, ls_adamw *adam,
                        const ls_group *g, const ls_grpo_opts *o, ls_arenas *ar, ls_grpo_metrics *mt) {
    return t_grpo_update_lora(policy, ref, grad, adam, NULL, NULL, g, o, ar, mt);
}

ls_status t_grpo_update_batch(ls_hybrid_model *policy, const ls_hybrid_model *ref, ls_hybrid_model *grad,
                              ls_adamw *adam, ls_group *groups, int n_groups, const ls_grpo_opts *o, ls_arenas *ar,
                              ls_grpo_metrics *mt) {
    ls_policy p;
    LS_TRY(ls_hybrid_policy_wrap(&p, policy, ref, grad, NULL, NULL));
    ls_status s = ls_grpo_update_batch(&p, adam, groups, n_groups, NULL, o, ar, mt);
    ls_policy_close(&p);
    return s;
}

ls_status t_adamw_init(ls_adamw *a, ls_hybrid_model *m, ls_arena *fixed) {
    ls_policy p;
    LS_TRY(ls_hybrid_policy_wrap(&p, m, NULL, m, NULL, NULL));
    ls_status s = ls_adamw_init(a, &p, fixed);
    ls_policy_close(&p);
    return s;
}

ls_status t_score_group(const ls_hybrid_model *m, const ls_group *g, const ls_score_opts *o, ls_arenas *ar, float **out,
                        ls_score_stats *stats) {
    ls_model h = ls_hybrid_handle((ls_hybrid_model *)m); /* read only */
    return ls_score_group(&h, g, o, ar, out, stats);
}

ls_status t_hybrid_perturb(ls_hybrid_model *m, uint64_t seed) {
    ls_param *p;
    int64_t n;
    LS_TRY(ls_hybrid_params(m, &p, &n));
    ls_rng r;
    ls_rng_seed(&r, seed);
    for (int64_t k = 0; k < n; k++)
        if (p[k].p) t_perturb_ulp(p[k].p, p[k].n, &r);
    free(p);
    return LS_OK;
}
