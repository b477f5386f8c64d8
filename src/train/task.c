/*
 * task.c — the built-in long-context tasks (task.h): a head, a haystack of filler or
 * generated sentences with the needles at their depths, the question at the end;
 * exact-match and shaped rewards.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/task.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* ---- haystacks --------------------------------------------------------------------- */

static const char *const filler[] = {
    "The grass is green. ", "The sky is blue. ", "The sun is yellow. ", "Here we go. ",
    "There and back again. ", "The river flows to the sea. ", "A quiet wind moves the trees. ",
};

/* Varied text: sentences from small word lists (no digits, no capitals but the first
 * letter, none of the needles' phrases), so that no stretch of the haystack repeats. */
static const char *const v_adj[] = {"old", "small", "bright", "quiet", "heavy", "narrow", "distant", "gentle",
                                    "wooden", "silver", "broken", "patient", "curious", "empty", "ancient",
                                    "careful", "crowded", "hidden", "sudden", "warm", "pale", "steady",
                                    "famous", "humble"};
static const char *const v_noun[] = {"farmer", "bridge", "lantern", "village", "teacher", "harbor", "garden",
                                     "engine", "market", "painter", "valley", "letter", "window", "soldier",
                                     "kitchen", "island", "doctor", "forest", "ladder", "castle", "student",
                                     "mirror", "sailor", "library", "basket", "tower", "baker", "meadow",
                                     "traveler", "station", "orchard", "blanket"};
static const char *const v_verb[] = {"watched", "carried", "painted", "followed", "repaired", "described",
                                     "visited", "remembered", "opened", "crossed", "borrowed", "admired",
                                     "cleaned", "measured", "guarded", "studied", "found", "built", "sold",
                                     "noticed", "shared", "moved", "praised", "forgot"};
static const char *const v_prep[] = {"near", "behind", "beside", "under", "across", "beyond", "inside",
                                     "around", "before", "after", "without", "along"};
static const char *const v_time[] = {"In the morning", "Later that day", "Every winter", "Long ago",
                                     "At dusk", "Once again", "By the evening", "Without a word",
                                     "After the rain", "Before the storm"};

static const char *pick(const char *const *w, size_t n, ls_rng *r) { return w[ls_rng_u64(r) % n]; }

/* One haystack sentence into buf (at most cap - 1 bytes): its length. */
static size_t sentence(ls_haystack h, ls_rng *r, char *buf, size_t cap) {
    if (h == LS_HAY_REPEAT) return (size_t)snprintf(buf, cap, "%s", pick(filler, N_OF(filler), r));
    int n;
    switch (ls_rng_u64(r) % 4) {
    case 0:
        n = snprintf(buf, cap, "The %s %s %s the %s %s %s the %s. ", pick(v_adj, N_OF(v_adj), r),
                     pick(v_noun, N_OF(v_noun), r), pick(v_verb, N_OF(v_verb), r), pick(v_adj, N_OF(v_adj), r),
                     pick(v_noun, N_OF(v_noun), r), pick(v_prep, N_OF(v_prep), r), pick(v_noun, N_OF(v_noun), r));
        break;
    case 1:
        n = snprintf(buf, cap, "%s the %s %s a %s %s. ", pick(v_time, N_OF(v_time), r), pick(v_noun, N_OF(v_noun), r),
                     pick(v_verb, N_OF(v_verb), r), pick(v_adj, N_OF(v_adj), r), pick(v_noun, N_OF(v_noun), r));
        break;
    case 2:
        n = snprintf(buf, cap, "A %s %s %s the %s, and the %s %s it. ", pick(v_adj, N_OF(v_adj), r),
                     pick(v_noun, N_OF(v_noun), r), pick(v_verb, N_OF(v_verb), r), pick(v_noun, N_OF(v_noun), r),
                     pick(v_noun, N_OF(v_noun), r), pick(v_verb, N_OF(v_verb), r));
        break;
    default:
        n = snprintf(buf, cap, "Nobody %s the %s %s the %s. ", pick(v_verb, N_OF(v_verb), r),
                     pick(v_noun, N_OF(v_noun), r), pick(v_prep, N_OF(v_prep), r), pick(v_noun, N_OF(v_noun), r));
        break;
    }
    buf[0] = (char)toupper((unsigned char)buf[0]);
    return n > 0 && (size_t)n < cap ? (size_t)n : cap - 1;
}

/* ---- building a prompt ----------------------------------------------------------- */

#define MAX_NEEDLES 8

typedef struct {
    char text[160];
    size_t len;
    double at;     /* requested depth in [0, 1] */
    double placed; /* where it went, as a fraction of the haystack */
} needle;

/* head + haystack (needles inserted at their depths, in the given order when depths
 * tie) + tail, exactly prompt_bytes long. */
static ls_status build(ls_task_item *it, size_t prompt_bytes, const char *head, const char *tail, needle *nd,
                       int nn, ls_haystack h, ls_rng *r) {
    size_t fixed = strlen(head) + strlen(tail);
    for (int i = 0; i < nn; i++) fixed += nd[i].len;
    if (prompt_bytes < fixed + 16)
        return ls_err(LS_ERR_ARG, "a prompt of %zu bytes is too short for the task (it needs at least %zu)",
                      prompt_bytes, fixed + 16);
    size_t hay = prompt_bytes - fixed;
    int order[MAX_NEEDLES];
    for (int i = 0; i < nn; i++) order[i] = i;
    for (int i = 1; i < nn; i++) /* stable by depth */
        for (int j = i; j > 0 && nd[order[j]].at < nd[order[j - 1]].at; j--) {
            int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    char *p = malloc(prompt_bytes + 1);
    if (!p) return ls_err(LS_ERR_NOMEM, "cannot allocate a %zu-byte prompt", prompt_bytes);
    size_t n = strlen(head), written = 0;
    memcpy(p, head, n);
    int next = 0;
    char s[256];
    while (written < hay || next < nn) {
        if (next < nn && written >= (size_t)(nd[order[next]].at * (double)hay)) {
            needle *e = &nd[order[next++]];
            memcpy(p + n, e->text, e->len);
            n += e->len;
            e->placed = (double)written / (double)hay;
            continue;
        }
        size_t sl = sentence(h, r, s, sizeof s);
        if (written + sl > hay) { /* pad to the exact length with spaces */
            sl = hay - written;
            memset(s, ' ', sl);
        }
        memcpy(p + n, s, sl);
        n += sl;
        written += sl;
    }
    memcpy(p + n, tail, strlen(tail));
    n += strlen(tail);
    p[n] = 0;
    it->prompt = p;
    it->prompt_len = n;
    return LS_OK;
}

/* ---- the tasks --------------------------------------------------------------------- */

int ls_task_held_out(const char *answer) {
    uint64_t h = 1469598103934665603ull;
    for (const char *c = answer; *c; c++) h = (h ^ (uint8_t)*c) * 1099511628211ull;
    return (h >> 32) % 8 == 0;
}

static void draw_key(char *out, size_t cap, ls_rng *r) {
    snprintf(out, cap, "%05u", (unsigned)(10000 + ls_rng_u64(r) % 90000));
}

static const char *const key_words[] = {"amber", "cobalt", "maple", "falcon", "harbor", "velvet", "copper",
                                        "willow", "orchid", "granite", "lagoon", "meadow", "saffron", "glacier",
                                        "thistle", "ember"};

static const char *const passkey_head = "There is important information hidden inside a lot of irrelevant text. "
                                        "Find it and memorise it. I will quiz you about it.\n\n";

/* Every draw-until-acceptable loop of the generators gives up after this many tries (an
 * acceptable draw comes within a few from any working generator state). */
#define DRAW_TRIES 100000

static ls_status no_draw(const char *what) {
    return ls_err(LS_ERR_ARG, "the task generator drew no acceptable %s in %d tries: its random state is degenerate",
                  what, DRAW_TRIES);
}

static ls_status make_passkey(ls_task_item *it, size_t bytes, double depth, int held_out, ls_haystack h, ls_rng *r) {
    int tries = 0;
    do {
        if (++tries > DRAW_TRIES) return no_draw("pass key");
        draw_key(it->answer, sizeof it->answer, r);
    } while (ls_task_held_out(it->answer) != held_out);
    needle nd = {.at = depth};
    nd.len = (size_t)snprintf(nd.text, sizeof nd.text, "The pass key is %s. Remember it. %s is the pass key. ",
                              it->answer, it->answer);
    LS_TRY(build(it, bytes, passkey_head, "\n\nWhat is the pass key? The pass key is", &nd, 1, h, r));
    it->depth = nd.placed;
    return LS_OK;
}

#define MULTI_KEYS 4

static ls_status make_multikey(ls_task_item *it, size_t bytes, double depth, int held_out, ls_haystack h, ls_rng *r) {
    needle nd[MULTI_KEYS];
    char keys[MULTI_KEYS][8];
    int word[MULTI_KEYS];
    for (int i = 0; i < MULTI_KEYS; i++) {
        int again, tries = 0;
        do { /* distinct words and keys; the asked one (0) from its part; a training prompt's
              * distractors never held-out keys (they would be learnt beside the answer) */
            if (++tries > DRAW_TRIES) return no_draw("set of keys");
            word[i] = (int)(ls_rng_u64(r) % N_OF(key_words));
            draw_key(keys[i], sizeof keys[i], r);
            again = i == 0 ? ls_task_held_out(keys[0]) != held_out : !held_out && ls_task_held_out(keys[i]);
            for (int j = 0; j < i; j++) again |= word[j] == word[i] || !strcmp(keys[j], keys[i]);
        } while (again);
        nd[i].at = i == 0 ? depth : ls_rng_uniform(r);
        nd[i].len = (size_t)snprintf(nd[i].text, sizeof nd[i].text, "The pass key for %s is %s. Remember it. ",
                                     key_words[word[i]], keys[i]);
    }
    snprintf(it->answer, sizeof it->answer, "%s", keys[0]);
    char tail[160];
    snprintf(tail, sizeof tail, "\n\nWhat is the pass key for %s? The pass key for %s is", key_words[word[0]],
             key_words[word[0]]);
    LS_TRY(build(it, bytes, passkey_head, tail, nd, MULTI_KEYS, h, r));
    it->depth = nd[0].placed;
    return LS_OK;
}

#define VT_NAMES 3

static ls_status make_vartrack(ls_task_item *it, size_t bytes, double depth, int held_out, ls_haystack h, ls_rng *r) {
    char value[8], names[VT_NAMES][4];
    int tries = 0;
    do {
        if (++tries > DRAW_TRIES) return no_draw("variable chain");
        draw_key(value, sizeof value, r);
        for (int i = 0; i < VT_NAMES; i++) {
            int again, inner = 0;
            do {
                if (++inner > DRAW_TRIES) return no_draw("variable name");
                for (int c = 0; c < 3; c++) names[i][c] = (char)('A' + ls_rng_u64(r) % 26);
                names[i][3] = 0;
                again = 0;
                for (int j = 0; j < i; j++) again |= !strcmp(names[j], names[i]);
            } while (again);
        }
        snprintf(it->answer, sizeof it->answer, "%s %s %s", names[0], names[1], names[2]);
    } while (ls_task_held_out(it->answer) != held_out);
    /* the chain in order: the first at the depth, the others spread over what follows */
    needle nd[VT_NAMES];
    for (int i = 0; i < VT_NAMES; i++) {
        nd[i].at = depth + (1.0 - depth) * (double)i / VT_NAMES;
        nd[i].len = (size_t)snprintf(nd[i].text, sizeof nd[i].text, "Assign %s to %s. ", i ? names[i - 1] : value,
                                     names[i]);
    }
    char tail[200];
    snprintf(tail, sizeof tail, "\n\nQuestion: which variables hold the value %s? Name them in the order they were "
                                "assigned. Answer:", value);
    LS_TRY(build(it, bytes,
                 "Memorise the assignments hidden in the text below: each copies a value into a variable. "
                 "I will ask you about them.\n\n", tail, nd, VT_NAMES, h, r));
    it->depth = nd[0].placed;
    return LS_OK;
}

/* ---- names ----------------------------------------------------------------------- */

static const char *const kind_name[] = {"passkey", "multikey", "vartrack"};

ls_status ls_task_parse(ls_task *t, const char *name, const char *haystack) {
    memset(t, 0, sizeof *t);
    size_t n = strlen(name);
    if (n > 7 && !strcmp(name + n - 7, "-shaped")) t->shaped = 1, n -= 7;
    int found = 0;
    for (size_t k = 0; k < N_OF(kind_name) && !found; k++)
        if (strlen(kind_name[k]) == n && !strncmp(name, kind_name[k], n)) t->kind = (ls_task_kind)k, found = 1;
    if (!found)
        return ls_err(LS_ERR_ARG, "task \"%s\": expected passkey, multikey or vartrack (each also NAME-shaped: partial "
                                  "credit)", name);
    if (!haystack || !strcmp(haystack, "repeat")) t->haystack = LS_HAY_REPEAT;
    else if (!strcmp(haystack, "varied")) t->haystack = LS_HAY_VARIED;
    else return ls_err(LS_ERR_ARG, "haystack \"%s\": expected repeat or varied", haystack);
    return LS_OK;
}

const char *ls_task_name(const ls_task *t, char *buf, size_t cap) {
    snprintf(buf, cap, "%s%s", kind_name[t->kind], t->shaped ? "-shaped" : "");
    return buf;
}

const char *ls_haystack_name(ls_haystack h) { return h == LS_HAY_VARIED ? "varied" : "repeat"; }

size_t ls_task_min_bytes(const ls_task *t) {
    return t->kind == LS_TASK_PASSKEY ? 256 : t->kind == LS_TASK_MULTIKEY ? 512 : 400;
}

ls_status ls_task_make(const ls_task *t, ls_task_item *it, size_t prompt_bytes, double depth, int held_out,
                       ls_rng *rng) {
    memset(it, 0, sizeof *it);
    char nm[32];
    if (prompt_bytes < ls_task_min_bytes(t))
        return ls_err(LS_ERR_ARG, "%s prompt length %zu is below %zu bytes", ls_task_name(t, nm, sizeof nm),
                      prompt_bytes, ls_task_min_bytes(t));
    if (depth > 1) return ls_err(LS_ERR_ARG, "%s depth %g is outside [0, 1]", ls_task_name(t, nm, sizeof nm), depth);
    if (depth < 0) depth = ls_rng_uniform(rng);
    held_out = held_out != 0;
    switch (t->kind) {
    case LS_TASK_MULTIKEY: return make_multikey(it, prompt_bytes, depth, held_out, t->haystack, rng);
    case LS_TASK_VARTRACK: return make_vartrack(it, prompt_bytes, depth, held_out, t->haystack, rng);
    default: return make_passkey(it, prompt_bytes, depth, held_out, t->haystack, rng);
    }
}

void ls_task_item_free(ls_task_item *it) {
    free(it->prompt);
    it->prompt = NULL;
}

/* ---- rewards ------------------------------------------------------------------------ */

static size_t skip_space(const char *r, size_t len) {
    size_t i = 0;
    while (i < len && isspace((unsigned char)r[i])) i++;
    return i;
}

double ls_answer_reward(const char *ans, const char *r, size_t len) {
    size_t i = skip_space(r, len), k = strlen(ans);
    if (len - i < k || memcmp(r + i, ans, k) != 0) return 0.0;
    if (k && isdigit((unsigned char)ans[k - 1]) && i + k < len && isdigit((unsigned char)r[i + k])) return 0.0;
    return 1.0;
}

double ls_task_exact(const ls_task *t, const ls_task_item *it, const char *r, size_t len) {
    if (ls_answer_reward(it->answer, r, len) == 0.0) return 0.0;
    if (t->kind != LS_TASK_VARTRACK) return 1.0;
    /* the list ends there: no letter goes on the last name, no further name follows */
    size_t e = skip_space(r, len) + strlen(it->answer);
    if (e < len && isalnum((unsigned char)r[e])) return 0.0;
    if (e + 1 < len && r[e] == ' ' && isupper((unsigned char)r[e + 1])) return 0.0;
    return 1.0;
}

double ls_task_score(const ls_task *t, const ls_task_item *it, const char *r, size_t len) {
    if (ls_task_exact(t, it, r, len) == 1.0) return 1.0;
    size_t i = skip_space(r, len), k = strlen(it->answer), digits = 0, match = 0, names = 0;
    if (t->kind == LS_TASK_VARTRACK) {
        for (size_t j = 0; j + 3 <= k; j += 4) /* "ABC DEF GHI": name j/4 at j */
            names += i + j + 3 <= len && !memcmp(r + i + j, it->answer + j, 3);
        return 0.45 * (double)names / (double)((k + 1) / 4);
    }
    for (size_t j = 0; j < k && i + j < len; j++) {
        digits += isdigit((unsigned char)r[i + j]) != 0;
        match += r[i + j] == it->answer[j];
    }
    return 0.2 * (double)digits / (double)k + 0.3 * (double)match / (double)k;
}

double ls_task_reward(const ls_task *t, const ls_task_item *it, const char *r, size_t len) {
    return t->shaped ? ls_task_score(t, it, r, len) : ls_task_exact(t, it, r, len);
}
