#!/usr/bin/env bash
# device_run_mtp.sh - the one accelerator call of the MTP-only second stage (train_mtp.py): train the mtp.*
# head of models/tiny-next with the main model frozen, evaluate before/after, write the new mtp.* tensors.
#
# Run from the repository root (models/tiny-next is read there). The folder of this script must hold
# train_mtp.py, train.py, make_data.py, eval_cases.json and data/ (make_data.py's prose.jsonl, chats.jsonl
# (either may be gzipped) and heldout.json); extra arguments go to train_mtp.py:
#     OUT=/some/dir bash tools/tiny_next/device_run_mtp.sh --time-budget 150 --deadline 235
# Output ($OUT): mtp.safetensors (the chosen variant), mtp_<other>.safetensors, mtp_ft.json, train_mtp.log.
# Then, here: python3 tools/tiny_next/merge_mtp.py --mtp $OUT/mtp.safetensors --model models/tiny-next/model.safetensors
set -u
: "${OUT:?set OUT}"
HERE=$(cd "$(dirname "$0")" && pwd)
PYTHONUNBUFFERED=1 python3 "$HERE/train_mtp.py" --model models/tiny-next --data "${DATA:-$HERE/data}" \
  --eval-cases "$HERE/eval_cases.json" --out "$OUT" "$@"
rc=$?
ls -la "$OUT"
exit $rc
