/*
 * fuzz_group.c — libFuzzer harness for the GRPO group reader (ls_group_parse), the
 * reader of one group file / one JSONL line. Vocabulary of 1000 ids.
 * Oracles: a rejection names the file; an accepted group has G >= 1 responses,
 * non-empty id arrays with every id in [0, vocab), and finite optional fields.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "fuzz_common.h"
#include "longstraw/group.h"

#define NAME "fuzz/group.jsonl"
#define VOCAB 1000

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_ids(const int32_t *ids, int64_t n, const char *what) {
    FUZZ_CHECK(n >= 1 && ids, "%s: %lld ids", what, (long long)n);
    for (int64_t i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < VOCAB, "%s[%lld] = %d", what, (long long)i, ids[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_strndup(data, size);
    ls_group g;
    ls_status s = ls_group_parse(&g, text, NAME, VOCAB);
    if (s != LS_OK) {
        fuzz_check_rejection(s, NAME);
        /* ls_group_parse frees a partial group on failure and zeroes it */
        FUZZ_CHECK(!g.prompt && !g.resp && !g.R && !g.rewards && !g.advantages && !g.old_logprobs,
                   "a rejected group was not cleared");
    } else {
        check_ids(g.prompt, g.P, "prompt");
        FUZZ_CHECK(g.G >= 1 && g.resp && g.R, "G = %d", g.G);
        for (int i = 0; i < g.G; i++) {
            check_ids(g.resp[i], g.R[i], "response");
            if (g.old_logprobs)
                for (int64_t t = 0; t < g.R[i]; t++)
                    FUZZ_CHECK(isfinite(g.old_logprobs[i][t]), "old_logprobs[%d][%lld] = %g", i, (long long)t,
                               (double)g.old_logprobs[i][t]);
            if (g.rewards) FUZZ_CHECK(isfinite(g.rewards[i]), "rewards[%d]", i);
            if (g.advantages) FUZZ_CHECK(isfinite(g.advantages[i]), "advantages[%d]", i);
        }
    }
    ls_group_free(&g);
    free(text);
    return 0;
}
