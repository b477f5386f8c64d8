#!/usr/bin/env python3
"""Independent fp64 reference for the Qwen3-Next / Qwen3.5 hybrid decoder
(Gated DeltaNet + gated full attention, dense SwiGLU or sparse MoE).

Written from /work/shared/specs/hybrid-qwen3next.md only; it does not look at
the C implementation.  Everything is computed in torch.float64 with plain,
token-serial code (no chunking, no caching).

CLI:
    python3 hybrid_ref.py --model DIR --group FILE.json [--dump-hidden FILE.json]
prints {"logprobs": [[...], ...]} to stdout.  logprobs[i][j] is
log p(response_i[j] | prompt, response_i[:j]) from one full-sequence forward over
prompt + response_i.
"""

import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

DT = torch.float64

# ----------------------------------------------------------------------------
# safetensors (own parser/writer; no safetensors package available)
# ----------------------------------------------------------------------------

_NP_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
}


def read_safetensors(path):
    """Return {name: float64 torch tensor} and the metadata dict."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    base = 8 + n
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, info in header.items():
        dt = info["dtype"]
        if dt not in _NP_DTYPES:
            raise ValueError("%s: unsupported dtype %s" % (name, dt))
        b, e = info["data_offsets"]
        shape = list(info["shape"])
        arr = np.frombuffer(raw, dtype=_NP_DTYPES[dt], count=(e - b) // _NP_DTYPES[dt].itemsize,
                            offset=base + b)
        if dt == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        arr = arr.astype(np.float64).reshape(shape)
        out[name] = torch.from_numpy(arr.copy())
    return out, meta


def f32_to_bf16_bits(a):
    """Round-to-nearest-even float32 -> bf16 bit pattern (uint16)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: (torch tensor, dtype string)}; written in insertion order."""
    header = {}
    blobs = []
    off = 0
    for name, (t, dt) in tensors.items():
        a = t.detach().to(torch.float64).numpy()
        if dt == "BF16":
            data = f32_to_bf16_bits(a.astype(np.float32)).astype("<u2").tobytes()
        elif dt in ("F32", "F16", "F64"):
            data = np.ascontiguousarray(a.astype(_NP_DTYPES[dt])).tobytes()
        else:
            raise ValueError(dt)
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    if metadata:
        header["__metadata__"] = metadata
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((-len(hb)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for d in blobs:
            f.write(d)


def load_weights(model_dir):
    single = os.path.join(model_dir, "model.safetensors")
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(single):
        return read_safetensors(single)[0]
    if not os.path.exists(index):
        raise FileNotFoundError("no model.safetensors or model.safetensors.index.json in " + model_dir)
    with open(index) as f:
        wm = json.load(f)["weight_map"]
    out = {}
    for shard in sorted(set(wm.values())):
        ts, _ = read_safetensors(os.path.join(model_dir, shard))
        for k, v in ts.items():
            if wm.get(k) == shard:
                out[k] = v
    missing = [k for k in wm if k not in out]
    if missing:
        raise KeyError("tensors listed in index but not found: %s" % missing[:5])
    return out


# ----------------------------------------------------------------------------
# config
# ----------------------------------------------------------------------------

Q35_TYPES = ("qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text")


class Cfg:
    def __init__(self, raw):
        top_type = raw.get("model_type", "")
        tc = raw.get("text_config", raw) if isinstance(raw.get("text_config"), dict) else raw
        text_type = tc.get("model_type", top_type)
        if top_type == "qwen3_next" or text_type == "qwen3_next":
            self.family = "qwen3_next"
        elif top_type in Q35_TYPES or text_type in Q35_TYPES:
            self.family = "qwen3_5"
        else:
            raise ValueError("unsupported model_type %r / %r" % (top_type, text_type))
        self.is_moe_type = "moe" in top_type or "moe" in text_type

        g = tc.get
        self.D = g("hidden_size")
        self.V = g("vocab_size")
        self.L = g("num_hidden_layers")
        self.n_h = g("num_attention_heads")
        self.n_kv = g("num_key_value_heads")
        self.hd = g("head_dim") if g("head_dim") is not None else 256
        self.eps = g("rms_norm_eps", 1e-6)
        self.Hk = g("linear_num_key_heads")
        self.Hv = g("linear_num_value_heads")
        self.dk = g("linear_key_head_dim")
        self.dv = g("linear_value_head_dim")
        self.conv_k = g("linear_conv_kernel_dim", 4)
        rp = g("rope_parameters") or {}
        theta = g("rope_theta")
        if theta is None:
            theta = rp.get("rope_theta", 10000.0)
        prf = g("partial_rotary_factor")
        if prf is None:
            prf = rp.get("partial_rotary_factor", 0.25)
        self.rope_theta = float(theta)
        self.rot = int(self.hd * prf)
        lt = g("layer_types")
        if lt is None:
            fai = g("full_attention_interval", 4)
            lt = ["full_attention" if (i + 1) % fai == 0 else "linear_attention" for i in range(self.L)]
        assert len(lt) == self.L, "layer_types length != num_hidden_layers"
        for t in lt:
            assert t in ("full_attention", "linear_attention"), t
        self.layer_types = lt
        if g("num_experts") is not None:
            ne = g("num_experts")
        elif self.family == "qwen3_next":
            ne = 512  # HF class default (spec §8.1)
        elif self.is_moe_type:
            ne = 256
        else:
            ne = 0
        self.E = ne or 0
        self.topk = g("num_experts_per_tok", 10)
        self.moe_I = g("moe_intermediate_size")
        default_shared = 512 if self.family == "qwen3_next" else 0
        self.shared_I = g("shared_expert_intermediate_size", default_shared) or 0
        self.I = g("intermediate_size")
        self.sparse_step = g("decoder_sparse_step", 1) or 1
        self.mlp_only = set(g("mlp_only_layers", []) or [])
        if self.family == "qwen3_5":
            self.renorm = True  # Qwen3.5-MoE router always renormalises (spec §1)
        else:
            self.renorm = bool(g("norm_topk_prob", True))
        tie = raw.get("tie_word_embeddings")
        if tie is None:
            tie = tc.get("tie_word_embeddings", False)
        self.tie = bool(tie)
        if g("attention_bias", False):
            raise ValueError("attention_bias=true not supported")
        assert self.Hv % self.Hk == 0 and self.n_h % self.n_kv == 0

    def is_moe(self, i):
        return self.E > 0 and (i + 1) % self.sparse_step == 0 and i not in self.mlp_only


# ----------------------------------------------------------------------------
# math building blocks
# ----------------------------------------------------------------------------

def silu(x):
    return x * torch.sigmoid(x)


def rmsnorm_1pw(x, w, eps):
    """zero-centred RMSNorm: x / sqrt(mean(x^2)+eps) * (1 + w)"""
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * (1.0 + w)


def gated_rmsnorm(o, z, w, eps):
    """plain-weight RMSNorm, then gate by SiLU(z)"""
    return o / torch.sqrt((o * o).mean(-1, keepdim=True) + eps) * w * silu(z)


def l2norm(x, eps=1e-6):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def softplus(x):
    # log(1 + e^x), identity above 20 as in torch / FLA (spec §7.6)
    return torch.nn.functional.softplus(x, beta=1.0, threshold=20.0)


def causal_conv_silu(X, w):
    """X [T, C] channels, w [C, W]: y[t,c] = SiLU(sum_j w[c,j] * X[t-W+1+j, c]), X[<0]=0."""
    T, C = X.shape
    W = w.shape[1]
    Xp = torch.cat([torch.zeros(W - 1, C, dtype=X.dtype), X], 0)
    y = torch.zeros(T, C, dtype=X.dtype)
    for j in range(W):
        y = y + Xp[j:j + T] * w[:, j]
    return silu(y)


def gated_delta_rule(q, k, v, beta, g, S0=None):
    """Token-serial gated delta rule (spec §2.6).
    q, k [T, H, dk] (q already l2-normed and scaled), v [T, H, dv], beta, g [T, H].
    Returns o [T, H, dv] and final state S [H, dk, dv]."""
    T, H, dk = k.shape
    dv = v.shape[-1]
    S = torch.zeros(H, dk, dv, dtype=DT) if S0 is None else S0.clone()
    o = torch.zeros(T, H, dv, dtype=DT)
    for t in range(T):
        S = torch.exp(g[t])[:, None, None] * S
        pred = torch.einsum("hkv,hk->hv", S, k[t])
        u = beta[t][:, None] * (v[t] - pred)
        S = S + torch.einsum("hk,hv->hkv", k[t], u)
        o[t] = torch.einsum("hkv,hk->hv", S, q[t])
    return o, S


def rope_partial(x, pos, rot, theta):
    """x [T, heads, hd]; rotate-half RoPE on the first rot dims."""
    half = rot // 2
    j = torch.arange(half, dtype=DT)
    inv_freq = theta ** (-2.0 * j / rot)
    ang = pos.to(DT)[:, None] * inv_freq[None, :]  # [T, half]
    cos = torch.cat([torch.cos(ang), torch.cos(ang)], -1)[:, None, :]
    sin = torch.cat([torch.sin(ang), torch.sin(ang)], -1)[:, None, :]
    xr, xp = x[..., :rot], x[..., rot:]
    x1, x2 = xr[..., :half], xr[..., half:]
    rh = torch.cat([-x2, x1], -1)
    return torch.cat([xr * cos + rh * sin, xp], -1)


def swiglu(x, wg, wu, wd):
    return (silu(x @ wg.T) * (x @ wu.T)) @ wd.T


# ----------------------------------------------------------------------------
# model
# ----------------------------------------------------------------------------

# --- projections shared by every model class of tests/reference (m: anything with
# .cfg, .W(name) and .has(name) -- HybridModel, grpo_ref's PrefixModel, check_grpo's
# DetachedPrefix); what differs between them (state, detach points) starts after these.

def gdn_inputs(m, i, x):
    """Gated DeltaNet input projections of layer i, either HF layout (Qwen3-Next fused
    in_proj_qkvz/in_proj_ba with per-key-head interleaving, or Qwen3.5 split). Returns
    X [T, 2*Hk*dk + Hv*dv] (the pre-conv [Q|K|V]), z [T, Hv, dv], b and a [T, Hv]."""
    c = m.cfg
    p = "layers.%d.linear_attn." % i
    T = x.shape[0]
    Hk, Hv, dk, dv = c.Hk, c.Hv, c.dk, c.dv
    r = Hv // Hk
    if m.has(p + "in_proj_qkvz.weight"):
        P = (x @ m.W(p + "in_proj_qkvz.weight").T).view(T, Hk, 2 * dk + 2 * r * dv)
        q = P[:, :, :dk]
        k = P[:, :, dk:2 * dk]
        v = P[:, :, 2 * dk:2 * dk + r * dv].reshape(T, Hk, r, dv).reshape(T, Hv, dv)
        z = P[:, :, 2 * dk + r * dv:].reshape(T, Hk, r, dv).reshape(T, Hv, dv)
        Q = (x @ m.W(p + "in_proj_ba.weight").T).view(T, Hk, 2 * r)
        b = Q[:, :, :r].reshape(T, Hv)
        a = Q[:, :, r:].reshape(T, Hv)
    else:
        qkv = x @ m.W(p + "in_proj_qkv.weight").T
        q = qkv[:, :Hk * dk]
        k = qkv[:, Hk * dk:2 * Hk * dk]
        v = qkv[:, 2 * Hk * dk:]
        z = (x @ m.W(p + "in_proj_z.weight").T).reshape(T, Hv, dv)
        b = x @ m.W(p + "in_proj_b.weight").T
        a = x @ m.W(p + "in_proj_a.weight").T
    X = torch.cat([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], -1)
    return X, z, b, a


def gdn_recurrence_inputs(m, i, Y, b, a):
    """From the conv output Y [T, 2*Hk*dk + Hv*dv] and the gate projections b, a of layer
    i: q (L2-normalised, times dk^-1/2) and k (L2-normalised), both expanded to the Hv
    value heads (value head h reads key head h // (Hv/Hk)), v [T, Hv, dv], beta = sigmoid(b)
    and the log decay g = -exp(A_log) * softplus(a + dt_bias), each [T, Hv]."""
    c = m.cfg
    p = "layers.%d.linear_attn." % i
    T = Y.shape[0]
    Hk, Hv, dk, dv = c.Hk, c.Hv, c.dk, c.dv
    q = l2norm(Y[:, :Hk * dk].reshape(T, Hk, dk)) * (dk ** -0.5)
    k = l2norm(Y[:, Hk * dk:2 * Hk * dk].reshape(T, Hk, dk))
    v = Y[:, 2 * Hk * dk:].reshape(T, Hv, dv)
    beta = torch.sigmoid(b)
    g = -torch.exp(m.W(p + "A_log")) * softplus(a + m.W(p + "dt_bias"))
    idx = torch.arange(Hv) // (Hv // Hk)
    return q[:, idx], k[:, idx], v, beta, g


def attn_inputs(m, i, x):
    """Gated attention input projections of layer i: q [T, n_h, hd] and k [T, n_kv, hd]
    after their zero-centred RMSNorm (before RoPE), gate [T, n_h*hd], v [T, n_kv, hd].
    q_proj rows are per head [q | gate]."""
    c = m.cfg
    p = "layers.%d.self_attn." % i
    T = x.shape[0]
    nh, nkv, hd = c.n_h, c.n_kv, c.hd
    qg = (x @ m.W(p + "q_proj.weight").T).view(T, nh, 2 * hd)
    gate = qg[:, :, hd:].reshape(T, nh * hd)
    k = (x @ m.W(p + "k_proj.weight").T).view(T, nkv, hd)
    v = (x @ m.W(p + "v_proj.weight").T).view(T, nkv, hd)
    q = rmsnorm_1pw(qg[:, :, :hd], m.W(p + "q_norm.weight"), c.eps)
    k = rmsnorm_1pw(k, m.W(p + "k_norm.weight"), c.eps)
    return q, gate, k, v


def dense_mlp(m, i, x):
    p = "layers.%d.mlp." % i
    return swiglu(x, m.W(p + "gate_proj.weight"), m.W(p + "up_proj.weight"), m.W(p + "down_proj.weight"))


def expert_weights(m, i, e):
    """(gate [I, D], up [I, D], down [D, I]) of expert e: per-expert tensors or HF v5 fused
    experts.gate_up_proj [E, 2I, D] (gate rows first) / experts.down_proj [E, D, I]."""
    p = "layers.%d.mlp.experts." % i
    if m.has(p + "gate_up_proj"):
        gu = m.W(p + "gate_up_proj")[e]
        I = gu.shape[0] // 2
        return gu[:I], gu[I:], m.W(p + "down_proj")[e]
    q = p + "%d." % e
    return m.W(q + "gate_proj.weight"), m.W(q + "up_proj.weight"), m.W(q + "down_proj.weight")


class HybridModel:
    def __init__(self, model_dir, cfg_raw=None, weights=None):
        if cfg_raw is None:
            with open(os.path.join(model_dir, "config.json")) as f:
                cfg_raw = json.load(f)
        self.cfg = Cfg(cfg_raw)
        self.w = load_weights(model_dir) if weights is None else weights
        # prefix: family default, fall back to the other if absent
        cands = ["model.language_model.", "model."] if self.cfg.family == "qwen3_5" else ["model.", "model.language_model."]
        for p in cands:
            if p + "embed_tokens.weight" in self.w:
                self.pre = p
                break
        else:
            raise KeyError("embed_tokens.weight not found")
        self.used = set()
        self.router_gaps = None  # set to a list to record top-k margins (fixture sanity)

    def W(self, name):
        full = self.pre + name
        if full not in self.w:
            raise KeyError(full)
        self.used.add(full)
        return self.w[full]

    def has(self, name):
        return (self.pre + name) in self.w

    # --- Gated DeltaNet ---
    def gdn(self, i, x):
        c = self.cfg
        p = "layers.%d.linear_attn." % i
        T = x.shape[0]
        Hv, dv = c.Hv, c.dv
        X, z, b, a = gdn_inputs(self, i, x)
        cw = self.W(p + "conv1d.weight")
        cw = cw.reshape(cw.shape[0], cw.shape[-1])
        Y = causal_conv_silu(X, cw)
        q, k, v, beta, g = gdn_recurrence_inputs(self, i, Y, b, a)
        o, _ = gated_delta_rule(q, k, v, beta, g)
        o = gated_rmsnorm(o, z, self.W(p + "norm.weight"), c.eps)
        return o.reshape(T, Hv * dv) @ self.W(p + "out_proj.weight").T

    # --- gated full attention ---
    def attn(self, i, x):
        c = self.cfg
        p = "layers.%d.self_attn." % i
        T = x.shape[0]
        nh, nkv, hd = c.n_h, c.n_kv, c.hd
        q, gate, k, v = attn_inputs(self, i, x)
        pos = torch.arange(T)
        q = rope_partial(q, pos, c.rot, c.rope_theta)
        k = rope_partial(k, pos, c.rot, c.rope_theta)
        grp = nh // nkv
        out = torch.zeros(T, nh, hd, dtype=DT)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        for h in range(nh):
            kh = k[:, h // grp]
            vh = v[:, h // grp]
            s = (q[:, h] @ kh.T) * (hd ** -0.5)
            s = s.masked_fill(~mask, float("-inf"))
            out[:, h] = torch.softmax(s, -1) @ vh
        out = out.reshape(T, nh * hd) * torch.sigmoid(gate)
        return out @ self.W(p + "o_proj.weight").T

    # --- FFN ---
    def dense_mlp(self, i, x):
        return dense_mlp(self, i, x)

    def expert_weights(self, i, e):
        return expert_weights(self, i, e)

    def moe(self, i, x):
        c = self.cfg
        p = "layers.%d.mlp." % i
        N = x.shape[0]
        probs = torch.softmax(x @ self.W(p + "gate.weight").T, -1)  # [N, E]
        topv, topi = torch.topk(probs, c.topk, dim=-1)
        if self.router_gaps is not None and c.topk < c.E:
            srt = torch.sort(probs, -1, descending=True).values
            self.router_gaps.append(float((srt[:, c.topk - 1] - srt[:, c.topk]).min()))
        if c.renorm:
            topv = topv / topv.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in range(c.E):
            sel = (topi == e)  # [N, k]
            rows = sel.any(-1).nonzero().flatten()
            if rows.numel() == 0:
                # still mark weights as used
                self.expert_weights(i, e)
                continue
            wg, wu, wd = self.expert_weights(i, e)
            wt = (topv * sel).sum(-1)[rows]
            out[rows] += wt[:, None] * swiglu(x[rows], wg, wu, wd)
        if c.shared_I > 0 or self.has(p + "shared_expert.gate_proj.weight"):
            sp = p + "shared_expert."
            sh = swiglu(x, self.W(sp + "gate_proj.weight"), self.W(sp + "up_proj.weight"), self.W(sp + "down_proj.weight"))
            sg = torch.sigmoid(x @ self.W(p + "shared_expert_gate.weight").T)  # [N,1]
            out = out + sg * sh
        return out

    # --- full model ---
    def forward(self, ids, return_hidden=False):
        c = self.cfg
        ids = torch.as_tensor(ids, dtype=torch.long)
        emb = self.W("embed_tokens.weight")
        h = emb[ids].clone()
        hidden = [h]
        for i in range(c.L):
            p = "layers.%d." % i
            xn = rmsnorm_1pw(h, self.W(p + "input_layernorm.weight"), c.eps)
            if c.layer_types[i] == "linear_attention":
                h = h + self.gdn(i, xn)
            else:
                h = h + self.attn(i, xn)
            xn = rmsnorm_1pw(h, self.W(p + "post_attention_layernorm.weight"), c.eps)
            h = h + (self.moe(i, xn) if c.is_moe(i) else self.dense_mlp(i, xn))
            hidden.append(h)
        h = rmsnorm_1pw(h, self.W("norm.weight"), c.eps)
        if c.tie:
            head = emb
        else:
            if "lm_head.weight" not in self.w:
                raise KeyError("lm_head.weight missing and tie_word_embeddings is false")
            self.used.add("lm_head.weight")
            head = self.w["lm_head.weight"]
        logits = h @ head.T
        return (logits, hidden) if return_hidden else logits

    def response_logprobs(self, prompt, response):
        seq = list(prompt) + list(response)
        lp = torch.log_softmax(self.forward(seq), -1)
        P = len(prompt)
        return [float(lp[P - 1 + j, response[j]]) for j in range(len(response))]


def group_logprobs(model, group):
    return [model.response_logprobs(group["prompt"], r) for r in group["responses"]]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model dir (config.json + safetensors)")
    ap.add_argument("--group", required=True, help="group json {prompt, responses}")
    ap.add_argument("--dump-hidden", metavar="FILE",
                    help="also write per-layer residual streams of prompt+response[0] (list of [T][D]) to FILE")
    a = ap.parse_args(argv)
    torch.set_grad_enabled(False)
    model = HybridModel(a.model)
    with open(a.group) as f:
        group = json.load(f)
    res = {"logprobs": group_logprobs(model, group)}
    if a.dump_hidden:
        seq = list(group["prompt"]) + list(group["responses"][0])
        _, hidden = model.forward(seq, return_hidden=True)
        with open(a.dump_hidden, "w") as f:
            json.dump({"tokens": seq, "hidden": [t.tolist() for t in hidden]}, f)
    unused = sorted(k for k in model.w if k not in model.used and not k.startswith(("mtp.", "model.visual.")))
    if unused:
        print("warning: unused tensors: %s" % unused[:10], file=sys.stderr)
    json.dump(res, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
