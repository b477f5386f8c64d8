#!/usr/bin/env python3
"""Self-checks of hybrid_ref.py (run after make_fixtures.py):

 (a) gated_delta_rule vs the direct matrix formula
         S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T,  o_t = S_t^T q_t
     and vs the chunked WY/UT form of spec §3 (chunk 16, with a non-zero initial state);
 (a') whole-layer checks against deliberately slow scalar/loop versions written from the
     spec: Gated DeltaNet layer (row formulas of §2.1 for the fused layout, per-channel conv),
     gated attention (pairwise RoPE form), MoE block (python sort for top-k);
 (c) causality: per-position logprobs of one full forward == last-position logprobs of
     forwards over the prefixes;
 (d) the recurrent state matters in the fixtures (resetting it changes logprobs a lot);
 (e) stored expected.json reproduces (hybrid fixtures; the mla_* ones are checked by make_mla_fixtures.py);
 (f) the MLA indexer KL cases (mla_ref.py --indexer-kl-coef, cases.json "kl_cases"): the committed gradient
     files reproduce, their non-indexer tensors are the C = 0 (GRPO-only) files' bit for bit, C = 0 writes
     the GRPO-only tensors, and central differences of C*L_I on the 5 indexer tensors of two layers.

    python3 self_checks.py      # exit 0 on success
"""

import json
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hybrid_ref as hr  # noqa: E402

DT = torch.float64
FIX = os.path.join(HERE, "fixtures")
ok = True


def report(name, err, tol):
    global ok
    good = err < tol
    ok &= good
    print("%-62s max err %.3e  (tol %.0e) %s" % (name, err, tol, "ok" if good else "FAIL"))


# ---------------------------------------------------------------------------- (a)
def direct_rule(q, k, v, beta, g, S0):
    T, H, dk = k.shape
    dv = v.shape[-1]
    o = torch.zeros(T, H, dv, dtype=DT)
    S = S0.clone()
    for h in range(H):
        Sh = S[h]
        for t in range(T):
            kk = k[t, h][:, None]
            Sh = math.exp(g[t, h]) * (torch.eye(dk, dtype=DT) - beta[t, h] * kk @ kk.T) @ Sh \
                + beta[t, h] * kk @ v[t, h][None, :]
            o[t, h] = Sh.T @ q[t, h]
        S[h] = Sh
    return o, S


def chunked_rule(q, k, v, beta, g, S0, C=16):
    """WY/UT chunk algorithm of spec §3 (single pass, exact arithmetic form)."""
    T, H, dk = k.shape
    dv = v.shape[-1]
    o = torch.zeros(T, H, dv, dtype=DT)
    S_all = S0.clone()
    for h in range(H):
        S = S_all[h]
        for s in range(0, T, C):
            e = min(s + C, T)
            n = e - s
            K, Q, Vv, B = k[s:e, h], q[s:e, h], v[s:e, h], beta[s:e, h]
            gam = torch.cumsum(g[s:e, h], 0)
            A = torch.zeros(n, n, dtype=DT)
            for r_ in range(n):
                for i in range(r_):
                    A[r_, i] = B[r_] * (K[r_] @ K[i]) * math.exp(gam[r_] - gam[i])
            Tm = torch.linalg.inv(torch.eye(n, dtype=DT) + A)
            Wm = Tm @ (torch.diag(B * torch.exp(gam)) @ K)
            U = Tm @ (torch.diag(B) @ Vv)
            Vp = U - Wm @ S
            M = torch.ones(n, n, dtype=DT).tril()
            dec = torch.exp(gam[:, None] - gam[None, :]) * M
            o[s:e, h] = torch.diag(torch.exp(gam)) @ Q @ S + ((Q @ K.T) * dec) @ Vp
            S = math.exp(gam[-1]) * S + (K * torch.exp(gam[-1] - gam)[:, None]).T @ Vp
        S_all[h] = S
    return o, S_all


def check_rule():
    g_ = torch.Generator().manual_seed(5)
    T, H, dk, dv = 45, 3, 6, 5
    q = hr.l2norm(torch.randn(T, H, dk, generator=g_, dtype=DT)) * dk ** -0.5
    k = hr.l2norm(torch.randn(T, H, dk, generator=g_, dtype=DT))
    v = torch.randn(T, H, dv, generator=g_, dtype=DT)
    beta = torch.sigmoid(torch.randn(T, H, generator=g_, dtype=DT))
    g = -torch.rand(T, H, generator=g_, dtype=DT)
    S0 = torch.randn(H, dk, dv, generator=g_, dtype=DT)
    o1, s1 = hr.gated_delta_rule(q, k, v, beta, g, S0)
    o2, s2 = direct_rule(q, k, v, beta, g, S0)
    o3, s3 = chunked_rule(q, k, v, beta, g, S0)
    report("(a) recurrence vs direct S=a(I-bkk^T)S+bkv^T (o, S)",
           max((o1 - o2).abs().max().item(), (s1 - s2).abs().max().item()), 1e-12)
    report("(a) recurrence vs chunked WY/UT form (C=16)",
           max((o1 - o3).abs().max().item(), (s1 - s3).abs().max().item()), 1e-10)


# ---------------------------------------------------------------------------- (a') slow layers
def slow_gdn(m, i, x):
    c = m.cfg
    p = "layers.%d.linear_attn." % i
    T = x.shape[0]
    Hk, Hv, dk, dv = c.Hk, c.Hv, c.dk, c.dv
    r = Hv // Hk
    fused = m.has(p + "in_proj_qkvz.weight")
    G = 2 * dk + 2 * r * dv
    kd = Hk * dk

    # row index (matrix, row) of each logical projected quantity, from the spec's formulas
    def row(kind, head, d):
        if fused:
            if kind == "q":
                return "in_proj_qkvz.weight", head * G + d
            if kind == "k":
                return "in_proj_qkvz.weight", head * G + dk + d
            gk, j = divmod(head, r)
            if kind == "v":
                return "in_proj_qkvz.weight", gk * G + 2 * dk + j * dv + d
            if kind == "z":
                return "in_proj_qkvz.weight", gk * G + 2 * dk + r * dv + j * dv + d
            if kind == "b":
                return "in_proj_ba.weight", gk * 2 * r + j
            if kind == "a":
                return "in_proj_ba.weight", gk * 2 * r + r + j
        else:
            if kind == "q":
                return "in_proj_qkv.weight", head * dk + d
            if kind == "k":
                return "in_proj_qkv.weight", kd + head * dk + d
            if kind == "v":
                return "in_proj_qkv.weight", 2 * kd + head * dv + d
            if kind == "z":
                return "in_proj_z.weight", head * dv + d
            if kind == "b":
                return "in_proj_b.weight", head
            if kind == "a":
                return "in_proj_a.weight", head

    def proj(kind, head, d, t):
        name, rr = row(kind, head, d)
        return float(m.W(p + name)[rr] @ x[t])

    # conv channels in [Q | K | V] order
    chans = [("q", h, d) for h in range(Hk) for d in range(dk)] + \
            [("k", h, d) for h in range(Hk) for d in range(dk)] + \
            [("v", h, d) for h in range(Hv) for d in range(dv)]
    cw = m.W(p + "conv1d.weight")
    Wk = cw.shape[-1]
    post = {}
    for ci, (kind, h, d) in enumerate(chans):
        raw = [proj(kind, h, d, t) for t in range(T)]
        for t in range(T):
            s = 0.0
            for j in range(Wk):
                tt = t - (Wk - 1) + j
                if tt >= 0:
                    s += float(cw[ci, 0, j]) * raw[tt]
            post[(kind, h, d, t)] = s / (1.0 + math.exp(-s))
    A_log, dt_bias, nw = m.W(p + "A_log"), m.W(p + "dt_bias"), m.W(p + "norm.weight")
    out_heads = torch.zeros(T, Hv, dv, dtype=DT)
    for h in range(Hv):
        kh = h // r
        S = torch.zeros(dk, dv, dtype=DT)
        for t in range(T):
            qv = torch.tensor([post[("q", kh, d, t)] for d in range(dk)], dtype=DT)
            kv = torch.tensor([post[("k", kh, d, t)] for d in range(dk)], dtype=DT)
            vv = torch.tensor([post[("v", h, d, t)] for d in range(dv)], dtype=DT)
            qv = qv / math.sqrt(float(qv @ qv) + 1e-6) / math.sqrt(dk)
            kv = kv / math.sqrt(float(kv @ kv) + 1e-6)
            b = 1.0 / (1.0 + math.exp(-proj("b", h, 0, t)))
            av = proj("a", h, 0, t) + float(dt_bias[h])
            sp = av if av > 20 else math.log1p(math.exp(av))
            alpha = math.exp(-math.exp(float(A_log[h])) * sp)
            S = alpha * (torch.eye(dk, dtype=DT) - b * torch.outer(kv, kv)) @ S + b * torch.outer(kv, vv)
            o = S.T @ qv
            z = torch.tensor([proj("z", h, d, t) for d in range(dv)], dtype=DT)
            o = o / math.sqrt(float((o * o).mean()) + c.eps) * nw * z / (1 + torch.exp(-z))
            out_heads[t, h] = o
    return out_heads.reshape(T, -1) @ m.W(p + "out_proj.weight").T


def slow_attn(m, i, x):
    c = m.cfg
    p = "layers.%d.self_attn." % i
    T = x.shape[0]
    nh, nkv, hd, rot = c.n_h, c.n_kv, c.hd, c.rot
    Wq, Wk, Wv, Wo = (m.W(p + n + "_proj.weight") for n in "qkvo")
    half = rot // 2

    def norm1pw(vec, w):
        return vec / math.sqrt(float((vec * vec).mean()) + c.eps) * (1 + w)

    def rope(vec, pos):
        vec = vec.clone()
        for j in range(half):
            ang = pos * c.rope_theta ** (-2.0 * j / rot)
            x1, x2 = float(vec[j]), float(vec[j + half])
            vec[j] = x1 * math.cos(ang) - x2 * math.sin(ang)
            vec[j + half] = x2 * math.cos(ang) + x1 * math.sin(ang)
        return vec

    ks = [[rope(norm1pw(Wk[kv * hd:(kv + 1) * hd] @ x[t], m.W(p + "k_norm.weight")), t) for kv in range(nkv)]
          for t in range(T)]
    vs = [[Wv[kv * hd:(kv + 1) * hd] @ x[t] for kv in range(nkv)] for t in range(T)]
    att = torch.zeros(T, nh * hd, dtype=DT)
    for t in range(T):
        for h in range(nh):
            base = h * 2 * hd
            qh = rope(norm1pw(Wq[base:base + hd] @ x[t], m.W(p + "q_norm.weight")), t)
            gate = Wq[base + hd:base + 2 * hd] @ x[t]
            kv = h // (nh // nkv)
            sc = [float(qh @ ks[s][kv]) / math.sqrt(hd) for s in range(t + 1)]
            mx = max(sc)
            ex = [math.exp(s_ - mx) for s_ in sc]
            tot = sum(ex)
            o = sum((ex[s] / tot) * vs[s][kv] for s in range(t + 1))
            att[t, h * hd:(h + 1) * hd] = o / (1 + torch.exp(-gate))
    return att @ Wo.T


def slow_moe(m, i, x):
    c = m.cfg
    p = "layers.%d.mlp." % i
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        logits = [float(v) for v in m.W(p + "gate.weight") @ x[t]]
        mx = max(logits)
        ex = [math.exp(l - mx) for l in logits]
        probs = [e / sum(ex) for e in ex]
        order = sorted(range(c.E), key=lambda e: -probs[e])[:c.topk]
        wts = [probs[e] for e in order]
        if c.renorm:
            wts = [w_ / sum(wts) for w_ in wts]
        for e, w_ in zip(order, wts):
            wg, wu, wd = m.expert_weights(i, e)
            hdn = [float(wg[j] @ x[t]) for j in range(wg.shape[0])]
            hdn = torch.tensor([a / (1 + math.exp(-a)) * float(wu[j] @ x[t]) for j, a in enumerate(hdn)], dtype=DT)
            out[t] += w_ * (wd @ hdn)
        if c.shared_I > 0:
            sp = p + "shared_expert."
            a = m.W(sp + "gate_proj.weight") @ x[t]
            hdn = a / (1 + torch.exp(-a)) * (m.W(sp + "up_proj.weight") @ x[t])
            sg = 1 / (1 + math.exp(-float(m.W(p + "shared_expert_gate.weight")[0] @ x[t])))
            out[t] += sg * (m.W(sp + "down_proj.weight") @ hdn)
    return out


def check_layers():
    gen = torch.Generator().manual_seed(11)
    for name in ("next_dense", "next_moe", "q35_dense", "q35_moe"):
        m = hr.HybridModel(os.path.join(FIX, name))
        x = torch.randn(20, m.cfg.D, generator=gen, dtype=DT)
        i_lin = m.cfg.layer_types.index("linear_attention")
        i_att = m.cfg.layer_types.index("full_attention")
        report("(a') %s GDN layer %d vs slow scalar version" % (name, i_lin),
               (m.gdn(i_lin, x) - slow_gdn(m, i_lin, x)).abs().max().item(), 1e-11)
        report("(a') %s attention layer %d vs slow version" % (name, i_att),
               (m.attn(i_att, x) - slow_attn(m, i_att, x)).abs().max().item(), 1e-11)
        moe_layers = [i for i in range(m.cfg.L) if m.cfg.is_moe(i)]
        if moe_layers:
            i = moe_layers[0]
            report("(a') %s MoE layer %d vs slow version" % (name, i),
                   (m.moe(i, x) - slow_moe(m, i, x)).abs().max().item(), 1e-11)


# ---------------------------------------------------------------------------- (c) causality
def check_causality():
    for name in ("next_moe", "q35_dense"):
        m = hr.HybridModel(os.path.join(FIX, name))
        with open(os.path.join(FIX, name, "group.json")) as f:
            grp = json.load(f)
        P = grp["prompt"]
        err = 0.0
        for resp, js in ((grp["responses"][1], range(5)), (grp["responses"][2], (0, 1, 2, 17, 40, 66))):
            full = m.response_logprobs(P, resp)
            for j in js:
                lp = torch.log_softmax(m.forward(P + resp[:j])[-1], -1)[resp[j]].item()
                err = max(err, abs(lp - full[j]))
        report("(c) %s full forward vs prefix forwards" % name, err, 1e-11)


# ---------------------------------------------------------------------------- (d) state matters
def check_state_matters():
    global ok
    orig = hr.gated_delta_rule

    def no_memory(q, k, v, beta, g, S0=None):  # forget the state before each token
        T, H, _ = k.shape
        o = torch.zeros(T, H, v.shape[-1], dtype=DT)
        for t in range(T):
            o[t] = orig(q[t:t + 1], k[t:t + 1], v[t:t + 1], beta[t:t + 1], g[t:t + 1])[0][0]
        return o, None

    for name in ("next_dense", "q35_dense"):
        m = hr.HybridModel(os.path.join(FIX, name))
        with open(os.path.join(FIX, name, "group.json")) as f:
            grp = json.load(f)
        ref = torch.tensor(m.response_logprobs(grp["prompt"], grp["responses"][2]))
        hr.gated_delta_rule = no_memory
        try:
            alt = torch.tensor(m.response_logprobs(grp["prompt"], grp["responses"][2]))
        finally:
            hr.gated_delta_rule = orig
        d = (ref - alt).abs().mean().item()
        good = d > 0.05
        ok &= good
        print("(d) %-10s mean |dlogprob| when GDN state is reset every token: %.3f %s" % (name, d, "ok" if good else "FAIL"))


# ---------------------------------------------------------------------------- (e)
def check_expected():
    for name in sorted(os.listdir(FIX)):
        d = os.path.join(FIX, name)
        if not os.path.exists(os.path.join(d, "expected.json")):
            continue  # grpo/ and next_dense_ref/ (GRPO fixtures) have no expected.json
        if name.startswith("mla_"):
            continue  # MLA family (mla_ref.py): checked by make_mla_fixtures.py and (f)
        m = hr.HybridModel(d)
        with open(os.path.join(d, "group.json")) as f:
            grp = json.load(f)
        with open(os.path.join(d, "expected.json")) as f:
            exp = json.load(f)["logprobs"]
        got = hr.group_logprobs(m, grp)
        err = max(abs(a - b) for ra, rb in zip(got, exp) for a, b in zip(ra, rb))
        assert [len(r) for r in got] == [len(r) for r in exp]
        report("(e) %s expected.json reproduces" % name, err, 1e-12)


# ---------------------------------------------------------------------------- (f) MLA indexer KL
def check_indexer_kl():
    """per kl_cases entry: mla_ref.main(args) reproduces the committed file (tensors bit for bit as F32; loss,
    grad_norm, indexer_kl to 1e-12 relative: the last fp64 bits of the metadata vary across CPUs); the
    non-indexer tensors equal the base (C = 0) case's file bit for bit and its indexer tensors are 0; the same
    args with --indexer-kl-coef 0 give the base tensors; central differences (h = 1e-5, prompt state held)
    of C*L_I at the largest-|g| entry of the 5 indexer tensors of the first and last full indexer layer."""
    import tempfile
    import mla_ref as mr
    with open(os.path.join(FIX, "mla_grpo", "cases.json")) as f:
        doc = json.load(f)
    base = {c["name"]: c for c in doc["cases"]}
    cwd = os.getcwd()
    os.chdir(FIX)
    try:
        with torch.enable_grad(), tempfile.TemporaryDirectory() as tmp:
            for e in doc["kl_cases"]:
                b = base[e["base_case"]]
                tc, mc = hr.read_safetensors(e["grad"])
                tb, _ = hr.read_safetensors(b["grad"])
                _, res = mr.main(e["args"] + ["--quiet", "--out", os.path.join(tmp, "k.safetensors")])
                tk, mk = hr.read_safetensors(os.path.join(tmp, "k.safetensors"))
                bad = [n for n in tc if not torch.equal(tc[n], tk[n])] + [n for n in tb if ".indexer." not in n
                                                                          and not torch.equal(tb[n], tc[n])]
                bad += [n for n in tb if ".indexer." in n and float(tb[n].abs().max()) != 0.0]
                rel = max(abs(float(mk[k]) - float(mc[k])) / abs(float(mc[k])) for k in ("loss", "grad_norm", "indexer_kl"))
                _ = mr.main(e["args"] + ["--quiet", "--indexer-kl-coef", "0", "--out", os.path.join(tmp, "z.safetensors")])
                tz, mz = hr.read_safetensors(os.path.join(tmp, "z.safetensors"))
                bad += ["C=0:" + n for n in tb if not torch.equal(tb[n], tz[n])] + (["C=0 meta"] if "indexer_kl" in mz else [])
                report("(f) %s reproduces, GRPO part == %s (mismatches)" % (e["name"], b["name"]),
                       float(len(bad)) + (rel if rel > 1e-12 else 0.0), 0.5)
                cfg, w = res["cfg"], {n: t.clone() for n, t in res["weights"].items()}
                with open(e["args"][e["args"].index("--group") + 1]) as f:
                    group = json.load(f)
                C = e["indexer_kl_coef"]
                with torch.no_grad():
                    state = mr.Net(cfg, w).capture(group["prompt"])

                def val():
                    with torch.no_grad():
                        return C * float(mr.indexer_kl_loss(mr.Net(cfg, w), state, group))
                full = [i for i in range(cfg.L) if cfg.full_idx[i]]
                worst = 0.0
                for i in (full[0], full[-1]):
                    for tn in ("wq_b.weight", "wk.weight", "k_norm.weight", "k_norm.bias", "weights_proj.weight"):
                        n = "model.layers.%d.self_attn.indexer.%s" % (i, tn)
                        g = res["grads0"][n].reshape(-1)
                        j = int(g.abs().argmax())
                        t = w[n].view(-1)
                        x0 = float(t[j])
                        t[j] = x0 + 1e-5
                        lp = val()
                        t[j] = x0 - 1e-5
                        lm = val()
                        t[j] = x0
                        worst = max(worst, abs((lp - lm) / 2e-5 - float(g[j])) / abs(float(g[j])))
                report("(f) %s FD of C*L_I, 10 indexer entries (rel)" % e["name"], worst, 1e-6)
    finally:
        os.chdir(cwd)


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    check_rule()
    check_layers()
    check_causality()
    check_state_matters()
    check_expected()
    check_indexer_kl()
    print("self_checks:", "OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)
