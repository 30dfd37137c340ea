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
# mode and table.md.
#
# Per mode (the server with residency, then with --no-residency): 3 warm-up requests, BUSY_N
# back-to-back requests (the busy baseline), then for each gap: a request, the gap (with the
# pressure process filling RAM and exiting inside it; the gap is at least as long as that takes),
# the measured request, and right after it 2 more requests (a busy reference taken at the same
# moment, so a machine shared with other work compares like with like). The server's page faults
# during the measured request are read from /proc. QUIET_GAPS repeats the gaps with no pressure.
#
# Environment: GAPS (default "2 6 30 60 120"), QUIET_GAPS (default "2 6 30"), BUSY_N (default 10),
# MODES (default "held held-touch unheld": the server with residency, with residency and a tick
# that also reads 256 MiB of the set (--residency-touch 256M), and with --no-residency), RESERVE_MIB (what the pressure leaves available, default 1536),
# THREADS (default 2).
set -euo pipefail
bin=$(realpath "$1")
model=$(realpath "$2")
pressure=$(realpath "$3")
out=$4
tokenizer=${5:-models/tiny-next}
gaps=${GAPS:-2 6 30 60 120}
quiet_gaps=${QUIET_GAPS-2 6 30}
busy_n=${BUSY_N:-10}
modes=${MODES:-held held-touch unheld}
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

faults() { awk '{ print $10, $12 }' "/proc/$pid/stat"; }  # minflt majflt
load1() { cut -d' ' -f1 /proc/loadavg; }

# measure KIND GAP: the request before the gap, the gap (with pressure if KIND is "pressure"), the
# measured request and its busy reference; appends a row to results.csv.
measure() {
  local kind=$1 gap=$2 t_end note=- left actual rss f0 f1 ms a1 a2 after found
  request >/dev/null  # the request before the gap (it also re-arms the keep-warm window)
  t_end=$(now)
  if [ "$kind" = pressure ]; then note=$("$pressure" --reserve-mib "$reserve" --hold-ms 500); fi
  left=$(awk -v a="$t_end" -v b="$(now)" -v g="$gap" 'BEGIN { l = g - (b - a); print (l > 0 ? l : 0) }')
  sleep "$left"
  actual=$(awk -v a="$t_end" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
  rss=$(rss_file_mib)
  f0=$(faults)
  ms=$(request)
  f1=$(faults)
  a1=$(request)
  a2=$(request)
  after=$(awk -v a="$a1" -v b="$a2" 'BEGIN { printf "%.1f", (a + b) / 2 }')
  found=$(metric tensorfold_residency_pages_found_out_total)
  read -r min0 maj0 <<<"$f0"
  read -r min1 maj1 <<<"$f1"
  echo "$mode,$kind,$gap,$actual,$ms,$after,$((maj1 - maj0)),$((min1 - min0)),$rss,${found:-},$(load1),$note" >>"$out/results.csv"
  echo "$kind gap $gap s (actual $actual s): $ms ms, right after: $a1 $a2 ms; faults major $((maj1 - maj0)) minor $((min1 - min0)); RssFile before $rss MiB; load $(load1); $note"
}

echo "mode,kind,gap_s,actual_gap_s,latency_ms,after_ms,major_faults,minor_faults,rss_file_mib,pages_found_out,load1,pressure" >"$out/results.csv"
for mode in $modes; do
  case $mode in
    held) flags=() ;;
    held-touch) flags=(--residency-touch 256M) ;;
    unheld) flags=(--no-residency) ;;
    *) echo "unknown mode $mode" >&2; exit 2 ;;
  esac
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
    echo "$mode,busy,0,0,$ms,$ms,0,0,$(rss_file_mib),,$(load1),-" >>"$out/results.csv"
  done
  echo "busy (back to back, $busy_n requests): median $(echo "$busy" | median) ms:$busy"
  for gap in $gaps; do measure pressure "$gap"; done
  for gap in $quiet_gaps; do measure quiet "$gap"; done
  kill -TERM "$pid"
  wait "$pid" || true
  pid=
done

# The table: per mode, the busy median, then each gap's latency, its ratio to the busy reference
# taken right after it, and the server's major page faults during it.
awk -F, -v modes="$modes" '
  $2 == "busy" { b[$1] = b[$1] " " $5 }
  $2 != "busy" && $2 != "kind" {
    k = $2 SUBSEP $3
    if (!(k in seen)) { seen[k] = 1; order[++n] = k }
    lat[$1, k] = $5; ref[$1, k] = $6; maj[$1, k] = $7; act[$1, k] = $4
  }
  function med(s,   a, k, i, j, t) {
    k = split(s, a, " ")
    for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return (k % 2) ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
  }
  END {
    m = split(modes, M, " ")
    printf "| idle gap |"; for (j = 1; j <= m; j++) printf " %s |", M[j]; print ""
    printf "| --- |"; for (j = 1; j <= m; j++) printf " --- |"; print ""
    printf "| busy: median of back-to-back requests |"; for (j = 1; j <= m; j++) printf " %.0f ms |", med(b[M[j]]); print ""
    for (i = 1; i <= n; i++) {
      split(order[i], p, SUBSEP)
      printf "| %s s, %s |", p[2], (p[1] == "pressure" ? "memory pressure" : "quiet")
      for (j = 1; j <= m; j++) {
        k = order[i]
        printf " %.0f ms = %.2fx the %.0f ms right after; gap %s s; %d major faults |", lat[M[j], k], lat[M[j], k] / ref[M[j], k], ref[M[j], k], act[M[j], k], maj[M[j], k]
      }
      print ""
    }
  }' "$out/results.csv" | tee "$out/table.md"
