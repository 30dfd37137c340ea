#!/usr/bin/env bash
# device_run.sh - the one call on the accelerator machine that makes models/tiny-next: train + evaluate
# (train.py), then the golden logits of the exported checkpoint (tools/golden_for_checkpoint.py, on the
# CPU), and pack everything into at most 8 files under $OUT for the size-limited copy back.
#
# Run from a folder that holds tools/tiny_next/ (with data/ from make_data.py), tools/make_golden.py and
# tools/golden_for_checkpoint.py; extra arguments go to train.py:
#     OUT=/some/dir bash tools/tiny_next/device_run.sh --steps 2400 --batch 128 --time-budget 430
# Output: model_small.tar, model.safetensors.partN (cat them), eval.json, golden.tar (tiny_next/),
# extras.tar (train.log, eval_outputs.json, reference.json, golden.log).
set -u
: "${OUT:?set OUT}"
MDIR=${TN_MODEL_DIR:-/tmp/tn_model}
rm -rf "$MDIR" /tmp/tn_golden
python3 tools/tiny_next/train.py --out "$OUT" --model-dir "$MDIR" --export-parts "$@"
rc=$?
echo "train.py exit $rc"
if [ -f "$MDIR/model.safetensors" ]; then
  CUDA_VISIBLE_DEVICES= python3 tools/golden_for_checkpoint.py --checkpoint "$MDIR" --name tiny_next \
    --out /tmp/tn_golden --link ../../../models/tiny-next > "$OUT/golden.log" 2>&1
  echo "golden exit $?"
  tail -5 "$OUT/golden.log"
  [ -d /tmp/tn_golden/tiny_next ] && tar -C /tmp/tn_golden -cf "$OUT/golden.tar" tiny_next
fi
cd "$OUT" || exit 1
extras=()
for f in train.log eval_outputs.json reference.json golden.log; do [ -f "$f" ] && extras+=("$f"); done
if [ ${#extras[@]} -gt 0 ]; then
  tar -cf extras.tar "${extras[@]}" && rm -f "${extras[@]}"
fi
rm -rf "$OUT/model"
ls -la "$OUT"
exit $rc
