/*
 * test_report.c — `longstraw report` end to end on hand-written traces
 * (tests/fixtures/report/): the receipt's rows against values computed by hand from
 * the fixture, memory.svg's shape, a truncated last line, malformed lines named by
 * file:line and field, downsampling that keeps peaks, usage errors.
 *
 * Fixture two_segments/trace.0.jsonl (rank 0): a crashed segment and a resumed one.
 *   segment 1: load s=2.0 (peak fixed 1 GiB, scratch 1 MiB), capture s=1.0 (peak prompt
 *              512 MiB, scratch 4 MiB), update_end of update 0, last event at t=4.25
 *   segment 2: load s=1.5 (peak scratch 3 MiB), capture s=3.0 (peak prompt 768 MiB,
 *              scratch 1 MiB), update_end of update 1 (prompt predicted 768 MiB,
 *              measured 800 MiB), end at t=5.6, then a line cut in the middle
 *   an unknown event with a malformed "live" and an unknown key, both to be skipped.
 * So: load 2× 3.5 s (mean 1.75), capture 2× 4.0 s (mean 2.0); 14 known events over
 * 4.25 + 5.6 = 9.85 s. trace.1.jsonl (rank 1): one load of 0.5 s, peak fixed 512 B.
 */
#include <stdlib.h>
#include <string.h>

#include "longstraw/config.h"
#include "testutil.h"

int test_report_table(void);
int test_report_svg(void);
int test_report_truncated_line(void);
int test_report_malformed(void);
int test_report_downsample(void);
int test_report_usage(void);
int test_report_metrics_svg(void);

#define FIXTURES LS_SOURCE_DIR "/tests/fixtures/report"

static char *run(const char *cmd, int *rc) {
    char full[8192];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    return t_run_capture(full, rc);
}

/* A fresh temp dir holding a copy of fixture `name` as DIR/run. */
static int copy_fixture(const char *name, char *dir, size_t cap) {
    char cmd[2048];
    if (t_make_tmpdir(dir, cap) != 0) return -1;
    snprintf(cmd, sizeof cmd, "cp -r '%s/%s' '%s/run'", FIXTURES, name, dir);
    return system(cmd);
}


/* The part of the output about one rank: from "rank R:" to the next blank line. */
static const char *section(const char *out, int rank, const char **end) {
    char head[32];
    snprintf(head, sizeof head, "rank %d: ", rank);
    const char *s = strstr(out, head);
    *end = NULL;
    if (!s) return NULL;
    *end = strstr(s, "\n\n");
    if (!*end) *end = s + strlen(s);
    return s;
}

/* Split the line of [from, end) that starts with "  <name> " into words. */
static int row_words(const char *from, const char *end, const char *name, char words[20][32]) {
    char key[64];
    snprintf(key, sizeof key, "\n  %s ", name);
    const char *s = strstr(from, key);
    if (!s || s >= end) return 0;
    const char *eol = strchr(s + 1, '\n');
    size_t len = eol ? (size_t)(eol - s) : strlen(s);
    char line[512];
    if (len >= sizeof line) return 0;
    memcpy(line, s, len);
    line[len] = 0;
    int n = 0;
    char *save = NULL;
    for (char *w = strtok_r(line, " \n", &save); w && n < 20; w = strtok_r(NULL, " \n", &save))
        snprintf(words[n++], 32, "%s", w);
    return n;
}

static int check_num(const char *word, double want, double tol, const char *what) {
    char *e = NULL;
    double v = strtod(word, &e);
    T_CHECK(e != word && *e == 0, "%s: \"%s\" is not a number", what, word);
    T_CHECK(fabs(v - want) <= tol, "%s: %g, expected %g", what, v, want);
    return 0;
}

static int check_phase_rows(const char *out) {
    static const struct {
        int rank;
        const char *phase;
        double count, total, mean;
        const char *peak[6]; /* fixed grad prompt score branch scratch */
    } want[] = {
        {0, "load", 2, 3.5, 1.75, {"1.0 GiB", "0 B", "0 B", "0 B", "0 B", "3.0 MiB"}},
        {0, "capture", 2, 4.0, 2.0, {"1.0 GiB", "0 B", "768.0 MiB", "0 B", "0 B", "4.0 MiB"}},
        {1, "load", 1, 0.5, 0.5, {"512 B", "0 B", "0 B", "0 B", "0 B", "0 B"}},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const char *end, *sec = section(out, want[i].rank, &end);
        char w[20][32];
        T_CHECK(sec, "no section for rank %d", want[i].rank);
        T_CHECK(row_words(sec, end, want[i].phase, w) == 16, "rank %d: no %s row", want[i].rank, want[i].phase);
        if (check_num(w[1], want[i].count, 0, "count") || check_num(w[2], want[i].total, 5e-4, "total") ||
            check_num(w[3], want[i].mean, 5e-4, "mean"))
            return 1;
        for (int a = 0; a < 6; a++) {
            char got[64];
            snprintf(got, sizeof got, "%s %s", w[4 + 2 * a], w[5 + 2 * a]);
            T_CHECK(strcmp(got, want[i].peak[a]) == 0, "rank %d %s arena %d: \"%s\", expected \"%s\"",
                    want[i].rank, want[i].phase, a, got, want[i].peak[a]);
        }
    }
    /* only phases seen: nothing else in rank 0, no capture in rank 1 */
    static const char *absent[] = {"reference", "rollout", "reward", "score", "replay", "optimize", "checkpoint"};
    const char *end0, *sec0 = section(out, 0, &end0), *end1, *sec1 = section(out, 1, &end1);
    char w[20][32];
    T_CHECK(sec0 && sec1, "no section for rank 0 or 1");
    for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++)
        T_CHECK(row_words(sec0, end0, absent[i], w) == 0, "rank 0 has a %s row", absent[i]);
    T_CHECK(row_words(sec1, end1, "capture", w) == 0, "rank 1 has a capture row");
    return 0;
}

static int check_prediction(const char *out) {
    const char *end, *sec = section(out, 0, &end);
    char w[20][32];
    T_CHECK(sec && strstr(sec, "update 1 (the last update_end)"), "prediction is not from update 1");
    T_CHECK(row_words(sec, end, "prompt", w) == 6, "no prompt term row");
    T_CHECK(strcmp(w[1], "768.0") == 0 && strcmp(w[3], "800.0") == 0, "prompt: %s %s / %s %s", w[1], w[2], w[3], w[4]);
    if (check_num(w[5], 838860800.0 / 805306368.0, 5e-4, "prompt ratio")) return 1;
    T_CHECK(row_words(sec, end, "fixed", w) == 6, "no fixed term row");
    if (check_num(w[5], 1.0, 5e-4, "fixed ratio")) return 1;
    T_CHECK(row_words(sec, end, "grad", w) == 6 && strcmp(w[5], "-") == 0, "grad: predicted 0 needs ratio \"-\"");
    sec = section(out, 1, &end);
    T_CHECK(sec && strstr(sec, "no update_end event") && strstr(sec, "no update_end event") < end, "rank 1 prediction");
    return 0;
}

static int check_metrics(const char *out) {
    static const struct {
        const char *name;
        double first, last;
    } want[] = {{"reward", 0.25, 0.75}, {"kl", 0, 0.02}, {"grad_norm", 1.5, 1.0}, {"step_time", 4.0, 3.25}};
    const char *sec = strstr(out, "metrics: ");
    T_CHECK(sec && strstr(sec, "metrics.jsonl: 3 updates"), "no metrics summary with 3 updates");
    const char *end = sec + strlen(sec);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char w[20][32];
        T_CHECK(row_words(sec, end, want[i].name, w) == 3, "no %s metric row", want[i].name);
        if (check_num(w[1], want[i].first, 1e-9, want[i].name) || check_num(w[2], want[i].last, 1e-9, want[i].name))
            return 1;
    }
    return 0;
}

int test_report_table(void) {
    char dir[512], cmd[2048];
    int rc;
    T_CHECK(copy_fixture("two_segments", dir, sizeof dir) == 0, "copy fixture");
    snprintf(cmd, sizeof cmd, "'%s' report --no-svg '%s/run/'", LS_CLI_PATH, dir);
    char *out = run(cmd, &rc);
    T_CHECK(out && rc == 0, "report rc %d: %s", rc, out ? out : "");
    T_CHECK(strstr(out, "2 segments, 14 events, 9.850 s"), "segments/events/time: %s", out);
    int bad = check_phase_rows(out) || check_prediction(out) || check_metrics(out);
    if (bad) fprintf(stderr, "  output:\n%s", out);
    free(out);
    T_CHECK(!bad, "receipt differs from the hand-computed values");
    char svg[800];
    snprintf(svg, sizeof svg, "%s/run/memory.svg", dir);
    FILE *f = fopen(svg, "r");
    if (f) fclose(f);
    T_CHECK(!f, "--no-svg wrote %s", svg);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

static int check_svg_text(const char *svg) {
    T_CHECK(strncmp(svg, "<svg", 4) == 0, "does not start with <svg");
    T_CHECK(strstr(svg, "xmlns=\"http://www.w3.org/2000/svg\""), "no SVG namespace");
    T_CHECK(strstr(svg, "</svg>\n"), "not closed");
    /* one shaded band and one label per phase that ran: load and capture, twice each */
    T_CHECK(count(svg, ">load</text>") == 2, "load labels: %d", count(svg, ">load</text>"));
    T_CHECK(count(svg, ">capture</text>") == 2, "capture labels: %d", count(svg, ">capture</text>"));
    T_CHECK(count(svg, "fill-opacity=") == 4, "bands: %d", count(svg, "fill-opacity="));
    T_CHECK(count(svg, ">restart</text>") == 1, "restart markers: %d", count(svg, ">restart</text>"));
    /* stacked peak 1 GiB + 768 MiB: the y axis ends on 2 GiB; x runs to 9.85 s */
    T_CHECK(strstr(svg, ">2 GiB</text>") && strstr(svg, ">9</text>") && !strstr(svg, ">10</text>"), "axis ticks");
    static const char *legend[] = {"fixed (peak 1.0 GiB)", "prompt (peak 768.0 MiB)", "scratch (peak 2.0 MiB)",
                                   "grad (peak 0 B)"};
    for (size_t i = 0; i < sizeof legend / sizeof legend[0]; i++)
        T_CHECK(strstr(svg, legend[i]), "legend lacks \"%s\"", legend[i]);
    T_CHECK(!strstr(svg, ">rollout</text>"), "the truncated line's phase was drawn");
    return 0;
}

int test_report_svg(void) {
    char dir[512], cmd[2048], path[800];
    int rc;
    T_CHECK(copy_fixture("two_segments", dir, sizeof dir) == 0, "copy fixture");
    snprintf(cmd, sizeof cmd, "'%s' report '%s/run'", LS_CLI_PATH, dir);
    char *out = run(cmd, &rc);
    T_CHECK(out && rc == 0, "report rc %d: %s", rc, out ? out : "");
    free(out);
    snprintf(path, sizeof path, "%s/run/memory.svg", dir);
    char *svg = NULL;
    T_OK(ls_read_file(path, &svg, NULL));
    int bad = check_svg_text(svg);
    free(svg);
    if (bad) return 1;
    /* atomic write leaves no temp file behind */
    snprintf(cmd, sizeof cmd, "ls '%s/run' | grep -c tmp", dir);
    out = t_run_capture(cmd, &rc);
    T_CHECK(out && atoi(out) == 0, "temp files left: %s", out ? out : "");
    free(out);
    /* --out writes there instead */
    snprintf(cmd, sizeof cmd, "rm '%s' && '%s' report --out '%s/other.svg' '%s/run'", path, LS_CLI_PATH, dir, dir);
    out = run(cmd, &rc);
    T_CHECK(out && rc == 0, "report --out rc %d: %s", rc, out ? out : "");
    free(out);
    snprintf(path, sizeof path, "%s/other.svg", dir);
    T_OK(ls_read_file(path, &svg, NULL));
    bad = check_svg_text(svg);
    free(svg);
    snprintf(path, sizeof path, "%s/run/memory.svg", dir);
    FILE *f = fopen(path, "r");
    if (f) fclose(f);
    T_CHECK(!bad && !f, "--out: bad SVG or RUN/memory.svg written anyway");
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* The fixture without its cut last line reports the same receipt, minus the note. */
int test_report_truncated_line(void) {
    char dir[512], cmd[2048];
    int rc1, rc2;
    T_CHECK(copy_fixture("two_segments", dir, sizeof dir) == 0, "copy fixture");
    snprintf(cmd, sizeof cmd, "'%s' report --no-svg '%s/run'", LS_CLI_PATH, dir);
    char *cut = run(cmd, &rc1);
    snprintf(cmd, sizeof cmd, "cd '%s/run' && head -n 15 trace.0.jsonl > t && mv t trace.0.jsonl && '%s' report --no-svg .",
             dir, LS_CLI_PATH);
    char *whole = run(cmd, &rc2);
    T_CHECK(cut && whole && rc1 == 0 && rc2 == 0, "rc %d / %d: %s", rc1, rc2, whole ? whole : "");
    const char *note = " (skipped a truncated last line)";
    T_CHECK(count(cut, note) == 1 && count(whole, note) == 0, "truncation note");
    /* compare the phase and prediction lines, which name no paths */
    const char *a = strstr(cut, "\n  phase"), *b = strstr(whole, "\n  phase");
    T_CHECK(a && b, "no phase table");
    const char *ea = strstr(a, "\n\n"), *eb = strstr(b, "\n\n");
    T_CHECK(ea && eb && ea - a == eb - b && memcmp(a, b, (size_t)(ea - a)) == 0, "tables differ:\n%s\n---\n%s",
            cut, whole);
    free(cut);
    free(whole);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

static int write_trace(const char *dir, const char *bad_line) {
    char path[800];
    snprintf(path, sizeof path, "%s/trace.0.jsonl", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "{\"t\": 0, \"ev\": \"start\", \"rank\": 0, \"live\": [0, 0, 0, 0, 0, 0]}\n%s\n", bad_line);
    fprintf(f, "{\"t\": 2, \"ev\": \"end\", \"live\": [0, 0, 0, 0, 0, 0]}\n");
    return fclose(f);
}

int test_report_malformed(void) {
    char cmd[2048], dir[512];
    int rc;
    snprintf(cmd, sizeof cmd, "'%s' report --no-svg '%s/bad_live'", LS_CLI_PATH, FIXTURES);
    char *out = run(cmd, &rc);
    const char *want = "bad_live/trace.0.jsonl:3: field \"live\": expected an array of 6 integers";
    T_CHECK(out && rc == 1 && strstr(out, want), "rc %d, output: %s", rc, out ? out : "");
    free(out);
    static const struct { const char *line, *needle; } bad[] = {
        {"{\"t\": 1, \"ev\": \"phase_end\", \"phase\": \"load\", \"s\": 1, \"peak\": [1, 2, 3, 4, 5, -6], "
         "\"live\": [0, 0, 0, 0, 0, 0]}", ":2: field \"peak\": expected an array of 6 integers"},
        {"{\"t\": \"x\", \"ev\": \"end\", \"live\": [0, 0, 0, 0, 0, 0]}", ":2: field \"t\": expected a non-negative number"},
        {"{\"t\": 1, \"ev\": \"end\", \"live\": [0, 0, 0.5, 0, 0, 0]}", ":2: field \"live\": expected an array of 6"},
        {"{\"t\": 1, \"ev\": \"phase_end\", \"phase\": \"load\", \"peak\": [0, 0, 0, 0, 0, 0], "
         "\"live\": [0, 0, 0, 0, 0, 0]}", ":2: field \"s\": expected a non-negative number"},
        {"{\"t\": 1, \"ev\": \"update_end\", \"predicted\": {\"prompt\": 1, \"fixed\": 2}, \"measured\": {}, "
         "\"live\": [0, 0, 0, 0, 0, 0]}", ":2: field \"predicted.grad\": expected a non-negative integer"},
        {"{\"t\": 1, \"live\": [0, 0, 0, 0, 0, 0]}", ":2: field \"ev\": expected a string"},
        {"{\"t\": 1, \"ev\": \"end\", \"live\": [0, 0, 0, 0, 0, 0]} x", ":2: not valid JSON"},
        {"[1, 2]", ":2: expected a JSON object"},
    };
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        T_CHECK(write_trace(dir, bad[i].line) == 0, "write trace");
        snprintf(cmd, sizeof cmd, "'%s' report --no-svg '%s'", LS_CLI_PATH, dir);
        out = run(cmd, &rc);
        T_CHECK(out && rc == 1 && strstr(out, "trace.0.jsonl") && strstr(out, bad[i].needle),
                "`%s`: rc %d, output: %s", bad[i].line, rc, out ? out : "");
        free(out);
    }
    /* metrics.jsonl is checked too */
    T_CHECK(write_trace(dir, "") == 0, "write trace");
    snprintf(cmd, sizeof cmd, "cd '%s' && printf '{\"reward\": 1}\\n{\"reward\": \"high\"}\\n' > metrics.jsonl && "
             "'%s' report --no-svg .", dir, LS_CLI_PATH);
    out = run(cmd, &rc);
    T_CHECK(out && rc == 1 && strstr(out, "metrics.jsonl:2: field \"reward\": expected a number"), "metrics: rc %d, %s",
            rc, out ? out : "");
    free(out);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* 20,000 events, one of them a 7 GiB prompt spike: at most 4,000 points drawn, and
 * the spike still sets the y axis (1 GiB fixed + 7 GiB = 8 GiB). */
int test_report_downsample(void) {
    char dir[512], path[800], cmd[2048];
    int rc;
    const int64_t n = 20000, spike = 12345;
    const long long gib = 1LL << 30;
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    snprintf(path, sizeof path, "%s/trace.0.jsonl", dir);
    FILE *f = fopen(path, "w");
    T_CHECK(f, "write trace");
    fprintf(f, "{\"t\": 0, \"ev\": \"start\", \"rank\": 0, \"live\": [0, 0, 0, 0, 0, 0]}\n");
    for (int64_t i = 1; i <= n; i++)
        fprintf(f, "{\"t\": %.3f, \"ev\": \"layer_end\", \"live\": [%lld, 0, %lld, 0, 0, %lld]}\n", (double)i * 0.001,
                gib, i == spike ? 7 * gib : 0, (long long)(i % 7) << 20);
    T_CHECK(fclose(f) == 0, "write trace");
    snprintf(cmd, sizeof cmd, "'%s' report '%s'", LS_CLI_PATH, dir);
    char *out = run(cmd, &rc);
    T_CHECK(out && rc == 0, "report rc %d: %s", rc, out ? out : "");
    free(out);
    snprintf(path, sizeof path, "%s/memory.svg", dir);
    char *svg = NULL;
    size_t len = 0;
    T_OK(ls_read_file(path, &svg, &len));
    long long events = 0, points = 0;
    const char *c = strstr(svg, "<!-- ");
    int ok = c && sscanf(c, "<!-- %lld events drawn as %lld points", &events, &points) == 2;
    int peak = strstr(svg, ">8 GiB</text>") && strstr(svg, "prompt (peak 7.0 GiB)");
    free(svg);
    T_CHECK(ok && events == n + 1 && points > 0 && points <= 4000, "events %lld, points %lld", events, points);
    T_CHECK(peak, "the spike was lost in downsampling");
    T_CHECK(len < 2000000, "SVG of %zu bytes", len);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

int test_report_usage(void) {
    char dir[512], cmd[2048];
    int rc;
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    struct { const char *args; int rc; const char *needle; } cases[] = {
        {"--help", 0, "usage: longstraw report RUN/"},
        {"", 2, "the run directory RUN/ is required"},
        {"a b", 2, "unexpected argument \"b\""},
        {"--bogus x", 2, "see longstraw report --help"},
        {"--out x.svg --no-svg x", 2, "not both"},
        {"/nonexistent/run/", 1, "/nonexistent/run: No such file or directory"},
        {dir, 1, "no trace files (expected "},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(cmd, sizeof cmd, "'%s' report %s", LS_CLI_PATH, cases[i].args);
        char *out = run(cmd, &rc);
        T_CHECK(out && rc == cases[i].rc && strstr(out, cases[i].needle), "`report %s`: rc %d, output: %s",
                cases[i].args, rc, out ? out : "");
        T_CHECK(i + 1 != sizeof cases / sizeof cases[0] || strstr(out, dir), "message does not name %s", dir);
        free(out);
    }
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}

/* metrics.svg draws what a run is watched by: for GRPO the reward with its spread, KL,
 * entropy, clipped fraction, gradient norm, response length and the held-out curves,
 * never the GRPO loss (≈ 0 at ratio 1); for SFT the training NLL. A skipped update's
 * nulls leave a gap, not a zero. */
int test_report_metrics_svg(void) {
    char dir[512], cmd[2048], path[800];
    int rc;
    for (int grpo = 1; grpo >= 0; grpo--) {
        T_CHECK(copy_fixture("two_segments", dir, sizeof dir) == 0, "copy fixture");
        snprintf(path, sizeof path, "%s/run/metrics.jsonl", dir);
        FILE *f = fopen(path, "w");
        T_CHECK(f, "metrics.jsonl");
        for (int u = 0; u < 6; u++) {
            if (grpo)
                fprintf(f, "{\"update\": %d, \"loss\": 1e-16, \"reward\": %s, \"reward_std\": 0.1, \"kl\": 0.0%d, "
                           "\"entropy\": %g, \"clip_ratio/low_mean\": 0.01, \"clip_ratio/high_mean\": 0.02, "
                           "\"completions/mean_length\": 7, \"completions/min_length\": 3, \"completions/max_length\": 8, "
                           "\"grad_norm\": 2.5, \"eval/exact_match\": %g, \"eval/exact_match/300\": %g, "
                           "\"eval/exact_match/600\": %g%s}\n",
                        u, u == 3 ? "null" : u == 0 ? "0.125" : "0.5", u, 3.0 - 0.2 * u, 0.1 * u, 0.1 * u, 0.05 * u,
                        u == 0 ? ", \"eval/exact_match_before\": 0, \"eval/exact_match/300_before\": 0, "
                                 "\"eval/exact_match/600_before\": 0" : "");
            else
                fprintf(f, "{\"update\": %d, \"loss\": %g, \"reward\": null, \"eval/nll\": %g}\n", u, 4.0 - 0.5 * u,
                        4.1 - 0.5 * u);
        }
        fclose(f);
        snprintf(cmd, sizeof cmd, "'%s' report '%s/run'", LS_CLI_PATH, dir);
        char *out = run(cmd, &rc);
        T_CHECK(out && rc == 0 && strstr(out, "metrics.svg"), "report rc %d: %s", rc, out ? out : "");
        free(out);
        snprintf(path, sizeof path, "%s/run/metrics.svg", dir);
        char *svg = NULL;
        T_OK(ls_read_file(path, &svg, NULL));
        T_CHECK(strncmp(svg, "<svg", 4) == 0 && strstr(svg, "</svg>\n") && !strstr(svg, "nan") && !strstr(svg, "inf"),
                "not a closed SVG, or non-finite coordinates");
        static const char *grpo_panels[] = {"reward: group mean", "KL to the reference", "entropy",
                                            "clipped fraction", "gradient norm", "response length",
                                            "held-out exact match", "by prompt length", "P = 300", "P = 600",
                                            "GRPO run, 6 updates"};
        static const char *sft_panels[] = {"training loss: NLL", "held-out NLL per response token", "SFT run"};
        const char *const *want = grpo ? grpo_panels : sft_panels;
        size_t nwant = grpo ? sizeof grpo_panels / sizeof *grpo_panels : sizeof sft_panels / sizeof *sft_panels;
        for (size_t i = 0; i < nwant; i++) T_CHECK(strstr(svg, want[i]), "%s metrics.svg lacks \"%s\"", grpo ? "GRPO" : "SFT", want[i]);
        if (grpo) {
            T_CHECK(!strstr(svg, "training loss"), "the GRPO loss is drawn");
            T_CHECK(count(svg, "<polygon") == 2, "expected 2 bands (reward spread, length range), got %d",
                    count(svg, "<polygon"));
            /* the reward line: 5 points (update 3 had none), the held-out one 7 (before + 6) */
            const char *rw = strstr(svg, "reward: group mean");
            const char *pl = rw ? strstr(rw, "<polyline") : NULL, *pe = pl ? strstr(pl, "/>") : NULL;
            T_CHECK(pl && pe, "no reward polyline");
            int pts = 0;
            for (const char *q = strstr(pl, "points=\""); q && q < pe; q++) pts += *q == ',';
            T_CHECK(pts == 5, "reward polyline has %d points, expected 5", pts);
            /* held-out exact match: the reward panel's second line, 7 points (before + 6) */
            const char *p2 = strstr(pe, "<polyline"), *e2 = p2 ? strstr(p2, "/>") : NULL;
            T_CHECK(p2 && e2 && p2 < strstr(rw, "KL to the reference"), "no held-out line in the reward panel");
            pts = 0;
            for (const char *q = strstr(p2, "points=\""); q && q < e2; q++) pts += *q == ',';
            T_CHECK(pts == 7, "held-out exact match polyline has %d points, expected 7", pts);
        } else {
            T_CHECK(!strstr(svg, "reward: group mean") && !strstr(svg, "clipped fraction"), "GRPO panels in an SFT run");
        }
        free(svg);
        T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    }
    return 0;
}
