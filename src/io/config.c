/*
 * config.c — the field readers of HF config.json files (config_fields.h) and the file
 * helpers beside them. Which family parses a config.json is the registry's business
 * (src/models/family.c: ls_config_parse), so src/io names no family. The registry accepts model_type qwen3_next, qwen3_5 / qwen3_5_moe (fields under text_config),
 * qwen3_5_text and qwen3_5_moe_text (the hybrid family), and glm_moe_dsa and
 * deepseek_v32 (the MLA + DSA + MoE family, specs/mla-dsa-moe.md §1). Every field is
 * type-checked and range-checked; errors name the file and the field.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "longstraw/config.h"
#include "longstraw/config_fields.h"
#include "longstraw/files.h"

ls_status ls_read_file(const char *path, char **out, size_t *len) {
    FILE *f;
    LS_TRY(ls_open_input_stream(path, &f)); /* a FIFO or directory is refused by name, never blocks */
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        if (cap > ((size_t)1 << 32)) { /* no input of ours is near it: not read until memory runs out */
            fclose(f);
            free(buf);
            return ls_err(LS_ERR_ARG, "%s: larger than 4 GiB, more than any file the tool reads whole", path);
        }
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    int err = ferror(f), e = errno;
    fclose(f);
    if (!buf) return ls_err(LS_ERR_NOMEM, "%s: file too large to read", path);
    if (err) {
        free(buf);
        return ls_err(LS_ERR_IO, "%s: read error: %s", path, strerror(e));
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return LS_OK;
}

long ls_line_of(const char *text, long off) {
    long line = 1;
    for (long i = 0; i < off && text[i]; i++) line += text[i] == '\n';
    return line;
}

ls_status ls_write_file_atomic(const char *path, const void *data, size_t len) {
    char tmp[4200];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= sizeof tmp)
        return ls_err(LS_ERR_ARG, "%s: path too long", path);
    /* only a regular file (or nothing) is replaced; the temp file is new (never a
     * planted symlink or FIFO) */
    LS_TRY(ls_check_output_file(path));
    int fd;
    LS_TRY(ls_create_temp_file(tmp, &fd));
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        ls_status s = ls_err(LS_ERR_IO, "%s: fdopen failed: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        return s;
    }
    int ok = fwrite(data, 1, len, f) == len && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (fclose(f) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        ls_status s = ls_err(LS_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
        unlink(tmp);
        return s;
    }
    return LS_OK;
}

ls_status ls_copy_file_atomic(const char *src, const char *dst) {
    char *text = NULL;
    size_t len = 0;
    LS_TRY(ls_read_file(src, &text, &len));
    ls_status s = ls_write_file_atomic(dst, text, len);
    free(text);
    return s;
}

/* Integer field: absent → dflt (or error when required); must be an integer in [lo, hi]. */
ls_status ls_cfg_get_int(const cJSON *o, const char *key, int64_t dflt, int required, int64_t lo, int64_t hi,
                         int64_t *out, const char *path) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it || cJSON_IsNull(it)) {
        if (required) return ls_err(LS_ERR_FORMAT, "%s: missing required field \"%s\"", path, key);
        *out = dflt;
        return LS_OK;
    }
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble))
        return ls_err(LS_ERR_FORMAT, "%s: field \"%s\" must be an integer", path, key);
    double v = it->valuedouble;
    if (v < (double)lo || v > (double)hi)
        return ls_err(LS_ERR_FORMAT, "%s: field \"%s\" = %.0f is out of range [%lld, %lld]", path,
                      key, v, (long long)lo, (long long)hi);
    *out = (int64_t)v;
    return LS_OK;
}

ls_status ls_cfg_get_num(const cJSON *o, const char *key, double dflt, double lo, double hi, double *out,
                         const char *path) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it || cJSON_IsNull(it)) {
        *out = dflt;
        return LS_OK;
    }
    if (!cJSON_IsNumber(it)) return ls_err(LS_ERR_FORMAT, "%s: field \"%s\" must be a number", path, key);
    if (!(it->valuedouble >= lo && it->valuedouble <= hi))
        return ls_err(LS_ERR_FORMAT, "%s: field \"%s\" = %g is out of range [%g, %g]", path, key,
                      it->valuedouble, lo, hi);
    *out = it->valuedouble;
    return LS_OK;
}

ls_status ls_cfg_get_bool(const cJSON *o, const char *key, int dflt, int *out, const char *path) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it || cJSON_IsNull(it)) {
        *out = dflt;
        return LS_OK;
    }
    if (!cJSON_IsBool(it)) return ls_err(LS_ERR_FORMAT, "%s: field \"%s\" must be true or false", path, key);
    *out = cJSON_IsTrue(it);
    return LS_OK;
}

int ls_cfg_count_kind(const ls_config *c, int k) {
    int n = 0;
    for (int64_t i = 0; i < c->n_layers; i++) n += c->kind[i] == k;
    return n;
}

/* The fields every family's config has: model_type, vocabulary, width, layers, heads. */
ls_status ls_cfg_parse_common(ls_config *c, const cJSON *o, const char *mt, const char *path) {
    int64_t v = 0;
    memset(c, 0, sizeof *c);
    snprintf(c->model_type, sizeof c->model_type, "%s", mt);
    LS_TRY(ls_cfg_get_int(o, "vocab_size", 0, 1, 1, INT32_MAX, &v, path));
    c->vocab = v;
    LS_TRY(ls_cfg_get_int(o, "hidden_size", 0, 1, 1, 1 << 20, &v, path));
    c->hidden = v;
    LS_TRY(ls_cfg_get_int(o, "num_hidden_layers", 0, 1, 1, LS_MAX_LAYERS, &v, path));
    c->n_layers = v;
    LS_TRY(ls_cfg_get_int(o, "num_attention_heads", 0, 1, 1, 4096, &v, path));
    c->n_heads = (int)v;
    LS_TRY(ls_cfg_get_int(o, "num_key_value_heads", c->n_heads, 0, 1, 4096, &v, path));
    c->n_kv = (int)v;
    return LS_OK;
}

/* A per-layer array of two words ("dense"/"sparse", "full"/"shared"): out[i] = 1 for
 * `one`, 0 for `zero`; anything else is refused naming the field and entry. */
ls_status ls_cfg_layer_words(const cJSON *a, const char *field, const char *one, const char *zero, int64_t L,
                             uint8_t *out, const char *path) {
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != L)
        return ls_err(LS_ERR_FORMAT, "%s: field \"%s\" must be an array of %lld strings", path, field, (long long)L);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        if (cJSON_IsString(e) && !strcmp(e->valuestring, one)) out[i] = 1;
        else if (cJSON_IsString(e) && !strcmp(e->valuestring, zero)) out[i] = 0;
        else return ls_err(LS_ERR_FORMAT, "%s: %s[%d] must be \"%s\" or \"%s\"", path, field, i, zero, one);
        i++;
    }
    return LS_OK;
}

ls_status ls_write_memstream(const char *path, FILE *f, char **buf, size_t *len) {
    ls_status s = fclose(f) == 0 ? ls_write_file_atomic(path, *buf, *len)
                                 : ls_err(LS_ERR_NOMEM, "%s: cannot build the file in memory", path);
    free(*buf);
    *buf = NULL;
    return s;
}
