/*
 * kernels.h — the CPU backend's kernels (src/backend/cpu/), each backward beside its
 * forward: the reference every backend is held to. The models reach them only
 * through the backend table (backend.h, ls_op_*); tests and benchmarks call them
 * directly. Conventions (STYLE.md §2, llm.c order):
 * outputs, saved-for-backward (tape; NULL = no tape), inputs, weights, dims.
 * Activations are f32, row-major, token-major: x[t][...]. Weights are in HF
 * layout [out, in]. Functions that need scratch memory take an ls_arena and
 * release what they used before returning.
 */
#ifndef LONGSTRAW_KERNELS_H
#define LONGSTRAW_KERNELS_H

#include <stdint.h>

#include "longstraw/core.h"

/* ---- linear ---------------------------------------------------------------- */
/* out[T,N] (=, or += when accumulate) x[T,K] · W[N,K]ᵀ, through cblas_sgemm. */
void ls_linear_fwd(float *out, const float *x, const float *W, int64_t T, int64_t K, int64_t N,
                   int accumulate);
/* dx[T,K] (=, or += when accumulate_dx) dout[T,N]·W; dW[N,K] += doutᵀ·x. dx or dW may be
 * NULL (skipped). */
void ls_linear_bwd(float *dx, float *dW, const float *dout, const float *x, const float *W,
                   int64_t T, int64_t K, int64_t N, int accumulate_dx);

/* ---- embedding ------------------------------------------------------------- */
/* out[T,D] = table[ids[t], :]; ids already validated < V. */
void ls_embed_fwd(float *out, const int32_t *ids, const float *table, int64_t T, int64_t D);
/* dtable[ids[t], :] += dout[t, :] (serial over t: repeated ids accumulate). */
void ls_embed_bwd(float *dtable, const float *dout, const int32_t *ids, int64_t T, int64_t D);

/* ---- norms ----------------------------------------------------------------- */
/* Zero-centred RMSNorm (specs/hybrid-qwen3next.md §5): y = x·rsqrt(mean(x²)+eps)·(1+w).
 * rows of length D; rstd[rows] saved when non-NULL. y may alias x. */
void ls_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, int64_t rows,
                    int64_t D, float eps);
/* dx[rows,D] (=) and dw[D] (+=; NULL skips) from dy, the input x and the saved rstd.
 * dx may alias dy. */
void ls_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *rstd,
                    const float *w, int64_t rows, int64_t D);
/* Plain RMSNorm (the MLA family, specs/mla-dsa-moe.md): y = x·rsqrt(mean(x²)+eps)·w; the
 * same contract as the zero-centred pair above. */
void ls_rmsnorm_plain_fwd(float *y, float *rstd, const float *x, const float *w, int64_t rows, int64_t D, float eps);
void ls_rmsnorm_plain_bwd(float *dx, float *dw, const float *dy, const float *x, const float *rstd, const float *w,
                          int64_t rows, int64_t D);
/* Gated RMSNorm (§2.7): y = x·rsqrt(mean(x²)+eps)·w ⊙ SiLU(z); plain w. */
void ls_gated_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *z, const float *w,
                          int64_t rows, int64_t D, float eps);
/* dx, dz [rows,D] (=), dw[D] (+=; NULL skips). dx may alias dy. */
void ls_gated_rmsnorm_bwd(float *dx, float *dz, float *dw, const float *dy, const float *x,
                          const float *z, const float *rstd, const float *w, int64_t rows,
                          int64_t D);
/* L2 norm per row (§2.5): y = x / sqrt(Σx² + eps); y may alias x; rnorm saved if non-NULL. */
void ls_l2norm_fwd(float *y, float *rnorm, const float *x, int64_t rows, int64_t D, float eps);
/* dx[rows,D] (=) from dy, the input x and the saved rnorm. dx may alias dy. */
void ls_l2norm_bwd(float *dx, const float *dy, const float *x, const float *rnorm, int64_t rows,
                   int64_t D);

/* ---- causal depthwise conv + SiLU ------------------------------------------ */
/* y[T,C] = SiLU(Σ_j w[c,j]·x[t−(W−1)+j, c]); positions before t = 0 come from
 * tail[W−1, C] (oldest first), which is updated in place to the last W−1 inputs.
 * pre[T,C] (pre-activation) saved when non-NULL. w is [C, W] (HF conv1d [C,1,W]). */
void ls_conv_fwd(float *y, float *pre, float *tail, const float *x, const float *w, int64_t T,
                 int64_t C, int64_t W);
/* dx[T,C] (=), dw[C,W] (+=; NULL skips), dtail[W−1,C] (= gradient w.r.t. the tail the
 * forward started from; NULL skips — the hook for the prompt-state gradient) from
 * dy[T,C], the saved pre-activation pre[T,C], the input x[T,C] and that initial tail. */
void ls_conv_bwd(float *dx, float *dw, float *dtail, const float *dy, const float *pre,
                 const float *x, const float *tail_in, const float *w, int64_t T, int64_t C,
                 int64_t W);
/* One token of each of n sequences (batched decode): row i of y, x [n, C] against its
 * own tail tails[i] [W−1, C] (updated in place); no pre-activation is kept. */
void ls_conv_step_seqs(float *y, float *const *tails, const float *x, const float *w, int64_t n, int64_t C,
                       int64_t W);

/* ---- rotary embedding ------------------------------------------------------ */
/* In-place partial rotate-half RoPE (§4.3) on x[T, heads, hd]: dims [0, rot) of each
 * head rotate with angle (pos0+t)·theta^(−2j/rot), pairing j with j + rot/2. */
void ls_rope_fwd(float *x, int64_t T, int heads, int hd, int rot, double theta, int64_t pos0);
/* In place: dx ← Rᵀ dx (the inverse rotation), same arguments. */
void ls_rope_bwd(float *dx, int64_t T, int heads, int hd, int rot, double theta, int64_t pos0);
/* The MLA family's rotary embedding (specs/mla-dsa-moe.md §2, §3): in place on dims
 * [off, off + 2·half) of every head of x[T, heads, hd], angle (pos0+t)·inv_freq[i] for
 * pair i = (off+2i, off+2i+1) when interleaved (MLA; GLM's indexer), else (off+i,
 * off+i+half) (DeepSeek-V3.2's indexer). inv_freq[half] may carry YaRN (mla.h). */
void ls_rope_table_fwd(float *x, int64_t T, int heads, int hd, int off, int half, const double *inv_freq,
                       int interleaved, int64_t pos0);
/* dx (= in place) ← Rᵀ·dx, same arguments. */
void ls_rope_table_bwd(float *dx, int64_t T, int heads, int hd, int off, int half, const double *inv_freq,
                       int interleaved, int64_t pos0);
/* The DSA lightning indexer's causal selection (spec §3, §8.1): query t sits at
 * position pos0 + t and sees keys 0..pos0+t of score[t, 0..n) ([T, n] row-major); it keeps
 * the min(k, pos0+t+1) largest scores, ties to the lower position. sel[T, k] (=) holds
 * the kept positions in ascending order, −1 after count[t] (=). Scores must be finite. */
ls_status ls_dsa_topk(int32_t *sel, int64_t *count, const float *score, int64_t T, int64_t n, int64_t pos0,
                      int64_t k, ls_arena *scratch);
/* The family's MoE routing (spec §4): s = σ(logits [T,E]); selection by s + bias
 * (bias [E] or NULL) among the topk_group best of n_group groups (a group scores its two
 * best), K experts, ties to the lower index; gates wt[T,K] (=) from the unbiased s,
 * renormalised when norm, times scaling; sel[T,K] (=) in selection order; s_out [T,E]
 * (=, NULL skips) for the backward. E <= 1024. */
void ls_mla_route_fwd(int32_t *sel, float *wt, float *s_out, const float *logits, const float *bias, int64_t T, int E,
                      int K, int n_group, int topk_group, int norm, double scaling);
/* LayerNorm with weight and bias over rows of x[n, d] (y may alias x). The backward
 * (the indexer KL loss trains k_norm): dx (=, may alias dy), dw and db (+=, NULL skips)
 * from dy and the forward's input x. */
void ls_layernorm_fwd(float *y, const float *x, const float *w, const float *b, int64_t n, int64_t d, float eps);
void ls_layernorm_bwd(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w, int64_t n,
                      int64_t d, float eps);
/* dlogits [T,E] (=) from dwt [T,K]; the selection and the bias get no gradient. */
void ls_mla_route_bwd(float *dlogits, const float *dwt, const float *s, const int32_t *sel, int64_t T, int E, int K,
                      int norm, double scaling);

/* MoE rows grouped by expert (both families): count[E+1] prefix sums, rows[T·K] =
 * token·K + slot, ascending within an expert. */
ls_status ls_moe_group(int64_t *count, int64_t *rows, const int32_t *sel, int64_t T, int E, int K, ls_arena *sc);
/* The hybrid family's MoE routing (specs/hybrid-qwen3next.md §5): probs[T,E] (=) =
 * softmax(logits); sel[T,K] (=) the K largest (ties to the lower index), wt[T,K] (=)
 * their probabilities, renormalised to sum 1 when norm_topk. */
void ls_moe_route(float *probs, int32_t *sel, float *wt, const float *logits, int64_t T, int E, int K, int norm_topk);
/* Its backward: dlogits [T,E] (=) from dwt [T,K] and the forward's probs, sel and wt;
 * the selection carries no gradient. E <= 1024. */
void ls_moe_route_bwd(float *dlogits, const float *dwt, const float *probs, const int32_t *sel, const float *wt,
                      int64_t T, int E, int K, int norm_topk);
/* One expert's routed rows (rows[i] = token·K + slot, from ls_moe_group): gather xs[n,D]
 * (=) = x[rows[i]/K]; scatter y[rows[i]/K] += wt[rows[i]]·ys[i] (wt NULL: weight 1), in
 * row order; and the combine's backward: dys[i] (=) = wt[rows[i]]·dy[rows[i]/K],
 * dwt[rows[i]] (=) = dy[rows[i]/K]·ys[i] (the dot in double). */
void ls_moe_gather(float *xs, const float *x, const int64_t *rows, int64_t n, int64_t D, int K);
void ls_moe_scatter_add(float *y, const float *ys, const int64_t *rows, const float *wt, int64_t n, int64_t D, int K);
void ls_moe_combine_bwd(float *dys, float *dwt, const float *dy, const float *ys, const int64_t *rows, const float *wt,
                        int64_t n, int64_t D, int K);

/* ---- activations ------------------------------------------------------------ */
/* out[T,I] = SiLU(gu[t, 0:I]) ⊙ gu[t, I:2I]. */
void ls_swiglu_fwd(float *out, const float *gu, int64_t T, int64_t n_inter);
/* dgu[T,2I] (=) from dout[T,I] and the forward input gu. */
void ls_swiglu_bwd(float *dgu, const float *dout, const float *gu, int64_t T, int64_t n_inter);
static inline float ls_sigmoidf(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }
/* The attention output gate: y[i] (=) = x[i]·σ(gate[i]) (y may alias x); backward:
 * dgate (=) and dx (=, may alias dy) from dy and the forward's x and gate. */
void ls_sigmoid_mul_fwd(float *y, const float *x, const float *gate, int64_t n);
void ls_sigmoid_mul_bwd(float *dx, float *dgate, const float *dy, const float *x, const float *gate, int64_t n);
/* The shared expert's gated add: x[t,:] += σ(logit[t])·y[t,:] over [T,D]; backward:
 * dy (=) = σ·dx and dlogit[t] (=) = (dx[t]·y[t])·σ(1−σ), the dot in double. */
void ls_gated_add_rows(float *x, const float *logit, const float *y, int64_t T, int64_t D);
void ls_gated_add_rows_bwd(float *dy, float *dlogit, const float *dx, const float *logit, const float *y, int64_t T,
                           int64_t D);

/* ---- products ------------------------------------------------------------------ */
/* y[i] += x[i] (a residual add), in index order. */
void ls_add_to(float *y, const float *x, int64_t n);
/* dst[r, 0:width] = src[r, 0:width] for r < rows, rows ld_dst / ld_src floats apart (a
 * strided block copy: a column slice of a wider row, or into one). */
void ls_copy_rows(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t width);
/* x[i] = f32(dtype(x[i])): the rounding a value gets when stored in pages of `dtype`
 * (f32: none; a 2-byte dtype: bf16 or f16). */
void ls_round_to(float *x, int64_t n, ls_dtype dtype);
/* dst[i] (=, stored as `dtype`: f32, bf16 or f16) = src[i]: rows written into pages. */
void ls_store_as(void *dst, const float *src, int64_t n, ls_dtype dtype);
/* C[M,N] = alpha·op(A)·op(B) + beta·C, row-major with leading dimensions; op(X) = Xᵀ
 * when trans_x (through cblas_sgemm). */
void ls_gemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
             const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

/* ---- optimizer ----------------------------------------------------------------- */
/* The constants of one AdamW step (torch semantics): gradients scaled by clip, bias
 * corrections bc1 = 1 − β1^step and bc2 = 1 − β2^step, eps outside the square root. */
typedef struct {
    double clip, bc1, bc2, lr, eps;
    float b1, b2;
} ls_adamw_hp;
/* One AdamW step over n elements in place: decoupled decay first (w·decay, decay =
 * 1 − lr·wd or 1), then m, v and w from the bias-corrected moments. */
void ls_adamw_step(const ls_adamw_hp *hp, float decay, float *w, const float *g, float *m, float *v, int64_t n);
/* The same step computed, nothing written: *bad (=) the first element whose new weight
 * or moment would be non-finite (or a negative second moment), −1 when none; then
 * at[3] (=) its new weight, exp_avg and exp_avg_sq (for the report). */
void ls_adamw_check(int64_t *bad, float *at, const ls_adamw_hp *hp, float decay, const float *w, const float *g,
                    const float *m, const float *v, int64_t n);
/* *out (=) Σ x[i]² in double (a gradient norm's share). */
void ls_sumsq(double *out, const float *x, int64_t n);
/* x[i] *= c. */
void ls_scale(float *x, float c, int64_t n);

/* ---- gated delta rule (specs/hybrid-qwen3next.md §2.6, §3) ------------------ */
/* Dimensions of one Gated DeltaNet recurrence. Value head h reads key head h/(H_v/H_k). */
typedef struct {
    int H_k, H_v, d_k, d_v;
    float scale; /* applied to q, normally d_k^-1/2 */
} ls_gdr_dims;

/* Chunked WY/UT form, chunk 64. q,k [T,H_k,d_k] already L2-normalised (scale not yet
 * applied), v [T,H_v,d_v], beta [T,H_v] = σ(b), g [T,H_v] = log decay (≤ 0).
 * state [H_v,d_k,d_v]: in = initial state S_0, out = final state S_T (f32).
 * o [T,H_v,d_v] = output. tape_h [ceil(T/64), H_v, d_k, d_v] (chunk-start states)
 * saved when non-NULL. Scratch from `scratch`, released before return. */
ls_status ls_gdr_chunk_fwd(float *o, float *tape_h, float *state, const float *q, const float *k,
                           const float *v, const float *beta, const float *g, int64_t T,
                           ls_gdr_dims dm, ls_arena *scratch);
/* Token-serial recurrence, same contract (the reference, and the one-token decode step). */
void ls_gdr_serial_fwd(float *o, float *state, const float *q, const float *k, const float *v,
                       const float *beta, const float *g, int64_t T, ls_gdr_dims dm);
/* One token of each of n sequences (batched decode): row i of o, q, k, v, beta, g
 * continues states[i] (advanced in place). */
void ls_gdr_step_seqs(float *o, float *const *states, const float *q, const float *k, const float *v,
                      const float *beta, const float *g, int64_t n, ls_gdr_dims dm);
/* The mixer's prologue (spec §2.3–§2.5) on the conv output y [T, 2·H_k·d_k + H_v·d_v]
 * = [q | k | v] and the projected ba [T, 2·H_v] = [b | a]: q, k [T,H_k,d_k] (=)
 * L2-normalised (eps 1e-6; rq, rk [T,H_k] their saved 1/norms, NULL skips), v (=) the
 * copy, beta = σ(b), g = −e^{A_log}·softplus(a + dt_bias) [T,H_v] (=). */
void ls_gdn_prep_fwd(float *q, float *k, float *v, float *beta, float *g, float *rq, float *rk, const float *y,
                     const float *ba, const float *A_log, const float *dt_bias, int64_t T, ls_gdr_dims dm);
/* Its backward from dq, dk, dv, dbeta, dg: dy [T, conv_dim] (=), dba [T, 2·H_v] (=),
 * dA_log, ddt_bias [H_v] (+=, in token order; NULL skips). */
void ls_gdn_prep_bwd(float *dy, float *dba, float *dA_log, float *ddt_bias, const float *dq, const float *dk,
                     const float *dv, const float *dbeta, const float *dg, const float *y, const float *rq,
                     const float *rk, const float *ba, const float *beta, const float *g, const float *A_log,
                     const float *dt_bias, int64_t T, ls_gdr_dims dm);
/* Backward of ls_gdr_chunk_fwd (spec §3, "Chunk backward"). Inputs: dout [T,H_v,d_v];
 * dstate_T [H_v,d_k,d_v] = gradient w.r.t. the final state (NULL = zero); the forward's
 * inputs q, k, v, beta, g and its tape_h (chunk-start states, tape_h[0] = S_0).
 * Outputs (all =): dq, dk [T,H_k,d_k] (summed over the value heads sharing a key head),
 * dv [T,H_v,d_v], dbeta, dg [T,H_v], dstate0 [H_v,d_k,d_v] = gradient w.r.t. the initial
 * state (NULL skips — the hook for the prompt-state gradient). Gradients are w.r.t.
 * the kernel's own inputs (normalised q, k; β; g), scale included. */
ls_status ls_gdr_chunk_bwd(float *dq, float *dk, float *dv, float *dbeta, float *dg,
                           float *dstate0, const float *dout, const float *dstate_T,
                           const float *tape_h, const float *q, const float *k, const float *v,
                           const float *beta, const float *g, int64_t T, ls_gdr_dims dm,
                           ls_arena *scratch);

/* ---- attention ----------------------------------------------------------------- */
/* A paged prefix of keys/values: positions [0, n) in pages of `page_size` positions;
 * page i holds positions [i·S, (i+1)·S) as [S, n_kv, hd] in `dtype` (F32 or BF16). */
typedef struct {
    int64_t n;
    int64_t page_size;
    ls_dtype dtype;
    void *const *k_pages;
    void *const *v_pages;
} ls_kv_prefix;

/* Sparse MLA attention, absorbed form (specs/mla-dsa-moe.md §2): T queries at
 * positions pos0.. with H heads, q [T, H, rkv+dr] = [W_UKᵀ q_nope ; q_pe]; one shared key
 * row per position [c_kv ; k_pe] (rkv + dr values), its first rkv values the value; rows
 * of positions < pos0 from `prefix` pages (f32 or bf16), the others from own [T, rkv+dr].
 * Query t attends to the positions sel[t, 0..k) (−1 ends the list; ls_dsa_topk). o [T, H,
 * rkv] (=) = Σ softmax(scale·q·key)·c_kv; lse [T, H] (=, NULL skips). */
ls_status ls_mla_attn_fwd(float *o, float *lse, const float *q, const float *own, const ls_kv_prefix *prefix,
                          const int32_t *sel, int64_t k, int64_t T, int H, int rkv, int dr, int64_t pos0, float scale);
/* Backward from the saved o and lse: dq [T, H, rkv+dr] (=); down [T, rkv+dr] (=, NULL
 * skips) the own rows' gradient (key and value parts); dprefix (+=, f32 pages like the
 * prefix, NULL skips) the prompt rows' — the full-mode hook. The selection carries no
 * gradient. */
ls_status ls_mla_attn_bwd(float *dq, float *down, void *const *dprefix, const float *dout, const float *o,
                          const float *lse, const float *q, const float *own, const ls_kv_prefix *prefix,
                          const int32_t *sel, int64_t k, int64_t T, int H, int rkv, int dr, int64_t pos0,
                          float scale);
/* The indexer KL loss's pieces (spec §3 "Indexer training", sparse stage), over the
 * selected rows sel[t, 0..k) (−1: none; positions below pos0 from pages, the others
 * from own rows, as ls_mla_attn_fwd reads them):
 * ls_mla_attn_probs: P[t, j] (=) = (1/H)·Σ_h exp(scale·q[t,h]·key_j − lse[t,h]), the
 *   attention's probabilities averaged over heads (0 where sel is −1);
 * ls_dsa_sel_scores: score[t, j] (=) = scale·Σ_h w[t,h]·ReLU(q[t,h]·k_j), the index scores of
 *   the selected keys (−inf where sel is −1), keys->k_pages the index-key pages, own
 *   [., dI] the own index keys;
 * ls_dsa_sel_scores_bwd: from dS = ∂L/∂I [T, k]: dq [T, nI, dI] (=), dw [T, nI] (=), down [., dI]
 *   (+=, NULL skips) the own keys' gradient; the paged keys get none. */
void ls_mla_attn_probs(float *P, const float *q, const float *lse, const float *own, const ls_kv_prefix *prefix,
                       const int32_t *sel, int64_t k, int64_t T, int H, int rkv, int dr, int64_t pos0, float scale);
void ls_dsa_sel_scores(float *score, const float *q, const float *w, const ls_kv_prefix *keys, const float *own,
                       const int32_t *sel, int64_t k, int64_t T, int nI, int dI, int64_t pos0, float scale);
void ls_dsa_sel_scores_bwd(float *dq, float *dw, float *down, const float *dS, const float *q, const float *w,
                           const ls_kv_prefix *keys, const float *own, const int32_t *sel, int64_t k, int64_t T, int nI,
                           int dI, int64_t pos0, float scale);
/* The lightning indexer's scores (spec §3): score[t, s] (=) = scale·Σ_j w[t,j]·ReLU(q[t,j]·k[s])
 * over the paged index keys (keys->k_pages: one key of dI values per position, f32 or
 * bf16); q [T, nI, dI], w [T, nI]; score [T, keys->n]. */
ls_status ls_dsa_scores(float *score, const float *q, const float *w, const ls_kv_prefix *keys, int64_t T, int nI,
                        int dI, float scale, ls_arena *scratch);

/* Causal attention of T new queries that sit at positions prefix->n .. prefix->n+T−1
 * over the whole prefix plus their own keys 0..t. q [T,n_h,hd], k,v [T,n_kv,hd] (f32),
 * GQA: query head h uses kv head h/(n_h/n_kv). o [T,n_h,hd]; lse [T,n_h] (natural-log
 * log-sum-exp of the scaled scores) saved when non-NULL. prefix may be NULL (empty).
 * Tiled online softmax: no [T, n] score buffer is ever formed. */
ls_status ls_attn_fwd(float *o, float *lse, const float *q, const float *k, const float *v,
                      const ls_kv_prefix *prefix, int64_t T, int n_h, int n_kv, int hd,
                      float scale, ls_arena *scratch);
/* Backward from the saved output o and lse: dq [T,n_h,hd], dk, dv [T,n_kv,hd] (all =)
 * for the call's own queries/keys/values. Prefix keys/values receive no gradient in the
 * prefix-frozen objective; dk_prefix/dv_prefix (same page layout as the prefix, f32;
 * NULL skips) are the hook where exact mode will accumulate (+=) it. */
ls_status ls_attn_bwd(float *dq, float *dk, float *dv, void *const *dk_prefix,
                      void *const *dv_prefix, const float *dout, const float *o, const float *lse,
                      const float *q, const float *k, const float *v, const ls_kv_prefix *prefix,
                      int64_t T, int n_h, int n_kv, int hd, float scale, ls_arena *scratch);
/* The partial of a context-parallel rank (DESIGN §8): attention of T queries over the
 * prefix only (no own keys, every prefix position visible). o [T,n_h,hd] normalised
 * over the prefix, lse [T,n_h] its log-sum-exp (−inf and o = 0 where the prefix is
 * empty). Partials combine exactly with ls_attn_merge. */
ls_status ls_attn_prefix_fwd(float *o, float *lse, const float *q, const ls_kv_prefix *prefix, int64_t T,
                             int n_h, int n_kv, int hd, float scale, ls_arena *scratch);
/* (o, lse) ← the log-sum-exp merge of (o, lse) and (o2, lse2): attention over the union
 * of both key sets. [T, n_h, hd] / [T, n_h]. */
void ls_attn_merge(float *o, float *lse, const float *o2, const float *lse2, int64_t T, int n_h, int hd);
/* Backward of a partial given the *merged* output o and lse (the softmax over every
 * rank's keys): dq (=) is this prefix's share of ∂L/∂q — the shares of all partials
 * sum to the whole — and dk_prefix/dv_prefix (+=, NULL skips) its keys' gradients. */
ls_status ls_attn_prefix_bwd(float *dq, void *const *dk_prefix, void *const *dv_prefix, const float *dout,
                             const float *o, const float *lse, const float *q, const ls_kv_prefix *prefix,
                             int64_t T, int n_h, int n_kv, int hd, float scale, ls_arena *scratch);
/* Naive reference: full score rows in double. For tests only (O(T·(n+T)) memory). */
void ls_attn_naive(float *o, float *lse, const float *q, const float *k, const float *v,
                   const ls_kv_prefix *prefix, int64_t T, int n_h, int n_kv, int hd, float scale);

/* ---- LM head ------------------------------------------------------------------- */
/* logprob[t] = log_softmax(h[t]·Wᵀ / temperature)[target[t]] over V; logits formed in
 * row chunks of `chunk_rows` from `scratch` (never a [T, V] buffer). lse[T] saved when
 * non-NULL. */
ls_status ls_lmhead_logprobs_fwd(float *logprob, float *lse, const float *h, const float *W,
                                 const int32_t *target, int64_t T, int64_t D, int64_t V,
                                 float temperature, int64_t chunk_rows, ls_arena *scratch);
/* Both in one pass over the logits: logprob/lse as above and/or entropy (NULL skips). */
ls_status ls_lmhead_fwd(float *logprob, float *lse, float *entropy, const float *h, const float *W,
                        const int32_t *target, int64_t T, int64_t D, int64_t V, float temperature,
                        int64_t chunk_rows, ls_arena *scratch);
/* Entropy of the (temperature-scaled) next-token distribution per row, entropy[T]. */
ls_status ls_lmhead_entropy(float *entropy, const float *h, const float *W, int64_t T, int64_t D,
                            int64_t V, float temperature, int64_t chunk_rows, ls_arena *scratch);
/* Backward: given dlogprob[T] = ∂L/∂logprob[t], dh[T,D] (=) and dW[V,D] (+=; NULL skips),
 * recomputing the logits chunk by chunk and using the saved lse. */
ls_status ls_lmhead_logprobs_bwd(float *dh, float *dW, const float *dlogprob, const float *h,
                                 const float *W, const int32_t *target, const float *lse,
                                 int64_t T, int64_t D, int64_t V, float temperature,
                                 int64_t chunk_rows, ls_arena *scratch);

#endif
