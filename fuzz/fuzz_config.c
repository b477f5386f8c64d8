/*
 * fuzz_config.c — libFuzzer harness for the config.json reader (ls_config_parse).
 * Input: the bytes of a config.json (NUL-terminated copy). Oracles: a rejection
 * names the file; an accepted config satisfies the ranges config.c promises.
 */
#include <stddef.h>
#include <stdint.h>

#include "fuzz_common.h"
#include "longstraw/config.h"

#define NAME "fuzz/config.json"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_strndup(data, size);
    ls_config c;
    ls_status s = ls_config_parse(&c, text, NAME);
    if (s != LS_OK) {
        fuzz_check_rejection(s, NAME);
    } else {
        FUZZ_CHECK(c.n_layers >= 1 && c.n_layers <= LS_MAX_LAYERS, "n_layers %lld", (long long)c.n_layers);
        FUZZ_CHECK(c.vocab >= 1 && c.hidden >= 1, "vocab %lld hidden %lld", (long long)c.vocab,
                   (long long)c.hidden);
        FUZZ_CHECK(c.n_heads >= 1 && c.n_kv >= 1 && c.n_heads % c.n_kv == 0, "heads %d kv %d", c.n_heads,
                   c.n_kv);
        FUZZ_CHECK(c.H_k >= 1 && c.H_v % c.H_k == 0, "H_k %d H_v %d", c.H_k, c.H_v);
        FUZZ_CHECK(c.rot_dim >= 0 && c.rot_dim <= c.head_dim && c.rot_dim % 2 == 0, "rot_dim %d head_dim %d",
                   c.rot_dim, c.head_dim);
        FUZZ_CHECK(c.eps >= 0.0f && c.eps <= 1.0f, "eps %g", (double)c.eps);
        FUZZ_CHECK(ls_cfg_count_kind(&c, LS_LAYER_GDN) + ls_cfg_count_kind(&c, LS_LAYER_ATTN) == c.n_layers,
                   "layer kinds do not add up");
        for (int64_t i = 0; i < c.n_layers; i++) {
            FUZZ_CHECK(c.moe[i] <= 1, "moe[%lld] = %d", (long long)i, c.moe[i]);
            FUZZ_CHECK(c.moe[i] || c.intermediate > 0, "dense layer %lld without intermediate_size", (long long)i);
            FUZZ_CHECK(!c.moe[i] || (c.n_experts > 0 && c.top_k <= c.n_experts), "moe layer %lld: %d of %d experts",
                       (long long)i, c.top_k, c.n_experts);
        }
    }
    free(text);
    return 0;
}
