/*
 * moe_ep.c — expert parallelism: the combine of the routed outputs and the expert gather
 * of an export (cp.h).
 */
#include <string.h>

#include "longstraw/cp.h"
#include "longstraw/backend.h"

#define ALLOC_F(arena, n) ((float *)ls_arena_host_alloc((arena), (size_t)(n) * sizeof(float)))

/* Rank d of the EP group holds a share of token t's routed outputs iff one of t's
 * experts (sel [T, K]) is among its n_local. */
static int ep_holds(const int32_t *sel, int64_t t, int K, int64_t n_local, int d) {
    for (int k = 0; k < K; k++)
        if (sel[t * K + k] / n_local == d) return 1;
    return 0;
}

/* Rank s owns tokens [s·q, (s+1)·q), q = ⌈T/N⌉: one all-to-all sends each row a rank
 * holds a share of to its owner, which sums the shares in rank order, and one
 * all-gather spreads the slices. */
ls_status ls_dist_ep_combine(const ls_backend *be, float *y_dev, int64_t T, int64_t W, const int32_t *sel_dev, int K,
                             int64_t n_local, const ls_comm *ep, ls_arena *sc) {
    int N = ls_comm_size(ep), r = ls_comm_rank(ep);
    int64_t q = (T + N - 1) / N, lo = (int64_t)r * q, hi = lo + q < T ? lo + q : T, nl = n_local;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    size_t yb = (size_t)(T * W) * sizeof(float), selb = (size_t)(T * K) * sizeof(int32_t);
    float *y = ls_host_view(be, sc, y_dev, yb, 1); /* host views of the outputs and the routing */
    const int32_t *sel = ls_host_view(be, sc, (void *)sel_dev, selb, 1);
    size_t *cnt = ls_arena_host_alloc(sc, (size_t)(2 * N) * sizeof(size_t)), *rcnt = cnt ? cnt + N : NULL;
    float *snd = ALLOC_F(sc, T * W), *rcv = ALLOC_F(sc, (N * q > 0 ? N * q : 1) * W);
    float *all = ALLOC_F(sc, (N * q > 0 ? N * q : 1) * W), *mine = ALLOC_F(sc, (q > 0 ? q : 1) * W);
    if (!cnt || !snd || !rcv || !all || !mine || !y || !sel) return LS_ERR_NOMEM;
    /* out: the rows this rank holds a share of, to the owner of each token's slice (in
     * rank order, tokens ascending); in: the shares of this rank's slice, from each rank */
    int64_t ns = 0;
    for (int s = 0; s < N; s++) {
        int64_t n = 0;
        for (int64_t t = (int64_t)s * q; t < (s + 1) * q && t < T; t++)
            if (ep_holds(sel, t, K, nl, r)) memcpy(snd + (ns + n++) * W, y + t * W, (size_t)W * sizeof(float));
        cnt[s] = (size_t)(n * W) * sizeof(float), ns += n;
        int64_t nr = 0;
        for (int64_t t = lo; t < hi; t++) nr += ep_holds(sel, t, K, nl, s);
        rcnt[s] = (size_t)(nr * W) * sizeof(float);
    }
    LS_TRY(ls_comm_alltoallv(ep, snd, cnt, rcv, rcnt));
    /* the slice's sums, ranks in order (the same bits whatever the group's timing) */
    memset(mine, 0, (size_t)((q > 0 ? q : 1) * W) * sizeof(float));
    const float *in = rcv;
    for (int d = 0; d < N; d++)
        for (int64_t t = lo; t < hi; t++)
            if (ep_holds(sel, t, K, nl, d)) {
                float *o = mine + (t - lo) * W;
                for (int64_t i = 0; i < W; i++) o[i] += in[i];
                in += W;
            }
    LS_TRY(ls_comm_allgather(ep, mine, all, (size_t)(q * W) * sizeof(float)));
    memcpy(y, all, (size_t)(T * W) * sizeof(float));
    ls_host_view_done(be, sc, y_dev, y, yb, 1);
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* The export's point-to-point tag (an EP group carries no other tagged message). */
#define TAG_EXPORT 7

ls_status ls_dist_ep_gather(const ls_comm *ep, const float *mine, float *out, int64_t n, int owner) {
    int r = ls_comm_rank(ep);
    if (owner == 0 || (r != owner && r != 0)) return LS_OK;
    if (r == owner) return ls_comm_send(ep, mine, (size_t)n * sizeof(float), 0, TAG_EXPORT);
    return ls_comm_recv(ep, out, (size_t)n * sizeof(float), owner, TAG_EXPORT);
}
