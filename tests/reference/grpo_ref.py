#!/usr/bin/python3
"""Independent fp64 GRPO / SFT reference (loss, gradients, AdamW trajectory) for the
Qwen3-Next / Qwen3.5 hybrid model, in the PREFIX-FROZEN mode of DESIGN.md §3/§7 (default)
or the exact FULL mode (--mode full: nothing detached, DESIGN §3 "exact gradient mode").

Written from /work/shared/DESIGN.md and /work/shared/specs/hybrid-qwen3next.md;
it does not look at the C implementation.  Everything is torch.float64 with autograd.

Prefix-frozen semantics
  * capture: x_1..x_{P-1} run under no_grad from an empty state; kept per layer:
      full attention: K (after k_norm + RoPE) and V of positions 0..P-2;
      Gated DeltaNet: recurrent state S after P-1 tokens and the pre-conv [Q|K|V]
      channels of the last W-1 prompt positions (zeros before position 0).
  * branch of member i: [x_P, y_1..y_{R-1}] at positions P-1..P+R-2, with autograd,
    continuing from the (detached) captured state.  l_{i,t} = log_softmax(logits/tau)[y_t].

Full mode (--mode full)
  * the same capture runs WITH autograd and its graph is kept (retain_graph across members):
    K/V, S and the conv tail are functions of the parameters, so the gradient is that of the
    naive full graph over prompt + response.  Same loss value; old and reference log-probs stay
    detached constants.  Every --steps step recaptures with the current weights.

Objectives (--loss)
  * grpo (default): DESIGN §7 (clipped ratio, optional k3 KL, grpo/dapo/dr_grpo aggregation).
  * sft: L = -(1/sum_i R_i) sum_i sum_t l_{i,t} (completion-only NLL, mean per token over the
    group; TRL SFTTrainer).  No rewards / old / reference log-probs needed; --beta must be 0.

CLI
  python3 grpo_ref.py --model DIR --group GROUP.json [--ref-model DIR]
        [--adapter ADAPTER.safetensors --lora-alpha A]
        [--mode prefix-frozen|full] [--loss grpo|sft]
        [--temperature T] [--epsilon E] [--epsilon-high EH] [--beta B]
        [--scale-rewards group|batch|none] [--loss-type grpo|dapo|dr_grpo]
        [--max-completion-length N]
        [--steps N] [--lr LR] [--weight-decay WD] [--adam-beta1 B1] [--adam-beta2 B2]
        [--adam-eps EPS] [--max-grad-norm C]
        [--out GRAD.safetensors] [--out-model DIR|FILE.safetensors] [--trajectory FILE.json]
Prints a JSON summary (loss / grad_norm per step, step-0 statistics) to stdout.
"""

import argparse
import json
import math
import os
import shutil
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hybrid_ref as hr  # noqa: E402

DT = torch.float64
NO_DECAY_SUFFIXES = ("norm.weight", "A_log", "dt_bias")
PEFT_PREFIX = "base_model.model."
STD_EPS = 1e-4

silu = hr.silu
rmsnorm_1pw = hr.rmsnorm_1pw
gated_rmsnorm = hr.gated_rmsnorm
rope_partial = hr.rope_partial
swiglu = hr.swiglu


# ----------------------------------------------------------------------------
# stateful, differentiable forward
# ----------------------------------------------------------------------------

class Net:
    """Hybrid decoder that can continue from a prompt state.

    weights: {full checkpoint name: fp64 tensor} (may be autograd leaves)
    lora:    {full weight name: (A [r,in], B [out,r], scale)}  -> W_eff = W + scale * B @ A
    """

    def __init__(self, cfg, weights, lora=None):
        self.cfg = cfg
        self.w = weights
        self.lora = lora or {}
        cands = ["model.language_model.", "model."] if cfg.family == "qwen3_5" else ["model.", "model.language_model."]
        for p in cands:
            if p + "embed_tokens.weight" in weights:
                self.pre = p
                break
        else:
            raise KeyError("embed_tokens.weight not found")
        for k in self.lora:
            if k not in weights:
                raise KeyError("adapter targets %s, which is not in the checkpoint" % k)
            if weights[k].dim() != 2:
                raise ValueError("adapter on non-2D tensor %s" % k)
            if k.endswith("embed_tokens.weight"):
                raise ValueError("LoRA on embed_tokens is not supported")
        self.used = set()
        self.router_gaps = None  # list -> record top-k router margins

    def _get(self, key):
        if key not in self.w:
            raise KeyError(key)
        self.used.add(key)
        t = self.w[key]
        if key in self.lora:
            A, B, s = self.lora[key]
            t = t + s * (B @ A)
        return t

    def W(self, name):
        return self._get(self.pre + name)

    def has(self, name):
        return (self.pre + name) in self.w

    # --- state -------------------------------------------------------------
    def empty_state(self):
        c = self.cfg
        st = []
        C = 2 * c.Hk * c.dk + c.Hv * c.dv
        for lt in c.layer_types:
            if lt == "linear_attention":
                st.append({"S": torch.zeros(c.Hv, c.dk, c.dv, dtype=DT),
                           "conv": torch.zeros(c.conv_k - 1, C, dtype=DT)})
            else:
                st.append({"K": torch.zeros(0, c.n_kv, c.hd, dtype=DT),
                           "V": torch.zeros(0, c.n_kv, c.hd, dtype=DT)})
        return st

    # --- Gated DeltaNet ----------------------------------------------------
    def gdn(self, i, x, st):
        c = self.cfg
        p = "layers.%d.linear_attn." % i
        T = x.shape[0]
        Hv, dv = c.Hv, c.dv
        X, z, b, a = hr.gdn_inputs(self, i, x)  # X: pre-conv [Q|K|V]
        Wk = c.conv_k
        Xf = torch.cat([st["conv"], X], 0)  # [W-1+T, C]
        cw = self.W(p + "conv1d.weight")
        cw = cw.reshape(cw.shape[0], cw.shape[-1])
        y = 0
        for j in range(Wk):
            y = y + Xf[j:j + T] * cw[:, j]
        Y = silu(y)
        q, k, v, beta, g = hr.gdn_recurrence_inputs(self, i, Y, b, a)
        S = st["S"]
        outs = []
        for t in range(T):
            S = torch.exp(g[t])[:, None, None] * S
            pred = torch.einsum("hkv,hk->hv", S, k[t])
            u = beta[t][:, None] * (v[t] - pred)
            S = S + torch.einsum("hk,hv->hkv", k[t], u)
            outs.append(torch.einsum("hkv,hk->hv", S, q[t]))
        o = torch.stack(outs, 0)
        o = gated_rmsnorm(o, z, self.W(p + "norm.weight"), c.eps)
        out = o.reshape(T, Hv * dv) @ self.W(p + "out_proj.weight").T
        return out, {"S": S, "conv": Xf[Xf.shape[0] - (Wk - 1):]}

    # --- gated full attention ------------------------------------------------
    def attn(self, i, x, st, pos0):
        c = self.cfg
        p = "layers.%d.self_attn." % i
        T = x.shape[0]
        nh, nkv, hd = c.n_h, c.n_kv, c.hd
        q, gate, k, v = hr.attn_inputs(self, i, x)
        pos = torch.arange(pos0, pos0 + T)
        q = rope_partial(q, pos, c.rot, c.rope_theta)
        k = rope_partial(k, pos, c.rot, c.rope_theta)
        T0 = st["K"].shape[0]
        assert T0 == pos0, "state length %d != start position %d" % (T0, pos0)
        K = torch.cat([st["K"], k], 0)
        V = torch.cat([st["V"], v], 0)
        grp = nh // nkv
        Kh = torch.repeat_interleave(K, grp, dim=1)  # query head h -> kv head h // grp
        Vh = torch.repeat_interleave(V, grp, dim=1)
        s = torch.einsum("thd,shd->hts", q, Kh) * (hd ** -0.5)
        mask = torch.arange(T0 + T)[None, :] <= (T0 + torch.arange(T))[:, None]  # [T, T0+T]
        s = s.masked_fill(~mask[None], float("-inf"))
        out = torch.einsum("hts,shd->thd", torch.softmax(s, -1), Vh)
        out = out.reshape(T, nh * hd) * torch.sigmoid(gate)
        return out @ self.W(p + "o_proj.weight").T, {"K": K, "V": V}

    # --- FFN ---------------------------------------------------------------
    def dense_mlp(self, i, x):
        return hr.dense_mlp(self, i, x)

    def expert_weights(self, i, e):
        return hr.expert_weights(self, i, e)

    def moe(self, i, x):
        c = self.cfg
        p = "layers.%d.mlp." % i
        probs = torch.softmax(x @ self.W(p + "gate.weight").T, -1)
        topv, topi = torch.topk(probs, c.topk, dim=-1)
        if self.router_gaps is not None and c.topk < c.E:
            srt = torch.sort(probs.detach(), -1, descending=True).values
            self.router_gaps.append(float((srt[:, c.topk - 1] - srt[:, c.topk]).min()))
        if c.renorm:
            topv = topv / topv.sum(-1, keepdim=True)
        out = torch.zeros(x.shape, dtype=DT)
        for e in range(c.E):
            wg, wu, wd = self.expert_weights(i, e)  # marks every expert as used
            sel = topi == e
            rows = sel.any(-1).nonzero().flatten()
            if rows.numel() == 0:
                continue
            wt = (topv * sel).sum(-1)[rows]
            out = out.index_add(0, rows, wt[:, None] * swiglu(x[rows], wg, wu, wd))
        if c.shared_I > 0 or self.has(p + "shared_expert.gate_proj.weight"):
            sp = p + "shared_expert."
            sh = swiglu(x, self.W(sp + "gate_proj.weight"), self.W(sp + "up_proj.weight"), self.W(sp + "down_proj.weight"))
            out = out + torch.sigmoid(x @ self.W(p + "shared_expert_gate.weight").T) * sh
        return out

    # --- model ---------------------------------------------------------------
    def forward(self, ids, pos0, state):
        """ids: tokens at positions pos0..pos0+T-1, state: what positions 0..pos0-1 left.
        Returns logits [T, V] and the extended state (input state is not modified)."""
        c = self.cfg
        ids = torch.as_tensor(ids, dtype=torch.long)
        emb = self.W("embed_tokens.weight")
        h = emb[ids]
        new_state = []
        for i in range(c.L):
            p = "layers.%d." % i
            xn = rmsnorm_1pw(h, self.W(p + "input_layernorm.weight"), c.eps)
            if c.layer_types[i] == "linear_attention":
                o, ns = self.gdn(i, xn, state[i])
            else:
                o, ns = self.attn(i, xn, state[i], pos0)
            new_state.append(ns)
            h = h + o
            xn = rmsnorm_1pw(h, self.W(p + "post_attention_layernorm.weight"), c.eps)
            h = h + (self.moe(i, xn) if c.is_moe(i) else self.dense_mlp(i, xn))
        h = rmsnorm_1pw(h, self.W("norm.weight"), c.eps)
        if c.tie:
            head = emb
        else:
            if "lm_head.weight" not in self.w:
                raise KeyError("lm_head.weight missing and tie_word_embeddings is false")
            head = self._get("lm_head.weight")
        return h @ head.T, new_state

    def capture(self, prompt, keep_graph=False):
        """Prompt state after x_1..x_{P-1}: no tape (prefix-frozen), or, with keep_graph
        (full mode), the state tensors with their autograd graph back to the parameters."""
        st = self.empty_state()
        if keep_graph:
            if len(prompt) > 1:
                with torch.enable_grad():
                    _, st = self.forward(prompt[:-1], 0, st)
            return st
        if len(prompt) > 1:
            with torch.no_grad():
                _, st = self.forward(prompt[:-1], 0, st)
        return [{k: v.detach() for k, v in d.items()} for d in st]

    def branch_logprobs(self, state, prompt, resp, temperature=1.0):
        """l_t = log p(y_t | prompt, y_<t) for t = 1..R from the branch [x_P, y_1..y_{R-1}]."""
        P, R = len(prompt), len(resp)
        assert R >= 1
        ids = [prompt[-1]] + list(resp[:-1])
        logits, _ = self.forward(ids, P - 1, state)
        lp = torch.log_softmax(logits / temperature, -1)
        return lp[torch.arange(R), torch.as_tensor(resp, dtype=torch.long)]


# ----------------------------------------------------------------------------
# objective
# ----------------------------------------------------------------------------

def advantages(rewards, mode):
    r = torch.as_tensor(rewards, dtype=DT)
    m = r.mean()
    if mode == "none":
        return r - m
    if mode not in ("group", "batch"):
        raise ValueError(mode)
    # one group per call: batch-level statistics == group-level statistics
    std = r.std(unbiased=True) if r.numel() > 1 else torch.zeros((), dtype=DT)
    return (r - m) / (std + STD_EPS)


class Objective:
    def __init__(self, temperature=1.0, epsilon=0.2, epsilon_high=None, beta=0.0, loss_type="grpo",
                 max_completion_length=None, scale_rewards="group", loss="grpo"):
        if loss not in ("grpo", "sft"):
            raise ValueError(loss)
        self.loss = loss
        self.temperature = float(temperature)
        self.eps_low = float(epsilon)
        self.eps_high = float(epsilon if epsilon_high is None else epsilon_high)
        self.beta = float(beta)
        if loss == "sft" and self.beta != 0.0:
            raise ValueError("--loss sft takes no KL term: --beta must be 0")
        if loss_type not in ("grpo", "dapo", "dr_grpo"):
            raise ValueError(loss_type)
        self.loss_type = loss_type
        self.max_completion_length = max_completion_length
        self.scale_rewards = scale_rewards

    def member_weights(self, lengths):
        """c_i such that L = sum_i c_i * sum_t term_{i,t}."""
        G = len(lengths)
        if self.loss == "sft":
            return [1.0 / sum(lengths)] * G
        if self.loss_type == "grpo":
            return [1.0 / (G * R) for R in lengths]
        if self.loss_type == "dapo":
            return [1.0 / sum(lengths)] * G
        mcl = self.max_completion_length if self.max_completion_length is not None else max(lengths)
        return [1.0 / (G * mcl)] * G

    def terms(self, l, o, f, A):
        """per-token loss terms of one member: l current (graph), o old, f reference (or None), A scalar.
        sft: -l (o, f, A unused)."""
        if self.loss == "sft":
            return -l
        rho = torch.exp(l - o)
        t = -torch.minimum(rho * A, torch.clamp(rho, 1.0 - self.eps_low, 1.0 + self.eps_high) * A)
        if self.beta != 0.0:
            d = f - l
            t = t + self.beta * (torch.exp(d) - d - 1.0)
        return t


def group_advantages(group, obj):
    if group.get("advantages") is not None:
        if len(group["advantages"]) != len(group["responses"]):
            raise ValueError("advantages length != number of responses")
        return torch.as_tensor(group["advantages"], dtype=DT)
    if group.get("rewards") is None:
        raise ValueError("the group file needs \"rewards\" (or \"advantages\")")
    return advantages(group["rewards"], obj.scale_rewards)


def token_stats(obj, A, ls, olds, refs):
    """clip region counts (per sign of A), TRL-style clip fractions, mean k3 KL."""
    n = {"tokens": 0, "low_Apos": 0, "low_Aneg": 0, "high_Apos": 0, "high_Aneg": 0}
    kl_sum = 0.0
    for i, (l, o) in enumerate(zip(ls, olds)):
        rho = torch.exp(l.detach() - o)
        lo = rho < 1.0 - obj.eps_low
        hi = rho > 1.0 + obj.eps_high
        pos = float(A[i]) > 0
        neg = float(A[i]) < 0
        n["tokens"] += l.numel()
        n["low_Apos"] += int(lo.sum()) if pos else 0
        n["low_Aneg"] += int(lo.sum()) if neg else 0
        n["high_Apos"] += int(hi.sum()) if pos else 0
        n["high_Aneg"] += int(hi.sum()) if neg else 0
        if refs is not None:
            d = refs[i] - l.detach()
            kl_sum += float((torch.exp(d) - d - 1.0).sum())
    n["clip_frac_low"] = n["low_Aneg"] / n["tokens"]    # clipped with zero gradient (TRL's is_low_clipped)
    n["clip_frac_high"] = n["high_Apos"] / n["tokens"]  # (TRL's is_high_clipped)
    n["kl_mean"] = kl_sum / n["tokens"] if refs is not None else 0.0
    return n


def log_margin(obj, ls, olds):
    """smallest |log rho - log(1-eps_low)|, |log rho - log(1+eps_high)| over tokens."""
    m = float("inf")
    for l, o in zip(ls, olds):
        lr = l.detach() - o
        m = min(m, float((lr - math.log(1.0 - obj.eps_low)).abs().min()),
                float((lr - math.log(1.0 + obj.eps_high)).abs().min()))
    return m


def sft_stats(ls):
    n = sum(l.numel() for l in ls)
    return {"tokens": n, "nll_mean": -sum(float(l.sum()) for l in ls) / n}


def policy_loss(net, state, group, obj, old=None, ref=None, backward=True, keep_state_graph=False):
    """GRPO (or SFT) loss of one group on a captured state.
    old: list of tensors (None -> current log-probs, detached); ref: list of tensors or None.
    Backpropagates member by member when backward=True.  keep_state_graph: the state carries an
    autograd graph (full mode), kept alive across the members' backwards (retain_graph).
    Returns (loss float, dict)."""
    prompt, resps = group["prompt"], group["responses"]
    sft = obj.loss == "sft"
    A = None if sft else group_advantages(group, obj)
    lengths = [len(r) for r in resps]
    cw = obj.member_weights(lengths)
    if obj.beta != 0.0 and ref is None:
        raise ValueError("beta != 0 needs reference log-probs")
    total = 0.0
    ls, olds = [], []
    for i, resp in enumerate(resps):
        l = net.branch_logprobs(state, prompt, resp, obj.temperature)
        o = l.detach() if (old is None or sft) else old[i]
        f = ref[i] if ref is not None else None
        li = cw[i] * obj.terms(l, o, f, None if sft else A[i]).sum()
        if backward:
            li.backward(retain_graph=keep_state_graph and i < len(resps) - 1)
        total += float(li)
        ls.append(l.detach())
        olds.append(o)
    stats = sft_stats(ls) if sft else token_stats(obj, A, ls, olds, ref)
    return total, {"logprobs": ls, "old": olds, "advantages": A, "stats": stats}


def loss_fn(net, state, group, obj, old=None, ref=None):
    """Same loss as a differentiable tensor (one graph; used by the checks).  For full mode pass
    a state captured with keep_graph=True by the same net (see full_loss_fn)."""
    prompt, resps = group["prompt"], group["responses"]
    sft = obj.loss == "sft"
    A = None if sft else group_advantages(group, obj)
    cw = obj.member_weights([len(r) for r in resps])
    L = 0.0
    for i, resp in enumerate(resps):
        l = net.branch_logprobs(state, prompt, resp, obj.temperature)
        o = l.detach() if (old is None or sft) else old[i]
        L = L + cw[i] * obj.terms(l, o, ref[i] if ref is not None else None, None if sft else A[i]).sum()
    return L


def full_loss_fn(net, group, obj, old=None, ref=None):
    """Full-mode loss as a differentiable tensor: capture (with graph) + branches."""
    return loss_fn(net, net.capture(group["prompt"], keep_graph=True), group, obj, old, ref)


def reference_logprobs(net, group, temperature):
    with torch.no_grad():
        st = net.capture(group["prompt"])
        return [net.branch_logprobs(st, group["prompt"], r, temperature).detach() for r in group["responses"]]


# ----------------------------------------------------------------------------
# weights, adapters, optimizer
# ----------------------------------------------------------------------------

def load_model(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = hr.Cfg(json.load(f))
    return cfg, hr.load_weights(model_dir)


def checkpoint_order(model_dir):
    """tensor names in checkpoint order (file order; shards in index order)."""
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(single):
        return list(hr.read_safetensors(single)[0].keys())
    with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
        wm = json.load(f)["weight_map"]
    names = []
    for shard in sorted(set(wm.values())):
        names += [k for k in hr.read_safetensors(os.path.join(model_dir, shard))[0] if wm.get(k) == shard]
    return names


def used_tensors(cfg, weights):
    """names the forward reads (dry one-token run); every expert counts as used."""
    net = Net(cfg, weights)
    with torch.no_grad():
        net.forward([0], 0, net.empty_state())
    return net.used


def load_adapter(path, alpha):
    """PEFT adapter -> ordered {adapter name: tensor}, {weight name: (A name, B name, scale)}."""
    ts, _ = hr.read_safetensors(path)
    mods = {}
    for name in ts:
        if not name.startswith(PEFT_PREFIX):
            raise ValueError("adapter tensor %s lacks prefix %s" % (name, PEFT_PREFIX))
        for kind in ("lora_A", "lora_B"):
            suf = "." + kind + ".weight"
            if name.endswith(suf):
                mods.setdefault(name[len(PEFT_PREFIX):-len(suf)], {})[kind] = name
                break
        else:
            raise ValueError("unexpected adapter tensor %s" % name)
    spec = {}
    for mod, d in mods.items():
        if set(d) != {"lora_A", "lora_B"}:
            raise ValueError("module %s lacks lora_A or lora_B" % mod)
        A, B = ts[d["lora_A"]], ts[d["lora_B"]]
        r = A.shape[0]
        if B.shape[1] != r:
            raise ValueError("rank mismatch for %s" % mod)
        spec[mod + ".weight"] = (d["lora_A"], d["lora_B"], float(alpha) / r)
    return ts, spec


def make_lora(params, spec):
    return {w: (params[a], params[b], s) for w, (a, b, s) in spec.items()}


class AdamW:
    """torch.optim.AdamW arithmetic (amsgrad off), fp64, per-name decay mask."""

    def __init__(self, params, lr, weight_decay, beta1, beta2, eps, decay_names):
        self.p = params
        self.lr, self.wd, self.b1, self.b2, self.eps = lr, weight_decay, beta1, beta2, eps
        self.decay = decay_names
        self.t = 0
        self.m = {n: torch.zeros_like(t) for n, t in params.items()}
        self.v = {n: torch.zeros_like(t) for n, t in params.items()}

    @torch.no_grad()
    def step(self, grads):
        self.t += 1
        bc1 = 1.0 - self.b1 ** self.t
        bc2 = 1.0 - self.b2 ** self.t
        for n, p in self.p.items():
            g = grads[n]
            if self.wd != 0.0 and n in self.decay:
                p.mul_(1.0 - self.lr * self.wd)
            self.m[n].mul_(self.b1).add_(g, alpha=1.0 - self.b1)
            self.v[n].mul_(self.b2).addcmul_(g, g, value=1.0 - self.b2)
            denom = (self.v[n].sqrt() / math.sqrt(bc2)).add_(self.eps)
            p.addcdiv_(self.m[n], denom, value=-self.lr / bc1)


def decays(name):
    return not name.endswith(NO_DECAY_SUFFIXES)


def clip_coef(norm, max_norm):
    """torch.nn.utils.clip_grad_norm_: coef = max/(norm+1e-6), applied if < 1; 0 disables."""
    if not max_norm:
        return 1.0
    c = max_norm / (norm + 1e-6)
    return c if c < 1.0 else 1.0


# ----------------------------------------------------------------------------
# the run
# ----------------------------------------------------------------------------

def run(model_dir, group, obj, ref_model=None, adapter=None, lora_alpha=None, steps=1, lr=1e-6,
        weight_decay=0.0, beta1=0.9, beta2=0.999, adam_eps=1e-8, max_grad_norm=1.0, log=None,
        grad_mode="prefix-frozen"):
    """Returns dict with step0 grads {name: tensor}, losses, grad_norms, final params, stats.
    grad_mode: "prefix-frozen" (captured state detached) or "full" (exact gradient)."""
    if grad_mode not in ("prefix-frozen", "full"):
        raise ValueError(grad_mode)
    full_graph = grad_mode == "full"
    sft = obj.loss == "sft"
    if sft and obj.beta != 0.0:
        raise ValueError("--loss sft takes no KL term: --beta must be 0")
    if not group.get("responses"):
        raise ValueError("the group file needs at least one response")
    cfg, weights = load_model(model_dir)
    order = checkpoint_order(model_dir)
    old = None
    if group.get("old_logprobs") is not None:
        old = [torch.as_tensor(o, dtype=DT) for o in group["old_logprobs"]]
        for o, r in zip(old, group["responses"]):
            if o.numel() != len(r):
                raise ValueError("old_logprobs length != response length")
    if steps > 1 and old is None and not sft:
        raise ValueError("--steps > 1 needs old_logprobs in the group file")
    G = len(group["responses"])
    if group.get("rewards") is not None and len(group["rewards"]) != G:
        raise ValueError("rewards length != G")

    if adapter is not None:
        if lora_alpha is None:
            raise ValueError("--adapter needs --lora-alpha")
        ad, spec = load_adapter(adapter, lora_alpha)
        params = {n: t.clone().requires_grad_(True) for n, t in ad.items()}
        mode = "lora"
    else:
        used = used_tensors(cfg, weights)
        params = {n: weights[n] for n in order if n in used}
        for t in params.values():
            t.requires_grad_(True)
        spec = None
        mode = "full"

    # reference log-probs (fixed for the whole run)
    ref = None
    if obj.beta != 0.0:
        if ref_model is not None:
            rcfg, rw = load_model(ref_model)
            ref = reference_logprobs(Net(rcfg, rw), group, obj.temperature)
        else:  # LoRA: base with adapters off; full FT: the initial weights
            ref = reference_logprobs(Net(cfg, {n: t.detach() for n, t in weights.items()}), group, obj.temperature)

    opt = AdamW(params, lr, weight_decay, beta1, beta2, adam_eps, {n for n in params if decays(n)})
    losses, norms, stats, margins, lps, stats0, grads0, lp0 = [], [], [], [], [], None, None, None
    for step in range(steps):
        for t in params.values():
            t.grad = None
        net = Net(cfg, weights, make_lora(params, spec) if spec else None)
        state = net.capture(group["prompt"], keep_graph=full_graph)  # recaptured with the current weights
        loss, info = policy_loss(net, state, group, obj, old=old, ref=ref, backward=True,
                                 keep_state_graph=full_graph)
        del state
        grads = {n: (t.grad.detach().clone() if t.grad is not None else torch.zeros_like(t)) for n, t in params.items()}
        norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
        losses.append(loss)
        norms.append(norm)
        stats.append(info["stats"])
        lps.append(info["logprobs"])
        margins.append(log_margin(obj, info["logprobs"], info["old"]) if (old is not None and not sft) else None)
        if step == 0:
            grads0, stats0, lp0 = grads, info["stats"], info["logprobs"]
            if not sft:
                stats0["advantages"] = [float(a) for a in info["advantages"]]
        if log:
            log("step %d  loss %.10g  grad_norm %.10g" % (step, loss, norm))
        coef = clip_coef(norm, max_grad_norm)
        if coef < 1.0:
            grads = {n: g * coef for n, g in grads.items()}
        opt.step(grads)
    for t in params.values():
        t.requires_grad_(False)
        t.grad = None
    return {"mode": mode, "grad_mode": grad_mode, "loss_kind": obj.loss, "grads0": grads0, "loss": losses, "grad_norm": norms, "stats0": stats0,
            "params": params, "weights": weights, "order": order, "logprobs0": lp0, "ref": ref,
            "stats": stats, "clip_margin": margins, "logprobs": lps}


def write_grads(path, res):
    if res.get("loss_kind", "grpo") == "sft":  # no clipping / KL statistics in SFT
        meta = {"loss": repr(res["loss"][0]), "grad_norm": repr(res["grad_norm"][0]), "mode": res["mode"]}
    else:
        meta = {"loss": repr(res["loss"][0]), "grad_norm": repr(res["grad_norm"][0]),
                "clip_frac_low": repr(res["stats0"]["clip_frac_low"]),
                "clip_frac_high": repr(res["stats0"]["clip_frac_high"]),
                "kl_mean": repr(res["stats0"]["kl_mean"]), "mode": res["mode"]}
    # the two keys below only appear away from the defaults, so older fixture files stay byte-identical
    if res.get("grad_mode", "prefix-frozen") != "prefix-frozen" or res.get("loss_kind", "grpo") != "grpo":
        meta["grad_mode"] = res["grad_mode"]
        meta["objective"] = res["loss_kind"]
    if res.get("indexer_kl") is not None:  # mla_ref.py --indexer-kl-coef > 0 only (the unscaled L_I)
        meta["indexer_kl"] = repr(res["indexer_kl"])
    hr.write_safetensors(path, {n: (g, "F32") for n, g in res["grads0"].items()}, meta)


def write_model(dest, res, model_dir):
    if res["mode"] == "lora":
        tensors = {n: (t, "F32") for n, t in res["params"].items()}
        path = dest if dest.endswith(".safetensors") else os.path.join(dest, "adapter.safetensors")
    else:
        w = res["weights"]
        tensors = {n: (w[n], "F32") for n in res["order"]}
        path = dest if dest.endswith(".safetensors") else os.path.join(dest, "model.safetensors")
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    hr.write_safetensors(path, tensors, {"format": "pt"})
    if res["mode"] == "full" and not dest.endswith(".safetensors"):
        shutil.copyfile(os.path.join(model_dir, "config.json"), os.path.join(dest, "config.json"))
    return path


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--mode", choices=("prefix-frozen", "full"), default="prefix-frozen",
                    help="prefix-frozen: the captured prompt state is detached; full: exact gradient")
    ap.add_argument("--loss", choices=("grpo", "sft"), default="grpo",
                    help="grpo (DESIGN §7) or sft (mean per-token NLL of the responses; --beta must be 0)")
    ap.add_argument("--ref-model")
    ap.add_argument("--adapter")
    ap.add_argument("--lora-alpha", type=float)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--epsilon", type=float, default=0.2)
    ap.add_argument("--epsilon-high", type=float)
    ap.add_argument("--beta", type=float, default=0.0)
    ap.add_argument("--scale-rewards", choices=("group", "batch", "none"), default="group")
    ap.add_argument("--loss-type", choices=("grpo", "dapo", "dr_grpo"), default="grpo")
    ap.add_argument("--max-completion-length", type=int)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--adam-beta1", type=float, default=0.9)
    ap.add_argument("--adam-beta2", type=float, default=0.999)
    ap.add_argument("--adam-eps", type=float, default=1e-8)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--out", help="step-0 gradients (F32 safetensors)")
    ap.add_argument("--out-model", help="final weights: a dir (model.safetensors+config.json / adapter.safetensors) "
                                        "or a path ending in .safetensors")
    ap.add_argument("--trajectory", help="JSON {loss: [...], grad_norm: [...]}")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quiet", action="store_true")
    return ap


def main(argv=None):
    a = build_parser().parse_args(argv)
    torch.set_num_threads(a.threads)
    with open(a.group) as f:
        group = json.load(f)
    if a.loss == "sft" and a.beta != 0.0:
        sys.exit("grpo_ref.py: --loss sft takes no KL term: --beta must be 0 (got %g)" % a.beta)
    obj = Objective(a.temperature, a.epsilon, a.epsilon_high, a.beta, a.loss_type, a.max_completion_length,
                    a.scale_rewards, loss=a.loss)
    log = None if a.quiet else (lambda s: print(s, file=sys.stderr))
    res = run(a.model, group, obj, ref_model=a.ref_model, adapter=a.adapter, lora_alpha=a.lora_alpha,
              steps=a.steps, lr=a.lr, weight_decay=a.weight_decay, beta1=a.adam_beta1, beta2=a.adam_beta2,
              adam_eps=a.adam_eps, max_grad_norm=a.max_grad_norm, log=log, grad_mode=a.mode)
    if a.out:
        write_grads(a.out, res)
    if a.out_model:
        write_model(a.out_model, res, a.model)
    if a.trajectory:
        with open(a.trajectory, "w") as f:
            json.dump({"loss": res["loss"], "grad_norm": res["grad_norm"]}, f, indent=1)
            f.write("\n")
    summary = {"loss": res["loss"], "grad_norm": res["grad_norm"], "stats0": res["stats0"]}
    if __name__ == "__main__" or argv is None:
        json.dump(summary, sys.stdout)
        sys.stdout.write("\n")
    return res


if __name__ == "__main__":
    main()
