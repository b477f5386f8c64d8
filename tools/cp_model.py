#!/usr/bin/env python3
"""cp_model.py — what context parallelism should cost at N ranks (issue 22): time per
rank and bytes moved per rank of one `longstraw step`, from compute measured on one rank
and the volume of the collectives the CP capture and update make (docs/architecture.md,
"Context parallelism that scales").

    python3 tools/cp_model.py --config CFG.json --cli build/longstraw \
        --capture 8192:19.52,32768:144.06 --update 32768:149.90 \
        --prompts 32768,131072 --ranks 2,8,32 [--bandwidth 25] [--latency 20] \
        [--group-size 2] [--response 128] [--layout zigzag|contiguous]

--capture P:SECONDS,...  capture times of one rank with one thread at two prompt lengths
                         (`bench/cp`'s "1 x 1 thr" row): fit t(P) = a·P + b·P², the
                         linear part (projections, FFN, the recurrence) and the causal
                         part (attention, the indexer's scores)
--update P:SECONDS       the whole update at one of them: update − capture is the part
                         every rank repeats (the responses are replicated: score,
                         replay, optimizer), taken as not shrinking with N
--bandwidth GB/s         per rank, each direction (default 25: two ranks of one machine
                         through shared memory; an NVLink 4 GPU has about 450, an NDR
                         InfiniBand port 50)
--latency µs             per collective (default 20)

Volumes (bytes a rank receives; ring collectives move (N−1)/N of the total to each):
  hybrid, capture: an attention layer gathers every segment another rank reads, K | V
    (P · 2·n_kv·head_dim · dtype); a Gated DeltaNet layer broadcasts each of the 2N (zigzag)
    or N segments' (M, S⁰) (H_v·d_k·(d_k + d_v) f32) and conv tail.
  MLA, capture: every layer gathers the latent rows (P · (kv_lora_rank + qk_rope)), a full
    indexer layer also the index keys (P · index_head_dim).
  update: per member and attention layer the (o, lse) merge of R rows (MAX + SUM
    all-reduce); per member and full indexer layer the candidates' all-gather (N·R·k·8);
    the gradient all-reduce (2·(N−1)/N of the parameters, f32).
Prints, per P and N: compute per rank (the fit, the causal part divided evenly under
zigzag, the last rank's share under contiguous), the repeated part, bytes in, time in the
collectives, predicted capture and update, CP efficiency against one rank with N threads
at perfect thread scaling. Standard library only.
"""
import argparse
import json
import math
import subprocess
import sys


def pairs(text, what):
    out = []
    for item in text.split(","):
        p, _, t = item.partition(":")
        try:
            out.append((int(p), float(t)))
        except ValueError:
            sys.exit(f"cp_model: {what}: expected P:SECONDS, got '{item}'")
    return out


def plan(cli, config, prompt, ranks, layout):
    cmd = [cli, "plan", "--config", config, "--prompt", str(prompt), "--cp", str(ranks), "--cp-layout", layout,
           "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"cp_model: {' '.join(cmd)}: {r.stderr.strip()}")
    return json.loads(r.stdout)


def volumes(cfg, pl, P, N, layout, G, R):
    """(capture bytes, capture collectives, update bytes, update collectives) one rank receives"""
    esz = 2 if pl["state_dtype"] == "bf16" else 4
    ring = (N - 1) / N
    segs = 2 * N if layout == "zigzag" else N
    S = pl["page_size"]
    rounds = math.ceil(P / segs / S / max(1, 2048 // S))  # gather blocks of one capture chunk
    grad = 2 * ring * pl["parameters"] * 4
    if pl.get("family") == "mla":
        L, nfull = pl["mla_layers"], pl["index_layers"]
        dk = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
        cap = L * P * dk * esz + nfull * P * cfg["index_head_dim"] * esz
        ncap = (L + nfull) * rounds
        H, k = cfg["num_attention_heads"], min(cfg["index_topk"], P)
        upd = G * (L * 2 * R * H * (cfg["kv_lora_rank"] + 1) * 4 * ring + nfull * N * R * k * 8) + grad
        nupd = G * (2 * L + nfull) * 2 + 1  # forward and backward
    else:
        na, ng = pl["attention_layers"], pl["gdn_layers"]
        kvd = cfg["num_key_value_heads"] * cfg["head_dim"]
        hv, dk, dv = cfg["linear_num_value_heads"], cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
        cdim = 2 * cfg["linear_num_key_heads"] * dk + hv * dv
        cap = na * P * 2 * kvd * esz + ng * segs * (hv * dk * (dk + dv) + 3 * cdim) * 4
        ncap = na * rounds + ng * segs * 3
        H = cfg["num_attention_heads"]
        upd = G * na * 2 * R * H * (cfg["head_dim"] + 1) * 4 * ring * 2 + grad
        nupd = G * na * 2 * 2 + 1
    return cap * ring, ncap, upd, nupd


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--cli", default="build/longstraw")
    ap.add_argument("--capture", required=True)
    ap.add_argument("--update", required=True)
    ap.add_argument("--prompts", default="32768,131072")
    ap.add_argument("--ranks", default="2,8,32")
    ap.add_argument("--bandwidth", type=float, default=25.0)
    ap.add_argument("--latency", type=float, default=20.0)
    ap.add_argument("--group-size", type=int, default=2)
    ap.add_argument("--response", type=int, default=128)
    ap.add_argument("--layout", choices=["zigzag", "contiguous"], default="zigzag")
    a = ap.parse_args()
    with open(a.config) as f:
        cfg = json.load(f)
    cap = pairs(a.capture, "--capture")
    if len(cap) != 2 or cap[0][0] == cap[1][0]:
        sys.exit("cp_model: --capture: two prompt lengths")
    (p1, t1), (p2, t2) = cap
    det = p1 * p2 * p2 - p2 * p1 * p1
    lin = (t1 * p2 * p2 - t2 * p1 * p1) / det  # a: seconds per position
    quad = (p1 * t2 - p2 * t1) / det           # b: seconds per position²
    (pu, tu), = pairs(a.update, "--update")
    rep = tu - (lin * pu + quad * pu * pu)
    bw, lat = a.bandwidth * 1e9, a.latency * 1e-6
    print(f"fit (1 rank, 1 thread): capture t(P) = {lin * 1e6:.3f} µs·P + {quad * 1e12:.4f} ps·P²; "
          f"repeated per rank (update − capture at P = {pu}): {rep:.2f} s")
    print(f"links: {a.bandwidth:g} GB/s per rank, {a.latency:g} µs per collective; layout {a.layout}; "
          f"G = {a.group_size}, R = {a.response}\n")
    print("| P | N | compute / rank s | repeated s | capture bytes in / rank | update bytes in / rank "
          "| collectives | comm s | capture s | update s | efficiency capture, update |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for P in [int(x) for x in a.prompts.split(",")]:
        for N in [int(x) for x in a.ranks.split(",")]:
            pl = plan(a.cli, a.config, P, N, a.layout)
            share = 1 / N if a.layout == "zigzag" else (2 * N - 1) / (N * N)
            comp = lin * P / N + quad * P * P * share
            cb, nc, ub, nu = volumes(cfg, pl, P, N, a.layout, a.group_size, a.response)
            ccap, cupd = cb / bw + nc * lat, ub / bw + nu * lat
            tcap, tupd = comp + ccap, comp + ccap + rep + cupd
            ideal_cap = (lin * P + quad * P * P) / N  # one rank with N threads, perfect scaling
            ideal_upd = ideal_cap + rep / N
            print(f"| {P} | {N} | {comp:.2f} | {rep:.2f} | {cb / 2**20:.1f} MiB | {ub / 2**20:.1f} MiB | {nc + nu} "
                  f"| {ccap + cupd:.3f} | {tcap:.2f} | {tupd:.2f} | {ideal_cap / tcap:.2f}, {ideal_upd / tupd:.2f} |")


if __name__ == "__main__":
    main()
