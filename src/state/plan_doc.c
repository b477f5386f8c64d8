/*
 * plan_doc.c — building the document `longstraw plan` prints (plan.h).
 */
#include <stdarg.h>
#include <stdio.h>

#include "longstraw/plan.h"

static ls_plan_field *next_field(ls_plan_doc *d, const char *key, ls_plan_kind kind) {
    LS_ASSERT(d->nfield < LS_PLAN_FIELDS, "plan document: more than %d fields", LS_PLAN_FIELDS);
    ls_plan_field *f = &d->field[d->nfield++];
    *f = (ls_plan_field){.key = key, .kind = kind};
    return f;
}

void ls_plan_i64(ls_plan_doc *d, const char *key, long long v) { next_field(d, key, LS_PLAN_I64)->i = v; }
void ls_plan_size(ls_plan_doc *d, const char *key, size_t v) { next_field(d, key, LS_PLAN_SIZE)->z = v; }
void ls_plan_str(ls_plan_doc *d, const char *key, const char *v) { next_field(d, key, LS_PLAN_STR)->s = v; }

static ls_plan_line *next_line(ls_plan_doc *d, int row, size_t bytes, const char *fmt, va_list ap) {
    LS_ASSERT(d->nline < LS_PLAN_LINES, "plan document: more than %d lines", LS_PLAN_LINES);
    ls_plan_line *l = &d->line[d->nline++];
    l->row = row;
    l->bytes = bytes;
    vsnprintf(l->text, sizeof l->text, fmt, ap);
    return l;
}

void ls_plan_text(ls_plan_doc *d, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    next_line(d, 0, 0, fmt, ap);
    va_end(ap);
}

void ls_plan_row(ls_plan_doc *d, size_t bytes, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    next_line(d, 1, bytes, fmt, ap);
    va_end(ap);
}

void ls_plan_live_terms(ls_plan_doc *d, size_t params, size_t w_bytes, size_t m_bytes, size_t g_bytes,
                        const char *what) {
    ls_plan_text(d, "%s", "");
    ls_plan_text(d, "  other M_live terms, full fine-tune in f32 (%zu parameters%s):", params, what);
    ls_plan_row(d, w_bytes, "fixed: weights");
    ls_plan_row(d, m_bytes, "fixed: AdamW moments");
    ls_plan_row(d, g_bytes, "grad");
}
