/*
 * plan_make.c — `plan`'s answer as a library call (plan.h ls_plan_make, ls_plan_write):
 * used by the CLI and the API alike.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/config.h"
#include "longstraw/family.h"
#include "longstraw/files.h"
#include "longstraw/flags.h"
#include "longstraw/grpo.h"
#include "longstraw/plan.h"

void ls_plan_flags_init(ls_plan_flags *f) {
    memset(f, 0, sizeof *f);
    f->rq.prompt = -1;
    f->rq.page_size = 64;
    f->rq.dtype = LS_DTYPE_BF16;
    f->rq.cp = 1;
    f->rq.layout = LS_CP_ZIGZAG;
    f->rq.ep = 1;
    f->sweep = 512;
}

ls_status ls_plan_flag_set(ls_plan_flags *f, const char *k, const char *v, int *known) {
    ls_plan_request *r = &f->rq;
    int64_t x;
    *known = 1;
    if (ls_flag_name_is(k, "indexer-kl")) return r->aux_loss = ls_flag_on(v), LS_OK;
    static const char *const valued[] = {"prompt", "page-size", "cp", "state-dtype", "cp-layout", "mode",
                                         "sweep-chunk", "ep", "cp-wave", "state-on"};
    int i = 0, n = (int)(sizeof valued / sizeof valued[0]);
    while (i < n && !ls_flag_name_is(k, valued[i])) i++;
    if (i == n) return *known = 0, LS_OK;
    char flag[32];
    snprintf(flag, sizeof flag, "--%s", valued[i]);
    if (!v) return ls_err(LS_ERR_ARG, "%s needs a value", flag);
    switch (i) {
    case 0: return ls_flag_i64(flag, v, 1, INT64_MAX / 2, &r->prompt);
    case 1: return ls_flag_i64(flag, v, 1, 1 << 20, &r->page_size);
    case 2: LS_TRY(ls_flag_i64(flag, v, 1, 65536, &x)); return r->cp = (int)x, LS_OK;
    case 3: return ls_flag_dtype(flag, v, &r->dtype);
    case 4: return ls_flag_layout(v, &r->layout);
    case 5: return ls_flag_mode(v, &f->full);
    case 6: return ls_flag_i64(flag, v, 1, INT64_MAX / 4, &f->sweep);
    case 7: LS_TRY(ls_flag_i64(flag, v, 1, 4096, &x)); return r->ep = (int)x, LS_OK;
    case 8: return ls_flag_i64(flag, v, 1, (int64_t)1 << 40, &r->cp_wave);
    default: return ls_flag_state_on(flag, v, &f->on_host);
    }
}

ls_plan_request ls_plan_flags_request(const ls_plan_flags *f, const char *path) {
    ls_plan_request r = f->rq;
    r.path = path;
    r.sweep_chunk = f->full ? f->sweep : 0;
    return r;
}

ls_status ls_plan_check(const ls_plan_request *rq) {
    /* what `grad`/`step`/`train` would refuse, refused here the same way (the library's check) */
    ls_grpo_opts o;
    ls_grpo_opts_default(&o);
    o.full = rq->sweep_chunk > 0;
    if (o.full) o.sweep_chunk = rq->sweep_chunk;
    o.aux_loss_coef = rq->aux_loss ? 1.0 : 0.0;
    return ls_grpo_opts_check(&o);
}

ls_status ls_plan_make(ls_plan_doc *doc, const ls_config *cfg, const ls_plan_request *rq, int on_host) {
    LS_TRY(ls_plan_check(rq));
    const ls_family *fam = ls_family_for(cfg, rq->path);
    if (!fam) return ls_err(LS_ERR_UNSUPPORTED, "%s: no family runs this config", rq->path);
    LS_TRY(fam->plan(doc, cfg, rq));
    ls_state_plan_t sp;
    LS_TRY(fam->state_plan(&sp, cfg, rq->prompt, rq->page_size, rq->dtype, rq->cp, rq->layout, rq->sweep_chunk));
    /* its bytes by memory on a device backend (the receipt's prompt_state_bytes) */
    size_t dev, host;
    ls_state_placement(&sp, cfg, rq->dtype, rq->cp, on_host, &dev, &host);
    ls_plan_str(doc, "state_on", on_host ? "host" : "device");
    ls_plan_size(doc, "state_device_bytes_per_rank", dev);
    ls_plan_size(doc, "state_host_bytes_per_rank", host);
    ls_plan_text(doc, "prompt state by memory on a device backend (--state-on %s):", on_host ? "host" : "device");
    ls_plan_row(doc, dev, on_host ? "  device: one layer staged at a time" : "  device: pages and states");
    ls_plan_row(doc, host, on_host ? "  host: the state, the stages' tables" : "  host: page tables");
    return LS_OK;
}

static double gib(size_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

void ls_plan_write(FILE *f, const ls_plan_doc *d, int json) {
    if (json) {
        fputc('{', f);
        for (int i = 0; i < d->nfield; i++) {
            const ls_plan_field *x = &d->field[i];
            fprintf(f, "%s\"%s\": ", i ? ", " : "", x->key);
            if (x->kind == LS_PLAN_I64) fprintf(f, "%lld", x->i);
            else if (x->kind == LS_PLAN_SIZE) fprintf(f, "%zu", x->z);
            else ls_json_string(f, x->s);
        }
        fputs("}\n", f);
        return;
    }
    for (int i = 0; i < d->nline; i++) {
        const ls_plan_line *l = &d->line[i];
        if (l->row) fprintf(f, "  %-40s %20zu %12.4f\n", l->text, l->bytes, gib(l->bytes));
        else fprintf(f, "%s\n", l->text);
    }
}
