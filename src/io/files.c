/*
 * files.c — opening what a user names without blocking on a FIFO or following a
 * planted symbolic link, a content digest of inputs, and JSON numbers that are never
 * NaN or Inf (files.h).
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "longstraw/files.h"

static ls_status not_regular_input(const char *path, mode_t m) {
    return ls_err(LS_ERR_ARG, "%s is %s, not a regular file: refusing to read it%s", path, ls_file_kind(m),
                  S_ISDIR(m) ? " (name a file, not a directory)" : "");
}

/* Clear O_NONBLOCK, which was there only so that open() could not block. */
static int clear_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
}

ls_status ls_open_input(const char *path, int *fd) {
    struct stat st;
    *fd = -1;
    if (stat(path, &st) != 0) return ls_err(LS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return not_regular_input(path, st.st_mode);
    /* it may have been replaced since: O_NONBLOCK keeps a FIFO from blocking the open,
     * and the descriptor itself is checked */
    int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (f < 0) return ls_err(LS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(f, &st) != 0 || !S_ISREG(st.st_mode) || clear_nonblock(f) != 0) {
        int e = errno;
        close(f);
        return S_ISREG(st.st_mode) ? ls_err(LS_ERR_IO, "%s: cannot open: %s", path, strerror(e))
                                   : not_regular_input(path, st.st_mode);
    }
    *fd = f;
    return LS_OK;
}

ls_status ls_open_input_stream(const char *path, FILE **f) {
    int fd;
    *f = NULL;
    LS_TRY(ls_open_input(path, &fd));
    *f = fdopen(fd, "rb");
    if (*f) return LS_OK;
    ls_status s = ls_err(LS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    close(fd);
    return s;
}

ls_status ls_open_in_place(const char *path, int flags, int *fd) {
    struct stat st;
    *fd = -1;
    if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        if (S_ISLNK(st.st_mode)) {
            char to[4096];
            ssize_t n = readlink(path, to, sizeof to - 1);
            to[n > 0 ? n : 0] = 0;
            return ls_err(LS_ERR_ARG, "%s is a symbolic link (to %s), not a regular file: refusing to write through it",
                          path, n > 0 ? to : "?");
        }
        return ls_err(LS_ERR_ARG, "%s is %s, not a regular file: refusing to write it", path, ls_file_kind(st.st_mode));
    }
    /* O_NOFOLLOW and the fstat close the window between the lstat and the open */
    int f = open(path, flags | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    if (f < 0) {
        if (errno == ELOOP) return ls_err(LS_ERR_ARG, "%s is a symbolic link, not a regular file: refusing to write through it", path);
        return ls_err(LS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    if (fstat(f, &st) != 0 || !S_ISREG(st.st_mode) || clear_nonblock(f) != 0) {
        int e = errno;
        close(f);
        if (S_ISREG(st.st_mode)) return ls_err(LS_ERR_IO, "%s: cannot open: %s", path, strerror(e));
        return ls_err(LS_ERR_ARG, "%s is %s, not a regular file: refusing to write it", path, ls_file_kind(st.st_mode));
    }
    *fd = f;
    return LS_OK;
}

/* ---- digest ----------------------------------------------------------------------- */

#define DIGEST_WHOLE ((int64_t)64 << 20) /* hashed whole up to this size */
#define DIGEST_HEAD ((int64_t)1 << 20)
#define DIGEST_BLOCK ((int64_t)64 << 10)
#define DIGEST_BLOCKS 256

static const uint64_t K1 = 0x9e3779b97f4a7c15ull, K2 = 0xc2b2ae3d27d4eb4full;

static uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* One lane over 8-byte words (xxhash-like round), the tail byte by byte. */
static uint64_t mix(uint64_t h, const unsigned char *p, size_t n) {
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = rotl64(h ^ (w * K2), 31) * K1;
        p += 8, n -= 8;
    }
    while (n--) h = rotl64(h ^ (*p++ * K2), 23) * K1;
    return h;
}

static uint64_t finish(uint64_t h) {
    h ^= h >> 33;
    h *= K2;
    h ^= h >> 29;
    return h;
}

/* Hash `len` bytes of fd from `off` into *h; buf holds at least DIGEST_BLOCK bytes. */
static int hash_range(int fd, int64_t off, int64_t len, unsigned char *buf, uint64_t *h) {
    while (len > 0) {
        size_t want = (size_t)(len < DIGEST_BLOCK ? len : DIGEST_BLOCK);
        ssize_t got = pread(fd, buf, want, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got == 0) errno = EIO; /* the file shrank while we read it */
        if (got <= 0) return -1;
        *h = mix(*h, buf, (size_t)got);
        off += got, len -= got;
    }
    return 0;
}

ls_status ls_file_digest(const char *path, uint64_t *digest, int64_t *size) {
    int fd;
    LS_TRY(ls_open_input(path, &fd));
    struct stat st;
    unsigned char *buf = malloc((size_t)DIGEST_BLOCK);
    if (!buf || fstat(fd, &st) != 0) {
        free(buf);
        close(fd);
        return ls_err(buf ? LS_ERR_IO : LS_ERR_NOMEM, "%s: cannot read: %s", path, buf ? strerror(errno) : "out of memory");
    }
    int64_t n = (int64_t)st.st_size;
    uint64_t h = K1 ^ (uint64_t)n;
    int bad;
    if (n <= DIGEST_WHOLE) {
        bad = hash_range(fd, 0, n, buf, &h);
    } else {
        bad = hash_range(fd, 0, DIGEST_HEAD, buf, &h);
        for (int i = 0; i < DIGEST_BLOCKS && !bad; i++) {
            int64_t off = DIGEST_HEAD + (n - DIGEST_HEAD - DIGEST_BLOCK) / (DIGEST_BLOCKS - 1) * i;
            bad = hash_range(fd, off, DIGEST_BLOCK, buf, &h);
        }
    }
    int e = errno;
    free(buf);
    close(fd);
    if (bad) return ls_err(LS_ERR_IO, "%s: cannot read: %s", path, strerror(e));
    *digest = finish(h);
    *size = n;
    return LS_OK;
}

/* ---- JSON numbers -------------------------------------------------------------------- */

int ls_json_number(FILE *f, const char *fmt, double v) {
    if (!isfinite(v)) return fputs("null", f) < 0 ? -1 : 4;
    return fprintf(f, fmt ? fmt : "%.9g", v);
}

void ls_json_string(FILE *f, const char *s) {
    cJSON *j = cJSON_CreateString(s);
    char *t = j ? cJSON_PrintUnformatted(j) : NULL;
    fputs(t ? t : "null", f);
    free(t);
    cJSON_Delete(j);
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

void ls_dir_names_free(char **names, size_t n) {
    for (size_t i = 0; names && i < n; i++) free(names[i]);
    free(names);
}

ls_status ls_dir_names(const char *dir, int (*keep)(const char *name), char ***names, size_t *n) {
    *names = NULL, *n = 0;
    DIR *d = opendir(dir);
    if (!d) return ls_err(LS_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
    size_t cap = 0;
    ls_status s = LS_OK;
    for (struct dirent *e; s == LS_OK && (e = readdir(d));) {
        if (!keep(e->d_name)) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            char **t = realloc(*names, cap * sizeof **names);
            if (!t) {
                s = ls_err(LS_ERR_NOMEM, "%s: out of memory listing it", dir);
                break;
            }
            *names = t;
        }
        if (!((*names)[*n] = strdup(e->d_name))) s = ls_err(LS_ERR_NOMEM, "%s: out of memory listing it", dir);
        else (*n)++;
    }
    closedir(d);
    if (s != LS_OK) {
        ls_dir_names_free(*names, *n);
        *names = NULL, *n = 0;
        return s;
    }
    if (*n) qsort(*names, *n, sizeof **names, cmp_names);
    return LS_OK;
}
