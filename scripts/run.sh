#!/usr/bin/env bash
# Sets up, builds the release binary and serves the embedded model (models/tiny-next) with the
# OpenAI API on http://127.0.0.1:8080 (Ctrl-C stops it). Extra arguments go to `tensorfold serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)"
exec ./build/release/apps/tensorfold serve "$@"
