/*
 * family.c — the registry of model families (family.h): which family reads a
 * checkpoint, decided by its config.json: the hybrid family (Qwen3-Next / Qwen3.5) and
 * the MLA + DSA + MoE family (GLM-5.x, DeepSeek-V3.2) — and the parse of a config.json,
 * handed to the family its model_type names (the field readers live in src/io/config.c).
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/config_fields.h"
#include "longstraw/files.h"

#include "longstraw/mla.h"
#include "longstraw/hybrid.h"

static const ls_family *const families[] = {&ls_hybrid_family, &ls_mla_family};

void ls_fwd_opts_default(ls_fwd_opts *o) {
    memset(o, 0, sizeof *o);
    o->capture_chunk = 2048;
    o->lmhead_rows = 64;
    o->temperature = 1.0f;
}

const ls_family *ls_family_for(const ls_config *cfg, const char *path) {
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (families[i]->accepts(cfg)) return families[i];
    ls_err(LS_ERR_UNSUPPORTED, "%s: model_type \"%s\" is read by no model family", path, cfg->model_type);
    return NULL;
}

const ls_family *ls_family_for_type(const char *model_type) {
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        for (const char *const *t = families[i]->model_types; *t; t++)
            if (!strcmp(*t, model_type)) return families[i];
    return NULL;
}

void ls_family_type_names(char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = 0;
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        for (const char *const *t = families[i]->model_types; *t && n < cap; t++)
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", *t);
}

const ls_family *ls_family_named(const char *name) {
    if (!name) return families[0]; /* the default */
    char names[128] = "";
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++) {
        if (!strcmp(families[i]->name, name)) return families[i];
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? " or " : "", families[i]->name);
    }
    ls_err(LS_ERR_ARG, "family \"%s\": expected %s", name, names);
    return NULL;
}

static ls_status family_of_dir(const char *dir, const ls_family **fam) {
    char path[4096];
    ls_config cfg;
    snprintf(path, sizeof path, "%s/config.json", dir);
    LS_TRY(ls_config_load(&cfg, path));
    *fam = ls_family_for(&cfg, path);
    return *fam ? LS_OK : LS_ERR_UNSUPPORTED;
}

ls_status ls_model_load(ls_model *m, const char *dir, const ls_comm *ep, ls_arena *fixed) {
    const ls_family *fam;
    LS_TRY(family_of_dir(dir, &fam));
    return fam->load(m, dir, ep, fixed);
}

ls_status ls_policy_open(ls_policy *p, const ls_policy_spec *spec, ls_arenas *ar) {
    const ls_family *fam;
    memset(p, 0, sizeof *p);
    LS_TRY(family_of_dir(spec->model_dir, &fam));
    if (spec->ref_dir) { /* the reference runs the policy's own forward: the same family */
        const ls_family *rfam;
        LS_TRY(family_of_dir(spec->ref_dir, &rfam));
        if (rfam != fam)
            return ls_err(LS_ERR_ARG, "the reference model %s is of the \"%s\" family, the policy %s of the \"%s\" "
                                      "family: the reference (--ref-model) must be the same family and config as the policy",
                          spec->ref_dir, rfam->name, spec->model_dir, fam->name);
    }
    ls_status s = fam->policy_open(p, spec, ar);
    if (s != LS_OK && p->fam) ls_policy_close(p);
    return s;
}

void ls_policy_close(ls_policy *p) {
    if (p->fam) p->fam->policy_close(p);
}

/* ---- config.json: the family its model_type names parses it ---------------------------- */
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
        if (cJSON_IsString(tmt)) type = tmt->valuestring; /* else the wrapper's: its family knows */
    }
    const ls_family *fam = ls_family_for_type(type);
    if (!fam) {
        char names[512] = "";
        ls_family_type_names(names, sizeof names);
        s = ls_err(LS_ERR_UNSUPPORTED, "%s: model_type \"%s\" is not supported (expected %s)", path, type, names);
    } else {
        s = fam->parse_config(c, obj, type, obj != root, path);
        if (s == LS_OK) c->family = fam;
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
