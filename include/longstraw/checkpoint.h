/*
 * checkpoint.h — training checkpoints that a crash cannot leave half written.
 *
 * RUN/checkpoint-<U>/ holds the state after U updates: the weights (model.safetensors
 * + config.json, or adapter_model.safetensors + adapter_config.json with LoRA), the
 * optimizer moments (optimizer.safetensors) and trainer_state.json (data position,
 * RNG, counters; written last). It is built in RUN/.checkpoint-<U>.tmp/ — every file
 * written atomically (temp + fsync + rename) — and committed by renaming the
 * directory, then fsyncing RUN/. A directory named checkpoint-<U> is therefore
 * complete; a killed writer leaves only a .tmp directory, which the next run removes.
 * Deleting one (pruning, or replacing it) first renames it to .checkpoint-<U>.del, so a
 * directory named checkpoint-<U> is never partly deleted either.
 */
#ifndef LONGSTRAW_CHECKPOINT_H
#define LONGSTRAW_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "longstraw/core.h"
#include "longstraw/family.h"

/* Create (emptying a stale one) RUN/.checkpoint-<U>.tmp; its path in tmp[n]. */
ls_status ls_ckpt_begin(const char *run, int64_t update, char *tmp, size_t n);
/* Commit tmp as RUN/checkpoint-<U> (replacing an existing one); its path in dir[n]. */
ls_status ls_ckpt_commit(const char *run, int64_t update, const char *tmp, char *dir, size_t n);
/* The most updates a run holds (the bound of --updates); a checkpoint-<U> beyond it is
 * refused, never read as a clamped number. */
#define LS_CKPT_MAX_UPDATE (INT64_MAX / 4)

/* The newest committed checkpoint: *update = −1 when there is none. Stale .tmp
 * directories are removed. A directory named checkpoint-<digits> whose number is out
 * of range or not written as this tool writes it (checkpoint-007) is an error naming
 * it; other names (checkpoint-best) are not checkpoints and are left alone. */
ls_status ls_ckpt_latest(const char *run, int64_t *update, char *dir, size_t n);
/* Remove committed checkpoints older than the newest `keep` (keep >= 1). */
ls_status ls_ckpt_prune(const char *run, int keep);

/* Optimizer moments of the trainable tensors (parallel lists, ls_grpo's order) and
 * the step count, as optimizer.safetensors: exp_avg.<k>, exp_avg_sq.<k> (f32, 1-D), or
 * with by_name exp_avg.<m[k].what> (LoRA: PEFT tensor names, so the moments find their
 * adapters whatever order a loader keeps). Loading checks the tensor count and every
 * size against the lists, and every value: non-finite moments or a negative exp_avg_sq
 * are an error naming the file, tensor, element and value.
 * Expert parallelism (`sharded` non-NULL and `ep` of several ranks; sharded[k] = 1 for
 * this rank's share of split tensors): saving is collective over ep — rank 0 gathers
 * every rank's shards and writes one file of the whole set by name (the ranks given no
 * path only take part when rank 0 has one); loading, every rank reads its own tensors
 * by name.
 * The moments are backend `be`'s memory (staged through host copies on a device). */
ls_status ls_optim_save(const struct ls_backend *be, const char *path, const ls_param *m, const ls_param *v, int64_t n,
                        int64_t step, int by_name, const uint8_t *sharded, const struct ls_comm *ep);
ls_status ls_optim_load(const struct ls_backend *be, const char *path, const ls_param *m, const ls_param *v, int64_t n,
                        int64_t *step, int by_name, const uint8_t *sharded, const struct ls_comm *ep);

#endif
