/*
 * group.h — a GRPO group file: {"prompt": [ids], "responses": [[ids], ...],
 * "rewards": [...], "advantages": [...], "old_logprobs": [[...], ...]}; the last
 * three are optional. In training data (JSONL, one group per line) the prompt and the
 * responses may be text, and "answer" may name what a rollout task expects. Every field is validated; errors name the file and field.
 */
#ifndef LONGSTRAW_GROUP_H
#define LONGSTRAW_GROUP_H

#include <stdint.h>

#include "longstraw/core.h"

typedef struct {
    int32_t *prompt;   /* [P] */
    int64_t P;
    int G;
    int32_t **resp;    /* [G] → [R_i] */
    int64_t *R;        /* [G] */
    double *rewards;   /* [G] or NULL */
    double *advantages; /* [G] or NULL */
    float **old_logprobs; /* [G] → [R_i], or NULL */
    char *prompt_text; /* the prompt when given as text (NUL-terminated), or NULL */
    char *answer;      /* optional "answer" field (rollout tasks), or NULL */
} ls_group;

typedef struct ls_tokenizer ls_tokenizer;
enum {
    LS_GROUP_TRAIN = 1,       /* G >= 2 and "rewards" or "advantages" required */
    LS_GROUP_PROMPT_ONLY = 2, /* only "prompt" (and "answer") read: rollouts sample the responses */
    LS_GROUP_SYNTAX = 4,      /* quick check: text fields must be non-empty strings but are not
                               * tokenized (their P or R_i is 0, old_logprobs of them unchecked) */
};

/* Parse `path`; ids must lie in [0, vocab). Memory: malloc (ls_group_free). */
ls_status ls_group_load(ls_group *g, const char *path, int64_t vocab);
ls_status ls_group_parse(ls_group *g, const char *text, const char *path, int64_t vocab);
/* As ls_group_parse; "prompt" and each response may also be text, tokenized with
 * `tok` (NULL: text is an error saying so). `path` labels messages ("data.jsonl:17"). */
ls_status ls_group_parse_ex(ls_group *g, const char *text, const char *path, int64_t vocab,
                            const ls_tokenizer *tok, int flags);
/* ls_group_load with text allowed (tokenized with `tok`) and the parse flags. */
ls_status ls_group_load_ex(ls_group *g, const char *path, int64_t vocab, const ls_tokenizer *tok, int flags);
void ls_group_free(ls_group *g);

#endif
