"""LongStraw from Python: the GRPO transaction (capture, score, replay, optimize) over the
embeddable C API (include/longstraw/api.h, liblongstraw.so) through ctypes.

    import longstraw as ls
    ctx = ls.Context(threads=2)
    pol = ctx.policy("MODEL_DIR", lora_rank=0)
    lp = pol.logprobs(group)                     # list of float32 arrays, one per response
    g = pol.grad(group, mode="prefix-frozen")    # {tensor name: float32 array}
    m = pol.step([group], lr=1e-5)               # one update; its metrics
    pol.save("OUT_DIR")

Keyword arguments are the command line's flags with '_' for '-' (max_grad_norm=1.0 is
--max-grad-norm 1.0), with the same defaults. Errors raise ls.LongStrawError carrying the
library's message (file, field, value). The library never writes to stdout or stderr.

The shared library is found from $LONGSTRAW_LIB, then build/liblongstraw.so of the checkout
this package sits in, then the package directory, then the system's search path.
"""
import ctypes
import json
import os
import signal
import threading

import numpy as np

__all__ = ["Context", "Policy", "LongStrawError", "API_VERSION", "library_path"]

API_VERSION = 1


class LongStrawError(RuntimeError):
    """A failed library call; str(e) is the library's message."""


def _find_library():
    env = os.environ.get("LONGSTRAW_LIB")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(here, "..", "..", "build", "liblongstraw.so"),
                 os.path.join(here, "liblongstraw.so")):
        if os.path.exists(cand):
            return os.path.normpath(cand)
    return "liblongstraw.so"


library_path = _find_library()
try:
    _lib = ctypes.CDLL(library_path, mode=ctypes.RTLD_GLOBAL)
except OSError as e:
    raise ImportError("longstraw: cannot load %s (%s): build LongStraw (cmake --build build) or set LONGSTRAW_LIB"
                      % (library_path, e)) from None

_c = ctypes.c_char_p
_pp = ctypes.POINTER(ctypes.c_char_p)
_vp = ctypes.c_void_p
_i64 = ctypes.c_int64


def _sig(name, res, *args):
    f = getattr(_lib, name)
    f.restype = res
    f.argtypes = list(args)
    return f


_sig("ls_api_version", ctypes.c_int)
_sig("ls_ctx_new", _vp, ctypes.c_int)
_sig("ls_ctx_free", None, _vp)
_sig("ls_ctx_error", _c, _vp)
_sig("ls_api_last_error", _c)
_sig("ls_ctx_rank", ctypes.c_int, _vp)
_sig("ls_ctx_world_size", ctypes.c_int, _vp)
_sig("ls_ctx_request_stop", None, _vp, ctypes.c_int)
_PROGRESS_FN = ctypes.CFUNCTYPE(None, _vp, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_double,
                                ctypes.c_int)
_sig("ls_ctx_set_progress", None, _vp, _PROGRESS_FN, _vp)
_sig("ls_api_policy_open", _vp, _vp, _c, ctypes.c_int, _pp, _pp)
_sig("ls_api_policy_close", None, _vp)
_sig("ls_api_policy_logprobs", _vp, _vp, _c, ctypes.c_int, _pp, _pp)
_sig("ls_api_policy_grad", _vp, _vp, _c, ctypes.c_int, _pp, _pp)
_sig("ls_api_policy_step", _vp, _vp, ctypes.c_int, _pp, ctypes.c_int, _pp, _pp)
_sig("ls_api_policy_save", ctypes.c_int, _vp, _c)
_sig("ls_api_policy_rollouts", _vp, _vp, _c, ctypes.c_int, _pp, _pp)
_REWARD_FN = ctypes.CFUNCTYPE(ctypes.c_int, _vp, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_char_p),
                              ctypes.POINTER(ctypes.c_size_t), ctypes.c_int, ctypes.c_int64,
                              ctypes.POINTER(ctypes.c_double))
_LOG_FN = ctypes.CFUNCTYPE(None, _vp, ctypes.c_char_p)
_sig("ls_api_train", _vp, _vp, ctypes.c_int, _pp, _pp, _REWARD_FN, _vp, _LOG_FN, _vp)
_sig("ls_api_reward_error", None, _vp, _c)
_sig("ls_api_plan", _vp, _vp, _c, ctypes.c_int, _pp, _pp)
_sig("ls_result_count", _i64, _vp)
_sig("ls_result_name", _c, _vp, _i64)
_sig("ls_result_ndim", ctypes.c_int, _vp, _i64)
_sig("ls_result_shape", ctypes.POINTER(_i64), _vp, _i64)
_sig("ls_result_data", ctypes.POINTER(ctypes.c_float), _vp, _i64)
_sig("ls_result_json", _c, _vp)
_sig("ls_result_free", None, _vp)

if _lib.ls_api_version() != API_VERSION:
    raise ImportError("longstraw: %s has API version %d, this package speaks %d"
                      % (library_path, _lib.ls_api_version(), API_VERSION))


def _enc(s):
    return None if s is None else os.fsencode(s) if not isinstance(s, bytes) else s


def _flag_value(k, v):
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    return str(v)


def _flags(kw):
    """(n, names, values) for the C API; None values are left out (the CLI's default)."""
    items = [(k, _flag_value(k, v)) for k, v in kw.items() if v is not None]
    n = len(items)
    names = (ctypes.c_char_p * max(n, 1))(*[k.encode() for k, _ in items])
    values = (ctypes.c_char_p * max(n, 1))(*[v.encode() for _, v in items])
    return n, names, values


def _group_json(group):
    if isinstance(group, (str, bytes)):
        return group.encode() if isinstance(group, str) else group
    def conv(o):
        if isinstance(o, np.ndarray):
            return o.tolist()
        if isinstance(o, np.generic):
            return o.item()
        raise TypeError("group: %r is not JSON" % type(o).__name__)
    return json.dumps(group, default=conv).encode()


class _Result:
    def __init__(self, ptr):
        self.ptr = ptr

    def arrays(self):
        out = {}
        for i in range(_lib.ls_result_count(self.ptr)):
            name = _lib.ls_result_name(self.ptr, i).decode()
            nd = _lib.ls_result_ndim(self.ptr, i)
            shp = _lib.ls_result_shape(self.ptr, i)
            shape = tuple(shp[d] for d in range(nd))
            n = int(np.prod(shape)) if shape else 1
            data = _lib.ls_result_data(self.ptr, i)
            arr = np.ctypeslib.as_array(data, shape=(max(n, 1),))[:n].copy().reshape(shape)
            out[name] = arr
        return out

    def json(self):
        return json.loads(_lib.ls_result_json(self.ptr).decode())

    def __del__(self):
        if self.ptr:
            _lib.ls_result_free(self.ptr)
            self.ptr = None


class Context:
    """Owns the thread count, the last error, the stop request, the trace, the progress
    reports and (under mpirun) the communicator: two contexts do not see each other's.
    progress: a callable progress(what, done, total, seconds, final) for the long calls'
    progress (capture, scoring, evaluation; tokens), at most 5 a second (default: none)."""

    def __init__(self, threads=0, progress=None):
        self._ptr = _lib.ls_ctx_new(int(threads))
        if not self._ptr:
            raise LongStrawError(_lib.ls_api_last_error().decode())
        self.threads = threads
        self._progress_cb = None
        if progress is not None:
            self.set_progress(progress)

    def set_progress(self, progress):
        """Progress reports to progress(what, done, total, seconds, final); None: off."""
        if progress is None:
            self._progress_cb = None
            _lib.ls_ctx_set_progress(self._ptr, ctypes.cast(None, _PROGRESS_FN), None)
            return

        def cb(_user, what, done, total, seconds, final):
            try:
                progress(what.decode(), int(done), int(total), float(seconds), bool(final))
            except Exception:  # noqa: BLE001 - a report must not end the run
                pass

        self._progress_cb = _PROGRESS_FN(cb)  # kept alive as long as the library may call it
        _lib.ls_ctx_set_progress(self._ptr, self._progress_cb, None)

    def request_stop(self, sig=signal.SIGINT):
        """Ask this context's running call to stop at its next safe point: a training run
        ends after the update in flight with a checkpoint (its result's "stop_signal" is
        sig), as `longstraw train` does on SIGINT. Safe from another thread."""
        _lib.ls_ctx_request_stop(self._ptr, int(sig))

    @property
    def rank(self):
        return _lib.ls_ctx_rank(self._ptr)

    @property
    def world_size(self):
        return _lib.ls_ctx_world_size(self._ptr)

    def _error(self):
        return LongStrawError(_lib.ls_ctx_error(self._ptr).decode())

    def policy(self, model, **flags):
        """The trainable set of checkpoint directory `model`: lora_rank, lora_alpha,
        lora_targets, lora_seed, adapter, ref_model, backend, state_on are fixed here; any
        other training flag becomes this policy's default for later calls."""
        return Policy(self, model, flags)

    def plan(self, model, prompt, **flags):
        """`longstraw plan --json` for checkpoint directory (or config.json) `model` at a
        prompt of `prompt` tokens: the memory plan as a dict (keys as the CLI's)."""
        n, names, values = _flags(dict(flags, prompt=prompt))
        ptr = _lib.ls_api_plan(self._ptr, _enc(model), n, names, values)
        if not ptr:
            raise self._error()
        return _Result(ptr).json()

    def train(self, reward_funcs=None, reward_weights=None, log=None, stop_on_sigint=True, **flags):
        """`longstraw train` from Python: flags as keywords (model=, out=, task=, rollout=True,
        updates=, num_generations=, ..., every training flag; resume="RUN"). reward_funcs:
        callables in TRL's signature, reward_func(prompts, completions, **kwargs) ->
        list[float], called on rank 0 with each rollout group's decoded prompt (repeated per
        completion) and completions, kwargs group= (the group's number); several are summed
        with reward_weights (default 1 each), as TRL does. log: a callable taking each
        progress line (default: none are printed). stop_on_sigint (from the main thread):
        the first Ctrl-C asks the run to stop after its update in flight, with a
        checkpoint (request_stop), as the CLI does; a second one raises KeyboardInterrupt.
        Returns {"updates", "skipped", "stop_signal", "out", "metrics": the run's
        metrics.jsonl rows}."""
        if callable(reward_funcs):
            reward_funcs = [reward_funcs]
        funcs = list(reward_funcs or [])
        weights = list(reward_weights) if reward_weights is not None else [1.0] * len(funcs)
        if len(weights) != len(funcs):
            raise ValueError("reward_weights: %d weights for %d reward functions" % (len(weights), len(funcs)))
        failure = []

        def reward_cb(_user, prompt, plen, resp, lens, n, group_id, out):
            try:
                p = ctypes.string_at(prompt, plen).decode("utf-8", "replace")
                comps = [ctypes.string_at(resp[i], lens[i]).decode("utf-8", "replace") for i in range(n)]
                total = [0.0] * n
                for f, w in zip(funcs, weights):
                    r = f(prompts=[p] * n, completions=comps, group=group_id)
                    r = [float(x) for x in r]
                    if len(r) != n:
                        raise ValueError("%s returned %d rewards for %d completions"
                                         % (getattr(f, "__name__", "reward function"), len(r), n))
                    total = [t + w * x for t, x in zip(total, r)]
                for i in range(n):
                    out[i] = total[i]
                return 0
            except BaseException as e:  # noqa: B902 - reported through the library's error
                failure.append(e)
                _lib.ls_api_reward_error(self._ptr, ("%s: %s" % (type(e).__name__, e)).encode())
                return 1

        def log_cb(_user, line):
            if log is not None:
                log(line.decode("utf-8", "replace"))

        rfn = _REWARD_FN(reward_cb) if funcs else ctypes.cast(None, _REWARD_FN)
        lfn = _LOG_FN(log_cb)
        n, names, values = _flags(flags)
        old_handler = None
        if stop_on_sigint and threading.current_thread() is threading.main_thread():
            def on_sigint(sig, _frame):
                self.request_stop(sig)
                signal.signal(signal.SIGINT, old_handler)  # a second Ctrl-C interrupts

            old_handler = signal.signal(signal.SIGINT, on_sigint)
        try:
            ptr = _lib.ls_api_train(self._ptr, n, names, values, rfn, None, lfn, None)
        finally:
            if old_handler is not None:
                signal.signal(signal.SIGINT, old_handler)
        if not ptr:
            err = self._error()
            if failure:
                raise err from failure[0]
            raise err
        res = _Result(ptr).json()
        res["metrics"] = []
        path = os.path.join(res["out"], "metrics.jsonl")
        if self.rank == 0 and os.path.exists(path):
            with open(path) as f:
                res["metrics"] = [json.loads(line) for line in f if line.strip()]
        return res

    def close(self):
        if getattr(self, "_ptr", None):
            _lib.ls_ctx_free(self._ptr)
            self._ptr = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()


class Policy:
    """A checkpoint opened for training (weights, gradients, optimizer moments)."""

    def __init__(self, ctx, model, flags):
        self.ctx = ctx
        self.model = model
        if "lora_rank" in flags and not flags["lora_rank"]:
            flags = dict(flags)
            del flags["lora_rank"]  # 0: full fine-tune (the CLI's default)
        n, names, values = _flags(flags)
        self.__ptr = None
        ptr = _lib.ls_api_policy_open(ctx._ptr, _enc(model), n, names, values)
        if not ptr:
            raise ctx._error()
        self.__ptr = ptr

    def _call(self, ptr):
        if not ptr:
            raise self.ctx._error()
        return _Result(ptr)

    @property
    def _ptr(self):
        if not self.__ptr:
            raise LongStrawError("policy %s is closed" % self.model)
        if not self.ctx._ptr:
            raise LongStrawError("the context of policy %s is closed" % self.model)
        return self.__ptr

    def plan(self, prompt, **flags):
        """The memory plan of this policy's checkpoint at a prompt of `prompt` tokens."""
        return self.ctx.plan(self.model, prompt, **flags)

    def logprobs(self, group, **flags):
        """log p(y_t | prompt, y_<t) of every response: a list of float32 arrays."""
        n, names, values = _flags(flags)
        r = self._call(_lib.ls_api_policy_logprobs(self._ptr, _group_json(group), n, names, values))
        a = r.arrays()
        return [a[str(i)] for i in range(len(a))]

    def grad(self, group, **flags):
        """The gradient of the objective (no step): {tensor name: float32 array}, what
        `longstraw grad` writes. The loss and metrics: grad_with_metrics."""
        return self.grad_with_metrics(group, **flags)[0]

    def grad_with_metrics(self, group, **flags):
        n, names, values = _flags(flags)
        r = self._call(_lib.ls_api_policy_grad(self._ptr, _group_json(group), n, names, values))
        return r.arrays(), r.json()

    def step(self, groups, **flags):
        """One update over `groups` (a list of groups, or one group); returns its metrics."""
        if isinstance(groups, dict):
            groups = [groups]
        texts = [_group_json(g) for g in groups]
        arr = (ctypes.c_char_p * max(len(texts), 1))(*texts)
        n, names, values = _flags(flags)
        return self._call(_lib.ls_api_policy_step(self._ptr, len(texts), arr, n, names, values)).json()

    def rollouts(self, prompt, **flags):
        """Sample responses after capturing `prompt` (a list of token ids, or a group dict)
        once: (responses, logprobs), lists of int32 / float32 arrays. Keywords:
        num_generations (8), max_new_tokens (32), top_p (1.0), temperature (1.0), seed (0),
        stop (token ids), and the engine flags."""
        group = prompt if isinstance(prompt, (dict, str, bytes)) else {"prompt": list(prompt)}
        n, names, values = _flags(flags)
        a = self._call(_lib.ls_api_policy_rollouts(self._ptr, _group_json(group), n, names, values)).arrays()
        G = sum(1 for k in a if not k.startswith("logprobs."))
        return [a[str(i)].astype(np.int32) for i in range(G)], [a["logprobs.%d" % i] for i in range(G)]

    def save(self, out_dir):
        """Write the policy as `longstraw step --out DIR` does."""
        if _lib.ls_api_policy_save(self._ptr, _enc(out_dir)):
            raise self.ctx._error()

    def close(self):
        """Free the policy (weights, gradients, moments); later calls raise."""
        ptr = getattr(self, "_Policy__ptr", None)
        if ptr:
            _lib.ls_api_policy_close(ptr)
            self.__ptr = None

    def __del__(self):
        self.close()
