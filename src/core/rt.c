/*
 * rt.c — the current runtime of each thread (core/rt.h).
 */
#include <stdlib.h>
#include <string.h>

#include "core/rt.h"
#include "longstraw/trace.h"

void ls_rt_init(ls_rt *rt) {
    memset(rt, 0, sizeof *rt);
    rt->trace.fd = -1;
    rt->trace.update = -1;
    rt->trace.member = -1;
    rt->trace.layers = 1;
}

static ls_rt g_process = {.trace = {.fd = -1, .update = -1, .member = -1, .layers = 1}};
static _Thread_local ls_rt *g_current;

ls_rt *ls_rt_get(void) { return g_current ? g_current : &g_process; }
ls_rt *ls_rt_process(void) { return &g_process; }

ls_rt *ls_rt_enter(ls_rt *rt) {
    ls_rt *prev = g_current;
    g_current = rt;
    return prev;
}

void ls_rt_leave(ls_rt *prev) { g_current = prev; }

void ls_rt_release(ls_rt *rt) {
    ls_rt *prev = ls_rt_enter(rt);
    (void)ls_trace_close(); /* closes the file and frees the line buffer (a no-op when off) */
    ls_rt_leave(prev);
}
