/*
 * cmd_report.c — `longstraw report RUN/`: read what a run wrote about itself
 * (RUN/trace.<rank>.jsonl, format in docs/trace.md, and RUN/metrics.jsonl) and
 *   - print a receipt per rank: per phase the count, total and mean seconds and the
 *     peak bytes of each arena; the last update's predicted vs measured M_live terms
 *     (DESIGN §1); the first and last value of the main metrics;
 *   - draw RUN/memory.svg: the live bytes of each arena over the whole run of the
 *     lowest rank (rank 0) as a stacked area chart, restarts concatenated, phases
 *     shaded. Written atomically.
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "longstraw/config.h"
#include "longstraw/files.h"
#include "longstraw/tokenizer.h"

/* int cmd_report(int argc, char **argv);  (declared in cli.h, registered in main.c) */

#define NA 6  /* arenas, in the trace's order */
#define NPH 10 /* phases, in the order the receipt lists them */
#define NTERM 3
#define MAX_RANK 1048576
#define SVG_MAX_POINTS 4000

static const char *const arena_name[NA] = {"fixed", "grad", "prompt", "score", "branch", "scratch"};
static const char *const arena_colour[NA] = {"#4e79a7", "#f28e2b", "#e15759",
                                             "#76b7b2", "#59a14f", "#edc948"};
static const char *const phase_name[NPH] = {"load",  "reference", "capture",  "rollout",   "reward",
                                            "score", "replay", "sweep", "optimize", "checkpoint"};
static const char *const term_name[NTERM] = {"prompt", "grad", "fixed"}; /* predicted/measured */

/* ---- growable text and arrays ------------------------------------------------------ */

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    while (!b->oom) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) b->oom = 1;
        else if (b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        } else {
            size_t nc = b->cap ? b->cap : 1 << 16;
            while (nc <= b->len + (size_t)n) nc *= 2;
            char *np = realloc(b->p, nc);
            if (!np) b->oom = 1;
            else b->p = np, b->cap = nc;
        }
    }
}

/* Text content or attribute value, escaped for XML, as valid UTF-8 (a path need not be:
 * an ill-formed byte becomes U+FFFD). */
static void sb_escape(sbuf *b, const char *s) {
    size_t n = strlen(s), adv;
    for (size_t i = 0; i < n; i += adv) {
        if (!ls_tok_utf8_seq((const unsigned char *)s + i, n - i, &adv)) {
            sb_printf(b, "\xEF\xBF\xBD");
            continue;
        }
        if (adv > 1) {
            sb_printf(b, "%.*s", (int)adv, s + i);
            continue;
        }
        switch (s[i]) {
        case '&': sb_printf(b, "&amp;"); break;
        case '<': sb_printf(b, "&lt;"); break;
        case '>': sb_printf(b, "&gt;"); break;
        case '"': sb_printf(b, "&quot;"); break;
        case '\'': sb_printf(b, "&apos;"); break;
        default: sb_printf(b, "%c", (unsigned char)s[i] < 0x20 ? '?' : s[i]); /* XML 1.0 forbids controls */
        }
    }
}

/* Make room for `need` elements of `elem` bytes; returns the (moved) array or NULL. */
static void *grow(void *p, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return p;
    int64_t nc = *cap ? *cap * 2 : 1024;
    while (nc < need) nc *= 2;
    size_t bytes;
    if (ls_mul_size((size_t)nc, elem, &bytes)) return NULL;
    void *np = realloc(p, bytes);
    if (np) *cap = nc;
    return np;
}

/* "0 B", "512 B", "1.5 KiB", "768.0 MiB", "1.0 GiB" */
static const char *fmt_bytes(char buf[32], double b) {
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB"};
    int u = 0;
    while (u < 3 && b >= (u ? 1023.95 : 1024.0)) b /= 1024.0, u++; /* no "1024.0 KiB" */
    if (u == 0) snprintf(buf, 32, "%.0f B", b);
    else snprintf(buf, 32, "%.1f %s", b, unit[u]);
    return buf;
}

/* ---- one rank's trace ----------------------------------------------------------------- */

typedef struct {
    double t; /* seconds on the concatenated time axis */
    int64_t live[NA];
} sample;

typedef struct {
    int phase;
    double t0, t1;
} band;

typedef struct {
    int64_t count;
    double total;
    int64_t peak[NA];
} phase_stat;

typedef struct {
    int have;
    int64_t update;
    int64_t pred[NTERM], meas[NTERM];
} update_stat;

typedef struct {
    char path[4224]; /* RUN (< 4096) + "/trace.<rank>.jsonl" */
    int rank, segments, truncated;
    int64_t events;
    phase_stat ph[NPH];
    update_stat last;          /* from the last update_end */
    sample *s;                 /* every known event */
    int64_t ns, cap_s;
    band *b;                   /* one per phase that ran */
    int64_t nb, cap_b;
    double *restart;           /* concatenated times where a later segment began */
    int64_t nr, cap_r;
    double offset, t_end;      /* this segment's start, latest time so far */
    int open_phase;            /* phase_begin without its phase_end yet, or -1 */
    double open_t0;
} trace;

typedef struct {
    const char *path;
    int64_t line;
} lctx;

static ls_status bad_field(const lctx *c, const char *key, const char *what) {
    return ls_err(LS_ERR_FORMAT, "%s:%lld: field \"%s\": expected %s", c->path, (long long)c->line,
                  key, what);
}

static ls_status no_memory(const lctx *c) {
    return ls_err(LS_ERR_NOMEM, "%s:%lld: out of memory", c->path, (long long)c->line);
}

static int as_bytes(const cJSON *it, int64_t *out) {
    if (!cJSON_IsNumber(it)) return 0;
    double v = it->valuedouble;
    if (!(v >= 0 && v < 9.0e18) || v != floor(v)) return 0;
    *out = (int64_t)v;
    return 1;
}

static ls_status get_seconds(const cJSON *o, const char *key, const lctx *c, double *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(it) || !(it->valuedouble >= 0) || !isfinite(it->valuedouble))
        return bad_field(c, key, "a non-negative number");
    *out = it->valuedouble;
    return LS_OK;
}

static ls_status get_arenas(const cJSON *o, const char *key, const lctx *c, int64_t out[NA]) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != NA)
        return bad_field(c, key, "an array of 6 integers");
    for (int i = 0; i < NA; i++)
        if (!as_bytes(cJSON_GetArrayItem(a, i), &out[i]))
            return bad_field(c, key, "an array of 6 integers");
    return LS_OK;
}

/* `predicted` / `measured`: an object with byte counts for prompt, grad and fixed. */
static ls_status get_terms(const cJSON *o, const char *key, const lctx *c, int64_t out[NTERM]) {
    const cJSON *obj = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsObject(obj)) return bad_field(c, key, "an object");
    for (int i = 0; i < NTERM; i++) {
        if (as_bytes(cJSON_GetObjectItemCaseSensitive(obj, term_name[i]), &out[i])) continue;
        char name[64];
        snprintf(name, sizeof name, "%s.%s", key, term_name[i]);
        return bad_field(c, name, "a non-negative integer");
    }
    return LS_OK;
}

/* Index of the event's phase, or -1 for a phase this reader does not know. */
static ls_status get_phase(const cJSON *o, const lctx *c, int *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, "phase");
    if (!cJSON_IsString(it)) return bad_field(c, "phase", "a string");
    *out = -1;
    for (int i = 0; i < NPH; i++)
        if (strcmp(it->valuestring, phase_name[i]) == 0) *out = i;
    return LS_OK;
}

static ls_status push_band(trace *tr, int phase, double t0, double t1, const lctx *c) {
    band *nb = grow(tr->b, &tr->cap_b, tr->nb + 1, sizeof *nb);
    if (!nb) return no_memory(c);
    tr->b = nb;
    tr->b[tr->nb++] = (band){phase, t0 < t1 ? t0 : t1, t1};
    return LS_OK;
}

/* A phase still open when its segment (or the file) ends: the run stopped inside it. */
static ls_status close_open_phase(trace *tr, double t, const lctx *c) {
    if (tr->open_phase < 0) return LS_OK;
    int p = tr->open_phase;
    tr->open_phase = -1;
    return push_band(tr, p, tr->open_t0, t, c);
}

static ls_status on_start(trace *tr, const cJSON *o, const lctx *c) {
    LS_TRY(close_open_phase(tr, tr->t_end, c));
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(o, "rank");
    if (cJSON_IsNumber(r) && r->valuedouble != tr->rank)
        fprintf(stderr, "longstraw report: note: %s:%lld: start event says rank %g; using %d from the file name\n",
                c->path, (long long)c->line, r->valuedouble, tr->rank);
    tr->offset = tr->t_end; /* the new segment's t restarts at 0 */
    if (tr->segments++ > 0) {
        double *nr = grow(tr->restart, &tr->cap_r, tr->nr + 1, sizeof *nr);
        if (!nr) return no_memory(c);
        tr->restart = nr;
        tr->restart[tr->nr++] = tr->offset;
    }
    return LS_OK;
}

static ls_status on_phase_begin(trace *tr, const cJSON *o, double x, const lctx *c) {
    int p = -1;
    LS_TRY(get_phase(o, c, &p));
    if (p < 0) return LS_OK;
    LS_TRY(close_open_phase(tr, x, c)); /* phases do not nest */
    tr->open_phase = p;
    tr->open_t0 = x;
    return LS_OK;
}

static ls_status on_phase_end(trace *tr, const cJSON *o, double x, const lctx *c) {
    int p = -1;
    double s = 0;
    int64_t peak[NA] = {0};
    LS_TRY(get_phase(o, c, &p));
    LS_TRY(get_seconds(o, "s", c, &s));
    LS_TRY(get_arenas(o, "peak", c, peak));
    if (p < 0) return LS_OK;
    phase_stat *st = &tr->ph[p];
    st->count++;
    st->total += s;
    for (int a = 0; a < NA; a++)
        if (peak[a] > st->peak[a]) st->peak[a] = peak[a];
    /* without its phase_begin (cut off?), the band is the `s` seconds before the end */
    double t0 = tr->open_phase == p ? tr->open_t0 : fmax(x - s, tr->offset);
    tr->open_phase = -1;
    return push_band(tr, p, t0, x, c);
}

static ls_status on_update_end(trace *tr, const cJSON *o, const lctx *c) {
    update_stat u = {.have = 1, .update = -1};
    LS_TRY(get_terms(o, "predicted", c, u.pred));
    LS_TRY(get_terms(o, "measured", c, u.meas));
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, "update");
    if (cJSON_IsNumber(it) && fabs(it->valuedouble) < 1e15) u.update = (int64_t)it->valuedouble;
    tr->last = u;
    return LS_OK;
}

enum { EV_START, EV_PHASE_BEGIN, EV_PHASE_END, EV_UPDATE_END, EV_OTHER, EV_UNKNOWN };

static int event_kind(const char *ev) {
    static const char *const other[] = {"layer_end", "optimizer", "checkpoint", "end"};
    if (strcmp(ev, "start") == 0) return EV_START;
    if (strcmp(ev, "phase_begin") == 0) return EV_PHASE_BEGIN;
    if (strcmp(ev, "phase_end") == 0) return EV_PHASE_END;
    if (strcmp(ev, "update_end") == 0) return EV_UPDATE_END;
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++)
        if (strcmp(ev, other[i]) == 0) return EV_OTHER;
    return EV_UNKNOWN;
}

static ls_status on_event(trace *tr, const cJSON *o, const lctx *c) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "ev");
    if (!cJSON_IsString(e)) return bad_field(c, "ev", "a string");
    int kind = event_kind(e->valuestring);
    if (kind == EV_UNKNOWN) return LS_OK; /* newer writer: skip (docs/trace.md) */
    double t = 0;
    int64_t live[NA] = {0};
    LS_TRY(get_seconds(o, "t", c, &t));
    LS_TRY(get_arenas(o, "live", c, live));
    if (kind == EV_START) LS_TRY(on_start(tr, o, c));
    /* t is monotonic within a segment; fmax only guards the drawing against a bad file */
    double x = fmax(tr->offset + t, tr->t_end);
    if (kind == EV_PHASE_BEGIN) LS_TRY(on_phase_begin(tr, o, x, c));
    if (kind == EV_PHASE_END) LS_TRY(on_phase_end(tr, o, x, c));
    if (kind == EV_UPDATE_END) LS_TRY(on_update_end(tr, o, c));
    sample *ns = grow(tr->s, &tr->cap_s, tr->ns + 1, sizeof *ns);
    if (!ns) return no_memory(c);
    tr->s = ns;
    tr->s[tr->ns].t = x;
    memcpy(tr->s[tr->ns].live, live, sizeof live);
    tr->ns++;
    tr->t_end = x;
    tr->events++;
    return LS_OK;
}

/* Parse one complete line into a JSON object (NULL for a blank line). */
static ls_status parse_object(const char *line, const lctx *c, cJSON **out) {
    *out = NULL;
    if (line[strspn(line, " \t\r\n")] == 0) return LS_OK;
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithOpts(line, &end, 1);
    if (!o) {
        const char *at = cJSON_GetErrorPtr();
        long col = at && at >= line ? (long)(at - line) + 1 : 1;
        return ls_err(LS_ERR_FORMAT, "%s:%lld: not valid JSON (near column %ld)", c->path,
                      (long long)c->line, col);
    }
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return ls_err(LS_ERR_FORMAT, "%s:%lld: expected a JSON object", c->path, (long long)c->line);
    }
    *out = o;
    return LS_OK;
}

typedef ls_status (*line_fn)(void *ctx, const cJSON *o, const lctx *c);

/* Call fn on the object of every complete line of `path`; a last line without a
 * newline (cut by a crash) is skipped and reported through *truncated. */
/* The most report reads of one file: a run's metrics and traces stay far below it; a
 * larger one is refused by name, not read until memory runs out. */
#define REPORT_FILE_MAX ((int64_t)4 << 30)

/* path as a stream: a regular file (a FIFO, device or directory is refused by name and
 * never blocks, a link to /dev/zero included: files.h) of at most REPORT_FILE_MAX bytes */
static ls_status open_bounded(const char *path, FILE **f) {
    LS_TRY(ls_open_input_stream(path, f));
    struct stat sb;
    if (fstat(fileno(*f), &sb) == 0 && sb.st_size <= REPORT_FILE_MAX) return LS_OK;
    fclose(*f);
    *f = NULL;
    return ls_err(LS_ERR_ARG, "%s: %lld bytes, more than report reads of one file (%lld): not a run's file?", path,
                  (long long)sb.st_size, (long long)REPORT_FILE_MAX);
}

static ls_status read_jsonl(const char *path, line_fn fn, void *ctx, int *truncated) {
    FILE *f;
    LS_TRY(open_bounded(path, &f));
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    lctx c = {path, 0};
    ls_status s = LS_OK;
    *truncated = 0;
    while (s == LS_OK && (n = getline(&line, &cap, f)) > 0) {
        c.line++;
        if (line[n - 1] != '\n') {
            *truncated = 1;
            break;
        }
        cJSON *o;
        s = parse_object(line, &c, &o);
        if (s == LS_OK && o) s = fn(ctx, o, &c);
        cJSON_Delete(o);
    }
    if (s == LS_OK && ferror(f)) s = ls_err(LS_ERR_IO, "%s: read error: %s", path, strerror(errno));
    free(line);
    fclose(f);
    return s;
}

static ls_status trace_line(void *ctx, const cJSON *o, const lctx *c) { return on_event(ctx, o, c); }

static ls_status trace_read(trace *tr) {
    tr->open_phase = -1;
    LS_TRY(read_jsonl(tr->path, trace_line, tr, &tr->truncated));
    lctx c = {tr->path, 0};
    return close_open_phase(tr, tr->t_end, &c);
}

static void trace_free(trace *tr) {
    free(tr->s);
    free(tr->b);
    free(tr->restart);
}

/* ---- the run directory ---------------------------------------------------------------- */

/* The rank of "trace.<rank>.jsonl", or -1 for any other name. */
static int trace_rank(const char *name) {
    if (strncmp(name, "trace.", 6) != 0 || name[6] < '0' || name[6] > '9') return -1;
    char *end = NULL;
    errno = 0;
    long r = strtol(name + 6, &end, 10);
    if (errno || strcmp(end, ".jsonl") != 0 || r > MAX_RANK) return -1;
    return (int)r;
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The ranks that have a trace in `run`, ascending (malloc'd). */
static ls_status find_ranks(const char *run, int **ranks, int *n) {
    struct stat st;
    if (stat(run, &st) != 0) return ls_err(LS_ERR_IO, "%s: %s", run, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return ls_err(LS_ERR_IO, "%s: not a directory", run);
    DIR *d = opendir(run);
    if (!d) return ls_err(LS_ERR_IO, "%s: cannot open: %s", run, strerror(errno));
    int64_t cap = 0;
    *ranks = NULL;
    *n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int r = trace_rank(e->d_name);
        if (r < 0) continue;
        int *nr = grow(*ranks, &cap, *n + 1, sizeof *nr);
        if (!nr) {
            closedir(d);
            free(*ranks);
            *ranks = NULL;
            return ls_err(LS_ERR_NOMEM, "%s: out of memory listing traces", run);
        }
        *ranks = nr;
        (*ranks)[(*n)++] = r;
    }
    closedir(d);
    if (*n == 0) return ls_err(LS_ERR_IO, "%s: no trace files (expected %s/trace.<rank>.jsonl)", run, run);
    qsort(*ranks, (size_t)*n, sizeof **ranks, cmp_int);
    return LS_OK;
}

/* ---- metrics.jsonl ---------------------------------------------------------------- */

#define NMETRIC 4
static const char *const metric_name[NMETRIC] = {"reward", "kl", "grad_norm", "step_time"};

/* The series of metrics.svg: (update, value) points of one metrics.jsonl field, after
 * update u at x = u + 1; "eval/X_before" is eval/X at x = 0 (before the first update);
 * "reward-" / "reward+" are reward ∓ reward_std (the band of the reward panel). */
#define NSERIES 32
typedef struct {
    char name[64];
    double *x, *y;
    int64_t n, cap;
} series;

typedef struct {
    int64_t updates;
    int have[NMETRIC];
    double first[NMETRIC], last[NMETRIC];
    series s[NSERIES];
    int ns;
    int grpo; /* some update had a finite reward: a GRPO run, drawn as one */
    int oom;
} metrics;

/* the fields drawn (besides every "eval/..." field) */
static const char *const drawn_field[] = {"loss", "reward", "kl", "entropy", "indexer_kl", "clip_ratio/low_mean",
                                          "clip_ratio/high_mean", "grad_norm", "completions/mean_length",
                                          "completions/min_length", "completions/max_length"};

static series *series_find(const metrics *m, const char *name) {
    for (int i = 0; i < m->ns; i++)
        if (strcmp(m->s[i].name, name) == 0) return (series *)&m->s[i];
    return NULL;
}

static void series_add(metrics *m, const char *name, double x, double y) {
    if (!isfinite(y) || strlen(name) >= sizeof m->s[0].name) return;
    series *c = series_find(m, name);
    if (!c) {
        if (m->ns == NSERIES) return; /* more eval fields than panels: the first ones are drawn */
        c = &m->s[m->ns++];
        snprintf(c->name, sizeof c->name, "%s", name);
    }
    if (c->n == c->cap) {
        int64_t cap = c->cap ? 2 * c->cap : 64;
        double *nx = realloc(c->x, (size_t)cap * sizeof(double)), *ny = nx ? realloc(c->y, (size_t)cap * sizeof(double)) : NULL;
        if (nx) c->x = nx;
        if (!nx || !ny) {
            m->oom = 1;
            return;
        }
        c->y = ny, c->cap = cap;
    }
    c->x[c->n] = x, c->y[c->n] = y, c->n++;
}

static void metrics_free(metrics *m) {
    for (int i = 0; i < m->ns; i++) free(m->s[i].x), free(m->s[i].y);
}

static ls_status metrics_line(void *ctx, const cJSON *o, const lctx *c) {
    metrics *m = ctx;
    m->updates++;
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(o, "update");
    double x = cJSON_IsNumber(u) ? u->valuedouble + 1 : (double)m->updates; /* after update u (0-based) */
    for (size_t i = 0; i < sizeof drawn_field / sizeof drawn_field[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, drawn_field[i]);
        if (cJSON_IsNumber(v)) series_add(m, drawn_field[i], x, v->valuedouble);
    }
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(o, "reward"), *sd = cJSON_GetObjectItemCaseSensitive(o, "reward_std");
    if (cJSON_IsNumber(r) && isfinite(r->valuedouble)) {
        m->grpo = 1;
        if (cJSON_IsNumber(sd)) {
            series_add(m, "reward-", x, r->valuedouble - sd->valuedouble);
            series_add(m, "reward+", x, r->valuedouble + sd->valuedouble);
        }
    }
    const cJSON *ev;
    cJSON_ArrayForEach(ev, o) {
        if (!ev->string || strncmp(ev->string, "eval/", 5) != 0 || !cJSON_IsNumber(ev)) continue;
        size_t len = strlen(ev->string);
        char name[64];
        if (len > 7 && strcmp(ev->string + len - 7, "_before") == 0 && len - 7 < sizeof name) {
            snprintf(name, sizeof name, "%.*s", (int)(len - 7), ev->string);
            series_add(m, name, x - 1, ev->valuedouble);
        } else {
            series_add(m, ev->string, x, ev->valuedouble);
        }
    }
    for (int i = 0; i < NMETRIC; i++) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, metric_name[i]);
        if (!it || cJSON_IsNull(it)) continue; /* absent this update */
        if (!cJSON_IsNumber(it)) return bad_field(c, metric_name[i], "a number");
        if (!m->have[i]) m->first[i] = it->valuedouble;
        m->last[i] = it->valuedouble;
        m->have[i] = 1;
    }
    return LS_OK;
}

/* ---- the receipt on stdout ------------------------------------------------------------ */

static void print_phases(const trace *tr) {
    char buf[32];
    printf("  %-11s %6s %10s %10s", "phase", "count", "total s", "mean s");
    for (int a = 0; a < NA; a++) printf(" %10s", arena_name[a]);
    printf("\n");
    for (int p = 0; p < NPH; p++) {
        const phase_stat *st = &tr->ph[p];
        if (!st->count) continue;
        printf("  %-11s %6lld %10.3f %10.3f", phase_name[p], (long long)st->count, st->total,
               st->total / (double)st->count);
        for (int a = 0; a < NA; a++) printf(" %10s", fmt_bytes(buf, (double)st->peak[a]));
        printf("\n");
    }
}

static void print_prediction(const trace *tr) {
    const update_stat *u = &tr->last;
    if (!u->have) {
        printf("  predicted vs measured: no update_end event\n");
        return;
    }
    char b1[32], b2[32];
    printf("  predicted vs measured, update %lld (the last update_end):\n", (long long)u->update);
    printf("  %-11s %12s %12s %8s\n", "term", "predicted", "measured", "ratio");
    for (int i = 0; i < NTERM; i++) {
        printf("  %-11s %12s %12s", term_name[i], fmt_bytes(b1, (double)u->pred[i]),
               fmt_bytes(b2, (double)u->meas[i]));
        if (u->pred[i] > 0) printf(" %8.3f\n", (double)u->meas[i] / (double)u->pred[i]);
        else printf(" %8s\n", "-");
    }
}

static void print_rank(const trace *tr) {
    printf("rank %d: %s: %d segment%s, %lld events, %.3f s%s\n", tr->rank, tr->path, tr->segments,
           tr->segments == 1 ? "" : "s", (long long)tr->events, tr->t_end,
           tr->truncated ? " (skipped a truncated last line)" : "");
    printf("  per phase: count, seconds, and the peak bytes of each arena (max of phase_end.peak)\n");
    print_phases(tr);
    print_prediction(tr);
    printf("\n");
}

static void print_metrics(const char *path, const metrics *m) {
    printf("metrics: %s: %lld updates\n", path, (long long)m->updates);
    printf("  %-11s %14s %14s\n", "metric", "first", "last");
    for (int i = 0; i < NMETRIC; i++) {
        if (m->have[i]) printf("  %-11s %14.6g %14.6g\n", metric_name[i], m->first[i], m->last[i]);
        else printf("  %-11s %14s %14s\n", metric_name[i], "-", "-");
    }
    /* the held-out curves: first (update 0 when measured before training) and last */
    for (int i = 0; i < m->ns; i++) {
        const series *c = &m->s[i];
        if (strncmp(c->name, "eval/", 5) != 0 || c->n == 0) continue;
        printf("  %-11s %14.6g %14.6g   (%s, update %.0f to %.0f)\n", "held-out", c->y[0], c->y[c->n - 1], c->name,
               c->x[0], c->x[c->n - 1]);
    }
}

/* ---- memory.svg ---------------------------------------------------------------------- */

/* Plot geometry in SVG user units. */
#define SVG_W 1080
#define SVG_H 540
#define PL 90.0  /* plot left */
#define PR 820.0 /* plot right */
#define PT 60.0  /* plot top */
#define PB 480.0 /* plot bottom */

typedef struct {
    double tmax, ymax; /* data range drawn: seconds, bytes */
    double unit;       /* bytes per y tick unit */
    const char *uname;
} scale;

static double px_x(const scale *sc, double t) { return PL + (PR - PL) * t / sc->tmax; }
static double px_y(const scale *sc, double b) { return PB - (PB - PT) * b / sc->ymax; }

/* 1, 2 or 5 times a power of ten, close to range/target. */
static double nice_step(double range, int target) {
    double raw = range / target, p = pow(10.0, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3 ? 2 : m < 7 ? 5 : 10) * p;
}

/* At most SVG_MAX_POINTS points: time buckets, each drawn as its first and last time
 * with the per-arena maxima inside it, so every peak stays visible. */
static int64_t bucket_of(double t, double tmax) {
    const int64_t nbucket = SVG_MAX_POINTS / 2;
    int64_t k = (int64_t)(t / tmax * (double)nbucket);
    return k < nbucket ? k : nbucket - 1;
}

static int64_t downsample(const sample *s, int64_t n, double tmax, sample *out) {
    if (n <= SVG_MAX_POINTS) {
        memcpy(out, s, (size_t)n * sizeof *s);
        return n;
    }
    int64_t m = 0;
    for (int64_t i = 0; i < n;) {
        int64_t k = bucket_of(s[i].t, tmax);
        sample hi = s[i];
        int64_t j = i + 1;
        for (; j < n && bucket_of(s[j].t, tmax) == k; j++)
            for (int a = 0; a < NA; a++)
                if (s[j].live[a] > hi.live[a]) hi.live[a] = s[j].live[a];
        out[m] = hi;
        out[m + 1] = hi;
        out[m + 1].t = s[j - 1].t;
        m += 2;
        i = j;
    }
    return m;
}

static double stacked(const sample *s, int upto) {
    double v = 0;
    for (int a = 0; a <= upto; a++) v += (double)s->live[a];
    return v;
}

static scale make_scale(const sample *pts, int64_t m) {
    scale sc = {.tmax = m ? pts[m - 1].t : 0, .ymax = 0};
    for (int64_t i = 0; i < m; i++) sc.ymax = fmax(sc.ymax, stacked(&pts[i], NA - 1));
    if (!(sc.tmax > 0)) sc.tmax = 1;
    if (!(sc.ymax > 0)) sc.ymax = 1024.0 * 1024.0;
    static const char *const un[] = {"B", "KiB", "MiB", "GiB"};
    int u = 0;
    for (sc.unit = 1; u < 3 && sc.ymax >= sc.unit * 1024.0; u++) sc.unit *= 1024.0;
    sc.uname = un[u];
    double step = nice_step(sc.ymax / sc.unit, 5); /* top of the axis on a tick */
    sc.ymax = ceil(sc.ymax / sc.unit / step - 1e-9) * step * sc.unit;
    return sc;
}

static void svg_axes(sbuf *b, const scale *sc) {
    double ystep = nice_step(sc->ymax / sc->unit, 5);
    int64_t ny = (int64_t)floor(sc->ymax / sc->unit / ystep + 1e-6);
    for (int64_t k = 0; k <= ny; k++) {
        double v = (double)k * ystep, y = px_y(sc, v * sc->unit);
        sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", PL, y, PR, y);
        sb_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g %s</text>\n", PL - 6, y + 4, v, sc->uname);
    }
    double xstep = nice_step(sc->tmax, 8);
    int64_t nx = (int64_t)floor(sc->tmax / xstep + 1e-6);
    for (int64_t k = 0; k <= nx; k++) {
        double t = (double)k * xstep, x = px_x(sc, t);
        sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#000\"/>\n", x, PB, x, PB + 5);
        sb_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n", x, PB + 18, t);
    }
    sb_printf(b, "<path d=\"M%.1f %.1fV%.1fH%.1f\" fill=\"none\" stroke=\"#000\"/>\n", PL, PT, PB, PR);
    sb_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">time (s)</text>\n", (PL + PR) / 2, PB + 38);
    sb_printf(b, "<text transform=\"translate(20 %.1f) rotate(-90)\" text-anchor=\"middle\">live bytes</text>\n",
              (PT + PB) / 2);
}

/* One polygon per arena between its stacked top and the arena below. */
static void svg_areas(sbuf *b, const scale *sc, const sample *pts, int64_t m) {
    for (int a = 0; a < NA; a++) {
        int any = 0;
        for (int64_t i = 0; i < m && !any; i++) any = pts[i].live[a] > 0;
        if (!any) continue;
        sb_printf(b, "<polygon fill=\"%s\" points=\"", arena_colour[a]);
        for (int64_t i = 0; i < m; i++)
            sb_printf(b, "%.1f,%.1f ", px_x(sc, pts[i].t), px_y(sc, stacked(&pts[i], a)));
        for (int64_t i = m - 1; i >= 0; i--)
            sb_printf(b, "%.1f,%.1f ", px_x(sc, pts[i].t), px_y(sc, a ? stacked(&pts[i], a - 1) : 0));
        sb_printf(b, "\"/>\n");
    }
}

/* Shaded phase bands over the plot, labelled above it where the label fits. */
static void svg_bands(sbuf *b, const scale *sc, const trace *tr) {
    for (int64_t i = 0; i < tr->nb; i++) {
        double x0 = px_x(sc, tr->b[i].t0), x1 = px_x(sc, tr->b[i].t1);
        const char *name = phase_name[tr->b[i].phase];
        sb_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#000\" "
                  "fill-opacity=\"%s\" stroke=\"#555\" stroke-opacity=\"0.3\" stroke-width=\"0.5\"/>\n",
                  x0, PT, x1 - x0, PB - PT, i % 2 ? "0.07" : "0.13");
        if (x1 - x0 < 6.5 * (double)strlen(name) + 4) continue; /* ~6.5 units per char at 11 */
        sb_printf(b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n",
                  (x0 + x1) / 2, PT - 6, name);
    }
    for (int64_t i = 0; i < tr->nr; i++) {
        double x = px_x(sc, tr->restart[i]);
        sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#c00\" "
                  "stroke-dasharray=\"4 3\"/>\n", x, PT, x, PB);
        sb_printf(b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"#c00\">restart</text>\n", x + 3, PB - 4);
    }
}

static void svg_legend(sbuf *b, const trace *tr) {
    for (int a = 0; a < NA; a++) {
        int64_t peak = 0;
        for (int64_t i = 0; i < tr->ns; i++)
            if (tr->s[i].live[a] > peak) peak = tr->s[i].live[a];
        char buf[32];
        double y = PT + 10 + 22.0 * (NA - 1 - a); /* top to bottom as stacked */
        sb_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/>\n", PR + 20, y,
                  arena_colour[a]);
        sb_printf(b, "<text x=\"%.1f\" y=\"%.1f\">%s (peak %s)</text>\n", PR + 38, y + 10, arena_name[a],
                  fmt_bytes(buf, (double)peak));
    }
}

static void svg_build(sbuf *b, const trace *tr, const char *run, const sample *pts, int64_t m) {
    scale sc = make_scale(pts, m);
    sb_printf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" height=\"%d\" "
              "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n", SVG_W, SVG_H, SVG_W, SVG_H);
    sb_printf(b, "<title>LongStraw memory timeline: ");
    sb_escape(b, run);
    sb_printf(b, "</title>\n<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n");
    sb_printf(b, "<text x=\"%.1f\" y=\"24\" font-size=\"16\">live bytes per arena, rank %d: ", PL, tr->rank);
    sb_escape(b, run);
    sb_printf(b, "</text>\n<!-- %lld events drawn as %lld points -->\n", (long long)tr->ns, (long long)m);
    svg_axes(b, &sc);
    svg_areas(b, &sc, pts, m);
    svg_bands(b, &sc, tr);
    svg_legend(b, tr);
    sb_printf(b, "</svg>\n");
}

static ls_status write_svg(const trace *tr, const char *run, const char *out) {
    size_t bytes;
    if (ls_mul_size((size_t)tr->ns + 1, sizeof(sample), &bytes))
        return ls_err(LS_ERR_NOMEM, "%s: too many events to draw", tr->path);
    sample *pts = malloc(bytes);
    if (!pts) return ls_err(LS_ERR_NOMEM, "%s: out of memory drawing %s", tr->path, out);
    int64_t m = downsample(tr->s, tr->ns, tr->ns ? fmax(tr->s[tr->ns - 1].t, 1e-9) : 1, pts);
    sbuf b = {0};
    svg_build(&b, tr, run, pts, m);
    free(pts);
    ls_status s = b.oom ? ls_err(LS_ERR_NOMEM, "out of memory drawing %s", out)
                        : ls_write_file_atomic(out, b.p, b.len);
    free(b.p);
    return s;
}

/* ---- metrics.svg ---------------------------------------------------------------------- */

/* One panel of metrics.svg: up to three series (lines with dots) and an optional band
 * (the area between two series, drawn under them), against the update, with axes and
 * a legend; the box [x0, x1] × [top, top + h). */
#define PANEL_LINES 3
typedef struct {
    const char *title;
    const series *line[PANEL_LINES];
    const char *label[PANEL_LINES];
    const series *lo, *hi; /* band, or NULL */
} panel;

static const char *const line_colour[PANEL_LINES] = {"#4e79a7", "#e15759", "#59a14f"};

static void svg_panel(sbuf *b, const panel *p, double x0, double x1, double top, double h) {
    double xmax = 1, ymin = INFINITY, ymax = -INFINITY;
    const series *all[PANEL_LINES + 2] = {p->line[0], p->line[1], p->line[2], p->lo, p->hi};
    for (int k = 0; k < PANEL_LINES + 2; k++)
        for (int64_t i = 0; all[k] && i < all[k]->n; i++) {
            xmax = all[k]->x[i] > xmax ? all[k]->x[i] : xmax;
            ymin = all[k]->y[i] < ymin ? all[k]->y[i] : ymin;
            ymax = all[k]->y[i] > ymax ? all[k]->y[i] : ymax;
        }
    if (!(ymax > ymin)) ymin -= 0.5, ymax += 0.5;
    double pad = 0.05 * (ymax - ymin), y0 = ymin - pad, y1 = ymax + pad, bot = top + h;
#define MX(x) (x0 + (x1 - x0) * (x) / xmax)
#define MY(y) (bot - h * ((y) - y0) / (y1 - y0))
    sb_printf(b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\">", x0, top - 10);
    sb_escape(b, p->title);
    sb_printf(b, "</text>\n<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#999\"/>\n",
              x0, top, x1 - x0, h);
    double ys = nice_step(y1 - y0, 4), xs = nice_step(xmax, 6);
    for (double y = ceil(y0 / ys) * ys; y <= y1; y += ys)
        sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/><text x=\"%.1f\" y=\"%.1f\" "
                  "text-anchor=\"end\">%.4g</text>\n", x0, MY(y), x1, MY(y), x0 - 6, MY(y) + 4, fabs(y) < 1e-9 * ys ? 0.0 : y);
    for (double x = 0; x <= xmax + 1e-9; x += xs)
        sb_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.0f</text>\n", MX(x), bot + 16, x);
    if (p->lo && p->hi && p->lo->n == p->hi->n && p->lo->n > 0) { /* the band: along hi, back along lo */
        sb_printf(b, "<polygon fill=\"%s\" fill-opacity=\"0.18\" stroke=\"none\" points=\"", line_colour[0]);
        for (int64_t i = 0; i < p->hi->n; i++) sb_printf(b, "%.1f,%.1f ", MX(p->hi->x[i]), MY(p->hi->y[i]));
        for (int64_t i = p->lo->n - 1; i >= 0; i--) sb_printf(b, "%.1f,%.1f ", MX(p->lo->x[i]), MY(p->lo->y[i]));
        sb_printf(b, "\"/>\n");
    }
    double lx = x0 + 8;
    for (int k = 0; k < PANEL_LINES; k++) {
        const series *c = p->line[k];
        if (!c || c->n == 0) continue;
        sb_printf(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", line_colour[k]);
        for (int64_t i = 0; i < c->n; i++) sb_printf(b, "%.1f,%.1f ", MX(c->x[i]), MY(c->y[i]));
        sb_printf(b, "\"/>\n");
        for (int64_t i = 0; i < c->n && c->n <= 200; i++)
            sb_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>\n", MX(c->x[i]), MY(c->y[i]), line_colour[k]);
        if (p->label[k]) { /* legend inside the box, top left */
            sb_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"%s\"/><text x=\"%.1f\" y=\"%.1f\">",
                      lx, top + 8, line_colour[k], lx + 14, top + 17);
            sb_escape(b, p->label[k]);
            sb_printf(b, "</text>\n");
            lx += 24 + 7.0 * (double)strlen(p->label[k]);
        }
    }
    if (!p->line[0] || p->line[0]->n == 0)
        sb_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#999\">no finite values</text>\n",
                  (x0 + x1) / 2, top + h / 2);
#undef MX
#undef MY
}

/* RUN/metrics.svg. A GRPO run (some update has a reward): what TRL and verl users
 * watch — reward mean with its spread (± std over the group's members), KL to the
 * reference, entropy, the clipped fraction of tokens, the gradient norm, the response
 * length (mean, min–max band) — then every held-out "eval/..." curve. The GRPO loss
 * is not drawn: at ratio 1 it is ≈ 0 whatever the model learns. An SFT run: the
 * training NLL and the held-out curves. Two panels a row. */
static ls_status write_metrics_svg(const metrics *m, const char *run, const char *out) {
    panel pn[NSERIES + 8];
    int np = 0;
    if (m->grpo) {
        pn[np++] = (panel){.title = "reward: group mean (band: ± std over members)", .line = {series_find(m, "reward")},
                           .lo = series_find(m, "reward-"), .hi = series_find(m, "reward+")};
        pn[np++] = (panel){.title = "KL to the reference (per token)", .line = {series_find(m, "kl")}};
        pn[np++] = (panel){.title = "entropy (nats per response token)", .line = {series_find(m, "entropy")}};
        pn[np++] = (panel){.title = "clipped fraction of response tokens",
                           .line = {series_find(m, "clip_ratio/low_mean"), series_find(m, "clip_ratio/high_mean")},
                           .label = {"ratio < 1 - eps", "ratio > 1 + eps"}};
        pn[np++] = (panel){.title = "gradient norm (before clipping)", .line = {series_find(m, "grad_norm")}};
        pn[np++] = (panel){.title = "response length, tokens (mean; band: min to max)",
                           .line = {series_find(m, "completions/mean_length")},
                           .lo = series_find(m, "completions/min_length"), .hi = series_find(m, "completions/max_length")};
        if (series_find(m, "indexer_kl"))
            pn[np++] = (panel){.title = "indexer KL (DSA indexer vs attention)", .line = {series_find(m, "indexer_kl")}};
    } else if (series_find(m, "loss")) {
        pn[np++] = (panel){.title = "training loss: NLL per response token (metrics.jsonl \"loss\")",
                           .line = {series_find(m, "loss")}};
    }
    /* held-out exact match: beside the reward (both in [0, 1]) in a GRPO run; its
     * per-length curves (eval/exact_match/<L>) together in one panel */
    const series *em = series_find(m, "eval/exact_match");
    if (m->grpo && em) {
        pn[0].title = "reward: group mean (band: ± std), and held-out exact match (update 0: before)";
        pn[0].line[1] = em;
        pn[0].label[0] = "reward", pn[0].label[1] = "held-out exact match";
    }
    /* a task's reward is 0 or 1 for most prompts: its running mean shows the trend */
    const series *avg = series_find(m, "reward_avg");
    if (m->grpo && avg && avg->n >= 8) {
        pn[0].line[2] = avg;
        pn[0].label[2] = "reward, mean of last 8";
    }
    int nlen = 0; /* held-out per-length curves: drawn together, when there are several */
    for (int i = 0; i < m->ns; i++) nlen += !strncmp(m->s[i].name, "eval/exact_match/", 17);
    panel *bylen = NULL;
    char titles[NSERIES][96], lens[NSERIES][32];
    for (int i = 0; i < m->ns; i++) {
        const char *name = m->s[i].name;
        if (strncmp(name, "eval/", 5) != 0 || (m->grpo && em == &m->s[i])) continue;
        if (!strncmp(name, "eval/exact_match/", 17)) {
            if (nlen < 2) continue;
            if (!bylen || bylen->line[PANEL_LINES - 1]) {
                bylen = &pn[np++];
                *bylen = (panel){.title = "held-out exact match by prompt length (update 0: before training)"};
            }
            int k = 0;
            while (bylen->line[k]) k++;
            snprintf(lens[i], sizeof lens[i], "P = %s", name + 17);
            bylen->line[k] = &m->s[i], bylen->label[k] = lens[i];
            continue;
        }
        if (strcmp(name, "eval/nll") == 0)
            snprintf(titles[i], sizeof titles[i], "held-out NLL per response token (update 0: before training)");
        else snprintf(titles[i], sizeof titles[i], "held-out %s (update 0: before training)", name + 5);
        pn[np++] = (panel){.title = titles[i], .line = {&m->s[i]}};
    }
    if (np == 0) return LS_OK;
    const double ph = 170, gap = 75, W = SVG_W, colw = W / 2;
    int rows = (np + 1) / 2;
    double H = 50 + rows * (ph + gap);
    sbuf b = {0};
    sb_printf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" height=\"%.0f\" "
              "viewBox=\"0 0 %d %.0f\" font-family=\"sans-serif\" font-size=\"11\">\n", SVG_W, H, SVG_W, H);
    sb_printf(&b, "<title>LongStraw metrics: ");
    sb_escape(&b, run);
    sb_printf(&b, "</title>\n<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n");
    sb_printf(&b, "<text x=\"%.1f\" y=\"24\" font-size=\"15\">", 20.0);
    sb_escape(&b, run);
    sb_printf(&b, " — %s run, %lld updates (x axis: update)</text>\n", m->grpo ? "GRPO" : "SFT", (long long)m->updates);
    for (int i = 0; i < np; i++) {
        double x0 = (i % 2) * colw + 70, top = 70 + (i / 2) * (ph + gap);
        svg_panel(&b, &pn[i], x0, x0 + colw - 100, top, ph);
    }
    sb_printf(&b, "</svg>\n");
    ls_status s = b.oom ? ls_err(LS_ERR_NOMEM, "out of memory drawing %s", out) : ls_write_file_atomic(out, b.p, b.len);
    free(b.p);
    if (s == LS_OK) printf("metrics curves: %s\n", out);
    return s;
}

/* ---- the heat map of an evaluation (RULER's picture) ---------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Exact match by prompt length (rows) and needle depth (columns) of an eval document
 * (`longstraw eval --out`, RUN/eval.json), each cell coloured from red (0) to green
 * (1) with its value and count; written atomically to `out`. */
static ls_status write_eval_svg(const char *path, const char *out) {
    char *text = NULL;
    LS_TRY(ls_read_file(path, &text, NULL));
    cJSON *doc = cJSON_Parse(text);
    free(text);
    const cJSON *bl = cJSON_GetObjectItemCaseSensitive(doc, "by_length");
    const cJSON *em = cJSON_GetObjectItemCaseSensitive(doc, "exact_match");
    if (!cJSON_IsObject(bl) || !cJSON_IsNumber(em)) {
        cJSON_Delete(doc);
        return ls_err(LS_ERR_FORMAT, "%s: not an evaluation (no \"by_length\" object or \"exact_match\" number)", path);
    }
    double lens[64], deps[64];
    int nl = 0, nd = 0;
    const cJSON *L, *D;
    cJSON_ArrayForEach(L, bl) {
        if (nl < 64) lens[nl++] = atof(L->string);
        cJSON_ArrayForEach(D, cJSON_GetObjectItemCaseSensitive(L, "by_depth")) {
            double d = atof(D->string);
            int seen = 0;
            for (int i = 0; i < nd; i++) seen |= deps[i] == d;
            if (!seen && nd < 64) deps[nd++] = d;
        }
    }
    qsort(lens, (size_t)nl, sizeof *lens, cmp_double);
    qsort(deps, (size_t)nd, sizeof *deps, cmp_double);
    const double cw = 90, ch = 34, x0 = 120, y0 = 104;
    double W = x0 + cw * (nd > 0 ? nd : 1) + 140, H = y0 + ch * (nl > 0 ? nl : 1) + 70;
    if (W < 760) W = 760; /* the two lines of text above the grid */
    sbuf b = {0};
    sb_printf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%.0f\" height=\"%.0f\" "
              "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" "
              "height=\"100%%\" fill=\"#fff\"/>\n<text x=\"20\" y=\"26\" font-size=\"15\">", W, H, W, H);
    const cJSON *task = cJSON_GetObjectItemCaseSensitive(doc, "task"), *hay = cJSON_GetObjectItemCaseSensitive(doc, "haystack");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(doc, "model");
    sb_escape(&b, cJSON_IsString(task) ? task->valuestring : "?");
    sb_printf(&b, " (%s haystack): held-out exact match %.3f", cJSON_IsString(hay) ? hay->valuestring : "?", em->valuedouble);
    sb_printf(&b, "</text>\n<text x=\"20\" y=\"46\" fill=\"#555\">");
    sb_escape(&b, cJSON_IsString(model) ? model->valuestring : path);
    sb_printf(&b, "</text>\n<text x=\"20\" y=\"62\" fill=\"#555\">rows: prompt length (tokens), columns: needle "
              "depth, cell: exact match (prompts)</text>\n");
    for (int j = 0; j < nd; j++)
        sb_printf(&b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n", x0 + cw * (j + 0.5), y0 - 8, deps[j]);
    sb_printf(&b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#555\">needle depth</text>\n",
              x0 + cw * nd / 2.0, y0 - 26);
    for (int i = 0; i < nl; i++) {
        char key[32];
        snprintf(key, sizeof key, "%.0f", lens[i]);
        const cJSON *row = cJSON_GetObjectItemCaseSensitive(bl, key), *bd = cJSON_GetObjectItemCaseSensitive(row, "by_depth");
        double y = y0 + ch * i;
        sb_printf(&b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", x0 - 8, y + ch / 2 + 4, key);
        for (int j = 0; j < nd; j++) {
            const cJSON *c = NULL;
            cJSON_ArrayForEach(D, bd) if (atof(D->string) == deps[j]) c = D;
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, "exact_match"), *n = cJSON_GetObjectItemCaseSensitive(c, "n");
            double x = x0 + cw * j;
            if (!cJSON_IsNumber(v) || !cJSON_IsNumber(n) || n->valuedouble < 1) {
                sb_printf(&b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#eee\" stroke=\"#fff\"/>\n",
                          x, y, cw, ch);
                continue;
            }
            double e = v->valuedouble < 0 ? 0 : v->valuedouble > 1 ? 1 : v->valuedouble;
            int r = (int)(215 - 170 * e), g = (int)(60 + 120 * e), bl2 = (int)(60 + 30 * e);
            sb_printf(&b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"rgb(%d,%d,%d)\" "
                      "stroke=\"#fff\"/>\n<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#fff\">%.2f "
                      "(%.0f)</text>\n", x, y, cw, ch, r, g, bl2, x + cw / 2, y + ch / 2 + 4, v->valuedouble, n->valuedouble);
        }
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(row, "exact_match");
        if (cJSON_IsNumber(re))
            sb_printf(&b, "<text x=\"%.1f\" y=\"%.1f\">all depths %.2f</text>\n", x0 + cw * nd + 10, y + ch / 2 + 4,
                      re->valuedouble);
    }
    sb_printf(&b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#555\">prompt length</text>\n", x0 - 8, y0 - 8);
    sb_printf(&b, "</svg>\n");
    cJSON_Delete(doc);
    ls_status s = b.oom ? ls_err(LS_ERR_NOMEM, "out of memory drawing %s", out) : ls_write_file_atomic(out, b.p, b.len);
    free(b.p);
    if (s == LS_OK) printf("exact match by length and depth: %s\n", out);
    return s;
}

/* ---- the command --------------------------------------------------------------------- */

static void help(void) {
    printf("usage: longstraw report RUN/ [options]\n       longstraw report --eval FILE.json [--out FILE.svg]\n\n"
           "Summarise a run from RUN/trace.<rank>.jsonl and RUN/metrics.jsonl: per rank, each\n"
           "phase's count, seconds and per-arena peak bytes; the last update's predicted vs\n"
           "measured memory terms; the first and last metrics. Draws the live bytes of each\n"
           "arena over time (rank 0, restarts concatenated, phases shaded) to RUN/memory.svg, and\n"
           "the curves a run is watched by to RUN/metrics.svg: for GRPO the reward (mean, spread),\n"
           "KL, entropy, clipped fraction, gradient norm and response length; for SFT the\n"
           "training NLL; and every held-out eval/ metric (train --eval-*), per update.\n\n"
           "A run that evaluated on a task (train --eval-every) left RUN/eval.json: its exact match\n"
           "by prompt length and needle depth is drawn to RUN/eval.svg (RULER's heat map).\n"
           "longstraw report --eval FILE.json draws that picture for a `longstraw eval --out` file.\n\n"
           "  --eval FILE          draw FILE's heat map (to FILE with .svg for .json, or --out)\n"
           "  --out FILE           write the timeline to FILE instead of RUN/memory.svg\n"
           "  --no-svg             do not draw the timeline or the curves\n"
           "  --help               this text\n");
}

static ls_status load_traces(const char *run, trace **out, int *n) {
    int *ranks = NULL;
    LS_TRY(find_ranks(run, &ranks, n));
    trace *tr = calloc((size_t)*n, sizeof *tr);
    ls_status s = tr ? LS_OK : ls_err(LS_ERR_NOMEM, "%s: out of memory", run);
    for (int i = 0; s == LS_OK && i < *n; i++) {
        tr[i].rank = ranks[i];
        snprintf(tr[i].path, sizeof tr[i].path, "%s/trace.%d.jsonl", run, ranks[i]);
        s = trace_read(&tr[i]);
    }
    free(ranks);
    *out = tr;
    return s;
}

static ls_status report_metrics(const char *run, int draw) {
    char path[4200], svg[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    snprintf(svg, sizeof svg, "%s/metrics.svg", run);
    struct stat st;
    if (stat(path, &st) != 0) return LS_OK; /* optional */
    metrics m = {0};
    int truncated;
    ls_status s = read_jsonl(path, metrics_line, &m, &truncated);
    if (s == LS_OK && m.oom) s = ls_err(LS_ERR_NOMEM, "%s: out of memory", path);
    const series *rw = series_find(&m, "reward");
    for (int64_t i = 0; s == LS_OK && rw && i < rw->n; i++) { /* the trailing mean of 8 updates' rewards */
        double sum = 0;
        int64_t k = 0;
        for (int64_t j = i; j >= 0 && j > i - 8; j--) sum += rw->y[j], k++;
        if (i >= 7) series_add(&m, "reward_avg", rw->x[i], sum / (double)k); /* m.s is fixed: rw stays valid */
    }
    if (s == LS_OK && m.oom) s = ls_err(LS_ERR_NOMEM, "%s: out of memory", path);
    if (s == LS_OK) print_metrics(path, &m);
    if (s == LS_OK && draw) s = write_metrics_svg(&m, run, svg);
    metrics_free(&m);
    return s;
}

static ls_status report(const char *run, const char *svg) {
    trace *tr = NULL;
    int n = 0;
    ls_status s = load_traces(run, &tr, &n);
    for (int i = 0; s == LS_OK && i < n; i++) print_rank(&tr[i]);
    if (s == LS_OK) s = report_metrics(run, svg != NULL);
    if (s == LS_OK && svg) s = write_svg(&tr[0], run, svg);
    if (s == LS_OK && svg) printf("memory timeline (rank %d): %s\n", tr[0].rank, svg);
    char ej[4200], es[4200];
    struct stat st;
    snprintf(ej, sizeof ej, "%s/eval.json", run);
    snprintf(es, sizeof es, "%s/eval.svg", run);
    if (s == LS_OK && svg && stat(ej, &st) == 0) s = write_eval_svg(ej, es); /* train's last held-out evaluation */
    for (int i = 0; tr && i < n; i++) trace_free(&tr[i]);
    free(tr);
    return s;
}

int cmd_report(int argc, char **argv) {
    static const struct option opts[] = {{"out", required_argument, 0, 'o'},
                                         {"eval", required_argument, 0, 'e'},
                                         {"no-svg", no_argument, 0, 'n'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *out = NULL, *eval = NULL;
    int no_svg = 0, ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case 'o': out = optarg; break;
        case 'e': eval = optarg; break;
        case 'n': no_svg = 1; break;
        case 'h': help(); return 0;
        default: return cli_usage_error("report", "bad option");
        }
    }
    if (eval) { /* one evaluation's picture */
        if (optind < argc) return cli_usage_error("report", "--eval FILE draws one evaluation: no RUN/ with it");
        if (no_svg) return cli_usage_error("report", "--eval draws a picture: not with --no-svg");
        char dst[4200];
        size_t el = strlen(eval);
        if (out) snprintf(dst, sizeof dst, "%s", out);
        else if (el > 5 && !strcmp(eval + el - 5, ".json")) snprintf(dst, sizeof dst, "%.*s.svg", (int)(el - 5), eval);
        else snprintf(dst, sizeof dst, "%s.svg", eval);
        ls_status es = write_eval_svg(eval, dst);
        return es == LS_OK ? 0 : cli_fail("report", es);
    }
    if (optind >= argc) return cli_usage_error("report", "the run directory RUN/ is required");
    if (optind + 1 < argc) return cli_usage_error("report", "unexpected argument \"%s\"", argv[optind + 1]);
    if (out && no_svg) return cli_usage_error("report", "give --out or --no-svg, not both");
    char run[4096], svg[4200];
    size_t len = strlen(argv[optind]);
    if (len == 0 || len >= sizeof run) return cli_usage_error("report", "bad run directory \"%s\"", argv[optind]);
    memcpy(run, argv[optind], len + 1);
    while (len > 1 && run[len - 1] == '/') run[--len] = 0; /* RUN/ and RUN name the same */
    snprintf(svg, sizeof svg, "%s/memory.svg", run);
    ls_status s = report(run, no_svg ? NULL : out ? out : svg);
    return s == LS_OK ? 0 : cli_fail("report", s);
}
