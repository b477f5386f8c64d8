#!/usr/bin/python3
"""Outside-checker emulation: build random checkpoints with `longstraw init`
(HF names, both layouts, dense and MoE, bf16 and f32 storage), run
`longstraw logprobs` (capture + continuation) and compare with hybrid_ref.py in
fp64. Exit 0 on success, 1 on a mismatch, 77 (skip) when torch is unavailable.

    /usr/bin/python3 tests/reference/check_cli.py LONGSTRAW_BINARY [--prompt 1200]
        [--launcher "mpirun --oversubscribe -np 3"]   (logprobs under context parallelism)
"""
import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile

try:
    import torch  # noqa: F401
except ImportError:
    print("SKIP: /usr/bin/python3 has no torch (apt-get install python3-torch)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hybrid_ref  # noqa: E402

BASE = dict(vocab_size=500, hidden_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
            partial_rotary_factor=0.25, rope_theta=1e6, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=24, linear_value_head_dim=16, intermediate_size=160, rms_norm_eps=1e-6)
MOE = dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=48, shared_expert_intermediate_size=64,
           norm_topk_prob=True)

CASES = [
    ("qwen3_next dense, 2 layers, f32", dict(model_type="qwen3_next", num_hidden_layers=2, num_experts=0,
                                             full_attention_interval=2), "f32"),
    ("qwen3_next MoE, 5 layers, bf16", dict(model_type="qwen3_next", num_hidden_layers=5, full_attention_interval=3,
                                            **MOE), "bf16"),
    ("qwen3_5 dense, 4 layers, bf16", dict(model_type="qwen3_5", text_config=dict(model_type="qwen3_5_text",
                                           num_hidden_layers=4, full_attention_interval=4)), "bf16"),
    ("qwen3_5_moe_text, 3 layers, f32", dict(model_type="qwen3_5_moe_text", num_hidden_layers=3,
                                             layer_types=["full_attention", "linear_attention", "full_attention"],
                                             **MOE), "f32"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--prompt", type=int, default=1200)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--launcher", default="", help="prefix of the logprobs command, e.g. an mpirun line")
    args = ap.parse_args()
    launch = shlex.split(args.launcher)
    rng = random.Random(11)
    worst_all = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, cfg, dtype) in enumerate(CASES):
            full = dict(cfg)
            if "text_config" in full:
                full["text_config"] = {**BASE, **full["text_config"]}
            else:
                full = {**BASE, **full}
            d = os.path.join(tmp, f"m{i}")
            os.makedirs(d)
            with open(os.path.join(d, "in.json"), "w") as f:
                json.dump(full, f)
            subprocess.run([args.binary, "init", "--config", os.path.join(d, "in.json"), "--seed", str(i),
                            "--dtype", dtype, "--out", d], check=True, capture_output=True)
            group = {"prompt": [rng.randrange(500) for _ in range(args.prompt)],
                     "responses": [[rng.randrange(500) for _ in range(n)] for n in (1, 17, 70)]}
            gpath = os.path.join(d, "g.json")
            with open(gpath, "w") as f:
                json.dump(group, f)
            out = subprocess.run(launch + [args.binary, "logprobs", "--model", d, "--group", gpath, "--capture-chunk",
                                           "512"], check=True, capture_output=True, text=True).stdout
            got = json.loads(out)["logprobs"]
            torch.set_grad_enabled(False)
            ref = hybrid_ref.group_logprobs(hybrid_ref.HybridModel(d), group)
            worst = max(abs(a - b) for ra, rb in zip(got, ref) for a, b in zip(ra, rb))
            n = sum(len(r) for r in ref)
            ok = n == sum(len(r) for r in got) and worst <= args.tol
            worst_all = max(worst_all, worst)
            how = f" ({args.launcher})" if launch else ""
            print(f"{'ok  ' if ok else 'FAIL'} {name}{how}: P={args.prompt}, {n} tokens, max |C - fp64| = {worst:.2e}")
            if not ok:
                return 1
    print(f"all {len(CASES)} checkpoints within {args.tol:g} (worst {worst_all:.2e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
