/*
 * status.c — thread-local error messages and the always-on assertion.
 */
#include "longstraw/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char err_buf[1024];

ls_status ls_err(ls_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_buf, sizeof err_buf, fmt, ap);
    va_end(ap);
    return code;
}

ls_status ls_err_ctx(ls_status code, const char *fmt, ...) {
    char prefix[512], old[sizeof err_buf];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err_buf, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof err_buf - 3) n = sizeof err_buf - 3;
    memcpy(err_buf, prefix, n);
    memcpy(err_buf + n, ": ", 2);
    size_t room = sizeof err_buf - n - 3;
    size_t m = strlen(old);
    if (m > room) m = room;
    memcpy(err_buf + n + 2, old, m);
    err_buf[n + 2 + m] = 0;
    return code;
}

const char *ls_err_msg(void) { return err_buf[0] ? err_buf : "(no message)"; }

const char *ls_status_name(ls_status s) {
    switch (s) {
    case LS_OK: return "ok";
    case LS_ERR_IO: return "I/O error";
    case LS_ERR_FORMAT: return "format error";
    case LS_ERR_ARG: return "invalid argument";
    case LS_ERR_NOMEM: return "out of memory";
    case LS_ERR_UNSUPPORTED: return "unsupported";
    case LS_ERR_INTERRUPTED: return "interrupted";
    }
    return "unknown status";
}

void ls_assert_fail(const char *file, int line, const char *cond, const char *fmt, ...) {
    fprintf(stderr, "longstraw: assertion failed at %s:%d (rank %d): %s", file, line, ls_log_rank(), cond);
    if (fmt && fmt[0] == ' ') fmt++; /* LS_ASSERT prefixes one space */
    if (fmt && fmt[0]) {
        va_list ap;
        va_start(ap, fmt);
        fputs(": ", stderr);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
    }
    fputc('\n', stderr);
    abort();
}

static int g_log_rank;
void ls_set_log_rank(int rank) { g_log_rank = rank; }
int ls_log_rank(void) { return g_log_rank; }
