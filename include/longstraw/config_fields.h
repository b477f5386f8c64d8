/*
 * config_fields.h — reading config.json fields, for the families' own config parsers
 * (family.h, slot parse_config). Every reader names the file and the field in its
 * error; absent or null fields take the default.
 */
#ifndef LONGSTRAW_CONFIG_FIELDS_H
#define LONGSTRAW_CONFIG_FIELDS_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "longstraw/config.h"

/* An integer in [lo, hi] (absent: dflt, or an error when required). */
ls_status ls_cfg_get_int(const cJSON *o, const char *key, int64_t dflt, int required, int64_t lo, int64_t hi,
                         int64_t *out, const char *path);
/* A number in [lo, hi] (absent: dflt). */
ls_status ls_cfg_get_num(const cJSON *o, const char *key, double dflt, double lo, double hi, double *out,
                         const char *path);
/* true or false (absent: dflt). */
ls_status ls_cfg_get_bool(const cJSON *o, const char *key, int dflt, int *out, const char *path);
/* The fields every family has (zeroes *c first): model_type, vocab_size, hidden_size,
 * num_hidden_layers, num_attention_heads, num_key_value_heads. */
ls_status ls_cfg_parse_common(ls_config *c, const cJSON *o, const char *mt, const char *path);
/* A per-layer array of two words ("dense"/"sparse", "full"/"shared"): out[i] = 1 for
 * `one`, 0 for `zero`; anything else is refused naming the field and entry. */
ls_status ls_cfg_layer_words(const cJSON *a, const char *field, const char *one, const char *zero, int64_t L,
                             uint8_t *out, const char *path);

#endif
