/*
 * api.h — LongStraw's embeddable C API (liblongstraw.so), version LS_API_VERSION: what a host
 * process (the Python package in python/longstraw, any FFI) calls. Issue 23.
 *
 * Contract:
 *   - A context (ls_ctx) owns the thread count, the last error, the stop request, the
 *     trace and the progress reports: its calls run on its own runtime, so several
 *     contexts in one process do not see each other's (a context serves one thread at a
 *     time; different contexts may be used from different threads, but the BLAS thread
 *     count is process-wide: every call sets it from its context). Under a launcher
 *     (mpirun) the first context starts MPI when the host has not; CP then runs over the
 *     world (one per process, as MPI is). The library installs no signal handlers: a host
 *     asks a running call to stop with ls_ctx_request_stop.
 *   - Nothing is written to stdout or stderr: a failed call returns NULL / nonzero and
 *     ls_ctx_error names the file, field and value.
 *   - Flags are (name, value) string pairs named as the command line's flags without the
 *     dashes ("max-grad-norm" or "max_grad_norm"; flags.h), with the CLI's defaults; a
 *     switch takes "1"/"0".
 *   - A group is the group file's JSON text ({"prompt": [...], "responses": [[...], ...],
 *     "rewards": [...]}).
 *   - Results (ls_result) own their arrays: named f32 arrays and one JSON document.
 */
#ifndef LONGSTRAW_API_H
#define LONGSTRAW_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LS_API_VERSION 1

int ls_api_version(void); /* LS_API_VERSION of the library loaded */

typedef struct ls_ctx ls_ctx;
typedef struct ls_api_policy ls_api_policy;
typedef struct ls_result ls_result;

/* threads <= 0: all cores. NULL only when out of memory or MPI cannot start (message in
 * ls_api_last_error). */
ls_ctx *ls_ctx_new(int threads);
/* Close a context's policies first: their calls need it (ls_api_policy_close does not). */
void ls_ctx_free(ls_ctx *c);
const char *ls_ctx_error(const ls_ctx *c); /* the last failed call's message ("" if none) */
const char *ls_api_last_error(void);       /* for a failed ls_ctx_new */
int ls_ctx_rank(const ls_ctx *c);          /* 0 without MPI */
int ls_ctx_world_size(const ls_ctx *c);    /* 1 without MPI */
/* Ask the context's call in flight to stop at its next safe point (a training run: after
 * the update in flight, with a checkpoint, as the CLI does on SIGINT/SIGTERM; its result
 * has "stop_signal": sig; a capture: at its next chunk, the call failing with "stopped
 * by signal"). Async-signal-safe; from another thread, a signal handler or one of the
 * call's callbacks. Each call starts with no request (one made between calls is
 * dropped). sig <= 0 counts as 2. */
void ls_ctx_request_stop(ls_ctx *c, int sig);
/* Progress reports of the context's long calls (capture, scoring, evaluation): `what`
 * ("capture", ...), units done of total (tokens), seconds since the span began, final
 * (its last report); at most one per 0.2 s and the final one. NULL: none (the default). */
typedef void (*ls_api_progress_fn)(void *user, const char *what, int64_t done, int64_t total, double seconds,
                                   int final);
void ls_ctx_set_progress(ls_ctx *c, ls_api_progress_fn fn, void *user);

/* The trainable set of `model_dir` under the "what is trained" flags (lora-rank,
 * lora-alpha, lora-targets, lora-seed, adapter, ref-model, backend, state-on, ep) and any
 * other training flag as the policy's defaults for later calls. NULL on error. ep N ≥ 2
 * (the MLA family, under mpirun with a multiple of N ranks): CP × EP as `--ep N` — a
 * collective (every rank opens it with the same flags); the gradient then comes back on
 * world rank 0 (the other ranks' results are empty) and save is a collective. */
ls_api_policy *ls_api_policy_open(ls_ctx *c, const char *model_dir, int n, const char *const *names,
                                  const char *const *values);
void ls_api_policy_close(ls_api_policy *p);

/* log p(y_t | prompt, y_<t) of every response: arrays "0", "1", ... (one per response,
 * f32 [R_i]), the policy's current weights (adapters on). Engine flags (capture-chunk,
 * page-size, state-dtype, no-capture, cp-layout, cp-wave) apply. */
ls_result *ls_api_policy_logprobs(ls_api_policy *p, const char *group_json, int n, const char *const *names,
                                  const char *const *values);
/* The gradient of the objective w.r.t. every trainable tensor (f32, under the checkpoint's
 * tensor names, or PEFT names with LoRA) — what `longstraw grad` writes — without a step;
 * json: {"loss": L, ...metrics}. */
ls_result *ls_api_policy_grad(ls_api_policy *p, const char *group_json, int n, const char *const *names,
                              const char *const *values);
/* One update over n_groups groups (capture, score, replay, one AdamW call); the moments
 * persist across calls (the first call from a fresh state, as `longstraw step`). json:
 * the metrics (TRL's names). No arrays. */
ls_result *ls_api_policy_step(ls_api_policy *p, int n_groups, const char *const *groups_json, int n,
                              const char *const *names, const char *const *values);
/* G responses sampled from the policy after capturing the prompt once (group_json: the
 * group format's "prompt"; other fields ignored): arrays "0".."G-1" of token ids (as f32,
 * exact below 2^24) and "logprobs.0".. their sampling-time log-probs. Flags:
 * num-generations (8), max-new-tokens (32), top-p (1), temperature (1), seed (0), stop
 * (token ids, comma separated), and the engine flags. Under CP every rank samples the same
 * tokens (the same seed). */
ls_result *ls_api_policy_rollouts(ls_api_policy *p, const char *group_json, int n, const char *const *names,
                                  const char *const *values);
/* Write the policy as `longstraw step --out DIR` does (model.safetensors + config.json, or
 * the PEFT adapter files). 0 on success. */
int ls_api_policy_save(ls_api_policy *p, const char *dir);

/* `longstraw plan --json`: json is its document. model: a checkpoint directory or a
 * config.json. Flags: prompt (required), page-size, cp, state-dtype, cp-layout, mode,
 * sweep-chunk, ep, cp-wave, indexer-kl, state-on, with plan's defaults. */
ls_result *ls_api_plan(ls_ctx *c, const char *model, int n, const char *const *names, const char *const *values);

/* Rewards of one group from the host: prompt text, G response texts (decoded by the run's
 * tokenizer), the group's number; fills rewards[0..n). Nonzero: the run stops with
 * ls_api_reward_error's message. */
typedef int (*ls_api_reward_fn)(void *user, const char *prompt, size_t prompt_len, const char *const *responses,
                                const size_t *response_lens, int n, int64_t group_id, double *rewards);
/* A progress or status line of the training loop (with its newline). */
typedef void (*ls_api_log_fn)(void *user, const char *line);

/* `longstraw train` with the flags as (name, value) pairs (model, out, task, rollout,
 * updates, ..., and every training flag; resume as on the command line); reward: the
 * rewards of each rollout group (with rollout), instead of reward-cmd; log: its progress
 * lines (NULL: none are printed). json: {"updates": N, "skipped": K, "stop_signal": S,
 * "out": RUN}; the run's metrics are RUN/metrics.jsonl, as the CLI writes them. */
ls_result *ls_api_train(ls_ctx *c, int n, const char *const *names, const char *const *values,
                        ls_api_reward_fn reward, void *reward_user, ls_api_log_fn log, void *log_user);
/* The message a reward callback leaves for the error it returns (copied). */
void ls_api_reward_error(ls_ctx *c, const char *message);

int64_t ls_result_count(const ls_result *r);
const char *ls_result_name(const ls_result *r, int64_t i);
int ls_result_ndim(const ls_result *r, int64_t i);
const int64_t *ls_result_shape(const ls_result *r, int64_t i);
const float *ls_result_data(const ls_result *r, int64_t i);
const char *ls_result_json(const ls_result *r); /* "{}" when the call has none */
void ls_result_free(ls_result *r);

#ifdef __cplusplus
}
#endif

#endif
