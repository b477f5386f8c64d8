/*
 * topk.c — the global top-k merge of a sparse selection split over ranks (cp.h).
 */
#include <stdlib.h>

#include "longstraw/cp.h"
#include "longstraw/backend.h"

static int cand_order(const void *a, const void *b) { /* score descending, then position ascending */
    const ls_topk_cand *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

static int pos_order(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

ls_status ls_dist_topk_merge(const ls_backend *be, int32_t *sel_dev, const ls_topk_cand *mine, int64_t T, int64_t k,
                             const ls_comm *comm, ls_arena *scratch) {
    int N = ls_comm_size(comm);
    ls_arena_mark mk = ls_arena_get_mark(scratch);
    size_t sb = (size_t)(T * k) * sizeof(int32_t);
    ls_topk_cand *all = ls_arena_host_alloc(scratch, (size_t)(N * T * k) * sizeof(ls_topk_cand));
    ls_topk_cand *pool = ls_arena_host_alloc(scratch, (size_t)(N * k) * sizeof(ls_topk_cand));
    int32_t *sel = ls_host_view(be, scratch, sel_dev, sb, 0); /* written on the host, placed once */
    if (!all || !pool || !sel) return LS_ERR_NOMEM;
    LS_TRY(ls_comm_allgather(comm, mine, all, (size_t)(T * k) * sizeof(ls_topk_cand)));
    for (int64_t t = 0; t < T; t++) {
        int64_t np = 0;
        for (int r = 0; r < N; r++)
            for (int64_t j = 0; j < k; j++)
                if (all[(r * T + t) * k + j].pos >= 0) pool[np++] = all[(r * T + t) * k + j];
        qsort(pool, (size_t)np, sizeof *pool, cand_order);
        int64_t keep = np < k ? np : k;
        int32_t *out = sel + t * k;
        for (int64_t j = 0; j < k; j++) out[j] = j < keep ? pool[j].pos : -1;
        qsort(out, (size_t)keep, sizeof *out, pos_order);
    }
    ls_host_view_done(be, scratch, sel_dev, sel, sb, 1);
    ls_arena_release(scratch, mk);
    return LS_OK;
}
