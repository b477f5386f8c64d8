/*
 * fuzz_safetensors.c — libFuzzer harness for the safetensors reader.
 *
 * ls_st_open takes a path and maps the file, so each input is written to an
 * in-memory file (memfd_create, opened again through /proc/self/fd/N; a temp file
 * under $TMPDIR when memfd is unavailable). Then: ls_st_open, walk every tensor
 * (ls_st_at, ls_st_find, ls_st_check_shape), ls_st_read_f32 on each supported
 * tensor (and once with a wrong element count), the metadata, ls_st_close.
 * Oracles: a rejection names the file; an accepted file satisfies every promise of
 * safetensors.h (offsets inside the data buffer, no overlap, sizes consistent with
 * dtype and shape, names sorted and unique, metadata sorted).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "longstraw/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static int g_fd = -1;
static char g_path[256];

static void cleanup(void) {
    if (g_fd >= 0) close(g_fd);
    if (strncmp(g_path, "/proc/", 6) != 0 && g_path[0]) unlink(g_path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    g_fd = memfd_create("ls-fuzz-st", MFD_CLOEXEC);
    if (g_fd >= 0) {
        snprintf(g_path, sizeof g_path, "/proc/self/fd/%d", g_fd);
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(g_path, sizeof g_path, "%s/ls-fuzz-st-%d.safetensors", tmp && *tmp ? tmp : "/tmp", (int)getpid());
        g_fd = open(g_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (g_fd < 0) {
            perror(g_path);
            abort();
        }
    }
    atexit(cleanup);
    return 0;
}

static void put_input(const uint8_t *data, size_t size) {
    if (ftruncate(g_fd, 0) != 0) abort();
    size_t done = 0;
    while (done < size) {
        ssize_t w = pwrite(g_fd, data + done, size - done, (off_t)done);
        if (w <= 0) abort();
        done += (size_t)w;
    }
}

static void check_tensor(const ls_st_file *f, const ls_st_tensor *t) {
    FUZZ_CHECK(t->name && t->file == f->path, "tensor without name or file");
    FUZZ_CHECK(t->ndim >= 0 && t->ndim <= LS_ST_MAX_DIMS, "\"%s\": ndim %d", t->name, t->ndim);
    FUZZ_CHECK((unsigned)t->st_dtype < LS_ST_DTYPE_COUNT, "\"%s\": dtype %d", t->name, (int)t->st_dtype);
    int64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        FUZZ_CHECK(t->shape[d] >= 0, "\"%s\": shape[%d] = %lld", t->name, d, (long long)t->shape[d]);
        FUZZ_CHECK(!__builtin_mul_overflow(numel, t->shape[d], &numel), "\"%s\": numel overflows", t->name);
    }
    FUZZ_CHECK(numel == t->numel, "\"%s\": numel %lld, shape says %lld", t->name, (long long)t->numel,
               (long long)numel);
    FUZZ_CHECK(t->numel * ls_st_dtype_bits(t->st_dtype) == t->nbytes * 8, "\"%s\": %lld bytes for %lld x %d bits",
               t->name, (long long)t->nbytes, (long long)t->numel, ls_st_dtype_bits(t->st_dtype));
    FUZZ_CHECK(t->offset >= 0 && t->nbytes >= 0 && t->offset + t->nbytes <= f->data_size,
               "\"%s\": [%lld, +%lld) outside %lld data bytes", t->name, (long long)t->offset, (long long)t->nbytes,
               (long long)f->data_size);
    FUZZ_CHECK((const uint8_t *)t->data == f->data + t->offset, "\"%s\": data pointer", t->name);
    FUZZ_CHECK(ls_st_find(f, t->name) == t, "\"%s\": ls_st_find does not return it", t->name);
    FUZZ_CHECK(ls_st_check_shape(t, t->ndim, t->shape, NULL) == LS_OK, "\"%s\": check_shape of its own shape",
               t->name);
    if (t->ndim < LS_ST_MAX_DIMS) { /* one more dimension: a mismatch, reported naming the file */
        int64_t more[LS_ST_MAX_DIMS];
        memcpy(more, t->shape, sizeof more);
        more[t->ndim] = 1;
        ls_status c = ls_st_check_shape(t, t->ndim + 1, more, "fuzz");
        FUZZ_CHECK(c == LS_ERR_FORMAT, "\"%s\": check_shape with ndim + 1 gave %s", t->name, ls_status_name(c));
        fuzz_check_rejection(c, f->path);
    }

    ls_status s;
    if (!t->supported) {
        s = ls_st_read_f32(t, NULL, t->numel, "fuzz");
        FUZZ_CHECK(s == LS_ERR_UNSUPPORTED, "\"%s\": read of dtype %s gave %s", t->name,
                   ls_st_dtype_name(t->st_dtype), ls_status_name(s));
        fuzz_check_rejection(s, f->path);
        return;
    }
    /* numel <= data bytes / 2 for the supported dtypes: bounded by the input size */
    float *dst = malloc((size_t)(t->numel ? t->numel : 1) * sizeof(float));
    if (!dst) abort();
    s = ls_st_read_f32(t, dst, t->numel, "fuzz");
    FUZZ_CHECK(s == LS_OK, "\"%s\": read_f32 failed: %s", t->name, ls_err_msg());
    s = ls_st_read_f32(t, dst, t->numel + 1, NULL);
    FUZZ_CHECK(s == LS_ERR_FORMAT, "\"%s\": read_f32 with a wrong count gave %s", t->name, ls_status_name(s));
    fuzz_check_rejection(s, f->path);
    free(dst);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    put_input(data, size);
    ls_st_file f;
    ls_status s = ls_st_open(&f, g_path);
    if (s != LS_OK) {
        fuzz_check_rejection(s, g_path);
        FUZZ_CHECK(f.map == NULL && f.tensors == NULL && f.n_tensors == 0, "a failed open left state behind");
        ls_st_close(&f); /* documented as safe on a zeroed file */
        return 0;
    }
    FUZZ_CHECK(f.header_len >= 0 && (size_t)f.header_len + 8 + (size_t)f.data_size == size,
               "header %lld + data %lld != %zu", (long long)f.header_len, (long long)f.data_size, size);
    const ls_st_tensor *prev = NULL;
    for (int64_t i = 0; i < ls_st_count(&f); i++) {
        const ls_st_tensor *t = ls_st_at(&f, i);
        if (prev) FUZZ_CHECK(strcmp(prev->name, t->name) < 0, "names not sorted/unique at %lld", (long long)i);
        check_tensor(&f, t);
        prev = t;
    }
    /* no two non-empty tensors share a byte (quadratic, but headers here are small) */
    for (int64_t i = 0; i < f.n_tensors; i++)
        for (int64_t j = i + 1; j < f.n_tensors && f.n_tensors <= 512; j++) {
            const ls_st_tensor *a = &f.tensors[i], *b = &f.tensors[j];
            if (a->nbytes == 0 || b->nbytes == 0) continue;
            FUZZ_CHECK(a->offset + a->nbytes <= b->offset || b->offset + b->nbytes <= a->offset,
                       "\"%s\" and \"%s\" overlap", a->name, b->name);
        }
    for (int64_t i = 0; i < f.n_meta; i++) {
        if (i) FUZZ_CHECK(strcmp(f.meta_keys[i - 1], f.meta_keys[i]) < 0, "metadata keys not sorted/unique");
        FUZZ_CHECK(ls_st_meta_get(&f, f.meta_keys[i]) == f.meta_values[i], "meta_get(\"%s\")", f.meta_keys[i]);
    }
    const ls_st_tensor *nt = ls_st_find(&f, "no such tensor");
    FUZZ_CHECK(!nt || strcmp(nt->name, "no such tensor") == 0, "ls_st_find returned \"%s\"", nt->name);
    ls_st_close(&f);
    ls_st_close(&f); /* documented as safe on a closed file */
    return 0;
}
