#!/usr/bin/env bash
# Runs the server tests (node's test runner, official `openai` client) against the tensorfold binary
# given as $1, from the repository root (the embedded model models/tiny-next is the default).
# Further arguments name the test files (tests/server/NAME.test.mjs) to run; none: all of them.
set -euo pipefail
bin=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
# Both server tests start here at once under ctest -j: one installs the client, the other waits.
(
  flock 9
  if [ ! -d node_modules/openai ]; then npm ci --no-audit --no-fund --loglevel=error; fi
) 9>"$here/.npm-install.lock"
cd "$here/../.."
shift
files=()
for name in "$@"; do files+=("$here/$name.test.mjs"); done
[ ${#files[@]} -gt 0 ] || files=("$here"/*.test.mjs)
TF_BIN="$bin" node --test "${files[@]}"
