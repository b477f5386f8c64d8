#!/usr/bin/python3
"""Generate the deterministic tiny MLA + DSA + MoE fixtures (glm_moe_dsa, deepseek_v32) and their
GRPO gradient fixtures, from the fp64 reference mla_ref.py, and assert its self-checks.

    /usr/bin/python3 make_mla_fixtures.py            # (re)writes fixtures/mla_*/
    /usr/bin/python3 make_mla_fixtures.py --check    # regenerate into a temp dir, compare bit for bit
    /usr/bin/python3 make_mla_fixtures.py --kl-only [--check]   # only cases.json "kl_cases" + grad_*_kl files

Writes under fixtures/:
  mla_<name>/{config.json, model.safetensors, group.json, expected.json[, group_train.json]}
  mla_glm_ic_ref/{config.json, model.safetensors}   reference policy for the beta != 0 case
  mla_grpo/cases.json                               every case's exact mla_ref.py flags + results,
                                                    per-fixture selection statistics, self-check numbers
  mla_grpo/grad_<case>[_full].safetensors           gradients (F32, HF names, loss/grad_norm in __metadata__)
  mla_grpo/grad_<fixture>_kl.safetensors            indexer KL cases (--indexer-kl-coef; cases.json "kl_cases")
  mla_grpo/adapter_<fixture>.safetensors            PEFT LoRA adapters (F32) of the *_lora cases, whose
                                                    gradient files hold the lora_A/lora_B gradients only
"""

import argparse
import copy
import filecmp
import json
import math
import os
import re
import shutil
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hybrid_ref as hr  # noqa: E402
import grpo_ref as gr  # noqa: E402
import mla_ref as mr  # noqa: E402
from make_fixtures import Rng, write_json  # noqa: E402
from check_grpo import global_rel, rel_diff  # noqa: E402

DT = torch.float64
ROUTER_GAP = 5e-4   # min (K-th - (K+1)-th) biased router score s' and min group-score gap
MAX_ATTEMPTS = 3000
IDX_REL = 3e-5      # index top-k robust to relative perturbations of this size (mla_ref.Recorder.indexer)
CLIP_MARGIN = 2e-3  # min |log rho - log(1 -/+ eps)|
REWARDS = [1.0, 0.25, -0.5, 0.75]
NOISE_STD = 0.3
FD_H = 1e-5
LORA_ALPHA = 4
LORA_B_STD = 0.05   # B ~ N(0, 0.05), A ~ N(0, in^-1/2): both nonzero, so both get gradients
LORA_FD_REL = 1e-6
LORA_B0_REL = 1e-12

COMMON = dict(vocab_size=97, hidden_size=32, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
              qk_head_dim=16, v_head_dim=8, index_n_heads=2, index_head_dim=16, moe_intermediate_size=8,
              intermediate_size=24, scoring_func="sigmoid", topk_method="noaux_tc", hidden_act="silu",
              attention_bias=False, attention_dropout=0.0, initializer_range=0.02, use_cache=True)

GLM = dict(model_type="glm_moe_dsa", architectures=["GlmMoeDsaForCausalLM"], max_position_embeddings=202752,
           rope_interleave=True, indexer_rope_interleave=True, rms_norm_eps=1e-5, head_dim=8,
           routed_scaling_factor=2.5, n_group=1, topk_group=1)

# seed: where the margin search starts (the seeds below were found by it: the search is kept as a guard)
FIXTURES = [
    # (a) GLM-5 layout: 1 dense + 2 MoE layers, every layer runs its indexer, F32
    dict(name="mla_glm", seed=7118, dtype="F32", P=96, resp=(1, 4, 24), extra=12,
         cfg=dict(GLM, **COMMON, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=20,
                  index_topk=8, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                  first_k_dense_replace=1, moe_layer_freq=1, norm_topk_prob=True, num_nextn_predict_layers=0,
                  rope_parameters=dict(rope_theta=1e6, rope_type="default"), tie_word_embeddings=False,
                  dtype="float32"),
         case=["--loss-type", "grpo", "--epsilon", "0.2"]),
    # (b) GLM-5.2 IndexCache: layers 1 and 3 are shared (freq 2, offset 1), BF16 (bias F32), with a reference
    dict(name="mla_glm_ic", seed=7203, dtype="BF16", P=72, resp=(1, 5, 20), extra=10, ref=True,
         cfg=dict(GLM, **COMMON, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=12,
                  index_topk=6, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                  first_k_dense_replace=1, moe_layer_freq=1, norm_topk_prob=False, num_nextn_predict_layers=0,
                  index_topk_freq=2, index_skip_topk_offset=1, indexer_types=["full", "shared", "full", "shared"],
                  index_share_for_mtp_iteration=True, rope_theta=8e6,
                  rope_parameters=dict(rope_theta=8e6, rope_type="default"), tie_word_embeddings=False,
                  dtype="bfloat16"),
         case=["--loss-type", "dapo", "--epsilon", "0.2", "--epsilon-high", "0.28", "--beta", "0.05",
               "--ref-model", "mla_glm_ic_ref", "--temperature", "0.7"]),
    # (c) DeepSeek-V3.2: YaRN (mscale), half-split indexer RoPE, 8 experts in 4 groups (keep 2), F32,
    #     plus ignored MTP tensors (model.layers.3.*)
    dict(name="mla_dsv32", seed=9285, dtype="F32", P=130, resp=(1, 6, 30), extra=14, mtp=True,
         cfg=dict(COMMON, model_type="deepseek_v32", architectures=["DeepseekV32ForCausalLM"], num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24, index_topk=12,
                  n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=4, topk_group=2,
                  first_k_dense_replace=1, moe_layer_freq=1, norm_topk_prob=True, routed_scaling_factor=2.5,
                  rms_norm_eps=1e-6, rope_theta=10000.0,
                  rope_scaling=dict(type="yarn", factor=40, original_max_position_embeddings=4096, beta_fast=32,
                                    beta_slow=1, mscale=1.0, mscale_all_dim=1.0),
                  max_position_embeddings=163840, num_nextn_predict_layers=1, tie_word_embeddings=False,
                  torch_dtype="float32"),
         case=["--loss-type", "dr_grpo", "--scale-rewards", "none", "--temperature", "0.8"]),
    # (d) precedence: mlp_layer_types over first_k_dense_replace, indexer_types over freq/offset
    #     (which would give full/shared/full/shared); tied embeddings, no shared expert, BF16; log-probs only
    dict(name="mla_glm_types", seed=7400, dtype="BF16", P=60, resp=(1, 3, 15), extra=None,
         cfg=dict(GLM, **COMMON, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=12,
                  index_topk=5, n_routed_experts=4, n_shared_experts=0, num_experts_per_tok=2,
                  mlp_layer_types=["dense", "sparse", "dense", "sparse"], first_k_dense_replace=3,
                  indexer_types=["full", "shared", "shared", "full"], index_topk_freq=2, index_skip_topk_offset=1,
                  norm_topk_prob=True, num_nextn_predict_layers=0,
                  rope_parameters=dict(rope_theta=1e6, rope_type="default"), tie_word_embeddings=True,
                  dtype="bfloat16")),
]


# ----------------------------------------------------------------------------
# weights
# ----------------------------------------------------------------------------

def gen_weights(rng, c):
    """HF-named tensors for config c (mla_ref.Cfg), in a fixed order."""
    D, V = c.D, c.V
    w = {}
    n1 = lambda shape: 1.0 + rng.normal(shape, 0.1)  # noqa: E731  (plain-weight norms)
    # tied embeddings also serve as the head: N(0, 0.2) keeps those logits at a normal scale
    w["model.embed_tokens.weight"] = rng.normal((V, D), 0.2 if c.tie else 1.0)
    for i in range(c.L):
        p = "model.layers.%d." % i
        w[p + "input_layernorm.weight"] = n1((D,))
        a = p + "self_attn."
        w[a + "q_a_proj.weight"] = rng.lin(c.rq, D)
        w[a + "q_a_layernorm.weight"] = n1((c.rq,))
        w[a + "q_b_proj.weight"] = rng.lin(c.H * (c.dn + c.dr), c.rq)
        w[a + "kv_a_proj_with_mqa.weight"] = rng.lin(c.rkv + c.dr, D)
        w[a + "kv_a_layernorm.weight"] = n1((c.rkv,))
        w[a + "kv_b_proj.weight"] = rng.lin(c.H * (c.dn + c.dv), c.rkv)
        w[a + "o_proj.weight"] = rng.lin(D, c.H * c.dv)
        if c.full_idx[i]:  # shared (IndexCache) layers ship no indexer weights (spec §5)
            x = a + "indexer."
            w[x + "wq_b.weight"] = rng.lin(c.nI * c.dI, c.rq)
            w[x + "wk.weight"] = rng.lin(c.dI, D)
            w[x + "k_norm.weight"] = n1((c.dI,))
            w[x + "k_norm.bias"] = rng.normal((c.dI,), 0.1)
            w[x + "weights_proj.weight"] = rng.lin(c.nI, D)
        w[p + "post_attention_layernorm.weight"] = n1((D,))
        m = p + "mlp."
        if c.moe_layers[i]:
            w[m + "gate.weight"] = rng.normal((c.E, D), D ** -0.5)
            w[m + "gate.e_score_correction_bias"] = rng.normal((c.E,), 0.1)
            for e in range(c.E):
                ep = m + "experts.%d." % e
                w[ep + "gate_proj.weight"] = rng.lin(c.moe_I, D)
                w[ep + "up_proj.weight"] = rng.lin(c.moe_I, D)
                w[ep + "down_proj.weight"] = rng.lin(D, c.moe_I)
            if c.n_shared > 0:
                sI = c.moe_I * c.n_shared
                w[m + "shared_experts.gate_proj.weight"] = rng.lin(sI, D)
                w[m + "shared_experts.up_proj.weight"] = rng.lin(sI, D)
                w[m + "shared_experts.down_proj.weight"] = rng.lin(D, sI)
        else:
            w[m + "gate_proj.weight"] = rng.lin(c.I, D)
            w[m + "up_proj.weight"] = rng.lin(c.I, D)
            w[m + "down_proj.weight"] = rng.lin(D, c.I)
    w["model.norm.weight"] = n1((D,))
    if not c.tie:
        w["lm_head.weight"] = rng.lin(V, D)
    return w


def add_mtp(rng, c, w):
    """a few tensors of the MTP layer (index L): the reference must ignore them (spec §5)."""
    p = "model.layers.%d." % c.L
    w[p + "enorm.weight"] = 1.0 + rng.normal((c.D,), 0.1)
    w[p + "hnorm.weight"] = 1.0 + rng.normal((c.D,), 0.1)
    w[p + "eh_proj.weight"] = rng.lin(c.D, 2 * c.D)
    w[p + "shared_head.norm.weight"] = 1.0 + rng.normal((c.D,), 0.1)


def storage_dtype(name, dt):
    return "F32" if name.endswith("e_score_correction_bias") else dt  # spec §4/§5: the bias is fp32


def write_model(d, cfg_raw, w, dt):
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    write_json(os.path.join(d, "config.json"), cfg_raw)
    hr.write_safetensors(os.path.join(d, "model.safetensors"), {n: (t, storage_dtype(n, dt)) for n, t in w.items()},
                         {"format": "pt"})


# ----------------------------------------------------------------------------
# selection margins
# ----------------------------------------------------------------------------

def record(cfg, w, prompt, responses, rec=None, lora=None):
    rec = rec or mr.Recorder(IDX_REL, ROUTER_GAP)
    net = mr.Net(cfg, w, lora)
    net.rec = rec
    with torch.no_grad():
        for j, r in enumerate(responses):
            rec.min_pos = 0 if j == 0 else len(prompt)  # count the shared prompt rows once
            net.seq_logprobs(prompt, r)
    rec.min_pos = 0
    return rec


def clear_margins(cfg, w, prompt, responses, lora=None):
    """True when every discrete selection is clear of the thresholds (stops at the first violation)."""
    try:
        record(cfg, w, prompt, responses, mr.Recorder(IDX_REL, ROUTER_GAP, fail_fast=True), lora)
    except mr.SelectionTooClose:
        return False
    return True


def roundtrip(w, dt):
    """the values the checkpoint will hold (F32 or BF16 round-to-nearest-even; the bias stays F32)."""
    out = {}
    for n, t in w.items():
        a = t.numpy().astype(np.float32)
        if storage_dtype(n, dt) == "BF16":
            a = (hr.f32_to_bf16_bits(a).astype(np.uint32) << 16).view(np.float32)
        out[n] = torch.from_numpy(a.astype(np.float64))
    return out


def rec_summary(rec):
    return {"router_gap": rec.router_gap, "group_gap": None if math.isinf(rec.group_gap) else rec.group_gap,
            "index_min_gap": rec.idx_gap_abs, "index_rows": rec.idx_rows, "index_rows_pruned": rec.idx_pruned,
            "index_zero_ties_at_cutoff": rec.zero_ties, "index_rows_multi_page64": rec.multi_page,
            "router_tokens": rec.router_tokens, "router_bias_changed": rec.bias_changed,
            "router_group_changed": rec.group_changed}


# ----------------------------------------------------------------------------
# fixture construction
# ----------------------------------------------------------------------------

def build_fixture(root, spec, log):
    d = os.path.join(root, spec["name"])
    cfg_raw = spec["cfg"]
    cfg = mr.Cfg(cfg_raw)
    V = cfg.V
    for attempt in range(MAX_ATTEMPTS):
        seed = spec["seed"] + attempt
        rng = Rng(seed)
        w = gen_weights(rng, cfg)
        if spec.get("mtp"):
            add_mtp(rng, cfg, w)
        prompt = rng.ints(spec["P"], V)
        resps = [rng.ints(n, V) for n in spec["resp"]]
        extra = rng.ints(spec["extra"], V) if spec.get("extra") else None
        allr = resps + ([extra] if extra else [])
        if clear_margins(cfg, roundtrip(w, spec["dtype"]), prompt, allr):
            break
    else:
        raise RuntimeError("%s: no seed with clear selection margins in %d tries" % (spec["name"], MAX_ATTEMPTS))
    write_model(d, cfg_raw, w, spec["dtype"])
    wr = hr.load_weights(d)
    rt = roundtrip(w, spec["dtype"])
    assert all(torch.equal(rt[n], wr[n]) for n in w) and list(wr) == list(w)
    rec = record(cfg, wr, prompt, allr)
    assert rec.ok()
    ref_rec = None
    if spec.get("ref"):  # reference policy = policy + N(0, 0.05), its own clear margins
        for ra in range(MAX_ATTEMPTS):
            g2 = torch.Generator().manual_seed(seed * 1000 + ra)
            wref = {n: t + 0.05 * torch.randn(t.shape, generator=g2, dtype=DT) for n, t in wr.items()}
            if clear_margins(cfg, roundtrip(wref, spec["dtype"]), prompt, allr):
                break
        else:
            raise RuntimeError("no reference perturbation with clear margins")
        write_model(d + "_ref", cfg_raw, wref, spec["dtype"])
        ref_rec = record(cfg, hr.load_weights(d + "_ref"), prompt, allr)
        assert ref_rec.ok()
    group = {"prompt": prompt, "responses": resps}
    write_json(os.path.join(d, "group.json"), group)
    net = mr.Net(cfg, wr)
    lps = mr.group_logprobs(net, group)
    unread = mr.unread_tensors(cfg, wr, net.used)
    assert not unread, unread
    write_json(os.path.join(d, "expected.json"), {"logprobs": lps})
    with open(os.path.join(d, "selection.json"), "w") as f:  # prompt + the last response of group.json
        json.dump(mr.selections(mr.Net(cfg, wr), list(prompt) + list(resps[-1])), f, separators=(",", ":"))
        f.write("\n")
    info = {"seed": seed, "attempts": attempt + 1, "ref_attempts": (ra + 1) if spec.get("ref") else None, "P": len(prompt), "response_lengths": [len(r) for r in allr],
            "params": sum(t.numel() for n, t in wr.items() if not mr.is_mtp_name(n, cfg.L)),
            "selection": rec_summary(rec)}
    if ref_rec is not None:
        info["ref_selection"] = rec_summary(ref_rec)
    flat = [x for r in lps for x in r]
    log("%-14s seed %d (%d tries)  P %d  R %s  params %d  mean logprob %.4f" % (
        spec["name"], seed, attempt + 1, len(prompt), info["response_lengths"], info["params"], sum(flat) / len(flat)))
    log("               selection: %s" % json.dumps(info["selection"]))
    if ref_rec is not None:
        log("               ref selection: %s" % json.dumps(info["ref_selection"]))
    return d, cfg, wr, group, extra, info


# ----------------------------------------------------------------------------
# self-checks on the forward
# ----------------------------------------------------------------------------

def maxdiff(a, b):
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def meandiff(a, b):
    fa = [x for r in a for x in r]
    fb = [x for r in b for x in r]
    return sum(abs(x - y) for x, y in zip(fa, fb)) / len(fa)


def forward_checks(cfg, raw, w, group, log):
    out = {}
    net = mr.Net(cfg, w)
    plain = mr.group_logprobs(net, group)
    P = group["prompt"]
    with torch.no_grad():
        st = net.capture(P)
        stateful = [net.branch_logprobs(st, P, r).tolist() for r in group["responses"]]
        stc = net.capture(P, chunk=17)  # capture in chunks: each chunk extends the state
        chunked = [net.branch_logprobs(stc, P, r).tolist() for r in group["responses"]]
        # the state is exactly (c_kv, k_pe, kI) of positions 0..P-2
        full_state = net.forward(P[:-1], 0, net.empty_state())[1]
        st_diff = max(float((a[k] - b[k]).abs().max()) for a, b in zip(st, full_state) for k in a if a[k] is not None)
    out["plain_vs_stateful"] = maxdiff(plain, stateful)
    out["plain_vs_chunked_capture"] = maxdiff(plain, chunked)
    out["state_one_shot_vs_chunked"] = max(float((a[k] - b[k]).abs().max()) for a, b in zip(st, stc)
                                           for k in a if a[k] is not None)
    assert st_diff == 0.0
    assert out["plain_vs_stateful"] <= 1e-10, out
    assert out["plain_vs_chunked_capture"] <= 1e-10, out
    # an independent token-by-token implementation (absorbed MLA, python top-k and routing)
    seq = list(P) + list(max(group["responses"], key=len))
    with torch.no_grad():
        a = net.forward(seq, 0, net.empty_state())[0]
        b = mr.slow_logits(cfg, w, seq)
    out["vectorised_vs_slow_absorbed_logits"] = float((a - b).abs().max())
    assert out["vectorised_vs_slow_absorbed_logits"] <= 1e-10, out

    # negative controls: each convention matters on these weights
    def variant(**kw):
        c2 = copy.copy(cfg)
        for k, v in kw.items():
            setattr(c2, k, v)
        return mr.group_logprobs(mr.Net(c2, w), group)

    ctl = {}
    ctl["mla_rope_pairing_flipped"] = meandiff(plain, variant(mla_interleave=not cfg.mla_interleave))
    ctl["indexer_rope_pairing_flipped"] = meandiff(plain, variant(idx_interleave=not cfg.idx_interleave))
    ctl["dense_attention_(topk_off)"] = meandiff(plain, variant(k=10 ** 9))
    ctl["sigma_without_mscale"] = meandiff(plain, variant(sigma=(cfg.dn + cfg.dr) ** -0.5)) if cfg.yarn else None
    if cfg.yarn:
        c2 = copy.copy(cfg)
        c2.yarn = None
        n2 = mr.Net(c2, w)  # same sigma (with m^2), plain frequencies
        ctl["yarn_frequencies_off"] = meandiff(plain, mr.group_logprobs(n2, group))
    if not all(cfg.full_idx):
        n3 = mr.Net(cfg, w)
        n3.shared_dense = True
        ctl["shared_layers_dense_instead_of_reuse"] = meandiff(plain, mr.group_logprobs(n3, group))
    if cfg.lat_eps != 1e-6:
        ctl["latent_norm_eps_1e-6"] = meandiff(plain, mr.group_logprobs(mr.Net(mr.Cfg(raw, 1e-6), w), group))
    if cfg.n_group > 1:
        ctl["no_group_limit"] = meandiff(plain, variant(n_group=1, topk_group=1))
    for k in ("mla_rope_pairing_flipped", "indexer_rope_pairing_flipped", "dense_attention_(topk_off)"):
        assert ctl[k] > 1e-3, (k, ctl[k])
    if "shared_layers_dense_instead_of_reuse" in ctl:
        assert ctl["shared_layers_dense_instead_of_reuse"] > 1e-3, ctl
    out["negative_controls_mean_abs_logprob_diff"] = {k: v for k, v in ctl.items() if v is not None}
    log("               forward: plain-vs-stateful %.2e  chunked %.2e  slow %.2e" % (
        out["plain_vs_stateful"], out["plain_vs_chunked_capture"], out["vectorised_vs_slow_absorbed_logits"]))
    log("               controls: %s" % ", ".join("%s %.3g" % kv for kv in out["negative_controls_mean_abs_logprob_diff"].items()))
    return out


# ----------------------------------------------------------------------------
# GRPO fixtures
# ----------------------------------------------------------------------------

def parse(flags):
    return mr.build_parser().parse_args(["--model", "x", "--group", "y"] + flags)


def case_run(root, fx, flags, group, mode):
    a = parse(flags)
    ref = None if a.ref_model is None else os.path.join(root, a.ref_model)
    if a.adapter is None:
        return mr.run(os.path.join(root, fx), group, mr.objective_from_args(a), ref_model=ref, grad_mode=mode,
                      indexer_kl_coef=a.indexer_kl_coef), a
    return mr.run(os.path.join(root, fx), group, mr.objective_from_args(a), ref_model=ref, grad_mode=mode,
                  adapter=os.path.join(root, a.adapter), lora_alpha=a.lora_alpha), a


def make_group_train(root, spec, group, extra, idx):
    fx = spec["name"]
    g = {"prompt": group["prompt"], "responses": group["responses"] + [extra], "rewards": list(REWARDS)}
    res, a = case_run(root, fx, spec["case"], g, "prefix-frozen")
    gen = torch.Generator().manual_seed(9000 + idx)
    old = [l + NOISE_STD * torch.randn(l.shape, generator=gen, dtype=DT) for l in res["logprobs0"]]
    eh = a.epsilon if a.epsilon_high is None else a.epsilon_high
    for it in range(100):
        bad = [((l - o - math.log(1 - a.epsilon)).abs() < CLIP_MARGIN) | ((l - o - math.log(1 + eh)).abs() < CLIP_MARGIN)
               for l, o in zip(res["logprobs0"], old)]
        if not any(bool(b.any()) for b in bad):
            break
        for o, b in zip(old, bad):
            o[b] -= 0.01
    else:
        raise RuntimeError("could not clear the clip margins")
    g["old_logprobs"] = [[float(x) for x in o] for o in old]
    write_json(os.path.join(root, fx, "group_train.json"), g)
    return g


def detached_fullseq_grads(root, fx, flags, group, detach, dtype=DT):
    """the gradient of one full-sequence forward per member (prompt + response, no state), with c_kv, k_pe
    and kI of positions < P-1 detached (prefix-frozen) or nothing detached (the naive full graph).
    dtype float32: the same computation in float32 (conditioning check).
    With --adapter in flags the parameters are the adapter tensors (LoRA; no --ref-model: base reference)."""
    a = parse(flags)
    obj = mr.objective_from_args(a)
    cfg, w = mr.load_model(os.path.join(root, fx))
    w = {n: t.to(dtype) for n, t in w.items()}
    lora = None
    if a.adapter is not None:
        ts, sp = gr.load_adapter(os.path.join(root, a.adapter), a.lora_alpha)
        params = {n: t.to(dtype) for n, t in ts.items()}
        lora = gr.make_lora(params, sp)
    else:
        used = mr.used_tensors(cfg, w)
        params = {n: t for n, t in w.items() if n in used}
    for t in params.values():
        t.requires_grad_(True)
    ref = None
    if a.beta != 0.0:
        if a.ref_model is not None:
            rc, rw = mr.load_model(os.path.join(root, a.ref_model))
            rn = mr.Net(rc, {n: t.to(dtype) for n, t in rw.items()})
        else:  # LoRA without a reference model: the base, adapters off
            rn = mr.Net(cfg, {n: t.detach() for n, t in w.items()})
        with torch.no_grad():
            ref = [rn.seq_logprobs(group["prompt"], r, obj.temperature) for r in group["responses"]]
    net = mr.Net(cfg, w, lora)
    P = len(group["prompt"])
    A = gr.group_advantages(group, obj)
    cw = obj.member_weights([len(r) for r in group["responses"]])
    old = [torch.as_tensor(o, dtype=dtype) for o in group["old_logprobs"]]
    A = A.to(dtype)
    L = 0.0
    for i, r in enumerate(group["responses"]):
        l = net.seq_logprobs(group["prompt"], r, obj.temperature, cut=(P - 1) if detach else None)
        L = L + cw[i] * obj.terms(l, old[i], None if ref is None else ref[i], A[i]).sum()
    L.backward()
    g = {n: (t.grad.to(DT) if t.grad is not None else torch.zeros_like(t, dtype=DT)) for n, t in params.items()}
    for t in params.values():
        t.requires_grad_(False)
    return float(L), g


def zero_grad_names(names):
    return [n for n in names if ".self_attn.indexer." in n or n.endswith("e_score_correction_bias")]


def fd_check(root, fx, flags, group, g_full, g_pf, log):
    """central differences of the fp64 loss (full mode: the prompt is recaptured at each point; old and
    reference log-probs fixed) against autograd, with the discrete selections checked unchanged."""
    a = parse(flags)
    obj = mr.objective_from_args(a)
    cfg, w = mr.load_model(os.path.join(root, fx))
    ref = None
    if a.beta != 0.0:
        rc, rw = mr.load_model(os.path.join(root, a.ref_model))
        ref = gr.reference_logprobs(mr.Net(rc, rw), group, obj.temperature)
    old = [torch.as_tensor(o, dtype=DT) for o in group["old_logprobs"]]

    def loss():
        net = mr.Net(cfg, w)
        net.rec = mr.Recorder(IDX_REL, ROUTER_GAP)
        with torch.no_grad():
            L = float(gr.loss_fn(net, net.capture(group["prompt"]), group, obj, old=old, ref=ref))
        sels = net.rec.sels
        return L, sels

    L0, sels0 = loss()
    picks = []
    names = list(w)
    first_moe = next(i for i in range(cfg.L) if cfg.moe_layers[i])
    last = cfg.L - 1
    want = ["model.layers.0.self_attn.kv_b_proj.weight", "model.layers.0.self_attn.q_a_proj.weight",
            "model.layers.%d.self_attn.kv_a_proj_with_mqa.weight" % last,
            "model.layers.0.self_attn.kv_a_layernorm.weight", "model.layers.%d.mlp.gate.weight" % first_moe]
    # the routed expert with the largest gradient, and the shared expert
    ex = [n for n in names if n.startswith("model.layers.%d.mlp.experts." % first_moe) and n.endswith("down_proj.weight")]
    want.append(max(ex, key=lambda n: float(g_full[n].abs().max())))
    if cfg.n_shared:
        want.append("model.layers.%d.mlp.shared_experts.up_proj.weight" % first_moe)
    for n in want:
        picks.append((n, int(g_full[n].abs().flatten().argmax())))
    # the k_pe rows of kv_a_proj_with_mqa (the rope key): largest |g| among rows >= rkv
    n = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
    sub = g_full[n][cfg.rkv:].abs().flatten()
    picks.append((n, cfg.rkv * cfg.D + int(sub.argmax())))
    # an embedding row of a token that appears only in the prompt (not its last token): zero prefix-frozen grad
    only = sorted(set(group["prompt"][:-1]) - set(group["prompt"][-1:]) - {t for r in group["responses"] for t in r})
    tok = only[0]
    e = "model.embed_tokens.weight"
    picks.append((e, tok * cfg.D + int(g_full[e][tok].abs().argmax())))
    # indexer weights and the router bias: the loss must not move at all
    zero = [n for n in zero_grad_names(names)]
    zpicks = [(n, int(torch.randint(0, w[n].numel(), (1,), generator=torch.Generator().manual_seed(j)))) for j, n in
              enumerate(zero)][:8]
    rows, worst_rel, worst_abs = [], 0.0, 0.0
    for n, flat in picks + zpicks:
        t = w[n].view(-1)
        x0 = float(t[flat])
        t[flat] = x0 + FD_H
        Lp, sp = loss()
        t[flat] = x0 - FD_H
        Lm, sm = loss()
        t[flat] = x0
        same = all(bool((a_ == b_).all()) for a_, b_ in zip(sp, sels0)) and \
            all(bool((a_ == b_).all()) for a_, b_ in zip(sm, sels0))
        assert same, "selection changed under the FD step for %s" % n
        fd = (Lp - Lm) / (2 * FD_H)
        ga = float(g_full[n].reshape(-1)[flat])
        gp = float(g_pf[n].reshape(-1)[flat])
        if (n, flat) in zpicks:
            assert Lp == L0 and Lm == L0 and ga == 0.0 and gp == 0.0, (n, Lp - L0, Lm - L0, ga)
        else:
            err = abs(fd - ga)
            rel = err / max(abs(ga), 1e-12)
            worst_abs, worst_rel = max(worst_abs, err), max(worst_rel, rel)
            assert err <= 1e-6 * max(1.0, abs(ga)), (n, fd, ga)
        rows.append({"tensor": n, "flat_index": flat, "fd": fd, "autograd_full": ga, "autograd_prefix_frozen": gp})
    assert any(r["tensor"] == e and r["autograd_prefix_frozen"] == 0.0 and r["autograd_full"] != 0.0 for r in rows)
    log("               FD (h=%g) %d entries: worst abs err %.2e, worst rel err %.2e; %d indexer/bias entries exactly 0"
        % (FD_H, len(picks), worst_abs, worst_rel, len(zpicks)))
    return {"entries": rows, "worst_abs_err": worst_abs, "worst_rel_err": worst_rel, "h": FD_H,
            "prompt_only_token": tok}


def fp32_check(cfg, w, prompt, responses, log, label="policy", lora=None):
    """the same reference in float32: identical selections (index top-k and experts) on every sequence,
    and the log-prob difference.  lora: {weight: (A, B, scale)} (fp64), run unmerged in both precisions."""
    w32 = {n: t.to(torch.float32) for n, t in w.items()}
    l32 = None if lora is None else {k: (A.to(torch.float32), B.to(torch.float32), s) for k, (A, B, s) in lora.items()}
    n64, n32 = mr.Net(cfg, w, lora), mr.Net(cfg, w32, l32)
    worst, same = 0.0, True
    for r in responses:
        seq = list(prompt) + list(r)
        s64, s32 = mr.selections(n64, seq), mr.selections(n32, seq)
        same = same and s64 == s32
        with torch.no_grad():
            a = n64.seq_logprobs(prompt, r)
            b = n32.seq_logprobs(prompt, r).to(DT)
        worst = max(worst, float((a - b).abs().max()))
    assert same, "float32 run picks different keys or experts (%s)" % label
    return worst


def grpo_case(root, spec, group, log):
    fx = spec["name"]
    args = ["--model", fx, "--group", fx + "/group_train.json"] + spec["case"]
    entries, grads, results = [], {}, {}
    for mode in ("prefix-frozen", "full"):
        res, a = case_run(root, fx, spec["case"], group, mode)
        name = fx if mode == "prefix-frozen" else fx + "_full"
        gfile = "mla_grpo/grad_%s.safetensors" % name
        gr.write_grads(os.path.join(root, gfile), res)
        eh = a.epsilon if a.epsilon_high is None else a.epsilon_high
        margin = gr.log_margin(gr.Objective(a.temperature, a.epsilon, eh), res["logprobs0"],
                               [torch.as_tensor(o, dtype=DT) for o in group["old_logprobs"]])
        entries.append({"name": name, "args": args + (["--mode", "full"] if mode == "full" else []), "grad": gfile,
                        "loss": res["loss"][0], "grad_norm": res["grad_norm"][0], "clip_margin": margin,
                        "stats": res["stats0"]})
        grads[mode] = res["grads0"]
        results[mode] = res
        s = res["stats0"]
        log("%-20s loss %.8g  grad_norm %.8g  clip margin %.2e  rho<1-e (A>0 %d, A<0 %d) rho>1+e (A>0 %d, A<0 %d)" % (
            name, res["loss"][0], res["grad_norm"][0], margin, s["low_Apos"], s["low_Aneg"], s["high_Apos"],
            s["high_Aneg"]))
    chk = {}
    pf, fu = results["prefix-frozen"], results["full"]
    chk["loss_prefix_frozen_minus_full"] = abs(pf["loss"][0] - fu["loss"][0])
    assert chk["loss_prefix_frozen_minus_full"] <= 1e-14
    assert entries[0]["clip_margin"] >= CLIP_MARGIN
    Ld, gd = detached_fullseq_grads(root, fx, spec["case"], group, detach=True)
    Ln, gn = detached_fullseq_grads(root, fx, spec["case"], group, detach=False)
    chk["prefix_frozen_vs_fullseq_detached_loss"] = abs(Ld - pf["loss"][0])
    chk["prefix_frozen_vs_fullseq_detached_grad_worst_rel"] = rel_diff(grads["prefix-frozen"], gd)
    chk["full_vs_fullseq_naive_loss"] = abs(Ln - fu["loss"][0])
    chk["full_vs_fullseq_naive_grad_worst_rel"] = rel_diff(grads["full"], gn)
    chk["full_vs_prefix_frozen_global_rel"] = global_rel(grads["full"], grads["prefix-frozen"])
    assert chk["prefix_frozen_vs_fullseq_detached_loss"] <= 1e-12 and chk["full_vs_fullseq_naive_loss"] <= 1e-12, chk
    assert chk["prefix_frozen_vs_fullseq_detached_grad_worst_rel"] <= 1e-10, chk
    assert chk["full_vs_fullseq_naive_grad_worst_rel"] <= 1e-10, chk
    assert chk["full_vs_prefix_frozen_global_rel"] > 1e-2, chk
    # the gradient files: every read tensor (checkpoint order), indexer and router bias exactly zero
    for e in entries:
        ts, meta = hr.read_safetensors(os.path.join(root, e["grad"]))
        assert list(ts) == list(pf["grads0"]), "gradient file order"
        z = zero_grad_names(ts)
        assert z and all(float(ts[n].abs().max()) == 0.0 for n in z), "indexer / bias gradient not zero"
        assert all(not mr.is_mtp_name(n, pf["cfg"].L) for n in ts)
        assert float(meta["loss"]) == e["loss"]
    chk["zero_grad_tensors"] = len(zero_grad_names(list(pf["grads0"])))
    stats = entries[0]["stats"]
    assert all(stats[k] > 0 for k in ("low_Apos", "low_Aneg", "high_Apos", "high_Aneg")), stats
    L32, g32 = detached_fullseq_grads(root, fx, spec["case"], group, detach=True, dtype=torch.float32)
    chk["fp32_prefix_frozen_grad_worst_rel"] = rel_diff(g32, grads["prefix-frozen"])
    chk["fp32_loss_abs_diff"] = abs(L32 - pf["loss"][0])
    assert chk["fp32_prefix_frozen_grad_worst_rel"] < 1e-3, chk
    log("               float32 run of the reference: loss diff %.1e, worst per-tensor grad rel err %.1e" % (
        chk["fp32_loss_abs_diff"], chk["fp32_prefix_frozen_grad_worst_rel"]))
    chk["fd_full_mode"] = fd_check(root, fx, spec["case"], group, grads["full"], grads["prefix-frozen"], log)
    log("               prefix-frozen == full-seq detached: loss %.1e grads %.1e;  full == naive full graph: "
        "loss %.1e grads %.1e;  |full - pf| / |pf| = %.3f" % (
            chk["prefix_frozen_vs_fullseq_detached_loss"], chk["prefix_frozen_vs_fullseq_detached_grad_worst_rel"],
            chk["full_vs_fullseq_naive_loss"], chk["full_vs_fullseq_naive_grad_worst_rel"],
            chk["full_vs_prefix_frozen_global_rel"]))
    # the CLI reproduces the written file bit for bit
    return entries, chk


def check_cli_logprobs(root, name, log):
    """mla_ref.py --logprobs-out / --selection-out reproduce expected.json / selection.json."""
    with tempfile.TemporaryDirectory() as tmp:
        lp, sl = os.path.join(tmp, "lp.json"), os.path.join(tmp, "sel.json")
        d = os.path.join(root, name)
        mr.main(["--model", d, "--group", os.path.join(d, "group.json"), "--logprobs-out", lp, "--selection-out", sl])
        with open(lp) as f, open(os.path.join(d, "expected.json")) as g:
            assert json.load(f)["logprobs"] == json.load(g)["logprobs"], name
        assert filecmp.cmp(sl, os.path.join(d, "selection.json"), shallow=False), name


def check_cli(root, entry, log):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "g.safetensors")
        cwd = os.getcwd()
        os.chdir(root)
        try:
            mr.main(entry["args"] + ["--out", out, "--quiet"])
        finally:
            os.chdir(cwd)
        same = filecmp.cmp(out, os.path.join(root, entry["grad"]), shallow=False)
    assert same, "CLI output differs from %s" % entry["grad"]
    log("               CLI %s reproduces %s" % (" ".join(entry["args"][4:]) or "(defaults)", entry["grad"]))


# ----------------------------------------------------------------------------
# LoRA cases (PEFT adapters on mla_glm and mla_dsv32)
# ----------------------------------------------------------------------------

MLA_PROJ = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")


def glm_lora_targets(cfg, names):
    """rank 2 on every layer's MLA projections, rank 3 on three FFN matrices (routed, shared, dense)."""
    r3 = {"model.layers.1.mlp.experts.0.gate_proj.weight", "model.layers.2.mlp.shared_experts.down_proj.weight",
          "model.layers.0.mlp.up_proj.weight"}
    out = []
    for n in names:
        m = re.match(r"model\.layers\.(\d+)\.self_attn\.([a-z_]+)\.weight$", n)
        if m and int(m.group(1)) < cfg.L and m.group(2) in MLA_PROJ:
            out.append((n, 2))
        elif n in r3:
            out.append((n, 3))
    return out


def dsv32_lora_targets(cfg, names):
    """rank 2 on every layer's q_b_proj, kv_b_proj, o_proj and on every routed expert's down_proj of layer 1."""
    out = []
    for n in names:
        m = re.match(r"model\.layers\.(\d+)\.self_attn\.(q_b_proj|kv_b_proj|o_proj)\.weight$", n)
        if (m and int(m.group(1)) < cfg.L) or re.match(r"model\.layers\.1\.mlp\.experts\.\d+\.down_proj\.weight$", n):
            out.append((n, 2))
    return out


# fx: the fixture (its group_train.json and case flags); seed: where the adapter's margin search starts
# (the committed seeds were found by it); flags: added to the fixture's case flags besides --adapter/--lora-alpha;
# fd: the adapter tensors of the prefix-frozen finite-difference check ("ffn": the FFN adapter tensor with the
# largest |g|)
LORA_CASES = [
    dict(fx="mla_glm", adapter="adapter_mla_glm", seed=5103, targets=glm_lora_targets, flags=[],
         modes=("prefix-frozen", "full"),
         fd=["model.layers.0.self_attn.q_a_proj.lora_A", "model.layers.2.self_attn.kv_b_proj.lora_B", "ffn"]),
    dict(fx="mla_dsv32", adapter="adapter_mla_dsv32", seed=5201, targets=dsv32_lora_targets, flags=["--beta", "0.05"],
         modes=("prefix-frozen",),
         fd=["model.layers.0.self_attn.q_b_proj.lora_A", "model.layers.2.self_attn.o_proj.lora_B", "ffn"]),
]


def make_adapter(w, targets, seed, zero_b=False):
    """PEFT tensors {name: fp64 tensor holding F32 values}, lora_A then lora_B per module, in checkpoint order."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for n, r in targets:
        o, inp = w[n].shape
        mod = gr.PEFT_PREFIX + n[:-len(".weight")]
        A = torch.randn(r, inp, generator=g, dtype=DT) * inp ** -0.5
        B = torch.randn(o, r, generator=g, dtype=DT) * LORA_B_STD
        out[mod + ".lora_A.weight"] = A.to(torch.float32).to(DT)
        out[mod + ".lora_B.weight"] = torch.zeros_like(B) if zero_b else B.to(torch.float32).to(DT)
    return out


def write_adapter(path, ad):
    hr.write_safetensors(path, {n: (t, "F32") for n, t in ad.items()}, {"format": "pt"})


def load_lora(path):
    ts, sp = gr.load_adapter(path, LORA_ALPHA)
    return ts, sp, gr.make_lora(ts, sp)


def lora_flags(L, spec):
    return spec["case"] + L["flags"] + ["--adapter", "mla_grpo/%s.safetensors" % L["adapter"],
                                        "--lora-alpha", str(LORA_ALPHA)]


def clip_ok(res, a, group):
    eh = a.epsilon if a.epsilon_high is None else a.epsilon_high
    margin = gr.log_margin(gr.Objective(a.temperature, a.epsilon, eh), res["logprobs0"],
                           [torch.as_tensor(o, dtype=DT) for o in group["old_logprobs"]])
    s = res["stats0"]
    regions = all(s[k] > 0 for k in ("low_Apos", "low_Aneg", "high_Apos", "high_Aneg"))
    return margin, margin >= CLIP_MARGIN and regions


def build_adapter(root, L, spec, group, log):
    """the adapter file: the first seed (from L["seed"]) whose LoRA policy keeps every selection margin on every
    group_train sequence (as the base fixtures do) and every token >= CLIP_MARGIN from a clip edge, with all four
    clip regions populated (group_train.json is the base fixture's and is not changed)."""
    fx = L["fx"]
    cfg, w = mr.load_model(os.path.join(root, fx))
    targets = L["targets"](cfg, list(w))
    path = os.path.join(root, "mla_grpo", L["adapter"] + ".safetensors")
    flags = lora_flags(L, spec)
    for attempt in range(MAX_ATTEMPTS):
        seed = L["seed"] + attempt
        write_adapter(path, make_adapter(w, targets, seed))
        _, _, lora = load_lora(path)
        if not clear_margins(cfg, w, group["prompt"], group["responses"], lora):
            continue
        res, a = case_run(root, fx, flags, group, "prefix-frozen")
        margin, ok = clip_ok(res, a, group)
        if ok:
            break
    else:
        raise RuntimeError("%s: no adapter seed with clear margins in %d tries" % (L["adapter"], MAX_ATTEMPTS))
    rec = record(cfg, w, group["prompt"], group["responses"], lora=lora)
    assert rec.ok()
    info = {"fixture": fx, "seed": seed, "attempts": attempt + 1, "lora_alpha": LORA_ALPHA,
            "init": "A ~ N(0, in^-1/2), B ~ N(0, %g), stored F32" % LORA_B_STD,
            "modules": [[n[:-len(".weight")], r] for n, r in targets], "selection": rec_summary(rec),
            "clip_margin": margin}
    log("%-20s seed %d (%d tries)  %d modules  %d bytes  selection: %s" % (
        L["adapter"], seed, attempt + 1, len(targets), os.path.getsize(path), json.dumps(info["selection"])))
    return info, flags


def b0_check(root, L, fx, flags, group, modes, log):
    """(a) with B = 0 the forward is the base model's, and dL/dB = (alpha/r) G A^T with G the full-FT gradient of
    the un-adapted model (same flags, same group, same mode); dL/dA = (alpha/r) B^T G = 0 exactly."""
    cfg, w = mr.load_model(os.path.join(root, fx))
    targets = L["targets"](cfg, list(w))
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        p0 = os.path.join(tmp, "b0.safetensors")
        ts, _ = hr.read_safetensors(os.path.join(root, "mla_grpo", L["adapter"] + ".safetensors"))
        write_adapter(p0, {n: (torch.zeros_like(t) if n.endswith(".lora_B.weight") else t) for n, t in ts.items()})
        a = parse(flags)
        ref = None if a.ref_model is None else os.path.join(root, a.ref_model)
        obj = mr.objective_from_args(a)
        for mode in modes:
            rl = mr.run(os.path.join(root, fx), group, obj, ref_model=ref, grad_mode=mode, adapter=p0,
                        lora_alpha=a.lora_alpha)
            rf = mr.run(os.path.join(root, fx), group, obj, ref_model=ref, grad_mode=mode)
            assert rl["loss"][0] == rf["loss"][0], (rl["loss"], rf["loss"])
            gb, want = {}, {}
            for n, r in targets:
                mod = gr.PEFT_PREFIX + n[:-len(".weight")]
                A = ts[mod + ".lora_A.weight"]
                gb[n] = rl["grads0"][mod + ".lora_B.weight"]
                want[n] = (a.lora_alpha / r) * rf["grads0"][n] @ A.T
                assert float(rl["grads0"][mod + ".lora_A.weight"].abs().max()) == 0.0
            worst = rel_diff(gb, want)
            assert worst <= LORA_B0_REL, (mode, worst)
            out[mode] = {"grad_B_vs_scale_G_At_worst_rel": worst, "grad_B_vs_scale_G_At_global_rel": global_rel(gb, want),
                         "grad_A_max_abs": 0.0, "loss_equals_base": True}
    log("               (a) B = 0: grad_B == (alpha/r) G A^T, worst per-tensor rel %s; grad_A == 0; loss == base" % (
        ", ".join("%s %.1e" % (m, out[m]["grad_B_vs_scale_G_At_worst_rel"]) for m in modes)))
    return out


def lora_fd_check(root, L, fx, flags, group, g_pf, log):
    """(b) central differences (h = FD_H) of the loss w.r.t. one entry (largest |g|) of three different adapter
    tensors, prefix-frozen: the prompt state (captured with the unperturbed adapter), old and reference log-probs
    are held fixed; the selections of the branches are checked unchanged."""
    a = parse(flags)
    obj = mr.objective_from_args(a)
    cfg, w = mr.load_model(os.path.join(root, fx))
    ts, sp, _ = load_lora(os.path.join(root, a.adapter))
    ref = None
    if a.beta != 0.0:
        rn = mr.Net(*mr.load_model(os.path.join(root, a.ref_model))) if a.ref_model else mr.Net(cfg, w)
        ref = gr.reference_logprobs(rn, group, obj.temperature)
    old = [torch.as_tensor(o, dtype=DT) for o in group["old_logprobs"]]
    with torch.no_grad():
        state = mr.Net(cfg, w, gr.make_lora(ts, sp)).capture(group["prompt"])

    def loss():
        net = mr.Net(cfg, w, gr.make_lora(ts, sp))
        net.rec = mr.Recorder(IDX_REL, ROUTER_GAP)
        with torch.no_grad():
            Lv = float(gr.loss_fn(net, state, group, obj, old=old, ref=ref))
        return Lv, [s.clone() for s in net.rec.sels], [(i, e.clone()) for i, e in net.rec.experts]

    _, sels0, ex0 = loss()
    names = []
    for f in L["fd"]:
        if f == "ffn":
            cand = [n for n in ts if ".mlp." in n]
            names.append(max(cand, key=lambda n: float(g_pf[n].abs().max())))
        else:
            names.append(gr.PEFT_PREFIX + f + ".weight")
    assert len(set(names)) == 3 and any("lora_A" in n for n in names) and any("lora_B" in n for n in names)
    rows, worst = [], 0.0
    for n in names:
        flat = int(g_pf[n].abs().flatten().argmax())
        t = ts[n].view(-1)
        x0 = float(t[flat])
        t[flat] = x0 + FD_H
        Lp, sp_, ep = loss()
        t[flat] = x0 - FD_H
        Lm, sm, em = loss()
        t[flat] = x0
        same = all(bool(torch.equal(x, y)) for s in (sp_, sm) for x, y in zip(s, sels0)) and \
            all(i == j and bool(torch.equal(x, y)) for e in (ep, em) for (i, x), (j, y) in zip(e, ex0))
        assert same, "selection changed under the FD step for %s" % n
        fd = (Lp - Lm) / (2 * FD_H)
        ga = float(g_pf[n].reshape(-1)[flat])
        rel = abs(fd - ga) / abs(ga)
        assert rel <= LORA_FD_REL, (n, fd, ga, rel)
        worst = max(worst, rel)
        rows.append({"tensor": n, "flat_index": flat, "fd": fd, "autograd_prefix_frozen": ga, "rel_err": rel})
    log("               (b) FD (h=%g, prefix-frozen) on %s: worst rel err %.2e" % (
        FD_H, ", ".join(n[len(gr.PEFT_PREFIX):-len(".weight")] for n in names), worst))
    return {"entries": rows, "worst_rel_err": worst, "h": FD_H}


def refusal_checks(root, log):
    """mla_ref refuses LoRA on embed_tokens, on 1-D tensors, on non-.weight parameters, on names the model does
    not have, on the ignored MTP layer, and on misshapen adapters; each message names the tensor."""
    cases = [("mla_glm", "model.embed_tokens", (2, 32), (97, 2)),
             ("mla_glm", "model.layers.0.input_layernorm", (2, 32), (32, 2)),
             ("mla_glm", "model.layers.1.mlp.gate.e_score_correction_bias", (2, 32), (4, 2)),
             ("mla_glm", "model.layers.7.self_attn.q_a_proj", (2, 32), (20, 2)),
             ("mla_dsv32", "model.layers.3.eh_proj", (2, 64), (32, 2)),
             ("mla_glm", "model.layers.0.self_attn.o_proj", (2, 31), (32, 2))]
    g = {"prompt": [1, 2, 3], "responses": [[4, 5]], "rewards": [1.0]}
    msgs = []
    with tempfile.TemporaryDirectory() as tmp:
        p = os.path.join(tmp, "bad.safetensors")
        for fx, mod, sa, sb in cases:
            write_adapter(p, {gr.PEFT_PREFIX + mod + ".lora_A.weight": torch.ones(sa, dtype=DT),
                              gr.PEFT_PREFIX + mod + ".lora_B.weight": torch.ones(sb, dtype=DT)})
            try:
                mr.run(os.path.join(root, fx), g, gr.Objective(), adapter=p, lora_alpha=4.0)
            except ValueError as e:
                assert mod in str(e), (mod, str(e))
                msgs.append(str(e))
            else:
                raise AssertionError("adapter on %s accepted" % mod)
        # the CLI (plain log-probs, no objective) exits with the same message; p holds the misshapen o_proj adapter
        try:
            mr.main(["--model", os.path.join(root, "mla_glm"), "--group", os.path.join(root, "mla_glm", "group.json"),
                     "--adapter", p, "--lora-alpha", "4"])
        except SystemExit as e:
            assert str(e) == "mla_ref.py: " + msgs[-1], str(e)
        else:
            raise AssertionError("CLI accepted a misshapen adapter")
    log("               LoRA refusals (%d): %s" % (len(msgs), "; ".join(msgs)))
    return msgs


def check_lora_file(root, entry, adapter_names):
    ts, meta = hr.read_safetensors(os.path.join(root, entry["grad"]))
    assert list(ts) == adapter_names, "LoRA gradient file must hold the adapter tensors in adapter-file order"
    assert meta["mode"] == "lora" and float(meta["loss"]) == entry["loss"] and float(meta["grad_norm"]) == entry["grad_norm"]
    assert ("grad_mode" in meta) == ("--mode" in entry["args"])
    with open(os.path.join(root, entry["grad"]), "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        hdr = json.loads(f.read(n))
    assert all(v["dtype"] == "F32" for k, v in hdr.items() if k != "__metadata__")


def lora_cases(root, trains, log):
    """the *_lora cases: entries for cases.json, adapter info, self-check numbers."""
    entries, adapters, checks = [], {}, {}
    checks["refusals"] = refusal_checks(root, log)
    for L in LORA_CASES:
        fx = L["fx"]
        spec = next(s for s in FIXTURES if s["name"] == fx)
        group = trains[fx]
        info, flags = build_adapter(root, L, spec, group, log)
        adapters["mla_grpo/%s.safetensors" % L["adapter"]] = info
        args = ["--model", fx, "--group", fx + "/group_train.json"] + flags
        apath = os.path.join(root, "mla_grpo", L["adapter"] + ".safetensors")
        adapter_names = list(hr.read_safetensors(apath)[0])
        res_by_mode, mine = {}, []
        for mode in L["modes"]:
            res, a = case_run(root, fx, flags, group, mode)
            name = fx + "_lora" + ("_full" if mode == "full" else "")
            gfile = "mla_grpo/grad_%s.safetensors" % name
            gr.write_grads(os.path.join(root, gfile), res)
            margin, ok = clip_ok(res, a, group)
            assert ok, (name, margin)
            e = {"name": name, "args": args + (["--mode", "full"] if mode == "full" else []), "grad": gfile,
                 "loss": res["loss"][0], "grad_norm": res["grad_norm"][0], "clip_margin": margin, "stats": res["stats0"]}
            check_lora_file(root, e, adapter_names)
            mine.append(e)
            res_by_mode[mode] = res
            s = res["stats0"]
            log("%-20s loss %.8g  grad_norm %.8g  clip margin %.2e  rho<1-e (A>0 %d, A<0 %d) rho>1+e (A>0 %d, A<0 %d)"
                "  kl_mean %.4g" % (name, e["loss"], e["grad_norm"], margin, s["low_Apos"], s["low_Aneg"],
                                    s["high_Apos"], s["high_Aneg"], s["kl_mean"]))
        chk = {}
        pf = res_by_mode["prefix-frozen"]
        cfg, w = pf["cfg"], pf["weights"]
        # the adapter matters: LoRA policy vs the base (same flags, no adapter)
        base, _ = case_run(root, fx, spec["case"] + L["flags"], group, "prefix-frozen")
        chk["lora_vs_base_mean_abs_policy_logprob_diff"] = meandiff([l.tolist() for l in pf["logprobs0"]],
                                                                    [l.tolist() for l in base["logprobs0"]])
        assert chk["lora_vs_base_mean_abs_policy_logprob_diff"] > 1e-3, chk
        if pf["ref"] is not None and "--ref-model" not in flags:  # the reference policy is the base, adapters off
            assert all(torch.equal(f, l) for f, l in zip(pf["ref"], base["logprobs0"]))
            chk["reference_is_base_policy"] = True
        # Net's W + s B A on the fly == the merged weights
        _, _, lora = load_lora(apath)
        seq = list(group["prompt"]) + list(max(group["responses"], key=len))
        with torch.no_grad():
            la = mr.forward_logits(mr.Net(cfg, w, lora), seq)
            lb = mr.forward_logits(mr.Net(cfg, mr.merged_weights(w, lora)), seq)
            lc = mr.slow_logits(cfg, mr.merged_weights(w, lora), seq)
        chk["lora_vs_merged_weights_logits"] = float((la - lb).abs().max())
        chk["lora_vs_slow_absorbed_merged_logits"] = float((la - lc).abs().max())
        assert chk["lora_vs_merged_weights_logits"] <= 1e-12 and chk["lora_vs_slow_absorbed_merged_logits"] <= 1e-10, chk
        # prefix-frozen == full-sequence forward with the prompt state detached; full == naive full graph
        Ld, gd = detached_fullseq_grads(root, fx, flags, group, detach=True)
        chk["prefix_frozen_vs_fullseq_detached_loss"] = abs(Ld - pf["loss"][0])
        chk["prefix_frozen_vs_fullseq_detached_grad_worst_rel"] = rel_diff(pf["grads0"], gd)
        assert chk["prefix_frozen_vs_fullseq_detached_loss"] <= 1e-12, chk
        assert chk["prefix_frozen_vs_fullseq_detached_grad_worst_rel"] <= 1e-10, chk
        if "full" in res_by_mode:
            fu = res_by_mode["full"]
            Ln, gn = detached_fullseq_grads(root, fx, flags, group, detach=False)
            chk["loss_prefix_frozen_minus_full"] = abs(pf["loss"][0] - fu["loss"][0])
            chk["full_vs_fullseq_naive_loss"] = abs(Ln - fu["loss"][0])
            chk["full_vs_fullseq_naive_grad_worst_rel"] = rel_diff(fu["grads0"], gn)
            chk["full_vs_prefix_frozen_global_rel"] = global_rel(fu["grads0"], pf["grads0"])
            assert chk["loss_prefix_frozen_minus_full"] <= 1e-14 and chk["full_vs_fullseq_naive_loss"] <= 1e-12, chk
            assert chk["full_vs_fullseq_naive_grad_worst_rel"] <= 1e-10, chk
            assert chk["full_vs_prefix_frozen_global_rel"] > 1e-2, chk
        # float32: same selections on every group_train sequence, and the gradient's conditioning
        chk["fp32_same_selections_logprob_max_diff"] = fp32_check(cfg, w, group["prompt"], group["responses"], log,
                                                                  "LoRA policy", lora)
        L32, g32 = detached_fullseq_grads(root, fx, flags, group, detach=True, dtype=torch.float32)
        chk["fp32_prefix_frozen_grad_worst_rel"] = rel_diff(g32, pf["grads0"])
        chk["fp32_loss_abs_diff"] = abs(L32 - pf["loss"][0])
        assert chk["fp32_prefix_frozen_grad_worst_rel"] < 1e-3, chk
        chk["b_zero"] = b0_check(root, L, fx, flags, group, L["modes"], log)
        chk["fd_prefix_frozen"] = lora_fd_check(root, L, fx, flags, group, pf["grads0"], log)
        log("               LoRA vs base policy mean |dlogprob| %.3g; on-the-fly vs merged logits %.1e, vs slow %.1e; "
            "pf == detached full-seq grads %.1e%s; float32: same selections, logprob %.1e, grads %.1e" % (
                chk["lora_vs_base_mean_abs_policy_logprob_diff"], chk["lora_vs_merged_weights_logits"],
                chk["lora_vs_slow_absorbed_merged_logits"], chk["prefix_frozen_vs_fullseq_detached_grad_worst_rel"],
                "" if "full" not in res_by_mode else "; full == naive %.1e, |full - pf| / |pf| = %.3f" % (
                    chk["full_vs_fullseq_naive_grad_worst_rel"], chk["full_vs_prefix_frozen_global_rel"]),
                chk["fp32_same_selections_logprob_max_diff"], chk["fp32_prefix_frozen_grad_worst_rel"]))
        for e in mine:
            check_cli(root, e, log)
        entries += mine
        checks[fx + "_lora"] = chk
    return entries, adapters, checks


# ----------------------------------------------------------------------------
# indexer KL cases (mla_ref.py --indexer-kl-coef; cases.json "kl_cases")
# ----------------------------------------------------------------------------

# fx: the fixture whose model, group_train.json and case flags are used; coef: --indexer-kl-coef
KL_CASES = [
    dict(fx="mla_glm", coef=0.5),      # GLM-5, F32, grpo
    dict(fx="mla_glm_ic", coef=1.0),   # GLM-5.2 IndexCache (layers 1, 3 shared), BF16, dapo + beta 0.05 + ref model
    dict(fx="mla_dsv32", coef=2.0),    # DeepSeek-V3.2 (YaRN, half-split indexer RoPE), F32, dr_grpo
]
KL_FD_PER_TENSOR = 3   # the largest-|g| entry + 2 seeded random entries with |g| >= 1e-2 max|g|
KL_FD_REL = 1e-6
INDEXER_TENSORS = ("wq_b.weight", "wk.weight", "k_norm.weight", "k_norm.bias", "weights_proj.weight")


def is_indexer(n):
    return ".self_attn.indexer." in n


def kl_flags(K, spec):
    return spec["case"] + ["--indexer-kl-coef", repr(float(K["coef"]))]


def kl_grads(cfg, w, group, names, detach=True):
    """(L_I, {name: dL_I/dname}) for the tensors names, from mla_ref.indexer_kl_loss on a prompt state captured
    (detached) from w; detach False is the negative control (indexer inputs and teacher attached)."""
    net = mr.Net(cfg, w)
    state = net.capture(group["prompt"])
    net.kl_detach = detach
    for n in names:
        w[n].requires_grad_(True)
    try:
        L = mr.indexer_kl_loss(net, state, group)
        L.backward()
        g = {n: (w[n].grad.detach().clone().to(DT) if w[n].grad is not None else torch.zeros_like(w[n], dtype=DT))
             for n in names}
    finally:
        for n in names:
            w[n].requires_grad_(False)
            w[n].grad = None
    return float(L), g


class ReluMargin:
    """Recorder stand-in: the smallest |qI_j . kI_s| / (|qI_j| |kI_s|) over the branch queries, the heads and the
    SELECTED keys of every full indexer layer (how far the student's ReLUs are from their kink), and the selections."""

    def __init__(self):
        self.min_pos, self.rel, self.sels = 0, float("inf"), []

    def router(self, *a):
        pass

    def indexer(self, i, I, dots, wts, qn, kn, sel, causal, qpos, k, scale):
        self.sels.append(sel.clone())
        r = dots.abs() / (qn[:, :, None] * kn[None, None, :])   # [T, nI, S]
        self.rel = min(self.rel, float(r.masked_fill(~sel[:, None, :], float("inf")).min()))


def kl_value(cfg, w, state, group, coef, rec=None):
    net = mr.Net(cfg, w)
    net.rec = rec
    with torch.no_grad():
        return coef * float(mr.indexer_kl_loss(net, state, group))


def kl_fd_check(cfg, w, group, coef, g, log):
    """central differences (h = FD_H) of C * L_I (prompt state captured once and held fixed: it is a constant
    of L_I) w.r.t. KL_FD_PER_TENSOR entries of each of the 5 indexer tensors of the first and the last full
    indexer layer, against the written gradient; the branch selections are checked unchanged."""
    with torch.no_grad():
        state = mr.Net(cfg, w).capture(group["prompt"])
    r0 = ReluMargin()
    kl_value(cfg, w, state, group, coef, r0)
    full = [i for i in range(cfg.L) if cfg.full_idx[i]]
    layers = [full[0], full[-1]]
    rows, worst = [], 0.0
    gen = torch.Generator().manual_seed(4242)
    for i in layers:
        for tn in INDEXER_TENSORS:
            n = "model.layers.%d.self_attn.indexer.%s" % (i, tn)
            ga = g[n].reshape(-1)
            big = (ga.abs() >= 1e-2 * float(ga.abs().max())).nonzero().flatten()
            flats = [int(ga.abs().argmax())]
            for j in torch.randperm(big.numel(), generator=gen).tolist():
                if len(flats) == KL_FD_PER_TENSOR:
                    break
                if int(big[j]) not in flats:
                    flats.append(int(big[j]))
            t = w[n].view(-1)
            for flat in flats:
                x0 = float(t[flat])
                rp, rm = ReluMargin(), ReluMargin()
                t[flat] = x0 + FD_H
                Lp = kl_value(cfg, w, state, group, coef, rp)
                t[flat] = x0 - FD_H
                Lm = kl_value(cfg, w, state, group, coef, rm)
                t[flat] = x0
                assert all(torch.equal(a_, b_) for r in (rp, rm) for a_, b_ in zip(r.sels, r0.sels)), \
                    "selection changed under the FD step for %s" % n
                fd = (Lp - Lm) / (2 * FD_H)
                gv = float(ga[flat])
                rel = abs(fd - gv) / abs(gv)
                assert rel <= KL_FD_REL, (n, flat, fd, gv, rel)
                worst = max(worst, rel)
                rows.append({"tensor": n, "flat_index": flat, "fd": fd, "autograd": gv, "rel_err": rel})
    log("               FD (h=%g) of C*L_I on %d entries of the 5 indexer tensors of layers %s: worst rel err %.2e"
        % (FD_H, len(rows), layers, worst))
    return {"entries": rows, "worst_rel_err": worst, "h": FD_H, "layers": layers}, r0.rel


def kl_refusals(root, log):
    """--indexer-kl-coef > 0 is refused with --mode full, with --adapter, with --loss sft and when negative; by
    run and by the CLI."""
    fx = os.path.join(root, "mla_glm")
    g = {"prompt": [1, 2, 3], "responses": [[4, 5]], "rewards": [1.0]}
    ad = os.path.join(root, "mla_grpo", "adapter_mla_glm.safetensors")
    grp = os.path.join(fx, "group_train.json")
    cases = [(dict(grad_mode="full"), 0.5, ["--mode", "full"], "--mode prefix-frozen"),
             (dict(adapter=ad, lora_alpha=4.0), 0.5, ["--adapter", ad, "--lora-alpha", "4"], "--adapter"),
             (dict(), 0.5, ["--loss", "sft"], "--loss sft"),
             (dict(), -0.5, [], ">= 0")]
    msgs = []
    for kw, coef, flags, want in cases:
        obj = gr.Objective(loss="sft") if "--loss" in flags else gr.Objective()
        try:
            mr.run(fx, g, obj, indexer_kl_coef=coef, **kw)
        except ValueError as e:
            assert want in str(e), (want, str(e))
            msgs.append(str(e))
        else:
            raise AssertionError("run accepted --indexer-kl-coef %g with %s" % (coef, kw))
        try:
            mr.main(["--model", fx, "--group", grp, "--indexer-kl-coef", repr(coef), "--quiet"] + flags)
        except SystemExit as e:
            assert str(e) == "mla_ref.py: " + msgs[-1], str(e)
        else:
            raise AssertionError("CLI accepted --indexer-kl-coef %g %s" % (coef, flags))
    log("               indexer KL refusals (%d): %s" % (len(msgs), "; ".join(msgs)))
    return msgs


def kl_cases(root, trains, log):
    """the "kl_cases" entries of cases.json (each with its self-check numbers) and their gradient files."""
    entries = []
    refusals = kl_refusals(root, log)
    for K in KL_CASES:
        fx = K["fx"]
        spec = next(s for s in FIXTURES if s["name"] == fx)
        group = trains[fx]
        flags = kl_flags(K, spec)
        name = fx + "_kl"
        args = ["--model", fx, "--group", fx + "/group_train.json"] + flags
        res, a = case_run(root, fx, flags, group, "prefix-frozen")
        gfile = "mla_grpo/grad_%s.safetensors" % name
        gr.write_grads(os.path.join(root, gfile), res)
        margin, ok = clip_ok(res, a, group)
        assert ok, (name, margin)
        cfg, w = res["cfg"], res["weights"]
        # the selections: every group_train sequence passes the same margin test as the fixtures
        rec = record(cfg, w, group["prompt"], group["responses"])
        assert rec.ok(), rec_summary(rec)
        chk = {}
        g = res["grads0"]
        names = list(g)
        idx = [n for n in names if is_indexer(n)]
        # C = 0: the same flags without the KL term
        res0, _ = case_run(root, fx, spec["case"], group, "prefix-frozen")
        assert res0["indexer_kl"] is None and res0["loss"][0] == res["loss"][0]
        # (3) detachment: every non-indexer gradient is the GRPO one, bit for bit; the router bias stays 0
        assert all(torch.equal(g[n], res0["grads0"][n]) for n in names if not is_indexer(n))
        assert all(float(res0["grads0"][n].abs().max()) == 0.0 for n in idx)
        assert all(float(g[n].abs().max()) == 0.0 for n in names if n.endswith("e_score_correction_bias"))
        chk["non_indexer_grads_bitwise_equal_c0"] = True
        # the indexer part: C * dL_I/dtheta from indexer_kl_loss on its own; full layers only
        L_I, gk = kl_grads(cfg, {n: t.clone() for n, t in w.items()}, group, idx)
        chk["indexer_kl_standalone_abs_diff"] = abs(L_I - res["indexer_kl"])
        chk["indexer_grads_vs_coef_times_standalone_worst_rel"] = rel_diff({n: g[n] for n in idx},
                                                                          {n: K["coef"] * gk[n] for n in idx})
        assert chk["indexer_kl_standalone_abs_diff"] <= 1e-13 and chk["indexer_grads_vs_coef_times_standalone_worst_rel"] <= 1e-13, chk
        assert all(float(g[n].abs().max()) > 0.0 for n in idx), "an indexer tensor of a full layer got no KL gradient"
        assert len(idx) == 5 * sum(cfg.full_idx)
        # an independent value: slow_logits' per-query python KL (absorbed attention, python top-k)
        P, kls = len(group["prompt"]), []
        with torch.no_grad():
            for r in group["responses"]:
                mr.slow_logits(cfg, w, list(group["prompt"]) + list(r[:-1]), kl=kls, kl_from=P - 1)
        N = sum(len(r) for r in group["responses"])
        chk["indexer_kl_vs_slow_abs_diff"] = abs(sum(v for _, _, v in kls) / N - res["indexer_kl"])
        assert chk["indexer_kl_vs_slow_abs_diff"] <= 1e-12, chk
        assert len(kls) == N * sum(cfg.full_idx)
        # negative control: without the detachment L_I would also reach the non-indexer tensors
        _, gn = kl_grads(cfg, {n: t.clone() for n, t in w.items()}, group, names, detach=False)
        chk["undetached_control_non_indexer_grad_norm"] = math.sqrt(sum(float((gn[n] ** 2).sum()) for n in names
                                                                        if not is_indexer(n)))
        assert chk["undetached_control_non_indexer_grad_norm"] > 1e-3, chk
        # (1) central differences of C * L_I
        chk["fd_indexer_kl"], chk["selected_key_relu_min_rel"] = kl_fd_check(cfg, {n: t.clone() for n, t in w.items()},
                                                                            group, K["coef"], g, log)
        # the student's ReLUs on the selected keys are as clear of their kink as the selections of their cutoff
        assert chk["selected_key_relu_min_rel"] >= IDX_REL, chk
        # float32: L_I and its indexer gradients (same selections: the fixture's fp32 check)
        fp32_check(cfg, w, group["prompt"], group["responses"], log, "kl " + name)
        L32, g32 = kl_grads(cfg, {n: t.to(torch.float32) for n, t in w.items()}, group, idx)
        chk["fp32_indexer_kl_rel_diff"] = abs(L32 - L_I) / L_I
        chk["fp32_indexer_grads_worst_rel"] = rel_diff(g32, gk)
        assert chk["fp32_indexer_grads_worst_rel"] < 1e-3, chk
        e = {"name": name, "args": args, "grad": gfile, "loss": res["loss"][0], "grad_norm": res["grad_norm"][0],
             "indexer_kl": res["indexer_kl"], "indexer_kl_coef": K["coef"], "clip_margin": margin,
             "stats": res["stats0"], "base_case": fx, "selection": rec_summary(rec), "self_checks": chk}
        ts, meta = hr.read_safetensors(os.path.join(root, gfile))
        assert list(ts) == names and float(meta["indexer_kl"]) == e["indexer_kl"]
        assert float(meta["loss"]) == e["loss"] and float(meta["grad_norm"]) == e["grad_norm"]
        # (2) C = 0 is today's output: the base case's gradient file (same tensors, bit for bit) and, through the
        # CLI, --indexer-kl-coef 0 writes the same bytes as no flag
        tb, mb = hr.read_safetensors(os.path.join(root, "mla_grpo", "grad_%s.safetensors" % fx))
        with tempfile.TemporaryDirectory() as tmp:
            p0 = os.path.join(tmp, "c0.safetensors")
            gr.write_grads(p0, res0)
            t0, m0 = hr.read_safetensors(p0)
            assert "indexer_kl" not in m0 and list(t0) == list(tb) and all(torch.equal(t0[n], tb[n]) for n in tb)
        chk["c0_tensors_bitwise_equal_base_grad_file"] = True
        chk["c0_loss_rel_diff_base_grad_file"] = abs(float(m0["loss"]) - float(mb["loss"])) / abs(float(mb["loss"]))
        assert chk["c0_loss_rel_diff_base_grad_file"] <= 1e-12, chk
        check_cli(root, e, log)
        with tempfile.TemporaryDirectory() as tmp:
            cwd = os.getcwd()
            os.chdir(root)
            try:
                base = ["--model", fx, "--group", fx + "/group_train.json"] + spec["case"] + ["--quiet"]
                mr.main(base + ["--out", os.path.join(tmp, "a.safetensors")])
                mr.main(base + ["--indexer-kl-coef", "0", "--out", os.path.join(tmp, "b.safetensors")])
            finally:
                os.chdir(cwd)
            assert filecmp.cmp(os.path.join(tmp, "a.safetensors"), os.path.join(tmp, "b.safetensors"), shallow=False)
        chk["c0_cli_bytes_equal_no_flag"] = True
        entries.append(e)
        log("%-20s loss %.8g  grad_norm %.8g (C=0: %.8g)  indexer_kl %.8g  C %g  clip margin %.2e" % (
            name, e["loss"], e["grad_norm"], res0["grad_norm"][0], e["indexer_kl"], K["coef"], margin))
        log("               L_I standalone %.1e, vs slow %.1e; indexer grads == C * standalone %.1e; non-indexer "
            "grads == C=0 bit for bit; undetached control |g_other| %.3g; selected-key ReLU margin %.2e; "
            "float32 L_I %.1e grads %.1e" % (
                chk["indexer_kl_standalone_abs_diff"], chk["indexer_kl_vs_slow_abs_diff"],
                chk["indexer_grads_vs_coef_times_standalone_worst_rel"],
                chk["undetached_control_non_indexer_grad_norm"], chk["selected_key_relu_min_rel"],
                chk["fp32_indexer_kl_rel_diff"], chk["fp32_indexer_grads_worst_rel"]))
    entries[0]["self_checks"]["refusals"] = refusals
    return entries


def kl_only(root, log):
    """add (or replace) cases.json's "kl_cases" and their gradient files, from the committed fixtures, leaving
    every other file and key as it is."""
    path = os.path.join(root, "mla_grpo", "cases.json")
    with open(path) as f:
        doc = json.load(f)
    trains = {}
    for K in KL_CASES:
        with open(os.path.join(root, K["fx"], "group_train.json")) as f:
            trains[K["fx"]] = json.load(f)
    doc["kl_cases"] = kl_cases(root, trains, log)
    write_json(path, doc)
    return doc


# ----------------------------------------------------------------------------

REAL_DS = dict(model_type="deepseek_v32", hidden_size=7168, num_hidden_layers=61, num_attention_heads=128,
               num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
               v_head_dim=128, index_n_heads=64, index_head_dim=128, index_topk=2048, n_routed_experts=256,
               n_shared_experts=1, num_experts_per_tok=8, moe_intermediate_size=2048, intermediate_size=18432,
               first_k_dense_replace=3, moe_layer_freq=1, routed_scaling_factor=2.5, n_group=8, topk_group=4,
               scoring_func="sigmoid", topk_method="noaux_tc", norm_topk_prob=True, rms_norm_eps=1e-6,
               rope_theta=10000, rope_scaling=dict(type="yarn", factor=40, original_max_position_embeddings=4096,
                                                   beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0),
               vocab_size=129280, num_nextn_predict_layers=1, tie_word_embeddings=False)
REAL_GLM = dict(model_type="glm_moe_dsa", hidden_size=6144, num_hidden_layers=78, num_attention_heads=64,
                num_key_value_heads=64, q_lora_rank=2048, kv_lora_rank=512, qk_nope_head_dim=192, qk_rope_head_dim=64,
                qk_head_dim=256, head_dim=64, v_head_dim=256, index_n_heads=32, index_head_dim=128, index_topk=2048,
                n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8, moe_intermediate_size=2048,
                intermediate_size=12288, first_k_dense_replace=3, moe_layer_freq=1, routed_scaling_factor=2.5,
                n_group=1, topk_group=1, scoring_func="sigmoid", topk_method="noaux_tc", norm_topk_prob=True,
                rms_norm_eps=1e-5, rope_parameters=dict(rope_theta=1e6, rope_type="default"), rope_interleave=True,
                indexer_rope_interleave=True, vocab_size=154880, tie_word_embeddings=False)


def spec_constants(log):
    """config parsing on the real (full-size) configs of spec §1 reproduces the spec's numbers."""
    ds, glm = mr.Cfg(REAL_DS), mr.Cfg(REAL_GLM)
    glm52 = mr.Cfg(dict(REAL_GLM, index_topk_freq=4, index_skip_topk_offset=3, rope_theta=8e6))
    full52 = [i for i in range(78) if glm52.full_idx[i]]
    out = {"deepseek_sigma": ds.sigma, "deepseek_yarn_low_high": list(ds.yarn_low_high()),
           "deepseek_mscale": mr.yarn_mscale(40, 1.0), "glm5_sigma": glm.sigma,
           "glm5_full_indexer_layers": sum(glm.full_idx), "glm52_full_indexer_layers": full52,
           "deepseek_indexer_interleaved": ds.idx_interleave, "glm_indexer_interleaved": glm.idx_interleave,
           "deepseek_moe_layers_from": ds.moe_layers.index(True), "glm52_rope_theta": glm52.theta}
    assert abs(ds.sigma - 0.135234) < 5e-7 and abs(out["deepseek_mscale"] - 1.36889) < 5e-6
    assert out["deepseek_yarn_low_high"] == [10, 23]
    assert glm.sigma == 0.0625 and out["glm5_full_indexer_layers"] == 78
    assert full52 == [0, 1, 2] + list(range(6, 75, 4)) and len(full52) == 21
    assert not ds.idx_interleave and glm.idx_interleave and ds.mla_interleave and glm.mla_interleave
    assert out["deepseek_moe_layers_from"] == 3 and not any(ds.moe_layers[:3]) and all(ds.moe_layers[3:])
    # default rule (freq 1, offset 2): every layer full; q_lora_rank null is refused
    assert all(mr.Cfg(dict(REAL_GLM, index_skip_topk_offset=None)).full_idx)
    try:
        mr.Cfg(dict(REAL_DS, q_lora_rank=None))
        raise AssertionError("q_lora_rank null accepted")
    except ValueError:
        pass
    log("spec constants: DeepSeek sigma %.6f (m %.5f), YaRN low/high %s; GLM-5 sigma %g, %d full indexer layers; "
        "GLM-5.2 %d full: %s" % (ds.sigma, out["deepseek_mscale"], out["deepseek_yarn_low_high"], glm.sigma,
                                 out["glm5_full_indexer_layers"], len(full52), full52))
    return out


def generate(root, log):
    os.makedirs(os.path.join(root, "mla_grpo"), exist_ok=True)
    for f in os.listdir(os.path.join(root, "mla_grpo")):
        os.remove(os.path.join(root, "mla_grpo", f))
    doc = {"note": "paths are relative to tests/reference/fixtures; run: python3 ../mla_ref.py <args> --out GRAD "
                   "(from fixtures/). Thresholds: router/group gap %g, index relative "
                   "perturbation %g, clip margin %g" % (ROUTER_GAP, IDX_REL, CLIP_MARGIN),
           "cases": [], "fixtures": {}, "self_checks": {"spec_constants": spec_constants(log)}}
    trains = {}
    for idx, spec in enumerate(FIXTURES):
        d, cfg, w, group, extra, info = build_fixture(root, spec, log)
        fchk = forward_checks(cfg, spec["cfg"], w, group, log)
        check_cli_logprobs(root, spec["name"], log)
        allr = group["responses"] + ([extra] if extra else [])
        fchk["fp32_same_selections_logprob_max_diff"] = fp32_check(cfg, w, group["prompt"], allr, log)
        if spec.get("ref"):
            wref = hr.load_weights(d + "_ref")
            fchk["fp32_same_selections_logprob_max_diff_ref"] = fp32_check(cfg, wref, group["prompt"], allr, log, "ref")
        log("               float32 run: same index top-k and experts on all %d sequences%s; log-prob max diff %.1e" % (
            len(allr), " (policy and ref)" if spec.get("ref") else "", fchk["fp32_same_selections_logprob_max_diff"]))
        doc["fixtures"][spec["name"]] = info
        doc["self_checks"][spec["name"]] = {"forward": fchk}
        if spec.get("case"):
            g = make_group_train(root, spec, group, extra, idx)
            trains[spec["name"]] = g
            entries, chk = grpo_case(root, spec, g, log)
            check_cli(root, entries[1], log)
            doc["cases"] += entries
            doc["self_checks"][spec["name"]]["grpo"] = chk
    entries, adapters, lchk = lora_cases(root, trains, log)
    doc["cases"] += entries
    doc["adapters"] = adapters
    doc["self_checks"]["lora"] = lchk
    doc["kl_cases"] = kl_cases(root, trains, log)
    write_json(os.path.join(root, "mla_grpo", "cases.json"), doc)
    total = 0
    for dd in sorted(os.listdir(root)):
        if dd.startswith("mla_"):
            for f in sorted(os.listdir(os.path.join(root, dd))):
                n = os.path.getsize(os.path.join(root, dd, f))
                total += n
                log("  %8d  %s/%s" % (n, dd, f))
    log("  %8d  total bytes" % total)
    return doc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="regenerate into a temp dir and compare bit for bit")
    ap.add_argument("--kl-only", action="store_true",
                    help="only (re)write cases.json's \"kl_cases\" and grad_*_kl.safetensors from the committed "
                         "fixtures (with --check: into a copy, compared bit for bit)")
    ap.add_argument("--out", default=os.path.join(HERE, "fixtures"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    log = lambda s: print(s, flush=True)  # noqa: E731
    if a.kl_only:
        if not a.check:
            kl_only(a.out, log)
            return
        with tempfile.TemporaryDirectory() as tmp:
            for dd in os.listdir(a.out):
                if dd.startswith("mla_"):
                    shutil.copytree(os.path.join(a.out, dd), os.path.join(tmp, dd))
            kl_only(tmp, log)
            bad = [dd + "/" + f for dd in sorted(os.listdir(tmp)) for f in sorted(os.listdir(os.path.join(tmp, dd)))
                   if not os.path.exists(os.path.join(a.out, dd, f))
                   or not filecmp.cmp(os.path.join(tmp, dd, f), os.path.join(a.out, dd, f), shallow=False)]
        if bad:
            print("MISMATCH: %s" % bad)
            sys.exit(1)
        print("the indexer KL cases reproduce bit for bit")
        return
    if not a.check:
        generate(a.out, log)
        return
    with tempfile.TemporaryDirectory() as tmp:
        generate(tmp, log)
        bad = []
        for dd in sorted(os.listdir(tmp)):
            for f in sorted(os.listdir(os.path.join(tmp, dd))):
                p = os.path.join(a.out, dd, f)
                if not os.path.exists(p) or not filecmp.cmp(p, os.path.join(tmp, dd, f), shallow=False):
                    bad.append(dd + "/" + f)
        committed = {dd + "/" + f for dd in os.listdir(a.out) if dd.startswith("mla_")
                     for f in os.listdir(os.path.join(a.out, dd))}
        extra = sorted(committed - {dd + "/" + f for dd in os.listdir(tmp) for f in os.listdir(os.path.join(tmp, dd))})
        if bad or extra:
            print("MISMATCH: %s  EXTRA: %s" % (bad, extra))
            sys.exit(1)
        print("all MLA fixture files reproduce bit for bit")


if __name__ == "__main__":
    main()
