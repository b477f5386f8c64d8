#!/usr/bin/python3
"""Fixtures for grpo_ref.py's --mode full (exact gradient) and --loss sft (run after
make_grad_fixtures.py, which empties fixtures/grpo/).

    /usr/bin/python3 make_full_fixtures.py            # writes the files below (≈1 min, 1 thread)
    /usr/bin/python3 make_full_fixtures.py --check    # recompute into a temp dir, compare bit for bit, write nothing

Writes, under fixtures/grpo/ (nothing else is touched):
  full_cases.json                    "cases": the 5 cases of cases.json with "--mode full";
                                     "sft_cases": the SFT cases; "self_checks": numbers of the asserts below
  grad_<case>_full.safetensors       step-0 full-mode gradients (F32; loss/grad_norm in __metadata__)
  grad_sft_<name>.safetensors        SFT gradients
  sft_one.json                       q35_dense/group_train.json's prompt + its 2nd response only (no rewards)
  fd_full.json                       central differences vs autograd in --mode full (next_dense case)
  traj_<name>.json, traj_<name>_final.safetensors
                                     5-step --mode full trajectories ("trajectories" in full_cases.json, same
                                     entry format as cases.json's): next_dense_full (GRPO, full FT: final = every
                                     checkpoint tensor, F32) and lora_sft_full (SFT, LoRA: final = the adapter)

Asserts (generation fails otherwise):
  * every full-mode gradient (GRPO and SFT, full FT and LoRA) == the gradient of the NAIVE full graph:
    one full-sequence forward over prompt+response per member with hybrid_ref.HybridModel, nothing
    detached (per-tensor relative difference <= 1e-10); the prefix-frozen SFT case == the same forward with
    the prompt state detached (check_grpo.DetachedPrefix);
  * full-mode loss == prefix-frozen loss (cases.json) to 1e-14; every token >= 2e-3 (log rho) from a clip
    edge; all four clip regions and the unclipped region populated; full != prefix-frozen gradient;
  * SFT loss == -(sum of hybrid_ref full-sequence log-probs) / (sum R_i) to 1e-13;
  * --steps 2 in full mode recaptures: step 1 == the naive full graph at the weights after step 0;
  * the 5-step full-mode trajectories recapture at every step: step k (k = 1..4) == the naive full graph at the
    weights left by a k-step run (loss to 1e-12 abs, grad_norm to 1e-11 rel); step 0 == the matching single-step
    fixture; their final files hold the same tensor names/shapes as traj_next_dense_final / traj_lora_final;
    every GRPO token of every step >= 2e-3 (log rho) from a clip edge;
    next_dense_full's losses differ from the prefix-frozen traj_next_dense's after step 0;
  * fd_full.json: |fd - autograd| <= 1e-6 * max(1, |autograd|) (h = 1e-4, old/ref log-probs fixed);
    the prompt-only embedding row has prefix-frozen gradient exactly 0 and a nonzero full-mode gradient.
"""

import argparse
import json
import math
import os
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hybrid_ref as hr  # noqa: E402
import grpo_ref as gr  # noqa: E402
import make_grad_fixtures as mg  # noqa: E402  (CASES, MARGIN; its main() is not run)
from check_grpo import DetachedPrefix, global_rel, rel_diff  # noqa: E402

DT = torch.float64
FIX = os.path.join(HERE, "fixtures")
PARITY_TOL = 1e-10
FD_H, FD_TOL = 1e-4, 1e-6

SFT_ONE = "grpo/sft_one.json"
SFT_CASES = [
    ("sft_next_dense", ["--model", "next_dense", "--group", "next_dense/group_train.json", "--loss", "sft"]),
    ("sft_next_dense_full", ["--model", "next_dense", "--group", "next_dense/group_train.json", "--loss", "sft",
                             "--mode", "full"]),
    ("sft_q35_moe_full", ["--model", "q35_moe", "--group", "q35_moe/group_train.json", "--loss", "sft",
                          "--mode", "full", "--temperature", "0.7"]),
    ("sft_next_dense_lora_full", ["--model", "next_dense", "--group", "next_dense/group_train.json",
                                  "--adapter", "next_dense/adapter.safetensors", "--lora-alpha", "4",
                                  "--loss", "sft", "--mode", "full"]),
    ("sft_q35_dense_one_full", ["--model", "q35_dense", "--group", SFT_ONE, "--loss", "sft", "--mode", "full"]),
]
# 5-step --mode full trajectories (same entry format as cases.json's "trajectories")
TRAJ_FULL = [
    ("next_dense_full", ["--model", "next_dense", "--group", "next_dense/group_train.json", "--ref-model",
                         "next_dense_ref", "--loss-type", "grpo", "--epsilon", "0.2", "--beta", "0.05", "--mode",
                         "full", "--steps", "5", "--lr", "1e-2", "--weight-decay", "0.1", "--max-grad-norm", "1.0"],
     "next_dense_full", "next_dense"),
    ("lora_sft_full", ["--model", "next_dense", "--group", "next_dense/group_train.json", "--adapter",
                       "next_dense/adapter.safetensors", "--lora-alpha", "4", "--loss", "sft", "--mode", "full",
                       "--steps", "5", "--lr", "1e-2"],
     "sft_next_dense_lora_full", "lora"),
]  # (name, args, single-step fixture whose step 0 it must equal, prefix-frozen trajectory of the same format)
FD_CASE = "next_dense"
FD_GDN_LAYER = 0
FD_GDN_TENSORS = ["A_log", "dt_bias", "conv1d.weight", "in_proj_qkvz.weight"]


def parse(args):
    return gr.build_parser().parse_args(args)


def objective(a):
    return gr.Objective(a.temperature, a.epsilon, a.epsilon_high, a.beta, a.loss_type, a.max_completion_length,
                        a.scale_rewards, loss=a.loss)


# ---------------------------------------------------------------------------- independent naive graph
def naive(args, weights=None, adapter=None):
    """Loss and gradients from ONE full-sequence forward per member (hybrid_ref.HybridModel; prompt state
    detached for --mode prefix-frozen via check_grpo.DetachedPrefix, nothing detached for --mode full).
    weights / adapter: override the checkpoint / adapter file (fp64 dicts)."""
    a = parse(args)
    model_dir = os.path.join(FIX, a.model)
    with open(os.path.join(FIX, a.group)) as f:
        group = json.load(f)
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg_raw = json.load(f)
    cfg = hr.Cfg(cfg_raw)
    w0 = hr.load_weights(model_dir) if weights is None else weights
    obj = objective(a)
    if a.adapter:
        ad, spec = gr.load_adapter(os.path.join(FIX, a.adapter), a.lora_alpha)
        params = {n: (adapter[n] if adapter is not None else t).clone().requires_grad_(True) for n, t in ad.items()}
        w = dict(w0)
        for wn, (an, bn, sc) in spec.items():
            w[wn] = w0[wn] + sc * (params[bn] @ params[an])
    else:
        used = gr.used_tensors(cfg, w0)
        params = {n: t.clone().requires_grad_(True) for n, t in w0.items() if n in used}
        w = {**w0, **params}
    P = len(group["prompt"])
    m = DetachedPrefix(cfg_raw, w, None if a.mode == "full" else P - 1)
    sft = a.loss == "sft"
    ref = None
    if obj.beta:
        rm = hr.HybridModel(os.path.join(FIX, a.ref_model)) if a.ref_model else \
            hr.HybridModel(None, cfg_raw=cfg_raw, weights=hr.load_weights(model_dir))
        with torch.no_grad():
            ref = []
            for r in group["responses"]:
                lp = torch.log_softmax(rm.forward(list(group["prompt"]) + list(r))[P - 1:P - 1 + len(r)] /
                                       obj.temperature, -1)
                ref.append(lp[torch.arange(len(r)), torch.as_tensor(r)].detach())
    A = None if sft else gr.group_advantages(group, obj)
    cw = obj.member_weights([len(r) for r in group["responses"]])
    L, lps = 0.0, []
    for i, resp in enumerate(group["responses"]):
        logits = m.forward(list(group["prompt"]) + list(resp))
        lp = torch.log_softmax(logits[P - 1:P - 1 + len(resp)] / obj.temperature, -1)
        l = lp[torch.arange(len(resp)), torch.as_tensor(resp)]
        lps.append(l.detach())
        if sft:
            L = L + cw[i] * (-l).sum()
        else:
            o = torch.as_tensor(group["old_logprobs"][i], dtype=DT)
            L = L + cw[i] * obj.terms(l, o, ref[i] if ref is not None else None, A[i]).sum()
    L.backward()
    return float(L), {n: (t.grad if t.grad is not None else torch.zeros_like(t)) for n, t in params.items()}, lps


def region_counts(s):
    inside = s["tokens"] - s["low_Apos"] - s["low_Aneg"] - s["high_Apos"] - s["high_Aneg"]
    return [s["low_Apos"], s["low_Aneg"], s["high_Apos"], s["high_Aneg"], inside]


# ---------------------------------------------------------------------------- pieces
def write_sft_one(path):
    with open(os.path.join(FIX, "q35_dense", "group_train.json")) as f:
        g = json.load(f)
    mg.write_json(path, {"prompt": g["prompt"], "responses": [g["responses"][1]]})


def grpo_full_cases(outdir, checks):
    with open(os.path.join(FIX, "grpo", "cases.json")) as f:
        frozen = {c["name"]: c for c in json.load(f)["cases"]}
    out = []
    for name, fx, flags in mg.CASES:
        args = mg.case_args(fx, flags) + ["--mode", "full"]
        grad = "grpo/grad_%s_full.safetensors" % name
        res = gr.main(args + ["--out", os.path.join(outdir, grad), "--quiet"])
        a = parse(args)
        group = json.load(open(a.group))
        old = [torch.as_tensor(o, dtype=DT) for o in group["old_logprobs"]]
        margin = gr.log_margin(objective(a), res["logprobs0"], old)
        fc = frozen[name]
        dloss = abs(res["loss"][0] - fc["loss"])
        counts = region_counts(res["stats0"])
        L_n, g_n, _ = naive(args)
        par = rel_diff(res["grads0"], g_n)
        frz = gr.main(mg.case_args(fx, flags) + ["--quiet"])  # prefix-frozen, same run conditions
        dfz = global_rel(res["grads0"], frz["grads0"])
        print("%-22s loss %.10g  grad_norm %.10g (prefix-frozen %.6g)  margin %.2e  regions %s\n"
              "%22s |loss - frozen| %.1e  vs naive full graph: loss %.1e grads %.1e  full vs frozen grads %.3f" %
              (name + "_full", res["loss"][0], res["grad_norm"][0], fc["grad_norm"], margin, counts, "",
               dloss, abs(L_n - res["loss"][0]), par, dfz))
        assert dloss <= 1e-14, (name, dloss)
        assert res["loss"][0] == frz["loss"][0], name
        assert margin >= mg.MARGIN, (name, margin)
        assert min(counts) > 0, (name, counts)
        assert abs(L_n - res["loss"][0]) <= 1e-12 and par <= PARITY_TOL, (name, par)
        assert dfz > 1e-3, (name, dfz)
        checks["parity_" + name + "_full"] = par
        checks["full_vs_frozen_global_rel_" + name] = dfz
        out.append({"name": name + "_full", "args": args, "grad": grad, "loss": res["loss"][0],
                    "grad_norm": res["grad_norm"][0], "clip_margin": margin, "stats": res["stats0"]})
    return out


def sft_cases(outdir, checks):
    out = []
    for name, args in SFT_CASES:
        grad = "grpo/grad_%s.safetensors" % name
        res = gr.main(args + ["--out", os.path.join(outdir, grad), "--quiet"])
        L_n, g_n, lps = naive(args)
        par = rel_diff(res["grads0"], g_n)
        # plain scalar value: -(sum of full-sequence log-probs) / (sum R_i)
        n_tok = sum(int(l.numel()) for l in lps)
        scal = -sum(float(x) for l in lps for x in l) / n_tok
        dsc = abs(scal - res["loss"][0])
        print("%-26s loss %.10g  grad_norm %.10g  tokens %d  vs naive graph: loss %.1e grads %.1e  scalar %.1e" %
              (name, res["loss"][0], res["grad_norm"][0], n_tok, abs(L_n - res["loss"][0]), par, dsc))
        assert par <= PARITY_TOL and abs(L_n - res["loss"][0]) <= 1e-12, (name, par)
        assert dsc <= 1e-13, (name, dsc)
        checks["parity_" + name] = par
        out.append({"name": name, "args": args, "grad": grad, "loss": res["loss"][0],
                    "grad_norm": res["grad_norm"][0], "stats": res["stats0"]})
    # prefix-frozen vs full SFT differ; LoRA full SFT with rewards missing works (sft_one) -- covered above
    return out


def trajectory_checks(checks):
    """--steps 2 in full mode recaptures the prompt with the updated weights: step 1 == naive full graph at the
    weights left by a 1-step run (fp64, in memory)."""
    specs = [("grpo next_dense full", mg.case_args("next_dense", mg.CASES[0][2]) + ["--mode", "full"]),
             ("sft lora full", SFT_CASES[3][1]),
             ("sft q35_moe full", SFT_CASES[2][1])]
    for label, args in specs:
        opt = ["--lr", "1e-2", "--weight-decay", "0.1"]
        r2 = gr.main(args + opt + ["--steps", "2", "--quiet"])
        r1 = gr.main(args + opt + ["--steps", "1", "--quiet"])
        a = parse(args)
        if a.adapter:
            L, g, _ = naive(args, adapter=r1["params"])
        else:
            L, g, _ = naive(args, weights=r1["weights"])
        gn = math.sqrt(sum(float((t * t).sum()) for t in g.values()))
        e = max(abs(L - r2["loss"][1]), abs(gn - r2["grad_norm"][1]) / gn)
        print("traj %-22s step 1: loss %.10g grad_norm %.10g  vs naive full graph at the step-0-updated weights %.1e"
              % (label, r2["loss"][1], r2["grad_norm"][1], e))
        assert e <= 1e-11, (label, e)
        checks["traj_step1_vs_naive_" + label.replace(" ", "_")] = e


def with_steps(args, k):
    out = list(args)
    out[out.index("--steps") + 1] = str(k)
    return out


def full_trajectories(outdir, single):
    """The 5-step full-mode trajectories (files traj_<name>.json / traj_<name>_final.safetensors).
    single: {name: entry} of the single-step full-mode fixtures already computed."""
    with open(os.path.join(FIX, "grpo", "cases.json")) as f:
        frozen = {t["name"]: t for t in json.load(f)["trajectories"]}
    out = []
    for name, args, step0_of, fmt_of in TRAJ_FULL:
        tj, fin = "grpo/traj_%s.json" % name, "grpo/traj_%s_final.safetensors" % name
        res = gr.main(args + ["--trajectory", os.path.join(outdir, tj), "--out-model", os.path.join(outdir, fin),
                              "--quiet"])
        a = parse(args)
        n = a.steps
        assert len(res["loss"]) == n and all(math.isfinite(x) for x in res["loss"] + res["grad_norm"]), name
        if a.loss == "grpo":  # every token of every step >= MARGIN (log rho) from a clip edge
            assert min(res["clip_margin"]) >= mg.MARGIN, (name, res["clip_margin"])
        # step 0 == the single-step fixture (same flags without --steps/--lr/..., same thread count)
        s0 = single[step0_of]
        assert res["loss"][0] == s0["loss"] and res["grad_norm"][0] == s0["grad_norm"], (name, step0_of)
        # every step recaptures: step k == naive full graph at the weights left by a k-step run
        worst = 0.0
        for k in range(1, n):
            rk = gr.main(with_steps(args, k) + ["--quiet"])
            assert rk["loss"] == res["loss"][:k] and rk["grad_norm"] == res["grad_norm"][:k], (name, k)
            if a.adapter:
                L, g, _ = naive(args, adapter=rk["params"])
            else:
                L, g, _ = naive(args, weights=rk["weights"])
            gn = math.sqrt(sum(float((t * t).sum()) for t in g.values()))
            el, eg = abs(L - res["loss"][k]), abs(gn - res["grad_norm"][k]) / gn
            assert el <= 1e-12 and eg <= 1e-11, (name, k, el, eg)
            worst = max(worst, el, eg)
        # final file: same tensor names and shapes as the prefix-frozen trajectory's final file
        ft, _ = hr.read_safetensors(os.path.join(outdir, fin))
        fz, _ = hr.read_safetensors(os.path.join(FIX, frozen[fmt_of]["final"]))
        assert list(ft) == list(fz) and all(ft[k].shape == fz[k].shape for k in fz), (name, fmt_of)
        if not a.adapter:
            fl = frozen[fmt_of]["loss"]
            assert abs(res["loss"][0] - fl[0]) <= 1e-14 and min(abs(x - y) for x, y in zip(res["loss"][1:], fl[1:])) > 1e-6
        print("traj %-16s loss %s\n%21s grad_norm %s\n%21s clip margin %s\n%21s steps 1..%d vs naive full graph "
              "at the k-step weights: worst %.1e; final: %d tensors" %
              (name, " ".join("%.10g" % x for x in res["loss"]), "", " ".join("%.10g" % x for x in res["grad_norm"]),
               "", " ".join("n/a" if x is None else "%.2e" % x for x in res["clip_margin"]), "", n - 1, worst,
               len(ft)))
        out.append({"name": name, "args": args, "trajectory": tj, "final": fin, "loss": res["loss"],
                    "grad_norm": res["grad_norm"], "clip_margin": res["clip_margin"]})
    return out


def fd_full(checks):
    name, fx, flags = [c for c in mg.CASES if c[0] == FD_CASE][0]
    args = mg.case_args(fx, flags) + ["--mode", "full"]
    a = parse(args)
    obj = objective(a)
    model_dir = os.path.join(FIX, fx)
    group = json.load(open(a.group))
    old = [torch.as_tensor(o, dtype=DT) for o in group["old_logprobs"]]  # constants (unperturbed values)
    rc, rw = gr.load_model(a.ref_model)
    ref = gr.reference_logprobs(gr.Net(rc, rw), group, obj.temperature)  # separate checkpoint: fixed
    cfg, w = gr.load_model(model_dir)
    full = gr.main(args + ["--quiet"])
    frozen = gr.main(mg.case_args(fx, flags) + ["--quiet"])
    gF, gP = full["grads0"], frozen["grads0"]

    def loss_at(name_, flat, delta):
        ww = dict(w)
        t = w[name_].clone()
        t.view(-1)[flat] += delta
        ww[name_] = t
        net = gr.Net(cfg, ww)
        with torch.no_grad():  # recapture with the perturbed weights: the full-mode objective
            return float(gr.loss_fn(net, net.capture(group["prompt"]), group, obj, old, ref))

    L0 = loss_at(gr.Net(cfg, w).pre + "embed_tokens.weight", 0, 0.0)
    assert abs(L0 - full["loss"][0]) <= 1e-14
    prompt, resps = group["prompt"], group["responses"]
    in_resp = {t for r in resps for t in r}
    cands = sorted({t for t in prompt[:-1] if t not in in_resp and t != prompt[-1]})
    emb = gr.Net(cfg, w).pre + "embed_tokens.weight"
    # the candidate with the largest full-mode row gradient (all have prefix-frozen row gradient exactly 0)
    tok = max(cands, key=lambda t: float(gF[emb][t].norm()))
    assert all(float(gP[emb][t].abs().max()) == 0.0 for t in cands)
    row = gF[emb][tok]
    cols = torch.argsort(row.abs(), descending=True)[:4].tolist()
    D = w[emb].shape[1]
    picks = [(emb, tok * D + c, "embedding row of prompt-only token %d, col %d" % (tok, c)) for c in cols]
    pre = gr.Net(cfg, w).pre + "layers.%d.linear_attn." % FD_GDN_LAYER
    for tn in FD_GDN_TENSORS:
        n = pre + tn
        diff = (gF[n] - gP[n]).flatten().abs()
        picks.append((n, int(diff.argmax()), "largest |full - prefix-frozen| entry"))
    entries, worst_abs, worst_rel = [], 0.0, 0.0
    for n, flat, why in picks:
        fd = (loss_at(n, flat, FD_H) - loss_at(n, flat, -FD_H)) / (2 * FD_H)
        ag = float(gF[n].flatten()[flat])
        pf = float(gP[n].flatten()[flat])
        err = abs(fd - ag)
        rel = err / abs(ag) if ag != 0 else float("inf")
        ok = err <= FD_TOL * max(1.0, abs(ag))
        worst_abs, worst_rel = max(worst_abs, err), max(worst_rel, rel)
        idx = list(torch.unravel_index(torch.tensor(flat), w[n].shape)) if hasattr(torch, "unravel_index") else None
        if idx is None:
            idx, rem = [], flat
            for s in reversed(w[n].shape):
                idx.append(rem % s)
                rem //= s
            idx = idx[::-1]
        entries.append({"tensor": n, "shape": list(w[n].shape), "flat_index": flat, "index": [int(i) for i in idx],
                        "why": why, "fd": fd, "autograd_full": ag, "autograd_prefix_frozen": pf,
                        "abs_err": err, "rel_err": rel})
        print("  fd %-40s [%5d] %-12s fd % .12e  autograd % .12e  |d| %.1e rel %.1e  (prefix-frozen % .6e) %s" %
              (n, flat, str(idx), fd, ag, err, rel, pf, "ok" if ok else "FAIL"))
        assert ok, (n, flat, fd, ag)
    row_full = float(gF[emb][tok].norm())
    row_frozen = float(gP[emb][tok].abs().max())
    assert row_frozen == 0.0 and row_full > 1e-6
    checks["fd_worst_abs"], checks["fd_worst_rel"] = worst_abs, worst_rel
    return {"note": "central differences of the fp64 loss of case %s in --mode full (old log-probs from the group "
                    "file and reference log-probs from next_dense_ref held fixed; the prompt is recaptured with the "
                    "perturbed weights), vs the autograd full-mode gradient; flat_index is row-major into the tensor "
                    "as stored in the checkpoint (HF shape)" % name,
            "args": args, "h": FD_H, "tol": "abs_err <= %g * max(1, |autograd|)" % FD_TOL, "loss": full["loss"][0],
            "prompt_only_token": tok, "prompt_only_candidates": cands,
            "embed_row_grad_prefix_frozen_max_abs": row_frozen, "embed_row_grad_full_norm": row_full,
            "entries": entries, "worst_abs_err": worst_abs, "worst_rel_err": worst_rel}


def generate(outdir):
    os.makedirs(os.path.join(outdir, "grpo"), exist_ok=True)
    write_sft_one(os.path.join(outdir, SFT_ONE))
    if outdir != FIX:  # --check: the cases read sft_one.json from fixtures/
        a, b = open(os.path.join(outdir, SFT_ONE)).read(), open(os.path.join(FIX, SFT_ONE)).read()
        assert a == b, "sft_one.json differs"
    checks = {}
    doc = {"note": "paths are relative to tests/reference/fixtures; run: python3 grpo_ref.py <args> --out GRAD. "
                   "Written by make_full_fixtures.py with 1 torch thread.",
           "cases": grpo_full_cases(outdir, checks), "sft_cases": sft_cases(outdir, checks)}
    single = {c["name"]: c for c in doc["cases"] + doc["sft_cases"]}
    doc["trajectories"] = full_trajectories(outdir, single)
    trajectory_checks(checks)
    fd = fd_full(checks)
    doc["self_checks"] = checks
    mg.write_json(os.path.join(outdir, "grpo", "full_cases.json"), doc)
    mg.write_json(os.path.join(outdir, "grpo", "fd_full.json"), fd)
    files = ["grpo/full_cases.json", "grpo/fd_full.json", SFT_ONE] + [c["grad"] for c in doc["cases"]] + \
        [c["grad"] for c in doc["sft_cases"]] + [p for t in doc["trajectories"] for p in (t["trajectory"], t["final"])]
    return files


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="recompute into a temp dir and compare with fixtures/grpo")
    a = ap.parse_args()
    torch.set_num_threads(1)
    os.chdir(FIX)  # paths in the cases are relative to fixtures/
    if not a.check:
        files = generate(FIX)
        total = 0
        for p in files:
            total += os.path.getsize(p)
            print("  %8d  %s" % (os.path.getsize(p), p))
        print("  %8d  total new fixture bytes" % total)
        return
    with tempfile.TemporaryDirectory() as td:
        files = generate(td)
        missing = [p for p in files if not os.path.exists(p)]
        bad = [p for p in files if p in missing or open(os.path.join(td, p), "rb").read() != open(p, "rb").read()]
        for p in files:
            print("  %-45s %s" % (p, "MISSING" if p in missing else "differs" if p in bad else "identical"))
        print("ALL IDENTICAL" if not bad else "SOME FILES DIFFER")
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
