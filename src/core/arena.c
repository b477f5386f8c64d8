/*
 * arena.c — named bump arenas with lifetimes (DESIGN.md §4).
 * Blocks form a stack; a mark/release pair frees everything allocated after the
 * mark. Released blocks are kept in a spare list for reuse (no malloc per chunk
 * in steady state) until ls_arena_trim or ls_arena_free. `cur` counts the bytes
 * handed out (each request rounded up to LS_ALIGN), which is what `plan` predicts.
 * A block's memory comes from the arena's backend (backend.h: host memory for the
 * CPU backend, device memory for another); its header lives on the host, beside it.
 */
#include "longstraw/core.h"

#include <stdlib.h>
#include <string.h>

#include "longstraw/backend.h"

struct ls_arena_block {
    ls_arena_block *prev;
    size_t size;         /* usable bytes */
    size_t off;          /* bytes used */
    unsigned char *data; /* the backend's memory, aligned to LS_ALIGN */
};

/* what a block holds on top of its data (counted in `reserved` as when the header
 * sat in front of the data) */
#define BLOCK_HDR ls_align_up(sizeof(ls_arena_block))

static unsigned char *block_data(ls_arena_block *b) { return b->data; }
static const ls_backend *arena_be(const ls_arena *a) { return a->be ? a->be : ls_backend_cpu(); }

void ls_arena_set_backend(ls_arena *a, const struct ls_backend *be) {
    LS_ASSERT(!a->head && !a->spare, "arena %s: its backend is set before its first block", a->name);
    a->be = be;
}

const ls_backend *ls_arena_backend(const ls_arena *a) { return arena_be(a); }

const char *ls_arena_device(const ls_arena *a) { return arena_be(a)->device; }

void ls_arena_init(ls_arena *a, const char *name, size_t block_size) {
    memset(a, 0, sizeof *a);
    a->name = name;
    a->block_size = block_size ? block_size : ((size_t)16 << 20);
}

static ls_arena_block *block_new(ls_arena *a, size_t need) {
    /* Reuse the first spare block big enough. */
    ls_arena_block **pp = &a->spare;
    while (*pp) {
        if ((*pp)->size >= need) {
            ls_arena_block *b = *pp;
            *pp = b->prev;
            b->off = 0;
            return b;
        }
        pp = &(*pp)->prev;
    }
    size_t size = need > a->block_size ? need : a->block_size;
    size_t total;
    if (ls_add_size(size, BLOCK_HDR, &total)) return NULL;
    ls_arena_block *b = malloc(sizeof *b);
    if (!b) return NULL;
    const ls_backend *be = arena_be(a);
    b->data = be->i->buf_alloc(be, size, LS_ALIGN);
    if (!b->data) {
        free(b);
        return NULL;
    }
    b->size = size;
    b->off = 0;
    a->reserved += total;
    if (a->reserved > a->reserved_peak) a->reserved_peak = a->reserved;
    return b;
}

void *ls_arena_alloc(ls_arena *a, size_t bytes) {
    size_t n = ls_align_up(bytes ? bytes : 1);
    if (n < bytes) {
        ls_err(LS_ERR_NOMEM, "arena %s: request of %zu bytes overflows", a->name, bytes);
        return NULL;
    }
    ls_arena_block *b = a->head;
    if (!b || b->size - b->off < n) {
        ls_arena_block *nb = block_new(a, n);
        if (!nb) {
            ls_err(LS_ERR_NOMEM, "arena %s: cannot allocate %zu bytes (holding %zu)", a->name, n,
                   a->cur);
            return NULL;
        }
        nb->prev = b;
        a->head = nb;
        b = nb;
    }
    void *p = block_data(b) + b->off;
    b->off += n;
    a->cur += n;
    if (a->cur > a->peak) a->peak = a->cur;
    return p;
}

/* n·size into *bytes; 1 (the error set) when it overflows */
static int calloc_bytes(const ls_arena *a, size_t n, size_t size, size_t *bytes) {
    if (!ls_mul_size(n, size, bytes)) return 0;
    ls_err(LS_ERR_NOMEM, "arena %s: %zu x %zu bytes overflows", a->name, n, size);
    return 1;
}

void *ls_arena_calloc(ls_arena *a, size_t n, size_t size) {
    size_t bytes;
    if (calloc_bytes(a, n, size, &bytes)) return NULL;
    void *p = ls_arena_alloc(a, bytes);
    if (p) {
        const ls_backend *be = arena_be(a);
        be->i->zero(be, p, bytes);
    }
    return p;
}

int ls_arena_host_readable(const ls_arena *a) { return arena_be(a)->host_mem; }

void *ls_arena_host_alloc(ls_arena *a, size_t bytes) {
    if (ls_arena_host_readable(a)) return ls_arena_alloc(a, bytes);
    if (!a->host) {
        a->host = malloc(sizeof *a->host);
        if (!a->host) {
            ls_err(LS_ERR_NOMEM, "arena %s: cannot allocate its host part", a->name);
            return NULL;
        }
        ls_arena_init(a->host, a->name, (size_t)1 << 20);
    }
    return ls_arena_alloc(a->host, bytes);
}

void *ls_arena_host_calloc(ls_arena *a, size_t n, size_t size) {
    size_t bytes;
    if (calloc_bytes(a, n, size, &bytes)) return NULL;
    void *p = ls_arena_host_alloc(a, bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

size_t ls_arena_host_cur(const ls_arena *a) { return a->host ? a->host->cur : 0; }
size_t ls_arena_host_peak(const ls_arena *a) { return a->host ? a->host->peak : 0; }

ls_arena_mark ls_arena_get_mark(const ls_arena *a) {
    ls_arena_mark m = {a->head, a->head ? a->head->off : 0, a->cur, NULL, 0, 0};
    if (a->host) {
        m.hblock = a->host->head;
        m.hoff = a->host->head ? a->host->head->off : 0;
        m.hcur = a->host->cur;
    }
    return m;
}

void ls_arena_release(ls_arena *a, ls_arena_mark m) {
    if (a->host) ls_arena_release(a->host, (ls_arena_mark){m.hblock, m.hoff, m.hcur, NULL, 0, 0});
    while (a->head && a->head != m.block) {
        ls_arena_block *b = a->head;
        a->head = b->prev;
        b->prev = a->spare;
        a->spare = b;
    }
    if (a->head) a->head->off = m.off;
    a->cur = m.cur;
}

void ls_arena_reset(ls_arena *a) {
    ls_arena_mark m = {NULL, 0, 0, NULL, 0, 0};
    ls_arena_release(a, m);
}

void ls_arena_trim(ls_arena *a) {
    if (a->host) ls_arena_trim(a->host);
    while (a->spare) {
        ls_arena_block *b = a->spare;
        a->spare = b->prev;
        a->reserved -= b->size + BLOCK_HDR;
        const ls_backend *be = arena_be(a);
        be->i->buf_free(be, b->data, b->size);
        free(b);
    }
}

void ls_arena_reset_peak(ls_arena *a) {
    a->peak = a->cur;
    if (a->host) a->host->peak = a->host->cur;
}

void ls_arena_free(ls_arena *a) {
    ls_arena_reset(a);
    ls_arena_trim(a);
    free(a->host);
    a->host = NULL;
}

static const char *const arena_names[LS_ARENA_COUNT] = {"fixed", "grad",   "prompt",
                                                         "score", "branch", "scratch"};

const char *ls_arena_id_name(ls_arena_id id) {
    return (id >= 0 && id < LS_ARENA_COUNT) ? arena_names[id] : "?";
}

void ls_arenas_init(ls_arenas *as) {
    for (int i = 0; i < LS_ARENA_COUNT; i++) ls_arena_init(&as->a[i], arena_names[i], 0);
}

void ls_arenas_set_backend(ls_arenas *as, const ls_backend *be) {
    for (int i = 0; i < LS_ARENA_COUNT; i++)
        if (i != LS_ARENA_SCORE) ls_arena_set_backend(&as->a[i], be);
}

void ls_arenas_free(ls_arenas *as) {
    for (int i = 0; i < LS_ARENA_COUNT; i++) ls_arena_free(&as->a[i]);
}
