#!/usr/bin/env bash
# On the H200 device machine, in one call: MTP drafting on the device (issue 8's H200 numbers).
#   OUT=dir bash tools/device/h200_draft.sh DIR
#     DIR  our binaries built on the development machine (-DTF_NATIVE=OFF -DTF_CUDA=ON
#          -DTF_MPI=OFF; targets cuda_tests, cuda_bench), lib/ with the shared libraries the device
#          lacks (libfmt, libcudart), optionally mut/cuda_tests (a mutant the draft tests must catch;
#          MUT_FILTER names the tests it must fail, default DraftOnDevice.RollbackEqualsPlainState)
# Runs every CUDA test (the kernels, the model, the engine and drafting on the device), the
# mutant, then cuda_bench on tiny-next: the decode tables, the engine, and drafting against plain
# decoding (adaptive and fixed depth) on bench/draft_prompts.json, and the costs of drafting on
# the 80B-A3B shape (dummy weights: their acceptance means nothing, their costs are real). Logs:
# $OUT/run_log.txt.
set -uo pipefail
dir=${1:?usage: h200_draft.sh DIR}
out=${OUT:-/tmp/tf_out}
mkdir -p "$out"
log="$out/run_log.txt"
stamp() { echo "[$(date +%T)] $*" | tee -a "$log"; }
export LD_LIBRARY_PATH="$dir/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$log"

stamp "tests: every CUDA test"
TF_REPO=$PWD timeout 330 "$dir/cuda_tests" >"$out/cuda_tests.log" 2>&1
stamp "cuda_tests exit $?: $(grep -E '^\[  (PASSED|FAILED)' "$out/cuda_tests.log" | tr '\n' ' ')"
if [ -x "$dir/mut/cuda_tests" ]; then
  TF_REPO=$PWD "$dir/mut/cuda_tests" \
    --gtest_filter="${MUT_FILTER:-DraftOnDevice.RollbackEqualsPlainState}" \
    >"$out/mutant.log" 2>&1
  stamp "mutant exit $? (must fail): $(grep -E '^\[  (PASSED|FAILED)' "$out/mutant.log" | tr '\n' ' ')"
fi

stamp "bench: tiny-next, drafting adaptive"
"$dir/cuda_bench" --model models/tiny-next --engine --draft 3 --draft-streams 1,2,4,8 \
  >"$out/bench_adaptive.md" 2>&1
stamp "bench exit $?"
stamp "bench: tiny-next, drafting fixed"
"$dir/cuda_bench" --model models/tiny-next --batches 1 --draft 3 --draft-fixed \
  --draft-streams 1,2,4,8 >"$out/bench_fixed.md" 2>&1
stamp "bench exit $?"
stamp "bench: the 80B-A3B shape (24 layers, dummy weights with an MTP head): drafting costs"
"$dir/cuda_bench" --config bench/qwen3-next-80b-a3b-24l.json --load-format dummy --batches 1,8,32 \
  --draft 3 >"$out/bench_80b.md" 2>&1
stamp "bench exit $?; done"
