/*
 * attention.cu — causal attention over paged K/V (attention.c's contract): the full form
 * (a paged prefix, then the call's own keys 0..t), the context-parallel partial (the
 * prefix only) and both backwards. A first, correct step: one block per (query, head)
 * walking the keys in tiles with an online softmax, and backwards written so that every
 * output has one writer (no atomics): dq by query rows, dk/dv by key rows; the tiled
 * kernels on tensor cores replace these.
 *
 * The prefix descriptor and its page tables are read where the caller keeps them (host
 * or device: copied with cudaMemcpyDefault); the pages themselves are device memory,
 * f32 or bf16 (keys/values), f32 for the gradient pages.
 */
#include <cuda_runtime.h>
#include <math.h>

#include "cuda_backend.h"

extern "C" const int ls_cuda_attention_file = 1;

#define AT_THREADS 128
#define AT_TILE 128
#define GRID_STRIDE_AT(i, n) \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)
static unsigned at_blocks(int64_t n) {
    int64_t b = (n + AT_THREADS - 1) / AT_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

typedef struct {
    int64_t n, S;  /* prefix positions, page size */
    int bf16;      /* pages in bf16 (else f32) */
    void *const *kp, *const *vp; /* device copies of the page tables */
} dev_prefix;

__device__ static inline float ld_elem(const void *p, int64_t i, int bf16) {
    return bf16 ? __uint_as_float((unsigned)((const unsigned short *)p)[i] << 16) : ((const float *)p)[i];
}
/* Key or value j (prefix positions first, then own rows) of kv head kh: element d. */
__device__ static inline float kv_at(const dev_prefix P, void *const *pages, const float *own, int64_t j, int n_kv,
                                     int kh, int hd, int d) {
    if (j < P.n) return ld_elem(pages[j / P.S], ((j % P.S) * n_kv + kh) * (int64_t)hd + d, P.bf16);
    return own[((j - P.n) * n_kv + kh) * (int64_t)hd + d];
}

#define at_block_sum(v, part) ls_blk_sum<AT_THREADS>((v), (part))
#define at_block_max(v, part) ls_blk_max<AT_THREADS>((v), (part))

/* Keys query t sees: the prefix, then (own) its own keys 0..t. */
__device__ static inline int64_t keys_seen(const dev_prefix P, int64_t t, int own) { return P.n + (own ? t + 1 : 0); }

/* One block per (t, h): o (=) and lse (=, NULL skips). Shared: q (hd), a tile of scores,
 * the output accumulator (hd). */
__global__ static void k_attn_fwd(float *o, float *lse, const float *q, const float *k, const float *v,
                                  const dev_prefix P, int64_t T, int n_h, int n_kv, int hd, float scale, int own) {
    extern __shared__ float sm[];
    __shared__ float part[AT_THREADS / 32];
    float *qs = sm, *sc = sm + hd, *acc = sc + AT_TILE;
    int64_t t = blockIdx.x / n_h;
    int h = (int)(blockIdx.x % n_h), kh = h / (n_h / n_kv);
    const float *qr = q + (t * n_h + h) * (int64_t)hd;
    for (int d = threadIdx.x; d < hd; d += AT_THREADS) qs[d] = qr[d], acc[d] = 0.0f;
    __syncthreads();
    int64_t N = keys_seen(P, t, own);
    float m = -INFINITY, l = 0.0f;
    for (int64_t j0 = 0; j0 < N; j0 += AT_TILE) {
        int nt = (int)(N - j0 < AT_TILE ? N - j0 : AT_TILE);
        float tmax = -INFINITY;
        for (int i = threadIdx.x; i < nt; i += AT_THREADS) {
            float s = 0.0f;
            for (int d = 0; d < hd; d++) s += qs[d] * kv_at(P, P.kp, k, j0 + i, n_kv, kh, hd, d);
            s *= scale;
            sc[i] = s;
            tmax = fmaxf(tmax, s);
        }
        tmax = at_block_max(tmax, part);
        float mn = fmaxf(m, tmax), corr = m == -INFINITY ? 0.0f : expf(m - mn), ps = 0.0f;
        __syncthreads();
        for (int i = threadIdx.x; i < nt; i += AT_THREADS) {
            float p = expf(sc[i] - mn);
            sc[i] = p;
            ps += p;
        }
        ps = at_block_sum(ps, part);
        __syncthreads();
        for (int d = threadIdx.x; d < hd; d += AT_THREADS) {
            float a = acc[d] * corr;
            for (int i = 0; i < nt; i++) a += sc[i] * kv_at(P, P.vp, v, j0 + i, n_kv, kh, hd, d);
            acc[d] = a;
        }
        l = l * corr + ps;
        m = mn;
        __syncthreads();
    }
    float *orow = o + (t * n_h + h) * (int64_t)hd;
    for (int d = threadIdx.x; d < hd; d += AT_THREADS) orow[d] = l > 0 ? acc[d] / l : 0.0f;
    if (lse && threadIdx.x == 0) lse[t * n_h + h] = l > 0 ? (float)((double)m + log((double)l)) : -INFINITY;
}

/* The prefix's page tables on the device (stream-ordered copies of wherever the caller
 * keeps them; dev_prefix_free after the kernels). */
static dev_prefix dev_prefix_of(cuda_ctx *c, const ls_kv_prefix *pre) {
    dev_prefix P;
    P.n = pre ? pre->n : 0;
    P.S = pre && pre->page_size > 0 ? pre->page_size : 1;
    P.bf16 = pre && pre->dtype == LS_DTYPE_BF16;
    P.kp = P.vp = NULL;
    if (P.n <= 0) return P;
    LS_ASSERT(pre->dtype == LS_DTYPE_F32 || pre->dtype == LS_DTYPE_BF16, "attention pages of dtype %d",
              (int)pre->dtype);
    int64_t np = (P.n + P.S - 1) / P.S;
    P.kp = (void *const *)ls_cuda_stage_table(c, pre->k_pages, np);
    P.vp = (void *const *)ls_cuda_stage_table(c, pre->v_pages, np);
    return P;
}
static void dev_prefix_free(cuda_ctx *c, const dev_prefix *P) {
    ls_cuda_unstage(c, (const void *)P->kp);
    ls_cuda_unstage(c, (const void *)P->vp);
}
/* Pages of the prefix's layout (gradient pages; NULL: none) staged like its tables. */
static void *const *dev_pages(cuda_ctx *c, void *const *pages, const dev_prefix *P) {
    return (void *const *)ls_cuda_stage_table(c, pages, P->n > 0 ? (P->n + P->S - 1) / P->S : 0);
}

static ls_status attn_fwd(cuda_ctx *c, float *o, float *lse, const float *q, const float *k, const float *v,
                          const ls_kv_prefix *prefix, int64_t T, int n_h, int n_kv, int hd, float scale, int own,
                          ls_arena *sc) {
    LS_ASSERT(n_h > 0 && n_kv > 0 && n_h % n_kv == 0 && hd > 0, "attention heads %d / %d, head dim %d", n_h, n_kv, hd);
    if (T <= 0) return LS_OK;
    (void)sc;
    dev_prefix P = dev_prefix_of(c, prefix);
    size_t smem = (size_t)(2 * hd + AT_TILE) * sizeof(float);
    k_attn_fwd<<<(unsigned)(T * n_h), AT_THREADS, smem, c->stream>>>(o, lse, q, k, v, P, T, n_h, n_kv, hd, scale, own);
    CU_LAUNCHED();
    dev_prefix_free(c, &P);
    return LS_OK;
}
extern "C" ls_status ls_cuda_attn_fwd(cuda_ctx *c, float *o, float *lse, const float *q, const float *k, const float *v,
                                      const ls_kv_prefix *prefix, int64_t T, int n_h, int n_kv, int hd, float scale,
                                      ls_arena *scratch) {
    return attn_fwd(c, o, lse, q, k, v, prefix, T, n_h, n_kv, hd, scale, 1, scratch);
}
extern "C" ls_status ls_cuda_attn_prefix_fwd(cuda_ctx *c, float *o, float *lse, const float *q,
                                             const ls_kv_prefix *prefix, int64_t T, int n_h, int n_kv, int hd,
                                             float scale, ls_arena *scratch) {
    return attn_fwd(c, o, lse, q, NULL, NULL, prefix, T, n_h, n_kv, hd, scale, 0, scratch);
}

/* ---- backward ----------------------------------------------------------------------- */

/* Dd[t, h] = Σ_d dO·O in double (one block per row), as the CPU sums it. */
__global__ static void k_attn_D(float *Dd, const float *dout, const float *o, int hd) {
    __shared__ double part[AT_THREADS / 32];
    int64_t r = blockIdx.x;
    double s = 0.0;
    for (int d = threadIdx.x; d < hd; d += AT_THREADS) s += (double)dout[r * hd + d] * o[r * hd + d];
    s = ls_blk_sum<AT_THREADS>(s, part);
    if (threadIdx.x == 0) Dd[r] = (float)s;
}

/* dq of (t, h) (=): scale·Σ_j P(dP − D)·k_j over the keys the row sees. */
__global__ static void k_attn_dq(float *dq, const float *dout, const float *lse, const float *Dd, const float *q,
                                 const float *k, const float *v, const dev_prefix P, int n_h, int n_kv, int hd,
                                 float scale, int own) {
    extern __shared__ float sm[];
    float *qs = sm, *dos = sm + hd, *ds = dos + hd, *acc = ds + AT_TILE;
    int64_t t = blockIdx.x / n_h;
    int h = (int)(blockIdx.x % n_h), kh = h / (n_h / n_kv);
    int64_t row = t * n_h + h;
    for (int d = threadIdx.x; d < hd; d += AT_THREADS) qs[d] = q[row * hd + d], dos[d] = dout[row * hd + d], acc[d] = 0;
    __syncthreads();
    float L = lse[row], D = Dd[row];
    int64_t N = keys_seen(P, t, own);
    for (int64_t j0 = 0; j0 < N; j0 += AT_TILE) {
        int nt = (int)(N - j0 < AT_TILE ? N - j0 : AT_TILE);
        for (int i = threadIdx.x; i < nt; i += AT_THREADS) {
            float s = 0.0f, dp = 0.0f;
            for (int d = 0; d < hd; d++) {
                s += qs[d] * kv_at(P, P.kp, k, j0 + i, n_kv, kh, hd, d);
                dp += dos[d] * kv_at(P, P.vp, v, j0 + i, n_kv, kh, hd, d);
            }
            float p = L == -INFINITY ? 0.0f : expf(s * scale - L);
            ds[i] = p * (dp - D);
        }
        __syncthreads();
        for (int d = threadIdx.x; d < hd; d += AT_THREADS) {
            float a = acc[d];
            for (int i = 0; i < nt; i++) a += ds[i] * kv_at(P, P.kp, k, j0 + i, n_kv, kh, hd, d);
            acc[d] = a;
        }
        __syncthreads();
    }
    for (int d = threadIdx.x; d < hd; d += AT_THREADS) dq[row * hd + d] = scale * acc[d];
}

/* dk, dv of key j (kv head kh) over every query (and query head of the group) that sees
 * it: own key j (position P.n + j) is seen by queries t >= j; a prefix key by all. dk/dv
 * own rows (=) or gradient pages (+=). One block per (key, kv head), threads over dims. */
__global__ static void k_attn_dkv(float *dk, float *dv, void *const *dkp, void *const *dvp, const float *dout,
                                  const float *lse, const float *Dd, const float *q, const float *k, const float *v,
                                  const dev_prefix P, int64_t T, int64_t first, int n_h, int n_kv, int hd, float scale,
                                  int own) {
    extern __shared__ float sm[];
    __shared__ float part[AT_THREADS / 32];
    float *ks = sm, *vs = sm + hd, *gk = vs + hd, *gv = gk + hd;
    int64_t j = first + blockIdx.x / n_kv; /* keys from `first` (the prefix's are skipped without its gradient) */
    int kh = (int)(blockIdx.x % n_kv), rep = n_h / n_kv;
    for (int d = threadIdx.x; d < hd; d += AT_THREADS) {
        ks[d] = kv_at(P, P.kp, k, j, n_kv, kh, hd, d);
        vs[d] = kv_at(P, P.vp, v, j, n_kv, kh, hd, d);
        gk[d] = gv[d] = 0.0f;
    }
    __syncthreads();
    int64_t t0 = j < P.n ? 0 : j - P.n; /* the first query that sees it */
    for (int64_t t = t0; t < T; t++)
        for (int r = 0; r < rep; r++) {
            int64_t row = t * n_h + kh * rep + r;
            const float *qr = q + row * hd, *dr = dout + row * hd;
            float s = 0.0f, dp = 0.0f;
            for (int d = threadIdx.x; d < hd; d += AT_THREADS) s += qr[d] * ks[d], dp += dr[d] * vs[d];
            s = at_block_sum(s, part);
            dp = at_block_sum(dp, part);
            float L = lse[row], p = L == -INFINITY ? 0.0f : expf(s * scale - L), dsv = p * (dp - Dd[row]);
            for (int d = threadIdx.x; d < hd; d += AT_THREADS) gk[d] += scale * dsv * qr[d], gv[d] += p * dr[d];
        }
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += AT_THREADS) {
        if (j < P.n) {
            int64_t off = ((j % P.S) * n_kv + kh) * (int64_t)hd + d;
            if (dkp) ((float *)dkp[j / P.S])[off] += gk[d];
            if (dvp) ((float *)dvp[j / P.S])[off] += gv[d];
        } else if (own) {
            int64_t off = ((j - P.n) * n_kv + kh) * (int64_t)hd + d;
            dk[off] = gk[d], dv[off] = gv[d];
        }
    }
}

static ls_status attn_bwd(cuda_ctx *c, float *dq, float *dk, float *dv, void *const *dk_prefix, void *const *dv_prefix,
                          const float *dout, const float *o, const float *lse, const float *q, const float *k,
                          const float *v, const ls_kv_prefix *prefix, int64_t T, int n_h, int n_kv, int hd,
                          float scale, int own, ls_arena *sc) {
    LS_ASSERT(n_h > 0 && n_kv > 0 && n_h % n_kv == 0 && hd > 0, "attention heads %d / %d, head dim %d", n_h, n_kv, hd);
    if (T <= 0) return LS_OK;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    float *Dd = (float *)ls_arena_alloc(sc, (size_t)(T * n_h) * sizeof(float));
    if (!Dd) return LS_ERR_NOMEM;
    dev_prefix P = dev_prefix_of(c, prefix);
    void *const *dkp = dev_pages(c, dk_prefix, &P), *const *dvp = dev_pages(c, dv_prefix, &P);
    k_attn_D<<<(unsigned)(T * n_h), AT_THREADS, 0, c->stream>>>(Dd, dout, o, hd);
    CU_LAUNCHED();
    k_attn_dq<<<(unsigned)(T * n_h), AT_THREADS, (size_t)(3 * hd + AT_TILE) * sizeof(float), c->stream>>>(
        dq, dout, lse, Dd, q, k, v, P, n_h, n_kv, hd, scale, own);
    CU_LAUNCHED();
    int64_t nkeys = P.n + (own ? T : 0);
    int want_prefix = dkp || dvp;
    int64_t first = want_prefix ? 0 : P.n; /* prefix keys only when their gradient is wanted */
    if (nkeys > first) {
        k_attn_dkv<<<(unsigned)((nkeys - first) * n_kv), AT_THREADS, (size_t)(4 * hd) * sizeof(float), c->stream>>>(
            dk, dv, dkp, dvp, dout, lse, Dd, q, k, v, P, T, first, n_h, n_kv, hd, scale, own);
        CU_LAUNCHED();
    }
    ls_cuda_unstage(c, (const void *)dkp), ls_cuda_unstage(c, (const void *)dvp);
    dev_prefix_free(c, &P);
    ls_arena_release(sc, mk);
    return LS_OK;
}
extern "C" ls_status ls_cuda_attn_bwd(cuda_ctx *c, float *dq, float *dk, float *dv, void *const *dk_prefix,
                                      void *const *dv_prefix, const float *dout, const float *o, const float *lse,
                                      const float *q, const float *k, const float *v, const ls_kv_prefix *prefix,
                                      int64_t T, int n_h, int n_kv, int hd, float scale, ls_arena *scratch) {
    return attn_bwd(c, dq, dk, dv, dk_prefix, dv_prefix, dout, o, lse, q, k, v, prefix, T, n_h, n_kv, hd, scale, 1,
                    scratch);
}
extern "C" ls_status ls_cuda_attn_prefix_bwd(cuda_ctx *c, float *dq, void *const *dk_prefix, void *const *dv_prefix,
                                             const float *dout, const float *o, const float *lse, const float *q,
                                             const ls_kv_prefix *prefix, int64_t T, int n_h, int n_kv, int hd,
                                             float scale, ls_arena *scratch) {
    return attn_bwd(c, dq, NULL, NULL, dk_prefix, dv_prefix, dout, o, lse, q, NULL, NULL, prefix, T, n_h, n_kv, hd,
                    scale, 0, scratch);
}

/* ---- MLA absorbed sparse attention and the DSA indexer (mla_attn.c, mla_ops.c) ------------ */

/* Entries of a selection list before its first −1 (−1 ends the list). */
__device__ static inline int64_t list_len(const int32_t *st, int64_t k) {
    int64_t n = 0;
    while (n < k && st[n] >= 0) n++;
    return n;
}

/* Row of position p with dk values: a page row (f32 or bf16) below pos0, else an own row. */
__device__ static inline float row_at(const dev_prefix P, const float *own, int64_t pos0, int64_t p, int dk, int d) {
    if (p >= pos0) return own[(p - pos0) * dk + d];
    return ld_elem(P.kp[p / P.S], (p % P.S) * (int64_t)dk + d, P.bf16);
}
__device__ static inline float row_dot(const float *a, const dev_prefix P, const float *own, int64_t pos0, int64_t p,
                                       int dk, int n) {
    float s = 0.0f;
    for (int d = 0; d < n; d++) s += a[d] * row_at(P, own, pos0, p, dk, d);
    return s;
}

/* One block per (t, h): scores of the selected rows in shared memory, softmax, o = Σ p·c_kv. */
__global__ static void k_mla_fwd(float *o, float *lse, const float *q, const float *own, const dev_prefix P,
                                 const int32_t *sel, int64_t k, int H, int rkv, int dr, int64_t pos0, float scale) {
    extern __shared__ float sm[];
    __shared__ float part[AT_THREADS / 32];
    int dk = rkv + dr;
    float *sc = sm, *qs = sm + k;
    int64_t t = blockIdx.x / H;
    int h = (int)(blockIdx.x % H);
    for (int d = threadIdx.x; d < dk; d += AT_THREADS) qs[d] = q[(t * H + h) * dk + d];
    __syncthreads();
    const int32_t *st = sel + t * k;
    k = list_len(st, k); /* −1 ends the list */
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < k; j += AT_THREADS) {
        float s = st[j] < 0 ? -INFINITY : scale * row_dot(qs, P, own, pos0, st[j], dk, dk);
        sc[j] = s;
        mx = fmaxf(mx, s);
    }
    mx = at_block_max(mx, part);
    double l = 0;
    for (int64_t j = threadIdx.x; j < k; j += AT_THREADS) {
        float p = st[j] < 0 ? 0.0f : expf(sc[j] - mx);
        sc[j] = p;
        l += p;
    }
    __shared__ double dpart[AT_THREADS / 32];
    l = ls_blk_sum<AT_THREADS>(l, dpart);
    if (lse && threadIdx.x == 0) lse[t * H + h] = l > 0 ? (float)(mx + log(l)) : -INFINITY;
    float il = l > 0 ? (float)(1.0 / l) : 0.0f;
    for (int d = threadIdx.x; d < rkv; d += AT_THREADS) {
        float a = 0.0f;
        for (int64_t j = 0; j < k; j++)
            if (st[j] >= 0) a += sc[j] * row_at(P, own, pos0, st[j], dk, d);
        o[(t * H + h) * rkv + d] = a * il;
    }
}
extern "C" ls_status ls_cuda_mla_attn_fwd(cuda_ctx *c, float *o, float *lse, const float *q, const float *own,
                                          const ls_kv_prefix *prefix, const int32_t *sel, int64_t k, int64_t T, int H,
                                          int rkv, int dr, int64_t pos0, float scale) {
    if (T <= 0 || H <= 0) return LS_OK;
    dev_prefix P = dev_prefix_of(c, prefix);
    size_t smem = (size_t)(k + rkv + dr) * sizeof(float);
    LS_ASSERT(smem <= 48 * 1024 - 1024, "MLA attention: %lld selected rows and a row of %d in shared memory", (long long)k,
              rkv + dr);
    k_mla_fwd<<<(unsigned)(T * H), AT_THREADS, smem, c->stream>>>(o, lse, q, own, P, sel, k, H, rkv, dr, pos0, scale);
    CU_LAUNCHED();
    dev_prefix_free(c, &P);
    return LS_OK;
}

/* dq of (t, h) (=), and P, ds of its selected rows into scratch [T, H, k]. */
__global__ static void k_mla_bwd_q(float *dq, float *Pst, float *dst, const float *dout, const float *o,
                                   const float *lse, const float *q, const float *own, const dev_prefix P,
                                   const int32_t *sel, int64_t k, int H, int rkv, int dr, int64_t pos0, float scale) {
    __shared__ float part[AT_THREADS / 32];
    int dk = rkv + dr;
    int64_t t = blockIdx.x / H;
    int h = (int)(blockIdx.x % H);
    const float *qh = q + (t * H + h) * dk, *oh = o + (t * H + h) * rkv, *gh = dout + (t * H + h) * rkv;
    float Dd = 0.0f;
    for (int d = threadIdx.x; d < rkv; d += AT_THREADS) Dd += gh[d] * oh[d];
    Dd = at_block_sum(Dd, part);
    float L = lse[t * H + h];
    const int32_t *st = sel + t * k;
    float *Pr = Pst + (t * H + h) * k, *dr_ = dst + (t * H + h) * k;
    int64_t n = list_len(st, k); /* −1 ends the list: the rest get P = ds = 0 */
    for (int64_t j = threadIdx.x; j < k; j += AT_THREADS) {
        float p = 0.0f, ds = 0.0f;
        if (j < n) {
            p = expf(scale * row_dot(qh, P, own, pos0, st[j], dk, dk) - L);
            ds = p * (row_dot(gh, P, own, pos0, st[j], dk, rkv) - Dd) * scale;
        }
        Pr[j] = p, dr_[j] = ds;
    }
    __syncthreads();
    for (int d = threadIdx.x; d < dk; d += AT_THREADS) {
        float a = 0.0f;
        for (int64_t j = 0; j < n; j++) a += dr_[j] * row_at(P, own, pos0, st[j], dk, d);
        dq[(t * H + h) * dk + d] = a;
    }
}
/* The selected rows' gradients, one thread per dimension d, queries and rows in the
 * CPU's order (serial over queries: rows chosen by several queries meet). */
__global__ static void k_mla_bwd_rows(float *down, void *const *dpre, int64_t S, const float *Pst, const float *dst,
                                      const float *dout, const float *q, const int32_t *sel, int64_t k, int64_t T,
                                      int H,
                                      int rkv, int dr, int64_t pos0) {
    int dk = rkv + dr;
    GRID_STRIDE_AT(d, dk) {
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < k; j++) {
                int64_t p = sel[t * k + j];
                if (p < 0) break; /* −1 ends the list */
                float *row = p >= pos0 ? (down ? down + (p - pos0) * dk : NULL)
                                       : (dpre ? (float *)dpre[p / S] + (p % S) * dk : NULL);
                if (!row) continue;
                float a = 0.0f;
                for (int h = 0; h < H; h++) {
                    int64_t r = (t * H + h) * k + j;
                    a += dst[r] * q[(t * H + h) * dk + d];
                    if (d < rkv) a += Pst[r] * dout[(t * H + h) * rkv + d];
                }
                row[d] += a;
            }
    }
}
extern "C" ls_status ls_cuda_mla_attn_bwd(cuda_ctx *c, float *dq, float *down, void *const *dprefix, const float *dout,
                                          const float *o, const float *lse, const float *q, const float *own,
                                          const ls_kv_prefix *prefix, const int32_t *sel, int64_t k, int64_t T, int H,
                                          int rkv, int dr, int64_t pos0, float scale) {
    int dk = rkv + dr;
    if (down) CU_CK(cudaMemsetAsync(down, 0, (size_t)(T * dk) * sizeof(float), c->stream));
    if (T <= 0 || H <= 0) return LS_OK;
    if (k <= 0) return LS_OK;
    dev_prefix P = dev_prefix_of(c, prefix);
    /* P and ds of a chunk of queries (at most 64 Mi floats of scratch); the rows'
     * gradients take the chunks in query order, as the CPU's serial loop */
    int64_t per = 2 * (int64_t)H * k, tc = ((int64_t)64 << 20) / per;
    tc = tc < 1 ? 1 : tc > T ? T : tc;
    float *Pst = NULL;
    if (cudaMallocAsync((void **)&Pst, (size_t)(tc * per) * sizeof(float), c->stream) != cudaSuccess) {
        (void)cudaGetLastError();
        dev_prefix_free(c, &P);
        return ls_err(LS_ERR_NOMEM, "MLA attention backward: %lld queries x %d heads x %lld rows of scratch",
                      (long long)tc, H, (long long)k);
    }
    void *const *dtab = dev_pages(c, dprefix, &P);
    for (int64_t t0 = 0; t0 < T; t0 += tc) {
        int64_t n = T - t0 < tc ? T - t0 : tc;
        float *dst = Pst + n * H * k;
        k_mla_bwd_q<<<(unsigned)(n * H), AT_THREADS, 0, c->stream>>>(dq + t0 * H * dk, Pst, dst, dout + t0 * H * rkv,
                                                                     o + t0 * H * rkv, lse + t0 * H, q + t0 * H * dk,
                                                                     own, P, sel + t0 * k, k, H, rkv, dr, pos0, scale);
        CU_LAUNCHED();
        if (down || dtab) {
            k_mla_bwd_rows<<<(unsigned)((dk + 127) / 128), 128, 0, c->stream>>>(
                down, dtab, P.S, Pst, dst, dout + t0 * H * rkv, q + t0 * H * dk, sel + t0 * k, k, n, H,
                rkv, dr, pos0);
            CU_LAUNCHED();
        }
    }
    CU_CK(cudaFreeAsync(Pst, c->stream));
    ls_cuda_unstage(c, (const void *)dtab);
    dev_prefix_free(c, &P);
    return LS_OK;
}

/* P[t, j] = (1/H)·Σ_h exp(scale·q_h·row − lse_h), thread per (t, j). */
__global__ static void k_mla_probs(float *Pout, const float *q, const float *lse, const float *own, const dev_prefix P,
                                   const int32_t *sel, int64_t k, int64_t T, int H, int dk, int64_t pos0, float scale) {
    GRID_STRIDE_AT(i, T * k) {
        int64_t t = i / k, p = sel[i];
        if (p < 0) {
            Pout[i] = 0.0f;
            continue;
        }
        double s = 0;
        for (int h = 0; h < H; h++)
            s += exp((double)(scale * row_dot(q + (t * H + h) * dk, P, own, pos0, p, dk, dk)) - lse[t * H + h]);
        Pout[i] = (float)(s / H);
    }
}
extern "C" void ls_cuda_mla_attn_probs(cuda_ctx *c, float *Pout, const float *q, const float *lse, const float *own,
                                       const ls_kv_prefix *prefix, const int32_t *sel, int64_t k, int64_t T, int H,
                                       int rkv, int dr, int64_t pos0, float scale) {
    if (T <= 0 || k <= 0) return;
    dev_prefix P = dev_prefix_of(c, prefix);
    k_mla_probs<<<at_blocks(T * k), AT_THREADS, 0, c->stream>>>(Pout, q, lse, own, P, sel, k, T, H, rkv + dr, pos0,
                                                               scale);
    CU_LAUNCHED();
    dev_prefix_free(c, &P);
}

/* score[t, j] = scale·Σ_h w·ReLU(q_h·key) of the selected index keys (−inf where none). */
__global__ static void k_dsa_sel(float *score, const float *q, const float *w, const dev_prefix P, const float *own,
                                 const int32_t *sel, int64_t k, int64_t T, int nI, int dI, int64_t pos0, float scale) {
    GRID_STRIDE_AT(i, T * k) {
        int64_t t = i / k, p = sel[i];
        if (p < 0) {
            score[i] = -INFINITY;
            continue;
        }
        double s = 0;
        for (int h = 0; h < nI; h++) {
            float a = row_dot(q + (t * nI + h) * dI, P, own, pos0, p, dI, dI);
            if (a > 0) s += (double)w[t * nI + h] * a;
        }
        score[i] = (float)(s * scale);
    }
}
extern "C" void ls_cuda_dsa_sel_scores(cuda_ctx *c, float *score, const float *q, const float *w,
                                       const ls_kv_prefix *keys, const float *own, const int32_t *sel, int64_t k,
                                       int64_t T, int nI, int dI, int64_t pos0, float scale) {
    if (T <= 0 || k <= 0) return;
    dev_prefix P = dev_prefix_of(c, keys);
    k_dsa_sel<<<at_blocks(T * k), AT_THREADS, 0, c->stream>>>(score, q, w, P, own, sel, k, T, nI, dI, pos0, scale);
    CU_LAUNCHED();
    dev_prefix_free(c, &P);
}

/* dq [t, h] (=) and dw (=), thread per (t, h); the coefficient c of each (t, j, h) into
 * cst for the own keys' gradient. */
__global__ static void k_dsa_sel_bwd_q(float *dq, float *dw, float *cst, const float *dS, const float *q,
                                       const float *w,
                                       const dev_prefix P, const float *own, const int32_t *sel, int64_t k, int64_t T,
                                       int nI, int dI, int64_t pos0, float scale) {
    GRID_STRIDE_AT(i, T * nI) {
        int64_t t = i / nI;
        int h = (int)(i % nI);
        const float *qh = q + i * dI;
        float *dqh = dq + i * dI, dwv = 0.0f;
        for (int d = 0; d < dI; d++) dqh[d] = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            int64_t p = sel[t * k + j];
            float g = dS[t * k + j], c = 0.0f;
            if (p >= 0 && g != 0.0f) {
                float a = row_dot(qh, P, own, pos0, p, dI, dI);
                if (a > 0) {
                    dwv += g * scale * a;
                    c = g * scale * w[i];
                    for (int d = 0; d < dI; d++) dqh[d] += c * row_at(P, own, pos0, p, dI, d);
                }
            }
            if (cst) cst[(t * k + j) * nI + h] = c;
        }
        dw[i] = dwv;
    }
}
__global__ static void k_dsa_sel_bwd_own(float *down, const float *cst, const float *q, const int32_t *sel, int64_t k,
                                         int64_t T, int nI, int dI, int64_t pos0) {
    GRID_STRIDE_AT(d, dI) {
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < k; j++) {
                int64_t p = sel[t * k + j];
                if (p < pos0) continue; /* −1, or a paged key: no gradient */
                for (int h = 0; h < nI; h++) {
                    float c = cst[(t * k + j) * nI + h];
                    if (c != 0.0f) down[(p - pos0) * dI + d] += c * q[(t * nI + h) * dI + d];
                }
            }
    }
}
extern "C" void ls_cuda_dsa_sel_scores_bwd(cuda_ctx *c, float *dq, float *dw, float *down, const float *dS,
                                           const float *q, const float *w, const ls_kv_prefix *keys, const float *own,
                                           const int32_t *sel, int64_t k, int64_t T, int nI, int dI, int64_t pos0,
                                           float scale) {
    if (T <= 0) return;
    dev_prefix P = dev_prefix_of(c, keys);
    /* the own keys' coefficients of a chunk of queries (at most 64 Mi floats), chunks in
     * query order as the CPU's serial loop */
    int64_t tc = down && k > 0 ? ((int64_t)64 << 20) / (k * nI) : T;
    tc = tc < 1 ? 1 : tc > T ? T : tc;
    float *cst = NULL;
    if (down && k > 0) CU_CK(cudaMallocAsync((void **)&cst, (size_t)(tc * k * nI) * sizeof(float), c->stream));
    for (int64_t t0 = 0; t0 < T; t0 += tc) {
        int64_t n = T - t0 < tc ? T - t0 : tc;
        k_dsa_sel_bwd_q<<<at_blocks(n * nI), AT_THREADS, 0, c->stream>>>(dq + t0 * nI * dI, dw + t0 * nI, cst,
                                                                         dS + t0 * k, q + t0 * nI * dI, w + t0 * nI, P,
                                                                         own, sel + t0 * k, k, n, nI, dI, pos0, scale);
        CU_LAUNCHED();
        if (cst) {
            k_dsa_sel_bwd_own<<<at_blocks(dI), AT_THREADS, 0, c->stream>>>(down, cst, q + t0 * nI * dI, sel + t0 * k,
                                                                           k, n, nI, dI, pos0);
            CU_LAUNCHED();
        }
    }
    if (cst) CU_CK(cudaFreeAsync(cst, c->stream));
    dev_prefix_free(c, &P);
}

/* The indexer's scores over every paged key, thread per (t, s), heads in order. */
__global__ static void k_dsa_scores(float *score, const float *q, const float *w, const dev_prefix P, int64_t T, int nI,
                                    int dI, float scale) {
    GRID_STRIDE_AT(i, T * P.n) {
        int64_t t = i / P.n, s = i % P.n;
        float sc = 0.0f;
        for (int h = 0; h < nI; h++) {
            float a = 0.0f;
            const void *pg = P.kp[s / P.S];
            for (int d = 0; d < dI; d++) a += q[(t * nI + h) * dI + d] * ld_elem(pg, (s % P.S) * dI + d, P.bf16);
            sc += w[t * nI + h] * (a > 0.0f ? a : 0.0f);
        }
        score[i] = sc * scale;
    }
}
extern "C" ls_status ls_cuda_dsa_scores(cuda_ctx *c, float *score, const float *q, const float *w,
                                        const ls_kv_prefix *keys, int64_t T, int nI, int dI, float scale,
                                        ls_arena *scratch) {
    if (keys->n == 0 || T == 0) return LS_OK;
    (void)scratch;
    dev_prefix P = dev_prefix_of(c, keys);
    k_dsa_scores<<<at_blocks(T * P.n), AT_THREADS, 0, c->stream>>>(score, q, w, P, T, nI, dI, scale);
    CU_LAUNCHED();
    dev_prefix_free(c, &P);
    return LS_OK;
}

/* Causal top-k by radix select, a thread per query: the want-th largest score's key
 * (floats mapped to ordered integers) in four 8-bit passes, then every position above it
 * and the lowest ones equal to it, ascending — the CPU's selection exactly. */
__device__ static inline unsigned ordered(float f) {
    if (f == 0.0f) f = 0.0f; /* −0 and +0 are one value to the CPU's comparisons: a tie */
    unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}
__global__ static void k_dsa_topk(int32_t *sel, int64_t *count, const float *score, int64_t T, int64_t n, int64_t pos0,
                                  int64_t k) {
    GRID_STRIDE_AT(t, T) {
        const float *s = score + t * n;
        int64_t m = pos0 + t + 1, want = m < k ? m : k, c = 0;
        int32_t *out = sel + t * k;
        if (want == m) {
            for (int64_t j = 0; j < m; j++) out[c++] = (int32_t)j;
        } else {
            unsigned prefix = 0, mask = 0;
            int64_t remaining = want;
            unsigned hist[256];
            for (int shift = 24; shift >= 0; shift -= 8) {
                for (int b = 0; b < 256; b++) hist[b] = 0;
                for (int64_t j = 0; j < m; j++) {
                    unsigned key = ordered(s[j]);
                    if ((key & mask) == prefix) hist[(key >> shift) & 255u]++;
                }
                for (int b = 255; b >= 0; b--) {
                    if ((int64_t)hist[b] >= remaining) {
                        prefix |= (unsigned)b << shift, mask |= 255u << shift;
                        break;
                    }
                    remaining -= hist[b];
                }
            }
            int64_t ties = remaining; /* keys equal to the threshold still to take */
            for (int64_t j = 0; j < m; j++) {
                unsigned key = ordered(s[j]);
                if (key > prefix || (key == prefix && ties-- > 0)) out[c++] = (int32_t)j;
            }
        }
        count[t] = c;
        for (int64_t j = c; j < k; j++) out[j] = -1;
    }
}
extern "C" ls_status ls_cuda_dsa_topk(cuda_ctx *c, int32_t *sel, int64_t *count, const float *score, int64_t T,
                                      int64_t n, int64_t pos0, int64_t k, ls_arena *scratch) {
    (void)scratch;
    LS_ASSERT(k >= 1 && pos0 >= 0 && pos0 + T <= n, "top-k of %lld queries at %lld over %lld keys", (long long)T,
              (long long)pos0, (long long)n);
    if (T <= 0) return LS_OK;
    k_dsa_topk<<<at_blocks(T), 64, 0, c->stream>>>(sel, count, score, T, n, pos0, k);
    CU_LAUNCHED();
    return LS_OK;
}
