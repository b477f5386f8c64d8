/*
 * test_reward_cmd.c — rewards from an external process (--reward-cmd): exact answers
 * over several batches of one process, a 300 KB prompt against a child that replies as
 * it reads with 128 KB answer lines (deadlocks unless writes and reads interleave),
 * clear errors (not a number, early exit, signal, timeout, extra lines, EPIPE without
 * SIGPIPE), no inherited fds, a stop that kills what ignores EOF, and JSON escaping
 * checked byte for byte from what the child received. The children are sh and awk only.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "longstraw/reward.h"
#include "testutil.h"

int test_reward_cmd_batches(void);
int test_reward_cmd_errors(void);
int test_reward_cmd_json(void);

/* awk that sees each line as soon as it arrives: mawk reads pipes in whole blocks
 * unless -W interactive; other awks read lines. LC_ALL=C: length() counts bytes. */
#define AWK_NOW "A=awk; awk -W version 2>/dev/null | grep -q mawk && A='awk -W interactive'; export LC_ALL=C; exec $A "

/* reward = len(response) + 1000*index + 0.25*group, after `pad` spaces (trimmed by us).
 * Finds the response by its key: inside an escaped prompt a quote is always \". */
#define AWK_LEN_PROG                                                                                   \
    "'BEGIN { pad = \"\"; if (padn > 0) { pad = \" \"; while (length(pad) < padn) pad = pad pad } }" \
    " { i = index($0, \"\\\"response\\\": \\\"\"); s = substr($0, i + 13); j = index(s, \"\\\"\");"   \
    "   k = index($0, \"\\\"index\\\": \"); g = index($0, \"\\\"group\\\": \");"                         \
    "   printf \"%s%.17g\\n\", pad, (j - 1) + 1000 * (substr($0, k + 9) + 0) + 0.25 * (substr($0, g + 9) + 0);" \
    "   fflush() }'"

static void fill_text(char *s, size_t n, ls_rng *r) {
    static const char alpha[] = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJ\n\"\\\t";
    for (size_t i = 0; i < n; i++) s[i] = alpha[ls_rng_u64(r) % (sizeof alpha - 1)];
}

static void fill_letters(char *s, size_t n, ls_rng *r) {
    for (size_t i = 0; i < n; i++) s[i] = (char)('a' + ls_rng_u64(r) % 26);
}

/* One batch against the length child; every reward checked exactly. */
static int check_batch(ls_reward_cmd *rc, const char *prompt, size_t plen, const size_t *lens, int n, int64_t group,
                       ls_rng *r) {
    char **resp = calloc((size_t)n, sizeof *resp);
    double *got = calloc((size_t)n, sizeof *got), *want = calloc((size_t)n, sizeof *want);
    T_CHECK(resp && got && want, "alloc");
    for (int i = 0; i < n; i++) {
        resp[i] = malloc(lens[i] + 1);
        T_CHECK(resp[i], "alloc");
        fill_letters(resp[i], lens[i], r);
        want[i] = (double)lens[i] + 1000.0 * i + 0.25 * (double)group;
        got[i] = NAN;
    }
    T_OK(ls_reward_cmd_score(rc, prompt, plen, (const char *const *)resp, lens, n, group, got));
    double err = t_max_abs_diff_d(got, want, n);
    for (int i = 0; i < n; i++) T_CHECK(isfinite(got[i]), "reward %d not finite", i);
    T_CHECK(err <= 0, "batch of %d (prompt %zu bytes): max |got - want| = %g (got[0] %.17g want %.17g)", n, plen, err,
            got[0], want[0]);
    for (int i = 0; i < n; i++) free(resp[i]);
    free(resp);
    free(got);
    free(want);
    return 0;
}

int test_reward_cmd_batches(void) {
    ls_rng r;
    ls_rng_seed(&r, 11);
    size_t big = 300 * 1024;
    char *prompt = malloc(big);
    T_CHECK(prompt, "alloc");
    fill_text(prompt, big, &r); /* quotes, backslashes, newlines, tabs: all escaped */
    static const size_t lens_a[] = {3, 0, 11, 5000};
    size_t lens_b[8];
    for (int i = 0; i < 8; i++) lens_b[i] = (size_t)i * 37;
    lens_b[5] = 200 * 1024;
    static const size_t lens_c[] = {1};
    /* padn 0: one short line per answer. padn 131072: every answer line is 128 KB, so
     * its stdout pipe fills while our 300 KB requests are still going out. */
    static const int pads[] = {0, 131072};
    for (int p = 0; p < 2; p++) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "%s -v padn=%d %s", AWK_NOW, pads[p], AWK_LEN_PROG);
        ls_reward_cmd *rc;
        T_OK(ls_reward_cmd_start(&rc, cmd));
        T_OK(ls_reward_cmd_set_timeout(rc, 30)); /* a deadlock fails, it does not hang */
        double t0 = ls_now();
        T_CHECK(check_batch(rc, "short \"prompt\"", 14, lens_a, 4, 7, &r) == 0, "batch a, pad %d", pads[p]);
        T_CHECK(check_batch(rc, prompt, big, lens_b, 8, 123456789, &r) == 0, "batch b, pad %d", pads[p]);
        T_CHECK(check_batch(rc, NULL, 0, lens_c, 1, -3, &r) == 0, "batch c, pad %d", pads[p]);
        T_CHECK(check_batch(rc, prompt, big, lens_b, 8, 0, &r) == 0, "batch d, pad %d", pads[p]);
        double dt = ls_now() - t0;
        T_CHECK(dt < 20, "four batches took %.1f s", dt);
        T_OK(ls_reward_cmd_score(rc, prompt, big, NULL, NULL, 0, 0, NULL)); /* n = 0: nothing sent */
        t0 = ls_now();
        ls_reward_cmd_stop(rc);
        T_CHECK(ls_now() - t0 < 3, "stop of a child that exits on EOF took %.2f s", ls_now() - t0);
    }
    free(prompt);

    /* The child inherits no fd beyond 0-2, not even one opened without O_CLOEXEC. */
    int leak = open("/dev/null", O_RDONLY);
    T_CHECK(leak > 2, "open /dev/null");
    char cmd[512];
    snprintf(cmd, sizeof cmd, "while read -r l; do if [ -e /proc/$$/fd/%d ]; then echo 1; else echo 0; fi; done", leak);
    ls_reward_cmd *rc;
    T_OK(ls_reward_cmd_start(&rc, cmd));
    static const char *const one[] = {"x"};
    static const size_t one_len[] = {1};
    double inherited = NAN;
    T_OK(ls_reward_cmd_score(rc, "p", 1, one, one_len, 1, 0, &inherited));
    ls_reward_cmd_stop(rc);
    close(leak);
    T_CHECK(inherited == 0.0, "the child inherited fd %d (answer %g)", leak, inherited);
    return 0;
}

/* Start cmd, score a batch of n one-byte responses, expect an error naming each of
 * want[] (NULL-terminated); then the handle must refuse further batches. */
static int expect_fail(const char *cmd, double timeout, const char *prompt, size_t plen, int n,
                       const char *const *want, double max_s) {
    static const char *const resp[4] = {"a", "b", "c", "d"};
    static const size_t lens[4] = {1, 1, 1, 1};
    double rew[4];
    LS_ASSERT(n <= 4);
    ls_reward_cmd *rc;
    T_OK(ls_reward_cmd_start(&rc, cmd));
    if (timeout > 0) T_OK(ls_reward_cmd_set_timeout(rc, timeout));
    double t0 = ls_now();
    ls_status s = ls_reward_cmd_score(rc, prompt, plen, resp, lens, n, 1, rew);
    const char *msg = ls_err_msg();
    T_CHECK(s != LS_OK, "`%s` scored without error", cmd);
    T_CHECK(strstr(msg, "reward command '"), "`%s`: message does not name the command: %s", cmd, msg);
    for (int k = 0; want[k]; k++) T_CHECK(strstr(msg, want[k]), "`%s`: no \"%s\" in: %s", cmd, want[k], msg);
    T_CHECK(ls_reward_cmd_score(rc, "p", 1, resp, lens, 1, 2, rew) != LS_OK && strstr(ls_err_msg(), "unusable"),
            "`%s`: a second batch after an error: %s", cmd, ls_err_msg());
    ls_reward_cmd_stop(rc);
    double dt = ls_now() - t0;
    T_CHECK(dt < max_s, "`%s`: error and stop took %.2f s (limit %.1f)", cmd, dt, max_s);
    return 0;
}

static int pipe_signal_clean(void) {
    sigset_t pend;
    sigemptyset(&pend);
    sigpending(&pend);
    struct sigaction sa;
    sigaction(SIGPIPE, NULL, &sa);
    return sigismember(&pend, SIGPIPE) == 0 && sa.sa_handler == SIG_DFL;
}

int test_reward_cmd_errors(void) {
    static const struct {
        const char *cmd;
        int n;
        double timeout, max_s;
        const char *want[5];
    } cases[] = {
        {"while read -r l; do echo abc; done", 2, 0, 5, {"answer line 1 \"abc\"", "not a number", "item 0", NULL}},
        {"i=0; while read -r l; do i=$((i+1)); if [ $i = 3 ]; then echo ' 1.5x '; else echo $i; fi; done", 4, 0, 5,
         {"answer line 3 \" 1.5x \"", "item 2", "not a number", NULL}},
        {"while read -r l; do echo; done", 1, 0, 5, {"answer line 1 \"\"", "not a number", NULL}},
        {"while read -r l; do echo ' nan'; done", 1, 0, 5, {"not a finite number", NULL}},
        {"while read -r l; do echo 1e999; done", 1, 0, 5, {"not a finite number", NULL}},
        {"read -r l; echo 1; exit 3", 3, 0, 5, {"exited with status 3", "before answering item 1", NULL}},
        {"exec 2>/dev/null; no_such_command_ls_reward", 1, 0, 5, {"exited with status 127", "not found", NULL}},
        {"kill -9 $$", 2, 0, 5, {"killed by signal 9", "item 0", NULL}},
        {"sleep 30", 2, 1, 4, {"timeout after 1 s", "item 0", "0 of 2 answered", NULL}},
        {"read -r l; echo 1; sleep 30", 2, 1, 4, {"timeout after 1 s", "item 1", NULL}},
        {"while read -r l; do echo 1 2; done", 1, 0, 5, {"\"1 2\"", "not a number", NULL}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        T_CHECK(expect_fail(cases[c].cmd, cases[c].timeout, "p", 1, cases[c].n, cases[c].want, cases[c].max_s) == 0,
                "case %zu", c);

    /* It closes its stdin while 300 KB requests are going out: EPIPE, not SIGPIPE. */
    {
        size_t big = 300 * 1024;
        char *prompt = malloc(big);
        T_CHECK(prompt, "alloc");
        memset(prompt, 'x', big);
        static const char *const want[] = {"exited with status 0", "before answering item 1", NULL};
        T_CHECK(expect_fail("exec 0</dev/null; sleep 0.3; echo 1", 0, prompt, big, 2, want, 5) == 0, "EPIPE");
        T_CHECK(pipe_signal_clean(), "SIGPIPE left pending or its disposition changed");
        free(prompt);
    }

    /* Two lines per request: caught at the end of the batch or before the next one. */
    {
        ls_reward_cmd *rc;
        T_OK(ls_reward_cmd_start(&rc, "while read -r l; do echo 1; echo 2; done"));
        static const char *const resp[] = {"a"};
        static const size_t lens[] = {1};
        double rew[1];
        ls_status s = ls_reward_cmd_score(rc, "p", 1, resp, lens, 1, 0, rew);
        if (s == LS_OK) {
            struct timespec ts = {0, 300 * 1000000L};
            nanosleep(&ts, NULL);
            s = ls_reward_cmd_score(rc, "p", 1, resp, lens, 1, 0, rew);
        }
        T_CHECK(s != LS_OK && strstr(ls_err_msg(), "more") && strstr(ls_err_msg(), "2"), "extra lines: %s",
                s == LS_OK ? "accepted" : ls_err_msg());
        ls_reward_cmd_stop(rc);
    }

    /* A child that ignores EOF is killed, with what it started (its process group). */
    {
        char dir[512], pidfile[600], cmd[1400];
        T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
        snprintf(pidfile, sizeof pidfile, "%s/bg.pid", dir);
        snprintf(cmd, sizeof cmd, "sleep 60 & echo $! > '%s'; read -r l; echo 5; sleep 60", pidfile);
        ls_reward_cmd *rc;
        T_OK(ls_reward_cmd_start(&rc, cmd));
        static const char *const resp[] = {"a"};
        static const size_t lens[] = {1};
        double rew[1] = {NAN};
        T_OK(ls_reward_cmd_score(rc, "p", 1, resp, lens, 1, 0, rew));
        T_CHECK(rew[0] == 5.0, "answer %g", rew[0]);
        double t0 = ls_now();
        ls_reward_cmd_stop(rc);
        double dt = ls_now() - t0;
        T_CHECK(dt > 2 && dt < 8, "stop of a child that ignores EOF took %.2f s (grace 3 s, then SIGKILL)", dt);
        FILE *f = fopen(pidfile, "r");
        long bg = 0;
        T_CHECK(f && fscanf(f, "%ld", &bg) == 1 && bg > 1, "background pid");
        fclose(f);
        /* gone, or a zombie waiting for an init that does not reap */
        char stat[64], path[64], st = 0;
        snprintf(path, sizeof path, "/proc/%ld/stat", bg);
        struct timespec ts = {0, 50 * 1000000L};
        for (int k = 0; k < 40; k++) {
            FILE *g = fopen(path, "r");
            st = 0;
            if (g) {
                if (fgets(stat, sizeof stat, g)) {
                    char *rp = strrchr(stat, ')');
                    if (rp && rp[1] == ' ') st = rp[2];
                }
                fclose(g);
            }
            if (!g || st == 'Z') break;
            nanosleep(&ts, NULL);
        }
        T_CHECK(st == 0 || st == 'Z', "background `sleep 60` (pid %ld) survived the stop: state %c", bg, st);
        T_CHECK(t_remove_dir(dir) == 0, "rm");
    }

    /* Bad arguments. */
    ls_reward_cmd *rc = NULL;
    T_CHECK(ls_reward_cmd_start(&rc, "") == LS_ERR_ARG && !rc, "empty command");
    T_OK(ls_reward_cmd_start(&rc, "cat >/dev/null"));
    T_CHECK(ls_reward_cmd_set_timeout(rc, 0) == LS_ERR_ARG, "timeout 0");
    T_CHECK(ls_reward_cmd_set_timeout(rc, -1) == LS_ERR_ARG, "timeout -1");
    T_CHECK(ls_reward_cmd_set_timeout(rc, NAN) == LS_ERR_ARG, "timeout NaN");
    T_CHECK(ls_reward_cmd_set_timeout(rc, INFINITY) == LS_ERR_ARG, "timeout Inf");
    ls_reward_cmd_stop(rc);
    ls_reward_cmd_stop(NULL);
    T_CHECK(pipe_signal_clean(), "SIGPIPE left pending or its disposition changed");
    return 0;
}

/* Strict UTF-8 check (no overlongs, surrogates or > U+10FFFF). */
static int valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) k = 1, cp = c & 0x1F;
        else if (c >= 0xE0 && c <= 0xEF) k = 2, cp = c & 0x0F;
        else if (c >= 0xF0 && c <= 0xF4) k = 3, cp = c & 0x07;
        else return 0;
        if (i + k >= n) return 0;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += k + 1;
    }
    return 1;
}

#define FFFD "\xEF\xBF\xBD"

int test_reward_cmd_json(void) {
    char dir[512], file[600], cmd[2048];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    snprintf(file, sizeof file, "%s/requests.jsonl", dir);
    /* It keeps what it received and answers each line's length in bytes. */
    snprintf(cmd, sizeof cmd, "tee '%s' | { " AWK_NOW "'{ print length($0); fflush() }'; }", file);

    /* quotes, newline, tab, backslash, C0 controls and DEL; valid é € 😀; then ill-formed
     * UTF-8, one U+FFFD per maximal subpart: lone FF; E2 82 cut by 'x'; ED A0 80
     * (surrogate: ED alone is a subpart); C0 AF (overlong); F4 90 80 80 (> U+10FFFF). */
    static const char prompt[] = "He said \"hi\"\n\tback\\slash \x01\x1f\x7f end \xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"
                                 " [\xFF][\xE2\x82x][\xED\xA0\x80][\xC0\xAF][\xF4\x90\x80\x80][\xC3]";
    static const char prompt_dec[] = "He said \"hi\"\n\tback\\slash \x01\x1f\x7f end "
                                     "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80 [" FFFD "][" FFFD "x][" FFFD FFFD FFFD
                                     "][" FFFD FFFD "][" FFFD FFFD FFFD FFFD "][" FFFD "]";
    static const char prompt_raw[] = "\"prompt\": \"He said \\\"hi\\\"\\n\\tback\\\\slash \\u0001\\u001f\\u007f end ";
    /* a truncated sequence at the very end; an embedded NUL; \r \b \f and '/'; empty */
    static const char *const resp[] = {"ok\xE2\x82", "a\0b", "\r\b\f/", ""};
    static const size_t rlens[] = {4, 3, 4, 0};
    static const char *const resp_dec[] = {"ok" FFFD, "a", "\r\b\f/", ""}; /* cJSON stops at the NUL */
    static const char *const resp_raw[] = {"\"response\": \"ok" FFFD "\"", "\"response\": \"a\\u0000b\"",
                                           "\"response\": \"\\r\\b\\f/\"", "\"response\": \"\""};
    int n = 4;
    int64_t group = INT64_MAX;
    double rew[4] = {NAN, NAN, NAN, NAN};

    ls_reward_cmd *rc;
    T_OK(ls_reward_cmd_start(&rc, cmd));
    T_OK(ls_reward_cmd_set_timeout(rc, 20));
    T_OK(ls_reward_cmd_score(rc, prompt, sizeof prompt - 1, resp, rlens, n, group, rew));
    ls_reward_cmd_stop(rc); /* tee has written everything once it has exited */

    FILE *f = fopen(file, "rb");
    T_CHECK(f, "open %s", file);
    static char buf[1 << 16];
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = 0;
    T_CHECK(len > 0 && buf[len - 1] == '\n', "requests end with a newline");
    T_CHECK(valid_utf8((const unsigned char *)buf, len), "requests are valid UTF-8");
    int lines = 0;
    for (char *line = buf; line < buf + len; lines++) {
        char *nl = memchr(line, '\n', (size_t)(buf + len - line));
        T_CHECK(nl, "line %d without newline", lines);
        *nl = 0;
        size_t ll = (size_t)(nl - line);
        T_CHECK(lines < n, "more than %d request lines", n);
        for (size_t k = 0; k < ll; k++)
            T_CHECK((unsigned char)line[k] >= 0x20, "raw control byte 0x%02x in line %d", (unsigned char)line[k],
                    lines);
        T_CHECK(strlen(line) == ll, "NUL byte in line %d", lines);
        double d = fabs(rew[lines] - (double)ll);
        T_CHECK(d <= 0, "line %d: the child counted %g bytes, the file has %zu", lines, rew[lines], ll);
        T_CHECK(strstr(line, prompt_raw), "line %d: escaped prompt not found in %.120s", lines, line);
        T_CHECK(strstr(line, resp_raw[lines]), "line %d: no %s in %s", lines, resp_raw[lines], line);
        char tailx[96];
        snprintf(tailx, sizeof tailx, ", \"index\": %d, \"group\": 9223372036854775807}", lines);
        T_CHECK(ll >= strlen(tailx) && strcmp(line + ll - strlen(tailx), tailx) == 0, "line %d ends %s", lines,
                line + (ll > 60 ? ll - 60 : 0));
        T_CHECK(strncmp(line, "{\"prompt\": \"", 12) == 0, "line %d starts with the prompt", lines);

        cJSON *j = cJSON_Parse(line);
        T_CHECK(j && cJSON_IsObject(j), "line %d is not a JSON object", lines);
        T_CHECK(cJSON_GetArraySize(j) == 4, "line %d has %d keys", lines, cJSON_GetArraySize(j));
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "response");
        const cJSON *ix = cJSON_GetObjectItemCaseSensitive(j, "index");
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(j, "group");
        T_CHECK(cJSON_IsString(p) && strcmp(p->valuestring, prompt_dec) == 0, "line %d: prompt decodes to %s", lines,
                cJSON_IsString(p) ? p->valuestring : "(not a string)");
        T_CHECK(cJSON_IsString(r) && strcmp(r->valuestring, resp_dec[lines]) == 0, "line %d: response", lines);
        T_CHECK(cJSON_IsNumber(ix) && ix->valuedouble == lines, "line %d: index", lines);
        T_CHECK(cJSON_IsNumber(g) && g->valuedouble == 9223372036854775807.0, "line %d: group", lines);
        cJSON_Delete(j);
        line = nl + 1;
    }
    T_CHECK(lines == n, "%d request lines for %d items", lines, n);
    T_CHECK(t_remove_dir(dir) == 0, "rm");
    return 0;
}
