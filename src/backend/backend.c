/*
 * backend.c — what every backend shares: the registry that opens a backend by name,
 * the list of a table's empty slots, and the CUDA backend's entry points in a build
 * without it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
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

ls_status ls_backend_open(const char *name, const ls_backend **out) {
    *out = NULL;
    if (!name || !strcmp(name, "cpu")) {
        *out = ls_backend_cpu();
        return LS_OK;
    }
    if (!strcmp(name, "strict")) {
        *out = ls_backend_strict();
        return LS_OK;
    }
    if (!strncmp(name, "cuda", 4) && (name[4] == '\0' || name[4] == ':')) {
        long dev = 0;
        if (name[4] == ':') {
            char *end;
            errno = 0;
            dev = strtol(name + 5, &end, 10);
            if (errno || end == name + 5 || *end || dev < 0 || dev > 1023)
                return ls_err(LS_ERR_ARG, "--backend \"%s\": the device after \"cuda:\" must be a number from 0", name);
        }
        ls_status s = ls_backend_cuda_open((int)dev, out);
        if (s != LS_OK) return ls_err_ctx(s, "--backend %s", name);
        char miss[1024];
        int n = ls_backend_missing(*out, miss, sizeof miss);
        if (n) {
            ls_backend_cuda_close(*out);
            *out = NULL;
            return ls_err(LS_ERR_UNSUPPORTED, "--backend %s: the backend lacks %d op%s a model needs: %s", name, n,
                          n == 1 ? "" : "s", miss);
        }
        return LS_OK;
    }
    return ls_err(LS_ERR_ARG, "--backend \"%s\": unknown backend (choose " LS_BACKEND_NAMES ", or cuda:N)", name);
}

void ls_backend_close(const ls_backend *be) {
    if (be && be->i && be->i->name && !strcmp(be->i->name, "cuda")) ls_backend_cuda_close(be);
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
