/*
 * rollout.c — temperature / top-p sampling and generation from a forked prompt state.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/rollout.h"
#include "longstraw/tokenizer.h"
#include "longstraw/trace.h"

void ls_sample_opts_default(ls_sample_opts *o) {
    memset(o, 0, sizeof *o);
    o->temperature = 1.0f;
    o->top_p = 1.0f;
    o->max_new_tokens = 256;
}

/* Heap-sift on indices by descending probability (no malloc, O(V log V) worst case). */
static void sift(int32_t *idx, const float *p, int64_t n, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && p[idx[l]] < p[idx[m]]) m = l;
        if (r < n && p[idx[r]] < p[idx[m]]) m = r;
        if (m == i) return;
        int32_t t = idx[i];
        idx[i] = idx[m];
        idx[m] = t;
        i = m;
    }
}

int32_t ls_sample_token(const float *logits, int64_t V, float top_p, int greedy, ls_rng *rng,
                        float *work, int32_t *iwork, float *logprob) {
    float mx = -INFINITY;
    int32_t arg = 0;
    for (int64_t v = 0; v < V; v++)
        if (logits[v] > mx) mx = logits[v], arg = (int32_t)v;
    double z = 0;
    for (int64_t v = 0; v < V; v++) z += exp((double)(logits[v] - mx));
    double lz = (double)mx + log(z);
    if (greedy) {
        *logprob = (float)((double)logits[arg] - lz);
        return arg;
    }
    float *p = work; /* [V] probabilities */
    for (int64_t v = 0; v < V; v++) p[v] = (float)exp((double)logits[v] - lz);
    double u = ls_rng_uniform(rng);
    int32_t pick = -1;
    if (top_p >= 1.0f) {
        double acc = 0, target = u;
        for (int64_t v = 0; v < V && pick < 0; v++) {
            acc += p[v];
            if (acc > target) pick = (int32_t)v;
        }
    } else {
        /* nucleus: pop tokens by descending probability until the mass reaches top_p
         * (a min-heap over "−p" order built in place: heap of all, extract max) */
        for (int64_t v = 0; v < V; v++) iwork[v] = (int32_t)v;
        /* max-heap by p: sift uses "<" to float the larger up when we negate via order */
        for (int64_t v = 0; v < V; v++) work[v] = -p[v];
        for (int64_t i = V / 2 - 1; i >= 0; i--) sift(iwork, work, V, i);
        int64_t n = V, k = 0;
        double mass = 0;
        while (n > 0 && mass < top_p) { /* move the largest to the end, in order */
            int32_t top = iwork[0];
            iwork[0] = iwork[n - 1];
            iwork[n - 1] = top;
            n--;
            sift(iwork, work, n, 0);
            mass += -work[top];
            k++;
        }
        double target = u * mass, acc = 0;
        for (int64_t j = 0; j < k && pick < 0; j++) {
            int32_t t = iwork[V - 1 - j];
            acc += -work[t];
            if (acc > target) pick = t;
        }
        if (pick < 0) pick = iwork[V - k];
    }
    if (pick < 0) pick = arg; /* rounding at the very end of the mass */
    *logprob = (float)((double)logits[pick] - lz);
    return pick;
}

ls_status ls_generate_group(const ls_model *m, const ls_prompt_state *prompt_state, int32_t last_token,
                            int G, const ls_sample_opts *so, ls_rng *rng, int32_t **out, float **logprobs,
                            int64_t *len, const ls_fwd_opts *fo, ls_arena *branch, ls_arena *scratch) {
    int64_t V = ls_model_config(m)->vocab;
    for (int i = 0; i < G; i++) len[i] = 0;
    if (so->max_new_tokens < 1) return ls_err(LS_ERR_ARG, "max_new_tokens must be >= 1");
    if (G < 1) return ls_err(LS_ERR_ARG, "a group needs at least one member");
    ls_arena_mark mk = ls_arena_get_mark(branch);
    ls_prompt_state *st = ls_arena_host_calloc(branch, (size_t)G, sizeof *st);      /* [G] private forks */
    ls_prompt_state **act = ls_arena_host_alloc(branch, (size_t)G * sizeof *act);   /* [G] the live ones */
    int *who = ls_arena_host_alloc(branch, (size_t)G * sizeof(int));                /* [G] their members */
    int32_t *tok = ls_arena_host_alloc(branch, (size_t)G * sizeof(int32_t));        /* [G] next input */
    float *logits = ls_arena_host_alloc(branch, (size_t)G * (size_t)V * sizeof(float)); /* [G, V] */
    float *work = ls_arena_host_alloc(branch, (size_t)V * sizeof(float));           /* [V] */
    int32_t *iwork = ls_arena_host_alloc(branch, (size_t)V * sizeof(int32_t));      /* [V] */
    int32_t *ys = ls_arena_host_alloc(branch, (size_t)G * sizeof(int32_t));         /* [G] this step's tokens */
    float *yl = ls_arena_host_alloc(branch, (size_t)G * sizeof(float));             /* [G] their log-probs */
    const ls_comm *cp = prompt_state->nranks > 1 ? prompt_state->comm : NULL;
    ls_status s = st && act && who && tok && logits && work && iwork && ys && yl ? LS_OK : LS_ERR_NOMEM;
    for (int i = 0; i < G && s == LS_OK; i++) s = ls_state_fork(&st[i], prompt_state, so->max_new_tokens, branch);
    ls_fwd_opts o = *fo;
    int greedy = so->temperature <= 0;
    o.temperature = greedy ? 1.0f : so->temperature;
    int n = G;
    for (int i = 0; i < G && s == LS_OK; i++) act[i] = &st[i], who[i] = i, tok[i] = last_token;
    for (int64_t t = 0; s == LS_OK && t < so->max_new_tokens && n > 0; t++) {
        s = m->fam->decode(m, act, tok, n, logits, &o, scratch);
        if (s != LS_OK) break;
        for (int64_t k = 0; k < (int64_t)n * V; k++) /* garbage is not a response */
            if (!isfinite(logits[k])) {
                s = ls_err(LS_ERR_ARG, "the model's logits are not finite (%g for token %lld of member %d) at decode step "
                                       "%lld: its forward overflowed (NaN/Inf activations); nothing was sampled",
                           (double)logits[k], (long long)(k % V), who[k / V], (long long)t + 1);
                break;
            }
        if (s != LS_OK) break;
        ls_progress_add(n);
        for (int j = 0; j < n; j++) /* members in order: the RNG is drawn in a fixed order */
            ys[j] = ls_sample_token(logits + (int64_t)j * V, V, so->top_p, greedy, rng, work, iwork, &yl[j]);
        /* under CP every rank drew the same tokens from the same logits; rank 0's are
         * broadcast so that no rounding can ever make the ranks' responses differ */
        if (cp && (s = ls_comm_bcast(cp, ys, (size_t)n * sizeof(int32_t), 0)) == LS_OK)
            s = ls_comm_bcast(cp, yl, (size_t)n * sizeof(float), 0);
        if (s != LS_OK) break;
        int kept = 0;
        for (int j = 0; j < n; j++) {
            int i = who[j];
            float lp = yl[j];
            int32_t y = ys[j];
            out[i][t] = y;
            logprobs[i][t] = lp;
            len[i] = t + 1;
            int stop = 0;
            for (int k = 0; k < so->n_stop; k++) stop |= y == so->stop[k];
            if (!stop) act[kept] = act[j], who[kept] = i, tok[kept] = y, kept++;
        }
        n = kept;
    }
    ls_arena_release(branch, mk);
    return s;
}

ls_status ls_generate(const ls_model *m, const ls_prompt_state *prompt_state, int32_t last_token,
                      const ls_sample_opts *so, ls_rng *rng, int32_t *out, float *logprobs, int64_t *len,
                      const ls_fwd_opts *fo, ls_arena *branch, ls_arena *scratch) {
    return ls_generate_group(m, prompt_state, last_token, 1, so, rng, &out, &logprobs, len, fo, branch, scratch);
}

ls_status ls_stop_tokens_parse(const char *stop, const ls_tokenizer *tok, int64_t vocab, int32_t *ids, int cap,
                               int *n) {
    *n = 0;
    for (const char *p = stop; *p;) {
        size_t len = strcspn(p, ",");
        char tokname[256];
        if (len == 0 || len >= sizeof tokname) return ls_err(LS_ERR_ARG, "--stop: empty or overlong entry in \"%s\"", stop);
        memcpy(tokname, p, len);
        tokname[len] = 0;
        char *end;
        long long id = strtoll(tokname, &end, 10);
        if (*end) id = tok ? ls_tok_token_id(tok, tokname) : -1;
        if (id < 0 || id >= vocab)
            return ls_err(LS_ERR_ARG, "--stop: \"%s\" is neither a token id below %lld nor a token of the tokenizer",
                          tokname, (long long)vocab);
        if (*n == cap) return ls_err(LS_ERR_ARG, "--stop: at most %d stop tokens", cap);
        ids[(*n)++] = (int32_t)id;
        p += len + (p[len] == ',');
    }
    return LS_OK;
}
