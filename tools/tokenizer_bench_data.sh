#!/usr/bin/env bash
# Builds the two encode-benchmark inputs (not committed; rebuilt on demand, same bytes on any Debian
# 12 machine with the same packages):
#   english.txt: the English fortune cookies (apt-get install fortunes), 2^22 bytes at most
#   code.txt:    the libstdc++ 12 headers /usr/include/c++/12/bits/*.h (g++), 2^22 bytes at most
# Usage: tools/tokenizer_bench_data.sh OUT_DIR
set -euo pipefail
out=${1:?usage: $0 OUT_DIR}
mkdir -p "$out"
tmp=$(mktemp)
find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' -print0 | sort -z |
  xargs -0 cat | iconv -f utf-8 -t utf-8 -c >"$tmp" || true
head -c 4194304 "$tmp" >"$out/english.txt"
find /usr/include/c++/12/bits -maxdepth 1 -name '*.h' -print0 | sort -z | xargs -0 cat >"$tmp"
head -c 4194304 "$tmp" >"$out/code.txt"
rm -f "$tmp"
wc -c "$out/english.txt" "$out/code.txt"
