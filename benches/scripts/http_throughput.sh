#!/usr/bin/env bash
# HTTP throughput of one axum route on one worker thread, with `wrk -t1 -c64` on loopback:
# bare, and behind rl or tower_governor with a limit nothing hits and with every request
# rejected. Prints requests/s and the ratio to bare: with REPS > 1, every server is run once per
# repetition, in turn (alternating), and each ratio is to the same repetition's bare; the table
# gives the median and the range.
# Usage: [MODES="bare ..."] benches/scripts/http_throughput.sh [SECONDS] [REPS]
# (from the workspace root; needs wrk)
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-5}
reps=${2:-1}
command -v wrk >/dev/null || { echo "wrk is missing: apt-get install wrk" >&2; exit 1; }
cargo build --release -p benches --bin http_server --quiet
server=target/release/http_server
log=$(mktemp)
pid=""
redis_pid=""
# (each kill may find its process gone: `|| true`, or errexit would end the trap early)
trap '[ -n "$pid" ] && { kill $pid 2>/dev/null || true; }; [ -n "$redis_pid" ] && { kill $redis_pid || true; }; rm -f "$log"' EXIT
declare -A rps
modes="bare rl-allow governor-allow rl-allow-x rl-allow-noheaders governor-allow-noheaders rl-reject governor-reject"
redis_modes="rl-redis-allow rl-redis-noheaders rl-redis-reject naive-redis"
# With redis-server installed, the same server with its state in a local Redis (one key).
if command -v redis-server >/dev/null; then
  redis_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  redis_dir=$(mktemp -d)
  redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$redis_dir" >/dev/null &
  redis_pid=$!
  for _ in $(seq 100); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  export REDIS_URL="redis://127.0.0.1:$redis_port"
  modes="$modes $redis_modes"
fi
# MODES="bare naive-redis ..." runs only those (bare first: the ratios need it).
modes=${MODES:-$modes}
for rep in $(seq "$reps"); do
  for mode in $modes; do
    "$server" "$mode" 127.0.0.1:0 >"$log" &
    pid=$!
    for _ in $(seq 100); do grep -q listening "$log" && break; sleep 0.1; done
    url=$(sed -n 's/^listening on //p' "$log")
    wrk -t1 -c64 -d1s "$url/" >/dev/null            # warm up
    rps[$mode]="${rps[$mode]:-} $(wrk -t1 -c64 -d"${secs}s" "$url/" | awk '/^Requests\/sec/ { print $2 }')"
    kill $pid; wait $pid 2>/dev/null || true
  done
done
printf '| server | requests/s (median) | ratio to bare: median | min-max (%s reps) |\n|---|---:|---:|---:|\n' "$reps"
for mode in $modes; do
  python3 - "${rps[bare]}" "${rps[$mode]}" "$mode" <<'PY'
import statistics, sys
bare = [float(x) for x in sys.argv[1].split()]
mine = [float(x) for x in sys.argv[2].split()]
ratios = [m / b for m, b in zip(mine, bare)]
print(f"| {sys.argv[3]} | {statistics.median(mine):.0f} | {statistics.median(ratios):.2f} | {min(ratios):.2f}-{max(ratios):.2f} |")
PY
done
