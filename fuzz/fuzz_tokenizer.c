/*
 * fuzz_tokenizer.c — libFuzzer harness for the tokenizer.json reader and for
 * encode/decode. The first input byte picks the mode (mod 3), the rest is the payload:
 *   0  ls_tok_load_json(payload); when it loads, encode + decode a fixed text with it.
 *   1  ls_tok_encode(payload) with a small fixed tokenizer built at start-up (byte
 *      alphabet, a few merges, NFC, non-stripping added tokens); oracles: invalid
 *      UTF-8 is LS_ERR_ARG, every id is in the vocabulary, and
 *      decode(encode(s)) == NFC(s) (byte-level BPE is lossless) — canonically
 *      equivalent only, when s holds an added token's content (see encode_decode).
 *   2  ls_tok_decode(payload read as int32 ids) with the fixed tokenizer.
 * Oracle for mode 0: a rejection names the file.
 */
#define _GNU_SOURCE /* memmem */
#include <cjson/cJSON.h>
#include <stdint.h>

#include "fuzz_common.h"
#include "longstraw/tokenizer.h"

#define NAME "fuzz/tokenizer.json"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static ls_tokenizer *g_tok;

static const char QWEN_RE[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* GPT-2 byte alphabet spelling of byte b (as tokenizer.c's byte_to_cp). */
static void byte_spelling(int b, char out[4]) {
    unsigned cp = (unsigned)b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
        int k = 0;
        for (int x = 0; x < b; x++) k += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174);
        cp = 256u + (unsigned)k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp, out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3F)), out[2] = 0;
    }
}

static cJSON *added(int id, const char *content, int special, int single_word) {
    cJSON *a = cJSON_CreateObject();
    cJSON_AddNumberToObject(a, "id", id);
    cJSON_AddStringToObject(a, "content", content);
    cJSON_AddBoolToObject(a, "single_word", single_word);
    cJSON_AddBoolToObject(a, "lstrip", 0);
    cJSON_AddBoolToObject(a, "rstrip", 0);
    cJSON_AddBoolToObject(a, "normalized", 0);
    cJSON_AddBoolToObject(a, "special", special);
    return a;
}

/* Ids: 0..255 bytes, 256.. merges, 300.. added tokens (no lstrip/rstrip: they drop
 * spaces, which would break the round-trip oracle). */
static char *fixed_tokenizer_json(void) {
    cJSON *root = cJSON_CreateObject();
    cJSON *at = cJSON_AddArrayToObject(root, "added_tokens");
    cJSON_AddItemToArray(at, added(300, "<|sp|>", 1, 0));
    cJSON_AddItemToArray(at, added(301, "<|sp|>x", 1, 0));
    cJSON_AddItemToArray(at, added(302, "cat", 0, 1));
    cJSON_AddStringToObject(cJSON_AddObjectToObject(root, "normalizer"), "type", "NFC");
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
    cJSON_AddBoolToObject(bl, "use_regex", 0);
    cJSON_AddItemToArray(pres, bl);
    cJSON_AddItemToObject(root, "decoder", cJSON_Duplicate(bl, 1));
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    char sp[4];
    for (int b = 0; b < 256; b++) {
        byte_spelling(b, sp);
        cJSON_AddNumberToObject(vocab, sp, b);
    }
    static const char *merges[][3] = {
        {"h", "e", "he"}, {"l", "l", "ll"}, {"he", "ll", "hell"}, {"hell", "o", "hello"},
        {"\xc4\xa0", "hello", "\xc4\xa0hello"}, {"1", "2", "12"}, {"a", "a", "aa"}, {"t", "he", "the"},
        {"\xc4\xa0", "the", "\xc4\xa0the"}, {"\xc3\xa4", "\xc2\xb8", "\xc3\xa4\xc2\xb8"}, /* bytes E4 B8 */
        {"\xc4\xa0", "\xc4\xa0", "\xc4\xa0\xc4\xa0"}, {"\xc4\x8a", "\xc4\x8a", "\xc4\x8a\xc4\x8a"},
    };
    cJSON *ml = cJSON_AddArrayToObject(model, "merges");
    for (int i = 0; i < (int)(sizeof merges / sizeof merges[0]); i++) {
        char s[64];
        cJSON_AddNumberToObject(vocab, merges[i][2], 256 + i);
        snprintf(s, sizeof s, "%s %s", merges[i][0], merges[i][1]);
        cJSON_AddItemToArray(ml, cJSON_CreateString(s));
    }
    char *txt = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return txt;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    char *json = fixed_tokenizer_json();
    if (!json || ls_tok_load_json(&g_tok, json, strlen(json), "fixed") != LS_OK) {
        fprintf(stderr, "fuzz_tokenizer: the fixed tokenizer does not load: %s\n", ls_err_msg());
        abort();
    }
    if (getenv("LS_FUZZ_DUMP_TOKENIZER")) printf("%s\n", json); /* to make seeds */
    free(json);
    return 0;
}

/* Does s contain the content of one of the fixed tokenizer's added tokens? */
static int has_added_content(const char *s, size_t len) {
    return memmem(s, len, "<|sp|>", 6) != NULL || memmem(s, len, "cat", 3) != NULL;
}

static void encode_decode(const ls_tokenizer *t, const char *s, size_t len, int roundtrip) {
    int32_t *ids = NULL;
    int64_t n = 0;
    ls_status st = ls_tok_encode(t, s, len, &ids, &n);
    if (st != LS_OK) {
        FUZZ_CHECK(st == LS_ERR_ARG, "encode: %s: %s", ls_status_name(st), ls_err_msg());
        FUZZ_CHECK(ids == NULL && n == 0, "a failed encode returned ids");
        return;
    }
    FUZZ_CHECK(n >= 0 && (n == 0 || ids), "encode: n %lld", (long long)n);
    for (int64_t i = 0; i < n; i++)
        FUZZ_CHECK(ids[i] >= 0 && ids[i] < ls_tok_vocab_size(t), "ids[%lld] = %d", (long long)i, ids[i]);
    char *dec = NULL;
    size_t dl = 0;
    st = ls_tok_decode(t, ids, n, &dec, &dl);
    FUZZ_CHECK(st == LS_OK, "decode of encoded ids: %s", ls_err_msg());
    if (roundtrip) {
        char *nfc = NULL, *nfc_dec = NULL;
        size_t nl = 0, ndl = 0;
        st = ls_tok_nfc(s, len, &nfc, &nl);
        FUZZ_CHECK(st == LS_OK, "nfc of valid UTF-8: %s", ls_err_msg());
        if (!has_added_content(s, len)) {
            FUZZ_CHECK(dl == nl && memcmp(dec, nfc, dl) == 0, "decode(encode(s)) != NFC(s) (%zu vs %zu bytes)", dl, nl);
        } else {
            /* Added tokens are cut out before NFC, as in HF, so a mark right after one
             * does not compose with its last character ("<|sp|>" + U+0338 keeps the
             * U+0338; NFC of the whole text makes ">" + U+0338 one "≯"). The output is
             * then canonically equivalent to s, not equal to NFC(s). */
            st = ls_tok_nfc(dec, dl, &nfc_dec, &ndl);
            FUZZ_CHECK(st == LS_OK, "nfc of the decoded text: %s", ls_err_msg());
            FUZZ_CHECK(ndl == nl && memcmp(nfc_dec, nfc, nl) == 0, "NFC(decode(encode(s))) != NFC(s) (%zu vs %zu bytes)",
                       ndl, nl);
        }
        free(nfc_dec);
        free(nfc);
    }
    free(dec);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int mode = data[0] % 3;
    const char *p = (const char *)data + 1;
    const size_t n = size - 1;
    if (mode == 0) {
        ls_tokenizer *t = NULL;
        ls_status s = ls_tok_load_json(&t, p, n, NAME);
        if (s != LS_OK) {
            fuzz_check_rejection(s, NAME);
            FUZZ_CHECK(t == NULL, "a failed load returned a tokenizer");
            return 0;
        }
        FUZZ_CHECK(ls_tok_vocab_size(t) >= 256, "vocab size %lld", (long long)ls_tok_vocab_size(t));
        static const char text[] = "Hello, world! it's 12 caf\xc3\xa9s \xe4\xb8\xad\xe6\x96\x87\n\n  <|sp|>x";
        encode_decode(t, text, sizeof text - 1, 0);
        ls_tok_free(t);
    } else if (mode == 1) {
        encode_decode(g_tok, p, n, 1);
    } else {
        int64_t nid = (int64_t)(n / 4);
        int32_t *ids = malloc((size_t)(nid ? nid : 1) * sizeof(int32_t));
        if (!ids) abort();
        memcpy(ids, p, (size_t)nid * 4);
        char *dec = NULL;
        size_t dl = 0;
        ls_status s = ls_tok_decode(g_tok, ids, nid, &dec, &dl);
        FUZZ_CHECK(s == LS_OK || s == LS_ERR_ARG, "decode: %s", ls_status_name(s));
        FUZZ_CHECK(s == LS_OK ? dec != NULL && dec[dl] == 0 : dec == NULL, "decode output");
        free(dec);
        free(ids);
    }
    return 0;
}
