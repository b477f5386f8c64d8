/*
 * test_family.h — the transaction's entry points over hybrid models a test owns:
 * each call wraps the models in a trainable set (ls_hybrid_policy_wrap) and goes
 * through the family table, as the tool does.
 */
#ifndef LS_TEST_FAMILY_H
#define LS_TEST_FAMILY_H

#include "longstraw/grpo.h"
#include "longstraw/lora.h"
#include "longstraw/hybrid.h"
#include "longstraw/rollout.h"
#include "longstraw/score.h"

/* Full fine-tune of `policy` (ref may be NULL), gradients into `grad`. */
ls_status t_grpo_update(ls_hybrid_model *policy, const ls_hybrid_model *ref, ls_hybrid_model *grad, ls_adamw *adam,
                        const ls_group *g, const ls_grpo_opts *o, ls_arenas *ar, ls_grpo_metrics *mt);
/* LoRA adapters `lora` on the frozen `base`; `policy` is the merged copy or the side-branch view. */
ls_status t_grpo_update_lora(ls_hybrid_model *policy, const ls_hybrid_model *ref, ls_hybrid_model *grad,
                             ls_adamw *adam, ls_lora *lora, const ls_hybrid_model *base, const ls_group *g,
                             const ls_grpo_opts *o, ls_arenas *ar, ls_grpo_metrics *mt);
ls_status t_grpo_update_batch(ls_hybrid_model *policy, const ls_hybrid_model *ref, ls_hybrid_model *grad,
                              ls_adamw *adam, ls_group *groups, int n_groups, const ls_grpo_opts *o, ls_arenas *ar,
                              ls_grpo_metrics *mt);
/* AdamW moments for a full fine-tune of m. */
ls_status t_adamw_init(ls_adamw *a, ls_hybrid_model *m, ls_arena *fixed);
/* Every weight of m moved one ulp up or down at random (t_perturb_ulp): the model a
 * perturbation floor is measured on (testutil.h). */
ls_status t_hybrid_perturb(ls_hybrid_model *m, uint64_t seed);
ls_status t_score_group(const ls_hybrid_model *m, const ls_group *g, const ls_score_opts *o, ls_arenas *ar, float **out,
                        ls_score_stats *stats);

#endif
