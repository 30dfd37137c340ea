#!/usr/bin/env bash
# On the H200 device machine: the peer's (llama.cpp's) numbers for issue 9's table, on the same two
# models as ours: models/tiny-next and the Qwen3-Next-80B-A3B shape with 24 layers (dummy weights).
# The peer is built outside this repository (never committed); this script takes its binaries and its
# converter as arguments:
#   OUT=dir bash tools/device/bench_peer.sh BIN_DIR CONVERT_PY [CONFIG]
#     BIN_DIR     holds llama-bench and llama-batched-bench (CUDA build)
#     CONVERT_PY  the peer's convert_hf_to_gguf.py (runs with the device's transformers and torch)
#     CONFIG      the big model's config (default bench/qwen3-next-80b-a3b-24l.json)
# The 24-layer GGUF (~80 GB) is made without a 24-layer checkpoint, which the disk cannot hold beside
# it: a 4-layer dummy checkpoint of the same shape (tools/device/make_hf_dummy.py) is converted and
# bench/gguf_inflate.py repeats its layers. Files live in /dev/shm (RAM) and are removed at the end.
# Output ($OUT): peer_bench.md (llama-bench: pp512 and tg128 at batch 1), peer_batched.txt
# (llama-batched-bench: 128 prompt + 128 generated tokens at 1, 8 and 32 parallel sequences), logs.
# PEER_DEADLINE (epoch seconds), if set: llama-batched-bench is skipped when less than 120 s remain.
# PEER_PHASE picks one step: prepare-tiny, prepare-big (make a GGUF file), bench-tiny, bench-big
# (benchmark it, then remove it); unset: all of them in that order (tools/device/h200_run.sh
# overlaps the big model's preparation with other work).
set -uo pipefail
bin=${1:?usage: bench_peer.sh BIN_DIR CONVERT_PY [CONFIG]}
conv=${2:?usage: bench_peer.sh BIN_DIR CONVERT_PY [CONFIG]}
config=${3:-bench/qwen3-next-80b-a3b-24l.json}
out=${OUT:-/tmp/tf_out}
shm=/dev/shm/tf-peer
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
mkdir -p "$out" "$shm"
log="$out/peer_log.txt"
stamp() { echo "[$(date +%T)] $*" | tee -a "$log"; }

phase=${PEER_PHASE:-all}
want() { [ "$phase" = all ] || [ "$phase" = "$1" ]; }

if want prepare-tiny; then
  stamp "convert models/tiny-next"
  python3 "$conv" models/tiny-next --outtype bf16 --outfile "$shm/tiny-next.gguf" >>"$log" 2>&1 ||
    stamp "tiny-next conversion failed"
fi
if want prepare-big; then
  stamp "4-layer dummy of $config"
  python3 tools/device/make_hf_dummy.py --config "$config" --layers 4 --tokenizer models/tiny-next \
    --out "$shm/hf4" >>"$log" 2>&1 || stamp "dummy checkpoint failed"
  python3 "$conv" "$shm/hf4" --no-mtp --outtype bf16 --outfile "$shm/big4.gguf" >>"$log" 2>&1 ||
    stamp "big conversion failed"
  rm -rf "$shm/hf4"
  layers=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['num_hidden_layers'])" "$config")
  stamp "inflate to $layers layers"
  python3 bench/gguf_inflate.py "$shm/big4.gguf" "$shm/big.gguf" --layers "$layers" >>"$log" 2>&1 ||
    stamp "inflate failed"
  rm -f "$shm/big4.gguf"
  ls -la "$shm" | tee -a "$log"
fi

for m in tiny-next big; do
  [ "$m" = tiny-next ] && ! want bench-tiny && continue
  [ "$m" = big ] && ! want bench-big && continue
  [ -f "$shm/$m.gguf" ] || continue
  stamp "llama-bench $m"
  "$bin/llama-bench" -m "$shm/$m.gguf" -ngl 99 -fa 1 -p 512 -n 128 -r 2 -o md 2>>"$log" |
    tee -a "$out/peer_bench.md"
  if [ -n "${PEER_DEADLINE:-}" ] && [ $((PEER_DEADLINE - $(date +%s))) -lt 120 ]; then
    stamp "llama-batched-bench $m skipped: under 120 s left before PEER_DEADLINE"
    continue
  fi
  stamp "llama-batched-bench $m"
  "$bin/llama-batched-bench" -m "$shm/$m.gguf" -ngl 99 -fa on -c 16384 -b 2048 -ub 512 -npp 128 \
    -ntg 128 -npl 1,8,32 2>>"$log" | tee -a "$out/peer_batched.txt"
  rm -f "$shm/$m.gguf"
done
if [ "$phase" = all ] || [ "$phase" = bench-big ]; then rm -rf "$shm"; fi
stamp "done ($phase)"
