#!/usr/bin/env python3
"""train_mtp.py - second stage for models/tiny-next: train ONLY the MTP head (mtp.*), main model frozen.

The main model (every tensor but mtp.*) is loaded from the shipped checkpoint and never changes, so its
logits, the golden tests and the copy / arithmetic evaluation stay exactly as they are. The MTP head starts
from the shipped mtp.* and is distilled towards the frozen main model: at position t it gets the main
model's final normed hidden state h[t] and the token x[t+1] and is trained to predict the main model's
distribution at t+1 (soft cross-entropy; optionally plus cross-entropy on the main model's argmax), which
is what MTP agreement (the acceptance rate of a one-token greedy draft) measures.

Data: windows of 512 tokens of prose.jsonl and of chats.jsonl (make_data.py's corpus), minus the same 1%
of documents that train.py kept apart for validation (seed + 9); the main model's hidden states of every
window are computed once (fp32) and kept on the GPU, so a training step runs only the MTP head and the
frozen lm_head. Several variants (learning rate, hard-target weight) train side by side on the same
batches; each keeps its best state by MTP agreement on the validation documents (first 256 tokens of each,
teacher-forced), and the variant with the best validation agreement is written out. Nothing held out
(heldout.json) is used to choose.

Evaluation: exactly train.py's definitions (mtp_agreement) and held-out material, on the stock transformers
model (fp32, eager) and the bf16-rounded head: copy answers (prompt + transformers' greedy answer, the `hf`
tokens of tools/tiny_next/eval_cases.json, i.e. the shipped eval's outputs), held-out prose teacher-forced
(heldout.json's 125 prose docs, first 256 tokens), the model's own greedy continuation of held-out prose.
The main model's hidden states and argmaxes of these sequences are computed once and reused for the head
before and after training.

Output under --out: mtp.safetensors (bf16, only the mtp.* tensors of the chosen variant), mtp_<name>
.safetensors for the others, mtp_ft.json (metrics before/after, curves, timings), train_mtp.log. Merge into
the checkpoint with tools/tiny_next/merge_mtp.py (every other tensor stays byte-identical).

Usage (device):   bash tools/tiny_next/device_run_mtp.sh     (calls this)
                  python3 tools/tiny_next/train_mtp.py --model models/tiny-next --data DIR --out $OUT
CPU smoke test:   python3 tools/tiny_next/train_mtp.py --fake --out /tmp/x   (stand-in tokenizer and main
                  model, tiny data: exercises every code path but transformers / tokenizers)
"""

from __future__ import annotations

import argparse
import copy
import datetime
import gzip
import json
import math
import os
import random
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

if not hasattr(F, "scaled_dot_product_attention"):      # old torch (CPU smoke test only)
    def _sdpa(q, k, v, is_causal=False, scale=None):
        s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
        if is_causal:
            T = q.shape[-2]
            s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=q.device).tril(), float("-inf"))
        return torch.softmax(s.float(), -1).to(q.dtype) @ v
    F.scaled_dot_product_attention = _sdpa

import make_data  # noqa: E402
import train as T  # noqa: E402  (MTP, mtp_agreement, greedy_batch, load_reference_model, ...)

LOG_FH = None
T0 = time.time()


def log(*a):
    line = f"[{time.time() - T0:7.1f}s] " + " ".join(str(x) for x in a)
    print(line, flush=True)
    if LOG_FH:
        LOG_FH.write(line + "\n")
        LOG_FH.flush()


# ----------------------------------------------------------------------------------------------
# safetensors (the format is a u64 header length, a JSON header, raw little-endian bytes): own reader
# and writer so the same code runs without the safetensors package
# ----------------------------------------------------------------------------------------------

ST_DTYPES = {"BF16": (torch.bfloat16, 2), "F32": (torch.float32, 4), "F16": (torch.float16, 2)}


def st_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n


def st_read(path, prefix=""):
    hdr, base = st_header(path)
    out = {}
    with open(path, "rb") as f:
        for k, v in hdr.items():
            if k == "__metadata__" or not k.startswith(prefix):
                continue
            a, b = v["data_offsets"]
            f.seek(base + a)
            dt, _ = ST_DTYPES[v["dtype"]]
            raw = bytearray(f.read(b - a))
            if dt == torch.bfloat16:
                t = torch.frombuffer(raw, dtype=torch.int16).view(torch.bfloat16)
            else:
                t = torch.frombuffer(raw, dtype=dt)
            out[k] = t.reshape(v["shape"]).clone()
    return out


def st_write(path, tensors, metadata=None):
    """tensors: name -> bf16 tensor; sorted names, header padded with spaces to 8 bytes."""
    hdr, blobs, off = {}, [], 0
    if metadata:
        hdr["__metadata__"] = metadata
    for k in sorted(tensors):
        t = tensors[k].detach().to("cpu", torch.bfloat16).contiguous()
        b = t.view(torch.int16).numpy().astype("<i2").tobytes()
        hdr[k] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def mtp_state_bf16(mtp):
    return {"mtp." + k: v.detach().to(torch.bfloat16).cpu() for k, v in mtp.state_dict().items()}


def load_mtp_from(path, c, dev):
    sd = {k[4:]: v.float() for k, v in st_read(path, "mtp.").items()}
    m = T.MTP(c)
    m.load_state_dict(sd, strict=True)
    return m.to(dev).eval()


# ----------------------------------------------------------------------------------------------
# stand-ins for the CPU smoke test (--fake)
# ----------------------------------------------------------------------------------------------

class FakeEnc:
    def __init__(self, ids):
        self.ids = ids


class FakeTok:
    """Characters -> ids (mod 6000); the special tokens of the real tokenizer at 6128.."""
    SPECIALS = T.SPECIAL + T.ADDED

    def token_to_id(self, s):
        return 6128 + self.SPECIALS.index(s)

    def encode(self, text, add_special_tokens=True):
        ids, i = [], 0
        while i < len(text):
            for j, s in enumerate(self.SPECIALS):
                if text.startswith(s, i):
                    ids.append(6128 + j)
                    i += len(s)
                    break
            else:
                ids.append(ord(text[i]) % 6000)
                i += 1
        return FakeEnc(ids)

    def encode_batch(self, texts, add_special_tokens=True):
        return [self.encode(t) for t in texts]


class FakeRotary(nn.Module):
    def __init__(self, rot=16, theta=10000.0):
        super().__init__()
        self.inv = 1.0 / theta ** (torch.arange(0, rot, 2).float() / rot)

    def forward(self, x, pos):
        f = pos[..., None].float() * self.inv.to(x.device)
        emb = torch.cat((f, f), -1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class FakeOut:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class FakeInner(nn.Module):
    def __init__(self, V, H):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, H)
        self.mix = nn.Linear(H, H)
        self.rotary_emb = FakeRotary()

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        e = self.embed_tokens(input_ids)
        csum = e.cumsum(1) / torch.arange(1, e.shape[1] + 1, device=e.device)[None, :, None]
        return FakeOut(last_hidden_state=torch.tanh(self.mix(csum) + e))


class FakeModel(nn.Module):
    def __init__(self, V, H):
        super().__init__()
        self.model = FakeInner(V, H)
        self.lm_head = nn.Linear(H, V, bias=False)

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        return FakeOut(logits=self.lm_head(self.model(input_ids).last_hidden_state))


# ----------------------------------------------------------------------------------------------
# evaluation with cached main-model results (same maths as train.mtp_agreement)
# ----------------------------------------------------------------------------------------------

@torch.no_grad()
def cache_entry(model, seq, start, dev):
    H, logits = T.hidden_and_logits(model, seq, dev)
    Tn = len(seq)
    return {"H": H[:, :Tn - 1].contiguous(), "x": torch.tensor([seq], dtype=torch.long, device=dev),
            "target": logits.argmax(-1)[0][1:Tn], "start": start, "T": Tn}


@torch.no_grad()
def agreement(model, mtp, entries):
    """sum over entries of train.mtp_agreement(model, mtp, seq, start) from the cached H / targets."""
    a = n = 0
    for en in entries:
        Tn, H = en["T"], en["H"]
        pos = torch.arange(Tn - 1, device=H.device)[None]
        cos, sin = model.model.rotary_emb(H, pos)
        e = model.model.embed_tokens(en["x"][:, 1:Tn])
        pred = model.lm_head(mtp(H, e, cos, sin)).argmax(-1)[0]
        sl = slice(en["start"], Tn - 2)
        p, t_ = pred[sl], en["target"][sl]
        a += int((p == t_).sum())
        n += int(p.numel())
    return a, n


def eval_all(model, mtp, sets):
    was = mtp.training
    mtp.eval()
    out = {}
    for name, entries in sets.items():
        a, n = agreement(model, mtp, entries)
        out[name] = a / max(1, n)
        out[name + "_positions"] = n
    mtp.train(was)
    return out


def bf16_copy(mtp):
    m = copy.deepcopy(mtp)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return m.eval()


# ----------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------

def read_jsonl(path):
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def windows(tok, docs, eot, seed, L):
    s = T.build_stream(tok, docs, eot, seed)
    n = len(s) // L
    return torch.from_numpy(s[:n * L].astype(np.int64)).view(n, L), len(s)


def balance_loss(probs, idx, E):
    p = probs.float().reshape(-1, E)
    f = torch.zeros(E, device=p.device).scatter_add(0, idx.reshape(-1), torch.ones(idx.numel(), device=p.device))
    return E * ((f / idx.numel()) * p.mean(0)).sum()


def parse_variants(s):
    """'a:lr=1e-3,hard=0;b:lr=3e-4' -> [{'name': 'a', 'lr': 1e-3, 'hard': 0.0}, ...]"""
    out = []
    for part in s.split(";"):
        name, _, kv = part.partition(":")
        v = {"name": name.strip(), "lr": 1e-3, "hard": 0.0}
        for item in filter(None, kv.split(",")):
            k, _, val = item.partition("=")
            v[k.strip()] = float(val)
        out.append(v)
    return out


# ----------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------

def main():
    global LOG_FH
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(HERE, "..", "..", "models", "tiny-next"))
    ap.add_argument("--data", default=os.path.join(HERE, "data"), help="prose.jsonl(.gz), chats.jsonl(.gz), heldout.json")
    ap.add_argument("--eval-cases", default=os.path.join(HERE, "eval_cases.json"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234, help="train.py's seed (its validation split: seed + 9)")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=4000, help="schedule length (cosine to 10%% after warm-up)")
    ap.add_argument("--time-budget", type=float, default=140.0,
                    help="training seconds; the schedule runs on max(step / steps, elapsed / budget)")
    ap.add_argument("--deadline", type=float, default=0.0,
                    help="if > 0: seconds since start by which training must have stopped (leaves time to write)")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--aux-weight", type=float, default=0.001)
    ap.add_argument("--prose-frac", type=float, default=0.6, help="share of each batch's rows from prose windows")
    ap.add_argument("--variants", default="a:lr=1e-3,hard=0;b:lr=3e-4,hard=0;c:lr=1e-3,hard=0.5")
    ap.add_argument("--val-every", type=int, default=400)
    ap.add_argument("--fake", action="store_true", help="CPU smoke test with stand-ins for the tokenizer and model")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    LOG_FH = open(os.path.join(args.out, "train_mtp.log"), "w")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    versions = {"torch": torch.__version__, "python": sys.version.split()[0]}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    c = dict(T.MODEL_CFG)
    V, Hd, L = c["vocab_size"], c["hidden_size"], args.seq
    variants = parse_variants(args.variants)
    report = {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
              "args": vars(args), "variants": variants}

    def dump():
        with open(os.path.join(args.out, "mtp_ft.json"), "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")

    # ---------------- tokenizer, main model (frozen), shipped MTP head
    if args.fake:
        tok = FakeTok()
        torch.manual_seed(0)
        model = FakeModel(V, Hd).to(dev).eval()
        mtp0 = T.MTP(c)
        T.init_mtp(mtp0, 0.02, 5)
        fake_ckpt = os.path.join(args.out, "fake_model.safetensors")
        st_write(fake_ckpt, {**{k: v for k, v in model.state_dict().items()}, **mtp_state_bf16(mtp0)})
        mtp0 = load_mtp_from(fake_ckpt, c, dev)
        gpu = "cpu (fake)"
    else:
        import transformers
        from tokenizers import Tokenizer
        versions["transformers"] = transformers.__version__
        tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
        T.log = log
        model, info = T.load_reference_model(args.model)         # stock transformers, fp32, eager
        model = model.to(dev)
        bad = [k for k in info.get("missing_keys", [])]
        log(f"main model loaded: missing {bad}, unexpected {len(info.get('unexpected_keys', []))} (mtp.*)")
        mtp0 = load_mtp_from(os.path.join(args.model, "model.safetensors"), c, dev)
        gpu = torch.cuda.get_device_name(0) if dev == "cuda" else "cpu"
    for p in model.parameters():
        p.requires_grad_(False)
    report.update({"device": gpu, "versions": versions})
    log(f"device {gpu}, versions {versions}, variants {variants}")
    eot, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    stops = [im_end, eot]

    # ---------------- data
    prose = read_jsonl(os.path.join(args.data, "prose.jsonl"))
    chats = read_jsonl(os.path.join(args.data, "chats.jsonl"))
    with open(os.path.join(args.data, "heldout.json")) as f:
        held = json.load(f)
    with open(args.eval_cases) as f:
        cases = json.load(f)
    r = random.Random(args.seed + 9)           # train.py's validation split, same draws
    val_idx_p = set(r.sample(range(len(prose)), max(1, len(prose) // 100)))
    val_idx_c = set(r.sample(range(len(chats)), max(1, len(chats) // 100)))
    if args.fake:
        prose = prose[:100]
        chats = chats[:100]
        val_idx_p = {i for i in val_idx_p if i < 100} or {0}
        val_idx_c = {i for i in val_idx_c if i < 100}
        held = {"prose_docs": held["prose_docs"][:3], "copy_passages": held["copy_passages"][:3]}
        cases = {"copy": cases["copy"][:3]}
        val_idx_p = set(sorted(val_idx_p)[:3])
    tr_prose = [d for i, d in enumerate(prose) if i not in val_idx_p]
    tr_chats = [d for i, d in enumerate(chats) if i not in val_idx_c]
    val_prose = [prose[i] for i in sorted(val_idx_p)]
    t0 = time.time()
    wp, np_tok = windows(tok, tr_prose, eot, args.seed, L)
    wc, nc_tok = windows(tok, tr_chats, eot, args.seed + 1, L)
    log(f"data: {len(tr_prose)} prose docs ({np_tok:,} tokens, {wp.shape[0]} windows), {len(tr_chats)} chats "
        f"({nc_tok:,} tokens, {wc.shape[0]} windows), {len(val_prose)} validation prose docs; {time.time() - t0:.1f}s")
    report["data"] = {"prose_docs": len(tr_prose), "prose_tokens": np_tok, "prose_windows": int(wp.shape[0]),
                      "chats": len(tr_chats), "chat_tokens": nc_tok, "chat_windows": int(wc.shape[0]),
                      "val_prose_docs": len(val_prose), "seq": L}

    # ---------------- evaluation sets: main model's hidden states / argmax computed once (stock model)
    t0 = time.time()
    sets = {"mtp_copy_agreement": [], "mtp_prose_teacher_forced_agreement": [],
            "mtp_prose_generated_agreement": [], "val_prose_teacher_forced_agreement": []}
    n_copy_same = 0
    for cs, p in zip(cases["copy"], held["copy_passages"]):
        assert cs["text"] == p, "eval_cases.json and heldout.json disagree"
        pr = tok.encode(make_data.render_chat([{"role": "user", "content": f"Copy this text exactly:\n\n{p}"}],
                                              add_generation_prompt=True, enable_thinking=False)).ids
        o = cs["hf"]
        if len(o) >= 3:
            sets["mtp_copy_agreement"].append(cache_entry(model, pr + o, len(pr) - 1, dev))
    docs = held["prose_docs"][:125]
    for d in docs:
        ids = tok.encode(d).ids[:256]
        if len(ids) >= 8:
            sets["mtp_prose_teacher_forced_agreement"].append(cache_entry(model, ids, 0, dev))
    for d in val_prose:
        ids = tok.encode(d).ids[:256]
        if len(ids) >= 8:
            sets["val_prose_teacher_forced_agreement"].append(cache_entry(model, ids, 0, dev))
    cont_prompts = []
    for d in docs:
        words = d.split()
        if len(words) >= 20:
            cont_prompts.append(tok.encode(make_data.render_chat(
                [{"role": "user", "content": "Continue this text:\n\n" + " ".join(words[:40])}],
                add_generation_prompt=True, enable_thinking=False)).ids)
    outs = T.greedy_batch(model, cont_prompts, 8 if args.fake else 64, stops, eot, dev)
    for pr, o in zip(cont_prompts, outs):
        if len(o) >= 3:
            sets["mtp_prose_generated_agreement"].append(cache_entry(model, pr + o, len(pr) - 1, dev))
    log(f"eval sets cached in {time.time() - t0:.1f}s: " + ", ".join(f"{k} {len(v)}" for k, v in sets.items()))
    before = eval_all(model, mtp0, sets)
    report["before"] = before
    log(f"before (shipped head): {before}")
    dump()

    # ---------------- hidden states of the training windows (frozen main model, fp32)
    t0 = time.time()
    restore = None
    if not args.fake:
        gchk = T.check_fast_gdn(dev)
        log(f"fast GDN check: {gchk}")
        _, _, restore = T.patch_for_training(model, gchk["ok"], False)
    allw = torch.cat([wp, wc])
    Hs = torch.empty(allw.shape[0], L, Hd, dtype=torch.float32, device=dev)
    allw = allw.to(dev)
    pb = 128
    with torch.no_grad():
        for s in range(0, allw.shape[0], pb):
            Hs[s:s + pb] = model.model(input_ids=allw[s:s + pb], use_cache=False).last_hidden_state.float()
    if restore is not None:
        restore()
    if dev == "cuda":
        torch.cuda.synchronize()
    n_p = wp.shape[0]
    log(f"hidden states of {allw.shape[0]} windows ({allw.numel():,} tokens) in {time.time() - t0:.1f}s; "
        f"{Hs.numel() * 4 / 2 ** 30:.2f} GiB")
    report["precompute_seconds"] = time.time() - t0

    # ---------------- train the variants side by side
    pos = torch.arange(L - 1, device=dev)[None]
    cos, sin = model.model.rotary_emb(Hs[:1, :L - 1], pos)
    E = c["num_experts"]
    runs = []
    for v in variants:
        m = copy.deepcopy(mtp0).train()
        for p in m.parameters():
            p.requires_grad_(True)
        decay = [p for p in m.parameters() if p.dim() >= 2]
        nodecay = [p for p in m.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                 {"params": nodecay, "weight_decay": 0.0}], lr=v["lr"], betas=(0.9, 0.95),
                                eps=1e-8, **({"fused": True} if dev == "cuda" else {}))
        runs.append({"v": v, "mtp": m, "opt": opt, "best": None, "best_val": before["val_prose_teacher_forced_agreement"],
                     "best_step": 0, "curve": []})

    def lr_frac(step, el):
        if step < args.warmup:
            return (step + 1) / args.warmup
        pr = min(1.0, max((step - args.warmup) / max(1, args.steps - args.warmup), el / args.time_budget))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * pr))

    gen = torch.Generator(device="cpu").manual_seed(args.seed + 77)
    n_pr = int(round(args.batch * args.prose_frac))
    import contextlib

    def autocast():
        return (torch.autocast(device_type="cuda", dtype=torch.bfloat16) if dev == "cuda"
                else contextlib.nullcontext())
    t_train = time.time()
    step = 0
    stop_reason = "steps"

    def validate(step_):
        for rn in runs:
            va = eval_all(model, rn["mtp"], {"val": sets["val_prose_teacher_forced_agreement"]})
            rec = {"step": step_, "val_prose": round(va["val"], 4), **rn.get("last", {})}
            rn["curve"].append(rec)
            if va["val"] > rn["best_val"]:
                rn["best_val"], rn["best_step"] = va["val"], step_
                rn["best"] = copy.deepcopy(rn["mtp"].state_dict())
        log(f"step {step_} ({time.time() - t_train:.0f}s): " + "; ".join(
            f"{rn['v']['name']} val {rn['curve'][-1]['val_prose']:.4f} loss {rn.get('last', {}).get('loss', 0):.4f} "
            f"distill {rn.get('last', {}).get('distill', 0):.4f}" for rn in runs))

    while step < args.steps:
        el = time.time() - t_train
        if el > args.time_budget:
            stop_reason = "time budget"
            break
        if args.deadline > 0 and time.time() - T0 > args.deadline:
            stop_reason = "deadline"
            break
        ip = torch.randint(0, n_p, (n_pr,), generator=gen)
        ic = n_p + torch.randint(0, allw.shape[0] - n_p, (args.batch - n_pr,), generator=gen)
        idx = torch.cat([ip, ic]).to(dev)
        Hb, xb = Hs[idx], allw[idx]
        with torch.no_grad():
            teach = model.lm_head(Hb[:, 1:]).float()                 # main model's logits at t+1, fp32
            soft = F.softmax(teach, -1)
            hard = teach.argmax(-1)
            e = model.model.embed_tokens(xb[:, 1:])
        fr = lr_frac(step, el)
        for rn in runs:
            for g in rn["opt"].param_groups:
                g["lr"] = rn["v"]["lr"] * fr
            with autocast():
                mh = rn["mtp"](Hb[:, :L - 1], e, cos, sin)
                mlog = model.lm_head(mh).float()
                lsm = F.log_softmax(mlog, -1)
                distill = -(soft * lsm).sum(-1).mean()
                hce = F.nll_loss(lsm.reshape(-1, V), hard.reshape(-1))
                aux = balance_loss(*rn["mtp"].layers[0].mlp.last, E)
                loss = distill + rn["v"]["hard"] * hce + args.aux_weight * aux
            rn["opt"].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(rn["mtp"].parameters(), 1.0)
            rn["opt"].step()
            if (step + 1) % 50 == 0 or step == 0:
                rn["last"] = {"loss": round(float(loss), 4), "distill": round(float(distill), 4),
                              "hard_ce": round(float(hce), 4), "lr": rn["v"]["lr"] * fr}
        step += 1
        if step % args.val_every == 0:
            validate(step)
            report["runs_progress"] = [{"name": rn["v"]["name"], "curve": rn["curve"]} for rn in runs]
            dump()
    train_s = time.time() - t_train
    if step % args.val_every != 0:
        validate(step)
    log(f"training stopped ({stop_reason}) after {step} steps, {train_s:.1f}s, "
        f"{step * args.batch * (L - 1) / max(train_s, 1e-9):,.0f} positions/s per {len(runs)} variants")

    # ---------------- final: best state of each variant by validation, bf16-rounded, full evaluation
    results = []
    for rn in runs:
        m = copy.deepcopy(rn["mtp"])
        if rn["best"] is not None:
            m.load_state_dict(rn["best"])
        mb = bf16_copy(m)
        ev = eval_all(model, mb, sets)
        res = {"name": rn["v"]["name"], "variant": rn["v"], "best_step": rn["best_step"],
               "improved_on_val": rn["best"] is not None, "after": ev, "curve": rn["curve"]}
        results.append(res)
        st_write(os.path.join(args.out, f"mtp_{rn['v']['name']}.safetensors"), mtp_state_bf16(mb), {"format": "pt"})
        log(f"variant {rn['v']}: best step {rn['best_step']}, after {ev}")
    ok = [r_ for r_ in results if r_["improved_on_val"] and r_["after"]["mtp_copy_agreement"] >= 0.80]
    chosen = max(ok, key=lambda r_: r_["after"]["val_prose_teacher_forced_agreement"]) if ok else None
    if chosen is not None:
        os.replace(os.path.join(args.out, f"mtp_{chosen['name']}.safetensors"), os.path.join(args.out, "mtp.safetensors"))
    report.update({"results": results, "chosen": chosen["name"] if chosen else None, "steps": step,
                   "train_seconds": train_s, "stop_reason": stop_reason,
                   "tokens_per_variant": step * args.batch * (L - 1), "total_seconds": time.time() - T0})
    report.pop("runs_progress", None)
    try:                                     # the written files, read back by the safetensors package
        from safetensors.torch import load_file
        for r_ in results:
            fn = "mtp.safetensors" if r_["name"] == report["chosen"] else f"mtp_{r_['name']}.safetensors"
            a_, b_ = load_file(os.path.join(args.out, fn)), st_read(os.path.join(args.out, fn))
            assert a_.keys() == b_.keys() and all(torch.equal(a_[k].view(torch.int16), b_[k].view(torch.int16))
                                                  for k in a_)
        report["safetensors_readback"] = "ok"
    except ImportError:
        report["safetensors_readback"] = "safetensors package not installed"
    except Exception as e_:  # noqa: BLE001
        report["safetensors_readback"] = repr(e_)
    log(f"safetensors read-back: {report['safetensors_readback']}")
    dump()
    log(f"chosen: {report['chosen']}; total {time.time() - T0:.1f}s")


if __name__ == "__main__":
    main()
