/*
 * score.c — the scoring phase over a group (DESIGN §3 steps 1–2): capture the
 * prompt x_1..x_{P−1} once, then each member's branch [x_P, y_1..y_{R−1}] against
 * the read-only state; or the plain full-sequence forward per member. The
 * transaction (grpo.c) scores through the same functions.
 */
#include <math.h>
#include <string.h>

#include "longstraw/score.h"
#include "longstraw/trace.h"

void ls_score_opts_default(ls_score_opts *o) {
    memset(o, 0, sizeof *o);
    o->page_size = 64;
    o->state_dtype = LS_DTYPE_F32;
    ls_fwd_opts_default(&o->fwd);
}

ls_status ls_score_capture(const ls_model *m, const ls_group *g, const ls_score_opts *o, ls_arenas *ar,
                           ls_prompt_state *st) {
    LS_TRY(m->fam->state_init(st, ls_model_config(m), g->P - 1, o->page_size, o->state_dtype, o->fwd.comm,
                              o->fwd.cp_layout, &ar->a[LS_ARENA_PROMPT]));
    if (o->sweep_chunk > 0) LS_TRY(ls_state_enable_full(st, o->sweep_chunk));
    return m->fam->capture(m, st, g->prompt, g->P - 1, &o->fwd, &ar->a[LS_ARENA_SCRATCH]);
}

ls_status ls_score_member_ids(const ls_group *g, int i, int naive, ls_arena *a, int32_t **ids, int64_t *T,
                              int64_t *out_from) {
    int64_t P = g->P, R = g->R[i];
    *T = naive ? P + R - 1 : R;
    *out_from = naive ? P - 1 : 0;
    *ids = ls_arena_host_alloc(a, (size_t)*T * sizeof(int32_t)); /* [T], host memory (family.h) */
    if (!*ids) return LS_ERR_NOMEM;
    if (naive) {
        memcpy(*ids, g->prompt, (size_t)P * sizeof(int32_t));
        memcpy(*ids + P, g->resp[i], (size_t)(R - 1) * sizeof(int32_t));
    } else {
        (*ids)[0] = g->prompt[P - 1];
        memcpy(*ids + 1, g->resp[i], (size_t)(R - 1) * sizeof(int32_t));
    }
    return LS_OK;
}

ls_status ls_score_members(const ls_model *m, const ls_group *g, const ls_prompt_state *st,
                           const ls_score_opts *o, ls_arenas *ar, float **out) {
    ls_arena *br = &ar->a[LS_ARENA_BRANCH];
    ls_status s = LS_OK;
    for (int i = 0; i < g->G && s == LS_OK; i++) {
        ls_trace_set_member(i);
        ls_arena_mark mk = ls_arena_get_mark(br);
        int32_t *ids;
        int64_t T, from;
        s = ls_score_member_ids(g, i, st == NULL, br, &ids, &T, &from);
        if (s == LS_OK)
            s = m->fam->branch_fwd(m, st, ids, T, from, 0, g->resp[i], out[i], NULL, NULL, &o->fwd, NULL,
                                   &ar->a[LS_ARENA_SCRATCH]);
        ls_arena_release(br, mk);
    }
    ls_trace_set_member(-1);
    return s;
}

ls_status ls_score_group(const ls_model *m, const ls_group *g, const ls_score_opts *o, ls_arenas *ar,
                         float **out, ls_score_stats *stats) {
    ls_arena *prompt = &ar->a[LS_ARENA_PROMPT];
    ls_score_stats st_local;
    if (!stats) stats = &st_local;
    memset(stats, 0, sizeof *stats);
    for (int i = 0; i < g->G; i++) {
        out[i] = ls_arena_alloc(&ar->a[LS_ARENA_SCORE], (size_t)g->R[i] * sizeof(float)); /* [R_i] */
        if (!out[i]) return LS_ERR_NOMEM;
    }
    double t0 = ls_now();
    ls_arena_mark pm = ls_arena_get_mark(prompt);
    ls_prompt_state st;
    ls_status s = LS_OK;
    if (!o->no_capture) {
        s = ls_score_capture(m, g, o, ar, &st);
        stats->capture_s = ls_now() - t0;
        stats->prompt_bytes = prompt->cur - pm.cur;
    }
    t0 = ls_now();
    if (s == LS_OK) s = ls_score_members(m, g, o->no_capture ? NULL : &st, o, ar, out);
    stats->score_s = ls_now() - t0;
    ls_arena_release(prompt, pm);
    return s;
}

ls_status ls_score_check_finite(const ls_group *g, float *const *lp) {
    int64_t bad = 0, all = 0;
    int bi = -1;
    int64_t bt = -1;
    for (int i = 0; i < g->G; i++)
        for (int64_t t = 0; t < g->R[i]; t++, all++)
            if (!isfinite(lp[i][t]) && bad++ == 0) bi = i, bt = t;
    if (!bad) return LS_OK;
    return ls_err(LS_ERR_ARG,
                  "the log-prob of member %d (0-based), response token %lld (id %d) is %s: the forward overflowed "
                  "(%lld of %lld log-probs are not finite; the weights or the inputs drive activations beyond the "
                  "float range)",
                  bi, (long long)bt, g->resp[bi][bt], isnan(lp[bi][bt]) ? "NaN" : lp[bi][bt] > 0 ? "+Inf" : "-Inf",
                  (long long)bad, (long long)all);
}
