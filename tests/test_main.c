/*
 * test_main.c — runs registered tests by name (see test_list.h).
 * Exit status: 1 when any test fails or when no test ran; 77 (CTest's
 * SKIP_RETURN_CODE) when every test that ran was skipped (T_SKIP); else 0.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/comm.h"
#include "longstraw/core.h"
#include "longstraw/runtime.h"
#include "testutil.h"

#define LS_TEST_ENTRY(name) int test_##name(void);
#include "test_list.h"
#undef LS_TEST_ENTRY

typedef struct {
    const char *name;
    int (*fn)(void);
} test_entry;

static const test_entry tests[] = {
#define LS_TEST_ENTRY(name) {#name, test_##name},
#include "test_list.h"
#undef LS_TEST_ENTRY
};

int main(int argc, char **argv) {
    ls_runtime_setup(argv);
    int n = (int)(sizeof tests / sizeof tests[0]);
    int ran = 0, failed = 0, skipped = 0;
    const char *threads = getenv("LS_TEST_THREADS");
    ls_set_threads(threads ? atoi(threads) : 0);
    for (int i = 0; i < n; i++) {
        int want = argc < 2;
        for (int j = 1; j < argc; j++)
            if (strcmp(argv[j], tests[i].name) == 0) want = 1;
        if (!want) continue;
        double t0 = ls_now();
        int rc = tests[i].fn();
        ran++;
        if (rc == T_SKIP_CODE) skipped++;
        else if (rc) failed++;
        printf("%-32s %s (%.2fs)\n", tests[i].name, rc == T_SKIP_CODE ? "skipped" : rc ? "FAILED" : "ok",
               ls_now() - t0);
        fflush(stdout);
    }
    ls_comm_finalize(); /* a no-op unless a test started the world */
    if (argc >= 2 && ran != argc - 1) {
        fprintf(stderr, "unknown test name among the arguments\n");
        return 2;
    }
    printf("%d passed, %d skipped, %d failed\n", ran - failed - skipped, skipped, failed);
    if (failed || ran == 0) return 1;
    return skipped == ran ? T_SKIP_CODE : 0;
}
