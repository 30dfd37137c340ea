#!/usr/bin/env bash
# Bad flags and bad checkpoints given to the CLI: a clear message on stderr, a non-zero exit, never
# a signal (exit codes >= 128 are crashes).
set -u
bin="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
expect_error() {  # expect_error "what it must say" command...
  local want="$1"; shift
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ $rc -eq 0 ] || [ $rc -ge 128 ]; then
    echo "FAIL ($rc): $*"; cat "$tmp/err"; fail=1
  elif ! grep -q -- "$want" "$tmp/err"; then
    echo "FAIL: '$*' did not say '$want':"; cat "$tmp/err"; fail=1
  else
    echo "ok: $* -> $(head -1 "$tmp/err")"
  fi
}
expect_error "not a directory" "$bin" generate --model "$tmp/nowhere" --prompt-ids 1,2
mkdir -p "$tmp/empty"
expect_error "config.json: cannot open" "$bin" generate --model "$tmp/empty" --prompt-ids 1
echo '{"model_type": "llama"}' >"$tmp/empty/config.json"
expect_error "is not supported" "$bin" generate --model "$tmp/empty" --prompt-ids 1
expect_error "max-tokens" "$bin" generate --model "$tmp/empty" --prompt-ids 1 --max-tokens -3
expect_error "unknown-flag" "$bin" generate --prompt-ids 1 --unknown-flag
expect_error "--prompt-ids" "$bin" generate --model "$tmp/empty"
printf 'xxxxxxxx' >"$tmp/empty/model.safetensors"
echo '{"model_type": "qwen3_next"}' >"$tmp/empty/config.json"
expect_error "header length" "$bin" generate --model "$tmp/empty" --prompt-ids 1
# --draft needs an MTP head and greedy decoding.
golden="$(cd "$(dirname "$0")/../golden" && pwd)"
expect_error "has no MTP head" "$bin" generate --model "$golden/a_bf16_per_expert" --prompt-ids 1,2 --draft 2
expect_error "greedy" "$bin" generate --model "$golden/c_f16_tied_mtp" --prompt-ids 1,2 --draft 2 --temperature 0.7
expect_error "has no MTP head" "$bin" bench --model "$golden/a_bf16_per_expert" --prompt-ids 1,2 --draft 2
# Residency budgets are checked while parsing, before the model loads.
expect_error "residency limit must be more than 0" "$bin" serve --residency-limit 0
expect_error "residency device limit must be more than 0" "$bin" serve --residency-device-limit 0
expect_error "draft-max-streams" "$bin" serve --draft-max-streams -1
expect_error "chain" "$bin" serve --chain sometimes
exit $fail
