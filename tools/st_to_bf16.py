#!/usr/bin/env python3
"""st_to_bf16.py IN.safetensors OUT.safetensors

Rewrite a float32 safetensors file with every tensor of two or more dimensions in
bfloat16 (round to nearest, ties to even); one-dimensional tensors (norm weights,
A_log, dt_bias, biases) stay float32, as the model families' checkpoints store them.
Standard library only (scripts/make-demo-sft.sh runs it on a fresh machine)."""
import json
import struct
import sys
from array import array


def to_bf16(raw: bytes) -> bytes:
    words = array("I")
    words.frombytes(raw)
    if sys.byteorder != "little":
        words.byteswap()
    out = array("H", bytes(2 * len(words)))
    for i, w in enumerate(words):
        if (w & 0x7F800000) == 0x7F800000 and (w & 0x007FFFFF):  # NaN stays NaN
            out[i] = (w >> 16) | 0x40
        else:
            out[i] = ((w + 0x7FFF + ((w >> 16) & 1)) >> 16) & 0xFFFF
    if sys.byteorder != "little":
        out.byteswap()
    return out.tobytes()


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + hlen])
    body = data[8 + hlen :]
    meta = header.pop("__metadata__", None)
    out_header, chunks, off = {}, [], 0
    for name in sorted(header, key=lambda n: header[n]["data_offsets"][0]):
        t = header[name]
        a, b = t["data_offsets"]
        raw = body[a:b]
        dtype = t["dtype"]
        if dtype == "F32" and len(t["shape"]) >= 2:
            raw, dtype = to_bf16(raw), "BF16"
        out_header[name] = {"dtype": dtype, "shape": t["shape"], "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    if meta is not None:
        out_header["__metadata__"] = meta
    text = json.dumps(out_header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for c in chunks:
            f.write(c)
    return 0


if __name__ == "__main__":
    sys.exit(main())
