#!/usr/bin/env python3
"""Generate deterministic tiny hybrid-model fixtures + fp64 expected logprobs.

    python3 make_fixtures.py [--out DIR] [--only NAME ...]

Writes DIR/<name>/{config.json, weights, group.json, expected.json} for
next_dense, next_moe, q35_dense, q35_moe.  DIR defaults to ./fixtures next to
this script.  expected.json is computed by hybrid_ref.py from the weights as
read back from disk (so dtype rounding is included).
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hybrid_ref as hr  # noqa: E402

DT = torch.float64

COMMON = dict(
    hidden_size=32, vocab_size=97, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
    linear_conv_kernel_dim=4, rms_norm_eps=1e-6, num_hidden_layers=4, intermediate_size=48,
    hidden_act="silu", attention_bias=False, max_position_embeddings=4096,
)
ROPE_THETA = 10000.0
PRF = 0.5


class Rng:
    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def normal(self, shape, std):
        return torch.randn(*shape, generator=self.g, dtype=DT) * std

    def uniform(self, shape, lo, hi):
        return lo + (hi - lo) * torch.rand(*shape, generator=self.g, dtype=DT)

    def lin(self, out_f, in_f):
        return self.normal((out_f, in_f), in_f ** -0.5)

    def ints(self, n, hi):
        return torch.randint(0, hi, (n,), generator=self.g).tolist()


# ----------------------------------------------------------------------------
# layout conversion Qwen3.5 split -> Qwen3-Next fused (explicit row formula of spec §2.1)
# ----------------------------------------------------------------------------

def split_to_fused(Wqkv, Wz, Wb, Wa, Hk, Hv, dk, dv):
    """Build in_proj_qkvz / in_proj_ba from the split projections, row by row.
    Row rho of qkvz: g = rho // G, o = rho % G with G = 2dk + 2r dv;
    o<dk: q[g,o]; o<2dk: k[g,o-dk]; o<2dk+r dv: v[r g + (o-2dk)//dv, (o-2dk)%dv]; else z[...]."""
    r = Hv // Hk
    G = 2 * dk + 2 * r * dv
    key_dim = Hk * dk
    D = Wqkv.shape[1]
    qkvz = torch.empty(Hk * G, D, dtype=Wqkv.dtype)
    for rho in range(Hk * G):
        g, o = divmod(rho, G)
        if o < dk:
            src = Wqkv[g * dk + o]
        elif o < 2 * dk:
            src = Wqkv[key_dim + g * dk + (o - dk)]
        elif o < 2 * dk + r * dv:
            oo = o - 2 * dk
            h, d = r * g + oo // dv, oo % dv
            src = Wqkv[2 * key_dim + h * dv + d]
        else:
            oo = o - 2 * dk - r * dv
            h, d = r * g + oo // dv, oo % dv
            src = Wz[h * dv + d]
        qkvz[rho] = src
    ba = torch.empty(2 * Hv, D, dtype=Wb.dtype)
    for rho in range(2 * Hv):
        g, o = divmod(rho, 2 * r)
        ba[rho] = Wb[r * g + o] if o < r else Wa[r * g + (o - r)]
    return qkvz, ba


# ----------------------------------------------------------------------------
# weight generation (logical tensors, names without the model prefix)
# ----------------------------------------------------------------------------

def gen_weights(rng, c, layer_types, moe_layers, E=0, moe_I=0, shared_I=0, tie=False, fused_gdn=False,
                fused_experts=False):
    D, V = c["hidden_size"], c["vocab_size"]
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    Hk, Hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv, W = c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"]
    I = c["intermediate_size"]
    key_dim, value_dim = Hk * dk, Hv * dv
    conv_dim = 2 * key_dim + value_dim
    w = {}
    w["embed_tokens.weight"] = rng.normal((V, D), 1.0)
    for i, lt in enumerate(layer_types):
        p = "layers.%d." % i
        w[p + "input_layernorm.weight"] = rng.normal((D,), 0.1)
        if lt == "linear_attention":
            q = p + "linear_attn."
            Wqkv = rng.lin(conv_dim, D)
            Wz = rng.lin(value_dim, D)
            Wb = rng.lin(Hv, D)
            Wa = rng.lin(Hv, D)
            if fused_gdn:
                w[q + "in_proj_qkvz.weight"], w[q + "in_proj_ba.weight"] = split_to_fused(
                    Wqkv, Wz, Wb, Wa, Hk, Hv, dk, dv)
            else:
                w[q + "in_proj_qkv.weight"] = Wqkv
                w[q + "in_proj_z.weight"] = Wz
                w[q + "in_proj_b.weight"] = Wb
                w[q + "in_proj_a.weight"] = Wa
            w[q + "conv1d.weight"] = rng.uniform((conv_dim, 1, W), -0.5, 0.5)
            w[q + "dt_bias"] = rng.normal((Hv,), 0.5)
            w[q + "A_log"] = torch.log(rng.uniform((Hv,), 0.05, 1.0))
            w[q + "norm.weight"] = 1.0 + rng.normal((dv,), 0.1)
            w[q + "out_proj.weight"] = rng.lin(D, value_dim)
        else:
            q = p + "self_attn."
            w[q + "q_proj.weight"] = rng.lin(2 * nh * hd, D)
            w[q + "k_proj.weight"] = rng.lin(nkv * hd, D)
            w[q + "v_proj.weight"] = rng.lin(nkv * hd, D)
            w[q + "o_proj.weight"] = rng.lin(D, nh * hd)
            w[q + "q_norm.weight"] = rng.normal((hd,), 0.1)
            w[q + "k_norm.weight"] = rng.normal((hd,), 0.1)
        w[p + "post_attention_layernorm.weight"] = rng.normal((D,), 0.1)
        m = p + "mlp."
        if i in moe_layers:
            w[m + "gate.weight"] = rng.normal((E, D), D ** -0.5)
            gs, us, ds = [], [], []
            for e in range(E):
                gs.append(rng.lin(moe_I, D))
                us.append(rng.lin(moe_I, D))
                ds.append(rng.lin(D, moe_I))
            if fused_experts:
                w[m + "experts.gate_up_proj"] = torch.stack([torch.cat([gs[e], us[e]], 0) for e in range(E)])
                w[m + "experts.down_proj"] = torch.stack(ds)
            else:
                for e in range(E):
                    w[m + "experts.%d.gate_proj.weight" % e] = gs[e]
                    w[m + "experts.%d.up_proj.weight" % e] = us[e]
                    w[m + "experts.%d.down_proj.weight" % e] = ds[e]
            if shared_I > 0:
                w[m + "shared_expert.gate_proj.weight"] = rng.lin(shared_I, D)
                w[m + "shared_expert.up_proj.weight"] = rng.lin(shared_I, D)
                w[m + "shared_expert.down_proj.weight"] = rng.lin(D, shared_I)
                w[m + "shared_expert_gate.weight"] = rng.normal((1, D), D ** -0.5)
        else:
            w[m + "gate_proj.weight"] = rng.lin(I, D)
            w[m + "up_proj.weight"] = rng.lin(I, D)
            w[m + "down_proj.weight"] = rng.lin(D, I)
    w["norm.weight"] = rng.normal((D,), 0.1)
    if not tie:
        w["lm_head.weight"] = rng.lin(V, D)
    return w


def full_names(w, prefix):
    return {(k if k == "lm_head.weight" else prefix + k): v for k, v in w.items()}


def make_group(rng, V):
    return {"prompt": rng.ints(130, V), "responses": [rng.ints(n, V) for n in (1, 5, 67)]}


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")


# ----------------------------------------------------------------------------
# fixtures
# ----------------------------------------------------------------------------

def fx_next_dense(out):
    rng = Rng(1001)
    lt = ["linear_attention", "full_attention", "linear_attention", "full_attention"]
    cfg = dict(model_type="qwen3_next", architectures=["Qwen3NextForCausalLM"], **COMMON)
    cfg.update(layer_types=lt, rope_theta=ROPE_THETA, partial_rotary_factor=PRF, num_experts=0,
               tie_word_embeddings=False, torch_dtype="float32")
    w = gen_weights(rng, cfg, lt, moe_layers=set(), fused_gdn=True)
    write_json(os.path.join(out, "config.json"), cfg)
    hr.write_safetensors(os.path.join(out, "model.safetensors"),
                         {k: (v, "F32") for k, v in full_names(w, "model.").items()}, {"format": "pt"})
    return rng


def fx_next_moe(out):
    rng = Rng(1002)
    cfg = dict(model_type="qwen3_next", architectures=["Qwen3NextForCausalLM"], **COMMON)
    cfg.update(full_attention_interval=2, rope_theta=ROPE_THETA, partial_rotary_factor=PRF,
               num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
               shared_expert_intermediate_size=24, norm_topk_prob=True, decoder_sparse_step=1,
               mlp_only_layers=[2], tie_word_embeddings=True, torch_dtype="bfloat16")
    lt = ["full_attention" if (i + 1) % 2 == 0 else "linear_attention" for i in range(4)]
    w = gen_weights(rng, cfg, lt, moe_layers={0, 1, 3}, E=4, moe_I=16, shared_I=24, tie=True, fused_gdn=True)
    write_json(os.path.join(out, "config.json"), cfg)
    hr.write_safetensors(os.path.join(out, "model.safetensors"),
                         {k: (v, "BF16") for k, v in full_names(w, "model.").items()}, {"format": "pt"})
    return rng


def fx_q35_dense(out):
    rng = Rng(1003)
    lt = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
    tc = dict(model_type="qwen3_5_text", **COMMON)
    tc.update(layer_types=lt, full_attention_interval=4,
              rope_parameters=dict(rope_type="default", rope_theta=ROPE_THETA, partial_rotary_factor=PRF,
                                   mrope_section=[2, 1, 1], mrope_interleaved=True),
              attn_output_gate=True, dtype="float16")
    cfg = dict(model_type="qwen3_5", architectures=["Qwen3_5ForConditionalGeneration"], text_config=tc,
               tie_word_embeddings=False)
    w = full_names(gen_weights(rng, tc, lt, moe_layers=set()), "model.language_model.")
    write_json(os.path.join(out, "config.json"), cfg)

    def dt(name):
        return "F32" if name.endswith(("linear_attn.A_log", "linear_attn.norm.weight")) else "F16"

    names = list(w)
    shard1 = [n for n in names if n.endswith("embed_tokens.weight") or ".layers.0." in n or ".layers.1." in n]
    shard2 = [n for n in names if n not in shard1]
    files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    wmap, total = {}, 0
    for fn, sel in zip(files, (shard1, shard2)):
        hr.write_safetensors(os.path.join(out, fn), {n: (w[n], dt(n)) for n in sel}, {"format": "pt"})
        for n in sel:
            wmap[n] = fn
            total += w[n].numel() * (4 if dt(n) == "F32" else 2)
    write_json(os.path.join(out, "model.safetensors.index.json"),
               {"metadata": {"total_size": total}, "weight_map": dict(sorted(wmap.items()))})
    return rng


def fx_q35_moe(out):
    rng = Rng(1004)  # seed picked for a comfortable top-k router margin
    lt = ["linear_attention", "full_attention", "linear_attention", "full_attention"]
    cfg = dict(model_type="qwen3_5_moe_text", architectures=["Qwen3_5MoeForCausalLM"], **COMMON)
    cfg.update(layer_types=lt, full_attention_interval=2,
               rope_parameters=dict(rope_type="default", rope_theta=ROPE_THETA, partial_rotary_factor=PRF),
               num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
               shared_expert_intermediate_size=24, norm_topk_prob=False, decoder_sparse_step=1,
               mlp_only_layers=[], tie_word_embeddings=False, dtype="float32")
    w = full_names(gen_weights(rng, cfg, lt, moe_layers={0, 1, 2, 3}, E=4, moe_I=16, shared_I=24,
                               fused_experts=True), "model.language_model.")
    w["mtp.fc.weight"] = rng.lin(8, 16)  # ignored extra tensor
    write_json(os.path.join(out, "config.json"), cfg)
    hr.write_safetensors(os.path.join(out, "model.safetensors"), {k: (v, "F32") for k, v in w.items()},
                         {"format": "pt"})
    return rng


FIXTURES = {"next_dense": fx_next_dense, "next_moe": fx_next_moe, "q35_dense": fx_q35_dense, "q35_moe": fx_q35_moe}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
    ap.add_argument("--only", nargs="*", choices=sorted(FIXTURES))
    a = ap.parse_args()
    torch.set_grad_enabled(False)
    for name in (a.only or list(FIXTURES)):
        d = os.path.join(a.out, name)
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(d):
            os.remove(os.path.join(d, f))
        rng = FIXTURES[name](d)
        group = make_group(rng, COMMON["vocab_size"])
        write_json(os.path.join(d, "group.json"), group)
        model = hr.HybridModel(d)
        model.router_gaps = []
        lps = hr.group_logprobs(model, group)
        unused = sorted(k for k in model.w if k not in model.used and not k.startswith("mtp."))
        assert not unused, unused
        write_json(os.path.join(d, "expected.json"), {"logprobs": lps})
        gap = min(model.router_gaps) if model.router_gaps else None
        flat = [x for r in lps for x in r]
        print("%-10s  tokens=%d  mean logprob=%.4f  min top-k router gap=%s" %
              (name, len(flat), sum(flat) / len(flat), "n/a" if gap is None else "%.3g" % gap))


if __name__ == "__main__":
    main()
