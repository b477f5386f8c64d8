/*
 * test_comm.c — the communicator (include/longstraw/comm.h) on any number of ranks:
 * `ls_tests comm_collectives` alone (one rank, MPI singleton or the one-rank build)
 * and under mpirun -np 1..4 (CTest comm_collectives_np*). Checks allreduce SUM/MAX
 * (f32, f64) against closed forms, allgather, bcast, a send/recv ring, a 3M-float
 * allreduce that is bit-identical on every rank, and the trace events.
 *
 * Every rank runs the same sequence of calls whatever fails (a rank that returned
 * early would leave the others waiting in a collective); failures are counted and
 * summed over the ranks at the end, so every rank fails together.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "longstraw/comm.h"
#include "longstraw/trace.h"
#include "testutil.h"

int test_comm_collectives(void);

/* Count a failure and go on; print the first 10 of each rank (a broken reduce fails
 * every element). */
#define C_CHECK(cond, ...)                                                                  \
    do {                                                                                    \
        if (!(cond) && fails++ < 10) {                                                      \
            fprintf(stderr, "  FAIL rank %d %s:%d: ", rank, __FILE__, __LINE__);            \
            fprintf(stderr, __VA_ARGS__);                                                   \
            fputc('\n', stderr);                                                            \
        }                                                                                   \
    } while (0)

#define C_OK(expr)                                                                          \
    do {                                                                                    \
        ls_status c_s_ = (expr);                                                            \
        C_CHECK(c_s_ == LS_OK, "%s -> %s: %s", #expr, ls_status_name(c_s_), ls_err_msg()); \
    } while (0)

static uint64_t fnv1a(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* Rank r's element i of the large allreduce: in (-1, 1) with all 24 bits in use, so
 * sums round and their order matters. Integer hash and one division: the same bits
 * whether the compiler vectorises the loop or not (a vectorised sinf is not). */
static float big_val(int64_t i, int r) {
    uint32_t h = (uint32_t)i * 2654435761u ^ (uint32_t)(r + 1) * 40503u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return (float)(int32_t)(h & 0xffffffu) / 8388609.0f - 1.0f;
}

int test_comm_collectives(void) {
    int rank = -1, fails = 0;
    int64_t compared = 0;
    ls_comm *w = NULL, *w2 = NULL;
    T_OK(ls_comm_init(NULL, NULL, &w));
    T_OK(ls_comm_init(NULL, NULL, &w2)); /* idempotent */
    T_CHECK(w != NULL && w2 == w && ls_comm_world() == w, "init: world %p, again %p, ls_comm_world %p", (void *)w,
            (void *)w2, (void *)ls_comm_world());
    rank = ls_comm_rank(w);
    const int size = ls_comm_size(w);
    T_CHECK(size >= 1 && rank >= 0 && rank < size, "rank %d of %d", rank, size);
    T_CHECK(ls_comm_have_mpi() || size == 1, "size %d without MPI", size);
    T_CHECK(ls_comm_have_mpi() == (LS_MPIEXEC[0] != '\0'), "have_mpi %d but LS_MPIEXEC \"%s\"",
            ls_comm_have_mpi(), LS_MPIEXEC);

    /* Trace events: each rank traces into its own temp file. */
    char dir[4096], trace[4200];
    ls_arenas ar;
    ls_arenas_init(&ar);
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    snprintf(trace, sizeof trace, "%s/trace.%d.jsonl", dir, rank);
    T_OK(ls_trace_open(trace, rank, &ar, "test_comm"));

    /* allreduce, odd length (not a multiple of anything) */
    const int64_t n = 1001;
    float *f = malloc((size_t)n * sizeof *f);
    double *d = malloc((size_t)n * sizeof *d);
    T_CHECK(f && d, "malloc");
    for (int64_t i = 0; i < n; i++) f[i] = (float)((rank + 1) * (i % 7 + 1));
    C_OK(ls_comm_allreduce_f32(w, f, n, LS_REDUCE_SUM));
    for (int64_t i = 0; i < n; i++, compared++) {
        float want = (float)(size * (size + 1) / 2 * (i % 7 + 1));
        C_CHECK(f[i] == want, "allreduce_f32 SUM [%lld] = %g, want %g", (long long)i, f[i], want);
    }
    for (int64_t i = 0; i < n; i++) f[i] = 0.5f * (float)((i + rank) % size) - (float)i;
    C_OK(ls_comm_allreduce_f32(w, f, n, LS_REDUCE_MAX));
    for (int64_t i = 0; i < n; i++, compared++) {
        float want = 0.5f * (float)(size - 1) - (float)i;
        C_CHECK(f[i] == want, "allreduce_f32 MAX [%lld] = %g, want %g", (long long)i, f[i], want);
    }
    for (int64_t i = 0; i < n; i++) d[i] = rank + 0.25 * (double)i;
    C_OK(ls_comm_allreduce_f64(w, d, n, LS_REDUCE_SUM));
    for (int64_t i = 0; i < n; i++, compared++) {
        double want = 0.25 * (double)i * size + size * (size - 1) / 2.0;
        C_CHECK(d[i] == want, "allreduce_f64 SUM [%lld] = %.17g, want %.17g", (long long)i, d[i], want);
    }
    for (int64_t i = 0; i < n; i++) d[i] = (i % size == rank) ? 1e300 : -(double)rank;
    C_OK(ls_comm_allreduce_f64(w, d, n, LS_REDUCE_MAX));
    for (int64_t i = 0; i < n; i++, compared++)
        C_CHECK(d[i] == 1e300, "allreduce_f64 MAX [%lld] = %g, want 1e300", (long long)i, d[i]);
    C_OK(ls_comm_allreduce_f32(w, f, 0, LS_REDUCE_SUM)); /* empty is fine */

    /* allgather of an odd-sized block */
    enum { GB = 13 };
    unsigned char gs[GB], *gr = malloc((size_t)GB * (size_t)size);
    T_CHECK(gr, "malloc");
    for (int j = 0; j < GB; j++) gs[j] = (unsigned char)(rank * 31 + j);
    memset(gr, 0xAA, (size_t)GB * (size_t)size);
    C_OK(ls_comm_allgather(w, gs, gr, GB));
    for (int r = 0; r < size; r++)
        for (int j = 0; j < GB; j++, compared++)
            C_CHECK(gr[r * GB + j] == (unsigned char)(r * 31 + j), "allgather [%d][%d] = %d", r, j, gr[r * GB + j]);

    /* bcast from the last rank and from rank 0 */
    for (int k = 0; k < 2; k++) {
        int root = k == 0 ? size - 1 : 0;
        unsigned char b[37];
        for (int j = 0; j < 37; j++) b[j] = rank == root ? (unsigned char)(7 * j + root) : 0xAA;
        C_OK(ls_comm_bcast(w, b, sizeof b, root));
        for (int j = 0; j < 37; j++, compared++)
            C_CHECK(b[j] == (unsigned char)(7 * j + root), "bcast root %d [%d] = %d", root, j, b[j]);
    }

    /* send/recv ring: larger than an eager message; even ranks send first */
    if (size > 1) {
        enum { RN = 1 << 16 };
        double *out = malloc(RN * sizeof *out), *in = malloc(RN * sizeof *in);
        T_CHECK(out && in, "malloc");
        int next = (rank + 1) % size, prev = (rank + size - 1) % size;
        for (int i = 0; i < RN; i++) out[i] = rank * 1e6 + i;
        if (rank % 2 == 0) {
            C_OK(ls_comm_send(w, out, RN * sizeof *out, next, 5));
            C_OK(ls_comm_recv(w, in, RN * sizeof *in, prev, 5));
        } else {
            C_OK(ls_comm_recv(w, in, RN * sizeof *in, prev, 5));
            C_OK(ls_comm_send(w, out, RN * sizeof *out, next, 5));
        }
        for (int i = 0; i < RN; i++, compared++)
            C_CHECK(in[i] == prev * 1e6 + i, "ring [%d] = %g from rank %d", i, in[i], prev);
        free(out);
        free(in);
    }
    C_OK(ls_comm_barrier(w));

    /* 3M floats with inexact sums: close to the closed form and bit-identical on every rank */
    const int64_t big = 3000001;
    float *g = malloc((size_t)big * sizeof *g);
    T_CHECK(g, "malloc");
    for (int64_t i = 0; i < big; i++) g[i] = big_val(i, rank);
    C_OK(ls_comm_allreduce_f32(w, g, big, LS_REDUCE_SUM));
    double worst = 0;
    for (int64_t i = 0; i < big; i++, compared++) {
        double want = 0;
        for (int r = 0; r < size; r++) want += (double)big_val(i, r);
        double err = fabs((double)g[i] - want);
        if (!(err <= worst)) worst = err; /* NaN sticks */
    }
    C_CHECK(worst <= 1e-6 * size && t_all_finite_f(g, big), "3M allreduce: max |err| %g", worst);
    uint64_t h = fnv1a(g, (size_t)big * sizeof *g), *hs = malloc((size_t)size * sizeof *hs);
    T_CHECK(hs, "malloc");
    C_OK(ls_comm_allgather(w, &h, hs, sizeof h));
    for (int r = 0; r < size; r++, compared++)
        C_CHECK(hs[r] == h, "3M allreduce: rank %d hash %016llx, mine %016llx", r, (unsigned long long)hs[r],
                (unsigned long long)h);

    /* the trace has one collective event per call */
    ls_trace_close();
    FILE *tf = fopen(trace, "r");
    C_CHECK(tf != NULL, "cannot read %s", trace);
    int events = 0, reduces = 0;
    char line[1024];
    while (tf && fgets(line, sizeof line, tf)) {
        if (!strstr(line, "\"ev\": \"collective\"")) continue;
        events++;
        if (strstr(line, "\"kind\": \"allreduce_f32\"") && strstr(line, "\"bytes\": 12000004")) reduces++;
    }
    if (tf) fclose(tf);
    int want_events = 5 + 2 + 2 + 1 + 1 + (size > 1 ? 2 : 0); /* allreduce ×5, allgather ×2, bcast ×2, barrier, 3M; ring */
    C_CHECK(events == want_events && reduces == 1, "trace: %d collective events (want %d), %d of the 3M allreduce",
            events, want_events, reduces);
    unlink(trace);
    rmdir(dir);

    /* every rank fails if any did */
    double total = fails;
    C_OK(ls_comm_allreduce_f64(w, &total, 1, LS_REDUCE_SUM));
    free(f);
    free(d);
    free(gr);
    free(g);
    free(hs);
    ls_arenas_free(&ar);
    T_CHECK(compared > 0, "nothing compared");
    T_CHECK(fails == 0 && total == 0, "%d failures here, %g over all ranks", fails, total);
    return 0;
}
