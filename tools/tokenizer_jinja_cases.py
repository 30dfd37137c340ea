#!/usr/bin/env python3
"""Feature cases for TensorFold's Jinja interpreter, rendered by Jinja2 in transformers' chat
environment (see tools/tokenizer_ref_jinja.py): one JSON object a line,
  {"template": ..., "vars": {...}, "text": ...}   or   {..., "error": "..."} where Jinja2 raised.
Run: /usr/bin/python3 tools/tokenizer_jinja_cases.py --out tests/tokenizer/data/jinja_cases.expected.jsonl
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenizer_ref_jinja import make_env  # noqa: E402

M = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
     {"role": "assistant", "content": "yo", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]}]

CASES = [
    # whitespace control, trim_blocks, lstrip_blocks
    ("{% if true %}\n  x\n{% endif %}\n", {}),
    ("  {% if true %}\n  x\n  {% endif %}\nend", {}),
    ("a  {% if true %}b{% endif %}  c", {}),
    ("a\n  {%- if true -%}  \n b \n {%- endif %}\nc", {}),
    ("a {{- ' x ' -}} b", {}),
    ("{{ 'x' }}\n{{ 'y' }}\n", {}),
    ("{# comment #}\nA{#- c -#}  B\n  {# c2 #}\nC", {}),
    ("{%+ if true %}x{% endif +%}\ny", {}),
    ("line1\r\nline2\rline3\n", {}),
    ("\t{% set x = 1 %}\t{{ x }}", {}),
    # literals and operators
    ("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }}", {}),
    ("{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 3 }} {{ [1] + [2] }} {{ 1.5 + 1 }} {{ 1_000 }} {{ 1e3 }}", {}),
    ("{{ 'it\\'s' }} {{ \"q\\\"\" }} {{ 'tab\\tnl\\n' }} {{ '\\u00e9\\x41\\101' }} {{ 'a' 'b' }}", {}),
    ("{{ none }} {{ None }} {{ true }} {{ False }} {{ [1, 'a', none, true, 1.0] }} {{ {'k': 'v', 'n': 2} }}", {}),
    ("{{ x }}|{{ x.y is defined }}|{{ d.missing is defined }}", {"d": {}}),
    ("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ [1, 2] == [1, 2] }} {{ 1 == 1.0 }} {{ 1 != 2 }}", {}),
    ("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }} {{ 'x' in u }}", {}),
    ("{{ not true }} {{ not 0 and 1 }} {{ 0 or 'x' }} {{ '' or [] }} {{ 1 and 2 }}", {}),
    ("{{ 'y' if true else 'n' }} {{ 'y' if false else 'n' }} [{{ 'y' if false }}]", {}),
    # subscripts and slices
    ("{{ l[0] }} {{ l[-1] }} {{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[::2] }} {{ l[5] }} {{ l[1:2:1] }}", {"l": [1, 2, 3, 4]}),
    ("{{ s[0] }} {{ s[-1] }} {{ s[1:3] }} {{ s[::-1] }} {{ s|length }}", {"s": "héllo✨"}),
    ("{{ m[0].role }} {{ m[0]['content'] }} {{ m[2].tool_calls[0].function.name }} {{ m.0.role }}", {"m": M}),
    # loops
    ("{% for x in l %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }},{% endfor %}", {"l": ["a", "b", "c"]}),
    ("{% for x in l if x > 1 %}{{ x }}{{ loop.last }} {% else %}empty{% endfor %}", {"l": [1, 2, 3]}),
    ("{% for x in [] %}x{% else %}empty{% endfor %}", {}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("{% for x in l %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}", {"l": [1, 2, 3, 4, 5]}),
    ("{% for x in l %}{% for y in l %}{{ loop.index }}{% endfor %}{{ loop.index }}|{% endfor %}", {"l": [1, 2]}),
    ("{% for x in l %}{{ loop.previtem }}-{{ loop.nextitem }} {{ loop.cycle('a', 'b') }} {% endfor %}", {"l": [1, 2, 3]}),
    ("{% for c in 'ab' %}{{ c }}.{% endfor %}{% for x in none_var %}x{% endfor %}", {}),
    # scoping and namespace
    ("{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}", {}),
    ("{% set ns = namespace(n=0, s='') %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}", {}),
    ("{% set a, b = [1, 2] %}{{ a }}{{ b }}{% set t = (1, 2) %}{{ t[1] }}", {}),
    ("{% set blk %}inner {{ 1 + 1 }}{% endset %}[{{ blk }}]", {}),
    ("{% if x %}a{% elif y %}b{% else %}c{% endif %}", {"y": 1}),
    # string methods
    ("{{ s.startswith('ab') }} {{ s.endswith(('x', 'cd')) }} {{ s.upper() }} {{ s.replace('b', 'B') }} {{ s.find('c') }} {{ s.count('a') }}", {"s": "abcd abcd"}),
    ("[{{ s.strip() }}][{{ s.lstrip() }}][{{ s.rstrip() }}][{{ s.strip('\\n ') }}][{{ t.strip('xy') }}]", {"s": "\n  hi there \n", "t": "xyhixy"}),
    ("{{ s.split() }} {{ s.split(' ') }} {{ s.split('b') }} {{ s.split(' ', 1) }} {{ s.rsplit(' ', 1) }} {{ s.split('</think>')[-1] }}", {"s": " a b  c "}),
    ("{{ s.title() }} {{ s.capitalize() }} {{ s.lower() }} {{ '-'.join(['a', 'b']) }} {{ 'ß'.upper() }}", {"s": "hello WORLD x"}),
    ("{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}|{{ c.split('</think>')[-1].lstrip('\\n') }}", {"c": "<think>\nr\n</think>\n\nans"}),
    # filters
    ("{{ l|length }} {{ s|length }} {{ d|length }} {{ l|first }} {{ l|last }} {{ l|join(',') }} {{ l|reverse|list }}", {"l": [3, 1, 2], "s": "héé", "d": {"a": 1}}),
    ("{{ '  x  '|trim }} {{ 5|string }} {{ x|default('dflt') }} {{ ''|default('e', true) }} {{ 'AbC'|lower }} {{ 'abc'|upper }}", {}),
    ("{{ d|tojson }}", {"d": {"a": [1, 2.5, None, True, "é\"\\\n\u2028<>&'"], "b": {}, "c": [], "f": 1e20, "g": -0.0, "h": 12345678901234567890}}),
    ("{{ d|tojson(indent=2) }}", {"d": {"a": [1, {"b": None}], "c": "x"}}),
    ("{{ d|tojson(sort_keys=true) }} {{ 'x'|tojson }} {{ none|tojson }}", {"d": {"b": 1, "a": 2}}),
    ("{{ l|map(attribute='role')|join(',') }} {{ l|selectattr('role', 'equalto', 'user')|list|length }} {{ l|rejectattr('role', 'equalto', 'user')|map(attribute='content')|list }}", {"l": M[:2]}),
    ("{{ [3, 1, 2]|sort }} {{ [3, 1, 2]|sort(reverse=true) }} {{ [1, 2, 3]|sum }} {{ [1, 2, 1]|unique|list }} {{ [4, 2]|min }} {{ [4, 2]|max }}", {}),
    ("{{ d|items|list }} {{ '3'|int + 1 }} {{ 'x'|int }} {{ -3|abs }} {{ 'a-b'|replace('-', '+') }} {{ 2.7|int }}", {"d": {"k": "v"}}),
    ("{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}", {}),
    # tests
    ("{{ x is defined }} {{ y is defined }} {{ n is none }} {{ s is string }} {{ 1 is number }} {{ 1.0 is float }} {{ 1 is integer }}", {"x": 1, "n": None, "s": "s"}),
    ("{{ d is mapping }} {{ l is sequence }} {{ s is sequence }} {{ l is iterable }} {{ t is true }} {{ f is false }} {{ 0 is false }} {{ t is boolean }}", {"d": {}, "l": [], "s": "", "t": True, "f": False}),
    ("{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 2 is eq 2 }} {{ 'a' is in 'abc' }} {{ x is not none }} {{ 1 is sameas 1 }}", {"x": 0}),
    # globals
    ("{{ range(3)|list }} {{ range(1, 7, 2)|list }} {% for i in range(2) %}{{ i }}{% endfor %} {{ dict(a=1) }} {{ namespace(a=1).a }}", {}),
    ("{{ bos_token }}{{ eos_token }}|{{ additional_special_tokens|length }}", {"eos_token": "<e>", "additional_special_tokens": ["a", "b"]}),
    # str() and repr() of values
    ("{{ l }} {{ d }} {{ 1.0 }} {{ 1e-5 }} {{ 1e16 }} {{ 0.1 + 0.2 }} {{ 10 / 4 }} {{ 3 * 1.0 }}", {"l": ["it's", 'say "hi"', "x\ny", "\x01", "é", "\u2028"], "d": {"k": [1, None], "t": True}}),
    # errors Jinja2 raises (we must fail too)
    ("{{ x.y }}", {}),
    ("{{ 'a' + 1 }}", {}),
    ("{{ raise_exception('bad input') }}", {}),
    ("{{ n.startswith('a') }}", {"n": None}),
    ("{{ 'a' in none_value }}", {"none_value": None}),
    ("{% for x in 1 %}{% endfor %}", {}),
    ("{{ 1 / 0 }}", {}),
    ("{{ x|tojson }}", {}),
    ("{% set l = [1] %}{{ l.append(2) }}", {}),
    ("{% if true %}unclosed", {}),
    ("{{ 1 + }}", {}),
    ("{% macro m() %}x{% endmacro %}", {}),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    env = make_env()
    with open(args.out, "w", encoding="utf-8") as f:
        for tmpl, variables in CASES:
            rec = {"template": tmpl, "vars": variables}
            try:
                rec["text"] = env.from_string(tmpl).render(**variables)
            except Exception as e:
                rec["error"] = f"{type(e).__name__}: {e}"
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(f"{args.out}: {len(CASES)} cases")


if __name__ == "__main__":
    main()
