#!/usr/bin/env bash
# Sets up, builds (release and ASan+UBSan) and runs the whole test suite in parallel, then the
# runtime tests (threads: scheduler, engine, kept-state pool) under ThreadSanitizer.
# Labels: unit, runtime, golden, tokenizer, server, faults, eval, format, tp (tensor parallelism
# under mpirun; release only: the ASan preset builds without MPI). `scripts/test.sh -L unit`
# passes arguments on to ctest (the TSan run always takes the runtime label).
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
  # The eval label (the embedded model's quality floors: thousands of decode steps) runs in release
  # only; its code paths (forward, draft) run under ASan in the unit and golden tests.
  # Under the sanitizers the engine tests parametrised on models/tiny-next (".../tiny_next") are left
  # to the release run: the same code runs under them on the small random model, at a tenth the time.
  skip=()
  [ "$preset" = asan ] && skip=(-LE eval -E '/tiny_next')
  (cd "build/$preset" && ctest -j "$jobs" --output-on-failure --timeout 900 "${skip[@]}" "$@") ||
    status=1
done
echo "== ctest (tsan, runtime)"
cmake --preset tsan >/dev/null
cmake --build --preset tsan -j "$jobs"
(cd build/tsan && ctest -j "$jobs" --output-on-failure --timeout 900 -L runtime -E '/tiny_next') || status=1
exit $status
