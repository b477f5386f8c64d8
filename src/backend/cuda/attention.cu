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

__device__ static float at_block_sum(float v, float *part) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0;
    for (int w = 0; w < AT_THREADS / 32; w++) s += part[w];
    return s;
}
__device__ static float at_block_max(float v, float *part) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    float m = -INFINITY;
    for (int w = 0; w < AT_THREADS / 32; w++) m = fmaxf(m, part[w]);
    return m;
}

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
    if (lse && threadIdx.x == 0) lse[t * n_h + h] = l > 0 ? m + logf(l) : -INFINITY;
}

/* The prefix's page tables on the device, from the arena (released by the caller). */
static ls_status dev_prefix_of(cuda_ctx *c, dev_prefix *dp, const ls_kv_prefix *pre, ls_arena *sc) {
    dp->n = pre ? pre->n : 0;
    dp->S = pre && pre->page_size > 0 ? pre->page_size : 1;
    dp->bf16 = pre && pre->dtype == LS_DTYPE_BF16;
    dp->kp = dp->vp = NULL;
    if (!pre || pre->n <= 0) return LS_OK;
    LS_ASSERT(pre->dtype == LS_DTYPE_F32 || pre->dtype == LS_DTYPE_BF16, "attention pages of dtype %d", (int)pre->dtype);
    int64_t np = (pre->n + dp->S - 1) / dp->S;
    void **t = (void **)ls_arena_alloc(sc, 2 * (size_t)np * sizeof(void *));
    if (!t) return LS_ERR_NOMEM;
    CU_CK(cudaMemcpyAsync(t, pre->k_pages, (size_t)np * sizeof(void *), cudaMemcpyDefault, c->stream));
    if (pre->v_pages)
        CU_CK(cudaMemcpyAsync(t + np, pre->v_pages, (size_t)np * sizeof(void *), cudaMemcpyDefault, c->stream));
    dp->kp = t, dp->vp = t + np;
    return LS_OK;
}
/* Gradient page tables (f32 pages, NULL: none) on the device. */
static ls_status dev_pages(cuda_ctx *c, void **out_dev, void *const *pages, int64_t n, int64_t S, ls_arena *sc) {
    *out_dev = NULL;
    if (!pages || n <= 0) return LS_OK;
    int64_t np = (n + S - 1) / S;
    void **t = (void **)ls_arena_alloc(sc, (size_t)np * sizeof(void *));
    if (!t) return LS_ERR_NOMEM;
    CU_CK(cudaMemcpyAsync(t, pages, (size_t)np * sizeof(void *), cudaMemcpyDefault, c->stream));
    *out_dev = t;
    return LS_OK;
}

static ls_status attn_fwd(cuda_ctx *c, float *o, float *lse, const float *q, const float *k, const float *v,
                          const ls_kv_prefix *prefix, int64_t T, int n_h, int n_kv, int hd, float scale, int own,
                          ls_arena *sc) {
    LS_ASSERT(n_h > 0 && n_kv > 0 && n_h % n_kv == 0 && hd > 0, "attention heads %d / %d, head dim %d", n_h, n_kv, hd);
    if (T <= 0) return LS_OK;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    dev_prefix P;
    ls_status s = dev_prefix_of(c, &P, prefix, sc);
    if (s != LS_OK) return s;
    size_t smem = (size_t)(2 * hd + AT_TILE) * sizeof(float);
    k_attn_fwd<<<(unsigned)(T * n_h), AT_THREADS, smem, c->stream>>>(o, lse, q, k, v, P, T, n_h, n_kv, hd, scale, own);
    CU_LAUNCHED();
    ls_arena_release(sc, mk);
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

/* Dd[t, h] = Σ_d dO·O (one block per row). */
__global__ static void k_attn_D(float *Dd, const float *dout, const float *o, int hd) {
    __shared__ float part[AT_THREADS / 32];
    int64_t r = blockIdx.x;
    float s = 0.0f;
    for (int d = threadIdx.x; d < hd; d += AT_THREADS) s += dout[r * hd + d] * o[r * hd + d];
    s = at_block_sum(s, part);
    if (threadIdx.x == 0) Dd[r] = s;
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
                                  const dev_prefix P, int64_t T, int64_t nkeys, int n_h, int n_kv, int hd, float scale,
                                  int own) {
    extern __shared__ float sm[];
    __shared__ float part[AT_THREADS / 32];
    float *ks = sm, *vs = sm + hd, *gk = vs + hd, *gv = gk + hd;
    int64_t j = blockIdx.x / n_kv;
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
    (void)nkeys;
}

static ls_status attn_bwd(cuda_ctx *c, float *dq, float *dk, float *dv, void *const *dk_prefix, void *const *dv_prefix,
                          const float *dout, const float *o, const float *lse, const float *q, const float *k,
                          const float *v, const ls_kv_prefix *prefix, int64_t T, int n_h, int n_kv, int hd,
                          float scale, int own, ls_arena *sc) {
    LS_ASSERT(n_h > 0 && n_kv > 0 && n_h % n_kv == 0 && hd > 0, "attention heads %d / %d, head dim %d", n_h, n_kv, hd);
    if (T <= 0) return LS_OK;
    ls_arena_mark mk = ls_arena_get_mark(sc);
    dev_prefix P;
    void *dkp = NULL, *dvp = NULL;
    float *Dd = (float *)ls_arena_alloc(sc, (size_t)(T * n_h) * sizeof(float));
    ls_status s = Dd ? dev_prefix_of(c, &P, prefix, sc) : LS_ERR_NOMEM;
    if (s == LS_OK) s = dev_pages(c, &dkp, dk_prefix, P.n, P.S, sc);
    if (s == LS_OK) s = dev_pages(c, &dvp, dv_prefix, P.n, P.S, sc);
    if (s != LS_OK) {
        ls_arena_release(sc, mk);
        return s;
    }
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
            dk, dv, (void *const *)dkp, (void *const *)dvp, dout, lse, Dd, q, k, v, P, T, nkeys, n_h, n_kv, hd, scale,
            own);
        CU_LAUNCHED();
    }
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
