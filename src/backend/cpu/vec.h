/*
 * vec.h — the CPU kernels' f32 vectors (GCC vector extensions): 16 lanes with AVX-512
 * (one zmm register), 8 with AVX (ymm), else 4 (SSE; wider vectors would be split and
 * their broadcasts go through the stack). The -O2 cost model does not vectorise loops of
 * unknown trip count, so hot loops are written with vectors explicitly. Vectors stay
 * local (no vector arguments or returns) so nothing depends on the vector calling
 * convention (-Wpsabi).
 */
#ifndef LS_BACKEND_CPU_VEC_H
#define LS_BACKEND_CPU_VEC_H

#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#define LS_VL 16
#define LS_SPLAT(x) ((ls_vf){(x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x)})
#elif defined(__AVX__)
#define LS_VL 8
#define LS_SPLAT(x) ((ls_vf){(x), (x), (x), (x), (x), (x), (x), (x)})
#else
#define LS_VL 4
#define LS_SPLAT(x) ((ls_vf){(x), (x), (x), (x)})
#endif
typedef float ls_vf __attribute__((vector_size(LS_VL * sizeof(float))));
typedef int32_t ls_vi __attribute__((vector_size(LS_VL * sizeof(int32_t))));
typedef uint16_t ls_vh __attribute__((vector_size(LS_VL * sizeof(uint16_t))));
/* Half vectors (8 lanes, one ymm register) beside 16-lane ones: for work only 8 wide (a
 * tile of ≤ 8 heads), where a 512-bit operation would carry half zeros (on Zen 4 it also
 * costs two 256-bit ones). */
#if LS_VL == 16
#define LS_HALF_VL 8
typedef float ls_vf8 __attribute__((vector_size(8 * sizeof(float))));
#define LS_SPLAT8(x) ((ls_vf8){(x), (x), (x), (x), (x), (x), (x), (x)})
#endif
/* mask ? a : b lane-wise, mask lanes all-ones or zero (a vector comparison) */
#define LS_VSEL(mask, a, b) ((ls_vf)(((ls_vi)(a) & (mask)) | ((ls_vi)(b) & ~(mask))))
#define LS_VLOAD(v, p) memcpy(&(v), (p), sizeof(ls_vf))
#define LS_VSTORE(p, v) memcpy((p), &(v), sizeof(ls_vf))

/* y = 2^x lane-wise, for x ≤ 0 (a score minus the running max): Cephes exp2f
 * polynomial on [−½, ½] (relative error ~2e−7), exponent by bit construction.
 * x ≤ −127 gives exactly 0 (exponent field 0), so −inf gives 0; NaN stays NaN. */
#define LS_VEXP2(y, x)                                                                  \
    do {                                                                                 \
        const ls_vf lo_ = LS_SPLAT(-127.0f);                                         \
        ls_vf xc_ = LS_VSEL((x) > lo_, (x), lo_);                  /* NaN → −127 */ \
        ls_vi k_ = __builtin_convertvector(xc_ + 127.5f, ls_vi); /* round+127 */   \
        ls_vf f_ = xc_ - __builtin_convertvector(k_ - 127, ls_vf); /* [−½, ½] */     \
        ls_vf p_ = ((((1.535336188319500e-4f * f_ + 1.339887440266574e-3f) * f_ +      \
                        9.618437357674640e-3f) * f_ + 5.550332471162809e-2f) * f_ +     \
                      2.402264791363012e-1f) * f_ + 6.931472028550421e-1f;               \
        p_ = 1.0f + f_ * p_;                                                             \
        p_ *= (ls_vf)(k_ << 23); /* 2^(k−127); k = 0 gives 0 */                        \
        (y) = LS_VSEL((x) == (x), p_, (x));                                            \
    } while (0)

/* σ(x) lane-wise: LS_VEXP2 of −|x|·log2 e (relative error ~3e−7 against expf's ~1 ulp),
 * then 1/(1 + e) or e/(1 + e) by the sign; ±large saturate to 1 and 0, NaN stays NaN. */
#define LS_VSIGMOID(y, x)                                                                \
    do {                                                                                 \
        const ls_vf zero_ = LS_SPLAT(0.0f);                                              \
        ls_vi pos_ = (x) > zero_;                                                        \
        ls_vf e_, nx_ = LS_VSEL(pos_, -(x), (x)) * 1.4426950408889634f; /* −|x|·log2 e */ \
        LS_VEXP2(e_, nx_);                                                               \
        ls_vf r_ = 1.0f / (1.0f + e_);                                                   \
        (y) = LS_VSEL(pos_, r_, e_ * r_);                                                \
    } while (0)

/* s[i] = σ(x[i]), or with silu s[i] = x[i]·σ(x[i]), for i < n (s may be x): whole vectors,
 * then the tail as one zero-padded vector — the same arithmetic for every element,
 * wherever it sits, so a value never depends on a row's length or a chunking. */
static inline void ls_sigmoid_n(float *s, const float *x, int64_t n, int silu) {
    int64_t i = 0;
    for (; i + LS_VL <= n; i += LS_VL) {
        ls_vf v, y;
        LS_VLOAD(v, x + i);
        LS_VSIGMOID(y, v);
        if (silu) y *= v;
        LS_VSTORE(s + i, y);
    }
    if (i < n) {
        float b[LS_VL] = {0};
        memcpy(b, x + i, (size_t)(n - i) * sizeof(float));
        ls_vf v, y;
        LS_VLOAD(v, b);
        LS_VSIGMOID(y, v);
        if (silu) y *= v;
        LS_VSTORE(b, y);
        memcpy(s + i, b, (size_t)(n - i) * sizeof(float));
    }
}

#endif
