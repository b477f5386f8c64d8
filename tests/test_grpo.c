/*
 * test_grpo.c — the update transaction on one rank:
 *  - prefix-frozen gradients (capture + replay) equal the naive mode's (each member's
 *    whole sequence under a tape, prompt detached at the same points) to 4x the float
 *    floor measured in the same run (testutil.h), relative per tensor, dense and MoE,
 *    with ratios clipping both ways and β > 0; full mode likewise;
 *  - the branch arena's peak is the same for G = 2 and G = 8 at the same R, and the
 *    total grows only by the score arena.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "test_family.h"
#include "testutil.h"

int test_grpo_prefix_frozen_vs_naive(void);
int test_grpo_full_vs_naive(void);
int test_grpo_branch_arena_vs_G(void);
int test_grpo_batch_vs_single_groups(void);
int test_grpo_first_ratio_is_one(void);
int test_grpo_nonfinite_reward_std_skips(void);

static const char *cfg_dense =
    "{\"model_type\": \"qwen3_next\", \"vocab_size\": 151, \"hidden_size\": 48, \"num_hidden_layers\": 4,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, \"partial_rotary_factor\": 0.5,"
    " \"rope_theta\": 10000, \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4, \"linear_key_head_dim\": 16,"
    " \"linear_value_head_dim\": 8, \"intermediate_size\": 64, \"num_experts\": 0, \"full_attention_interval\": 2}";
static const char *cfg_moe =
    "{\"model_type\": \"qwen3_5_moe_text\", \"vocab_size\": 151, \"hidden_size\": 48, \"num_hidden_layers\": 3,"
    " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 16, \"linear_num_key_heads\": 2,"
    " \"linear_num_value_heads\": 4, \"linear_key_head_dim\": 8, \"linear_value_head_dim\": 8,"
    " \"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 24,"
    " \"shared_expert_intermediate_size\": 32, \"layer_types\": [\"linear_attention\", \"full_attention\","
    " \"linear_attention\"], \"rope_parameters\": {\"rope_theta\": 10000, \"partial_rotary_factor\": 0.25}}";

static int write_model(const char *dir, const char *text, uint64_t seed) {
    char path[700];
    snprintf(path, sizeof path, "%s/in.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return 1;
    fputs(text, f);
    fclose(f);
    if (ls_hybrid_write_random(path, dir, seed, LS_DTYPE_F32) != LS_OK) {
        fprintf(stderr, "  %s\n", ls_err_msg());
        return 1;
    }
    return 0;
}

/* A random dense model in a fresh DIR, loaded, with zeroed gradient buffers; 0 on success. */
static int dense_model(char *dir, size_t cap, uint64_t seed, ls_arenas *ar, ls_hybrid_model *m, ls_hybrid_model *gr) {
    ls_arenas_init(ar);
    if (t_make_tmpdir(dir, cap) != 0 || write_model(dir, cfg_dense, seed) != 0) return 1;
    if (ls_hybrid_load(m, dir, &ar->a[LS_ARENA_FIXED]) != LS_OK ||
        ls_hybrid_alloc_like(m, gr, &ar->a[LS_ARENA_GRAD]) != LS_OK) {
        fprintf(stderr, "  %s\n", ls_err_msg());
        return 1;
    }
    return 0;
}

/* A group with rewards; P prompt tokens, G members of lengths R[i]. */
static void make_group(ls_group *g, int64_t P, int G, const int64_t *R, int64_t vocab, uint64_t seed) {
    ls_rng r;
    ls_rng_seed(&r, seed);
    memset(g, 0, sizeof *g);
    g->P = P;
    g->G = G;
    g->prompt = malloc((size_t)P * sizeof(int32_t));
    g->resp = calloc((size_t)G, sizeof(int32_t *));
    g->R = calloc((size_t)G, sizeof(int64_t));
    g->rewards = calloc((size_t)G, sizeof(double));
    for (int64_t t = 0; t < P; t++) g->prompt[t] = (int32_t)(ls_rng_u64(&r) % (uint64_t)vocab);
    for (int i = 0; i < G; i++) {
        g->R[i] = R[i];
        g->resp[i] = malloc((size_t)R[i] * sizeof(int32_t));
        for (int64_t t = 0; t < R[i]; t++) g->resp[i][t] = (int32_t)(ls_rng_u64(&r) % (uint64_t)vocab);
        static const double rw[8] = {0.9, 0.1, -0.3, 0.6, 0.2, 0.5, 0.0, 1.0};
        g->rewards[i] = rw[i % 8];
    }
}

/* The worst per-tensor relative difference between two gradient sets (a tensor that is
 * zero in b, e.g. experts never routed to, by its largest absolute difference: both
 * must be exactly zero); NaN is the worst. 0 when the lists match. */
static int worst_tensor(const ls_hybrid_model *a, const ls_hybrid_model *b, double *worst, const char **what) {
    ls_param *p1, *p2;
    int64_t n1, n2;
    if (ls_hybrid_params(a, &p1, &n1) != LS_OK) return 1;
    if (ls_hybrid_params(b, &p2, &n2) != LS_OK) return free(p1), 1;
    int bad = n1 != n2 || n1 == 0;
    *worst = 0;
    for (int64_t k = 0; !bad && k < n1; k++) {
        double nrm = 0;
        for (int64_t i = 0; i < p2[k].n; i++) nrm += (double)p2[k].p[i] * p2[k].p[i];
        double e = nrm > 0 ? t_rel_err_f(p1[k].p, p2[k].p, p1[k].n) : t_max_abs_diff_f(p1[k].p, p2[k].p, p1[k].n);
        if (!(e <= *worst)) {
            *worst = e;
            if (what) *what = p1[k].what;
        }
    }
    free(p1);
    free(p2);
    return bad;
}

/* Capture + replay against naive mode (each member's whole sequence under one tape),
 * prefix-frozen (the prompt detached at the same points in both) or full (nothing
 * detached: the capture's dState, checkpoints and reverse sweep against the whole
 * graph). Full mode cuts the sweep in chunks of 37 (130 captured positions: 3 whole
 * chunks and one of 19) over pages of 7, capture chunks of 50. */
static int modes_vs_naive(int full) {
    const char *cfgs[2] = {cfg_dense, cfg_moe};
    for (int c = 0; c < 2; c++) {
        char dir[512], rdir[600];
        T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
        snprintf(rdir, sizeof rdir, "%s/ref", dir);
        T_CHECK(mkdir(rdir, 0755) == 0, "mkdir");
        T_CHECK(write_model(dir, cfgs[c], 21 + (uint64_t)c) == 0 && write_model(rdir, cfgs[c], 99) == 0, "models");
        ls_arenas ar;
        ls_arenas_init(&ar);
        ls_hybrid_model m, ref, g1, g2;
        T_OK(ls_hybrid_load(&m, dir, &ar.a[LS_ARENA_FIXED]));
        T_OK(ls_hybrid_load(&ref, rdir, &ar.a[LS_ARENA_FIXED]));
        T_OK(ls_hybrid_alloc_like(&m, &g1, &ar.a[LS_ARENA_GRAD]));
        T_OK(ls_hybrid_alloc_like(&m, &g2, &ar.a[LS_ARENA_GRAD]));
        static const int64_t R[4] = {1, 23, 70, 9};
        ls_group g;
        make_group(&g, 131, 4, R, m.cfg.vocab, 5 + (uint64_t)c);
        /* old log-probs = the policy's, perturbed so ratios clip both ways */
        ls_score_opts so;
        ls_score_opts_default(&so);
        float *lp[4];
        T_OK(t_score_group(&m, &g, &so, &ar, lp, NULL));
        g.old_logprobs = calloc(4, sizeof(float *));
        ls_rng r;
        ls_rng_seed(&r, 77);
        for (int i = 0; i < 4; i++) {
            g.old_logprobs[i] = malloc((size_t)R[i] * sizeof(float));
            for (int64_t t = 0; t < R[i]; t++) g.old_logprobs[i][t] = lp[i][t] + (float)(0.3 * ls_rng_normal(&r));
        }
        ls_arena_reset(&ar.a[LS_ARENA_SCORE]);
        ls_grpo_opts o;
        ls_grpo_opts_default(&o);
        o.beta = 0.05;
        o.eps_high = 0.28;
        o.fwd.capture_chunk = 50;
        o.full = full;
        o.sweep_chunk = 37;
        o.page_size = 7;
        ls_grpo_metrics m1, m2;
        T_OK(t_grpo_update(&m, &ref, &g1, NULL, &g, &o, &ar, &m1));
        o.no_capture = 1;
        T_OK(t_grpo_update(&m, &ref, &g2, NULL, &g, &o, &ar, &m2));
        printf("  %s: loss %.6f vs naive %.6f, clip low %.3f high %.3f, kl %.4f, grad norm %.4f\n",
               c ? "MoE" : "dense", m1.loss, m2.loss, m1.clip_low, m1.clip_high, m1.kl, m1.grad_norm);
        T_CHECK(m1.clip_low > 0 && m1.clip_high > 0, "clipping must be active both ways");
        /* The float floor of this model and group, measured here (testutil.h), the worst
         * of: each mode on the policy with every weight one ulp away, and the capture
         * mode with other capture chunks, pages and sweep chunks (sums over ~130
         * positions with cancellation, e.g. A_log's, move by ~1e-5 with the summation
         * order on some machines). */
        ls_hybrid_model mp, gp1, gp2, g3;
        T_OK(ls_hybrid_load(&mp, dir, &ar.a[LS_ARENA_FIXED]));
        T_OK(t_hybrid_perturb(&mp, 31 + (uint64_t)c));
        T_OK(ls_hybrid_alloc_like(&m, &gp1, &ar.a[LS_ARENA_GRAD]));
        T_OK(ls_hybrid_alloc_like(&m, &gp2, &ar.a[LS_ARENA_GRAD]));
        T_OK(ls_hybrid_alloc_like(&m, &g3, &ar.a[LS_ARENA_GRAD]));
        ls_grpo_metrics mp1, mp2, m3;
        o.no_capture = 0;
        T_OK(t_grpo_update(&mp, &ref, &gp1, NULL, &g, &o, &ar, &mp1));
        o.no_capture = 1;
        T_OK(t_grpo_update(&mp, &ref, &gp2, NULL, &g, &o, &ar, &mp2));
        o.no_capture = 0, o.fwd.capture_chunk = 31, o.sweep_chunk = 23, o.page_size = 5;
        T_OK(t_grpo_update(&m, &ref, &g3, NULL, &g, &o, &ar, &m3));
        double fl[3];
        T_CHECK(worst_tensor(&gp1, &g1, &fl[0], NULL) == 0 && worst_tensor(&gp2, &g2, &fl[1], NULL) == 0 &&
                    worst_tensor(&g3, &g1, &fl[2], NULL) == 0,
                "floor");
        T_CHECK(fl[2] <= T_FLOOR_NOISE_MAX, "%s: other chunks move the gradient by %.3e: not rounding", c ? "MoE" : "dense",
                fl[2]);
        double floor = fmax(fl[0], fmax(fl[1], fl[2]));
        /* the loss: its own floor, the same runs'. 8x: one scalar against the worst of
         * three scalar samples scatters more than a worst over thousands of elements
         * (measured up to 2.3x over Prescott, Sandybridge, Haswell, SkylakeX and Zen
         * kernels). min 1e-7: ~10 ulps of a loss near 0.1 */
        double lfloor = fmax(fabs(mp1.loss - m1.loss), fmax(fabs(mp2.loss - m2.loss), fabs(m3.loss - m1.loss)));
        double ltol = t_floor_bound(lfloor, 8, 1e-7 * fmax(1.0, fabs(m2.loss)));
        T_CHECK(fabs(m1.loss - m2.loss) <= ltol, "loss %.9f vs %.9f (bound %.2e: 8x the floor %.2e)", m1.loss, m2.loss,
                ltol, lfloor);
        /* 4x: the tensors this bites are 4-element ones (A_log, dt_bias) whose smallest
         * element carries the largest relative difference; measured up to 1.7x the floor
         * over Prescott, Sandybridge, Haswell, SkylakeX and Zen kernels. min 1e-6: 8
         * float32 epsilons */
        double bound = t_floor_bound(floor, 4, 1e-6);
        double worst = 0;
        const char *what = "";
        T_CHECK(worst_tensor(&g1, &g2, &worst, &what) == 0, "param lists");
        printf("  %s: worst tensor relative error %s vs naive %.2e (%s; %.2fx the floor %.2e: one ulp %.2e / %.2e, "
               "other chunks %.2e; bound %.2e); loss |Δ| %.2e (floor %.2e)\n",
               c ? "MoE" : "dense", full ? "full mode" : "prefix-frozen", worst, what, worst / floor, floor, fl[0], fl[1],
               fl[2], bound, fabs(m1.loss - m2.loss), lfloor);
        T_CHECK(worst <= bound, "%s: tensor %s relative error %.3e > %.2e (4x the floor %.2e)", c ? "MoE" : "dense", what,
                worst, bound, floor);
        ls_group_free(&g);
        ls_arenas_free(&ar);
        T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    }
    return 0;
}

int test_grpo_prefix_frozen_vs_naive(void) { return modes_vs_naive(0); }

/* The exact gradient (issue 11): capture, replay with dState, reverse sweep = the naive
 * full graph to 4x the float floor measured in the same run, per tensor, dense and MoE,
 * clipping both ways, β > 0. */
int test_grpo_full_vs_naive(void) { return modes_vs_naive(1); }

int test_grpo_branch_arena_vs_G(void) {
    char dir[512];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    T_CHECK(write_model(dir, cfg_moe, 3) == 0, "model");
    size_t peak[2][LS_ARENA_COUNT];
    const int Gs[2] = {2, 8};
    for (int k = 0; k < 2; k++) {
        ls_arenas ar;
        ls_arenas_init(&ar);
        ls_hybrid_model m, gr;
        ls_adamw adam;
        T_OK(ls_hybrid_load(&m, dir, &ar.a[LS_ARENA_FIXED]));
        T_OK(t_adamw_init(&adam, &m, &ar.a[LS_ARENA_FIXED]));
        T_OK(ls_hybrid_alloc_like(&m, &gr, &ar.a[LS_ARENA_GRAD]));
        int64_t R[8];
        for (int i = 0; i < 8; i++) R[i] = 40;
        ls_group g;
        make_group(&g, 300, Gs[k], R, m.cfg.vocab, 9);
        ls_grpo_opts o;
        ls_grpo_opts_default(&o);
        ls_grpo_metrics mt;
        T_OK(t_grpo_update(&m, NULL, &gr, &adam, &g, &o, &ar, &mt));
        for (int a = 0; a < LS_ARENA_COUNT; a++) peak[k][a] = ar.a[a].peak;
        ls_group_free(&g);
        ls_arenas_free(&ar);
    }
    size_t tot[2] = {0, 0};
    for (int a = 0; a < LS_ARENA_COUNT; a++) {
        printf("  arena %-8s peak G=2 %10zu  G=8 %10zu\n", ls_arena_id_name((ls_arena_id)a), peak[0][a], peak[1][a]);
        tot[0] += peak[0][a];
        tot[1] += peak[1][a];
        if (a != LS_ARENA_SCORE)
            T_CHECK(peak[0][a] == peak[1][a], "arena %s differs between G=2 and G=8", ls_arena_id_name((ls_arena_id)a));
    }
    T_CHECK(peak[1][LS_ARENA_BRANCH] > 0, "branch arena unused?");
    T_CHECK(tot[1] - tot[0] == peak[1][LS_ARENA_SCORE] - peak[0][LS_ARENA_SCORE] && tot[1] > tot[0],
            "total grows by more than the score arena");
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* Several groups in one update (TRL's batch) against single-group updates: the batch
 * gradient must be the single-group gradients weighted by each group's share of the
 * normaliser — grpo and dr_grpo G_g/N, dapo T_g/T — for scale = group, and with
 * scale = batch the same once each single group is given the batch-scaled advantages
 * (computed here from the rewards: group mean, std over the whole batch, Bessel). */
int test_grpo_batch_vs_single_groups(void) {
    char dir[512];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    T_CHECK(write_model(dir, cfg_dense, 41) == 0, "model");
    ls_arenas ar;
    ls_arenas_init(&ar);
    ls_hybrid_model m, gb, g1;
    T_OK(ls_hybrid_load(&m, dir, &ar.a[LS_ARENA_FIXED]));
    T_OK(ls_hybrid_alloc_like(&m, &gb, &ar.a[LS_ARENA_GRAD]));
    T_OK(ls_hybrid_alloc_like(&m, &g1, &ar.a[LS_ARENA_GRAD]));
    static const int64_t Ra[3] = {5, 12, 3}, Rb[4] = {7, 1, 9, 4};
    ls_group grp[2];
    make_group(&grp[0], 90, 3, Ra, m.cfg.vocab, 31);
    make_group(&grp[1], 57, 4, Rb, m.cfg.vocab, 32);
    grp[1].rewards[0] = 2.5; /* groups with different spreads: batch std differs from each group's */
    ls_param *pb, *p1;
    int64_t np, n1;
    T_OK(ls_hybrid_params(&gb, &pb, &np));
    T_OK(ls_hybrid_params(&g1, &p1, &n1));
    int64_t tot = 0;
    for (int64_t k = 0; k < np; k++) tot += pb[k].n;
    double *want = malloc((size_t)tot * sizeof(double));
    static const ls_loss_type losses[3] = {LS_LOSS_GRPO, LS_LOSS_DAPO, LS_LOSS_DR_GRPO};
    static const char *lname[3] = {"grpo", "dapo", "dr_grpo"};
    double T_g[2] = {5 + 12 + 3, 7 + 1 + 9 + 4}, N = 7;
    for (int li = 0; li < 3; li++) {
        for (int sc = 0; sc < 2; sc++) {
            ls_grpo_opts o;
            ls_grpo_opts_default(&o);
            o.loss = losses[li];
            o.scale = sc ? LS_SCALE_BATCH : LS_SCALE_GROUP;
            o.max_completion_length = 16;
            o.fwd.capture_chunk = 32;
            for (int64_t k = 0; k < np; k++) memset(pb[k].p, 0, (size_t)pb[k].n * sizeof(float));
            ls_grpo_metrics mb, ms;
            T_OK(t_grpo_update_batch(&m, NULL, &gb, NULL, grp, 2, &o, &ar, &mb));
            T_CHECK(!mb.skipped && mb.n_seq == 7, "batch update");
            /* the expectation from single-group updates */
            memset(want, 0, (size_t)tot * sizeof(double));
            double loss = 0, mean_all = 0, var = 0;
            for (int k = 0; k < 2; k++)
                for (int i = 0; i < grp[k].G; i++) mean_all += grp[k].rewards[i] / N;
            for (int k = 0; k < 2; k++)
                for (int i = 0; i < grp[k].G; i++) var += (grp[k].rewards[i] - mean_all) * (grp[k].rewards[i] - mean_all);
            double sd = sqrt(var / (N - 1));
            for (int k = 0; k < 2; k++) {
                ls_group one = grp[k];
                double adv[8];
                if (sc) { /* batch-scaled advantages, given explicitly */
                    double mu = 0;
                    for (int i = 0; i < one.G; i++) mu += one.rewards[i] / one.G;
                    for (int i = 0; i < one.G; i++) adv[i] = (one.rewards[i] - mu) / (sd + 1e-4);
                    one.advantages = adv;
                }
                ls_grpo_opts os = o;
                os.scale = LS_SCALE_GROUP;
                for (int64_t q = 0; q < n1; q++) memset(p1[q].p, 0, (size_t)p1[q].n * sizeof(float));
                T_OK(t_grpo_update(&m, NULL, &g1, NULL, &one, &os, &ar, &ms));
                double share = o.loss == LS_LOSS_DAPO ? T_g[k] / (T_g[0] + T_g[1]) : grp[k].G / N;
                loss += share * ms.loss;
                int64_t off = 0;
                for (int64_t q = 0; q < n1; q++)
                    for (int64_t i = 0; i < p1[q].n; i++) want[off++] += share * p1[q].p[i];
            }
            double num = 0, den = 0;
            int64_t off = 0;
            for (int64_t q = 0; q < np; q++)
                for (int64_t i = 0; i < pb[q].n; i++, off++) {
                    double d = pb[q].p[i] - want[off];
                    num += d * d;
                    den += want[off] * want[off];
                }
            double rel = sqrt(num / den);
            printf("  %-7s scale %-5s: batch vs weighted single-group gradients rel %.2e, loss %.6f vs %.6f (|Δ| %.2e)\n",
                   lname[li], sc ? "batch" : "group", rel, mb.loss, loss, fabs(mb.loss - loss));
            /* not a float floor: both sides run every member through the same kernels, and
             * only the sum of the weighted per-group gradients differs (float in the batch,
             * double here), ~1 float32 epsilon (6.6e-8 .. 8.2e-8 measured with Prescott,
             * Sandybridge, Haswell, SkylakeX and Zen kernels); 1e-5 sits far above that and
             * far below a wrong group weight (1e-2 and more) */
            T_CHECK(den > 0 && rel <= 1e-5, "%s/%s: gradient rel error %.3e", lname[li], sc ? "batch" : "group", rel);
            T_CHECK(fabs(mb.loss - loss) <= 1e-6 * fmax(1.0, fabs(loss)), "%s: loss %.9f vs %.9f", lname[li], mb.loss,
                    loss);
        }
    }
    /* G = 1 is refused: GRPO advantages are relative to the group */
    ls_group lone = grp[0];
    lone.G = 1;
    ls_grpo_opts o;
    ls_grpo_opts_default(&o);
    ls_grpo_metrics mt;
    T_CHECK(t_grpo_update_batch(&m, NULL, &gb, NULL, &lone, 1, &o, &ar, &mt) == LS_ERR_ARG &&
                strstr(ls_err_msg(), "G >= 2"),
            "G = 1 accepted: %s", ls_err_msg());
    free(want);
    free(pb);
    free(p1);
    ls_group_free(&grp[0]);
    ls_group_free(&grp[1]);
    ls_arenas_free(&ar);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* Scoring (no tape) and replay (tape) run the same tokens through the same code path,
 * so at the first iteration every ratio is exactly 1: with ε = 0 nothing may clip.
 * Short responses matter: decoding takes the token-serial delta rule for short spans,
 * a branch must not. */
int test_grpo_first_ratio_is_one(void) {
    char dir[512];
    ls_arenas ar;
    ls_hybrid_model m, gr;
    T_CHECK(dense_model(dir, sizeof dir, 43, &ar, &m, &gr) == 0, "model");
    static const int64_t R[6] = {1, 2, 3, 4, 5, 70};
    ls_group g;
    make_group(&g, 77, 6, R, m.cfg.vocab, 51);
    /* the score phase's old log-probs against the replay's taped forward, member by
     * member: the same bits, so every first-iteration ratio is exactly 1 */
    ls_model h = ls_hybrid_handle(&m);
    ls_score_opts so;
    ls_score_opts_default(&so);
    ls_prompt_state st;
    T_OK(ls_score_capture(&h, &g, &so, &ar, &st));
    float *old[6], lp[70];
    for (int i = 0; i < 6; i++) old[i] = ls_arena_alloc(&ar.a[LS_ARENA_SCORE], (size_t)R[i] * sizeof(float));
    T_OK(ls_score_members(&h, &g, &st, &so, &ar, old));
    int64_t compared = 0;
    for (int i = 0; i < 6; i++) {
        ls_arena *br = &ar.a[LS_ARENA_BRANCH];
        ls_arena_mark mk = ls_arena_get_mark(br);
        int32_t *ids;
        int64_t T, from;
        ls_branch_tape *tape = NULL;
        T_OK(ls_score_member_ids(&g, i, 0, br, &ids, &T, &from));
        T_OK(ls_hybrid_branch_fwd(&m, &st, ids, T, from, from, g.resp[i], lp, NULL, &tape, &so.fwd, br,
                                  &ar.a[LS_ARENA_SCRATCH]));
        for (int64_t t = 0; t < R[i]; t++, compared++)
            T_CHECK(memcmp(&lp[t], &old[i][t], sizeof(float)) == 0 && isfinite(lp[t]),
                    "member %d (R = %lld), token %lld: replayed %.9g, scored %.9g", i, (long long)R[i], (long long)t,
                    lp[t], old[i][t]);
        ls_arena_release(br, mk);
    }
    T_CHECK(compared == 85, "%lld log-probs compared", (long long)compared);
    ls_arena_reset(&ar.a[LS_ARENA_PROMPT]);
    ls_arena_reset(&ar.a[LS_ARENA_SCORE]);
    /* and through the transaction: with ε = 0 any ratio ≠ 1 would clip */
    ls_grpo_opts o;
    ls_grpo_opts_default(&o);
    o.eps_low = o.eps_high = 0;
    ls_grpo_metrics mt;
    T_OK(t_grpo_update(&m, NULL, &gr, NULL, &g, &o, &ar, &mt));
    printf("  %lld replayed log-probs bit-identical to the scored ones; ε = 0: clip low %.3g high %.3g\n",
           (long long)compared, mt.clip_low, mt.clip_high);
    T_CHECK(mt.clip_low == 0 && mt.clip_high == 0, "ratios differ from 1 at the first iteration (clip %g / %g)",
            mt.clip_low, mt.clip_high);
    ls_group_free(&g);
    ls_arenas_free(&ar);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* Rewards whose std overflows (finite rewards, infinite variance) give no usable
 * advantage: the update is marked skipped and the weights are left untouched. */
int test_grpo_nonfinite_reward_std_skips(void) {
    char dir[512];
    ls_arenas ar;
    ls_hybrid_model m, gr;
    T_CHECK(dense_model(dir, sizeof dir, 44, &ar, &m, &gr) == 0, "model");
    static const int64_t R[3] = {3, 4, 5};
    ls_group g;
    make_group(&g, 40, 3, R, m.cfg.vocab, 52);
    g.rewards[0] = 1e308, g.rewards[1] = -1e308, g.rewards[2] = 1e308; /* each finite; (r − mean)² is not */
    ls_adamw adam;
    T_OK(t_adamw_init(&adam, &m, &ar.a[LS_ARENA_FIXED]));
    ls_param *w;
    int64_t nw;
    T_OK(ls_hybrid_params(&m, &w, &nw));
    float before = w[0].p[0], last = w[nw - 1].p[w[nw - 1].n - 1];
    ls_grpo_opts o;
    ls_grpo_opts_default(&o);
    o.lr = 1e-2;
    ls_grpo_metrics mt;
    T_OK(t_grpo_update_batch(&m, NULL, &gr, &adam, &g, 1, &o, &ar, &mt));
    printf("  rewards ±1e308: skipped %d (%s), optimizer step %lld\n", mt.skipped, mt.skip_reason, (long long)adam.step);
    T_CHECK(mt.skipped == 1 && adam.step == 0, "the update was not skipped (step %lld)", (long long)adam.step);
    T_CHECK(w[0].p[0] == before && w[nw - 1].p[w[nw - 1].n - 1] == last, "weights changed");
    free(w);
    ls_group_free(&g);
    ls_arenas_free(&ar);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}
