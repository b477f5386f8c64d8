/*
 * testutil.c — comparison helpers shared by the tests (NaN-safe), the commands they run
 * and the training loop called as a library.
 */
#include <stdarg.h>
#include "testutil.h"
#include "longstraw/config.h"
#include "longstraw/files.h"
#include "longstraw/family.h"

#include "longstraw/trace.h"

#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

double t_max_abs_diff_f(const float *a, const float *b, int64_t n) {
    if (n <= 0) return INFINITY;
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d; /* NaN propagates */
        if (isnan(d)) return INFINITY;
    }
    return m;
}

double t_max_abs_diff_d(const double *a, const double *b, int64_t n) {
    if (n <= 0) return INFINITY;
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]);
        if (isnan(d)) return INFINITY;
        if (d > m) m = d;
    }
    return m;
}

double t_rel_err_f(const float *a, const float *b, int64_t n) {
    if (n <= 0) return INFINITY;
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    double r = sqrt(num) / fmax(sqrt(den), 1e-30);
    return isfinite(r) ? r : INFINITY;
}

double t_rel_err_fd(const float *a, const double *b, int64_t n) {
    if (n <= 0) return INFINITY;
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += b[i] * b[i];
    }
    double r = sqrt(num) / fmax(sqrt(den), 1e-30);
    return isfinite(r) ? r : INFINITY;
}

int t_all_finite_f(const float *a, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(a[i])) return 0;
    return n > 0;
}

void t_fill_normal(float *x, int64_t n, ls_rng *r, float std) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(std * ls_rng_normal(r));
}

void t_perturb_ulp(float *x, int64_t n, ls_rng *r) {
    for (int64_t i = 0; i < n; i++)
        if (isfinite(x[i]) && x[i] != 0.0f) x[i] = nextafterf(x[i], (ls_rng_u64(r) & 1) ? INFINITY : -INFINITY);
}

double t_floor_bound(double floor, double k, double min_bound) {
    if (isnan(floor)) return NAN;
    return k * floor > min_bound ? k * floor : min_bound;
}

int t_make_tmpdir(char *out, size_t cap) {
    const char *base = getenv("TMPDIR");
    if (!base || !base[0]) base = "/tmp";
    snprintf(out, cap, "%s/ls_test_XXXXXX", base);
    return mkdtemp(out) ? 0 : -1;
}

int t_remove_dir(const char *dir) {
    char cmd[4200];
    if ((size_t)snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir) >= sizeof cmd) return -1;
    return system(cmd) == 0 ? 0 : -1;
}

char *t_run_capture(const char *cmd, int *exit_code) {
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    if (!buf) {
        pclose(p);
        return NULL;
    }
    size_t got;
    while ((got = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += got;
        if (cap - len < 4096) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
    }
    buf[len] = 0;
    int st = pclose(p);
    if (exit_code) *exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return buf;
}

char *t_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += got;
        if (cap - n - 1 == 0) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) free(buf);
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (!buf) return NULL;
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

int t_st_same_f32(const ls_st_tensor *a, const ls_st_tensor *b) {
    if (!a || !b || a->numel != b->numel) return -1;
    float *x = malloc((size_t)(a->numel > 0 ? a->numel : 1) * sizeof(float));
    float *y = malloc((size_t)(b->numel > 0 ? b->numel : 1) * sizeof(float));
    int r = -1;
    if (x && y && ls_st_read_f32(a, x, a->numel, a->name) == LS_OK && ls_st_read_f32(b, y, b->numel, b->name) == LS_OK)
        r = memcmp(x, y, (size_t)a->numel * sizeof(float)) == 0;
    free(x);
    free(y);
    return r;
}

char *t_run_vfmt(int *exit_code, const char *fmt, va_list ap) {
    char cmd[16384];
    int n = vsnprintf(cmd, sizeof cmd - 8, fmt, ap);
    if (n < 0 || n >= (int)sizeof cmd - 8) return NULL;
    strcat(cmd, " 2>&1");
    return t_run_capture(cmd, exit_code);
}

char *t_run_fmt(int *exit_code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *out = t_run_vfmt(exit_code, fmt, ap);
    va_end(ap);
    return out;
}

ls_status t_train_logged(const ls_train_opts *o, ls_train_result *res, char **log) {
    char path[4200];
    size_t n = strlen(o->out);
    while (n > 1 && o->out[n - 1] == '/') n--;
    snprintf(path, sizeof path, "%.*s.stderr", (int)n, o->out);
    *log = NULL;
    fflush(stderr);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    int saved = fd >= 0 ? dup(STDERR_FILENO) : -1;
    int captured = saved >= 0 && dup2(fd, STDERR_FILENO) >= 0;
    ls_status s = ls_train_run(o, res);
    fflush(stderr);
    if (captured) dup2(saved, STDERR_FILENO);
    if (saved >= 0) close(saved);
    if (fd >= 0) close(fd);
    if (captured) *log = t_read_file(path, NULL);
    return s;
}

void t_train_opts(ls_train_opts *o, char *model, size_t mn, char *run, size_t rn, const char *dir,
                  const char *run_name, const char *data) {
    ls_train_opts_default(o);
    snprintf(model, mn, "%s/m", dir);
    snprintf(run, rn, "%s/%s", dir, run_name);
    o->model = model;
    o->out = run;
    o->data = data;
    ls_progress_enable(0);
}

int t_write_model(const char *config_path, const char *dir, int seed) {
    ls_config cfg;
    ls_status s = ls_make_dir(dir);
    if (s == LS_OK) s = ls_config_load(&cfg, config_path);
    const ls_family *fam = s == LS_OK ? ls_family_for(&cfg, config_path) : NULL;
    if (s == LS_OK) s = fam ? fam->write_random(config_path, dir, (uint64_t)seed, LS_DTYPE_F32) : LS_ERR_UNSUPPORTED;
    if (s != LS_OK) fprintf(stderr, "  model from %s: %s\n", config_path, ls_err_msg());
    return s == LS_OK ? 0 : 1;
}

int t_copy_model(const char *src, const char *dst, t_tensor_edit edit, void *ctx) {
    char path[2200], out[2200];
    ls_status s = ls_make_dir(dst);
    snprintf(path, sizeof path, "%s/config.json", src);
    snprintf(out, sizeof out, "%s/config.json", dst);
    if (s == LS_OK) s = ls_copy_file_atomic(path, out);
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    ls_st_file f;
    int opened = s == LS_OK && (s = ls_st_open(&f, path)) == LS_OK;
    int64_t n = opened ? ls_st_count(&f) : 0;
    float **bufs = calloc((size_t)(n > 0 ? n : 1), sizeof *bufs);
    if (s == LS_OK && !bufs) s = LS_ERR_NOMEM;
    ls_st_writer w;
    ls_st_writer_init(&w);
    for (int64_t i = 0; i < n && s == LS_OK; i++) {
        const ls_st_tensor *t = ls_st_at(&f, i);
        bufs[i] = malloc((size_t)(t->numel > 0 ? t->numel : 1) * sizeof(float));
        s = bufs[i] ? ls_st_read_f32(t, bufs[i], t->numel, NULL) : LS_ERR_NOMEM;
        ls_dtype dt = s == LS_OK && edit ? edit(t->name, bufs[i], t->numel, ctx) : LS_DTYPE_F32;
        if (s == LS_OK) s = ls_st_writer_add_f32(&w, t->name, dt, t->ndim, t->shape, bufs[i]);
    }
    snprintf(out, sizeof out, "%s/model.safetensors", dst);
    if (s == LS_OK) s = ls_st_write(&w, out);
    ls_st_writer_free(&w);
    for (int64_t i = 0; bufs && i < n; i++) free(bufs[i]);
    free(bufs);
    if (opened) ls_st_close(&f);
    if (s != LS_OK) fprintf(stderr, "  copy of the model %s to %s: %s\n", src, dst, ls_err_msg());
    return s == LS_OK ? 0 : 1;
}
