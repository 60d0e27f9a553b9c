#!/usr/bin/env bash
# Where the CPU of a request goes: for each MODE of the `http_server` bin (as
# benches/scripts/http_throughput.sh runs it), the server's and redis-server's user and system
# CPU per request (from /proc/PID/stat) over SECONDS of `wrk -t1 -c64`, and the calls Redis ran
# (INFO commandstats). On two cores shared by wrk, the server and Redis, requests/s follows the
# sum of all three, so a figure that moves one process's CPU shows here and not always there.
# Usage: benches/scripts/http_cpu.sh [SECONDS] MODE...   (from the workspace root; needs wrk
# and redis-server)
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-5}
shift
# shellcheck source=http_server.sh
source benches/scripts/http_server.sh
need wrk wrk
need redis-server redis-server
build_http_server
# user and system ticks of a process
ticks() { awk '{ print $14, $15 }' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
printf '| server | requests/s | server user / sys µs per request | Redis user / sys µs per request | Redis calls per request |\n'
printf '|---|---:|---:|---:|---:|\n'
for mode in "$@"; do
  redis_port=$(free_port)
  redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >/dev/null &
  redis_pid=$!
  for _ in $(seq 100); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  export REDIS_URL="redis://127.0.0.1:$redis_port"
  port=$(free_port)
  "$server" "$mode" "127.0.0.1:$port" >"$work/log" &
  pid=$!
  for _ in $(seq 100); do grep -q listening "$work/log" && break; sleep 0.1; done
  wrk -t1 -c64 -d1s "http://127.0.0.1:$port/" >/dev/null   # warm up
  redis-cli -p "$redis_port" config resetstat >/dev/null
  read -r su0 ss0 < <(ticks "$pid")
  read -r ru0 rs0 < <(ticks "$redis_pid")
  requests=$(wrk -t1 -c64 -d"${secs}s" "http://127.0.0.1:$port/" | awk '/requests in/ { print $1 }')
  read -r su1 ss1 < <(ticks "$pid")
  read -r ru1 rs1 < <(ticks "$redis_pid")
  calls=$(redis-cli -p "$redis_port" info commandstats \
    | sed -n 's/^cmdstat_\(fcall\|evalsha\|eval\):calls=\([0-9]*\).*/\2/p' | awk '{ s += $1 } END { print s + 0 }')
  kill "$pid" "$redis_pid"; wait "$pid" "$redis_pid" 2>/dev/null || true
  pid=""
  redis_pid=""
  python3 - "$mode" "$requests" "$secs" "$hz" "$su0" "$ss0" "$su1" "$ss1" "$ru0" "$rs0" "$ru1" "$rs1" "$calls" <<'PY'
import sys
mode, n, secs, hz = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
su0, ss0, su1, ss1, ru0, rs0, ru1, rs1, calls = map(int, sys.argv[5:])
us = lambda ticks: ticks / hz * 1e6 / n
print(f"| {mode} | {n / secs:.0f} | {us(su1 - su0):.2f} / {us(ss1 - ss0):.2f} | "
      f"{us(ru1 - ru0):.2f} / {us(rs1 - rs0):.2f} | {calls / n:.3f} |")
PY
done
