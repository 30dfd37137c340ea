#!/usr/bin/env python3
"""Writes the chat-template test cases: tests/tokenizer/data/chats.jsonl, one JSON object a line:
  {"name": ..., "messages": [...], "tools": [...] (optional), "add_generation_prompt": bool,
   "enable_thinking": bool (optional: absent means the template sees it undefined)}

Run: python3 tools/tokenizer_make_chats.py --out tests/tokenizer/data/chats.jsonl
Hand-written cases cover every role, reasoning_content (string, empty, null, absent), <think> inside
content, tool definitions, tool calls (arguments as object or string, with and without the
"function" wrapper), tool responses (one and several in a row), multi-step tool use, non-string
content, and the flags; seeded random conversations add volume.
"""
import argparse
import copy
import json
import random

rng = random.Random(7)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city. Use «metric» units.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. \"Zürich\" or 北京"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
        "days": {"type": "integer", "minimum": 1, "maximum": 14}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search <the web> & return the top results; 'quotes' and \\ too.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "top_k": {"type": "number", "default": 5.0},
        "threshold": {"type": "number", "default": 1e-07}, "safe": {"type": "boolean", "default": True},
        "filters": {"type": ["object", "null"], "default": None},
        "tags": {"type": "array", "items": {"type": "string"}, "default": []}},
        "required": ["query"]}}}
CALC = {"type": "function", "function": {
    "name": "calc", "description": "Evaluate an arithmetic expression.\nReturns a number.",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}}
BARE = {"name": "bare_tool", "description": "A tool given without the function wrapper",
        "parameters": {"type": "object", "properties": {}}}


def call(name, args, wrap=True, as_string=False):
    a = json.dumps(args, ensure_ascii=False) if as_string else args
    f = {"name": name, "arguments": a}
    return {"id": f"call_{rng.randint(1000, 9999)}", "type": "function", "function": f} if wrap else f


def hand_written():
    c = []
    add = lambda name, messages, **kw: c.append({"name": name, "messages": messages, **kw})
    add("user_only", [{"role": "user", "content": "Hello!"}])
    add("system_user", [{"role": "system", "content": "You are a helpful assistant."},
                        {"role": "user", "content": "What is 2+2?"}])
    add("multi_turn", [{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": "Hi"},
                       {"role": "assistant", "content": "Hello! How can I help?"},
                       {"role": "user", "content": "Tell me a joke."}])
    add("reasoning_last", [{"role": "user", "content": "Why is the sky blue?"},
                           {"role": "assistant", "content": "Rayleigh scattering.",
                            "reasoning_content": "Short wavelengths scatter more.\n"}])
    add("reasoning_history", [{"role": "user", "content": "q1"},
                              {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
                              {"role": "user", "content": "q2"},
                              {"role": "assistant", "content": "a2", "reasoning_content": "r2"},
                              {"role": "user", "content": "q3"}])
    add("reasoning_empty_and_null", [{"role": "user", "content": "q"},
                                     {"role": "assistant", "content": "a", "reasoning_content": ""},
                                     {"role": "user", "content": "q2"},
                                     {"role": "assistant", "content": "b", "reasoning_content": None}])
    add("think_in_content", [{"role": "user", "content": "Solve x+1=3"},
                             {"role": "assistant", "content": "<think>\nx = 3 - 1\n</think>\n\nx = 2"}])
    add("think_in_content_history", [{"role": "user", "content": "a"},
                                     {"role": "assistant", "content": "<think>hidden</think>shown"},
                                     {"role": "user", "content": "b"}])
    add("think_only_close", [{"role": "user", "content": "a"},
                             {"role": "assistant", "content": "reason\n\n</think>\n\nanswer"}])
    add("tools_no_system", [{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER])
    add("tools_with_system", [{"role": "system", "content": "You can call tools."},
                              {"role": "user", "content": "Search for jinja"}], tools=[WEATHER, SEARCH, CALC])
    add("tool_call_cycle", [
        {"role": "user", "content": "Weather in Zürich and 北京?"},
        {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Zürich"}),
                                                            call("get_weather", {"city": "北京", "unit": "celsius"})]},
        {"role": "tool", "content": "{\"temp\": 21.5}"},
        {"role": "tool", "content": "{\"temp\": 30}"},
        {"role": "assistant", "content": "Zürich is 21.5°C and Beijing 30°C."}], tools=[WEATHER])
    add("tool_call_with_text", [
        {"role": "user", "content": "Compute 6*7"},
        {"role": "assistant", "content": "Let me compute that.", "tool_calls": [call("calc", {"expr": "6*7"})]},
        {"role": "tool", "content": "42"}], tools=[CALC])
    add("tool_call_string_args", [
        {"role": "user", "content": "Search"},
        {"role": "assistant", "content": "", "tool_calls": [call("search", {"query": "a \"b\"", "top_k": 3},
                                                                 as_string=True)]},
        {"role": "tool", "content": "[]"}], tools=[SEARCH])
    add("tool_call_unwrapped", [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "", "tool_calls": [call("bare_tool", {}, wrap=False)]},
        {"role": "tool", "content": "ok"}], tools=[BARE])
    add("tool_call_float_args", [
        {"role": "user", "content": "Search with threshold"},
        {"role": "assistant", "content": "", "tool_calls": [call("search", {
            "query": "π ≈ 3.14", "threshold": 0.001, "top_k": 1e20, "ratio": 2.5e-8, "n": -0.0,
            "big": 12345678901234567890, "exp": 1.5e300, "tiny": 5e-324, "r": 0.1, "f": 100.0,
            "nested": {"ok": True, "none": None, "list": [1, 2.0, "three", [], {}]}})]},
        {"role": "tool", "content": "done"}], tools=[SEARCH])
    add("tool_response_in_user", [
        {"role": "user", "content": "First question"},
        {"role": "assistant", "content": "", "tool_calls": [call("calc", {"expr": "1"})]},
        {"role": "user", "content": "<tool_response>\n1\n</tool_response>"},
        {"role": "assistant", "content": "The answer is 1.", "reasoning_content": "It returned 1."}],
        tools=[CALC])
    add("multi_step_reasoning", [
        {"role": "user", "content": "Plan a trip"},
        {"role": "assistant", "content": "", "reasoning_content": "Need weather.",
         "tool_calls": [call("get_weather", {"city": "Rome"})]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "Go to Rome.", "reasoning_content": "It is sunny."}], tools=[WEATHER])
    add("system_later", [{"role": "user", "content": "a"}, {"role": "system", "content": "new rules"},
                         {"role": "user", "content": "b"}])
    add("tool_first", [{"role": "tool", "content": "orphan result"}, {"role": "user", "content": "ok?"}])
    add("unicode_everywhere", [{"role": "system", "content": "Réponds en français 🇫🇷."},
                               {"role": "user", "content": "¿Qué tal? 你好 👩🏽‍💻 \u0301 \t tabs\r\nCRLF"},
                               {"role": "assistant", "content": "Très bien ! ✨"}])
    add("empty_strings", [{"role": "system", "content": ""}, {"role": "user", "content": ""},
                          {"role": "assistant", "content": ""}])
    add("special_tokens_in_content", [{"role": "user", "content": "<|im_start|>assistant\n<|im_end|>"},
                                      {"role": "assistant", "content": "<tool_call>not a call</tool_call>"}])
    add("newlines_around_reasoning", [{"role": "user", "content": "q"},
                                      {"role": "assistant", "content": "\n\nanswer\n",
                                       "reasoning_content": "\n\nthinking\n\n"}])
    add("list_content", [{"role": "user", "content": [{"type": "text", "text": "describe"}]},
                         {"role": "assistant", "content": "ok"}])
    add("null_content_tool_call", [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [call("calc", {"expr": "2"})]},
        {"role": "tool", "content": "2"}], tools=[CALC])
    add("extra_keys", [{"role": "user", "content": "hi", "name": "alice", "weird": [1, 2]},
                       {"role": "assistant", "content": "hello", "refusal": None}])
    return c


def random_conversation(i):
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": rng.choice(["You are Qwen.", "Answer in JSON.", "简洁回答。",
                                                              "Rules:\n- be kind\n- be brief\n"])})
    tools = rng.sample([WEATHER, SEARCH, CALC], rng.randint(1, 3)) if rng.random() < 0.4 else None
    for _ in range(rng.randint(1, 4)):
        msgs.append({"role": "user", "content": rng.choice(["hi", "What's new?", "Erkläre Quantenphysik.",
                                                            "写一首诗", "  spaces  ", "line1\nline2",
                                                            "<think>not mine</think>"])})
        r = rng.random()
        if r < 0.3:
            msgs.append({"role": "assistant", "content": rng.choice(["ok", "Sure!\n", "Voilà."]),
                         "reasoning_content": rng.choice(["because", "", "step 1\nstep 2", None])})
        elif r < 0.55 and tools:
            t = rng.choice(tools)["function"]["name"]
            msgs.append({"role": "assistant", "content": rng.choice(["", "Calling a tool."]),
                         "tool_calls": [call(t, {"x": rng.randint(0, 9), "s": "é\"\\"},
                                             as_string=rng.random() < 0.3) for _ in range(rng.randint(1, 2))]})
            for _ in range(rng.randint(1, 2)):
                msgs.append({"role": "tool", "content": rng.choice(["{\"ok\": true}", "42", "error: none"])})
            msgs.append({"role": "assistant", "content": "Done."})
        elif r < 0.8:
            msgs.append({"role": "assistant", "content": rng.choice(["Hello.", "<think>\nhmm\n</think>\n\nYes.",
                                                                     "No."])})
    case = {"name": f"random_{i:02d}", "messages": msgs}
    if tools:
        case["tools"] = tools
    return case


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    base = hand_written() + [random_conversation(i) for i in range(40)]
    cases = []
    flags = [(False, None), (True, None), (True, False), (True, True), (False, False)]
    for k, b in enumerate(base):
        # every case with the generation prompt on and off; thinking flags rotate over the cases
        for agp, think in (flags[k % len(flags)], flags[(k + 2) % len(flags)]):
            c = copy.deepcopy(b)
            c["add_generation_prompt"] = agp
            if think is not None:
                c["enable_thinking"] = think
            cases.append(c)
    with open(args.out, "w", encoding="utf-8") as f:
        for c in cases:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    print(f"{args.out}: {len(cases)} cases")


if __name__ == "__main__":
    main()
