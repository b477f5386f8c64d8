/*
 * runtime.h — what the process runs on: OpenMP's wait policy, the BLAS and the
 * kernels it picked for this CPU, and its measured sgemm rate.
 *
 * Debian's OpenBLAS 0.3.21 (DYNAMIC_ARCH) picks its kernels from the CPU's family and
 * model at load time; a CPU newer than the library (an Intel Xeon family 6 model 207,
 * say) gets its Prescott (SSE3) kernels, about 6x slower than the AVX-512 ones the
 * core runs (measured: 41 vs 256 GFLOP/s on 2 threads). The library reads
 * OPENBLAS_CORETYPE once, before main(), so the choice is made by setting it and
 * re-executing the program (ls_runtime_setup), which a tool can do and a library
 * embedded in another process cannot: there, ls_blas_advice() says what to set.
 * docs/architecture.md "The BLAS's kernels" records the measurements (BLIS included).
 */
#ifndef LONGSTRAW_RUNTIME_H
#define LONGSTRAW_RUNTIME_H

#include <stddef.h>

/* Call first in main(), before MPI or any thread starts. Unless the user set them:
 *  - OMP_WAIT_POLICY=passive: idle OpenMP workers sleep instead of spinning (on a
 *    shared 2-core machine spinning made `step` 4–5x slower under load);
 *  - OPENBLAS_CORETYPE=<the strongest core this CPU runs>, when the BLAS's own
 *    choice is weaker (ls_blas_info: cpu_core vs core).
 * and, when it set either, re-executes the program once (/proc/self/exe) so the
 * libraries read them. A user's own setting always wins. Returns only when no
 * re-exec was needed or it failed (the program then runs as it is). */
void ls_runtime_setup(char **argv);
/* Holds OPENBLAS_VERBOSE back until ls_runtime_setup (runtime.c explains); run from the
 * executable's .preinit_array (src/core/preinit.c, added to every executable linking the
 * static library), never called otherwise. */
void ls_runtime_hold_verbose(int argc, char **argv, char **envp);

typedef struct {
    char config[192];    /* openblas_get_config(): version and build options */
    char core[32];       /* the kernels the BLAS runs (openblas_get_corename()) */
    char cpu_core[32];   /* the strongest core this CPU can run, by its features and
                          * vendor ("" when not x86-64 or nothing better than SSE) */
    const char *source;  /* who chose `core`: "user" (OPENBLAS_CORETYPE was set before
                          * the program started), "longstraw" (ls_runtime_setup set it),
                          * "blas" (the library's own detection) */
    char blas_core[32];  /* the core the BLAS picks by itself, where known ("" when the
                          * user chose: it was never asked) */
    int weaker;          /* 1 when `core` is weaker than `cpu_core` */
} ls_blas_info;

void ls_blas_info_get(ls_blas_info *out);

/* When the BLAS runs weaker kernels than the CPU can: 1 and a sentence for a user
 * (what runs, what could, what to set); 0 and "" otherwise. */
int ls_blas_advice(char *msg, size_t cap);

/* sgemm GFLOP/s on the current thread count: the best of a few 1024^3 products
 * (about 0.1 s at most), measured once per process and cached. */
double ls_blas_sgemm_gflops(void);

/* One line naming the BLAS, its core (and who chose it) and the measured rate, for
 * --stats and the benchmarks: "OpenBLAS 0.3.21, SkylakeX kernels (set by longstraw;
 * the CPU runs SkylakeX), sgemm 251 GFLOP/s on 2 threads". Measures (above). */
void ls_blas_describe(char *out, size_t cap);

#endif
