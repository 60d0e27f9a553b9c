#!/usr/bin/env bash
# Where the server's time per request goes, kernel included: for each MODE of the `http_server`
# bin (as benches/scripts/http_throughput.sh runs it), `perf record -e cpu-clock` (a software
# clock: it works where a VM offers no hardware counters) samples the server at 2 kHz over
# SECONDS of `wrk -t1 -c64`; prints µs per request in the kernel, the server's own code and
# each library, and the hottest symbols, in µs per request. Timings, not instructions: compare modes of one run.
# Usage: benches/scripts/http_profile.sh [SECONDS] MODE...   (from the workspace root; needs
# perf and wrk, and redis-server for the Redis modes)
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-4}
shift
# shellcheck source=http_server.sh
source benches/scripts/http_server.sh
need wrk wrk
need perf linux-perf
build_http_server
start_redis
hz=2000
for mode in "$@"; do
  "$server" "$mode" 127.0.0.1:0 >"$work/log" &
  pid=$!
  for _ in $(seq 100); do grep -q listening "$work/log" && break; sleep 0.1; done
  url=$(sed -n 's/^listening on //p' "$work/log")
  wrk -t1 -c64 -d1s "$url/" >/dev/null   # warm up
  perf record -q -F "$hz" -e cpu-clock -p "$pid" -o "$work/$mode.data" -- sleep "$secs" >/dev/null 2>&1 &
  perf_pid=$!
  requests=$(wrk -t1 -c64 -d"${secs}s" "$url/" | awk '/requests in/ { print $1 }')
  wait "$perf_pid" || true
  kill "$pid"; wait "$pid" 2>/dev/null || true
  pid=""
  printf '\n%s: %s requests in %s s\n\n| where | µs per request |\n|---|---:|\n' "$mode" "$requests" "$secs"
  perf report -i "$work/$mode.data" -n --no-children --sort dso -g none 2>/dev/null \
    | awk -v n="$requests" -v hz="$hz" '/^ +[0-9.]+%/ && $2 * 1e6 / hz / n >= 0.01 {
        printf "| %s | %.2f |\n", $3, $2 * 1e6 / hz / n }'
  printf '\n| symbol | µs per request |\n|---|---:|\n'
  perf report -i "$work/$mode.data" -n --no-children --sort sym -g none 2>/dev/null \
    | awk -v n="$requests" -v hz="$hz" '/^ +[0-9.]+%/ && shown++ < 12 {
        us = $2 * 1e6 / hz / n; $1 = ""; $2 = ""; $3 = ""; sub(/^ +/, "")
        printf "| `%s` | %.3f |\n", substr($0, 1, 90), us }'
done
