#!/usr/bin/env bash
# Sets up, builds (release and ASan+UBSan) and runs the whole test suite in parallel, then the
# runtime tests (threads: worker pool, scheduler, engine, kept-state pool) under ThreadSanitizer.
# Labels: unit, runtime, golden, tokenizer, server, faults, eval, format, tp (tensor parallelism
# under mpirun; release only: the ASan preset builds without MPI). `scripts/test.sh -L unit`
# passes arguments on to ctest (the TSan run always takes the runtime label).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage prints its wall time (CI must stay under 30 minutes on 2 cores).
stage() { echo "== $1 (at ${SECONDS} s)"; }
stage setup
bash scripts/setup.sh
jobs=$(nproc)
for preset in release asan; do
  stage "build ($preset)"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j "$jobs"
done
status=0
for preset in release asan; do
  stage "ctest ($preset)"
  # The eval label (the embedded model's quality floors: thousands of decode steps) runs in release
  # only; its code paths (forward, draft) run under ASan in the unit and golden tests.
  # Under the sanitizers the engine tests parametrised on models/tiny-next (".../tiny_next" and
  # golden_tiny_next) and the server's long greedy chats (server_engine) are left to the release
  # run: the same code runs under them on the small random model (runtime tests) and through
  # server_http, at a tenth the time. So are the tokenizer's CLI and live-corpus comparisons (the
  # tokenizer's own tests and fuzzing run under ASan) and the format check (no build in it).
  skip=()
  [ "$preset" = asan ] &&
    skip=(-LE 'eval|format' -E '/tiny_next|golden_tiny_next|server_engine|tokenizer_cli|tokenizer_live_js')
  (cd "build/$preset" && ctest -j "$jobs" --output-on-failure --timeout 900 "${skip[@]}" "$@") ||
    status=1
done
stage "build (tsan)"
cmake --preset tsan >/dev/null
cmake --build --preset tsan -j "$jobs"
stage "ctest (tsan, runtime)"
(cd build/tsan && ctest -j "$jobs" --output-on-failure --timeout 900 -L runtime -E '/tiny_next') || status=1
stage "done: status $status"
exit $status
