/*
 * config.c — HF config.json → ls_config (specs/hybrid-qwen3next.md §1, §8.1).
 * Accepts model_type qwen3_next, qwen3_5 / qwen3_5_moe (fields under text_config),
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
#include "longstraw/files.h"

ls_status ls_read_file(const char *path, char **out, size_t *len) {
    FILE *f;
    LS_TRY(ls_open_input_stream(path, &f)); /* a FIFO or directory is refused by name, never blocks */
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        char *nb = cap > ((size_t)1 << 36) ? NULL : realloc(buf, cap * 2);
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
static ls_status get_int(const cJSON *o, const char *key, int64_t dflt, int required, int64_t lo,
                         int64_t hi, int64_t *out, const char *path) {
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

static ls_status get_num(const cJSON *o, const char *key, double dflt, double lo, double hi,
                         double *out, const char *path) {
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

static ls_status get_bool(const cJSON *o, const char *key, int dflt, int *out, const char *path) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it || cJSON_IsNull(it)) {
        *out = dflt;
        return LS_OK;
    }
    if (!cJSON_IsBool(it)) return ls_err(LS_ERR_FORMAT, "%s: field \"%s\" must be true or false", path, key);
    *out = cJSON_IsTrue(it);
    return LS_OK;
}

int ls_cfg_count_kind(const ls_config *c, ls_layer_kind k) {
    int n = 0;
    for (int64_t i = 0; i < c->n_layers; i++) n += c->kind[i] == k;
    return n;
}

/* The fields every family's config has: model_type, vocabulary, width, layers, heads. */
static ls_status parse_common(ls_config *c, const cJSON *o, const char *mt, const char *path) {
    int64_t v = 0;
    memset(c, 0, sizeof *c);
    snprintf(c->model_type, sizeof c->model_type, "%s", mt);
    LS_TRY(get_int(o, "vocab_size", 0, 1, 1, INT32_MAX, &v, path));
    c->vocab = v;
    LS_TRY(get_int(o, "hidden_size", 0, 1, 1, 1 << 20, &v, path));
    c->hidden = v;
    LS_TRY(get_int(o, "num_hidden_layers", 0, 1, 1, LS_MAX_LAYERS, &v, path));
    c->n_layers = v;
    LS_TRY(get_int(o, "num_attention_heads", 0, 1, 1, 4096, &v, path));
    c->n_heads = (int)v;
    LS_TRY(get_int(o, "num_key_value_heads", c->n_heads, 0, 1, 4096, &v, path));
    c->n_kv = (int)v;
    return LS_OK;
}

/* A per-layer array of two words ("dense"/"sparse", "full"/"shared"): out[i] = 1 for
 * `one`, 0 for `zero`; anything else is refused naming the field and entry. */
static ls_status layer_words(const cJSON *a, const char *field, const char *one, const char *zero, int64_t L,
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

static ls_status parse_text(ls_config *c, const cJSON *o, const char *mt, int is_q35, int is_moe35,
                            const char *path) {
    int64_t v = 0;
    const int64_t BIG = (int64_t)1 << 40;
    LS_TRY(parse_common(c, o, mt, path));
    c->layout = is_q35 ? LS_LAYOUT_QWEN3_5 : LS_LAYOUT_QWEN3_NEXT;
#define INT(key, dflt, req, lo, hi, dst) \
    LS_TRY(get_int(o, key, dflt, req, lo, hi, &v, path)); \
    dst = v
    INT("head_dim", 256, 0, 2, 4096, c->head_dim);
    INT("linear_num_key_heads", 16, 0, 1, 4096, c->H_k);
    INT("linear_num_value_heads", 32, 0, 1, 4096, c->H_v);
    INT("linear_key_head_dim", 128, 0, 1, 4096, c->d_k);
    INT("linear_value_head_dim", 128, 0, 1, 4096, c->d_v);
    INT("linear_conv_kernel_dim", 4, 0, 1, 64, c->conv_k);
    INT("intermediate_size", 0, 0, 0, BIG, c->intermediate);
    INT("num_experts", is_q35 && !is_moe35 ? 0 : 512, 0, 0, 1 << 20, c->n_experts);
    INT("num_experts_per_tok", 10, 0, 1, 1 << 20, c->top_k);
    INT("moe_intermediate_size", 512, 0, 1, BIG, c->moe_inter);
    INT("shared_expert_intermediate_size", is_q35 ? 0 : 512, 0, 0, BIG, c->shared_inter);
    int64_t sparse_step;
    INT("decoder_sparse_step", 1, 0, 1, LS_MAX_LAYERS, sparse_step);
#undef INT
    if (is_q35 && !is_moe35) c->n_experts = 0; /* HF drops MoE fields of dense Qwen3.5 */
    if (c->n_heads % c->n_kv != 0)
        return ls_err(LS_ERR_FORMAT, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                      path, c->n_heads, c->n_kv);
    if (c->H_v % c->H_k != 0)
        return ls_err(LS_ERR_FORMAT, "%s: linear_num_value_heads %d is not a multiple of linear_num_key_heads %d",
                      path, c->H_v, c->H_k);
    if (c->n_experts > 0 && c->top_k > c->n_experts)
        return ls_err(LS_ERR_FORMAT, "%s: num_experts_per_tok %d exceeds num_experts %d", path,
                      c->top_k, c->n_experts);
    double eps;
    LS_TRY(get_num(o, "rms_norm_eps", 1e-6, 0.0, 1.0, &eps, path));
    c->eps = (float)eps;
    LS_TRY(get_bool(o, "tie_word_embeddings", 0, &c->tie_embeddings, path));
    LS_TRY(get_bool(o, "norm_topk_prob", 1, &c->norm_topk, path));
    if (is_moe35) c->norm_topk = 1; /* Qwen3.5-MoE's router always renormalises (spec §1) */

    /* rope: top level, or inside rope_parameters (v5) / rope_scaling */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(o, "rope_parameters");
    if (rp && !cJSON_IsObject(rp) && !cJSON_IsNull(rp))
        return ls_err(LS_ERR_FORMAT, "%s: field \"rope_parameters\" must be an object", path);
    const cJSON *src = (rp && cJSON_IsObject(rp) && cJSON_GetObjectItemCaseSensitive(rp, "rope_theta")) ? rp : o;
    LS_TRY(get_num(src, "rope_theta", 10000.0, 1.0, 1e12, &c->rope_theta, path));
    src = (rp && cJSON_IsObject(rp) && cJSON_GetObjectItemCaseSensitive(rp, "partial_rotary_factor")) ? rp : o;
    LS_TRY(get_num(src, "partial_rotary_factor", 0.25, 0.0, 1.0, &c->partial_rotary, path));
    c->rot_dim = (int)(c->head_dim * c->partial_rotary);
    c->rot_dim -= c->rot_dim % 2;

    /* layer kinds: layer_types, else full_attention_interval */
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(o, "layer_types");
    if (lt && !cJSON_IsNull(lt)) {
        LS_TRY(layer_words(lt, "layer_types", "full_attention", "linear_attention", c->n_layers, c->kind, path));
    } else {
        int64_t interval;
        LS_TRY(get_int(o, "full_attention_interval", 4, 0, 1, LS_MAX_LAYERS, &interval, path));
        for (int64_t i = 0; i < c->n_layers; i++)
            c->kind[i] = ((i + 1) % interval == 0) ? LS_LAYER_ATTN : LS_LAYER_GDN;
    }
    /* MoE placement: (i+1) % decoder_sparse_step == 0 and not in mlp_only_layers */
    const cJSON *mol = cJSON_GetObjectItemCaseSensitive(o, "mlp_only_layers");
    if (mol && !cJSON_IsNull(mol) && !cJSON_IsArray(mol))
        return ls_err(LS_ERR_FORMAT, "%s: field \"mlp_only_layers\" must be an array", path);
    for (int64_t i = 0; i < c->n_layers; i++)
        c->moe[i] = c->n_experts > 0 && ((i + 1) % sparse_step == 0);
    if (mol && cJSON_IsArray(mol)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, mol) {
            if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= (double)c->n_layers ||
                e->valuedouble != floor(e->valuedouble))
                return ls_err(LS_ERR_FORMAT, "%s: mlp_only_layers entries must be layer indices in [0, %lld)",
                              path, (long long)c->n_layers);
            c->moe[(int64_t)e->valuedouble] = 0;
        }
    }
    for (int64_t i = 0; i < c->n_layers; i++)
        if (!c->moe[i] && c->intermediate <= 0)
            return ls_err(LS_ERR_FORMAT, "%s: layer %lld has a dense MLP but \"intermediate_size\" is missing or 0",
                          path, (long long)i);
    if (c->rot_dim > 1024)
        return ls_err(LS_ERR_FORMAT, "%s: rotary dimension %d too large", path, c->rot_dim);
    return LS_OK;
}

int ls_cfg_count_index_full(const ls_config *c) {
    int n = 0;
    for (int64_t i = 0; i < c->n_layers && c->family == LS_FAMILY_MLA; i++) n += c->mla.index_full[i];
    return n;
}

/* glm_moe_dsa / deepseek_v32 (specs/mla-dsa-moe.md §1, §8.5, §8.7). */
static ls_status parse_mla(ls_config *c, const cJSON *o, const char *mt, const char *path) {
    int64_t v = 0;
    const int64_t BIG = (int64_t)1 << 40;
    int glm = strcmp(mt, "glm_moe_dsa") == 0;
    LS_TRY(parse_common(c, o, mt, path));
    c->family = LS_FAMILY_MLA;
    ls_mla_config *m = &c->mla;
#define INT(key, dflt, req, lo, hi, dst) \
    LS_TRY(get_int(o, key, dflt, req, lo, hi, &v, path)); \
    dst = v
    /* The indexer's query reads the q latent (spec §3): a plain q_proj layout (q_lora_rank
     * null) has no defined indexer query, so it is refused rather than guessed. */
    const cJSON *qr = cJSON_GetObjectItemCaseSensitive(o, "q_lora_rank");
    if (!qr || cJSON_IsNull(qr))
        return ls_err(LS_ERR_UNSUPPORTED, "%s: field \"q_lora_rank\" is %s: a plain q_proj (no q latent) leaves the "
                                          "DSA indexer's query undefined (specs/mla-dsa-moe.md §3); not supported",
                      path, qr ? "null" : "absent");
    INT("q_lora_rank", 0, 1, 1, 1 << 20, m->q_lora_rank);
    INT("kv_lora_rank", 0, 1, 1, 1 << 20, m->kv_lora_rank);
    INT("qk_nope_head_dim", 0, 1, 0, 4096, m->qk_nope);
    INT("qk_rope_head_dim", 0, 1, 2, 4096, m->qk_rope);
    INT("v_head_dim", 0, 1, 1, 4096, m->v_head);
    INT("index_n_heads", 0, 1, 1, 4096, m->index_heads);
    INT("index_head_dim", 0, 1, 1, 4096, m->index_head_dim);
    INT("index_topk", 0, 1, 1, BIG, m->index_topk);
    INT("intermediate_size", 0, 0, 0, BIG, c->intermediate);
    INT("n_routed_experts", 0, 0, 0, 1 << 20, c->n_experts);
    INT("num_experts_per_tok", 8, 0, 1, 1 << 20, c->top_k);
    INT("moe_intermediate_size", 0, 0, 0, BIG, c->moe_inter);
    INT("n_shared_experts", 0, 0, 0, 1024, m->n_shared_experts);
    INT("n_group", 1, 0, 1, 1 << 20, m->n_group);
    INT("topk_group", m->n_group, 0, 1, 1 << 20, m->topk_group);
    INT("num_nextn_predict_layers", 0, 0, 0, 64, m->n_mtp);
    int64_t first_dense, moe_freq, freq, offset;
    INT("first_k_dense_replace", 0, 0, 0, LS_MAX_LAYERS, first_dense);
    INT("moe_layer_freq", 1, 0, 1, LS_MAX_LAYERS, moe_freq);
    INT("index_topk_freq", 1, 0, 1, LS_MAX_LAYERS, freq);
    INT("index_skip_topk_offset", 2, 0, 0, LS_MAX_LAYERS, offset);
#undef INT
    c->head_dim = m->qk_nope + m->qk_rope;
    c->rot_dim = m->qk_rope;
    if (m->qk_rope % 2) return ls_err(LS_ERR_FORMAT, "%s: qk_rope_head_dim %d must be even", path, m->qk_rope);
    if (m->index_head_dim < m->qk_rope)
        return ls_err(LS_ERR_FORMAT, "%s: index_head_dim %d is below qk_rope_head_dim %d (its first %d dims are rope)",
                      path, m->index_head_dim, m->qk_rope, m->qk_rope);
    if (c->n_experts > 0 && c->top_k > c->n_experts)
        return ls_err(LS_ERR_FORMAT, "%s: num_experts_per_tok %d exceeds n_routed_experts %d", path, c->top_k,
                      c->n_experts);
    if (c->n_experts > 0 && (c->n_experts % m->n_group != 0 || m->topk_group > m->n_group))
        return ls_err(LS_ERR_FORMAT, "%s: n_routed_experts %d, n_group %d, topk_group %d: the experts must split "
                                     "into n_group groups and topk_group <= n_group", path, c->n_experts, m->n_group,
                      m->topk_group);
    double eps;
    LS_TRY(get_num(o, "rms_norm_eps", 1e-6, 0.0, 1.0, &eps, path));
    c->eps = (float)eps;
    LS_TRY(get_num(o, "routed_scaling_factor", 1.0, 0.0, 1e6, &m->routed_scaling, path));
    LS_TRY(get_bool(o, "tie_word_embeddings", 0, &c->tie_embeddings, path));
    LS_TRY(get_bool(o, "norm_topk_prob", 1, &c->norm_topk, path));
    LS_TRY(get_bool(o, "indexer_rope_interleave", glm, &m->indexer_rope_interleave, path));
    LS_TRY(get_bool(o, "rope_interleave", 1, &m->rope_interleave, path));
    const cJSON *sf = cJSON_GetObjectItemCaseSensitive(o, "scoring_func");
    if (sf && !cJSON_IsNull(sf) && !(cJSON_IsString(sf) && !strcmp(sf->valuestring, "sigmoid")))
        return ls_err(LS_ERR_UNSUPPORTED, "%s: field \"scoring_func\" must be \"sigmoid\" (spec §4)", path);
    /* rope: rope_parameters (v5) or rope_theta; rope_scaling {type yarn} */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(o, "rope_parameters");
    if (rp && !cJSON_IsObject(rp) && !cJSON_IsNull(rp))
        return ls_err(LS_ERR_FORMAT, "%s: field \"rope_parameters\" must be an object", path);
    const cJSON *src = (rp && cJSON_IsObject(rp) && cJSON_GetObjectItemCaseSensitive(rp, "rope_theta")) ? rp : o;
    LS_TRY(get_num(src, "rope_theta", 10000.0, 1.0, 1e12, &c->rope_theta, path));
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(o, "rope_scaling");
    if (rs && cJSON_IsObject(rs)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rs, "type");
        if (!ty) ty = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "yarn") != 0)
            return ls_err(LS_ERR_UNSUPPORTED, "%s: rope_scaling of type \"%s\" is not supported (only yarn)", path,
                          cJSON_IsString(ty) ? ty->valuestring : "?");
        int64_t om;
        LS_TRY(get_num(rs, "factor", 1.0, 1.0, 1e6, &m->yarn_factor, path));
        LS_TRY(get_int(rs, "original_max_position_embeddings", 4096, 0, 1, BIG, &om, path));
        m->yarn_orig_max = om;
        LS_TRY(get_num(rs, "beta_fast", 32.0, 0.0, 1e6, &m->yarn_beta_fast, path));
        LS_TRY(get_num(rs, "beta_slow", 1.0, 0.0, 1e6, &m->yarn_beta_slow, path));
        LS_TRY(get_num(rs, "mscale", 1.0, 0.0, 1e6, &m->yarn_mscale, path));
        LS_TRY(get_num(rs, "mscale_all_dim", 0.0, 0.0, 1e6, &m->yarn_mscale_all_dim, path));
        double af;
        LS_TRY(get_num(rs, "attention_factor", 1.0, 0.0, 1e6, &af, path));
        /* spec §2: cos/sin are not rescaled because mscale/mscale_all_dim = 1 */
        if (m->yarn_mscale != m->yarn_mscale_all_dim || af != 1.0)
            return ls_err(LS_ERR_UNSUPPORTED, "%s: rope_scaling with mscale %g != mscale_all_dim %g (or attention_factor "
                                              "%g != 1) rescales cos/sin: not supported", path, m->yarn_mscale,
                          m->yarn_mscale_all_dim, af);
    } else if (rs && !cJSON_IsNull(rs)) {
        return ls_err(LS_ERR_FORMAT, "%s: field \"rope_scaling\" must be an object", path);
    }
    for (int64_t i = 0; i < c->n_layers; i++) c->kind[i] = LS_LAYER_MLA;
    /* dense layers: mlp_layer_types, else first_k_dense_replace (and moe_layer_freq) */
    const cJSON *mlt = cJSON_GetObjectItemCaseSensitive(o, "mlp_layer_types");
    if (mlt && !cJSON_IsNull(mlt)) {
        LS_TRY(layer_words(mlt, "mlp_layer_types", "sparse", "dense", c->n_layers, c->moe, path));
    } else {
        for (int64_t i = 0; i < c->n_layers; i++) c->moe[i] = i >= first_dense && i % moe_freq == 0;
    }
    for (int64_t i = 0; i < c->n_layers; i++) {
        if (c->moe[i] && (c->n_experts == 0 || c->moe_inter <= 0))
            return ls_err(LS_ERR_FORMAT, "%s: layer %lld is MoE but \"n_routed_experts\" or \"moe_intermediate_size\" "
                                         "is missing or 0", path, (long long)i);
        if (!c->moe[i] && c->intermediate <= 0)
            return ls_err(LS_ERR_FORMAT, "%s: layer %lld has a dense MLP but \"intermediate_size\" is missing or 0",
                          path, (long long)i);
    }
    /* IndexCache (spec §8.5): indexer_types, else index_topk_pattern, else the
     * freq/offset rule */
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, "indexer_types");
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(o, "index_topk_pattern");
    if ((!it || cJSON_IsNull(it)) && pat && !cJSON_IsNull(pat)) {
        /* a string of F/S, or an array of "F"/"S" ("full"/"shared") */
        int ok = cJSON_IsString(pat) ? (int64_t)strlen(pat->valuestring) == c->n_layers
                                     : cJSON_IsArray(pat) && cJSON_GetArraySize(pat) == c->n_layers;
        for (int64_t i = 0; ok && i < c->n_layers; i++) {
            const char *e = cJSON_IsString(pat) ? NULL : cJSON_GetStringValue(cJSON_GetArrayItem(pat, (int)i));
            char ch = cJSON_IsString(pat) ? pat->valuestring[i] : 0;
            if (ch == 'F' || (e && (!strcmp(e, "F") || !strcmp(e, "full")))) m->index_full[i] = 1;
            else if (ch == 'S' || (e && (!strcmp(e, "S") || !strcmp(e, "shared")))) m->index_full[i] = 0;
            else ok = 0;
        }
        if (!ok)
            return ls_err(LS_ERR_FORMAT, "%s: field \"index_topk_pattern\" must hold %lld entries of F or S", path,
                          (long long)c->n_layers);
    } else if (it && !cJSON_IsNull(it)) {
        LS_TRY(layer_words(it, "indexer_types", "full", "shared", c->n_layers, m->index_full, path));
    } else {
        for (int64_t i = 0; i < c->n_layers; i++) {
            int64_t k = i - offset + 1;
            m->index_full[i] = (k > 0 ? k : 0) % freq == 0;
        }
    }
    if (!m->index_full[0])
        return ls_err(LS_ERR_FORMAT, "%s: layer 0 is a shared indexer layer: no earlier full layer to reuse", path);
    return LS_OK;
}

ls_status ls_config_parse(ls_config *c, const char *text, const char *path) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1); /* 1: nothing may follow the object */
    if (!root) {
        const char *at = end ? end : cJSON_GetErrorPtr();
        long off = at ? (long)(at - text) : -1;
        return ls_err(LS_ERR_FORMAT, "%s: invalid JSON near byte %ld (line %ld)", path, off, ls_line_of(text, off));
    }
    ls_status s = LS_OK;
    if (!cJSON_IsObject(root)) {
        s = ls_err(LS_ERR_FORMAT, "%s: top level must be a JSON object", path);
        goto done;
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsString(mt)) {
        s = ls_err(LS_ERR_FORMAT, "%s: missing string field \"model_type\"", path);
        goto done;
    }
    const cJSON *obj = root;
    const char *type = mt->valuestring;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (tc && cJSON_IsObject(tc)) {
        obj = tc;
        const cJSON *tmt = cJSON_GetObjectItemCaseSensitive(tc, "model_type");
        if (cJSON_IsString(tmt)) type = tmt->valuestring;
        else if (strcmp(type, "qwen3_5") == 0) type = "qwen3_5_text";
        else if (strcmp(type, "qwen3_5_moe") == 0) type = "qwen3_5_moe_text";
    }
    if (strcmp(type, "qwen3_next") == 0) {
        s = parse_text(c, obj, type, 0, 0, path);
    } else if (strcmp(type, "qwen3_5_text") == 0 || strcmp(type, "qwen3_5") == 0) {
        s = parse_text(c, obj, type, 1, 0, path);
    } else if (strcmp(type, "qwen3_5_moe_text") == 0 || strcmp(type, "qwen3_5_moe") == 0) {
        s = parse_text(c, obj, type, 1, 1, path);
    } else if (strcmp(type, "glm_moe_dsa") == 0 || strcmp(type, "deepseek_v32") == 0) {
        s = parse_mla(c, obj, type, path);
    } else {
        s = ls_err(LS_ERR_UNSUPPORTED,
                   "%s: model_type \"%s\" is not supported (expected qwen3_next, qwen3_5, qwen3_5_text, "
                   "qwen3_5_moe, qwen3_5_moe_text, glm_moe_dsa or deepseek_v32)", path, type);
    }
    /* tie_word_embeddings may sit at the top level of a Qwen3.5 wrapper config */
    if (s == LS_OK && obj != root) {
        const cJSON *tw = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
        if (cJSON_IsBool(tw) && !cJSON_GetObjectItemCaseSensitive(obj, "tie_word_embeddings"))
            c->tie_embeddings = cJSON_IsTrue(tw);
    }
done:
    cJSON_Delete(root);
    return s;
}

ls_status ls_config_load(ls_config *c, const char *path) {
    char *text = NULL;
    LS_TRY(ls_read_file(path, &text, NULL));
    ls_status s = ls_config_parse(c, text, path);
    free(text);
    return s;
}

ls_status ls_write_memstream(const char *path, FILE *f, char **buf, size_t *len) {
    ls_status s = fclose(f) == 0 ? ls_write_file_atomic(path, *buf, *len)
                                 : ls_err(LS_ERR_NOMEM, "%s: cannot build the file in memory", path);
    free(*buf);
    *buf = NULL;
    return s;
}
