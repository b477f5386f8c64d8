/*
 * reward.h — rewards from an external process (`longstraw train --reward-cmd CMD`).
 * One process per run, started with `/bin/sh -c CMD`, speaks JSON Lines on its stdin
 * and answers one number per line on its stdout; its stderr is ours.
 *
 * Protocol, per item i of a batch (one group), one line each way:
 *   request  {"prompt": "...", "response": "...", "index": i, "group": group_id}\n
 *   answer   <number>\n          (strtod of the whole line after trimming whitespace)
 * All n requests of a batch are sent before (or while) the n answers are read, in order;
 * answer k is the reward of item k. A child may answer each line as soon as it has read
 * it, or read the whole batch first: both work (both pipes are polled, writes are
 * non-blocking). Strings are JSON-escaped; any bytes are accepted, and bytes that are not
 * valid UTF-8 are sent as U+FFFD (one per maximal invalid subpart), so every request is
 * valid UTF-8 JSON. An answer that is empty, has trailing text, or is NaN/±Inf is an
 * error. Smallest child (answers 1 to every request): `while read -r l; do echo 1; done`.
 * A handle is used by one thread at a time.
 */
#ifndef LONGSTRAW_REWARD_H
#define LONGSTRAW_REWARD_H

#include <stddef.h>
#include <stdint.h>

#include "longstraw/core.h"

typedef struct ls_reward_cmd ls_reward_cmd;

/* Start `/bin/sh -c CMD` with pipes to its stdin and stdout (stderr inherited), by
 * posix_spawn (vfork-like: cheap even when we hold tens of GB). The child inherits no
 * other descriptor (ours are O_CLOEXEC; with glibc ≥ 2.34 every fd ≥ 3 is also closed
 * at spawn, covering fds others opened without O_CLOEXEC), gets SIGPIPE at its default
 * action and an empty signal mask, and runs in its own process group so that
 * ls_reward_cmd_stop can kill a whole pipeline (a terminal's Ctrl-C therefore reaches
 * only us; the child sees EOF on stdin when we exit). The handle and its buffers are
 * malloc'd (lifetime: until stop). Fails only when /bin/sh cannot be spawned: a command
 * that does not exist is noticed at the first score (sh exits with status 127). */
ls_status ls_reward_cmd_start(ls_reward_cmd **out, const char *cmd);

/* Seconds to wait for each answer (default 60; the clock restarts at the start of
 * ls_reward_cmd_score and whenever an answer arrives). Must be finite and > 0. */
ls_status ls_reward_cmd_set_timeout(ls_reward_cmd *rc, double seconds);

/* Score a batch: for each i writes one JSON object line {"prompt": "...", "response":
 * "...", "index": i, "group": group_id} (strings JSON-escaped, any bytes: invalid UTF-8
 * replaced by U+FFFD) to the process and reads one line per item answering a number
 * (strtod, the whole line after trimming whitespace; NaN/Inf rejected) into rewards[i].
 * Errors name the command and what went wrong: the process exited (with its status)
 * before answering item i; output line k "abc" is not a number; timeout after N s
 * waiting for item i; more lines than items. After an error the process is out of step
 * with us and every later call fails; rewards[] is then only partly written.
 * SIGPIPE: while writing, SIGPIPE is blocked in the calling thread and a SIGPIPE raised
 * by our own write (child closed its stdin) is consumed before the mask is restored, so
 * a dead child is an EPIPE error, never a signal, and the process-wide disposition is
 * left alone. Prompts of any size: the prompt is escaped once per call, not per item. */
ls_status ls_reward_cmd_score(ls_reward_cmd *rc, const char *prompt, size_t prompt_len,
                              const char *const *responses, const size_t *response_lens, int n, int64_t group_id,
                              double *rewards);

/* Close the child's stdin, wait for it to exit (up to 3 s, draining its stdout; no
 * wait after a timeout), then SIGKILL its process group; free. NULL is a no-op. */
void ls_reward_cmd_stop(ls_reward_cmd *rc);
/* The process group of the running command (0 when none), for a signal handler
 * (ls_reward_cmd_kill_group). */
int ls_reward_cmd_pgid(const ls_reward_cmd *rc);

/* End process group `pgid` (a reward command's) from anywhere, a signal handler included
 * (async-signal-safe: kill, waitpid, nanosleep): SIGTERM, then after `grace_s` seconds
 * SIGKILL to whatever of the group is still alive, so a command that ignores or traps
 * SIGTERM cannot outlive us; returns once the group is gone (or 1 s after the SIGKILL).
 * Group members that are our children are reaped. pgid <= 0: nothing. */
void ls_reward_cmd_kill_group(int pgid, double grace_s);
#define LS_REWARD_KILL_GRACE_S 2.0 /* the grace a second Ctrl-C gives the reward command */

#endif
