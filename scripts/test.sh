#!/usr/bin/env bash
# Sets up, builds (release and ASan+UBSan) and runs the whole test suite in parallel.
# Labels: unit, golden, faults, format. `scripts/test.sh -L unit` passes arguments on to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc)
for preset in release asan; do
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j "$jobs"
done
status=0
for preset in release asan; do
  echo "== ctest ($preset)"
  (cd "build/$preset" && ctest -j "$jobs" --output-on-failure --timeout 900 "$@") || status=1
done
exit $status
