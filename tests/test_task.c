/*
 * test_task.c — the passkey task: exact prompt length, the key where it was put,
 * exact-match reward.
 */
#include <string.h>

#include "longstraw/task.h"
#include "testutil.h"

int test_task_passkey(void);

int test_task_passkey(void) {
    ls_rng r;
    ls_rng_seed(&r, 3);
    static const size_t lens[] = {256, 1000, 65536};
    static const double depths[] = {0.0, 0.5, 1.0, -1.0};
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 4; b++) {
            ls_passkey_item it;
            T_OK(ls_passkey_make(&it, lens[a], depths[b], &r));
            T_CHECK(it.prompt_len == lens[a] && strlen(it.prompt) == lens[a], "length %zu for %zu", it.prompt_len,
                    lens[a]);
            const char *k = strstr(it.prompt, "The pass key is ");
            T_CHECK(k && strncmp(k + 16, it.answer, 5) == 0, "needle with the key");
            T_CHECK(strlen(it.answer) == 5, "five digits");
            /* a sentence is ~20 bytes: the depth is exact to that granularity */
            if (depths[b] >= 0 && lens[a] >= 1000)
                T_CHECK(fabs(it.depth - depths[b]) < 0.05, "depth %.3f for %.1f", it.depth, depths[b]);
            char ok[32], bad1[32], bad2[32];
            snprintf(ok, sizeof ok, "  %s. Done", it.answer);
            snprintf(bad1, sizeof bad1, " %s7", it.answer);
            snprintf(bad2, sizeof bad2, " %.4s", it.answer);
            T_CHECK(ls_passkey_reward(&it, ok, strlen(ok)) == 1.0, "exact match");
            T_CHECK(ls_passkey_reward(&it, bad1, strlen(bad1)) == 0.0, "trailing digit");
            T_CHECK(ls_passkey_reward(&it, bad2, strlen(bad2)) == 0.0, "prefix only");
            T_CHECK(ls_passkey_reward(&it, "", 0) == 0.0, "empty");
            ls_passkey_free(&it);
        }
    ls_passkey_item it;
    T_CHECK(ls_passkey_make(&it, 100, 0.5, &r) != LS_OK && strstr(ls_err_msg(), "256"), "too short rejected");
    T_CHECK(ls_passkey_make(&it, 1000, 1.5, &r) != LS_OK && strstr(ls_err_msg(), "depth"), "bad depth rejected");
    return 0;
}
