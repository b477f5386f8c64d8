/*
 * fuzz_common.h — helpers shared by the libFuzzer harnesses in fuzz/.
 *
 * Oracles beyond "no sanitizer report": a loader that rejects its input must
 * leave a message that names the file (STYLE.md rule 5: errors name the file,
 * field or value), and an accepted input must satisfy the documented
 * post-conditions. A violated oracle aborts, so libFuzzer saves the input.
 */
#ifndef LS_FUZZ_COMMON_H
#define LS_FUZZ_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/core.h"

/* Abort (libFuzzer records a crash) with a short report. */
#define FUZZ_CHECK(cond, ...)                                                   \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "fuzz oracle failed at %s:%d: %s: ", __FILE__,      \
                    __LINE__, #cond);                                           \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, "\n");                                              \
            abort();                                                            \
        }                                                                       \
    } while (0)

/* A rejected input: the status is a real error and the message names `name`. */
static inline void fuzz_check_rejection(ls_status s, const char *name) {
    FUZZ_CHECK(s > LS_OK && s <= LS_ERR_UNSUPPORTED, "status %d out of range", (int)s);
    const char *m = ls_err_msg();
    FUZZ_CHECK(m && strstr(m, name), "%s without the file name: \"%s\"", ls_status_name(s), m ? m : "(null)");
}

/* NUL-terminated copy of the fuzzer's bytes (malloc; the bytes may hold NULs). */
static inline char *fuzz_strndup(const unsigned char *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) abort();
    memcpy(s, data, size);
    s[size] = 0;
    return s;
}

#endif
