/*
 * safetensors.c — safetensors reader (mmap + full header validation), sharded
 * model directories (model.safetensors.index.json) and an atomic writer.
 * Format: include/longstraw/safetensors.h. Every length, offset, shape and dtype
 * in a header is checked before a tensor is handed out; messages name the file,
 * the tensor and the offending value. Header metadata lives in malloc'd memory
 * (load time only); tensor data stays in the read-only mapping.
 */
#include "longstraw/safetensors.h"
#include "longstraw/files.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader assumes a little-endian host"
#endif

/* Largest integer a JSON number (an IEEE double in cJSON) holds exactly. */
#define ST_MAX_JSON_INT 9007199254740992.0

/* ---- dtypes ------------------------------------------------------------- */
static const struct {
    const char *name;
    int bits;
} st_dtypes[LS_ST_DTYPE_COUNT] = {
    [LS_ST_F32] = {"F32", 32},        [LS_ST_BF16] = {"BF16", 16},      [LS_ST_F16] = {"F16", 16},
    [LS_ST_F64] = {"F64", 64},        [LS_ST_BOOL] = {"BOOL", 8},       [LS_ST_U8] = {"U8", 8},
    [LS_ST_I8] = {"I8", 8},           [LS_ST_I16] = {"I16", 16},        [LS_ST_U16] = {"U16", 16},
    [LS_ST_I32] = {"I32", 32},        [LS_ST_U32] = {"U32", 32},        [LS_ST_I64] = {"I64", 64},
    [LS_ST_U64] = {"U64", 64},        [LS_ST_F8_E5M2] = {"F8_E5M2", 8}, [LS_ST_F8_E4M3] = {"F8_E4M3", 8},
    [LS_ST_F8_E8M0] = {"F8_E8M0", 8}, [LS_ST_F6_E2M3] = {"F6_E2M3", 6}, [LS_ST_F6_E3M2] = {"F6_E3M2", 6},
    [LS_ST_F4] = {"F4", 4},           [LS_ST_C64] = {"C64", 64},
};

const char *ls_st_dtype_name(ls_st_dtype t) {
    return (unsigned)t < LS_ST_DTYPE_COUNT ? st_dtypes[t].name : "?";
}

int ls_st_dtype_bits(ls_st_dtype t) { return (unsigned)t < LS_ST_DTYPE_COUNT ? st_dtypes[t].bits : 0; }

int ls_st_dtype_parse(const char *s, ls_st_dtype *out) {
    for (int i = 0; i < LS_ST_DTYPE_COUNT; i++)
        if (strcmp(s, st_dtypes[i].name) == 0) {
            *out = (ls_st_dtype)i;
            return 0;
        }
    return -1;
}

int ls_st_dtype_to_ls(ls_st_dtype t, ls_dtype *out) {
    switch (t) {
    case LS_ST_F32: *out = LS_DTYPE_F32; return 1;
    case LS_ST_BF16: *out = LS_DTYPE_BF16; return 1;
    case LS_ST_F16: *out = LS_DTYPE_F16; return 1;
    case LS_ST_F64: *out = LS_DTYPE_F64; return 1;
    default: return 0;
    }
}

ls_st_dtype ls_st_dtype_from_ls(ls_dtype t) {
    switch (t) {
    case LS_DTYPE_F32: return LS_ST_F32;
    case LS_DTYPE_BF16: return LS_ST_BF16;
    case LS_DTYPE_F16: return LS_ST_F16;
    case LS_DTYPE_F64: return LS_ST_F64;
    }
    LS_ASSERT(0, "bad ls_dtype %d", (int)t);
    return LS_ST_F32;
}

/* ---- small helpers ---------------------------------------------------------- */
static void fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* numel and byte size of a shape; 0 on success, -1 when the element count
 * overflows, -3 when the byte size does, -2 when it is not a whole number of bytes. */
static int shape_size(ls_st_dtype dt, int ndim, const int64_t *shape, int64_t *numel, int64_t *nbytes) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(n, shape[i], &n)) return -1;
    int64_t bits;
    if (__builtin_mul_overflow(n, (int64_t)ls_st_dtype_bits(dt), &bits)) return -3;
    *numel = n;
    *nbytes = bits / 8;
    return (bits % 8) ? -2 : 0;
}

/* Offset of the first byte that is not valid UTF-8 (or is NUL, which JSON text
 * cannot hold unescaped), or -1 when all of s is valid. */
static int64_t utf8_invalid_at(const uint8_t *s, int64_t n) {
    int64_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c == 0) return i;
        if (c < 0x80) {
            i++;
            continue;
        }
        int len;
        uint32_t cp, min;
        if ((c & 0xe0) == 0xc0) {
            len = 2, cp = c & 0x1fu, min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            len = 3, cp = c & 0x0fu, min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            len = 4, cp = c & 0x07u, min = 0x10000;
        } else {
            return i;
        }
        if (n - i < len) return i;
        for (int k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return i;
            cp = (cp << 6) | (s[i + k] & 0x3fu);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
        i += len;
    }
    return -1;
}

/* A JSON number that is a non-negative integer <= 2^53. Returns NULL on success,
 * or what is wrong with it. */
static const char *json_uint(const cJSON *it, int64_t *out) {
    if (!cJSON_IsNumber(it)) return "is not a number";
    double v = it->valuedouble;
    if (!isfinite(v) || v != floor(v)) return "is not an integer";
    if (v < 0) return "is negative";
    if (v > ST_MAX_JSON_INT) return "is too large";
    *out = (int64_t)v;
    return NULL;
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const ls_st_tensor *)a)->name, ((const ls_st_tensor *)b)->name);
}

static int cmp_tensor_ptr_name(const void *a, const void *b) {
    return strcmp((*(const ls_st_tensor *const *)a)->name, (*(const ls_st_tensor *const *)b)->name);
}

static int cmp_tensor_ptr_offset(const void *a, const void *b) {
    const ls_st_tensor *x = *(const ls_st_tensor *const *)a, *y = *(const ls_st_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_key_tensor(const void *key, const void *elem) {
    return strcmp((const char *)key, ((const ls_st_tensor *)elem)->name);
}

static int cmp_key_tensor_ptr(const void *key, const void *elem) {
    return strcmp((const char *)key, (*(const ls_st_tensor *const *)elem)->name);
}

static char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t n = a;
    if (a == 0 || dir[a - 1] != '/') p[n++] = '/';
    memcpy(p + n, name, b + 1);
    return p;
}

/* ---- reader ---------------------------------------------------------------- */

/* One header entry → t. f->data / f->data_size are set. */
static ls_status parse_entry(ls_st_file *f, const cJSON *e, ls_st_tensor *t) {
    const char *P = f->path;
    t->file = f->path;
    t->name = strdup(e->string);
    if (!t->name) return ls_err(LS_ERR_NOMEM, "%s: out of memory for tensor names", P);
    const char *N = t->name;
    if (!cJSON_IsObject(e))
        return ls_err(LS_ERR_FORMAT, "%s: tensor \"%s\": entry is not a JSON object", P, N);

    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!jd) return ls_err(LS_ERR_FORMAT, "%s: tensor \"%s\": missing \"dtype\"", P, N);
    if (!js) return ls_err(LS_ERR_FORMAT, "%s: tensor \"%s\": missing \"shape\"", P, N);
    if (!jo) return ls_err(LS_ERR_FORMAT, "%s: tensor \"%s\": missing \"data_offsets\"", P, N);

    if (!cJSON_IsString(jd))
        return ls_err(LS_ERR_FORMAT, "%s: tensor \"%s\": \"dtype\" is not a string", P, N);
    if (ls_st_dtype_parse(jd->valuestring, &t->st_dtype) != 0)
        return ls_err(LS_ERR_FORMAT, "%s: tensor \"%s\": unknown dtype \"%s\"", P, N, jd->valuestring);
    t->supported = ls_st_dtype_to_ls(t->st_dtype, &t->dtype);

    if (!cJSON_IsArray(js))
        return ls_err(LS_ERR_FORMAT, "%s: tensor \"%s\": \"shape\" is not an array", P, N);
    int nd = cJSON_GetArraySize(js);
    if (nd > LS_ST_MAX_DIMS)
        return ls_err(LS_ERR_UNSUPPORTED, "%s: tensor \"%s\": %d dimensions, at most %d supported", P, N, nd,
                      LS_ST_MAX_DIMS);
    t->ndim = nd;
    int d = 0;
    for (const cJSON *it = js->child; it; it = it->next, d++) {
        const char *why = json_uint(it, &t->shape[d]);
        if (why) {
            if (cJSON_IsNumber(it))
                return ls_err(LS_ERR_FORMAT, "%s: tensor \"%s\": shape[%d] = %.17g %s", P, N, d,
                              it->valuedouble, why);
            return ls_err(LS_ERR_FORMAT, "%s: tensor \"%s\": shape[%d] %s", P, N, d, why);
        }
    }
    char shp[256];
    fmt_shape(shp, sizeof shp, t->ndim, t->shape);
    int rc = shape_size(t->st_dtype, t->ndim, t->shape, &t->numel, &t->nbytes);
    if (rc == -1)
        return ls_err(LS_ERR_FORMAT, "%s: tensor \"%s\": shape %s overflows the element count", P, N, shp);
    if (rc == -3)
        return ls_err(LS_ERR_FORMAT, "%s: tensor \"%s\": shape %s of %s overflows the byte size", P, N, shp,
                      ls_st_dtype_name(t->st_dtype));
    if (rc == -2)
        return ls_err(LS_ERR_FORMAT, "%s: tensor \"%s\": shape %s of %s is not a whole number of bytes", P, N,
                      shp, ls_st_dtype_name(t->st_dtype));

    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2)
        return ls_err(LS_ERR_FORMAT, "%s: tensor \"%s\": \"data_offsets\" is not a [begin, end] array", P, N);
    int64_t off[2];
    for (int i = 0; i < 2; i++) {
        const cJSON *it = cJSON_GetArrayItem(jo, i);
        const char *why = json_uint(it, &off[i]);
        if (why) {
            if (cJSON_IsNumber(it))
                return ls_err(LS_ERR_FORMAT, "%s: tensor \"%s\": data_offsets[%d] = %.17g %s", P, N, i,
                              it->valuedouble, why);
            return ls_err(LS_ERR_FORMAT, "%s: tensor \"%s\": data_offsets[%d] %s", P, N, i, why);
        }
    }
    if (off[0] > off[1])
        return ls_err(LS_ERR_FORMAT, "%s: tensor \"%s\": data_offsets [%lld, %lld] has begin > end", P, N,
                      (long long)off[0], (long long)off[1]);
    if (off[1] > f->data_size)
        return ls_err(LS_ERR_FORMAT,
                      "%s: tensor \"%s\": data_offsets end %lld is past the end of the data buffer "
                      "(%lld bytes)",
                      P, N, (long long)off[1], (long long)f->data_size);
    if (off[1] - off[0] != t->nbytes)
        return ls_err(LS_ERR_FORMAT,
                      "%s: tensor \"%s\": data_offsets [%lld, %lld] span %lld bytes, but dtype %s "
                      "shape %s needs %lld",
                      P, N, (long long)off[0], (long long)off[1], (long long)(off[1] - off[0]),
                      ls_st_dtype_name(t->st_dtype), shp, (long long)t->nbytes);
    t->offset = off[0];
    t->data = f->data + off[0];
    return LS_OK;
}

static ls_status parse_metadata(ls_st_file *f, const cJSON *m) {
    const char *P = f->path;
    if (f->meta_keys) return ls_err(LS_ERR_FORMAT, "%s: \"__metadata__\" appears twice", P);
    if (!cJSON_IsObject(m)) return ls_err(LS_ERR_FORMAT, "%s: \"__metadata__\" is not a JSON object", P);
    int n = cJSON_GetArraySize(m);
    f->meta_keys = calloc((size_t)n + 1, sizeof(char *));
    f->meta_values = calloc((size_t)n + 1, sizeof(char *));
    if (!f->meta_keys || !f->meta_values) return ls_err(LS_ERR_NOMEM, "%s: out of memory", P);
    for (const cJSON *it = m->child; it; it = it->next) {
        if (!cJSON_IsString(it))
            return ls_err(LS_ERR_FORMAT, "%s: \"__metadata__\" value of \"%s\" is not a string", P,
                          it->string);
        int64_t i = f->n_meta;
        f->meta_keys[i] = strdup(it->string);
        f->meta_values[i] = strdup(it->valuestring);
        f->n_meta++;
        if (!f->meta_keys[i] || !f->meta_values[i]) return ls_err(LS_ERR_NOMEM, "%s: out of memory", P);
    }
    /* sort keys (values follow) for ls_st_meta_get; few entries, insertion sort */
    for (int64_t i = 1; i < f->n_meta; i++)
        for (int64_t j = i; j > 0 && strcmp(f->meta_keys[j - 1], f->meta_keys[j]) > 0; j--) {
            char *k = f->meta_keys[j], *v = f->meta_values[j];
            f->meta_keys[j] = f->meta_keys[j - 1], f->meta_values[j] = f->meta_values[j - 1];
            f->meta_keys[j - 1] = k, f->meta_values[j - 1] = v;
        }
    for (int64_t i = 1; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i - 1], f->meta_keys[i]) == 0)
            return ls_err(LS_ERR_FORMAT, "%s: \"__metadata__\" key \"%s\" appears twice", P, f->meta_keys[i]);
    return LS_OK;
}

/* Tensors must not share bytes (empty tensors occupy none). */
static ls_status check_overlap(ls_st_file *f) {
    if (f->n_tensors < 2) return LS_OK;
    const ls_st_tensor **by_off = malloc((size_t)f->n_tensors * sizeof *by_off);
    if (!by_off) return ls_err(LS_ERR_NOMEM, "%s: out of memory", f->path);
    for (int64_t i = 0; i < f->n_tensors; i++) by_off[i] = &f->tensors[i];
    qsort(by_off, (size_t)f->n_tensors, sizeof *by_off, cmp_tensor_ptr_offset);
    const ls_st_tensor *prev = NULL;
    ls_status s = LS_OK;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        const ls_st_tensor *t = by_off[i];
        if (t->nbytes == 0) continue;
        if (prev && t->offset < prev->offset + prev->nbytes) {
            s = ls_err(LS_ERR_FORMAT,
                       "%s: tensor \"%s\": data_offsets [%lld, %lld] overlap tensor \"%s\" [%lld, %lld]",
                       f->path, t->name, (long long)t->offset, (long long)(t->offset + t->nbytes), prev->name,
                       (long long)prev->offset, (long long)(prev->offset + prev->nbytes));
            break;
        }
        prev = t; /* sorted by begin and disjoint so far: prev has the largest end */
    }
    free(by_off);
    return s;
}

static ls_status parse_header(ls_st_file *f) {
    const char *P = f->path;
    const uint8_t *h = f->map + 8;
    int64_t n = f->header_len;
    int64_t bad = utf8_invalid_at(h, n);
    if (bad >= 0)
        return ls_err(LS_ERR_FORMAT,
                      "%s: header is not valid UTF-8 JSON text (byte 0x%02x at header offset %lld)", P,
                      h[bad], (long long)bad);
    /* cJSON needs a NUL-terminated copy; the mapping has none. */
    char *txt = malloc((size_t)n + 1);
    if (!txt) return ls_err(LS_ERR_NOMEM, "%s: cannot allocate %lld bytes for the header", P, (long long)n);
    memcpy(txt, h, (size_t)n);
    txt[n] = 0;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(txt, (size_t)n, &end, 0);
    ls_status s = LS_OK;
    if (!root) {
        long long at = end ? (long long)(end - txt) : -1;
        s = ls_err(LS_ERR_FORMAT, "%s: header is not valid JSON (parse error near header offset %lld)", P,
                   at);
        goto done;
    }
    for (const char *p = end; p < txt + n; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            s = ls_err(LS_ERR_FORMAT,
                       "%s: header has trailing bytes after the JSON object (header offset %lld)", P,
                       (long long)(p - txt));
            goto done;
        }
    if (!cJSON_IsObject(root)) {
        s = ls_err(LS_ERR_FORMAT, "%s: header is not a JSON object", P);
        goto done;
    }
    int64_t count = 0;
    for (const cJSON *e = root->child; e; e = e->next)
        if (strcmp(e->string, "__metadata__") != 0) count++;
    f->tensors = calloc((size_t)count + 1, sizeof *f->tensors);
    if (!f->tensors) {
        s = ls_err(LS_ERR_NOMEM, "%s: out of memory for %lld tensor entries", P, (long long)count);
        goto done;
    }
    for (const cJSON *e = root->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            s = parse_metadata(f, e);
        } else {
            s = parse_entry(f, e, &f->tensors[f->n_tensors]);
            f->n_tensors++; /* counted even on failure so close frees its name */
        }
        if (s != LS_OK) goto done;
    }
    qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, cmp_tensor_name);
    for (int64_t i = 1; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i - 1].name, f->tensors[i].name) == 0) {
            s = ls_err(LS_ERR_FORMAT, "%s: tensor \"%s\" appears twice in the header", P, f->tensors[i].name);
            goto done;
        }
    s = check_overlap(f);
done:
    cJSON_Delete(root);
    free(txt);
    return s;
}

static ls_status st_open(ls_st_file *f, const char *path) {
    f->path = strdup(path);
    if (!f->path) return ls_err(LS_ERR_NOMEM, "%s: out of memory", path);
    int fd;
    LS_TRY(ls_open_input(path, &fd)); /* a FIFO is refused by name, never blocks */
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return ls_err(LS_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return ls_err(LS_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size < 8) {
        close(fd);
        return ls_err(LS_ERR_FORMAT, "%s: file is %lld bytes, shorter than the 8-byte header length", path,
                      (long long)st.st_size);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd); /* the mapping keeps the file */
    if (map == MAP_FAILED) return ls_err(LS_ERR_IO, "%s: mmap failed: %s", path, strerror(e));
    f->map = map;
    f->map_size = (size_t)st.st_size;

    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | f->map[i];
    if (n > (uint64_t)LS_ST_MAX_HEADER)
        return ls_err(LS_ERR_FORMAT, "%s: header length %llu exceeds the %lld-byte limit", path,
                      (unsigned long long)n, (long long)LS_ST_MAX_HEADER);
    if (n > f->map_size - 8)
        return ls_err(LS_ERR_FORMAT, "%s: header length %llu runs past the end of the file (%zu bytes)", path,
                      (unsigned long long)n, f->map_size);
    f->header_len = (int64_t)n;
    f->data = f->map + 8 + n;
    f->data_size = (int64_t)(f->map_size - 8 - n);
    return parse_header(f);
}

ls_status ls_st_open(ls_st_file *f, const char *path) {
    LS_ASSERT(f && path);
    ls_st_file tmp;
    memset(&tmp, 0, sizeof tmp);
    memset(f, 0, sizeof *f);
    ls_status s = st_open(&tmp, path);
    if (s != LS_OK) {
        ls_st_close(&tmp);
        return s;
    }
    *f = tmp; /* tensors point at tmp.path / tmp.map, both heap/mapping: still valid */
    return LS_OK;
}

void ls_st_close(ls_st_file *f) {
    if (!f) return;
    for (int64_t i = 0; i < f->n_tensors; i++) free((char *)f->tensors[i].name);
    free(f->tensors);
    for (int64_t i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->meta_keys);
    free(f->meta_values);
    if (f->map) munmap((void *)f->map, f->map_size);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const ls_st_tensor *ls_st_at(const ls_st_file *f, int64_t i) {
    LS_ASSERT(i >= 0 && i < f->n_tensors, "tensor index %lld of %lld", (long long)i, (long long)f->n_tensors);
    return &f->tensors[i];
}

const ls_st_tensor *ls_st_find(const ls_st_file *f, const char *name) {
    if (f->n_tensors == 0) return NULL;
    return bsearch(name, f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, cmp_key_tensor);
}

const char *ls_st_meta_get(const ls_st_file *f, const char *key) {
    for (int64_t i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

/* Index of the first NaN or ±Inf in x[0..n), or -1. The common all-finite case is
 * one branch-free pass, in parallel for large tensors. */
static int64_t first_non_finite(const float *x, int64_t n) {
    int bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static) if (n > (1 << 20))
    for (int64_t i = 0; i < n; i++) bad |= !(fabsf(x[i]) <= FLT_MAX); /* NaN compares false */
    if (!bad) return -1;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return i;
    return -1;
}

ls_status ls_st_read_weights(const ls_st_tensor *t, float *dst, int64_t numel_expected, const char *ctx) {
    LS_TRY(ls_st_read_f32(t, dst, numel_expected, ctx));
    int64_t bad = first_non_finite(dst, numel_expected);
    if (bad >= 0)
        return ls_err(LS_ERR_FORMAT, "%s: tensor %s holds a non-finite value (%s) at element %lld", t->file, t->name,
                      isnan(dst[bad]) ? "nan" : dst[bad] > 0 ? "inf" : "-inf", (long long)bad);
    return LS_OK;
}

ls_status ls_st_read_f32(const ls_st_tensor *t, float *dst, int64_t numel_expected, const char *ctx) {
    const char *c = ctx ? ctx : "", *sep = ctx ? ": " : "";
    if (!t->supported)
        return ls_err(LS_ERR_UNSUPPORTED,
                      "%s%s%s: tensor \"%s\": dtype %s cannot be read as float (F32, BF16, F16, F64 can)", c,
                      sep, t->file, t->name, ls_st_dtype_name(t->st_dtype));
    if (t->numel != numel_expected) {
        char shp[256];
        fmt_shape(shp, sizeof shp, t->ndim, t->shape);
        return ls_err(LS_ERR_FORMAT, "%s%s%s: tensor \"%s\": has %lld elements (shape %s), expected %lld", c,
                      sep, t->file, t->name, (long long)t->numel, shp, (long long)numel_expected);
    }
    if (t->numel == 0) return LS_OK;
    LS_ASSERT(dst);
    const size_t es = ls_dtype_size(t->dtype);
    const uint8_t *src = t->data;
    const int64_t n = t->numel;
    if ((uintptr_t)src % es == 0) {
        /* Chunks in parallel: the first touch of each mapped page is a page fault,
         * which parallelises too. */
        const int64_t chunk = 1 << 16, nchunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (nchunks > 4)
        for (int64_t k = 0; k < nchunks; k++) {
            int64_t i0 = k * chunk, m = n - i0 < chunk ? n - i0 : chunk;
            ls_convert_to_f32(dst + i0, src + (size_t)i0 * es, t->dtype, (size_t)m);
        }
        return LS_OK;
    }
    /* Unaligned (a foreign writer's header length not a multiple of 8): bounce
     * through an aligned buffer; typed loads from src would be undefined. */
    double bounce[2048];
    const int64_t per = (int64_t)(sizeof bounce / es);
    for (int64_t i0 = 0; i0 < n; i0 += per) {
        int64_t m = n - i0 < per ? n - i0 : per;
        memcpy(bounce, src + (size_t)i0 * es, (size_t)m * es);
        ls_convert_to_f32(dst + i0, bounce, t->dtype, (size_t)m);
    }
    return LS_OK;
}

ls_status ls_st_check_shape(const ls_st_tensor *t, int ndim, const int64_t *shape, const char *ctx) {
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (same) return LS_OK;
    char have[256], want[256];
    fmt_shape(have, sizeof have, t->ndim, t->shape);
    fmt_shape(want, sizeof want, ndim, shape);
    const char *c = ctx ? ctx : "", *sep = ctx ? ": " : "";
    return ls_err(LS_ERR_FORMAT, "%s%s%s: tensor \"%s\": shape %s, expected %s", c, sep, t->file, t->name,
                  have, want);
}

/* ---- model directories ------------------------------------------------------ */

/* Whole small file into a NUL-terminated malloc'd buffer. */
static ls_status read_text_file(const char *path, char **out) {
    FILE *fp;
    LS_TRY(ls_open_input_stream(path, &fp));
    struct stat st;
    if (fstat(fileno(fp), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(fp);
        return ls_err(LS_ERR_IO, "%s: not a readable regular file", path);
    }
    if (st.st_size > (off_t)1 << 30) {
        fclose(fp);
        return ls_err(LS_ERR_FORMAT, "%s: %lld bytes is too large for an index file", path,
                      (long long)st.st_size);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(fp);
        return ls_err(LS_ERR_NOMEM, "%s: cannot allocate %zu bytes", path, n + 1);
    }
    size_t got = fread(buf, 1, n, fp);
    fclose(fp);
    if (got != n) {
        free(buf);
        return ls_err(LS_ERR_IO, "%s: short read (%zu of %zu bytes)", path, got, n);
    }
    buf[n] = 0;
    *out = buf;
    return LS_OK;
}

/* by_name ← every tensor of m->files[0], already sorted. */
static ls_status model_single(ls_st_model *m, const char *file) {
    m->files = calloc(1, sizeof *m->files);
    if (!m->files) return ls_err(LS_ERR_NOMEM, "%s: out of memory", file);
    m->n_files = 1;
    LS_TRY(ls_st_open(&m->files[0], file));
    m->n_tensors = m->files[0].n_tensors;
    m->by_name = malloc(((size_t)m->n_tensors + 1) * sizeof *m->by_name);
    if (!m->by_name) return ls_err(LS_ERR_NOMEM, "%s: out of memory", file);
    for (int64_t i = 0; i < m->n_tensors; i++) m->by_name[i] = &m->files[0].tensors[i];
    return LS_OK;
}

static ls_status model_sharded(ls_st_model *m, const char *index) {
    char *txt = NULL;
    LS_TRY(read_text_file(index, &txt));
    cJSON *root = cJSON_Parse(txt);
    free(txt);
    const char **shards = NULL;
    char *spath = NULL;
    ls_status s = LS_OK;
    if (!root) {
        s = ls_err(LS_ERR_FORMAT, "%s: not valid JSON", index);
        goto done;
    }
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(root) || !cJSON_IsObject(wm)) {
        s = ls_err(LS_ERR_FORMAT, "%s: missing \"weight_map\" object", index);
        goto done;
    }
    int64_t n = cJSON_GetArraySize(wm);
    if (n == 0) {
        s = ls_err(LS_ERR_FORMAT, "%s: \"weight_map\" is empty", index);
        goto done;
    }
    /* distinct shard names, validated so they cannot leave the directory */
    shards = malloc((size_t)n * sizeof *shards);
    if (!shards) {
        s = ls_err(LS_ERR_NOMEM, "%s: out of memory", index);
        goto done;
    }
    int64_t k = 0;
    for (const cJSON *it = wm->child; it; it = it->next) {
        if (!cJSON_IsString(it)) {
            s = ls_err(LS_ERR_FORMAT, "%s: weight_map entry \"%s\" is not a shard filename string", index,
                       it->string);
            goto done;
        }
        const char *sh = it->valuestring;
        if (!sh[0] || strchr(sh, '/') || strstr(sh, "..")) {
            s = ls_err(LS_ERR_FORMAT,
                       "%s: tensor \"%s\" maps to shard \"%s\", which is not a plain filename in the "
                       "model directory",
                       index, it->string, sh);
            goto done;
        }
        shards[k++] = sh;
    }
    qsort(shards, (size_t)n, sizeof *shards, cmp_str_ptr);
    int64_t nf = 0;
    for (int64_t i = 0; i < n; i++)
        if (nf == 0 || strcmp(shards[nf - 1], shards[i]) != 0) shards[nf++] = shards[i];

    m->files = calloc((size_t)nf, sizeof *m->files);
    if (!m->files) {
        s = ls_err(LS_ERR_NOMEM, "%s: out of memory", index);
        goto done;
    }
    m->n_files = nf;
    for (int64_t i = 0; i < nf; i++) {
        spath = path_join(m->dir, shards[i]);
        if (!spath) {
            s = ls_err(LS_ERR_NOMEM, "%s: out of memory", index);
            goto done;
        }
        s = ls_st_open(&m->files[i], spath);
        free(spath);
        spath = NULL;
        if (s != LS_OK) {
            ls_err_ctx(s, "%s: shard \"%s\"", index, shards[i]);
            goto done;
        }
    }

    m->by_name = malloc((size_t)n * sizeof *m->by_name);
    if (!m->by_name) {
        s = ls_err(LS_ERR_NOMEM, "%s: out of memory", index);
        goto done;
    }
    for (const cJSON *it = wm->child; it; it = it->next) {
        const char **sh = bsearch(&it->valuestring, shards, (size_t)nf, sizeof *shards, cmp_str_ptr);
        LS_ASSERT(sh);
        const ls_st_tensor *t = ls_st_find(&m->files[sh - shards], it->string);
        if (!t) {
            s = ls_err(LS_ERR_FORMAT,
                       "%s: weight_map puts tensor \"%s\" in shard \"%s\", which does not hold it", index,
                       it->string, *sh);
            goto done;
        }
        m->by_name[m->n_tensors++] = t;
    }
    qsort(m->by_name, (size_t)m->n_tensors, sizeof *m->by_name, cmp_tensor_ptr_name);
    for (int64_t i = 1; i < m->n_tensors; i++)
        if (strcmp(m->by_name[i - 1]->name, m->by_name[i]->name) == 0) {
            s = ls_err(LS_ERR_FORMAT, "%s: weight_map lists tensor \"%s\" twice", index, m->by_name[i]->name);
            goto done;
        }
done:
    free(shards);
    cJSON_Delete(root);
    return s;
}

static ls_status model_open(ls_st_model *m, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return ls_err(LS_ERR_IO, "%s: cannot access: %s", path, strerror(errno));
    m->dir = strdup(path);
    if (!m->dir) return ls_err(LS_ERR_NOMEM, "%s: out of memory", path);
    if (S_ISREG(st.st_mode)) return model_single(m, path);
    if (!S_ISDIR(st.st_mode)) return ls_err(LS_ERR_IO, "%s: neither a directory nor a file", path);

    char *single = path_join(path, LS_ST_SINGLE_NAME);
    char *index = path_join(path, LS_ST_INDEX_NAME);
    ls_status s;
    if (!single || !index) {
        s = ls_err(LS_ERR_NOMEM, "%s: out of memory", path);
    } else if (stat(single, &st) == 0) {
        s = model_single(m, single);
    } else if (stat(index, &st) == 0) {
        s = model_sharded(m, index);
    } else {
        s = ls_err(LS_ERR_IO, "%s: model directory holds neither %s nor %s", path, LS_ST_SINGLE_NAME,
                   LS_ST_INDEX_NAME);
    }
    free(single);
    free(index);
    return s;
}

ls_status ls_st_model_open(ls_st_model *m, const char *path) {
    LS_ASSERT(m && path);
    ls_st_model tmp;
    memset(&tmp, 0, sizeof tmp);
    memset(m, 0, sizeof *m);
    ls_status s = model_open(&tmp, path);
    if (s != LS_OK) {
        ls_st_model_close(&tmp);
        return s;
    }
    *m = tmp;
    return LS_OK;
}

void ls_st_model_close(ls_st_model *m) {
    if (!m) return;
    for (int64_t i = 0; i < m->n_files; i++) ls_st_close(&m->files[i]);
    free(m->files);
    free((void *)m->by_name);
    free(m->dir);
    memset(m, 0, sizeof *m);
}

const ls_st_tensor *ls_st_model_find(const ls_st_model *m, const char *name) {
    if (m->n_tensors == 0) return NULL;
    const ls_st_tensor *const *p =
        bsearch(name, m->by_name, (size_t)m->n_tensors, sizeof *m->by_name, cmp_key_tensor_ptr);
    return p ? *p : NULL;
}

const ls_st_tensor *ls_st_model_at(const ls_st_model *m, int64_t i) {
    LS_ASSERT(i >= 0 && i < m->n_tensors, "tensor index %lld of %lld", (long long)i, (long long)m->n_tensors);
    return m->by_name[i];
}

/* ---- writer ------------------------------------------------------------------- */
void ls_st_writer_init(ls_st_writer *w) { memset(w, 0, sizeof *w); }

void ls_st_writer_free(ls_st_writer *w) {
    if (!w) return;
    for (int64_t i = 0; i < w->n; i++) free(w->t[i].name);
    free(w->t);
    for (int64_t i = 0; i < w->n_meta; i++) {
        free(w->meta_keys[i]);
        free(w->meta_values[i]);
    }
    free(w->meta_keys);
    free(w->meta_values);
    memset(w, 0, sizeof *w);
}

static int utf8_ok(const char *s) { return utf8_invalid_at((const uint8_t *)s, (int64_t)strlen(s)) < 0; }

static ls_status writer_add(ls_st_writer *w, const char *name, ls_st_dtype dt, int ndim, const int64_t *shape,
                            ls_st_wtensor **out) {
    LS_ASSERT(w && name);
    if ((unsigned)dt >= LS_ST_DTYPE_COUNT)
        return ls_err(LS_ERR_ARG, "tensor \"%s\": bad dtype %d", name, (int)dt);
    if (ndim < 0 || ndim > LS_ST_MAX_DIMS)
        return ls_err(LS_ERR_ARG, "tensor \"%s\": ndim %d outside [0, %d]", name, ndim, LS_ST_MAX_DIMS);
    if (strcmp(name, "__metadata__") == 0) return ls_err(LS_ERR_ARG, "\"__metadata__\" is not a tensor name");
    if (!utf8_ok(name)) return ls_err(LS_ERR_ARG, "tensor name \"%s\" is not valid UTF-8", name);
    ls_st_wtensor e;
    memset(&e, 0, sizeof e);
    e.dtype = dt;
    e.ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || (double)shape[i] > ST_MAX_JSON_INT)
            return ls_err(LS_ERR_ARG, "tensor \"%s\": shape[%d] = %lld out of range", name, i,
                          (long long)shape[i]);
        e.shape[i] = shape[i];
    }
    int rc = shape_size(dt, ndim, e.shape, &e.numel, &e.nbytes);
    if (rc != 0) {
        char shp[256];
        fmt_shape(shp, sizeof shp, ndim, e.shape);
        return ls_err(LS_ERR_ARG, "tensor \"%s\": shape %s of %s %s", name, shp, ls_st_dtype_name(dt),
                      rc == -2 ? "is not a whole number of bytes" : "overflows");
    }
    if (w->n == w->cap) {
        int64_t cap = w->cap ? 2 * w->cap : 64;
        ls_st_wtensor *t = realloc(w->t, (size_t)cap * sizeof *t);
        if (!t) return ls_err(LS_ERR_NOMEM, "writer: out of memory for %lld tensors", (long long)cap);
        w->t = t;
        w->cap = cap;
    }
    e.name = strdup(name);
    if (!e.name) return ls_err(LS_ERR_NOMEM, "writer: out of memory");
    w->t[w->n] = e;
    *out = &w->t[w->n++];
    return LS_OK;
}

ls_status ls_st_writer_add_f32(ls_st_writer *w, const char *name, ls_dtype dtype, int ndim,
                               const int64_t *shape, const float *src) {
    ls_st_wtensor *e = NULL;
    LS_TRY(writer_add(w, name, ls_st_dtype_from_ls(dtype), ndim, shape, &e));
    if (e->numel > 0 && !src) {
        free(e->name);
        w->n--;
        return ls_err(LS_ERR_ARG, "tensor \"%s\": NULL data for %lld elements", name, (long long)e->numel);
    }
    e->src_f32 = src;
    return LS_OK;
}

ls_status ls_st_writer_add_raw(ls_st_writer *w, const char *name, ls_st_dtype dtype, int ndim,
                               const int64_t *shape, const void *data, size_t nbytes) {
    ls_st_wtensor *e = NULL;
    LS_TRY(writer_add(w, name, dtype, ndim, shape, &e));
    if ((uint64_t)e->nbytes != (uint64_t)nbytes || (nbytes > 0 && !data)) {
        ls_status s = ls_err(LS_ERR_ARG, "tensor \"%s\": %zu bytes given%s, dtype %s shape needs %lld", name,
                             nbytes, data ? "" : " (NULL)", ls_st_dtype_name(dtype), (long long)e->nbytes);
        free(e->name);
        w->n--;
        return s;
    }
    e->src_raw = data;
    return LS_OK;
}

ls_status ls_st_writer_add_meta(ls_st_writer *w, const char *key, const char *value) {
    LS_ASSERT(w && key && value);
    if (!utf8_ok(key) || !utf8_ok(value))
        return ls_err(LS_ERR_ARG, "metadata \"%s\": key or value is not valid UTF-8", key);
    for (int64_t i = 0; i < w->n_meta; i++)
        if (strcmp(w->meta_keys[i], key) == 0)
            return ls_err(LS_ERR_ARG, "metadata key \"%s\" added twice", key);
    if (w->n_meta == w->cap_meta) {
        int64_t cap = w->cap_meta ? 2 * w->cap_meta : 8;
        char **k = realloc(w->meta_keys, (size_t)cap * sizeof *k);
        if (!k) return ls_err(LS_ERR_NOMEM, "writer: out of memory");
        w->meta_keys = k;
        char **v = realloc(w->meta_values, (size_t)cap * sizeof *v);
        if (!v) return ls_err(LS_ERR_NOMEM, "writer: out of memory");
        w->meta_values = v;
        w->cap_meta = cap;
    }
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return ls_err(LS_ERR_NOMEM, "writer: out of memory");
    }
    w->meta_keys[w->n_meta] = k;
    w->meta_values[w->n_meta] = v;
    w->n_meta++;
    return LS_OK;
}

/* Data order of the reference writer: larger elements first, then by name. */
static int cmp_wt_layout(const void *a, const void *b) {
    const ls_st_wtensor *x = *(const ls_st_wtensor *const *)a, *y = *(const ls_st_wtensor *const *)b;
    int bx = ls_st_dtype_bits(x->dtype), by = ls_st_dtype_bits(y->dtype);
    if (bx != by) return bx > by ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_wt_name(const void *a, const void *b) {
    return strcmp((*(const ls_st_wtensor *const *)a)->name, (*(const ls_st_wtensor *const *)b)->name);
}

/* JSON header for the tensors in `order`; malloc'd, space-padded to a multiple of 8. */
static ls_status build_header(const ls_st_writer *w, const ls_st_wtensor **order, char **out, size_t *out_len,
                              const char *path) {
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL;
    if (ok && w->n_meta > 0) {
        cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
        ok = meta != NULL;
        for (int64_t i = 0; ok && i < w->n_meta; i++)
            ok = cJSON_AddStringToObject(meta, w->meta_keys[i], w->meta_values[i]) != NULL;
    }
    int64_t off = 0;
    char num[32];
    for (int64_t i = 0; ok && i < w->n; i++) {
        const ls_st_wtensor *t = order[i];
        cJSON *e = cJSON_AddObjectToObject(root, t->name);
        cJSON *shape = NULL, *offs = NULL;
        ok = e && cJSON_AddStringToObject(e, "dtype", ls_st_dtype_name(t->dtype)) &&
             (shape = cJSON_AddArrayToObject(e, "shape")) &&
             (offs = cJSON_AddArrayToObject(e, "data_offsets"));
        /* integers as raw text: cJSON prints doubles >= 1e15 in exponent form */
        for (int d = 0; ok && d < t->ndim; d++) {
            snprintf(num, sizeof num, "%lld", (long long)t->shape[d]);
            cJSON *r = cJSON_CreateRaw(num);
            ok = r && cJSON_AddItemToArray(shape, r);
        }
        int64_t end;
        if (ok && __builtin_add_overflow(off, t->nbytes, &end)) {
            cJSON_Delete(root);
            return ls_err(LS_ERR_ARG, "%s: total data size overflows", path);
        }
        for (int j = 0; ok && j < 2; j++) {
            snprintf(num, sizeof num, "%lld", (long long)(j ? end : off));
            cJSON *r = cJSON_CreateRaw(num);
            ok = r && cJSON_AddItemToArray(offs, r);
        }
        off = end;
    }
    char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!json) return ls_err(LS_ERR_NOMEM, "%s: out of memory building the header", path);
    size_t len = strlen(json), padded = (len + 7) & ~(size_t)7;
    if ((int64_t)padded > LS_ST_MAX_HEADER) {
        free(json);
        return ls_err(LS_ERR_ARG, "%s: header of %zu bytes exceeds the %lld-byte limit", path, padded,
                      (long long)LS_ST_MAX_HEADER);
    }
    char *buf = realloc(json, padded + 1);
    if (!buf) {
        free(json);
        return ls_err(LS_ERR_NOMEM, "%s: out of memory building the header", path);
    }
    memset(buf + len, ' ', padded - len);
    buf[padded] = 0;
    *out = buf;
    *out_len = padded;
    return LS_OK;
}

static ls_status write_all(FILE *fp, const void *p, size_t n, const char *tmp) {
    if (n > 0 && fwrite(p, 1, n, fp) != n)
        return ls_err(LS_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
    return LS_OK;
}

static ls_status write_body(FILE *fp, const ls_st_wtensor **order, int64_t n, const char *hdr, size_t hlen,
                            const char *tmp) {
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    LS_TRY(write_all(fp, len8, 8, tmp));
    LS_TRY(write_all(fp, hdr, hlen, tmp));
    enum { CHUNK = 1 << 16 }; /* elements; 512 KiB of F64 */
    double *buf = NULL;
    ls_status s = LS_OK;
    for (int64_t i = 0; s == LS_OK && i < n; i++) {
        const ls_st_wtensor *t = order[i];
        if (t->nbytes == 0) continue;
        if (t->src_raw || t->dtype == LS_ST_F32) {
            s = write_all(fp, t->src_raw ? t->src_raw : (const void *)t->src_f32, (size_t)t->nbytes, tmp);
            continue;
        }
        if (!buf && !(buf = malloc(CHUNK * sizeof *buf))) {
            s = ls_err(LS_ERR_NOMEM, "%s: out of memory for the conversion buffer", tmp);
            break;
        }
        ls_dtype dt = LS_DTYPE_F32;
        int is_float = ls_st_dtype_to_ls(t->dtype, &dt);
        LS_ASSERT(is_float, "f32 source for %s tensor", ls_st_dtype_name(t->dtype));
        size_t es = ls_dtype_size(dt);
        for (int64_t j = 0; s == LS_OK && j < t->numel; j += CHUNK) {
            int64_t m = t->numel - j < CHUNK ? t->numel - j : CHUNK;
            ls_convert_from_f32(buf, dt, t->src_f32 + j, (size_t)m);
            s = write_all(fp, buf, (size_t)m * es, tmp);
        }
    }
    free(buf);
    return s;
}

/* fsync the directory holding `path` so the rename itself is durable. */
static ls_status sync_parent_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!dir) return ls_err(LS_ERR_NOMEM, "%s: out of memory", path);
    ls_status s = LS_OK;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        s = ls_err(LS_ERR_IO, "%s: written, but cannot open directory %s to sync it: %s", path, dir,
                   strerror(errno));
    } else {
        /* EINVAL: the file system does not support syncing directories */
        if (fsync(fd) != 0 && errno != EINVAL)
            s = ls_err(LS_ERR_IO, "%s: written, but syncing directory %s failed: %s", path, dir,
                       strerror(errno));
        close(fd);
    }
    free(dir);
    return s;
}

ls_status ls_st_emit(const ls_st_writer *w, const ls_st_sink *to) {
    LS_ASSERT(w && to && (to->path || to->fn));
    if (to->path) return ls_st_write(w, to->path);
    for (int64_t i = 0; i < w->n; i++) {
        const ls_st_wtensor *t = &w->t[i];
        const float *v = t->src_f32;
        if (!v && t->dtype == LS_ST_F32) v = t->src_raw;
        if (!v && t->numel > 0)
            return ls_err(LS_ERR_UNSUPPORTED, "%s: a raw tensor of dtype %s cannot go to a callback", t->name,
                          ls_st_dtype_name(t->dtype));
        LS_TRY(to->fn(to->user, t->name, t->ndim, t->shape, v));
    }
    return LS_OK;
}

ls_status ls_st_write(const ls_st_writer *w, const char *path) {
    LS_ASSERT(w && path);
    ls_status s = LS_OK;
    const ls_st_wtensor **order = malloc(((size_t)w->n + 1) * sizeof *order);
    char *hdr = NULL, *tmp = NULL;
    size_t hlen = 0;
    FILE *fp = NULL;
    int created = 0;
    if (!order) return ls_err(LS_ERR_NOMEM, "%s: out of memory", path);
    for (int64_t i = 0; i < w->n; i++) order[i] = &w->t[i];
    qsort(order, (size_t)w->n, sizeof *order, cmp_wt_name);
    for (int64_t i = 1; i < w->n; i++)
        if (strcmp(order[i - 1]->name, order[i]->name) == 0) {
            s = ls_err(LS_ERR_ARG, "%s: tensor \"%s\" added twice", path, order[i]->name);
            goto fail;
        }
    qsort(order, (size_t)w->n, sizeof *order, cmp_wt_layout);
    s = build_header(w, order, &hdr, &hlen, path);
    if (s != LS_OK) goto fail;

    size_t plen = strlen(path) + 32;
    tmp = malloc(plen);
    if (!tmp) {
        s = ls_err(LS_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    snprintf(tmp, plen, "%s.tmp.%ld", path, (long)getpid());
    /* Only a regular file (or nothing) at `path` is replaced. A stale temp file of a
     * crashed run (same pid after a container restart) is ours to replace; the new
     * one is opened O_EXCL|O_NOFOLLOW, never a planted symlink or FIFO. */
    s = ls_check_output_file(path);
    if (s != LS_OK) goto fail;
    int fd;
    s = ls_create_temp_file(tmp, &fd);
    if (s != LS_OK) goto fail;
    created = 1;
    fp = fdopen(fd, "wb");
    if (!fp) {
        s = ls_err(LS_ERR_IO, "%s: fdopen failed: %s", tmp, strerror(errno));
        close(fd);
        goto fail;
    }
    s = write_body(fp, order, w->n, hdr, hlen, tmp);
    if (s != LS_OK) goto fail;
    if (fflush(fp) != 0) {
        s = ls_err(LS_ERR_IO, "%s: flush failed: %s", tmp, strerror(errno));
        goto fail;
    }
    if (fsync(fileno(fp)) != 0) {
        s = ls_err(LS_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
        goto fail;
    }
    int rc = fclose(fp);
    fp = NULL;
    if (rc != 0) {
        s = ls_err(LS_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
        goto fail;
    }
    if (rename(tmp, path) != 0) {
        s = ls_err(LS_ERR_IO, "%s: cannot rename %s over it: %s", path, tmp, strerror(errno));
        goto fail;
    }
    created = 0;
    s = sync_parent_dir(path);
fail:
    if (fp) fclose(fp);
    if (created) unlink(tmp);
    free(tmp);
    free(hdr);
    free(order);
    return s;
}
