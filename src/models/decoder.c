/*
 * decoder.c — the skeleton both families fill (decoder.h): the model driver (capture on
 * one rank and under CP, decode, a branch forward and backward, the full-mode sweep),
 * the decoder layer, SwiGLU on rows with its LoRA side branches, and the routed experts
 * of an MoE layer, forward and backward, all through the backend's ops.
 */
#include <string.h>

#include "decoder.h"
#include "longstraw/core.h"
#include "longstraw/trace.h"

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

void ls_dec_norm1_fwd(const ls_dec_layer *d, float *xn, const float *x) { norm_fwd(d, xn, NULL, x, d->input_norm); }

ls_status ls_dec_ffn_fwd(const ls_dec_layer *d, float *x) {
    int64_t T = d->T, D = d->D;
    ls_arena_mark mk = ls_arena_get_mark(d->sc);
    float *xn2 = ALLOC_F(d->sc, T * D);
    if (!xn2) return LS_ERR_NOMEM;
    norm_fwd(d, xn2, NULL, x, d->post_norm);
    ls_status s = d->moe ? d->moe(d, x, xn2)
                         : ls_dec_swiglu_fwd(d->be, x, NULL, NULL, xn2, T, D, d->I, d->gu_w, d->down_w, 1, &d->lora, d->sc);
    ls_arena_release(d->sc, mk);
    return s;
}

ls_status ls_dec_layer_bwd(const ls_dec_layer *d, float *dx) {
    int64_t T = d->T, D = d->D;
    const ls_dec_tape *tp = d->saved;
    ls_arena_mark mk = ls_arena_get_mark(d->sc);
    float *dxn = ls_arena_calloc(d->sc, (size_t)(T * D), sizeof(float)); /* [T, D] ∂L/∂(normed input) */
    if (!dxn) return LS_ERR_NOMEM;
    if (tp->x_mid) { /* FFN: x_out = x_mid + FFN(norm2(x_mid)) (none recorded: the mixer only) */
        if (d->moe_bwd)
            LS_TRY(d->moe_bwd(d, dx, dxn));
        else
            LS_TRY(ls_dec_swiglu_bwd(d->be, dxn, d->dgu_w, d->ddown_w, dx, tp->xn2, tp->gu, tp->act, d->gu_w, d->down_w,
                                     T, D, d->I, 1, &d->lora, d->sc));
        norm_bwd(d, dxn, d->d_post_norm, dxn, tp->x_mid, tp->rstd2, d->post_norm);
        ls_op_add_to(d->be, dx, dxn, T * D); /* ∂L/∂(mixer output) */
        ls_op_zero(d->be, dxn, T * D);
    }
    /* mixer: x_mid = x_in + Mixer(norm1(x_in)) */
    LS_TRY(d->mixer_bwd(d, dx, dxn));
    norm_bwd(d, dxn, d->d_input_norm, dxn, tp->x_in, tp->rstd1, d->input_norm);
    ls_op_add_to(d->be, dx, dxn, T * D);
    ls_arena_release(d->sc, mk);
    return LS_OK;
}

ls_status ls_dec_norm1_bwd(const ls_dec_layer *d, float *dx, const float *dxn, const float *x) {
    int64_t T = d->T, D = d->D;
    ls_arena_mark mk = ls_arena_get_mark(d->sc);
    float *y = ALLOC_F(d->sc, T * D), *rstd = ALLOC_F(d->sc, T);
    if (!y || !rstd) return LS_ERR_NOMEM;
    norm_fwd(d, y, rstd, x, d->input_norm); /* its rstd (y is then the gradient) */
    norm_bwd(d, y, d->d_input_norm, dxn, x, rstd, d->input_norm);
    ls_op_add_to(d->be, dx, y, T * D);
    ls_arena_release(d->sc, mk);
    return LS_OK;
}

/* ---- the model skeleton ---------------------------------------------------------------- */
#define NEED(p)                        \
    do {                               \
        if (!(p)) return LS_ERR_NOMEM; \
    } while (0)

static int64_t chunk_of(const ls_fwd_opts *o) { return o->capture_chunk > 0 ? o->capture_chunk : 2048; }

static void final_norm(const ls_dec_model *dm, float *y, float *rstd, const float *x, int64_t n) {
    if (dm->norm == LS_NORM_PLAIN) ls_op_rmsnorm_plain_fwd(dm->be, y, rstd, x, dm->final_norm, n, dm->cfg->hidden, dm->cfg->eps);
    else ls_op_rmsnorm_fwd(dm->be, y, rstd, x, dm->final_norm, n, dm->cfg->hidden, dm->cfg->eps);
}

/* logits [n, vocab] of rows h [n, D] (normed in place), scaled by 1/temperature, to the host */
static ls_status logits_of(const ls_dec_model *dm, float *logits, float *h, int64_t n, const ls_fwd_opts *o,
                           ls_arena *sc) {
    int64_t V = dm->cfg->vocab;
    float *lg = ls_dec_out(dm->be, sc, logits, n * V);
    NEED(lg);
    final_norm(dm, h, NULL, h, n);
    ls_op_linear_fwd(dm->be, lg, h, dm->lm_head, n, dm->cfg->hidden, V, 0);
    ls_op_scale(dm->be, lg, 1.0f / o->temperature, n * V);
    ls_dec_out_done(dm->be, logits, lg, n * V);
    return LS_OK;
}

static ls_status begin(const ls_dec_model *dm, const ls_dec_pass *p) { return dm->begin ? dm->begin(dm, p) : LS_OK; }

static ls_status stopped(int64_t at, int64_t of) {
    return ls_err(LS_ERR_INTERRUPTED, "stopped by signal %d during capture, at position %lld of %lld",
                  ls_stop_requested(), (long long)at, (long long)of);
}

/* What a capture writes of a layer's state (read: the pages before, the recurrent state). */
#define CAPTURE_STAGE (LS_STAGE_PAGES | LS_STAGE_REC | LS_STAGE_CKPT)

/* Layer l of a capture pass over rows [pos0, pos0 + T) of p->st; with a stage (a state in
 * host memory) the layer runs on its device copy: pages reserved on the host, copied in,
 * and what the layer wrote copied back. */
static ls_status capture_layer(const ls_dec_model *dm, const ls_dec_pass *p, ls_state_stage *sg, int l, float *x,
                               int skip) {
    if (!sg) return dm->layer_fwd(dm, p, l, x, skip);
    int64_t hi = p->pos0 + p->T;
    LS_TRY(ls_state_reserve(p->st, l, hi));
    ls_dec_pass q = *p;
    q.st = ls_state_stage_in(sg, l, hi, p->pos0);
    LS_TRY(dm->layer_fwd(dm, &q, l, x, skip));
    ls_state_stage_out(sg, CAPTURE_STAGE, p->pos0, hi);
    return LS_OK;
}

ls_status ls_dec_extend(const ls_dec_model *dm, ls_prompt_state *st, const int32_t *ids, int64_t n, float *logits,
                        const ls_fwd_opts *o, ls_arena *sc) {
    const ls_config *c = dm->cfg;
    int64_t D = c->hidden, C = chunk_of(o);
    ls_arena_mark top = ls_arena_get_mark(sc);
    ls_state_stage *sg = NULL; /* a state in host memory: staged per layer */
    LS_TRY(ls_state_stage_new(&sg, st, dm->be, CAPTURE_STAGE, sc));
    for (int64_t c0 = 0, T; c0 < n; c0 += T) {
        /* chunks of C, cut at every sweep-chunk start (full mode: its checkpoint) */
        T = ls_state_span_end(st, 0, st->n, st->n + n - c0, C) - st->n; /* one rank: one segment from 0 */
        int last_chunk = c0 + T == n;
        if (!logits && ls_stop_requested()) return stopped(st->n, st->n + n - c0); /* waits at most one chunk */
        ls_arena_mark mk = ls_arena_get_mark(sc);
        ls_dec_pass p = {.kind = LS_DEC_EXTEND, .T = T, .pos0 = st->n, .st = st, .sweep = -1, .o = o, .sc = sc};
        float *x = ALLOC_F(sc, T * D); /* [T, D] the chunk's residual stream */
        NEED(x);
        LS_TRY(begin(dm, &p));
        const int32_t *xi = ls_dec_ids_in(dm->be, sc, ids + c0, T);
        NEED(xi);
        ls_op_embed_fwd(dm->be, x, xi, dm->embed, T, D);
        for (int l = 0; l < c->n_layers; l++) {
            /* the last layer's FFN feeds only the LM head: skipped unless logits are wanted */
            LS_TRY(capture_layer(dm, &p, sg, l, x, l == c->n_layers - 1 && !(logits && last_chunk)));
            ls_trace_layer_end(l, "fwd");
        }
        ls_state_advance(st, T);
        if (!logits) ls_progress_add(T); /* capture; decoding reports its own progress */
        if (logits && last_chunk) LS_TRY(logits_of(dm, logits, x + (T - 1) * D, 1, o, sc));
        ls_arena_release(sc, mk);
    }
    ls_arena_release(sc, top);
    return LS_OK;
}

/* ---- capture under context parallelism (DESIGN §8) -----------------------------------
 * Layer-major: for each layer, the family's cp_layer runs it over all of the rank's
 * positions at once (the residual stream of the rank's positions stays alive across
 * layers: the one buffer sized by P/N), exchanging with the other ranks what the layer
 * needs of theirs (the hybrid: a Gated DeltaNet state scan and gathered K/V pages; the
 * MLA family: gathered index keys and latent pages). Every rank makes the same
 * collectives in the same order, so the schedule cannot deadlock, and no rank waits for
 * another's compute in prompt order. */
static ls_status capture_cp(const ls_dec_model *dm, ls_prompt_state *st, const int32_t *ids, int64_t n,
                            const ls_fwd_opts *o, ls_arena *sc) {
    const ls_config *c = dm->cfg;
    if (st->n != 0 || n != st->capacity)
        return ls_err(LS_ERR_ARG, "a prompt state split over ranks is captured whole, once (%lld of %lld positions)",
                      (long long)n, (long long)st->capacity);
    LS_ASSERT(dm->cp_layer, "the family has no layer-major CP capture");
    int64_t D = c->hidden;
    int last = c->n_layers - 1; /* its FFN feeds only the LM head */
    ls_arena_mark top = ls_arena_get_mark(sc);
    ls_state_stage *sg = NULL; /* a state in host memory: staged per layer */
    LS_TRY(ls_state_stage_new(&sg, st, dm->be, CAPTURE_STAGE, sc));
    int64_t Tr = 0, xoff[LS_STATE_MAX_SEGS]; /* the rank's positions, its segments one after another */
    for (int k = 0; k < st->nseg; k++) xoff[k] = Tr, Tr += st->seg_hi[k] - st->seg_lo[k];
    float *x = ALLOC_F(sc, (Tr > 0 ? Tr : 1) * D); /* [Tr, D] the rank's residual stream */
    NEED(x);
    ls_dec_pass p = {.kind = LS_DEC_CP_CAPTURE, .T = Tr, .st = st, .sweep = -1, .o = o, .sc = sc};
    LS_TRY(begin(dm, &p));
    for (int k = 0; k < st->nseg; k++) {
        ls_arena_mark mi = ls_arena_get_mark(sc);
        const int32_t *xi = ls_dec_ids_in(dm->be, sc, ids + st->seg_lo[k], st->seg_hi[k] - st->seg_lo[k]);
        NEED(xi);
        ls_op_embed_fwd(dm->be, x + xoff[k] * D, xi, dm->embed, st->seg_hi[k] - st->seg_lo[k], D);
        ls_arena_release(sc, mi);
    }
    ls_status s = LS_OK;
    for (int l = 0; l < c->n_layers && s == LS_OK; l++) {
        /* a state in host memory: the layer's pages (all of the rank's, made here) and
         * recurrent state staged in, written back */
        ls_prompt_state *sl = st;
        for (int k = 0; sg && k < st->nseg && s == LS_OK; k++) {
            st->n = st->seg_lo[k];
            s = ls_state_reserve(st, l, st->seg_hi[k]);
        }
        if (s == LS_OK && sg) sl = ls_state_stage_in(sg, l, n, -1);
        if (s == LS_OK && st->full && st->full->xres) { /* the layer's input, for a layer-major sweep */
            float *xr = st->full->xres + (size_t)l * (size_t)Tr * (size_t)D;
            LS_ASSERT(st->full->xres_rows == Tr, "the sweep's layer inputs hold %lld rows, the rank %lld",
                      (long long)st->full->xres_rows, (long long)Tr);
            if (ls_state_resident(st, dm->be)) ls_op_copy(dm->be, xr, x, Tr * D);
            else if (Tr > 0) dm->be->i->to_host(dm->be, xr, x, (size_t)(Tr * D) * sizeof(float));
        }
        if (s == LS_OK) s = dm->cp_layer(dm, sl, st, l, x, l == last, o, sc);
        if (s == LS_OK && sg) ls_state_stage_out(sg, LS_STAGE_REC | LS_STAGE_PAGES, 0, n);
        ls_trace_layer_end(l, "fwd");
    }
    ls_progress_add(n); /* layer-major: the whole prompt is done only now */
    st->n = n;
    ls_arena_release(sc, top);
    return s;
}

/* (decoder.h) */
int ls_dec_cp_chunk(const ls_prompt_state *st, const int64_t *xoff, int64_t C, int64_t r0, int64_t r1, int *k,
                     int64_t *c0, int64_t *T, int64_t *r) {
    for (; *k < st->nseg; (*k)++, *c0 = -1) {
        int64_t lo = st->seg_lo[*k], hi = st->seg_hi[*k];
        int64_t a = lo + (r0 > xoff[*k] ? r0 - xoff[*k] : 0), b = lo + (r1 - xoff[*k]);
        if (b > hi) b = hi;
        int64_t p = *c0 < 0 ? a : *c0;
        if (p >= b) continue;
        int64_t e = ls_state_span_end(st, lo, p, hi, C);
        if (e > b) e = b;
        *T = e - p, *r = xoff[*k] + p - lo, *c0 = e;
        return 1;
    }
    return 0;
}

ls_status ls_dec_cp_segs(const ls_prompt_state *st, int l, int with_v, ls_arena *sc, ls_dist_segs *g, int64_t **lo) {
    int n = ls_state_segments(st);
    int *owner = ls_arena_host_alloc(sc, (size_t)n * sizeof(int));
    int64_t *first = ls_arena_host_alloc(sc, 2 * (size_t)n * sizeof(int64_t)), *npos = first ? first + n : NULL;
    void ***kt = ls_arena_host_alloc(sc, 2 * (size_t)n * sizeof(void **)), ***vt = kt ? kt + n : NULL;
    NEED(owner && first && kt);
    for (int sg = 0; sg < n; sg++) {
        int64_t hi;
        ls_state_segment(st, sg, &owner[sg], &first[sg], &hi);
        npos[sg] = hi - first[sg], kt[sg] = vt[sg] = NULL;
        for (int k = 0; k < st->nseg; k++)
            if (owner[sg] == st->rank && st->seg_lo[k] == first[sg]) {
                kt[sg] = st->attn[l].k_pages + st->seg_lpage[k];
                if (with_v) vt[sg] = st->attn[l].v_pages + st->seg_lpage[k];
            }
    }
    *g = (ls_dist_segs){n, owner, npos, kt, with_v ? vt : NULL, NULL, NULL};
    if (lo) *lo = first;
    return LS_OK;
}

ls_status ls_dec_capture(const ls_dec_model *dm, ls_prompt_state *st, const int32_t *ids, int64_t n,
                         const ls_fwd_opts *o, ls_arena *sc) {
    if (st->nranks > 1) return capture_cp(dm, st, ids, n, o, sc);
    return ls_dec_extend(dm, st, ids, n, NULL, o, sc);
}

ls_status ls_dec_decode(const ls_dec_model *dm, ls_prompt_state *const *sts, const int32_t *ids, int n,
                        float *logits, const ls_fwd_opts *o, ls_arena *sc) {
    const ls_config *c = dm->cfg;
    if (!dm->batched_decode) { /* each sequence its own pass: one token each */
        for (int i = 0; i < n; i++) LS_TRY(ls_dec_extend(dm, sts[i], ids + i, 1, logits + (int64_t)i * c->vocab, o, sc));
        return LS_OK;
    }
    for (int i = 0; i < n; i++)
        if (!ls_state_resident(sts[i], dm->be))
            return ls_err(LS_ERR_UNSUPPORTED, "batched decode of a prompt state in host memory is not built "
                                              "(--state-on host serves logprobs, grad and step)");
    int64_t D = c->hidden;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    ls_dec_pass p = {.kind = LS_DEC_DECODE, .T = n, .seqs = sts, .sweep = -1, .o = o, .sc = sc};
    float *x = ALLOC_F(sc, (int64_t)n * D); /* [n, D]: one row per sequence */
    NEED(x);
    ls_status s = begin(dm, &p);
    const int32_t *xi = ls_dec_ids_in(dm->be, sc, ids, n);
    if (s == LS_OK && !xi) s = LS_ERR_NOMEM;
    if (s == LS_OK) ls_op_embed_fwd(dm->be, x, xi, dm->embed, n, D);
    for (int l = 0; l < c->n_layers && s == LS_OK; l++) s = dm->layer_fwd(dm, &p, l, x, 0);
    if (s == LS_OK) {
        for (int i = 0; i < n; i++) ls_state_advance(sts[i], 1);
        s = logits_of(dm, logits, x, n, o, sc);
    }
    ls_arena_release(sc, mk);
    return s;
}

ls_status ls_dec_branch_fwd(const ls_dec_model *dm, const ls_prompt_state *view, const int32_t *ids, int64_t T,
                            int64_t out_from, int64_t grad_from, const int32_t *target, float *logprob,
                            float *entropy, ls_dec_branch **tape_out, const ls_fwd_opts *o, ls_arena *tape_arena,
                            ls_arena *sc, int sweep) {
    const ls_config *c = dm->cfg;
    int64_t D = c->hidden, pos0 = view ? view->n : 0;
    LS_ASSERT(out_from >= 0 && out_from <= T, "out_from %lld outside [0, %lld]", (long long)out_from, (long long)T);
    LS_ASSERT(grad_from >= 0 && grad_from <= out_from, "grad_from %lld", (long long)grad_from);
    int taping = tape_out != NULL;
    ls_arena *A = taping ? tape_arena : sc; /* what outlives a layer */
    ls_arena_mark mk = ls_arena_get_mark(sc);
    int64_t n = T - out_from; /* rows that predict a target */
    ls_dec_pass p = {.kind = LS_DEC_BRANCH, .T = T, .pos0 = pos0, .grad_from = grad_from, .view = view,
                     .sweep = sweep, .o = o, .ta = tape_arena, .sc = sc};
    ids = ls_dec_ids_in(dm->be, A, ids, T); /* kept on the tape for the backward */
    target = ls_dec_ids_in(dm->be, A, target, n);
    float *lp = ls_dec_out(dm->be, sc, logprob, n), *ent = ls_dec_out(dm->be, sc, entropy, n);
    NEED(ids && (target || n == 0) && (lp || !logprob) && (ent || !entropy));
    ls_state_stage *sg = NULL; /* a prefix in host memory: staged per layer (again in the backward) */
    if (view) LS_TRY(ls_state_stage_new(&sg, (ls_prompt_state *)view, dm->be, LS_STAGE_PAGES | LS_STAGE_REC, A));
    if (sg) p.view = ls_state_stage_dev(sg);
    ls_dec_branch *tb = NULL;
    if (taping) {
        NEED(tb = dm->tape_new(dm, &p, A));
        tb->T = T, tb->out_from = out_from, tb->grad_from = grad_from, tb->pos0 = pos0;
        tb->ids = ids, tb->target = target, tb->temperature = o->temperature;
        tb->lmhead_rows = o->lmhead_rows, tb->stage = sg;
        p.tape = tb;
    }
    float *x = ALLOC_F(A, T * D); /* [T, D] residual stream */
    NEED(x);
    LS_TRY(begin(dm, &p));
    ls_op_embed_fwd(dm->be, x, ids, dm->embed, T, D);
    for (int l = 0; l < c->n_layers; l++) {
        if (sg) ls_state_stage_in(sg, l, pos0, -1);
        LS_TRY(dm->layer_fwd(dm, &p, l, x, 0));
        ls_trace_layer_end(l, "fwd");
    }
    if (n > 0) { /* (a sweep chunk of the prompt predicts nothing) */
        float *xo = x + out_from * D, *h = xo, *rstd = NULL; /* [n, D] rows that predict a target */
        if (taping) {
            h = ALLOC_F(A, n * D), rstd = ALLOC_F(A, n), tb->lse = ALLOC_F(A, n);
            NEED(h && rstd && tb->lse);
            tb->x_final = xo, tb->h_final = h, tb->rstd_f = rstd;
        }
        final_norm(dm, h, rstd, xo, n);
        LS_TRY(ls_op_lmhead_fwd(dm->be, lp, taping ? tb->lse : NULL, ent, h, dm->lm_head, target, n, D, c->vocab,
                                o->temperature, o->lmhead_rows, sc));
        ls_dec_out_done(dm->be, logprob, lp, n);
        ls_dec_out_done(dm->be, entropy, ent, n);
    }
    ls_arena_release(sc, mk);
    if (taping) *tape_out = tb;
    return LS_OK;
}

/* What a backward adds to of a layer's state: its gradient tables. */
#define BWD_STAGE (LS_STAGE_GPAGES | LS_STAGE_GREC)

ls_status ls_dec_branch_bwd(const ls_dec_model *dm, const ls_dec_grad *g, const ls_dec_branch *tb,
                            const float *dlogprob, const ls_dec_dstate *dc, ls_arena *sc) {
    const ls_config *c = dm->cfg;
    int64_t T = tb->T, D = c->hidden, n = T - tb->out_from;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *dx = ls_arena_calloc(sc, (size_t)(T * D), sizeof(float)); /* [T, D] ∂L/∂residual */
    NEED(dx);
    if (n > 0) { /* a sweep chunk predicts nothing: its gradient comes in through the state */
        float *dh = ALLOC_F(sc, n * D); /* [n, D] ∂L/∂(LM-head input) */
        const float *dl = ls_dec_in(dm->be, sc, dlogprob, n);
        NEED(dh && dl);
        LS_TRY(ls_op_lmhead_logprobs_bwd(dm->be, dh, g->lm_head, dl, tb->h_final, dm->lm_head, tb->target, tb->lse, n,
                                         D, c->vocab, tb->temperature, tb->lmhead_rows, sc));
        float *dxo = dx + tb->out_from * D;
        if (dm->norm == LS_NORM_PLAIN)
            ls_op_rmsnorm_plain_bwd(dm->be, dxo, g->final_norm, dh, tb->x_final, tb->rstd_f, dm->final_norm, n, D);
        else
            ls_op_rmsnorm_bwd(dm->be, dxo, g->final_norm, dh, tb->x_final, tb->rstd_f, dm->final_norm, n, D);
    }
    ls_state_stage *gs = NULL; /* a prompt-state gradient in host memory: staged per layer */
    if (dc && dc->st) LS_TRY(ls_state_stage_new(&gs, dc->st, dm->be, BWD_STAGE, sc));
    for (int l = c->n_layers - 1; l >= 0; l--) {
        ls_dec_dstate dl = dc ? *dc : (ls_dec_dstate){0};
        if (tb->stage) ls_state_stage_in(tb->stage, l, tb->pos0, -1);
        if (gs) dl.st = ls_state_stage_in(gs, l, dc->st->n, -1);
        LS_TRY(dm->layer_bwd(dm, g, tb, l, dx, dc ? &dl : NULL, sc));
        if (gs) ls_state_stage_out(gs, BWD_STAGE, 0, 0);
        ls_trace_layer_end(l, "bwd");
    }
    if (g->embed) ls_op_embed_bwd(dm->be, g->embed, dx, tb->ids, T, D);
    ls_arena_release(sc, mk);
    return LS_OK;
}

/* ---- the full-mode sweep ----------------------------------------------------------------
 * The prompt's sweep chunks (each layout segment cut every sweep_chunk positions, as
 * ls_state_enable_full cuts them) from last to first: a chunk's gradient is complete
 * once every later chunk has added to it. One rank computes them all. Under CP, without
 * sweep_every_rank, the owner of a chunk computes it, receiving d(state) from the owner
 * of the chunk after and passing it on, and the other ranks serve it their earlier pages
 * (taking their dK/dV back); with it, every rank recomputes every chunk and adds the
 * gradient of the pages it holds (the family's entry gives the ranks but one an empty
 * gradient set). */

/* Sweep chunk i over all segments in prompt order: [lo, hi) in segment seg of owner; 0 past the end. */
static int sweep_chunk_at(const ls_prompt_state *st, int64_t i, int64_t *lo, int64_t *hi, int *owner, int *seg) {
    int64_t W = st->full->sweep_chunk;
    for (int sg = 0; sg < ls_state_segments(st); sg++) {
        int64_t a, b;
        ls_state_segment(st, sg, owner, &a, &b);
        int64_t k = (b - a + W - 1) / W;
        if (i < k) {
            *lo = a + i * W, *hi = *lo + W < b ? *lo + W : b, *seg = sg;
            return 1;
        }
        i -= k;
    }
    return 0;
}

/* Another rank's chunk at `lo`: the family's part layer by layer, forward then backward
 * (a state in host memory staged per layer: the pages before lo, the gradient pages). */
static ls_status sweep_serve(const ls_dec_model *dm, ls_prompt_state *st, int owner, int64_t lo, const ls_fwd_opts *o,
                             ls_arena *sc) {
    int L = dm->cfg->n_layers;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    ls_state_stage *sg = NULL;
    ls_status s = ls_state_stage_new(&sg, st, dm->be, LS_STAGE_PAGES | LS_STAGE_GPAGES, sc);
    for (int k = 0; k < 2 * L && s == LS_OK; k++) {
        int bwd = k >= L, l = bwd ? 2 * L - 1 - k : k;
        ls_prompt_state *sl = sg ? ls_state_stage_in(sg, l, lo, -1) : st;
        s = dm->sweep_serve(dm, sl, owner, lo, l, bwd, o, sc);
        if (s == LS_OK && sg && bwd) ls_state_stage_out(sg, LS_STAGE_GPAGES, 0, 0);
    }
    ls_arena_release(sc, mk);
    return s;
}

/* d(recurrent state) of every layer to (send) or from `peer`. */
static ls_status sweep_relay(const ls_dec_model *dm, ls_prompt_state *st, int peer, int send, ls_arena *sc) {
    ls_arena_mark mk = ls_arena_get_mark(sc);
    ls_state_stage *sg = NULL;
    ls_status s = ls_state_stage_new(&sg, st, dm->be, LS_STAGE_GREC, sc);
    for (int l = 0; l < dm->cfg->n_layers && s == LS_OK; l++) {
        ls_prompt_state *sl = sg ? ls_state_stage_in(sg, l, 0, -1) : st;
        s = dm->sweep_relay(dm, sl, peer, send, l);
        if (s == LS_OK && sg && !send) ls_state_stage_out(sg, LS_STAGE_GREC, 0, 0);
    }
    ls_arena_release(sc, mk);
    return s;
}

/* The layer-major sweep under CP (decoder.h's cp_sweep_layer): every layer from the last
 * over all of the rank's positions, from the inputs the capture kept; the embedding's
 * gradient of the rank's positions at the end. Every rank enters every layer. */
static ls_status sweep_layers(const ls_dec_model *dm, const ls_dec_grad *g, ls_prompt_state *st, const int32_t *ids,
                              const ls_fwd_opts *o, ls_arena *tape_arena, ls_arena *sc) {
    const ls_config *c = dm->cfg;
    int64_t D = c->hidden, Tr = st->full->xres_rows, L = c->n_layers;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *dx = ls_arena_calloc(sc, (size_t)((Tr > 0 ? Tr : 1) * D), sizeof(float)); /* [Tr, D] */
    NEED(dx);
    /* a state in host memory: each layer's pages, gradient pages and d(state) staged in,
     * the gradient pages written back; its inputs copied in */
    ls_state_stage *sg = NULL;
    LS_TRY(ls_state_stage_new(&sg, st, dm->be, LS_STAGE_PAGES | LS_STAGE_GPAGES | LS_STAGE_GREC, sc));
    float *xd = sg ? ALLOC_F(sc, (Tr > 0 ? Tr : 1) * D) : NULL;
    NEED(!sg || xd);
    ls_status s = LS_OK;
    for (int64_t l = L - 1; l >= 0 && s == LS_OK; l--) {
        const float *x = st->full->xres + (size_t)l * (size_t)(Tr * D);
        ls_prompt_state *sl = sg ? ls_state_stage_in(sg, (int)l, st->n, -1) : st;
        if (sg && Tr > 0) dm->be->i->to_device(dm->be, xd, x, (size_t)(Tr * D) * sizeof(float));
        s = dm->cp_sweep_layer(dm, g, sl, st, (int)l, sg ? xd : x, dx, o, tape_arena, sc);
        if (s == LS_OK && sg) ls_state_stage_out(sg, LS_STAGE_GPAGES, 0, 0);
        ls_trace_layer_end((int)l, "bwd");
        ls_progress_add(Tr * (L - l) / L - Tr * (L - 1 - l) / L); /* the rank's positions over the layers */
    }
    int64_t r = 0;
    for (int k = 0; k < st->nseg && s == LS_OK && g->embed; k++) {
        int64_t n = st->seg_hi[k] - st->seg_lo[k];
        ls_arena_mark mi = ls_arena_get_mark(sc);
        const int32_t *xi = ls_dec_ids_in(dm->be, sc, ids + st->seg_lo[k], n);
        NEED(xi);
        ls_op_embed_bwd(dm->be, g->embed, dx + r * D, xi, n, D);
        ls_arena_release(sc, mi);
        r += n;
    }
    ls_arena_release(sc, mk);
    return s;
}

int ls_dec_sweep_layer_major(const ls_dec_model *dm, const ls_prompt_state *st, const ls_fwd_opts *o) {
    if (st->nranks <= 1 || !dm->cp_sweep_layer || !st->full || !st->full->xres) return 0;
    size_t b = dm->cp_sweep_bytes(dm->cfg); /* kept for all of the rank's positions: within a wave */
    int64_t nw = 1;
    if (b) ls_cp_waves(ls_state_fullest_positions(st), chunk_of(o), o->cp_wave, b, &nw);
    return nw == 1;
}

ls_status ls_dec_sweep(const ls_dec_model *dm, const ls_dec_grad *g, ls_prompt_state *st, const int32_t *ids,
                       const ls_fwd_opts *o, ls_arena *tape_arena, ls_arena *sc) {
    LS_ASSERT(st->full, "the sweep needs a state captured in full mode");
    const ls_config *c = dm->cfg;
    if (ls_dec_sweep_layer_major(dm, st, o)) return sweep_layers(dm, g, st, ids, o, tape_arena, sc);
    int64_t n = 0, lo, hi;
    int owner, seg, cp = st->nranks > 1, every = !cp || dm->sweep_every_rank;
    while (sweep_chunk_at(st, n, &lo, &hi, &owner, &seg)) n++;
    ls_status s = LS_OK;
    for (int64_t i = n - 1; i >= 0 && s == LS_OK; i--) {
        sweep_chunk_at(st, i, &lo, &hi, &owner, &seg);
        if (!every && owner != st->rank) {
            s = sweep_serve(dm, st, owner, lo, o, sc);
            continue;
        }
        int other; /* the owners of the chunks after and before */
        int64_t a, b;
        int sg2;
        if (!every && i + 1 < n && sweep_chunk_at(st, i + 1, &a, &b, &other, &sg2) && other != st->rank)
            if ((s = sweep_relay(dm, st, other, 0, sc)) != LS_OK) break;
        /* the state where the chunk starts: the pages before it, a recurrent layer's checkpoint */
        int64_t j = ls_state_ckpt_at(st, lo);
        ls_prompt_state view = *st;
        view.n = lo;
        view.full = NULL;
        if (st->gdn) {
            LS_ASSERT(j >= 0, "rank %d has no checkpoint at %lld", st->rank, (long long)lo);
            view.gdn = &st->full->ckpt[j * c->n_layers];
        }
        ls_trace_set_member((int)(j >= 0 ? j : i));
        ls_arena_mark tm = ls_arena_get_mark(tape_arena);
        ls_dec_branch *tape = NULL;
        ls_dec_dstate dc = {st, 1, NULL};
        s = ls_dec_branch_fwd(dm, &view, ids + lo, hi - lo, hi - lo, 0, NULL, NULL, NULL, &tape, o, tape_arena, sc, seg);
        if (s == LS_OK) s = ls_dec_branch_bwd(dm, g, tape, NULL, &dc, sc);
        ls_arena_release(tape_arena, tm);
        ls_progress_add(hi - lo);
        if (s == LS_OK && !every && i > 0 && sweep_chunk_at(st, i - 1, &a, &b, &other, &sg2) && other != st->rank)
            s = sweep_relay(dm, st, other, 1, sc);
    }
    ls_trace_set_member(-1);
    return s;
}
