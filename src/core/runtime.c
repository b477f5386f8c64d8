/*
 * runtime.c — the process's runtime choices made before main's work starts (OpenMP
 * wait policy, the BLAS's kernels) and the facts a receipt reports about them (the
 * BLAS, its core, its measured sgemm rate). See include/longstraw/runtime.h.
 */
#include "longstraw/runtime.h"

#include "longstraw/core.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* OpenBLAS's own extensions (declared in its cblas.h; repeated so a missing one is a
 * link error that names it, not a silent fallback) */
char *openblas_get_corename(void);
char *openblas_get_config(void);

/* Marks an OPENBLAS_CORETYPE that ls_runtime_setup set (so the receipt can tell the
 * user's choice from ours, in this process and in the ones it starts). */
#define LS_CORE_MARK "LONGSTRAW_SET_OPENBLAS_CORETYPE"
/* ... and the core the BLAS had chosen by itself before that */
#define LS_CORE_OWN "LONGSTRAW_BLAS_OWN_CORETYPE"

/* OpenBLAS's x86-64 core names (DYNAMIC_ARCH, 0.3.x) by the widest vector ISA their
 * sgemm kernels use: 0 SSE, 1 AVX, 2 AVX2 + FMA, 3 AVX-512 (F/BW/DQ/VL), 4 AVX-512 +
 * BF16. -1: a name this table does not know (a newer library): never overridden. */
static int core_level(const char *name) {
    static const struct {
        const char *name;
        int level;
    } t[] = {
        {"Katmai", 0},      {"Coppermine", 0},  {"Northwood", 0},    {"Prescott", 0},   {"Banias", 0},
        {"Atom", 0},        {"Core2", 0},       {"Penryn", 0},       {"Dunnington", 0}, {"Nehalem", 0},
        {"Athlon", 0},      {"Opteron", 0},     {"Opteron_SSE3", 0}, {"Barcelona", 0},  {"Nano", 0},
        {"Bobcat", 0},      {"Sandybridge", 1}, {"Bulldozer", 1},    {"Piledriver", 1}, {"Steamroller", 1},
        {"Excavator", 1},   {"Haswell", 2},     {"Zen", 2},          {"SkylakeX", 3},   {"Cooperlake", 4},
        {"SapphireRapids", 4},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (strcasecmp(name, t[i].name) == 0) return t[i].level;
    return -1;
}

/* The strongest OpenBLAS core this CPU runs, from its features (libgcc's cpuid reading
 * also checks that the OS saves the AVX / AVX-512 state) and vendor; "" for none
 * better than SSE or a non-x86 machine. AMD stays on the Zen kernels even with
 * AVX-512 (Zen 4): the SkylakeX kernels were not measured faster there. */
static const char *cpu_best_core(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    int amd = __builtin_cpu_is("amd");
    int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (amd) return avx2 ? "Zen" : __builtin_cpu_supports("avx") ? "Bulldozer" : "";
    if (avx512 && __builtin_cpu_supports("avx512bf16")) return "Cooperlake";
    if (avx512) return "SkylakeX";
    if (avx2) return "Haswell";
    if (__builtin_cpu_supports("avx")) return "Sandybridge";
#endif
    return "";
}

void ls_blas_info_get(ls_blas_info *out) {
    memset(out, 0, sizeof *out);
    const char *cfg = openblas_get_config(), *core = openblas_get_corename();
    snprintf(out->config, sizeof out->config, "%s", cfg ? cfg : "?");
    snprintf(out->core, sizeof out->core, "%s", core ? core : "?");
    snprintf(out->cpu_core, sizeof out->cpu_core, "%s", cpu_best_core());
    const char *env = getenv("OPENBLAS_CORETYPE"), *mark = getenv(LS_CORE_MARK);
    if (!env || !*env) {
        out->source = "blas";
        snprintf(out->blas_core, sizeof out->blas_core, "%s", out->core);
    } else if (mark && strcmp(mark, env) == 0) {
        out->source = "longstraw";
        const char *own = getenv(LS_CORE_OWN);
        snprintf(out->blas_core, sizeof out->blas_core, "%s", own ? own : "");
    } else if (strcasecmp(env, out->core) == 0) {
        out->source = "user";
    } else { /* the user's value is not what runs: OpenBLAS rejected it and chose itself */
        out->source = "blas";
        snprintf(out->blas_core, sizeof out->blas_core, "%s", out->core);
    }
    int have = core_level(out->core), can = out->cpu_core[0] ? core_level(out->cpu_core) : -1;
    out->weaker = have >= 0 && can > have;
}

int ls_blas_advice(char *msg, size_t cap) {
    ls_blas_info b;
    ls_blas_info_get(&b);
    if (cap) msg[0] = 0;
    if (!b.weaker) return 0;
    if (strcmp(b.source, "blas") == 0)
        snprintf(msg, cap, "the BLAS (%s) runs its %s kernels on a CPU that runs %s ones: set OPENBLAS_CORETYPE=%s "
                           "before the process starts (a program calls ls_runtime_setup first in main)",
                 b.config, b.core, b.cpu_core, b.cpu_core);
    else
        snprintf(msg, cap, "the BLAS (%s) runs its %s kernels (OPENBLAS_CORETYPE=%s, set by %s) on a CPU that runs "
                           "%s ones",
                 b.config, b.core, getenv("OPENBLAS_CORETYPE"), b.source, b.cpu_core);
    return 1;
}

/* OPENBLAS_VERBOSE makes OpenBLAS name its kernels as it loads, before main. A process
 * that then executes itself again (with OMP_WAIT_POLICY, with a better
 * OPENBLAS_CORETYPE) would print it twice, first the kernels it is about to drop. So in a
 * process that may do so, the variable is held back before any library starts (the
 * executable's preinit array runs before every library's constructor) and
 * ls_runtime_setup gives it back: to the process it becomes, which prints once, or to
 * this one, which then says what OpenBLAS would have said. */
#define LS_VERBOSE_HELD "OPENBLAS_VERBOS_" /* the variable renamed in place (same length) */

/* NAME's value in envp (getenv does not work yet when the preinit array runs) */
static const char *env_in(char **envp, const char *name) {
    size_t n = strlen(name);
    for (; envp && *envp; envp++)
        if (!strncmp(*envp, name, n) && (*envp)[n] == '=') return *envp + n + 1;
    return NULL;
}

void ls_runtime_hold_verbose(int argc, char **argv, char **envp) {
    (void)argc, (void)argv;
    const char *ct = env_in(envp, "OPENBLAS_CORETYPE");
    if (env_in(envp, "OMP_WAIT_POLICY") && ct && *ct) return; /* no second start: OpenBLAS says it itself */
    for (; envp && *envp; envp++)
        if (!strncmp(*envp, "OPENBLAS_VERBOSE=", 17)) (*envp)[15] = '_'; /* OPENBLAS_VERBOS_ */
}
/* Its .preinit_array entry is in src/core/preinit.c, compiled into each executable that
 * links the static library (a shared library may not have one: liblongstraw.so's hosts
 * start OpenBLAS before they load it anyway). */

void ls_runtime_setup(char **argv) {
    int changed = 0;
    if (!getenv("OMP_WAIT_POLICY") && setenv("OMP_WAIT_POLICY", "passive", 1) == 0) changed = 1;
    const char *env = getenv("OPENBLAS_CORETYPE");
    if (!env || !*env) {
        ls_blas_info b;
        ls_blas_info_get(&b);
        /* set both or neither: the mark without the variable would call the next
         * user's setting ours */
        if (b.weaker && setenv(LS_CORE_MARK, b.cpu_core, 1) == 0) {
            if (setenv("OPENBLAS_CORETYPE", b.cpu_core, 1) == 0) {
                setenv(LS_CORE_OWN, b.core, 1);
                changed = 1;
            } else {
                unsetenv(LS_CORE_MARK);
            }
        }
    }
    const char *held = getenv(LS_VERBOSE_HELD);
    if (held) {
        char v[64];
        snprintf(v, sizeof v, "%s", held);
        setenv("OPENBLAS_VERBOSE", v, 1);
        unsetenv(LS_VERBOSE_HELD);
        if (!changed && atoi(v) >= 2) { /* what OpenBLAS prints at that level as it loads */
            const char *core = openblas_get_corename();
            fprintf(stderr, "Core: %s\n", core ? core : "?");
        }
    }
    if (changed) {
        /* the program by its own path, so that the process keeps its name (`pgrep
         * longstraw`), not "exe"; /proc/self/exe when the path is gone */
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n > 0) self[n] = 0;
        if (n > 0 && access(self, X_OK) == 0) execv(self, argv);
        execv("/proc/self/exe", argv); /* returns only on failure: carry on as we are */
    }
}

static double g_gflops = 0;
static int g_gflops_threads = 0;

double ls_blas_sgemm_gflops(void) {
    int threads = ls_get_threads();
    if (g_gflops > 0 && g_gflops_threads == threads) return g_gflops;
    enum { N = 1024 };
    float *a = NULL, *b = NULL, *c = NULL;
    if (posix_memalign((void **)&a, LS_ALIGN, sizeof(float) * N * N) ||
        posix_memalign((void **)&b, LS_ALIGN, sizeof(float) * N * N) ||
        posix_memalign((void **)&c, LS_ALIGN, sizeof(float) * N * N)) {
        free(a), free(b), free(c);
        return 0;
    }
    for (size_t i = 0; i < (size_t)N * N; i++) {
        a[i] = (float)(i % 13) * 0.01f;
        b[i] = (float)(i % 7) * 0.02f;
    }
    double best = 0, spent = 0;
    /* one warm-up, then the best of up to 5 (stopping after 0.1 s) */
    for (int r = 0; r < 6 && (r < 3 || spent < 0.1); r++) {
        double t = ls_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, a, N, b, N, 0.0f, c, N);
        t = ls_now() - t;
        spent += t;
        double rate = 2.0 * N * N * (double)N / (t > 0 ? t : 1e-9) / 1e9;
        if (r > 0 && rate > best) best = rate;
    }
    free(a), free(b), free(c);
    g_gflops = best, g_gflops_threads = threads;
    return best;
}

void ls_blas_describe(char *out, size_t cap) {
    ls_blas_info b;
    ls_blas_info_get(&b);
    double gf = ls_blas_sgemm_gflops();
    int threads = ls_get_threads();
    char own[64] = "";
    if (strcmp(b.source, "longstraw") == 0 && b.blas_core[0])
        snprintf(own, sizeof own, " over the BLAS's %s", b.blas_core);
    snprintf(out, cap, "%s; %s kernels (chosen by %s%s; the CPU runs %s), sgemm %.0f GFLOP/s on %d thread%s",
             b.config, b.core, b.source, own, b.cpu_core[0] ? b.cpu_core : "no better than SSE", gf, threads,
             threads == 1 ? "" : "s");
}
