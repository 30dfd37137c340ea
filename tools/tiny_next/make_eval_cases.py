#!/usr/bin/env python3
"""make_eval_cases.py - write tools/tiny_next/eval_cases.json, the held-out cases `tensorfold eval` runs.

The cases are exactly those train.py's evaluation uses (held out by make_data.py, never trained on):
heldout.json's copy_passages (400 passages of 8-40 words from 25 held-out Brown files and held-out
fortunes) and arith (600 problems a + b / a - b with a, b < 1000, alternating + and -). Each case also
carries transformers' greedy tokens for it (eval_outputs.json, written by train.py on the device: fp32,
on the shipped bf16 weights), so the engine's eval can say how often it produces the same tokens.
prose: heldout.json's 125 held-out prose documents for MTP agreement (train_mtp.py's sets), each cut
after its first PROSE_WORDS words (the eval uses the first 256 tokens, teacher-forced, and the first 40
words as a "Continue this text" prompt); cutting at a word boundary leaves those tokens unchanged.

Usage: python3 tools/tiny_next/make_eval_cases.py --heldout tools/tiny_next/data/heldout.json \
           --outputs eval_outputs.json [--out tools/tiny_next/eval_cases.json]
Without --outputs, the copy and arithmetic cases (with their hf tokens) are kept from the existing --out
file and only the prose documents are (re)written.
"""

import argparse
import json
import os
import re

PROSE_WORDS = 320  # > 256 tokens of any held-out document (tiny-next: about 1.3 tokens a word)
HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heldout", default=os.path.join(HERE, "data", "heldout.json"))
    ap.add_argument("--outputs", help="eval_outputs.json from train.py (default: keep --out's cases)")
    ap.add_argument("--out", default=os.path.join(HERE, "eval_cases.json"))
    args = ap.parse_args()
    with open(args.heldout) as f:
        held = json.load(f)
    copy = held["copy_passages"]
    arith = held["arith"]
    if args.outputs:
        with open(args.outputs) as f:
            outs = json.load(f)
    else:
        with open(args.out) as f:
            old = json.load(f)
        assert [c["text"] for c in old["copy"]] == copy, "--out's copy cases differ from heldout.json"
        outs = {"copy": [c["hf"] for c in old["copy"]], "arith_off": [c["hf_off"] for c in old["arith"]],
                "arith_on": [c["hf_on"] for c in old["arith"]]}
    assert len(outs["copy"]) == len(copy), (len(outs["copy"]), len(copy))
    assert len(outs["arith_off"]) == len(arith) and len(outs["arith_on"]) == len(arith)
    prose = []
    for d in held["prose_docs"][:125]:
        m = list(re.finditer(r"\S+", d))
        prose.append(d[:m[PROSE_WORDS - 1].end()] if len(m) > PROSE_WORDS else d)
    doc = {
        "about": "held-out cases of models/tiny-next (tools/tiny_next/make_eval_cases.py); prompts are one user "
                 "message rendered with the model's chat template and add_generation_prompt; copy runs with "
                 "thinking off; hf = transformers' greedy tokens (fp32, shipped bf16 weights), ending with "
                 "<|im_end|> or <|endoftext|> unless the length limit came first",
        "copy_prompt": "Copy this text exactly:\n\n{text}",
        "arith_prompt": "What is {a} {op} {b}?",
        "copy_max_new": "tokens of the text + 8",
        "arith_max_new": {"off": 24, "on": 200},
        "continue_prompt": "Continue this text:\n\n{text}",
        "prose_about": "held-out prose documents (first %d words); MTP agreement: the first 256 tokens "
                       "teacher-forced, and the model's greedy continuation (64 tokens, thinking off) of "
                       "continue_prompt with the first 40 words (documents of 20 words or more)" % PROSE_WORDS,
        "copy": [{"text": p, "hf": o} for p, o in zip(copy, outs["copy"])],
        "arith": [{"a": a, "op": op, "b": b, "hf_off": o1, "hf_on": o2}
                  for (a, op, b), o1, o2 in zip(arith, outs["arith_off"], outs["arith_on"])],
        "prose": [{"text": p} for p in prose],
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
    print(f"wrote {args.out}: {len(copy)} copy, {len(arith)} arithmetic cases, {len(prose)} prose documents")


if __name__ == "__main__":
    main()
