#!/usr/bin/env bash
# On the H200 device machine, in one call: two builds of bench/cuda_bench measured alternately,
# so that a kernel change is judged against the build before it on the same machine and clocks.
#   OUT=dir bash tools/device/ab_bench.sh RUN_DIR OLD NEW [REPS]
#     RUN_DIR  the new build's cuda_tests (run first, all of them) and lib/ with the shared
#              libraries the device lacks (libfmt, libcudart), as for h200_draft.sh
#     OLD, NEW cuda_bench binaries of the two builds (built on the development machine)
#     REPS     rounds (default 2); each round runs OLD then NEW on the 80B-A3B shape (dummy
#              weights, batches 1, 8, 32, prefill 512) and on models/tiny-next (batches 1, 8, 32)
#   TESTS=0 skips cuda_tests (when an earlier call on the same machine ran them).
# Prints one line per run (tokens/s per row of the decode table); the tables land in $OUT.
set -uo pipefail
run=${1:?usage: ab_bench.sh RUN_DIR OLD NEW [REPS]}
old=${2:?usage: ab_bench.sh RUN_DIR OLD NEW [REPS]}
new=${3:?usage: ab_bench.sh RUN_DIR OLD NEW [REPS]}
reps=${4:-2}
out=${OUT:-/tmp/tf_out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$run/lib:${LD_LIBRARY_PATH:-}"
date -u
if [ "${TESTS:-1}" != 0 ]; then
  TF_REPO=$PWD timeout 300 "$run/cuda_tests" >"$out/cuda_tests.log" 2>&1
  echo "cuda_tests exit $?: $(grep -E '^\[  (PASSED|FAILED)' "$out/cuda_tests.log" | tr '\n' ' ')"
fi
rows() { grep -E '\| (decode|prefill 512 tokens) \| [0-9]+ \|' "$1" | cut -d'|' -f2,3,4 | tr -s ' ' | tr '\n' ' '; }
for r in $(seq 1 "$reps"); do
  for v in old new; do
    bin=$old
    [ "$v" = new ] && bin=$new
    timeout 120 "$bin" --config bench/qwen3-next-80b-a3b-24l.json --load-format dummy \
      --batches 1,8,32 >"$out/80b_${v}_$r.md" 2>&1
    timeout 60 "$bin" --model models/tiny-next --batches 1,8,32 >"$out/tiny_${v}_$r.md" 2>&1
    echo "$v round $r: 80B $(rows "$out/80b_${v}_$r.md")| tiny-next $(rows "$out/tiny_${v}_$r.md")"
  done
done
date -u
