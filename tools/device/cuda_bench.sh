#!/usr/bin/env bash
# On the H200 device machine: the CUDA benchmark (bench/cuda_bench.cpp) on models/tiny-next and on
# the Qwen3-Next-80B-A3B shape with 24 of its 48 layers (bench/qwen3-next-80b-a3b-24l.json, dummy
# bf16 weights generated on the device, ~80 GB). Binaries are built on the development machine
# (-DTF_NATIVE=OFF -DTF_CUDA=ON, target cuda_bench) and carried with the libraries the device lacks:
#   usage: tools/device/cuda_bench.sh DIR [CONFIG_DIR]   (DIR holds cuda_bench and lib/; CONFIG_DIR
#   holds the JSON config, default bench/; results go to $OUT)
set -uo pipefail
dir=${1:?usage: cuda_bench.sh DIR [CONFIG_DIR]}
cfg=${2:-bench}
out=${OUT:-/tmp/tf_out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$dir/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv
status=0
"$dir/cuda_bench" --model models/tiny-next 2>&1 | tee "$out/bench_tiny.md" || status=1
"$dir/cuda_bench" --model models/tiny-next --batches 1 --prefill 0 --no-graphs 2>&1 |
  tee "$out/bench_tiny_nographs.md" || status=1
"$dir/cuda_bench" --config "$cfg/qwen3-next-80b-a3b-24l.json" --load-format dummy --kernels 2>&1 |
  tee "$out/bench_80b.md" || status=1
"$dir/cuda_bench" --config "$cfg/qwen3-next-80b-a3b-24l.json" --load-format dummy --batches 1 \
  --prefill 0 --no-graphs 2>&1 | tee "$out/bench_80b_nographs.md" || status=1
exit "$status"
