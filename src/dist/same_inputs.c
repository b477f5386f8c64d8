/*
 * same_inputs.c — every rank of a run checks that it was given the same command and the
 * same files as rank 0 before the work's first collective (files.h): ranks started with
 * other arguments (`mpirun -np 1 longstraw ... --model A : -np 1 longstraw ... --model
 * B`, another --mode, --cp-layout or --capture-chunk) or reading other files would
 * otherwise compute silently wrong results or wait forever in a collective the others
 * never enter. Uses the communicator's API only (MPI stays in comm.c).
 *
 * Each rank describes itself as (kind, key, value) triples — the program's digest, each
 * argument, each input file's size and digest — serialised as NUL-terminated strings.
 * One allgather of (length, hash) settles the usual case; on a difference rank 0's
 * description is broadcast, each rank names its first difference, and the findings are
 * gathered so that every rank refuses with the same message.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "longstraw/files.h"

#define MSG_BYTES 480 /* one rank's finding */

typedef struct {
    char *buf;
    size_t len, cap;
    int bad; /* out of memory */
} desc;

static void put(desc *d, const char *s) {
    size_t n = strlen(s) + 1;
    if (d->bad) return;
    if (d->len + n > d->cap) {
        size_t cap = d->cap ? d->cap : 4096;
        while (cap < d->len + n) cap *= 2;
        char *b = realloc(d->buf, cap);
        if (!b) {
            d->bad = 1;
            return;
        }
        d->buf = b, d->cap = cap;
    }
    memcpy(d->buf + d->len, s, n);
    d->len += n;
}

static void put3(desc *d, const char *kind, const char *key, const char *val) {
    put(d, kind);
    put(d, key);
    put(d, val);
}

/* "N bytes, digest H", or why the file cannot be read (not an error here: the command's
 * own load reports it; a file missing on one rank only is a difference). */
static void describe_file(const char *path, char *out, size_t cap) {
    uint64_t h;
    int64_t n;
    if (ls_file_digest(path, &h, &n) == LS_OK)
        snprintf(out, cap, "%lld bytes, digest %016llx", (long long)n, (unsigned long long)h);
    else
        snprintf(out, cap, "unreadable (%s)", ls_err_msg());
}

static int is_input_name(const char *n) {
    size_t k = strlen(n);
    return n[0] != '.' && ((k > 5 && !strcmp(n + k - 5, ".json")) || (k > 12 && !strcmp(n + k - 12, ".safetensors")));
}

/* A path: a file's triple, or one per *.json / *.safetensors file of a directory. */
static void put_path(desc *d, const char *path) {
    char val[1400];
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
        describe_file(path, val, sizeof val);
        put3(d, "file", path, val);
        return;
    }
    char **names;
    size_t n;
    ls_status ls = ls_dir_names(path, is_input_name, &names, &n);
    if (ls == LS_ERR_NOMEM) d->bad = 1;
    if (ls != LS_OK) {
        if (ls != LS_ERR_NOMEM) put3(d, "file", path, "an unreadable directory");
        return;
    }
    if (n == 0) put3(d, "file", path, "a directory without .json or .safetensors files");
    for (size_t i = 0; i < n; i++) {
        char full[4400];
        snprintf(full, sizeof full, "%s%s%s", path, path[0] && path[strlen(path) - 1] == '/' ? "" : "/", names[i]);
        describe_file(full, val, sizeof val);
        put3(d, "file", full, val);
    }
    ls_dir_names_free(names, n);
}

static void build(desc *d, int argc, char *const *argv, const char *const *paths, int n_paths) {
    char val[1400], key[32];
    describe_file("/proc/self/exe", val, sizeof val);
    put3(d, "program", "", val);
    for (int i = 1; i < argc; i++) {
        snprintf(key, sizeof key, "%d", i);
        put3(d, "arg", key, argv[i]);
    }
    for (int i = 0; i < n_paths; i++)
        if (paths[i]) put_path(d, paths[i]);
}

/* The triples of a description: v[3k], v[3k+1], v[3k+2]. malloc'd array of pointers into buf. */
static const char **split(const char *buf, size_t len, size_t *n) {
    size_t k = 0;
    for (size_t i = 0; i < len; i++) k += buf[i] == 0;
    const char **v = malloc((k + 1) * sizeof *v);
    if (!v) return NULL;
    k = 0;
    for (size_t i = 0; i < len; i += strlen(buf + i) + 1) v[k++] = buf + i;
    *n = k / 3;
    return v;
}

/* "value", cut to fit a message. */
static void quote(char *out, size_t cap, const char *s) {
    size_t n = strlen(s);
    if (n + 3 <= cap) snprintf(out, cap, "\"%s\"", s);
    else snprintf(out, cap, "\"%.*s...\"", (int)(cap > 8 ? cap - 8 : 0), s);
}

/* This rank's first difference from rank 0's description (`r0`), in msg. */
static void first_difference(int rank, const char **me, size_t nme, const char **r0, size_t n0, char *msg, size_t cap) {
    char a[160], b[160], prev[80];
    msg[0] = 0;
    /* the program */
    if (nme && n0 && strcmp(me[2], r0[2]) != 0) {
        snprintf(msg, cap, "runs another longstraw program than rank 0 (/proc/self/exe: %s on rank %d, %s on rank 0)", me[2],
                 rank, r0[2]);
        return;
    }
    /* the arguments, in order */
    size_t ai = 0, aj = 0;
    int argn = 0;
    for (;;) {
        while (ai < nme && strcmp(me[3 * ai], "arg")) ai++;
        while (aj < n0 && strcmp(r0[3 * aj], "arg")) aj++;
        int in_me = ai < nme, in_r0 = aj < n0;
        if (!in_me && !in_r0) break;
        argn++;
        if (in_me != in_r0) {
            quote(a, sizeof a, in_me ? me[3 * ai + 2] : r0[3 * aj + 2]);
            snprintf(msg, cap, "was started with %s arguments than rank 0: argument %d is %s on rank %d and missing on rank %d",
                     in_me ? "more" : "fewer", argn, a, in_me ? rank : 0, in_me ? 0 : rank);
            return;
        }
        if (strcmp(me[3 * ai + 2], r0[3 * aj + 2]) != 0) {
            quote(a, sizeof a, me[3 * ai + 2]);
            quote(b, sizeof b, r0[3 * aj + 2]);
            prev[0] = 0;
            if (ai > 0 && !strcmp(me[3 * (ai - 1)], "arg")) {
                char p[64];
                quote(p, sizeof p, me[3 * (ai - 1) + 2]);
                snprintf(prev, sizeof prev, " (after %s)", p);
            }
            snprintf(msg, cap, "was started with argument %d = %s where rank 0 has %s%s", argn, a, b, prev);
            return;
        }
        ai++, aj++;
    }
    /* the files, by name */
    for (size_t i = 0; i < nme; i++) {
        if (strcmp(me[3 * i], "file")) continue;
        size_t j = 0;
        while (j < n0 && (strcmp(r0[3 * j], "file") || strcmp(r0[3 * j + 1], me[3 * i + 1]))) j++;
        if (j == n0) {
            snprintf(msg, cap, "reads %s, which rank 0 does not", me[3 * i + 1]);
            return;
        }
        if (strcmp(me[3 * i + 2], r0[3 * j + 2]) != 0) {
            snprintf(msg, cap, "reads another %s than rank 0: %.120s on rank %d, %.120s on rank 0", me[3 * i + 1],
                     me[3 * i + 2], rank, r0[3 * j + 2]);
            return;
        }
    }
    for (size_t j = 0; j < n0; j++) {
        if (strcmp(r0[3 * j], "file")) continue;
        size_t i = 0;
        while (i < nme && (strcmp(me[3 * i], "file") || strcmp(me[3 * i + 1], r0[3 * j + 1]))) i++;
        if (i == nme) {
            snprintf(msg, cap, "does not read %s, which rank 0 reads", r0[3 * j + 1]);
            return;
        }
    }
}

ls_status ls_check_same_inputs(const ls_comm *c, int argc, char *const *argv, const char *const *paths, int n_paths) {
    if (!c || ls_comm_size(c) < 2) return LS_OK;
    int N = ls_comm_size(c), rank = ls_comm_rank(c);
    desc d = {0};
    build(&d, argc, argv, paths, n_paths);
    /* every rank takes part in every collective below, whatever happened here */
    uint64_t mine[2] = {d.bad ? 0 : (uint64_t)d.len, 0};
    if (!d.bad) {
        uint64_t h = 0x9e3779b97f4a7c15ull;
        for (size_t i = 0; i < d.len; i++) h = (h ^ (unsigned char)d.buf[i]) * 0x100000001b3ull;
        mine[1] = h;
    }
    uint64_t *all = malloc((size_t)N * sizeof mine);
    char *msgs = malloc((size_t)N * MSG_BYTES), *r0 = NULL;
    if (!all || !msgs) LS_ASSERT(0, "out of memory checking the ranks' inputs");
    ls_status s = ls_comm_allgather(c, mine, all, sizeof mine);
    int differ = 0;
    for (int r = 1; r < N && s == LS_OK; r++) differ |= all[2 * r] != all[0] || all[2 * r + 1] != all[1];
    if (s != LS_OK || !differ) goto done;
    /* someone differs: rank 0's description to every rank, each rank's finding to all */
    size_t len0 = (size_t)all[0];
    r0 = malloc(len0 + 1);
    if (!r0) LS_ASSERT(0, "out of memory checking the ranks' inputs");
    if (rank == 0 && len0) memcpy(r0, d.buf, len0);
    if (len0) s = ls_comm_bcast(c, r0, len0, 0);
    if (s != LS_OK) goto done;
    char msg[MSG_BYTES] = "";
    if (rank != 0 && (all[2 * rank] != all[0] || all[2 * rank + 1] != all[1])) {
        size_t nme = 0, n0 = 0;
        const char **vme = d.bad ? NULL : split(d.buf, d.len, &nme), **v0 = split(r0, len0, &n0);
        if (vme && v0) first_difference(rank, vme, nme, v0, n0, msg, sizeof msg);
        if (!msg[0]) snprintf(msg, sizeof msg, "describes its command and files differently from rank 0");
        free(vme);
        free(v0);
    }
    s = ls_comm_allgather(c, msg, msgs, MSG_BYTES);
    if (s != LS_OK) goto done;
    int first = -1, more = 0;
    for (int r = 1; r < N; r++)
        if (msgs[(size_t)r * MSG_BYTES]) {
            if (first < 0) first = r;
            else more++;
        }
    LS_ASSERT(first > 0, "the ranks' inputs differ, but no rank found a difference");
    char tail[64] = "";
    if (more) snprintf(tail, sizeof tail, " (and %d more rank%s differ%s)", more, more == 1 ? "" : "s", more == 1 ? "s" : "");
    s = ls_err(LS_ERR_ARG,
               "the %d ranks were not given the same command and inputs: rank %d %.*s%s. Every rank must run the same "
               "command line on the same files",
               N, first, MSG_BYTES, msgs + (size_t)first * MSG_BYTES, tail);
done:
    free(all);
    free(msgs);
    free(r0);
    free(d.buf);
    return s;
}
