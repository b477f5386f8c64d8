/*
 * stage.c — a prompt state that lives in host memory, staged to the device one layer at
 * a time (`--state-on host`, state.h): the layer's pages (those holding the positions
 * a pass reads or writes), its recurrent state, its gradient tables and the sweep
 * checkpoint being written are copied into one layer's worth of device memory, the layer
 * runs against that mirror, and what it wrote is copied back. The mirror's tables and
 * buffers sit at the same addresses for every layer, so a tape that kept a pointer to
 * them (a branch's prefix) reads the right layer again once the backward re-stages it.
 */
#include <string.h>

#include "longstraw/backend.h"
#include "longstraw/state.h"
#include "core/rt.h"

struct ls_state_stage {
    ls_prompt_state *host;
    const ls_backend *be;
    ls_prompt_state dev;   /* the state as the staged layer's ops see it */
    int layer;             /* the layer staged (−1: none yet) */
    int64_t pages;         /* local pages staged */
    int64_t ckpt;          /* the checkpoint staged (−1: none) */
    ls_attn_state *attn;   /* [n_layers] */
    ls_gdn_state *gdn;     /* [n_layers] */
    ls_state_full full;
    ls_layer_dstate *d;    /* [n_layers] */
    ls_gdn_state *ckpts;   /* [n_chunks · n_layers] */
    void **tab[2], **gtab[2]; /* [cap_pages] device page pointers: pages, gradient pages */
    char *area[2], *garea[2]; /* their memory: cap_pages of the widest layer's */
    size_t pb_max[2], gpb_max[2];
    float *S, *tail, *dS, *dtail, *ckS, *cktail;
};

/* The bytes of every stage made, by what it carries (the largest of each kind): device, host part. */

static int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }

static size_t pbytes(const ls_prompt_state *st, int64_t row, size_t esz) {
    return ls_align_up((size_t)st->page_size * (size_t)row * esz);
}

/* The widest page of each table of a config (pb: K/V or latent/index rows in dtype; gpb:
 * full mode's f32 gradient rows), and whether any layer keeps a recurrent state. */
static int widest_pages(const ls_config *c, int64_t page_size, ls_dtype dtype, size_t pb[2], size_t gpb[2]) {
    int any_rec = 0;
    pb[0] = pb[1] = gpb[0] = gpb[1] = 0;
    for (int l = 0; l < c->n_layers; l++) {
        ls_state_layer d = ls_state_layer_of(c, l);
        any_rec |= d.recurrent;
        for (int side = 0; side < 2; side++) {
            size_t b = ls_align_up((size_t)page_size * (size_t)d.row[side] * ls_dtype_size(dtype));
            size_t g = ls_align_up((size_t)page_size * (size_t)d.grad_row[side] * sizeof(float));
            if (d.row[side] && b > pb[side]) pb[side] = b;
            if (d.grad_row[side] && g > gpb[side]) gpb[side] = g;
        }
    }
    return any_rec;
}

int ls_state_resident(const ls_prompt_state *st, const ls_backend *be) {
    return be->host_mem || ls_arena_backend(st->arena) == be;
}

ls_status ls_state_stage_new(ls_state_stage **out, ls_prompt_state *st, const ls_backend *be, unsigned what,
                             ls_arena *A) {
    *out = NULL;
    if (ls_state_resident(st, be)) return LS_OK;
    const ls_config *c = st->cfg;
    size_t L = (size_t)c->n_layers;
    size_t dev0 = A->cur, host0 = ls_arena_host_cur(A);
    ls_state_stage *s = ls_arena_host_calloc(A, 1, sizeof *s);
    if (!s) return LS_ERR_NOMEM;
    s->host = st, s->be = be, s->layer = -1, s->ckpt = -1;
    s->dev = *st;
    s->dev.arena = A; /* (nothing is allocated through it: the host reserves pages first) */
    ls_state_recurrent rs = ls_state_recurrent_of(c);
    int any_rec = widest_pages(c, st->page_size, st->dtype, s->pb_max, s->gpb_max);
    size_t np = (size_t)st->cap_pages;
    s->attn = ls_arena_host_calloc(A, L, sizeof *s->attn);
    if (!s->attn) return LS_ERR_NOMEM;
    s->dev.attn = s->attn;
    for (int side = 0; side < 2; side++) {
        if (!(what & LS_STAGE_PAGES) || !s->pb_max[side]) continue;
        s->tab[side] = ls_arena_host_calloc(A, np ? np : 1, sizeof(void *));
        s->area[side] = ls_arena_alloc(A, (np ? np : 1) * s->pb_max[side]);
        if (!s->tab[side] || !s->area[side]) return LS_ERR_NOMEM;
    }
    if (st->gdn) {
        s->gdn = ls_arena_host_calloc(A, L, sizeof *s->gdn);
        if (!s->gdn) return LS_ERR_NOMEM;
        s->dev.gdn = s->gdn;
        if ((what & LS_STAGE_REC) && any_rec) {
            s->S = ls_arena_alloc(A, rs.rec_floats * sizeof(float));
            s->tail = ls_arena_alloc(A, (rs.tail_floats ? rs.tail_floats : 1) * sizeof(float));
            if (!s->S || !s->tail) return LS_ERR_NOMEM;
        }
    }
    if (st->full) {
        s->full = *st->full;
        s->d = ls_arena_host_calloc(A, L, sizeof *s->d);
        s->ckpts = ls_arena_host_calloc(A, (size_t)(st->full->n_chunks > 0 ? st->full->n_chunks : 1) * L,
                                        sizeof *s->ckpts);
        if (!s->d || !s->ckpts) return LS_ERR_NOMEM;
        s->full.d = s->d, s->full.ckpt = s->ckpts;
        s->dev.full = &s->full;
        for (int side = 0; side < 2; side++) {
            if (!(what & LS_STAGE_GPAGES) || !s->gpb_max[side]) continue;
            s->gtab[side] = ls_arena_host_calloc(A, np ? np : 1, sizeof(void *));
            s->garea[side] = ls_arena_alloc(A, (np ? np : 1) * s->gpb_max[side]);
            if (!s->gtab[side] || !s->garea[side]) return LS_ERR_NOMEM;
        }
        if (any_rec && (what & (LS_STAGE_GREC | LS_STAGE_CKPT))) {
            size_t tb = (rs.tail_floats ? rs.tail_floats : 1) * sizeof(float), rb = rs.rec_floats * sizeof(float);
            if (what & LS_STAGE_GREC) {
                s->dS = ls_arena_alloc(A, rb), s->dtail = ls_arena_alloc(A, tb);
                if (!s->dS || !s->dtail) return LS_ERR_NOMEM;
            }
            if (what & LS_STAGE_CKPT) {
                s->ckS = ls_arena_alloc(A, rb), s->cktail = ls_arena_alloc(A, tb);
                if (!s->ckS || !s->cktail) return LS_ERR_NOMEM;
            }
        }
    }
    unsigned k = what & 31;
    if (A->cur - dev0 > ls_rt_get()->made_dev[k]) ls_rt_get()->made_dev[k] = A->cur - dev0;
    if (ls_arena_host_cur(A) - host0 > ls_rt_get()->made_host[k])
        ls_rt_get()->made_host[k] = ls_arena_host_cur(A) - host0;
    *out = s;
    return LS_OK;
}

void ls_state_stage_made(unsigned what, size_t *dev, size_t *host) {
    *dev = ls_rt_get()->made_dev[what & 31], *host = ls_rt_get()->made_host[what & 31];
}

void ls_state_stage_predict(const ls_config *c, int64_t cap_pages, int64_t page_size, ls_dtype dtype, int full,
                            int64_t n_chunks, unsigned what, size_t *dev, size_t *host) {
    size_t L = (size_t)c->n_layers, np = (size_t)(cap_pages > 0 ? cap_pages : 1), pb_max[2], gpb_max[2];
    int any_rec = widest_pages(c, page_size, dtype, pb_max, gpb_max);
    ls_state_recurrent rs = ls_state_recurrent_of(c);
    size_t rec = ls_align_up(rs.rec_floats * sizeof(float)), tail = ls_align_up((rs.tail_floats ? rs.tail_floats : 1) * sizeof(float));
    size_t d = 0, h = ls_align_up(sizeof(ls_state_stage)) + ls_align_up(L * sizeof(ls_attn_state));
    for (int side = 0; side < 2; side++)
        if ((what & LS_STAGE_PAGES) && pb_max[side]) h += ls_align_up(np * sizeof(void *)), d += ls_align_up(np * pb_max[side]);
    if (rs.table) {
        h += ls_align_up(L * sizeof(ls_gdn_state));
        if ((what & LS_STAGE_REC) && any_rec) d += rec + tail;
    }
    if (full) {
        h += ls_align_up(L * sizeof(ls_layer_dstate)) + ls_align_up((size_t)(n_chunks > 0 ? n_chunks : 1) * L * sizeof(ls_gdn_state));
        for (int side = 0; side < 2; side++)
            if ((what & LS_STAGE_GPAGES) && gpb_max[side])
                h += ls_align_up(np * sizeof(void *)), d += ls_align_up(np * gpb_max[side]);
        if (any_rec && (what & LS_STAGE_GREC)) d += rec + tail;
        if (any_rec && (what & LS_STAGE_CKPT)) d += rec + tail;
    }
    *dev = d, *host = h;
}

/* The device bytes of the stages alive at once at the peak, from per-kind sizes: a
 * capture's; a branch's (with, in full mode, its backward's gradient stage); a CP sweep
 * serving another rank's chunk. */
typedef void (*kind_bytes)(const void *ctx, unsigned what, size_t *dev, size_t *host);

static void peak_of(kind_bytes f, const void *ctx, int full, int cp, size_t *dev, size_t *host) {
    const unsigned alone[] = {LS_STAGE_PAGES | LS_STAGE_REC | LS_STAGE_CKPT, LS_STAGE_PAGES | LS_STAGE_GPAGES,
                              LS_STAGE_GREC};
    size_t d, h, d2 = 0, h2 = 0;
    *dev = *host = 0;
    for (size_t i = 0; i < sizeof alone / sizeof alone[0]; i++) {
        if (i > 0 && !(full && cp > 1)) break; /* serving and relaying: a CP sweep's */
        f(ctx, alone[i], &d, &h);
        if (d > *dev) *dev = d;
        if (h > *host) *host = h;
    }
    f(ctx, LS_STAGE_PAGES | LS_STAGE_REC, &d, &h);
    if (full) f(ctx, LS_STAGE_GPAGES | LS_STAGE_GREC, &d2, &h2);
    if (d + d2 > *dev) *dev = d + d2;
    if (h + h2 > *host) *host = h + h2;
}

typedef struct {
    const ls_config *c;
    const ls_state_plan_t *p;
    ls_dtype dtype;
} predict_ctx;

static void predicted_kind(const void *ctx, unsigned what, size_t *dev, size_t *host) {
    const predict_ctx *q = ctx;
    ls_state_stage_predict(q->c, q->p->pages_per_rank, q->p->page_size, q->dtype, q->p->sweep_chunk > 0,
                           q->p->sweep_chunks_per_rank, what, dev, host);
}

static void made_kind(const void *ctx, unsigned what, size_t *dev, size_t *host) {
    (void)ctx;
    ls_state_stage_made(what, dev, host);
}

void ls_state_stage_peak_predicted(const ls_state_plan_t *p, const ls_config *c, ls_dtype dtype, int cp, size_t *dev,
                                   size_t *host) {
    predict_ctx q = {c, p, dtype};
    peak_of(predicted_kind, &q, p->sweep_chunk > 0, cp, dev, host);
}

void ls_state_stage_peak_made(size_t *dev, size_t *host) { peak_of(made_kind, NULL, 1, 2, dev, host); }

ls_prompt_state *ls_state_stage_dev(ls_state_stage *s) { return &s->dev; }

/* the layer's entries of the mirror's tables cleared: no other layer is on the device */
static void clear_layer(ls_state_stage *s, int l) {
    memset(&s->attn[l], 0, sizeof s->attn[l]);
    if (s->gdn) memset(&s->gdn[l], 0, sizeof s->gdn[l]);
    if (s->d) memset(&s->d[l], 0, sizeof s->d[l]);
    if (s->ckpt >= 0) memset(&s->ckpts[s->ckpt * s->host->cfg->n_layers + l], 0, sizeof(ls_gdn_state));
}

ls_prompt_state *ls_state_stage_in(ls_state_stage *s, int l, int64_t upto, int64_t at) {
    ls_prompt_state *h = s->host;
    const ls_config *c = h->cfg;
    const ls_backend *be = s->be;
    if (s->layer >= 0) clear_layer(s, s->layer);
    ls_prompt_state keep = s->dev;
    s->dev = *h; /* the host's bookkeeping as it is now (n, pages), the mirror's tables */
    s->dev.arena = keep.arena, s->dev.attn = keep.attn, s->dev.gdn = keep.gdn, s->dev.full = keep.full;
    if (h->full) s->full.n_chunks = h->full->n_chunks, s->full.chunks = h->full->chunks;
    s->layer = l, s->ckpt = -1;
    ls_state_layer d = ls_state_layer_of(c, l);
    size_t esz = ls_dtype_size(h->dtype), rec = ls_state_recurrent_of(c).rec_floats * sizeof(float);
    size_t tl = ls_state_recurrent_of(c).tail_floats * sizeof(float);
    int64_t held = ls_state_held_before(h, upto < h->capacity ? upto : h->capacity);
    s->pages = ceil_div(held, h->page_size);
    if (s->pages > h->cap_pages) s->pages = h->cap_pages;
    for (int side = 0; side < 2; side++) {
        void **src = side ? h->attn[l].v_pages : h->attn[l].k_pages;
        if (s->tab[side] && d.row[side] && src) {
            size_t pb = pbytes(h, d.row[side], esz);
            memset(s->tab[side], 0, (size_t)h->cap_pages * sizeof(void *));
            for (int64_t p = 0; p < s->pages; p++) {
                if (!src[p]) continue;
                s->tab[side][p] = s->area[side] + (size_t)p * pb;
                be->i->to_device(be, s->tab[side][p], src[p], pb);
            }
            *(side ? &s->attn[l].v_pages : &s->attn[l].k_pages) = s->tab[side];
        }
        void **gsrc = h->full && h->full->d ? (side ? h->full->d[l].dv : h->full->d[l].dk) : NULL;
        if (s->gtab[side] && d.grad_row[side] && gsrc) {
            size_t pb = pbytes(h, d.grad_row[side], sizeof(float));
            memset(s->gtab[side], 0, (size_t)h->cap_pages * sizeof(void *));
            for (int64_t p = 0; p < s->pages; p++) {
                if (!gsrc[p]) continue;
                s->gtab[side][p] = s->garea[side] + (size_t)p * pb;
                be->i->to_device(be, s->gtab[side][p], gsrc[p], pb);
            }
            *(side ? &s->d[l].dv : &s->d[l].dk) = s->gtab[side];
        }
    }
    if (d.recurrent && s->S && h->gdn && h->gdn[l].S) {
        be->i->to_device(be, s->S, h->gdn[l].S, rec);
        if (tl) be->i->to_device(be, s->tail, h->gdn[l].conv_tail, tl);
        s->gdn[l].S = s->S, s->gdn[l].conv_tail = s->tail;
    }
    if (d.recurrent && s->dS && h->full->d[l].dS) {
        be->i->to_device(be, s->dS, h->full->d[l].dS, rec);
        if (tl) be->i->to_device(be, s->dtail, h->full->d[l].dtail, tl);
        s->d[l].dS = s->dS, s->d[l].dtail = s->dtail;
    }
    if (d.recurrent && s->ckS && at >= 0 && (s->ckpt = ls_state_ckpt_at(h, at)) >= 0) {
        ls_gdn_state *ck = &s->ckpts[s->ckpt * c->n_layers + l]; /* written by the layer, not read */
        ck->S = s->ckS, ck->conv_tail = s->cktail;
    }
    return &s->dev;
}

void ls_state_stage_out(ls_state_stage *s, unsigned what, int64_t wlo, int64_t whi) {
    ls_prompt_state *h = s->host;
    const ls_config *c = h->cfg;
    const ls_backend *be = s->be;
    int l = s->layer;
    if (l < 0) return;
    ls_state_layer d = ls_state_layer_of(c, l);
    size_t esz = ls_dtype_size(h->dtype), rec = ls_state_recurrent_of(c).rec_floats * sizeof(float);
    size_t tl = ls_state_recurrent_of(c).tail_floats * sizeof(float);
    if ((what & LS_STAGE_PAGES) && whi > wlo) { /* the pages holding the rows written */
        int64_t a = ls_state_held_before(h, wlo) / h->page_size, b = ceil_div(ls_state_held_before(h, whi), h->page_size);
        for (int side = 0; side < 2; side++) {
            void **dst = side ? h->attn[l].v_pages : h->attn[l].k_pages;
            if (!s->tab[side] || !d.row[side] || !dst) continue;
            for (int64_t p = a; p < b && p < s->pages; p++)
                if (dst[p] && s->tab[side][p]) be->i->to_host(be, dst[p], s->tab[side][p], pbytes(h, d.row[side], esz));
        }
        if (s->dev.n_pages > h->n_pages) h->n_pages = s->dev.n_pages;
    }
    if ((what & LS_STAGE_GPAGES) && h->full)
        for (int side = 0; side < 2; side++) {
            void **dst = side ? h->full->d[l].dv : h->full->d[l].dk;
            if (!s->gtab[side] || !d.grad_row[side] || !dst) continue;
            for (int64_t p = 0; p < s->pages; p++)
                if (dst[p] && s->gtab[side][p])
                    be->i->to_host(be, dst[p], s->gtab[side][p], pbytes(h, d.grad_row[side], sizeof(float)));
        }
    if ((what & LS_STAGE_REC) && d.recurrent && s->S && h->gdn && h->gdn[l].S) {
        be->i->to_host(be, h->gdn[l].S, s->S, rec);
        if (tl) be->i->to_host(be, h->gdn[l].conv_tail, s->tail, tl);
    }
    if ((what & LS_STAGE_GREC) && d.recurrent && s->dS && h->full->d[l].dS) {
        be->i->to_host(be, h->full->d[l].dS, s->dS, rec);
        if (tl) be->i->to_host(be, h->full->d[l].dtail, s->dtail, tl);
    }
    if ((what & LS_STAGE_CKPT) && s->ckpt >= 0 && d.recurrent) {
        ls_gdn_state *ck = &h->full->ckpt[s->ckpt * c->n_layers + l];
        be->i->to_host(be, ck->S, s->ckS, rec);
        if (tl) be->i->to_host(be, ck->conv_tail, s->cktail, tl);
    }
}

void ls_state_placement(const ls_state_plan_t *p, const ls_config *c, ls_dtype dtype, int cp, int on_host, size_t *dev,
                        size_t *host) {
    size_t tables = p->table_bytes_per_rank + p->full_table_bytes_per_rank;
    if (!on_host) { /* an arena on the device: its bookkeeping in the arena's host part */
        *dev = p->total_bytes_per_rank - tables, *host = tables;
        return;
    }
    size_t sd, sh;
    ls_state_stage_peak_predicted(p, c, dtype, cp, &sd, &sh);
    *dev = sd, *host = p->total_bytes_per_rank + sh;
}
