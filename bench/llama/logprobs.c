/*
 * bench/llama/logprobs.c — log p(ids[t] | ids[<t]) under llama.cpp for t >= START, one per
 * line: the check that the GGUF written by to_gguf.py is the same model LongStraw runs.
 * Built by bench/llama/compare.sh against a llama.cpp build (not part of LongStraw's build).
 *
 *   logprobs MODEL.gguf START THREADS < ids.txt   (whitespace-separated token ids)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: logprobs MODEL.gguf START THREADS < ids.txt\n");
        return 2;
    }
    int start = atoi(argv[2]), threads = atoi(argv[3]);
    int n = 0, cap = 1024;
    llama_token *ids = malloc(sizeof *ids * (size_t)cap);
    int v;
    while (scanf("%d", &v) == 1) {
        if (n == cap) ids = realloc(ids, sizeof *ids * (size_t)(cap *= 2));
        ids[n++] = v;
    }
    if (n < 2 || start < 1 || start >= n) {
        fprintf(stderr, "logprobs: %d ids, START %d: need 1 <= START < n\n", n, start);
        return 2;
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "logprobs: cannot load %s\n", argv[1]);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n;
    cp.n_batch = (uint32_t)n;
    cp.n_ubatch = 512;
    cp.n_threads = cp.n_threads_batch = threads;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "logprobs: cannot create a context\n");
        return 1;
    }
    int V = llama_vocab_n_tokens(llama_model_get_vocab(model));
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = ids[i];
        b.pos[i] = i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = i >= start - 1 && i < n - 1;
    }
    b.n_tokens = n;
    if (llama_decode(ctx, b)) {
        fprintf(stderr, "logprobs: llama_decode failed\n");
        return 1;
    }
    for (int t = start; t < n; t++) {
        const float *z = llama_get_logits_ith(ctx, t - 1);
        double m = z[0], s = 0;
        for (int j = 1; j < V; j++)
            if (z[j] > m) m = z[j];
        for (int j = 0; j < V; j++) s += exp(z[j] - m);
        printf("%.9g\n", z[ids[t]] - m - log(s));
    }
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
