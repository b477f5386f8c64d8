#!/usr/bin/python3
"""Independent fp64 reference for the MLA + DSA (lightning indexer) + MoE family:
GLM-5.x (`glm_moe_dsa`, incl. the GLM-5.2 IndexCache fields) and DeepSeek-V3.2 (`deepseek_v32`).

Written from /work/shared/specs/mla-dsa-moe.md only; it does not look at the C implementation.
Everything is torch.float64.  MTP layers (index >= num_hidden_layers) are ignored.

Forward (per layer, spec §2-§4; x = input_layernorm(h)):
  c_q  = RMSNorm(q_a_proj x)                      [rq]   (q_a_layernorm, eps = rms_norm_eps)
  q    = q_b_proj c_q -> [H, dn+dr]; nope first, rope last; q_pe <- RoPE(q_pe)
  a    = kv_a_proj_with_mqa x; c_kv = RMSNorm(a[:rkv]) (kv_a_layernorm); k_pe = RoPE(a[rkv:]) (shared by heads)
  kv_b_proj [H*(dn+dv), rkv] -> per head [k_nope rows (dn); v rows (dv)]
  S[h,t,s] = sigma*(q_nope.k_nope + q_pe.k_pe) masked to s <= t and s in TopK_t; softmax; o_proj
  indexer (full layers): qI = wq_b c_q [nI, dI], kI = LayerNorm(wk x) [dI] (weight+bias, eps 1e-6),
      rope on the FIRST dr dims of qI and kI, w = weights_proj x * nI^-0.5,
      I[t,s] = sum_j w[t,j] * dI^-0.5 * ReLU(qI[t,j].kI[s]); TopK_t = top min(k, t+1) causal keys,
      ties to the lower position (stable).  Shared (IndexCache) layers reuse the most recent full
      layer's selection.  The selection carries no gradient.
  RoPE: theta_i = base^(-2i/dr); MLA interleaved pairs (2i, 2i+1) (rope_interleave, default true);
      indexer interleaved iff indexer_rope_interleave (default false = half-split (i, i+dr/2)).
      YaRN (deepseek rope_scaling): frequency ramp, sigma = (dn+dr)^-0.5 * m^2, m = 0.1*mscale_all_dim*ln(f)+1.
  FFN: dense SwiGLU (first_k_dense_replace / mlp_layer_types) or MoE: s = sigmoid(x W_g^T),
      s' = s + e_score_correction_bias (selection only), group limit (sum of the 2 largest s' per
      group, keep topk_group groups, others -inf), top-k by s', g = s (unbiased), renormalised if
      norm_topk_prob (+1e-20), times routed_scaling_factor, plus the shared experts.
  Norms are plain-weight RMSNorm x/sqrt(mean x^2 + eps) * w.

GRPO (prefix-frozen / full) reuses grpo_ref.py's Objective and policy_loss: the prompt state of
each layer is (c_kv, k_pe, kI) of positions 0..P-2; prefix-frozen captures it without a tape
(detached), full mode keeps its graph.

LoRA (--adapter FILE --lora-alpha A), PEFT semantics as in grpo_ref.py (its load_adapter is reused):
tensors base_model.model.<HF name without .weight>.lora_A.weight [r, in] / .lora_B.weight [out, r],
W_eff = W + (A/r) * B @ A (r per module, from lora_A's shape).  Only 2-D .weight tensors that the
forward reads can be targets: embed_tokens, 1-D tensors, names the checkpoint lacks and the ignored
MTP layers are refused (naming the tensor).  The base is frozen; the trainable set (and --out) is the
adapter tensors, in adapter-file order.  With --beta != 0 and no --ref-model the reference policy is
the base with the adapters off.  The plain log-probs / --selection-out are those of the adapted model.

Indexer KL (--indexer-kl-coef C > 0; prefix-frozen, no adapter, GRPO objectives; spec §3 sparse stage, §8.4):
the gradient is that of L_GRPO + C * L_I, L_I = (1/N) sum over responses, branch queries t and layers with
their own indexer of KL(p || q) over the layer's selection S_t: p = head-averaged MLA attention probabilities
(detached), q = softmax of the index scores; the indexer reads detached x, c_q and prompt keys, so L_I reaches
only the indexer tensors.  N = total response tokens.  __metadata__ "indexer_kl" = L_I; "loss" = L_GRPO.

CLI
  python3 mla_ref.py --model DIR --group G.json [--mode prefix-frozen|full] [--out GRAD.safetensors]
        [--logprobs-out FILE.json] [--ref-model DIR] [--loss grpo|sft] [--loss-type grpo|dapo|dr_grpo]
        [--epsilon E] [--epsilon-high EH] [--beta B] [--scale-rewards group|batch|none]
        [--temperature T] [--max-completion-length N] [--latent-norm-eps EPS] [--selection-out FILE.json]
        [--adapter ADAPTER.safetensors --lora-alpha A] [--indexer-kl-coef C] [--threads N]
Without "rewards"/"advantages" in the group (and without --loss sft) it prints
{"logprobs": [[...], ...]} (temperature 1, one full-sequence forward per response, like
hybrid_ref.py).  Otherwise it runs the GRPO/SFT objective and prints loss / grad_norm / stats0.
"""

import argparse
import json
import math
import os
import re
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hybrid_ref as hr  # noqa: E402  (safetensors read/write, sharded loading)
import grpo_ref as gr  # noqa: E402  (Objective, policy_loss, write_grads, ...)

DT = torch.float64
MODEL_TYPES = ("glm_moe_dsa", "deepseek_v32")
INDEXER_LN_EPS = 1e-6  # spec §3: k_norm is a LayerNorm with eps 1e-6
NEG_INF = float("-inf")


# ----------------------------------------------------------------------------
# config
# ----------------------------------------------------------------------------

def yarn_mscale(factor, m):
    return 1.0 if factor <= 1.0 else 0.1 * m * math.log(factor) + 1.0


class Cfg:
    """Parsed config.json of a glm_moe_dsa / deepseek_v32 checkpoint."""

    def __init__(self, raw, latent_eps=None):
        mt = raw.get("model_type")
        if mt not in MODEL_TYPES:
            raise ValueError("config.json: model_type %r is not one of %s" % (mt, MODEL_TYPES))
        self.model_type = mt

        def opt(name, default):
            v = raw.get(name)
            return default if v is None else v

        def req(name):
            v = raw.get(name)
            if v is None:
                raise ValueError("config.json: %s is required" % name)
            return v

        self.D = req("hidden_size")
        self.V = req("vocab_size")
        self.L = req("num_hidden_layers")
        self.H = req("num_attention_heads")
        nkv = raw.get("num_key_value_heads")
        if nkv is not None and nkv != self.H:
            raise ValueError("config.json: num_key_value_heads %d != num_attention_heads %d (MLA)" % (nkv, self.H))
        self.rq = raw.get("q_lora_rank")
        if self.rq is None:
            # spec §3: the indexer's query input is the normalised q latent c_q (wq_b is [nI*dI, rq]);
            # a checkpoint without a q latent (plain q_proj) has no defined indexer query.
            raise ValueError("config.json: q_lora_rank null (plain q_proj) is not supported: the DSA indexer "
                             "reads the q latent c_q (spec §3)")
        self.rkv = req("kv_lora_rank")
        self.dn = req("qk_nope_head_dim")
        self.dr = req("qk_rope_head_dim")
        self.dv = req("v_head_dim")
        if self.dr % 2:
            raise ValueError("config.json: qk_rope_head_dim must be even")
        qk = raw.get("qk_head_dim")
        if qk is not None and qk != self.dn + self.dr:
            raise ValueError("config.json: qk_head_dim %d != qk_nope_head_dim + qk_rope_head_dim" % qk)
        self.nI = req("index_n_heads")
        self.dI = req("index_head_dim")
        if self.dI < self.dr:
            raise ValueError("config.json: index_head_dim < qk_rope_head_dim")
        self.k = req("index_topk")
        self.E = req("n_routed_experts")
        self.topk = req("num_experts_per_tok")
        self.moe_I = req("moe_intermediate_size")
        self.n_shared = opt("n_shared_experts", 0)
        self.I = raw.get("intermediate_size")
        self.rsf = float(opt("routed_scaling_factor", 1.0))
        self.n_group = opt("n_group", 1)
        self.topk_group = opt("topk_group", self.n_group)
        if self.E % self.n_group:
            raise ValueError("config.json: n_routed_experts %% n_group != 0")
        if not 1 <= self.topk_group <= self.n_group:
            raise ValueError("config.json: topk_group must be in [1, n_group]")
        if self.n_group > 1 and self.E // self.n_group < 2:
            raise ValueError("config.json: group scores need >= 2 experts per group")
        if self.topk > self.topk_group * (self.E // self.n_group):
            raise ValueError("config.json: num_experts_per_tok exceeds the experts of topk_group groups")
        if opt("scoring_func", "sigmoid") != "sigmoid":
            raise ValueError("config.json: scoring_func %r unsupported (spec §4: sigmoid)" % raw.get("scoring_func"))
        if opt("topk_method", "noaux_tc") != "noaux_tc":
            raise ValueError("config.json: topk_method %r unsupported (spec §4: noaux_tc)" % raw.get("topk_method"))
        self.norm_topk = bool(opt("norm_topk_prob", True))
        self.eps = float(opt("rms_norm_eps", 1e-6))
        # spec §8.2: the latent norms follow rms_norm_eps (vLLM/SGLang/Megatron); HF hard-codes 1e-6
        self.lat_eps = self.eps if latent_eps is None else float(latent_eps)
        self.tie = bool(opt("tie_word_embeddings", False))
        if raw.get("attention_bias"):
            raise ValueError("config.json: attention_bias=true is not supported")

        # --- RoPE ---
        rp = raw.get("rope_parameters") or {}
        self.theta = float(raw["rope_theta"] if raw.get("rope_theta") is not None else rp.get("rope_theta", 10000.0))
        rs = raw.get("rope_scaling")
        if rs is None and rp.get("rope_type", rp.get("type")) not in (None, "default"):
            rs = rp
        rtype = None if rs is None else rs.get("rope_type", rs.get("type"))
        self.yarn = None
        if rtype in (None, "default"):
            pass
        elif rtype in ("yarn", "deepseek_yarn"):
            for f in ("factor", "original_max_position_embeddings"):
                if rs.get(f) is None:
                    raise ValueError("config.json: rope_scaling.%s is required for yarn" % f)
            ms, msa = rs.get("mscale"), rs.get("mscale_all_dim")
            if ms is None or msa is None or float(ms) != float(msa):
                # spec §2: cos/sin are not rescaled because HF's attention_factor mscale/mscale_all_dim = 1;
                # other combinations are not defined by the spec.
                raise ValueError("config.json: rope_scaling needs mscale == mscale_all_dim (got %r, %r)" % (ms, msa))
            if rs.get("attention_factor") not in (None, 1, 1.0):
                raise ValueError("config.json: rope_scaling.attention_factor != 1 is not supported")
            self.yarn = dict(factor=float(rs["factor"]), orig=float(rs["original_max_position_embeddings"]),
                             beta_fast=float(opt_get(rs, "beta_fast", 32.0)),
                             beta_slow=float(opt_get(rs, "beta_slow", 1.0)), mscale_all_dim=float(msa))
        else:
            raise ValueError("config.json: rope type %r unsupported" % rtype)
        self.mla_interleave = bool(opt("rope_interleave", True))          # spec §2: MLA interleaved in both
        self.idx_interleave = bool(opt("indexer_rope_interleave", False))  # spec §3/§8.3: absent = half-split
        m = yarn_mscale(self.yarn["factor"], self.yarn["mscale_all_dim"]) if self.yarn else 1.0
        self.sigma = (self.dn + self.dr) ** -0.5 * m * m

        # --- dense / MoE layers (spec §8.7) ---
        mlt = raw.get("mlp_layer_types")
        if mlt is not None:
            if len(mlt) != self.L or any(t not in ("dense", "sparse") for t in mlt):
                raise ValueError("config.json: mlp_layer_types needs %d entries of dense/sparse" % self.L)
            self.moe_layers = [t == "sparse" for t in mlt]
        else:
            fk = raw.get("first_k_dense_replace")
            if fk is None:
                raise ValueError("config.json: needs mlp_layer_types or first_k_dense_replace")
            freq = opt("moe_layer_freq", 1)
            self.moe_layers = [i >= fk and i % freq == 0 for i in range(self.L)]
        if not all(self.moe_layers) and self.I is None:
            raise ValueError("config.json: intermediate_size is required for dense layers")

        # --- indexer layers (spec §1, §8.5) ---
        it = raw.get("indexer_types")
        pat = raw.get("index_topk_pattern")
        if it is not None:
            if len(it) != self.L or any(t not in ("full", "shared") for t in it):
                raise ValueError("config.json: indexer_types needs %d entries of full/shared" % self.L)
            full = [t == "full" for t in it]
        elif pat is not None:
            conv = {"F": True, "S": False, "full": True, "shared": False}
            if len(pat) != self.L or any(t not in conv for t in pat):
                raise ValueError("config.json: index_topk_pattern needs %d entries of F/S" % self.L)
            full = [conv[t] for t in pat]
        else:
            freq = opt("index_topk_freq", 1)
            off = opt("index_skip_topk_offset", 2)
            full = [max(i - off + 1, 0) % freq == 0 for i in range(self.L)]
        if not full[0]:
            raise ValueError("config.json: layer 0 must run its own indexer (no earlier layer to share)")
        self.full_idx = full

    def yarn_low_high(self):
        """YaRN ramp ends (spec §2): low = floor(corr(beta_fast)), high = ceil(corr(beta_slow)), clamped."""
        dr, base, y = self.dr, self.theta, self.yarn

        def corr(r):
            return dr * math.log(y["orig"] / (2 * math.pi * r)) / (2 * math.log(base))

        low = min(max(math.floor(corr(y["beta_fast"])), 0), dr - 1)
        high = min(max(math.ceil(corr(y["beta_slow"])), 0), dr - 1)
        return low, high

    def inv_freq(self):
        """theta_i = base^(-2i/dr), i < dr/2, with the YaRN ramp when configured (spec §2)."""
        dr, base = self.dr, self.theta
        i = torch.arange(dr // 2, dtype=DT)
        th = base ** (-2.0 * i / dr)
        if self.yarn:
            low, high = self.yarn_low_high()
            if high == low:
                high += 0.001  # DS-ref guard against a zero-width ramp (not reached by the fixtures)
            ramp = ((i - low) / (high - low)).clamp(0.0, 1.0)
            th = th / self.yarn["factor"] * ramp + th * (1.0 - ramp)
        return th


def opt_get(d, k, default):
    v = d.get(k)
    return default if v is None else v


# ----------------------------------------------------------------------------
# primitives
# ----------------------------------------------------------------------------

def rmsnorm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def layernorm(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def rope(x, pos, inv_freq, interleaved):
    """x: [T, ..., d] rotated at positions pos [T]; interleaved (2i, 2i+1) or half-split (i, i+d/2)."""
    T, d = x.shape[0], x.shape[-1]
    ang = pos.to(inv_freq.dtype)[:, None] * inv_freq[None, :]  # [T, d/2]
    shp = [T] + [1] * (x.dim() - 2) + [d // 2]
    cos, sin = torch.cos(ang).reshape(shp), torch.sin(ang).reshape(shp)
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2)
    x1, x2 = x[..., :d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


def swiglu(x, wg, wu, wd):
    return (torch.nn.functional.silu(x @ wg.T) * (x @ wu.T)) @ wd.T


def topk_mask(I, qpos, kpos, k):
    """bool [T, S]: the min(k, #causal) causal keys with the largest I, ties to the lower position."""
    causal = kpos[None, :] <= qpos[:, None]
    key = torch.where(causal, -I, torch.full_like(I, float("inf")))
    order = torch.sort(key, dim=-1, stable=True).indices  # stable: equal scores keep position order
    n = causal.sum(-1).clamp(max=k)
    take = torch.arange(I.shape[1])[None, :] < n[:, None]
    return torch.zeros_like(causal).scatter(1, order, take), causal


def is_mtp_name(name, L):
    m = re.match(r"model\.layers\.(\d+)\.", name)
    return m is not None and int(m.group(1)) >= L


# ----------------------------------------------------------------------------
# LoRA targets
# ----------------------------------------------------------------------------

def check_lora(cfg, weights, lora, used=None):
    """Refuse adapter targets the model cannot take (each message names the tensor): embed_tokens,
    tensors the checkpoint lacks, 1-D tensors (incl. a non-.weight parameter such as
    e_score_correction_bias), MTP-layer tensors (ignored by the model), shapes that do not fit
    (A [r, in], B [out, r] for W [out, in]), and, given used (the names the forward reads), unread ones."""
    for k, (A, B, _s) in lora.items():
        if k.endswith("embed_tokens.weight"):
            raise ValueError("LoRA on embed_tokens is not supported (%s)" % k)
        if k not in weights:
            base = k[:-len(".weight")] if k.endswith(".weight") else None
            if base is not None and base in weights:
                raise ValueError("LoRA on %s (a %d-D parameter, not a .weight matrix) is not supported"
                                 % (base, weights[base].dim()))
            raise ValueError("adapter targets %s, which the model does not have (not in the checkpoint)" % k)
        if is_mtp_name(k, cfg.L):
            raise ValueError("adapter targets %s, an MTP-layer tensor, which the model ignores" % k)
        W = weights[k]
        if W.dim() != 2:
            raise ValueError("LoRA on the %d-D tensor %s is not supported (2-D weights only)" % (W.dim(), k))
        if A.dim() != 2 or B.dim() != 2 or A.shape[1] != W.shape[1] or B.shape[0] != W.shape[0] \
                or B.shape[1] != A.shape[0]:
            raise ValueError("adapter for %s: lora_A %s / lora_B %s do not fit the weight %s" % (
                k, list(A.shape), list(B.shape), list(W.shape)))
        if used is not None and k not in used:
            raise ValueError("adapter targets %s, which the forward does not read" % k)


def merged_weights(weights, lora):
    """{name: W + scale * B @ A} (detached, in the weights' dtype): the adapted model as plain weights
    (checks, margin search)."""
    out = dict(weights)
    for k, (A, B, s) in lora.items():
        out[k] = (weights[k] + s * (B.detach().to(weights[k].dtype) @ A.detach().to(weights[k].dtype))).detach()
    return out


# ----------------------------------------------------------------------------
# indexer KL loss (spec §3 "Indexer training", sparse stage; §8.4)
# ----------------------------------------------------------------------------

def indexer_kl_rows(A, I, sel):
    """KL(p || q) per query [T] over the selected keys: A [H, T, S] attention probabilities (0 off the
    selection), I [T, S] index scores, sel [T, S] bool.  Teacher p = head-summed A, L1-normalised (the
    head average); student q = softmax of I over the selection; 0 log 0 = 0."""
    p = A.sum(0)
    p = p / p.sum(-1, keepdim=True)
    logq = torch.log_softmax(I.masked_fill(~sel, NEG_INF), -1)
    zero = torch.zeros_like(p)
    on = sel & (p > 0)
    lq = torch.where(sel, logq, zero)
    lp = torch.log(torch.where(on, p, torch.ones_like(p)))
    return torch.where(on, p * (lp - lq), zero).sum(-1)


def indexer_kl_member(net, state, prompt, resp):
    """sum over the branch queries of one response and over the layers with their own indexer of
    KL(p || q), as a tensor (graph to the indexer tensors only); the branch is branch_logprobs' forward."""
    net.kl = []
    try:
        net.branch_logprobs(state, prompt, resp)
        terms = net.kl
    finally:
        net.kl = None
    if not terms:
        raise ValueError("indexer KL: the model has no layer with its own indexer")
    total = terms[0][1].sum()
    for _, t in terms[1:]:
        total = total + t.sum()
    return total


def indexer_kl_loss(net, state, group):
    """L_I = (1/N) sum_i sum_{branch queries t of response i} sum_{full indexer layers l} KL(p_lt || q_lt),
    N = total response tokens, on a captured (detached) prompt state.  Returns a tensor."""
    resps = group["responses"]
    N = sum(len(r) for r in resps)
    L = 0.0
    for r in resps:
        L = L + indexer_kl_member(net, state, group["prompt"], r)
    return L / N


def check_indexer_kl(coef, grad_mode, adapter, loss):
    """the combinations --indexer-kl-coef takes (raises ValueError)."""
    if not coef >= 0.0 or math.isinf(coef):
        raise ValueError("--indexer-kl-coef must be a finite number >= 0 (got %r)" % coef)
    if coef == 0.0:
        return
    if grad_mode != "prefix-frozen":
        raise ValueError("--indexer-kl-coef needs --mode prefix-frozen (the indexer KL is defined on the "
                         "captured, detached prompt state)")
    if adapter is not None:
        raise ValueError("--indexer-kl-coef trains the indexer tensors themselves: not with --adapter (LoRA)")
    if loss != "grpo":
        raise ValueError("--indexer-kl-coef is an addition to the GRPO objective (--loss grpo, any --loss-type): "
                         "not with --loss %s" % loss)


# ----------------------------------------------------------------------------
# stateful, differentiable model
# ----------------------------------------------------------------------------

class Net:
    """MLA + DSA + MoE decoder that can continue from a prompt state.

    state[i] = {"ckv": [T0, rkv] (after kv_a_layernorm), "kpe": [T0, dr] (after RoPE),
                "kI": [T0, dI] (after k_norm + RoPE; full indexer layers only, else None)}
    for positions 0..T0-1.  rec: None, or a Recorder that collects the selections and their margins.
    lora: None or {full weight name: (A [r, in], B [out, r], scale)} -> W_eff = W + scale * B @ A
    (grpo_ref.make_lora); validated by check_lora.
    """

    def __init__(self, cfg, weights, lora=None):
        self.cfg = cfg
        self.w = weights
        self.lora = lora or {}
        check_lora(cfg, weights, self.lora)
        self.used = set()
        self.rec = None
        # float64 everywhere; float32 weights give a float32 run (the generator's conditioning check)
        self.dt = weights["model.embed_tokens.weight"].dtype
        self.inv_freq = cfg.inv_freq().to(self.dt)
        self.shared_dense = False  # negative control: shared layers attend densely instead of reusing
        # indexer KL loss (see indexer_kl_loss): None, or a list that every full indexer layer appends
        # (layer, KL per query [T]) to; kl_detach False is a negative control (indexer inputs and teacher attached)
        self.kl = None
        self.kl_detach = True

    def _get(self, key):
        if key not in self.w:
            raise KeyError("tensor %s missing from the checkpoint" % key)
        self.used.add(key)
        t = self.w[key]
        if key in self.lora:
            A, B, s = self.lora[key]
            t = t + s * (B @ A)
        return t

    def W(self, name):
        return self._get("model." + name)

    def empty_state(self):
        c = self.cfg
        dt = self.dt
        return [{"ckv": torch.zeros(0, c.rkv, dtype=dt), "kpe": torch.zeros(0, c.dr, dtype=dt),
                 "kI": torch.zeros(0, c.dI, dtype=dt) if c.full_idx[i] else None} for i in range(c.L)]

    # --- DSA indexer (spec §3) ---------------------------------------------
    def indexer(self, i, x, cq, pos, st, cut):
        c = self.cfg
        p = "layers.%d.self_attn.indexer." % i
        T = x.shape[0]
        if self.kl is not None and self.kl_detach:
            # indexer KL: the indexer reads constants (x, c_q, the prompt's index keys), so L_I reaches only the
            # indexer's own tensors; the values (and the selection) are unchanged
            x, cq = x.detach(), cq.detach()
            st = dict(st, kI=st["kI"].detach())
        kI = layernorm(x @ self.W(p + "wk.weight").T, self.W(p + "k_norm.weight"), self.W(p + "k_norm.bias"),
                       INDEXER_LN_EPS)
        kI = torch.cat([rope(kI[:, :c.dr], pos, self.inv_freq, c.idx_interleave), kI[:, c.dr:]], -1)
        KI = torch.cat([st["kI"], kI], 0)
        if cut is not None:
            KI = torch.cat([KI[:cut].detach(), KI[cut:]], 0)
        qI = (cq @ self.W(p + "wq_b.weight").T).reshape(T, c.nI, c.dI)
        qI = torch.cat([rope(qI[..., :c.dr], pos, self.inv_freq, c.idx_interleave), qI[..., c.dr:]], -1)
        wts = (x @ self.W(p + "weights_proj.weight").T) * c.nI ** -0.5  # [T, nI]
        dots = torch.einsum("tjd,sd->tjs", qI, KI)  # [T, nI, S]
        I = torch.einsum("tj,tjs->ts", wts, torch.relu(dots)) * c.dI ** -0.5
        kpos = torch.arange(KI.shape[0])
        sel, causal = topk_mask(I, pos, kpos, c.k)
        if self.rec is not None:
            self.rec.indexer(i, I.detach(), dots.detach(), wts.detach(), qI.detach().norm(dim=-1),
                             KI.detach().norm(dim=-1), sel, causal, pos, c.k, c.dI ** -0.5)
        return sel, KI, I

    # --- MLA (spec §2) -------------------------------------------------------
    def attn(self, i, x, st, pos0, sel_prev, cut):
        c = self.cfg
        p = "layers.%d.self_attn." % i
        T = x.shape[0]
        assert st["ckv"].shape[0] == pos0, "state length %d != start position %d" % (st["ckv"].shape[0], pos0)
        pos = torch.arange(pos0, pos0 + T)
        cq = rmsnorm(x @ self.W(p + "q_a_proj.weight").T, self.W(p + "q_a_layernorm.weight"), c.lat_eps)
        q = (cq @ self.W(p + "q_b_proj.weight").T).reshape(T, c.H, c.dn + c.dr)
        q_nope, q_pe = q[..., :c.dn], rope(q[..., c.dn:], pos, self.inv_freq, c.mla_interleave)
        a = x @ self.W(p + "kv_a_proj_with_mqa.weight").T  # [T, rkv+dr]
        ckv = rmsnorm(a[:, :c.rkv], self.W(p + "kv_a_layernorm.weight"), c.lat_eps)
        kpe = rope(a[:, c.rkv:], pos, self.inv_freq, c.mla_interleave)
        CKV = torch.cat([st["ckv"], ckv], 0)
        KPE = torch.cat([st["kpe"], kpe], 0)
        if cut is not None:  # full-sequence forward with the prompt state detached (checks)
            CKV = torch.cat([CKV[:cut].detach(), CKV[cut:]], 0)
            KPE = torch.cat([KPE[:cut].detach(), KPE[cut:]], 0)
        KI = I = None
        if c.full_idx[i]:
            sel, KI, I = self.indexer(i, x, cq, pos, st, cut)
        elif self.shared_dense:
            sel = torch.arange(CKV.shape[0])[None, :] <= pos[:, None]
        else:
            sel = sel_prev  # IndexCache: reuse the most recent full layer's picks (spec §7.5)
        Wkvb = self.W(p + "kv_b_proj.weight").reshape(c.H, c.dn + c.dv, c.rkv)
        k_nope = torch.einsum("hdr,sr->shd", Wkvb[:, :c.dn], CKV)
        v = torch.einsum("hdr,sr->shd", Wkvb[:, c.dn:], CKV)
        S = c.sigma * (torch.einsum("thd,shd->hts", q_nope, k_nope) + torch.einsum("thd,sd->hts", q_pe, KPE))
        S = S.masked_fill(~sel[None], NEG_INF)
        A = torch.softmax(S, -1)  # [H, T, S]
        if self.kl is not None and I is not None:  # only layers that run their own indexer
            self.kl.append((i, indexer_kl_rows(A.detach() if self.kl_detach else A, I, sel)))
        o = torch.einsum("hts,shd->thd", A, v).reshape(T, c.H * c.dv)
        out = o @ self.W(p + "o_proj.weight").T
        return out, {"ckv": CKV, "kpe": KPE, "kI": KI}, sel

    # --- FFN (spec §4) -------------------------------------------------------
    def dense_mlp(self, i, x):
        p = "layers.%d.mlp." % i
        return swiglu(x, self.W(p + "gate_proj.weight"), self.W(p + "up_proj.weight"), self.W(p + "down_proj.weight"))

    def route(self, i, x):
        """(top-k expert ids [T, K], gate weights [T, K]); selection by s + bias, weights from s."""
        c = self.cfg
        p = "layers.%d.mlp." % i
        s = torch.sigmoid(x @ self.W(p + "gate.weight").T)  # [T, E]
        sb = s + self.W(p + "gate.e_score_correction_bias")
        T = x.shape[0]
        if c.n_group > 1:
            gsc = sb.reshape(T, c.n_group, -1).topk(2, dim=-1).values.sum(-1)  # [T, n_group]
            gi = gsc.topk(c.topk_group, dim=-1).indices
            gmask = torch.zeros(T, c.n_group, dtype=torch.bool).scatter(1, gi, True)
            emask = gmask[:, :, None].expand(T, c.n_group, c.E // c.n_group).reshape(T, c.E)
            sbm = sb.masked_fill(~emask, NEG_INF)
        else:
            gsc, sbm = None, sb
        topi = sbm.topk(c.topk, dim=-1).indices
        g = s.gather(1, topi)
        if c.norm_topk:
            g = g / (g.sum(-1, keepdim=True) + 1e-20)
        g = g * c.rsf
        if self.rec is not None:
            keep = self._pos >= self.rec.min_pos
            self.rec.router(i, s.detach()[keep], sb.detach()[keep], None if gsc is None else gsc.detach()[keep],
                            sbm.detach()[keep], topi[keep], c)
        return topi, g

    def moe(self, i, x):
        c = self.cfg
        p = "layers.%d.mlp." % i
        topi, g = self.route(i, x)
        out = torch.zeros(x.shape, dtype=x.dtype)
        for e in range(c.E):
            ep = p + "experts.%d." % e
            wg, wu, wd = self.W(ep + "gate_proj.weight"), self.W(ep + "up_proj.weight"), self.W(ep + "down_proj.weight")
            sel = topi == e
            rows = sel.any(-1).nonzero().flatten()
            if rows.numel() == 0:
                continue
            wt = (g * sel).sum(-1)[rows]
            out = out.index_add(0, rows, wt[:, None] * swiglu(x[rows], wg, wu, wd))
        if c.n_shared > 0:
            sp = p + "shared_experts."
            out = out + swiglu(x, self.W(sp + "gate_proj.weight"), self.W(sp + "up_proj.weight"),
                               self.W(sp + "down_proj.weight"))
        return out

    # --- model ---------------------------------------------------------------
    def forward(self, ids, pos0, state, cut=None):
        """ids: tokens at positions pos0..pos0+T-1; state: what positions 0..pos0-1 left.
        cut: detach c_kv / k_pe / kI of positions < cut (checks only).
        Returns logits [T, V] and the extended state (the input state is not modified)."""
        c = self.cfg
        ids = torch.as_tensor(ids, dtype=torch.long)
        self._pos = torch.arange(pos0, pos0 + ids.numel())  # for the Recorder
        emb = self.W("embed_tokens.weight")
        h = emb[ids]
        new_state, sel = [], None
        for i in range(c.L):
            p = "layers.%d." % i
            xn = rmsnorm(h, self.W(p + "input_layernorm.weight"), c.eps)
            o, ns, sel = self.attn(i, xn, state[i], pos0, sel, cut)
            new_state.append(ns)
            h = h + o
            xn = rmsnorm(h, self.W(p + "post_attention_layernorm.weight"), c.eps)
            h = h + (self.moe(i, xn) if c.moe_layers[i] else self.dense_mlp(i, xn))
        h = rmsnorm(h, self.W("norm.weight"), c.eps)
        head = emb if c.tie else self._get("lm_head.weight")
        return h @ head.T, new_state

    def capture(self, prompt, keep_graph=False, chunk=None):
        """State after x_1..x_{P-1} (x_P is the first input of every branch).  Prefix-frozen: no tape,
        detached; keep_graph (full mode): the state tensors keep their graph to the parameters.
        chunk: capture in chunks of that many tokens (each chunk extends the state)."""
        st = self.empty_state()
        n = len(prompt) - 1
        step = chunk or max(n, 1)
        with torch.enable_grad() if keep_graph else torch.no_grad():
            for a in range(0, n, step):
                _, st = self.forward(prompt[a:min(a + step, n)], a, st)
        if keep_graph:
            return st
        return [{k: (None if v is None else v.detach()) for k, v in d.items()} for d in st]

    def branch_logprobs(self, state, prompt, resp, temperature=1.0):
        """l_t = log p(y_t | prompt, y_<t), t = 1..R, from the branch [x_P, y_1..y_{R-1}]."""
        P, R = len(prompt), len(resp)
        assert R >= 1
        logits, _ = self.forward([prompt[-1]] + list(resp[:-1]), P - 1, state)
        lp = torch.log_softmax(logits / temperature, -1)
        return lp[torch.arange(R), torch.as_tensor(resp, dtype=torch.long)]

    def seq_logprobs(self, prompt, resp, temperature=1.0, cut=None):
        """same log-probs from ONE full-sequence forward over prompt + response (no state)."""
        P, R = len(prompt), len(resp)
        logits, _ = self.forward(list(prompt) + list(resp), 0, self.empty_state(), cut=cut)
        lp = torch.log_softmax(logits[P - 1:P - 1 + R] / temperature, -1)
        return lp[torch.arange(R), torch.as_tensor(resp, dtype=torch.long)]


# ----------------------------------------------------------------------------
# selection margins (used by the fixture generator)
# ----------------------------------------------------------------------------

class SelectionTooClose(Exception):
    pass


class Recorder:
    """Collects, per forward, the margins that decide the discrete selections.

    router: min over tokens of (K-th - (K+1)-th) of the biased, group-masked score s', and of the
            (topk_group-th - next) group score; counts of tokens whose selection the bias / the group
            limit changes.
    indexer: per query with more than k causal keys, whether the selected set survives float32-sized
             perturbations (see indexer()); idx_margin is the smallest positive min-selected minus
             max-unselected score; zero_ties counts rows whose cutoff is an exact tie (at I == 0).
    """

    def __init__(self, idx_rel, router_gap=0.0, fail_fast=False, page=64):
        self.idx_rel, self.page = idx_rel, page
        self.min_router_gap = router_gap
        self.fail_fast = fail_fast  # raise SelectionTooClose at the first violation (seed searches)
        self.router_gap = float("inf")
        self.group_gap = float("inf")
        self.bias_changed = 0
        self.group_changed = 0
        self.router_tokens = 0
        self.idx_margin = float("inf")  # smallest positive (min selected - max unselected) / row scale
        self.idx_gap_abs = float("inf")  # smallest positive (min selected - max unselected)
        self.idx_bad = 0
        self.idx_rows = 0
        self.idx_pruned = 0
        self.zero_ties = 0
        self.multi_page = 0
        self.sel_layers = []
        self.sels = []      # per indexer call: the selection mask [T, S]
        self.experts = []   # per router call: (layer, sorted expert ids [T, K])
        self.min_pos = 0  # rows/tokens at earlier positions are not counted (set by the caller)

    def router(self, i, s, sb, gsc, sbm, topi, c):
        K = c.topk
        self.experts.append((i, torch.sort(topi, -1).values))
        srt = torch.sort(sbm, -1, descending=True).values
        if K < c.E:  # a masked (K+1)-th expert is -inf: infinite margin
            self.router_gap = min(self.router_gap, float((srt[:, K - 1] - srt[:, K]).min()))
        if gsc is not None and c.topk_group < c.n_group:
            gs = torch.sort(gsc, -1, descending=True).values
            self.group_gap = min(self.group_gap, float((gs[:, c.topk_group - 1] - gs[:, c.topk_group]).min()))
        chosen = torch.zeros_like(sb, dtype=torch.bool).scatter(1, topi, True)
        unb = torch.zeros_like(chosen).scatter(1, sb.topk(K, -1).indices, True)   # no group limit
        nob = torch.zeros_like(chosen).scatter(1, s.topk(K, -1).indices, True)    # no bias, no group limit
        self.group_changed += int((chosen != unb).any(-1).sum())
        self.bias_changed += int((unb != nob).any(-1).sum())
        self.router_tokens += s.shape[0]
        if self.fail_fast and not (self.router_gap >= self.min_router_gap and self.group_gap >= self.min_router_gap):
            raise SelectionTooClose("router, layer %d" % i)

    def indexer(self, i, I, dots, wts, qn, kn, sel, causal, qpos, k, scale):
        """I [T, S] index scores, dots [T, nI, S] = qI.kI, wts [T, nI] head weights (with nI^-0.5),
        qn [T, nI] = |qI|, kn [S] = |kI|, scale = dI^-0.5.

        A row is robust when every (selected a, unselected b) pair keeps its order under relative
        perturbations of size rel (far above float32 rounding): with b_js = rel*|qI_j|*|kI_s|, a head
        whose dot >= b_js contributes w*dot*scale +- 2*rel*|w|*|qI_j|*|kI_s|*scale, a dot <= -b_js
        contributes exactly 0 (ReLU off), and a dot in between anything in [0, w*b_js*scale] (by the
        sign of w).  Then a beats b iff lo_a > hi_b, or both can only be exactly 0 at the boundary
        (lo_a == 0 == hi_b) and a has the lower position (the tie rule)."""
        self.sels.append(sel.clone())
        self.sel_layers.append(i)
        rel = self.idx_rel
        for t in range(I.shape[0]):
            if int(qpos[t]) < self.min_pos:  # rows already counted (the shared prompt)
                continue
            cs = causal[t]
            n = int(cs.sum())
            self.idx_rows += 1
            if n <= k:
                continue
            self.idx_pruned += 1
            sv = I[t][sel[t]]
            uv = I[t][cs & ~sel[t]]
            m = float(sv.min() - uv.max())
            picked = sel[t].nonzero().flatten()
            if len(set(int(s) // self.page for s in picked)) > 1:
                self.multi_page += 1
            d = dots[t][:, cs]                              # [nI, n]
            w = wts[t][:, None]                             # [nI, 1]
            qk = qn[t][:, None] * kn[cs][None, :]           # [nI, n]
            bnd = rel * qk
            pos_ = d >= bnd
            frag = (d > -bnd) & ~pos_
            term = w * torch.relu(d) * scale
            err = 2 * rel * w.abs() * qk * scale
            fr_end = w * bnd * scale
            zero = torch.zeros_like(term)
            lo = torch.where(pos_, term - err, torch.where(frag, torch.clamp(fr_end, max=0.0), zero)).sum(0)
            hi = torch.where(pos_, term + err, torch.where(frag, torch.clamp(fr_end, min=0.0), zero)).sum(0)
            sl = sel[t][cs]
            kp = torch.arange(n)
            la, hb = lo[sl][:, None], hi[~sl][None, :]
            beat = (la > hb) | ((la == 0) & (hb == 0) & (kp[sl][:, None] < kp[~sl][None, :]))
            if m == 0.0:
                self.zero_ties += 1
            if bool(beat.all()):
                if m > 0:
                    # relative margin: (min selected - max unselected) / row scale
                    rs = float((w.abs() * qk * scale).sum(0).max())
                    self.idx_margin = min(self.idx_margin, m / rs)
                    self.idx_gap_abs = min(self.idx_gap_abs, m)
                continue
            self.idx_bad += 1
            if self.fail_fast:
                raise SelectionTooClose("index top-k, layer %d, position %d" % (i, int(qpos[t])))

    def ok(self):
        return self.idx_bad == 0 and self.router_gap >= self.min_router_gap and self.group_gap >= self.min_router_gap


# ----------------------------------------------------------------------------
# slow, independent forward (per query, absorbed MQA form, python sorting) for the checks
# ----------------------------------------------------------------------------

def _rope_complex(x, pos, inv_freq, interleaved):
    d = x.shape[-1]
    z = torch.complex(x[..., 0::2], x[..., 1::2]) if interleaved else torch.complex(x[..., :d // 2], x[..., d // 2:])
    z = z * torch.polar(torch.ones_like(inv_freq), float(pos) * inv_freq)
    return torch.stack([z.real, z.imag], -1).flatten(-2) if interleaved else torch.cat([z.real, z.imag], -1)


def slow_logits(cfg, w, ids, kl=None, kl_from=0):
    """logits [T, V] from a token-by-token implementation written differently from Net:
    complex-number RoPE, absorbed attention (q~ = W_UK^T q_nope against [c_kv; k_pe], value c_kv,
    W_UV after the sum), top-k and routing by python sorting, one token at a time.
    kl: a list that gets (layer, t, KL(p || q)) of every query t >= kl_from of every layer with its own
    indexer (teacher = head average of the absorbed attention, student = softmax of the python scores)."""
    c = cfg
    W = lambda n: w["model." + n]  # noqa: E731
    inv = c.inv_freq()
    T = len(ids)
    h = W("embed_tokens.weight")[torch.as_tensor(ids)]

    def rms(x, wt, eps):
        return x / math.sqrt(float((x * x).mean()) + eps) * wt

    prev_sel = None
    for i in range(c.L):
        p = "layers.%d." % i
        a_ = "layers.%d.self_attn." % i
        Wkvb = W(a_ + "kv_b_proj.weight").reshape(c.H, c.dn + c.dv, c.rkv)
        WUK, WUV = Wkvb[:, :c.dn, :], Wkvb[:, c.dn:, :]
        xs = [rms(h[t], W(p + "input_layernorm.weight"), c.eps) for t in range(T)]
        cqs, ckvs, kpes, kIs = [], [], [], []
        for t in range(T):
            cq = rms(W(a_ + "q_a_proj.weight") @ xs[t], W(a_ + "q_a_layernorm.weight"), c.lat_eps)
            kv = W(a_ + "kv_a_proj_with_mqa.weight") @ xs[t]
            cqs.append(cq)
            ckvs.append(rms(kv[:c.rkv], W(a_ + "kv_a_layernorm.weight"), c.lat_eps))
            kpes.append(_rope_complex(kv[c.rkv:], t, inv, c.mla_interleave))
            if c.full_idx[i]:
                ip = a_ + "indexer."
                kr = W(ip + "wk.weight") @ xs[t]
                kr = (kr - kr.mean()) / math.sqrt(float(((kr - kr.mean()) ** 2).mean()) + INDEXER_LN_EPS)
                kr = kr * W(ip + "k_norm.weight") + W(ip + "k_norm.bias")
                kIs.append(torch.cat([_rope_complex(kr[:c.dr], t, inv, c.idx_interleave), kr[c.dr:]]))
        sels = []
        outs = []
        for t in range(T):
            if c.full_idx[i]:
                ip = a_ + "indexer."
                qI = (W(ip + "wq_b.weight") @ cqs[t]).reshape(c.nI, c.dI)
                qI = torch.cat([_rope_complex(qI[:, :c.dr], t, inv, c.idx_interleave), qI[:, c.dr:]], -1)
                wts = (W(ip + "weights_proj.weight") @ xs[t]) / math.sqrt(c.nI)
                scores = []
                for s in range(t + 1):
                    sc = 0.0
                    for j in range(c.nI):
                        sc += float(wts[j]) * max(float(qI[j] @ kIs[s]), 0.0) / math.sqrt(c.dI)
                    scores.append(sc)
                sel = sorted(range(t + 1), key=lambda s: (-scores[s], s))[:c.k]
            else:
                sel = prev_sel[t]
            sels.append(sel)
            q = (W(a_ + "q_b_proj.weight") @ cqs[t]).reshape(c.H, c.dn + c.dr)
            q_pe = _rope_complex(q[:, c.dn:], t, inv, c.mla_interleave)
            qt = torch.einsum("hdr,hd->hr", WUK, q[:, :c.dn])  # absorbed query [H, rkv]
            keys = torch.stack([torch.cat([ckvs[s], kpes[s]]) for s in sel])  # [n, rkv+dr]
            lg = c.sigma * (torch.cat([qt, q_pe], -1) @ keys.T)  # [H, n]
            mx = lg.max(-1, keepdim=True).values
            pr = torch.exp(lg - mx)
            pr = pr / pr.sum(-1, keepdim=True)
            if kl is not None and c.full_idx[i] and t >= kl_from:
                sc = [scores[s] for s in sel]
                m0 = max(sc)
                lz = m0 + math.log(sum(math.exp(v - m0) for v in sc))
                pt = [float(pr[:, j].sum()) / c.H for j in range(len(sel))]
                kl.append((i, t, sum(pj * (math.log(pj) - (v - lz)) for pj, v in zip(pt, sc) if pj > 0)))
            ob = pr @ keys[:, :c.rkv]  # [H, rkv]
            o = torch.einsum("hdr,hr->hd", WUV, ob).reshape(-1)
            outs.append(W(a_ + "o_proj.weight") @ o)
        prev_sel = sels
        h = h + torch.stack(outs)
        new = []
        for t in range(T):
            x = rms(h[t], W(p + "post_attention_layernorm.weight"), c.eps)
            m = p + "mlp."
            if not c.moe_layers[i]:
                y = W(m + "down_proj.weight") @ (torch.nn.functional.silu(W(m + "gate_proj.weight") @ x) *
                                                 (W(m + "up_proj.weight") @ x))
            else:
                lg = W(m + "gate.weight") @ x
                s = [1.0 / (1.0 + math.exp(-float(v))) for v in lg]
                b = W(m + "gate.e_score_correction_bias")
                sb = [s[e] + float(b[e]) for e in range(c.E)]
                gsz = c.E // c.n_group
                allowed = list(range(c.E))
                if c.n_group > 1:
                    gsc = [sum(sorted(sb[g * gsz:(g + 1) * gsz], reverse=True)[:2]) for g in range(c.n_group)]
                    keep = sorted(range(c.n_group), key=lambda g: -gsc[g])[:c.topk_group]
                    allowed = [e for e in range(c.E) if e // gsz in keep]
                chosen = sorted(allowed, key=lambda e: -sb[e])[:c.topk]
                gw = [s[e] for e in chosen]
                if c.norm_topk:
                    tot = sum(gw) + 1e-20
                    gw = [v / tot for v in gw]
                gw = [v * c.rsf for v in gw]
                y = torch.zeros(c.D, dtype=DT)
                for e, gv in zip(chosen, gw):
                    ep = m + "experts.%d." % e
                    y = y + gv * (W(ep + "down_proj.weight") @ (torch.nn.functional.silu(W(ep + "gate_proj.weight") @ x)
                                                              * (W(ep + "up_proj.weight") @ x)))
                if c.n_shared > 0:
                    sp = m + "shared_experts."
                    y = y + W(sp + "down_proj.weight") @ (torch.nn.functional.silu(W(sp + "gate_proj.weight") @ x) *
                                                          (W(sp + "up_proj.weight") @ x))
            new.append(y)
        h = h + torch.stack(new)
    hn = torch.stack([rms(h[t], W("norm.weight"), c.eps) for t in range(T)])
    head = W("embed_tokens.weight") if c.tie else w["lm_head.weight"]
    return hn @ head.T


# ----------------------------------------------------------------------------
# loading, log-probs, GRPO
# ----------------------------------------------------------------------------

def load_model(model_dir, latent_eps=None):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = Cfg(json.load(f), latent_eps)
    return cfg, hr.load_weights(model_dir)


def used_tensors(cfg, weights):
    """names the forward reads (dry one-token run; every expert counts as read)."""
    net = Net(cfg, weights)
    with torch.no_grad():
        net.forward([0], 0, net.empty_state())
    return net.used


def unread_tensors(cfg, weights, used):
    return sorted(k for k in weights if k not in used and not is_mtp_name(k, cfg.L))


def group_logprobs(net, group, temperature=1.0):
    """expected.json semantics: one full-sequence forward per response (no state)."""
    with torch.no_grad():
        return [net.seq_logprobs(group["prompt"], r, temperature).tolist() for r in group["responses"]]


def forward_logits(net, ids):
    """plain forward: logits [T, V] of a token sequence at positions 0..T-1 (no state)."""
    return net.forward(list(ids), 0, net.empty_state())[0]


def selections(net, ids):
    """the discrete choices of one plain forward over ids: per full indexer layer the sorted selected key
    positions of every query, and per MoE layer the sorted chosen experts of every token."""
    rec = Recorder(0.0)
    net.rec = rec
    try:
        with torch.no_grad():
            forward_logits(net, ids)
    finally:
        net.rec = None
    topk = {str(i): [m.nonzero().flatten().tolist() for m in sel] for i, sel in zip(rec.sel_layers, rec.sels)}
    experts = {str(i): e.tolist() for i, e in rec.experts}
    return {"tokens": list(ids), "index_topk": net.cfg.k, "topk": topk, "experts": experts}


def run(model_dir, group, obj, ref_model=None, grad_mode="prefix-frozen", latent_eps=None, log=None,
        adapter=None, lora_alpha=None, indexer_kl_coef=0.0):
    """One GRPO/SFT gradient evaluation.  Returns a dict shaped like grpo_ref.run's
    (grads0, loss, grad_norm, stats0, mode, grad_mode, loss_kind, ...) so grpo_ref.write_grads works.
    adapter (PEFT safetensors) + lora_alpha: LoRA mode (mode "lora"); the trainable set and grads0 are the
    adapter tensors in file order, the base is frozen, and the beta != 0 reference without ref_model is
    the base with the adapters off (grpo_ref.run's rule).
    indexer_kl_coef C > 0 (prefix-frozen, no adapter, GRPO objectives): grads0 = grad(L_GRPO + C * L_I)
    (indexer_kl_loss); "loss" stays the GRPO loss, res["indexer_kl"] = L_I (unscaled)."""
    if grad_mode not in ("prefix-frozen", "full"):
        raise ValueError(grad_mode)
    check_indexer_kl(indexer_kl_coef, grad_mode, adapter, obj.loss)
    full_graph = grad_mode == "full"
    sft = obj.loss == "sft"
    if not group.get("responses"):
        raise ValueError("the group file needs at least one response")
    cfg, weights = load_model(model_dir, latent_eps)
    order = gr.checkpoint_order(model_dir)
    old = None
    if group.get("old_logprobs") is not None:
        old = [torch.as_tensor(o, dtype=DT) for o in group["old_logprobs"]]
        for o, r in zip(old, group["responses"]):
            if o.numel() != len(r):
                raise ValueError("old_logprobs length != response length")
    used = used_tensors(cfg, weights)
    lora = None
    if adapter is not None:
        if lora_alpha is None:
            raise ValueError("--adapter needs --lora-alpha")
        ad, spec = gr.load_adapter(adapter, lora_alpha)  # PEFT names -> {weight: (A name, B name, alpha/r)}
        params = {n: t.clone().requires_grad_(True) for n, t in ad.items()}
        lora = gr.make_lora(params, spec)
        check_lora(cfg, weights, lora, used)
        mode = "lora"
    else:
        params = {n: weights[n] for n in order if n in used}
        for t in params.values():
            t.requires_grad_(True)
        mode = "full"
    ref = None
    if obj.beta != 0.0:
        if ref_model is not None:
            rcfg, rw = load_model(ref_model, latent_eps)
            ref = gr.reference_logprobs(Net(rcfg, rw), group, obj.temperature)
        else:  # full FT: the initial weights; LoRA: the base with the adapters off
            ref = gr.reference_logprobs(Net(cfg, {n: t.detach() for n, t in weights.items()}), group,
                                        obj.temperature)
    net = Net(cfg, weights, lora)
    state = net.capture(group["prompt"], keep_graph=full_graph)
    loss, info = gr.policy_loss(net, state, group, obj, old=old, ref=ref, backward=True,
                                keep_state_graph=full_graph)
    kl = None
    if indexer_kl_coef > 0.0:
        # a second pass over the same branches: its graph reaches only the indexer tensors (inputs and teacher
        # detached), so the GRPO part of every other gradient is untouched
        N = sum(len(r) for r in group["responses"])
        kl = 0.0
        for r in group["responses"]:
            ki = indexer_kl_member(net, state, group["prompt"], r)
            (ki * (indexer_kl_coef / N)).backward()
            kl += float(ki)
        kl /= N
    del state
    grads = {n: (t.grad.detach().clone() if t.grad is not None else torch.zeros_like(t)) for n, t in params.items()}
    for t in params.values():
        t.requires_grad_(False)
        t.grad = None
    norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
    stats0 = info["stats"]
    if not sft:
        stats0["advantages"] = [float(a) for a in info["advantages"]]
    if log:
        log("loss %.10g  grad_norm %.10g%s" % (loss, norm, "" if kl is None else "  indexer_kl %.10g" % kl))
    return {"mode": mode, "grad_mode": grad_mode, "loss_kind": obj.loss, "grads0": grads, "loss": [loss],
            "grad_norm": [norm], "stats0": stats0, "logprobs0": info["logprobs"], "old": info["old"], "ref": ref,
            "order": order, "weights": weights, "cfg": cfg, "unread": unread_tensors(cfg, weights, used),
            "params": params, "lora": lora, "indexer_kl": kl, "indexer_kl_coef": indexer_kl_coef}


def objective_from_args(a):
    return gr.Objective(a.temperature, a.epsilon, a.epsilon_high, a.beta, a.loss_type, a.max_completion_length,
                        a.scale_rewards, loss=a.loss)


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--mode", choices=("prefix-frozen", "full"), default="prefix-frozen")
    ap.add_argument("--loss", choices=("grpo", "sft"), default="grpo")
    ap.add_argument("--ref-model")
    ap.add_argument("--adapter", help="PEFT LoRA adapter (safetensors); trains the adapters only")
    ap.add_argument("--lora-alpha", type=float, help="LoRA alpha (scale alpha/r per module); needed with --adapter")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--epsilon", type=float, default=0.2)
    ap.add_argument("--epsilon-high", type=float)
    ap.add_argument("--beta", type=float, default=0.0)
    ap.add_argument("--scale-rewards", choices=("group", "batch", "none"), default="group")
    ap.add_argument("--loss-type", choices=("grpo", "dapo", "dr_grpo"), default="grpo")
    ap.add_argument("--max-completion-length", type=int)
    ap.add_argument("--latent-norm-eps", type=float,
                    help="eps of q_a_layernorm/kv_a_layernorm (default rms_norm_eps; HF uses 1e-6), spec §8.2")
    ap.add_argument("--out", help="gradients (F32 safetensors, HF names, loss/grad_norm in __metadata__)")
    ap.add_argument("--logprobs-out", help="JSON {logprobs (temperature 1, full-sequence forward)[, policy_logprobs "
                                           "(at --temperature, prefix-frozen branch), temperature]}")
    ap.add_argument("--selection-out", help="JSON of the index top-k and the routed experts of one plain forward over "
                                            "prompt + the last response (see selections())")
    ap.add_argument("--indexer-kl-coef", type=float, default=0.0,
                    help="C >= 0: the gradient is that of L_GRPO + C * L_I, the indexer KL loss (indexer_kl_loss; "
                         "prefix-frozen, no --adapter); L_I goes to __metadata__ indexer_kl.  0 = off")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quiet", action="store_true")
    return ap


def main(argv=None):
    a = build_parser().parse_args(argv)
    torch.set_num_threads(a.threads)
    with open(a.group) as f:
        group = json.load(f)
    objective = a.loss == "sft" or group.get("rewards") is not None or group.get("advantages") is not None
    if a.out and not objective:
        sys.exit("mla_ref.py: --out needs \"rewards\" or \"advantages\" in the group file (or --loss sft)")
    if a.loss == "sft" and a.beta != 0.0:
        sys.exit("mla_ref.py: --loss sft takes no KL term: --beta must be 0 (got %g)" % a.beta)
    if a.adapter and a.lora_alpha is None:
        sys.exit("mla_ref.py: --adapter needs --lora-alpha")
    try:
        check_indexer_kl(a.indexer_kl_coef, a.mode, a.adapter, a.loss)
    except ValueError as e:
        sys.exit("mla_ref.py: %s" % e)
    if a.indexer_kl_coef > 0.0 and not objective:
        sys.exit("mla_ref.py: --indexer-kl-coef needs an objective: \"rewards\" or \"advantages\" in the group file")
    cfg, w = load_model(a.model, a.latent_norm_eps)
    lora = None
    try:
        if a.adapter:  # the plain log-probs / selections are those of the adapted model
            ad, spec = gr.load_adapter(a.adapter, a.lora_alpha)
            lora = gr.make_lora(ad, spec)
            check_lora(cfg, w, lora, used_tensors(cfg, w))
        net = Net(cfg, w, lora)
    except ValueError as e:
        sys.exit("mla_ref.py: %s" % e)
    lps = group_logprobs(net, group)
    unread = unread_tensors(cfg, w, net.used)
    if unread:
        print("warning: unread tensors: %s" % unread[:10], file=sys.stderr)
    out = {"logprobs": lps}
    res = None
    if objective:
        log = None if a.quiet else (lambda s: print(s, file=sys.stderr))
        res = run(a.model, group, objective_from_args(a), ref_model=a.ref_model, grad_mode=a.mode,
                  latent_eps=a.latent_norm_eps, log=log, adapter=a.adapter, lora_alpha=a.lora_alpha,
                  indexer_kl_coef=a.indexer_kl_coef)
        if a.out:
            gr.write_grads(a.out, res)
        out = {"loss": res["loss"][0], "grad_norm": res["grad_norm"][0], "stats0": res["stats0"]}
        if res["indexer_kl"] is not None:
            out["indexer_kl"] = res["indexer_kl"]
    if a.selection_out:
        with open(a.selection_out, "w") as f:
            json.dump(selections(net, list(group["prompt"]) + list(group["responses"][-1])), f,
                      separators=(",", ":"))
            f.write("\n")
    if a.logprobs_out:
        doc = {"logprobs": lps}
        if res is not None:
            doc["policy_logprobs"] = [l.tolist() for l in res["logprobs0"]]
            doc["temperature"] = a.temperature
        with open(a.logprobs_out, "w") as f:
            json.dump(doc, f)
            f.write("\n")
    if argv is None:
        json.dump(out, sys.stdout)
        sys.stdout.write("\n")
    return out, res


if __name__ == "__main__":
    main()
