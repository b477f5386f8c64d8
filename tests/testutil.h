/*
 * testutil.h — helpers for the test suite. Every comparison is written so NaN
 * fails: `!(err <= tol)`. A comparison over zero elements fails.
 */
#ifndef LS_TESTUTIL_H
#define LS_TESTUTIL_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "longstraw/core.h"
#include "longstraw/safetensors.h"
#include "longstraw/trainer.h"

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
/* Tolerances from measured floors (issue 18). Two float32 schedules of one computation
 * (capture vs plain, side branches vs merged LoRA, CP vs one rank, full mode vs naive,
 * other chunk sizes) differ by rounding alone, and by how much depends on the BLAS
 * kernels (OpenBLAS's Prescott, Sandybridge, Haswell, SkylakeX and Zen cores sum in
 * other orders, with and without FMA), the model and the input: side branches vs merged
 * LoRA measured 3.6e-6 with SkylakeX kernels and 2.0e-5 with Sandybridge's. A constant
 * set at one machine's float floor fails on the next, so such a bound is k times a floor
 * measured in the same run, on the same model and input, with the same kernels:
 *  - the perturbation floor: a schedule run again after every weight moved by one ulp at
 *    random (t_perturb_ulp) — the outputs' sensitivity to rounding-sized changes. The
 *    code under test does not enter it, so a bug cannot raise it;
 *  - a reordering floor: a schedule against itself with other chunk or page sizes (equal
 *    in exact arithmetic), which follows the kernels' summation order. A bug in the
 *    chunking could raise it, so it is first held under what rounding can give
 *    (T_FLOOR_NOISE_MAX), and the test fails when it is not.
 * Comparisons against an fp64 reference with bounds well above float noise and
 * bit-for-bit comparisons do not need one. */
/* Move every finite non-zero element one ulp up or down at random (zeros stay zero, so
 * structural zeros such as a fresh LoRA B keep their meaning). */
void t_perturb_ulp(float *x, int64_t n, ls_rng *r);
/* max(k·floor, min_bound); NaN when floor is NaN (so a `!(err <= bound)` check fails).
 * min_bound is a few ulps of the compared values: it only keeps a floor of exactly 0
 * (outputs the perturbation does not reach) from demanding bit equality. */
double t_floor_bound(double floor, double k, double min_bound);
/* A reordering floor above this (absolute on log-probs, relative per tensor on
 * gradients) is not rounding: a wrong index or a missing term gives 1e-2 .. 1. The
 * largest floor measured, 8.9e-5 (q35_moe's gradient, prefix-frozen capture against
 * naive with Haswell kernels: top-k routing near ties), sits below it with 10x room. */
#define T_FLOOR_NOISE_MAX 1e-3

/* A checkpoint of random weights for the config at config_path in directory dir (made),
 * by the family the config names (its write_random, what `longstraw init` calls; f32);
 * 0 on success, the library's message on stderr otherwise. */
int t_write_model(const char *config_path, const char *dir, int seed);
/* Copy the model of directory src (config.json, model.safetensors) into dst (made),
 * every tensor read as f32 and passed to edit (NULL: none), which may change its values
 * and returns the dtype it is written in. 0 on success (a message on stderr else). */
typedef ls_dtype (*t_tensor_edit)(const char *name, float *v, int64_t n, void *ctx);
int t_copy_model(const char *src, const char *dst, t_tensor_edit edit, void *ctx);
/* A fresh empty temp directory (under $TMPDIR or /tmp); path written to out. */
int t_make_tmpdir(char *out, size_t cap);
/* Remove a directory tree (rm -rf); 0 on success. */
int t_remove_dir(const char *dir);
/* The loop as a library (trainer.h), the way `train` calls it: default options for the
 * model dir/m (model: its path, mn bytes), the run directory dir/<run_name> (run, rn
 * bytes) and data (NULL: a task); progress lines off. */
void t_train_opts(ls_train_opts *o, char *model, size_t mn, char *run, size_t rn, const char *dir,
                  const char *run_name, const char *data);
/* ls_train_run with what it writes on stderr (rank 0's lines: each update, checkpoints,
 * resumes, refusals; a reward process's stderr) captured into *log, malloc'd (caller
 * frees; NULL when the capture failed: the run still happens, a check on *log fails).
 * The text is kept in <out>.stderr, beside the run directory, so that a crash's report
 * (a sanitizer's, an assertion's) outlives the test. */
ls_status t_train_logged(const ls_train_opts *o, ls_train_result *res, char **log);
/* Run a shell command, capture stdout into a malloc'd buffer (caller frees). */
char *t_run_capture(const char *cmd, int *exit_code);
/* The same for a printf-style command, stderr folded into the output; NULL when the
 * command does not fit. */
char *t_run_fmt(int *exit_code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
char *t_run_vfmt(int *exit_code, const char *fmt, va_list ap);
/* A whole file as a NUL-terminated malloc'd string (caller frees), its length in *len
 * (may be NULL); NULL when it cannot be read. */
char *t_read_file(const char *path, size_t *len);
/* 1 when two safetensors tensors (any dtypes) hold the same values bit for bit as f32,
 * 0 when they differ, −1 when they cannot be compared (size, read, memory). */
int t_st_same_f32(const ls_st_tensor *a, const ls_st_tensor *b);

#endif
