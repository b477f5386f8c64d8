/*
 * decoder.c — the decoder layer both families fill (decoder.h): the layer skeleton,
 * SwiGLU on rows with its LoRA side branches, and the routed experts of an MoE layer,
 * forward and backward, all through the backend's ops.
 */
#include <string.h>

#include "decoder.h"

#define ALLOC_F(arena, n) ((float *)ls_arena_alloc((arena), (size_t)(n) * sizeof(float)))

ls_status ls_dec_swiglu_fwd(const ls_backend *be, float *out, float *gu, float *act, const float *xs, int64_t n,
                            int64_t D, int64_t I, const float *gu_w, const float *down_w, int accumulate,
                            const ls_ffn_lora *fl, ls_arena *sc) {
    ls_arena_mark mk = ls_arena_get_mark(sc);
    if (!gu) gu = ALLOC_F(sc, n * 2 * I);
    if (!act) act = ALLOC_F(sc, n * I);
    if (!gu || !act) return LS_ERR_NOMEM;
    int lora = fl && fl->lora;
    ls_op_linear_fwd(be, gu, xs, gu_w, n, D, 2 * I, 0);
    if (lora) LS_TRY(ls_lora_linear_fwd(fl->lora, fl->layer, fl->gu, fl->gu_off, 2 * I, gu, xs, n, sc));
    ls_op_swiglu_fwd(be, act, gu, n, I);
    ls_op_linear_fwd(be, out, act, down_w, n, I, D, accumulate);
    if (lora) LS_TRY(ls_lora_linear_fwd(fl->lora, fl->layer, fl->down, fl->down_off, D, out, act, n, sc));
    ls_arena_release(sc, mk);
    return LS_OK;
}

ls_status ls_dec_swiglu_bwd(const ls_backend *be, float *dxs, float *dgu_w, float *ddown_w, const float *dout,
                            const float *xs, const float *gu, const float *act, const float *gu_w, const float *down_w,
                            int64_t n, int64_t D, int64_t I, int accumulate, const ls_ffn_lora *fl, ls_arena *sc) {
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *d_act = ALLOC_F(sc, n * I);   /* [n, I] */
    float *dgu = ALLOC_F(sc, n * 2 * I); /* [n, 2I] */
    if (!d_act || !dgu) return LS_ERR_NOMEM;
    int lora = fl && fl->lora;
    ls_op_linear_bwd(be, d_act, ddown_w, dout, act, down_w, n, I, D, 0);
    if (lora) LS_TRY(ls_lora_linear_bwd((ls_lora *)fl->lora, fl->layer, fl->down, fl->down_off, D, d_act, dout, act, n, sc));
    ls_op_swiglu_bwd(be, dgu, d_act, gu, n, I);
    ls_op_linear_bwd(be, dxs, dgu_w, dgu, xs, gu_w, n, D, 2 * I, accumulate);
    if (lora) LS_TRY(ls_lora_linear_bwd((ls_lora *)fl->lora, fl->layer, fl->gu, fl->gu_off, 2 * I, dxs, dgu, xs, n, sc));
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* expert le's adapters: the template's tensors at the expert's rows */
static ls_ffn_lora expert_lora(const ls_dec_experts *ex, int64_t le) {
    ls_ffn_lora f = ex->lora;
    f.gu_off = le * 2 * ex->I;
    f.down_off = le * ex->D;
    return f;
}

/* count[E+1] (host memory: the expert loop's bounds, read back once per layer), rows[T·K]
 * grouped by expert, and the largest group of this rank's experts */
static ls_status group(const ls_backend *be, const ls_dec_experts *ex, const int32_t *sel, int64_t T, int64_t **count,
                       int64_t **rows, int64_t *maxn, ls_arena *sc) {
    size_t cb = (size_t)(ex->E + 1) * sizeof(int64_t);
    int64_t *dcount = ls_arena_alloc(sc, cb);
    *rows = ls_arena_alloc(sc, (size_t)(T * ex->K) * sizeof(int64_t));
    if (!dcount || !*rows) return LS_ERR_NOMEM;
    LS_TRY(ls_op_moe_group(be, dcount, *rows, sel, T, ex->E, ex->K, sc));
    if (!(*count = ls_host_view(be, sc, dcount, cb, 1))) return LS_ERR_NOMEM;
    *maxn = 0;
    for (int64_t e = ex->e0; e < ex->e0 + ex->ne; e++) {
        int64_t n = (*count)[e + 1] - (*count)[e];
        if (n > *maxn) *maxn = n;
    }
    return LS_OK;
}

ls_status ls_dec_experts_fwd(const ls_backend *be, const ls_dec_experts *ex, float *y, const float *xn,
                             const int32_t *sel, const float *wt, int64_t T, ls_arena *sc) {
    ls_arena_mark mk = ls_arena_get_mark(sc);
    int64_t D = ex->D, I = ex->I, *count, *rows, maxn;
    LS_TRY(group(be, ex, sel, T, &count, &rows, &maxn, sc));
    float *xs = ALLOC_F(sc, maxn * D), *ys = ALLOC_F(sc, maxn * D); /* [n_e, D] */
    if (!xs || !ys) return LS_ERR_NOMEM;
    for (int64_t e = ex->e0; e < ex->e0 + ex->ne; e++) {
        int64_t n = count[e + 1] - count[e], le = e - ex->e0;
        if (n == 0) continue;
        const int64_t *r = rows + count[e];
        ls_ffn_lora fl = expert_lora(ex, le);
        ls_op_moe_gather(be, xs, xn, r, n, D, ex->K);
        LS_TRY(ls_dec_swiglu_fwd(be, ys, NULL, NULL, xs, n, D, I, ex->gu_w + le * 2 * I * D, ex->down_w + le * D * I, 0,
                                 &fl, sc));
        ls_op_moe_scatter_add(be, y, ys, r, wt, n, D, ex->K);
    }
    ls_arena_release(sc, mk);
    return LS_OK;
}

ls_status ls_dec_experts_bwd(const ls_backend *be, const ls_dec_experts *ex, float *dwt, float *dxn, const float *dy,
                             const float *xn, const int32_t *sel, const float *wt, int64_t T, ls_arena *sc) {
    ls_arena_mark mk = ls_arena_get_mark(sc);
    int64_t D = ex->D, I = ex->I, *count, *rows, maxn;
    LS_TRY(group(be, ex, sel, T, &count, &rows, &maxn, sc));
    float *xs = ALLOC_F(sc, maxn * D), *ys = ALLOC_F(sc, maxn * D), *dys = ALLOC_F(sc, maxn * D);
    float *gu = ALLOC_F(sc, maxn * 2 * I), *act = ALLOC_F(sc, maxn * I), *dxs = ALLOC_F(sc, maxn * D);
    if (!xs || !ys || !dys || !gu || !act || !dxs) return LS_ERR_NOMEM;
    for (int64_t e = ex->e0; e < ex->e0 + ex->ne; e++) {
        int64_t n = count[e + 1] - count[e], le = e - ex->e0;
        if (n == 0) continue;
        const int64_t *r = rows + count[e];
        const float *Wgu = ex->gu_w + le * 2 * I * D, *Wdn = ex->down_w + le * D * I;
        ls_ffn_lora fl = expert_lora(ex, le);
        ls_op_moe_gather(be, xs, xn, r, n, D, ex->K);
        /* the expert, recomputed (its activations are not on the tape) */
        LS_TRY(ls_dec_swiglu_fwd(be, ys, gu, act, xs, n, D, I, Wgu, Wdn, 0, &fl, sc));
        ls_op_moe_combine_bwd(be, dys, dwt, dy, ys, r, wt, n, D, ex->K);
        LS_TRY(ls_dec_swiglu_bwd(be, dxs, ex->dgu_w ? ex->dgu_w + le * 2 * I * D : NULL,
                                 ex->ddown_w ? ex->ddown_w + le * D * I : NULL, dys, xs, gu, act, Wgu, Wdn, n, D, I, 0, &fl,
                                 sc));
        ls_op_moe_scatter_add(be, dxn, dxs, r, NULL, n, D, ex->K);
    }
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* n elements of `size` bytes of host memory x as the backend's: x, or a copy from arena a */
static const void *dev_copy(const ls_backend *be, ls_arena *a, const void *x, int64_t n, size_t size) {
    if (be->host_mem || !x) return x;
    void *d = ls_arena_alloc(a, (size_t)(n > 0 ? n : 1) * size);
    if (d && n > 0) be->i->to_device(be, d, x, (size_t)n * size);
    return d;
}

const int32_t *ls_dec_ids_in(const ls_backend *be, ls_arena *a, const int32_t *ids, int64_t n) {
    return dev_copy(be, a, ids, n, sizeof *ids);
}

const float *ls_dec_in(const ls_backend *be, ls_arena *a, const float *x, int64_t n) {
    return dev_copy(be, a, x, n, sizeof *x);
}

float *ls_dec_out(const ls_backend *be, ls_arena *a, float *out, int64_t n) {
    if (be->host_mem || !out) return out;
    return ALLOC_F(a, n > 0 ? n : 1);
}

void ls_dec_out_done(const ls_backend *be, float *out, const float *buf, int64_t n) {
    if (out && buf != out && n > 0) be->i->to_host(be, out, buf, (size_t)n * sizeof(float));
}

/* ---- the layer skeleton -------------------------------------------------------------- */
static void norm_fwd(const ls_dec_layer *d, float *y, float *rstd, const float *x, const float *w) {
    if (d->norm == LS_NORM_PLAIN) ls_op_rmsnorm_plain_fwd(d->be, y, rstd, x, w, d->T, d->D, d->eps);
    else ls_op_rmsnorm_fwd(d->be, y, rstd, x, w, d->T, d->D, d->eps);
}

static void norm_bwd(const ls_dec_layer *d, float *dx, float *dw, const float *dy, const float *x, const float *rstd,
                     const float *w) {
    if (d->norm == LS_NORM_PLAIN) ls_op_rmsnorm_plain_bwd(d->be, dx, dw, dy, x, rstd, w, d->T, d->D);
    else ls_op_rmsnorm_bwd(d->be, dx, dw, dy, x, rstd, w, d->T, d->D);
}

ls_status ls_dec_layer_fwd(const ls_dec_layer *d, float *x, int skip_ffn) {
    int64_t T = d->T, D = d->D;
    ls_dec_tape *tp = d->tp;
    ls_arena *A = tp ? d->ta : d->sc;
    ls_arena_mark mk = ls_arena_get_mark(d->sc);
    float *xn = ALLOC_F(A, T * D); /* [T, D] */
    if (!xn) return LS_ERR_NOMEM;
    if (tp) {
        tp->x_in = ALLOC_F(A, T * D);
        tp->rstd1 = ALLOC_F(A, T);
        if (!tp->x_in || !tp->rstd1) return LS_ERR_NOMEM;
        ls_op_copy(d->be, tp->x_in, x, T * D);
        tp->xn1 = xn;
    }
    /* h += Mixer(norm1(h)) */
    norm_fwd(d, xn, tp ? tp->rstd1 : NULL, x, d->input_norm);
    LS_TRY(d->mixer(d, x, xn));
    if (!skip_ffn) { /* h += FFN(norm2(h)) */
        float *xn2 = xn;
        if (tp) {
            tp->x_mid = ALLOC_F(A, T * D);
            tp->xn2 = xn2 = ALLOC_F(A, T * D);
            tp->rstd2 = ALLOC_F(A, T);
            if (!tp->x_mid || !tp->xn2 || !tp->rstd2) return LS_ERR_NOMEM;
            ls_op_copy(d->be, tp->x_mid, x, T * D);
        }
        norm_fwd(d, xn2, tp ? tp->rstd2 : NULL, x, d->post_norm);
        if (d->moe) {
            LS_TRY(d->moe(d, x, xn2));
        } else {
            float *gu = tp ? ALLOC_F(A, T * 2 * d->I) : NULL, *act = tp ? ALLOC_F(A, T * d->I) : NULL;
            if (tp && (!gu || !act)) return LS_ERR_NOMEM;
            LS_TRY(ls_dec_swiglu_fwd(d->be, x, gu, act, xn2, T, D, d->I, d->gu_w, d->down_w, 1, &d->lora, d->sc));
            if (tp) tp->gu = gu, tp->act = act;
        }
    }
    ls_arena_release(d->sc, mk); /* with a tape, everything kept came from the tape arena */
    return LS_OK;
}

ls_status ls_dec_layer_bwd(const ls_dec_layer *d, float *dx) {
    int64_t T = d->T, D = d->D;
    const ls_dec_tape *tp = d->saved;
    ls_arena_mark mk = ls_arena_get_mark(d->sc);
    float *dxn = ls_arena_calloc(d->sc, (size_t)(T * D), sizeof(float)); /* [T, D] ∂L/∂(normed input) */
    if (!dxn) return LS_ERR_NOMEM;
    /* FFN: x_out = x_mid + FFN(norm2(x_mid)) */
    if (d->moe_bwd)
        LS_TRY(d->moe_bwd(d, dx, dxn));
    else
        LS_TRY(ls_dec_swiglu_bwd(d->be, dxn, d->dgu_w, d->ddown_w, dx, tp->xn2, tp->gu, tp->act, d->gu_w, d->down_w, T,
                                 D, d->I, 1, &d->lora, d->sc));
    norm_bwd(d, dxn, d->d_post_norm, dxn, tp->x_mid, tp->rstd2, d->post_norm);
    ls_op_add_to(d->be, dx, dxn, T * D); /* ∂L/∂(mixer output) */
    /* mixer: x_mid = x_in + Mixer(norm1(x_in)) */
    ls_op_zero(d->be, dxn, T * D);
    LS_TRY(d->mixer_bwd(d, dx, dxn));
    norm_bwd(d, dxn, d->d_input_norm, dxn, tp->x_in, tp->rstd1, d->input_norm);
    ls_op_add_to(d->be, dx, dxn, T * D);
    ls_arena_release(d->sc, mk);
    return LS_OK;
}
