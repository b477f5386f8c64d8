/*
 * files.h — how the tool opens what a user names (issue 18 §3): input files that may
 * turn out to be a FIFO or a directory, files of a run directory written in place (the
 * lock, the trace, metrics.jsonl) that may be a planted symbolic link, a content digest
 * of inputs, the check that every rank of a run was given the same command and the same
 * files, and a JSON number that is never NaN or Inf.
 */
#ifndef LONGSTRAW_FILES_H
#define LONGSTRAW_FILES_H

#include <stdint.h>
#include <stdio.h>

#include "longstraw/comm.h"
#include "longstraw/core.h"

/* Open an input file for reading (O_RDONLY|O_CLOEXEC; *fd on LS_OK). Only a regular
 * file is read (a symbolic link to one counts): a FIFO, directory, device or socket is
 * refused with LS_ERR_ARG naming the path and what it is, without ever blocking (stat
 * first, then open O_NONBLOCK and fstat the descriptor, which is what is read). */
ls_status ls_open_input(const char *path, int *fd);
/* The same as a stdio stream ("rb"). */
ls_status ls_open_input_stream(const char *path, FILE **f);

/* Open a file of a run directory that is written in place (RUN/.lock, RUN/trace.<r>.jsonl,
 * RUN/metrics.jsonl): created 0644 when missing; `flags` is O_RDWR or O_WRONLY|O_APPEND
 * (O_CREAT, O_CLOEXEC, O_NOFOLLOW and O_NONBLOCK are added; O_NONBLOCK is cleared again
 * on the descriptor). A symbolic link there is refused, not followed (the file it points
 * to, outside the run, would be written), as is a FIFO, directory, device or socket:
 * LS_ERR_ARG naming the path and what it is. *fd on LS_OK. */
ls_status ls_open_in_place(const char *path, int flags, int *fd);

/* A 64-bit digest of a file's content and its size, to tell whether two ranks read the
 * same file (not a cryptographic hash). Files up to 64 MiB are hashed whole; a larger
 * one (a multi-GB checkpoint) by its size, its first MiB (the safetensors header and
 * the first tensors) and 256 blocks of 64 KiB spread evenly over the rest, so two such
 * files that differ only between those blocks digest the same. Read through
 * ls_open_input (never blocks on a FIFO). */
ls_status ls_file_digest(const char *path, uint64_t *digest, int64_t *size);

/* The names of dir's entries for which keep(name) is nonzero, sorted (strcmp), as a
 * malloc'd array of malloc'd strings (*n of them; ls_dir_names_free frees). LS_ERR_IO
 * when dir cannot be listed, LS_ERR_NOMEM. */
ls_status ls_dir_names(const char *dir, int (*keep)(const char *name), char ***names, size_t *n);
void ls_dir_names_free(char **names, size_t n);

/* Before the first collective of a command: do all ranks of `c` run the same command on
 * the same inputs? Compared with rank 0's: the program itself (digest of
 * /proc/self/exe), argv[1..argc) element by element, and each of `paths` (NULL entries
 * skipped) by ls_file_digest — a directory by each of its *.json and *.safetensors
 * files. Collective over c (an allgather of 16 bytes when all agree; on a difference
 * rank 0's description is broadcast and each rank's finding gathered). LS_ERR_ARG on
 * every rank when any differs, naming the first rank that differs and what: the
 * argument (its position, both values, the flag before it) or the file (both sizes
 * and digests). LS_OK at once when c is NULL or has one rank. */
ls_status ls_check_same_inputs(const ls_comm *c, int argc, char *const *argv, const char *const *paths, int n_paths);

/* A JSON number: "%.9g" of v (or the given printf format), or "null" when v is NaN or
 * ±Inf, which JSON cannot represent. Returns what fprintf returns. */
int ls_json_number(FILE *f, const char *fmt, double v);
/* A JSON string literal of s (escaped; "null" when out of memory). */
void ls_json_string(FILE *f, const char *s);

#endif
