#!/usr/bin/env bash
# On the device machine, in one call: two builds' MTP drafting on tiny-next measured alternately
# (issue 8), so that a change to the drafting policy is judged against the build before it on the
# same machine and clocks.
#   OUT=dir bash tools/device/draft_ab.sh RUN_DIR OLD NEW [REPS]
#     RUN_DIR  the new build's cuda_tests (run first, all of them) and lib/ with the shared
#              libraries the device lacks (libfmt, libcudart), as for h200_draft.sh
#     OLD, NEW cuda_bench binaries of the two builds (built on the development machine)
#     REPS     rounds (default 2); each round runs OLD then NEW, cold (a fresh engine per run)
#              and warm (one engine per kind for every rep): `cuda_bench --model models/tiny-next
#              --batches 1 --prefill 0 --draft 3 --draft-reps 5 --draft-lookup 12
#              --draft-streams 1,2,4,8 [--draft-warm]`
#   TESTS=0 skips cuda_tests.
# Prints one line per run (the drafted / plain ratio per prompt kind and stream count); the
# tables land in $OUT.
set -uo pipefail
run=${1:?usage: draft_ab.sh RUN_DIR OLD NEW [REPS]}
old=${2:?usage: draft_ab.sh RUN_DIR OLD NEW [REPS]}
new=${3:?usage: draft_ab.sh RUN_DIR OLD NEW [REPS]}
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
# The drafting lines ("  copy  N=1: plain ... (2.69x); 506 drafts in 49 verify rows, ..."), as
# "copy/1 2.69x 506/49".
ratios() { sed -nE 's/^ +([a-z]+) +N=([0-9]+):.*\(([0-9.]+x)\); ([0-9]+) drafts in ([0-9]+) verify.*/\1\/\2 \3 \4\/\5/p' "$1" |
  tr '\n' ' '; }
for r in $(seq 1 "$reps"); do
  for mode in cold warm; do
    flag=
    [ "$mode" = warm ] && flag=--draft-warm
    for v in old new; do
      bin=$old
      [ "$v" = new ] && bin=$new
      f="$out/draft_${mode}_${v}_$r.md"
      timeout 120 "$bin" --model models/tiny-next --batches 1 --prefill 0 --draft 3 --draft-reps 5 \
        --draft-lookup 12 --draft-streams 1,2,4,8 $flag >"$f" 2>&1
      echo "$v $mode round $r (exit $?): $(ratios "$f")"
    done
  done
done
date -u
