/*
 * test_core.c — arenas (accounting, mark/release, reuse) and dtype conversions.
 */
#include <string.h>

#include "longstraw/core.h"
#include "testutil.h"

int test_core_arena(void);
int test_core_dtype(void);

int test_core_arena(void) {
    ls_arena a;
    ls_arena_init(&a, "t", 1024);
    char *p = ls_arena_alloc(&a, 10);
    T_CHECK(p && ((uintptr_t)p % LS_ALIGN) == 0, "alignment");
    T_CHECK(a.cur == 64, "cur after 10-byte alloc: %zu", a.cur);
    ls_arena_mark m = ls_arena_get_mark(&a);
    char *big = ls_arena_alloc(&a, 5000); /* larger than a block */
    T_CHECK(big != NULL, "big alloc");
    memset(big, 1, 5000);
    T_CHECK(a.cur == 64 + ls_align_up(5000), "cur %zu", a.cur);
    size_t peak = a.peak;
    ls_arena_release(&a, m);
    T_CHECK(a.cur == 64 && a.peak == peak, "release: cur %zu peak %zu", a.cur, a.peak);
    size_t reserved = a.reserved;
    char *again = ls_arena_alloc(&a, 5000);
    T_CHECK(again == big, "spare block reused");
    T_CHECK(a.reserved == reserved, "no new reservation");
    ls_arena_reset(&a);
    T_CHECK(a.cur == 0, "reset");
    ls_arena_free(&a);
    T_CHECK(a.reserved == 0, "free returns all blocks: %zu", a.reserved);
    return 0;
}

int test_core_dtype(void) {
    /* bf16: round to nearest even, exact for representable values */
    T_CHECK(ls_bf16_to_f32(ls_f32_to_bf16(1.0f)) == 1.0f, "bf16 1.0");
    T_CHECK(ls_bf16_to_f32(ls_f32_to_bf16(-3.5f)) == -3.5f, "bf16 -3.5");
    float x = 1.0f + 1.0f / 256.0f; /* halfway between two bf16 values: ties to even (1.0) */
    T_CHECK(ls_bf16_to_f32(ls_f32_to_bf16(x)) == 1.0f, "bf16 tie to even");
    T_CHECK(isnan(ls_bf16_to_f32(ls_f32_to_bf16(NAN))), "bf16 NaN");
    /* f16 round trips */
    const float vals[] = {0.0f, 1.0f, -2.0f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f, 0.333251953125f};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        float y = ls_f16_to_f32(ls_f32_to_f16(vals[i]));
        T_CHECK(y == vals[i], "f16 round trip %g -> %g", vals[i], y);
    }
    T_CHECK(isinf(ls_f16_to_f32(ls_f32_to_f16(1e6f))), "f16 overflow to inf");
    ls_rng r;
    ls_rng_seed(&r, 7);
    double s = 0, s2 = 0;
    for (int i = 0; i < 20000; i++) {
        double z = ls_rng_normal(&r);
        s += z;
        s2 += z * z;
    }
    T_CHECK(fabs(s / 20000) < 0.05 && fabs(s2 / 20000 - 1) < 0.05, "normal moments");
    return 0;
}
