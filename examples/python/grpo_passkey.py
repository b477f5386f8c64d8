#!/usr/bin/python3
"""GRPO with a Python reward function (TRL's signature) on a long-prompt task.

    PYTHONPATH=python /usr/bin/python3 examples/python/grpo_passkey.py [OUT_DIR]

Writes a small random hybrid checkpoint (`longstraw init` of the demo's size), then trains it
on RULER-style passkey retrieval: the pass key sits inside a 1K-token haystack and the
reward reads it back from each sampled completion. The same run with a reward process is
`longstraw train ... --reward-cmd CMD`; here the reward is a Python callable.
"""
import json
import os
import re
import subprocess
import sys

import longstraw as ls

out = sys.argv[1] if len(sys.argv) > 1 else "grpo_passkey_run"
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
# the CLI (for `init`): $LONGSTRAW_BIN, else beside the loaded library, else this checkout's build/
longstraw_bin = os.environ.get("LONGSTRAW_BIN") or next(
    (c for c in (os.path.join(os.path.dirname(ls.library_path), "longstraw"), os.path.join(root, "build", "longstraw"))
     if os.path.exists(c)), "longstraw")
model = os.path.join(out, "model")
os.makedirs(out, exist_ok=True)
if not os.path.exists(os.path.join(model, "model.safetensors")):
    cfg = os.path.join(out, "config.json")
    with open(cfg, "w") as f:  # byte-level ids: the task's default tokenizer
        json.dump({"model_type": "qwen3_next", "vocab_size": 257, "hidden_size": 256, "num_hidden_layers": 4,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
                   "linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_key_head_dim": 32,
                   "linear_value_head_dim": 32, "intermediate_size": 768, "num_experts": 0,
                   "full_attention_interval": 4}, f)
    subprocess.run([longstraw_bin, "init", "--config", cfg, "--out", model], check=True)


def passkey_reward(prompts, completions, **kwargs):
    """Shaped: half for answering in digits at all, half per digit of the prompt's pass key."""
    rewards = []
    for p, c in zip(prompts, completions):
        key = re.search(r"The pass key is (\d+)\.", p).group(1)
        got = c.strip()[:len(key)]
        digits = sum(ch.isdigit() for ch in got) / len(key)
        right = sum(a == b for a, b in zip(key, got)) / len(key)
        rewards.append(0.5 * digits + 0.5 * right)
    return rewards


ctx = ls.Context(threads=2)
res = ctx.train(model=model, out=os.path.join(out, "run"), task="passkey", rollout=True, prompt_len=1024,
                num_generations=8, max_new_tokens=6, updates=40, lr=1e-3, seed=1,
                reward_funcs=[passkey_reward], log=lambda line: print(line, end=""))
first, last = res["metrics"][0], res["metrics"][-1]
print("%d updates: mean reward %.3f at the first, %.3f at the last" % (res["updates"], first["reward"], last["reward"]))
