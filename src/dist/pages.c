/*
 * pages.c — the ring over pages and the state relay (cp.h): what context parallelism
 * moves point to point. Every message is tagged by its layer and kind, so two layers'
 * streams never cross; the program order on both sides is the callers' (the same on
 * every rank, so the schedule cannot deadlock).
 */
#include <string.h>

#include "longstraw/cp.h"
#include "longstraw/backend.h"

/* Kinds of a layer's point-to-point messages. */
enum { TAG_PAGE_GRADS = 0, TAG_PAGES = 1, TAG_PARTS = 2 };
#define TAG(layer, kind) ((layer) * 4 + (kind))

/* K | V of pages [p0, p0 + nb) (be's memory, kb and vb bytes a page; vb 0: no V) packed
 * into the host buffer buf. */
static void pack_block(const ls_backend *be, char *buf, void *const *k, void *const *v, int64_t p0, int64_t nb,
                       size_t kb, size_t vb) {
    for (int64_t i = 0; i < nb; i++) {
        be->i->to_host(be, buf + (size_t)i * kb, k[p0 + i], kb);
        if (vb) be->i->to_host(be, buf + (size_t)nb * kb + (size_t)i * vb, v[p0 + i], vb);
    }
}

/* A received block (host) where the ops can read it: buf itself on a host-memory
 * backend, else dev (the backend's memory) after one copy. */
static char *place_block(const ls_backend *be, char *dev, char *buf, size_t bytes) {
    if (ls_host_direct(be)) return buf;
    be->i->to_device(be, dev, buf, bytes);
    return dev;
}

/* The page pointers of a packed block (vb 0: v gets NULLs). */
static void unpack_block(char *buf, void **k, void **v, int64_t nb, size_t kb, size_t vb) {
    for (int64_t i = 0; i < nb; i++) k[i] = buf + (size_t)i * kb, v[i] = vb ? buf + (size_t)nb * kb + (size_t)i * vb : NULL;
}

/* Scratch too small for a block's buffers: released, and said. */
static ls_status no_block(ls_arena *sc, ls_arena_mark mk, int layer, int64_t bp) {
    ls_arena_release(sc, mk);
    return ls_err(LS_ERR_NOMEM, "layer %d: scratch for a block of %lld pages in transit", layer, (long long)bp);
}

/* Pages holding npos positions. */
static int64_t pages_of(int64_t npos, int64_t page_size) { return (npos + page_size - 1) / page_size; }

/* Positions in the block of nb pages starting at page p0. */
static int64_t block_rows(int64_t npos, int64_t page_size, int64_t p0, int64_t nb) {
    int64_t left = npos - p0 * page_size;
    return left < nb * page_size ? left : nb * page_size;
}

ls_status ls_dist_pages_send(const ls_backend *be, const ls_comm *c, void *const *k, void *const *v, int64_t npos,
                             int64_t page_size, size_t page_bytes, int64_t bp, int dst, int layer, ls_arena *sc) {
    int64_t np = pages_of(npos, page_size);
    ls_arena_mark mk = ls_arena_get_mark(sc);
    char *buf = ls_arena_host_alloc(sc, 2 * (size_t)bp * page_bytes);
    if (!buf) return no_block(sc, mk, layer, bp);
    ls_status s = LS_OK;
    for (int64_t p0 = 0; p0 < np && s == LS_OK; p0 += bp) {
        int64_t nb = np - p0 < bp ? np - p0 : bp;
        pack_block(be, buf, k, v, p0, nb, page_bytes, page_bytes);
        s = ls_comm_send(c, buf, 2 * (size_t)nb * page_bytes, dst, TAG(layer, TAG_PAGES));
    }
    ls_arena_release(sc, mk);
    return s;
}

ls_status ls_dist_pages_recv(const ls_backend *be, const ls_comm *c, int64_t npos, int64_t page_size,
                             size_t page_bytes, int64_t bp, int src, int layer, ls_dist_pages_fn fn, void *ctx,
                             ls_arena *sc) {
    int64_t np = pages_of(npos, page_size);
    ls_arena_mark mk = ls_arena_get_mark(sc);
    char *buf = ls_arena_host_alloc(sc, 2 * (size_t)bp * page_bytes);
    char *dev = ls_host_direct(be) ? buf : ls_arena_alloc(sc, 2 * (size_t)bp * page_bytes);
    void **kp = ls_arena_host_alloc(sc, 2 * (size_t)bp * sizeof(void *));
    if (!buf || !dev || !kp) return no_block(sc, mk, layer, bp);
    ls_status s = LS_OK;
    for (int64_t p0 = 0; p0 < np && s == LS_OK; p0 += bp) {
        int64_t nb = np - p0 < bp ? np - p0 : bp;
        s = ls_comm_recv(c, buf, 2 * (size_t)nb * page_bytes, src, TAG(layer, TAG_PAGES));
        if (s != LS_OK) break;
        unpack_block(place_block(be, dev, buf, 2 * (size_t)nb * page_bytes), kp, kp + bp, nb, page_bytes, page_bytes);
        s = fn(ctx, kp, kp + bp, NULL, NULL, nb, block_rows(npos, page_size, p0, nb));
    }
    ls_arena_release(sc, mk);
    return s;
}

ls_status ls_dist_pages_send_grad(const ls_backend *be, const ls_comm *c, void *const *k, void *const *v,
                                  void *const *dk, void *const *dv, int64_t npos, int64_t page_size, size_t page_bytes,
                                  int64_t grad_floats, int64_t bp, int dst, int layer, ls_arena *sc) {
    int64_t np = pages_of(npos, page_size);
    size_t db = 2 * (size_t)bp * (size_t)grad_floats * sizeof(float);
    ls_arena_mark mk = ls_arena_get_mark(sc);
    char *buf = ls_arena_host_alloc(sc, 2 * (size_t)bp * page_bytes);
    float *dbuf = ls_arena_host_alloc(sc, db);
    float *ddev = ls_host_direct(be) ? dbuf : ls_arena_alloc(sc, db);
    if (!buf || !dbuf || !ddev) return no_block(sc, mk, layer, bp);
    ls_status s = LS_OK;
    for (int64_t p0 = 0; p0 < np && s == LS_OK; p0 += bp) {
        int64_t nb = np - p0 < bp ? np - p0 : bp;
        pack_block(be, buf, k, v, p0, nb, page_bytes, page_bytes);
        s = ls_comm_send(c, buf, 2 * (size_t)nb * page_bytes, dst, TAG(layer, TAG_PAGES));
        if (s == LS_OK)
            s = ls_comm_recv(c, dbuf, 2 * (size_t)nb * (size_t)grad_floats * sizeof(float), dst,
                             TAG(layer, TAG_PAGE_GRADS));
        if (s != LS_OK) break;
        const float *g = (const float *)place_block(be, (char *)ddev, (char *)dbuf,
                                                    2 * (size_t)nb * (size_t)grad_floats * sizeof(float));
        for (int64_t i = 0; i < nb; i++) { /* the holder's dK/dV += the reader's (an op: they are the backend's) */
            ls_op_add_to(be, dk[p0 + i], g + i * grad_floats, grad_floats);
            ls_op_add_to(be, dv[p0 + i], g + (nb + i) * grad_floats, grad_floats);
        }
    }
    ls_arena_release(sc, mk);
    return s;
}

ls_status ls_dist_pages_recv_grad(const ls_backend *be, const ls_comm *c, int64_t npos, int64_t page_size,
                                  size_t page_bytes, int64_t grad_floats, int64_t bp, int src, int layer,
                                  ls_dist_pages_fn fn, void *ctx, ls_arena *sc) {
    int64_t np = pages_of(npos, page_size);
    size_t gb = (size_t)grad_floats * sizeof(float);
    int direct = ls_host_direct(be);
    ls_arena_mark mk = ls_arena_get_mark(sc);
    char *buf = ls_arena_host_alloc(sc, 2 * (size_t)bp * page_bytes);
    char *dev = direct ? buf : ls_arena_alloc(sc, 2 * (size_t)bp * page_bytes);
    char *dbuf = ls_arena_host_alloc(sc, 2 * (size_t)bp * gb);
    char *ddev = direct ? dbuf : ls_arena_alloc(sc, 2 * (size_t)bp * gb);
    void **kp = ls_arena_host_alloc(sc, 4 * (size_t)bp * sizeof(void *));
    if (!buf || !dev || !dbuf || !ddev || !kp) return no_block(sc, mk, layer, bp);
    void **vp = kp + bp, **dkp = kp + 2 * bp, **dvp = kp + 3 * bp;
    ls_status s = LS_OK;
    for (int64_t p0 = 0; p0 < np && s == LS_OK; p0 += bp) {
        int64_t nb = np - p0 < bp ? np - p0 : bp;
        s = ls_comm_recv(c, buf, 2 * (size_t)nb * page_bytes, src, TAG(layer, TAG_PAGES));
        if (s != LS_OK) break;
        be->i->zero(be, ddev, 2 * (size_t)nb * gb);
        unpack_block(place_block(be, dev, buf, 2 * (size_t)nb * page_bytes), kp, vp, nb, page_bytes, page_bytes);
        unpack_block(ddev, dkp, dvp, nb, gb, gb);
        s = fn(ctx, kp, vp, (float *const *)dkp, (float *const *)dvp, nb, block_rows(npos, page_size, p0, nb));
        if (s == LS_OK && !direct) be->i->to_host(be, dbuf, ddev, 2 * (size_t)nb * gb);
        if (s == LS_OK) s = ls_comm_send(c, dbuf, 2 * (size_t)nb * gb, src, TAG(layer, TAG_PAGE_GRADS));
    }
    ls_arena_release(sc, mk);
    return s;
}

/* A layer's relayed state has at most this many parts (recurrent state, conv tail). */
#define MAX_PARTS 2

/* How a part moves: sent (read), received (written) or both (a broadcast). */
enum { PART_SEND = 1, PART_RECV = 2 };

/* One part through a host view (itself on a host-memory backend). */
static ls_status move_part(const ls_backend *be, const ls_comm *c, const ls_dist_part *p, int how, int peer, int tag) {
    void *h = ls_host_view(be, NULL, p->p, p->bytes, how & PART_SEND);
    if (!h) return ls_err(LS_ERR_NOMEM, "staging %zu bytes of a relayed state", p->bytes);
    ls_status s = how == PART_SEND   ? ls_comm_send(c, h, p->bytes, peer, tag)
                  : how == PART_RECV ? ls_comm_recv(c, h, p->bytes, peer, tag)
                                     : ls_comm_bcast(c, h, p->bytes, peer);
    ls_host_view_done(be, NULL, p->p, h, p->bytes, s == LS_OK && (how & PART_RECV));
    return s;
}

ls_status ls_dist_relay_send(const ls_backend *be, const ls_comm *c, const ls_dist_part *parts, int n, int dst,
                             int layer) {
    LS_ASSERT(n <= MAX_PARTS, "a relayed state has at most %d parts (%d)", MAX_PARTS, n);
    for (int i = 0; i < n; i++)
        if (parts[i].bytes) LS_TRY(move_part(be, c, &parts[i], PART_SEND, dst, TAG(layer, TAG_PARTS + i)));
    return LS_OK;
}

ls_status ls_dist_relay_recv(const ls_backend *be, const ls_comm *c, const ls_dist_part *parts, int n, int src,
                             int layer) {
    LS_ASSERT(n <= MAX_PARTS, "a relayed state has at most %d parts (%d)", MAX_PARTS, n);
    for (int i = 0; i < n; i++)
        if (parts[i].bytes) LS_TRY(move_part(be, c, &parts[i], PART_RECV, src, TAG(layer, TAG_PARTS + i)));
    return LS_OK;
}

ls_status ls_dist_bcast_parts(const ls_backend *be, const ls_comm *c, const ls_dist_part *parts, int n, int root) {
    for (int i = 0; i < n; i++)
        if (parts[i].bytes) LS_TRY(move_part(be, c, &parts[i], PART_SEND | PART_RECV, root, 0));
    return LS_OK;
}

/* ---- the gather by rounds ------------------------------------------------------------ */

int64_t ls_dist_gather_block(int64_t bp, int ranks, int slots) {
    int64_t den = (int64_t)(ranks + 1) * (slots > 0 ? slots : 1), b = bp * 8 / den;
    if (b > bp) b = bp;
    return b > 0 ? b : 1;
}

size_t ls_dist_gather_bytes(int64_t bp, int ranks, int slots, size_t kb, size_t vb) {
    if (ranks <= 1 || slots <= 0) return 0;
    int64_t b = ls_dist_gather_block(bp, ranks, slots);
    /* the round's send slot and every rank's, K | V; one block on the device; its page pointers */
    return (size_t)(ranks + 1) * (size_t)slots * (size_t)b * (kb + vb) + (size_t)b * (kb + vb) +
           2 * (size_t)b * sizeof(void *);
}

/* Whether a later segment of another rank reads segment sg's pages. */
static int seg_read(const ls_dist_segs *g, int sg) {
    if (g->npos[sg] <= 0) return 0;
    for (int t = sg + 1; t < g->n; t++)
        if (g->npos[t] > 0 && g->owner[t] != g->owner[sg]) return 1;
    return 0;
}

/* The rounds of both gathers; gk > 0 (with gfn): with gradients, gk and gv floats a page
 * (cp.h). */
static ls_status gather(const ls_backend *be, const ls_comm *c, const ls_dist_segs *g, int64_t page_size, size_t kb,
                        size_t vb, int64_t gk, int64_t gv, int64_t bp, int layer, ls_dist_seg_fn fn,
                        ls_dist_seg_grad_fn gfn, void *ctx, ls_arena *sc) {
    int N = ls_comm_size(c), me = ls_comm_rank(c);
    if (N <= 1) return LS_OK;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    int *slot = ls_arena_host_alloc(sc, (size_t)(g->n + N) * sizeof(int)), *per = slot ? slot + g->n : NULL;
    if (!slot) return no_block(sc, mk, layer, bp);
    /* each read segment's slot among its owner's; the fullest rank's count; the rounds */
    int slots = 0;
    int64_t rounds = 0;
    memset(per, 0, (size_t)N * sizeof(int));
    for (int sg = 0; sg < g->n; sg++) {
        slot[sg] = seg_read(g, sg) ? per[g->owner[sg]]++ : -1;
        if (per[g->owner[sg]] > slots) slots = per[g->owner[sg]];
    }
    if (slots == 0) {
        ls_arena_release(sc, mk);
        return LS_OK;
    }
    /* with gradients the block's K | V and dK | dV count against the same budget */
    size_t gkb = (size_t)gk * sizeof(float), gvb = (size_t)gv * sizeof(float); /* one dK page, one dV page */
    int gf = gk > 0;
    int64_t b = ls_dist_gather_block(bp, gf ? 2 * N : N, slots);
    for (int sg = 0; sg < g->n; sg++)
        if (slot[sg] >= 0) {
            int64_t r = (pages_of(g->npos[sg], page_size) + b - 1) / b;
            if (r > rounds) rounds = r;
        }
    size_t blk = (size_t)b * (kb + vb), sb = (size_t)slots * blk, gblk = (size_t)b * (gkb + gvb);
    char *send = ls_arena_host_alloc(sc, sb), *recv = ls_arena_host_alloc(sc, (size_t)N * sb);
    char *dev = ls_host_direct(be) ? NULL : ls_arena_alloc(sc, blk);
    void **kp = ls_arena_host_alloc(sc, 4 * (size_t)b * sizeof(void *));
    if (!send || !recv || !kp || (!ls_host_direct(be) && !dev)) return no_block(sc, mk, layer, b);
    /* gradients: my share of every other rank's read blocks, by owner then slot; theirs of mine */
    size_t *sbytes = NULL, *rbytes = NULL, *soff = NULL;
    char *gsend = NULL, *grecv = NULL, *gdev = NULL;
    if (gf) {
        sbytes = ls_arena_host_alloc(sc, 3 * (size_t)N * sizeof(size_t));
        if (!sbytes) return no_block(sc, mk, layer, b);
        rbytes = sbytes + N, soff = rbytes + N;
        size_t tot = 0;
        for (int r = 0; r < N; r++) {
            soff[r] = tot;
            sbytes[r] = r == me ? 0 : (size_t)per[r] * gblk;
            rbytes[r] = r == me ? 0 : (size_t)per[me] * gblk;
            tot += sbytes[r];
        }
        gsend = ls_arena_host_alloc(sc, tot ? tot : 1);
        grecv = ls_arena_host_alloc(sc, (size_t)(N - 1) * (size_t)per[me] * gblk + 1);
        gdev = ls_host_direct(be) ? NULL : ls_arena_alloc(sc, gblk);
        if (!gsend || !grecv || (!ls_host_direct(be) && !gdev)) return no_block(sc, mk, layer, b);
    }
    ls_status s = LS_OK;
    for (int64_t r = 0; r < rounds && s == LS_OK; r++) {
        int64_t p0 = r * b;
        for (int sg = 0; sg < g->n; sg++) { /* my read segments' block r */
            int64_t np = pages_of(g->npos[sg], page_size);
            if (g->owner[sg] != me || slot[sg] < 0 || p0 >= np) continue;
            pack_block(be, send + (size_t)slot[sg] * blk, g->k[sg], g->v ? g->v[sg] : NULL, p0, np - p0 < b ? np - p0 : b, kb, vb);
        }
        s = ls_comm_allgather(c, send, recv, sb);
        if (s == LS_OK && gf) memset(gsend, 0, soff[N - 1] + sbytes[N - 1]);
        for (int sg = 0; sg < g->n && s == LS_OK; sg++) {
            int64_t np = pages_of(g->npos[sg], page_size);
            if (g->owner[sg] == me || slot[sg] < 0 || p0 >= np) continue;
            int64_t nb = np - p0 < b ? np - p0 : b, rows = block_rows(g->npos[sg], page_size, p0, nb);
            char *at = recv + (size_t)g->owner[sg] * sb + (size_t)slot[sg] * blk;
            unpack_block(place_block(be, dev, at, (size_t)nb * (kb + vb)), kp, kp + b, nb, kb, vb);
            if (!gf) {
                s = fn(ctx, sg, kp, kp + b, nb, rows, p0 * page_size);
                continue;
            }
            /* the block's gradient: into its place in the message (or on the device, then there) */
            char *gat = gsend + soff[g->owner[sg]] + (size_t)slot[sg] * gblk, *gb = gdev ? gdev : gat;
            if (gdev) be->i->zero(be, gdev, (size_t)nb * (gkb + gvb));
            unpack_block(gb, kp + 2 * b, kp + 3 * b, nb, gkb, gvb);
            s = gfn(ctx, sg, kp, kp + b, (float *const *)(kp + 2 * b), (float *const *)(kp + 3 * b), nb, rows,
                    p0 * page_size);
            if (s == LS_OK && gdev) be->i->to_host(be, gat, gdev, (size_t)nb * (gkb + gvb));
        }
        if (s != LS_OK || !gf) continue;
        s = ls_comm_alltoallv(c, gsend, sbytes, grecv, rbytes);
        for (int sg = 0; sg < g->n && s == LS_OK; sg++) { /* the other ranks' shares of my blocks, rank order */
            int64_t np = pages_of(g->npos[sg], page_size);
            if (g->owner[sg] != me || slot[sg] < 0 || p0 >= np) continue;
            int64_t nb = np - p0 < b ? np - p0 : b;
            for (int q = 0, i = 0; q < N; q++) {
                if (q == me) continue;
                char *at = grecv + ((size_t)i++ * (size_t)per[me] + (size_t)slot[sg]) * gblk;
                unpack_block(place_block(be, gdev, at, (size_t)nb * (gkb + gvb)), kp + 2 * b, kp + 3 * b, nb, gkb, gvb);
                for (int64_t j = 0; j < nb; j++) {
                    ls_op_add_to(be, (float *)g->dk[sg][p0 + j], (const float *)kp[2 * b + j], gk);
                    if (gv) ls_op_add_to(be, (float *)g->dv[sg][p0 + j], (const float *)kp[3 * b + j], gv);
                }
            }
        }
    }
    ls_arena_release(sc, mk);
    return s;
}

ls_status ls_dist_pages_gather(const ls_backend *be, const ls_comm *c, const ls_dist_segs *g, int64_t page_size,
                               size_t kb, size_t vb, int64_t bp, int layer, ls_dist_seg_fn fn, void *ctx, ls_arena *sc) {
    return gather(be, c, g, page_size, kb, vb, 0, 0, bp, layer, fn, NULL, ctx, sc);
}

ls_status ls_dist_pages_gather_grad(const ls_backend *be, const ls_comm *c, const ls_dist_segs *g, int64_t page_size,
                                    size_t kb, size_t vb, int64_t gk, int64_t gv, int64_t bp, int layer,
                                    ls_dist_seg_grad_fn fn, void *ctx, ls_arena *sc) {
    if (gk <= 0 || gv < 0) return ls_err(LS_ERR_ARG, "layer %d: a gather with gradients needs gradient pages", layer);
    return gather(be, c, g, page_size, kb, vb, gk, gv, bp, layer, NULL, fn, ctx, sc);
}

/* ---- waves ----------------------------------------------------------------------------- */

int64_t ls_cp_waves(int64_t fullest, int64_t C, int64_t forced, size_t per_pos, int64_t *nw) {
    int64_t W = forced > 0 ? forced : (int64_t)(LS_CP_WAVE_BYTES / (per_pos > 0 ? per_pos : 1));
    if (forced <= 0 && W < C) W = C;
    if (W < 1) W = 1;
    *nw = fullest > 0 ? (fullest + W - 1) / W : 1;
    return W;
}
