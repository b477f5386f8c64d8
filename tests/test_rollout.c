/*
 * test_rollout.c — sampling from a captured prompt state: every sampled token's
 * log-prob equals what scoring (capture + branch) computes for it afterwards; the
 * prompt state is left untouched by the members' forks (pages shared read-only,
 * the partial last page copied); greedy and top-p → 0 agree; stop tokens stop.
 * Sample-time vs scored log-probs are two float32 schedules: the bound is 4x a floor
 * measured in the same run (testutil.h).
 */
#include <stdlib.h>
#include <string.h>

#include "longstraw/rollout.h"
#include "test_family.h"
#include "testutil.h"

int test_rollout_sample_vs_score(void);
int test_rollout_decode_batch(void);

static uint64_t state_hash(const ls_prompt_state *st) {
    const ls_config *c = st->cfg;
    uint64_t h = 1469598103934665603ull;
    size_t pb = (size_t)st->page_size * (size_t)c->n_kv * (size_t)c->head_dim * ls_dtype_size(st->dtype);
    const ls_hybrid_config *hc = ls_hybrid_cfg(c);
    size_t rec = (size_t)hc->H_v * (size_t)hc->d_k * (size_t)hc->d_v * 4;
    for (int64_t l = 0; l < c->n_layers; l++) {
        const unsigned char *bufs[2];
        size_t lens[2];
        int nb = 0;
        if (c->kind[l] == LS_LAYER_ATTN) {
            for (int64_t p = 0; p < st->n_pages; p++) {
                const unsigned char *k = st->attn[l].k_pages[p], *v = st->attn[l].v_pages[p];
                for (size_t i = 0; i < pb; i++) h = (h ^ k[i]) * 1099511628211ull;
                for (size_t i = 0; i < pb; i++) h = (h ^ v[i]) * 1099511628211ull;
            }
        } else {
            bufs[nb] = (const unsigned char *)st->gdn[l].S, lens[nb++] = rec;
        }
        for (int b = 0; b < nb; b++)
            for (size_t i = 0; i < lens[b]; i++) h = (h ^ bufs[b][i]) * 1099511628211ull;
    }
    return h ^ (uint64_t)st->n;
}

/* A fixture's model (fixed arena of fresh arenas) and its group.json. */
static int load_fixture(const char *name, ls_arenas *ar, ls_hybrid_model *m, ls_group *g) {
    char dir[1024], path[1200];
    snprintf(dir, sizeof dir, "%s/tests/reference/fixtures/%s", LS_SOURCE_DIR, name);
    ls_arenas_init(ar);
    snprintf(path, sizeof path, "%s/group.json", dir);
    if (ls_hybrid_load(m, dir, &ar->a[LS_ARENA_FIXED]) != LS_OK || ls_group_load(g, path, m->cfg.vocab) != LS_OK) {
        fprintf(stderr, "  %s: %s\n", name, ls_err_msg());
        return 1;
    }
    return 0;
}

/* The float floor of scoring group r (testutil.h): its scored log-probs sc (model m,
 * options so) against the same scoring on mp (every weight one ulp away), and on m with
 * capture chunks of 16 over pages of 7 (held under T_FLOOR_NOISE_MAX); the worst over
 * every member, or -1 when a run fails or the chunks move log-probs by more than rounding. */
static double score_floor(const ls_hybrid_model *m, const ls_hybrid_model *mp, const ls_group *r,
                          const ls_score_opts *so, ls_arenas *ar, float **sc) {
    float *alt[8];
    double f = 0;
    if (r->G > 8) return -1;
    for (int v = 0; v < 2; v++) {
        ls_score_opts o = *so;
        if (v) o.fwd.capture_chunk = 16, o.page_size = 7;
        if (t_score_group(v ? m : mp, r, &o, ar, alt, NULL) != LS_OK) return -1;
        for (int i = 0; i < r->G; i++) {
            double d = t_max_abs_diff_f(alt[i], sc[i], r->R[i]);
            if (v && !(d <= T_FLOOR_NOISE_MAX)) return -1;
            if (!(d <= f)) f = d;
        }
    }
    return f;
}

/* The fixture's model again (fixed arena of ar), every weight one ulp away. */
static int load_perturbed(const char *name, ls_arenas *ar, ls_hybrid_model *mp) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/reference/fixtures/%s", LS_SOURCE_DIR, name);
    T_OK(ls_hybrid_load(mp, dir, &ar->a[LS_ARENA_FIXED]));
    T_OK(t_hybrid_perturb(mp, 77));
    return 0;
}

int test_rollout_sample_vs_score(void) {
    static const char *names[] = {"next_moe", "q35_dense"};
    for (int f = 0; f < 2; f++) {
        ls_arenas ar;
        ls_hybrid_model m;
        ls_group g;
        T_CHECK(load_fixture(names[f], &ar, &m, &g) == 0, "%s", names[f]);
        ls_hybrid_model mp; /* every weight one ulp away: the float floor's model */
        T_CHECK(load_perturbed(names[f], &ar, &mp) == 0, "%s", names[f]);
        ls_model mh = ls_hybrid_handle(&m);
        ls_fwd_opts fo;
        ls_fwd_opts_default(&fo);
        ls_prompt_state st;
        T_OK(ls_state_init(&st, &m.cfg, g.P - 1, 7, LS_DTYPE_F32, NULL, LS_CP_CONTIGUOUS, &ar.a[LS_ARENA_PROMPT])); /* 129 = 18·7 + 3 */
        T_OK(ls_hybrid_capture(&m, &st, g.prompt, g.P - 1, &fo, &ar.a[LS_ARENA_SCRATCH]));
        uint64_t h0 = state_hash(&st);
        enum { N = 24 };
        static const float temps[4] = {0.0f, 1.0f, 0.8f, 1.3f};
        static const float tops[4] = {1.0f, 1.0f, 0.9f, 1e-7f};
        int32_t out[4][N];
        float lp[4][N];
        int64_t len[4];
        double d[4], floor = 0;
        ls_rng rng;
        ls_rng_seed(&rng, 11);
        for (int k = 0; k < 4; k++) {
            ls_sample_opts so;
            ls_sample_opts_default(&so);
            so.temperature = temps[k];
            so.top_p = tops[k];
            so.max_new_tokens = N;
            T_OK(ls_generate(&mh, &st, g.prompt[g.P - 1], &so, &rng, out[k], lp[k], &len[k], &fo,
                             &ar.a[LS_ARENA_BRANCH], &ar.a[LS_ARENA_SCRATCH]));
            T_CHECK(len[k] == N, "length %lld", (long long)len[k]);
            T_CHECK(state_hash(&st) == h0, "%s: generation wrote into the prompt state", names[f]);
            T_CHECK(ar.a[LS_ARENA_BRANCH].cur == 0, "branch arena not released");
            /* score the sampled response at the same temperature (greedy: τ = 1) */
            ls_group r;
            memset(&r, 0, sizeof r);
            r.P = g.P;
            r.prompt = g.prompt;
            r.G = 1;
            int32_t *resp = out[k];
            int64_t R = len[k];
            r.resp = &resp;
            r.R = &R;
            ls_score_opts so2;
            ls_score_opts_default(&so2);
            so2.fwd.temperature = temps[k] > 0 ? temps[k] : 1.0f;
            float *sc[1];
            T_OK(t_score_group(&m, &r, &so2, &ar, sc, NULL));
            d[k] = t_max_abs_diff_f(lp[k], sc[0], R);
            double fk = score_floor(&m, &mp, &r, &so2, &ar, sc);
            T_CHECK(fk >= 0, "%s: the floor's scoring failed or is not rounding", names[f]);
            floor = fk > floor ? fk : floor;
            printf("  %-9s τ=%.1f top-p=%g: %lld tokens, max |sample-time logprob − scored| = %.2e (floor %.2e)\n",
                   names[f], (double)temps[k], (double)tops[k], (long long)R, d[k], fk);
            ls_arena_reset(&ar.a[LS_ARENA_SCORE]);
        }
        /* decoding token by token and scoring the response as one branch are two float32
         * schedules: 4x the floor of the scored log-probs (measured 0.2–1.35x it over
         * Prescott, Sandybridge, Haswell, SkylakeX and Zen kernels, 2.0e-5 at most with
         * Sandybridge's; a sampled group up to 1.5x). min 1e-6: two ulps of a log-prob in
         * [4, 8) */
        double tol = t_floor_bound(floor, 4, 1e-6);
        for (int k = 0; k < 4; k++)
            T_CHECK(d[k] <= tol, "%s τ=%.1f: sampled vs scored log-probs differ by %.3e > %.2e (4x the floor %.2e)",
                    names[f], (double)temps[k], d[k], tol, floor);
        /* top-p → 0 keeps only the most likely token: the greedy sequence */
        T_CHECK(memcmp(out[0], out[3], sizeof out[0]) == 0, "%s: top-p 1e-7 differs from greedy", names[f]);
        /* a stop token ends the response, kept as its last token */
        ls_sample_opts so;
        ls_sample_opts_default(&so);
        so.temperature = 0;
        so.max_new_tokens = N;
        int32_t stop = out[0][5];
        so.stop = &stop;
        so.n_stop = 1;
        int32_t o2[N];
        float l2[N];
        int64_t n2;
        T_OK(ls_generate(&mh, &st, g.prompt[g.P - 1], &so, &rng, o2, l2, &n2, &fo, &ar.a[LS_ARENA_BRANCH],
                         &ar.a[LS_ARENA_SCRATCH]));
        int64_t first = 0;
        while (out[0][first] != stop) first++;
        T_CHECK(n2 == first + 1 && o2[n2 - 1] == stop, "stop token: length %lld, expected %lld", (long long)n2,
                (long long)first + 1);
        ls_group_free(&g);
        ls_arenas_free(&ar);
    }
    return 0;
}

/* Batched decode (ls_hybrid_decode) against one sequence at a time: three forks of
 * one captured state are fed different tokens for 20 steps (teacher forcing), as one
 * batch and each alone with ls_hybrid_extend — the logits must agree, so no row reads
 * another member's conv tail, delta-rule state, K/V pages or position. Then a group
 * sampled with ls_generate_group: every member's sample-time log-probs equal scoring
 * its own response, and members that stop leave the batch without disturbing the rest. */
int test_rollout_decode_batch(void) {
    static const char *names[] = {"next_moe", "q35_dense"};
    for (int f = 0; f < 2; f++) {
        ls_arenas ar;
        ls_hybrid_model m;
        ls_group g;
        T_CHECK(load_fixture(names[f], &ar, &m, &g) == 0, "%s", names[f]);
        ls_hybrid_model mp; /* every weight one ulp away: the float floor's model */
        T_CHECK(load_perturbed(names[f], &ar, &mp) == 0, "%s", names[f]);
        ls_model mh = ls_hybrid_handle(&m);
        ls_fwd_opts fo;
        ls_fwd_opts_default(&fo);
        fo.temperature = 0.9f;
        ls_prompt_state st;
        T_OK(ls_state_init(&st, &m.cfg, g.P - 1, 7, LS_DTYPE_BF16, NULL, LS_CP_CONTIGUOUS, &ar.a[LS_ARENA_PROMPT]));
        T_OK(ls_hybrid_capture(&m, &st, g.prompt, g.P - 1, &fo, &ar.a[LS_ARENA_SCRATCH]));
        enum { NB = 3, STEPS = 20 };
        int64_t V = m.cfg.vocab;
        ls_arena *br = &ar.a[LS_ARENA_BRANCH];
        ls_prompt_state a[NB], b[NB];
        ls_prompt_state *pa[NB];
        for (int i = 0; i < NB; i++) {
            T_OK(ls_state_fork(&a[i], &st, STEPS, br));
            T_OK(ls_state_fork(&b[i], &st, STEPS, br));
            pa[i] = &a[i];
        }
        float *lb = malloc((size_t)(NB * V) * sizeof(float)), *l1 = malloc((size_t)V * sizeof(float));
        double worst = 0;
        for (int t = 0; t < STEPS; t++) {
            int32_t ids[NB];
            for (int i = 0; i < NB; i++) ids[i] = t == 0 ? g.prompt[g.P - 1] : (int32_t)((t * 17 + i * 29 + 3) % V);
            T_OK(ls_hybrid_decode(&m, pa, ids, NB, lb, &fo, &ar.a[LS_ARENA_SCRATCH]));
            for (int i = 0; i < NB; i++) {
                T_OK(ls_hybrid_extend(&m, &b[i], &ids[i], 1, l1, &fo, &ar.a[LS_ARENA_SCRATCH]));
                double d = t_max_abs_diff_f(lb + i * V, l1, V);
                if (!(d <= worst)) worst = d;
            }
        }
        printf("  %-9s batched decode of %d sequences vs one at a time, %d steps: max |Δlogit| = %.2e\n", names[f],
               NB, STEPS, worst);
        T_CHECK(worst <= 1e-4, "%s: batched vs single decode %.3e", names[f], worst);
        free(lb);
        free(l1);
        ls_arena_reset(br);
        /* a sampled group, one member stopping early; f32 pages, as scoring keeps a
         * branch's own K/V in f32 (bf16 pages would round the sampled tokens' K/V) */
        T_OK(ls_state_init(&st, &m.cfg, g.P - 1, 7, LS_DTYPE_F32, NULL, LS_CP_CONTIGUOUS, &ar.a[LS_ARENA_PROMPT]));
        T_OK(ls_hybrid_capture(&m, &st, g.prompt, g.P - 1, &fo, &ar.a[LS_ARENA_SCRATCH]));
        enum { G = 5, N = 16 };
        int32_t ob[G][N], *out[G];
        float lpb[G][N], *lps[G];
        int64_t len[G];
        for (int i = 0; i < G; i++) out[i] = ob[i], lps[i] = lpb[i];
        ls_sample_opts so;
        ls_sample_opts_default(&so);
        so.temperature = 1.1f;
        so.max_new_tokens = N;
        int32_t stop = 5;
        so.stop = &stop;
        so.n_stop = 1;
        ls_rng rng;
        ls_rng_seed(&rng, 3);
        T_OK(ls_generate_group(&mh, &st, g.prompt[g.P - 1], G, &so, &rng, out, lps, len, &fo, br,
                               &ar.a[LS_ARENA_SCRATCH]));
        T_CHECK(br->cur == 0, "branch arena not released");
        ls_group r;
        memset(&r, 0, sizeof r);
        r.P = g.P;
        r.prompt = g.prompt;
        r.G = G;
        r.resp = out;
        r.R = len;
        ls_score_opts sco;
        ls_score_opts_default(&sco);
        sco.fwd.temperature = 1.1f;
        float *sc[G];
        T_OK(t_score_group(&m, &r, &sco, &ar, sc, NULL));
        double floor = score_floor(&m, &mp, &r, &sco, &ar, sc); /* as in rollout_sample_vs_score */
        T_CHECK(floor >= 0, "%s: the floor's scoring failed or is not rounding", names[f]);
        double tol = t_floor_bound(floor, 4, 1e-6), worst_s = 0;
        int differ = 0;
        for (int i = 0; i < G; i++) {
            T_CHECK(len[i] == N || out[i][len[i] - 1] == stop, "member %d: length %lld without a stop", i, (long long)len[i]);
            double d = t_max_abs_diff_f(lpb[i], sc[i], len[i]);
            T_CHECK(d <= tol, "%s member %d: sampled vs scored %.3e > %.2e (4x the floor %.2e)", names[f], i, d, tol, floor);
            worst_s = d > worst_s ? d : worst_s;
            differ |= i > 0 && (len[i] != len[0] || memcmp(ob[i], ob[0], (size_t)len[0] * sizeof(int32_t)) != 0);
        }
        printf("  %-9s a sampled group of %d: max |sample-time logprob − scored| = %.2e (floor %.2e, bound %.2e)\n",
               names[f], G, worst_s, floor, tol);
        T_CHECK(differ, "%s: all members sampled the same response", names[f]);
        ls_group_free(&g);
        ls_arenas_free(&ar);
    }
    return 0;
}
