/*
 * comm.h — the communicator (DESIGN §5, §8): what the transaction needs from the
 * ranks of a run and nothing more. Two builds share this API: MPI (OpenMPI; the
 * world is every process mpirun started) and a one-rank build without MPI, where
 * every collective is the identity and point-to-point calls are programmer errors.
 * MPI is named only in src/dist/.
 *
 * Every call is collective over the communicator unless it says otherwise, and is
 * made from the main thread only. Every call records one trace event
 * ("collective": kind, bytes, seconds) when tracing is on. A failed MPI call returns
 * LS_ERR_IO with a message naming the operation; the caller decides whether to abort.
 */
#ifndef LONGSTRAW_COMM_H
#define LONGSTRAW_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "longstraw/core.h"

typedef struct ls_comm ls_comm;

typedef enum { LS_REDUCE_SUM = 0, LS_REDUCE_MAX } ls_reduce_op;

/* Start the world (MPI_Init_thread, funneled) once per process, before anything
 * else touches the communicator; the one-rank build returns a world of size 1.
 * Idempotent: a second call returns the same world. */
ls_status ls_comm_init(int *argc, char ***argv, ls_comm **world);
/* The world started by ls_comm_init (NULL before). */
ls_comm *ls_comm_world(void);
/* Finalize (MPI_Finalize); safe to call when never initialised. */
void ls_comm_finalize(void);
/* 1 when this build has MPI. */
int ls_comm_have_mpi(void);

int ls_comm_rank(const ls_comm *c);
int ls_comm_size(const ls_comm *c);

/* In place, element-wise over ranks; every rank ends with the same bits (the
 * reduction is done once and broadcast, whatever MPI's algorithm). n may exceed
 * INT_MAX (split into pieces). */
ls_status ls_comm_allreduce_f32(const ls_comm *c, float *buf, int64_t n, ls_reduce_op op);
ls_status ls_comm_allreduce_f64(const ls_comm *c, double *buf, int64_t n, ls_reduce_op op);
/* recv[r·bytes .. (r+1)·bytes) = rank r's send[0..bytes). */
ls_status ls_comm_allgather(const ls_comm *c, const void *send, void *recv, size_t bytes);
/* Every rank sends send_bytes[r] bytes to rank r (the blocks of `send` in rank order) and
 * receives recv_bytes[r] from rank r (into `recv` in rank order); the counts must match
 * pairwise. Each message under 2 GiB. */
ls_status ls_comm_alltoallv(const ls_comm *c, const void *send, const size_t *send_bytes, void *recv,
                            const size_t *recv_bytes);
/* Point to point (not collective): blocking send / receive of exactly `bytes`. */
ls_status ls_comm_send(const ls_comm *c, const void *buf, size_t bytes, int dst, int tag);
ls_status ls_comm_recv(const ls_comm *c, void *buf, size_t bytes, int src, int tag);
ls_status ls_comm_bcast(const ls_comm *c, void *buf, size_t bytes, int root);
ls_status ls_comm_barrier(const ls_comm *c);
/* A new communicator of the ranks of c that pass the same `color`, ordered by `key`
 * (MPI_Comm_split); freed with ls_comm_free (the world is never freed). */
ls_status ls_comm_split(const ls_comm *c, int color, int key, ls_comm **out);
void ls_comm_free(ls_comm *c);
/* The ranks of `world` (NULL: one) as CP × EP for an expert-parallel degree ep ≥ 2:
 * ranks r with the same r mod ep share the experts' shards' layout (one CP group, *cp),
 * ranks with the same r / ep share the pages (one EP group, *ep_group). Collective over
 * world. LS_ERR_ARG naming --ep when the rank count is not a multiple of ep. Both new
 * (ls_comm_free them). */
ls_status ls_comm_parallel(const ls_comm *world, int64_t ep, ls_comm **cp, ls_comm **ep_group);
/* End every rank of the run with `code` (MPI_Abort); the one-rank build exits. */
void ls_comm_abort(const ls_comm *c, int code) __attribute__((noreturn));

#endif
