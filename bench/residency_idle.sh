#!/usr/bin/env bash
# The residency benchmark (not a test): the latency of a 1-token request after idle gaps while a
# second process puts the machine under memory pressure, with and without the residency owner,
# against the same request on a busy server. See docs/PERFORMANCE.md, "Residency".
#
#   bench/residency_idle.sh TENSORFOLD MODEL_DIR MEMORY_PRESSURE OUT_DIR [TOKENIZER_DIR]
#
# TENSORFOLD is the binary, MODEL_DIR a checkpoint (e.g. from `tensorfold make-checkpoint`; if it has
# no tokenizer the files are copied from TOKENIZER_DIR, default models/tiny-next),
# MEMORY_PRESSURE the bench/memory_pressure binary. OUT_DIR gets results.csv, one server log per
# mode and table.md. Environment: GAPS (seconds, default "2 6 30 60 120"), BUSY_N (requests in the
# busy baseline, default 10), MODES (default "held unheld"), RESERVE_MIB (what the pressure leaves
# available, default 1536), THREADS (default 2), PRESSURE=0 to measure idle gaps without pressure.
set -euo pipefail
bin=$(realpath "$1")
model=$(realpath "$2")
pressure=$(realpath "$3")
out=$4
tokenizer=${5:-models/tiny-next}
gaps=${GAPS:-2 6 30 60 120}
busy_n=${BUSY_N:-10}
modes=${MODES:-held unheld}
reserve=${RESERVE_MIB:-1536}
threads=${THREADS:-2}
mkdir -p "$out"
if [ ! -f "$model/tokenizer.json" ]; then
  cp "$tokenizer/tokenizer.json" "$tokenizer/tokenizer_config.json" "$model/"
fi
body='{"prompt": "The capital of France is", "max_tokens": 1, "temperature": 0}'
now() { date +%s.%N; }
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; true' EXIT

request() {  # prints "ms" of one 1-token completion (fails on a non-200 answer)
  local r
  r=$(curl -s -o /dev/null -w '%{http_code} %{time_total}' -H 'content-type: application/json' \
    -d "$body" "$url/v1/completions")
  [ "${r%% *}" = 200 ] || { echo "request failed: $r" >&2; return 1; }
  awk -v t="${r#* }" 'BEGIN { printf "%.1f", t * 1000 }'
}
metric() { curl -s "$url/metrics" | awk -v n="$1" '$1 == n { print $2 }'; }
rss_file_mib() { awk '/^RssFile/ { printf "%.0f", $2 / 1024 }' "/proc/$pid/status"; }
median() { tr ' ' '\n' | grep . | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

echo "mode,kind,gap_s,actual_gap_s,latency_ms,rss_file_mib,pages_found_out,pressure" >"$out/results.csv"
for mode in $modes; do
  flags=()
  [ "$mode" = unheld ] && flags=(--no-residency)
  port=$((20000 + RANDOM % 30000))
  url="http://127.0.0.1:$port"
  "$bin" serve --model "$model" --port "$port" --threads "$threads" --parallel 1 "${flags[@]}" \
    >"$out/server-$mode.log" 2>&1 &
  pid=$!
  until [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ]; do
    kill -0 "$pid" || { cat "$out/server-$mode.log"; exit 1; }
    sleep 0.5
  done
  echo "== $mode: $(grep -E 'residency' "$out/server-$mode.log" | head -1 | sed 's/^\[[^]]*\] //')"
  for _ in 1 2 3; do request >/dev/null; done  # warm-up
  busy=""
  for _ in $(seq 1 "$busy_n"); do
    ms=$(request)
    busy="$busy $ms"
    echo "$mode,busy,0,0,$ms,$(rss_file_mib),$(metric tensorfold_residency_pages_found_out_total),-" >>"$out/results.csv"
  done
  echo "busy (back to back, $busy_n requests): median $(echo "$busy" | median) ms:$busy"
  for gap in $gaps; do
    request >/dev/null  # the request before the gap (re-arms the keep-warm window)
    t_end=$(now)
    note=-
    if [ "${PRESSURE:-1}" != 0 ]; then note=$("$pressure" --reserve-mib "$reserve" --hold-ms 500); fi
    left=$(awk -v a="$t_end" -v b="$(now)" -v g="$gap" 'BEGIN { l = g - (b - a); print (l > 0 ? l : 0) }')
    sleep "$left"
    actual=$(awk -v a="$t_end" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
    rss=$(rss_file_mib)
    ms=$(request)
    found=$(metric tensorfold_residency_pages_found_out_total)
    echo "$mode,idle,$gap,$actual,$ms,$rss,$found,$note" >>"$out/results.csv"
    echo "gap $gap s (actual $actual s): $ms ms; RssFile before it $rss MiB; pressure: $note"
  done
  kill -TERM "$pid"
  wait "$pid" || true
  pid=
done

# The table: one row per gap, each mode's latency and its ratio to that mode's busy median.
awk -F, '
  $2 == "busy" { b[$1] = b[$1] " " $5 }
  $2 == "idle" { lat[$1, $3] = $5; act[$1, $3] = $4; if (!($3 in seen)) { seen[$3] = 1; order[++n] = $3 } }
  function med(s,   a, k, i, j, t) {
    k = split(s, a, " ")
    for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return (k % 2) ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
  }
  END {
    printf "| idle gap | with residency | ratio to busy | without residency | ratio to busy |\n| --- | --- | --- | --- | --- |\n"
    printf "| busy (median of back-to-back) | %.0f ms | 1.00x | %.0f ms | 1.00x |\n", med(b["held"]), med(b["unheld"])
    for (i = 1; i <= n; i++) {
      g = order[i]
      printf "| %s s (actual %s / %s s) | %.0f ms | %.2fx | %.0f ms | %.2fx |\n", g, act["held", g], act["unheld", g],
        lat["held", g], (med(b["held"]) ? lat["held", g] / med(b["held"]) : 0),
        lat["unheld", g], (med(b["unheld"]) ? lat["unheld", g] / med(b["unheld"]) : 0)
    }
  }' "$out/results.csv" | tee "$out/table.md"
