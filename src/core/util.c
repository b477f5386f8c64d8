/*
 * util.c — dtype conversion, RNG, timers, peak RSS, thread control, and the checks
 * the atomic file writers make on their destination and temp file.
 */
#include "longstraw/core.h"
#include "core/rt.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <stdlib.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

void openblas_set_num_threads(int num_threads);

/* ---- dtypes ---- */
size_t ls_dtype_size(ls_dtype t) {
    switch (t) {
    case LS_DTYPE_F32: return 4;
    case LS_DTYPE_BF16: return 2;
    case LS_DTYPE_F16: return 2;
    case LS_DTYPE_F64: return 8;
    }
    return 0;
}

const char *ls_dtype_name(ls_dtype t) {
    switch (t) {
    case LS_DTYPE_F32: return "F32";
    case LS_DTYPE_BF16: return "BF16";
    case LS_DTYPE_F16: return "F16";
    case LS_DTYPE_F64: return "F64";
    }
    return "?";
}

int ls_dtype_parse(const char *s, ls_dtype *out) {
    static const struct { const char *n; ls_dtype t; } tab[] = {
        {"F32", LS_DTYPE_F32}, {"BF16", LS_DTYPE_BF16}, {"F16", LS_DTYPE_F16}, {"F64", LS_DTYPE_F64}};
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (strcmp(s, tab[i].n) == 0) {
            *out = tab[i].t;
            return 0;
        }
    return -1;
}

float ls_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    union { uint32_t u; float f; } v;
    if (exp == 0) {
        /* zero or subnormal: value = man * 2^-24 */
        float f = ldexpf((float)man, -24);
        return sign ? -f : f;
    } else if (exp == 31) {
        v.u = sign | 0x7f800000u | (man << 13);
    } else {
        v.u = sign | ((exp + 112) << 23) | (man << 13);
    }
    return v.f;
}

uint16_t ls_f32_to_f16(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    uint32_t sign = (v.u >> 16) & 0x8000u;
    uint32_t a = v.u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow -> inf */
    if (a < 0x38800000u) {
        /* subnormal half: round(|f| * 2^24) */
        float m = ldexpf(fabsf(f), 24);
        uint32_t r = (uint32_t)nearbyintf(m);
        return (uint16_t)(sign | r);
    }
    uint32_t exp = (a >> 23) - 112;
    uint32_t man = a & 0x7fffffu;
    uint32_t h = (exp << 10) | (man >> 13);
    uint32_t rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

void ls_convert_to_f32(float *dst, const void *src, ls_dtype t, size_t n) {
    switch (t) {
    case LS_DTYPE_F32: memcpy(dst, src, n * 4); break;
    case LS_DTYPE_BF16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = ls_bf16_to_f32(s[i]);
        break;
    }
    case LS_DTYPE_F16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = ls_f16_to_f32(s[i]);
        break;
    }
    case LS_DTYPE_F64: {
        const double *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = (float)s[i];
        break;
    }
    }
}

void ls_convert_from_f32(void *dst, ls_dtype t, const float *src, size_t n) {
    switch (t) {
    case LS_DTYPE_F32: memcpy(dst, src, n * 4); break;
    case LS_DTYPE_BF16: {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = ls_f32_to_bf16(src[i]);
        break;
    }
    case LS_DTYPE_F16: {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = ls_f32_to_f16(src[i]);
        break;
    }
    case LS_DTYPE_F64: {
        double *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = src[i];
        break;
    }
    }
}

/* ---- RNG ---- */
static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void ls_rng_seed(ls_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t ls_rng_u64(ls_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double ls_rng_uniform(ls_rng *r) { return (double)(ls_rng_u64(r) >> 11) * 0x1.0p-53; }

double ls_rng_normal(ls_rng *r) {
    double u1 = ls_rng_uniform(r), u2 = ls_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* ---- time, memory, threads ---- */
double ls_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

size_t ls_peak_rss_bytes(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (size_t)ru.ru_maxrss * 1024u;
}

int ls_num_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

void ls_set_threads(int n) {
    if (n <= 0) n = ls_num_cores();
    ls_rt_get()->threads = n;
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
    openblas_set_num_threads(n);
}

int ls_get_threads(void) {
    int n = ls_rt_get()->threads;
    return n > 0 ? n : ls_num_cores();
}

/* ---- output files ---- */
const char *ls_file_kind(unsigned int m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISLNK(m)) return "a symbolic link";
    return "not a regular file";
}

/* `path` up to its last '/' ("." when it has none). */
static void parent_of(const char *path, char *out, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, cap, ".");
    else if (slash == path) snprintf(out, cap, "/");
    else snprintf(out, cap, "%.*s", (int)(slash - path), path);
}

/* ENOTDIR on creating `path`: its parent (or one above) is a file. */
static ls_status not_a_directory(const char *path) {
    char dir[4096];
    parent_of(path, dir, sizeof dir);
    return ls_err(LS_ERR_ARG, "%s: cannot create it: %s (or a directory above it) is not a directory", path, dir);
}

ls_status ls_check_output_file(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return LS_OK;
        if (errno == ENOTDIR) return not_a_directory(path);
        return ls_err(LS_ERR_IO, "%s: cannot access: %s", path, strerror(errno));
    }
    if (S_ISREG(st.st_mode)) return LS_OK;
    if (S_ISLNK(st.st_mode)) {
        char to[4096];
        ssize_t n = readlink(path, to, sizeof to - 1);
        to[n > 0 ? n : 0] = 0;
        return ls_err(LS_ERR_ARG, "%s is a symbolic link (to %s), not a regular file: refusing to replace it "
                                  "(name the file itself)", path, n > 0 ? to : "?");
    }
    return ls_err(LS_ERR_ARG, "%s is %s, not a regular file: refusing to replace it", path, ls_file_kind(st.st_mode));
}

ls_status ls_create_temp_file(const char *tmp, int *fd) {
    struct stat st;
    if (lstat(tmp, &st) == 0) {
        /* ours by name (path.tmp.<pid>); a directory there is not */
        if (S_ISDIR(st.st_mode))
            return ls_err(LS_ERR_ARG, "%s is a directory: cannot use it as a temp file", tmp);
        if (unlink(tmp) != 0 && errno != ENOENT)
            return ls_err(LS_ERR_IO, "%s: cannot remove stale temp file: %s", tmp, strerror(errno));
    }
    *fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (*fd < 0) {
        if (errno == ENOTDIR) return not_a_directory(tmp);
        return ls_err(LS_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    }
    return LS_OK;
}

ls_status ls_make_dir(const char *path) {
    if (mkdir(path, 0755) == 0) return LS_OK;
    int e = errno;
    struct stat st;
    if (e == EEXIST && stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) return LS_OK;
        return ls_err(LS_ERR_ARG, "%s exists and is %s, not a directory", path,
                      S_ISREG(st.st_mode) ? "a regular file" : ls_file_kind(st.st_mode));
    }
    if (e == EEXIST) /* a dangling symlink */
        return ls_err(LS_ERR_ARG, "%s exists and is a symbolic link to nothing, not a directory", path);
    if (e == ENOTDIR) {
        char dir[4096];
        parent_of(path, dir, sizeof dir);
        return ls_err(LS_ERR_ARG, "%s: cannot create it: %s (or a directory above it) is not a directory", path, dir);
    }
    return ls_err(LS_ERR_IO, "%s: cannot create: %s", path, strerror(e));
}

/* ---- stop requests ------------------------------------------------------------ */
/* A signal handler's request goes to the process's runtime (the CLI's); an API
 * context's is ls_ctx_request_stop's. The current runtime's is what loops honour. */
void ls_request_stop(int sig) { ls_rt_process()->stop = sig; }
int ls_stop_requested(void) { return ls_rt_get()->stop; }
void ls_clear_stop(void) { ls_rt_get()->stop = 0; }
