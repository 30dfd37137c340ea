#!/usr/bin/env python3
"""gguf_inflate.py - repeat the layers of a GGUF file to make a deeper model of the same shape.

The peer benchmark (llama.cpp) needs the 80B-A3B-shaped model (24 layers, bf16, ~80 GB) as GGUF, but the
H200 machine's disk cannot hold both a 24-layer safetensors checkpoint and its GGUF. So a 4-layer dummy
checkpoint of the same shape is converted with the peer's own converter, and this script writes the
24-layer file from it: layer i of the output is layer i % n of the input (4 layers keep the full-attention
interval of 4: layers 3, 7, 11, ... are attention layers). Speed does not depend on the weights' values,
only on their shapes and types, which this keeps.

Metadata: `<arch>.block_count` becomes --layers, and every array whose length is the old layer count
(per-layer flags such as `<arch>.attention.recurrent_layers`) is repeated the same way; tensors named
`blk.<i>.*` are repeated, all others copied once. The input must have no extra (MTP/nextn) blocks.

Pure standard library (GGUF v2/v3 as documented in the ggml repository's docs/gguf.md: little-endian
header, key/value pairs, tensor infos, data aligned to general.alignment).

Usage: python3 bench/gguf_inflate.py IN.gguf OUT.gguf --layers 24
"""

import argparse
import re
import struct
import sys

# value types of GGUF key/value pairs -> struct format of one scalar (strings and arrays are special)
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


class Reader:
    def __init__(self, f):
        self.f = f

    def unpack(self, fmt):
        n = struct.calcsize(fmt)
        b = self.f.read(n)
        if len(b) != n:
            raise ValueError("truncated GGUF file")
        return struct.unpack(fmt, b)[0]

    def string(self):
        n = self.unpack("<Q")
        return self.f.read(n).decode("utf-8")

    def value(self, vtype):
        """Returns (type, value); an array's value is (element type, [elements])."""
        if vtype in SCALAR:
            return self.unpack(SCALAR[vtype])
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            et = self.unpack("<I")
            n = self.unpack("<Q")
            return (et, [self.value(et) for _ in range(n)])
        raise ValueError(f"unknown GGUF value type {vtype}")


def pack_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def pack_value(vtype, v):
    if vtype in SCALAR:
        return struct.pack(SCALAR[vtype], v)
    if vtype == STRING:
        return pack_string(v)
    et, items = v
    return struct.pack("<IQ", et, len(items)) + b"".join(pack_value(et, x) for x in items)


def read_gguf(path):
    f = open(path, "rb")
    r = Reader(f)
    if f.read(4) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    version = r.unpack("<I")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not supported")
    n_tensors, n_kv = r.unpack("<Q"), r.unpack("<Q")
    kv = []
    for _ in range(n_kv):
        key = r.string()
        vtype = r.unpack("<I")
        kv.append([key, vtype, r.value(vtype)])
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        nd = r.unpack("<I")
        dims = [r.unpack("<Q") for _ in range(nd)]
        ttype = r.unpack("<I")
        offset = r.unpack("<Q")
        tensors.append({"name": name, "dims": dims, "type": ttype, "offset": offset})
    align = next((v for k, t, v in kv if k == "general.alignment"), 32)
    data_start = (f.tell() + align - 1) // align * align
    f.seek(0, 2)
    size = f.tell()
    ends = sorted(t["offset"] for t in tensors) + [size - data_start]
    for t in tensors:  # a tensor's bytes run to the next tensor's start (its padding included)
        t["span"] = min(e for e in ends if e > t["offset"]) - t["offset"]
    return f, version, kv, tensors, align, data_start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--layers", type=int, required=True)
    a = ap.parse_args()
    f, version, kv, tensors, align, data_start = read_gguf(a.src)
    arch = next(v for k, t, v in kv if k == "general.architecture")
    count_key = f"{arch}.block_count"
    old = next(v for k, t, v in kv if k == count_key)
    if any(k.endswith("nextn_predict_layers") and v for k, t, v in kv):
        sys.exit("the input has MTP/nextn blocks; make it with num_nextn_predict_layers = 0")
    for e in kv:
        if e[0] == count_key:
            e[2] = a.layers
        elif e[1] == ARRAY and e[0].startswith(arch + ".") and len(e[2][1]) == old:
            e[2] = (e[2][0], [e[2][1][i % old] for i in range(a.layers)])

    blk = re.compile(r"^blk\.(\d+)\.(.*)$")
    by_name = {t["name"]: t for t in tensors}
    out = [(t["name"], t) for t in tensors if not blk.match(t["name"])]
    for i in range(a.layers):
        for t in tensors:
            m = blk.match(t["name"])
            if m and int(m.group(1)) == i % old:
                out.append((f"blk.{i}.{m.group(2)}", by_name[t["name"]]))

    header = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(out), len(kv)))
    for key, vtype, v in kv:
        header += pack_string(key) + struct.pack("<I", vtype) + pack_value(vtype, v)
    offset = 0
    placed = []
    for name, t in out:
        header += pack_string(name) + struct.pack("<I", len(t["dims"]))
        header += b"".join(struct.pack("<Q", d) for d in t["dims"])
        header += struct.pack("<IQ", t["type"], offset)
        placed.append(t)
        offset += (t["span"] + align - 1) // align * align
    header += b"\0" * ((-len(header)) % align)
    with open(a.dst, "wb") as o:
        o.write(header)
        for t in placed:
            f.seek(data_start + t["offset"])
            left = t["span"]
            while left:
                chunk = f.read(min(left, 64 << 20))
                o.write(chunk)
                left -= len(chunk)
            o.write(b"\0" * ((-t["span"]) % align))
    print(f"{a.dst}: {len(out)} tensors, {a.layers} layers (from {old}), {offset / 1e9:.2f} GB of data")


if __name__ == "__main__":
    main()
