"""Reference logits of transformers for an existing qwen3_next checkpoint (e.g. models/tiny-next).

Run on the H200 machine from the repository root (only CPU is used, in float32, pure-PyTorch paths):

    python3 tools/golden_for_checkpoint.py --checkpoint models/tiny-next --name tiny_next \
        --out $OUT/golden --link ../../../models/tiny-next

Writes OUT/NAME/reference.json and one raw little-endian float32 logits file per prompt, in the format
of tools/make_golden.py (tests/golden/README.md), plus "checkpoint": LINK, the checkpoint's path
relative to the case folder, so the weights are not copied. Prompts: chat prompts rendered with the
checkpoint's own chat template (thinking on and off) and a long prose prompt, tokenized by the
checkpoint's own tokenizer.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden as mg  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--link", required=True, help="checkpoint path relative to OUT/NAME")
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(16, os.cpu_count() or 1)))
    mg.instrument_transformers()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import transformers

    tok = AutoTokenizer.from_pretrained(args.checkpoint)
    model, info = mg.load(AutoModelForCausalLM, args.checkpoint, torch.float32)
    missing = list(info.get("missing_keys", []))
    assert not missing, missing
    chats = [
        ("add_think", [{"role": "user", "content": "What is 123 + 456?"}], True),
        ("add_nothink", [{"role": "user", "content": "What is 305 - 87?"}], False),
        ("story", [{"role": "system", "content": "You are a helpful assistant."},
                   {"role": "user", "content": "Tell me a story about a dog."}], True),
    ]
    prompts = []
    for name, msgs, think in chats:
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                       enable_thinking=think)
        prompts.append((name, tok(text, add_special_tokens=False)["input_ids"]))
    prose = ("The old house stood at the end of the road, and nobody had lived there for years. "
             "Children told stories about it on the way home from school, and their parents "
             "laughed at the stories, but nobody went inside. ") * 4
    prompts.append(("prose", tok(prose, add_special_tokens=False)["input_ids"][:150]))

    d = os.path.join(args.out, args.name)
    os.makedirs(d, exist_ok=True)
    ref = {"case": args.name, "checkpoint": args.link,
           "transformers_version": transformers.__version__, "torch_version": torch.__version__,
           "n_generated": mg.N_GEN, "code_paths": {"device": "cpu", "compute_dtype": "float32"},
           "prompts": []}
    for pname, ids in prompts:
        rows, toks = mg.reference_rows(model, ids)
        m = mg.margins_of(rows)
        P = len(ids)
        entry = {"name": pname, "ids": ids, "greedy": toks, "logits_file": f"{pname}.logits.f32",
                 "rows": P + mg.N_GEN - 1, "margins": [float(f"{x:.6g}") for x in m],
                 "greedy_margins": [float(f"{x:.6g}") for x in m[P - 1:]]}
        rows.float().numpy().astype("<f4").tofile(os.path.join(d, entry["logits_file"]))
        ref["prompts"].append(entry)
        print(f"{pname}: P={P} greedy {toks} min margin {min(entry['greedy_margins']):.3g}", flush=True)
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
