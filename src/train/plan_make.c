/*
 * plan_make.c — `plan`'s answer as a library call (plan.h ls_plan_make, ls_plan_write):
 * used by the CLI and the API alike.
 */
#include <stdio.h>
#include <stdlib.h>

#include "longstraw/config.h"
#include "longstraw/family.h"
#include "longstraw/files.h"
#include "longstraw/grpo.h"
#include "longstraw/plan.h"

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
