#!/usr/bin/env bash
# On the H200 device machine, in one call: the CUDA tests of the engine on the device, our numbers
# and the peer's (llama.cpp) on the same two models side by side (issue 9's table).
#   OUT=dir bash tools/device/h200_run.sh DIR PEER_DIR CONVERT_PY
#     DIR         our binaries built on the development machine (-DTF_NATIVE=OFF -DTF_CUDA=ON
#                 -DTF_MPI=OFF; targets cuda_tests, cuda_bench), lib/ with the shared libraries
#                 the device lacks (libfmt, libcudart), optionally mut/cuda_tests (a mutant)
#     PEER_DIR    the peer's llama-bench and llama-batched-bench (CUDA build, never committed),
#                 with its shared libraries beside them
#     CONVERT_PY  the peer's convert_hf_to_gguf.py
#   BUDGET_S (default 600): the seconds this call may take; the peer's batched runs are skipped
#   when too little of it is left (the batch-1 numbers come first).
# The peer's 80B-shaped GGUF is made in the background from the start (tools/device/bench_peer.sh
# prepare-big: a 4-layer dummy checkpoint, converted, its layers repeated), while the tests and our
# benchmarks run; each result lands in $OUT as soon as it exists, so a call cut short still returns
# what finished. Logs: $OUT/run_log.txt.
set -uo pipefail
dir=${1:?usage: h200_run.sh DIR PEER_DIR CONVERT_PY}
peer=${2:?usage: h200_run.sh DIR PEER_DIR CONVERT_PY}
conv=${3:?usage: h200_run.sh DIR PEER_DIR CONVERT_PY}
out=${OUT:-/tmp/tf_out}
mkdir -p "$out"
log="$out/run_log.txt"
stamp() { echo "[$(date +%T)] $*" | tee -a "$log"; }
export LD_LIBRARY_PATH="$dir/lib:$peer:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv | tee -a "$log"

export PEER_DEADLINE=$(($(date +%s) + ${BUDGET_S:-600}))
peer_step() { PEER_PHASE=$1 OUT="$out" bash tools/device/bench_peer.sh "$peer" "$conv"; }
stamp "peer: the 80B-shaped GGUF in the background; tiny-next's now"
peer_step prepare-big &
prep=$!
peer_step prepare-tiny

stamp "tests: the engine on the device, the CUDA model against the CPU"
TF_REPO=$PWD "$dir/cuda_tests" --gtest_filter='EngineOnDevice.*:*CudaModelTest.*:CudaDummyModel.*' \
  >"$out/cuda_tests.log" 2>&1
stamp "cuda_tests exit $?: $(grep -E '^\[  (PASSED|FAILED)' "$out/cuda_tests.log" | tr '\n' ' ')"

if [ -x "$dir/mut/cuda_tests" ]; then
  # A binary built with a change that the engine test must catch (its comment names it).
  TF_REPO=$PWD "$dir/mut/cuda_tests" --gtest_filter='EngineOnDevice.ResumedAndBatchedEqualAlone' \
    >"$out/mutant.log" 2>&1
  stamp "mutant exit $? (must fail): $(grep -E '^\[  (PASSED|FAILED)' "$out/mutant.log" | tr '\n' ' ')"
fi

stamp "ours and the peer's: tiny-next"
"$dir/cuda_bench" --model models/tiny-next --engine >"$out/ours_tiny.md" 2>&1
peer_step bench-tiny
stamp "ours: 80B-A3B shape, 24 layers (dummy weights on the device)"
"$dir/cuda_bench" --config bench/qwen3-next-80b-a3b-24l.json --load-format dummy \
  >"$out/ours_80b.md" 2>&1
stamp "ours done"

stamp "waiting for the peer's 80B-shaped GGUF"
wait "$prep"
peer_step bench-big
stamp done
