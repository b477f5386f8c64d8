#!/usr/bin/python3
"""The Python API (python/longstraw) against the CLI on the same inputs, bit for bit.

    test_api.py LONGSTRAW_BIN LIBLONGSTRAW_SO [unittest args]

Exits 77 (CTest's skip) when numpy is absent. Uses a random checkpoint from `longstraw init`
in a private temporary directory (removed at the end).
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

try:
    import numpy as np
except ImportError:
    print("skip: numpy is not installed for %s" % sys.executable)
    sys.exit(77)

if len(sys.argv) < 3:
    sys.exit("usage: test_api.py LONGSTRAW_BIN LIBLONGSTRAW_SO [unittest args]")
BIN, LIB = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
del sys.argv[1:3]
os.environ["LONGSTRAW_LIB"] = LIB
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import longstraw as ls  # noqa: E402

CONFIG = {"model_type": "qwen3_next", "vocab_size": 97, "hidden_size": 64, "num_hidden_layers": 4,
          "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "partial_rotary_factor": 0.25,
          "rope_theta": 10000, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
          "linear_value_head_dim": 16, "intermediate_size": 96, "num_experts": 0, "full_attention_interval": 2}


def read_safetensors(path):
    out = {}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    for k, v in head.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", (k, v["dtype"])
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(data[a:b], dtype="<f4").reshape(v["shape"])
    return out


def capture_fd2(fn):
    """Run fn with fd 2 and fd 1 redirected to a file; return (fn(), bytes written)."""
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile() as t:
        saved = os.dup(2), os.dup(1)
        os.dup2(t.fileno(), 2)
        os.dup2(t.fileno(), 1)
        try:
            r = fn()
        finally:
            os.dup2(saved[0], 2)
            os.dup2(saved[1], 1)
            os.close(saved[0])
            os.close(saved[1])
        t.seek(0)
        return r, t.read()


class API(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="ls_pyapi_")
        cls.model = os.path.join(cls.dir, "model")
        with open(os.path.join(cls.dir, "config.json"), "w") as f:
            json.dump(CONFIG, f)
        subprocess.run([BIN, "init", "--config", os.path.join(cls.dir, "config.json"), "--seed", "3", "--out",
                        cls.model], check=True, capture_output=True)
        rng = np.random.default_rng(5)
        cls.group = {"prompt": rng.integers(0, 97, 150).tolist(),
                     "responses": [rng.integers(0, 97, n).tolist() for n in (7, 12, 5)],
                     "rewards": [1.0, 0.0, 0.5]}
        cls.gpath = os.path.join(cls.dir, "group.json")
        with open(cls.gpath, "w") as f:
            json.dump(cls.group, f)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def cli(self, *args):
        r = subprocess.run([BIN] + list(args), capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def test_logprobs_equal_cli(self):
        want = json.loads(self.cli("logprobs", "--model", self.model, "--group", self.gpath, "--threads", "1",
                                   "--page-size", "16"))["logprobs"]
        ctx = ls.Context(threads=1)
        got = ctx.policy(self.model).logprobs(self.group, page_size=16)
        self.assertEqual(len(got), 3)
        for g, w in zip(got, want):
            self.assertEqual(g.dtype, np.float32)
            # the CLI prints %.9g: exact for float32
            self.assertTrue(np.array_equal(g, np.array(w, dtype=np.float32)), (g, w))

    def grad_cli(self, *flags):
        out = os.path.join(self.dir, "g.safetensors")
        self.cli("grad", "--model", self.model, "--group", self.gpath, "--out", out, "--threads", "1", *flags)
        return read_safetensors(out)

    def assert_same_tensors(self, got, want):
        self.assertEqual(sorted(got), sorted(want))
        for k in want:
            self.assertEqual(got[k].shape, want[k].shape, k)
            self.assertTrue(np.array_equal(got[k], want[k]), k)

    def test_grad_equal_cli(self):
        ctx = ls.Context(threads=1)
        pol = ctx.policy(self.model)
        for mode, extra in (("prefix-frozen", {}), ("full", {"sweep_chunk": 40})):
            flags = ["--mode", mode] + (["--sweep-chunk", "40"] if extra else [])
            want = self.grad_cli(*flags)
            got, m = pol.grad_with_metrics(self.group, mode=mode, **extra)
            self.assert_same_tensors(got, want)
            self.assertTrue(np.isfinite(m["loss"]))
        # nonzero: the check compares something
        self.assertGreater(sum(float(np.abs(v).sum()) for v in got.values()), 0)

    def test_grad_lora_equal_cli(self):
        want = self.grad_cli("--lora-rank", "4", "--lora-seed", "2", "--beta", "0.1")
        got = ls.Context(threads=1).policy(self.model, lora_rank=4, lora_seed=2).grad(self.group, beta=0.1)
        self.assert_same_tensors(got, want)

    def test_step_equal_cli(self):
        out = os.path.join(self.dir, "step_cli")
        self.cli("step", "--model", self.model, "--group", self.gpath, "--out", out, "--threads", "1", "--lr", "1e-3")
        pol = ls.Context(threads=1).policy(self.model)
        m = pol.step([self.group], lr=1e-3)
        self.assertEqual(m["step"], 1)
        self.assertTrue(np.isfinite(m["grad_norm"]))
        out2 = os.path.join(self.dir, "step_py")
        pol.save(out2)
        self.assert_same_tensors(read_safetensors(os.path.join(out2, "model.safetensors")),
                                 read_safetensors(os.path.join(out, "model.safetensors")))
        with open(os.path.join(out2, "config.json")) as a, open(os.path.join(out, "config.json")) as b:
            self.assertEqual(a.read(), b.read())
        # a second step moves the weights again (the moments persist)
        m2 = pol.step(self.group, lr=1e-3)
        self.assertEqual(m2["step"], 2)

    def test_nothing_printed(self):
        def run():
            ctx = ls.Context(threads=1)
            pol = ctx.policy(self.model)
            pol.logprobs(self.group)
            pol.grad(self.group)
            pol.step(self.group)
            try:
                ctx.policy(os.path.join(self.dir, "nope"))
            except ls.LongStrawError:
                pass
            ctx.plan(self.model, 500)
            pol.rollouts(self.group, num_generations=2, max_new_tokens=3)
            model = os.path.join(self.dir, "model257q")
            with open(os.path.join(self.dir, "config257q.json"), "w") as f:
                json.dump(dict(CONFIG, vocab_size=257), f)
            subprocess.run([BIN, "init", "--config", os.path.join(self.dir, "config257q.json"), "--out", model],
                           check=True, capture_output=True)
            res = ctx.train(model=model, out=os.path.join(self.dir, "run_quiet"), task="passkey", rollout=True,
                            prompt_len=300, num_generations=2, max_new_tokens=3, updates=1,
                            reward_funcs=lambda prompts, completions, **kw: [len(c) % 2 for c in completions])
            run_dir = os.path.join(self.dir, "run_quiet")
            try:  # a resume names its run: another --out is refused (same rule as the CLI: by inode)
                ctx.train(resume=run_dir, out=os.path.join(self.dir, "elsewhere"), updates=2)
                return "resume with another out was accepted"
            except ls.LongStrawError as e:
                if "must be the same run" not in str(e):
                    return str(e)
            return res["updates"] == 1
        ok, printed = capture_fd2(run)
        self.assertTrue(ok is True, ok)
        self.assertEqual(printed, b"")

    def test_errors(self):
        ctx = ls.Context(threads=1)
        missing = os.path.join(self.dir, "nope")
        with self.assertRaises(ls.LongStrawError) as e:
            ctx.policy(missing)
        self.assertIn(missing, str(e.exception))
        bad = os.path.join(self.dir, "bad")
        os.makedirs(bad, exist_ok=True)
        cfg = dict(CONFIG, hidden_size=-5)
        with open(os.path.join(bad, "config.json"), "w") as f:
            json.dump(cfg, f)
        shutil.copy(os.path.join(self.model, "model.safetensors"), bad)
        with self.assertRaises(ls.LongStrawError) as e:
            ctx.policy(bad)
        self.assertIn("hidden_size", str(e.exception))
        self.assertIn("config.json", str(e.exception))
        pol = ctx.policy(self.model)
        with self.assertRaises(ls.LongStrawError) as e:
            pol.grad(self.group, lr="x")
        self.assertIn("--lr", str(e.exception))
        with self.assertRaises(ls.LongStrawError) as e:
            pol.grad(self.group, no_such_flag=1)
        self.assertIn("no_such_flag", str(e.exception))
        with self.assertRaises(ls.LongStrawError) as e:
            pol.grad(dict(self.group, responses=[[1000]] * 3))
        self.assertIn("responses", str(e.exception))
        with self.assertRaises(ls.LongStrawError):
            pol.grad(self.group, lora_rank=2)  # fixed at open
        # the process survives and the policy still works
        self.assertEqual(len(pol.logprobs(self.group)), 3)
        # closed objects raise instead of touching freed memory
        other = ls.Context(threads=1)
        p2 = other.policy(self.model)
        other.close()
        with self.assertRaises(ls.LongStrawError) as e:
            p2.logprobs(self.group)
        self.assertIn("context", str(e.exception))
        pol.close()
        with self.assertRaises(ls.LongStrawError) as e:
            pol.grad(self.group)
        self.assertIn("closed", str(e.exception))

    def test_mpi_grad_equal_cli(self):
        """`mpirun -np 2 python3` runs CP (and EP): the same gradient as `mpirun -np 2 longstraw grad`."""
        mpi = os.environ.get("LS_TEST_MPIEXEC")
        if not mpi:
            self.skipTest("LS_TEST_MPIEXEC not set (a build without MPI)")
        launcher = mpi.split() + ["--oversubscribe", "--allow-run-as-root", "-np", "2"]
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_NUM_THREADS="1",
                   PYTHONPATH=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
        # the hybrid under CP in both modes; the MLA fixture (4 routed experts) with --ep 2
        mla = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference", "fixtures", "mla_glm")
        for model, gpath, mode, ep in ((self.model, self.gpath, "prefix-frozen", 1),
                                       (self.model, self.gpath, "full", 1),
                                       (mla, os.path.join(mla, "group_train.json"), "prefix-frozen", 2)):
            out = os.path.join(self.dir, "g_mpi.safetensors")
            r = subprocess.run(launcher + [BIN, "grad", "--model", model, "--group", gpath, "--out", out,
                                           "--threads", "1", "--mode", mode, "--ep", str(ep)],
                               capture_output=True, text=True, env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            npz = os.path.join(self.dir, "g_mpi.npz")
            r = subprocess.run(launcher + [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                        "mpi_grad.py"),
                                           model, gpath, npz, "mode=" + mode, "ep=%d" % ep],
                               capture_output=True, text=True, env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout + r.stderr, "")  # the library printed nothing on any rank
            with np.load(npz) as z:
                got = {k: z[k] for k in z.files}
            self.assert_same_tensors(got, read_safetensors(out))

    def reward(self, prompts, completions, **kwargs):
        """A TRL-signature reward reading both texts (the same as reward_cmd.py's)."""
        return [((len(c) * 7 + sum(map(ord, c[:5])) + len(p)) % 11) / 10.0 for p, c in zip(prompts, completions)]

    def test_train_python_reward_equals_reward_cmd(self):
        """A training run driven by a Python reward in TRL's signature gives the metrics of the
        same run with that reward through --reward-cmd."""
        model = os.path.join(self.dir, "model257")
        with open(os.path.join(self.dir, "config257.json"), "w") as f:
            json.dump(dict(CONFIG, vocab_size=257), f)
        self.cli("init", "--config", os.path.join(self.dir, "config257.json"), "--seed", "4", "--out", model)
        cmd = os.path.join(self.dir, "reward_cmd.py")
        with open(cmd, "w") as f:
            f.write("import json, sys\n"
                    "for line in sys.stdin:\n"
                    "    o = json.loads(line)\n"
                    "    p, c = o['prompt'], o['response']\n"
                    "    print(((len(c) * 7 + sum(map(ord, c[:5])) + len(p)) % 11) / 10.0, flush=True)\n")
        common = ["--task", "passkey", "--rollout", "--prompt-len", "300", "--num-generations", "3",
                  "--max-new-tokens", "6", "--updates", "2", "--seed", "9", "--lr", "1e-3", "--threads", "1",
                  "--quiet"]
        run_cli = os.path.join(self.dir, "run_cli")
        self.cli("train", "--model", model, "--out", run_cli, "--reward-cmd", "%s %s" % (sys.executable, cmd),
                 *common)
        ctx = ls.Context(threads=1)
        lines = []
        kw = {common[i][2:]: (common[i + 1] if i + 1 < len(common) and not common[i + 1].startswith("--") else True)
              for i in range(len(common)) if common[i].startswith("--")}
        run_py = os.path.join(self.dir, "run_py")
        res = ctx.train(model=model, out=run_py, reward_funcs=[self.reward], log=lines.append,
                        **{k.replace("-", "_"): v for k, v in kw.items()})
        self.assertEqual(res["updates"], 2)
        with open(os.path.join(run_cli, "metrics.jsonl")) as f:
            want = [json.loads(x) for x in f]
        self.assertEqual(len(res["metrics"]), 2)
        for g, w in zip(res["metrics"], want):
            for k in ("time", "step_time"):
                g.pop(k), w.pop(k)
            self.assertEqual(g, w)
        self.assertTrue(any("update 2/2" in x for x in lines), lines)
        # the rewards are not constant: the comparison pins them
        self.assertGreater(max(m["reward_std"] for m in want), 0)

    def test_train_reward_errors(self):
        ctx = ls.Context(threads=1)
        model = os.path.join(self.dir, "model257e")
        with open(os.path.join(self.dir, "config257e.json"), "w") as f:
            json.dump(dict(CONFIG, vocab_size=257), f)
        self.cli("init", "--config", os.path.join(self.dir, "config257e.json"), "--out", model)

        def bad(prompts, completions, **kw):
            raise KeyError("no such column")
        with self.assertRaises(ls.LongStrawError) as e:
            ctx.train(model=model, out=os.path.join(self.dir, "run_bad"), task="passkey", rollout=True,
                      prompt_len=300, num_generations=2, max_new_tokens=2, updates=1, reward_funcs=bad)
        self.assertIn("no such column", str(e.exception))
        self.assertIsInstance(e.exception.__cause__, KeyError)
        with self.assertRaises(ls.LongStrawError) as e:
            ctx.train(model=model, out=os.path.join(self.dir, "run_bad2"), task="passkey", updates=1,
                      reward_funcs=self.reward)
        self.assertIn("rollout", str(e.exception))
        with self.assertRaises(ls.LongStrawError) as e:
            ctx.train(model=model, out=os.path.join(self.dir, "run_bad3"), task="nope", rollout=True)
        self.assertIn("--task", str(e.exception))

    def test_plan_equal_cli(self):
        ctx = ls.Context(threads=1)
        for flags, cli in (({}, []), ({"mode": "full", "page_size": 16}, ["--mode", "full", "--page-size", "16"]),
                           ({"cp": 3, "cp_layout": "contiguous"}, ["--cp", "3", "--cp-layout", "contiguous"])):
            want = json.loads(self.cli("plan", "--model", self.model, "--prompt", "1000", "--json", *cli))
            self.assertEqual(ctx.plan(self.model, 1000, **flags), want)
            self.assertEqual(ctx.policy(self.model).plan(1000, **flags), want)
        with self.assertRaises(ls.LongStrawError) as e:
            ctx.plan(self.model, 1000, mode="sideways")
        self.assertIn("--mode", str(e.exception))

    def test_pip_install_offline(self):
        """`pip install ./python` without a network: the wheel carries the library; the installed
        package gives the CLI's log-probs."""
        try:
            import pip  # noqa: F401
        except ImportError:
            self.skipTest("pip is not installed for %s" % sys.executable)
        target = os.path.join(self.dir, "site")
        src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
        env = dict(os.environ, LONGSTRAW_LIB=LIB, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--target", target,
                            src], capture_output=True, text=True, env=env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertTrue(os.path.exists(os.path.join(target, "longstraw", "liblongstraw.so")))
        code = ("import json, sys, longstraw as ls\n"
                "assert ls.library_path.startswith(sys.argv[1]), ls.library_path\n"
                "g = json.load(open(sys.argv[3]))\n"
                "print(json.dumps([a.tolist() for a in ls.Context(threads=1).policy(sys.argv[2]).logprobs(g)]))\n")
        env = {k: v for k, v in os.environ.items() if k != "LONGSTRAW_LIB"}
        env["PYTHONPATH"] = target
        r = subprocess.run([sys.executable, "-c", code, target, self.model, self.gpath], capture_output=True,
                           text=True, env=env, cwd=self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        want = json.loads(self.cli("logprobs", "--model", self.model, "--group", self.gpath, "--threads", "1"))
        got = json.loads(r.stdout)
        for g, w in zip(got, want["logprobs"]):
            self.assertTrue(np.array_equal(np.array(g, dtype=np.float32), np.array(w, dtype=np.float32)))

    def test_rollouts(self):
        pol = ls.Context(threads=1).policy(self.model)
        resp, lps = pol.rollouts(self.group["prompt"], num_generations=4, max_new_tokens=9, seed=3)
        self.assertEqual(len(resp), 4)
        for r, lp in zip(resp, lps):
            self.assertEqual(r.dtype, np.int32)
            self.assertEqual(len(r), 9)
            self.assertTrue(((r >= 0) & (r < 97)).all())
            self.assertTrue(np.isfinite(lp).all() and (lp <= 0).all())
        again, _ = pol.rollouts(self.group, num_generations=4, max_new_tokens=9, seed=3)
        self.assertTrue(all(np.array_equal(a, b) for a, b in zip(resp, again)))  # the seed decides
        other, _ = pol.rollouts(self.group, num_generations=4, max_new_tokens=9, seed=4)
        self.assertFalse(all(np.array_equal(a, b) for a, b in zip(resp, other)))
        # the sampling-time log-probs are the policy's log-probs of those tokens
        scored = pol.logprobs({"prompt": self.group["prompt"], "responses": [r.tolist() for r in resp]})
        for a, b in zip(lps, scored):
            self.assertLess(float(np.abs(a - b).max()), 1e-4)
        # a stop token ends a response (and is kept)
        stop = int(resp[0][2])
        cut, _ = pol.rollouts(self.group, num_generations=4, max_new_tokens=9, seed=3, stop=[stop])
        first = resp[0].tolist().index(stop)
        self.assertEqual(cut[0].tolist(), resp[0][:first + 1].tolist())
        with self.assertRaises(ls.LongStrawError) as e:
            pol.rollouts(self.group, updates=3)
        self.assertIn("updates", str(e.exception))

    def test_two_contexts(self):
        a, b = ls.Context(threads=1), ls.Context(threads=2)
        pa, pb = a.policy(self.model), b.policy(self.model)
        ga1 = pa.grad(self.group)
        pb.grad(self.group)
        ga2 = pa.grad(self.group)  # b's thread count did not leak into a's call
        self.assert_same_tensors(ga2, ga1)
        self.assert_same_tensors(ga1, self.grad_cli())
        with self.assertRaises(ls.LongStrawError):
            b.policy(os.path.join(self.dir, "nope"))
        self.assertEqual(a.policy(self.model).logprobs(self.group)[0].shape, (7,))

    def test_stop_and_progress_are_the_contexts(self):
        """A progress callback of context a asks a's call to stop: a's capture stops at its
        next chunk, context b (no callback) runs the same call undisturbed, and the next
        call of a starts with no request; b never hears of a's progress."""
        seen_a, seen_b = [], []
        a = ls.Context(threads=1)
        b = ls.Context(threads=1, progress=lambda *r: seen_b.append(r))
        b.set_progress(None)

        def on_progress(what, done, total, seconds, final):
            seen_a.append((what, done, total, final))
            if what == "capture":
                a.request_stop()

        a.set_progress(on_progress)
        pa, pb = a.policy(self.model), b.policy(self.model)
        with self.assertRaises(ls.LongStrawError) as cm:
            pa.grad(self.group, capture_chunk=32)
        self.assertIn("stopped by signal 2 during capture", str(cm.exception))
        self.assertEqual(seen_a[0][:3], ("capture", 0, len(self.group["prompt"]) - 1))
        want = self.grad_cli("--capture-chunk", "32")
        self.assert_same_tensors(pb.grad(self.group, capture_chunk=32), want)
        self.assertEqual(seen_b, [])
        a.set_progress(lambda *r: seen_a.append(r))  # reports only: a's next call runs whole
        n0 = len(seen_a)
        self.assert_same_tensors(pa.grad(self.group, capture_chunk=32), want)
        finals = [r[:3] for r in seen_a[n0:] if r[4]]  # (what, done, total) of each span's last report
        P, R = len(self.group["prompt"]), sum(len(r) for r in self.group["responses"])
        self.assertIn(("capture", P - 1, P - 1), finals)
        self.assertIn(("replay", R, R), finals)
        a.close()
        b.close()


if __name__ == "__main__":
    unittest.main()
