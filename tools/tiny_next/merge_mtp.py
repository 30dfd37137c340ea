#!/usr/bin/env python3
"""merge_mtp.py - put the mtp.* tensors of a safetensors file (train_mtp.py's mtp.safetensors) into a
checkpoint, in place: each mtp.* tensor's bytes are overwritten at its offsets; the header and every other
tensor stay byte-identical (checked). Pure Python (no torch).

Usage: python3 tools/tiny_next/merge_mtp.py --mtp mtp.safetensors --model models/tiny-next/model.safetensors
       (--dry-run: only compare)
"""

import argparse
import hashlib
import json
import os
import struct


def header(buf):
    n = struct.unpack("<Q", buf[:8])[0]
    return json.loads(buf[8:8 + n]), 8 + n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mtp", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    src = open(a.mtp, "rb").read()
    dst = bytearray(open(a.model, "rb").read())
    hs, bs = header(src)
    hd, bd = header(dst)
    ks = sorted(k for k in hs if k != "__metadata__")
    kd = sorted(k for k in hd if k.startswith("mtp."))
    if not all(k.startswith("mtp.") for k in ks):
        raise SystemExit("the source holds tensors other than mtp.*")
    if ks != kd:
        raise SystemExit(f"mtp.* names differ: only in source {sorted(set(ks) - set(kd))}, "
                         f"only in model {sorted(set(kd) - set(ks))}")

    def keep_digest(buf):
        """sha256 of the header and of every non-mtp tensor's bytes."""
        h = hashlib.sha256(buf[:bd])
        for k in sorted(hd):
            if k != "__metadata__" and not k.startswith("mtp."):
                x, y = hd[k]["data_offsets"]
                h.update(buf[bd + x:bd + y])
        return h.hexdigest()

    before = keep_digest(dst)
    changed = 0
    for k in ks:
        s, d = hs[k], hd[k]
        if s["dtype"] != d["dtype"] or s["shape"] != d["shape"]:
            raise SystemExit(f"{k}: {s['dtype']} {s['shape']} vs {d['dtype']} {d['shape']}")
        x, y = s["data_offsets"]
        u, v = d["data_offsets"]
        new = src[bs + x:bs + y]
        assert len(new) == v - u
        if dst[bd + u:bd + v] != new:
            changed += 1
            dst[bd + u:bd + v] = new
    after = keep_digest(dst)
    if before != after:
        raise SystemExit("internal error: a non-mtp byte changed")
    print(f"{len(ks)} mtp.* tensors, {changed} changed; header and {len(hd) - 1 - len(kd)} other tensors "
          f"byte-identical (sha256 {after[:16]})")
    if not a.dry_run and changed:
        tmp = a.model + ".tmp"
        with open(tmp, "wb") as f:
            f.write(dst)
        os.replace(tmp, a.model)
        print(f"wrote {a.model}")


if __name__ == "__main__":
    main()
