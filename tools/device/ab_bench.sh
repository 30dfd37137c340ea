#!/usr/bin/env bash
# On the device machine, in one call: two builds of bench/cuda_bench measured alternately, so that
# a change is judged against the build before it on the same machine and clocks.
#   OUT=dir [WHAT=draft] [TESTS=0] bash tools/device/ab_bench.sh RUN_DIR OLD NEW [REPS]
#     RUN_DIR  the new build's cuda_tests (run first, all of them) and lib/ with the shared
#              libraries the device lacks (libfmt, libcudart), as for h200_draft.sh
#     OLD, NEW cuda_bench binaries of the two builds (built on the development machine)
#     REPS     rounds (default 2); each round runs OLD then NEW:
#              default: the decode tables of the 80B-A3B shape (dummy weights, batches 1, 8, 32,
#              prefill 512) and of models/tiny-next (batches 1, 8, 32); prints tokens/s per row
#              WHAT=engine: tiny-next through the engine (`cuda_bench --model models/tiny-next
#              --batches 1,8,16,32 --prefill 0 --engine`); prints tokens/s per stream count
#              WHAT=draft: MTP drafting on tiny-next (issue 8), cold (a fresh engine per run)
#              then warm (one engine per kind for every rep): `cuda_bench --model
#              models/tiny-next --batches 1 --prefill 0 --draft 3 --draft-reps 5 --draft-lookup 12
#              --draft-streams 1,2,4,8 [--draft-warm]`; prints drafted / plain and drafts in
#              verify rows per prompt kind and stream count
#   TESTS=0 skips cuda_tests (when an earlier call on the same machine ran them).
#   CONTROL=1 (with WHAT=draft) adds --draft-control: after each drafting row, the same runs with
#   both engines plain, printed as "control: copy/1 1.00x ...".
# The tables land in $OUT.
set -uo pipefail
run=${1:?usage: ab_bench.sh RUN_DIR OLD NEW [REPS]}
old=${2:?usage: ab_bench.sh RUN_DIR OLD NEW [REPS]}
new=${3:?usage: ab_bench.sh RUN_DIR OLD NEW [REPS]}
reps=${4:-2}
out=${OUT:-/tmp/tf_out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$run/lib:${LD_LIBRARY_PATH:-}"
date -u
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [ "${TESTS:-1}" != 0 ]; then
  TF_REPO=$PWD timeout 300 "$run/cuda_tests" >"$out/cuda_tests.log" 2>&1
  echo "cuda_tests exit $?: $(grep -E '^\[  (PASSED|FAILED)' "$out/cuda_tests.log" | tr '\n' ' ')"
fi
# The decode table's rows, "decode | 1 | 461.1 ...".
rows() { grep -E '\| (decode|decode, chained|prefill 512 tokens) \| [0-9]+ \|' "$1" | cut -d'|' -f2,3,4 | tr -s ' ' | tr '\n' ' '; }
# The drafting lines ("  copy  N=1: plain ... (2.69x); decoding ... tok/s per stream (2.90x); 506
# drafts in 49 verify rows, ..."; builds before f92808b print no "decoding" part), as
# "copy/1 2.69x dec:2.90x 506/49".
ratios() { sed -nE 's/^ +([a-z]+) +N=([0-9]+):[^(]*\(([0-9.]+x)\);( decoding [^(]*\(([0-9.]+x)\);)? ([0-9]+) drafts in ([0-9]+) verify.*/\1\/\2 \3 dec:\5 \6\/\7/p' "$1" |
  tr '\n' ' '; }
# The control lines ("  copy  N=1: control, both plain: ... (1.00x); decoding 0.99x"), as
# "copy/1 1.00x".
controls() { sed -nE 's/^ +([a-z]+) +N=([0-9]+): control[^(]*\(([0-9.]+x)\).*/\1\/\2 \3/p' "$1" | tr '\n' ' '; }
for r in $(seq 1 "$reps"); do
  modes=plain
  [ "${WHAT:-}" = draft ] && modes="cold warm"
  [ "${WHAT:-}" = engine ] && modes=engine
  for mode in $modes; do
    for v in old new; do
      bin=$old
      [ "$v" = new ] && bin=$new
      if [ "$mode" = engine ]; then
        timeout 60 "$bin" --model models/tiny-next --batches 1,8,16,32 --prefill 0 --engine \
          >"$out/engine_${v}_$r.md" 2>&1
        echo "$v round $r engine (streams | tok/s): $(grep -E '^\| prompt' "$out/engine_${v}_$r.md" |
          cut -d'|' -f3,4 | tr -s ' ' | tr '\n' ' ')"
        continue
      fi
      if [ "$mode" = plain ]; then
        timeout 120 "$bin" --config bench/qwen3-next-80b-a3b-24l.json --load-format dummy \
          --batches 1,8,32 >"$out/80b_${v}_$r.md" 2>&1
        timeout 60 "$bin" --model models/tiny-next --batches 1,8,32 >"$out/tiny_${v}_$r.md" 2>&1
        echo "$v round $r: 80B $(rows "$out/80b_${v}_$r.md")| tiny-next $(rows "$out/tiny_${v}_$r.md")"
        continue
      fi
      flag=
      [ "$mode" = warm ] && flag=--draft-warm
      f="$out/draft_${mode}_${v}_$r.md"
      [ "${CONTROL:-0}" = 1 ] && flag="$flag --draft-control"
      timeout 150 "$bin" --model models/tiny-next --batches 1 --prefill 0 --draft 3 --draft-reps 5 \
        --draft-lookup 12 --draft-streams 1,2,4,8 $flag >"$f" 2>&1
      echo "$v $mode round $r (exit $?): $(ratios "$f")"
      [ "${CONTROL:-0}" = 1 ] && echo "  control: $(controls "$f")"
    done
  done
done
date -u
