#!/usr/bin/env bash
# Instructions the HTTP server spends per request (callgrind), for each MODE of the
# `http_server` bin (as benches/scripts/http_throughput.sh runs it), while `wrk -t1 -c64`
# loads it: the counters are zeroed after a warm-up and dumped after SECONDS of load, so
# start-up is left out. Instructions do not move with this machine's other load, which the
# requests/s of http_throughput.sh do; batch sizes of the Redis modes still depend on timing
# (the server runs ~50x slower under callgrind). With PROFILE=DIR, each mode's dump is kept
# in DIR for callgrind_annotate.
# Usage: benches/scripts/http_instructions.sh [SECONDS] MODE...   (from the workspace root;
# needs valgrind and wrk, and redis-server for the Redis modes)
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-5}
shift
# shellcheck source=http_server.sh
source benches/scripts/http_server.sh
need valgrind valgrind
need wrk wrk
build_http_server
start_redis
printf '| server | requests | instructions per request |\n|---|---:|---:|\n'
for mode in "$@"; do
  port=$(free_port)
  out=$work/$mode.callgrind
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" "$server" "$mode" "127.0.0.1:$port" \
    >"$work/$mode.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do grep -q listening "$work/$mode.log" && break; sleep 0.1; done
  wrk -t1 -c64 -d2s "http://127.0.0.1:$port/" >/dev/null   # warm up
  callgrind_control --instr=on "$pid" >/dev/null 2>&1
  requests=$(wrk -t1 -c64 -d"${secs}s" "http://127.0.0.1:$port/" | awk '/requests in/ { print $1 }')
  callgrind_control --instr=off "$pid" >/dev/null 2>&1
  kill "$pid"; wait "$pid" 2>/dev/null || true
  pid=""
  dump=$out
  total=$(sed -n "s/^totals: \([0-9]*\).*/\1/p" "$dump")
  printf '| %s | %s | %s |\n' "$mode" "$requests" $(( total / requests ))
  if [ -n "${PROFILE:-}" ]; then
    mkdir -p "$PROFILE"
    cp "$dump" "$PROFILE/$mode.callgrind"
  fi
done
