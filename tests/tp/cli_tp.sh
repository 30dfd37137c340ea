#!/usr/bin/env bash
# `tensorfold generate --tp N` under mpirun (label tp): the same greedy tokens as one process at
# N = 2 and 4, with and without MTP drafts; and the two ways to get --tp wrong, each refused with
# a message that says what to run; bad input ends every rank at once.
# Usage: cli_tp.sh path/to/tensorfold path/to/mpirun   (from the repository root)
set -u
bin=$1
mpirun=(${2} --allow-run-as-root --oversubscribe --bind-to none)
fail=0
bad() { echo "FAIL: $*"; fail=1; }

tokens() {  # tokens NP ARGS... -> the "tokens" array of generate --json
  local np=$1
  shift
  if [ "$np" = 1 ]; then
    "$bin" generate --threads 1 --json "$@"
  else
    "${mpirun[@]}" -np "$np" "$bin" generate --tp "$np" --threads 1 --json "$@"
  fi | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])'
}

for prompt in 1,2,3 100,200,300,400,500,600,700 42; do
  for draft in 0 2; do
    one=$(tokens 1 --prompt-ids "$prompt" --max-tokens 24 --ignore-eos --draft "$draft")
    [ -n "$one" ] || bad "no tokens at TP=1"
    for np in 2 4; do
      got=$(tokens "$np" --prompt-ids "$prompt" --max-tokens 24 --ignore-eos --draft "$draft")
      [ "$got" = "$one" ] || bad "prompt $prompt draft $draft: TP=$np $got vs TP=1 $one"
    done
  done
done
echo "tokens equal at TP=1/2/4 on 3 prompts, with and without drafts"

out=$("$bin" generate --tp 2 --prompt-ids 1 2>&1)
code=$?
[ $code = 2 ] || bad "--tp 2 outside mpirun exited $code"
echo "$out" | grep -q "needs exactly 2 processes.*mpirun -np 2" || bad "message: $out"
out=$("${mpirun[@]}" -np 2 "$bin" generate --prompt-ids 1 2>&1)
[ $? != 0 ] || bad "mpirun -np 2 without --tp exited 0"
echo "$out" | grep -q "one of 2 processes started by mpirun, but --tp is 1: pass --tp 2" ||
  bad "message: $out"

# Failures on the way in end the job at once, with the reason: a model no rank can load, and a
# bad argument that rank 0 finds after loading (the followers are told to stop).
out=$(timeout 30 "${mpirun[@]}" -np 2 "$bin" generate --tp 2 --model /nonexistent --prompt-ids 1 2>&1)
code=$?
[ $code != 0 ] && [ $code != 124 ] || bad "a missing model under --tp 2 exited $code"
echo "$out" | grep -q "rank 1: not found: /nonexistent" || bad "message: $out"
out=$(timeout 30 "${mpirun[@]}" -np 2 "$bin" generate --tp 2 --prompt-ids 999999 2>&1)
code=$?
[ $code = 2 ] || bad "a bad --prompt-ids under --tp 2 exited $code"
echo "$out" | grep -q "is not a token id" || bad "message: $out"

[ $fail = 0 ] && echo PASS
exit $fail
