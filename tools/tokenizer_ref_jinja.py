#!/usr/bin/env python3
"""Reference chat renders: Jinja2 (Debian's python3-jinja2) on each template's own text, in the
environment transformers' apply_chat_template uses (sandboxed, trim_blocks, lstrip_blocks,
loopcontrols; tojson = json.dumps(ensure_ascii=False); raise_exception; the tokenizer's special
tokens as variables; tools=None when a case has none; enable_thinking only when the case sets it).

Run (Debian 12: apt-get install python3-jinja2):
  /usr/bin/python3 tools/tokenizer_ref_jinja.py --chats tests/tokenizer/data/chats.jsonl \
      --template qwen3=tests/tokenizer/data/qwen3/tokenizer_config.json \
      --template qwen3_next_instruct=tests/tokenizer/data/templates/qwen3_next_instruct.jinja \
      --template qwen3_next_thinking=tests/tokenizer/data/templates/qwen3_next_thinking.jinja \
      --out tests/tokenizer/data/chats.expected.jsonl
Output: one JSON object a line, {"template": NAME, "case": INDEX, "text": RENDER} or, where Jinja2
raised, {"template": NAME, "case": INDEX, "error": MESSAGE}.
"""
import argparse
import json

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

# tokenizer_config.json of Qwen3; used as the special-token variables for .jinja templates too.
SPECIAL_KEYS = ["bos_token", "eos_token", "unk_token", "pad_token", "additional_special_tokens"]


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                       extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def load_template(spec):
    name, path = spec.split("=", 1)
    if path.endswith(".json"):
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
        return name, cfg["chat_template"], cfg
    with open(path, encoding="utf-8") as f:
        return name, f.read(), None


def special_vars(cfg):
    out = {}
    for k in SPECIAL_KEYS:
        v = cfg.get(k) if cfg else None
        if isinstance(v, dict):
            v = v.get("content")
        if v is not None:
            out[k] = v
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chats", required=True)
    ap.add_argument("--template", action="append", required=True, help="NAME=tokenizer_config.json|file.jinja")
    ap.add_argument("--config", default="tests/tokenizer/data/qwen3/tokenizer_config.json",
                    help="special tokens for .jinja templates")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.config, encoding="utf-8") as f:
        default_cfg = json.load(f)
    with open(args.chats, encoding="utf-8") as f:
        cases = [json.loads(line) for line in f if line.strip()]
    env = make_env()
    n_err = 0
    with open(args.out, "w", encoding="utf-8") as out:
        for spec in args.template:
            name, text, cfg = load_template(spec)
            tmpl = env.from_string(text)
            variables = special_vars(cfg or default_cfg)
            for i, c in enumerate(cases):
                kw = dict(variables)
                kw.update(messages=c["messages"], tools=c.get("tools"), documents=None,
                          add_generation_prompt=c.get("add_generation_prompt", False))
                if "enable_thinking" in c:
                    kw["enable_thinking"] = c["enable_thinking"]
                rec = {"template": name, "case": i}
                try:
                    rec["text"] = tmpl.render(**kw)
                except Exception as e:  # the C++ renderer must fail on the same cases
                    rec["error"] = f"{type(e).__name__}: {e}"
                    n_err += 1
                out.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(f"{args.out}: {len(cases)} cases x {len(args.template)} templates, {n_err} errors; "
          f"jinja2 {jinja2.__version__}")


if __name__ == "__main__":
    main()
