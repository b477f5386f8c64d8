#!/usr/bin/python3
"""Generate the deterministic GRPO gradient fixtures (run after make_fixtures.py).

    /usr/bin/python3 make_grad_fixtures.py

Writes, under fixtures/:
  <fx>/group_train.json           for next_dense, next_moe, q35_dense, q35_moe
  next_dense_ref/                 reference checkpoint = next_dense + N(0, 0.05), F32
  next_dense/adapter.safetensors  PEFT LoRA adapter (rank 2, A and B ~ N(0, 0.1))
  grpo/cases.json                 every case's exact grpo_ref.py flags (paths relative to fixtures/)
  grpo/grad_<case>.safetensors    step-0 gradients (F32; loss/grad_norm in __metadata__)
  grpo/traj_<name>.json, grpo/traj_<name>_final.safetensors
The fixtures' existing files (config.json, weights, group.json, expected.json) are only read.
This empties fixtures/grpo/: rerun make_full_fixtures.py afterwards (--mode full / --loss sft fixtures).
"""

import json
import math
import os
import shutil
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hybrid_ref as hr  # noqa: E402
import grpo_ref as gr  # noqa: E402

DT = torch.float64
FIX = os.path.join(HERE, "fixtures")
OUT = os.path.join(FIX, "grpo")
FIXTURES = ["next_dense", "next_moe", "q35_dense", "q35_moe"]
REWARDS = [1.0, 0.25, -0.5, 0.75]  # distinct; A signs +, -, -, + (lengths 1, 5, 67, 20)
NOISE_STD = 0.3
MARGIN = 2e-3          # min |log rho - log(1 -/+ eps)| at step 0 for every case
ROUTER_GAP = 5e-4      # min top-k router margin on the new response's branch positions
LORA_TARGETS = ["q_proj", "v_proj", "in_proj_qkvz", "out_proj", "gate_proj", "down_proj"]
LORA_RANK, LORA_ALPHA = 2, 4.0

CASES = [
    ("next_dense", "next_dense", ["--ref-model", "next_dense_ref", "--loss-type", "grpo", "--epsilon", "0.2",
                                  "--beta", "0.05"]),
    ("next_moe", "next_moe", ["--loss-type", "dapo", "--epsilon", "0.2", "--epsilon-high", "0.28",
                              "--temperature", "0.7"]),
    ("q35_dense", "q35_dense", ["--loss-type", "dr_grpo", "--beta", "0"]),
    ("q35_moe", "q35_moe", ["--loss-type", "grpo", "--scale-rewards", "none"]),
    ("next_dense_lora", "next_dense", ["--adapter", "next_dense/adapter.safetensors", "--lora-alpha", "4",
                                       "--loss-type", "grpo", "--epsilon", "0.2", "--beta", "0.05"]),
]
TRAJ = [
    ("next_dense", "next_dense", ["--ref-model", "next_dense_ref", "--loss-type", "grpo", "--epsilon", "0.2",
                                  "--beta", "0.05", "--steps", "5", "--lr", "1e-2", "--weight-decay", "0.1",
                                  "--max-grad-norm", "1.0"]),
    ("lora", "next_dense", ["--adapter", "next_dense/adapter.safetensors", "--lora-alpha", "4",
                            "--loss-type", "grpo", "--epsilon", "0.2", "--beta", "0.05", "--steps", "5",
                            "--lr", "1e-2"]),
]


def write_json(path, obj, indent=1):
    with open(path, "w") as f:
        json.dump(obj, f, indent=indent)
        f.write("\n")


def case_args(fx, flags):
    return ["--model", fx, "--group", fx + "/group_train.json"] + flags


def parse(flags):
    return gr.build_parser().parse_args(["--model", "x", "--group", "y"] + flags)


def run_case(fx, flags, group):
    """grpo_ref.run for a case/trajectory on an in-memory group; returns (result, parsed args)."""
    a = parse(flags)
    p = lambda x: None if x is None else os.path.join(FIX, x)  # noqa: E731
    obj = gr.Objective(a.temperature, a.epsilon, a.epsilon_high, a.beta, a.loss_type, a.max_completion_length,
                       a.scale_rewards)
    res = gr.run(os.path.join(FIX, fx), group, obj, ref_model=p(a.ref_model), adapter=p(a.adapter),
                 lora_alpha=a.lora_alpha, steps=a.steps, lr=a.lr, weight_decay=a.weight_decay, beta1=a.adam_beta1,
                 beta2=a.adam_beta2, adam_eps=a.adam_eps, max_grad_norm=a.max_grad_norm)
    return res, a


def make_ref_checkpoint():
    src, dst = os.path.join(FIX, "next_dense"), os.path.join(FIX, "next_dense_ref")
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(dst):
        os.remove(os.path.join(dst, f))
    shutil.copyfile(os.path.join(src, "config.json"), os.path.join(dst, "config.json"))
    ts, _ = hr.read_safetensors(os.path.join(src, "model.safetensors"))
    g = torch.Generator().manual_seed(3001)
    out = {n: (t + 0.05 * torch.randn(*t.shape, generator=g, dtype=DT), "F32") for n, t in ts.items()}
    hr.write_safetensors(os.path.join(dst, "model.safetensors"), out, {"format": "pt"})


def make_adapter():
    ts, _ = hr.read_safetensors(os.path.join(FIX, "next_dense", "model.safetensors"))
    cfg, _ = gr.load_model(os.path.join(FIX, "next_dense"))
    g = torch.Generator().manual_seed(3002)
    out = {}
    for i in range(cfg.L):
        for tgt in LORA_TARGETS:
            names = [n for n in ts if n.startswith("model.layers.%d." % i) and n.endswith("." + tgt + ".weight")]
            for n in names:
                mod = gr.PEFT_PREFIX + n[:-len(".weight")]
                o, inp = ts[n].shape
                out[mod + ".lora_A.weight"] = (0.1 * torch.randn(LORA_RANK, inp, generator=g, dtype=DT), "F32")
                out[mod + ".lora_B.weight"] = (0.1 * torch.randn(o, LORA_RANK, generator=g, dtype=DT), "F32")
    hr.write_safetensors(os.path.join(FIX, "next_dense", "adapter.safetensors"), out, {"format": "pt"})
    return sorted({k[len(gr.PEFT_PREFIX):].rsplit(".lora_", 1)[0] for k in out})


def choose_fourth_response(fx, base_group, seed):
    cfg, w = gr.load_model(os.path.join(FIX, fx))
    net = gr.Net(cfg, w)
    st = net.capture(base_group["prompt"])
    for attempt in range(200):
        g = torch.Generator().manual_seed(seed + attempt)
        resp = torch.randint(0, cfg.V, (20,), generator=g).tolist()
        if cfg.E == 0:
            return resp, None
        net.router_gaps = []
        with torch.no_grad():
            net.branch_logprobs(st, base_group["prompt"], resp)
        gap = min(net.router_gaps)
        if gap >= ROUTER_GAP:
            return resp, gap
    raise RuntimeError("no response with router gap >= %g" % ROUTER_GAP)


def make_group_train(fx, idx):
    with open(os.path.join(FIX, fx, "group.json")) as f:
        base = json.load(f)
    resp4, gap = choose_fourth_response(fx, base, 4000 + 100 * idx)
    group = {"prompt": base["prompt"], "responses": base["responses"] + [resp4], "rewards": list(REWARDS)}
    runs = [c for c in CASES if c[1] == fx] + [t for t in TRAJ if t[1] == fx]
    # old log-probs: the first case's policy (its temperature) + N(0, 0.3)
    res, _ = run_case(fx, runs[0][2] + ["--steps", "1"], group)
    g = torch.Generator().manual_seed(5000 + idx)
    old = [l + NOISE_STD * torch.randn(l.shape, generator=g, dtype=DT) for l in res["logprobs0"]]
    # keep every token of every case, and of every trajectory step, at least MARGIN (in log-ratio)
    # away from the clip boundaries: shift the old log-prob of offending tokens by -0.01 and retry
    for it in range(100):
        group["old_logprobs"] = [o.tolist() for o in old]
        bad = [torch.zeros(o.shape, dtype=torch.bool) for o in old]
        for _, _, flags in runs:
            res, a = run_case(fx, flags, group)
            eh = a.epsilon if a.epsilon_high is None else a.epsilon_high
            for lps in res["logprobs"]:
                for i, (l, o) in enumerate(zip(lps, old)):
                    lr = l - o
                    bad[i] |= ((lr - math.log(1 - a.epsilon)).abs() < MARGIN) | \
                        ((lr - math.log(1 + eh)).abs() < MARGIN)
        moved = sum(int(b.sum()) for b in bad)
        if not moved:
            break
        for o, b in zip(old, bad):
            o[b] -= 0.01
    else:
        raise RuntimeError("could not clear the clip margins")
    group["old_logprobs"] = [[float(x) for x in o] for o in old]
    write_json(os.path.join(FIX, fx, "group_train.json"), group)
    return gap, it


def fmt_stats(s):
    return "tokens %d  rho<1-e: A>0 %d, A<0 %d | rho>1+e: A>0 %d, A<0 %d  clip_frac low %.3f high %.3f" % (
        s["tokens"], s["low_Apos"], s["low_Aneg"], s["high_Apos"], s["high_Aneg"], s["clip_frac_low"],
        s["clip_frac_high"])


def main():
    torch.set_num_threads(1)
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        os.remove(os.path.join(OUT, f))
    make_ref_checkpoint()
    mods = make_adapter()
    print("adapter modules: %d (%s ...)" % (len(mods), ", ".join(mods[:3])))
    for idx, fx in enumerate(FIXTURES):
        gap, it = make_group_train(fx, idx)
        print("%-10s group_train.json written (router gap on response 4: %s, margin passes: %d)" %
              (fx, "n/a" if gap is None else "%.3g" % gap, it))
    os.chdir(FIX)  # all paths in cases.json are relative to fixtures/
    doc = {"note": "paths are relative to tests/reference/fixtures; run: python3 grpo_ref.py <args> --out GRAD",
           "cases": [], "trajectories": []}
    for name, fx, flags in CASES:
        args = case_args(fx, flags)
        grad = "grpo/grad_%s.safetensors" % name
        res = gr.main(args + ["--out", grad, "--quiet"])
        s = res["stats0"]
        lps = [l for l in res["logprobs0"]]
        a = parse(flags)
        eh = a.epsilon if a.epsilon_high is None else a.epsilon_high
        margin = gr.log_margin(gr.Objective(a.temperature, a.epsilon, eh), lps,
                               [torch.as_tensor(o, dtype=DT) for o in json.load(open(fx + "/group_train.json"))["old_logprobs"]])
        print("%-16s loss %.8g  grad_norm %.8g  min clip margin %.2e\n                 %s" %
              (name, res["loss"][0], res["grad_norm"][0], margin, fmt_stats(s)))
        doc["cases"].append({"name": name, "args": args, "grad": grad, "loss": res["loss"][0],
                             "grad_norm": res["grad_norm"][0], "clip_margin": margin, "stats": s})
    for name, fx, flags in TRAJ:
        args = case_args(fx, flags)
        tj, fin = "grpo/traj_%s.json" % name, "grpo/traj_%s_final.safetensors" % name
        res = gr.main(args + ["--trajectory", tj, "--out-model", fin, "--quiet"])
        print("traj %-10s loss %s\n                grad_norm %s\n                clip margin %s" %
              (name, " ".join("%.6g" % x for x in res["loss"]), " ".join("%.6g" % x for x in res["grad_norm"]),
               " ".join("%.2e" % x for x in res["clip_margin"])))
        for k, s in enumerate(res["stats"]):
            print("                step %d: %s" % (k, fmt_stats(s)))
        doc["trajectories"].append({"name": name, "args": args, "trajectory": tj, "final": fin,
                                    "loss": res["loss"], "grad_norm": res["grad_norm"],
                                    "clip_margin": res["clip_margin"]})
    write_json("grpo/cases.json", doc)
    total = 0
    new = ["next_dense_ref/config.json", "next_dense_ref/model.safetensors", "next_dense/adapter.safetensors"] + \
          ["%s/group_train.json" % fx for fx in FIXTURES] + ["grpo/" + f for f in sorted(os.listdir("grpo"))]
    for p in new:
        n = os.path.getsize(p)
        total += n
        print("  %8d  %s" % (n, p))
    print("  %8d  total new fixture bytes" % total)


if __name__ == "__main__":
    main()
