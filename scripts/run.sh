#!/usr/bin/env bash
# Sets up, builds the release binary and runs the main job: greedy generation on a bundled
# checkpoint (tests/golden/*; the embedded chat model models/tiny-next replaces it once it lands).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)"
model=${1:-$(ls -d tests/golden/*/ | head -1)}
./build/release/apps/tensorfold generate --model "$model" --prompt-ids 1,2,3,4,5 --max-tokens 16 --json
