/*
 * cpu.c — the CPU backend's table (backend.h): host memory from the C allocator,
 * copies by memcpy, and every op its kernel of the same name (kernels.h). The
 * entries are made from the op list itself, so a slot cannot be missed or take the
 * wrong kernel.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "longstraw/backend.h"

#define HUGE_BLOCK ((size_t)2 << 20)

/* Large blocks: 2 MiB aligned and marked for transparent huge pages; kernels walk
 * head-strided rows, where 4 KiB pages cost TLB misses. */
static void *cpu_alloc(const ls_backend *be, size_t bytes, size_t align) {
    (void)be;
    void *p = NULL;
    if (align < sizeof(void *)) align = sizeof(void *);
    if (bytes >= HUGE_BLOCK && align < HUGE_BLOCK) align = HUGE_BLOCK;
    if (posix_memalign(&p, align, bytes ? bytes : 1) != 0) return NULL;
#ifdef MADV_HUGEPAGE
    if (align == HUGE_BLOCK) madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
}
static void cpu_free(const ls_backend *be, void *p, size_t bytes) {
    (void)be, (void)bytes;
    free(p);
}
static void cpu_copy(const ls_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memmove(dst, src, bytes);
}
static void cpu_zero(const ls_backend *be, void *p, size_t bytes) {
    (void)be;
    if (bytes) memset(p, 0, bytes);
}

#define CPU_ARGS_(...) __VA_ARGS__
#define CPU_OP_(name, params, args) \
    static void cpu_##name(LS_BACKEND_PARAMS_ params) { (void)be; ls_##name(CPU_ARGS_ args); }
#define CPU_STATUS_OP_(name, params, args) \
    static ls_status cpu_##name(LS_BACKEND_PARAMS_ params) { (void)be; return ls_##name(CPU_ARGS_ args); }
LS_BACKEND_OPS(CPU_OP_)
LS_BACKEND_STATUS_OPS(CPU_STATUS_OP_)

#define CPU_ENTRY_(name, params, args) .name = cpu_##name,
static const ls_backend_i cpu_table = {
    .name = "cpu",
    .buf_alloc = cpu_alloc,
    .buf_free = cpu_free,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .copy = cpu_copy,
    .zero = cpu_zero,
    LS_BACKEND_OPS(CPU_ENTRY_) LS_BACKEND_STATUS_OPS(CPU_ENTRY_)};

static const ls_backend cpu_backend = {.i = &cpu_table, .device = "host", .ctx = NULL, .host_mem = 1};

const ls_backend *ls_backend_cpu(void) { return &cpu_backend; }
