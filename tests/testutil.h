/*
 * testutil.h — helpers for the test suite. Every comparison is written so NaN
 * fails: `!(err <= tol)`. A comparison over zero elements fails.
 */
#ifndef LS_TESTUTIL_H
#define LS_TESTUTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "longstraw/core.h"
#include "longstraw/safetensors.h"

#define T_FAIL(...)                                                  \
    do {                                                             \
        fprintf(stderr, "  FAIL %s:%d: ", __FILE__, __LINE__);       \
        fprintf(stderr, __VA_ARGS__);                                \
        fputc('\n', stderr);                                         \
        return 1;                                                    \
    } while (0)

/* A test that cannot run here (a tool it drives is not installed, the network it
 * needs is unreachable) says why and returns T_SKIP_CODE: test_main reports it as
 * "skipped", never as passed, and CTest as skipped (SKIP_RETURN_CODE 77). */
#define T_SKIP_CODE 77
#define T_SKIP(...)                   \
    do {                              \
        printf("  SKIP: ");           \
        printf(__VA_ARGS__);          \
        putchar('\n');                \
        fflush(stdout);               \
        return T_SKIP_CODE;           \
    } while (0)

#define T_CHECK(cond, ...)             \
    do {                               \
        if (!(cond)) T_FAIL(__VA_ARGS__); \
    } while (0)

#define T_OK(expr)                                                             \
    do {                                                                       \
        ls_status t_s_ = (expr);                                               \
        if (t_s_ != LS_OK) T_FAIL("%s -> %s: %s", #expr, ls_status_name(t_s_), ls_err_msg()); \
    } while (0)

/* max |a-b|; returns INFINITY when n == 0 or anything is non-finite */
double t_max_abs_diff_f(const float *a, const float *b, int64_t n);
double t_max_abs_diff_d(const double *a, const double *b, int64_t n);
/* ||a-b|| / max(||b||, tiny); INFINITY when n == 0 or non-finite */
double t_rel_err_f(const float *a, const float *b, int64_t n);
double t_rel_err_fd(const float *a, const double *b, int64_t n);
int t_all_finite_f(const float *a, int64_t n);
void t_fill_normal(float *x, int64_t n, ls_rng *r, float std);
/* A fresh empty temp directory (under $TMPDIR or /tmp); path written to out. */
int t_make_tmpdir(char *out, size_t cap);
/* Remove a directory tree (rm -rf); 0 on success. */
int t_remove_dir(const char *dir);
/* Run a shell command, capture stdout into a malloc'd buffer (caller frees). */
char *t_run_capture(const char *cmd, int *exit_code);
/* A whole file as a NUL-terminated malloc'd string (caller frees), its length in *len
 * (may be NULL); NULL when it cannot be read. */
char *t_read_file(const char *path, size_t *len);
/* 1 when two safetensors tensors (any dtypes) hold the same values bit for bit as f32,
 * 0 when they differ, −1 when they cannot be compared (size, read, memory). */
int t_st_same_f32(const ls_st_tensor *a, const ls_st_tensor *b);

#endif
