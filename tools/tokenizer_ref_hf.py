#!/usr/bin/env python3
"""Hugging Face references for TensorFold's tokenizer (run where `tokenizers` and `transformers` are
installed; here: the H200 device machine, offline, tokenizers + transformers from its Python).

  train-small  Trains the small Qwen-style tokenizer (byte-level BPE, NFC, the Qwen Split regex +
               ByteLevel, ChatML and think/tool added tokens) on a text file; writes tokenizer.json.
  encode       Encodes every corpus line (add_special_tokens=False) with each tokenizer dir; writes
               ids (one JSON array a line) and the decode of those ids where it is not NFC(text);
               also decodes seeded random id sequences (skip_special_tokens false and true).
  bench        Encode speed of whole files, one thread (RAYON_NUM_THREADS=1), best of 3.
  small-config Writes tokenizer_config.json beside the small tokenizer.json: Qwen3's config (chat
               template with thinking on/off and tools, eos <|im_end|>, pad <|endoftext|>) with the
               small tokenizer's added-token ids. Needs only the json module.
  chat         apply_chat_template(tokenize=False) of transformers on every chat case and template,
               as a cross-check of the Jinja2 references made by tools/tokenizer_ref_jinja.py.

How it was run (one device call, from the repository root; the outputs were copied into
tests/tokenizer/data/ and the bench numbers into docs/PERFORMANCE.md):
  RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false python3 tools/tokenizer_ref_hf.py all \
      --train-text tools/tokenizer_tmp/train.txt --bench-dir tools/tokenizer_tmp --out $OUT
(train.txt from tools/tokenizer_train_text.sh, english.txt and code.txt from
tools/tokenizer_bench_data.sh; qwen3/tokenizer.json was committed gzip'd afterwards, which
plain_dir() handles), then here:
  python3 tools/tokenizer_ref_hf.py small-config --out tests/tokenizer/data/small
"""
import argparse
import gzip
import json
import os
import random
import shutil
import sys
import tempfile
import time
import unicodedata

QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
NON_SPECIAL = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]


def train_small(text_path, out_dir, vocab_size):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers import processors, trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train([text_path], trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in NON_SPECIAL])
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    print(f"small tokenizer: {tok.get_vocab_size()} tokens -> {out_dir}")


def small_config(qwen3_dir, small_dir):
    with open(os.path.join(qwen3_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    with open(os.path.join(small_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    cfg["added_tokens_decoder"] = {
        str(t["id"]): {k: t[k] for k in ["content", "lstrip", "normalized", "rstrip", "single_word", "special"]}
        for t in tok["added_tokens"]}
    cfg["additional_special_tokens"] = ["<|im_start|>", "<|im_end|>"]
    cfg["model_max_length"] = 4096
    with open(os.path.join(small_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
        f.write("\n")
    print(f"wrote {small_dir}/tokenizer_config.json")


def plain_dir(tok_dir):
    """tests/tokenizer/data/qwen3 keeps tokenizer.json gzip'd: unpack it into a temporary dir."""
    if os.path.exists(os.path.join(tok_dir, "tokenizer.json")):
        return tok_dir
    out = tempfile.mkdtemp(prefix="tok_")
    with gzip.open(os.path.join(tok_dir, "tokenizer.json.gz"), "rb") as f, \
            open(os.path.join(out, "tokenizer.json"), "wb") as g:
        shutil.copyfileobj(f, g)
    shutil.copy(os.path.join(tok_dir, "tokenizer_config.json"), out)
    return out


def load(tok_dir):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(os.path.join(plain_dir(tok_dir), "tokenizer.json"))


def encode_corpus(tok_dirs, corpus, out_dir):
    with open(corpus, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    for name, d in tok_dirs.items():
        tok = load(d)
        n_diff = 0
        with open(os.path.join(out_dir, f"{name}.corpus.ids.jsonl"), "w") as fi, \
                open(os.path.join(out_dir, f"{name}.corpus.decode_diff.jsonl"), "w") as fd:
            for i, text in enumerate(lines):
                ids = tok.encode(text, add_special_tokens=False).ids
                fi.write(json.dumps(ids) + "\n")
                back = tok.decode(ids, skip_special_tokens=False)
                if back != unicodedata.normalize("NFC", text):
                    n_diff += 1
                    fd.write(json.dumps({"line": i, "decoded": back}, ensure_ascii=False) + "\n")
        # Random id sequences: splits inside UTF-8 characters, added tokens, both skip modes.
        rng = random.Random(11)
        n = tok.get_vocab_size()
        with open(os.path.join(out_dir, f"{name}.decode.jsonl"), "w") as fo:
            for k in range(400):
                ids = [rng.randrange(n) for _ in range(rng.randint(0, 12))]
                if k % 3 == 0:  # mostly high-byte single tokens: invalid and partial UTF-8
                    ids = [rng.randrange(128, 256) if rng.random() < 0.7 else rng.randrange(n)
                           for _ in range(rng.randint(1, 8))]
                rec = {"ids": ids, "text": tok.decode(ids, skip_special_tokens=False),
                       "text_skip_special": tok.decode(ids, skip_special_tokens=True)}
                fo.write(json.dumps(rec, ensure_ascii=False) + "\n")
        print(f"{name}: {len(lines)} lines encoded, decode != NFC(text) on {n_diff}")


def bench(tok_dirs, files):
    import tokenizers
    print(f"tokenizers {tokenizers.__version__}, RAYON_NUM_THREADS={os.environ.get('RAYON_NUM_THREADS')}")
    for name, d in tok_dirs.items():
        tok = load(d)
        for f in files:
            with open(f, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
            nbytes = len(text.encode("utf-8"))
            tok.encode(text[:100000], add_special_tokens=False)
            best, n = 1e9, 0
            for _ in range(3):
                t0 = time.perf_counter()
                n = len(tok.encode(text, add_special_tokens=False).ids)
                best = min(best, time.perf_counter() - t0)
            print(f"bench {name} {os.path.basename(f)}: {nbytes / 1e6:.2f} MB, {n} tokens, "
                  f"{nbytes / 1e6 / best:.2f} MB/s")


def chat(tok_dir, chats, templates, out_path):
    import transformers
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(plain_dir(tok_dir))
    with open(chats, encoding="utf-8") as f:
        cases = [json.loads(line) for line in f if line.strip()]
    n_err = 0
    with open(out_path, "w", encoding="utf-8") as out:
        for name, text in templates.items():
            for i, c in enumerate(cases):
                kw = {}
                if "enable_thinking" in c:
                    kw["enable_thinking"] = c["enable_thinking"]
                rec = {"template": name, "case": i}
                try:
                    rec["text"] = tok.apply_chat_template(
                        c["messages"], tools=c.get("tools"), tokenize=False, chat_template=text,
                        add_generation_prompt=c.get("add_generation_prompt", False), **kw)
                except Exception as e:
                    rec["error"] = f"{type(e).__name__}: {e}"
                    n_err += 1
                out.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(f"transformers {transformers.__version__}: {len(cases)} cases x {len(templates)} templates, "
          f"{n_err} errors")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["train-small", "small-config", "encode", "bench", "chat", "all"])
    ap.add_argument("--train-text")
    ap.add_argument("--vocab-size", type=int, default=6000)
    ap.add_argument("--bench-dir")
    ap.add_argument("--data", default="tests/tokenizer/data")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    small_dir = os.path.join(args.out, "small")
    steps = ["train-small", "encode", "bench", "chat"] if args.what == "all" else [args.what]
    dirs = {"qwen3": os.path.join(args.data, "qwen3"), "small": small_dir}
    for step in steps:
        try:
            if step == "train-small":
                train_small(args.train_text, small_dir, args.vocab_size)
            elif step == "small-config":
                small_config(os.path.join(args.data, "qwen3"), args.out)
            elif step == "encode":
                encode_corpus(dirs, os.path.join(args.data, "corpus.jsonl"), args.out)
            elif step == "bench":
                bench(dirs, [os.path.join(args.bench_dir, "english.txt"),
                             os.path.join(args.bench_dir, "code.txt")])
            elif step == "chat":
                with open(os.path.join(args.data, "qwen3", "tokenizer_config.json")) as f:
                    templates = {"qwen3": json.load(f)["chat_template"]}
                for n in ["qwen3_next_instruct", "qwen3_next_thinking"]:
                    with open(os.path.join(args.data, "templates", n + ".jinja")) as f:
                        templates[n] = f.read()
                chat(os.path.join(args.data, "qwen3"), os.path.join(args.data, "chats.jsonl"), templates,
                     os.path.join(args.out, "chats.transformers.jsonl"))
        except Exception as e:  # keep going: one device call must bring back every step it can
            print(f"step {step} failed: {type(e).__name__}: {e}", file=sys.stderr)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
