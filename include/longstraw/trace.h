/*
 * trace.h — what a run writes about itself (issue 4 §5): one JSON object per line in
 * RUN/trace.<rank>.jsonl (format: docs/trace.md), and a progress line on stderr.
 *
 * The tracer is the current runtime's (core/rt.h: the process's, or an API context's)
 * and off until ls_trace_open; every call is then a no-op, so library code calls it
 * unconditionally. Calls come from the calling thread only (the layer loops are
 * sequential; OpenMP runs inside them). Every event carries the
 * live bytes of each arena, so the trace alone draws the memory timeline.
 */
#ifndef LONGSTRAW_TRACE_H
#define LONGSTRAW_TRACE_H

#include <stdint.h>

#include "longstraw/core.h"

/* Start tracing to `path` (created or appended: a resumed run continues its trace).
 * `ar` is sampled at every event; `command` goes into the start event. The file is
 * written in place (ls_open_in_place): a symbolic link, FIFO or directory at `path` is
 * refused, never followed. */
ls_status ls_trace_open(const char *path, int rank, ls_arenas *ar, const char *command);
/* Write the end event and close; the status is ls_trace_status's (close included). */
ls_status ls_trace_close(void);
/* A command refused after the trace was opened: the file back to what it was (truncated
 * to its size then, or removed when it was made by this open), and closed. */
void ls_trace_abandon(void);
int ls_trace_on(void);
/* A failed trace write (disk full, file size limit) is an error like any other write:
 * each event is one write() of a whole line; the first that fails is remembered, its
 * partial line cut off again (the file ends with a whole line) and nothing more is
 * written. LS_ERR_IO naming the file and the system's reason once that happened, else
 * LS_OK. Callers check it where they can stop cleanly (the trainer: after each update). */
ls_status ls_trace_status(void);

/* Phase begin/end. At the end the event carries the phase's time and the peak bytes
 * of each arena while it ran (the arenas' own peaks keep their run-wide maxima). */
void ls_trace_phase_begin(const char *phase);
void ls_trace_phase_end(const char *phase);
/* The phase between the last begin and its end ("setup" outside any), tracked even
 * when no trace is written, so a failure can name where it happened. */
const char *ls_trace_current_phase(void);
/* The update (0-based) later events belong to. */
void ls_trace_set_update(int64_t update);
int64_t ls_trace_update(void);
/* The group member (−1 = none) later layer events belong to. */
void ls_trace_set_member(int member);
/* A layer finished its forward ("fwd") or backward ("bwd") pass. */
void ls_trace_layer_end(int layer, const char *pass);
/* Layer events off (e.g. during token-by-token decoding, where they would be one per
 * token per layer); returns the previous setting. */
int ls_trace_layers(int on);
/* Any other event: `fields` is a JSON object body ("\"k\": 1, \"s\": \"x\"") or NULL. */
void ls_trace_event(const char *ev, const char *fields_fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- progress on stderr -------------------------------------------------------------
 * A bar redrawn in place when stderr is a terminal, plain lines (at most one per 10 s
 * and one at the end) otherwise; off when quiet. A runtime with a progress callback
 * (an API context's) gets the reports instead, at most one per 0.2 s and the last. */
void ls_progress_enable(int on);
void ls_progress_begin(const char *what, int64_t total); /* total units (tokens) */
void ls_progress_add(int64_t done);                    /* units completed since the last call */
void ls_progress_end(void);

#endif
