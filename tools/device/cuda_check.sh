#!/usr/bin/env bash
# On the H200 device machine: runs the CUDA tests (kernel contracts, CUDA vs CPU forward on the
# golden checkpoints and models/tiny-next, batch invariance) and a compute-sanitizer memcheck pass
# over the kernel tests. The test binary is built on the development machine (same tree,
# -DTF_NATIVE=OFF -DTF_CUDA=ON, target cuda_tests) and carried with the libraries the device lacks:
#   usage: tools/device/cuda_check.sh DIR   (DIR holds cuda_tests and lib/; results go to $OUT)
set -uo pipefail
dir=${1:?usage: cuda_check.sh DIR}
out=${OUT:-/tmp/tf_out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$dir/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
TF_REPO=$PWD "$dir/cuda_tests" 2>&1 | tee "$out/cuda_tests.log"
status=${PIPESTATUS[0]}
compute-sanitizer --tool memcheck --error-exitcode 1 "$dir/cuda_tests" --gtest_filter='CudaOps.*' \
  >"$out/memcheck.log" 2>&1 || status=1
tail -3 "$out/memcheck.log"
exit "$status"
