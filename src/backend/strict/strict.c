/*
 * strict.c — the strict CPU backend (backend.h, issue 33): the CPU backend's ops over
 * buffers that host code cannot read or write. Every buffer is an mmap of its own,
 * PROT_NONE except while one of this backend's entries runs (an op, or a copy in, out,
 * within or a zeroing); the entry opens every live buffer, calls the CPU backend and
 * closes them again. Host code that touches device memory outside an op — a read the
 * CUDA backend would turn into garbage or a fault — faults here at once, on a machine
 * without a GPU, so the device boundary of the models is tested in CI.
 *
 * Entries nest (a status op takes scratch from an arena of this backend, whose new
 * block is mapped readable while the op runs; calloc zeroes through `zero`): only the
 * outermost entry changes protections. A SIGSEGV at an address inside a live buffer
 * prints which buffer before the default action ends the process.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "longstraw/backend.h"

typedef struct {
    unsigned char *p;
    size_t bytes; /* mapped, whole pages */
} strict_buf;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static strict_buf *bufs;
static size_t n_bufs, cap_bufs;
static int depth; /* entries running (nesting) */

static size_t page_round(size_t n) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

static void protect_all(int prot) {
    for (size_t i = 0; i < n_bufs; i++)
        if (mprotect(bufs[i].p, bufs[i].bytes, prot) != 0) LS_ASSERT(0, "strict backend: mprotect failed (errno %d)", errno);
}

static void enter(void) {
    pthread_mutex_lock(&lock);
    if (depth++ == 0) protect_all(PROT_READ | PROT_WRITE);
    pthread_mutex_unlock(&lock);
}
static void leave(void) {
    pthread_mutex_lock(&lock);
    LS_ASSERT(depth > 0, "strict backend: leave without enter");
    if (--depth == 0) protect_all(PROT_NONE);
    pthread_mutex_unlock(&lock);
}

/* async-signal-safe: a hex address into buf */
static size_t hex(char *buf, uintptr_t v) {
    char t[2 * sizeof v];
    size_t n = 0;
    do t[n++] = "0123456789abcdef"[v & 15]; while ((v >>= 4) && n < sizeof t);
    for (size_t i = 0; i < n; i++) buf[i] = t[n - 1 - i];
    return n;
}

static void on_segv(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    uintptr_t a = (uintptr_t)si->si_addr;
    for (size_t i = 0; i < n_bufs; i++)
        if (a >= (uintptr_t)bufs[i].p && a < (uintptr_t)bufs[i].p + bufs[i].bytes) {
            char m[160] = "longstraw: host code touched memory of the strict backend (device memory) at 0x";
            size_t n = strlen(m);
            n += hex(m + n, a);
            m[n++] = '\n';
            ssize_t w = write(2, m, n);
            (void)w;
            break;
        }
    signal(sig, SIG_DFL); /* SA_RESETHAND as well; the access repeats and ends the process */
}

static void install_handler(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, NULL);
}

/* A mapping of n bytes (whole pages). Large ones are 2 MiB aligned and asked for huge
 * pages: a protection change then touches one entry per 2 MiB instead of 512, which is
 * most of this backend's cost (every op changes every buffer twice). */
#define HUGE_ ((size_t)2 << 20)
static void *map_buffer(size_t n, int prot) {
    int fl = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    if (n < HUGE_) {
        void *p = mmap(NULL, n, prot, fl, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    size_t n2 = (n + HUGE_ - 1) / HUGE_ * HUGE_;
    unsigned char *raw = mmap(NULL, n2 + HUGE_, prot, fl, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    unsigned char *p = (unsigned char *)(((uintptr_t)raw + HUGE_ - 1) / HUGE_ * HUGE_);
    if (p > raw) munmap(raw, (size_t)(p - raw));
    if (raw + n2 + HUGE_ > p + n) munmap(p + n, (size_t)(raw + n2 + HUGE_ - (p + n)));
#ifdef MADV_HUGEPAGE
    madvise(p, n, MADV_HUGEPAGE);
#endif
    return p;
}

static void *strict_alloc(const ls_backend *be, size_t bytes, size_t align) {
    (void)be;
    if (align > (size_t)sysconf(_SC_PAGESIZE)) return NULL; /* mmap aligns to pages */
    size_t n = page_round(bytes ? bytes : 1);
    pthread_mutex_lock(&lock);
    void *p = map_buffer(n, depth ? PROT_READ | PROT_WRITE : PROT_NONE);
    if (p && n_bufs == cap_bufs) {
        size_t nc = cap_bufs ? 2 * cap_bufs : 64;
        strict_buf *nb = realloc(bufs, nc * sizeof *nb);
        if (!nb) {
            munmap(p, n);
            p = NULL;
        } else {
            bufs = nb, cap_bufs = nc;
        }
    }
    if (p) bufs[n_bufs++] = (strict_buf){p, n};
    pthread_mutex_unlock(&lock);
    return p;
}

static void strict_free(const ls_backend *be, void *p, size_t bytes) {
    (void)be, (void)bytes;
    if (!p) return;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < n_bufs; i++)
        if (bufs[i].p == p) {
            munmap(bufs[i].p, bufs[i].bytes);
            bufs[i] = bufs[--n_bufs];
            pthread_mutex_unlock(&lock);
            return;
        }
    pthread_mutex_unlock(&lock);
    LS_ASSERT(0, "strict backend: freeing %p, which it did not allocate", p);
}

int ls_backend_strict_owns(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int found = 0;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < n_bufs && !found; i++)
        found = a >= (uintptr_t)bufs[i].p && a < (uintptr_t)bufs[i].p + bufs[i].bytes;
    pthread_mutex_unlock(&lock);
    return found;
}

/* ---- every pointer an op is given is this backend's memory -------------------------
 * (backend.h: except the optimizer's hyper-parameters and the scalar results of sumsq
 * and adamw_check, which are the host's). A host pointer handed to an op works on the
 * CPU but not on a device; here it stops the process naming the op and argument. Page
 * tables and pointer arrays may be host memory (the CUDA backend stages them); the
 * pages they point to may not. */
static int host_arg(const char *op, const char *arg) {
    return (!strcmp(op, "sumsq") && !strcmp(arg, "out")) ||
           (!strcmp(op, "adamw_check") && (!strcmp(arg, "bad") || !strcmp(arg, "at")));
}
static void chk_ptr(const char *op, const char *arg, const void *p) {
    if (!p || host_arg(op, arg) || ls_backend_strict_owns(p)) return;
    LS_ASSERT(0, "strict backend: op %s was given %s = %p, which is not the backend's memory (a host pointer)", op,
              arg, p);
}
static void chk_prefix(const char *op, const char *arg, const ls_kv_prefix *kv) {
    if (!kv || kv->n <= 0) return;
    int64_t pages = (kv->n + kv->page_size - 1) / kv->page_size;
    for (int64_t i = 0; i < pages; i++) {
        if (kv->k_pages) chk_ptr(op, arg, kv->k_pages[i]);
        if (kv->v_pages) chk_ptr(op, arg, kv->v_pages[i]);
    }
}
static void chk_arena(const char *op, const char *arg, const ls_arena *a) {
    LS_ASSERT(!a || ls_arena_backend(a)->i == ls_backend_strict()->i,
              "strict backend: op %s was given arena %s (%s) for %s, not one of the backend's", op, a ? a->name : "",
              a ? ls_arena_device(a) : "", arg);
}
static void chk_none(const char *op, const char *arg, ...) { (void)op, (void)arg; }

#define CHK_(op, x)                                                                                                  \
    _Generic((x), void *: chk_ptr, float *: chk_ptr, const float *: chk_ptr, int32_t *: chk_ptr, const int32_t *: chk_ptr,            \
             int64_t *: chk_ptr, const int64_t *: chk_ptr, double *: chk_ptr, const double *: chk_ptr,               \
             const ls_kv_prefix *: chk_prefix, ls_arena *: chk_arena, default: chk_none)(#op, #x, x);
/* CHK_ applied to each of up to 20 arguments */
#define EACH_N_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18, _19, _20, N, ...) N
#define EACH_(op, ...)                                                                                               \
    EACH_SEL_(EACH_N_(__VA_ARGS__, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1))            \
    (op, __VA_ARGS__)
#define EACH_SEL_(n) EACH_CAT_(EACH_, n)
#define EACH_CAT_(a, b) a##b
#define EACH_1(op, x) CHK_(op, x)
#define EACH_2(op, x, ...) CHK_(op, x) EACH_1(op, __VA_ARGS__)
#define EACH_3(op, x, ...) CHK_(op, x) EACH_2(op, __VA_ARGS__)
#define EACH_4(op, x, ...) CHK_(op, x) EACH_3(op, __VA_ARGS__)
#define EACH_5(op, x, ...) CHK_(op, x) EACH_4(op, __VA_ARGS__)
#define EACH_6(op, x, ...) CHK_(op, x) EACH_5(op, __VA_ARGS__)
#define EACH_7(op, x, ...) CHK_(op, x) EACH_6(op, __VA_ARGS__)
#define EACH_8(op, x, ...) CHK_(op, x) EACH_7(op, __VA_ARGS__)
#define EACH_9(op, x, ...) CHK_(op, x) EACH_8(op, __VA_ARGS__)
#define EACH_10(op, x, ...) CHK_(op, x) EACH_9(op, __VA_ARGS__)
#define EACH_11(op, x, ...) CHK_(op, x) EACH_10(op, __VA_ARGS__)
#define EACH_12(op, x, ...) CHK_(op, x) EACH_11(op, __VA_ARGS__)
#define EACH_13(op, x, ...) CHK_(op, x) EACH_12(op, __VA_ARGS__)
#define EACH_14(op, x, ...) CHK_(op, x) EACH_13(op, __VA_ARGS__)
#define EACH_15(op, x, ...) CHK_(op, x) EACH_14(op, __VA_ARGS__)
#define EACH_16(op, x, ...) CHK_(op, x) EACH_15(op, __VA_ARGS__)
#define EACH_17(op, x, ...) CHK_(op, x) EACH_16(op, __VA_ARGS__)
#define EACH_18(op, x, ...) CHK_(op, x) EACH_17(op, __VA_ARGS__)
#define EACH_19(op, x, ...) CHK_(op, x) EACH_18(op, __VA_ARGS__)
#define EACH_20(op, x, ...) CHK_(op, x) EACH_19(op, __VA_ARGS__)

#define CPU_ ls_backend_cpu()
/* A copy that crosses or stays in the boundary: the ends that are device memory checked
 * (dst_dev, src_dev), then one memmove with every buffer open. */
static void move(const char *what, int dst_dev, int src_dev, void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    if (dst_dev) chk_ptr(what, "dst", dst);
    if (src_dev) chk_ptr(what, "src", src);
    enter();
    CPU_->i->copy(CPU_, dst, src, bytes);
    leave();
}
static void strict_copy(const ls_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    move("copy", 1, 1, dst, src, bytes);
}
static void strict_to_device(const ls_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    move("to_device", 1, 0, dst, src, bytes);
}
static void strict_to_host(const ls_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    move("to_host", 0, 1, dst, src, bytes);
}
static void strict_zero(const ls_backend *be, void *p, size_t bytes) {
    (void)be;
    if (bytes) chk_ptr("zero", "p", p);
    enter();
    CPU_->i->zero(CPU_, p, bytes);
    leave();
}

#define STRICT_ARGS_(...) __VA_ARGS__
#define STRICT_OP_(name, params, args)                                                                                \
    static void strict_##name(LS_BACKEND_PARAMS_ params) {                                                           \
        (void)be;                                                                                                     \
        EACH_(name, STRICT_ARGS_ args)                                                                                \
        enter();                                                                                                      \
        CPU_->i->name(CPU_, STRICT_ARGS_ args);                                                                       \
        leave();                                                                                                      \
    }
#define STRICT_STATUS_OP_(name, params, args)                                                                         \
    static ls_status strict_##name(LS_BACKEND_PARAMS_ params) {                                                      \
        (void)be;                                                                                                     \
        EACH_(name, STRICT_ARGS_ args)                                                                                \
        enter();                                                                                                      \
        ls_status s_ = CPU_->i->name(CPU_, STRICT_ARGS_ args);                                                       \
        leave();                                                                                                      \
        return s_;                                                                                                    \
    }
LS_BACKEND_OPS(STRICT_OP_)
LS_BACKEND_STATUS_OPS(STRICT_STATUS_OP_)

#define STRICT_ENTRY_(name, params, args) .name = strict_##name,
static const ls_backend_i strict_table = {
    .name = "strict",
    .buf_alloc = strict_alloc,
    .buf_free = strict_free,
    .to_device = strict_to_device,
    .to_host = strict_to_host,
    .copy = strict_copy,
    .zero = strict_zero,
    LS_BACKEND_OPS(STRICT_ENTRY_) LS_BACKEND_STATUS_OPS(STRICT_ENTRY_)};

static const ls_backend strict_backend = {.i = &strict_table, .device = "strict", .ctx = NULL, .host_mem = 0};

static pthread_once_t once = PTHREAD_ONCE_INIT;

const ls_backend *ls_backend_strict(void) {
    pthread_once(&once, install_handler);
    return &strict_backend;
}
