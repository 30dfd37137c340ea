#!/usr/bin/env bash
# Runs the server tests (node's test runner, official `openai` client) against the tensorfold binary
# given as $1, from the repository root (the embedded model models/tiny-next is the default).
set -euo pipefail
bin=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
if [ ! -d node_modules/openai ]; then npm ci --no-audit --no-fund --loglevel=error; fi
cd "$here/../.."
TF_BIN="$bin" node --test "$here"/*.test.mjs
