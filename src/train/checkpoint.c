/*
 * checkpoint.c — committing checkpoint directories and the optimizer-state file
 * (checkpoint.h).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "longstraw/checkpoint.h"
#include "longstraw/backend.h"
#include "longstraw/comm.h"
#include "longstraw/safetensors.h"

/* Remove the entries of the open directory `fd` (named `path` in messages), depth
 * first, never following a symbolic link: a link is unlinked as a link, a
 * subdirectory is opened O_NOFOLLOW relative to its parent (openat), so nothing
 * outside the tree is touched even if an entry is swapped for a link meanwhile.
 * Takes ownership of fd. */
static ls_status remove_entries(int fd, const char *path, int depth) {
    DIR *d = fdopendir(fd);
    if (!d) {
        ls_status s = ls_err(LS_ERR_IO, "%s: cannot list: %s", path, strerror(errno));
        close(fd);
        return s;
    }
    struct dirent *e;
    char p[4096];
    ls_status s = LS_OK;
    while (s == LS_OK && (errno = 0, e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        struct stat st;
        if (fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno != ENOENT) s = ls_err(LS_ERR_IO, "%s: cannot stat: %s", p, strerror(errno));
            continue;
        }
        if (S_ISDIR(st.st_mode)) {
            if (depth >= 32) {
                s = ls_err(LS_ERR_IO, "%s: nested too deeply to remove (checkpoints hold files)", p);
                break;
            }
            int sub = openat(fd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0) s = ls_err(LS_ERR_IO, "%s: cannot open: %s", p, strerror(errno));
            else s = remove_entries(sub, p, depth + 1);
            if (s == LS_OK && unlinkat(fd, e->d_name, AT_REMOVEDIR) != 0)
                s = ls_err(LS_ERR_IO, "%s: cannot remove: %s", p, strerror(errno));
        } else if (unlinkat(fd, e->d_name, 0) != 0 && errno != ENOENT) {
            s = ls_err(LS_ERR_IO, "%s: cannot remove: %s", p, strerror(errno));
        }
    }
    if (s == LS_OK && errno != 0) s = ls_err(LS_ERR_IO, "%s: cannot list: %s", path, strerror(errno));
    closedir(d);
    return s;
}

/* Remove `path` inside a run directory (a checkpoint, a stale .tmp or .del). A
 * symbolic link there is removed as a link, never followed; a directory is removed
 * with everything in it, links inside likewise unlinked, not traversed. */
static ls_status remove_dir(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? LS_OK : ls_err(LS_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        if (unlink(path) != 0 && errno != ENOENT)
            return ls_err(LS_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
        return LS_OK;
    }
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return ls_err(LS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    LS_TRY(remove_entries(fd, path, 0));
    if (rmdir(path) != 0) return ls_err(LS_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    return LS_OK;
}

static ls_status fsync_dir(const char *path);

/* Delete a committed checkpoint without ever leaving a partial one under its name:
 * rename it to .checkpoint-<U>.del (fsync RUN/), then remove that. A crash in between
 * leaves a .del directory, which list() removes. */
static ls_status retire(const char *run, int64_t update) {
    char dir[4200], del[4200];
    snprintf(dir, sizeof dir, "%s/checkpoint-%lld", run, (long long)update);
    snprintf(del, sizeof del, "%s/.checkpoint-%lld.del", run, (long long)update);
    LS_TRY(remove_dir(del));
    if (rename(dir, del) != 0) {
        if (errno == ENOENT) return LS_OK;
        return ls_err(LS_ERR_IO, "%s -> %s: rename failed: %s", dir, del, strerror(errno));
    }
    LS_TRY(fsync_dir(run));
    return remove_dir(del);
}

static ls_status fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ls_err(LS_ERR_IO, "%s: cannot open to fsync: %s", path, strerror(errno));
    int r = fsync(fd);
    close(fd);
    return r == 0 ? LS_OK : ls_err(LS_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
}

ls_status ls_ckpt_begin(const char *run, int64_t update, char *tmp, size_t n) {
    if ((size_t)snprintf(tmp, n, "%s/.checkpoint-%lld.tmp", run, (long long)update) >= n)
        return ls_err(LS_ERR_ARG, "%s: path too long", run);
    LS_TRY(remove_dir(tmp));
    if (mkdir(tmp, 0755) != 0) return ls_err(LS_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    return LS_OK;
}

ls_status ls_ckpt_commit(const char *run, int64_t update, const char *tmp, char *dir, size_t n) {
    if ((size_t)snprintf(dir, n, "%s/checkpoint-%lld", run, (long long)update) >= n)
        return ls_err(LS_ERR_ARG, "%s: path too long", run);
    LS_TRY(fsync_dir(tmp));
    LS_TRY(retire(run, update)); /* a rerun of the same update replaces it */
    if (rename(tmp, dir) != 0) return ls_err(LS_ERR_IO, "%s -> %s: rename failed: %s", tmp, dir, strerror(errno));
    return fsync_dir(run);
}

/* The update number of a directory named "checkpoint-<digits>": 1 and *u when <digits>
 * is a canonical number (no sign, no leading zero) up to LS_CKPT_MAX_UPDATE, 0 when the
 * name is not of that form (a user's own "checkpoint-best" is left alone), −1 with an
 * error when it is of that form but out of range or not canonical: such a name is
 * refused rather than read as another number (sscanf's %lld made
 * checkpoint-99999999999999999999 INT64_MAX). */
static int ckpt_number(const char *run, const char *name, int64_t *u) {
    const char *d = name + strlen("checkpoint-");
    if (strncmp(name, "checkpoint-", strlen("checkpoint-")) != 0 || !*d) return 0;
    for (const char *c = d; *c; c++)
        if (*c < '0' || *c > '9') return 0;
    int64_t v = 0;
    for (const char *c = d; *c; c++) {
        if (v > (LS_CKPT_MAX_UPDATE - (*c - '0')) / 10) {
            ls_err(LS_ERR_FORMAT, "%s/%s: update number out of range (a run holds at most %lld updates): not a "
                                  "checkpoint this tool wrote; rename or remove it", run, name,
                   (long long)LS_CKPT_MAX_UPDATE);
            return -1;
        }
        v = 10 * v + (*c - '0');
    }
    if (d[0] == '0' && d[1]) {
        ls_err(LS_ERR_FORMAT, "%s/%s: not a checkpoint name this tool writes (it would be checkpoint-%lld): rename "
                              "or remove it", run, name, (long long)v);
        return -1;
    }
    *u = v;
    return 1;
}

/* Committed checkpoints' update numbers, ascending (malloc'd); stale tmps removed. */
static ls_status list(const char *run, int64_t **out, int64_t *count) {
    *out = NULL;
    *count = 0;
    DIR *d = opendir(run);
    if (!d) return ls_err(LS_ERR_IO, "%s: cannot open the run directory: %s", run, strerror(errno));
    struct dirent *e;
    int64_t cap = 0;
    ls_status s = LS_OK;
    while ((e = readdir(d)) && s == LS_OK) {
        long long u;
        char extra;
        if (sscanf(e->d_name, ".checkpoint-%lld.tm%c", &u, &extra) == 2 ||
            sscanf(e->d_name, ".checkpoint-%lld.de%c", &u, &extra) == 2) {
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", run, e->d_name);
            s = remove_dir(p);
            continue;
        }
        int64_t num = 0;
        int is = ckpt_number(run, e->d_name, &num);
        if (is < 0) {
            s = LS_ERR_FORMAT;
            break;
        }
        if (!is) continue;
        if (*count == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *t = realloc(*out, (size_t)cap * sizeof(int64_t));
            if (!t) {
                s = LS_ERR_NOMEM;
                break;
            }
            *out = t;
        }
        (*out)[(*count)++] = num;
    }
    closedir(d);
    for (int64_t i = 1; i < *count; i++) /* insertion sort: few entries */
        for (int64_t j = i; j > 0 && (*out)[j - 1] > (*out)[j]; j--) {
            int64_t t = (*out)[j];
            (*out)[j] = (*out)[j - 1];
            (*out)[j - 1] = t;
        }
    return s;
}

ls_status ls_ckpt_latest(const char *run, int64_t *update, char *dir, size_t n) {
    int64_t *u, c;
    *update = -1;
    ls_status s = list(run, &u, &c);
    if (s != LS_OK) {
        free(u);
        return s;
    }
    if (c > 0) {
        *update = u[c - 1];
        snprintf(dir, n, "%s/checkpoint-%lld", run, (long long)*update);
    }
    free(u);
    return LS_OK;
}

ls_status ls_ckpt_prune(const char *run, int keep) {
    int64_t *u, c;
    ls_status s = list(run, &u, &c);
    for (int64_t i = 0; i + keep < c && s == LS_OK; i++) s = retire(run, u[i]);
    free(u);
    return s;
}

/* The tensor name of moment `which` (0: exp_avg, 1: exp_avg_sq) of parameter k: by
 * its own name when the list has names that identify it (LoRA: the PEFT tensor names,
 * whose order differs between new and loaded adapters), else by position. */
static void moment_name(char *out, size_t cap, int which, const ls_param *p, int64_t k, int by_name) {
    if (by_name) snprintf(out, cap, "%s.%s", which ? "exp_avg_sq" : "exp_avg", p->what);
    else snprintf(out, cap, "%s.%lld", which ? "exp_avg_sq" : "exp_avg", (long long)k);
}

/* The moments of expert-parallel ranks ≠ 0 go to rank 0 as one message each: the
 * count of its shards, then per shard its name (fixed width), size and both moments. */
#define OPTIM_NAME 256

typedef struct {
    char name[OPTIM_NAME];
    int64_t n;
} optim_shard;

/* Rank 0 of `ep` receives every other rank's shards into the writer (buffers kept in
 * *held until the file is written). */
static ls_status gather_shards(ls_st_writer *w, const ls_comm *ep, float ***held, int64_t *nheld) {
    ls_status s = LS_OK;
    for (int r = 1; r < ls_comm_size(ep) && s == LS_OK; r++) {
        int64_t cnt = 0;
        s = ls_comm_recv(ep, &cnt, sizeof cnt, r, 11);
        for (int64_t k = 0; k < cnt && s == LS_OK; k++) {
            optim_shard h;
            s = ls_comm_recv(ep, &h, sizeof h, r, 11);
            float **grow = s == LS_OK ? realloc(*held, (size_t)(*nheld + 1) * sizeof **held) : NULL;
            float *buf = grow && h.n > 0 ? malloc((size_t)h.n * 2 * sizeof(float)) : NULL;
            if (grow) *held = grow;
            if (s == LS_OK && !buf) s = ls_err(LS_ERR_NOMEM, "cannot hold the moments of %s from rank %d", h.name, r);
            if (s == LS_OK) (*held)[(*nheld)++] = buf;
            if (s == LS_OK) s = ls_comm_recv(ep, buf, (size_t)h.n * 2 * sizeof(float), r, 11);
            int64_t shape[1] = {h.n};
            char name[OPTIM_NAME + 16];
            h.name[OPTIM_NAME - 1] = 0;
            snprintf(name, sizeof name, "exp_avg.%s", h.name);
            if (s == LS_OK) s = ls_st_writer_add_f32(w, name, LS_DTYPE_F32, 1, shape, buf);
            snprintf(name, sizeof name, "exp_avg_sq.%s", h.name);
            if (s == LS_OK) s = ls_st_writer_add_f32(w, name, LS_DTYPE_F32, 1, shape, buf + h.n);
        }
    }
    return s;
}

/* A rank ≠ 0 of `ep`: its shards to rank 0. */
static ls_status send_shards(const ls_param *m, const ls_param *v, int64_t n, const uint8_t *sharded,
                             const ls_comm *ep) {
    int64_t cnt = 0;
    for (int64_t k = 0; k < n; k++) cnt += sharded[k] != 0;
    ls_status s = ls_comm_send(ep, &cnt, sizeof cnt, 0, 11);
    float *buf = NULL;
    for (int64_t k = 0; k < n && s == LS_OK; k++) {
        if (!sharded[k]) continue;
        optim_shard h;
        memset(&h, 0, sizeof h);
        if (strlen(m[k].what) >= OPTIM_NAME) {
            s = ls_err(LS_ERR_ARG, "tensor name too long for the optimizer file: %s", m[k].what);
            break;
        }
        snprintf(h.name, sizeof h.name, "%s", m[k].what);
        h.n = m[k].n;
        float *grow = realloc(buf, (size_t)(h.n > 0 ? h.n : 1) * 2 * sizeof(float));
        if (!grow) s = ls_err(LS_ERR_NOMEM, "cannot stage the moments of %s", h.name);
        else buf = grow;
        if (s == LS_OK) s = ls_comm_send(ep, &h, sizeof h, 0, 11);
        if (s == LS_OK) {
            memcpy(buf, m[k].p, (size_t)h.n * sizeof(float));
            memcpy(buf + h.n, v[k].p, (size_t)h.n * sizeof(float));
            s = ls_comm_send(ep, buf, (size_t)h.n * 2 * sizeof(float), 0, 11);
        }
    }
    free(buf);
    return s;
}

static int ep_size(const ls_comm *ep) { return ep ? ls_comm_size(ep) : 1; }

static ls_status optim_save(const char *path, const ls_param *m, const ls_param *v, int64_t n, int64_t step,
                            int by_name, const uint8_t *sharded, const ls_comm *ep) {
    int N = sharded ? ep_size(ep) : 1, r = N > 1 ? ls_comm_rank(ep) : 0;
    if (N > 1) { /* collective: only when the group's rank 0 writes */
        float writes = path && r == 0 ? 1.0f : 0.0f;
        LS_TRY(ls_comm_allreduce_f32(ep, &writes, 1, LS_REDUCE_MAX));
        if (writes == 0.0f) return LS_OK;
        if (r != 0) return send_shards(m, v, n, sharded, ep);
        by_name = 1; /* positions differ between the ranks: names do not */
    }
    ls_st_writer w;
    ls_st_writer_init(&w);
    char name[512], buf[32];
    ls_status s = LS_OK;
    for (int64_t k = 0; k < n && s == LS_OK; k++) {
        int64_t shape[1] = {m[k].n};
        moment_name(name, sizeof name, 0, &m[k], k, by_name);
        s = ls_st_writer_add_f32(&w, name, LS_DTYPE_F32, 1, shape, m[k].p);
        moment_name(name, sizeof name, 1, &m[k], k, by_name);
        if (s == LS_OK) s = ls_st_writer_add_f32(&w, name, LS_DTYPE_F32, 1, shape, v[k].p);
    }
    float **held = NULL; /* the other ranks' moments, until the file is written */
    int64_t nheld = 0, total = n;
    if (N > 1) {
        ls_status g = gather_shards(&w, ep, &held, &nheld); /* every message received, even after an error here */
        if (s == LS_OK) s = g;
        total = w.n / 2;
    }
    snprintf(buf, sizeof buf, "%lld", (long long)step);
    if (s == LS_OK) s = ls_st_writer_add_meta(&w, "step", buf);
    snprintf(buf, sizeof buf, "%lld", (long long)total);
    if (s == LS_OK) s = ls_st_writer_add_meta(&w, "tensors", buf);
    if (s == LS_OK && path) s = ls_st_write(&w, path);
    ls_st_writer_free(&w);
    for (int64_t k = 0; k < nheld; k++) free(held[k]);
    free(held);
    return s;
}

/* Why a moment is missing, when the file says: its moments are named the other way
 * (by position: saved on one rank; by tensor name: saved with --ep > 1 or LoRA). */
static const char *missing_hint(const ls_st_file *f, int by_name) {
    if (by_name && ls_st_find(f, "exp_avg.0"))
        return " (the file names its moments by position: the run was saved without --ep; resume it with the "
               "run's own --ep 1)";
    if (!by_name && ls_st_count(f) > 0 && !ls_st_find(f, "exp_avg.0"))
        return " (the file names its moments by tensor: the run was saved with expert parallelism; resume it under "
               "mpirun with the run's own --ep, see its args.json)";
    return "";
}

/* A loaded moment is usable: every value finite, and the second moment (a running
 * mean of squares) >= 0; else the file, tensor, element and value are named. A NaN
 * here would otherwise reach every weight it touches at the next step. */
static ls_status check_moment(const char *path, const char *name, int second, const float *x, int64_t n) {
    int bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static) if (n > (1 << 20))
    for (int64_t i = 0; i < n; i++) bad |= !(fabsf(x[i]) <= FLT_MAX) || (second && x[i] < 0);
    for (int64_t i = 0; bad && i < n; i++)
        if (!isfinite(x[i]) || (second && x[i] < 0))
            return ls_err(LS_ERR_FORMAT, "%s: tensor \"%s\" holds an invalid value %g at element %lld (%s)", path,
                          name, (double)x[i], (long long)i,
                          second ? "exp_avg_sq must be finite and >= 0" : "exp_avg must be finite");
    return LS_OK;
}

static ls_status optim_load(const char *path, const ls_param *m, const ls_param *v, int64_t n, int64_t *step,
                            int by_name, const uint8_t *sharded, const ls_comm *ep) {
    int N = sharded ? ep_size(ep) : 1;
    int64_t total = n; /* every rank holds as many shards as the others (the experts split evenly) */
    if (N > 1) {
        int64_t nsh = 0;
        for (int64_t k = 0; k < n; k++) nsh += sharded[k] != 0;
        total = n + (N - 1) * nsh;
        by_name = 1;
    }
    ls_st_file f;
    LS_TRY(ls_st_open(&f, path));
    ls_status s = LS_OK;
    const char *st = ls_st_meta_get(&f, "step"), *nt = ls_st_meta_get(&f, "tensors");
    char *end = NULL;
    errno = 0;
    long long sv = st ? strtoll(st, &end, 10) : -1;
    if (!st || !end || *end || end == st || errno || sv < 0)
        s = ls_err(LS_ERR_FORMAT, "%s: metadata \"step\" is missing or not a count", path);
    else if (!nt || strtoll(nt, NULL, 10) != total || ls_st_count(&f) != 2 * total)
        s = ls_err(LS_ERR_FORMAT, "%s: holds moments of %s tensors (%lld entries), but %lld are trained: "
                                  "a different model, LoRA or --ep setup", path, nt ? nt : "?", (long long)ls_st_count(&f),
                   (long long)total);
    char name[512];
    for (int64_t k = 0; k < n && s == LS_OK; k++) {
        for (int which = 0; which < 2 && s == LS_OK; which++) {
            moment_name(name, sizeof name, which, &m[k], k, by_name);
            const ls_st_tensor *t = ls_st_find(&f, name);
            if (!t) s = ls_err(LS_ERR_FORMAT, "%s: tensor \"%s\" is missing%s", path, name, missing_hint(&f, by_name));
            else s = ls_st_read_f32(t, which ? v[k].p : m[k].p, which ? v[k].n : m[k].n, path);
            if (s == LS_OK) s = check_moment(path, name, which, which ? v[k].p : m[k].p, which ? v[k].n : m[k].n);
        }
    }
    if (s == LS_OK) *step = sv;
    ls_st_close(&f);
    return s;
}

/* The moments as host memory: the lists themselves on a host-memory backend, else lists of
 * host views (read back when `read`), one place where the optimizer state crosses. */
static ls_status host_moments(const ls_backend *be, const ls_param *m, int64_t n, int read, ls_param **out) {
    *out = calloc((size_t)(n > 0 ? n : 1), sizeof **out);
    if (!*out) return ls_err(LS_ERR_NOMEM, "cannot stage %lld moments", (long long)n);
    for (int64_t k = 0; k < n; k++) {
        (*out)[k] = m[k];
        if (m[k].p && !((*out)[k].p = ls_host_view(be, NULL, m[k].p, (size_t)m[k].n * sizeof(float), read)))
            return ls_err(LS_ERR_NOMEM, "cannot stage the moments of %s", m[k].what ? m[k].what : "a tensor");
    }
    return LS_OK;
}

/* The views back into the moments when `write`, and freed. */
static void done_moments(const ls_backend *be, const ls_param *m, ls_param *h, int64_t n, int write) {
    for (int64_t k = 0; h && k < n; k++) ls_host_view_done(be, NULL, m[k].p, h[k].p, (size_t)m[k].n * sizeof(float), write);
    free(h);
}

ls_status ls_optim_save(const ls_backend *be, const char *path, const ls_param *m, const ls_param *v, int64_t n,
                        int64_t step, int by_name, const uint8_t *sharded, const ls_comm *ep) {
    if (ls_host_direct(be)) return optim_save(path, m, v, n, step, by_name, sharded, ep);
    ls_param *hm = NULL, *hv = NULL;
    ls_status s = host_moments(be, m, n, 1, &hm);
    if (s == LS_OK) s = host_moments(be, v, n, 1, &hv);
    if (s == LS_OK) s = optim_save(path, hm, hv, n, step, by_name, sharded, ep);
    done_moments(be, m, hm, n, 0);
    done_moments(be, v, hv, n, 0);
    return s;
}

ls_status ls_optim_load(const ls_backend *be, const char *path, const ls_param *m, const ls_param *v, int64_t n,
                        int64_t *step, int by_name, const uint8_t *sharded, const ls_comm *ep) {
    if (ls_host_direct(be)) return optim_load(path, m, v, n, step, by_name, sharded, ep);
    ls_param *hm = NULL, *hv = NULL;
    ls_status s = host_moments(be, m, n, 0, &hm);
    if (s == LS_OK) s = host_moments(be, v, n, 0, &hv);
    if (s == LS_OK) s = optim_load(path, hm, hv, n, step, by_name, sharded, ep);
    done_moments(be, m, hm, n, s == LS_OK);
    done_moments(be, v, hv, n, s == LS_OK);
    return s;
}
