/*
 * comm.c — the communicator (include/longstraw/comm.h, DESIGN §5, §8). The one
 * file that names MPI: built with LS_HAVE_MPI it wraps a dup of MPI_COMM_WORLD
 * (OpenMPI, MPI_THREAD_FUNNELED); without it, a world of one rank where every
 * collective is the identity.
 *
 * Every collective and point-to-point call records one trace event
 *   {"ev": "collective", "kind": "allreduce_f32", "bytes": B, "seconds": S}
 * when tracing is on (bytes = this rank's payload: the buffer for allreduce and
 * bcast, the send block for allgather, the message for send/recv, 0 for barrier);
 * when it is off the clock is not read.
 *
 * MPI counts are `int`; payloads larger than LS_COMM_PIECE bytes go in pieces, so
 * n may exceed INT_MAX elements.
 */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "longstraw/comm.h"
#include "longstraw/trace.h"

#ifdef LS_HAVE_MPI
#include <mpi.h>
#endif

/* Largest piece one MPI call moves (bytes): well under INT_MAX elements of any type. */
#define LS_COMM_PIECE ((size_t)1 << 30)
/* The smallest MPI_TAG_UB the standard allows; larger tags are not portable. */
#define LS_COMM_TAG_MAX 32767

struct ls_comm {
    int rank, size;
#ifdef LS_HAVE_MPI
    MPI_Comm mc; /* dup of MPI_COMM_WORLD, MPI_ERRORS_RETURN */
#endif
};

static ls_comm g_world;
static int g_have_world; /* ls_comm_init succeeded and ls_comm_finalize has not run */
#ifdef LS_HAVE_MPI
static int g_started; /* ls_comm_init called MPI_Init_thread (else the host did: it finalizes) */
#endif

/* ---- tracing ------------------------------------------------------------------- */

/* Start time of a call, or 0 when tracing is off (then the clock is not read). */
static double trace_begin(void) { return ls_trace_on() ? ls_now() : 0.0; }

static void trace_end(const char *kind, size_t bytes, double t0) {
    if (!ls_trace_on()) return;
    ls_trace_event("collective", "\"kind\": \"%s\", \"bytes\": %zu, \"seconds\": %.6f", kind, bytes,
                   ls_now() - t0);
}

#ifdef LS_HAVE_MPI
/* ---- MPI build ----------------------------------------------------------------- */

static int g_finalized; /* ls_comm_finalize ran: MPI cannot start again */

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* LS_ERR_IO naming the MPI call and MPI's own message for `rc`. */
static ls_status mpi_fail(const char *what, const char *call, int rc) {
    char msg[MPI_MAX_ERROR_STRING + 1];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) len = 0;
    msg[len] = '\0';
    return ls_err(LS_ERR_IO, "%s: %s failed: %s", what, call, len ? msg : "unknown MPI error");
}

ls_status ls_comm_init(int *argc, char ***argv, ls_comm **world) {
    if (g_have_world) {
        if (world) *world = &g_world;
        return LS_OK;
    }
    if (world) *world = NULL;
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (fin || g_finalized)
        return ls_err(LS_ERR_UNSUPPORTED, "ls_comm_init: MPI was already finalized in this process");
    if (!inited) {
        g_started = 1;
        int provided = MPI_THREAD_SINGLE;
        /* MPI_Init_thread's errors are fatal (no communicator has an error handler yet). */
        int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) return mpi_fail("ls_comm_init", "MPI_Init_thread", rc);
        if (provided < MPI_THREAD_FUNNELED)
            return ls_err(LS_ERR_UNSUPPORTED,
                          "ls_comm_init: MPI provides thread level %d, need MPI_THREAD_FUNNELED (%d)", provided,
                          MPI_THREAD_FUNNELED);
    } else {
        /* Someone else started MPI: their thread level must still allow OpenMP threads. */
        int provided = MPI_THREAD_SINGLE;
        MPI_Query_thread(&provided);
        if (provided < MPI_THREAD_FUNNELED)
            return ls_err(LS_ERR_UNSUPPORTED,
                          "ls_comm_init: MPI was initialised with thread level %d, need MPI_THREAD_FUNNELED (%d)",
                          provided, MPI_THREAD_FUNNELED);
    }
    MPI_Comm mc;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &mc);
    if (rc != MPI_SUCCESS) return mpi_fail("ls_comm_init", "MPI_Comm_dup", rc);
    rc = MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(mc, &g_world.rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(mc, &g_world.size);
    if (rc != MPI_SUCCESS) {
        MPI_Comm_free(&mc);
        return mpi_fail("ls_comm_init", "MPI_Comm_set_errhandler/rank/size", rc);
    }
    g_world.mc = mc;
    g_have_world = 1;
    ls_set_log_rank(g_world.rank);
    if (world) *world = &g_world;
    return LS_OK;
}

/* Finalizes MPI only when ls_comm_init started the world; a no-op otherwise. */
void ls_comm_finalize(void) {
    if (!g_have_world) return;
    g_have_world = 0;
    g_finalized = 1;
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) return;
    MPI_Comm_free(&g_world.mc);
    if (g_started) MPI_Finalize(); /* a host's MPI (mpi4py) stays the host's to end */
}

int ls_comm_have_mpi(void) { return 1; }

ls_status ls_comm_split(const ls_comm *c, int color, int key, ls_comm **out) {
    *out = NULL;
    ls_comm *n = calloc(1, sizeof *n);
    if (!n) return ls_err(LS_ERR_NOMEM, "ls_comm_split: out of memory");
    int rc = MPI_Comm_split(c->mc, color, key, &n->mc);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(n->mc, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(n->mc, &n->rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(n->mc, &n->size);
    if (rc != MPI_SUCCESS) {
        free(n);
        return mpi_fail("ls_comm_split", "MPI_Comm_split", rc);
    }
    *out = n;
    return LS_OK;
}

void ls_comm_free(ls_comm *c) {
    if (!c || c == &g_world) return;
    MPI_Comm_free(&c->mc);
    free(c);
}


/* Reduce to rank 0 then broadcast: every rank gets rank 0's bits, whatever
 * algorithm (and summation order) MPI picks for each rank. */
static ls_status allreduce(const ls_comm *c, void *buf, int64_t n, MPI_Datatype type, size_t esize,
                           ls_reduce_op op, const char *kind) {
    LS_ASSERT(c != NULL && n >= 0 && (buf != NULL || n == 0), "%s: c %p buf %p n %lld", kind, (const void *)c,
              buf, (long long)n);
    LS_ASSERT(op == LS_REDUCE_SUM || op == LS_REDUCE_MAX, "%s: op %d", kind, (int)op);
    double t0 = trace_begin();
    MPI_Op mop = op == LS_REDUCE_SUM ? MPI_SUM : MPI_MAX;
    size_t piece = LS_COMM_PIECE / esize;
    char *p = buf;
    for (size_t left = (size_t)n; left > 0;) {
        size_t k = min_size(left, piece);
        int rc = c->rank == 0 ? MPI_Reduce(MPI_IN_PLACE, p, (int)k, type, mop, 0, c->mc)
                              : MPI_Reduce(p, NULL, (int)k, type, mop, 0, c->mc);
        if (rc != MPI_SUCCESS) return mpi_fail(kind, "MPI_Reduce", rc);
        rc = MPI_Bcast(p, (int)k, type, 0, c->mc);
        if (rc != MPI_SUCCESS) return mpi_fail(kind, "MPI_Bcast", rc);
        p += k * esize;
        left -= k;
    }
    trace_end(kind, (size_t)n * esize, t0);
    return LS_OK;
}

ls_status ls_comm_allreduce_f32(const ls_comm *c, float *buf, int64_t n, ls_reduce_op op) {
    return allreduce(c, buf, n, MPI_FLOAT, sizeof(float), op, "allreduce_f32");
}

ls_status ls_comm_allreduce_f64(const ls_comm *c, double *buf, int64_t n, ls_reduce_op op) {
    return allreduce(c, buf, n, MPI_DOUBLE, sizeof(double), op, "allreduce_f64");
}

ls_status ls_comm_alltoallv(const ls_comm *c, const void *send, const size_t *send_bytes, void *recv,
                            const size_t *recv_bytes) {
    LS_ASSERT(c != NULL && send_bytes && recv_bytes, "alltoallv: c %p", (const void *)c);
    int N = c->size;
    int *sc = malloc((size_t)N * 4 * sizeof(int)), *sd = sc ? sc + N : NULL, *rc_ = sc ? sc + 2 * N : NULL,
        *rd = sc ? sc + 3 * N : NULL;
    if (!sc) return ls_err(LS_ERR_NOMEM, "alltoallv: counts of %d ranks", N);
    size_t so = 0, ro = 0;
    for (int r = 0; r < N; r++) {
        if (send_bytes[r] > INT_MAX || recv_bytes[r] > INT_MAX || so > INT_MAX || ro > INT_MAX) {
            free(sc);
            return ls_err(LS_ERR_UNSUPPORTED, "alltoallv: %zu / %zu bytes for rank %d (over 2 GiB in one message)",
                          send_bytes[r], recv_bytes[r], r);
        }
        sc[r] = (int)send_bytes[r], sd[r] = (int)so, rc_[r] = (int)recv_bytes[r], rd[r] = (int)ro;
        so += send_bytes[r], ro += recv_bytes[r];
    }
    if (so > INT_MAX || ro > INT_MAX) {
        free(sc);
        return ls_err(LS_ERR_UNSUPPORTED, "alltoallv: %zu / %zu bytes in all (over 2 GiB)", so, ro);
    }
    double t0 = trace_begin();
    int rc = MPI_Alltoallv(send, sc, sd, MPI_BYTE, recv, rc_, rd, MPI_BYTE, c->mc);
    free(sc);
    if (rc != MPI_SUCCESS) return mpi_fail("alltoallv", "MPI_Alltoallv", rc);
    trace_end("alltoallv", so, t0);
    return LS_OK;
}

ls_status ls_comm_allgather(const ls_comm *c, const void *send, void *recv, size_t bytes) {
    LS_ASSERT(c != NULL && ((send && recv) || bytes == 0), "allgather: c %p send %p recv %p", (const void *)c,
              send, recv);
    LS_ASSERT(bytes == 0 || (uintptr_t)send + bytes <= (uintptr_t)recv ||
                  (uintptr_t)recv + bytes * (size_t)c->size <= (uintptr_t)send,
              "allgather: send and recv overlap");
    double t0 = trace_begin();
    if (bytes <= LS_COMM_PIECE) {
        int rc = MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, c->mc);
        if (rc != MPI_SUCCESS) return mpi_fail("allgather", "MPI_Allgather", rc);
    } else {
        /* Piece [o, o+k) of every rank's block: one `k`-byte block per rank, blocks
         * `bytes` apart in recv (a resized type: displacements would overflow int). */
        for (size_t o = 0; o < bytes;) {
            size_t k = min_size(bytes - o, LS_COMM_PIECE);
            MPI_Datatype blk, strided;
            int rc = MPI_Type_contiguous((int)k, MPI_BYTE, &blk);
            if (rc != MPI_SUCCESS) return mpi_fail("allgather", "MPI_Type_contiguous", rc);
            rc = MPI_Type_create_resized(blk, 0, (MPI_Aint)bytes, &strided);
            MPI_Type_free(&blk);
            if (rc != MPI_SUCCESS) return mpi_fail("allgather", "MPI_Type_create_resized", rc);
            rc = MPI_Type_commit(&strided);
            if (rc == MPI_SUCCESS)
                rc = MPI_Allgather((const char *)send + o, (int)k, MPI_BYTE, (char *)recv + o, 1, strided, c->mc);
            MPI_Type_free(&strided);
            if (rc != MPI_SUCCESS) return mpi_fail("allgather", "MPI_Allgather", rc);
            o += k;
        }
    }
    trace_end("allgather", bytes, t0);
    return LS_OK;
}

static void check_peer(const ls_comm *c, const void *buf, size_t bytes, int peer, int tag, const char *what) {
    LS_ASSERT(c != NULL && (buf != NULL || bytes == 0), "%s: c %p buf %p", what, (const void *)c, buf);
    LS_ASSERT(peer >= 0 && peer < c->size && peer != c->rank, "%s: peer %d (rank %d of %d)", what, peer, c->rank,
              c->size);
    LS_ASSERT(tag >= 0 && tag <= LS_COMM_TAG_MAX, "%s: tag %d outside [0, %d]", what, tag, LS_COMM_TAG_MAX);
}

/* Pieces of one message keep their order: MPI does not overtake between one pair
 * on one tag and communicator. */
ls_status ls_comm_send(const ls_comm *c, const void *buf, size_t bytes, int dst, int tag) {
    check_peer(c, buf, bytes, dst, tag, "send");
    double t0 = trace_begin();
    size_t o = 0;
    do {
        size_t k = min_size(bytes - o, LS_COMM_PIECE);
        int rc = MPI_Send((const char *)buf + o, (int)k, MPI_BYTE, dst, tag, c->mc);
        if (rc != MPI_SUCCESS) return mpi_fail("send", "MPI_Send", rc);
        o += k;
    } while (o < bytes);
    trace_end("send", bytes, t0);
    return LS_OK;
}

ls_status ls_comm_recv(const ls_comm *c, void *buf, size_t bytes, int src, int tag) {
    check_peer(c, buf, bytes, src, tag, "recv");
    double t0 = trace_begin();
    size_t o = 0;
    do {
        size_t k = min_size(bytes - o, LS_COMM_PIECE);
        MPI_Status st;
        int rc = MPI_Recv((char *)buf + o, (int)k, MPI_BYTE, src, tag, c->mc, &st);
        if (rc != MPI_SUCCESS) return mpi_fail("recv", "MPI_Recv", rc);
        int got = 0;
        MPI_Get_count(&st, MPI_BYTE, &got);
        if (got < 0 || (size_t)got != k)
            return ls_err(LS_ERR_IO, "recv: rank %d sent %d bytes with tag %d, expected %zu (of a %zu-byte message)",
                          src, got, tag, k, bytes);
        o += k;
    } while (o < bytes);
    trace_end("recv", bytes, t0);
    return LS_OK;
}

ls_status ls_comm_bcast(const ls_comm *c, void *buf, size_t bytes, int root) {
    LS_ASSERT(c != NULL && (buf != NULL || bytes == 0), "bcast: c %p buf %p", (const void *)c, buf);
    LS_ASSERT(root >= 0 && root < c->size, "bcast: root %d of %d ranks", root, c->size);
    double t0 = trace_begin();
    for (size_t o = 0; o < bytes;) {
        size_t k = min_size(bytes - o, LS_COMM_PIECE);
        int rc = MPI_Bcast((char *)buf + o, (int)k, MPI_BYTE, root, c->mc);
        if (rc != MPI_SUCCESS) return mpi_fail("bcast", "MPI_Bcast", rc);
        o += k;
    }
    trace_end("bcast", bytes, t0);
    return LS_OK;
}

ls_status ls_comm_barrier(const ls_comm *c) {
    LS_ASSERT(c != NULL, "barrier: NULL communicator");
    double t0 = trace_begin();
    int rc = MPI_Barrier(c->mc);
    if (rc != MPI_SUCCESS) return mpi_fail("barrier", "MPI_Barrier", rc);
    trace_end("barrier", 0, t0);
    return LS_OK;
}

void ls_comm_abort(const ls_comm *c, int code) {
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (inited && !fin) MPI_Abort(c ? c->mc : MPI_COMM_WORLD, code);
    /* MPI_Abort returned, or MPI is not running: this process alone ends. */
    exit(code);
}

#else
/* ---- one-rank build ------------------------------------------------------------ */

/* A launcher's world size (Open MPI, PMIx or PMI), 0 when none says. */
static long launcher_size(void) {
    const char *v[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"};
    for (int i = 0; i < 3; i++)
        if (getenv(v[i]) && atol(getenv(v[i])) > 0) return atol(getenv(v[i]));
    return 0;
}

ls_status ls_comm_init(int *argc, char ***argv, ls_comm **world) {
    (void)argc, (void)argv;
    long n = launcher_size();
    if (n > 1) /* N copies that each think they are alone would each write every output */
        return ls_err(LS_ERR_UNSUPPORTED, "this longstraw was built without MPI, but mpirun started it as one of %ld "
                                          "ranks: each would run alone; rebuild it with MPI (cmake finds OpenMPI: "
                                          "scripts/install-deps.sh) or run it without mpirun", n);
    g_world.rank = 0;
    g_world.size = 1;
    g_have_world = 1;
    if (world) *world = &g_world;
    return LS_OK;
}

void ls_comm_finalize(void) { g_have_world = 0; }

int ls_comm_have_mpi(void) { return 0; }

ls_status ls_comm_split(const ls_comm *c, int color, int key, ls_comm **out) {
    (void)color, (void)key;
    *out = calloc(1, sizeof **out);
    if (!*out) return ls_err(LS_ERR_NOMEM, "ls_comm_split: out of memory");
    **out = *c;
    return LS_OK;
}

void ls_comm_free(ls_comm *c) {
    if (c && c != &g_world) free(c);
}


static ls_status identity(const ls_comm *c, const void *buf, size_t bytes, const char *kind) {
    LS_ASSERT(c != NULL && (buf != NULL || bytes == 0), "%s: c %p buf %p", kind, (const void *)c, buf);
    double t0 = trace_begin();
    trace_end(kind, bytes, t0);
    return LS_OK;
}

ls_status ls_comm_allreduce_f32(const ls_comm *c, float *buf, int64_t n, ls_reduce_op op) {
    LS_ASSERT(n >= 0 && (op == LS_REDUCE_SUM || op == LS_REDUCE_MAX), "allreduce_f32: n %lld op %d", (long long)n,
              (int)op);
    return identity(c, buf, (size_t)n * sizeof(float), "allreduce_f32");
}

ls_status ls_comm_allreduce_f64(const ls_comm *c, double *buf, int64_t n, ls_reduce_op op) {
    LS_ASSERT(n >= 0 && (op == LS_REDUCE_SUM || op == LS_REDUCE_MAX), "allreduce_f64: n %lld op %d", (long long)n,
              (int)op);
    return identity(c, buf, (size_t)n * sizeof(double), "allreduce_f64");
}

ls_status ls_comm_alltoallv(const ls_comm *c, const void *send, const size_t *send_bytes, void *recv,
                            const size_t *recv_bytes) {
    LS_ASSERT(c != NULL && send_bytes && recv_bytes && send_bytes[0] == recv_bytes[0], "alltoallv: one rank");
    double t0 = trace_begin();
    if (send_bytes[0] && send != recv) memmove(recv, send, send_bytes[0]);
    trace_end("alltoallv", send_bytes[0], t0);
    return LS_OK;
}

ls_status ls_comm_allgather(const ls_comm *c, const void *send, void *recv, size_t bytes) {
    LS_ASSERT(c != NULL && ((send && recv) || bytes == 0), "allgather: c %p send %p recv %p", (const void *)c,
              send, recv);
    double t0 = trace_begin();
    if (bytes && send != recv) memmove(recv, send, bytes);
    trace_end("allgather", bytes, t0);
    return LS_OK;
}

ls_status ls_comm_send(const ls_comm *c, const void *buf, size_t bytes, int dst, int tag) {
    LS_ASSERT(0, "send to rank %d: a one-rank build has no peer", dst);
    return LS_ERR_UNSUPPORTED;
}

ls_status ls_comm_recv(const ls_comm *c, void *buf, size_t bytes, int src, int tag) {
    LS_ASSERT(0, "recv from rank %d: a one-rank build has no peer", src);
    return LS_ERR_UNSUPPORTED;
}

ls_status ls_comm_bcast(const ls_comm *c, void *buf, size_t bytes, int root) {
    LS_ASSERT(root == 0, "bcast: root %d of 1 rank", root);
    return identity(c, buf, bytes, "bcast");
}

ls_status ls_comm_barrier(const ls_comm *c) { return identity(c, NULL, 0, "barrier"); }

/* The API's contract (comm.h): abort ends the run; with one rank that is exit. */
void ls_comm_abort(const ls_comm *c, int code) { exit(code); }
#endif

ls_comm *ls_comm_world(void) { return g_have_world ? &g_world : NULL; }

int ls_comm_rank(const ls_comm *c) {
    LS_ASSERT(c != NULL, "ls_comm_rank: NULL communicator");
    return c->rank;
}

int ls_comm_size(const ls_comm *c) {
    LS_ASSERT(c != NULL, "ls_comm_size: NULL communicator");
    return c->size;
}

ls_status ls_comm_parallel(const ls_comm *world, int64_t ep, ls_comm **cp, ls_comm **ep_group) {
    *cp = *ep_group = NULL;
    int W = world ? ls_comm_size(world) : 1, r = world ? ls_comm_rank(world) : 0;
    if (ep < 2 || W % ep != 0)
        return ls_err(LS_ERR_ARG, "--ep %lld: the run has %d rank%s, not a multiple of it (ranks = CP x EP)",
                      (long long)ep, W, W == 1 ? "" : "s");
    LS_TRY(ls_comm_split(world, r % (int)ep, r, cp)); /* same experts: one CP group */
    ls_status s = ls_comm_split(world, r / (int)ep, r, ep_group); /* same pages: one EP group */
    if (s != LS_OK) {
        ls_comm_free(*cp);
        *cp = NULL;
    }
    return s;
}
