/*
 * test_task.c — the built-in tasks: exact prompt length, the needles where they were
 * put, held-out answers apart from training ones, exact-match and shaped rewards.
 */
#include <string.h>

#include "longstraw/task.h"
#include "testutil.h"

int test_task_passkey(void);
int test_task_kinds(void);

int test_task_passkey(void) {
    ls_rng r;
    ls_rng_seed(&r, 3);
    ls_task t;
    T_OK(ls_task_parse(&t, "passkey", NULL));
    static const size_t lens[] = {300, 1000, 65536};
    static const double depths[] = {0.0, 0.5, 1.0, -1.0};
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 4; b++) {
            ls_task_item it;
            T_OK(ls_task_make(&t, &it, lens[a], depths[b], (int)(b & 1), &r));
            T_CHECK(it.prompt_len == lens[a] && strlen(it.prompt) == lens[a], "length %zu for %zu", it.prompt_len,
                    lens[a]);
            const char *k = strstr(it.prompt, "The pass key is ");
            T_CHECK(k && strncmp(k + 16, it.answer, 5) == 0, "needle with the key");
            T_CHECK(strlen(it.answer) == 5, "five digits");
            T_CHECK(ls_task_held_out(it.answer) == (int)(b & 1), "answer %s in the %s part", it.answer,
                    b & 1 ? "held-out" : "training");
            /* a sentence is ~20 bytes: the depth is exact to that granularity */
            if (depths[b] >= 0 && lens[a] >= 1000)
                T_CHECK(fabs(it.depth - depths[b]) < 0.05, "depth %.3f for %.1f", it.depth, depths[b]);
            char ok[32], bad1[32], bad2[32];
            snprintf(ok, sizeof ok, "  %s. Done", it.answer);
            snprintf(bad1, sizeof bad1, " %s7", it.answer);
            snprintf(bad2, sizeof bad2, " %.4s", it.answer);
            T_CHECK(ls_task_exact(&t, &it, ok, strlen(ok)) == 1.0, "exact match");
            T_CHECK(ls_task_exact(&t, &it, bad1, strlen(bad1)) == 0.0, "trailing digit");
            T_CHECK(ls_task_exact(&t, &it, bad2, strlen(bad2)) == 0.0, "prefix only");
            T_CHECK(ls_task_exact(&t, &it, "", 0) == 0.0, "empty");
            double sh = ls_task_score(&t, &it, bad2, strlen(bad2));
            T_CHECK(sh > 0.3 && sh < 0.5, "shaped credit %g for four of five digits", sh);
            ls_task_item_free(&it);
        }
    ls_task_item it;
    T_CHECK(ls_task_make(&t, &it, 100, 0.5, 0, &r) != LS_OK && strstr(ls_err_msg(), "256"), "too short rejected");
    T_CHECK(ls_task_make(&t, &it, 1000, 1.5, 0, &r) != LS_OK && strstr(ls_err_msg(), "depth"), "bad depth rejected");
    return 0;
}

/* The held-out part is about 1/8 of the answers, and no training draw lands in it. */
static int count_held_out(void) {
    char key[8];
    int held = 0;
    for (int k = 10000; k < 100000; k++) {
        snprintf(key, sizeof key, "%05d", k);
        held += ls_task_held_out(key);
    }
    T_CHECK(held > 90000 / 8 - 1500 && held < 90000 / 8 + 1500, "%d of 90000 keys held out", held);
    return 0;
}

int test_task_kinds(void) {
    if (count_held_out()) return 1;
    ls_task t;
    T_CHECK(ls_task_parse(&t, "vartrack-shaped", "varied") == LS_OK && t.kind == LS_TASK_VARTRACK && t.shaped &&
                t.haystack == LS_HAY_VARIED, "vartrack-shaped on varied text");
    T_CHECK(ls_task_parse(&t, "needle", NULL) != LS_OK && strstr(ls_err_msg(), "needle") && strstr(ls_err_msg(), "multikey"),
            "unknown task named with the known ones");
    T_CHECK(ls_task_parse(&t, "passkey", "essays") != LS_OK && strstr(ls_err_msg(), "essays"), "unknown haystack named");
    ls_rng r;
    ls_rng_seed(&r, 11);
    for (int hay = 0; hay < 2; hay++)
        for (int rep = 0; rep < 8; rep++) {
            double depth = rep / 7.0;
            /* multi-key: four distinct keys under four words, the asked one at the depth */
            T_OK(ls_task_parse(&t, "multikey", hay ? "varied" : "repeat"));
            ls_task_item it;
            T_OK(ls_task_make(&t, &it, 4000, depth, rep & 1, &r));
            T_CHECK(it.prompt_len == 4000, "multikey length %zu", it.prompt_len);
            int needles = 0;
            for (const char *p = it.prompt; (p = strstr(p, "The pass key for ")); p++) needles++;
            T_CHECK(needles == 5, "4 needles + the question, found %d", needles); /* the question repeats the phrase */
            const char *q = strstr(it.prompt, "What is the pass key for ");
            T_CHECK(q, "the question");
            char word[32], probe[160];
            T_CHECK(sscanf(q + 25, "%31[a-z]", word) == 1, "asked word");
            snprintf(probe, sizeof probe, "The pass key for %s is %s.", word, it.answer);
            const char *at = strstr(it.prompt, probe);
            T_CHECK(at && at < q, "the asked needle %s holds the answer", probe);
            T_CHECK(fabs(it.depth - depth) < 0.05, "depth %.3f for %.3f", it.depth, depth);
            T_CHECK(ls_task_held_out(it.answer) == (rep & 1), "held-out part");
            if (hay) T_CHECK(!strstr(it.prompt, "The grass is green"), "varied text has no filler");
            ls_task_item_free(&it);
            /* variable tracking: the chain in order, the answer lists it */
            T_OK(ls_task_parse(&t, "vartrack", hay ? "varied" : "repeat"));
            T_OK(ls_task_make(&t, &it, 3000, depth, rep & 1, &r));
            T_CHECK(it.prompt_len == 3000 && strlen(it.answer) == 11, "vartrack length %zu, answer \"%s\"", it.prompt_len,
                    it.answer);
            char value[8], n0[4], n1[4], n2[4];
            const char *qv = strstr(it.prompt, "hold the value ");
            T_CHECK(qv && sscanf(qv + 15, "%5[0-9]", value) == 1, "asked value");
            T_CHECK(sscanf(it.answer, "%3s %3s %3s", n0, n1, n2) == 3, "three names");
            char s0[32], s1[32], s2[32];
            snprintf(s0, sizeof s0, "Assign %s to %s.", value, n0);
            snprintf(s1, sizeof s1, "Assign %s to %s.", n0, n1);
            snprintf(s2, sizeof s2, "Assign %s to %s.", n1, n2);
            const char *p0 = strstr(it.prompt, s0), *p1 = strstr(it.prompt, s1), *p2 = strstr(it.prompt, s2);
            T_CHECK(p0 && p1 && p2 && p0 < p1 && p1 < p2 && p2 < qv, "the chain in order");
            T_CHECK(fabs(it.depth - depth) < 0.05, "depth %.3f for %.3f", it.depth, depth);
            char ok[64], extra[64], part[64];
            snprintf(ok, sizeof ok, " %s.\nmore", it.answer);
            snprintf(extra, sizeof extra, " %s QQQ", it.answer);
            snprintf(part, sizeof part, " %s %s XYZ", n0, n1);
            T_CHECK(ls_task_exact(&t, &it, ok, strlen(ok)) == 1.0, "vartrack exact");
            T_CHECK(ls_task_exact(&t, &it, extra, strlen(extra)) == 0.0, "an extra name is wrong");
            T_CHECK(ls_task_exact(&t, &it, part, strlen(part)) == 0.0, "a wrong name is wrong");
            double sh = ls_task_score(&t, &it, part, strlen(part));
            T_CHECK(fabs(sh - 0.3) < 1e-12, "two of three names: shaped %g", sh);
            T_CHECK(ls_task_reward(&t, &it, part, strlen(part)) == 0.0, "exact reward");
            ls_task_item_free(&it);
        }
    return 0;
}
