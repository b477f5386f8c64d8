/*
 * prompt_state.c — paged K/V and Gated DeltaNet state of a captured prompt.
 * Pages are allocated right-sized from the prompt arena one at a time as positions
 * arrive; nothing else in the state grows with P. ls_state_plan mirrors every
 * allocation made here, so the arena's byte count equals the plan exactly (tested).
 */
#include <stdint.h>
#include <string.h>

#include "longstraw/family.h"
#include "longstraw/state.h"
#include "longstraw/backend.h"

/* The layout of a layer and of the recurrent states, from the config's family (family.h:
 * state_layer, state_recurrent): a full-attention layer K and V rows, an MLA layer its
 * latent row and index key, a Gated DeltaNet layer a recurrent state. */
static const ls_family *family_of(const ls_config *c) {
    const ls_family *f = ls_family_for(c, "the prompt state's config");
    LS_ASSERT(f != NULL, "no family reads model_type %s", c->model_type);
    return f;
}

ls_state_layer ls_state_layer_of(const ls_config *c, int l) {
    ls_state_layer d;
    memset(&d, 0, sizeof d);
    family_of(c)->state_layer(c, l, &d);
    return d;
}

ls_state_recurrent ls_state_recurrent_of(const ls_config *c) {
    ls_state_recurrent r;
    memset(&r, 0, sizeof r);
    family_of(c)->state_recurrent(c, &r);
    return r;
}

int64_t ls_state_row(const ls_config *c, int l, int side) { return ls_state_layer_of(c, l).row[side]; }

static int count_layers(const ls_config *c, int recurrent) {
    int n = 0;
    for (int l = 0; l < c->n_layers; l++) {
        ls_state_layer d = ls_state_layer_of(c, l);
        n += recurrent ? d.recurrent : d.row[0] > 0;
    }
    return n;
}

static size_t page_bytes(const ls_config *c, int l, int side, int64_t S, ls_dtype dt) {
    return ls_align_up((size_t)S * (size_t)ls_state_row(c, l, side) * ls_dtype_size(dt));
}

/* page_bytes of every page table of the config, each multiplication checked: nonzero
 * on overflow (as ls_mul_size); *widest gets the largest. */
static int page_bytes_checked(const ls_config *c, int64_t S, ls_dtype dt, size_t *widest) {
    *widest = 0;
    for (int l = 0; l < c->n_layers; l++)
        for (int side = 0; side < 2; side++) {
            size_t b;
            if (ls_mul_size((size_t)S, (size_t)ls_state_row(c, l, side), &b) || ls_mul_size(b, ls_dtype_size(dt), &b) ||
                b > SIZE_MAX - LS_ALIGN)
                return 1;
            if (ls_align_up(b) > *widest) *widest = ls_align_up(b);
        }
    return 0;
}

static int has_gdn_table(const ls_config *c) { return ls_state_recurrent_of(c).table; }

/* a * b * c, 0 on success (as ls_mul_size) */
static int mul3(size_t a, size_t b, size_t c, size_t *out) {
    return ls_mul_size(a, b, out) || ls_mul_size(*out, c, out);
}

/* ls_align_up(n), 0 on success */
static int align_checked(size_t n, size_t *out) {
    if (n > SIZE_MAX - LS_ALIGN) return 1;
    *out = ls_align_up(n);
    return 0;
}

static int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }

static int64_t layout_pages_per_rank(int64_t pages, int N, ls_cp_layout lay);
static void rank_share(int64_t positions, int64_t S, int N, ls_cp_layout lay, int r, int64_t sweep, int64_t *pages,
                       int64_t *chunks, int64_t *held);

/* Bytes ls_arena_alloc takes for a request of n (0 takes one aligned unit), 0 on success. */
static int abytes(size_t n, size_t *out) { return align_checked(n ? n : 1, out); }

static int64_t grad_row(const ls_config *c, int l, int side) { return ls_state_layer_of(c, l).grad_row[side]; }

/* The full-mode allocations of ls_state_enable_full for a rank with `np` local pages
 * and `nc` sweep chunks, in its order: dState then checkpoints. 0 on success. */
static int full_bytes(const ls_config *cfg, int64_t S, int64_t np, int64_t nc, size_t *dstate, size_t *ckpt,
                      size_t *tables) {
    size_t L = (size_t)cfg->n_layers, ng = (size_t)count_layers(cfg, 1);
    ls_state_recurrent rs = ls_state_recurrent_of(cfg);
    size_t t, tabb, conv, rec, a;
    /* dState: the header, the per-layer table, per gradient table its page table and np
     * f32 pages, per GDN layer dS and dtail */
    if (abytes(sizeof(ls_state_full), &a) || ls_mul_size(L, sizeof(ls_layer_dstate), &t) || abytes(t, &t) ||
        ls_add_size(a, t, &a) || ls_mul_size((size_t)np, sizeof(void *), &tabb) || abytes(tabb, &tabb))
        return 1;
    *tables = a; /* (each sum below is bounded by the state's, which is checked) */
    for (int l = 0; l < cfg->n_layers; l++)
        for (int side = 0; side < 2; side++) {
            size_t pg;
            if (!grad_row(cfg, l, side)) continue;
            *tables += tabb;
            if (ls_mul_size((size_t)S, (size_t)grad_row(cfg, l, side), &pg) || ls_mul_size(pg, sizeof(float), &pg) ||
                abytes(pg, &pg) || ls_mul_size(pg, (size_t)np, &t) || ls_add_size(t, tabb, &t) || ls_add_size(a, t, &a))
                return 1;
        }
    if (ls_mul_size(rs.tail_floats, sizeof(float), &conv) || abytes(conv, &conv) ||
        ls_mul_size(rs.rec_floats, sizeof(float), &rec) || abytes(rec, &rec) || ls_mul_size(conv + rec, ng, &t) ||
        ls_add_size(a, t, dstate))
        return 1;
    /* checkpoints: the chunk list, the [nc][L] table, per chunk and GDN layer S and tail */
    if (ls_mul_size((size_t)nc, sizeof(ls_sweep_chunk), &a) || abytes(a, &a) ||
        mul3((size_t)nc, L, sizeof(ls_gdn_state), &t) || abytes(t, &t))
        return 1;
    *tables += a + t; /* the chunk list and the checkpoint table */
    if (ls_add_size(a, t, &a) || mul3((size_t)nc, ng, conv + rec, &t) || ls_add_size(a, t, ckpt)) return 1;
    return 0;
}

/* The prefix-frozen prompt arena of a rank with np local pages: the pages of every page
 * table, the tables, GDN states (ls_state_init's allocations). 0 on success. */
static int base_bytes(const ls_config *cfg, int64_t page_size, ls_dtype dtype, int64_t np, size_t *kv, size_t *tab,
                      size_t *gdn) {
    size_t L = (size_t)cfg->n_layers, ppr = (size_t)np, pb, ptab, conv, rec, t0, t1, t;
    if (page_bytes_checked(cfg, page_size, dtype, &pb) || ls_mul_size(ppr, sizeof(void *), &ptab) ||
        align_checked(ptab, &ptab))
        return 1;
    *kv = 0;
    if (ls_mul_size(L, sizeof(ls_attn_state), &t0) || align_checked(t0, &t0)) return 1;
    t1 = 0;
    if (has_gdn_table(cfg) && (ls_mul_size(L, sizeof(ls_gdn_state), &t1) || align_checked(t1, &t1))) return 1;
    if (ls_add_size(t0, t1, tab)) return 1;
    for (int l = 0; l < cfg->n_layers; l++) /* without a page table: no pages, no table */
        for (int side = 0; side < 2; side++) {
            if (!ls_state_row(cfg, l, side)) continue;
            if (ls_mul_size(ppr, page_bytes(cfg, l, side, page_size, dtype), &t) || ls_add_size(*kv, t, kv) ||
                ls_add_size(*tab, ptab, tab))
                return 1;
        }
    ls_state_recurrent rs = ls_state_recurrent_of(cfg);
    if (ls_mul_size(rs.tail_floats, sizeof(float), &conv) || align_checked(conv, &conv) ||
        ls_mul_size(rs.rec_floats, sizeof(float), &rec) || align_checked(rec, &rec) || ls_add_size(conv, rec, gdn) ||
        ls_mul_size((size_t)count_layers(cfg, 1), *gdn, gdn))
        return 1;
    return 0;
}

ls_status ls_state_plan(ls_state_plan_t *p, const ls_config *cfg, int64_t prompt_len,
                        int64_t page_size, ls_dtype dtype, int cp, ls_cp_layout layout, int64_t sweep_chunk) {
    if (prompt_len < 1) return ls_err(LS_ERR_ARG, "prompt length must be >= 1 (got %lld)", (long long)prompt_len);
    if (page_size < 1) return ls_err(LS_ERR_ARG, "page size must be >= 1 (got %lld)", (long long)page_size);
    if (cp < 1) return ls_err(LS_ERR_ARG, "--cp must be >= 1 (got %d)", cp);
    if (sweep_chunk < 0) return ls_err(LS_ERR_ARG, "--sweep-chunk must be >= 1 (got %lld)", (long long)sweep_chunk);
    if (dtype != LS_DTYPE_F32 && dtype != LS_DTYPE_BF16)
        return ls_err(LS_ERR_ARG, "state dtype must be f32 or bf16");
    size_t pb;
    if (page_bytes_checked(cfg, page_size, dtype, &pb))
        return ls_err(LS_ERR_ARG, "page size %lld: one page of the prompt state overflows a 64-bit byte count",
                      (long long)page_size);
    memset(p, 0, sizeof *p);
    p->positions = prompt_len - 1; /* x_P is the first input of every branch (DESIGN §3) */
    p->page_size = page_size;
    p->cp = cp;
    p->layout = layout;
    p->pages = ceil_div(p->positions, page_size);
    p->pages_per_rank = layout_pages_per_rank(p->pages, cp, layout);
    p->n_attn = count_layers(cfg, 0);
    p->n_gdn = count_layers(cfg, 1);
    p->sweep_chunk = sweep_chunk;
    /* Every product and sum checked: at the lengths this tool is for, a wrapped size
     * would print a small, wrong plan (and size an arena by it). Each rank's own share
     * (its pages, its sweep chunks); the rows are the fullest rank's. */
    for (int r = 0; r < cp; r++) {
        int64_t np, nc, held;
        size_t kv, tab, gdn, ds = 0, ck = 0, ftab = 0, xr = 0, total;
        rank_share(p->positions, page_size, cp, layout, r, sweep_chunk, &np, &nc, &held);
        if (base_bytes(cfg, page_size, dtype, np, &kv, &tab, &gdn))
            return ls_err(LS_ERR_ARG,
                          "prompt length %lld with page size %lld: the prompt state of %d attention layers "
                          "(%lld pages per rank) overflows a 64-bit byte count",
                          (long long)prompt_len, (long long)page_size, p->n_attn, (long long)np);
        if (sweep_chunk > 0 && full_bytes(cfg, page_size, np, nc, &ds, &ck, &ftab))
            return ls_err(LS_ERR_ARG, "prompt length %lld: the full-mode gradient state overflows a 64-bit byte count",
                          (long long)prompt_len);
        if (sweep_chunk > 0 && cp > 1 && ls_state_recurrent_of(cfg).sweep_inputs &&
            (mul3((size_t)cfg->n_layers, (size_t)held, (size_t)cfg->hidden * sizeof(float), &xr) || abytes(xr, &xr)))
            return ls_err(LS_ERR_ARG, "prompt length %lld: the sweep's layer inputs overflow a 64-bit byte count",
                          (long long)prompt_len);
        if (ls_add_size(kv, tab, &total) || ls_add_size(total, gdn, &total) || ls_add_size(total, ds, &total) ||
            ls_add_size(total, ck, &total) || ls_add_size(total, xr, &total))
            return ls_err(LS_ERR_ARG, "prompt length %lld with page size %lld: the prompt state's byte count "
                                      "overflows 64 bits", (long long)prompt_len, (long long)page_size);
        if (r == 0 || total > p->total_bytes_per_rank) {
            p->kv_bytes_per_rank = kv, p->table_bytes_per_rank = tab, p->gdn_bytes_per_rank = gdn;
            p->dstate_bytes_per_rank = ds, p->ckpt_bytes_per_rank = ck, p->total_bytes_per_rank = total;
            p->full_table_bytes_per_rank = ftab, p->sweep_input_bytes_per_rank = xr;
        }
        p->sweep_chunks_per_rank = nc > p->sweep_chunks_per_rank ? nc : p->sweep_chunks_per_rank;
    }
    if (cp > 1) { /* every factor is bounded by sizes checked above, or by the config */
        size_t tr = (size_t)p->pages_per_rank * (size_t)page_size;
        if (mul3(tr, (size_t)cfg->hidden, sizeof(float), &p->cp_capture_bytes_per_rank))
            return ls_err(LS_ERR_ARG, "prompt length %lld: the CP capture's shard buffers overflow a 64-bit byte count",
                          (long long)prompt_len);
    }
    return LS_OK;
}

static ls_status alloc_tables(ls_prompt_state *st);

/* Contiguous blocks of a range of `pages` split into n: block b is [first(b), first(b + 1)). */
static int64_t block_first(int64_t pages, int n, int b) {
    int64_t base = pages / n, rem = pages % n;
    return (int64_t)b * base + (b < rem ? b : rem);
}

/* Segments of a layout: contiguous has one per rank (segment r on rank r); zigzag has
 * 2N, segment s on rank s for s < N and on rank 2N − 1 − s after. */
static int layout_segments(ls_cp_layout lay, int N) { return lay == LS_CP_ZIGZAG && N > 1 ? 2 * N : N; }
static int layout_owner(ls_cp_layout lay, int N, int s) { return lay == LS_CP_ZIGZAG && s >= N ? 2 * N - 1 - s : s; }

int ls_state_segments(const ls_prompt_state *st) { return layout_segments(st->layout, st->nranks); }

void ls_state_segment(const ls_prompt_state *st, int s, int *owner, int64_t *lo, int64_t *hi) {
    int64_t pages = ceil_div(st->prompt_capacity, st->page_size);
    int n = ls_state_segments(st);
    *owner = layout_owner(st->layout, st->nranks, s);
    *lo = block_first(pages, n, s) * st->page_size;
    *hi = block_first(pages, n, s + 1) * st->page_size;
    if (*lo > st->prompt_capacity) *lo = st->prompt_capacity;
    if (*hi > st->prompt_capacity) *hi = st->prompt_capacity;
}

const char *ls_cp_layout_name(ls_cp_layout lay) { return lay == LS_CP_ZIGZAG ? "zigzag" : "contiguous"; }

int ls_cp_layout_parse(const char *s, ls_cp_layout *out) {
    if (!strcmp(s, "contiguous")) *out = LS_CP_CONTIGUOUS;
    else if (!strcmp(s, "zigzag")) *out = LS_CP_ZIGZAG;
    else return -1;
    return 0;
}

/* Pages of the fullest rank under a layout (every rank's share of `pages`). */
static int64_t layout_pages_per_rank(int64_t pages, int N, ls_cp_layout lay) {
    int n = layout_segments(lay, N);
    int64_t most = 0;
    for (int r = 0; r < N; r++) {
        int64_t k = 0;
        for (int s = 0; s < n; s++)
            if (layout_owner(lay, N, s) == r) k += block_first(pages, n, s + 1) - block_first(pages, n, s);
        most = k > most ? k : most;
    }
    return most;
}

ls_status ls_state_init(ls_prompt_state *st, const ls_config *cfg, int64_t capacity, int64_t page_size,
                        ls_dtype dtype, const ls_comm *comm, ls_cp_layout layout, ls_arena *arena) {
    if (page_size < 1) return ls_err(LS_ERR_ARG, "page size must be >= 1 (got %lld)", (long long)page_size);
    if (dtype != LS_DTYPE_F32 && dtype != LS_DTYPE_BF16)
        return ls_err(LS_ERR_ARG, "state dtype must be f32 or bf16");
    size_t pb;
    if (page_bytes_checked(cfg, page_size, dtype, &pb)) /* page_bytes below is then exact */
        return ls_err(LS_ERR_ARG, "page size %lld: one page of the prompt state overflows a 64-bit byte count",
                      (long long)page_size);
    memset(st, 0, sizeof *st);
    st->cfg = cfg;
    st->capacity = st->prompt_capacity = capacity;
    st->page_size = page_size;
    st->dtype = dtype;
    st->arena = arena;
    st->comm = comm;
    st->rank = comm ? ls_comm_rank(comm) : 0;
    st->nranks = comm ? ls_comm_size(comm) : 1;
    st->layout = layout;
    int64_t pages = ceil_div(capacity, page_size);
    int n = ls_state_segments(st);
    for (int s = 0; s < n; s++) { /* this rank's segments, in prompt order; the tail's owner */
        int owner;
        int64_t lo, hi;
        ls_state_segment(st, s, &owner, &lo, &hi);
        if (hi > lo && hi == capacity) st->tail_rank = owner;
        if (owner != st->rank) continue;
        st->seg_lo[st->nseg] = lo, st->seg_hi[st->nseg] = hi;
        st->seg_gpage[st->nseg] = block_first(pages, n, s);
        st->seg_lpage[st->nseg] = st->cap_pages;
        st->cap_pages += block_first(pages, n, s + 1) - block_first(pages, n, s);
        st->nseg++;
    }
    return alloc_tables(st);
}

/* Rank r's pages and sweep chunks (chunks of `sweep` positions cut in each of its
 * segments; 0 when sweep is 0) for a prompt of `positions`. */
static void rank_share(int64_t positions, int64_t S, int N, ls_cp_layout lay, int r, int64_t sweep, int64_t *pages,
                       int64_t *chunks, int64_t *held) {
    int64_t all = ceil_div(positions, S);
    int n = layout_segments(lay, N);
    *pages = *chunks = *held = 0;
    for (int s = 0; s < n; s++) {
        if (layout_owner(lay, N, s) != r) continue;
        int64_t p0 = block_first(all, n, s), p1 = block_first(all, n, s + 1);
        *pages += p1 - p0;
        int64_t lo = p0 * S < positions ? p0 * S : positions, hi = p1 * S < positions ? p1 * S : positions;
        if (sweep > 0) *chunks += ceil_div(hi - lo, sweep);
        *held += hi - lo;
    }
}

ls_status ls_state_enable_full(ls_prompt_state *st, int64_t sweep_chunk) {
    const ls_config *c = st->cfg;
    if (sweep_chunk < 1) return ls_err(LS_ERR_ARG, "--sweep-chunk must be >= 1 (got %lld)", (long long)sweep_chunk);
    LS_ASSERT(st->n == 0 && !st->full, "full mode is enabled on an empty state, once");
    ls_arena *A = st->arena;
    size_t L = (size_t)c->n_layers;
    ls_state_recurrent rs = ls_state_recurrent_of(c);
    size_t conv_n = rs.tail_floats, rec_n = rs.rec_floats;
    ls_state_full *f = ls_arena_host_calloc(A, 1, sizeof *f);
    if (!f) return LS_ERR_NOMEM;
    f->sweep_chunk = sweep_chunk;
    /* dState (full_bytes mirrors this order) */
    f->d = ls_arena_host_calloc(A, L, sizeof(ls_layer_dstate));
    if (!f->d) return LS_ERR_NOMEM;
    for (size_t l = 0; l < L; l++) {
        ls_layer_dstate *d = &f->d[l];
        for (int side = 0; side < 2; side++) {
            if (!grad_row(c, (int)l, side)) continue;
            size_t pb = ls_align_up((size_t)st->page_size * (size_t)grad_row(c, (int)l, side) * sizeof(float));
            void **tab = ls_arena_host_calloc(A, (size_t)st->cap_pages, sizeof(void *));
            if (!tab) return LS_ERR_NOMEM;
            for (int64_t i = 0; i < st->cap_pages; i++)
                if (!(tab[i] = ls_arena_calloc(A, 1, pb))) return LS_ERR_NOMEM;
            *(side ? &d->dv : &d->dk) = tab;
        }
        if (ls_state_layer_of(c, (int)l).recurrent) {
            d->dS = ls_arena_calloc(A, rec_n, sizeof(float));
            d->dtail = ls_arena_calloc(A, conv_n, sizeof(float));
            if (!d->dS || !d->dtail) return LS_ERR_NOMEM;
        }
    }
    /* checkpoints */
    for (int k = 0; k < st->nseg; k++) f->n_chunks += ceil_div(st->seg_hi[k] - st->seg_lo[k], sweep_chunk);
    f->chunks = ls_arena_host_calloc(A, (size_t)f->n_chunks, sizeof(ls_sweep_chunk));
    f->ckpt = ls_arena_host_calloc(A, (size_t)f->n_chunks * L, sizeof(ls_gdn_state));
    if (!f->chunks || !f->ckpt) return LS_ERR_NOMEM;
    int64_t j = 0;
    for (int k = 0; k < st->nseg; k++)
        for (int64_t a = st->seg_lo[k]; a < st->seg_hi[k]; a += sweep_chunk, j++) {
            f->chunks[j].lo = a;
            f->chunks[j].hi = a + sweep_chunk < st->seg_hi[k] ? a + sweep_chunk : st->seg_hi[k];
            for (size_t l = 0; l < L; l++) {
                if (!ls_state_layer_of(c, (int)l).recurrent) continue;
                ls_gdn_state *g = &f->ckpt[(size_t)j * L + l];
                g->conv_tail = ls_arena_calloc(A, conv_n, sizeof(float));
                g->S = ls_arena_calloc(A, rec_n, sizeof(float));
                if (!g->conv_tail || !g->S) return LS_ERR_NOMEM;
            }
        }
    if (st->nranks > 1 && rs.sweep_inputs) { /* every layer's input at the rank's positions */
        for (int k = 0; k < st->nseg; k++) f->xres_rows += st->seg_hi[k] - st->seg_lo[k];
        f->xres = ls_arena_alloc(A, L * (size_t)f->xres_rows * (size_t)c->hidden * sizeof(float));
        if (!f->xres) return LS_ERR_NOMEM;
    }
    st->full = f;
    return LS_OK;
}

int64_t ls_state_fullest_positions(const ls_prompt_state *st) {
    int64_t best = 0;
    for (int r = 0; r < st->nranks; r++) {
        int64_t n = 0;
        for (int sg = 0; sg < ls_state_segments(st); sg++) {
            int owner;
            int64_t lo, hi;
            ls_state_segment(st, sg, &owner, &lo, &hi);
            if (owner == r) n += hi - lo;
        }
        if (n > best) best = n;
    }
    return best;
}

int64_t ls_state_local_page(const ls_prompt_state *st, int64_t pos) {
    for (int k = 0; k < st->nseg; k++)
        if (pos >= st->seg_lo[k] && pos < st->seg_hi[k])
            return st->seg_lpage[k] + pos / st->page_size - st->seg_gpage[k];
    return -1;
}

int64_t ls_state_ckpt_at(const ls_prompt_state *st, int64_t pos) {
    if (!st->full) return -1;
    for (int64_t j = 0; j < st->full->n_chunks; j++)
        if (st->full->chunks[j].lo == pos) return j;
    return -1;
}

int64_t ls_state_span_end(const ls_prompt_state *st, int64_t lo, int64_t pos, int64_t hi, int64_t chunk) {
    int64_t e = pos + chunk < hi ? pos + chunk : hi;
    if (st->full) { /* sweep chunks start at lo + k·W (ls_state_enable_full) */
        int64_t W = st->full->sweep_chunk, nb = lo + ((pos - lo) / W + 1) * W;
        e = nb < e ? nb : e;
    }
    return e;
}

int64_t ls_state_layout_pages(int64_t positions, int64_t page_size, int N, ls_cp_layout layout) {
    return layout_pages_per_rank(ceil_div(positions, page_size), N, layout);
}

/* The per-layer tables of a state whose layout is set (st->cap_pages local pages). */
static ls_status alloc_tables(ls_prompt_state *st) {
    const ls_config *cfg = st->cfg;
    ls_arena *arena = st->arena;
    size_t L = (size_t)cfg->n_layers;
    st->attn = ls_arena_host_calloc(arena, L, sizeof(ls_attn_state));
    st->gdn = has_gdn_table(cfg) ? ls_arena_host_calloc(arena, L, sizeof(ls_gdn_state)) : NULL;
    if (!st->attn || (has_gdn_table(cfg) && !st->gdn)) return LS_ERR_NOMEM;
    ls_state_recurrent rs = ls_state_recurrent_of(cfg);
    size_t conv_n = rs.tail_floats, rec_n = rs.rec_floats;
    for (int l = 0; l < (int)L; l++) {
        if (ls_state_row(cfg, l, 0) && !(st->attn[l].k_pages = ls_arena_host_calloc(arena, (size_t)st->cap_pages, sizeof(void *))))
            return LS_ERR_NOMEM;
        if (ls_state_row(cfg, l, 1) && !(st->attn[l].v_pages = ls_arena_host_calloc(arena, (size_t)st->cap_pages, sizeof(void *))))
            return LS_ERR_NOMEM;
        if (ls_state_layer_of(cfg, l).recurrent) {
            st->gdn[l].conv_tail = ls_arena_calloc(arena, conv_n, sizeof(float));
            st->gdn[l].S = ls_arena_calloc(arena, rec_n, sizeof(float));
            if (!st->gdn[l].conv_tail || !st->gdn[l].S) return LS_ERR_NOMEM;
        }
    }
    return LS_OK;
}

/* The segment of this rank holding positions [st->n, st->n + T), or an error. */
static ls_status segment_of(const ls_prompt_state *st, int64_t T, int *out) {
    if (st->n + T > st->capacity)
        return ls_err(LS_ERR_ARG, "prompt state holds %lld positions; cannot append %lld more",
                      (long long)st->capacity, (long long)T);
    int sg = 0;
    while (sg + 1 < st->nseg && st->n >= st->seg_hi[sg]) sg++;
    if (st->nseg == 0 || st->n < st->seg_lo[sg] || st->n + T > st->seg_hi[sg])
        return ls_err(LS_ERR_ARG, "rank %d of %d (%s layout) does not hold positions [%lld, %lld)", st->rank,
                      st->nranks, ls_cp_layout_name(st->layout), (long long)st->n, (long long)(st->n + T));
    *out = sg;
    return LS_OK;
}

static int64_t local_page(const ls_prompt_state *st, int sg, int64_t pos) {
    return st->seg_lpage[sg] + pos / st->page_size - st->seg_gpage[sg];
}

ls_status ls_state_reserve(ls_prompt_state *st, int layer, int64_t hi) {
    const ls_state_layer d = ls_state_layer_of(st->cfg, layer);
    if (hi <= st->n || d.row[0] == 0) return LS_OK;
    int sg;
    LS_TRY(segment_of(st, hi - st->n, &sg));
    size_t esz = ls_dtype_size(st->dtype);
    size_t pb = ls_align_up((size_t)st->page_size * (size_t)d.row[0] * esz);
    size_t vpb = ls_align_up((size_t)st->page_size * (size_t)d.row[1] * esz);
    ls_attn_state *a = &st->attn[layer];
    for (int64_t pg = local_page(st, sg, st->n); pg <= local_page(st, sg, hi - 1); pg++) {
        if (a->k_pages[pg]) continue;
        a->k_pages[pg] = ls_arena_alloc(st->arena, pb);
        if (d.row[1]) a->v_pages[pg] = ls_arena_alloc(st->arena, vpb);
        if (!a->k_pages[pg] || (d.row[1] && !a->v_pages[pg])) return LS_ERR_NOMEM;
    }
    return LS_OK;
}

ls_status ls_state_append_kv(ls_prompt_state *st, int layer, const float *k, const float *v,
                             int64_t T) {
    const ls_state_layer d = ls_state_layer_of(st->cfg, layer); /* its layout, asked once */
    LS_ASSERT(d.row[0] > 0, "layer %d has no pages", layer);
    int64_t row = d.row[0], vrow = d.row[1];
    size_t esz = ls_dtype_size(st->dtype);
    LS_ASSERT(!vrow == !v, "layer %d: V rows given to a table that has %s", layer, vrow ? "them" : "none");
    ls_attn_state *a = &st->attn[layer];
    const ls_backend *be = ls_arena_backend(st->arena);
    int sg; /* the segment of this rank holding the positions */
    LS_TRY(segment_of(st, T, &sg));
    LS_TRY(ls_state_reserve(st, layer, st->n + T));
    for (int64_t t = 0; t < T;) {
        int64_t pos = st->n + t;
        int64_t pg = local_page(st, sg, pos), off = pos % st->page_size;
        int64_t n = st->page_size - off;
        if (n > T - t) n = T - t;
        ls_op_store_as(be, (char *)a->k_pages[pg] + (size_t)(off * row) * esz, k + t * row, n * row, st->dtype);
        if (vrow) ls_op_store_as(be, (char *)a->v_pages[pg] + (size_t)(off * vrow) * esz, v + t * vrow, n * vrow, st->dtype);
        if (pg + 1 > st->n_pages) st->n_pages = pg + 1;
        t += n;
    }
    return LS_OK;
}

void ls_state_advance(ls_prompt_state *st, int64_t T) { st->n += T; }

int64_t ls_state_held_before(const ls_prompt_state *st, int64_t limit) {
    int64_t n = 0; /* whole earlier segments, then a part */
    for (int k = 0; k < st->nseg; k++) {
        int64_t end = limit < st->seg_hi[k] ? limit : st->seg_hi[k];
        n += end > st->seg_lo[k] ? end - st->seg_lo[k] : 0;
    }
    return n;
}

ls_kv_prefix ls_state_prefix(const ls_prompt_state *st, int layer) {
    ls_kv_prefix p;
    p.n = ls_state_held_before(st, st->n);
    p.page_size = st->page_size;
    p.dtype = st->dtype;
    p.k_pages = st->attn[layer].k_pages;
    p.v_pages = st->attn[layer].v_pages;
    return p;
}

ls_status ls_state_fork(ls_prompt_state *dst, const ls_prompt_state *src, int64_t extra,
                        ls_arena *arena) {
    const ls_config *c = src->cfg;
    /* the same layout as the source; the rank holding the prompt's last page holds the
     * member's new positions too (right after it, so its pages stay contiguous) */
    memset(dst, 0, sizeof *dst);
    *dst = *src;
    dst->arena = arena;
    dst->full = NULL; /* a member's continuation: no sweep, no prompt gradient of its own */
    dst->capacity = src->n + extra;
    if (src->rank == src->tail_rank && src->nseg > 0) { /* the segment ending at the tail grows */
        int k = src->nseg - 1;
        while (k > 0 && !(src->seg_hi[k] == src->prompt_capacity && src->seg_hi[k] > src->seg_lo[k])) k--;
        dst->seg_hi[k] = dst->capacity;
        dst->cap_pages = src->seg_lpage[k] + ceil_div(dst->capacity - src->seg_gpage[k] * src->page_size,
                                                      src->page_size);
    }
    LS_TRY(alloc_tables(dst));
    ls_kv_prefix held = ls_state_prefix(src, 0); /* positions this rank holds (any layer: the same) */
    int64_t full = held.n / src->page_size, partial = held.n % src->page_size;
    ls_state_recurrent rs = ls_state_recurrent_of(c);
    size_t conv_n = rs.tail_floats, rec_n = rs.rec_floats;
    const ls_backend *be = ls_arena_backend(arena);
    for (int64_t l = 0; l < c->n_layers; l++) {
        for (int side = 0; side < 2; side++) {
            if (!ls_state_row(c, (int)l, side)) continue;
            void **a = side ? dst->attn[l].v_pages : dst->attn[l].k_pages;
            void *const *b = side ? src->attn[l].v_pages : src->attn[l].k_pages;
            size_t pb = page_bytes(c, (int)l, side, src->page_size, src->dtype);
            for (int64_t p = 0; p < full; p++) a[p] = b[p];
            if (partial) { /* the page the member will append into: private */
                if (!(a[full] = ls_arena_alloc(arena, pb))) return LS_ERR_NOMEM;
                be->i->copy(be, a[full], b[full], pb);
            }
        }
        if (ls_state_layer_of(c, (int)l).recurrent) {
            ls_op_copy(be, dst->gdn[l].S, src->gdn[l].S, (int64_t)rec_n);
            ls_op_copy(be, dst->gdn[l].conv_tail, src->gdn[l].conv_tail, (int64_t)conv_n);
        }
    }
    dst->n_pages = full + (partial ? 1 : 0);
    return LS_OK;
}
