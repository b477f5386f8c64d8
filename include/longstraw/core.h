/*
 * core.h — status codes, always-on assertions, named arenas, dtypes (f32 compute,
 * bf16/f16 storage), seeded RNG, timers, process peak RSS, thread control.
 * Everything a user can cause returns an ls_status and leaves a message in a
 * thread-local buffer (ls_err_msg); programmer errors use LS_ASSERT, which aborts.
 */
#ifndef LONGSTRAW_CORE_H
#define LONGSTRAW_CORE_H

#include <stddef.h>
#include <stdint.h>

/* ---- status ------------------------------------------------------------ */
typedef enum {
    LS_OK = 0,
    LS_ERR_IO,          /* open/read/write/mmap failed */
    LS_ERR_FORMAT,      /* malformed file content */
    LS_ERR_ARG,         /* bad argument / flag / field value */
    LS_ERR_NOMEM,       /* allocation failed or size overflow */
    LS_ERR_UNSUPPORTED, /* valid but not supported (dtype, model_type, ...) */
    LS_ERR_INTERRUPTED, /* a stop was requested (ls_request_stop) and honoured at a safe point */
} ls_status;

/* Record an error message (printf-style) for the calling thread; returns code. */
ls_status ls_err(ls_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Prefix the current message with more context ("while loading X: <old>"). */
ls_status ls_err_ctx(ls_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
const char *ls_err_msg(void);
const char *ls_status_name(ls_status s);

#define LS_TRY(expr)                         \
    do {                                     \
        ls_status ls_try_s_ = (expr);        \
        if (ls_try_s_ != LS_OK) return ls_try_s_; \
    } while (0)

/* The rank named by assertion reports (set by the communicator; 0 before). */
void ls_set_log_rank(int rank);
int ls_log_rank(void);
void ls_assert_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));
/* Always on (also in release builds). */
#define LS_ASSERT(cond, ...)                                          \
    do {                                                              \
        if (!(cond)) ls_assert_fail(__FILE__, __LINE__, #cond, " " __VA_ARGS__); \
    } while (0)

/* Overflow-checked size arithmetic: return 0 on success, nonzero on overflow. */
static inline int ls_mul_size(size_t a, size_t b, size_t *out) {
    return __builtin_mul_overflow(a, b, out);
}
static inline int ls_add_size(size_t a, size_t b, size_t *out) {
    return __builtin_add_overflow(a, b, out);
}
#define LS_ALIGN 64
static inline size_t ls_align_up(size_t n) { return (n + (LS_ALIGN - 1)) & ~(size_t)(LS_ALIGN - 1); }

/* ---- arenas -------------------------------------------------------------- */
typedef struct ls_arena_block ls_arena_block;
struct ls_backend;
typedef struct ls_arena_s {
    const char *name;
    const struct ls_backend *be; /* where its blocks live (backend.h); NULL: the CPU backend */
    ls_arena_block *head;   /* current (last) block; blocks form a stack */
    ls_arena_block *spare;  /* released blocks kept for reuse */
    size_t block_size;      /* default size of a new block */
    size_t cur;             /* bytes handed out (each request aligned to LS_ALIGN) */
    size_t peak;            /* max of cur since init / ls_arena_reset_peak */
    size_t reserved;        /* bytes held from the OS (blocks, incl. spare) */
    size_t reserved_peak;
    /* Host-side bookkeeping of the same lifetime (ls_arena_host_alloc) when the blocks
     * are device memory the host cannot read; NULL until the first such request. With
     * a host-memory backend (the CPU's) host requests share the blocks above. */
    struct ls_arena_s *host;
} ls_arena;

typedef struct {
    ls_arena_block *block;
    size_t off;
    size_t cur;
    ls_arena_block *hblock; /* the host part's (0 when it has none) */
    size_t hoff, hcur;
} ls_arena_mark;

void ls_arena_init(ls_arena *a, const char *name, size_t block_size);
/* Take the arena's blocks from backend `be` (before its first allocation). */
void ls_arena_set_backend(ls_arena *a, const struct ls_backend *be);
/* The backend its blocks come from (the CPU backend when none was set). */
const struct ls_backend *ls_arena_backend(const ls_arena *a);
/* The device its memory is on ("host" for the CPU backend), for plans and receipts. */
const char *ls_arena_device(const ls_arena *a);
/* 64-byte aligned, uninitialised, the backend's memory. Returns NULL and sets ls_err on
 * failure. ls_arena_calloc zeroes through the backend. */
void *ls_arena_alloc(ls_arena *a, size_t bytes);
void *ls_arena_calloc(ls_arena *a, size_t n, size_t size);
/* Host memory released with a's marks (page tables, layer structs, integer bookkeeping
 * the host reads): a's own blocks when they are host memory, else its host part. */
void *ls_arena_host_alloc(ls_arena *a, size_t bytes);
void *ls_arena_host_calloc(ls_arena *a, size_t n, size_t size);
/* 1 when a's blocks are host memory (its backend's host_mem) */
int ls_arena_host_readable(const ls_arena *a);
/* bytes its host part holds now / at most (0 when a's blocks are host memory) */
size_t ls_arena_host_cur(const ls_arena *a);
size_t ls_arena_host_peak(const ls_arena *a);
ls_arena_mark ls_arena_get_mark(const ls_arena *a);
void ls_arena_release(ls_arena *a, ls_arena_mark m); /* free everything after m */
void ls_arena_reset(ls_arena *a);                     /* free everything */
void ls_arena_trim(ls_arena *a);                      /* return spare blocks to the OS */
void ls_arena_reset_peak(ls_arena *a);
void ls_arena_free(ls_arena *a);

typedef enum {
    LS_ARENA_FIXED = 0, /* weights, adapters, optimizer moments */
    LS_ARENA_GRAD,      /* parameter gradients */
    LS_ARENA_PROMPT,    /* captured prompt state */
    LS_ARENA_SCORE,     /* old/ref log-probs, advantages */
    LS_ARENA_BRANCH,    /* one member's tape */
    LS_ARENA_SCRATCH,   /* transients of one chunk / layer */
    LS_ARENA_COUNT
} ls_arena_id;

typedef struct {
    ls_arena a[LS_ARENA_COUNT];
} ls_arenas;

void ls_arenas_init(ls_arenas *as);
/* Put the arenas whose bytes the ops read (fixed, grad, prompt, branch, scratch) on
 * backend `be`; the score arena (log-probs, advantages: what the objective reads on the
 * host) stays in host memory. Before the first allocation. */
void ls_arenas_set_backend(ls_arenas *as, const struct ls_backend *be);
void ls_arenas_free(ls_arenas *as);
const char *ls_arena_id_name(ls_arena_id id);

/* ---- dtypes --------------------------------------------------------------- */
typedef enum { LS_DTYPE_F32 = 0, LS_DTYPE_BF16, LS_DTYPE_F16, LS_DTYPE_F64 } ls_dtype;

size_t ls_dtype_size(ls_dtype t);
const char *ls_dtype_name(ls_dtype t);          /* safetensors spelling: "F32", "BF16", ... */
int ls_dtype_parse(const char *s, ls_dtype *out); /* 0 on success */

typedef uint16_t ls_bf16;
static inline float ls_bf16_to_f32(ls_bf16 h) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}
/* Round to nearest even; NaN stays NaN. */
static inline ls_bf16 ls_f32_to_bf16(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (ls_bf16)((v.u >> 16) | 0x40u);
    uint32_t lsb = (v.u >> 16) & 1u;
    v.u += 0x7fffu + lsb;
    return (ls_bf16)(v.u >> 16);
}
float ls_f16_to_f32(uint16_t h);
uint16_t ls_f32_to_f16(float f);

/* Convert n elements of any dtype into f32 / from f32 into any dtype. */
void ls_convert_to_f32(float *dst, const void *src, ls_dtype t, size_t n);
void ls_convert_from_f32(void *dst, ls_dtype t, const float *src, size_t n);

/* ---- RNG (xoshiro256**, seeded by splitmix64) ----------------------------- */
typedef struct { uint64_t s[4]; } ls_rng;
void ls_rng_seed(ls_rng *r, uint64_t seed);
uint64_t ls_rng_u64(ls_rng *r);
double ls_rng_uniform(ls_rng *r);  /* [0, 1) */
double ls_rng_normal(ls_rng *r);   /* N(0, 1) */

/* ---- stop requests ------------------------------------------------------------
 * A signal handler records a stop (async-signal-safe); long loops (capture, chunk by
 * chunk) honour it at their next safe point and return LS_ERR_INTERRUPTED. */
void ls_request_stop(int sig);
int ls_stop_requested(void); /* the signal, or 0 */
void ls_clear_stop(void);

/* ---- time, memory, threads ------------------------------------------------ */
double ls_now(void);              /* monotonic seconds */
size_t ls_peak_rss_bytes(void);   /* process peak resident set */
void ls_set_threads(int n);       /* OpenMP + OpenBLAS; n <= 0 means all cores */
int ls_get_threads(void);
int ls_num_cores(void);
/* (ls_runtime_setup in runtime.h: OMP_WAIT_POLICY and the BLAS's kernels) */

/* ---- output files ---------------------------------------------------------- */
/* What a st_mode names, for messages: "a directory", "a FIFO", ... */
const char *ls_file_kind(unsigned int st_mode);
/* May an atomic writer replace `path` (temp file + rename over it)? LS_OK when
 * nothing is there or a regular file is; LS_ERR_ARG naming the path and what it is
 * when it is a directory, FIFO, device, socket or symbolic link (a link is refused,
 * not followed: the rename would replace the link, not its target), or when a
 * component of its directory is not a directory. */
ls_status ls_check_output_file(const char *path);
/* Create the new temp file `tmp` of an atomic writer for writing: a stale one (a
 * crashed run with the same pid) is removed first; O_CREAT|O_EXCL|O_NOFOLLOW, so it
 * never opens a planted symlink, FIFO or device (and never blocks). *fd on LS_OK. */
ls_status ls_create_temp_file(const char *tmp, int *fd);
/* mkdir -m 0755 `path` unless it is already a directory (a symlink to one counts);
 * LS_ERR_ARG naming the path and what it is when it exists as anything else. */
ls_status ls_make_dir(const char *path);

#endif
