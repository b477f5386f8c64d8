/*
 * gdr.c — gated delta rule forward (specs/hybrid-qwen3next.md §2.6, §3): the
 * token-serial recurrence (reference and one-token decode step) and the chunked
 * WY/UT form (chunk 64) used for prompt capture. Both run one value head per
 * OpenMP thread. The chunked form does its matrix products with a small
 * register-blocked kernel on 64-byte-aligned per-thread buffers whose widths are
 * padded to a multiple of 16 floats (zero padding changes no result).
 */
#include <math.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "longstraw/kernels.h"

#define GDR_CHUNK 64 /* rows per chunk (§3, FLA default) */
#define GDR_NR 16    /* columns of one register tile = two 8-float vectors */
#define GDR_MR 6     /* rows of one register tile: 12 accumulators + 3 = 15 of 16 ymm */

typedef float gdr_v8 __attribute__((vector_size(32)));

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* e^x for x ≤ 0 (a few ulp; Cephes expf polynomial). Written without calls and
 * branches so `omp simd` loops vectorise it. x < −87 gives 0 (the true value is
 * below FLT_MIN); NaN stays NaN. */
static inline float exp_nonpos(float x) {
    float xc = x < -87.0f ? -87.0f : x;
    xc = xc > 88.0f ? 88.0f : xc;
    /* n = round(x / ln2) by the 1.5·2^23 trick (exact for |n| < 2^22) */
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } s;
    s.i = ((int32_t)n + 127) * (1 << 23);
    return x < -87.0f ? 0.0f : p * s.f;
}

/* ---- serial recurrence ---------------------------------------------------- */

/* Token-serial §2.6 per value head: S̃ = e^{g_t} S; u = β_t (v_t − S̃ᵀ k_t);
 * S = S̃ + k_t uᵀ; o_t = Sᵀ (scale·q_t). Columns of S are independent, so each
 * block of 32 columns (d_k × 32 floats, in L1) is carried through all its steps. */
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
        for (int64_t t = 0; t < T; t++) {
            const float *qt = q + (t * H_k + hk) * dk; /* (d_k) */
            const float *kt = k + (t * H_k + hk) * dk; /* (d_k) */
            const float *vt = v + (t * H_v + h) * dv;  /* (d_v) */
            float *ot = o + (t * H_v + h) * dv;        /* (d_v) */
            const float a = expf(g[t * H_v + h]), b = beta[t * H_v + h];
            for (int64_t j0 = 0; j0 < dv; j0 += 32) {
                const int64_t nj = dv - j0 < 32 ? dv - j0 : 32;
                float u[32], acc[32];
                for (int64_t j = 0; j < nj; j++) acc[j] = 0.0f;
                /* acc = Sᵀ k over this column block */
                for (int64_t d = 0; d < dk; d++) {
                    const float kd = kt[d];
                    const float *Sr = S + d * dv + j0;
#pragma omp simd
                    for (int64_t j = 0; j < nj; j++) acc[j] += kd * Sr[j];
                }
#pragma omp simd
                for (int64_t j = 0; j < nj; j++) {
                    u[j] = b * (vt[j0 + j] - a * acc[j]);
                    acc[j] = 0.0f;
                }
                /* S = a·S + k uᵀ; acc = Sᵀ q (new S) */
                for (int64_t d = 0; d < dk; d++) {
                    const float kd = kt[d], qd = qt[d];
                    float *Sr = S + d * dv + j0;
#pragma omp simd
                    for (int64_t j = 0; j < nj; j++) {
                        float s = a * Sr[j] + kd * u[j];
                        Sr[j] = s;
                        acc[j] += qd * s;
                    }
                }
                for (int64_t j = 0; j < nj; j++) ot[j0 + j] = scale * acc[j];
            }
        }
    }
}

/* ---- chunked form ---------------------------------------------------------- */

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

/* Per-thread buffers of the chunked form (all from the scratch arena). */
typedef struct {
    float *S;   /* (dkp, dvp) running state, zero-padded */
    float *QK;  /* (2n, dkp) rows 0..n−1 = q, rows n..2n−1 = k of the chunk */
    float *Kt;  /* (dkp, C) kᵀ; later (k ⊙ e^{γ_last−γ})ᵀ */
    float *G;   /* (2n, C) rows 0..n−1: P = scale·(M ⊙ QKᵀ ⊙ e^{γ_r−γ_i});
                 *          rows n..2n−1: −A (strictly lower) */
    float *X;   /* (2n, dvp) [Q;K]·S; rows 0..n−1 become the output O */
    float *V;   /* (n, dvp) v, then R, then V′ (in place) */
    float *gam; /* (C) γ = within-chunk cumsum of g */
    float *eg;  /* (C) e^{γ} */
    float *bet; /* (C) β */
    float *w;   /* (C) e^{γ_last − γ} */
} gdr_work;

/* Forward substitution (I + A) X = R in place on V (n, dvp), with NA = −A strictly
 * lower (n, stride C): rows in blocks of 16; the part below the diagonal block
 * goes through mm, the 16×16 diagonal block row by row. */
static void gdr_solve(float *V, const float *NA, int64_t n, int64_t dvp) {
    for (int64_t b0 = 0; b0 < n; b0 += 16) {
        const int64_t nb = n - b0 < 16 ? n - b0 : 16;
        if (b0 > 0) mm(nb, dvp, b0, NA + b0 * GDR_CHUNK, GDR_CHUNK, V, dvp, V + b0 * dvp, dvp, 1.0f, 0);
        for (int64_t r = b0 + 1; r < b0 + nb; r++) {
            float *vr = V + r * dvp;
            for (int64_t i = b0; i < r; i++) {
                const float a = NA[r * GDR_CHUNK + i];
                const float *vi = V + i * dvp;
#pragma omp simd
                for (int64_t j = 0; j < dvp; j++) vr[j] += a * vi[j];
            }
        }
    }
}

/* One chunk of n ≤ C tokens starting at t0 for value head h (§3 steps 1–6).
 * V′ = (I+A)⁻¹(diag(β)V − diag(βe^γ) K S) is the same as U − W·S of §3 step 5
 * (W·S = (I+A)⁻¹ diag(βe^γ) K S), so W is never formed: one product [Q;K]·S
 * serves both the inter-chunk output and the deltas. */
static void gdr_chunk(gdr_work *wk, float *o, const float *q, const float *k, const float *v,
                      const float *beta, const float *g, int64_t t0, int64_t n, int64_t h,
                      int64_t hk, ls_gdr_dims dm, int64_t dkp, int64_t dvp) {
    const int64_t H_k = dm.H_k, H_v = dm.H_v, dk = dm.d_k, dv = dm.d_v, C = GDR_CHUNK;
    const float scale = dm.scale;
    float *S = wk->S, *QK = wk->QK, *Kt = wk->Kt, *G = wk->G, *X = wk->X, *V = wk->V;
    float *gam = wk->gam, *eg = wk->eg, *bet = wk->bet, *w = wk->w;

    /* gather this head's rows into contiguous, zero-padded buffers; γ = cumsum g */
    float cum = 0.0f;
    for (int64_t r = 0; r < n; r++) {
        const int64_t t = t0 + r;
        const float *qr = q + (t * H_k + hk) * dk, *kr = k + (t * H_k + hk) * dk;
        float *Qd = QK + r * dkp, *Kd = QK + (n + r) * dkp, *Vd = V + r * dvp;
        memcpy(Qd, qr, (size_t)dk * sizeof(float));
        memcpy(Kd, kr, (size_t)dk * sizeof(float));
        for (int64_t d = dk; d < dkp; d++) Qd[d] = Kd[d] = 0.0f;
        for (int64_t d = 0; d < dk; d++) Kt[d * C + r] = kr[d];
        memcpy(Vd, v + (t * H_v + h) * dv, (size_t)dv * sizeof(float));
        for (int64_t j = dv; j < dvp; j++) Vd[j] = 0.0f;
        cum += g[t * H_v + h];
        gam[r] = cum;
        bet[r] = beta[t * H_v + h];
    }
#pragma omp simd
    for (int64_t r = 0; r < n; r++) {
        eg[r] = exp_nonpos(gam[r]);
        w[r] = exp_nonpos(gam[n - 1] - gam[r]);
    }

    /* G = [Q;K]·Kᵀ (2n, n) and X = [Q;K]·S (2n, dvp), both from the chunk-start S */
    mm(2 * n, round_up(n, GDR_NR), dkp, QK, dkp, Kt, C, G, C, 0.0f, 0);
    mm(2 * n, dvp, dkp, QK, dkp, S, dvp, X, dvp, 0.0f, 0);

    /* P = scale·(QKᵀ ⊙ e^{γ_r−γ_i}) for i ≤ r; −A = −β_r (KKᵀ ⊙ e^{γ_r−γ_i}) for i < r.
     * Exponents are ≤ 0 on and below the diagonal; above it the entries are zeroed. */
    for (int64_t r = 0; r < n; r++) {
        float *Pr = G + r * C, *Ar = G + (n + r) * C;
        const float gr = gam[r], sb = -bet[r];
#pragma omp simd
        for (int64_t i = 0; i < n; i++) {
            const float e = exp_nonpos(i <= r ? gr - gam[i] : -100.0f);
            Pr[i] = i <= r ? scale * Pr[i] * e : 0.0f;
            Ar[i] = i < r ? sb * Ar[i] * e : 0.0f;
        }
    }

    /* R = diag(β)(V − diag(e^γ) K S) */
    for (int64_t r = 0; r < n; r++) {
        float *Vr = V + r * dvp;
        const float *KSr = X + (n + r) * dvp;
        const float b = bet[r], e = eg[r];
#pragma omp simd
        for (int64_t j = 0; j < dvp; j++) Vr[j] = b * (Vr[j] - e * KSr[j]);
    }
    /* V′ = (I+A)⁻¹ R: the true per-token deltas u_r of §2.6 */
    gdr_solve(V, G + n * C, n, dvp);

    /* O = scale·diag(e^γ) Q S + P V′ */
    for (int64_t r = 0; r < n; r++) {
        float *Or = X + r * dvp;
        const float s = scale * eg[r];
#pragma omp simd
        for (int64_t j = 0; j < dvp; j++) Or[j] *= s;
    }
    mm(n, dvp, n, G, C, V, dvp, X, dvp, 1.0f, 1);
    for (int64_t r = 0; r < n; r++)
        memcpy(o + ((t0 + r) * H_v + h) * dv, X + r * dvp, (size_t)dv * sizeof(float));

    /* S ← e^{γ_last} S + (K ⊙ e^{γ_last−γ})ᵀ V′ */
    for (int64_t d = 0; d < dk; d++) {
        float *Kr = Kt + d * C;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) Kr[i] *= w[i];
    }
    mm(dkp, dvp, n, Kt, C, V, dvp, S, dvp, eg[n - 1], 0);
}

ls_status ls_gdr_chunk_fwd(float *o, float *tape_h, float *state, const float *q, const float *k,
                           const float *v, const float *beta, const float *g, int64_t T,
                           ls_gdr_dims dm, ls_arena *scratch) {
    LS_ASSERT(dm.H_k > 0 && dm.H_v > 0 && dm.H_v % dm.H_k == 0 && dm.d_k > 0 && dm.d_v > 0,
              "H_k %d H_v %d d_k %d d_v %d", dm.H_k, dm.H_v, dm.d_k, dm.d_v);
    LS_ASSERT(T >= 0, "T %lld", (long long)T);
    if (T == 0) return LS_OK;
    const int64_t H_v = dm.H_v, dk = dm.d_k, dv = dm.d_v, C = GDR_CHUNK;
    const int64_t rep = H_v / dm.H_k;
    const int64_t dkp = round_up(dk, GDR_NR), dvp = round_up(dv, GDR_NR);
    const int64_t n_chunks = (T + C - 1) / C;

    int nt = 1;
#ifdef _OPENMP
    nt = omp_get_max_threads();
#endif
    if (nt > H_v) nt = (int)H_v;

    /* per-thread floats; every piece is a multiple of 16 floats, so all stay 64-byte aligned */
    const int64_t fl_S = dkp * dvp, fl_QK = 2 * C * dkp, fl_Kt = dkp * C, fl_G = 2 * C * C;
    const int64_t fl_X = 2 * C * dvp, fl_V = C * dvp, fl_vec = 4 * C;
    const int64_t per_thread = fl_S + fl_QK + fl_Kt + fl_G + fl_X + fl_V + fl_vec;
    size_t bytes;
    if (ls_mul_size((size_t)per_thread, (size_t)nt, &bytes) ||
        ls_mul_size(bytes, sizeof(float), &bytes))
        return ls_err(LS_ERR_NOMEM, "gdr chunk scratch: size overflow (%d threads, d_k %d, d_v %d)",
                      nt, dm.d_k, dm.d_v);
    ls_arena_mark mark = ls_arena_get_mark(scratch);
    float *buf = ls_arena_alloc(scratch, bytes);
    if (!buf)
        return ls_err_ctx(LS_ERR_NOMEM, "gdr chunk scratch (%zu bytes from arena '%s')", bytes,
                          scratch->name ? scratch->name : "?");
    /* Kt's padding rows (d ≥ d_k) and unused columns must hold finite values: zero all */
    memset(buf, 0, bytes);

#pragma omp parallel num_threads(nt)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        float *p = buf + (int64_t)tid * per_thread;
        gdr_work wk;
        wk.S = p, p += fl_S;
        wk.QK = p, p += fl_QK;
        wk.Kt = p, p += fl_Kt;
        wk.G = p, p += fl_G;
        wk.X = p, p += fl_X;
        wk.V = p, p += fl_V;
        wk.gam = p, wk.eg = p + C, wk.bet = p + 2 * C, wk.w = p + 3 * C;
#pragma omp for schedule(static)
        for (int64_t h = 0; h < H_v; h++) {
            float *Sh = state + h * dk * dv; /* (d_k, d_v) */
            for (int64_t d = 0; d < dk; d++) {
                memcpy(wk.S + d * dvp, Sh + d * dv, (size_t)dv * sizeof(float));
                for (int64_t j = dv; j < dvp; j++) wk.S[d * dvp + j] = 0.0f;
            }
            for (int64_t d = dk; d < dkp; d++)
                for (int64_t j = 0; j < dvp; j++) wk.S[d * dvp + j] = 0.0f;
            for (int64_t c = 0; c < n_chunks; c++) {
                if (tape_h) {
                    float *th = tape_h + (c * H_v + h) * dk * dv; /* (d_k, d_v) */
                    for (int64_t d = 0; d < dk; d++)
                        memcpy(th + d * dv, wk.S + d * dvp, (size_t)dv * sizeof(float));
                }
                const int64_t t0 = c * C, n = T - t0 < C ? T - t0 : C;
                gdr_chunk(&wk, o, q, k, v, beta, g, t0, n, h, h / rep, dm, dkp, dvp);
            }
            for (int64_t d = 0; d < dk; d++)
                memcpy(Sh + d * dv, wk.S + d * dvp, (size_t)dv * sizeof(float));
        }
    }
    ls_arena_release(scratch, mark);
    return LS_OK;
}
