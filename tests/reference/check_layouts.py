#!/usr/bin/env python3
"""Self-check (b): the Qwen3-Next fused/interleaved layout and the Qwen3.5 split
layout give identical logprobs when the same underlying weights are written both ways.

Same logical weights (fp64, in memory) are packaged as
  * qwen3_5 / qwen3_5_moe_text: split in_proj_qkv/z/b/a, prefix model.language_model.
  * qwen3_next: fused in_proj_qkvz/in_proj_ba built by the row formula of spec §2.1
    (make_fixtures.split_to_fused), prefix model.
and (MoE) per-expert vs fused gate_up_proj/down_proj experts. The MoE pair uses
norm_topk_prob=true on the qwen3_next side (qwen3_5 MoE always renormalises).
A negative control (contiguous, i.e. wrong, split of in_proj_qkvz) must differ.

    python3 check_layouts.py        # exit 0 on success
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hybrid_ref as hr  # noqa: E402
import make_fixtures as mf  # noqa: E402

# H_v/H_k = 3 and d_k != d_v here, to make any index mix-up visible
DIMS = dict(mf.COMMON, linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=8,
            linear_value_head_dim=4)
LT = ["linear_attention", "full_attention", "linear_attention", "linear_attention"]


def convert(w_split, Hk, Hv, dk, dv):
    """split-layout logical weights -> fused qwen3_next layout"""
    out = {}
    for k, v in w_split.items():
        if k.endswith("linear_attn.in_proj_qkv.weight"):
            p = k[: -len("in_proj_qkv.weight")]
            qkvz, ba = mf.split_to_fused(v, w_split[p + "in_proj_z.weight"], w_split[p + "in_proj_b.weight"],
                                         w_split[p + "in_proj_a.weight"], Hk, Hv, dk, dv)
            out[p + "in_proj_qkvz.weight"] = qkvz
            out[p + "in_proj_ba.weight"] = ba
        elif k.endswith(("in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight")):
            continue
        else:
            out[k] = v
    return out


def logprobs(cfg, w, group):
    m = hr.HybridModel(None, cfg_raw=cfg, weights=w)
    lp = hr.group_logprobs(m, group)
    extra = sorted(set(w) - m.used)
    assert not extra, "unused tensors: %s" % extra
    return torch.tensor([x for r in lp for x in r], dtype=torch.float64)


def main():
    torch.set_grad_enabled(False)
    rng = mf.Rng(777)
    Hk, Hv = DIMS["linear_num_key_heads"], DIMS["linear_num_value_heads"]
    dk, dv = DIMS["linear_key_head_dim"], DIMS["linear_value_head_dim"]
    rope = dict(rope_theta=mf.ROPE_THETA, partial_rotary_factor=mf.PRF)
    ok = True

    # ---- dense ----
    w = mf.gen_weights(rng, DIMS, LT, moe_layers=set())
    group = {"prompt": rng.ints(40, 97), "responses": [rng.ints(3, 97), rng.ints(12, 97)]}
    cfg35 = {"model_type": "qwen3_5", "tie_word_embeddings": False,
             "text_config": dict(DIMS, model_type="qwen3_5_text", layer_types=LT,
                                 rope_parameters=dict(rope, rope_type="default"))}
    cfgnx = dict(DIMS, model_type="qwen3_next", layer_types=LT, num_experts=0, **rope)
    a = logprobs(cfg35, mf.full_names(w, "model.language_model."), group)
    b = logprobs(cfgnx, mf.full_names(convert(w, Hk, Hv, dk, dv), "model."), group)
    d = (a - b).abs().max().item()
    print("dense  split vs fused: max |dlogprob| = %.3e" % d)
    ok &= d < 1e-10

    # negative control: contiguous (wrong) split of the fused in_proj_qkvz / in_proj_ba
    wf = convert(w, Hk, Hv, dk, dv)
    wbad = dict(w)
    kd, vd = Hk * dk, Hv * dv
    for i, lt in enumerate(LT):
        if lt != "linear_attention":
            continue
        p = "layers.%d.linear_attn." % i
        F = wf[p + "in_proj_qkvz.weight"]
        BA = wf[p + "in_proj_ba.weight"]
        wbad[p + "in_proj_qkv.weight"] = F[: 2 * kd + vd]
        wbad[p + "in_proj_z.weight"] = F[2 * kd + vd:]
        wbad[p + "in_proj_b.weight"] = BA[:Hv]
        wbad[p + "in_proj_a.weight"] = BA[Hv:]
    c = logprobs(cfg35, mf.full_names(wbad, "model.language_model."), group)
    dn = (a - c).abs().max().item()
    print("dense  negative control (naive contiguous split): max |dlogprob| = %.3e (must be large)" % dn)
    ok &= dn > 1e-3

    # ---- MoE: qwen3_next fused-GDN + per-expert vs qwen3_5_moe split-GDN + fused experts ----
    LTm = ["full_attention", "linear_attention", "linear_attention", "full_attention"]
    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24,
               decoder_sparse_step=1, mlp_only_layers=[1])
    w = mf.gen_weights(rng, DIMS, LTm, moe_layers={0, 2, 3}, E=4, moe_I=16, shared_I=24, tie=True)
    cfg35m = dict(DIMS, model_type="qwen3_5_moe_text", layer_types=LTm, norm_topk_prob=False,
                  tie_word_embeddings=True, rope_parameters=dict(rope), **moe)
    cfgnxm = dict(DIMS, model_type="qwen3_next", layer_types=LTm, norm_topk_prob=True,
                  tie_word_embeddings=True, **rope, **moe)
    a = logprobs(cfg35m, mf.full_names(_fuse_only_experts(w), "model.language_model."), group)
    b = logprobs(cfgnxm, mf.full_names(convert(w, Hk, Hv, dk, dv), "model."), group)
    d = (a - b).abs().max().item()
    print("moe    split+fused-experts vs fused-GDN+per-expert: max |dlogprob| = %.3e" % d)
    ok &= d < 1e-10
    # and qwen3_next without renormalisation must differ
    cfgnxm_nr = dict(cfgnxm, norm_topk_prob=False)
    c = logprobs(cfgnxm_nr, mf.full_names(convert(w, Hk, Hv, dk, dv), "model."), group)
    dn = (a - c).abs().max().item()
    print("moe    negative control (qwen3_next norm_topk_prob=false): max |dlogprob| = %.3e (must be large)" % dn)
    ok &= dn > 1e-3

    print("check_layouts:", "OK" if ok else "FAILED")
    return 0 if ok else 1


def _fuse_only_experts(w):
    """keep split GDN, fuse the per-expert MLP tensors"""
    out = dict(w)
    for k in list(out):
        if k.endswith("mlp.experts.0.gate_proj.weight"):
            p = k[: -len("0.gate_proj.weight")]
            E = len([n for n in out if n.startswith(p) and n.endswith(".gate_proj.weight")])
            out[p + "gate_up_proj"] = torch.stack(
                [torch.cat([out[p + "%d.gate_proj.weight" % e], out[p + "%d.up_proj.weight" % e]]) for e in range(E)])
            out[p + "down_proj"] = torch.stack([out[p + "%d.down_proj.weight" % e] for e in range(E)])
            for e in range(E):
                for m in ("gate", "up", "down"):
                    del out[p + "%d.%s_proj.weight" % (e, m)]
    return out


if __name__ == "__main__":
    sys.exit(main())
