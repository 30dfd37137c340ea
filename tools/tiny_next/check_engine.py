#!/usr/bin/env python3
"""check_engine.py - compare TensorFold's greedy tokens on models/tiny-next with transformers'.

Reads tools/tiny_next/reference.json (written by train.py on the device: transformers 5, CPU, fp32,
eager; greedy = argmax of a no-cache forward per token, 20 tokens, not stopping at <|im_end|>) and
runs, for each prompt,

    build/release/apps/tensorfold generate --model models/tiny-next --prompt-ids IDS \
        --max-tokens N --temperature 0 --ignore-eos --json

Prints one line per prompt and exits non-zero if any token differs.

Usage: python3 tools/tiny_next/check_engine.py [--bin build/release/apps/tensorfold]
"""

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/release/apps/tensorfold"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/tiny-next"))
    ap.add_argument("--reference", default=os.path.join(ROOT, "tools/tiny_next/reference.json"))
    args = ap.parse_args()
    with open(args.reference) as f:
        ref = json.load(f)
    bad = 0
    for p in ref["prompts"]:
        n = len(p["greedy"])
        cmd = [args.bin, "generate", "--model", args.model, "--prompt-ids", ",".join(map(str, p["ids"])),
               "--max-tokens", str(n), "--temperature", "0", "--ignore-eos", "--json"]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"FAIL (exit {out.returncode}): {out.stderr.strip()}")
            bad += 1
            continue
        got = json.loads(out.stdout.strip().splitlines()[-1])["tokens"]
        same = got == p["greedy"]
        first = next((i for i, (a, b) in enumerate(zip(got, p["greedy"])) if a != b), None)
        print(f"{'ok  ' if same else 'DIFF'} {len(p['ids'])} prompt tokens, {n} generated"
              f"{'' if same else f', first difference at {first}'}: {p['greedy_text']!r}")
        if not same:
            print(f"     engine       {got}\n     transformers {p['greedy']}")
            bad += 1
    print(f"{len(ref['prompts']) - bad} passed, {bad} failed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
