#!/usr/bin/python3
"""Write a LongStraw hybrid checkpoint (qwen3_next dense or qwen3_5 dense, as `longstraw init`
writes them) as a GGUF file for llama.cpp's `qwen35` architecture, so llama.cpp runs the same
model: same weights, same math (specs/hybrid-qwen3next.md).

    bench/llama/to_gguf.py MODEL_DIR OUT.gguf [--dtype f32|bf16]

What the conversion does (llama.cpp's conventions for qwen35):
  * zero-centred RMSNorm weights (every norm but the GDN gated norm) are stored as 1 + w;
  * A_log is stored as -exp(A_log) (ssm_a), dt_bias as ssm_dt.bias, conv1d as [conv_dim, K];
  * Qwen3-Next's fused in_proj_qkvz / in_proj_ba are de-interleaved per key-head group into
    attn_qkv ([q | k | v]), attn_gate (z), ssm_beta (b), ssm_alpha (a);
  * value heads are reordered from grouped-by-key-head to tiled order (llama.cpp broadcasts
    key heads by tiling) in every tensor indexed by value head;
  * the vocabulary is a placeholder SentencePiece table of vocab_size entries (the benchmark
    feeds token ids, never text).
Only dense hybrid configs are supported (no experts): the comparison's model.
Needs numpy only.
"""
import json
import os
import struct
import sys

import numpy as np


def fail(msg):
    sys.stderr.write("to_gguf: %s\n" % msg)
    sys.exit(1)


def read_safetensors(path):
    out = {}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        base = 8 + n
        for name, info in head.items():
            if name == "__metadata__":
                continue
            a, b = info["data_offsets"]
            f.seek(base + a)
            raw = f.read(b - a)
            dt = info["dtype"]
            if dt == "F32":
                arr = np.frombuffer(raw, dtype="<f4")
            elif dt == "BF16":
                arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
            elif dt == "F16":
                arr = np.frombuffer(raw, dtype="<f2").astype(np.float32)
            else:
                fail("%s: tensor %s: dtype %s not supported" % (path, name, dt))
            out[name] = arr.reshape(info["shape"]).astype(np.float32)
    return out


def load_model(d):
    cfg_path = os.path.join(d, "config.json")
    try:
        cfg = json.load(open(cfg_path))
    except (OSError, ValueError) as e:
        fail("%s: %s" % (cfg_path, e))
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    if not files:
        fail("%s: no .safetensors file" % d)
    t = {}
    for f in files:
        t.update(read_safetensors(os.path.join(d, f)))
    return cfg, t


# ---- GGUF writer (version 3, little endian) ----
T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR = 4, 5, 6, 7, 8, 9
G_F32, G_BF16 = 0, 30
ALIGN = 32


def w_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def w_kv(key, typ, val):
    out = w_str(key) + struct.pack("<I", typ)
    if typ == T_U32:
        out += struct.pack("<I", val)
    elif typ == T_I32:
        out += struct.pack("<i", val)
    elif typ == T_F32:
        out += struct.pack("<f", val)
    elif typ == T_BOOL:
        out += struct.pack("<B", 1 if val else 0)
    elif typ == T_STR:
        out += w_str(val)
    elif typ == T_ARR:
        et, items = val
        out += struct.pack("<IQ", et, len(items))
        if et == T_STR:
            out += b"".join(w_str(s) for s in items)
        elif et == T_F32:
            out += np.asarray(items, dtype="<f4").tobytes()
        elif et in (T_I32, T_U32):
            out += np.asarray(items, dtype="<i4" if et == T_I32 else "<u4").tobytes()
    return out


def write_gguf(path, kvs, tensors, dtype):
    blobs, infos, off = [], [], 0
    for name, arr in tensors:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if dtype == "bf16" and arr.ndim == 2 and "ssm_conv1d" not in name:  # ggml's conv wants f32
            u = arr.view(np.uint32)
            # round to nearest even (no NaNs in these weights)
            raw = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()
            gt = G_BF16
        else:
            raw, gt = arr.astype("<f4").tobytes(), G_F32
        dims = list(reversed(arr.shape))  # GGUF lists the fastest dimension first
        info = w_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", x) for x in dims)
        info += struct.pack("<IQ", gt, off)
        infos.append(info)
        pad = (-len(raw)) % ALIGN
        blobs.append(raw + b"\0" * pad)
        off += len(raw) + pad
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    head += b"".join(w_kv(*kv) for kv in kvs) + b"".join(infos)
    head += b"\0" * ((-len(head)) % ALIGN)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(head)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def main():
    args = sys.argv[1:]
    if not args or "--help" in args or "-h" in args:
        print(__doc__.strip())
        return 0
    dtype = "f32"
    if "--dtype" in args:
        i = args.index("--dtype")
        if i + 1 >= len(args) or args[i + 1] not in ("f32", "bf16"):
            fail("--dtype: f32 or bf16")
        dtype = args[i + 1]
        del args[i:i + 2]
    if len(args) != 2:
        fail("usage: to_gguf.py MODEL_DIR OUT.gguf [--dtype f32|bf16]")
    mdir, out = args
    cfg, t = load_model(mdir)
    mt = cfg.get("model_type")
    if mt in ("qwen3_5", "qwen3_5_moe") and "text_config" in cfg:
        cfg = cfg["text_config"]
        mt = cfg.get("model_type", "qwen3_5_text")
    if mt not in ("qwen3_next", "qwen3_5_text", "qwen3_5"):
        fail("%s/config.json: model_type %r: a dense hybrid (qwen3_next / qwen3_5) is needed" % (mdir, mt))
    if cfg.get("num_experts", 0):
        fail("%s/config.json: num_experts %s: only dense configs convert" % (mdir, cfg["num_experts"]))
    fused = mt == "qwen3_next"
    pre = "model." if fused else "model.language_model."

    D, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    H, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim", D // H)
    rp = cfg.get("rope_parameters") or {}
    prf = rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
    theta = rp.get("rope_theta", cfg.get("rope_theta", 10000.0))
    rot = int(hd * prf)
    Hk, Hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    if dk != dv:
        fail("%s/config.json: linear_key_head_dim %d != linear_value_head_dim %d: llama.cpp's qwen35 needs them equal"
             % (mdir, dk, dv))
    r = Hv // Hk
    K = cfg.get("linear_conv_kernel_dim", 4)
    interval = cfg.get("full_attention_interval", 4)
    lt = cfg.get("layer_types")
    full = [(lt[i] == "full_attention") if lt else ((i + 1) % interval == 0) for i in range(L)]
    eps = cfg.get("rms_norm_eps", 1e-6)
    tied = cfg.get("tie_word_embeddings", False)

    def get(name):
        if name not in t:
            fail("%s: tensor %s missing" % (mdir, name))
        return t[name]

    def tile_v(a, axis, width):
        """value heads grouped by key head [g, j] -> tiled [j, g] along axis (blocks of width)."""
        a = np.moveaxis(a, axis, 0)
        sh = a.shape
        a = a.reshape((Hk, r, width) + sh[1:]).swapaxes(0, 1).reshape(sh)
        return np.moveaxis(a, 0, axis)

    out_t = [("token_embd.weight", get(pre + "embed_tokens.weight")),
             ("output_norm.weight", 1.0 + get(pre + "norm.weight"))]
    if not tied:
        out_t.append(("output.weight", get("lm_head.weight")))
    for i in range(L):
        b = "%slayers.%d." % (pre, i)
        o = "blk.%d." % i
        out_t.append((o + "attn_norm.weight", 1.0 + get(b + "input_layernorm.weight")))
        out_t.append((o + "post_attention_norm.weight", 1.0 + get(b + "post_attention_layernorm.weight")))
        if full[i]:
            out_t += [(o + "attn_q.weight", get(b + "self_attn.q_proj.weight")),
                      (o + "attn_k.weight", get(b + "self_attn.k_proj.weight")),
                      (o + "attn_v.weight", get(b + "self_attn.v_proj.weight")),
                      (o + "attn_output.weight", get(b + "self_attn.o_proj.weight")),
                      (o + "attn_q_norm.weight", 1.0 + get(b + "self_attn.q_norm.weight")),
                      (o + "attn_k_norm.weight", 1.0 + get(b + "self_attn.k_norm.weight"))]
        else:
            a = b + "linear_attn."
            if fused:
                w = get(a + "in_proj_qkvz.weight").reshape(Hk, 2 * dk + 2 * r * dv, D)
                q = w[:, :dk].reshape(Hk * dk, D)
                k = w[:, dk:2 * dk].reshape(Hk * dk, D)
                v = w[:, 2 * dk:2 * dk + r * dv].reshape(Hv * dv, D)
                z = w[:, 2 * dk + r * dv:].reshape(Hv * dv, D)
                ba = get(a + "in_proj_ba.weight").reshape(Hk, 2 * r, D)
                beta = ba[:, :r].reshape(Hv, D)
                alpha = ba[:, r:].reshape(Hv, D)
            else:
                qkv = get(a + "in_proj_qkv.weight")
                q, k, v = qkv[:Hk * dk], qkv[Hk * dk:2 * Hk * dk], qkv[2 * Hk * dk:]
                z = get(a + "in_proj_z.weight")
                beta, alpha = get(a + "in_proj_b.weight"), get(a + "in_proj_a.weight")
            conv = get(a + "conv1d.weight").reshape(-1, K)
            conv = np.concatenate([conv[:2 * Hk * dk], tile_v(conv[2 * Hk * dk:], 0, dv)], axis=0)
            out_t += [(o + "attn_qkv.weight", np.concatenate([q, k, tile_v(v, 0, dv)], axis=0)),
                      (o + "attn_gate.weight", tile_v(z, 0, dv)),
                      (o + "ssm_beta.weight", tile_v(beta, 0, 1)),
                      (o + "ssm_alpha.weight", tile_v(alpha, 0, 1)),
                      (o + "ssm_conv1d.weight", conv),
                      (o + "ssm_dt.bias", tile_v(get(a + "dt_bias"), 0, 1)),
                      (o + "ssm_a", tile_v(-np.exp(get(a + "A_log").astype(np.float64)).astype(np.float32), 0, 1)),
                      (o + "ssm_norm.weight", get(a + "norm.weight")),
                      (o + "ssm_out.weight", tile_v(get(a + "out_proj.weight"), 1, dv))]
        out_t += [(o + "ffn_gate.weight", get(b + "mlp.gate_proj.weight")),
                  (o + "ffn_up.weight", get(b + "mlp.up_proj.weight")),
                  (o + "ffn_down.weight", get(b + "mlp.down_proj.weight"))]

    arch = "qwen35"
    half = rot // 2
    sections = [half - 2 * (half // 3), half // 3, half // 3, 0]
    toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % i for i in range(256)]
    if V < len(toks) + 1:
        fail("%s/config.json: vocab_size %d: at least %d needed for the placeholder vocabulary" % (mdir, V, len(toks) + 1))
    types = [2, 3, 3] + [6] * 256
    toks += ["\u2581t%d" % i for i in range(V - len(toks))]
    types += [1] * (V - len(types))
    kvs = [("general.architecture", T_STR, arch),
           ("general.name", T_STR, "longstraw " + os.path.basename(os.path.abspath(mdir))),
           ("general.file_type", T_U32, 32 if dtype == "bf16" else 0),
           (arch + ".context_length", T_U32, int(cfg.get("max_position_embeddings", 262144))),
           (arch + ".embedding_length", T_U32, D),
           (arch + ".block_count", T_U32, L),
           (arch + ".feed_forward_length", T_U32, cfg["intermediate_size"]),
           (arch + ".attention.head_count", T_U32, H),
           (arch + ".attention.head_count_kv", T_U32, Hkv),
           (arch + ".attention.key_length", T_U32, hd),
           (arch + ".attention.value_length", T_U32, hd),
           (arch + ".attention.layer_norm_rms_epsilon", T_F32, eps),
           (arch + ".rope.dimension_count", T_U32, rot),
           (arch + ".rope.freq_base", T_F32, float(theta)),
           (arch + ".rope.dimension_sections", T_ARR, (T_I32, sections)),
           (arch + ".ssm.conv_kernel", T_U32, K),
           (arch + ".ssm.state_size", T_U32, dk),
           (arch + ".ssm.group_count", T_U32, Hk),
           (arch + ".ssm.time_step_rank", T_U32, Hv),
           (arch + ".ssm.inner_size", T_U32, Hv * dv),
           (arch + ".full_attention_interval", T_U32, interval),
           ("tokenizer.ggml.model", T_STR, "llama"),
           ("tokenizer.ggml.tokens", T_ARR, (T_STR, toks)),
           ("tokenizer.ggml.scores", T_ARR, (T_F32, [0.0] * V)),
           ("tokenizer.ggml.token_type", T_ARR, (T_I32, types)),
           ("tokenizer.ggml.bos_token_id", T_U32, 1),
           ("tokenizer.ggml.eos_token_id", T_U32, 2),
           ("tokenizer.ggml.unknown_token_id", T_U32, 0),
           ("tokenizer.ggml.add_bos_token", T_BOOL, False)]
    if lt and any(full[i] != ((i + 1) % interval == 0) for i in range(L)):
        fail("%s/config.json: layer_types not periodic with full_attention_interval %d" % (mdir, interval))
    write_gguf(out, kvs, out_t, dtype)
    print("wrote %s: %d tensors, %s" % (out, len(out_t), dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
