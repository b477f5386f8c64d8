#!/usr/bin/python3
"""LongStraw's gradient as torch tensors, beside torch autograd's own on a tiny model.

    PYTHONPATH=python /usr/bin/python3 examples/python/grad_vs_torch.py [WORK_DIR]

Writes a tiny random hybrid checkpoint (`longstraw init`), takes the gradient of the SFT
loss (mean NLL of the response tokens) with `mode="full"` — the exact gradient through the
prompt too — from LongStraw (`pol.grad`, float32), and the same gradient from the
independent fp64 PyTorch implementation of the model in tests/reference/hybrid_ref.py
(written from specs/, not from the C code), and prints the relative error per tensor.
Needs torch (Debian: python3-torch).
"""
import json
import os
import subprocess
import sys

import numpy as np
import torch

import longstraw as ls

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
# the CLI (for `init`): $LONGSTRAW_BIN, else beside the loaded library, else this checkout's build/
longstraw_bin = os.environ.get("LONGSTRAW_BIN") or next(
    (c for c in (os.path.join(os.path.dirname(ls.library_path), "longstraw"), os.path.join(root, "build", "longstraw"))
     if os.path.exists(c)), "longstraw")
sys.path.insert(0, os.path.join(root, "tests", "reference"))
import hybrid_ref  # noqa: E402  (the fp64 reference model)

work = sys.argv[1] if len(sys.argv) > 1 else "grad_vs_torch"
model = os.path.join(work, "model")
os.makedirs(work, exist_ok=True)
cfg = os.path.join(work, "config.json")
with open(cfg, "w") as f:
    json.dump({"model_type": "qwen3_next", "vocab_size": 101, "hidden_size": 64, "num_hidden_layers": 4,
               "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "linear_num_key_heads": 2,
               "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
               "intermediate_size": 96, "num_experts": 0, "full_attention_interval": 2}, f)
subprocess.run([longstraw_bin, "init", "--config", cfg, "--seed", "1", "--out", model],
               check=True, stdout=subprocess.DEVNULL)

rng = np.random.default_rng(0)
group = {"prompt": rng.integers(0, 101, 200).tolist(), "responses": [rng.integers(0, 101, 24).tolist()]}

# LongStraw: float32 arrays by tensor name -> torch tensors
pol = ls.Context(threads=2).policy(model)
ours = {k: torch.from_numpy(v) for k, v in pol.grad(group, loss="sft", mode="full").items()}

# torch autograd on the fp64 reference
ref = hybrid_ref.HybridModel(model)
for w in ref.w.values():
    w.requires_grad_(True)
seq = group["prompt"] + group["responses"][0]
lp = torch.log_softmax(ref.forward(seq), -1)
P, R = len(group["prompt"]), len(group["responses"][0])
loss = -sum(lp[P - 1 + j, seq[P + j]] for j in range(R)) / R
loss.backward()

worst = 0.0
for name in sorted(ours):
    theirs = ref.w[name].grad
    err = float((ours[name].double() - theirs).norm() / theirs.norm().clamp_min(1e-30))
    worst = max(worst, err)
    print("%-55s rel. error %.2e" % (name, err))
print("largest relative error %.2e (float32 against float64) over %d tensors" % (worst, len(ours)))
sys.exit(0 if worst <= 1e-4 else 1)
