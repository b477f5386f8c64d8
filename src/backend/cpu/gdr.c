/*
 * gdr.c — gated delta rule (specs/hybrid-qwen3next.md §2.6, §3): the token-serial
 * recurrence (reference and one-token decode step), the chunked WY/UT form (chunk
 * 64) used for prompt capture, and its backward (reverse chunk scan recomputing
 * each chunk from the taped chunk-start states). Threads split the value heads.
 * The chunked form does its matrix products with a small register-blocked kernel
 * (mm, 6×16 tile of 8-float vectors; GNU C's default -ffp-contract=fast makes
 * them FMAs) on 64-byte-aligned per-thread buffers whose widths are padded to a
 * multiple of 16 floats (zero padding changes no result). At these sizes
 * (≤ 128×128×128) it measured 77–94 GFLOP/s per Zen core against 52–74 for a
 * single-threaded OpenBLAS 0.3.21 cblas_sgemm, and it does not depend on how
 * the BLAS was threaded.
 */
#include <math.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "longstraw/kernels.h"

/* Without AVX (LS_NATIVE=OFF) GCC warns that passing 32-byte vectors changes the
 * ABI; every function here that does so is static, so no ABI is crossed. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

#define GDR_CHUNK 64 /* rows per chunk (§3, FLA default) */
/* Row stride of the (·, C) buffers Kt and G: not a power of two, so that the
 * rows of a 16-column panel spread over all L1 sets instead of a few. */
#define GDR_LDG (GDR_CHUNK + 16)
#define GDR_NR 16    /* columns of one register tile = two 8-float vectors */
#define GDR_MR 6     /* rows of one register tile: 12 accumulators + 3 = 15 of 16 ymm */

typedef float gdr_v8 __attribute__((vector_size(32)));

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* e^x (a few ulp; Cephes expf polynomial), for x ≤ 0 in this file; eight lanes
 * in explicit vector code so that it vectorises without -ffast-math.
 * x < −87 gives 0 (the true value is below FLT_MIN); NaN stays NaN. */
typedef int32_t gdr_v8i __attribute__((vector_size(32)));

static inline gdr_v8 v8_select(gdr_v8i m, gdr_v8 a, gdr_v8 b) { /* m ? a : b, lane-wise */
    return (gdr_v8)(((gdr_v8i)a & m) | ((gdr_v8i)b & ~m));
}

static inline gdr_v8 exp8(gdr_v8 x) {
    const gdr_v8 zero = {0}, lo = zero - 87.0f, hi = zero + 88.0f;
    const gdr_v8i under = x < lo;
    gdr_v8 xc = v8_select(under, lo, x);
    xc = v8_select(xc > hi, hi, xc);
    /* n = round(x / ln2) by the 1.5·2^23 trick (exact for |n| < 2^22) */
    const gdr_v8 n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    gdr_v8 r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    gdr_v8 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    typedef uint32_t v8u32 __attribute__((vector_size(32)));
    const v8u32 e = (v8u32)(__builtin_convertvector(n, gdr_v8i) + 127) << 23; /* 2^n */
    return v8_select(under, zero, p * (gdr_v8)e);
}

/* ---- serial recurrence ---------------------------------------------------- */

/* One block of 32 columns of S (d_k rows of stride ld, any alignment) through one
 * token of §2.6. Two accumulator sets (even/odd rows) keep 8 FMA chains in flight. */
typedef float gdr_v8u __attribute__((vector_size(32), aligned(4)));

static inline void serial_block32(float *S, int64_t dk, int64_t ld, const float *qt,
                                  const float *kt, const float *vt, float *ot, float a, float b,
                                  float scale) {
    gdr_v8 acc0[4] = {{0}}, acc1[4] = {{0}}, u[4];
    int64_t d = 0;
    /* acc = Sᵀ k */
    for (; d + 1 < dk; d += 2) {
        const gdr_v8u *S0 = (const gdr_v8u *)(S + d * ld), *S1 = (const gdr_v8u *)(S + (d + 1) * ld);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            acc0[c] += kt[d] * S0[c];
            acc1[c] += kt[d + 1] * S1[c];
        }
    }
    if (d < dk) {
        const gdr_v8u *S0 = (const gdr_v8u *)(S + d * ld);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) acc0[c] += kt[d] * S0[c];
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        u[c] = b * (((const gdr_v8u *)vt)[c] - a * (acc0[c] + acc1[c]));
        acc0[c] = acc1[c] = (gdr_v8){0};
    }
    /* S = a·S + k uᵀ; acc = Sᵀ q (new S) */
    for (d = 0; d + 1 < dk; d += 2) {
        gdr_v8u *S0 = (gdr_v8u *)(S + d * ld), *S1 = (gdr_v8u *)(S + (d + 1) * ld);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const gdr_v8 s0 = a * S0[c] + kt[d] * u[c], s1 = a * S1[c] + kt[d + 1] * u[c];
            S0[c] = s0;
            S1[c] = s1;
            acc0[c] += qt[d] * s0;
            acc1[c] += qt[d + 1] * s1;
        }
    }
    if (d < dk) {
        gdr_v8u *S0 = (gdr_v8u *)(S + d * ld);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const gdr_v8 s0 = a * S0[c] + kt[d] * u[c];
            S0[c] = s0;
            acc0[c] += qt[d] * s0;
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) ((gdr_v8u *)ot)[c] = scale * (acc0[c] + acc1[c]);
}

/* The last nj < 32 columns of S (stride ld) through one token, scalar loops. */
static void serial_block_tail(float *S, int64_t dk, int64_t ld, int64_t nj, const float *qt,
                              const float *kt, const float *vt, float *ot, float a, float b,
                              float scale) {
    float u[32], acc[32];
    for (int64_t j = 0; j < nj; j++) acc[j] = 0.0f;
    for (int64_t d = 0; d < dk; d++)
        for (int64_t j = 0; j < nj; j++) acc[j] += kt[d] * S[d * ld + j];
    for (int64_t j = 0; j < nj; j++) {
        u[j] = b * (vt[j] - a * acc[j]);
        acc[j] = 0.0f;
    }
    for (int64_t d = 0; d < dk; d++)
        for (int64_t j = 0; j < nj; j++) {
            float s = a * S[d * ld + j] + kt[d] * u[j];
            S[d * ld + j] = s;
            acc[j] += qt[d] * s;
        }
    for (int64_t j = 0; j < nj; j++) ot[j] = scale * acc[j];
}

/* Token-serial §2.6 per value head: S̃ = e^{g_t} S; u = β_t (v_t − S̃ᵀ k_t);
 * S = S̃ + k_t uᵀ; o_t = Sᵀ (scale·q_t). Column j of S only ever meets column j
 * of u, so each block of 32 columns runs through all T tokens on its own, from a
 * contiguous copy (d_k × 32 floats, on the stack, in L1: the rows of S itself are
 * d_v apart and would fight over a few L1 sets). */
#define GDR_SERIAL_MAX_DK 256
void ls_gdr_serial_fwd(float *o, float *state, const float *q, const float *k, const float *v,
                       const float *beta, const float *g, int64_t T, ls_gdr_dims dm) {
    LS_ASSERT(dm.H_k > 0 && dm.H_v > 0 && dm.H_v % dm.H_k == 0 && dm.d_k > 0 && dm.d_v > 0,
              "H_k %d H_v %d d_k %d d_v %d", dm.H_k, dm.H_v, dm.d_k, dm.d_v);
    LS_ASSERT(T >= 0, "T %lld", (long long)T);
    const int64_t H_k = dm.H_k, H_v = dm.H_v, dk = dm.d_k, dv = dm.d_v;
    const int64_t rep = H_v / H_k;
    const float scale = dm.scale;
#pragma omp parallel for schedule(static) if (H_v > 1 && T * H_v * dk * dv >= 262144)
    for (int64_t h = 0; h < H_v; h++) {
        float *S = state + h * dk * dv; /* (d_k, d_v) */
        const int64_t hk = h / rep;
        float blk[GDR_SERIAL_MAX_DK * 32] __attribute__((aligned(64))); /* (d_k, 32) */
        for (int64_t j0 = 0; j0 < dv; j0 += 32) {
            const int64_t nj = dv - j0 < 32 ? dv - j0 : 32;
            const int copy = nj == 32 && dk <= GDR_SERIAL_MAX_DK;
            float *Sb = copy ? blk : S + j0;
            const int64_t ld = copy ? 32 : dv;
            if (copy)
                for (int64_t d = 0; d < dk; d++) memcpy(blk + d * 32, S + d * dv + j0, 32 * sizeof(float));
            for (int64_t t = 0; t < T; t++) {
                const float *qt = q + (t * H_k + hk) * dk;     /* (d_k) */
                const float *kt = k + (t * H_k + hk) * dk;     /* (d_k) */
                const float *vt = v + (t * H_v + h) * dv + j0; /* (nj) */
                float *ot = o + (t * H_v + h) * dv + j0;       /* (nj) */
                const float a = expf(g[t * H_v + h]), b = beta[t * H_v + h];
                if (nj == 32)
                    serial_block32(Sb, dk, ld, qt, kt, vt, ot, a, b, scale);
                else
                    serial_block_tail(Sb, dk, ld, nj, qt, kt, vt, ot, a, b, scale);
            }
            if (copy)
                for (int64_t d = 0; d < dk; d++) memcpy(S + d * dv + j0, blk + d * 32, 32 * sizeof(float));
        }
    }
}

/* ---- chunked form ---------------------------------------------------------- */

/* C's MR×16 tile (stride ldc, 32-byte aligned) = beta·C + the accumulators c0 | c1
 * (columns 0–7 | 8–15); beta == 0 never reads C. Shared by mm_tile and mm_tile_at. */
static inline __attribute__((always_inline)) void tile_store(int MR, const gdr_v8 *c0, const gdr_v8 *c1, float *C,
                                                            int64_t ldc, float beta) {
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++) {
        gdr_v8 *cr = (gdr_v8 *)(C + r * ldc);
        if (beta == 0.0f) {
            cr[0] = c0[r];
            cr[1] = c1[r];
        } else {
            cr[0] = beta * cr[0] + c0[r];
            cr[1] = beta * cr[1] + c1[r];
        }
    }
}

/* One MR×16 tile of C = beta·C + A·B over p < k. beta == 0 never reads C.
 * A (MR rows, stride lda), B (k rows of 16, stride ldb), C (stride ldc);
 * B and C 32-byte aligned. */
static inline __attribute__((always_inline)) void mm_tile(int MR, int64_t k, const float *A,
                                                         int64_t lda, const float *B,
                                                         int64_t ldb, float *C, int64_t ldc,
                                                         float beta) {
    gdr_v8 c0[GDR_MR], c1[GDR_MR];
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++) c0[r] = c1[r] = (gdr_v8){0};
    for (int64_t p = 0; p < k; p++) {
        const gdr_v8 b0 = *(const gdr_v8 *)(B + p * ldb);
        const gdr_v8 b1 = *(const gdr_v8 *)(B + p * ldb + 8);
#pragma GCC unroll 6
        for (int r = 0; r < MR; r++) {
            const float a = A[r * lda + p];
            c0[r] += a * b0;
            c1[r] += a * b1;
        }
    }
    tile_store(MR, c0, c1, C, ldc, beta);
}

/* C[m,n] = beta·C + A[m,k]·B[k,n] (row-major; n, ldb, ldc multiples of 16; B, C
 * 64-byte aligned). tri: A is lower triangular incl. diagonal (A[i,p] = 0 for
 * p > i), so the rows [i0, i0+MR) only need p < i0+MR. */
static void mm(int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B,
               int64_t ldb, float *C, int64_t ldc, float beta, int tri) {
    for (int64_t j0 = 0; j0 < n; j0 += GDR_NR) {
        int64_t i0 = 0;
        for (; i0 + GDR_MR <= m; i0 += GDR_MR) {
            int64_t kk = tri && i0 + GDR_MR < k ? i0 + GDR_MR : k;
            mm_tile(GDR_MR, kk, A + i0 * lda, lda, B + j0, ldb, C + i0 * ldc + j0, ldc, beta);
        }
        const int64_t kk = tri && m < k ? m : k;
        const float *Ai = A + i0 * lda;
        float *Ci = C + i0 * ldc + j0;
        switch (m - i0) {
        case 5: mm_tile(5, kk, Ai, lda, B + j0, ldb, Ci, ldc, beta); break;
        case 4: mm_tile(4, kk, Ai, lda, B + j0, ldb, Ci, ldc, beta); break;
        case 3: mm_tile(3, kk, Ai, lda, B + j0, ldb, Ci, ldc, beta); break;
        case 2: mm_tile(2, kk, Ai, lda, B + j0, ldb, Ci, ldc, beta); break;
        case 1: mm_tile(1, kk, Ai, lda, B + j0, ldb, Ci, ldc, beta); break;
        default: break;
        }
    }
}

/* Per-thread buffers of the chunked form (all from the scratch arena). The
 * q/k part (QK, Kt, GK) is shared by consecutive value heads of one key head. */
typedef struct {
    float *S;   /* (heads of this thread, dkp, dvp) stride ldv: running states, zero-padded */
    float *QK;  /* (2n, dkp) rows 0..n−1 = q, rows n..2n−1 = k of the chunk */
    float *Kt;  /* (dkp, C) stride GDR_LDG: kᵀ */
    float *GK;  /* (2n, C) stride GDR_LDG: [Q;K]·Kᵀ */
    float *Kw;  /* (dkp, C) stride GDR_LDG: (k ⊙ e^{γ_last−γ})ᵀ of one value head */
    float *G;   /* (2n, C) stride GDR_LDG: rows 0..n−1: P = scale·(M ⊙ QKᵀ ⊙ e^{γ_r−γ_i});
                 *          rows n..2n−1: −A (strictly lower) */
    float *X;   /* (2n, dvp) stride ldv: [Q;K]·S; rows 0..n−1 become the output O */
    float *V;   /* (C, dvp) stride ldv: v, then R, then V′ (in place) */
    float *gam; /* (C) γ = within-chunk cumsum of g */
    float *eg;  /* (C) e^{γ} */
    float *bet; /* (C) β */
    float *w;   /* (C) e^{γ_last − γ} */
} gdr_work;

/* Forward substitution (I + A) X = R in place on V (C rows, stride ldv; rows < n
 * used), with NA = −A strictly lower (stride GDR_LDG): rows in blocks of 8; the part left
 * of the diagonal block goes through mm, the 8×8 diagonal block is solved with
 * 8 columns × 8 rows held in registers. Rows ≥ n of the last block are computed
 * from stale (finite, in-bounds) values and never stored. */
static void gdr_solve(float *V, const float *NA, int64_t n, int64_t dvp, int64_t ldv) {
    const int64_t L = GDR_LDG;
    for (int64_t b0 = 0; b0 < n; b0 += 8) {
        const int64_t nb = n - b0 < 8 ? n - b0 : 8;
        if (b0 > 0) mm(nb, dvp, b0, NA + b0 * L, L, V, ldv, V + b0 * ldv, ldv, 1.0f, 0);
        const float *Nb = NA + b0 * L + b0; /* (8, 8) diagonal block, stride L */
        for (int64_t j0 = 0; j0 < dvp; j0 += 8) {
            gdr_v8 x[8];
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++) x[r] = *(const gdr_v8 *)(V + (b0 + r) * ldv + j0);
#pragma GCC unroll 8
            for (int r = 1; r < 8; r++)
#pragma GCC unroll 8
                for (int i = 0; i < r; i++) x[r] += Nb[r * L + i] * x[i];
            for (int64_t r = 1; r < nb; r++) *(gdr_v8 *)(V + (b0 + r) * ldv + j0) = x[r];
        }
    }
}

#if defined(__clang__) || __GNUC__ >= 12
#define GDR_SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define GDR_SHUF(a, b, ...) __builtin_shuffle(a, b, (gdr_v8i){__VA_ARGS__})
#endif
#define GDR_LO 0, 8, 1, 9, 4, 12, 5, 13 /* unpack low */
#define GDR_HI 2, 10, 3, 11, 6, 14, 7, 15
#define GDR_P0 0, 1, 8, 9, 4, 5, 12, 13 /* pairs */
#define GDR_P1 2, 3, 10, 11, 6, 7, 14, 15
#define GDR_H0 0, 1, 2, 3, 8, 9, 10, 11 /* 128-bit halves */
#define GDR_H1 4, 5, 6, 7, 12, 13, 14, 15
/* dst (cols, rows) stride ldd = transpose of src (rows, cols) stride lds, in 8×8 blocks
 * (unpack / shuffle / lane swap); rows and cols multiples of 8, rows of both 32-byte aligned. */
static void gdr_transpose_ld(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows,
                             int64_t cols) {
    for (int64_t r0 = 0; r0 < rows; r0 += 8)
        for (int64_t d0 = 0; d0 < cols; d0 += 8) {
            gdr_v8 x[8], t[8], s[8];
            for (int r = 0; r < 8; r++) x[r] = *(const gdr_v8 *)(src + (r0 + r) * lds + d0);
            for (int r = 0; r < 8; r += 2) {
                t[r] = GDR_SHUF(x[r], x[r + 1], GDR_LO);
                t[r + 1] = GDR_SHUF(x[r], x[r + 1], GDR_HI);
            }
            for (int r = 0; r < 8; r += 4) {
                s[r] = GDR_SHUF(t[r], t[r + 2], GDR_P0);
                s[r + 1] = GDR_SHUF(t[r], t[r + 2], GDR_P1);
                s[r + 2] = GDR_SHUF(t[r + 1], t[r + 3], GDR_P0);
                s[r + 3] = GDR_SHUF(t[r + 1], t[r + 3], GDR_P1);
            }
            float *o = dst + d0 * ldd + r0;
            for (int c = 0; c < 4; c++) {
                *(gdr_v8 *)(o + c * ldd) = GDR_SHUF(s[c], s[c + 4], GDR_H0);
                *(gdr_v8 *)(o + (c + 4) * ldd) = GDR_SHUF(s[c], s[c + 4], GDR_H1);
            }
        }
}

/* The q/k half of one chunk of n ≤ C tokens from t0, key head hk: gather q, k
 * into QK (zero-padded to dkp), Kt = kᵀ, GK = [Q;K]·Kᵀ (§3 step 2 before gating). */
static void gdr_chunk_keys(gdr_work *wk, const float *q, const float *k, int64_t t0, int64_t n,
                           int64_t hk, ls_gdr_dims dm, int64_t dkp) {
    const int64_t H_k = dm.H_k, dk = dm.d_k, L = GDR_LDG;
    float *QK = wk->QK;
    for (int64_t r = 0; r < n; r++) {
        const int64_t t = t0 + r;
        float *Qd = QK + r * dkp, *Kd = QK + (n + r) * dkp;
        memcpy(Qd, q + (t * H_k + hk) * dk, (size_t)dk * sizeof(float));
        memcpy(Kd, k + (t * H_k + hk) * dk, (size_t)dk * sizeof(float));
        for (int64_t d = dk; d < dkp; d++) Qd[d] = Kd[d] = 0.0f;
    }
    gdr_transpose_ld(wk->Kt, GDR_LDG, QK + n * dkp, dkp, round_up(n, 8), dkp); /* Kt (dkp, GDR_LDG) */
    mm(2 * n, round_up(n, GDR_NR), dkp, QK, dkp, wk->Kt, L, wk->GK, L, 0.0f, 0);
}

/* The rest of the chunk for value head h with state S (dkp, dvp; stride ldv), after
 * gdr_chunk_keys for its key head (§3 steps 1–6). V′ = (I+A)⁻¹(diag(β)V −
 * diag(βe^γ) K S) equals U − W·S of §3 step 5 (W·S = (I+A)⁻¹ diag(βe^γ) K S), so W
 * is never formed: one product [Q;K]·S serves the inter-chunk output and the deltas. */
static void gdr_chunk_head(gdr_work *wk, float *S, float *o, const float *v, const float *beta,
                           const float *g, int64_t t0, int64_t n, int64_t h, ls_gdr_dims dm,
                           int64_t dkp, int64_t dvp, int64_t ldv) {
    const int64_t H_v = dm.H_v, dv = dm.d_v, L = GDR_LDG;
    const float scale = dm.scale;
    float *QK = wk->QK, *Kt = wk->Kt, *GK = wk->GK, *Kw = wk->Kw, *G = wk->G, *X = wk->X;
    float *V = wk->V, *gam = wk->gam, *eg = wk->eg, *bet = wk->bet, *w = wk->w;

    /* gather v (zero-padded); γ = cumsum g; β */
    float cum = 0.0f;
    for (int64_t r = 0; r < n; r++) {
        const int64_t t = t0 + r;
        float *Vd = V + r * ldv;
        memcpy(Vd, v + (t * H_v + h) * dv, (size_t)dv * sizeof(float));
        for (int64_t j = dv; j < dvp; j++) Vd[j] = 0.0f;
        cum += g[t * H_v + h];
        gam[r] = cum;
        bet[r] = beta[t * H_v + h];
    }
    /* e^{γ}, e^{γ_last−γ}; gam, eg, w hold C floats, so whole vectors of 8 fit */
    for (int64_t r0 = 0; r0 < n; r0 += 8) {
        const gdr_v8 gv = *(const gdr_v8 *)(gam + r0);
        *(gdr_v8 *)(eg + r0) = exp8(gv);
        *(gdr_v8 *)(w + r0) = exp8(gam[n - 1] - gv);
    }

    /* X = [Q;K]·S (2n, dvp) from the chunk-start S */
    mm(2 * n, dvp, dkp, QK, dkp, S, ldv, X, ldv, 0.0f, 0);

    /* P = scale·(QKᵀ ⊙ e^{γ_r−γ_i}) for i ≤ r; −A = −β_r (KKᵀ ⊙ e^{γ_r−γ_i}) for i < r.
     * Exponents are ≤ 0 on and below the diagonal; above it the entries are zeroed. */
    for (int64_t r = 0; r < n; r++) {
        const float *GPr = GK + r * L, *GAr = GK + (n + r) * L;
        float *Pr = G + r * L, *Ar = G + (n + r) * L; /* (C) each; whole vectors of 8 fit */
        const float gr = gam[r], sb = -bet[r];
        const gdr_v8 zero = {0};
        for (int64_t i0 = 0; i0 < n; i0 += 8) {
            const gdr_v8i idx = (gdr_v8i){0, 1, 2, 3, 4, 5, 6, 7} + (int32_t)i0;
            const gdr_v8i on = idx <= (int32_t)r, below = idx < (int32_t)r;
            const gdr_v8 e = exp8(v8_select(on, gr - *(const gdr_v8 *)(gam + i0), zero - 100.0f));
            *(gdr_v8 *)(Pr + i0) = v8_select(on, scale * *(const gdr_v8 *)(GPr + i0) * e, zero);
            *(gdr_v8 *)(Ar + i0) = v8_select(below, sb * *(const gdr_v8 *)(GAr + i0) * e, zero);
        }
    }

    /* R = diag(β)(V − diag(e^γ) K S) */
    for (int64_t r = 0; r < n; r++) {
        float *Vr = V + r * ldv;
        const float *KSr = X + (n + r) * ldv;
        const float b = bet[r], e = eg[r];
#pragma omp simd
        for (int64_t j = 0; j < dvp; j++) Vr[j] = b * (Vr[j] - e * KSr[j]);
    }
    /* V′ = (I+A)⁻¹ R: the true per-token deltas u_r of §2.6 */
    gdr_solve(V, G + n * L, n, dvp, ldv);

    /* O = scale·diag(e^γ) Q S + P V′ */
    for (int64_t r = 0; r < n; r++) {
        float *Or = X + r * ldv;
        const float s = scale * eg[r];
#pragma omp simd
        for (int64_t j = 0; j < dvp; j++) Or[j] *= s;
    }
    mm(n, dvp, n, G, L, V, ldv, X, ldv, 1.0f, 1);
    for (int64_t r = 0; r < n; r++)
        memcpy(o + ((t0 + r) * H_v + h) * dv, X + r * ldv, (size_t)dv * sizeof(float));

    /* S ← e^{γ_last} S + (K ⊙ e^{γ_last−γ})ᵀ V′ (rows d ≥ d_k of Kt are zero) */
    for (int64_t d = 0; d < dkp; d++) {
        const float *Kr = Kt + d * L;
        float *Kwr = Kw + d * L;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) Kwr[i] = Kr[i] * w[i];
    }
    mm(dkp, dvp, n, Kw, L, V, ldv, S, ldv, eg[n - 1], 0);
}

/* Value heads [h0, h1) over all chunks, from the scratch slot at p (sized in
 * ls_gdr_chunk_fwd): the chunks in order, all heads of the range per chunk, so that the rows
 * of one token for neighbouring heads share pages (fewer TLB misses than one head
 * over all T) and value heads of one key head reuse the q/k gather and [Q;K]·Kᵀ. */
static void gdr_chunk_range(float *p, int64_t h0, int64_t h1, float *o, float *tape_h,
                            float *state, const float *q, const float *k, const float *v,
                            const float *beta, const float *g, int64_t T, ls_gdr_dims dm) {
    const int64_t H_v = dm.H_v, dk = dm.d_k, dv = dm.d_v, C = GDR_CHUNK, L = GDR_LDG;
    const int64_t rep = H_v / dm.H_k;
    const int64_t dkp = round_up(dk, GDR_NR), dvp = round_up(dv, GDR_NR), ldv = dvp + GDR_NR;
    const int64_t fl_S = dkp * ldv; /* one state */
    gdr_work wk;
    wk.S = p, p += (h1 - h0) * fl_S;
    wk.QK = p, p += 2 * C * dkp;
    wk.Kt = p, p += dkp * L;
    wk.Kw = p, p += dkp * L;
    wk.GK = p, p += 2 * C * L;
    wk.G = p, p += 2 * C * L;
    wk.X = p, p += 2 * C * ldv;
    wk.V = p, p += C * ldv;
    wk.gam = p, wk.eg = p + C, wk.bet = p + 2 * C, wk.w = p + 3 * C;

    for (int64_t h = h0; h < h1; h++) { /* states in (the padding is zero already) */
        float *Sw = wk.S + (h - h0) * fl_S;
        for (int64_t d = 0; d < dk; d++)
            memcpy(Sw + d * ldv, state + (h * dk + d) * dv, (size_t)dv * sizeof(float));
    }
    for (int64_t t0 = 0, c = 0; t0 < T; t0 += C, c++) {
        const int64_t n = T - t0 < C ? T - t0 : C;
        for (int64_t h = h0; h < h1; h++) {
            float *Sw = wk.S + (h - h0) * fl_S; /* (dkp, dvp) stride ldv */
            if (tape_h) {
                float *th = tape_h + (c * H_v + h) * dk * dv; /* (d_k, d_v) */
                for (int64_t d = 0; d < dk; d++)
                    memcpy(th + d * dv, Sw + d * ldv, (size_t)dv * sizeof(float));
            }
            if (h == h0 || h / rep != (h - 1) / rep)
                gdr_chunk_keys(&wk, q, k, t0, n, h / rep, dm, dkp);
            gdr_chunk_head(&wk, Sw, o, v, beta, g, t0, n, h, dm, dkp, dvp, ldv);
        }
    }
    for (int64_t h = h0; h < h1; h++) { /* states out */
        const float *Sw = wk.S + (h - h0) * fl_S;
        for (int64_t d = 0; d < dk; d++)
            memcpy(state + (h * dk + d) * dv, Sw + d * ldv, (size_t)dv * sizeof(float));
    }
}

/* Scratch: n_slots = min(threads, H_v) slots from `scratch`, each holding the states
 * of ⌈H_v/n_slots⌉ heads plus one chunk's buffers (≈ 1.5 MiB per slot at H_v = 32,
 * 2 threads, d_k = d_v = 128); slot i takes value heads [H_v·i/n, H_v·(i+1)/n). */
ls_status ls_gdr_chunk_fwd(float *o, float *tape_h, float *state, const float *q, const float *k,
                           const float *v, const float *beta, const float *g, int64_t T,
                           ls_gdr_dims dm, ls_arena *scratch) {
    LS_ASSERT(dm.H_k > 0 && dm.H_v > 0 && dm.H_v % dm.H_k == 0 && dm.d_k > 0 && dm.d_v > 0,
              "H_k %d H_v %d d_k %d d_v %d", dm.H_k, dm.H_v, dm.d_k, dm.d_v);
    LS_ASSERT(T >= 0, "T %lld", (long long)T);
    if (T == 0) return LS_OK;
    const int64_t H_v = dm.H_v, C = GDR_CHUNK, L = GDR_LDG;
    const int64_t dkp = round_up(dm.d_k, GDR_NR), dvp = round_up(dm.d_v, GDR_NR);
    const int64_t ldv = dvp + GDR_NR;

    int n_slots = 1;
#ifdef _OPENMP
    n_slots = omp_get_max_threads();
#endif
    if (n_slots > H_v) n_slots = (int)H_v;
    const int64_t max_heads = (H_v + n_slots - 1) / n_slots;

    /* floats per slot (see gdr_chunk_range); every piece is a multiple of 16 floats,
     * so all stay 64-byte aligned */
    const int64_t slot = max_heads * dkp * ldv + 2 * C * dkp + 2 * dkp * L + 4 * C * L +
                         3 * C * ldv + 4 * C;
    size_t bytes;
    if (ls_mul_size((size_t)slot, (size_t)n_slots, &bytes) ||
        ls_mul_size(bytes, sizeof(float), &bytes))
        return ls_err(LS_ERR_NOMEM, "gdr chunk scratch: size overflow (%d slots, d_k %d, d_v %d)",
                      n_slots, dm.d_k, dm.d_v);
    ls_arena_mark mark = ls_arena_get_mark(scratch);
    float *buf = ls_arena_alloc(scratch, bytes);
    if (!buf)
        return ls_err_ctx(LS_ERR_NOMEM, "gdr chunk scratch (%zu bytes from arena '%s')", bytes,
                          scratch->name ? scratch->name : "?");
    /* padding rows/columns must hold finite values (zero): clear everything once */
    memset(buf, 0, bytes);

    /* One slot per thread; should the runtime give fewer threads, each takes several. */
#pragma omp parallel num_threads(n_slots)
    {
        int tid = 0, nth = 1;
#ifdef _OPENMP
        tid = omp_get_thread_num();
        nth = omp_get_num_threads();
#endif
        for (int i = tid; i < n_slots; i += nth)
            gdr_chunk_range(buf + (int64_t)i * slot, H_v * i / n_slots, H_v * (i + 1) / n_slots, o,
                            tape_h, state, q, k, v, beta, g, T, dm);
    }
    ls_arena_release(scratch, mark);
    return LS_OK;
}

/* ---- chunked backward (specs/hybrid-qwen3next.md §3, "Chunk backward") ------
 *
 * Per value head, chunk by chunk from the last, carrying dS = ∂L/∂(state at the
 * chunk end) backward from dS_T = dstate_T. Nothing but the chunk-start states is
 * taped: each chunk's V′, P, A are recomputed from tape_h (§3 backward step 1).
 * Chunk of n rows, start state S, γ = within-chunk cumsum g, e_r = e^{γ_r},
 * w_r = e^{γ_last−γ_r}, D_{ri} = e^{γ_r−γ_i}, M = lower triangle incl. diagonal:
 *   forward   R = diag(β)(V − diag(e) K S),  V′ = (I+A)⁻¹ R,  O = s·diag(e) Q S + P V′,
 *             S_next = e_last S + Kᵀ diag(w) V′,  P = s·(M ⊙ QKᵀ ⊙ D),
 *             A = diag(β)(strictly lower KKᵀ ⊙ D);
 *   backward  dV′ = diag(w) K dS + Pᵀ dO (steps 2–3),  dR = (I+A)⁻ᵀ dV′ (the solve's
 *             backward: FLA forms T = (I+A)⁻¹ and dT in step 5; here T is never formed),
 *             dP̂ = s·M ⊙ D ⊙ (dO V′ᵀ)          (= ∂L/∂(q_r·k_i)),
 *             B̂ = −diag(β)(strict ⊙ D ⊙ dR V′ᵀ) (= ∂L/∂(k_r·k_i); dA = −dR V′ᵀ, step 5),
 *             dQ = s·diag(e) dO Sᵀ + dP̂ K,
 *             dK = dP̂ᵀ Q + (B̂ + B̂ᵀ) K − diag(βe) dR Sᵀ + diag(w) V′ dSᵀ,
 *             dV = diag(β) dR,  dβ_r = dR_r·(v_r − e_r (KS)_r) + Σ_i ∂L/∂A_{ri}·A_{ri}/β_r,
 *             dγ_r = e_r ∂L/∂e_r − w_r ∂L/∂w_r + Σ_i (c_{ri} − c_{ir}) with
 *                    c = ∂L/∂P ⊙ P + ∂L/∂A ⊙ A (the D factors), plus, on the last row,
 *                    e_last⟨S, dS⟩ + Σ_r w_r ∂L/∂w_r;  dg = reverse cumsum of dγ (step 6),
 *             dS ← e_last dS + Qᵀ diag(s e) dO − Kᵀ diag(βe) dR (step 3; = dh0 at the end).
 * The products run through mm and mm_at (Aᵀ·B, for the transposed left factors);
 * three small transposes per head and chunk (V′ᵀ, Sᵀ, dSᵀ) feed the rest.
 */

/* One MR×16 tile of C = beta·C + Aᵀ·B over p ∈ [p0, k), A stored (k, ·) with the
 * tile's MR columns at A[p·lda + r]. beta == 0 never reads C. */
static inline __attribute__((always_inline)) void mm_tile_at(int MR, int64_t p0, int64_t k,
                                                            const float *A, int64_t lda,
                                                            const float *B, int64_t ldb, float *C,
                                                            int64_t ldc, float beta) {
    gdr_v8 c0[GDR_MR], c1[GDR_MR];
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++) c0[r] = c1[r] = (gdr_v8){0};
    for (int64_t p = p0; p < k; p++) {
        const gdr_v8 b0 = *(const gdr_v8 *)(B + p * ldb);
        const gdr_v8 b1 = *(const gdr_v8 *)(B + p * ldb + 8);
        const float *Ap = A + p * lda;
#pragma GCC unroll 6
        for (int r = 0; r < MR; r++) {
            c0[r] += Ap[r] * b0;
            c1[r] += Ap[r] * b1;
        }
    }
    tile_store(MR, c0, c1, C, ldc, beta);
}

/* C[m,n] = beta·C + Aᵀ·B with A stored (k, m) row-major (stride lda); n, ldb, ldc
 * multiples of 16, B and C 64-byte aligned. upper: Aᵀ is upper triangular (A lower,
 * A[p,i] = 0 for p < i), so rows [i0, i0+MR) only need p ≥ i0. */
static void mm_at(int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B,
                  int64_t ldb, float *C, int64_t ldc, float beta, int upper) {
    for (int64_t j0 = 0; j0 < n; j0 += GDR_NR) {
        int64_t i0 = 0;
        for (; i0 + GDR_MR <= m; i0 += GDR_MR)
            mm_tile_at(GDR_MR, upper ? i0 : 0, k, A + i0, lda, B + j0, ldb, C + i0 * ldc + j0,
                       ldc, beta);
        const int64_t p0 = upper ? i0 : 0;
        const float *Ai = A + i0;
        float *Ci = C + i0 * ldc + j0;
        switch (m - i0) {
        case 5: mm_tile_at(5, p0, k, Ai, lda, B + j0, ldb, Ci, ldc, beta); break;
        case 4: mm_tile_at(4, p0, k, Ai, lda, B + j0, ldb, Ci, ldc, beta); break;
        case 3: mm_tile_at(3, p0, k, Ai, lda, B + j0, ldb, Ci, ldc, beta); break;
        case 2: mm_tile_at(2, p0, k, Ai, lda, B + j0, ldb, Ci, ldc, beta); break;
        case 1: mm_tile_at(1, p0, k, Ai, lda, B + j0, ldb, Ci, ldc, beta); break;
        default: break;
        }
    }
}

/* C = A·B like mm (beta 0), but only the 6×16 tiles that reach the diagonal or below
 * it (column j0 ≤ last row of the tile); tiles strictly above are left as they were. */
static void mm_lo(int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B,
                  int64_t ldb, float *C, int64_t ldc) {
    for (int64_t j0 = 0; j0 < n; j0 += GDR_NR) {
        int64_t i0 = 0;
        for (; i0 + GDR_MR <= m; i0 += GDR_MR)
            if (j0 <= i0 + GDR_MR - 1)
                mm_tile(GDR_MR, k, A + i0 * lda, lda, B + j0, ldb, C + i0 * ldc + j0, ldc, 0.0f);
        if (i0 >= m || j0 > m - 1) continue;
        const float *Ai = A + i0 * lda;
        float *Ci = C + i0 * ldc + j0;
        switch (m - i0) {
        case 5: mm_tile(5, k, Ai, lda, B + j0, ldb, Ci, ldc, 0.0f); break;
        case 4: mm_tile(4, k, Ai, lda, B + j0, ldb, Ci, ldc, 0.0f); break;
        case 3: mm_tile(3, k, Ai, lda, B + j0, ldb, Ci, ldc, 0.0f); break;
        case 2: mm_tile(2, k, Ai, lda, B + j0, ldb, Ci, ldc, 0.0f); break;
        case 1: mm_tile(1, k, Ai, lda, B + j0, ldb, Ci, ldc, 0.0f); break;
        default: break;
        }
    }
}


/* Back substitution (I + A)ᵀ X = B in place on X (rows < n, stride ldx, dvp columns),
 * with NA = −A strictly lower (stride GDR_LDG): X_r = B_r + Σ_{i>r} NA_{ir} X_i, in
 * blocks of 8 rows from the bottom; the part right of the diagonal block goes through
 * mm_at, the diagonal block is solved in registers (rows ≥ n are zero, never read). */
static void gdr_solve_t(float *X, const float *NA, int64_t n, int64_t dvp, int64_t ldx) {
    const int64_t L = GDR_LDG;
    for (int64_t b0 = (n - 1) / 8 * 8; b0 >= 0; b0 -= 8) {
        const int nb = n - b0 < 8 ? (int)(n - b0) : 8;
        const int64_t e0 = b0 + nb;
        if (e0 < n)
            mm_at(nb, dvp, n - e0, NA + e0 * L + b0, L, X + e0 * ldx, ldx, X + b0 * ldx, ldx,
                  1.0f, 0);
        const float *Nb = NA + b0 * L + b0; /* (nb, nb) diagonal block, stride L */
        for (int64_t j0 = 0; j0 < dvp; j0 += 8) {
            gdr_v8 x[8];
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++)
                x[r] = r < nb ? *(const gdr_v8 *)(X + (b0 + r) * ldx + j0) : (gdr_v8){0};
#pragma GCC unroll 8
            for (int r = 6; r >= 0; r--)
#pragma GCC unroll 8
                for (int i = r + 1; i < 8; i++)
                    if (i < nb) x[r] += Nb[i * L + r] * x[i];
            for (int r = 0; r < nb; r++) *(gdr_v8 *)(X + (b0 + r) * ldx + j0) = x[r];
        }
    }
}

/* Per-slot buffers of the backward (from the scratch arena; ldk = dkp + 16, ldv as in
 * the forward, L = GDR_LDG). */
typedef struct {
    float *dS;   /* (heads of this slot, dkp, ldv): running ∂L/∂S, zero-padded */
    float *S;    /* (dkp, ldv) chunk-start state from the tape, zero-padded */
    float *QK;   /* (2C, ldk) rows 0..n−1 = q, rows n..2n−1 = k of the chunk */
    float *Kt;   /* (dkp, L) kᵀ */
    float *GK;   /* (2C, L) [Q;K]·Kᵀ */
    float *G;    /* (2C, L) [P; −A] as in the forward */
    float *E;    /* (2C, L) [dO;dR]·V′ᵀ, then [dP̂; B̂] in place */
    float *X;    /* (C, ldv) K·S */
    float *V;    /* (C, ldv) v, then R, then V′ */
    float *DX;   /* (2C, ldv) [dO; dV′ → dR], finally scaled for the dS update */
    float *St;   /* (dvp, ldk) Sᵀ */
    float *dSt;  /* (dvp, ldk) dSᵀ */
    float *Vt;   /* (dvp, L) V′ᵀ */
    float *Y;    /* (2C, ldk) [dO;dR]·Sᵀ */
    float *Zs;   /* (C, ldk) V′·dSᵀ */
    float *Z1;   /* (2C, ldk) [dP̂·K; B̂·K] */
    float *Z2;   /* (C, ldk) dP̂ᵀQ + B̂ᵀK */
    float *gam, *eg, *bet, *w; /* (C) γ, e^γ, β, e^{γ_last−γ} */
    float *dgam, *csum, *dbA;  /* (C) ∂L/∂γ, column sums of c, ∂L/∂β through A */
} gdr_bwork;

/* Carve the slot at base (NULL: only count); returns its size in floats. Every piece
 * is a multiple of 16 floats, so all stay 64-byte aligned. */
static int64_t gdr_bwork_layout(gdr_bwork *wk, float *base, int64_t heads, int64_t dkp,
                                int64_t dvp, int64_t ldv, int64_t ldk) {
    const int64_t C = GDR_CHUNK, L = GDR_LDG;
    int64_t off = 0;
#define GDR_TAKE(field, nfl)                    \
    do {                                        \
        if (base) wk->field = base + off;       \
        off += (nfl);                           \
    } while (0)
    GDR_TAKE(dS, heads * dkp * ldv);
    GDR_TAKE(S, dkp * ldv);
    GDR_TAKE(QK, 2 * C * ldk);
    GDR_TAKE(Kt, dkp * L);
    GDR_TAKE(GK, 2 * C * L);
    GDR_TAKE(G, 2 * C * L);
    GDR_TAKE(E, 2 * C * L);
    GDR_TAKE(X, C * ldv);
    GDR_TAKE(V, C * ldv);
    GDR_TAKE(DX, 2 * C * ldv);
    GDR_TAKE(St, dvp * ldk);
    GDR_TAKE(dSt, dvp * ldk);
    GDR_TAKE(Vt, dvp * L);
    GDR_TAKE(Y, 2 * C * ldk);
    GDR_TAKE(Zs, C * ldk);
    GDR_TAKE(Z1, 2 * C * ldk);
    GDR_TAKE(Z2, C * ldk);
    GDR_TAKE(gam, C);
    GDR_TAKE(eg, C);
    GDR_TAKE(bet, C);
    GDR_TAKE(w, C);
    GDR_TAKE(dgam, C);
    GDR_TAKE(csum, C);
    GDR_TAKE(dbA, C);
#undef GDR_TAKE
    return off;
}

/* What every slot of one ls_gdr_chunk_bwd call shares. */
typedef struct {
    float *dq, *dk, *dv, *dbeta, *dg;
    float *stage_q, *stage_k;  /* (n_stage, sct, d_k): per-value-head dq, dk of shared key heads */
    const int32_t *stage_idx;  /* (H_v): staging block of value head h, −1 = written directly;
                                * NULL = no key head is shared between slots */
    int64_t sct;               /* tokens per super-chunk (staging rows) */
    const float *dout, *tape_h, *q, *k, *v, *beta, *g;
    int64_t T;
    ls_gdr_dims dm;
    int64_t dkp, dvp, ldv, ldk;
} gdr_bwd_ctx;

/* The q/k half of one chunk for key head hk (as gdr_chunk_keys, rows of QK stride ldk,
 * which keeps the columns read by mm_at off a power-of-two stride). */
static void gdr_bwd_keys(gdr_bwork *wk, const gdr_bwd_ctx *x, int64_t t0, int64_t n, int64_t hk) {
    const int64_t H_k = x->dm.H_k, nk = x->dm.d_k, dkp = x->dkp, ldk = x->ldk, L = GDR_LDG;
    float *QK = wk->QK;
    for (int64_t r = 0; r < n; r++) {
        const int64_t t = t0 + r;
        float *Qd = QK + r * ldk, *Kd = QK + (n + r) * ldk;
        memcpy(Qd, x->q + (t * H_k + hk) * nk, (size_t)nk * sizeof(float));
        memcpy(Kd, x->k + (t * H_k + hk) * nk, (size_t)nk * sizeof(float));
        for (int64_t d = nk; d < dkp; d++) Qd[d] = Kd[d] = 0.0f;
    }
    gdr_transpose_ld(wk->Kt, L, QK + n * ldk, ldk, round_up(n, 8), dkp);
    mm(2 * n, round_up(n, GDR_NR), dkp, QK, ldk, wk->Kt, L, wk->GK, L, 0.0f, 0);
}

/* One chunk [t0, t0+n) of value head h, after gdr_bwd_keys for its key head: dS (dkp,
 * ldv) in = ∂L/∂S at the chunk end, out = at the chunk start. dv, dβ, dg rows of the
 * chunk are written (=); the chunk's dq, dk rows go to oq, ok (row stride ldo), = or,
 * when acc, += (a later value head of the same key head). */
static void gdr_bwd_head(gdr_bwork *wk, float *dS, float *oq, float *ok, int64_t ldo, int acc,
                         const gdr_bwd_ctx *x, int64_t c, int64_t t0, int64_t n, int64_t h) {
    const int64_t H_v = x->dm.H_v, nk = x->dm.d_k, nv = x->dm.d_v, L = GDR_LDG;
    const int64_t dkp = x->dkp, dvp = x->dvp, ldv = x->ldv, ldk = x->ldk;
    const float scale = x->dm.scale;
    float *S = wk->S, *QK = wk->QK, *GK = wk->GK, *G = wk->G, *E = wk->E, *X = wk->X;
    float *V = wk->V, *DX = wk->DX, *St = wk->St, *dSt = wk->dSt, *Vt = wk->Vt;
    float *Y = wk->Y, *Zs = wk->Zs, *Z1 = wk->Z1, *Z2 = wk->Z2;
    float *gam = wk->gam, *eg = wk->eg, *bet = wk->bet, *w = wk->w;
    float *dgam = wk->dgam, *csum = wk->csum, *dbA = wk->dbA;
    const float *K = QK + n * ldk; /* (n, dkp) stride ldk */
    float *dO = DX, *dR = DX + n * ldv;  /* (n, dvp) stride ldv each */
    const gdr_v8 zero = {0};

    /* 1. S from the tape; v, dO (zero-padded); γ = cumsum g; β; e^γ; e^{γ_last−γ} */
    const float *Sh = x->tape_h + (c * H_v + h) * nk * nv; /* (d_k, d_v) */
    for (int64_t d = 0; d < nk; d++) memcpy(S + d * ldv, Sh + d * nv, (size_t)nv * sizeof(float));
    float cum = 0.0f;
    for (int64_t r = 0; r < n; r++) {
        const int64_t t = t0 + r;
        float *Vr = V + r * ldv, *dOr = dO + r * ldv;
        memcpy(Vr, x->v + (t * H_v + h) * nv, (size_t)nv * sizeof(float));
        memcpy(dOr, x->dout + (t * H_v + h) * nv, (size_t)nv * sizeof(float));
        for (int64_t j = nv; j < dvp; j++) Vr[j] = dOr[j] = 0.0f;
        cum += x->g[t * H_v + h];
        gam[r] = cum;
        bet[r] = x->beta[t * H_v + h];
    }
    for (int64_t r0 = 0; r0 < n; r0 += 8) {
        const gdr_v8 gv = *(const gdr_v8 *)(gam + r0);
        *(gdr_v8 *)(eg + r0) = exp8(gv);
        *(gdr_v8 *)(w + r0) = exp8(gam[n - 1] - gv);
    }

    /* 2. recompute (§3 backward step 1, as gdr_chunk_head): X = K S; P, −A; V′ */
    mm(n, dvp, dkp, K, ldk, S, ldv, X, ldv, 0.0f, 0);
    for (int64_t r = 0; r < n; r++) {
        const float *GPr = GK + r * L, *GAr = GK + (n + r) * L;
        float *Pr = G + r * L, *Ar = G + (n + r) * L;
        const float gr = gam[r], sb = -bet[r];
        for (int64_t i0 = 0; i0 < n; i0 += 8) {
            const gdr_v8i idx = (gdr_v8i){0, 1, 2, 3, 4, 5, 6, 7} + (int32_t)i0;
            const gdr_v8i on = idx <= (int32_t)r, below = idx < (int32_t)r;
            const gdr_v8 e = exp8(v8_select(on, gr - *(const gdr_v8 *)(gam + i0), zero - 100.0f));
            *(gdr_v8 *)(Pr + i0) = v8_select(on, scale * *(const gdr_v8 *)(GPr + i0) * e, zero);
            *(gdr_v8 *)(Ar + i0) = v8_select(below, sb * *(const gdr_v8 *)(GAr + i0) * e, zero);
        }
    }
    for (int64_t r = 0; r < n; r++) {
        float *Vr = V + r * ldv;
        const float *KSr = X + r * ldv;
        const float b = bet[r], e = eg[r];
#pragma omp simd
        for (int64_t j = 0; j < dvp; j++) Vr[j] = b * (Vr[j] - e * KSr[j]);
    }
    gdr_solve(V, G + n * L, n, dvp, ldv);

    /* 3. dV′ = diag(w) K dS + Pᵀ dO; dR = (I+A)⁻ᵀ dV′ (§3 backward steps 2, 3, 5) */
    mm(n, dvp, dkp, K, ldk, dS, ldv, dR, ldv, 0.0f, 0);
    for (int64_t r = 0; r < n; r++) {
        float *dRr = dR + r * ldv;
        const float wr = w[r];
#pragma omp simd
        for (int64_t j = 0; j < dvp; j++) dRr[j] *= wr;
    }
    mm_at(n, dvp, n, G, L, dO, ldv, dR, ldv, 1.0f, 1);
    gdr_solve_t(dR, G + n * L, n, dvp, ldv);

    /* 4. V′ᵀ, Sᵀ, dSᵀ; E = [dO; dR]·V′ᵀ on and below the diagonal */
    const int64_t n16 = round_up(n, GDR_NR);
    gdr_transpose_ld(Vt, L, V, ldv, round_up(n, 8), dvp);
    gdr_transpose_ld(St, ldk, S, ldv, dkp, dvp);
    gdr_transpose_ld(dSt, ldk, dS, ldv, dkp, dvp);
    mm_lo(n, n16, dvp, dO, ldv, Vt, L, E, L);
    mm_lo(n, n16, dvp, dR, ldv, Vt, L, E + n * L, L);

    /* 5. E → dP̂ (rows 0..n−1) and B̂ (rows n..2n−1), zero outside their triangles;
     * dγ from the D factors of P and A (c_{ri} to γ_r, −c_{ri} to γ_i; the diagonal
     * of P has no decay); dβ through A */
    for (int64_t i0 = 0; i0 < n; i0 += 8) *(gdr_v8 *)(csum + i0) = zero;
    for (int64_t r = 0; r < n; r++) {
        float *Er = E + r * L, *Eb = E + (n + r) * L;
        const float *GPr = GK + r * L, *GAr = GK + (n + r) * L;
        const float gr = gam[r], br = bet[r];
        gdr_v8 rs = zero, db = zero;
        for (int64_t i0 = 0; i0 < n; i0 += 8) {
            const gdr_v8i idx = (gdr_v8i){0, 1, 2, 3, 4, 5, 6, 7} + (int32_t)i0;
            const gdr_v8i on = idx <= (int32_t)r, below = idx < (int32_t)r;
            const gdr_v8 e = exp8(v8_select(on, gr - *(const gdr_v8 *)(gam + i0), zero - 100.0f));
            const gdr_v8 gp = *(const gdr_v8 *)(GPr + i0), ga = *(const gdr_v8 *)(GAr + i0);
            const gdr_v8 dp = v8_select(on, scale * *(const gdr_v8 *)(Er + i0) * e, zero);
            const gdr_v8 ta = v8_select(below, zero - *(const gdr_v8 *)(Eb + i0) * e, zero);
            const gdr_v8 bh = br * ta;
            const gdr_v8 cc = v8_select(below, dp * gp + bh * ga, zero);
            rs += cc;
            db += ta * ga;
            *(gdr_v8 *)(csum + i0) += cc;
            *(gdr_v8 *)(Er + i0) = dp;
            *(gdr_v8 *)(Eb + i0) = bh;
        }
        float s1 = 0.0f, s2 = 0.0f;
        for (int l = 0; l < 8; l++) {
            s1 += rs[l];
            s2 += db[l];
        }
        dgam[r] = s1;
        dbA[r] = s2;
    }
    for (int64_t r = 0; r < n; r++) dgam[r] -= csum[r];

    /* 6. Y = [dO;dR]·Sᵀ, Zs = V′·dSᵀ, Z1 = [dP̂·K; B̂·K], Z2 = dP̂ᵀQ + B̂ᵀK */
    mm(2 * n, dkp, dvp, DX, ldv, St, ldk, Y, ldk, 0.0f, 0);
    mm(n, dkp, dvp, V, ldv, dSt, ldk, Zs, ldk, 0.0f, 0);
    mm(n, dkp, n, E, L, K, ldk, Z1, ldk, 0.0f, 1);
    mm(n, dkp, n, E + n * L, L, K, ldk, Z1 + n * ldk, ldk, 0.0f, 1);
    mm_at(n, dkp, n, E, L, QK, ldk, Z2, ldk, 0.0f, 1);
    mm_at(n, dkp, n, E + n * L, L, K, ldk, Z2, ldk, 1.0f, 1);

    /* 7. rows: dq, dk, dv, dβ, the rest of dγ; then dg = reverse cumsum of dγ */
    double sdS = 0.0, sumw = 0.0; /* ⟨S, dS⟩; Σ_r w_r ∂L/∂w_r */
    for (int64_t d = 0; d < nk; d++) {
        const float *Sr = S + d * ldv, *dSr = dS + d * ldv;
        float acc_s = 0.0f;
#pragma omp simd reduction(+ : acc_s)
        for (int64_t j = 0; j < nv; j++) acc_s += Sr[j] * dSr[j];
        sdS += acc_s;
    }
    for (int64_t r = 0; r < n; r++) {
        const int64_t t = t0 + r;
        const float *qr = QK + r * ldk, *kr = K + r * ldk;
        const float *y0 = Y + r * ldk, *y1 = Y + (n + r) * ldk, *zs = Zs + r * ldk;
        const float *z1q = Z1 + r * ldk, *z1k = Z1 + (n + r) * ldk, *z2 = Z2 + r * ldk;
        const float er = eg[r], br = bet[r], wr = w[r], se = scale * er, be = br * er;
        float *dqr = oq + r * ldo, *dkr = ok + r * ldo;
        float qy = 0.0f, ky = 0.0f, kz = 0.0f;
#pragma omp simd reduction(+ : qy, ky, kz)
        for (int64_t d = 0; d < nk; d++) {
            qy += qr[d] * y0[d];
            ky += kr[d] * y1[d];
            kz += kr[d] * zs[d];
        }
        if (acc) {
#pragma omp simd
            for (int64_t d = 0; d < nk; d++) {
                dqr[d] += z1q[d] + se * y0[d];
                dkr[d] += z1k[d] + z2[d] - be * y1[d] + wr * zs[d];
            }
        } else {
#pragma omp simd
            for (int64_t d = 0; d < nk; d++) {
                dqr[d] = z1q[d] + se * y0[d];
                dkr[d] = z1k[d] + z2[d] - be * y1[d] + wr * zs[d];
            }
        }
        const float *dRr = dR + r * ldv, *Xr = X + r * ldv, *vr = x->v + (t * H_v + h) * nv;
        float *dvr = x->dv + (t * H_v + h) * nv;
        float db = 0.0f;
#pragma omp simd reduction(+ : db)
        for (int64_t j = 0; j < nv; j++) {
            dvr[j] = br * dRr[j];
            db += dRr[j] * (vr[j] - er * Xr[j]);
        }
        x->dbeta[t * H_v + h] = db + dbA[r];
        /* ∂L/∂e_r = s q_r·(S dO_r) − β_r k_r·(S dR_r); ∂L/∂w_r = k_r·(dS V′_r) */
        dgam[r] += se * qy - be * ky - wr * kz;
        sumw += (double)wr * kz;
    }
    dgam[n - 1] += (float)(sumw + eg[n - 1] * sdS);
    double acc_g = 0.0;
    for (int64_t r = n - 1; r >= 0; r--) {
        acc_g += dgam[r];
        x->dg[(t0 + r) * H_v + h] = (float)acc_g;
    }

    /* 8. dS ← e_last dS + [Q;K]ᵀ [diag(s e) dO; −diag(βe) dR] */
    for (int64_t r = 0; r < n; r++) {
        float *dOr = dO + r * ldv, *dRr = dR + r * ldv;
        const float a = scale * eg[r], b = -bet[r] * eg[r];
#pragma omp simd
        for (int64_t j = 0; j < dvp; j++) {
            dOr[j] *= a;
            dRr[j] *= b;
        }
    }
    mm_at(dkp, dvp, 2 * n, QK, ldk, DX, ldv, dS, ldv, eg[n - 1], 0);
}

/* Value heads [h0, h1) of one slot over chunks [c_lo, c_hi), last chunk first; per
 * chunk the heads in order, so that the heads of one key head reuse gdr_bwd_keys and
 * a key head held whole by this slot accumulates dq, dk in head order. */
static void gdr_bwd_range(gdr_bwork *wk, int64_t h0, int64_t h1, int64_t c_lo, int64_t c_hi,
                          const gdr_bwd_ctx *x) {
    const int64_t H_k = x->dm.H_k, rep = x->dm.H_v / H_k, nk = x->dm.d_k, C = GDR_CHUNK;
    const int64_t fl_S = x->dkp * x->ldv;
    for (int64_t c = c_hi - 1; c >= c_lo; c--) {
        const int64_t t0 = c * C, n = x->T - t0 < C ? x->T - t0 : C;
        for (int64_t h = h0; h < h1; h++) {
            const int64_t hk = h / rep;
            if (h == h0 || hk != (h - 1) / rep) gdr_bwd_keys(wk, x, t0, n, hk);
            float *oq, *ok;
            int64_t ldo;
            int acc;
            const int32_t si = x->stage_idx ? x->stage_idx[h] : -1;
            if (si >= 0) { /* a key head split between slots: own rows, summed later */
                const int64_t off = ((int64_t)si * x->sct + (t0 - c_lo * C)) * nk;
                oq = x->stage_q + off;
                ok = x->stage_k + off;
                ldo = nk;
                acc = 0;
            } else {
                oq = x->dq + (t0 * H_k + hk) * nk;
                ok = x->dk + (t0 * H_k + hk) * nk;
                ldo = H_k * nk;
                acc = h % rep != 0;
            }
            gdr_bwd_head(wk, wk->dS + (h - h0) * fl_S, oq, ok, ldo, acc, x, c, t0, n, h);
        }
    }
}

/* Most chunks per super-chunk (one barrier each when key heads are split: a few
 * microseconds against milliseconds of work per super-chunk). */
#define GDR_SC_CHUNKS 4

/* The slot holding value head h when slot i takes [H_v·i/n, H_v·(i+1)/n). */
static int64_t gdr_slot_of(int64_t h, int64_t H_v, int n_slots) {
    int64_t i = 0;
    while (i + 1 < n_slots && H_v * (i + 1) / n_slots <= h) i++;
    return i;
}

/* Outputs (all =): dq, dk (T, H_k, d_k) summed over the value heads of each key head;
 * dv (T, H_v, d_v); dbeta, dg (T, H_v); dstate0 (H_v, d_k, d_v) unless NULL.
 * Scratch (from `scratch`, released before return): one slot per thread as in the
 * forward, value heads [H_v·i/n, H_v·(i+1)/n) each (≈ 1.2 MiB per slot at d_k = d_v =
 * 128 plus 72 KiB per value head of the slot). When a key head's value heads fall in
 * two slots, each of them writes its dq, dk rows into a staging area and the slots,
 * after a barrier, sum them in head order, one super-chunk (≤ 4 chunks, staging
 * ≤ 4 MiB) at a time; results do not depend on the number of threads. */
ls_status ls_gdr_chunk_bwd(float *dq, float *dk, float *dv, float *dbeta, float *dg,
                           float *dstate0, const float *dout, const float *dstate_T,
                           const float *tape_h, const float *q, const float *k, const float *v,
                           const float *beta, const float *g, int64_t T, ls_gdr_dims dm,
                           ls_arena *scratch) {
    LS_ASSERT(dm.H_k > 0 && dm.H_v > 0 && dm.H_v % dm.H_k == 0 && dm.d_k > 0 && dm.d_v > 0,
              "H_k %d H_v %d d_k %d d_v %d", dm.H_k, dm.H_v, dm.d_k, dm.d_v);
    LS_ASSERT(T >= 0, "T %lld", (long long)T);
    const int64_t H_k = dm.H_k, H_v = dm.H_v, nk = dm.d_k, nv = dm.d_v, rep = H_v / H_k;
    const int64_t C = GDR_CHUNK, n_chunks = (T + C - 1) / C;
    if (T == 0) { /* no step: the initial state is the final state */
        if (dstate0) {
            if (dstate_T)
                memcpy(dstate0, dstate_T, (size_t)(H_v * nk * nv) * sizeof(float));
            else
                memset(dstate0, 0, (size_t)(H_v * nk * nv) * sizeof(float));
        }
        return LS_OK;
    }
    gdr_bwd_ctx x = {dq, dk, dv, dbeta, dg, NULL, NULL, NULL, 0, dout, tape_h, q, k, v, beta, g, T,
                     dm, 0, 0, 0, 0};
    x.dkp = round_up(nk, GDR_NR);
    x.dvp = round_up(nv, GDR_NR);
    x.ldv = x.dvp + GDR_NR;
    x.ldk = x.dkp + GDR_NR;

    int n_slots = 1;
#ifdef _OPENMP
    n_slots = omp_get_max_threads();
#endif
    if (n_slots > H_v) n_slots = (int)H_v;
    const int64_t max_heads = (H_v + n_slots - 1) / n_slots;
    gdr_bwork lay = {0}; /* only sized here */
    const int64_t slot = gdr_bwork_layout(&lay, NULL, max_heads, x.dkp, x.dvp, x.ldv, x.ldk);

    /* key heads whose value heads fall in two slots get staging blocks */
    size_t b_ints, b_slots;
    if (ls_mul_size((size_t)slot, (size_t)n_slots, &b_slots) ||
        ls_mul_size(b_slots, sizeof(float), &b_slots) ||
        ls_mul_size((size_t)(H_v + H_k), sizeof(int32_t), &b_ints))
        return ls_err(LS_ERR_NOMEM,
                      "gdr chunk bwd scratch: size overflow (%d slots, d_k %d, d_v %d)", n_slots,
                      dm.d_k, dm.d_v);
    ls_arena_mark mark = ls_arena_get_mark(scratch);
    int32_t *ints = ls_arena_alloc(scratch, b_ints);
    if (!ints) goto nomem;
    int32_t *stage_idx = ints, *shared = ints + H_v; /* (H_v), (H_k) */
    int64_t n_shared = 0, n_stage = 0;
    for (int64_t hk = 0; hk < H_k; hk++) {
        const int64_t a = hk * rep, b = a + rep - 1;
        const int split = gdr_slot_of(a, H_v, n_slots) != gdr_slot_of(b, H_v, n_slots);
        if (split) shared[n_shared++] = (int32_t)hk;
        for (int64_t h = a; h <= b; h++) stage_idx[h] = split ? (int32_t)n_stage++ : -1;
    }
    int64_t sc_chunks = n_chunks; /* chunks per super-chunk */
    if (n_shared > 0) {
        const int64_t per_chunk = n_stage * C * nk * 2; /* staging floats per chunk */
        sc_chunks = ((int64_t)1 << 20) / per_chunk;      /* at most 4 MiB of staging */
        if (sc_chunks > GDR_SC_CHUNKS) sc_chunks = GDR_SC_CHUNKS;
        if (sc_chunks < 1) sc_chunks = 1;
        if (sc_chunks > n_chunks) sc_chunks = n_chunks;
        size_t b_stage;
        if (ls_mul_size((size_t)per_chunk, (size_t)sc_chunks, &b_stage) ||
            ls_mul_size(b_stage, sizeof(float), &b_stage)) {
            ls_arena_release(scratch, mark);
            return ls_err(LS_ERR_NOMEM, "gdr chunk bwd staging: size overflow");
        }
        float *stage = ls_arena_alloc(scratch, b_stage);
        if (!stage) goto nomem;
        x.stage_q = stage;
        x.stage_k = stage + n_stage * sc_chunks * C * nk;
        x.stage_idx = stage_idx;
        x.sct = sc_chunks * C;
    }
    const int64_t n_sc = (n_chunks + sc_chunks - 1) / sc_chunks;
    float *buf = ls_arena_alloc(scratch, b_slots);
    if (!buf) goto nomem;
    /* padding rows/columns must hold finite values (zero): clear everything once */
    memset(buf, 0, b_slots);

#pragma omp parallel num_threads(n_slots)
    {
        int tid = 0, nth = 1;
#ifdef _OPENMP
        tid = omp_get_thread_num();
        nth = omp_get_num_threads();
#endif
        gdr_bwork wk = {0}; /* carved per slot below */
        /* dS = dstate_T (padding stays zero) */
        for (int i = tid; i < n_slots && dstate_T; i += nth) {
            float *dSs = buf + (int64_t)i * slot;
            for (int64_t h = H_v * i / n_slots; h < H_v * (i + 1) / n_slots; h++)
                for (int64_t d = 0; d < nk; d++)
                    memcpy(dSs + ((h - H_v * i / n_slots) * x.dkp + d) * x.ldv,
                           dstate_T + (h * nk + d) * nv, (size_t)nv * sizeof(float));
        }
        for (int64_t sc = n_sc - 1; sc >= 0; sc--) {
            const int64_t c_lo = sc * sc_chunks;
            const int64_t c_hi = c_lo + sc_chunks < n_chunks ? c_lo + sc_chunks : n_chunks;
            for (int i = tid; i < n_slots; i += nth) {
                gdr_bwork_layout(&wk, buf + (int64_t)i * slot, max_heads, x.dkp, x.dvp, x.ldv,
                                 x.ldk);
                gdr_bwd_range(&wk, H_v * i / n_slots, H_v * (i + 1) / n_slots, c_lo, c_hi, &x);
            }
            if (n_shared > 0) {
                /* every slot has staged this super-chunk: sum the shared key heads */
#pragma omp barrier
                const int64_t t_lo = c_lo * C, nt = (c_hi * C < T ? c_hi * C : T) - t_lo;
#pragma omp for schedule(static)
                for (int64_t job = 0; job < n_shared * nt; job++) {
                    const int64_t hk = shared[job / nt], tr = job % nt;
                    float *oq = dq + ((t_lo + tr) * H_k + hk) * nk;
                    float *ok = dk + ((t_lo + tr) * H_k + hk) * nk;
                    for (int64_t hh = hk * rep; hh < hk * rep + rep; hh++) {
                        const int64_t off = ((int64_t)stage_idx[hh] * x.sct + tr) * nk;
                        const float *sq = x.stage_q + off, *sk = x.stage_k + off;
                        if (hh == hk * rep) {
                            memcpy(oq, sq, (size_t)nk * sizeof(float));
                            memcpy(ok, sk, (size_t)nk * sizeof(float));
                        } else {
                            for (int64_t d = 0; d < nk; d++) {
                                oq[d] += sq[d];
                                ok[d] += sk[d];
                            }
                        }
                    }
                } /* implicit barrier: staging is free for the next super-chunk */
            }
        }
        for (int i = tid; i < n_slots && dstate0; i += nth) {
            const float *dSs = buf + (int64_t)i * slot;
            for (int64_t h = H_v * i / n_slots; h < H_v * (i + 1) / n_slots; h++)
                for (int64_t d = 0; d < nk; d++)
                    memcpy(dstate0 + (h * nk + d) * nv,
                           dSs + ((h - H_v * i / n_slots) * x.dkp + d) * x.ldv,
                           (size_t)nv * sizeof(float));
        }
    }
    ls_arena_release(scratch, mark);
    return LS_OK;
nomem:
    ls_arena_release(scratch, mark);
    return ls_err_ctx(LS_ERR_NOMEM, "gdr chunk bwd scratch (arena '%s')",
                      scratch->name ? scratch->name : "?");
}
