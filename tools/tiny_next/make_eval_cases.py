#!/usr/bin/env python3
"""make_eval_cases.py - write tools/tiny_next/eval_cases.json, the held-out cases `tensorfold eval` runs.

The cases are exactly those train.py's evaluation uses (held out by make_data.py, never trained on):
heldout.json's copy_passages (400 passages of 8-40 words from 25 held-out Brown files and held-out
fortunes) and arith (600 problems a + b / a - b with a, b < 1000, alternating + and -). Each case also
carries transformers' greedy tokens for it (eval_outputs.json, written by train.py on the device: fp32,
on the shipped bf16 weights), so the engine's eval can say how often it produces the same tokens.

Usage: python3 tools/tiny_next/make_eval_cases.py --heldout tools/tiny_next/data/heldout.json \
           --outputs eval_outputs.json [--out tools/tiny_next/eval_cases.json]
"""

import argparse
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heldout", default=os.path.join(HERE, "data", "heldout.json"))
    ap.add_argument("--outputs", required=True, help="eval_outputs.json from train.py")
    ap.add_argument("--out", default=os.path.join(HERE, "eval_cases.json"))
    args = ap.parse_args()
    with open(args.heldout) as f:
        held = json.load(f)
    with open(args.outputs) as f:
        outs = json.load(f)
    copy = held["copy_passages"]
    arith = held["arith"]
    assert len(outs["copy"]) == len(copy), (len(outs["copy"]), len(copy))
    assert len(outs["arith_off"]) == len(arith) and len(outs["arith_on"]) == len(arith)
    doc = {
        "about": "held-out cases of models/tiny-next (tools/tiny_next/make_eval_cases.py); prompts are one user "
                 "message rendered with the model's chat template and add_generation_prompt; copy runs with "
                 "thinking off; hf = transformers' greedy tokens (fp32, shipped bf16 weights), ending with "
                 "<|im_end|> or <|endoftext|> unless the length limit came first",
        "copy_prompt": "Copy this text exactly:\n\n{text}",
        "arith_prompt": "What is {a} {op} {b}?",
        "copy_max_new": "tokens of the text + 8",
        "arith_max_new": {"off": 24, "on": 200},
        "copy": [{"text": p, "hf": o} for p, o in zip(copy, outs["copy"])],
        "arith": [{"a": a, "op": op, "b": b, "hf_off": o1, "hf_on": o2}
                  for (a, op, b), o1, o2 in zip(arith, outs["arith_off"], outs["arith_on"])],
    }
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("{\n")
        keys = list(doc)
        for i, k in enumerate(keys):
            v = doc[k]
            sep = ",\n" if i + 1 < len(keys) else "\n"
            if isinstance(v, list):
                f.write(f" {json.dumps(k)}: [\n")
                f.write(",\n".join("  " + json.dumps(x, ensure_ascii=False, separators=(",", ":")) for x in v))
                f.write("\n ]" + sep)
            else:
                f.write(f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}{sep}")
        f.write("}\n")
    print(f"wrote {args.out}: {len(copy)} copy, {len(arith)} arithmetic cases")


if __name__ == "__main__":
    main()
