/*
 * plan.h — what `longstraw plan` prints, made by the model's family (family.h, slot
 * `plan`) and printed by the CLI: an ordered list of named values (the --json
 * document, whose keys are the CLI's contract) and the lines of the human table (text,
 * or a labelled byte count). The family decides what its prompt state holds; the CLI
 * only prints.
 */
#ifndef LONGSTRAW_PLAN_H
#define LONGSTRAW_PLAN_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "longstraw/config.h"
#include "longstraw/core.h"
#include "longstraw/state.h"

/* What to plan: `plan`'s flags. */
typedef struct {
    const char *path; /* the config, for messages */
    int64_t prompt, page_size;
    ls_dtype dtype;      /* prompt-state storage */
    int cp;              /* context-parallel ranks */
    ls_cp_layout layout;
    int64_t sweep_chunk; /* full mode's reverse-sweep chunk; 0: prefix-frozen */
    int ep;              /* expert-parallel ranks */
    int aux_loss;        /* the family's auxiliary tensors trained too (the indexers) */
    int64_t cp_wave;     /* the CP capture's waves: positions (0: automatic; ls_cp_waves) */
} ls_plan_request;

typedef enum { LS_PLAN_I64, LS_PLAN_SIZE, LS_PLAN_STR } ls_plan_kind;

typedef struct {
    const char *key;
    ls_plan_kind kind;
    long long i;
    size_t z;
    const char *s; /* a string that outlives the document (a literal, the config's) */
} ls_plan_field;

typedef struct {
    char text[320]; /* a line of text, or a row's label */
    int row;        /* 1: a row: label, bytes, GiB */
    size_t bytes;
} ls_plan_line;

#define LS_PLAN_FIELDS 64
#define LS_PLAN_LINES 40

typedef struct {
    ls_plan_field field[LS_PLAN_FIELDS];
    int nfield;
    ls_plan_line line[LS_PLAN_LINES];
    int nline;
} ls_plan_doc;

/* Appending to a document (a full document is a programmer error: LS_ASSERT). */
void ls_plan_i64(ls_plan_doc *d, const char *key, long long v);
void ls_plan_size(ls_plan_doc *d, const char *key, size_t v);
void ls_plan_str(ls_plan_doc *d, const char *key, const char *v);
void ls_plan_text(ls_plan_doc *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ls_plan_row(ls_plan_doc *d, size_t bytes, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The fixed and grad terms of M_live (DESIGN §1) for a full fine-tune in f32, as rows
 * under one heading; `what` continues the heading's parenthesis. */
void ls_plan_live_terms(ls_plan_doc *d, size_t params, size_t w_bytes, size_t m_bytes, size_t g_bytes,
                        const char *what);

/* `plan`'s flags by name, for the CLI's options and an API host's (name, value) pairs
 * alike: one table of names, defaults and ranges. */
typedef struct {
    ls_plan_request rq; /* path unset; sweep_chunk set by ls_plan_flags_request from the mode */
    int full;           /* --mode full */
    int64_t sweep;      /* --sweep-chunk (default 512) */
    int on_host;        /* --state-on host */
} ls_plan_flags;
void ls_plan_flags_init(ls_plan_flags *f);
/* One flag ("page-size" or "page_size"; a switch's value NULL or "1" is on): LS_ERR_ARG
 * "--FLAG: ..." on a bad value; *known = 0 (and LS_OK) for a name that is not plan's. */
ls_status ls_plan_flag_set(ls_plan_flags *f, const char *name, const char *value, int *known);
/* The request the flags make for the config at `path`. */
ls_plan_request ls_plan_flags_request(const ls_plan_flags *f, const char *path);

/* The objective's options of rq as `grad`/`step` check them (same messages). */
ls_status ls_plan_check(const ls_plan_request *rq);
/* The whole `plan` answer for a loaded config (the document's strings may point into it:
 * keep it while doc is used; rq->path names it in messages): the family's plan under rq,
 * the prompt state by memory (on_host: --state-on host), after the library's checks of
 * the objective's options (full mode: rq->sweep_chunk > 0). LS_ERR_UNSUPPORTED: a flag
 * this family has no use for. */
ls_status ls_plan_make(ls_plan_doc *doc, const ls_config *cfg, const ls_plan_request *rq, int on_host);
/* The document as `plan --json` prints it (one object, the family's key order, newline) or
 * as the table. */
void ls_plan_write(FILE *f, const ls_plan_doc *d, int json);

#endif
