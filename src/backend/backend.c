/*
 * backend.c — what every backend shares: the list of a table's empty slots, and the
 * CUDA backend's entry points in a build without it.
 */
#include <stdio.h>
#include <string.h>

#include "longstraw/backend.h"

int ls_backend_missing(const ls_backend *be, char *names, size_t cap) {
    int n = 0;
    size_t used = 0;
    if (names && cap) names[0] = '\0';
#define MISSING_(name, params, args)                                                                      \
    if (!be->i->name) {                                                                                   \
        if (names && used < cap) used += (size_t)snprintf(names + used, cap - used, "%s%s", n ? "," : "", #name); \
        n++;                                                                                              \
    }
    LS_BACKEND_OPS(MISSING_)
    LS_BACKEND_STATUS_OPS(MISSING_)
#undef MISSING_
    return n;
}

#ifndef LS_HAVE_CUDA
ls_status ls_backend_cuda_open(int device, const ls_backend **out) {
    (void)device;
    *out = NULL;
    return ls_err(LS_ERR_UNSUPPORTED, "this build has no CUDA backend (configure with cmake -DLS_CUDA=ON)");
}
void ls_backend_cuda_close(const ls_backend *be) { (void)be; }
void ls_backend_cuda_sync(const ls_backend *be) { (void)be; }
int ls_backend_cuda_built(void) { return 0; }
const ls_backend_i *ls_backend_cuda_table(void) { return NULL; }
#else
int ls_backend_cuda_built(void) { return 1; }
#endif
