#!/usr/bin/env python3
"""train.py - train tiny-next: tokenizer + qwen3_next model + MTP head, evaluate, write the model dir.

Runs on the accelerator machine (PyTorch, transformers with qwen3_next, tokenizers, safetensors;
no network). Input: the corpus written by make_data.py (tools/tiny_next/data/). Output under --out:

  model/            config.json, model.safetensors (bf16, one tensor per expert, mtp.* included),
                    tokenizer.json, tokenizer_config.json (with the chat template), generation_config.json
  eval.json         evaluation (held-out): copy exact match, arithmetic with thinking on/off,
                    MTP top-1 agreement, loss curve, timings, load check, tokenizer check
  reference.json    transformers' greedy tokens (CPU, fp32, eager) for a few chat prompts, to compare
                    with the TensorFold engine
  train.log         the log

What is trained
  1. Byte-level BPE (HF tokenizers) with the Qwen pre-tokenizer (NFC; Split(regex, isolated);
     ByteLevel(add_prefix_space=False, use_regex=False); ByteLevel decoder); special tokens
     <|endoftext|> <|im_start|> <|im_end|> and added (non-special) <think> </think> <tool_call>
     </tool_call> <tool_response> </tool_response>, after the BPE ids.
  2. transformers' Qwen3NextForCausalLM (Gated DeltaNet + gated attention, MoE + shared expert),
     built from transformers' own Qwen3NextConfig.
  3. An MTP layer written here (qwen3-next.md section 6.1): concat(rmsnorm_zc(embed(x_{t+1})),
     rmsnorm_zc(h_t)) -> fc -> one gated full-attention + MoE decoder layer -> norm -> shared lm_head,
     predicting x_{t+2}; trained jointly (CE on x_{t+2} plus soft CE towards the main model's own
     distribution at t+1).
  Data: each batch of 128 rows x 512 tokens takes 1 - --fresh-frac of its rows as random windows of the
  static stream (prose.jsonl + chats.jsonl; every token weighs 1) and --fresh-frac as rows of fresh
  synthetic chats that worker processes generate while the GPU trains (fresh.py: copy chats whose text
  cannot be memorised, arithmetic, every other task; chunk i seeded by (seed, i), consumed in order, so
  runs are reproducible). In fresh rows only assistant tokens weigh 1 (the user's random text is not
  learnable and would only teach its own unigram distribution).
  Training speed-ups, used only while training and checked against transformers at start-up:
  the Gated DeltaNet chunk kernel with the intra-chunk triangular inverse done by one
  solve_triangular (instead of a 63-step Python loop), and a dense (all-experts, zero weights for
  unrouted ones) expert mix instead of the per-expert gather loop. Evaluation and the references
  use the stock transformers code on the reloaded bf16 checkpoint.

Usage (device):  bash tools/tiny_next/device_run.sh --steps 2650 --batch 128 --time-budget 430 ...  (calls this)
                 python3 tools/tiny_next/train.py --out $OUT --steps 3000
Smoke test:      python3 tools/tiny_next/train.py --out $OUT --smoke
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import random
import re
import sys
import time
import types

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_data  # noqa: E402  (render_chat, arithmetic helpers: pure Python)

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
QWEN_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")

LOG_FH = None
T_START = time.time()


def log(*a):
    s = " ".join(str(x) for x in a)
    line = f"[{time.time() - T_START:7.1f}s] {s}"
    print(line, flush=True)
    if LOG_FH:
        LOG_FH.write(line + "\n")
        LOG_FH.flush()


# ----------------------------------------------------------------------------------------------
# configuration
# ----------------------------------------------------------------------------------------------

MODEL_CFG = dict(
    vocab_size=6144, hidden_size=320, intermediate_size=640, num_hidden_layers=6,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128, shared_expert_intermediate_size=256,
    norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
    rms_norm_eps=1e-6, tie_word_embeddings=False, hidden_act="silu", max_position_embeddings=4096,
    attention_bias=False, attention_dropout=0.0, initializer_range=0.02,
    router_aux_loss_coef=0.001, output_router_logits=False, use_cache=True,
)
FULL_ATTENTION_INTERVAL = 2     # layers: GDN, attn, GDN, attn, GDN, attn (3 + 3): attention for copying
ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}


# ----------------------------------------------------------------------------------------------
# tokenizer
# ----------------------------------------------------------------------------------------------

def train_tokenizer(texts, vocab_total):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, \
        processors, trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    n_bpe = vocab_total - 16
    trainer = trainers.BpeTrainer(vocab_size=n_bpe, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])

    def it():
        for t in texts:
            for s in SPECIAL + ADDED:
                t = t.replace(s, "\n")
            yield t

    tok.train_from_iterator(it(), trainer=trainer, length=len(texts))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL])
    tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in ADDED])
    return tok


def write_tokenizer_files(tok, outdir, tokenizer_class):
    tok.save(os.path.join(outdir, "tokenizer.json"))
    with open(os.path.join(HERE, "chat_template.jinja")) as f:
        template = f.read()
    dec = {}
    for s in SPECIAL + ADDED:
        dec[str(tok.token_to_id(s))] = {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                        "single_word": False, "special": s in SPECIAL}
    cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": dec,
        "bos_token": None,
        "chat_template": template,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 4096,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": tokenizer_class,
        "unk_token": None,
    }
    with open(os.path.join(outdir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")


def sample_chats_for_checks(seed, n=40):
    rng = random.Random(seed)
    g = make_data.Gen(rng, ["The cat sat on the mat.", "Copy me now please, friend.", "A B C."],
                      [["One.", "Two.", "Three."]], ["apple", "river", "stone", "cloud", "green", "table",
                                                     "music", "house", "lamp", "bird"], set())
    out = []
    for _ in range(n):
        out.append(g.sample())
    return out


def check_hf_tokenizer(outdir, tok):
    """AutoTokenizer must reproduce tokenizers' encoding and render the template like make_data."""
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(outdir)
    texts = ["Hello world!", "  multiple   spaces\n\nand lines\r\n", "Numbers 12345 and 3.14159",
             "<|im_start|>user\nWhat is 347 + 285?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
             "Ünïcödé café naïve — “quotes” 日本語", "don't I'll we're they've", "<tool_call>\n{\"a\": 1}\n</tool_call>"]
    enc_ok = all(hf.encode(t, add_special_tokens=False) == tok.encode(t, add_special_tokens=False).ids for t in texts)
    dec_ok = all(hf.decode(tok.encode(t).ids) == tok.decode(tok.encode(t).ids, skip_special_tokens=False)
                 for t in texts)
    tmpl_ok, n = True, 0
    for msgs, tools in sample_chats_for_checks(7):
        for agp, et in ((False, None), (True, True), (True, False)):
            ms = msgs[:-1] if agp else msgs
            kw = {"add_generation_prompt": agp}
            if et is not None:
                kw["enable_thinking"] = et
            if tools:
                kw["tools"] = tools
            a = hf.apply_chat_template(ms, tokenize=False, **kw)
            b = make_data.render_chat(ms, tools=tools, add_generation_prompt=agp, enable_thinking=et)
            n += 1
            if a != b:
                if tmpl_ok:
                    log("template mismatch:", repr(a[:300]), "VS", repr(b[:300]))
                tmpl_ok = False
    eos_ok = hf.eos_token_id == tok.token_to_id("<|im_end|>") and hf.pad_token_id == tok.token_to_id("<|endoftext|>")
    res = {"class": type(hf).__name__, "encode_matches": enc_ok, "decode_matches": dec_ok,
           "chat_template_matches_make_data": tmpl_ok, "template_renders": n, "eos_pad_ok": eos_ok}
    return res


# ----------------------------------------------------------------------------------------------
# MTP head (qwen3-next.md section 6.1), own PyTorch code; parameter names = on-disk mtp.* names
# ----------------------------------------------------------------------------------------------

class RMSNormZC(nn.Module):
    """Zero-centred RMSNorm: y = x / rms(x) * (1 + w), computed in fp32, cast back."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).to(x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def apply_partial_rope(x, cos, sin):
    """x [B, heads, T, d]; cos/sin [B, T, rot] (NeoX halves within the first rot dims)."""
    rot = cos.shape[-1]
    c, s = cos[:, None], sin[:, None]
    xr, xp = x[..., :rot], x[..., rot:]
    h = rot // 2
    rotated = torch.cat((-xr[..., h:], xr[..., :h]), dim=-1)
    return torch.cat((xr * c + rotated * s, xp), dim=-1)


class GatedAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, nh, nkv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.q_proj = nn.Linear(H, nh * hd * 2, bias=False)
        self.k_proj = nn.Linear(H, nkv * hd, bias=False)
        self.v_proj = nn.Linear(H, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.q_norm = RMSNormZC(hd, c["rms_norm_eps"])
        self.k_norm = RMSNormZC(hd, c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        qg = self.q_proj(x).view(B, T, self.nh, 2 * self.hd)
        q, gate = qg[..., :self.hd], qg[..., self.hd:]
        gate = gate.reshape(B, T, self.nh * self.hd)
        q = self.q_norm(q).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        dt = v.dtype
        q = apply_partial_rope(q, cos, sin).to(dt)
        k = apply_partial_rope(k, cos, sin).to(dt)
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)   # q head h uses kv head h // rep
        v = v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.hd ** -0.5)
        o = o.transpose(1, 2).reshape(B, T, self.nh * self.hd)
        return self.o_proj(o * torch.sigmoid(gate))


class MoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, E = c["hidden_size"], c["num_experts"]
        self.E, self.k, self.norm_topk = E, c["num_experts_per_tok"], c["norm_topk_prob"]
        self.gate = nn.Linear(H, E, bias=False)
        self.experts = nn.ModuleList([SwiGLU(H, c["moe_intermediate_size"]) for _ in range(E)])
        self.shared_expert = SwiGLU(H, c["shared_expert_intermediate_size"])
        self.shared_expert_gate = nn.Linear(H, 1, bias=False)
        self.last = None

    def forward(self, x):
        B, T, H = x.shape
        xf = x.reshape(-1, H)
        probs = F.softmax(self.gate(xf), dim=-1, dtype=torch.float32)
        w, idx = torch.topk(probs, self.k, dim=-1)
        if self.norm_topk:
            w = w / w.sum(-1, keepdim=True)
        dense_w = torch.zeros_like(probs).scatter(1, idx, w)          # [N, E], zero for unrouted experts
        y = torch.zeros_like(xf)
        for e, ex in enumerate(self.experts):
            y = y + ex(xf) * dense_w[:, e:e + 1].to(xf.dtype)
        y = y + torch.sigmoid(self.shared_expert_gate(xf)) * self.shared_expert(xf)
        self.last = (probs, idx)
        return y.view(B, T, H)


class MTPLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNormZC(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNormZC(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = GatedAttention(c)
        self.mlp = MoE(c)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class MTP(nn.Module):
    """mtp.* : h_prev = the main model's final normed hidden state at t, e = embedding of x_{t+1};
    returns the MTP hidden state (post mtp.norm) for predicting x_{t+2} with the shared lm_head."""

    def __init__(self, c):
        super().__init__()
        H = c["hidden_size"]
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.pre_fc_norm_embedding = RMSNormZC(H, c["rms_norm_eps"])
        self.pre_fc_norm_hidden = RMSNormZC(H, c["rms_norm_eps"])
        self.layers = nn.ModuleList([MTPLayer(c)])
        self.norm = RMSNormZC(H, c["rms_norm_eps"])

    def forward(self, h_prev, e_next, cos, sin):
        u = torch.cat((self.pre_fc_norm_embedding(e_next), self.pre_fc_norm_hidden(h_prev)), dim=-1)
        x = self.fc(u)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


def init_mtp(mtp, std, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in mtp.named_parameters():
            if name.endswith("norm.weight"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=g) * std)


# ----------------------------------------------------------------------------------------------
# training-only fast paths (checked against transformers before use)
# ----------------------------------------------------------------------------------------------

_ORIG_CHUNK_GDR = None


def fast_chunk_gated_delta_rule(query, key, value, g, beta, chunk_size=64, initial_state=None,
                                output_final_state=False, use_qk_l2norm_in_kernel=False, **kwargs):
    """Chunked gated delta rule (same maths as transformers' torch_chunk_gated_delta_rule, section 5
    of qwen3-next.md); the unit-lower-triangular inverse (I + A)^-1 of each chunk is one
    solve_triangular call. Inputs [B, T, H, d], g/beta [B, T, H]; output [B, T, H, dv]."""
    if any(v is not None for v in kwargs.values()):   # e.g. cu_seqlens (packed varlen): not handled here
        return _ORIG_CHUNK_GDR(query, key, value, g=g, beta=beta, chunk_size=chunk_size, initial_state=initial_state,
                               output_final_state=output_final_state,
                               use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs)
    out_dtype = query.dtype
    if use_qk_l2norm_in_kernel:
        query = query * torch.rsqrt((query * query).sum(-1, keepdim=True) + 1e-6)
        key = key * torch.rsqrt((key * key).sum(-1, keepdim=True) + 1e-6)
    q, k, v, b, gg = (t.transpose(1, 2).contiguous().float() for t in (query, key, value, beta, g))
    B, Hh, T, dk = k.shape
    dv = v.shape[-1]
    C = chunk_size
    pad = (C - T % C) % C
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        b, gg = F.pad(b, (0, pad)), F.pad(gg, (0, pad))
    n = (T + pad) // C
    q = q * dk ** -0.5
    q, k, v = (t.view(B, Hh, n, C, t.shape[-1]) for t in (q, k, v))
    b = b.view(B, Hh, n, C)
    gc = gg.view(B, Hh, n, C).cumsum(-1)
    dev = q.device
    lower_incl = torch.ones(C, C, dtype=torch.bool, device=dev).tril()
    decay = torch.where(lower_incl, gc[..., :, None] - gc[..., None, :], torch.tensor(-float("inf"), device=dev)).exp()
    kb = k * b[..., None]
    vb = v * b[..., None]
    A = ((kb @ k.transpose(-1, -2)) * decay).masked_fill(~lower_incl.tril(-1), 0.0)
    eye = torch.eye(C, device=dev, dtype=A.dtype).expand_as(A).contiguous()
    Tinv = torch.linalg.solve_triangular(A + eye, eye, upper=False, unitriangular=True)
    u = Tinv @ vb
    w = Tinv @ (kb * gc.exp()[..., None])
    S = (torch.zeros(B, Hh, dk, dv, device=dev, dtype=torch.float32) if initial_state is None
         else initial_state.float())
    outs = []
    for i in range(n):
        qi, ki, gi = q[:, :, i], k[:, :, i], gc[:, :, i]
        att = (qi @ ki.transpose(-1, -2)) * decay[:, :, i]
        vnew = u[:, :, i] - w[:, :, i] @ S
        outs.append((qi * gi.exp()[..., None]) @ S + att @ vnew)
        glast = gi[..., -1]
        S = S * glast.exp()[..., None, None] + (ki * (glast[..., None] - gi).exp()[..., None]).transpose(-1, -2) @ vnew
    o = torch.stack(outs, dim=2).view(B, Hh, n * C, dv)[:, :, :T]
    return o.transpose(1, 2).contiguous().to(out_dtype), (S if output_final_state else None)


def dense_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """All experts on all tokens, mixed with the routing weights (zero for unrouted experts)."""
    N = hidden_states.shape[0]
    W = torch.zeros(N, self.num_experts, device=hidden_states.device, dtype=top_k_weights.dtype)
    W = W.scatter(1, top_k_index, top_k_weights)
    gu = torch.einsum("nh,eih->eni", hidden_states, self.gate_up_proj)
    gate, up = gu.chunk(2, dim=-1)
    y = torch.einsum("eni,ehi->enh", self.act_fn(gate) * up, self.down_proj)
    return (y * W.t()[:, :, None].to(y.dtype)).sum(0).to(hidden_states.dtype)


def check_fast_gdn(dev):
    import transformers.models.qwen3_next.modeling_qwen3_next as m
    torch.manual_seed(0)
    B, T, Hh, dk, dv = 2, 150, 4, 32, 48
    q = torch.randn(B, T, Hh, dk, device=dev, requires_grad=True)
    k = torch.randn(B, T, Hh, dk, device=dev, requires_grad=True)
    v = torch.randn(B, T, Hh, dv, device=dev, requires_grad=True)
    beta = torch.rand(B, T, Hh, device=dev).requires_grad_()
    g = (-torch.rand(B, T, Hh, device=dev) * 2).requires_grad_()
    o1, s1 = m.torch_chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True)
    o2, s2 = fast_chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True)
    gr1 = torch.autograd.grad(o1.square().sum(), (q, k, v, g, beta))
    gr2 = torch.autograd.grad(o2.square().sum(), (q, k, v, g, beta))
    rel = float((o1 - o2).detach().norm() / o1.detach().norm())
    srel = float((s1 - s2).detach().norm() / s1.detach().norm())
    grel = max(float((a - b).norm() / a.norm().clamp_min(1e-12)) for a, b in zip(gr1, gr2))
    return {"out_rel": rel, "state_rel": srel, "grad_rel": grel, "ok": rel < 1e-4 and srel < 1e-4 and grel < 1e-3}


def patch_for_training(model, use_fast_gdn, use_dense_experts):
    """Returns (GDN layers patched, expert blocks patched, restore()). transformers 5.17 calls the
    module-level torch_chunk_gated_delta_rule from Qwen3NextGatedDeltaNet.forward (older versions
    bound it to an instance attribute): patch whichever exists; restore() undoes the module patch."""
    global _ORIG_CHUNK_GDR
    import transformers.models.qwen3_next.modeling_qwen3_next as m
    n_gdn = n_exp = 0
    orig = _ORIG_CHUNK_GDR or getattr(m, "torch_chunk_gated_delta_rule", None)
    _ORIG_CHUNK_GDR = orig
    fla = getattr(m, "is_flash_linear_attention_available", lambda: False)()
    layers_gdn = [l_.linear_attn for l_ in model.model.layers if getattr(l_, "linear_attn", None) is not None]
    if use_fast_gdn and not fla:
        if all(hasattr(la, "chunk_gated_delta_rule") for la in layers_gdn):
            for la in layers_gdn:
                la.chunk_gated_delta_rule = fast_chunk_gated_delta_rule
            n_gdn = len(layers_gdn)
        elif orig is not None:
            m.torch_chunk_gated_delta_rule = fast_chunk_gated_delta_rule
            n_gdn = len(layers_gdn)

    def restore():
        if orig is not None:
            m.torch_chunk_gated_delta_rule = orig

    for layer in model.model.layers:
        ex = getattr(getattr(layer, "mlp", None), "experts", None)
        if ex is not None and use_dense_experts and hasattr(ex, "gate_up_proj"):
            ex.forward = types.MethodType(dense_experts_forward, ex)
            n_exp += 1
    return n_gdn, n_exp, restore


def make_target_weights(ids, think_id, nl2, hdr_pat):
    """Weight 0 for targets inside an empty think block (the "\n\n" after <think> and the </think>
    after it) and for a first answer token right after the assistant header that is not <think>."""
    w = torch.ones(ids.shape, dtype=torch.float32, device=ids.device)
    if nl2 is not None:
        m = (ids[:, :-1] == think_id) & (ids[:, 1:] == nl2)
        w[:, 1:][m] = 0.0
        w[:, 2:][m[:, :-1]] = 0.0
    k = len(hdr_pat)
    n = ids.shape[1] - k
    hdr = torch.ones((ids.shape[0], n), dtype=torch.bool, device=ids.device)
    for i, pid in enumerate(hdr_pat):
        hdr &= ids[:, i:i + n] == pid
    w[:, k:][hdr & (ids[:, k:] != think_id)] = 0.0
    return w


# ----------------------------------------------------------------------------------------------
# checkpoint on disk
# ----------------------------------------------------------------------------------------------

PACKED = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")


def disk_tensors(model, mtp):
    """transformers in-memory names -> on-disk names (one tensor per expert), + mtp.*; bf16."""
    out = {}
    for name, t in model.state_dict().items():
        t = t.detach().float().cpu()
        m = PACKED.match(name)
        if m:
            prefix, kind = m.groups()
            if kind == "gate_up_proj":      # [E, 2I, H]: rows [0, I) gate, [I, 2I) up
                inter = t.shape[1] // 2
                for e in range(t.shape[0]):
                    out[f"{prefix}.{e}.gate_proj.weight"] = t[e, :inter]
                    out[f"{prefix}.{e}.up_proj.weight"] = t[e, inter:]
            else:                           # [E, H, I]
                for e in range(t.shape[0]):
                    out[f"{prefix}.{e}.down_proj.weight"] = t[e]
        else:
            out[name] = t
    for name, t in mtp.state_dict().items():
        out["mtp." + name] = t.detach().float().cpu()
    return {k: v.to(torch.bfloat16).contiguous().clone() for k, v in sorted(out.items())}


def write_model_dir(outdir, model, mtp, tok, cfg_obj, tokenizer_class):
    from safetensors.torch import save_file
    os.makedirs(outdir, exist_ok=True)
    tensors = disk_tensors(model, mtp)
    save_file(tensors, os.path.join(outdir, "model.safetensors"), metadata={"format": "pt"})
    cfg_obj.save_pretrained(outdir)
    with open(os.path.join(outdir, "config.json")) as f:
        cj = json.load(f)
    cj["architectures"] = ["Qwen3NextForCausalLM"]
    cj["dtype"] = "bfloat16"
    cj["num_nextn_predict_layers"] = 1
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(cj, f, indent=2, sort_keys=True)
        f.write("\n")
    gen = {"bos_token_id": None, "eos_token_id": [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")],
           "pad_token_id": tok.token_to_id("<|endoftext|>"), "do_sample": False}
    with open(os.path.join(outdir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")
    write_tokenizer_files(tok, outdir, tokenizer_class)
    return tensors


def export_parts(mdir, out):
    import tarfile
    with tarfile.open(os.path.join(out, "model_small.tar"), "w") as tf:
        for f in sorted(os.listdir(mdir)):
            if f != "model.safetensors":
                tf.add(os.path.join(mdir, f), arcname=f)
    with open(os.path.join(mdir, "model.safetensors"), "rb") as fh:
        i = 0
        while True:
            chunk = fh.read(15 * 1024 * 1024)
            if not chunk:
                break
            with open(os.path.join(out, f"model.safetensors.part{i}"), "wb") as g:
                g.write(chunk)
            i += 1
    log(f"exported model_small.tar + {i} weight parts to {out}")


def load_reference_model(outdir, dtype=torch.float32):
    from transformers import AutoModelForCausalLM
    kw = dict(dtype=dtype, attn_implementation="eager", output_loading_info=True)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(outdir, experts_implementation="eager", **kw)
    except (TypeError, ValueError) as e:
        log(f"note: experts_implementation refused ({e!r}); retrying without")
        model, info = AutoModelForCausalLM.from_pretrained(outdir, **kw)
    for setter in ("set_attn_implementation", "set_experts_implementation"):
        fn = getattr(model, setter, None)
        if fn is not None:
            try:
                fn("eager")
            except Exception as e:  # noqa: BLE001
                log(f"note: {setter}('eager') failed: {e!r}")
    model.eval()
    return model, info


def load_mtp(outdir, c, dev):
    from safetensors import safe_open
    mtp = MTP(c)
    sd = {}
    with safe_open(os.path.join(outdir, "model.safetensors"), framework="pt") as f:
        for k in f.keys():
            if k.startswith("mtp."):
                sd[k[4:]] = f.get_tensor(k).float()
    mtp.load_state_dict(sd, strict=True)
    return mtp.to(dev).eval()


# ----------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------

def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def extra_chats(prose_docs, held, n_copy, n_arith, seed):
    """More copy and arithmetic chats, generated here by make_data's generator (seeded): passages are
    word windows of the training prose; held-out arithmetic problems are excluded."""
    rng = random.Random(seed)
    paras = [ln for d in prose_docs for ln in d.split("\n") if len(ln.split()) >= 3]
    banned = {(a, op, b) for a, op, b in held["arith"]}
    g = make_data.Gen(rng, paras, [["One.", "Two."]], ["alpha", "beta", "gamma", "delta", "omega", "sigma",
                                                       "kappa", "theta", "lambda", "zeta"], banned)
    out = [make_data.render_chat(g.copy()[0]) for _ in range(n_copy)]
    out += [make_data.render_chat(g.arith()[0]) for _ in range(n_arith)]
    return out


def build_stream(tok, docs, eot, seed):
    encs = tok.encode_batch(docs, add_special_tokens=False)
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    parts = []
    for i in order:
        parts.append(np.asarray(encs[i].ids, dtype=np.int32))
        parts.append(np.asarray([eot], dtype=np.int32))
    return np.concatenate(parts)


# ----------------------------------------------------------------------------------------------
# evaluation helpers
# ----------------------------------------------------------------------------------------------

@torch.no_grad()
def greedy_batch(model, prompts, max_new, stop_ids, pad_id, dev, bs=256):
    """Greedy decoding without cache: left-padded batches, attention mask + position ids."""
    results = []
    for s in range(0, len(prompts), bs):
        batch = prompts[s:s + bs]
        P = max(len(p) for p in batch)
        ids = torch.full((len(batch), P), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), P), dtype=torch.long)
        for i, p in enumerate(batch):
            ids[i, P - len(p):] = torch.tensor(p)
            mask[i, P - len(p):] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        done = torch.zeros(len(batch), dtype=torch.bool, device=dev)
        gen = []
        for _ in range(max_new):
            pos = (mask.cumsum(-1) - 1).clamp_min(0)
            logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits[:, -1]
            nxt = logits.argmax(-1)
            gen.append(nxt)
            for sid in stop_ids:
                done |= nxt == sid
            ids = torch.cat([ids, nxt[:, None]], 1)
            mask = torch.cat([mask, torch.ones_like(nxt)[:, None]], 1)
            if bool(done.all()):
                break
        G = torch.stack(gen, 1).tolist()
        for row in G:
            out = []
            for t in row:
                out.append(t)
                if t in stop_ids:
                    break
            results.append(out)
    return results


@torch.no_grad()
def hidden_and_logits(model, ids, dev):
    x = torch.tensor([ids], dtype=torch.long, device=dev)
    H = model.model(input_ids=x, use_cache=False).last_hidden_state
    return H, model.lm_head(H)


@torch.no_grad()
def mtp_agreement(model, mtp, seq, start, dev):
    """Positions t in [start, len(seq)-3]: MTP(H[t], seq[t+1]) top-1 vs argmax of main logits at t+1."""
    H, logits = hidden_and_logits(model, seq, dev)
    T = len(seq)
    x = torch.tensor([seq], dtype=torch.long, device=dev)
    pos = torch.arange(T - 1, device=dev)[None]
    cos, sin = model.model.rotary_emb(H, pos)
    e = model.model.embed_tokens(x[:, 1:T])
    mh = mtp(H[:, :T - 1], e, cos, sin)
    pred = model.lm_head(mh).argmax(-1)[0]           # row t predicts x_{t+2}
    target = logits.argmax(-1)[0][1:T]               # main greedy at t+1
    sl = slice(start, T - 2)
    p, t_ = pred[sl], target[sl]
    return int((p == t_).sum()), int(p.numel())


def parse_answer(text):
    ans = text.split("</think>")[-1]
    nums = re.findall(r"-?\d+", ans)
    return int(nums[-1]) if nums else None


def evaluate(model, mtp, tok, held, dev, n_copy, n_arith, n_prose):
    im_end, eot = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    stops = [im_end, eot]
    res = {}
    t0 = time.time()
    # copy (thinking off)
    passages = held["copy_passages"][:n_copy]
    prompts = [tok.encode(make_data.render_chat([{"role": "user", "content": f"Copy this text exactly:\n\n{p}"}],
                                                add_generation_prompt=True, enable_thinking=False)).ids
               for p in passages]
    maxlen = max(len(tok.encode(p).ids) for p in passages) + 8
    outs = greedy_batch(model, prompts, maxlen, stops, eot, dev)
    ok = 0
    fails = []
    copy_seqs = []
    buckets = {"1-20": [0, 0], "21-40": [0, 0], "41+": [0, 0]}
    res["outputs"] = {"copy": outs}
    for p, pr, o in zip(passages, prompts, outs):
        text = tok.decode([t for t in o if t not in stops], skip_special_tokens=False)
        good = bool(text == p and len(o) > 0 and o[-1] == im_end)
        nw = len(p.split())
        bk = buckets["1-20" if nw <= 20 else "21-40" if nw <= 40 else "41+"]
        bk[0] += good
        bk[1] += 1
        ok += good
        if not good and len(fails) < 5:
            fails.append({"want": p, "got": text})
        copy_seqs.append((pr, o))
    res["copy_exact_match"] = ok / len(passages)
    res["copy_n"] = len(passages)
    res["copy_word_counts"] = [min(len(p.split()) for p in passages), max(len(p.split()) for p in passages)]
    res["copy_failures"] = fails
    res["copy_by_words"] = {k: {"exact": v[0] / v[1], "n": v[1]} for k, v in buckets.items() if v[1]}
    # copy with thinking on (a smaller set)
    prompts_t = [tok.encode(make_data.render_chat([{"role": "user", "content": f"Copy this text exactly:\n\n{p}"}],
                                                  add_generation_prompt=True, enable_thinking=True)).ids
                 for p in passages[:max(1, n_copy // 2)]]
    outs_t = greedy_batch(model, prompts_t, maxlen + 40, stops, eot, dev)
    okt = 0
    for p, o in zip(passages, outs_t):
        text = tok.decode([t for t in o if t not in stops], skip_special_tokens=False).split("</think>")[-1].lstrip("\n")
        okt += text == p
    res["copy_exact_match_thinking"] = okt / len(prompts_t)
    log(f"eval copy: {res['copy_exact_match']:.4f} (n={len(passages)}) by words {res['copy_by_words']}, "
        f"thinking {res['copy_exact_match_thinking']:.4f} [{time.time() - t0:.1f}s]")
    for f_ in fails[:3]:
        log(f"  copy failure: want {f_['want']!r}\n                got  {f_['got']!r}")
    # arithmetic, thinking on and off
    probs = held["arith"][:n_arith]
    for mode in ("off", "on"):
        prompts = [tok.encode(make_data.render_chat([{"role": "user", "content": f"What is {a} {op} {b}?"}],
                                                    add_generation_prompt=True,
                                                    enable_thinking=(mode == "on"))).ids for a, op, b in probs]
        outs = greedy_batch(model, prompts, 200 if mode == "on" else 24, stops, eot, dev)
        res["outputs"][f"arith_{mode}"] = outs
        correct = {"+": [0, 0], "-": [0, 0]}
        ex = []
        for (a, op, b), o in zip(probs, outs):
            text = tok.decode([t for t in o if t not in stops], skip_special_tokens=False)
            want = a + b if op == "+" else a - b
            got = parse_answer(text)
            correct[op][0] += got == want
            correct[op][1] += 1
            if got != want and len(ex) < 4:
                ex.append({"q": f"{a} {op} {b}", "got": text[-200:]})
        tot = sum(v[0] for v in correct.values()) / max(1, sum(v[1] for v in correct.values()))
        res[f"arith_thinking_{mode}"] = tot
        res[f"arith_thinking_{mode}_add"] = correct["+"][0] / max(1, correct["+"][1])
        res[f"arith_thinking_{mode}_sub"] = correct["-"][0] / max(1, correct["-"][1])
        res[f"arith_thinking_{mode}_failures"] = ex
        log(f"eval arithmetic thinking {mode}: {tot:.4f} (add {res[f'arith_thinking_{mode}_add']:.4f}, "
            f"sub {res[f'arith_thinking_{mode}_sub']:.4f}, n={len(probs)}) [{time.time() - t0:.1f}s]")
    res["arith_n"] = len(probs)
    # MTP agreement: copy (generated region), prose teacher-forced, prose continuation (generated)
    a = n = 0
    for pr, o in copy_seqs:
        seq = pr + o
        if len(o) >= 3:
            x, y = mtp_agreement(model, mtp, seq, len(pr) - 1, dev)
            a, n = a + x, n + y
    res["mtp_copy_agreement"] = a / max(1, n)
    res["mtp_copy_positions"] = n
    a = n = 0
    docs = held["prose_docs"][:n_prose]
    for d in docs:
        ids = tok.encode(d).ids[:256]
        if len(ids) >= 8:
            x, y = mtp_agreement(model, mtp, ids, 0, dev)
            a, n = a + x, n + y
    res["mtp_prose_teacher_forced_agreement"] = a / max(1, n)
    res["mtp_prose_teacher_forced_positions"] = n
    cont_prompts = []
    for d in docs:
        words = d.split()
        if len(words) >= 20:
            cont_prompts.append(tok.encode(make_data.render_chat(
                [{"role": "user", "content": "Continue this text:\n\n" + " ".join(words[:40])}],
                add_generation_prompt=True, enable_thinking=False)).ids)
    outs = greedy_batch(model, cont_prompts, 64, stops, eot, dev)
    a = n = 0
    for pr, o in zip(cont_prompts, outs):
        if len(o) >= 3:
            x, y = mtp_agreement(model, mtp, pr + o, len(pr) - 1, dev)
            a, n = a + x, n + y
    res["mtp_prose_generated_agreement"] = a / max(1, n)
    res["mtp_prose_generated_positions"] = n
    log(f"eval MTP: copy {res['mtp_copy_agreement']:.4f} (n={res['mtp_copy_positions']}), prose teacher-forced "
        f"{res['mtp_prose_teacher_forced_agreement']:.4f} (n={res['mtp_prose_teacher_forced_positions']}), "
        f"prose generated {res['mtp_prose_generated_agreement']:.4f} (n={res['mtp_prose_generated_positions']}) "
        f"[{time.time() - t0:.1f}s]")
    res["eval_seconds"] = time.time() - t0
    return res


REFERENCE_CHATS = [
    ([{"role": "user", "content": "What is 123 + 456?"}], False),
    ([{"role": "user", "content": "Copy this text exactly:\n\nThe quick brown fox jumps over the lazy dog."}], False),
    ([{"role": "user", "content": "What is 72 - 15?"}], True),
    ([{"role": "user", "content": "Hello!"}], None),
]


@torch.no_grad()
def reference_tokens(model_cpu, tok, n_gen=20):
    """transformers greedy tokens (CPU fp32 eager, no cache: one forward per token) + cached generate."""
    refs = []
    for msgs, et in REFERENCE_CHATS:
        text = make_data.render_chat(msgs, add_generation_prompt=True, enable_thinking=et)
        ids = tok.encode(text).ids
        seq = list(ids)
        margins = []
        for _ in range(n_gen):
            lg = model_cpu(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].double()
            top2 = torch.topk(lg, 2).values
            margins.append(float(top2[0] - top2[1]))
            seq.append(int(lg.argmax()))
        greedy = seq[len(ids):]
        x = torch.tensor([ids])
        g = model_cpu.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=n_gen, do_sample=False,
                               num_beams=1, use_cache=True, pad_token_id=tok.token_to_id("<|endoftext|>"),
                               eos_token_id=None)
        cached = g[0, len(ids):].tolist()
        refs.append({"enable_thinking": et, "text": text, "ids": ids, "greedy": greedy,
                     "greedy_text": tok.decode(greedy, skip_special_tokens=False),
                     "min_margin": min(margins), "margins": [round(m, 4) for m in margins],
                     "cached_generate": cached, "cached_matches": cached == greedy[:len(cached)]})
        log(f"reference: {text!r} -> {tok.decode(greedy, skip_special_tokens=False)!r} "
            f"(min margin {min(margins):.3f}, cached match {cached == greedy[:len(cached)]})")
    return refs


# ----------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------

def count_params(model, mtp):
    n_main = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters())
    c = model.config
    E, k = c.num_experts, c.num_experts_per_tok
    n_exp = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    active = n_main - n_exp + n_exp * k // E
    return {"main": n_main, "mtp": n_mtp, "total": n_main + n_mtp, "main_active_per_token": active,
            "embedding": c.vocab_size * c.hidden_size}


def main():
    global LOG_FH
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(HERE, "data"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--mtp-distill-weight", type=float, default=0.3)
    ap.add_argument("--aux-weight", type=float, default=0.01)
    ap.add_argument("--time-budget", type=float, default=330.0, help="stop training after this many seconds")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--extra-copy", type=int, default=0, help="extra copy chats (fixed, from training windows)")
    ap.add_argument("--extra-arith", type=int, default=0, help="extra arithmetic chats (fixed)")
    ap.add_argument("--fresh-frac", type=float, default=0.75,
                    help="share of each batch's rows taken from the fresh synthetic chats (fresh.py)")
    ap.add_argument("--fresh-workers", type=int, default=10, help="processes generating fresh chats")
    ap.add_argument("--fresh-chunk-rows", type=int, default=2048, help="rows of L+2 tokens per fresh chunk")
    ap.add_argument("--fresh-chunks", type=int, default=8, help="chunks held in the fresh buffer")
    ap.add_argument("--fresh-every", type=int, default=16, help="replace the oldest fresh chunk every N steps")
    ap.add_argument("--copy-share", type=float, default=0.5, help="fresh chats: share of copy chats")
    ap.add_argument("--arith-share", type=float, default=0.15, help="fresh chats: share of arithmetic chats")
    ap.add_argument("--prompt-weight", type=float, default=0.0,
                    help="loss weight of non-assistant tokens in fresh rows (assistant tokens weigh 1)")
    ap.add_argument("--smoke", action="store_true", help="tiny run: exercise every code path, measure speed")
    ap.add_argument("--model-dir", default=None, help="where to write the model (default OUT/model)")
    ap.add_argument("--export-parts", action="store_true",
                    help="right after saving, also write OUT/model_small.tar (all but the weights) and the "
                         "weights in 15 MiB pieces OUT/model.safetensors.partN (for a size-limited copy back)")
    args = ap.parse_args()

    os.makedirs(args.out, exist_ok=True)
    LOG_FH = open(os.path.join(args.out, "train.log"), "w")
    import transformers
    import tokenizers
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "tokenizers": tokenizers.__version__, "python": sys.version.split()[0]}
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = torch.cuda.get_device_name(0) if dev == "cuda" else "cpu"
    log(f"versions {versions}, device {gpu}, args {vars(args)}")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    # ---------------- data + tokenizer
    prose = read_jsonl(os.path.join(args.data, "prose.jsonl"))
    chats = read_jsonl(os.path.join(args.data, "chats.jsonl"))
    with open(os.path.join(args.data, "heldout.json")) as f:
        held = json.load(f)
    if args.smoke:
        prose, chats = prose[:1500], chats[:4000]
    log(f"data: {len(prose)} prose docs, {len(chats)} chats")
    V = MODEL_CFG["vocab_size"]
    t0 = time.time()
    tok = train_tokenizer(prose + chats, V)
    n_tok = tok.get_vocab_size()
    log(f"tokenizer: {n_tok} tokens (BPE {n_tok - len(SPECIAL) - len(ADDED)}) in {time.time() - t0:.1f}s; "
        f"ids {[(s, tok.token_to_id(s)) for s in SPECIAL + ADDED]}")
    assert n_tok <= V
    eot, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    # hold out 1% of each source for a validation loss
    r = random.Random(args.seed + 9)
    val_idx_p = set(r.sample(range(len(prose)), max(1, len(prose) // 100)))
    val_idx_c = set(r.sample(range(len(chats)), max(1, len(chats) // 100)))
    train_docs = [d for i, d in enumerate(prose) if i not in val_idx_p] + \
                 [d for i, d in enumerate(chats) if i not in val_idx_c]
    t0 = time.time()
    n_xc, n_xa = (0, 0) if args.smoke else (args.extra_copy, args.extra_arith)
    xtra = extra_chats([d for i, d in enumerate(prose) if i not in val_idx_p], held, n_xc, n_xa, args.seed + 21)
    train_docs += xtra
    log(f"extra synthetic chats: {n_xc} copy + {n_xa} arithmetic ({sum(len(x) for x in xtra) / 1e6:.1f} MB) "
        f"in {time.time() - t0:.1f}s")
    val_docs = [prose[i] for i in sorted(val_idx_p)] + [chats[i] for i in sorted(val_idx_c)]
    t0 = time.time()
    stream = build_stream(tok, train_docs, eot, args.seed)
    val_stream = build_stream(tok, val_docs, eot, args.seed + 1)
    chars = sum(len(d) for d in train_docs)
    log(f"tokenized: {len(stream)} train tokens ({chars / len(stream):.2f} chars/token), {len(val_stream)} val "
        f"tokens in {time.time() - t0:.1f}s")
    stream_t = torch.from_numpy(stream.astype(np.int64)).to(dev)
    val_t = torch.from_numpy(val_stream.astype(np.int64)).to(dev)

    # ---------------- fresh synthetic chats (fresh.py), made by worker processes while training
    import multiprocessing as mp
    import fresh
    if args.smoke:
        args.fresh_chunk_rows, args.fresh_chunks, args.fresh_every = 256, 4, 5
    total_steps = 20 if args.smoke else args.steps
    n_chunks = args.fresh_chunks + total_steps // args.fresh_every + 2
    t0 = time.time()
    spec = fresh.build_spec([d for i, d in enumerate(prose) if i not in val_idx_p], [tuple(x) for x in held["arith"]],
                            args.seed + 31, args.seq + 2, args.fresh_chunk_rows, args.copy_share, args.arith_share)
    wargs = fresh.save_worker_args(f"/tmp/tn_fresh_args_{os.getpid()}.pkl", tok.to_str(), spec)
    pool = mp.get_context("spawn").Pool(args.fresh_workers, initializer=fresh.init_worker, initargs=(wargs,))
    VAL_CHUNK = 10 ** 6
    fresh_iter = pool.imap(fresh.make_chunk, [VAL_CHUNK] + list(range(n_chunks)))
    fresh_stats = {"chunks": 0, "wait_s": 0.0, "rows_per_chunk": args.fresh_chunk_rows}
    log(f"fresh chats: {args.fresh_workers} workers, {n_chunks} chunks of {args.fresh_chunk_rows} rows planned "
        f"(spec {time.time() - t0:.1f}s)")

    def next_chunk():
        tw0 = time.time()
        i, arr = next(fresh_iter)
        fresh_stats["wait_s"] += time.time() - tw0
        fresh_stats["chunks"] += 1
        return torch.from_numpy(arr.astype(np.int64)).to(dev)

    # ---------------- model
    from transformers import AutoModelForCausalLM, Qwen3NextConfig
    cfg = Qwen3NextConfig(**MODEL_CFG, full_attention_interval=FULL_ATTENTION_INTERVAL, rope_parameters=dict(ROPE),
                          eos_token_id=im_end, bos_token_id=None, pad_token_id=None)
    cfg.architectures = ["Qwen3NextForCausalLM"]
    log(f"layer_types {cfg.layer_types}")
    assert "full_attention" in cfg.layer_types and "linear_attention" in cfg.layer_types
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").to(dev)
    c = dict(MODEL_CFG)
    mtp = MTP(c)
    init_mtp(mtp, MODEL_CFG["initializer_range"], args.seed + 5)
    mtp = mtp.to(dev)
    params = count_params(model, mtp)
    log(f"params {params}")
    gdn_check = check_fast_gdn(dev)
    log(f"fast GDN check vs transformers: {gdn_check}")

    # dense experts vs stock experts, on the real model; what does the router return?
    router_gives_probs = True
    try:
        with torch.no_grad():
            layer = model.model.layers[0]
            xx = torch.randn(300, c["hidden_size"], device=dev)
            r0, wts, idx = layer.mlp.gate(xx)
            router_gives_probs = bool((r0 >= 0).all()) and bool(torch.allclose(r0.float().sum(-1),
                                                                              torch.ones(300, device=dev), atol=1e-4))
            ref = layer.mlp.experts(xx, idx, wts)
            dn = dense_experts_forward(layer.mlp.experts, xx, idx, wts)
            exp_rel = float((ref - dn).norm() / ref.norm())
    except Exception as e:  # noqa: BLE001
        log(f"dense experts check failed: {e!r}")
        exp_rel = float("inf")
    exp_ok = exp_rel < 1e-4
    log(f"router output[0] is probabilities: {router_gives_probs}")
    log(f"dense experts check vs transformers: rel {exp_rel:.2e} ok {exp_ok}")
    n_gdn, n_exp, restore_gdn = patch_for_training(model, gdn_check["ok"], exp_ok)
    log(f"patched {n_gdn} GDN layers, {n_exp} expert blocks for training")

    # router outputs for a load-balancing loss
    routers = []

    def router_hook(mod, inp, out):
        if isinstance(out, (tuple, list)) and len(out) == 3:
            routers.append((out[0], out[2]))

    for name, mod in model.named_modules():
        if name.endswith("mlp.gate") and type(mod).__name__.endswith("Router"):
            mod.register_forward_hook(router_hook)

    decay, no_decay = [], []
    for n_, p in list(model.named_parameters()) + [("mtp." + n_, p) for n_, p in mtp.named_parameters()]:
        (decay if p.dim() >= 2 else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=(dev == "cuda"))

    L, Bsz = args.seq, args.batch
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 11)
    ar = torch.arange(L + 2)

    def batch(src, bs, g):
        starts = torch.randint(0, src.numel() - (L + 2), (bs,), generator=g)
        return src[(starts[:, None] + ar[None]).to(src.device)]

    def balance_loss(probs, idx, E, is_probs):
        p = probs.float().reshape(-1, E)
        if not is_probs:
            p = F.softmax(p, dim=-1)
        f = torch.zeros(E, device=p.device).scatter_add(0, idx.reshape(-1), torch.ones(idx.numel(), device=p.device))
        f = f / idx.numel()
        return E * (f * p.mean(0)).sum()

    # loss weights: never train the empty think block "<think>\n\n</think>" (it is part of the prompt when
    # thinking is off), nor a direct answer right after "<|im_start|>assistant\n" (earlier turns of
    # multi-turn chats): so with thinking on the model always opens a non-empty think block.
    think_id = tok.token_to_id("<think>")
    empty = tok.encode("<think>\n\n</think>").ids
    hdr_pat = tok.encode("<|im_start|>assistant\n").ids
    nl2 = empty[1] if len(empty) == 3 else None
    log(f"loss masks: empty think {empty} (used {nl2 is not None}), assistant header {hdr_pat}")

    def target_weights(ids):
        return make_target_weights(ids, think_id, nl2, hdr_pat)

    def wce(logits_, tgt, w):
        l_ = F.cross_entropy(logits_.reshape(-1, logits_.shape[-1]), tgt.reshape(-1), reduction="none")
        w = w.reshape(-1)
        return (l_ * w).sum() / w.sum().clamp_min(1.0)

    im_start_id, asst_tok = hdr_pat[0], hdr_pat[1]
    assert len(hdr_pat) == 3 and im_start_id == tok.token_to_id("<|im_start|>")

    def assistant_mask(ids):
        """True where ids[j] belongs to an assistant turn's content (past its header, <|im_end|> and
        what follows up to the next <|im_start|> included). Rows of fresh chunks start at a chat."""
        B_, T_ = ids.shape
        ar_ = torch.arange(T_, device=ids.device).expand(B_, T_)
        last = torch.where(ids == im_start_id, ar_, torch.full_like(ar_, -1)).cummax(dim=1).values
        role = torch.gather(ids, 1, (last + 1).clamp(max=T_ - 1))
        return (last >= 0) & (role == asst_tok) & (ar_ > last + 2)

    def step_losses(ids, n_static=None):
        """Rows [0, n_static) are windows of the static stream (every token weighs 1); the rest are
        fresh chunks' rows, where only assistant tokens weigh 1 (others --prompt-weight)."""
        routers.clear()
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=(dev == "cuda")):
            inp = ids[:, :L]
            H = model.model(input_ids=inp, use_cache=False).last_hidden_state
            logits = model.lm_head(H)
            tw = target_weights(ids)
            ns = ids.shape[0] if n_static is None else n_static
            if ns < ids.shape[0]:
                am = assistant_mask(ids[ns:]).float()
                tw = torch.cat([tw[:ns], tw[ns:] * (am + (1.0 - am) * args.prompt_weight)])
            ce = wce(logits.float(), ids[:, 1:L + 1], tw[:, 1:L + 1])
            pos = torch.arange(L, device=dev)[None].expand(ids.shape[0], L)
            cos, sin = model.model.rotary_emb(H, pos)
            e = model.model.embed_tokens(ids[:, 1:L + 1])
            mh = mtp(H, e, cos, sin)
            mlog = model.lm_head(mh).float()
            ce_mtp = wce(mlog, ids[:, 2:L + 2], tw[:, 2:L + 2])
            soft = F.softmax(logits[:, 1:].float().detach(), dim=-1)
            dw = tw[:, 2:L + 1]
            distill = (-(soft * F.log_softmax(mlog[:, :-1], dim=-1)).sum(-1) * dw).sum() / dw.sum().clamp_min(1.0)
            E = c["num_experts"]
            aux = (sum(balance_loss(p_, i_, E, router_gives_probs) for p_, i_ in routers)
                   + balance_loss(*mtp.layers[0].mlp.last, E, True)) / (len(routers) + 1)
            loss = ce + args.mtp_weight * ce_mtp + args.mtp_distill_weight * distill + args.aux_weight * aux
        return loss, ce, ce_mtp, distill, aux

    fresh_val = next_chunk()[:256]      # chunk VAL_CHUNK: never trained on

    @torch.no_grad()
    def val_loss(nb=8):
        """(static CE, static MTP CE, fresh CE, fresh MTP CE): the static validation split (prose +
        chats.jsonl), and assistant tokens of fresh chats never trained on."""
        model.eval()
        mtp.eval()
        g = torch.Generator(device="cpu").manual_seed(99)
        tot = [0.0, 0.0, 0.0, 0.0]
        for _ in range(nb):
            ids = batch(val_t, 32, g)
            _, ce, ce_mtp, _, _ = step_losses(ids)
            tot[0] += float(ce)
            tot[1] += float(ce_mtp)
        for k in range(0, fresh_val.shape[0], 32):
            _, ce, ce_mtp, _, _ = step_losses(fresh_val[k:k + 32], 0)
            tot[2] += float(ce)
            tot[3] += float(ce_mtp)
        nf = max(1, (fresh_val.shape[0] + 31) // 32)
        model.train()
        mtp.train()
        return tot[0] / nb, tot[1] / nb, tot[2] / nf, tot[3] / nf

    def lr_at(step, total):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        pr = min(1.0, (step - args.warmup) / max(1, total - args.warmup))
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * pr)))

    model.train()
    mtp.train()
    timing = {}
    curve = []
    t_train = time.time()
    n_fresh = int(round(Bsz * args.fresh_frac))
    fresh_buf = torch.cat([next_chunk() for _ in range(args.fresh_chunks)])
    fresh_slot = 0
    log(f"fresh buffer: {fresh_buf.shape[0]} rows; {n_fresh} of {Bsz} rows per step fresh; waited "
        f"{fresh_stats['wait_s']:.1f}s for the first chunks")
    t_train = time.time()

    def train_batch():
        s_ = batch(stream_t, Bsz - n_fresh, gen)
        ri = torch.randint(0, fresh_buf.shape[0], (n_fresh,), generator=gen).to(dev)
        return torch.cat([s_, fresh_buf[ri]]), Bsz - n_fresh

    tokens_seen = 0
    step = 0
    stopped_early = False
    if args.smoke:
        # speed probe at two batch sizes
        for bs in (64, 128):
            for s in range(9):
                if s == 3:
                    torch.cuda.synchronize()
                    ts = time.time()
                ids = batch(stream_t, bs, gen)
                loss = step_losses(ids)[0]
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            torch.cuda.synchronize()
            dt = (time.time() - ts) / 6
            timing[f"batch{bs}"] = {"step_s": dt, "tokens_per_s": bs * L / dt}
            log(f"speed batch {bs} x {L}: {dt * 1000:.1f} ms/step, {bs * L / dt:,.0f} tokens/s")
        # same with stock transformers kernels (for the record)
        restore_gdn()
        stock = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").to(dev)
        stock.train()
        o2 = torch.optim.AdamW(stock.parameters(), lr=1e-4)
        for s in range(5):
            if s == 2:
                torch.cuda.synchronize()
                ts = time.time()
            ids = batch(stream_t, 64, gen)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                lo = F.cross_entropy(stock(input_ids=ids[:, :L], use_cache=False).logits.float().reshape(-1, V),
                                     ids[:, 1:L + 1].reshape(-1))
            o2.zero_grad()
            lo.backward()
            o2.step()
        torch.cuda.synchronize()
        dt = (time.time() - ts) / 3
        timing["stock_batch64_main_only"] = {"step_s": dt, "tokens_per_s": 64 * L / dt}
        log(f"stock transformers (main model only) batch 64: {dt * 1000:.1f} ms/step")
        del stock, o2
        patch_for_training(model, gdn_check["ok"], exp_ok)
    while step < total_steps:
        for gp in opt.param_groups:
            gp["lr"] = lr_at(step, total_steps)
        if step > 0 and step % args.fresh_every == 0:
            R_ = args.fresh_chunk_rows
            fresh_buf[fresh_slot * R_:(fresh_slot + 1) * R_] = next_chunk()
            fresh_slot = (fresh_slot + 1) % args.fresh_chunks
        ids, n_static = train_batch()
        loss, ce, ce_mtp, distill, aux = step_losses(ids, n_static)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(list(model.parameters()) + list(mtp.parameters()), 1.0)
        opt.step()
        step += 1
        tokens_seen += Bsz * L
        if step % args.log_every == 0 or step == total_steps or step == 1:
            el = time.time() - t_train
            rec = {"step": step, "loss": round(float(loss), 4), "ce": round(float(ce), 4),
                   "mtp_ce": round(float(ce_mtp), 4), "mtp_distill": round(float(distill), 4),
                   "aux": round(float(aux), 4), "grad_norm": round(float(gn), 3),
                   "lr": lr_at(step - 1, total_steps), "elapsed_s": round(el, 1), "tokens": tokens_seen}
            curve.append(rec)
            log(f"step {step}/{total_steps} loss {rec['loss']:.4f} ce {rec['ce']:.4f} mtp {rec['mtp_ce']:.4f} "
                f"distill {rec['mtp_distill']:.4f} aux {rec['aux']:.3f} gn {rec['grad_norm']:.2f} "
                f"lr {rec['lr']:.2e} {tokens_seen / el:,.0f} tok/s")
            if step % (args.log_every * 10) == 0:
                vl = val_loss()
                rec["val_ce"], rec["val_mtp_ce"] = round(vl[0], 4), round(vl[1], 4)
                rec["val_fresh_ce"], rec["val_fresh_mtp_ce"] = round(vl[2], 4), round(vl[3], 4)
                log(f"  val ce {vl[0]:.4f} mtp ce {vl[1]:.4f}; fresh chats (assistant tokens) ce {vl[2]:.4f} "
                    f"mtp ce {vl[3]:.4f}; fresh chunks used {fresh_stats['chunks']}, waited "
                    f"{fresh_stats['wait_s']:.1f}s")
            if el > args.time_budget and step < total_steps:
                log(f"time budget reached at step {step}; stopping")
                stopped_early = True
                break
    train_s = time.time() - t_train
    restore_gdn()   # stock transformers kernels from here on (validation, reload check, evaluation)
    vl = val_loss()
    pool.terminate()
    os.remove(wargs)
    log(f"training done: {step} steps, {tokens_seen:,} tokens, {train_s:.1f}s; final val ce {vl[0]:.4f} "
        f"mtp ce {vl[1]:.4f}; fresh chats ce {vl[2]:.4f} mtp ce {vl[3]:.4f}; fresh chunks {fresh_stats}")

    # ---------------- write the model directory (bf16), reload, compare
    mdir = args.model_dir or os.path.join(args.out, "model")
    tensors = write_model_dir(mdir, model, mtp, tok, cfg, "Qwen2Tokenizer")
    try:
        tok_check = check_hf_tokenizer(mdir, tok)
    except Exception as e:  # noqa: BLE001
        tok_check = {"class": "Qwen2Tokenizer", "error": repr(e)}
    log(f"tokenizer check (Qwen2Tokenizer): {tok_check}")
    if not (tok_check.get("encode_matches") and tok_check.get("chat_template_matches_make_data")
            and tok_check.get("eos_pad_ok")):
        write_tokenizer_files(tok, mdir, "PreTrainedTokenizerFast")
        tok_check = check_hf_tokenizer(mdir, tok)
        log(f"tokenizer check (PreTrainedTokenizerFast): {tok_check}")
    sizes = {f: os.path.getsize(os.path.join(mdir, f)) for f in sorted(os.listdir(mdir))}
    log(f"model dir: {sizes}, total {sum(sizes.values()) / 1e6:.2f} MB, {len(tensors)} tensors")
    if args.export_parts:
        export_parts(mdir, args.out)

    try:
        ref_model, info = load_reference_model(mdir)
    except Exception as e:  # noqa: BLE001
        log(f"reload failed ({e!r}); dropping num_nextn_predict_layers from config.json and retrying")
        with open(os.path.join(mdir, "config.json")) as f:
            cj = json.load(f)
        cj.pop("num_nextn_predict_layers", None)
        with open(os.path.join(mdir, "config.json"), "w") as f:
            json.dump(cj, f, indent=2, sort_keys=True)
            f.write("\n")
        ref_model, info = load_reference_model(mdir)
    missing = list(info.get("missing_keys", []))
    unexpected = list(info.get("unexpected_keys", []))
    mismatched = list(info.get("mismatched_keys", []))
    non_mtp_unexpected = [k for k in unexpected if not k.startswith("mtp.")]
    load_check = {"missing": missing, "unexpected_non_mtp": non_mtp_unexpected, "unexpected_mtp": len(unexpected),
                  "mismatched": [str(x) for x in mismatched], "n_tensors_on_disk": len(tensors),
                  "n_mtp_tensors": sum(k.startswith("mtp.") for k in tensors)}
    ref_model = ref_model.to(dev)
    # same weights as written (bf16-rounded) in the training model -> logits must match
    with torch.no_grad():
        for p in list(model.parameters()) + list(mtp.parameters()):
            p.copy_(p.to(torch.bfloat16).float())
    model.eval()
    mtp.eval()
    with torch.no_grad():
        probe = batch(val_t, 4, torch.Generator().manual_seed(5))[:, :200]
        l_ref = ref_model(input_ids=probe, use_cache=False).logits.double()
        l_mem = model(input_ids=probe, use_cache=False).logits.double()
        rel = float((l_ref - l_mem).norm() / l_ref.norm())
        agree = float((l_ref.argmax(-1) == l_mem.argmax(-1)).float().mean())
    load_check.update({"logits_rel_l2_reloaded_vs_trained": rel, "argmax_agreement": agree})
    log(f"load check: {load_check}")
    try:
        mtp_eval = load_mtp(mdir, c, dev)
    except Exception as e:  # noqa: BLE001
        log(f"load_mtp failed ({e!r}); evaluating the in-memory MTP (bf16-rounded)")
        mtp_eval = mtp

    # ---------------- evaluation (stock transformers on the reloaded checkpoint)
    import traceback
    try:
        if args.smoke:
            ev = evaluate(ref_model, mtp_eval, tok, held, dev, n_copy=16, n_arith=16, n_prose=4)
        else:
            ev = evaluate(ref_model, mtp_eval, tok, held, dev, n_copy=400, n_arith=600, n_prose=125)
    except Exception:  # noqa: BLE001
        ev = {"error": traceback.format_exc()}
        log(f"EVAL FAILED: {ev['error']}")

    # ---------------- references for the C++ engine (CPU, fp32)
    try:
        ref_cpu = ref_model.to("cpu")
        refs = reference_tokens(ref_cpu, tok)
        with open(os.path.join(args.out, "reference.json"), "w") as f:
            json.dump({"model": "tiny-next", "transformers": versions["transformers"], "torch": versions["torch"],
                       "device": "cpu", "dtype": "float32", "attn_implementation": "eager",
                       "note": "greedy = argmax of a no-cache forward per token; cached_generate = model.generate",
                       "prompts": refs}, f, indent=1)
            f.write("\n")
    except Exception:  # noqa: BLE001
        log(f"REFERENCE FAILED: {traceback.format_exc()}")

    outputs = ev.pop("outputs", None) if isinstance(ev, dict) else None
    if outputs is not None:
        with open(os.path.join(args.out, "eval_outputs.json"), "w") as f:
            json.dump({"note": "greedy tokens (transformers, fp32, on the shipped bf16 weights) per held-out case, in "
                               "the order of heldout.json's copy_passages / arith; generation stops at "
                               "<|im_end|> or <|endoftext|> (included)", **outputs}, f)
            f.write("\n")
    report = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "device": gpu, "versions": versions, "args": vars(args), "params": params,
        "config": {k: v for k, v in json.load(open(os.path.join(mdir, "config.json"))).items()},
        "tokenizer": {"vocab_in_tokenizer": n_tok, "model_vocab": V, "check": tok_check,
                      "train_tokens": int(len(stream)), "val_tokens": int(len(val_stream)),
                      "chars_per_token": chars / len(stream)},
        "fast_paths": {"gdn": gdn_check, "dense_experts_rel": exp_rel, "patched_gdn_layers": n_gdn,
                       "patched_expert_blocks": n_exp},
        "timing": timing, "train_seconds": train_s, "steps": step, "tokens_seen": tokens_seen,
        "stopped_early": stopped_early,
        "static_epochs": tokens_seen * (Bsz - n_fresh) / Bsz / len(stream),
        "final_val": {"ce": vl[0], "mtp_ce": vl[1], "fresh_ce": vl[2], "fresh_mtp_ce": vl[3]},
        "fresh": {**fresh_stats, "rows_per_step": n_fresh, "fresh_frac": args.fresh_frac,
                  "tokens_generated": fresh_stats["chunks"] * args.fresh_chunk_rows * (args.seq + 2)},
        "loss_curve": curve,
        "load_check": load_check, "model_dir_bytes": sizes, "eval": ev,
        "total_seconds": time.time() - T_START,
    }
    with open(os.path.join(args.out, "eval.json"), "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    log(f"wrote {args.out}/eval.json; total {time.time() - T_START:.1f}s")


if __name__ == "__main__":
    main()
