/*
 * tokenizer.c — byte-level BPE from a Hugging Face tokenizer.json (Qwen2/Qwen3 family).
 *
 * Encode follows HF `tokenizers` (Rust), Tokenizer::encode(text, add_special_tokens=False):
 *   1. added tokens with normalized=false are cut out of the raw text (leftmost-longest,
 *      lstrip/rstrip/single_word as AddedVocabulary::find_matches);
 *   2. each remaining piece is normalised (NFC), then added tokens with normalized=true
 *      are cut out of it the same way;
 *   3. the pre-tokenizer splits each piece with the Qwen pattern (Isolated: every match is
 *      a pre-token) — `match_qwen` below is a hand-written matcher for exactly
 *        (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}
 *        | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *      with leftmost-first alternation and greedy backtracking worked out per branch;
 *   4. ByteLevel maps each pre-token's UTF-8 bytes to the GPT-2 byte alphabet and BPE
 *      merges adjacent symbols lowest merge rank first (leftmost on ties), with a binary
 *      heap and a linked list per pre-token (as HF's Word::merge_all).
 * The vocabulary is keyed by the token spellings of tokenizer.json (the byte alphabet), so
 * every lookup is the same string lookup HF does. Decode maps each token back to bytes.
 * Memory: the tokenizer's tables are malloc'd at load and freed by ls_tok_free; encode and
 * decode use per-call malloc'd scratch (grown geometrically, never per token).
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/config.h"
#include "longstraw/tokenizer.h"

#define LS_TOK_MAX_ID (1 << 26) /* ids at or above this are rejected (tables are per id) */
#define LS_TOK_ABSENT UINT32_MAX

/* The one Split pattern this file implements (Qwen2 / Qwen2.5 / Qwen3). */
static const char QWEN_PATTERN[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

typedef struct {
    uint64_t key; /* (left id << 32) | right id; UINT64_MAX = empty slot */
    int32_t rank, new_id;
} merge_ent;

typedef struct {
    int32_t id;
    uint32_t off, len; /* matching text in the pool (NFC'd for normalized=true tokens) */
    uint8_t single_word, lstrip, rstrip;
} added_tok;

typedef struct {
    added_tok *v;
    int n;
    uint8_t first[256]; /* first bytes of the tokens: a quick reject while scanning */
} added_set;

enum { F_PRESENT = 1, F_ADDED = 2, F_SPECIAL = 4 };

struct ls_tokenizer {
    int nfc, ignore_merges;
    int64_t n_ids; /* 1 + largest id */
    /* per id (n_ids): spelling in tokenizer.json and decoded bytes, both in pool */
    uint32_t *str_off, *str_len, *dec_off, *dec_len;
    uint8_t *flags;
    char *pool;
    size_t pool_len, pool_cap;
    int32_t *shash; /* spelling -> id, open addressing, -1 = empty */
    uint64_t shash_mask;
    merge_ent *mhash;
    uint64_t mhash_mask;
    int32_t byte_id[256];      /* id of the single-byte token of each byte */
    int16_t cp_byte[256 + 68]; /* inverse of byte_to_cp, -1 outside the byte alphabet */
    char byte_sym[256][3];     /* GPT-2 byte alphabet: UTF-8 spelling of each byte */
    uint8_t byte_sym_len[256];
    added_set raw, norm; /* normalized=false / normalized=true added tokens, longest first */
};

/* ---- small helpers --------------------------------------------------------------- */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uint64_t hash_pair(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
}

/* UTF-8 of a code point below U+0800 (the byte alphabet ends at U+0143). */
static size_t put_utf8_2(char *p, uint32_t cp) {
    if (cp < 0x80) return p[0] = (char)cp, 1;
    p[0] = (char)(0xC0 | (cp >> 6));
    p[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* GPT-2 bytes_to_unicode: the printable bytes 33..126, 161..172, 174..255 stand for
   themselves; the other 68 bytes, in order, for U+0100..U+0143. */
static int byte_is_printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

static uint32_t byte_to_cp(int b) {
    if (byte_is_printable(b)) return (uint32_t)b;
    int k = 0;
    for (int x = 0; x < b; x++) k += !byte_is_printable(x);
    return 256u + (uint32_t)k;
}

/* ---- string table ---------------------------------------------------------------- */

static ls_status pool_add(ls_tokenizer *t, const char *s, size_t n, uint32_t *off) {
    if (n >= UINT32_MAX || t->pool_len + n >= UINT32_MAX)
        return ls_err(LS_ERR_NOMEM, "token strings exceed 4 GiB");
    if (t->pool_len + n + 1 > t->pool_cap) {
        size_t cap = t->pool_cap ? t->pool_cap : 1 << 20;
        while (cap < t->pool_len + n + 1) cap *= 2;
        char *p = realloc(t->pool, cap);
        if (!p) return ls_err(LS_ERR_NOMEM, "out of memory for token strings");
        t->pool = p;
        t->pool_cap = cap;
    }
    memcpy(t->pool + t->pool_len, s, n);
    t->pool[t->pool_len + n] = 0;
    *off = (uint32_t)t->pool_len;
    t->pool_len += n + 1;
    return LS_OK;
}

/* Slot of spelling s in shash: holds its id, or -1 where it would go. */
static uint64_t shash_slot(const ls_tokenizer *t, const char *s, size_t n) {
    uint64_t h = hash_bytes(s, n) & t->shash_mask;
    for (;;) {
        int32_t id = t->shash[h];
        if (id < 0) return h;
        if (t->str_len[id] == n && memcmp(t->pool + t->str_off[id], s, n) == 0) return h;
        h = (h + 1) & t->shash_mask;
    }
}

static int32_t lookup(const ls_tokenizer *t, const char *s, size_t n) {
    return t->shash[shash_slot(t, s, n)];
}

static const merge_ent *merge_find(const ls_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t h = hash_pair(key) & t->mhash_mask;
    for (;;) {
        const merge_ent *e = &t->mhash[h];
        if (e->key == key) return e;
        if (e->key == UINT64_MAX) return NULL;
        h = (h + 1) & t->mhash_mask;
    }
}

/* ---- JSON field helpers (errors name file and field) -------------------------- */

static ls_status get_bool(const cJSON *o, const char *key, int dflt, int *out, const char *file,
                          const char *where) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it || cJSON_IsNull(it)) {
        *out = dflt;
        return LS_OK;
    }
    if (!cJSON_IsBool(it))
        return ls_err(LS_ERR_FORMAT, "%s: field \"%s.%s\" must be true or false", file, where, key);
    *out = cJSON_IsTrue(it);
    return LS_OK;
}

static const char *get_type(const cJSON *o) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(it) ? it->valuestring : NULL;
}

static int is_int_in(const cJSON *it, double lo, double hi) {
    /* Range first: casting a double outside int64_t's range (1e300) is undefined
     * behaviour (found by fuzz/fuzz_tokenizer; callers pass lo, hi within int64_t). */
    return cJSON_IsNumber(it) && it->valuedouble >= lo && it->valuedouble < hi &&
           it->valuedouble == (double)(int64_t)it->valuedouble;
}

/* ---- loading ----------------------------------------------------------------------- */

static ls_status check_normalizer(ls_tokenizer *t, const cJSON *n, const char *file) {
    if (!n || cJSON_IsNull(n)) return LS_OK;
    const char *ty = get_type(n);
    if (!cJSON_IsObject(n) || !ty)
        return ls_err(LS_ERR_FORMAT, "%s: field \"normalizer\" must be null or an object with a \"type\"", file);
    if (strcmp(ty, "NFC") == 0) {
        t->nfc = 1;
        return LS_OK;
    }
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        if (!cJSON_IsArray(arr))
            return ls_err(LS_ERR_FORMAT, "%s: field \"normalizer.normalizers\" must be an array", file);
        int i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, arr) {
            const char *et = get_type(e);
            if (!et || strcmp(et, "NFC") != 0)
                return ls_err(LS_ERR_UNSUPPORTED, "%s: field \"normalizer.normalizers[%d]\": type \"%s\" is not supported (only NFC)",
                              file, i, et ? et : "?");
            t->nfc = 1;
            i++;
        }
        return LS_OK;
    }
    return ls_err(LS_ERR_UNSUPPORTED, "%s: field \"normalizer\": type \"%s\" is not supported (null or NFC)", file, ty);
}

static ls_status check_byte_level(const cJSON *o, const char *file, const char *where) {
    int aps = 0, use_regex = 1;
    LS_TRY(get_bool(o, "add_prefix_space", 0, &aps, file, where));
    LS_TRY(get_bool(o, "use_regex", 1, &use_regex, file, where));
    if (aps)
        return ls_err(LS_ERR_UNSUPPORTED, "%s: field \"%s.add_prefix_space\" = true is not supported", file, where);
    if (use_regex)
        return ls_err(LS_ERR_UNSUPPORTED, "%s: field \"%s.use_regex\" must be false (the split comes from the Split pre-tokenizer)",
                      file, where);
    return LS_OK;
}

static ls_status check_pre_tokenizer(const cJSON *p, const char *file) {
    const char *ty = p ? get_type(p) : NULL;
    const cJSON *arr = p ? cJSON_GetObjectItemCaseSensitive(p, "pretokenizers") : NULL;
    if (!ty || strcmp(ty, "Sequence") != 0 || !cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != 2)
        return ls_err(LS_ERR_UNSUPPORTED,
                      "%s: field \"pre_tokenizer\" must be a Sequence of [Split (Qwen pattern), ByteLevel]", file);
    const cJSON *sp = cJSON_GetArrayItem(arr, 0), *bl = cJSON_GetArrayItem(arr, 1);
    const char *st = get_type(sp), *bt = get_type(bl);
    if (!st || strcmp(st, "Split") != 0)
        return ls_err(LS_ERR_UNSUPPORTED, "%s: field \"pre_tokenizer.pretokenizers[0]\" must be a Split", file);
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(sp, "pattern");
    const cJSON *re = pat ? cJSON_GetObjectItemCaseSensitive(pat, "Regex") : NULL;
    if (!cJSON_IsString(re) || strcmp(re->valuestring, QWEN_PATTERN) != 0)
        return ls_err(LS_ERR_UNSUPPORTED,
                      "%s: field \"pre_tokenizer.pretokenizers[0].pattern.Regex\" is not the Qwen split pattern "
                      "(the only one implemented)", file);
    const cJSON *beh = cJSON_GetObjectItemCaseSensitive(sp, "behavior");
    if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") != 0)
        return ls_err(LS_ERR_UNSUPPORTED, "%s: field \"pre_tokenizer.pretokenizers[0].behavior\" must be \"Isolated\"", file);
    int invert = 0;
    LS_TRY(get_bool(sp, "invert", 0, &invert, file, "pre_tokenizer.pretokenizers[0]"));
    if (invert)
        return ls_err(LS_ERR_UNSUPPORTED, "%s: field \"pre_tokenizer.pretokenizers[0].invert\" must be false", file);
    if (!bt || strcmp(bt, "ByteLevel") != 0)
        return ls_err(LS_ERR_UNSUPPORTED, "%s: field \"pre_tokenizer.pretokenizers[1]\" must be a ByteLevel", file);
    return check_byte_level(bl, file, "pre_tokenizer.pretokenizers[1]");
}

static ls_status check_model_options(ls_tokenizer *t, const cJSON *m, const char *file) {
    const char *ty = get_type(m);
    if (ty && strcmp(ty, "BPE") != 0)
        return ls_err(LS_ERR_UNSUPPORTED, "%s: field \"model.type\" = \"%s\" is not supported (BPE)", file, ty);
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(m, "dropout");
    if (d && !cJSON_IsNull(d) && !(cJSON_IsNumber(d) && d->valuedouble == 0.0))
        return ls_err(LS_ERR_UNSUPPORTED, "%s: field \"model.dropout\" must be null (BPE dropout is not supported)", file);
    const char *empty_keys[2] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(m, empty_keys[i]);
        if (s && !cJSON_IsNull(s) && !(cJSON_IsString(s) && s->valuestring[0] == 0))
            return ls_err(LS_ERR_UNSUPPORTED, "%s: field \"model.%s\" must be null or \"\"", file, empty_keys[i]);
    }
    int bf = 0;
    LS_TRY(get_bool(m, "byte_fallback", 0, &bf, file, "model"));
    if (bf) return ls_err(LS_ERR_UNSUPPORTED, "%s: field \"model.byte_fallback\" = true is not supported", file);
    LS_TRY(get_bool(m, "ignore_merges", 0, &t->ignore_merges, file, "model"));
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(m, "unk_token");
    if (unk && !cJSON_IsNull(unk) && !cJSON_IsString(unk))
        return ls_err(LS_ERR_FORMAT, "%s: field \"model.unk_token\" must be a string or null", file);
    return LS_OK;
}

/* Merges: "a b" strings or ["a", "b"] pairs; rank = position. */
static ls_status load_merges(ls_tokenizer *t, const cJSON *merges, const char *file) {
    if (!cJSON_IsArray(merges))
        return ls_err(LS_ERR_FORMAT, "%s: field \"model.merges\" must be an array", file);
    int64_t n = cJSON_GetArraySize(merges);
    if (n >= INT32_MAX) return ls_err(LS_ERR_FORMAT, "%s: field \"model.merges\" has too many entries", file);
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2) cap *= 2;
    size_t bytes;
    if (ls_mul_size((size_t)cap, sizeof(merge_ent), &bytes) || !(t->mhash = malloc(bytes)))
        return ls_err(LS_ERR_NOMEM, "%s: out of memory for %lld merges", file, (long long)n);
    for (uint64_t i = 0; i < cap; i++) t->mhash[i].key = UINT64_MAX;
    t->mhash_mask = cap - 1;
    char *cat = NULL;
    size_t cat_cap = 0;
    int64_t rank = 0;
    ls_status st = LS_OK;
    const cJSON *e;
    cJSON_ArrayForEach(e, merges) {
        const char *a, *b;
        size_t la, lb;
        if (cJSON_IsString(e)) {
            a = e->valuestring;
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                st = ls_err(LS_ERR_FORMAT, "%s: field \"model.merges[%lld]\" = \"%.60s\" must be two tokens separated by one space",
                            file, (long long)rank, a);
                break;
            }
            la = (size_t)(sp - a);
            b = sp + 1;
            lb = strlen(b);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
            a = cJSON_GetArrayItem(e, 0)->valuestring;
            b = cJSON_GetArrayItem(e, 1)->valuestring;
            la = strlen(a);
            lb = strlen(b);
        } else {
            st = ls_err(LS_ERR_FORMAT, "%s: field \"model.merges[%lld]\" must be a string \"a b\" or a pair [\"a\", \"b\"]",
                        file, (long long)rank);
            break;
        }
        int32_t ia = lookup(t, a, la), ib = lookup(t, b, lb);
        if (la + lb + 1 > cat_cap) {
            size_t nc = (la + lb + 1) * 2;
            char *p = realloc(cat, nc);
            if (!p) {
                st = ls_err(LS_ERR_NOMEM, "%s: out of memory reading merges", file);
                break;
            }
            cat = p;
            cat_cap = nc;
        }
        memcpy(cat, a, la);
        memcpy(cat + la, b, lb);
        int32_t im = lookup(t, cat, la + lb);
        if (ia < 0 || ib < 0 || im < 0) {
            const char *miss = ia < 0 ? a : ib < 0 ? b : NULL;
            int ml = (int)(ia < 0 ? la : ib < 0 ? lb : la + lb);
            if (!miss) miss = cat;
            st = ls_err(LS_ERR_FORMAT, "%s: field \"model.merges[%lld]\": token \"%.*s\" is not in model.vocab", file,
                        (long long)rank, ml > 60 ? 60 : ml, miss);
            break;
        }
        uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
        uint64_t h = hash_pair(key) & t->mhash_mask;
        while (t->mhash[h].key != UINT64_MAX && t->mhash[h].key != key) h = (h + 1) & t->mhash_mask;
        /* a repeated pair takes the later rank, as HF's merge map (collected into a HashMap) */
        t->mhash[h] = (merge_ent){key, (int32_t)rank, im};
        rank++;
    }
    free(cat);
    return st;
}

typedef struct {
    int32_t id;
    const char *content;
    int single_word, lstrip, rstrip, normalized, special;
} added_json;

static ls_status parse_added(const cJSON *arr, added_json **out, int *n_out, int64_t *max_id, const char *file) {
    *out = NULL;
    *n_out = 0;
    if (!arr || cJSON_IsNull(arr)) return LS_OK;
    if (!cJSON_IsArray(arr)) return ls_err(LS_ERR_FORMAT, "%s: field \"added_tokens\" must be an array", file);
    int n = cJSON_GetArraySize(arr);
    added_json *v = calloc((size_t)(n ? n : 1), sizeof *v);
    if (!v) return ls_err(LS_ERR_NOMEM, "%s: out of memory for added_tokens", file);
    int i = 0;
    const cJSON *e;
    char where[64];
    cJSON_ArrayForEach(e, arr) {
        snprintf(where, sizeof where, "added_tokens[%d]", i);
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        ls_status st = LS_OK;
        if (!cJSON_IsObject(e))
            st = ls_err(LS_ERR_FORMAT, "%s: field \"%s\" must be an object", file, where);
        else if (!is_int_in(id, 0, LS_TOK_MAX_ID))
            st = ls_err(LS_ERR_FORMAT, "%s: field \"%s.id\" must be an integer in [0, %d)", file, where, LS_TOK_MAX_ID);
        else if (!cJSON_IsString(c) || !c->valuestring[0])
            st = ls_err(LS_ERR_FORMAT, "%s: field \"%s.content\" must be a non-empty string", file, where);
        if (st == LS_OK) {
            v[i].id = (int32_t)id->valuedouble;
            v[i].content = c->valuestring;
            if ((st = get_bool(e, "single_word", 0, &v[i].single_word, file, where)) == LS_OK &&
                (st = get_bool(e, "lstrip", 0, &v[i].lstrip, file, where)) == LS_OK &&
                (st = get_bool(e, "rstrip", 0, &v[i].rstrip, file, where)) == LS_OK &&
                (st = get_bool(e, "special", 0, &v[i].special, file, where)) == LS_OK)
                st = get_bool(e, "normalized", !v[i].special, &v[i].normalized, file, where);
        }
        if (st != LS_OK) {
            free(v);
            return st;
        }
        if (v[i].id + 1 > *max_id) *max_id = v[i].id + 1;
        i++;
    }
    *out = v;
    *n_out = n;
    return LS_OK;
}

static ls_status add_to_set(ls_tokenizer *t, added_set *set, const added_json *a, const char *text, size_t len) {
    added_tok *nv = realloc(set->v, (size_t)(set->n + 1) * sizeof *nv);
    if (!nv) return ls_err(LS_ERR_NOMEM, "out of memory for added tokens");
    set->v = nv;
    added_tok *d = &set->v[set->n++];
    d->id = a->id;
    d->len = (uint32_t)len;
    d->single_word = (uint8_t)a->single_word;
    d->lstrip = (uint8_t)a->lstrip;
    d->rstrip = (uint8_t)a->rstrip;
    LS_TRY(pool_add(t, text, len, &d->off));
    set->first[(unsigned char)text[0]] = 1;
    return LS_OK;
}

static int cmp_added_len_desc(const void *x, const void *y) {
    const added_tok *a = x, *b = y;
    return a->len != b->len ? (a->len < b->len ? 1 : -1) : (a->id > b->id) - (a->id < b->id);
}

static ls_status load_tables(ls_tokenizer *t, const cJSON *root, const char *file) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) return ls_err(LS_ERR_FORMAT, "%s: missing object field \"model\"", file);
    LS_TRY(check_model_options(t, model, file));
    LS_TRY(check_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), file));
    LS_TRY(check_pre_tokenizer(cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), file));
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if (dec && !cJSON_IsNull(dec)) {
        const char *dt = get_type(dec);
        if (!dt || strcmp(dt, "ByteLevel") != 0)
            return ls_err(LS_ERR_UNSUPPORTED, "%s: field \"decoder\" must be null or ByteLevel", file);
    }
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab)) return ls_err(LS_ERR_FORMAT, "%s: field \"model.vocab\" must be an object", file);

    /* sizes first: largest id over vocab and added tokens */
    int64_t n_vocab = 0, max_id = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        if (!is_int_in(e, 0, LS_TOK_MAX_ID))
            return ls_err(LS_ERR_FORMAT, "%s: field \"model.vocab[\"%.60s\"]\" must be an integer id in [0, %d)", file,
                          e->string, LS_TOK_MAX_ID);
        if ((int64_t)e->valuedouble + 1 > max_id) max_id = (int64_t)e->valuedouble + 1;
        n_vocab++;
    }
    if (n_vocab == 0) return ls_err(LS_ERR_FORMAT, "%s: field \"model.vocab\" is empty", file);
    added_json *added = NULL;
    int n_added = 0;
    LS_TRY(parse_added(cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), &added, &n_added, &max_id, file));
    /* tables are indexed by id: a few tokens with one huge id would cost gigabytes */
    if (max_id > 2 * (n_vocab + n_added) + 65536) {
        free(added);
        return ls_err(LS_ERR_FORMAT, "%s: the largest token id is %lld but there are only %lld tokens: ids this sparse "
                                     "are not a tokenizer this loader accepts", file, (long long)max_id - 1,
                      (long long)(n_vocab + n_added));
    }
    ls_status st = LS_OK;
    t->n_ids = max_id;
    size_t n = (size_t)max_id;
    t->str_off = malloc(n * sizeof(uint32_t));
    t->str_len = malloc(n * sizeof(uint32_t));
    t->dec_off = malloc(n * sizeof(uint32_t));
    t->dec_len = malloc(n * sizeof(uint32_t));
    t->flags = calloc(n, 1);
    uint64_t cap = 16;
    while (cap < (uint64_t)(n_vocab + n_added) * 2) cap *= 2;
    t->shash = malloc((size_t)cap * sizeof(int32_t));
    t->shash_mask = cap - 1;
    if (!t->str_off || !t->str_len || !t->dec_off || !t->dec_len || !t->flags || !t->shash) {
        free(added);
        return ls_err(LS_ERR_NOMEM, "%s: out of memory for a vocabulary of %lld ids", file, (long long)max_id);
    }
    memset(t->shash, 0xff, (size_t)cap * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) t->str_len[i] = t->dec_len[i] = LS_TOK_ABSENT;

    for (int i = 0; i < 256 + 68; i++) t->cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) t->cp_byte[byte_to_cp(b)] = (int16_t)b;
    /* vocab: spelling and decoded bytes (HF ByteLevel decoder: a token with a character
       outside the byte alphabet decodes to its own UTF-8) */
    char *tmp = NULL;
    cJSON_ArrayForEach(e, vocab) {
        int32_t id = (int32_t)e->valuedouble;
        const char *s = e->string;
        size_t len = strlen(s);
        if (t->flags[id] & F_PRESENT) {
            st = ls_err(LS_ERR_FORMAT, "%s: field \"model.vocab[\"%.60s\"]\": id %d is also used by \"%.60s\"", file, s,
                        id, t->pool + t->str_off[id]);
            break;
        }
        uint64_t slot = shash_slot(t, s, len);
        if (t->shash[slot] >= 0) {
            st = ls_err(LS_ERR_FORMAT, "%s: field \"model.vocab\": token \"%.60s\" appears twice", file, s);
            break;
        }
        if ((st = pool_add(t, s, len, &t->str_off[id])) != LS_OK) break;
        t->str_len[id] = (uint32_t)len;
        t->flags[id] = F_PRESENT;
        t->shash[slot] = id;
        char *ntmp = realloc(tmp, len + 1);
        if (!ntmp) {
            st = ls_err(LS_ERR_NOMEM, "%s: out of memory", file);
            break;
        }
        tmp = ntmp;
        size_t w = 0, i = 0;
        int all = 1;
        while (i < len) {
            uint32_t cp;
            int k = ls_tok_utf8_decode((const unsigned char *)s + i, len - i, &cp);
            int b = k && cp < 256 + 68 ? t->cp_byte[cp] : -1;
            if (b < 0) {
                all = 0;
                break;
            }
            tmp[w++] = (char)b;
            i += (size_t)k;
        }
        if (all) {
            st = pool_add(t, tmp, w, &t->dec_off[id]);
            t->dec_len[id] = (uint32_t)w;
        } else {
            t->dec_off[id] = t->str_off[id];
            t->dec_len[id] = (uint32_t)len;
        }
        if (st != LS_OK) break;
    }
    free(tmp);
    /* the 256 byte symbols */
    for (int b = 0; b < 256 && st == LS_OK; b++) {
        t->byte_sym_len[b] = (uint8_t)put_utf8_2(t->byte_sym[b], byte_to_cp(b));
        t->byte_id[b] = lookup(t, t->byte_sym[b], t->byte_sym_len[b]);
        if (t->byte_id[b] < 0)
            st = ls_err(LS_ERR_FORMAT, "%s: field \"model.vocab\" lacks the byte-level symbol \"%.*s\" of byte 0x%02X", file,
                        (int)t->byte_sym_len[b], t->byte_sym[b], b);
    }
    /* merges see the model vocab only (as HF's BPE builder) */
    if (st == LS_OK) st = load_merges(t, cJSON_GetObjectItemCaseSensitive(model, "merges"), file);
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (st == LS_OK && cJSON_IsString(unk) && lookup(t, unk->valuestring, strlen(unk->valuestring)) < 0)
        st = ls_err(LS_ERR_FORMAT, "%s: field \"model.unk_token\" = \"%.60s\" is not in model.vocab", file, unk->valuestring);
    /* added tokens */
    for (int i = 0; i < n_added && st == LS_OK; i++) {
        const added_json *a = &added[i];
        size_t len = strlen(a->content);
        uint64_t slot = shash_slot(t, a->content, len);
        int32_t have = t->shash[slot];
        if (have >= 0 && have != a->id) {
            st = ls_err(LS_ERR_FORMAT, "%s: field \"added_tokens[%d]\": \"%.60s\" has id %d but is token %d already", file,
                        i, a->content, a->id, have);
            break;
        }
        if (have < 0 && (t->flags[a->id] & F_PRESENT)) {
            st = ls_err(LS_ERR_FORMAT, "%s: field \"added_tokens[%d].id\" = %d is already the token \"%.60s\"", file, i,
                        a->id, t->pool + t->str_off[a->id]);
            break;
        }
        if (have < 0) {
            if ((st = pool_add(t, a->content, len, &t->str_off[a->id])) != LS_OK) break;
            t->str_len[a->id] = (uint32_t)len;
            t->shash[slot] = a->id;
        }
        if (t->flags[a->id] & F_ADDED) continue; /* listed twice: HF ignores the repeat */
        t->flags[a->id] |= F_PRESENT | F_ADDED | (a->special ? F_SPECIAL : 0);
        t->dec_off[a->id] = t->str_off[a->id]; /* added tokens decode to their content */
        t->dec_len[a->id] = (uint32_t)len;
        if (a->normalized && t->nfc) {
            char *nf;
            size_t nl;
            if ((st = ls_tok_nfc(a->content, len, &nf, &nl)) != LS_OK) {
                st = ls_err_ctx(st, "%s: field \"added_tokens[%d].content\"", file, i);
                break;
            }
            st = nl ? add_to_set(t, &t->norm, a, nf, nl) : LS_OK;
            free(nf);
        } else {
            st = add_to_set(t, a->normalized ? &t->norm : &t->raw, a, a->content, len);
        }
    }
    free(added);
    if (st != LS_OK) return st;
    if (t->raw.n) qsort(t->raw.v, (size_t)t->raw.n, sizeof(added_tok), cmp_added_len_desc);
    if (t->norm.n) qsort(t->norm.v, (size_t)t->norm.n, sizeof(added_tok), cmp_added_len_desc);
    return LS_OK;
}

ls_status ls_tok_load_json(ls_tokenizer **out, const char *json, size_t len, const char *name) {
    *out = NULL;
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) {
        const char *ep = cJSON_GetErrorPtr();
        long long off = ep && ep >= json && ep <= json + len ? (long long)(ep - json) : -1;
        return ls_err(LS_ERR_FORMAT, "%s: not valid JSON (near byte %lld)", name, off);
    }
    ls_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        cJSON_Delete(root);
        return ls_err(LS_ERR_NOMEM, "%s: out of memory", name);
    }
    ls_status st = cJSON_IsObject(root) ? load_tables(t, root, name)
                                        : ls_err(LS_ERR_FORMAT, "%s: top level must be a JSON object", name);
    cJSON_Delete(root);
    if (st != LS_OK) {
        ls_tok_free(t);
        return st;
    }
    *out = t;
    return LS_OK;
}

ls_status ls_tok_load(ls_tokenizer **out, const char *path) {
    char *text;
    size_t len;
    *out = NULL;
    LS_TRY(ls_read_file(path, &text, &len));
    ls_status st = ls_tok_load_json(out, text, len, path);
    free(text);
    return st;
}

void ls_tok_free(ls_tokenizer *t) {
    if (!t) return;
    free(t->str_off);
    free(t->str_len);
    free(t->dec_off);
    free(t->dec_len);
    free(t->flags);
    free(t->pool);
    free(t->shash);
    free(t->mhash);
    free(t->raw.v);
    free(t->norm.v);
    free(t);
}

int64_t ls_tok_vocab_size(const ls_tokenizer *t) { return t->n_ids; }

int32_t ls_tok_token_id(const ls_tokenizer *t, const char *token) {
    return lookup(t, token, strlen(token));
}

int ls_tok_is_special(const ls_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && (t->flags[id] & F_SPECIAL);
}

/* ---- encode ------------------------------------------------------------------------ */

enum { C_L = 1, C_N = 2, C_S = 4, C_RN = 8 }; /* \p{L}, \p{N}, \s, [\r\n] */

typedef struct { int32_t id, prev, next; } bpe_sym;
typedef struct { int32_t rank, pos, left, right, new_id; } bpe_merge;

typedef struct {
    const ls_tokenizer *t;
    int32_t *ids;
    int64_t n, cap;
    char *norm; /* NFC'd text of the current piece */
    size_t norm_cap;
    uint32_t *cps; /* (ncp) code points of the current piece, then their classes and offsets */
    uint8_t *cls;
    int64_t *off; /* (ncp + 1) byte offsets */
    int64_t cp_cap;
    bpe_sym *sym; /* (len) symbols of the current pre-token */
    bpe_merge *heap; /* (2 len) candidate merges */
    int64_t sym_cap, heap_cap;
    char *spell; /* byte-alphabet spelling of a pre-token (ignore_merges) */
    size_t spell_cap;
} enc_ctx;

static ls_status grow(void **p, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return LS_OK;
    int64_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    size_t bytes;
    if (ls_mul_size((size_t)c, elem, &bytes)) return ls_err(LS_ERR_NOMEM, "encode: size overflow");
    void *q = realloc(*p, bytes);
    if (!q) return ls_err(LS_ERR_NOMEM, "encode: out of memory (%zu bytes)", bytes);
    *p = q;
    *cap = c;
    return LS_OK;
}

static ls_status emit(enc_ctx *c, int32_t id) {
    if (c->n == c->cap) LS_TRY(grow((void **)&c->ids, &c->cap, c->n + 1, sizeof(int32_t)));
    c->ids[c->n++] = id;
    return LS_OK;
}

static int heap_less(const bpe_merge *a, const bpe_merge *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(bpe_merge *h, int64_t *n, bpe_merge m) {
    int64_t i = (*n)++;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!heap_less(&m, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = m;
}

static bpe_merge heap_pop(bpe_merge *h, int64_t *n) {
    bpe_merge top = h[0], last = h[--(*n)];
    int64_t i = 0;
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        const bpe_merge *best = &last;
        if (l < *n && heap_less(&h[l], best)) m = l, best = &h[l];
        if (r < *n && heap_less(&h[r], best)) m = r;
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static void try_pair(const ls_tokenizer *t, const bpe_sym *s, int32_t pos, bpe_merge *h, int64_t *nh) {
    int32_t q = s[pos].next;
    if (q < 0) return;
    const merge_ent *m = merge_find(t, s[pos].id, s[q].id);
    if (m) heap_push(h, nh, (bpe_merge){m->rank, pos, s[pos].id, s[q].id, m->new_id});
}

/* BPE of one pre-token (its raw bytes); ids appended to c. */
static ls_status bpe(enc_ctx *c, const unsigned char *b, int64_t len) {
    const ls_tokenizer *t = c->t;
    if (len == 1) return emit(c, t->byte_id[b[0]]);
    if (len >= INT32_MAX) return ls_err(LS_ERR_ARG, "encode: a pre-token of %lld bytes is too long", (long long)len);
    if (t->ignore_merges) {
        int64_t need = 2 * len + 1, cap = (int64_t)c->spell_cap;
        LS_TRY(grow((void **)&c->spell, &cap, need, 1));
        c->spell_cap = (size_t)cap;
        size_t w = 0;
        for (int64_t i = 0; i < len; i++) {
            memcpy(c->spell + w, t->byte_sym[b[i]], t->byte_sym_len[b[i]]);
            w += t->byte_sym_len[b[i]];
        }
        int32_t id = lookup(t, c->spell, w);
        if (id >= 0) return emit(c, id);
    }
    LS_TRY(grow((void **)&c->sym, &c->sym_cap, len, sizeof(bpe_sym)));
    LS_TRY(grow((void **)&c->heap, &c->heap_cap, 2 * len, sizeof(bpe_merge)));
    bpe_sym *s = c->sym;
    bpe_merge *h = c->heap;
    for (int64_t i = 0; i < len; i++)
        s[i] = (bpe_sym){t->byte_id[b[i]], (int32_t)i - 1, i + 1 < len ? (int32_t)i + 1 : -1};
    int64_t nh = 0;
    for (int32_t i = 0; i + 1 < len; i++) try_pair(t, s, i, h, &nh);
    /* len-1 initial pairs; each merge pops one entry and pushes <= 2, and there are at
       most len-1 merges: the heap never exceeds 2 len entries. */
    while (nh > 0) {
        bpe_merge m = heap_pop(h, &nh);
        int32_t q = s[m.pos].next;
        if (s[m.pos].id != m.left || q < 0 || s[q].id != m.right) continue; /* stale */
        s[m.pos].id = m.new_id;
        s[m.pos].next = s[q].next;
        if (s[q].next >= 0) s[s[q].next].prev = m.pos;
        s[q].id = -1;
        if (s[m.pos].prev >= 0) try_pair(t, s, s[m.pos].prev, h, &nh);
        try_pair(t, s, m.pos, h, &nh);
    }
    for (int32_t i = 0; i >= 0; i = s[i].next) LS_TRY(emit(c, s[i].id));
    return LS_OK;
}

/* ASCII-only simple case fold, plus U+017F LATIN SMALL LETTER LONG S -> 's' (what
   (?i) does under Unicode simple case folding for the letters of the contractions). */
static uint32_t fold(uint32_t cp) {
    if (cp >= 'A' && cp <= 'Z') return cp + 32;
    return cp == 0x17F ? 's' : cp;
}

/* End (exclusive) of the Qwen-pattern match starting at i (< n); every position matches. */
static int64_t match_qwen(const uint32_t *cp, const uint8_t *cl, int64_t i, int64_t n) {
    /* (?i:'s|'t|'re|'ve|'m|'ll|'d) */
    if (cp[i] == '\'' && i + 1 < n) {
        uint32_t a = fold(cp[i + 1]);
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if (i + 2 < n) {
            uint32_t b = fold(cp[i + 2]);
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
        }
    }
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    int64_t j = i;
    if (!(cl[i] & (C_L | C_N | C_RN)) && i + 1 < n && (cl[i + 1] & C_L)) j = i + 1;
    if (cl[j] & C_L) {
        while (j < n && (cl[j] & C_L)) j++;
        return j;
    }
    /* \p{N} */
    if (cl[i] & C_N) return i + 1;
    /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
    j = (cp[i] == ' ' && i + 1 < n && !(cl[i + 1] & (C_S | C_L | C_N))) ? i + 1 : i;
    if (!(cl[j] & (C_S | C_L | C_N))) {
        while (j < n && !(cl[j] & (C_S | C_L | C_N))) j++;
        while (j < n && (cl[j] & C_RN)) j++;
        return j;
    }
    /* cp[i] is whitespace from here on; e = end of the whitespace run */
    int64_t e = i;
    while (e < n && (cl[e] & C_S)) e++;
    /* \s*[\r\n]+ : \s* backs off to the last [\r\n] of the run, which ends the match */
    for (int64_t k = e - 1; k >= i; k--)
        if (cl[k] & C_RN) return k + 1;
    /* \s+(?!\S) : the whole run at the end of text, else all but its last character */
    if (e == n) return e;
    if (e - i >= 2) return e - 1;
    /* \s+ */
    return e;
}

/* Pre-tokenize valid UTF-8 s[0..len) and BPE each pre-token. */
static ls_status pretok_bpe(enc_ctx *c, const char *s, size_t len) {
    if (len == 0) return LS_OK;
    int64_t cap = c->cp_cap;
    LS_TRY(grow((void **)&c->cps, &cap, (int64_t)len + 1, sizeof(uint32_t)));
    cap = c->cp_cap;
    LS_TRY(grow((void **)&c->cls, &cap, (int64_t)len + 1, 1));
    LS_TRY(grow((void **)&c->off, &c->cp_cap, (int64_t)len + 1, sizeof(int64_t)));
    int64_t n = 0;
    for (size_t i = 0; i < len; n++) {
        uint32_t cp;
        int k = ls_tok_utf8_decode((const unsigned char *)s + i, len - i, &cp);
        LS_ASSERT(k > 0, "text was validated as UTF-8");
        uint8_t f = 0;
        if (ls_tok_uni_is_letter(cp)) f = C_L;
        else if (ls_tok_uni_is_number(cp)) f = C_N;
        else if (ls_tok_uni_is_space(cp)) f = (uint8_t)(C_S | (cp == '\r' || cp == '\n' ? C_RN : 0));
        c->cps[n] = cp;
        c->cls[n] = f;
        c->off[n] = (int64_t)i;
        i += (size_t)k;
    }
    c->off[n] = (int64_t)len;
    for (int64_t i = 0; i < n;) {
        int64_t e = match_qwen(c->cps, c->cls, i, n);
        LS_TRY(bpe(c, (const unsigned char *)s + c->off[i], c->off[e] - c->off[i]));
        i = e;
    }
    return LS_OK;
}

/* Last code point before s+pos (valid UTF-8), its start in *start. */
static uint32_t cp_before(const char *s, size_t pos, size_t *start) {
    size_t k = pos - 1;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
    uint32_t cp = 0;
    ls_tok_utf8_decode((const unsigned char *)s + k, pos - k, &cp);
    *start = k;
    return cp;
}

/* Approximates regex \w (Alphabetic, marks, Nd, Pc) by letters, numbers, marks, '_'. */
static int is_word_cp(uint32_t cp) {
    return ls_tok_uni_is_letter(cp) || ls_tok_uni_is_number(cp) || cp == '_' || ls_tok_uni_ccc(cp) > 0;
}

static ls_status process_piece(enc_ctx *c, const char *s, size_t len);

/* Cut the added tokens of `set` out of s (HF AddedVocabulary::find_matches); pieces between
   them go on to the next stage (normalize, or pre-tokenize). */
static ls_status split_added(enc_ctx *c, const added_set *set, const char *s, size_t len, int raw_stage) {
    const ls_tokenizer *t = c->t;
    size_t start_offset = 0, pos = 0;
    while (pos < len) {
        if (!set->first[(unsigned char)s[pos]]) {
            pos++;
            continue;
        }
        const added_tok *hit = NULL;
        for (int k = 0; k < set->n; k++) {
            const added_tok *a = &set->v[k];
            if (a->len <= len - pos && memcmp(s + pos, t->pool + a->off, a->len) == 0) {
                hit = a; /* sorted longest first: the first hit is the longest */
                break;
            }
        }
        if (!hit) {
            pos++;
            continue;
        }
        size_t start = pos, stop = pos + hit->len, b;
        pos = stop; /* the scan resumes after the match, kept or not (Aho-Corasick iter) */
        if (hit->single_word) {
            uint32_t after = 0;
            if (stop < len) ls_tok_utf8_decode((const unsigned char *)s + stop, len - stop, &after);
            if ((start > 0 && is_word_cp(cp_before(s, start, &b))) || (stop < len && is_word_cp(after))) continue;
        }
        if (hit->lstrip) {
            size_t ns = start;
            while (ns > 0 && ls_tok_uni_is_space(cp_before(s, ns, &b))) ns = b;
            start = ns > start_offset ? ns : start_offset;
        }
        if (hit->rstrip) {
            uint32_t cp;
            int k;
            while (stop < len && (k = ls_tok_utf8_decode((const unsigned char *)s + stop, len - stop, &cp)) > 0 &&
                   ls_tok_uni_is_space(cp))
                stop += (size_t)k;
        }
        if (start_offset < start) {
            if (raw_stage) LS_TRY(process_piece(c, s + start_offset, start - start_offset));
            else LS_TRY(pretok_bpe(c, s + start_offset, start - start_offset));
        }
        LS_TRY(emit(c, hit->id));
        start_offset = stop;
    }
    if (start_offset < len) {
        if (raw_stage) return process_piece(c, s + start_offset, len - start_offset);
        return pretok_bpe(c, s + start_offset, len - start_offset);
    }
    return LS_OK;
}

/* A piece of raw text between non-normalized added tokens: normalize, then cut the
   normalized added tokens out of it, then pre-tokenize. */
static ls_status process_piece(enc_ctx *c, const char *s, size_t len) {
    const ls_tokenizer *t = c->t;
    const char *text = s;
    size_t tlen = len;
    if (t->nfc) {
        /* U+0300 is the first code point NFC can change; its UTF-8 lead byte is 0xCC */
        int simple = 1;
        for (size_t i = 0; i < len && simple; i++) simple = (unsigned char)s[i] < 0xCC;
        if (!simple) {
            char *nf;
            LS_TRY(ls_tok_nfc(s, len, &nf, &tlen));
            int64_t cap = (int64_t)c->norm_cap;
            ls_status st = grow((void **)&c->norm, &cap, (int64_t)tlen + 1, 1);
            if (st == LS_OK) memcpy(c->norm, nf, tlen);
            free(nf);
            LS_TRY(st);
            c->norm_cap = (size_t)cap;
            text = c->norm;
        }
    }
    if (t->norm.n) {
        if (text == c->norm) {
            /* split_added may normalize later pieces into c->norm: work on a copy */
            char *copy = malloc(tlen + 1);
            if (!copy) return ls_err(LS_ERR_NOMEM, "encode: out of memory");
            memcpy(copy, text, tlen);
            ls_status st = split_added(c, &t->norm, copy, tlen, 0);
            free(copy);
            return st;
        }
        return split_added(c, &t->norm, text, tlen, 0);
    }
    return pretok_bpe(c, text, tlen);
}

ls_status ls_tok_encode(const ls_tokenizer *t, const char *utf8, size_t len, int32_t **ids, int64_t *n) {
    *ids = NULL;
    *n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        if ((unsigned char)utf8[i] < 0x80) {
            i++;
            continue;
        }
        int k = ls_tok_utf8_decode((const unsigned char *)utf8 + i, len - i, &cp);
        if (!k) return ls_err(LS_ERR_ARG, "encode: invalid UTF-8 at byte %zu of %zu", i, len);
        i += (size_t)k;
    }
    enc_ctx c = {.t = t};
    ls_status st = t->raw.n ? split_added(&c, &t->raw, utf8, len, 1) : process_piece(&c, utf8, len);
    free(c.norm);
    free(c.cps);
    free(c.cls);
    free(c.off);
    free(c.sym);
    free(c.heap);
    free(c.spell);
    if (st != LS_OK) {
        free(c.ids);
        return st;
    }
    *ids = c.ids;
    *n = c.n;
    return LS_OK;
}

/* ---- decode ------------------------------------------------------------------------ */

ls_status ls_tok_decode(const ls_tokenizer *t, const int32_t *ids, int64_t n, char **utf8, size_t *len) {
    *utf8 = NULL;
    *len = 0;
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || !(t->flags[id] & F_PRESENT))
            return ls_err(LS_ERR_ARG, "decode: ids[%lld] = %d is not a token id (vocabulary size %lld)", (long long)i, id,
                          (long long)t->n_ids);
        total += t->dec_len[id];
    }
    char *out = malloc(total + 1);
    if (!out) return ls_err(LS_ERR_NOMEM, "decode: out of memory for %zu bytes", total);
    size_t w = 0;
    for (int64_t i = 0; i < n; i++) {
        memcpy(out + w, t->pool + t->dec_off[ids[i]], t->dec_len[ids[i]]);
        w += t->dec_len[ids[i]];
    }
    out[w] = 0;
    *utf8 = out;
    *len = w;
    return LS_OK;
}

/* ---- a byte-level tokenizer without merges --------------------------------------- */

ls_status ls_tok_byte_level_json(char **json) {
    cJSON *root = cJSON_CreateObject(), *vocab = cJSON_CreateObject();
    cJSON *model = cJSON_CreateObject(), *pre = cJSON_CreateObject(), *seq = cJSON_CreateArray();
    cJSON *split = cJSON_CreateObject(), *pat = cJSON_CreateObject(), *bl = cJSON_CreateObject();
    cJSON *added = cJSON_CreateArray(), *eos = cJSON_CreateObject(), *dec = cJSON_CreateObject();
    int ok = root && vocab && model && pre && seq && split && pat && bl && added && eos && dec;
    for (int b = 0; ok && b < 256; b++) {
        char sym[8];
        size_t n = put_utf8_2(sym, byte_to_cp(b));
        sym[n] = 0;
        ok = cJSON_AddNumberToObject(vocab, sym, b) != NULL;
    }
    ok = ok && cJSON_AddStringToObject(model, "type", "BPE") && cJSON_AddNullToObject(model, "dropout") &&
         cJSON_AddFalseToObject(model, "ignore_merges") && cJSON_AddFalseToObject(model, "byte_fallback");
    if (ok) cJSON_AddItemToObject(model, "vocab", vocab), vocab = NULL;
    ok = ok && cJSON_AddArrayToObject(model, "merges");
    ok = ok && cJSON_AddStringToObject(pat, "Regex", QWEN_PATTERN) && cJSON_AddStringToObject(split, "type", "Split") &&
         cJSON_AddStringToObject(split, "behavior", "Isolated") && cJSON_AddFalseToObject(split, "invert");
    if (ok) cJSON_AddItemToObject(split, "pattern", pat), pat = NULL;
    ok = ok && cJSON_AddStringToObject(bl, "type", "ByteLevel") && cJSON_AddFalseToObject(bl, "add_prefix_space") &&
         cJSON_AddFalseToObject(bl, "use_regex");
    if (ok) cJSON_AddItemToArray(seq, split), cJSON_AddItemToArray(seq, bl), split = bl = NULL;
    ok = ok && cJSON_AddStringToObject(pre, "type", "Sequence");
    if (ok) cJSON_AddItemToObject(pre, "pretokenizers", seq), seq = NULL;
    ok = ok && cJSON_AddNumberToObject(eos, "id", 256) && cJSON_AddStringToObject(eos, "content", "<|endoftext|>") &&
         cJSON_AddFalseToObject(eos, "single_word") && cJSON_AddFalseToObject(eos, "lstrip") &&
         cJSON_AddFalseToObject(eos, "rstrip") && cJSON_AddFalseToObject(eos, "normalized") &&
         cJSON_AddTrueToObject(eos, "special");
    if (ok) cJSON_AddItemToArray(added, eos), eos = NULL;
    ok = ok && cJSON_AddStringToObject(dec, "type", "ByteLevel");
    ok = ok && cJSON_AddStringToObject(root, "version", "1.0") && cJSON_AddNullToObject(root, "normalizer");
    if (ok) {
        cJSON_AddItemToObject(root, "pre_tokenizer", pre);
        cJSON_AddItemToObject(root, "model", model);
        cJSON_AddItemToObject(root, "added_tokens", added);
        cJSON_AddItemToObject(root, "decoder", dec);
        pre = model = added = dec = NULL;
    }
    *json = ok ? cJSON_Print(root) : NULL;
    cJSON *left[] = {root, vocab, model, pre, seq, split, pat, bl, added, eos, dec};
    for (size_t i = 0; i < sizeof left / sizeof left[0]; i++) cJSON_Delete(left[i]);
    return *json ? LS_OK : ls_err(LS_ERR_NOMEM, "cannot build the byte-level tokenizer");
}

ls_status ls_tok_load_for_model(ls_tokenizer **out, const char *path, int64_t vocab) {
    *out = NULL;
    if (path) {
        LS_TRY(ls_tok_load(out, path));
    } else {
        char *json;
        LS_TRY(ls_tok_byte_level_json(&json));
        ls_status s = ls_tok_load_json(out, json, strlen(json), "(built-in byte-level tokenizer)");
        free(json);
        LS_TRY(s);
    }
    if (vocab <= 0 || ls_tok_vocab_size(*out) <= vocab) return LS_OK;
    ls_status s = ls_err(LS_ERR_ARG, "%s: the tokenizer has %lld ids but the model's vocab_size is %lld",
                         path ? path : "(built-in tokenizer)", (long long)ls_tok_vocab_size(*out), (long long)vocab);
    ls_tok_free(*out);
    *out = NULL;
    return s;
}
