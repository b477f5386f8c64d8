/*
 * rt.h — the run-time state a context owns (issue 23): the thread count, the stop
 * request, the trace, the progress line, the reward process group and the staging
 * statistics. They were process globals; now each thread has a current ls_rt — the
 * process's own until something enters another — and library code reads the current
 * one. The CLI runs on the process's; the C API enters its context's for each call
 * (ls_rt_enter / ls_rt_leave), so two contexts in one process do not see each other's
 * stop requests, trace or progress.
 *
 * Read from the calling thread only, never from inside an OpenMP region (a worker
 * thread's current runtime is the process's). What stays process-wide, by nature: the
 * MPI world (dist/comm.c), the rank that assertion messages name (status.c) and the
 * measured sgemm rate (runtime.c). OpenBLAS's thread count is process-wide too: each
 * API call sets it from its context.
 */
#ifndef LS_CORE_RT_H
#define LS_CORE_RT_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "longstraw/core.h"

/* The trace (trace.c). */
typedef struct {
    int fd; /* -1: tracing off */
    char path[4096];
    int64_t size;  /* bytes of whole lines in the file */
    int64_t size0; /* ... when it was opened, and whether it was made then (ls_trace_abandon) */
    int created;
    int err; /* errno of the first failed write (0: none); nothing is written after it */
    char *line; /* the event being built */
    size_t len, cap;
    ls_arenas *ar;
    double t0;
    int64_t update;
    int member;
    int layers;
    const char *phase; /* the traced phase (static strings) */
    double phase_t0;
    size_t saved_peak[LS_ARENA_COUNT];
} ls_rt_trace;

/* A progress report: `what` (static), units done of total, seconds since it began,
 * final (the last report of this span). */
typedef void (*ls_progress_fn)(void *user, const char *what, int64_t done, int64_t total, double seconds, int final);

/* The progress line (trace.c). */
typedef struct {
    int enabled, tty, active;
    const char *what;
    int64_t total, done;
    double t0, last;
    ls_progress_fn fn; /* NULL: the line on stderr (the CLI) */
    void *user;
} ls_rt_progress;

typedef struct ls_rt {
    int threads;                 /* 0: all cores */
    volatile sig_atomic_t stop;  /* a stop request: the signal, or 0 */
    const char *phase;           /* the phase running now, traced or not (NULL: setup) */
    ls_rt_trace trace;
    ls_rt_progress progress;
    volatile int reward_pgid;    /* the running reward command's process group (0: none) */
    size_t made_dev[32], made_host[32]; /* staging statistics (state/stage.c) */
} ls_rt;

/* A runtime in its initial state (tracing and progress off, no stop); ls_rt_release
 * frees what its trace holds (closing an open trace first). */
void ls_rt_init(ls_rt *rt);
void ls_rt_release(ls_rt *rt);
/* This thread's current runtime (never NULL). */
ls_rt *ls_rt_get(void);
/* The process's own (the CLI's; where a signal handler's stop request goes). */
ls_rt *ls_rt_process(void);
/* Make rt current on this thread; returns the one to give back to ls_rt_leave. */
ls_rt *ls_rt_enter(ls_rt *rt);
void ls_rt_leave(ls_rt *prev);

#endif
