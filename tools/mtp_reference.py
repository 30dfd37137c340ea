#!/usr/bin/env python3
"""mtp_reference.py - reference logits of a qwen3_next checkpoint's MTP head, for tests/golden.

transformers ignores mtp.* (qwen3-next.md section 2.5), so this script runs the head itself, written
here from the formulas of qwen3-next.md section 6.1 (nothing copied from another implementation):

    u = concat(rmsnorm_zc(embed(x[p+1]), mtp.pre_fc_norm_embedding),     # embedding first
               rmsnorm_zc(H[p], mtp.pre_fc_norm_hidden))                  # H = model.norm output
    x = u @ mtp.fc^T
    x = x + gated_attention(rmsnorm_zc(x, input_layernorm), position p)  # the head's own KV cache
    x = x + moe(rmsnorm_zc(x, post_attention_layernorm))
    h = rmsnorm_zc(x, mtp.norm);  logits = h @ lm_head^T                  # shared lm_head

The target model's hidden states H (post final norm) and its logits come from transformers
(AutoModelForCausalLM, float32, no cache), the same reference as tests/golden.

For each prompt x[0..P-1] it writes
  * teacher-forced rows p = 0..P-2: the head at position p on (H[p], x[p+1]), attending to the
    head's cache rows 0..p (what it predicts is x[p+2]);
  * chained draft rows s = 1..k: g0 = argmax of the target's logits at P-1; step 1 runs the head at
    position P-1 on (H[P-1], g0), step s > 1 at position P-2+s on (h of step s-1, d_{s-1}), where
    d_s = argmax of step s's logits.
and checks the head against a float64 twin of the same code (fp64_max_rel_l2).

Usage (CPU is enough; the tiny checkpoints take seconds):
  python3 tools/mtp_reference.py --checkpoint DIR --prompts REF.json --steps 4 --out OUTDIR [--case NAME]
REF.json is a tests/golden reference.json (its "prompts"[i]["name"/"ids"] are used).
Writes OUTDIR/mtp_reference.json and OUTDIR/mtp.logits.f32 (float32 rows x vocab, little-endian;
each prompt's rows start at its "row0": teacher rows, then draft rows).
"""
import argparse
import datetime
import json
import math
import os
import platform

import torch


def load_config(d):
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    rp = c.get("rope_parameters") or {}
    c["_theta"] = float(rp.get("rope_theta", c.get("rope_theta", 10000.0)))
    c["_partial"] = float(rp.get("partial_rotary_factor", c.get("partial_rotary_factor", 0.25)))
    return c


def load_mtp_tensors(d):
    from safetensors import safe_open
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for fn in files:
        with safe_open(os.path.join(d, fn), framework="pt") as f:
            for k in f.keys():
                if k.startswith("mtp."):
                    out[k] = f.get_tensor(k)
    if not out:
        raise SystemExit(f"{d}: no mtp.* tensors")
    return out


class Head:
    """The MTP head in one dtype (float32 or float64), with its own KV cache."""

    def __init__(self, c, t, embed, lm_head, dtype):
        self.c, self.dt = c, dtype
        self.w = {k: v.to(dtype) for k, v in t.items()}
        self.embed, self.lm_head = embed.to(dtype), lm_head.to(dtype)
        self.eps = float(c["rms_norm_eps"])
        self.nh, self.nkv, self.D = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.rd = int(self.D * c["_partial"])
        # inv_freq in float32, as transformers computes it.
        inv = 1.0 / (c["_theta"] ** (torch.arange(0, self.rd, 2, dtype=torch.int64).float() / self.rd))
        self.inv_freq = inv
        self.K, self.V = [], []  # per cached position: [nkv, D]

    def norm(self, x, name):
        w = self.w[name]
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps) * (1.0 + w)

    def rope(self, x, pos):  # x [heads, D], NeoX pairs (i, i + rd/2) in the first rd dims
        ang = (torch.tensor(float(pos), dtype=torch.float32) * self.inv_freq)  # fp32 angle
        cos, sin = torch.cos(ang).to(self.dt), torch.sin(ang).to(self.dt)
        h = self.rd // 2
        a, b = x[:, :h].clone(), x[:, h:self.rd].clone()
        y = x.clone()
        y[:, :h] = a * cos - b * sin
        y[:, h:self.rd] = b * cos + a * sin
        return y

    def lin(self, name, x):
        return x @ self.w[name].T

    def ffn(self, p, x):
        g = self.lin(p + ".gate_proj.weight", x)
        u = self.lin(p + ".up_proj.weight", x)
        return self.lin(p + ".down_proj.weight", torch.nn.functional.silu(g) * u)

    def moe(self, x):
        p = "mtp.layers.0.mlp"
        c = self.c
        if p + ".gate.weight" not in self.w:
            return self.ffn(p, x)
        E, k = c["num_experts"], c["num_experts_per_tok"]
        probs = torch.softmax(self.lin(p + ".gate.weight", x), -1)  # fp32 (fp64 in the twin)
        w, idx = torch.topk(probs, k)
        if c.get("norm_topk_prob", True):
            w = w / w.sum()
        y = torch.zeros_like(x)
        packed = p + ".experts.gate_up_proj" in self.w
        I = c["moe_intermediate_size"]
        for j in range(k):
            e = int(idx[j])
            if packed:
                gu = self.w[p + ".experts.gate_up_proj"][e]
                g, u = x @ gu[:I].T, x @ gu[I:].T
                ye = (torch.nn.functional.silu(g) * u) @ self.w[p + ".experts.down_proj"][e].T
            else:
                ye = self.ffn(f"{p}.experts.{e}", x)
            y = y + w[j] * ye
        s = self.ffn(p + ".shared_expert", x)
        gate = torch.sigmoid(x @ self.w[p + ".shared_expert_gate.weight"][0])
        return y + gate * s

    def attention(self, x, pos):
        a = "mtp.layers.0.self_attn"
        nh, nkv, D = self.nh, self.nkv, self.D
        qg = self.lin(a + ".q_proj.weight", x).view(nh, 2 * D)
        q, gate = qg[:, :D], qg[:, D:].reshape(nh * D)
        k = self.lin(a + ".k_proj.weight", x).view(nkv, D)
        v = self.lin(a + ".v_proj.weight", x).view(nkv, D)
        q = self.rope(self.norm(q, a + ".q_norm.weight"), pos)
        k = self.rope(self.norm(k, a + ".k_norm.weight"), pos)
        # The cache row of this position (overwriting a draft row written there before).
        del self.K[pos:], self.V[pos:]
        self.K.append(k)
        self.V.append(v)
        Kc, Vc = torch.stack(self.K), torch.stack(self.V)  # [pos+1, nkv, D]
        o = torch.empty(nh, D, dtype=self.dt)
        for h in range(nh):
            kvh = h // (nh // nkv)
            s = (Kc[:, kvh] @ q[h]) / math.sqrt(D)
            o[h] = torch.softmax(s, -1) @ Vc[:, kvh]
        return self.lin(a + ".o_proj.weight", o.reshape(nh * D) * torch.sigmoid(gate))

    def step(self, h_prev, tok, pos):
        """One row of the head at position pos: returns (h, logits)."""
        e = self.embed[tok]
        u = torch.cat((self.norm(e, "mtp.pre_fc_norm_embedding.weight"),
                       self.norm(h_prev, "mtp.pre_fc_norm_hidden.weight")))
        x = self.lin("mtp.fc.weight", u)
        x = x + self.attention(self.norm(x, "mtp.layers.0.input_layernorm.weight"), pos)
        x = x + self.moe(self.norm(x, "mtp.layers.0.post_attention_layernorm.weight"))
        h = self.norm(x, "mtp.norm.weight")
        return h, h @ self.lm_head.T


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def run_prompt(c, mtp_t, embed, lm_head, H, tgt_logits, ids, steps):
    res = {}
    rows = {}
    for dt in (torch.float32, torch.float64):
        head = Head(c, mtp_t, embed, lm_head, dt)
        Hd = H.to(dt)
        out = []
        P = len(ids)
        for p in range(P - 1):
            _, lg = head.step(Hd[p], ids[p + 1], p)
            out.append(lg)
        g0 = int(tgt_logits[P - 1].argmax())
        h, tok, drafts = Hd[P - 1], g0, []
        for s in range(steps):
            h, lg = head.step(h, tok, P - 1 + s)
            out.append(lg)
            tok = int(lg.argmax())
            drafts.append(tok)
        rows[dt] = torch.stack(out)
        if dt == torch.float32:
            res["g0"], res["drafts"] = g0, drafts
        else:
            res["drafts_fp64"] = drafts
    r32, r64 = rows[torch.float32], rows[torch.float64]
    res["fp64_max_rel_l2"] = max(rel_l2(r32[i], r64[i]) for i in range(r32.shape[0]))
    top2 = torch.topk(r32, 2, dim=-1).values
    res["margins"] = [float(m) for m in (top2[:, 0] - top2[:, 1])]
    return res, r32


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--prompts", required=True, help="a tests/golden reference.json")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", required=True)
    ap.add_argument("--case", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    import transformers
    from transformers import AutoModelForCausalLM

    c = load_config(args.checkpoint)
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32).eval()
    mtp_t = {k: v.float() for k, v in load_mtp_tensors(args.checkpoint).items()}
    embed = model.model.embed_tokens.weight.detach().float()
    lm_head = model.lm_head.weight.detach().float()
    with open(args.prompts) as f:
        prompts = json.load(f)["prompts"]
    os.makedirs(args.out, exist_ok=True)
    out_rows, entries, row0 = [], [], 0
    with torch.no_grad():
        for p in prompts:
            ids = [int(t) for t in p["ids"]]
            x = torch.tensor([ids])
            H = model.model(input_ids=x, use_cache=False).last_hidden_state[0].float()
            tl = model.lm_head(H)
            res, r32 = run_prompt(c, mtp_t, embed, lm_head, H, tl, ids, args.steps)
            n = r32.shape[0]
            entries.append({"name": p["name"], "ids": ids, "row0": row0, "teacher_rows": len(ids) - 1,
                            "draft_rows": args.steps, **res})
            out_rows.append(r32)
            row0 += n
            print(f"{p['name']}: P={len(ids)} g0={res['g0']} drafts={res['drafts']} "
                  f"fp64 max rel-L2 {res['fp64_max_rel_l2']:.2e}")
    allr = torch.cat(out_rows).float().contiguous()
    allr.numpy().astype("<f4").tofile(os.path.join(args.out, "mtp.logits.f32"))
    meta = {
        "case": args.case or os.path.basename(os.path.normpath(args.checkpoint)),
        "tool": "tools/mtp_reference.py",
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "python": platform.python_version(), "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "vocab_size": int(lm_head.shape[0]), "draft_steps": args.steps, "logits_file": "mtp.logits.f32",
        "rows": int(allr.shape[0]), "prompts": entries,
    }
    with open(os.path.join(args.out, "mtp_reference.json"), "w") as f:
        json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()
