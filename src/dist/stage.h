/*
 * stage.h — the distributed layer's crossing of the device boundary (issue 33): MPI
 * moves host memory, the models hand it the backend's. A host view of a buffer is the
 * buffer itself on a host-memory backend (the CPU: nothing is copied) or a copy in host
 * memory, written back after. be NULL: the data is host memory already. Internal to
 * src/dist/.
 */
#ifndef LONGSTRAW_DIST_STAGE_H
#define LONGSTRAW_DIST_STAGE_H

#include <stdlib.h>

#include "longstraw/backend.h"

static inline int ls_stage_direct(const ls_backend *be) { return !be || be->host_mem; }

/* bytes of be's memory p as host memory: p, or a copy from the host part of arena a
 * (malloc'd when a is NULL: free with ls_stage_done) — read back when `read`. */
static inline void *ls_stage_in(const ls_backend *be, ls_arena *a, void *p, size_t bytes, int read) {
    if (ls_stage_direct(be) || !p) return p;
    void *h = a ? ls_arena_host_alloc(a, bytes ? bytes : 1) : malloc(bytes ? bytes : 1);
    if (h && read && bytes) be->i->to_host(be, h, p, bytes);
    return h;
}

/* The host view h of p back into p when `write`; a malloc'd view (a NULL) freed. */
static inline void ls_stage_done(const ls_backend *be, ls_arena *a, void *p, void *h, size_t bytes, int write) {
    if (h == p || !h) return;
    if (write && bytes) be->i->to_device(be, p, h, bytes);
    if (!a) free(h);
}

#endif
