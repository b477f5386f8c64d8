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
/* mask ? a : b lane-wise, mask lanes all-ones or zero (a vector comparison) */
#define LS_VSEL(mask, a, b) ((ls_vf)(((ls_vi)(a) & (mask)) | ((ls_vi)(b) & ~(mask))))
#define LS_VLOAD(v, p) memcpy(&(v), (p), sizeof(ls_vf))
#define LS_VSTORE(p, v) memcpy((p), &(v), sizeof(ls_vf))

#endif
