#!/usr/bin/env python3
"""make_golden.py - tiny random Qwen3-Next checkpoints + Hugging Face reference logits.

What it does
------------
Builds tiny, seeded, RANDOM `qwen3_next` checkpoints (several shapes, on-disk dtypes
and tensor layouts), reloads each written directory with Hugging Face transformers
(`AutoModelForCausalLM.from_pretrained(dir, dtype=torch.float32)`) and writes the
logits that transformers computes for a few prompts.  TensorFold's golden tests load
the same directories with the C++ engine and compare against these logits.
Only transformers computes numbers here; this script only chooses configs, draws
weights, and writes files.

How the committed set was made (see tests/golden/README.md for versions and date)
-------------------------------------------------------------------------------
On the H200 device machine (CPU only; PyTorch 2.11.0, transformers 5.17.0), from the
repository root:

    python3 tools/make_golden.py --out $OUT/golden --set golden --seed 1234
    python3 tools/make_golden.py --out $OUT/unseen --set unseen --seed 5678

`--set golden` is committed under tests/golden/<case>/; `--set unseen` (bigger,
different shapes/options) is kept outside the repository for a one-off check that
nothing in the engine is hard-coded.  Everything is deterministic given --seed.

What it writes, per case, under OUT/<case_name>/
-----------------------------------------------
  config.json                      written in the case's `config_style` (see CASES)
  model.safetensors                single-file cases, or
  model-0000K-of-0000N.safetensors + model.safetensors.index.json   sharded cases
                                   (HF format: {"metadata": {"total_size": bytes},
                                   "weight_map": {tensor name: file name}})
  reference.json                   see below
  <prompt>.logits.f32              raw float32 little-endian, rows x vocab_size, row-major
and OUT/summary.json (versions, date, per-case sizes/errors, and how transformers resolves
rope keys that a config.json leaves out).

Expert tensors on disk (written by this script with the safetensors library):
  expert_layout "per_expert" (as in the released Qwen3-Next-80B checkpoints):
      model.layers.{i}.mlp.experts.{e}.gate_proj.weight  [I, H]
      model.layers.{i}.mlp.experts.{e}.up_proj.weight    [I, H]
      model.layers.{i}.mlp.experts.{e}.down_proj.weight  [H, I]
  expert_layout "packed" (transformers-5 in-memory layout):
      model.layers.{i}.mlp.experts.gate_up_proj          [E, 2I, H]  rows [0,I) = gate, [I,2I) = up
      model.layers.{i}.mlp.experts.down_proj             [E, H, I]
  With tie_word_embeddings=true, lm_head.weight is not written.
  Cases with "mtp": true also carry random mtp.* tensors (multi-token-prediction head,
  names of qwen3-next.md section 2.5) which transformers ignores on load.

reference.json:
  {"case", "transformers_version", "torch_version", "dtype_on_disk",
   "float32_on_disk": [name patterns stored as float32 despite dtype_on_disk, e.g. "*linear_attn.A_log"],
   "expert_layout": "per_expert"|"packed", "config_style", "n_shards", "files", "mtp",
   "weights_seed", "n_generated": N (=8), "code_paths": {...},
   "effective_config": {what transformers made of config.json: layer_types,
                        rope_parameters, per-layer mlp kind, ...},
   "prompts": [{"name": "p7", "ids": [P ids], "greedy": [N ids],
                "logits_file": "p7.logits.f32", "rows": P+N-1,
                "margins": [P+N-1 floats: top1-top2 logit margin of every row],
                "greedy_margins": [N floats: margins of rows P-1 .. P+N-2],
                "min_router_logit_gap": smallest gap, in router-logit units, between the
                    k-th and (k+1)-th expert over all MoE layers and positions,
                "fp32_vs_fp64_max_rel_l2": max over rows of |l32-l64|/|l64|,
                "fp64_argmax_matches": the fp64 twin picks the same argmax on every row,
                "cached_generate_tokens_match": bool,
                "cached_generate_max_rel_l2": max over generated steps}]}

Rows: for a prompt of P tokens and N=8 greedy tokens g0..g7,
  row i (i < P)       = logits after prompt position i (one no-cache forward of the prompt);
  row P+n (n < N-1)   = logits after feeding g_n, i.e. the last row of a no-cache forward
                        over prompt + g0..g_n;
  g0 = argmax(row P-1), g_{n+1} = argmax(row P+n).  Total rows P+N-1.

Weights: every parameter is drawn from a seeded generator (see `draw`), rounded to the
on-disk dtype, and the draw is repeated with seed + 1000*attempt until (a) every router's
k-th vs (k+1)-th expert logit gap is >= 1e-4, (b) every row that picks a greedy token has a
top-2 margin >= 1e-3 and (c) the fp32 reference is within 3e-5 (max per-row relative L2) of
the fp64 twin; so a correct engine cannot flip a decision by rounding noise and the reference
itself is accurate well inside the tests' 1e-4 tolerance.  "weights_seed" records the draw used.

Reference computation: CPU, float32, eval mode, attn_implementation="eager",
experts_implementation="eager", pure-PyTorch Gated-DeltaNet path
(torch_chunk_gated_delta_rule for no-cache forwards; torch_recurrent_gated_delta_rule +
torch_causal_conv1d_update are only used by the cached `generate` cross-check).
The reference is computed from the RELOADED model, so it reflects exactly the weights on
disk (bf16/f16 rounding included).  The fp64 numbers (informational) come from
transformers' own qwen3_next modeling source with every hard-coded float32 upcast
rewritten to float64 (so the whole forward, incl. norms/softmax/delta rule, is fp64).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import functools
import inspect
import json
import math
import os
import re
import sys
import time
import types

import numpy as np
import torch

N_GEN = 8  # greedy tokens per prompt

# --------------------------------------------------------------------------------------
# Cases.  `cfg` holds the qwen3_next config fields; `rope_theta` / `partial_rotary_factor`
# are written according to `style`:
#   "legacy"   hand-written config.json like the released Qwen3-Next-80B one: top-level
#              rope_theta / partial_rotary_factor / rope_scaling: null, full_attention_interval,
#              no layer_types, "torch_dtype".
#   "hf"       the config is built with transformers' Qwen3NextConfig and written by its
#              save_pretrained (transformers-5 style: rope_parameters dict, layer_types list).
#              NOTE: transformers 5.17 then ALSO writes a top-level "partial_rotary_factor": 0.25
#              (Qwen3NextConfig's backward-compat default) next to rope_parameters; the model uses
#              rope_parameters["partial_rotary_factor"], so a loader must give that precedence.
#   "explicit" hand-written with an explicit (irregular) layer_types list and a
#              transformers-5 style rope_parameters dict, no full_attention_interval.
# --------------------------------------------------------------------------------------

GOLDEN_CASES = [
    dict(
        name="a_bf16_per_expert",
        disk_dtype="bfloat16", layout="per_expert", shards=1, mtp=False, style="legacy",
        prompt_lengths=[1, 7, 64, 65, 160],
        cfg=dict(
            vocab_size=384, hidden_size=64, num_hidden_layers=5, full_attention_interval=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32,  # GQA 2
            rope_theta=10000000.0, partial_rotary_factor=0.25,          # rotary dim 8
            linear_num_key_heads=2, linear_num_value_heads=4,           # r = 2
            linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
            num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
            shared_expert_intermediate_size=32, intermediate_size=96,
            norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
            rms_norm_eps=1e-6, tie_word_embeddings=False,
        ),
    ),
    dict(
        name="b_f32_packed_sharded",
        disk_dtype="float32", layout="packed", shards=3, mtp=False, style="hf",
        prompt_lengths=[1, 7, 64, 65, 160],
        cfg=dict(
            vocab_size=320, hidden_size=32, num_hidden_layers=6, full_attention_interval=3,
            num_attention_heads=4, num_key_value_heads=4, head_dim=16,  # GQA 1
            rope_theta=10000.0, partial_rotary_factor=1.0,              # rotary dim 16
            linear_num_key_heads=4, linear_num_value_heads=4,           # r = 1
            linear_key_head_dim=16, linear_value_head_dim=24, linear_conv_kernel_dim=4,  # d_k != d_v
            num_experts=6, num_experts_per_tok=3, moe_intermediate_size=16,
            shared_expert_intermediate_size=16, intermediate_size=64,
            norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[1],  # layer 1 dense
            rms_norm_eps=1e-5, tie_word_embeddings=False,
        ),
    ),
    dict(
        name="c_f16_tied_mtp",
        disk_dtype="float16", layout="per_expert", shards=1, mtp=True, style="explicit",
        prompt_lengths=[1, 7, 64, 65, 160],
        cfg=dict(
            vocab_size=448, hidden_size=48, num_hidden_layers=6,
            layer_types=["full_attention", "linear_attention", "linear_attention",
                         "full_attention", "linear_attention", "linear_attention"],
            num_attention_heads=4, num_key_value_heads=1, head_dim=32,  # GQA 4
            rope_theta=1000000.0, partial_rotary_factor=0.5,            # rotary dim 16
            linear_num_key_heads=1, linear_num_value_heads=4,           # r = 4
            linear_key_head_dim=24, linear_value_head_dim=16, linear_conv_kernel_dim=4,
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
            shared_expert_intermediate_size=24, intermediate_size=64,
            norm_topk_prob=True, decoder_sparse_step=2, mlp_only_layers=[],  # MoE on odd layers only
            rms_norm_eps=1e-6, tie_word_embeddings=True,
        ),
    ),
    dict(
        name="d_bf16_per_expert_sharded",
        disk_dtype="bfloat16", layout="per_expert", shards=2, mtp=False, style="legacy",
        f32_tensors=["linear_attn.A_log"],  # mixed dtypes: A_log stays float32 on disk
        prompt_lengths=[1, 7, 64, 65, 160],
        cfg=dict(
            vocab_size=300, hidden_size=96, num_hidden_layers=4, full_attention_interval=2,
            num_attention_heads=6, num_key_value_heads=2, head_dim=16,  # GQA 3
            rope_theta=5000000.0, partial_rotary_factor=0.25,           # rotary dim 4
            linear_num_key_heads=3, linear_num_value_heads=6,           # r = 2, odd head count
            linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
            num_experts=5, num_experts_per_tok=3, moe_intermediate_size=16,
            shared_expert_intermediate_size=16, intermediate_size=64,
            norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[],
            rms_norm_eps=1e-5, tie_word_embeddings=False,
        ),
    ),
]

UNSEEN_CASES = [
    dict(
        name="u1_bf16_h128_packed",
        disk_dtype="bfloat16", layout="packed", shards=1, mtp=False, style="hf",
        prompt_lengths=[1, 7, 64, 65, 200],
        cfg=dict(
            vocab_size=1000, hidden_size=128, num_hidden_layers=8, full_attention_interval=4,
            num_attention_heads=8, num_key_value_heads=2, head_dim=64,  # GQA 4
            rope_theta=10000000.0, partial_rotary_factor=0.25,          # rotary dim 16
            linear_num_key_heads=2, linear_num_value_heads=8,           # r = 4
            linear_key_head_dim=32, linear_value_head_dim=32, linear_conv_kernel_dim=4,
            num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=64, intermediate_size=256,
            norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
            rms_norm_eps=1e-6, tie_word_embeddings=False,
        ),
    ),
    dict(
        name="u2_f32_sharded_mtp_conv3",
        disk_dtype="float32", layout="per_expert", shards=3, mtp=True, style="explicit",
        prompt_lengths=[1, 7, 64, 65, 180],
        cfg=dict(
            vocab_size=700, hidden_size=80, num_hidden_layers=7,
            layer_types=["linear_attention", "linear_attention", "full_attention",
                         "linear_attention", "full_attention", "linear_attention",
                         "linear_attention"],
            num_attention_heads=8, num_key_value_heads=1, head_dim=32,  # GQA 8
            rope_theta=100000.0, partial_rotary_factor=0.75,            # rotary dim 24
            linear_num_key_heads=2, linear_num_value_heads=6,           # r = 3
            linear_key_head_dim=32, linear_value_head_dim=48, linear_conv_kernel_dim=3,
            num_experts=6, num_experts_per_tok=2, moe_intermediate_size=24,
            shared_expert_intermediate_size=32, intermediate_size=96,
            norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[0, 4],
            rms_norm_eps=1e-5, tie_word_embeddings=True,
        ),
    ),
    dict(
        name="u3_f16_packed_sharded",
        disk_dtype="float16", layout="packed", shards=2, mtp=False, style="legacy",
        prompt_lengths=[1, 7, 64, 65, 150],
        cfg=dict(
            vocab_size=512, hidden_size=112, num_hidden_layers=6, full_attention_interval=5,
            num_attention_heads=7, num_key_value_heads=7, head_dim=16,  # GQA 1, odd heads
            rope_theta=1000000.0, partial_rotary_factor=0.5,            # rotary dim 8
            linear_num_key_heads=2, linear_num_value_heads=4,           # r = 2
            linear_key_head_dim=64, linear_value_head_dim=32, linear_conv_kernel_dim=4,
            num_experts=4, num_experts_per_tok=3, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, intermediate_size=160,
            norm_topk_prob=True, decoder_sparse_step=3, mlp_only_layers=[],  # MoE on layers 2, 5
            rms_norm_eps=1e-6, tie_word_embeddings=False,
        ),
    ),
]

# Fields written into every config.json (besides the case's own).
COMMON_FIELDS = dict(
    hidden_act="silu", max_position_embeddings=4096, initializer_range=0.02,
    attention_bias=False, attention_dropout=0.0, use_cache=True,
    router_aux_loss_coef=0.001, output_router_logits=False,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Acceptance thresholds for the random draw (re-drawn with another seed otherwise) so that
# a correct engine cannot flip a decision by rounding noise.
MIN_ROUTER_GAP = 1e-4     # router logit units, k-th vs (k+1)-th expert
MIN_GREEDY_MARGIN = 1e-3  # top1 - top2 logit margin of every row that picks a greedy token
MAX_FP64_REL = 3e-5       # fp32 reference vs fp64 twin, max per-row relative L2 (reference accuracy)
MAX_ATTEMPTS = 8


def log(*a):
    print(*a, flush=True)


# --------------------------------------------------------------------------------------
# transformers hooks: make the code paths observable
# --------------------------------------------------------------------------------------

CALLS: dict[str, int] = {}


def _counting(name, fn):
    def wrapper(*a, **k):
        CALLS[name] = CALLS.get(name, 0) + 1
        return fn(*a, **k)
    wrapper.__name__ = getattr(fn, "__name__", name)
    wrapper.__wrapped__ = fn
    return wrapper


def instrument_transformers():
    """Wrap the pure-PyTorch kernels of modeling_qwen3_next with call counters.

    Must run before any model is built: Qwen3NextGatedDeltaNet binds these functions
    to instance attributes in __init__."""
    import transformers.models.qwen3_next.modeling_qwen3_next as m
    import importlib.util
    fast = {pkg: importlib.util.find_spec(pkg) is not None for pkg in ("fla", "causal_conv1d", "kernels")}
    for fname in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule",
                  "causal_conv1d_fn", "causal_conv1d_update", "torch_causal_conv1d_update",
                  "eager_attention_forward"):
        if hasattr(m, fname):
            fn = getattr(m, fname)
            fast[fname] = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
            setattr(m, fname, _counting(fname, fn))
    return m, fast


def make_fp64_model_class(m):
    """transformers' own qwen3_next modeling source with every float32 upcast made float64.

    Returns (Qwen3NextForCausalLM class of the rewritten module, number of rewrites)."""
    src = inspect.getsource(m)
    n = 0
    src, k = re.subn(r"torch\.float32\b", "torch.float64", src); n += k
    src, k = re.subn(r"torch\.float(?![0-9A-Za-z_])", "torch.float64", src); n += k
    src, k = re.subn(r"\.float\(\)", ".double()", src); n += k
    name = m.__name__ + "_fp64"
    mod = types.ModuleType(name)
    mod.__file__ = m.__file__
    mod.__package__ = m.__package__
    sys.modules[name] = mod
    # dont_inherit: this script's `from __future__ import annotations` must not leak into the
    # rewritten module (transformers reads `config: Qwen3NextConfig` as a real class).
    exec(compile(src, m.__file__ + " (float64 rewrite)", "exec", dont_inherit=True), mod.__dict__)
    return mod.Qwen3NextForCausalLM, n


# --------------------------------------------------------------------------------------
# config.json
# --------------------------------------------------------------------------------------

def expected_layer_types(cfg):
    if "layer_types" in cfg:
        return list(cfg["layer_types"])
    k = cfg["full_attention_interval"]
    return ["linear_attention" if (i + 1) % k else "full_attention" for i in range(cfg["num_hidden_layers"])]


def expected_mlp_kinds(cfg):
    return ["moe" if (i not in cfg["mlp_only_layers"] and cfg["num_experts"] > 0
                      and (i + 1) % cfg["decoder_sparse_step"] == 0) else "dense"
            for i in range(cfg["num_hidden_layers"])]


def write_config(case, d):
    c = dict(case["cfg"])
    theta = c.pop("rope_theta")
    prf = c.pop("partial_rotary_factor")
    fields = dict(COMMON_FIELDS, **c)
    style = case["style"]
    if style == "hf":
        from transformers import Qwen3NextConfig
        cfg = Qwen3NextConfig(
            **fields,
            rope_parameters={"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": prf},
        )
        cfg.architectures = ["Qwen3NextForCausalLM"]
        cfg.save_pretrained(d)
        return
    js = {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next"}
    js.update(fields)
    if style == "legacy":
        assert "layer_types" not in js
        js.update(rope_theta=theta, partial_rotary_factor=prf, rope_scaling=None,
                  torch_dtype=case["disk_dtype"])
    elif style == "explicit":
        assert "full_attention_interval" not in js
        js.update(rope_parameters={"rope_type": "default", "rope_theta": theta,
                                   "partial_rotary_factor": prf},
                  dtype=case["disk_dtype"])
    else:
        raise ValueError(style)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(js, f, indent=2, sort_keys=True)
        f.write("\n")


def effective_config(model):
    """What transformers made of config.json (as the model actually uses it)."""
    cfg = model.config
    inner = model.model
    rot = inner.rotary_emb
    inv = rot.inv_freq.double()
    rot_dim = 2 * inv.numel()
    theta_eff = float((1.0 / inv[1]) ** (rot_dim / 2.0)) if inv.numel() > 1 else None
    mlp = []
    for layer in inner.layers:
        mlp.append("moe" if hasattr(layer.mlp, "experts") else "dense")
    rp = getattr(cfg, "rope_parameters", None)
    return {
        "layer_types": list(cfg.layer_types),
        "mlp_kinds": mlp,
        "rope_parameters": {k: v for k, v in dict(rp).items()} if rp is not None else None,
        "rotary_dim_used": rot_dim,
        "rope_theta_from_inv_freq": theta_eff,
        "tie_word_embeddings": bool(getattr(cfg, "tie_word_embeddings", False)),
        "lm_head_is_embed": model.lm_head.weight.data_ptr() == inner.embed_tokens.weight.data_ptr(),
        "attn_implementation": getattr(cfg, "_attn_implementation", None),
        "experts_implementation": getattr(cfg, "_experts_implementation", None),
    }


def check_effective(case, eff):
    c = case["cfg"]
    assert eff["layer_types"] == expected_layer_types(c), (eff["layer_types"], expected_layer_types(c))
    assert eff["mlp_kinds"] == expected_mlp_kinds(c), (eff["mlp_kinds"], expected_mlp_kinds(c))
    assert eff["rotary_dim_used"] == int(c["head_dim"] * c["partial_rotary_factor"]), eff
    assert abs(eff["rope_theta_from_inv_freq"] / c["rope_theta"] - 1) < 1e-4, eff
    assert eff["lm_head_is_embed"] == c["tie_word_embeddings"], eff


# --------------------------------------------------------------------------------------
# random weights
# --------------------------------------------------------------------------------------

def draw(name, shape, g, hidden, tied=False):
    """Random value for one parameter, by name.  Every tensor is moved away from its init."""
    def normal(std):
        return torch.randn(shape, generator=g, dtype=torch.float64) * std

    def uniform(lo, hi):
        return torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo

    if name.endswith("linear_attn.norm.weight"):      # gated RMSNorm: plain weight around 1
        return 1.0 + normal(0.1)
    if re.search(r"norm[a-z_]*\.weight$", name):      # zero-centred RMSNorms (x * (1 + w)), incl. mtp.pre_fc_norm_*
        return normal(0.1)
    if name.endswith("A_log"):                        # decay rates A in [0.1, 3]
        return torch.log(uniform(0.1, 3.0))
    if name.endswith("dt_bias"):
        return uniform(-1.0, 1.0)
    if name.endswith("conv1d.weight"):
        return normal(0.3)
    if name.endswith("embed_tokens.weight"):
        # With a tied head, a large embedding makes logits ~ |E_x|^2 for the input token x and
        # greedy decoding just repeats it; a small one lets the layers dominate.
        return normal(0.25 if tied else 1.0)
    if name == "lm_head.weight":
        return normal(2.5 / math.sqrt(hidden))
    if name.endswith("mlp.gate.weight"):              # router: well separated logits
        return normal(2.0 / math.sqrt(hidden))
    if len(shape) >= 2:                               # every projection (incl. packed experts)
        return normal(1.0 / math.sqrt(shape[-1]))
    raise ValueError(f"no init rule for parameter {name} {tuple(shape)}")


def tensor_dtype(name, disk_dtype, f32_tensors):
    """On-disk dtype of one tensor: the case's dtype, or float32 for names ending in f32_tensors."""
    return torch.float32 if any(name.endswith(sfx) for sfx in f32_tensors) else disk_dtype


def fill_random(model, seed, disk_dtype, f32_tensors=()):
    """Overwrite every parameter with seeded random values rounded to the on-disk dtype."""
    g = torch.Generator().manual_seed(seed)
    hidden = model.config.hidden_size
    tied = bool(model.config.tie_word_embeddings)
    names = []
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            v = draw(name, tuple(p.shape), g, hidden, tied)
            p.copy_(v.to(tensor_dtype(name, disk_dtype, f32_tensors)).to(p.dtype))
            names.append(name)
    return names


def mtp_tensors(cfg, seed, disk_dtype, layout):
    """Random mtp.* tensors (qwen3-next.md section 2.5), scaled to the tiny config."""
    g = torch.Generator().manual_seed(seed)
    H, nh, nkv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    E, I, S = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
    shapes = {
        "mtp.fc.weight": (H, 2 * H),
        "mtp.pre_fc_norm_embedding.weight": (H,),
        "mtp.pre_fc_norm_hidden.weight": (H,),
        "mtp.norm.weight": (H,),
        "mtp.layers.0.input_layernorm.weight": (H,),
        "mtp.layers.0.post_attention_layernorm.weight": (H,),
        "mtp.layers.0.self_attn.q_proj.weight": (nh * hd * 2, H),
        "mtp.layers.0.self_attn.k_proj.weight": (nkv * hd, H),
        "mtp.layers.0.self_attn.v_proj.weight": (nkv * hd, H),
        "mtp.layers.0.self_attn.o_proj.weight": (H, nh * hd),
        "mtp.layers.0.self_attn.q_norm.weight": (hd,),
        "mtp.layers.0.self_attn.k_norm.weight": (hd,),
        "mtp.layers.0.mlp.gate.weight": (E, H),
    }
    if layout == "per_expert":
        for e in range(E):
            shapes[f"mtp.layers.0.mlp.experts.{e}.gate_proj.weight"] = (I, H)
            shapes[f"mtp.layers.0.mlp.experts.{e}.up_proj.weight"] = (I, H)
            shapes[f"mtp.layers.0.mlp.experts.{e}.down_proj.weight"] = (H, I)
    else:
        shapes["mtp.layers.0.mlp.experts.gate_up_proj"] = (E, 2 * I, H)
        shapes["mtp.layers.0.mlp.experts.down_proj"] = (E, H, I)
    shapes.update({
        "mtp.layers.0.mlp.shared_expert.gate_proj.weight": (S, H),
        "mtp.layers.0.mlp.shared_expert.up_proj.weight": (S, H),
        "mtp.layers.0.mlp.shared_expert.down_proj.weight": (H, S),
        "mtp.layers.0.mlp.shared_expert_gate.weight": (1, H),
    })
    return {n: draw(n, s, g, H).to(disk_dtype).contiguous() for n, s in shapes.items()}


# --------------------------------------------------------------------------------------
# on-disk layout
# --------------------------------------------------------------------------------------

PACKED_RE = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")
PER_EXPERT_RE = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def to_disk_tensors(state_dict, layout, disk_dtype, tied, f32_tensors=()):
    """In-memory (transformers) tensor names -> on-disk names for the chosen expert layout.

    transformers 5 keeps experts packed in memory:
        <p>.mlp.experts.gate_up_proj [E, 2I, H]   (gate rows first, then up; forward uses chunk(2))
        <p>.mlp.experts.down_proj    [E, H, I]
    per_expert on disk:
        <p>.mlp.experts.{e}.gate_proj.weight = gate_up_proj[e, :I]
        <p>.mlp.experts.{e}.up_proj.weight   = gate_up_proj[e, I:]
        <p>.mlp.experts.{e}.down_proj.weight = down_proj[e]
    (If a transformers version kept per-expert modules in memory, they are packed here for
    the packed layout instead.)"""
    out = {}
    per_expert_mem = {}
    for name, t in state_dict.items():
        if tied and name == "lm_head.weight":
            continue
        t = t.detach()
        m = PACKED_RE.match(name)
        pm = PER_EXPERT_RE.match(name)
        if m and layout == "per_expert":
            prefix, kind = m.groups()
            if kind == "gate_up_proj":
                inter = t.shape[1] // 2
                for e in range(t.shape[0]):
                    out[f"{prefix}.{e}.gate_proj.weight"] = t[e, :inter]
                    out[f"{prefix}.{e}.up_proj.weight"] = t[e, inter:]
            else:
                for e in range(t.shape[0]):
                    out[f"{prefix}.{e}.down_proj.weight"] = t[e]
        elif pm and layout == "packed":
            prefix, e, kind = pm.groups()
            per_expert_mem.setdefault(prefix, {}).setdefault(kind, {})[int(e)] = t
        else:
            out[name] = t
    for prefix, kinds in per_expert_mem.items():
        E = len(kinds["gate_proj"])
        out[f"{prefix}.gate_up_proj"] = torch.stack(
            [torch.cat([kinds["gate_proj"][e], kinds["up_proj"][e]], 0) for e in range(E)])
        out[f"{prefix}.down_proj"] = torch.stack([kinds["down_proj"][e] for e in range(E)])
    return {k: v.to(tensor_dtype(k, disk_dtype, f32_tensors)).contiguous().clone() for k, v in out.items()}


def write_safetensors(tensors, d, n_shards):
    from safetensors.torch import save_file
    names = list(tensors.keys())
    if n_shards == 1:
        save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        return ["model.safetensors"]
    sizes = [tensors[n].numel() * tensors[n].element_size() for n in names]
    total = sum(sizes)
    shards = [[] for _ in range(n_shards)]
    acc, cur = 0, 0
    for n, s in zip(names, sizes):
        if cur < n_shards - 1 and acc >= total * (cur + 1) / n_shards:
            cur += 1
        shards[cur].append(n)
        acc += s
    assert all(shards), "a shard is empty"
    files, weight_map = [], {}
    for i, group in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
        save_file({n: tensors[n] for n in group}, os.path.join(d, fn), metadata={"format": "pt"})
        files.append(fn)
        for n in group:
            weight_map[n] = fn
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
                  f, indent=2)
        f.write("\n")
    return files


# --------------------------------------------------------------------------------------
# model loading / running
# --------------------------------------------------------------------------------------

def force_eager(model):
    """Pin attention and experts to the plain eager implementations."""
    for setter in ("set_attn_implementation", "set_experts_implementation"):
        fn = getattr(model, setter, None)
        if fn is not None:
            try:
                fn("eager")
            except Exception as e:  # noqa: BLE001 - informational
                log(f"  note: {setter}('eager') failed: {e!r}")
    cfg = model.config
    if getattr(cfg, "_experts_implementation", "eager") not in (None, "eager"):
        cfg._experts_implementation = "eager"
    assert cfg._attn_implementation == "eager", cfg._attn_implementation
    assert getattr(cfg, "_experts_implementation", "eager") in (None, "eager"), cfg._experts_implementation
    model.eval()
    return model


def make_twin64(cls64, model):
    """fp64 twin of an in-memory fp32 model (same weights), built from the fp64-rewritten class."""
    m = cls64(copy.deepcopy(model.config)).double()
    m.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    return force_eager(m)


def load(cls_or_auto, d, dtype):
    kw = dict(dtype=dtype, attn_implementation="eager", output_loading_info=True)
    try:
        model, info = cls_or_auto.from_pretrained(d, experts_implementation="eager", **kw)
    except (TypeError, ValueError) as e:
        log(f"  note: from_pretrained(experts_implementation=...) refused ({e!r}); retrying without")
        model, info = cls_or_auto.from_pretrained(d, **kw)
    return force_eager(model), info


class RouterGaps:
    """Forward hooks on every router: smallest k-th vs (k+1)-th router-logit gap."""

    def __init__(self, model):
        self.min_gap = math.inf
        self.handles = []
        for name, mod in model.named_modules():
            if name.endswith("mlp.gate") and hasattr(mod, "weight") and mod.weight.dim() == 2:
                self.handles.append(mod.register_forward_hook(self._hook))
        self.k = model.config.num_experts_per_tok

    def _hook(self, mod, inp, out):
        probs = out[0] if isinstance(out, (tuple, list)) else out
        probs = probs.detach().double().reshape(-1, probs.shape[-1])
        if probs.min() >= 0 and torch.allclose(probs.sum(-1), torch.ones_like(probs[:, 0]), atol=1e-4):
            logits = torch.log(probs)  # softmax probabilities -> logits up to a per-row constant
        else:
            logits = probs
        top = torch.topk(logits, self.k + 1, dim=-1).values
        self.min_gap = min(self.min_gap, float((top[:, self.k - 1] - top[:, self.k]).min()))

    def close(self):
        for h in self.handles:
            h.remove()


@torch.inference_mode()
def forward_logits(model, ids):
    x = torch.tensor([ids], dtype=torch.long)
    return model(input_ids=x, use_cache=False).logits[0].double()


@torch.inference_mode()
def reference_rows(model, prompt, greedy=None):
    """Rows of section 'Rows' in the docstring.  greedy=None: choose tokens by argmax;
    otherwise teacher-force the given tokens.  Returns (rows [P+N-1, V] float64, tokens)."""
    rows = [forward_logits(model, prompt)]
    toks = []
    for n in range(N_GEN):
        last = rows[-1][-1]
        t = int(torch.argmax(last)) if greedy is None else int(greedy[n])
        toks.append(t)
        if n < N_GEN - 1:
            rows.append(forward_logits(model, prompt + toks)[-1:])
    return torch.cat(rows, 0), toks


def margins_of(rows):
    top2 = torch.topk(rows, 2, dim=-1).values
    return (top2[:, 0] - top2[:, 1]).tolist()


def rel_l2(a, b):
    """Per-row relative L2 error of a against b (b = reference)."""
    return ((a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-30))


@torch.inference_mode()
def cached_generate(model, prompt):
    """transformers' cached decode path (generate + past_key_values)."""
    x = torch.tensor([prompt], dtype=torch.long)
    out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=N_GEN,
                         do_sample=False, num_beams=1, use_cache=True,
                         return_dict_in_generate=True, output_logits=True, pad_token_id=0)
    # generate() may switch the experts implementation for decoding (grouped_mm -> batched_mm
    # off-CPU); with eager on CPU it must not, and the next reference must stay on eager.
    assert getattr(model.config, "_experts_implementation", "eager") in (None, "eager")
    toks = out.sequences[0, len(prompt):].tolist()
    logits = torch.cat([l.double() for l in out.logits], 0)  # [N, V]: rows P-1 .. P+N-2
    return toks, logits


# --------------------------------------------------------------------------------------
# one case
# --------------------------------------------------------------------------------------

def build_case(case, out_root, base_seed, case_index, modeling, cls64, versions):
    from transformers import AutoConfig, AutoModelForCausalLM

    name = case["name"]
    d = os.path.join(out_root, name)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    disk_dtype = DTYPES[case["disk_dtype"]]
    f32_tensors = list(case.get("f32_tensors", []))
    c = case["cfg"]
    t0 = time.time()
    log(f"=== {name}: {case['disk_dtype']} {case['layout']} shards={case['shards']} "
        f"mtp={case['mtp']} style={case['style']}")

    write_config(case, d)
    config = AutoConfig.from_pretrained(d)

    # Prompts: random ids, fixed seed per case.
    pg = torch.Generator().manual_seed(base_seed * 7919 + 17 * case_index + 1)
    prompts = [(f"p{P}", torch.randint(0, c["vocab_size"], (P,), generator=pg).tolist())
               for P in case["prompt_lengths"]]

    if cls64 is not None and not isinstance(cls64, type):
        cls64 = cls64()  # build the fp64-rewritten class once (cached)

    # Draw weights; re-draw until routing and greedy decisions are robust and the fp32
    # reference is accurate (see thresholds).
    best = None
    for attempt in range(MAX_ATTEMPTS):
        seed = base_seed + 101 * case_index + 1000 * attempt
        torch.manual_seed(seed)
        mem = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
        mem = force_eager(mem.float())
        fill_random(mem, seed, disk_dtype, f32_tensors)
        gaps = RouterGaps(mem)
        worst_margin = math.inf
        mem_rows, mem_toks = {}, {}
        for pname, ids in prompts:
            rows, toks = reference_rows(mem, ids)
            mem_rows[pname], mem_toks[pname] = rows, toks
            worst_margin = min(worst_margin, min(margins_of(rows)[len(ids) - 1:]))
        gaps.close()
        fp64_err = 0.0
        if cls64 is not None:
            twin = make_twin64(cls64, mem)
            for pname, ids in prompts:
                rows64, _ = reference_rows(twin, ids, greedy=mem_toks[pname])
                fp64_err = max(fp64_err, float(rel_l2(mem_rows[pname], rows64).max()))
            del twin
        ok = (gaps.min_gap >= MIN_ROUTER_GAP and worst_margin >= MIN_GREEDY_MARGIN
              and fp64_err <= MAX_FP64_REL)
        log(f"  attempt {attempt} seed {seed}: min router gap {gaps.min_gap:.3g}, "
            f"min greedy margin {worst_margin:.3g}, fp32 vs fp64 {fp64_err:.3g} -> {'ok' if ok else 'redraw'}")
        score = min(gaps.min_gap / MIN_ROUTER_GAP, worst_margin / MIN_GREEDY_MARGIN,
                    MAX_FP64_REL / max(fp64_err, 1e-30))
        if best is None or score > best[0]:
            best = (score, seed, mem, mem_rows)
        if ok:
            break
    else:
        log(f"  WARNING: no draw met the thresholds; using best seed {best[1]}")
    _, seed, mem, mem_rows = best

    # Write the checkpoint.
    tied = bool(c["tie_word_embeddings"])
    mem_sd = mem.state_dict()
    tensors = to_disk_tensors(mem_sd, case["layout"], disk_dtype, tied, f32_tensors)
    n_model_tensors = len(tensors)
    if case["mtp"]:
        tensors.update(mtp_tensors(c, seed + 777, disk_dtype, case["layout"]))
    files = write_safetensors(tensors, d, case["shards"])
    log(f"  wrote {len(tensors)} tensors ({n_model_tensors} model, {len(tensors) - n_model_tensors} mtp) "
        f"in {files}")

    # Re-read the files with the safetensors library: names/dtypes/values exactly as intended.
    from safetensors import safe_open
    seen = set()
    for fn in files:
        with safe_open(os.path.join(d, fn), framework="pt") as f:
            for k in f.keys():
                t = f.get_tensor(k)
                assert t.dtype == tensor_dtype(k, disk_dtype, f32_tensors) and torch.equal(t, tensors[k]), k
                seen.add(k)
    assert seen == set(tensors), "tensor set on disk differs"

    # Reload with transformers; the reference comes from this model.
    model, info = load(AutoModelForCausalLM, d, torch.float32)
    missing = list(info.get("missing_keys", []))
    unexpected = [k for k in info.get("unexpected_keys", []) if not k.startswith("mtp.")]
    mismatched = list(info.get("mismatched_keys", []))
    log(f"  reload: missing={missing} unexpected(non-mtp)={unexpected} mismatched={mismatched} "
        f"unexpected(all)={len(info.get('unexpected_keys', []))}")
    assert not missing and not unexpected and not mismatched, info
    re_sd = model.state_dict()
    assert set(re_sd) == set(mem_sd), set(re_sd) ^ set(mem_sd)
    for k, v in re_sd.items():
        assert v.dtype == torch.float32 and torch.equal(v, mem_sd[k]), f"reloaded {k} differs"
    eff = effective_config(model)
    check_effective(case, eff)
    log(f"  effective: {eff}")

    gated_norm_classes = sorted({type(l.linear_attn.norm).__name__
                                 for l in model.model.layers if hasattr(l, "linear_attn")})

    # fp64 twin (informational accuracy of the fp32 reference).
    model64 = None
    if cls64 is not None:
        model64, _ = load(cls64, d, torch.float64)

    ref = {
        "case": name,
        "transformers_version": versions["transformers"],
        "torch_version": versions["torch"],
        "dtype_on_disk": case["disk_dtype"],
        "float32_on_disk": [f"*{sfx}" for sfx in f32_tensors],  # exceptions to dtype_on_disk
        "expert_layout": case["layout"],
        "config_style": case["style"],
        "n_shards": case["shards"],
        "files": files,
        "mtp": bool(case["mtp"]),
        "weights_seed": seed,
        "n_generated": N_GEN,
        "effective_config": eff,
        "code_paths": {
            "device": "cpu",
            "compute_dtype": "float32",
            "gated_norm_class": gated_norm_classes,
            "fp64_reference": "modeling_qwen3_next rewritten to float64" if model64 is not None else "none",
        },
        "prompts": [],
    }
    calls_before = dict(CALLS)
    for pname, ids in prompts:
        P = len(ids)
        gaps = RouterGaps(model)
        rows, toks = reference_rows(model, ids)
        gaps.close()
        # The reloaded model must reproduce, bit for bit, what the in-memory model (the weights
        # we wrote, already rounded to the disk dtype) computed before anything was saved.
        assert torch.equal(rows, mem_rows[pname]), f"{pname}: reloaded model logits differ from in-memory model"
        assert rows.shape == (P + N_GEN - 1, c["vocab_size"])
        m = margins_of(rows)
        entry = {
            "name": pname, "ids": ids, "greedy": toks,
            "logits_file": f"{pname}.logits.f32", "rows": P + N_GEN - 1,
            "margins": [float(f"{x:.6g}") for x in m],
            "greedy_margins": [float(f"{x:.6g}") for x in m[P - 1:]],
            "min_router_logit_gap": gaps.min_gap,
        }
        rows.float().numpy().astype("<f4").tofile(os.path.join(d, entry["logits_file"]))
        back = np.fromfile(os.path.join(d, entry["logits_file"]), dtype="<f4").reshape(P + N_GEN - 1, -1)
        assert np.array_equal(back, rows.float().numpy())

        if model64 is not None:
            rows64, toks64 = reference_rows(model64, ids, greedy=toks)
            entry["fp32_vs_fp64_max_rel_l2"] = float(rel_l2(rows, rows64).max())
            # Does fp64 pick the same argmax on every row (teacher-forced on the fp32 tokens)?
            entry["fp64_argmax_matches"] = bool(torch.equal(torch.argmax(rows64, -1), torch.argmax(rows, -1)))

        gtoks, glog = cached_generate(model, ids)
        entry["cached_generate_tokens_match"] = gtoks == toks
        entry["cached_generate_max_rel_l2"] = float(rel_l2(glog, rows[P - 1:]).max())
        if gtoks != toks:
            entry["cached_generate_tokens"] = gtoks
        ref["prompts"].append(entry)
        log(f"  {pname}: greedy {toks} min greedy margin {min(entry['greedy_margins']):.3g} "
            f"router gap {gaps.min_gap:.3g} fp64 {entry.get('fp32_vs_fp64_max_rel_l2', float('nan')):.2e} "
            f"cached match {entry['cached_generate_tokens_match']} "
            f"cached rel {entry['cached_generate_max_rel_l2']:.2e}")
    ref["code_paths"]["calls_during_reference"] = {k: CALLS.get(k, 0) - calls_before.get(k, 0) for k in CALLS}
    frac = np.mean([x > 1e-3 for p in ref["prompts"] for x in p["margins"]])
    ref["fraction_rows_margin_gt_1e-3"] = float(frac)

    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    ckpt = sum(os.path.getsize(os.path.join(d, f)) for f in files)
    log(f"  done in {time.time() - t0:.1f}s: dir {size / 1e6:.2f} MB (checkpoint {ckpt / 1e6:.2f} MB), "
        f"rows with margin>1e-3: {frac:.4f}, calls {ref['code_paths']['calls_during_reference']}")
    return {"case": name, "dir_bytes": size, "checkpoint_bytes": ckpt,
            "fp32_vs_fp64": {p["name"]: p.get("fp32_vs_fp64_max_rel_l2") for p in ref["prompts"]},
            "cached_match": all(p["cached_generate_tokens_match"] for p in ref["prompts"]),
            "cached_max_rel_l2": max(p["cached_generate_max_rel_l2"] for p in ref["prompts"]),
            "seed": seed}


def config_probe():
    """How transformers resolves rope settings that config.json may leave out (informational)."""
    from transformers import Qwen3NextConfig
    res = {}
    trials = {
        "no_rope_keys": {},
        "rope_theta_only_toplevel": {"rope_theta": 12345.0},
        "rope_parameters_without_partial": {"rope_parameters": {"rope_type": "default", "rope_theta": 12345.0}},
        "toplevel_partial_and_theta": {"rope_theta": 12345.0, "partial_rotary_factor": 0.5},
        "interval_and_layer_types": {"full_attention_interval": 2, "num_hidden_layers": 4,
                                     "layer_types": ["full_attention"] + ["linear_attention"] * 3},
    }
    for k, kw in trials.items():
        try:
            cfg = Qwen3NextConfig(**kw)
            d = cfg.to_dict()
            res[k] = {"rope_parameters": d.get("rope_parameters"),
                      "partial_rotary_factor_attr": getattr(cfg, "partial_rotary_factor", "<absent>"),
                      "layer_types": d.get("layer_types")[:4],
                      "full_attention_interval_in_dict": d.get("full_attention_interval", "<absent>")}
        except Exception as e:  # noqa: BLE001
            res[k] = f"error: {e!r}"
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--set", choices=["golden", "unseen"], default="golden")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--no-fp64", action="store_true", help="skip the informational fp64 comparison")
    args = ap.parse_args()

    torch.set_num_threads(max(1, min(16, os.cpu_count() or 1)))
    import transformers
    versions = {"transformers": transformers.__version__, "torch": torch.__version__}
    log(f"transformers {versions['transformers']}, torch {versions['torch']}, "
        f"python {sys.version.split()[0]}, threads {torch.get_num_threads()}")
    modeling, fast = instrument_transformers()
    log(f"fast-path probe: {fast}")
    cls64 = None
    if not args.no_fp64:
        @functools.cache
        def lazy_fp64():
            try:
                cls, nrew = make_fp64_model_class(modeling)
                log(f"fp64 rewrite of {modeling.__name__}: {nrew} substitutions")
                return cls
            except Exception as e:  # noqa: BLE001
                log(f"WARNING: fp64 rewrite failed ({e!r}); skipping fp64 comparison")
                return None
        cls64 = lazy_fp64

    cases = GOLDEN_CASES if args.set == "golden" else UNSEEN_CASES
    os.makedirs(args.out, exist_ok=True)
    summary = {"set": args.set, "seed": args.seed, "versions": versions, "fast_path": fast,
               "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
               "config_probe": config_probe(), "cases": []}
    for i, case in enumerate(cases):
        summary["cases"].append(build_case(case, args.out, args.seed, i, modeling, cls64, versions))
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    total = sum(c["dir_bytes"] for c in summary["cases"])
    log(f"TOTAL {args.set}: {total / 1e6:.2f} MB in {len(cases)} cases")
    log(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
