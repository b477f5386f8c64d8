/*
 * test_safetensors.c — safetensors writer/reader round trip (every float dtype, a
 * 0-d scalar, an empty tensor, metadata, a foreign dtype, unaligned foreign files,
 * atomic replace), rejection of corrupt files crafted byte by byte (status and a
 * message naming the file, the tensor and the value), and sharded model directories.
 */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "longstraw/safetensors.h"
#include "testutil.h"

int test_safetensors_roundtrip(void);
int test_safetensors_reject(void);
int test_safetensors_sharded(void);

/* ---- helpers ---------------------------------------------------------------- */

/* Remove the regular files and empty subdirectories of dir, then dir itself. */
static void rm_flat(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[4096];
        while ((e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            if (unlink(p) != 0) rmdir(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static int write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = n ? fwrite(p, 1, n, f) : 0;
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

/* A safetensors file from its parts: u64 LE `hlen` (normally strlen(header)),
 * the header text, then `data_len` bytes of data (byte i = i). */
static int craft(const char *path, uint64_t hlen, const char *header, size_t data_len) {
    size_t h = strlen(header), n = 8 + h + data_len;
    uint8_t *buf = malloc(n);
    if (!buf) return -1;
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(buf + 8, header, h);
    for (size_t i = 0; i < data_len; i++) buf[8 + h + i] = (uint8_t)i;
    int rc = write_bytes(path, buf, n);
    free(buf);
    return rc;
}

static int bits_equal(const float *a, const float *b, int64_t n) {
    return n > 0 && memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

/* ---- round trip ---------------------------------------------------------------- */

static int roundtrip_body(const char *dir) {
    char path[600], p2[600];
    snprintf(path, sizeof path, "%s/ck.safetensors", dir);

    /* sources; bf16/f16 values chosen exactly representable */
    enum { NF32 = 15, NBF = 24, NF16 = 9, NF64 = 4 };
    float f32[NF32], bf[NBF], f16[NF16], f64[NF64], scalar = 42.5f;
    ls_rng r;
    ls_rng_seed(&r, 11);
    t_fill_normal(f32, NF32, &r, 1.0f);
    for (int i = 0; i < NBF; i++) bf[i] = -3.0f + 0.25f * (float)i;
    const float h16[NF16] = {
        0.0f,     1.0f,     -2.0f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f, 0.333251953125f,
        -1000.5f, 3.140625f};
    memcpy(f16, h16, sizeof f16);
    t_fill_normal(f64, NF64, &r, 3.0f);
    const int8_t i8[5] = {-128, -1, 0, 1, 127};

    const int64_t s_f32[2] = {3, 5}, s_bf[3] = {4, 3, 2}, s_f16[1] = {NF16}, s_f64[2] = {2, 2};
    const int64_t s_empty[2] = {0, 4}, s_i8[1] = {5};
    ls_st_writer w, w2;
    ls_st_writer_init(&w);
    T_OK(ls_st_writer_add_f32(&w, "model.w_f32", LS_DTYPE_F32, 2, s_f32, f32));
    T_OK(ls_st_writer_add_f32(&w, "model.w_bf16", LS_DTYPE_BF16, 3, s_bf, bf));
    T_OK(ls_st_writer_add_f32(&w, "model.w_f16", LS_DTYPE_F16, 1, s_f16, f16));
    T_OK(ls_st_writer_add_f32(&w, "model.w_f64", LS_DTYPE_F64, 2, s_f64, f64));
    T_OK(ls_st_writer_add_f32(&w, "scalar", LS_DTYPE_F32, 0, NULL, &scalar));
    T_OK(ls_st_writer_add_f32(&w, "empty", LS_DTYPE_BF16, 2, s_empty, NULL));
    T_OK(ls_st_writer_add_raw(&w, "ids.i8", LS_ST_I8, 1, s_i8, i8, sizeof i8));
    T_OK(ls_st_writer_add_meta(&w, "format", "pt"));
    T_OK(ls_st_writer_add_meta(&w, "note", "h\xc3\xa9llo \"quoted\"\n"));
    T_CHECK(ls_st_writer_add_meta(&w, "format", "np") == LS_ERR_ARG, "repeated metadata key accepted");
    T_CHECK(ls_st_writer_add_raw(&w, "bad", LS_ST_I8, 1, s_i8, i8, 4) == LS_ERR_ARG,
            "raw size mismatch accepted");
    T_CHECK(w.n == 7, "a rejected add must not leave an entry (n = %lld)", (long long)w.n);
    T_OK(ls_st_write(&w, path));
    T_CHECK(count_entries(dir) == 1, "temp file left behind (%d entries)", count_entries(dir));

    ls_st_file f;
    T_OK(ls_st_open(&f, path));
    T_CHECK(ls_st_count(&f) == 7, "count %lld", (long long)ls_st_count(&f));
    T_CHECK(f.header_len % 8 == 0, "header length %lld not padded to 8", (long long)f.header_len);
    /* data is contiguous and each tensor aligned to its element size */
    int64_t total = 0;
    for (int64_t i = 0; i < ls_st_count(&f); i++) {
        const ls_st_tensor *t = ls_st_at(&f, i);
        if (i > 0) T_CHECK(strcmp(ls_st_at(&f, i - 1)->name, t->name) < 0, "iteration not in name order");
        total += t->nbytes;
        int es = ls_st_dtype_bits(t->st_dtype) / 8;
        T_CHECK((uintptr_t)t->data % (uintptr_t)es == 0, "%s: data not aligned to %d", t->name, es);
    }
    T_CHECK(8 + f.header_len + total == (int64_t)f.map_size, "file size %zu != 8 + %lld + %lld", f.map_size,
            (long long)f.header_len, (long long)total);
    T_CHECK(ls_st_meta_get(&f, "format") && !strcmp(ls_st_meta_get(&f, "format"), "pt"), "metadata format");
    T_CHECK(ls_st_meta_get(&f, "note") && !strcmp(ls_st_meta_get(&f, "note"), "h\xc3\xa9llo \"quoted\"\n"),
            "metadata note");
    T_CHECK(ls_st_meta_get(&f, "absent") == NULL, "absent metadata key");
    T_CHECK(ls_st_find(&f, "absent") == NULL, "absent tensor");

    const struct {
        const char *name;
        ls_st_dtype dt;
        int ndim;
        const int64_t *shape;
        const float *src;
        int64_t n;
    } want[] = {
        {"model.w_f32", LS_ST_F32, 2, s_f32, f32, NF32}, {"model.w_bf16", LS_ST_BF16, 3, s_bf, bf, NBF},
        {"model.w_f16", LS_ST_F16, 1, s_f16, f16, NF16}, {"model.w_f64", LS_ST_F64, 2, s_f64, f64, NF64},
        {"scalar", LS_ST_F32, 0, NULL, &scalar, 1},
    };
    float got[64];
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        const ls_st_tensor *t = ls_st_find(&f, want[k].name);
        T_CHECK(t != NULL, "missing %s", want[k].name);
        T_CHECK(t->st_dtype == want[k].dt && t->supported, "%s: dtype %s", t->name,
                ls_st_dtype_name(t->st_dtype));
        T_CHECK(t->ndim == want[k].ndim && t->numel == want[k].n, "%s: ndim %d numel %lld", t->name, t->ndim,
                (long long)t->numel);
        T_OK(ls_st_check_shape(t, want[k].ndim, want[k].shape, "roundtrip"));
        for (int64_t i = 0; i < 64; i++) got[i] = NAN;
        T_OK(ls_st_read_f32(t, got, want[k].n, "roundtrip"));
        T_CHECK(bits_equal(got, want[k].src, want[k].n), "%s: values differ after round trip", t->name);
        T_CHECK(t_all_finite_f(got, want[k].n), "%s: non-finite value", t->name);
    }
    const ls_st_tensor *t = ls_st_find(&f, "empty");
    T_CHECK(t && t->numel == 0 && t->nbytes == 0 && t->ndim == 2 && t->shape[0] == 0 && t->shape[1] == 4,
            "empty tensor");
    T_OK(ls_st_read_f32(t, NULL, 0, NULL));
    t = ls_st_find(&f, "ids.i8");
    T_CHECK(t && t->st_dtype == LS_ST_I8 && !t->supported && t->nbytes == 5, "I8 tensor");
    T_CHECK(memcmp(t->data, i8, sizeof i8) == 0, "I8 bytes");
    T_CHECK(ls_st_read_f32(t, got, 5, "ctx") == LS_ERR_UNSUPPORTED, "I8 read as float not refused");
    T_CHECK(strstr(ls_err_msg(), "ids.i8") && strstr(ls_err_msg(), "I8") && strstr(ls_err_msg(), path),
            "message: %s", ls_err_msg());
    t = ls_st_find(&f, "model.w_f32");
    T_CHECK(ls_st_read_f32(t, got, 14, "layer 3 q_proj") == LS_ERR_FORMAT, "numel mismatch not refused");
    T_CHECK(strstr(ls_err_msg(), "layer 3 q_proj") && strstr(ls_err_msg(), "model.w_f32") &&
                strstr(ls_err_msg(), "14") && strstr(ls_err_msg(), path),
            "message: %s", ls_err_msg());
    const int64_t wrong[2] = {5, 3};
    T_CHECK(ls_st_check_shape(t, 2, wrong, NULL) == LS_ERR_FORMAT && strstr(ls_err_msg(), "[3, 5]") &&
                strstr(ls_err_msg(), "[5, 3]"),
            "shape mismatch: %s", ls_err_msg());
    ls_st_close(&f);
    ls_st_close(&f); /* idempotent */

    /* A tensor large enough for the chunked parallel conversion, odd length. */
    enum { NBIG = 300001 };
    float *big = malloc(NBIG * sizeof *big), *back = malloc(NBIG * sizeof *back);
    T_CHECK(big && back, "malloc");
    for (int i = 0; i < NBIG; i++) big[i] = (float)(i % 251) - 125.0f; /* exact in bf16 */
    const int64_t s_big[1] = {NBIG};
    ls_st_writer_init(&w2);
    T_OK(ls_st_writer_add_f32(&w2, "big", LS_DTYPE_BF16, 1, s_big, big));
    T_OK(ls_st_write(&w2, path));
    ls_st_writer_free(&w2);
    T_OK(ls_st_open(&f, path));
    T_OK(ls_st_read_f32(ls_st_find(&f, "big"), back, NBIG, NULL));
    T_CHECK(bits_equal(back, big, NBIG), "big bf16 tensor values");
    ls_st_close(&f);
    free(big);
    free(back);

    /* Atomic replace: a second write over the same path; the old content is gone. */
    ls_st_writer_init(&w2);
    T_OK(ls_st_writer_add_f32(&w2, "only", LS_DTYPE_F32, 0, NULL, &scalar));
    T_OK(ls_st_write(&w2, path));
    T_OK(ls_st_open(&f, path));
    T_CHECK(ls_st_count(&f) == 1 && ls_st_find(&f, "only") && f.n_meta == 0, "replaced file content");
    ls_st_close(&f);
    T_CHECK(count_entries(dir) == 1, "temp file left behind after replace");

    /* A refused write (over a directory: only regular files are replaced) leaves no
     * temp file; duplicate names are refused before anything is created. */
    snprintf(p2, sizeof p2, "%s/isdir", dir);
    T_CHECK(mkdir(p2, 0755) == 0, "mkdir");
    T_CHECK(ls_st_write(&w2, p2) == LS_ERR_ARG, "write over a directory was not refused");
    T_CHECK(strstr(ls_err_msg(), p2), "message: %s", ls_err_msg());
    T_CHECK(count_entries(dir) == 2, "temp file left after a failed write (%d entries)", count_entries(dir));
    T_OK(ls_st_writer_add_f32(&w2, "only", LS_DTYPE_F32, 0, NULL, &scalar));
    snprintf(p2, sizeof p2, "%s/dup.safetensors", dir);
    T_CHECK(ls_st_write(&w2, p2) == LS_ERR_ARG && strstr(ls_err_msg(), "\"only\""), "duplicate: %s",
            ls_err_msg());
    T_CHECK(count_entries(dir) == 2, "file created by a refused write");
    ls_st_writer_free(&w2);
    ls_st_writer_free(&w);

    /* Foreign files whose header length is not a multiple of 8: unaligned data is
     * still read correctly (through a bounce buffer). */
    const float fv[3] = {1.5f, -2.25f, 1e-3f};
    uint8_t raw[64];
    const char *hdr = "{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}";
    size_t hl = strlen(hdr);
    T_CHECK(hl % 4 != 0, "test header should be unaligned (%zu)", hl);
    for (int i = 0; i < 8; i++) raw[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    snprintf(p2, sizeof p2, "%s/foreign.safetensors", dir);
    {
        FILE *fp = fopen(p2, "wb");
        T_CHECK(fp, "fopen");
        fwrite(raw, 1, 8, fp);
        fwrite(hdr, 1, hl, fp);
        fwrite(fv, 1, sizeof fv, fp);
        T_CHECK(fclose(fp) == 0, "fclose");
    }
    T_OK(ls_st_open(&f, p2));
    t = ls_st_find(&f, "x");
    T_CHECK(t && (uintptr_t)t->data % 4 != 0, "expected unaligned data");
    T_OK(ls_st_read_f32(t, got, 3, NULL));
    T_CHECK(bits_equal(got, fv, 3), "unaligned F32 values");
    ls_st_close(&f);
    unlink(p2);

    return 0;
}

int test_safetensors_roundtrip(void) {
    char dir[512];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "mkdtemp");
    int rc = roundtrip_body(dir);
    rm_flat(dir); /* also after a failure */
    return rc;
}

/* ---- rejection -------------------------------------------------------------- */

typedef struct {
    const char *what;
    const char *header; /* NULL: use `bytes` as the whole file */
    int64_t hlen;       /* -1: strlen(header) */
    size_t data_len;
    const char *bytes;
    size_t nbytes;
    ls_status want;
    const char *tensor; /* must appear quoted in the message, or NULL */
    const char *value;  /* must appear in the message, or NULL */
} reject_case;

#define ENTRY(name, dt, shape, offs)                                                                         \
    "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":" offs "}"

static const reject_case rejects[] = {
    {"truncated file", NULL, 0, 0, "\x10\x00\x00\x00\x00", 5, LS_ERR_FORMAT, NULL, "5 bytes"},
    {"empty file", NULL, 0, 0, "", 0, LS_ERR_FORMAT, NULL, "0 bytes"},
    {"header length past end", "{}", 1000, 4, NULL, 0, LS_ERR_FORMAT, NULL, "1000"},
    {"absurd header length", "{}", (int64_t)1 << 40, 0, NULL, 0, LS_ERR_FORMAT, NULL, "1099511627776"},
    {"header not JSON", "{\"a\": nope}", -1, 0, NULL, 0, LS_ERR_FORMAT, NULL, "JSON"},
    {"header JSON array", "[1, 2]", -1, 0, NULL, 0, LS_ERR_FORMAT, NULL, "object"},
    {"trailing bytes after JSON", "{} x", -1, 0, NULL, 0, LS_ERR_FORMAT, NULL, "trailing"},
    {"invalid UTF-8", "{\"a\xff\":1}", -1, 0, NULL, 0, LS_ERR_FORMAT, NULL, "UTF-8"},
    {"entry not an object", "{\"blk.0.w\": 3}", -1, 0, NULL, 0, LS_ERR_FORMAT, "blk.0.w", "object"},
    {"missing data_offsets", "{\"blk.1.w\":{\"dtype\":\"F32\",\"shape\":[2]}}", -1, 8, NULL, 0, LS_ERR_FORMAT,
     "blk.1.w", "data_offsets"},
    {"missing dtype", "{\"blk.1.w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", -1, 8, NULL, 0, LS_ERR_FORMAT,
     "blk.1.w", "dtype"},
    {"missing shape", "{\"blk.1.w\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", -1, 8, NULL, 0,
     LS_ERR_FORMAT, "blk.1.w", "shape"},
    {"dtype not a string", "{\"blk.2.w\":{\"dtype\":5,\"shape\":[2],\"data_offsets\":[0,8]}}", -1, 8, NULL, 0,
     LS_ERR_FORMAT, "blk.2.w", "dtype"},
    {"shape not an array", "{" ENTRY("blk.2.s", "F32", "2", "[0,8]") "}", -1, 8, NULL, 0, LS_ERR_FORMAT,
     "blk.2.s", "shape"},
    {"unknown dtype", "{" ENTRY("blk.3.w", "F33", "[2]", "[0,8]") "}", -1, 8, NULL, 0, LS_ERR_FORMAT,
     "blk.3.w", "F33"},
    {"negative dim", "{" ENTRY("blk.4.w", "F32", "[3,-2]", "[0,8]") "}", -1, 8, NULL, 0, LS_ERR_FORMAT,
     "blk.4.w", "-2"},
    {"fractional dim", "{" ENTRY("blk.4.f", "F32", "[2.5]", "[0,8]") "}", -1, 8, NULL, 0, LS_ERR_FORMAT,
     "blk.4.f", "2.5"},
    {"string dim", "{" ENTRY("blk.4.s", "F32", "[\"2\"]", "[0,8]") "}", -1, 8, NULL, 0, LS_ERR_FORMAT,
     "blk.4.s", "shape[0]"},
    {"shape product overflow", "{" ENTRY("blk.5.w", "F32", "[4294967296,4294967296]", "[0,8]") "}", -1, 8,
     NULL, 0, LS_ERR_FORMAT, "blk.5.w", "overflow"},
    {"byte size overflow", "{" ENTRY("blk.5.b", "F64", "[1073741824,1073741824,2]", "[0,8]") "}", -1, 8, NULL,
     0, LS_ERR_FORMAT, "blk.5.b", "overflow"},
    {"too many dims", "{" ENTRY("blk.5.d", "F32", "[1,1,1,1,1,1,1,1,1]", "[0,4]") "}", -1, 4, NULL, 0,
     LS_ERR_UNSUPPORTED, "blk.5.d", "9"},
    {"offsets past end", "{" ENTRY("blk.6.w", "F32", "[200]", "[0,800]") "}", -1, 8, NULL, 0, LS_ERR_FORMAT,
     "blk.6.w", "800"},
    {"offsets begin > end", "{" ENTRY("blk.6.r", "F32", "[2]", "[8,0]") "}", -1, 8, NULL, 0, LS_ERR_FORMAT,
     "blk.6.r", "[8, 0]"},
    {"offsets one number", "{" ENTRY("blk.6.o", "F32", "[2]", "[8]") "}", -1, 8, NULL, 0, LS_ERR_FORMAT,
     "blk.6.o", "data_offsets"},
    {"negative offset", "{" ENTRY("blk.6.n", "F32", "[2]", "[-8,0]") "}", -1, 8, NULL, 0, LS_ERR_FORMAT,
     "blk.6.n", "-8"},
    {"size/shape mismatch", "{" ENTRY("blk.7.w", "F32", "[3]", "[0,8]") "}", -1, 16, NULL, 0, LS_ERR_FORMAT,
     "blk.7.w", "12"},
    {"overlap", "{" ENTRY("blk.8.a", "F32", "[2]", "[0,8]") "," ENTRY("blk.8.b", "F32", "[2]", "[4,12]") "}",
     -1, 12, NULL, 0, LS_ERR_FORMAT, "blk.8.b", "blk.8.a"},
    {"duplicate tensor",
     "{" ENTRY("blk.9.w", "F32", "[1]", "[0,4]") "," ENTRY("blk.9.w", "F32", "[1]", "[4,8]") "}", -1, 8, NULL,
     0, LS_ERR_FORMAT, "blk.9.w", "twice"},
    {"metadata value not a string", "{\"__metadata__\":{\"step\":5}}", -1, 0, NULL, 0, LS_ERR_FORMAT, NULL,
     "step"},
    {"metadata not an object", "{\"__metadata__\":[1]}", -1, 0, NULL, 0, LS_ERR_FORMAT, NULL, "__metadata__"},
};

static int reject_body(const char *dir) {
    char path[600];
    int n = 0;
    for (size_t k = 0; k < sizeof rejects / sizeof rejects[0]; k++) {
        const reject_case *c = &rejects[k];
        snprintf(path, sizeof path, "%s/case%02zu.safetensors", dir, k);
        if (c->header) {
            uint64_t hlen = c->hlen < 0 ? strlen(c->header) : (uint64_t)c->hlen;
            T_CHECK(craft(path, hlen, c->header, c->data_len) == 0, "craft %s", c->what);
        } else {
            T_CHECK(write_bytes(path, c->bytes, c->nbytes) == 0, "write %s", c->what);
        }
        ls_st_file f;
        memset(&f, 0xab, sizeof f);
        ls_status s = ls_st_open(&f, path);
        const char *msg = ls_err_msg();
        T_CHECK(s == c->want, "%s: status %s, expected %s (%s)", c->what, ls_status_name(s),
                ls_status_name(c->want), s == LS_OK ? "opened" : msg);
        T_CHECK(f.map == NULL && f.tensors == NULL && f.n_tensors == 0, "%s: struct not zeroed on failure",
                c->what);
        T_CHECK(strstr(msg, path), "%s: message does not name the file: %s", c->what, msg);
        if (c->tensor) {
            char q[128];
            snprintf(q, sizeof q, "\"%s\"", c->tensor);
            T_CHECK(strstr(msg, q), "%s: message does not name tensor %s: %s", c->what, q, msg);
        }
        if (c->value) T_CHECK(strstr(msg, c->value), "%s: message lacks \"%s\": %s", c->what, c->value, msg);
        ls_st_close(&f);
        unlink(path);
        n++;
    }
    T_CHECK(n == (int)(sizeof rejects / sizeof rejects[0]) && n > 0, "cases run: %d", n);

    /* A file that is valid except for a foreign dtype still opens. */
    snprintf(path, sizeof path, "%s/foreign.safetensors", dir);
    T_CHECK(craft(path,
                  strlen("{" ENTRY("q", "F8_E4M3", "[3]", "[0,3]") "," ENTRY("b", "BOOL", "[]", "[3,4]") "}"),
                  "{" ENTRY("q", "F8_E4M3", "[3]", "[0,3]") "," ENTRY("b", "BOOL", "[]", "[3,4]") "}",
                  4) == 0,
            "craft");
    ls_st_file f;
    T_OK(ls_st_open(&f, path));
    T_CHECK(ls_st_count(&f) == 2 && ls_st_find(&f, "q")->st_dtype == LS_ST_F8_E4M3 &&
                ls_st_find(&f, "b")->ndim == 0,
            "foreign dtypes");
    float x[3];
    T_CHECK(ls_st_read_f32(ls_st_find(&f, "q"), x, 3, NULL) == LS_ERR_UNSUPPORTED, "F8 read as float");
    ls_st_close(&f);
    unlink(path);

    /* A file of ours cut short by a crash of a non-atomic copy: the last tensor's
     * end is past the data. */
    snprintf(path, sizeof path, "%s/cut.safetensors", dir);
    const float four[4] = {1, 2, 3, 4};
    const int64_t s4[1] = {4};
    ls_st_writer w;
    ls_st_writer_init(&w);
    T_OK(ls_st_writer_add_f32(&w, "tail.w", LS_DTYPE_F32, 1, s4, four));
    T_OK(ls_st_write(&w, path));
    ls_st_writer_free(&w);
    struct stat st;
    T_CHECK(stat(path, &st) == 0 && truncate(path, st.st_size - 3) == 0, "truncate");
    T_CHECK(ls_st_open(&f, path) == LS_ERR_FORMAT && strstr(ls_err_msg(), path) &&
                strstr(ls_err_msg(), "\"tail.w\"") && strstr(ls_err_msg(), "past the end"),
            "cut file: %s", ls_err_msg());
    unlink(path);

    /* I/O errors: a missing file, a directory */
    snprintf(path, sizeof path, "%s/absent.safetensors", dir);
    T_CHECK(ls_st_open(&f, path) == LS_ERR_IO && strstr(ls_err_msg(), path), "absent: %s", ls_err_msg());
    /* a directory (or FIFO, device) is refused before it is opened: a bad argument */
    T_CHECK(ls_st_open(&f, dir) == LS_ERR_ARG && strstr(ls_err_msg(), dir) && strstr(ls_err_msg(), "directory"),
            "directory: %s", ls_err_msg());

    return 0;
}

int test_safetensors_reject(void) {
    char dir[512];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "mkdtemp");
    int rc = reject_body(dir);
    rm_flat(dir); /* also after a failure */
    return rc;
}

/* ---- sharded model directories ------------------------------------------------ */

static int write_text(const char *dir, const char *name, const char *text) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return write_bytes(p, text, strlen(text));
}

#define SHARD1 "model-00001-of-00002.safetensors"
#define SHARD2 "model-00002-of-00002.safetensors"

/* Two shards: a (F32 [2,3]), b (BF16 [4]) | c (F16 [3]), d (F32 scalar). */
static int write_shards(const char *dir, const float *a, const float *b, const float *c, const float *d) {
    char p[700];
    const int64_t sa[2] = {2, 3}, sb[1] = {4}, sc[1] = {3};
    ls_st_writer w;
    ls_st_writer_init(&w);
    T_OK(ls_st_writer_add_f32(&w, "a", LS_DTYPE_F32, 2, sa, a));
    T_OK(ls_st_writer_add_f32(&w, "b", LS_DTYPE_BF16, 1, sb, b));
    snprintf(p, sizeof p, "%s/%s", dir, SHARD1);
    T_OK(ls_st_write(&w, p));
    ls_st_writer_free(&w);
    ls_st_writer_init(&w);
    T_OK(ls_st_writer_add_f32(&w, "c", LS_DTYPE_F16, 1, sc, c));
    T_OK(ls_st_writer_add_f32(&w, "d", LS_DTYPE_F32, 0, NULL, d));
    snprintf(p, sizeof p, "%s/%s", dir, SHARD2);
    T_OK(ls_st_write(&w, p));
    ls_st_writer_free(&w);
    return 0;
}

static int expect_bad_model(const char *dir, ls_status want, const char *s1, const char *s2) {
    ls_st_model m;
    ls_status s = ls_st_model_open(&m, dir);
    T_CHECK(s == want, "status %s, expected %s: %s", ls_status_name(s), ls_status_name(want),
            s == LS_OK ? "opened" : ls_err_msg());
    T_CHECK(m.files == NULL && m.n_tensors == 0, "model struct not zeroed on failure");
    T_CHECK(strstr(ls_err_msg(), dir), "message does not name the directory: %s", ls_err_msg());
    if (s1) T_CHECK(strstr(ls_err_msg(), s1), "message lacks %s: %s", s1, ls_err_msg());
    if (s2) T_CHECK(strstr(ls_err_msg(), s2), "message lacks %s: %s", s2, ls_err_msg());
    return 0;
}

static int sharded_body(const char *dir) {
    char p[700];
    const float a[6] = {1, 2, 3, 4, 5, 6}, b[4] = {0.5f, -0.25f, 8.0f, -1.0f},
                c[3] = {0.125f, 2048.0f, -3.5f};
    const float d = 7.75f;
    if (write_shards(dir, a, b, c, &d)) return 1;

    /* neither file yet */
    if (expect_bad_model(dir, LS_ERR_IO, "neither", NULL)) return 1;

    T_CHECK(write_text(dir, LS_ST_INDEX_NAME,
                       "{\"metadata\": {\"total_size\": 46},\n \"weight_map\": {\"a\": \"" SHARD1
                       "\", \"b\": \"" SHARD1 "\", \"c\": \"" SHARD2 "\", \"d\": \"" SHARD2 "\"}}") == 0,
            "write index");
    ls_st_model m;
    T_OK(ls_st_model_open(&m, dir));
    T_CHECK(m.n_files == 2 && ls_st_model_count(&m) == 4, "files %lld tensors %lld", (long long)m.n_files,
            (long long)ls_st_model_count(&m));
    const struct {
        const char *name, *shard;
        const float *v;
        int64_t n;
    } want[] = {{"a", SHARD1, a, 6}, {"b", SHARD1, b, 4}, {"c", SHARD2, c, 3}, {"d", SHARD2, &d, 1}};
    float got[8];
    for (size_t k = 0; k < 4; k++) {
        const ls_st_tensor *t = ls_st_model_find(&m, want[k].name);
        T_CHECK(t, "missing %s", want[k].name);
        T_CHECK(strstr(t->file, want[k].shard), "%s in %s, expected %s", t->name, t->file, want[k].shard);
        T_OK(ls_st_read_f32(t, got, want[k].n, "sharded"));
        T_CHECK(bits_equal(got, want[k].v, want[k].n), "%s values", t->name);
        T_CHECK(ls_st_model_at(&m, (int64_t)k) == t, "model iteration order");
    }
    T_CHECK(ls_st_model_find(&m, "e") == NULL && ls_st_model_find(&m, "") == NULL, "absent tensor found");
    ls_st_model_close(&m);
    ls_st_model_close(&m);

    /* a single file path opens as a one-file model */
    snprintf(p, sizeof p, "%s/%s", dir, SHARD2);
    T_OK(ls_st_model_open(&m, p));
    T_CHECK(m.n_files == 1 && ls_st_model_count(&m) == 2 && ls_st_model_find(&m, "c"), "single-file model");
    ls_st_model_close(&m);

    /* bad indexes */
    T_CHECK(write_text(dir, LS_ST_INDEX_NAME,
                       "{\"weight_map\": {\"a\": \"" SHARD1 "\", \"zz.missing\": \"" SHARD2 "\"}}") == 0,
            "index");
    if (expect_bad_model(dir, LS_ERR_FORMAT, "\"zz.missing\"", SHARD2)) return 1;
    T_CHECK(write_text(dir, LS_ST_INDEX_NAME,
                       "{\"weight_map\": {\"a\": \"" SHARD1 "\", \"c\": \"../" SHARD2 "\"}}") == 0,
            "index");
    if (expect_bad_model(dir, LS_ERR_FORMAT, "\"c\"", "../" SHARD2)) return 1;
    T_CHECK(write_text(dir, LS_ST_INDEX_NAME, "{\"weight_map\": {\"a\": \"sub/" SHARD1 "\"}}") == 0, "index");
    if (expect_bad_model(dir, LS_ERR_FORMAT, "sub/" SHARD1, NULL)) return 1;
    T_CHECK(write_text(dir, LS_ST_INDEX_NAME, "{\"weight_map\": {\"a\": \"gone.safetensors\"}}") == 0,
            "index");
    if (expect_bad_model(dir, LS_ERR_IO, "gone.safetensors", LS_ST_INDEX_NAME)) return 1;
    T_CHECK(write_text(dir, LS_ST_INDEX_NAME, "{\"weight_map\": {\"a\": 3}}") == 0, "index");
    if (expect_bad_model(dir, LS_ERR_FORMAT, "\"a\"", NULL)) return 1;
    T_CHECK(write_text(dir, LS_ST_INDEX_NAME, "{\"metadata\": {}}") == 0, "index");
    if (expect_bad_model(dir, LS_ERR_FORMAT, "weight_map", NULL)) return 1;
    T_CHECK(write_text(dir, LS_ST_INDEX_NAME, "{\"weight_map\": {\"a\": ") == 0, "index");
    if (expect_bad_model(dir, LS_ERR_FORMAT, LS_ST_INDEX_NAME, "JSON")) return 1;
    /* a corrupt shard: the message carries the index and the shard's own problem */
    T_CHECK(write_text(dir, LS_ST_INDEX_NAME, "{\"weight_map\": {\"a\": \"bad.safetensors\"}}") == 0,
            "index");
    snprintf(p, sizeof p, "%s/bad.safetensors", dir);
    T_CHECK(craft(p, 1000, "{}", 0) == 0, "craft");
    if (expect_bad_model(dir, LS_ERR_FORMAT, "bad.safetensors", "1000")) return 1;

    /* model.safetensors with many tensors: it wins over the index; lookups by name */
    enum { NT = 5000 };
    float *vals = malloc(NT * sizeof *vals);
    T_CHECK(vals, "malloc");
    ls_st_writer w;
    ls_st_writer_init(&w);
    char name[64];
    for (int i = 0; i < NT; i++) {
        vals[i] = (float)i;
        snprintf(name, sizeof name, "model.layers.%d.weight", (i * 7919) % NT);
        T_OK(ls_st_writer_add_f32(&w, name, LS_DTYPE_F32, 0, NULL, &vals[(i * 7919) % NT]));
    }
    snprintf(p, sizeof p, "%s/%s", dir, LS_ST_SINGLE_NAME);
    T_OK(ls_st_write(&w, p));
    ls_st_writer_free(&w);
    T_OK(ls_st_model_open(&m, dir));
    T_CHECK(m.n_files == 1 && ls_st_model_count(&m) == NT, "single model: %lld tensors",
            (long long)ls_st_model_count(&m));
    int found = 0;
    for (int i = 0; i < NT; i++) {
        snprintf(name, sizeof name, "model.layers.%d.weight", i);
        const ls_st_tensor *t = ls_st_model_find(&m, name);
        T_CHECK(t, "missing %s", name);
        float v = NAN;
        T_OK(ls_st_read_f32(t, &v, 1, NULL));
        T_CHECK(v == (float)i, "%s = %g", name, v);
        found++;
    }
    T_CHECK(found == NT, "found %d", found);
    ls_st_model_close(&m);
    free(vals);

    return 0;
}

int test_safetensors_sharded(void) {
    char dir[512];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "mkdtemp");
    int rc = sharded_body(dir);
    rm_flat(dir); /* also after a failure */
    return rc;
}
