#!/usr/bin/env python3
"""fresh.py - synthetic chats generated while training, chunk by chunk, so the copy task cannot be
memorised (pure Python + numpy; `tokenizers` only inside the worker processes).

train.py starts a pool of worker processes (init_worker) and asks them for chunks in order
(make_chunk(i)); chunk i depends only on (seed, i), so a run is reproducible whatever the timing.
A chunk is an int32 array [rows, L+2] of whole chats, each followed by <|endoftext|>, packed from
the start of each row (the last chat of a row is cut at the row's end).

Chat mixture (per chat):
  copy_share   copy/repeat chats whose text cannot be guessed, 5-60 words (see CopyContent):
               random windows of the training prose (raw substrings, spacing kept), random word
               sequences over every word form of the training prose (uniform over forms or by
               frequency), random "codes" (numbers, mixed-case strings, names, punctuation), and
               mixtures; as a plain copy (any COPY_PROMPTS wording), a phrase repeated n times, or
               a two-turn chat that asks for the first text again.
  arith_share  addition/subtraction (make_data.Gen.arith; the held-out problems excluded).
  rest         make_data.Gen.sample() over the training prose: every task of chats.jsonl.
Half of the chats have thinking on (make_data's convention).

Run directly to print a few samples and time the generator (no tokenizer needed):
    python3 tools/tiny_next/fresh.py --data tools/tiny_next/data
"""

from __future__ import annotations

import json
import os
import random
import re
import string
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
import make_data  # noqa: E402

PUNCT_AFTER = [",", ".", ";", ":", "!", "?"]
_WIN_RE = {}


def _win_re(k):
    r = _WIN_RE.get(k)
    if r is None:
        r = _WIN_RE[k] = re.compile(r"\S+(?: +\S+){%d}" % (k - 1))
    return r


class CopyContent:
    """Passages to copy that a model cannot have memorised."""

    def __init__(self, texts, rng):
        self.rng = rng
        self.texts = [t for t in texts if len(t) >= 40]
        self.weights = np.cumsum([len(t) for t in self.texts], dtype=np.float64)
        tokens = []
        for t in self.texts:
            tokens += t.split()
        self.tokens = tokens                                   # frequency-weighted word forms
        self.forms = sorted(set(tokens))                       # every word form once
        caps = sorted({w for w in self.forms if w[:1].isupper() and w.isalpha() and len(w) >= 3})
        self.names = make_data.NAMES + caps

    def _text(self):
        x = self.rng.random() * self.weights[-1]
        return self.texts[int(np.searchsorted(self.weights, x, side="right"))]

    def window(self, k):
        """k consecutive words of the training prose, as the raw substring (spacing kept)."""
        r = self.rng
        for _ in range(50):
            t = self._text()
            pos = r.randrange(len(t))
            sp = t.find(" ", pos)
            start = 0 if pos == 0 else (sp + 1 if sp >= 0 else -1)
            if start < 0:
                continue
            m = _win_re(k).match(t, start)
            if m:
                return m.group(0)
        return self.words(k)

    def words(self, k):
        r = self.rng
        uni = r.random() < 0.5
        ws = [r.choice(self.forms) if (uni or r.random() < 0.3) else r.choice(self.tokens) for _ in range(k)]
        if r.random() < 0.4:
            ws[0] = ws[0][:1].upper() + ws[0][1:]
            if ws[-1][-1:] not in ".!?":
                ws[-1] += "."
        return " ".join(ws)

    def code(self):
        r = self.rng
        k = r.random()
        if k < 0.22:
            n = r.randint(1, 7)
            s = str(r.randint(0 if n == 1 else 10 ** (n - 1), 10 ** n - 1))
            if r.random() < 0.15:
                s += "." + str(r.randint(0, 99))
            return s
        if k < 0.45:
            alpha = r.choice([string.ascii_letters, string.ascii_letters + string.digits, string.ascii_lowercase,
                              string.ascii_uppercase + string.digits])
            return "".join(r.choice(alpha) for _ in range(r.randint(2, 10)))
        if k < 0.6:
            return r.choice(self.names)
        if k < 0.72:
            w = r.choice(self.forms)
            return w + r.choice(PUNCT_AFTER)
        if k < 0.82:
            a = "".join(r.choice(string.ascii_letters) for _ in range(r.randint(1, 4)))
            return a + r.choice("-_/.#") + str(r.randint(0, 999))
        if k < 0.9:
            return r.choice(["(", "\"", "'", "["]) + r.choice(self.forms) + r.choice([")", "\"", "'", "]"])
        return r.choice(self.tokens)

    def codes(self, k):
        return " ".join(self.code() for _ in range(k))

    def mixed(self, k):
        r = self.rng
        out = []
        while len(out) < k:
            x = r.random()
            if x < 0.4:
                n = min(k - len(out), r.randint(2, 8))
                out += self.window(n).split(" ")[:n] if r.random() < 0.5 else self.words(n).split(" ")
            else:
                out.append(self.code())
        return " ".join(out[:k])

    def n_words(self, lo=5, hi=60):
        r = self.rng
        return r.randint(lo, 40) if r.random() < 0.7 else r.randint(lo, hi)

    def passage(self, lo=5, hi=60):
        k = self.n_words(lo, hi)
        x = self.rng.random()
        if x < 0.35:
            return self.window(k)
        if x < 0.65:
            return self.words(k)
        k = min(k, 40)      # codes are many tokens per word
        if x < 0.85:
            return self.codes(k)
        return self.mixed(k)


class FreshGen:
    """Chats for one chunk: fresh copy chats, arithmetic, and everything make_data.Gen makes."""

    def __init__(self, rng, spec):
        self.rng = rng
        self.cc = CopyContent(spec["texts"], rng)
        self.gen = make_data.Gen(rng, spec["passages"], spec["docs_sents"], spec["words"],
                                 {tuple(x) for x in spec["banned"]})
        self.copy_share = spec.get("copy_share", 0.5)
        self.arith_share = spec.get("arith_share", 0.15)

    def copy(self):
        r, g = self.rng, self.gen
        x = r.random()
        t = g.think()
        if x < 0.1:
            p = self.cc.passage(1, 8) if r.random() < 0.5 else self.cc.passage(1, 8).split(" ")[0]
            p = " ".join(p.split(" ")[:r.randint(1, 8)])
            n = r.randint(2, 4)
            q = r.choice(["Repeat this phrase {n} times, one per line: {p}",
                          "Say \"{p}\" {n} times, each on its own line."]).format(n=n, p=p)
            return g.sys([{"role": "user", "content": q},
                          g.final("\n".join([p] * n), f"I need to write the phrase {n} times, one per line.", t)])
        p = self.cc.passage()
        if x < 0.2:   # two turns: copy, something else, then the first text again
            msgs = [{"role": "user", "content": r.choice(make_data.COPY_PROMPTS).format(p=p)},
                    {"role": "assistant", "content": p}]
            msgs += g._filler_turns(r.randint(0, 1))
            msgs += [{"role": "user", "content": r.choice(["What was the text I asked you to copy?",
                                                            "Copy that first text once more.",
                                                            "Repeat the first text again, exactly."])}]
            msgs.append(g.final(p, "The user refers to the text from the first turn.", t))
            return g.sys(msgs)
        q = r.choice(make_data.COPY_PROMPTS).format(p=p)
        return g.sys([{"role": "user", "content": q}, g.final(p, r.choice(make_data.COPY_REASONS), t)])

    def sample(self):
        x = self.rng.random()
        if x < self.copy_share:
            return self.copy(), None
        if x < self.copy_share + self.arith_share:
            return self.gen.arith()
        return self.gen.sample()


# ----------------------------------------------------------------------------------------------
# worker processes
# ----------------------------------------------------------------------------------------------

_W = {}


def build_spec(prose_docs, banned, seed, row_len, rows_per_chunk, copy_share=0.5, arith_share=0.15):
    """Everything a worker needs (picklable): training prose only; `banned` = held-out arithmetic."""
    passages = [ln for d in prose_docs for ln in d.split("\n") if len(ln.split()) >= 3]
    docs_sents = []
    for d in prose_docs:
        for para in d.split("\n"):
            s = [x for x in re.split(r"(?<=[.!?])\s+(?=[A-Z\"'(])", para.strip()) if x]
            if len(s) >= 2:
                docs_sents.append(s)
    freq = {}
    for d in prose_docs:
        for w in re.findall(r"[A-Za-z]+", d):
            if w.islower() and 3 <= len(w) <= 9:
                freq[w] = freq.get(w, 0) + 1
    words = sorted(w for w, c in freq.items() if c >= 20)
    return {"texts": list(prose_docs), "passages": passages, "docs_sents": docs_sents, "words": words,
            "banned": [list(x) for x in banned], "seed": seed, "row_len": row_len,
            "rows_per_chunk": rows_per_chunk, "copy_share": copy_share, "arith_share": arith_share}


def save_worker_args(path, tok_json, spec):
    """The workers' arguments go through a file: a spawn start blocks the parent while a child imports
    the main module if the arguments do not fit the pipe, which serialises the start of the pool."""
    import pickle
    with open(path, "wb") as f:
        pickle.dump((tok_json, spec), f, protocol=pickle.HIGHEST_PROTOCOL)
    return path


def init_worker(path):
    import pickle
    with open(path, "rb") as f:
        tok_json, spec = pickle.load(f)
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        os.nice(5)
    except OSError:
        pass
    from tokenizers import Tokenizer
    _W["tok"] = Tokenizer.from_str(tok_json)
    _W["spec"] = spec
    _W["eot"] = _W["tok"].token_to_id("<|endoftext|>")
    _W["gen"] = FreshGen(random.Random(0), spec)      # the big pools, built once per worker


def chunk_texts(gen, n):
    out = []
    for _ in range(n):
        msgs, tools = gen.sample()
        out.append(make_data.render_chat(msgs, tools=tools))
    return out


def make_chunk(i):
    """Chunk i: int32 [rows_per_chunk, row_len] of packed chats (deterministic in (seed, i))."""
    spec, tok, eot, gen = _W["spec"], _W["tok"], _W["eot"], _W["gen"]
    rng = random.Random(spec["seed"] * 1000003 + i)
    gen.rng = gen.gen.rng = gen.cc.rng = rng
    R, L2 = spec["rows_per_chunk"], spec["row_len"]
    out = np.full((R, L2), eot, dtype=np.int32)
    row, fill = 0, 0
    n_chats = n_tok = 0
    while row < R:
        encs = tok.encode_batch(chunk_texts(gen, 256), add_special_tokens=False)
        for e in encs:
            ids = e.ids
            if len(ids) + 1 > L2 and fill == 0:
                continue
            k = min(len(ids), L2 - fill)
            out[row, fill:fill + k] = ids[:k]
            fill += k
            if fill < L2:
                fill += 1                   # <|endoftext|> (already there)
            n_chats += 1
            n_tok += k
            if fill >= L2:
                row, fill = row + 1, 0
                if row == R:
                    break
    return i, out


# ----------------------------------------------------------------------------------------------

def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(HERE, "data"))
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--time", type=int, default=3000)
    args = ap.parse_args()
    prose = make_data_read(os.path.join(args.data, "prose.jsonl"))
    with open(os.path.join(args.data, "heldout.json")) as f:
        held = json.load(f)
    t0 = time.time()
    spec = build_spec(prose, [tuple(x) for x in held["arith"]], 1, 514, 16)
    g = FreshGen(random.Random(3), spec)
    print(f"spec + pools {time.time() - t0:.1f}s: {len(g.cc.forms)} word forms, {len(g.cc.tokens)} tokens, "
          f"{len(spec['passages'])} passages, {len(spec['docs_sents'])} sentence groups")
    for _ in range(args.n):
        print("-" * 60)
        print(g.copy() if g.rng.random() < 0.8 else g.sample()[0])
    t0 = time.time()
    texts = chunk_texts(g, args.time)
    dt = time.time() - t0
    chars = sum(len(t) for t in texts)
    print(f"{args.time} chats in {dt:.2f}s ({chars / dt / 1e6:.2f} MB/s, ~{chars / 3.4 / dt:,.0f} tokens/s)")
    held_set = set(held["copy_passages"])
    n_hit = sum(any(p in t for p in held_set) for t in texts[:500])
    print(f"held-out copy passages found in 500 generated chats: {n_hit}")


def make_data_read(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


if __name__ == "__main__":
    main()
