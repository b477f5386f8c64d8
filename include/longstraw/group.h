/*
 * group.h — a GRPO group file: {"prompt": [ids], "responses": [[ids], ...],
 * "rewards": [...], "advantages": [...], "old_logprobs": [[...], ...]}; the last
 * three are optional. Every field is validated; errors name the file and field.
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
} ls_group;

/* Parse `path`; ids must lie in [0, vocab). Memory: malloc (ls_group_free). */
ls_status ls_group_load(ls_group *g, const char *path, int64_t vocab);
ls_status ls_group_parse(ls_group *g, const char *text, const char *path, int64_t vocab);
void ls_group_free(ls_group *g);

#endif
