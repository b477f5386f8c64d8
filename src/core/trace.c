/*
 * trace.c — the run's trace (docs/trace.md) and the progress line on stderr (or the
 * runtime's progress callback). The state is the current runtime's (core/rt.h), used
 * from the calling thread only (see trace.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "longstraw/files.h"
#include "longstraw/trace.h"
#include "core/rt.h"

/* The current runtime's trace (core/rt.h). */
#define T (ls_rt_get()->trace)

int ls_trace_on(void) { return T.fd >= 0; }

/* Append printf-style text to the event being built. */
static void out(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void vout(const char *fmt, va_list ap) {
    if (T.err) return;
    for (;;) {
        va_list aq;
        va_copy(aq, ap);
        size_t room = T.cap - T.len;
        int n = vsnprintf(T.line ? T.line + T.len : NULL, room, fmt, aq);
        va_end(aq);
        if (n < 0) {
            T.err = EINVAL;
            return;
        }
        if ((size_t)n < room) {
            T.len += (size_t)n;
            return;
        }
        size_t cap = T.cap ? T.cap : 512;
        while (cap < T.len + (size_t)n + 1) cap *= 2;
        char *l = realloc(T.line, cap);
        if (!l) {
            T.err = ENOMEM;
            return;
        }
        T.line = l, T.cap = cap;
    }
}
static void out(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vout(fmt, ap);
    va_end(ap);
}

/* "{"t": .., "ev": "..", "live": [..]" — the caller adds fields and closes. */
static void head(const char *ev) {
    T.len = 0;
    out("{\"t\": %.6f, \"ev\": \"%s\", \"live\": [", ls_now() - T.t0, ev);
    for (int a = 0; a < LS_ARENA_COUNT; a++) out("%s%zu", a ? ", " : "", T.ar->a[a].cur);
    out("]");
}

/* Close the event and write its line with one write(): a crash loses at most the event
 * being written. A failed write (disk full, file size limit) is remembered and reported
 * (ls_trace_status); a partly written line is cut off again, so the file always ends
 * with a whole line, and nothing is written after the failure. */
static void tail(void) {
    out("}\n");
    if (T.err) return;
    size_t off = 0;
    while (off < T.len) {
        ssize_t w = write(T.fd, T.line + off, T.len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            T.err = w < 0 ? errno : EIO;
            if (off && ftruncate(T.fd, (off_t)T.size) != 0) { /* the cut line stays: readers skip it (docs/trace.md) */
            }
            return;
        }
        off += (size_t)w;
    }
    T.size += (int64_t)T.len;
}

ls_status ls_trace_open(const char *path, int rank, ls_arenas *ar, const char *command) {
    ls_trace_close();
    /* in place in the run directory: a symbolic link or FIFO planted there is refused */
    int fd;
    struct stat st;
    int created = lstat(path, &st) != 0 && errno == ENOENT;
    LS_TRY(ls_open_in_place(path, O_WRONLY | O_APPEND, &fd));
    T.fd = fd;
    T.size = fstat(fd, &st) == 0 ? (int64_t)st.st_size : 0;
    T.size0 = T.size, T.created = created;
    T.err = 0;
    snprintf(T.path, sizeof T.path, "%s", path);
    T.ar = ar;
    T.t0 = ls_now();
    T.update = -1;
    T.member = -1;
    T.layers = 1;
    T.phase = NULL;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    head("start");
    out(", \"rank\": %d, \"pid\": %ld, \"time_unix\": %.6f, \"command\": \"%s\", \"arenas\": [", rank, (long)getpid(),
        (double)tv.tv_sec + tv.tv_usec * 1e-6, command);
    for (int a = 0; a < LS_ARENA_COUNT; a++) out("%s\"%s\"", a ? ", " : "", ls_arena_id_name((ls_arena_id)a));
    out("]");
    tail();
    return ls_trace_status();
}

void ls_trace_abandon(void) {
    if (T.fd < 0) return;
    char path[sizeof T.path];
    snprintf(path, sizeof path, "%s", T.path);
    int created = T.created;
    if (!created && ftruncate(T.fd, (off_t)T.size0) != 0) { /* (as it was, or as far as it can be) */
    }
    close(T.fd);
    T.fd = -1;
    if (created) unlink(path);
}

ls_status ls_trace_status(void) {
    if (T.fd < 0 || !T.err) return LS_OK;
    return ls_err(LS_ERR_IO, "%s: cannot write the trace: %s (it ends at its last whole line)", T.path, strerror(T.err));
}

ls_status ls_trace_close(void) {
    if (T.fd < 0) return LS_OK;
    head("end");
    tail();
    if (close(T.fd) != 0 && !T.err) T.err = errno;
    ls_status s = ls_trace_status();
    T.fd = -1;
    T.err = 0;
    free(T.line);
    T.line = NULL;
    T.len = T.cap = 0;
    return s;
}

void ls_trace_set_update(int64_t update) { T.update = update; }
int64_t ls_trace_update(void) { return T.update; }
void ls_trace_set_member(int member) { T.member = member; }

int ls_trace_layers(int on) {
    int old = T.layers;
    T.layers = on;
    return old;
}

/* The phase running now, kept whether or not a trace is written: a fault names it. */
const char *ls_trace_current_phase(void) {
    const char *ph = ls_rt_get()->phase;
    return ph ? ph : "setup";
}

void ls_trace_phase_begin(const char *phase) {
    ls_rt_get()->phase = phase;
    if (T.fd < 0) return;
    /* measure the phase's own peak: remember the run-wide peaks, restart them at the
     * current level, and fold them back at the end */
    for (int a = 0; a < LS_ARENA_COUNT; a++) {
        ls_arena *ar = &T.ar->a[a];
        T.saved_peak[a] = ar->peak;
        ls_arena_reset_peak(ar);
    }
    T.phase = phase;
    T.phase_t0 = ls_now();
    head("phase_begin");
    out(", \"phase\": \"%s\", \"update\": %lld", phase, (long long)T.update);
    tail();
}

void ls_trace_phase_end(const char *phase) {
    ls_rt_get()->phase = NULL;
    if (T.fd < 0) return;
    head("phase_end");
    out(", \"phase\": \"%s\", \"update\": %lld, \"s\": %.6f, \"peak\": [", phase, (long long)T.update,
        ls_now() - T.phase_t0);
    for (int a = 0; a < LS_ARENA_COUNT; a++) {
        ls_arena *ar = &T.ar->a[a];
        out("%s%zu", a ? ", " : "", ar->peak);
        if (T.saved_peak[a] > ar->peak) ar->peak = T.saved_peak[a];
    }
    out("]");
    tail();
    T.phase = NULL;
}

void ls_trace_layer_end(int layer, const char *pass) {
    if (T.fd < 0 || !T.layers) return;
    head("layer_end");
    out(", \"phase\": \"%s\", \"update\": %lld, \"pass\": \"%s\", \"layer\": %d, \"member\": %d",
        T.phase ? T.phase : "", (long long)T.update, pass, layer, T.member);
    tail();
}

void ls_trace_event(const char *ev, const char *fmt, ...) {
    if (T.fd < 0) return;
    head(ev);
    if (fmt) {
        out(", ");
        va_list ap;
        va_start(ap, fmt);
        vout(fmt, ap);
        va_end(ap);
    }
    tail();
}

/* ---- progress ------------------------------------------------------------------ */

/* The current runtime's progress line. */
#define P (ls_rt_get()->progress)

void ls_progress_enable(int on) {
    P.enabled = on;
    P.tty = !P.fn && isatty(STDERR_FILENO);
}

static void fmt_eta(char *buf, size_t n, double s) {
    if (!(s >= 0) || s > 1e7) snprintf(buf, n, "--:--");
    else if (s >= 3600) snprintf(buf, n, "%d:%02d:%02d", (int)s / 3600, (int)s / 60 % 60, (int)s % 60);
    else snprintf(buf, n, "%d:%02d", (int)s / 60, (int)s % 60);
}

static void draw(int final) {
    double now = ls_now(), el = now - P.t0;
    if (P.fn) { /* a host's callback instead of the line */
        P.fn(P.user, P.what, P.done, P.total, el, final);
        P.last = now;
        return;
    }
    double rate = el > 0 ? (double)P.done / el : 0;
    double frac = P.total > 0 ? (double)P.done / (double)P.total : 1;
    char eta[32];
    fmt_eta(eta, sizeof eta, final ? el : (rate > 0 ? (double)(P.total - P.done) / rate : -1));
    if (P.tty) {
        char bar[31];
        int k = (int)(frac * 30 + 0.5);
        for (int i = 0; i < 30; i++) bar[i] = i < k ? '#' : '.';
        bar[30] = 0;
        fprintf(stderr, "\r  %-8s [%s] %3d%% %lld/%lld tok  %.0f tok/s  %s %s\033[K%s", P.what, bar,
                (int)(frac * 100), (long long)P.done, (long long)P.total, rate, final ? "took" : "ETA", eta,
                final ? "\n" : "");
    } else {
        fprintf(stderr, "  %s: %lld/%lld tokens (%d%%), %.0f tok/s, %s %s\n", P.what, (long long)P.done,
                (long long)P.total, (int)(frac * 100), rate, final ? "took" : "ETA", eta);
    }
    P.last = now;
}

void ls_progress_begin(const char *what, int64_t total) {
    if (!P.enabled) return;
    P.active = 1;
    P.what = what;
    P.total = total;
    P.done = 0;
    P.t0 = P.last = ls_now();
    if (P.tty || P.fn) draw(0);
}

void ls_progress_add(int64_t done) {
    if (!P.enabled || !P.active) return;
    P.done += done;
    double now = ls_now();
    if (now - P.last >= (P.tty || P.fn ? 0.2 : 10.0)) draw(0);
}

void ls_progress_end(void) {
    if (!P.enabled || !P.active) return;
    P.active = 0;
    draw(1);
}
