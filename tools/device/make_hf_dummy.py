#!/usr/bin/env python3
"""make_hf_dummy.py - a random-weight Hugging Face checkpoint of a qwen3_next configuration (device machine).

For the peer benchmark: the peer's converter turns it into GGUF and bench/gguf_inflate.py repeats its layers
(a 4-layer checkpoint of the 80B-A3B shape becomes the 24-layer model). The weights are normal(0, 0.02) in
bf16 (norm weights as transformers initialises them); with --layers N the first N entries of layer_types are
kept; MTP layers are dropped (num_nextn_predict_layers = 0). The tokenizer files are copied from --tokenizer
(the converter pads the vocabulary to vocab_size).

Usage: python3 tools/device/make_hf_dummy.py --config CONFIG.json --layers 4 --tokenizer models/tiny-next \
           --out /dev/shm/hf-dummy
"""

import argparse
import json
import os
import shutil
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--layers", type=int, default=0, help="keep the first N layers (0: all)")
    ap.add_argument("--tokenizer", required=True, help="folder with tokenizer.json and tokenizer_config.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    t0 = time.time()
    with open(a.config) as f:
        cfg = json.load(f)
    if a.layers:
        cfg["num_hidden_layers"] = a.layers
        if "layer_types" in cfg:
            cfg["layer_types"] = cfg["layer_types"][: a.layers]
    cfg["num_nextn_predict_layers"] = 0
    cfg["model_type"] = "qwen3_next"
    cfg.setdefault("architectures", ["Qwen3NextForCausalLM"])
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    config = AutoConfig.from_pretrained(a.out)
    torch.manual_seed(a.seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(a.out, max_shard_size="5GB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(a.tokenizer, name), a.out)
    print(f"{a.out}: {n / 1e9:.2f}B parameters, {cfg['num_hidden_layers']} layers, {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
