/*
 * score.c — the scoring phase over a group (DESIGN §3 steps 1–2): capture the
 * prompt x_1..x_{P−1} once, then each member's branch [x_P, y_1..y_{R−1}] against
 * the read-only state; or the plain full-sequence forward per member.
 */
#include <string.h>

#include "longstraw/score.h"

void ls_score_opts_default(ls_score_opts *o) {
    memset(o, 0, sizeof *o);
    o->page_size = 64;
    o->state_dtype = LS_DTYPE_F32;
    ls_fwd_opts_default(&o->fwd);
}

ls_status ls_score_group(const ls_hybrid_model *m, const ls_group *g, const ls_score_opts *o,
                         ls_arenas *ar, float **out, ls_score_stats *stats) {
    ls_arena *score = &ar->a[LS_ARENA_SCORE], *branch = &ar->a[LS_ARENA_BRANCH];
    ls_arena *prompt = &ar->a[LS_ARENA_PROMPT], *scratch = &ar->a[LS_ARENA_SCRATCH];
    ls_score_stats st_local;
    if (!stats) stats = &st_local;
    memset(stats, 0, sizeof *stats);
    for (int i = 0; i < g->G; i++) {
        out[i] = ls_arena_alloc(score, (size_t)g->R[i] * sizeof(float)); /* [R_i] */
        if (!out[i]) return LS_ERR_NOMEM;
    }
    int64_t P = g->P;
    double t0 = ls_now();
    if (o->no_capture) {
        for (int i = 0; i < g->G; i++) {
            int64_t R = g->R[i], T = P + R - 1;
            ls_arena_mark mk = ls_arena_get_mark(branch);
            int32_t *ids = ls_arena_alloc(branch, (size_t)T * sizeof(int32_t)); /* [P + R − 1] */
            if (!ids) return LS_ERR_NOMEM;
            memcpy(ids, g->prompt, (size_t)P * sizeof(int32_t));
            memcpy(ids + P, g->resp[i], (size_t)(R - 1) * sizeof(int32_t));
            LS_TRY(ls_hybrid_branch_logprobs(m, NULL, ids, T, P - 1, g->resp[i], out[i], &o->fwd, branch));
            ls_arena_release(branch, mk);
        }
        stats->score_s = ls_now() - t0;
        return LS_OK;
    }
    ls_arena_mark pm = ls_arena_get_mark(prompt);
    ls_prompt_state st;
    LS_TRY(ls_state_init(&st, &m->cfg, P - 1, o->page_size, o->state_dtype, prompt));
    LS_TRY(ls_hybrid_capture(m, &st, g->prompt, P - 1, &o->fwd, scratch));
    stats->capture_s = ls_now() - t0;
    stats->prompt_bytes = prompt->cur - pm.cur;
    t0 = ls_now();
    for (int i = 0; i < g->G; i++) {
        int64_t R = g->R[i];
        ls_arena_mark mk = ls_arena_get_mark(branch);
        int32_t *ids = ls_arena_alloc(branch, (size_t)R * sizeof(int32_t)); /* [x_P, y_1..y_{R−1}] */
        if (!ids) return LS_ERR_NOMEM;
        ids[0] = g->prompt[P - 1];
        memcpy(ids + 1, g->resp[i], (size_t)(R - 1) * sizeof(int32_t));
        LS_TRY(ls_hybrid_branch_logprobs(m, &st, ids, R, 0, g->resp[i], out[i], &o->fwd, branch));
        ls_arena_release(branch, mk);
    }
    stats->score_s = ls_now() - t0;
    ls_arena_release(prompt, pm);
    return LS_OK;
}
