#!/usr/bin/env bash
# Builds the training text of the small Qwen-style tokenizer (tests/tokenizer/data/small): every
# fortune cookie of the fortunes, fortunes-{de,es,it,pl,ru,zh} packages (valid UTF-8 only) and the
# Python 3.11 standard library's top-level modules. Usage: tools/tokenizer_train_text.sh OUT_FILE
set -euo pipefail
out=${1:?usage: $0 OUT_FILE}
{
  find /usr/share/games/fortunes -type f ! -name '*.dat' -print0 | sort -z | xargs -0 cat
  find /usr/lib/python3.11 -maxdepth 1 -name '*.py' -print0 | sort -z | xargs -0 cat
} | iconv -f utf-8 -t utf-8 -c | head -c 8000000 | iconv -f utf-8 -t utf-8 -c >"$out" || true
wc -c "$out"
