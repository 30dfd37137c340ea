#!/usr/bin/env bash
# The residency owner in the real server (../shared/design/residency.md, "Tests that pin it"):
#   fallback  run as an unprivileged user with a small `ulimit -l`: one warning, then it serves;
#             a startup set over --residency-limit: the same;
#   teardown  stopped while a tick is pending (short and long periods): exits within 3 s, code 0,
#             nothing at error level in the log.
# Usage: residency_server.sh path/to/tensorfold   (from the repository root: models/tiny-next)
set -u
bin=$(realpath "$1")
model=$(realpath models/tiny-next)
tmp=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail=0
say() { echo "$*"; }
bad() { echo "FAIL: $*"; fail=1; }

# start LOG ARGS...: starts "${prefix[@]}" $server serve ... ARGS on a free port (retrying if
# taken), sets $pid and $url, and waits until /health answers 200. Returns 1 when it never does.
prefix=()
server=$bin
start() {
  local log=$1
  shift
  for _ in 1 2 3 4 5; do
    local port=$((20000 + RANDOM % 30000))
    "${prefix[@]}" "$server" serve --model "$model" --threads 2 --port "$port" "$@" >"$log" 2>&1 &
    pid=$!
    url="http://127.0.0.1:$port"
    for _ in $(seq 1 300); do
      if ! kill -0 "$pid" 2>/dev/null; then break; fi
      if grep -q "listening on $url" "$log" &&
        [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ]; then return 0; fi
      sleep 0.1
    done
    wait "$pid" 2>/dev/null
    pid=
    grep -q "cannot listen" "$log" || { cat "$log"; return 1; }
  done
  return 1
}

# stop SIGNAL: signals the server and waits; sets $rc and $secs (how long it took).
stop() {
  local t0 t1
  t0=$(date +%s.%N)
  kill -s "$1" "$pid"
  wait "$pid"
  rc=$?
  pid=
  t1=$(date +%s.%N)
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
}

metric() { curl -s "$url/metrics" | awk -v n="$1" '$1 == n { print $2 }'; }

served() {  # a greedy completion answers 200
  local code
  code=$(curl -s -o "$tmp/answer" -w '%{http_code}' "$url/v1/completions" \
    -H 'content-type: application/json' -d '{"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}')
  [ "$code" = 200 ] || { echo "completion answered $code: $(cat "$tmp/answer")"; return 1; }
}

errors_in() { grep -E '\[(error|critical)\]|ERROR|AddressSanitizer|runtime error' "$1"; }

# --- fallback: unprivileged, `ulimit -l 64` ------------------------------------------------------
# As root (CI), drop to user nobody with setpriv (util-linux) or runuser; the binary and the model
# are copied where nobody can read them. As any other user, run as we are with the small limit.
mkdir -p "$tmp/run/model"
cp "$bin" "$tmp/run/tensorfold"
cp -r "$model"/. "$tmp/run/model/"
chmod -R a+rX "$tmp"
runner=()
if [ "$(id -u)" = 0 ]; then
  if command -v setpriv >/dev/null; then
    runner=(setpriv --reuid=nobody --regid=nogroup --clear-groups --inh-caps=-all --)
  elif command -v runuser >/dev/null; then
    runner=(runuser -u nobody --)
  else
    echo "SKIP fallback: running as root without setpriv or runuser"
  fi
fi
if [ "$(id -u)" != 0 ] || [ ${#runner[@]} -gt 0 ]; then
  model_saved=$model
  model=$tmp/run/model
  server=$tmp/run/tensorfold
  log=$tmp/fallback.log
  # The limit is set in a shell that then runs the server: soft and hard, so it cannot be raised.
  prefix=(bash -c 'ulimit -l 64 && exec "$@"' _ "${runner[@]}")
  if start "$log"; then
    user=$(ps -o user= -p "$pid" | tr -d ' ')
    [ "$(id -u)" != 0 ] || [ "$user" = nobody ] || bad "fallback: the server runs as $user"
    [ "$(awk '/^Max locked memory/ { print $4 }' "/proc/$pid/limits")" = 65536 ] ||
      bad "fallback: the server's RLIMIT_MEMLOCK is not 64 KiB"
    served || bad "fallback: the unprivileged server did not serve"
    [ "$(metric tensorfold_residency_active)" = 0 ] || bad "fallback: residency reported active"
    warnings=$(grep -c '\[warn' "$log")
    [ "$warnings" = 1 ] || bad "fallback: $warnings warnings, want exactly 1"
    grep -q 'residency: cannot hold.*RLIMIT_MEMLOCK.*serving without residency' "$log" ||
      bad "fallback: the warning does not say why"
    stop TERM
    [ "$rc" = 0 ] || bad "fallback: exit code $rc"
    if errors_in "$log"; then bad "fallback: error-level lines in the log"; fi
    say "ok: fallback as $user with ulimit -l 64, one warning: $(grep '\[warn' "$log" | sed 's/.*\[warn[a-z]*\] //')"
  else
    bad "fallback: the unprivileged server did not start"
    cat "$log"
  fi
  model=$model_saved
  server=$bin
  prefix=()
fi

# --- fallback: a startup set over the budget -----------------------------------------------------
log=$tmp/budget.log
if start "$log" --residency-limit 1M; then
  served || bad "budget: did not serve"
  [ "$(grep -c '\[warn' "$log")" = 1 ] || bad "budget: want exactly one warning"
  grep -q 'over the residency budget' "$log" || bad "budget: the warning does not say why"
  stop TERM
  say "ok: a startup set over --residency-limit 1M falls back with one warning and serves"
else
  bad "budget: the server did not start"
fi

# --- teardown with a pending tick -----------------------------------------------------------------
for spec in "250ms TERM" "60s INT"; do
  set -- $spec
  log=$tmp/teardown.log
  if ! start "$log" --residency-tick "$1" --keep-warm 10m; then
    bad "teardown ($1): the server did not start"
    continue
  fi
  served || bad "teardown ($1): did not serve"
  [ "$(metric tensorfold_residency_active)" = 1 ] || bad "teardown ($1): residency not active"
  if [ "$1" = 250ms ]; then
    # Let the tick run a few times, then stop between two ticks.
    for _ in $(seq 1 50); do
      [ "$(metric tensorfold_residency_ticks_total)" -ge 3 ] && break
      sleep 0.1
    done
    [ "$(metric tensorfold_residency_ticks_total)" -ge 3 ] || bad "teardown: the tick does not run"
    sleep 0.1
  else
    sleep 1  # the first tick is 59 s away
  fi
  stop "$2"
  [ "$rc" = 0 ] || bad "teardown ($1): exit code $rc"
  awk -v s="$secs" 'BEGIN { exit !(s < 3) }' || bad "teardown ($1): took $secs s"
  if errors_in "$log"; then bad "teardown ($1): error-level lines in the log"; fi
  say "ok: SIG$2 with a $1 tick pending: exit $rc in $secs s, no error in the log"
done
exit $fail
