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

/* How the pages of a prompt split over the ranks under context parallelism
 * (DESIGN §8). Contiguous: N blocks, rank r holds block r. Zigzag: 2N blocks
 * ("segments"), rank r holds segments r and 2N − 1 − r, so every rank holds as much
 * early as late prompt (causal attention work balanced). With one rank both are the
 * whole prompt. */
/* Zigzag is the default (the value of zero-initialised options): it measured faster
 * for both families (issue 22, docs/architecture.md). */
typedef enum { LS_CP_ZIGZAG = 0, LS_CP_CONTIGUOUS = 1 } ls_cp_layout;
const char *ls_cp_layout_name(ls_cp_layout lay);
int ls_cp_layout_parse(const char *s, ls_cp_layout *out); /* 0, or −1 for an unknown name */

#define LS_STATE_MAX_SEGS 2

/* Exact-gradient mode (DESIGN §3, `--mode full`): the gradient of the loss with respect
 * to the prompt state, shaped like it (dK/dV pages in f32 per attention layer, d(S,
 * conv tail) per Gated DeltaNet layer), and the sweep's checkpoints: the GDN state and
 * conv tail at the start of every sweep chunk of this rank's positions. All from the
 * prompt arena (plan's "full mode" row). */
typedef struct {
    void **dk, **dv;     /* attention layer: [cap_pages] f32 pages [S, n_kv, hd] (+=) */
    float *dS, *dtail;   /* GDN layer: [H_v, d_k, d_v], [W−1, conv_dim] */
} ls_layer_dstate;

typedef struct {
    int64_t lo, hi; /* positions of one sweep chunk (within one segment of this rank) */
} ls_sweep_chunk;

typedef struct {
    int64_t sweep_chunk;   /* positions per sweep chunk */
    int64_t n_chunks;      /* this rank's chunks, prompt order */
    ls_sweep_chunk *chunks;
    ls_gdn_state *ckpt;    /* [n_chunks][n_layers]: the state at each chunk's start (GDN layers) */
    ls_layer_dstate *d;    /* [n_layers] */
    /* under CP when the family asks (ls_state_recurrent.sweep_inputs): every layer's input
     * [n_layers][xres_rows][hidden] at the rank's positions (its segments one after
     * another), written by the CP capture; else NULL */
    float *xres;
    int64_t xres_rows;
} ls_state_full;

/* Under context parallelism the pages are split across the ranks of `comm` in the
 * segments of `layout` (whole pages; only the prompt's last page can be partial): a
 * rank allocates and holds only the positions of its segments. Page tables are local:
 * the rank's segments one after another in prompt order (segment k's first page is
 * local page seg_lpage[k]). The GDN state is replicated: after capture every rank
 * holds the state at the end. */
typedef struct {
    const ls_config *cfg;
    int64_t n;         /* positions captured so far, over all ranks (the next position) */
    int64_t capacity;  /* positions the state can hold, over all ranks */
    int64_t prompt_capacity; /* the capacity the layout was cut for (a fork's source's) */
    int64_t page_size; /* S */
    int64_t n_pages;   /* local pages allocated per attention layer */
    int64_t cap_pages; /* local pages the tables can hold */
    const ls_comm *comm; /* NULL or one rank: every page is local */
    int rank, nranks;
    ls_cp_layout layout;
    int nseg;                             /* this rank's segments */
    int64_t seg_lo[LS_STATE_MAX_SEGS];    /* their positions [seg_lo, seg_hi), prompt order */
    int64_t seg_hi[LS_STATE_MAX_SEGS];
    int64_t seg_gpage[LS_STATE_MAX_SEGS]; /* global index of each one's first page */
    int64_t seg_lpage[LS_STATE_MAX_SEGS]; /* local index of each one's first page */
    int tail_rank;     /* the rank holding the last prompt page (and a fork's new positions) */
    ls_dtype dtype;    /* K/V page storage: F32 or BF16 */
    ls_attn_state *attn; /* [n_layers]; used for attention layers */
    ls_gdn_state *gdn;   /* [n_layers]; used for GDN layers */
    ls_arena *arena;     /* the prompt arena */
    ls_state_full *full; /* exact-gradient mode (ls_state_enable_full), else NULL */
} ls_prompt_state;

/* What the prompt state keeps for one layer, as the model's family describes it
 * (family.h, slot state_layer): the state module allocates what it is told. */
typedef struct {
    int64_t row[2];      /* values per position of its page tables (0: K, or an MLA latent row;
                          * 1: V, or an index key); 0: no such table */
    int64_t grad_row[2]; /* full mode: values per position of the gradient tables (0: none) */
    int recurrent;       /* 1: a recurrent state (matrix + conv tail, sizes in ls_state_recurrent) */
} ls_state_layer;
/* The recurrent state of the config's recurrent layers (all the same size), and whether
 * the state keeps a per-layer table of them at all. */
typedef struct {
    int table;
    size_t rec_floats, tail_floats;
    /* 1: in full mode under CP the state also keeps every layer's input at the rank's
     * positions (ls_state_full.xres: the family's layer-major sweep reads them) */
    int sweep_inputs;
} ls_state_recurrent;
ls_state_layer ls_state_layer_of(const ls_config *c, int l);
ls_state_recurrent ls_state_recurrent_of(const ls_config *c);
/* ls_state_layer_of(c, l).row[side] */
int64_t ls_state_row(const ls_config *c, int l, int side);

/* Allocate an empty state able to hold `capacity` positions (page tables sized now,
 * pages allocated as positions arrive), from `arena` (the prompt arena); with a
 * communicator of N > 1 ranks, only this rank's share of the pages under `layout`. */
ls_status ls_state_init(ls_prompt_state *st, const ls_config *cfg, int64_t capacity, int64_t page_size,
                        ls_dtype dtype, const ls_comm *comm, ls_cp_layout layout, ls_arena *arena);
/* Exact-gradient mode for an empty state (before capture): allocate the dState buffer
 * (zeroed) and the sweep checkpoints for chunks of `sweep_chunk` positions, cut in each
 * of this rank's segments from its start. Capture then saves the checkpoints. */
ls_status ls_state_enable_full(ls_prompt_state *st, int64_t sweep_chunk);
/* Positions before `limit` this rank holds (its local rows 0 .. n−1, page · S + offset). */
int64_t ls_state_held_before(const ls_prompt_state *st, int64_t limit);
/* Local page index of global position `pos`, which this rank holds (−1 if not). */
int64_t ls_state_local_page(const ls_prompt_state *st, int64_t pos);
/* Sweep chunk j of this rank whose start is `pos`, or −1 (capture saves its checkpoint). */
int64_t ls_state_ckpt_at(const ls_prompt_state *st, int64_t pos);
/* The end of the capture span starting at `pos` of the segment [lo, hi) (any rank's):
 * at most `chunk` positions, never across a sweep-chunk start (full mode: lo + k·W),
 * so every rank cuts every segment the same way. */
int64_t ls_state_span_end(const ls_prompt_state *st, int64_t lo, int64_t pos, int64_t hi, int64_t chunk);
/* Pages of the fullest rank when `positions` in pages of `page_size` split over N ranks. */
int64_t ls_state_layout_pages(int64_t positions, int64_t page_size, int N, ls_cp_layout layout);

/* The layout's segments in prompt order: how many, and segment s's owner and
 * positions [*lo, *hi) (empty where the prompt has fewer pages than segments). */
int ls_state_segments(const ls_prompt_state *st);
/* The positions held by the rank of st's layout that holds most. */
int64_t ls_state_fullest_positions(const ls_prompt_state *st);
void ls_state_segment(const ls_prompt_state *st, int s, int *owner, int64_t *lo, int64_t *hi);
/* Append T positions of K/V ([T, n_kv, hd] f32 each) to attention layer `layer`.
 * Positions start at st->n and must lie in one segment of this rank; the caller
 * advances st->n after all layers (ls_state_advance). */
ls_status ls_state_append_kv(ls_prompt_state *st, int layer, const float *k, const float *v,
                             int64_t T);
void ls_state_advance(ls_prompt_state *st, int64_t T);
/* A read-only view of one attention layer's local pages for ls_attn_fwd: the
 * positions before st->n this rank holds (every position with one rank). */
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
    ls_cp_layout layout;
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
    /* exact-gradient mode (sweep_chunk > 0): dState (dK/dV pages in f32, d(S, conv tail))
     * and the sweep checkpoints, included in total_bytes_per_rank */
    int64_t sweep_chunk;
    int64_t sweep_chunks_per_rank; /* max over ranks */
    size_t dstate_bytes_per_rank, ckpt_bytes_per_rank;
    /* under CP, when the family's sweep is layer-major: every layer's input at the rank's
     * positions (ls_state_full.xres), included in total_bytes_per_rank */
    size_t sweep_input_bytes_per_rank;
    /* of which bookkeeping (a device arena keeps it in its host part, arena.c): the dState
     * header and page tables, the chunk list and the checkpoint table */
    size_t full_table_bytes_per_rank;
} ls_state_plan_t;

/* ---- a state in host memory, staged to the device one layer at a time (stage.c) -----
 * `--state-on host`: the prompt arena is host memory; before a layer of a pass reads or
 * writes the state, the driver (src/models/decoder.c) copies that layer's part into
 * one layer's worth of device memory (a stage, from a device arena), and after it
 * copies back what the layer wrote. What a stage carries: */
enum {
    LS_STAGE_PAGES = 1,  /* the layer's pages (K/V, latent rows, index keys) */
    LS_STAGE_REC = 2,    /* its recurrent state and conv tail */
    LS_STAGE_GPAGES = 4, /* full mode: its gradient pages */
    LS_STAGE_GREC = 8,   /* full mode: the gradient of its recurrent state */
    LS_STAGE_CKPT = 16   /* full mode: the sweep checkpoint a capture chunk writes */
};
typedef struct ls_backend ls_backend;
typedef struct ls_state_stage ls_state_stage;
/* Whether the ops of `be` read st's memory where it is (nothing to stage). */
int ls_state_resident(const ls_prompt_state *st, const ls_backend *be);
/* A stage of st for the ops of `be`, its device memory and bookkeeping from arena A
 * (one layer of the widest kind: cap_pages pages per table); *out NULL when st is
 * resident. The stage's state (ls_state_stage_dev) keeps its address for its lifetime. */
ls_status ls_state_stage_new(ls_state_stage **out, ls_prompt_state *st, const ls_backend *be, unsigned what,
                             ls_arena *A);
ls_prompt_state *ls_state_stage_dev(ls_state_stage *s);
/* Layer l onto the device: the pages holding this rank's positions before `upto`, the
 * recurrent state, the gradient tables, and (capture) the checkpoint of the sweep chunk
 * starting at `at` (−1: none). Returns the state the layer's ops read (no other
 * layer's tables are set in it). */
ls_prompt_state *ls_state_stage_in(ls_state_stage *s, int l, int64_t upto, int64_t at);
/* Back to the host, of what `what` names: the pages holding positions [wlo, whi), the
 * recurrent state, the gradient tables, the checkpoint; the host's page count follows. */
void ls_state_stage_out(ls_state_stage *s, unsigned what, int64_t wlo, int64_t whi);
/* Allocate layer `layer`'s pages for positions [st->n, hi) that have none yet (what an
 * append would allocate): a stage copies them in, the layer writes them. */
ls_status ls_state_reserve(ls_prompt_state *st, int layer, int64_t hi);

/* Predicted bytes of a stage carrying `what` of a state with cap_pages local pages
 * (full: in full mode with n_chunks sweep chunks): device memory, and its host part. */
void ls_state_stage_predict(const ls_config *c, int64_t cap_pages, int64_t page_size, ls_dtype dtype, int full,
                            int64_t n_chunks, unsigned what, size_t *dev, size_t *host);
/* The largest stage carrying `what` made by this process: device bytes, host part. */
void ls_state_stage_made(unsigned what, size_t *dev, size_t *host);
/* The stages alive at once at the peak of an update (a capture's; a branch's with, in full
 * mode, its backward's gradient stage; a CP sweep serving another rank), predicted from
 * the plan or as made by this process. */
void ls_state_stage_peak_predicted(const ls_state_plan_t *p, const ls_config *c, ls_dtype dtype, int cp,
                                   size_t *dev, size_t *host);
void ls_state_stage_peak_made(size_t *dev, size_t *host);
/* Where a state of plan p puts its bytes per rank on a device backend: in the device's
 * memory (its bookkeeping in the host part of the arena), or on_host with the stages on
 * the device (their bookkeeping on the host). */
void ls_state_placement(const ls_state_plan_t *p, const ls_config *c, ls_dtype dtype, int cp, int on_host, size_t *dev,
                        size_t *host);

ls_status ls_state_plan(ls_state_plan_t *p, const ls_config *cfg, int64_t prompt_len,
                        int64_t page_size, ls_dtype dtype, int cp, ls_cp_layout layout, int64_t sweep_chunk);

#endif
