#!/usr/bin/env bash
# The server with --tp 2 end to end (label tp), then a rank killed mid-serve (label faults):
#   serve     `mpirun -np 2 tensorfold serve --tp 2`: /health, a chat completion, a stream, two
#             requests at once, a chat's second turn (resumed from a kept state: copied on every rank);
#             greedy replies equal those of a TP=1 server; SIGTERM stops it within 5 s.
#   kill      rank 1 killed (SIGKILL) while a long stream runs: rank 0 reports "rank 1 (pid P)
#             died", every process is gone within 5 s, mpirun exits non-zero, the client's
#             connection ends (no hang).
# Usage: server_tp.sh path/to/tensorfold path/to/mpirun serve|kill  (from the repository root;
# SERVE_EXTRA adds flags to both servers, e.g. SERVE_EXTRA="--draft-max 2")
set -u
bin=$(realpath "$1")
mpirun=$2
what=$3
model=$(realpath models/tiny-next)
tmp=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# start LOG NP ARGS...: a server (under mpirun when NP > 1) on a free port; sets $pid and $url.
start() {
  local log=$1 np=$2
  shift 2
  for _ in 1 2 3 4 5; do
    local port=$((20000 + RANDOM % 30000))
    if [ "$np" = 1 ]; then
      "$bin" serve --model "$model" --threads 1 --port "$port" ${SERVE_EXTRA:-} "$@" >"$log" 2>&1 &
    else
      "$mpirun" --allow-run-as-root --oversubscribe --bind-to none -np "$np" \
        "$bin" serve --tp "$np" --model "$model" --threads 1 --port "$port" ${SERVE_EXTRA:-} "$@" >"$log" 2>&1 &
    fi
    pid=$!
    url="http://127.0.0.1:$port"
    for _ in $(seq 1 600); do
      if ! kill -0 "$pid" 2>/dev/null; then break; fi
      if grep -q "listening on $url" "$log" &&
        [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ]; then return 0; fi
      sleep 0.1
    done
    wait "$pid" 2>/dev/null
    pid=
    grep -q "cannot listen" "$log" || break
  done
  echo "--- $log"
  cat "$log"
  return 1
}

# signal_and_wait SIG PID LABEL: sends SIG to PID (a rank), waits for mpirun ($pid) to exit, sets
# $code to its exit code, and fails unless it took under 5 s.
signal_and_wait() {
  local t0 dt
  t0=$(date +%s.%N)
  kill -"$1" "$2"
  wait "$pid"
  code=$?
  pid=
  dt=$(python3 -c "print(round($(date +%s.%N) - $t0, 2))")
  echo "$3: mpirun exited with $code after ${dt}s"
  python3 -c "import sys; sys.exit(0 if $dt < 5 else 1)" || bad "stopping took ${dt}s"
}

# rank_pid R: the pid of rank R, the child of mpirun whose environment has OMPI_COMM_WORLD_RANK=R.
rank_pid() {
  for c in $(pgrep -P "$pid"); do
    if tr '\0' '\n' <"/proc/$c/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1"; then
      echo "$c"
    fi
  done
}

chat() {  # chat BODY -> the reply's JSON
  curl -s -m 60 "$url/v1/chat/completions" -H 'Content-Type: application/json' -d "$1"
}
content() { python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])'; }

q1='{"messages": [{"role": "user", "content": "What is 123 + 456?"}], "temperature": 0, "max_tokens": 24, "chat_template_kwargs": {"enable_thinking": false}}'
q2='{"messages": [{"role": "user", "content": "Copy this: the quick brown fox jumps over the lazy dog"}], "temperature": 0, "max_tokens": 24}'

# Replies of one server: q1, q2, both at once, a stream, then a second turn of q1's chat.
replies() {
  local out=$1
  chat "$q1" | content >"$out.1" || bad "q1"
  chat "$q2" | content >"$out.2" || bad "q2"
  chat "$q1" | content >"$out.3a" &
  local a=$!
  chat "$q2" | content >"$out.3b" || bad "q2 in parallel"
  wait $a || bad "q1 in parallel"
  curl -sN -m 60 "$url/v1/chat/completions" -H 'Content-Type: application/json' \
    -d "${q1%\}}, \"stream\": true}" | grep -c '^data: ' >"$out.stream"
  local a1
  a1=$(cat "$out.1")
  # With a system prompt over 64 tokens, so that the first turn keeps a state the second resumes.
  python3 - "$a1" >"$tmp/turn1.json" <<'PY'
import json, sys
sys_msg = "You are a careful assistant. " * 12
print(json.dumps({"messages": [
    {"role": "system", "content": sys_msg},
    {"role": "user", "content": "What is 123 + 456?"}],
  "temperature": 0, "max_tokens": 16, "chat_template_kwargs": {"enable_thinking": False}}))
PY
  chat "$(cat "$tmp/turn1.json")" >"$out.t1.json"
  content <"$out.t1.json" >"$out.5" || bad "first turn with a system prompt"
  python3 - "$(cat "$out.5")" >"$tmp/turn2.json" <<'PY'
import json, sys
sys_msg = "You are a careful assistant. " * 12
print(json.dumps({"messages": [
    {"role": "system", "content": sys_msg},
    {"role": "user", "content": "What is 123 + 456?"},
    {"role": "assistant", "content": sys.argv[1]},
    {"role": "user", "content": "And 1 + 1?"}],
  "temperature": 0, "max_tokens": 16, "chat_template_kwargs": {"enable_thinking": False}}))
PY
  chat "$(cat "$tmp/turn2.json")" >"$out.t2.json"
  content <"$out.t2.json" >"$out.4" || bad "second turn"
  python3 -c 'import json,sys; print(json.load(sys.stdin)["usage"]["prompt_tokens_details"]["cached_tokens"])' \
    <"$out.t2.json" >"$out.cached"
}

if [ "$what" = serve ]; then
  start "$tmp/one.log" 1 || { echo "FAIL: the TP=1 server did not start"; exit 1; }
  replies "$tmp/one"
  kill "$pid"; wait "$pid"; pid=
  start "$tmp/tp.log" 2 || { echo "FAIL: the --tp 2 server did not start"; exit 1; }
  replies "$tmp/tp"
  [ "$(cat "$tmp/tp.cached")" -gt 0 ] || bad "the second turn resumed no kept state under --tp 2"
  echo "TP=2 second turn: $(cat "$tmp/tp.cached") prompt tokens from a kept state"
  for f in 1 2 3a 3b 4 5; do
    if ! cmp -s "$tmp/one.$f" "$tmp/tp.$f"; then
      bad "reply $f differs: TP=1 '$(cat "$tmp/one.$f")' vs TP=2 '$(cat "$tmp/tp.$f")'"
    fi
  done
  [ "$(cat "$tmp/tp.stream")" -ge 3 ] || bad "the stream sent $(cat "$tmp/tp.stream") events"
  echo "TP=2 reply 1: $(cat "$tmp/tp.1")"
  # SIGTERM to rank 0 (the server): it stops as a single process does, then tells the followers
  # to stop; everything exits 0. (SIGTERM to mpirun is forwarded to every rank: the same clean
  # stop, but mpirun itself then exits 1.)
  signal_and_wait TERM "$(rank_pid 0)" "SIGTERM to rank 0"
  [ "$code" = 0 ] || bad "exit code $code after SIGTERM"
  grep -q "tensor parallel" "$tmp/tp.log" && bad "an error on a clean stop: $(grep 'tensor parallel' "$tmp/tp.log")"
elif [ "$what" = kill ]; then
  start "$tmp/tp.log" 2 || { echo "FAIL: the --tp 2 server did not start"; exit 1; }
  victim=$(rank_pid 1)
  [ -n "$victim" ] || { echo "FAIL: no rank 1 under mpirun $pid"; exit 1; }
  ranks=$(pgrep -P "$pid" | tr '\n' ' ')
  long='{"messages": [{"role": "user", "content": "Tell me a story."}], "temperature": 0, "max_tokens": 4000, "ignore_eos": true, "stream": true}'
  curl -sN -m 30 "$url/v1/chat/completions" -H 'Content-Type: application/json' -d "$long" \
    >"$tmp/stream.out" 2>&1 &
  client=$!
  sleep 1
  signal_and_wait KILL "$victim" "rank 1 killed"
  [ "$code" -ne 0 ] || bad "mpirun exited 0"
  grep "tensor parallel" "$tmp/tp.log" || bad "no clear error from rank 0"
  grep -q "rank 1 (pid $victim) died" "$tmp/tp.log" || bad "the error does not name rank 1"
  for r in $ranks; do  # gone, or a zombie nobody reaped (a container's init may not)
    state=$(awk '{print $3}' "/proc/$r/stat" 2>/dev/null)
    if [ -n "$state" ] && [ "$state" != Z ]; then bad "rank process $r still runs ($state)"; fi
  done
  for _ in $(seq 1 50); do kill -0 "$client" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$client" 2>/dev/null; then
    bad "the client still waits 5 s later"
    kill "$client"
  fi
  wait "$client" 2>/dev/null
  echo "client got $(grep -c '^data: ' "$tmp/stream.out") events before the stop"
  [ $fail = 0 ] || { echo "--- log"; cat "$tmp/tp.log"; }
fi
[ $fail = 0 ] && echo "PASS: $what"
exit $fail
