#!/usr/bin/env bash
# Fails (listing the files) when a tracked C++ file does not match .clang-format.
set -u
cd "$(git rev-parse --show-toplevel 2>/dev/null || pwd)"
bad=0
while IFS= read -r f; do
  [ -f "$f" ] || continue
  if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then
    echo "not clang-formatted: $f (run: clang-format -i $f)"
    bad=1
  fi
done < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' 2>/dev/null || find src apps tests -name '*.cpp' -o -name '*.h')
exit $bad
