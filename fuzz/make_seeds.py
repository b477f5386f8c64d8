#!/usr/bin/env python3
"""make_seeds.py — (re)generate the seed corpora under fuzz/corpus/<name>/.

Deterministic; standard library only. Valid examples come from the reference
fixtures (tests/reference/fixtures, examples/) or are built here; invalid ones each
break one rule the reader checks. The tokenizer seeds need the built harness
(fuzz/build.sh) to print its fixed tokenizer.json:

    LS_FUZZ_DIR=/tmp/ls-fuzz fuzz/build.sh tokenizer && python3 fuzz/make_seeds.py
Every seed stays under 64 KB.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")
FIX = os.path.join(ROOT, "tests", "reference", "fixtures")
BIN = os.path.join(os.environ.get("LS_FUZZ_DIR", "/tmp/ls-fuzz"), "bin")


def put(name, fname, data):
    if isinstance(data, str):
        data = data.encode()
    assert len(data) < 64 * 1024, (fname, len(data))
    d = os.path.join(CORPUS, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, fname), "wb") as f:
        f.write(data)


# ---- safetensors -------------------------------------------------------------------
BITS = {"F32": 32, "BF16": 16, "F16": 16, "F64": 64, "BOOL": 8, "U8": 8, "I8": 8, "I16": 16, "U16": 16,
        "I32": 32, "U32": 32, "I64": 64, "U64": 64, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
        "F6_E2M3": 6, "F6_E3M2": 6, "F4": 4, "C64": 64}


def st(tensors, meta=None, pad8=True, raw_header=None, extra=b""):
    """tensors: [(name, dtype, shape)]; data is a byte ramp laid out in order."""
    hdr, off, data = {}, 0, bytearray()
    if meta is not None:
        hdr["__metadata__"] = meta
    for name, dt, shape in tensors:
        n = 1
        for s in shape:
            n *= s
        nb = n * BITS[dt] // 8
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + nb]}
        data += bytes((off + i) * 37 % 251 for i in range(nb))
        off += nb
    h = raw_header if raw_header is not None else json.dumps(hdr, separators=(",", ":")).encode()
    if pad8 and raw_header is None:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + bytes(data) + extra


def seeds_safetensors():
    for src, dst in [("next_dense/adapter.safetensors", "fixture_lora_adapter.safetensors"),
                     ("q35_dense/model-00001-of-00002.safetensors", "fixture_q35_shard1.safetensors")]:
        with open(os.path.join(FIX, src), "rb") as f:
            put("safetensors", dst, f.read())
    S = "safetensors"
    put(S, "valid_f32_bf16.st", st([("w", "F32", [2, 3]), ("b", "BF16", [4])], meta={"format": "pt"}))
    put(S, "valid_every_dtype.st",
        st([("f64", "F64", []), ("f32", "F32", [3]), ("f16", "F16", [2, 2]), ("bf16", "BF16", [1, 1, 2]),
            ("i64", "I64", [1]), ("u32", "U32", [1]), ("i16", "I16", [2]), ("u8", "U8", [3]), ("b", "BOOL", [2]),
            ("e5m2", "F8_E5M2", [1]), ("e4m3", "F8_E4M3", [1]), ("e8m0", "F8_E8M0", [1]), ("f6", "F6_E2M3", [4]),
            ("f6b", "F6_E3M2", [4]), ("f4", "F4", [2]), ("c64", "C64", [1]), ("empty", "F32", [0, 5])],
           meta={"a": "1", "b": "2"}))
    put(S, "valid_unaligned.st", st([("x", "F32", [5]), ("y", "F64", [3]), ("z", "F16", [3])], pad8=False))
    put(S, "valid_empty_header.st", st([], raw_header=b"{}"))
    put(S, "valid_meta_only.st", st([], meta={"k": "v"}))
    put(S, "valid_8dims.st", st([("t", "F32", [1, 2, 1, 1, 2, 1, 1, 1])]))
    bad = {
        "bad_overlap.st": b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                          b'"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}',
        "bad_past_end.st": b'{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}',
        "bad_begin_gt_end.st": b'{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}}',
        "bad_span.st": b'{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}',
        "bad_dtype.st": b'{"a":{"dtype":"F128","shape":[1],"data_offsets":[0,8]}}',
        "bad_shape_float.st": b'{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}',
        "bad_shape_neg.st": b'{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}',
        "bad_9dims.st": b'{"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}}',
        "bad_overflow.st": b'{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}',
        "bad_f4_odd.st": b'{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}',
        "bad_offsets_shape.st": b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}}',
        "bad_missing_dtype.st": b'{"a":{"shape":[1],"data_offsets":[0,4]}}',
        "bad_dup_name.st": b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                           b'"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}',
        "bad_meta_value.st": b'{"__metadata__":{"k":1}}',
        "bad_meta_twice.st": b'{"__metadata__":{},"__metadata__":{}}',
        "bad_trailing.st": b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} x',
        "bad_not_object.st": b'[1,2,3]',
        "bad_utf8.st": b'{"\xc3\x28":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
        "bad_json.st": b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}',
        "bad_dtype_type.st": b'{"a":{"dtype":32,"shape":[1],"data_offsets":[0,4]}}',
        "bad_shape_type.st": b'{"a":{"dtype":"F32","shape":{"0":1},"data_offsets":[0,4]}}',
        "bad_bytes_overflow.st": b'{"a":{"dtype":"F64","shape":[9007199254740992,512],"data_offsets":[0,4]}}',
        "bad_meta_dup_key.st": b'{"__metadata__":{"k":"a","k":"b"}}',
    }
    for fname, h in bad.items():
        put(S, fname, st([], raw_header=h, extra=bytes(range(16))))
    put(S, "bad_header_len_huge.st", struct.pack("<Q", 1 << 40) + b"{}")
    put(S, "bad_header_len_past_end.st", struct.pack("<Q", 100) + b"{}")
    put(S, "bad_short.st", b"\x02\x00\x00")


# ---- sharded index (model.safetensors.index.json; the harness provides a.safetensors
# holding x, y and b.safetensors holding z) ----------------------------------------------
def seeds_st_index():
    S = "st_index"
    wm = {"x": "a.safetensors", "y": "a.safetensors", "z": "b.safetensors"}
    put(S, "valid_all.json", json.dumps({"metadata": {"total_size": 26}, "weight_map": wm}, indent=2))
    put(S, "valid_subset.json", json.dumps({"weight_map": {"z": "b.safetensors"}}))
    with open(os.path.join(FIX, "q35_dense", "model.safetensors.index.json")) as f:
        put(S, "fixture_q35_dense_index.json", f.read())  # its shards are absent here: rejected
    cases = {
        "bad_missing_shard.json": {"weight_map": dict(wm, z="c.safetensors")},
        "bad_wrong_shard.json": {"weight_map": dict(wm, z="a.safetensors")},
        "bad_escape.json": {"weight_map": dict(wm, z="../b.safetensors")},
        "bad_slash.json": {"weight_map": dict(wm, z="/tmp/b.safetensors")},
        "bad_empty_name.json": {"weight_map": dict(wm, z="")},
        "bad_not_string.json": {"weight_map": dict(wm, z=3)},
        "bad_empty_map.json": {"weight_map": {}},
        "bad_no_map.json": {"metadata": {}},
        "bad_index_as_shard.json": {"weight_map": {"x": "model.safetensors.index.json"}},
    }
    for fname, obj in cases.items():
        put(S, fname, json.dumps(obj))
    put(S, "bad_dup_tensor.json", '{"weight_map": {"x": "a.safetensors", "x": "a.safetensors"}}')
    put(S, "bad_json.json", '{"weight_map": {"x": "a.safetensors"')


# ---- config ------------------------------------------------------------------------
def seeds_config():
    S = "config"
    for sub in ["next_dense", "next_moe", "q35_dense", "q35_moe"]:
        with open(os.path.join(FIX, sub, "config.json")) as f:
            put(S, "fixture_%s.json" % sub, f.read())
    for ex in ["small_hybrid.json", "small_hybrid_moe.json", "qwen3_5_27b.json"]:
        with open(os.path.join(ROOT, "examples", ex)) as f:
            put(S, "example_" + ex, f.read())
    base = {"model_type": "qwen3_next", "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "intermediate_size": 32,
            "num_experts": 0}
    wrap = {"model_type": "qwen3_5", "tie_word_embeddings": True,
            "text_config": dict(base, model_type="qwen3_5_text",
                                rope_parameters={"rope_theta": 1e6, "partial_rotary_factor": 0.25})}
    put(S, "valid_wrapper.json", json.dumps(wrap))
    cases = {
        "valid_min.json": base,
        "bad_layer_types_len.json": dict(base, layer_types=["full_attention"]),
        "bad_layer_types_value.json": dict(base, layer_types=["full_attention", "mamba"]),
        "bad_mlp_only.json": dict(base, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[2]),
        "bad_heads.json": dict(base, num_attention_heads=3, num_key_value_heads=2),
        "bad_vocab_float.json": dict(base, vocab_size=64.5),
        "bad_vocab_huge.json": dict(base, vocab_size=1e300),
        "bad_eps.json": dict(base, rms_norm_eps=-1),
        "bad_tie.json": dict(base, tie_word_embeddings="yes"),
        "bad_topk.json": dict(base, num_experts=2, num_experts_per_tok=3),
        "bad_rope_params.json": dict(base, rope_parameters=3),
        "bad_model_type.json": dict(base, model_type="llama"),
        "bad_no_intermediate.json": dict(base, intermediate_size=0),
    }
    for fname, obj in cases.items():
        put(S, fname, json.dumps(obj))
    put(S, "bad_json.json", '{"model_type": "qwen3_next", "vocab_size": ')
    put(S, "bad_top_array.json", '[{"model_type": "qwen3_next"}]')


# ---- group (one JSON object per file / per JSONL line) ------------------------------
def seeds_group():
    S = "group"
    # fuzz_group.c takes its mode from the first byte: '0' plain ls_group_parse_ex,
    # '1' train (tokenizer, G >= 2, rewards), '2' prompt-only (rollouts)
    def put(name, fname, data, mode="0"):
        globals()["put"](name, fname, mode + data if isinstance(data, str) else mode.encode() + data)
    for sub in ["next_dense", "q35_moe"]:
        for fn in ["group.json", "group_train.json"]:
            with open(os.path.join(FIX, sub, fn)) as f:
                obj = json.load(f)
            put(S, "fixture_%s_%s" % (sub, fn), json.dumps(obj, separators=(",", ":")),  # one JSONL line
                "1" if fn == "group_train.json" else "0")
    with open(os.path.join(FIX, "next_dense", "group.json")) as f:
        put(S, "fixture_next_dense_pretty.json", f.read())
    base = {"prompt": [1, 2, 3], "responses": [[4, 5], [6]]}
    full = dict(base, rewards=[1.0, 0.0], advantages=[0.5, -0.5], old_logprobs=[[-1.0, -2.5], [-0.25]])
    cases = {
        "valid_min.json": base,
        "valid_full.json": full,
        "valid_nulls.json": dict(base, rewards=None, advantages=None, old_logprobs=None),
        "bad_id_range.json": dict(base, prompt=[1, 1000]),
        "bad_id_neg.json": dict(base, responses=[[-1]]),
        "bad_id_float.json": dict(base, prompt=[1.5]),
        "bad_empty_prompt.json": dict(base, prompt=[]),
        "bad_empty_responses.json": dict(base, responses=[]),
        "bad_response_not_array.json": dict(base, responses=[3]),
        "bad_rewards_len.json": dict(base, rewards=[1.0]),
        "bad_rewards_type.json": dict(base, rewards=["a", 1]),
        "bad_logprobs_len.json": dict(base, old_logprobs=[[-1.0], [-1.0]]),
        "bad_logprobs_outer.json": dict(base, old_logprobs=[[-1.0, -1.0]]),
        "bad_no_responses.json": {"prompt": [1]},
        "bad_no_prompt.json": {"responses": [[1]]},
    }
    for fname, obj in cases.items():
        put(S, fname, json.dumps(obj))
    put(S, "bad_top_array.json", "[1, 2]")
    put(S, "bad_json.json", '{"prompt": [1, 2')
    put(S, "repro_logprob_beyond_float.json", '{"prompt":[1],"responses":[[2]],"old_logprobs":[[-1e300]]}')
    put(S, "bad_reward_inf.json", '{"prompt":[1],"responses":[[2]],"rewards":[1e999]}')


# ---- tokenizer (first byte: 0 load, 1 encode, 2 decode) -----------------------------
def seeds_tokenizer():
    S = "tokenizer"
    exe = os.path.join(BIN, "fuzz_tokenizer")
    if os.path.exists(exe):
        with tempfile.TemporaryDirectory() as empty:
            out = subprocess.run([exe, "-runs=0", empty], env=dict(os.environ, LS_FUZZ_DUMP_TOKENIZER="1"),
                                 capture_output=True, check=True).stdout
        tok = out.split(b"\n")[0]
        json.loads(tok)
        put(S, "load_fixed.json", b"\x00" + tok)
        obj = json.loads(tok)
        obj["model"]["merges"] = [m.split(" ") for m in obj["model"]["merges"]]
        obj["model"]["ignore_merges"] = True
        obj["added_tokens"].append({"id": 303, "content": "e\u0301", "normalized": True, "special": False,
                                    "lstrip": True, "rstrip": True, "single_word": False})
        put(S, "load_pairs_normalized.json", b"\x00" + json.dumps(obj, separators=(",", ":")).encode())
        obj["model"]["vocab"]["xyz"] = 1
        put(S, "load_bad_dup_id.json", b"\x00" + json.dumps(obj, separators=(",", ":")).encode())
    else:
        print("make_seeds.py: %s not built; tokenizer load seeds skipped" % exe, file=sys.stderr)
    put(S, "load_bad_json.json", b"\x00{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}")
    with open(os.path.join(ROOT, "tests", "tokenizer", "corpus.jsonl"), encoding="utf-8") as f:
        lines = [json.loads(l) for l in f if l.strip()]
    for i in range(0, len(lines), 15):  # every 15th string of the tokenizer test corpus
        put(S, "encode_%03d.txt" % i, b"\x01" + lines[i].encode("utf-8"))
    put(S, "encode_added.txt", b"\x01hi<|sp|>x<|sp|>cat concat\r\n\n  \t x")
    put(S, "encode_bad_utf8.txt", b"\x01ok \xe4\xb8 \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\xaf")
    put(S, "encode_nfc.txt", b"\x01cafe\xcc\x81 \xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8 a\xcc\x87\xcc\xa3")
    put(S, "decode_ids.bin", b"\x02" + struct.pack("<6i", 104, 259, 300, 302, 256, 10))
    put(S, "decode_bad_id.bin", b"\x02" + struct.pack("<3i", 1, 999, -5))


if __name__ == "__main__":
    seeds_safetensors()
    seeds_st_index()
    seeds_config()
    seeds_group()
    seeds_tokenizer()
