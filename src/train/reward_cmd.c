/*
 * reward_cmd.c — rewards from an external process (`--reward-cmd CMD`): spawn
 * `/bin/sh -c CMD`, send one JSON line per item, read one number per line back.
 * The batch is pipelined through one poll() loop over both pipes with a non-blocking
 * write end, so a child that answers while it reads cannot deadlock against us however
 * large the prompt (we never block in write while its answers fill its stdout pipe).
 * Protocol and error contract: include/longstraw/reward.h.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pipe2, posix_spawn_file_actions_addclosefrom_np */
#endif

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "longstraw/reward.h"
#include "longstraw/tokenizer.h"

extern char **environ;

#define RC_STOP_GRACE_S 3.0     /* ls_reward_cmd_stop: wait this long after EOF on stdin */
#define RC_EOF_REAP_S 1.0       /* after EOF on its stdout, wait this long for the exit status */
#define RC_MAX_LINE (1u << 20)  /* an answer line longer than this is an error */
#define RC_READ_CHUNK (1u << 16)

struct ls_reward_cmd {
    char *cmd;        /* malloc'd copy of CMD */
    char name[128];   /* CMD shortened to one line for messages */
    pid_t pid;        /* child, also its process group id */
    int in_fd;        /* our (write, non-blocking) end of its stdin; -1 once closed */
    int out_fd;       /* our (read, non-blocking) end of its stdout; -1 once closed */
    int reaped;       /* waitpid done; wstatus valid */
    int wstatus;
    int broken;       /* out of step after an error: every later score fails */
    int timed_out;    /* stop kills at once */
    double timeout_s; /* per answer */
    int64_t lines;    /* answer lines read since start (for messages) */
    int64_t batches;  /* batches completed */
    int last_n;       /* items in the last completed batch */
    char *head;       /* `{"prompt": "<escaped>", "response": ` of the current batch */
    size_t head_len, head_cap;
    char *tail; /* `"<escaped response>", "index": i, "group": g}\n` of the item being written */
    size_t tail_len, tail_cap;
    char *rbuf; /* bytes read, not yet consumed as lines */
    size_t rlen, rcap;
};

/* ---- small helpers ---------------------------------------------------------- */

/* Grow *buf to hold need bytes (heap, lifetime of rc). 0 on success. */
static int buf_reserve(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 256;
    while (c < need) {
        if (ls_mul_size(c, 2, &c)) return -1;
    }
    char *nb = realloc(*buf, c);
    if (!nb) return -1;
    *buf = nb;
    *cap = c;
    return 0;
}

/* Every error marks rc out of step and is prefixed with the command. */
static ls_status rc_fail(ls_reward_cmd *rc, ls_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ls_status rc_fail(ls_reward_cmd *rc, ls_status code, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    rc->broken = 1;
    return ls_err(code, "reward command '%s': %s", rc->name, msg);
}

/* Printable, truncated copy of untrusted bytes for a message. */
static void show_bytes(char *dst, size_t cap, const char *s, size_t n) {
    size_t o = 0, limit = 60;
    for (size_t i = 0; i < n && o + 8 < cap; i++) {
        if (i == limit) {
            o += (size_t)snprintf(dst + o, cap - o, "...");
            break;
        }
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') o += (size_t)snprintf(dst + o, cap - o, "\\%c", c);
        else if (c >= 0x20 && c < 0x7f) dst[o++] = (char)c;
        else o += (size_t)snprintf(dst + o, cap - o, "\\x%02x", c);
    }
    dst[o < cap ? o : cap - 1] = 0;
}

static void describe_status(char *dst, size_t cap, int st) {
    if (WIFEXITED(st))
        snprintf(dst, cap, "exited with status %d%s", WEXITSTATUS(st),
                 WEXITSTATUS(st) == 127 ? " (command not found?)"
                 : WEXITSTATUS(st) == 126 ? " (command not executable?)" : "");
    else if (WIFSIGNALED(st))
        snprintf(dst, cap, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(dst, cap, "ended with wait status 0x%x", (unsigned)st);
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* waitpid(WNOHANG) until the child is reaped or wait_s has passed; 1 when reaped. */
static int reap(ls_reward_cmd *rc, double wait_s) {
    if (rc->reaped) return 1;
    double until = ls_now() + wait_s;
    for (;;) {
        int st;
        pid_t r = waitpid(rc->pid, &st, WNOHANG);
        if (r == rc->pid) {
            rc->reaped = 1;
            rc->wstatus = st;
            return 1;
        }
        if (r < 0 && errno != EINTR) { /* ECHILD: someone else reaped it (SIGCHLD ignored) */
            rc->reaped = 1;
            rc->wstatus = 0;
            return 1;
        }
        if (ls_now() >= until) return 0;
        sleep_ms(2);
    }
}

static void close_fd(int *fd) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

/* Move fd to ≥ 3 (keeping O_CLOEXEC) so dup2 onto 0/1 in the child never aliases it. */
static int fd_above_stdio(int fd) {
    if (fd < 0 || fd > 2) return fd;
    int nfd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    close(fd);
    return nfd;
}

static int set_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* ---- JSON escaping ------------------------------------------------------------ */

/* Write s as a quoted JSON string at dst (when dst != NULL); return its length.
 * Worst case 6 bytes per input byte (control bytes as \u00XX). */
static size_t json_escape(char *dst, const char *src, size_t n) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)src;
    size_t o = 0;
#define PUT(c) ((dst ? (void)(dst[o] = (char)(c)) : (void)0), o++) /* an expression: PUT(a), PUT(b) */
    PUT('"');
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t adv;
        if (c >= 0x80) {
            if (ls_tok_utf8_seq(s + i, n - i, &adv)) {
                for (size_t k = 0; k < adv; k++) PUT(s[i + k]);
            } else {
                PUT(0xEF), PUT(0xBF), PUT(0xBD); /* U+FFFD */
            }
            i += adv;
            continue;
        }
        i++;
        switch (c) {
        case '"': PUT('\\'), PUT('"'); break;
        case '\\': PUT('\\'), PUT('\\'); break;
        case '\n': PUT('\\'), PUT('n'); break;
        case '\r': PUT('\\'), PUT('r'); break;
        case '\t': PUT('\\'), PUT('t'); break;
        case '\b': PUT('\\'), PUT('b'); break;
        case '\f': PUT('\\'), PUT('f'); break;
        default:
            if (c < 0x20 || c == 0x7f) {
                PUT('\\'), PUT('u'), PUT('0'), PUT('0'), PUT(hex[c >> 4]), PUT(hex[c & 15]);
            } else {
                PUT(c);
            }
        }
    }
    PUT('"');
#undef PUT
    return o;
}

/* Escape into *buf at offset *len, growing it. 0 on success. */
static int append_escaped(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    size_t e = json_escape(NULL, s, n), need;
    if (ls_add_size(*len, e, &need) || ls_add_size(need, 1, &need) || buf_reserve(buf, cap, need)) return -1;
    *len += json_escape(*buf + *len, s, n);
    return 0;
}

static int append_str(char **buf, size_t *len, size_t *cap, const char *s) {
    size_t n = strlen(s), need;
    if (ls_add_size(*len, n, &need) || ls_add_size(need, 1, &need) || buf_reserve(buf, cap, need)) return -1;
    memcpy(*buf + *len, s, n);
    *len += n;
    return 0;
}

/* ---- start / stop ------------------------------------------------------------- */

ls_status ls_reward_cmd_start(ls_reward_cmd **out, const char *cmd) {
    LS_ASSERT(out);
    *out = NULL;
    if (!cmd || !cmd[0]) return ls_err(LS_ERR_ARG, "--reward-cmd: the command is empty");
    ls_reward_cmd *rc = calloc(1, sizeof *rc);
    if (!rc) return ls_err(LS_ERR_NOMEM, "reward command: cannot allocate its handle");
    rc->in_fd = rc->out_fd = -1;
    rc->pid = -1;
    rc->timeout_s = 60.0;
    rc->cmd = strdup(cmd);
    if (!rc->cmd) {
        free(rc);
        return ls_err(LS_ERR_NOMEM, "reward command: cannot copy the command");
    }
    {
        size_t n = strlen(cmd), lim = sizeof rc->name - 4, k;
        for (k = 0; k < n && k < lim; k++) rc->name[k] = (cmd[k] == '\n' || cmd[k] == '\r') ? ' ' : cmd[k];
        if (k < n) memcpy(rc->name + k, "...", 3), k += 3;
        rc->name[k] = 0;
    }
    int to_child[2] = {-1, -1}, from_child[2] = {-1, -1};
    ls_status s = LS_OK;
    if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) {
        s = ls_err(LS_ERR_IO, "reward command '%s' could not be started: pipe: %s", rc->name, strerror(errno));
        goto fail;
    }
    for (int k = 0; k < 2; k++) {
        to_child[k] = fd_above_stdio(to_child[k]);
        from_child[k] = fd_above_stdio(from_child[k]);
    }
    if (to_child[0] < 0 || to_child[1] < 0 || from_child[0] < 0 || from_child[1] < 0 || set_nonblock(to_child[1]) ||
        set_nonblock(from_child[0])) {
        s = ls_err(LS_ERR_IO, "reward command '%s' could not be started: fcntl: %s", rc->name, strerror(errno));
        goto fail;
    }

    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    if (posix_spawn_file_actions_init(&fa) != 0) {
        s = ls_err(LS_ERR_NOMEM, "reward command '%s' could not be started: out of memory", rc->name);
        goto fail;
    }
    if (posix_spawnattr_init(&at) != 0) {
        posix_spawn_file_actions_destroy(&fa);
        s = ls_err(LS_ERR_NOMEM, "reward command '%s' could not be started: out of memory", rc->name);
        goto fail;
    }
    /* Only 0 and 1 are made inheritable (dup2 clears O_CLOEXEC); the originals and all our
     * other pipes are O_CLOEXEC. closefrom(3) also drops fds others opened without it. */
    int e = posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
    if (!e) e = posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
    if (!e) e = posix_spawn_file_actions_addclosefrom_np(&fa, 3);
#endif
    /* SIGPIPE at its default action (we may run with it ignored), nothing blocked, and a
     * process group of its own so stop can kill a whole pipeline. */
    sigset_t def, none;
    sigemptyset(&def);
    sigaddset(&def, SIGPIPE);
    sigemptyset(&none);
    if (!e) e = posix_spawnattr_setsigdefault(&at, &def);
    if (!e) e = posix_spawnattr_setsigmask(&at, &none);
    if (!e) e = posix_spawnattr_setpgroup(&at, 0);
    if (!e) e = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP);
    char *argv[] = {"sh", "-c", rc->cmd, NULL};
    if (!e) e = posix_spawn(&rc->pid, "/bin/sh", &fa, &at, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    if (e) {
        rc->pid = -1;
        s = ls_err(LS_ERR_IO, "reward command '%s' could not be started: /bin/sh: %s", rc->name, strerror(e));
        goto fail;
    }
    close(to_child[0]);
    close(from_child[1]);
    rc->in_fd = to_child[1];
    rc->out_fd = from_child[0];
    *out = rc;
    return LS_OK;
fail:
    for (int k = 0; k < 2; k++) {
        close_fd(&to_child[k]);
        close_fd(&from_child[k]);
    }
    free(rc->cmd);
    free(rc);
    return s;
}

ls_status ls_reward_cmd_set_timeout(ls_reward_cmd *rc, double seconds) {
    LS_ASSERT(rc);
    if (!(seconds > 0) || !isfinite(seconds))
        return ls_err(LS_ERR_ARG, "reward command timeout %g s: expected a finite number of seconds > 0", seconds);
    rc->timeout_s = seconds;
    return LS_OK;
}

void ls_reward_cmd_stop(ls_reward_cmd *rc) {
    if (!rc) return;
    close_fd(&rc->in_fd); /* EOF on its stdin: a well-behaved child exits now */
    if (rc->pid > 0 && !rc->reaped) {
        /* Drain its stdout while waiting, so a child that prints on exit cannot block. */
        double until = ls_now() + (rc->timed_out ? 0.0 : RC_STOP_GRACE_S);
        while (!reap(rc, 0.0) && ls_now() < until) {
            if (rc->out_fd >= 0) {
                struct pollfd p = {rc->out_fd, POLLIN, 0};
                if (poll(&p, 1, 10) > 0) {
                    char junk[4096];
                    ssize_t r = read(rc->out_fd, junk, sizeof junk);
                    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) close_fd(&rc->out_fd);
                }
            } else {
                sleep_ms(5);
            }
        }
        if (!rc->reaped) {
            kill(-rc->pid, SIGKILL); /* its process group: sh and whatever it started */
            kill(rc->pid, SIGKILL);
            int st;
            while (waitpid(rc->pid, &st, 0) < 0 && errno == EINTR) {
            }
            rc->reaped = 1;
        }
    }
    close_fd(&rc->out_fd);
    free(rc->cmd);
    free(rc->head);
    free(rc->tail);
    free(rc->rbuf);
    free(rc);
}

/* Async-signal-safe (kill, waitpid, nanosleep only): a second Ctrl-C's handler ends the
 * process group this way, so a command that ignores SIGTERM cannot outlive us. */
void ls_reward_cmd_kill_group(int pgid, double grace_s) {
    if (pgid <= 0) return;
    int saved = errno, st;
    kill(-pgid, SIGTERM);
    for (int phase = 0; phase < 2; phase++) {
        /* phase 0: the grace period after SIGTERM; phase 1: SIGKILL, then up to 1 s for
         * the kernel to end them */
        long steps = phase == 0 ? (grace_s > 0 ? (long)(grace_s * 100.0) : 0) : 100;
        if (phase == 1) kill(-pgid, SIGKILL);
        for (long i = 0; i <= steps; i++) {
            /* reap what of the group is ours (the shell; orphans too when we are PID 1),
             * so a zombie does not count as alive */
            while (waitpid(-pgid, &st, WNOHANG) > 0) {
            }
            if (kill(-pgid, 0) != 0 && errno == ESRCH) {
                errno = saved;
                return;
            }
            if (i < steps) {
                struct timespec ts = {0, 10000000L};
                nanosleep(&ts, NULL);
            }
        }
    }
    errno = saved;
}

/* ---- one batch ---------------------------------------------------------------- */

/* Parse one answer line (without its '\n'). 0: ok; 1: not a number; 2: not finite. */
static int parse_answer(const char *s, size_t n, double *out) {
    while (n > 0 && isspace((unsigned char)s[0])) s++, n--;
    while (n > 0 && isspace((unsigned char)s[n - 1])) n--;
    char tmp[512];
    if (n == 0 || n >= sizeof tmp || memchr(s, 0, n)) return 1;
    memcpy(tmp, s, n);
    tmp[n] = 0;
    char *end;
    errno = 0;
    double v = strtod(tmp, &end);
    if (end != tmp + n) return 1;
    if (!isfinite(v)) return 2; /* nan, inf, and 1e999 (overflow) */
    *out = v;
    return 0;
}

/* The process is gone (EOF on its stdout): say how, before which item. */
static ls_status fail_exited(ls_reward_cmd *rc, int item, int n) {
    char how[160];
    if (reap(rc, RC_EOF_REAP_S)) describe_status(how, sizeof how, rc->wstatus);
    else snprintf(how, sizeof how, "closed its standard output (still running)");
    char partial[300] = "";
    if (rc->rlen > 0) {
        char shown[256];
        show_bytes(shown, sizeof shown, rc->rbuf, rc->rlen);
        snprintf(partial, sizeof partial, "; its last output \"%s\" has no newline", shown);
    }
    return rc_fail(rc, LS_ERR_IO, "%s before answering item %d (%d of %d answered in this batch%s)", how, item, item,
                   n, partial);
}

/* Read what is available; consume complete lines into rewards[*got..n). */
static ls_status read_answers(ls_reward_cmd *rc, double *rewards, int n, int *got, int *eof) {
    for (;;) {
        size_t need;
        if (ls_add_size(rc->rlen, RC_READ_CHUNK, &need) || buf_reserve(&rc->rbuf, &rc->rcap, need))
            return rc_fail(rc, LS_ERR_NOMEM, "cannot grow the answer buffer");
        ssize_t r = read(rc->out_fd, rc->rbuf + rc->rlen, RC_READ_CHUNK);
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            return rc_fail(rc, LS_ERR_IO, "reading its output: %s", strerror(errno));
        }
        if (r == 0) {
            *eof = 1;
            break;
        }
        size_t scan = rc->rlen; /* bytes before were already searched for '\n' */
        rc->rlen += (size_t)r;
        size_t start = 0;
        char *nl;
        while ((nl = memchr(rc->rbuf + scan, '\n', rc->rlen - scan))) {
            size_t end = (size_t)(nl - rc->rbuf);
            const char *line = rc->rbuf + start;
            size_t len = end - start;
            rc->lines++;
            if (*got >= n) {
                char shown[256];
                show_bytes(shown, sizeof shown, line, len);
                return rc_fail(rc, LS_ERR_FORMAT,
                               "printed more lines than the %d requests of this batch (output line %" PRId64
                               " is \"%s\"); expected exactly one number per request",
                               n, rc->lines, shown);
            }
            int bad = parse_answer(line, len, &rewards[*got]);
            if (bad) {
                char shown[256];
                show_bytes(shown, sizeof shown, line, len);
                return rc_fail(rc, LS_ERR_FORMAT,
                               "answer line %" PRId64 " \"%s\" (for item %d of this batch) is not a%s number; "
                               "expected one finite number per line",
                               rc->lines, shown, *got, bad == 2 ? " finite" : "");
            }
            (*got)++;
            start = scan = end + 1;
        }
        if (start > 0) {
            memmove(rc->rbuf, rc->rbuf + start, rc->rlen - start);
            rc->rlen -= start;
        }
        if (rc->rlen > RC_MAX_LINE)
            return rc_fail(rc, LS_ERR_FORMAT, "answer line %" PRId64 " is longer than %u bytes without a newline",
                           rc->lines + 1, RC_MAX_LINE);
        if (*got >= n && rc->rlen == 0) break; /* done; do not wait for more */
    }
    return LS_OK;
}

/* Build the request tail of item i into rc->tail. */
static ls_status build_tail(ls_reward_cmd *rc, const char *resp, size_t len, int i, int64_t group_id) {
    char num[96];
    snprintf(num, sizeof num, ", \"index\": %d, \"group\": %" PRId64 "}\n", i, group_id);
    rc->tail_len = 0;
    if (append_escaped(&rc->tail, &rc->tail_len, &rc->tail_cap, resp, len) ||
        append_str(&rc->tail, &rc->tail_len, &rc->tail_cap, num))
        return rc_fail(rc, LS_ERR_NOMEM, "cannot build the request for item %d (%zu response bytes)", i, len);
    return LS_OK;
}

static ls_status run_batch(ls_reward_cmd *rc, const char *const *responses, const size_t *response_lens, int n,
                           int64_t group_id, double *rewards, int *saw_epipe) {
    int wi = 0, wseg = 0; /* writing item wi: segment 0 = head, 1 = tail */
    size_t woff = 0;
    int got = 0, eof = 0;

    /* Anything readable before the first request is stray output (or EOF: it exited). */
    for (;;) {
        char early[256];
        ssize_t r = read(rc->out_fd, early, sizeof early);
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) return fail_exited(rc, 0, n);
        if (r > 0) {
            char shown[256];
            show_bytes(shown, sizeof shown, early, (size_t)r);
            if (rc->batches == 0)
                return rc_fail(rc, LS_ERR_FORMAT,
                               "printed \"%s\" before receiving its first request; expected one answer line per "
                               "request line", shown);
            return rc_fail(rc, LS_ERR_FORMAT,
                           "printed \"%s\" after the %d answers of the last batch, before receiving a request "
                           "(more answer lines than requests?)", shown, rc->last_n);
        }
        break; /* EAGAIN: nothing pending, as expected */
    }
    LS_TRY(build_tail(rc, responses[0], response_lens[0], 0, group_id));

    double deadline = ls_now() + rc->timeout_s;
    while (got < n) {
        int want_write = wi < n && rc->in_fd >= 0;
        struct pollfd p[2] = {{rc->out_fd, POLLIN, 0}, {rc->in_fd, POLLOUT, 0}};
        double left = deadline - ls_now();
        if (!(left > 0)) {
            rc->timed_out = 1;
            return rc_fail(rc, LS_ERR_IO,
                           "timeout after %g s waiting for the answer to item %d (%d of %d answered; %d of %d "
                           "requests sent)",
                           rc->timeout_s, got, got, n, wi, n);
        }
        double ms = ceil(left * 1000.0);
        int r = poll(p, want_write ? 2 : 1, ms > INT_MAX ? INT_MAX : (int)ms);
        if (r < 0) {
            if (errno == EINTR) continue;
            return rc_fail(rc, LS_ERR_IO, "poll: %s", strerror(errno));
        }
        if (r == 0) continue;
        if (want_write && p[1].revents) {
            /* Write until the pipe is full; never blocks (O_NONBLOCK). */
            while (wi < n) {
                const char *buf = wseg == 0 ? rc->head : rc->tail;
                size_t len = wseg == 0 ? rc->head_len : rc->tail_len;
                ssize_t w = write(rc->in_fd, buf + woff, len - woff);
                if (w < 0) {
                    if (errno == EINTR) continue;
                    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
                    if (errno == EPIPE) { /* it closed its stdin: read what it still says */
                        *saw_epipe = 1;
                        close_fd(&rc->in_fd);
                        break;
                    }
                    return rc_fail(rc, LS_ERR_IO, "writing request %d: %s", wi, strerror(errno));
                }
                woff += (size_t)w;
                if (woff < len) continue;
                woff = 0;
                if (wseg == 0) {
                    wseg = 1;
                } else {
                    wseg = 0;
                    if (++wi < n) LS_TRY(build_tail(rc, responses[wi], response_lens[wi], wi, group_id));
                }
            }
        }
        if (p[0].revents) {
            int before = got;
            LS_TRY(read_answers(rc, rewards, n, &got, &eof));
            if (got > before) deadline = ls_now() + rc->timeout_s;
            if (eof && got < n) return fail_exited(rc, got, n);
        }
    }
    if (wi < n)
        return rc_fail(rc, LS_ERR_FORMAT, "gave all %d answers before request %d was even sent; expected one answer "
                       "line per request line", n, wi);
    if (rc->rlen > 0) {
        char shown[256];
        show_bytes(shown, sizeof shown, rc->rbuf, rc->rlen);
        return rc_fail(rc, LS_ERR_FORMAT, "printed more than the %d answers of this batch (extra output \"%s\")", n,
                       shown);
    }
    rc->batches++;
    rc->last_n = n;
    return LS_OK;
}

ls_status ls_reward_cmd_score(ls_reward_cmd *rc, const char *prompt, size_t prompt_len,
                              const char *const *responses, const size_t *response_lens, int n, int64_t group_id,
                              double *rewards) {
    LS_ASSERT(rc && (prompt || prompt_len == 0));
    LS_ASSERT(n <= 0 || (responses && response_lens && rewards));
    if (n < 0) return ls_err(LS_ERR_ARG, "reward command '%s': batch of %d items", rc->name, n);
    if (rc->broken)
        return ls_err(LS_ERR_IO, "reward command '%s' is unusable after an earlier error (see the first error)",
                      rc->name);
    if (n == 0) return LS_OK;
    for (int i = 0; i < n; i++) LS_ASSERT(responses[i] || response_lens[i] == 0, "response %d", i);
    if (rc->in_fd < 0)
        return rc_fail(rc, LS_ERR_IO, "its stdin was closed in an earlier batch; cannot send item 0");

    /* The prompt part of every request, escaped once per batch. */
    rc->head_len = 0;
    if (append_str(&rc->head, &rc->head_len, &rc->head_cap, "{\"prompt\": ") ||
        append_escaped(&rc->head, &rc->head_len, &rc->head_cap, prompt ? prompt : "", prompt_len) ||
        append_str(&rc->head, &rc->head_len, &rc->head_cap, ", \"response\": "))
        return rc_fail(rc, LS_ERR_NOMEM, "cannot build the request (%zu prompt bytes)", prompt_len);

    /* SIGPIPE is blocked in this thread while we write; one our write raised (EPIPE) is
     * consumed below, unless one was already pending before we started. */
    sigset_t pipe_set, old_mask, pending;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old_mask);
    sigemptyset(&pending);
    sigpending(&pending);
    int was_pending = sigismember(&pending, SIGPIPE) == 1;
    int saw_epipe = 0;
    ls_status s = run_batch(rc, responses, response_lens, n, group_id, rewards, &saw_epipe);
    if (saw_epipe && !was_pending) {
        struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe_set, NULL, &zero) < 0 && errno == EINTR) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    return s;
}

int ls_reward_cmd_pgid(const ls_reward_cmd *rc) { return rc && rc->pid > 0 ? (int)rc->pid : 0; }
