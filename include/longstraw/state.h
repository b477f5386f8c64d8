/*
 * state.h — the captured prompt state (DESIGN.md §2–4): per full-attention layer,
 * K (after norm + RoPE) and V in right-sized pages of S positions (f32 or bf16);
 * per Gated DeltaNet layer, the conv tail [W−1, conv_dim] and the recurrent state
 * [H_v, d_k, d_v] in f32. Everything comes from the prompt arena; ls_state_plan
 * predicts its bytes exactly from the config.
 */
#ifndef LONGSTRAW_STATE_H
#define LONGSTRAW_STATE_H

#include "longstraw/comm.h"
#include "longstraw/config.h"
#include "longstraw/core.h"
#include "longstraw/kernels.h"

typedef struct {
    void **k_pages; /* [cap_pages] → [S, n_kv, hd] in dtype */
    void **v_pages;
} ls_attn_state;

typedef struct {
    float *conv_tail; /* [W−1, conv_dim], oldest first */
    float *S;         /* [H_v, d_k, d_v] */
} ls_gdn_state;

/* Under context parallelism (DESIGN §8) the pages are split across the ranks of
 * `comm` in contiguous blocks (pages [page_lo, page_lo + cap_pages) here, the first
 * pages/N + (r < pages mod N) of the rest): a rank allocates and holds only the
 * positions [lo, hi) of its pages. Page tables are local (index 0 = page page_lo).
 * The GDN state is replicated: after capture every rank holds the state at the end. */
typedef struct {
    const ls_config *cfg;
    int64_t n;         /* positions captured so far, over all ranks (the next position) */
    int64_t capacity;  /* positions the state can hold, over all ranks */
    int64_t page_size; /* S */
    int64_t n_pages;   /* local pages allocated per attention layer */
    int64_t cap_pages; /* local pages the tables can hold */
    const ls_comm *comm; /* NULL or one rank: every page is local */
    int rank, nranks;
    int64_t page_lo;   /* global index of local page 0 */
    int64_t lo, hi;    /* the positions this rank owns */
    int tail_rank;     /* the rank holding the last prompt page (and a fork's new positions) */
    ls_dtype dtype;    /* K/V page storage: F32 or BF16 */
    ls_attn_state *attn; /* [n_layers]; used for attention layers */
    ls_gdn_state *gdn;   /* [n_layers]; used for GDN layers */
    ls_arena *arena;     /* the prompt arena */
} ls_prompt_state;

/* Allocate an empty state able to hold `capacity` positions (page tables sized now,
 * pages allocated as positions arrive), from `arena` (the prompt arena); with a
 * communicator of N > 1 ranks, only this rank's share of the pages. */
ls_status ls_state_init(ls_prompt_state *st, const ls_config *cfg, int64_t capacity,
                        int64_t page_size, ls_dtype dtype, const ls_comm *comm, ls_arena *arena);
/* Which rank's block holds global page `page` (contiguous layout). */
int ls_state_page_owner(const ls_prompt_state *st, int64_t page);
/* The positions [*lo, *hi) rank r owns (contiguous layout). */
void ls_state_rank_range(const ls_prompt_state *st, int r, int64_t *lo, int64_t *hi);
/* Append T positions of K/V ([T, n_kv, hd] f32 each) to attention layer `layer`.
 * Positions start at st->n and must lie in this rank's [lo, hi); the caller
 * advances st->n after all layers (ls_state_advance). */
ls_status ls_state_append_kv(ls_prompt_state *st, int layer, const float *k, const float *v,
                             int64_t T);
void ls_state_advance(ls_prompt_state *st, int64_t T);
/* A read-only view of one attention layer's local pages for ls_attn_fwd: the
 * positions [lo, min(n, hi)) this rank holds (every position with one rank). */
ls_kv_prefix ls_state_prefix(const ls_prompt_state *st, int layer);

/* A member's private continuation of a read-only state (sampling): `dst` can hold
 * src->n + extra positions; full pages of `src` are shared by pointer (src must
 * outlive dst and is never written), the partial last page of each attention layer
 * is copied into a private page, GDN states and conv tails are copied. Everything
 * dst allocates comes from `arena` (the branch arena). Under CP the fork keeps the
 * source's layout, and the new positions belong to src->tail_rank. */
ls_status ls_state_fork(ls_prompt_state *dst, const ls_prompt_state *src, int64_t extra,
                        ls_arena *arena);

/* The prompt-state inventory predicted from the config (per rank under CP). */
typedef struct {
    int64_t positions;        /* captured positions (P − 1) */
    int64_t page_size;
    int cp;
    int64_t pages;            /* pages per attention layer, whole prompt */
    int64_t pages_per_rank;   /* max over ranks */
    int n_attn, n_gdn;
    size_t kv_bytes_per_rank;    /* K + V pages, all attention layers */
    size_t table_bytes_per_rank; /* page tables + per-layer headers */
    size_t gdn_bytes_per_rank;   /* conv tails + recurrent states (replicated) */
    size_t total_bytes_per_rank;
    /* capture under CP (cp > 1), scratch for the whole capture: the shard's residual
     * stream [P/N, D] in f32, alive across the layers (everything else is per chunk) */
    size_t cp_capture_bytes_per_rank;
} ls_state_plan_t;

ls_status ls_state_plan(ls_state_plan_t *p, const ls_config *cfg, int64_t prompt_len,
                        int64_t page_size, ls_dtype dtype, int cp);

#endif
