#!/usr/bin/env bash
# HTTP throughput of one axum route on one worker thread, with `wrk -t1 -c64` on loopback:
# bare, and behind rl or tower_governor with a limit nothing hits and with every request
# rejected. Prints requests/s and the ratio to bare, from one run of this script.
# Usage: benches/scripts/http_throughput.sh [SECONDS]   (from the workspace root; needs wrk)
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-5}
command -v wrk >/dev/null || { echo "wrk is missing: apt-get install wrk" >&2; exit 1; }
cargo build --release -p benches --bin http_server --quiet
server=target/release/http_server
log=$(mktemp)
trap 'kill $pid 2>/dev/null; rm -f "$log"' EXIT
declare -A rps
modes="bare rl-allow governor-allow rl-allow-x rl-allow-noheaders governor-allow-noheaders rl-reject governor-reject"
for mode in $modes; do
  "$server" "$mode" 127.0.0.1:0 >"$log" &
  pid=$!
  for _ in $(seq 100); do grep -q listening "$log" && break; sleep 0.1; done
  url=$(sed -n 's/^listening on //p' "$log")
  wrk -t1 -c64 -d1s "$url/" >/dev/null            # warm up
  rps[$mode]=$(wrk -t1 -c64 -d"${secs}s" "$url/" | awk '/^Requests\/sec/ { print $2 }')
  kill $pid; wait $pid 2>/dev/null || true
done
printf '| server | requests/s | ratio to bare |\n|---|---:|---:|\n'
for mode in $modes; do
  ratio=$(awk -v a="${rps[$mode]}" -v b="${rps[bare]}" 'BEGIN { printf "%.2f", a / b }')
  printf '| %s | %.0f | %s |\n' "$mode" "${rps[$mode]}" "$ratio"
done
