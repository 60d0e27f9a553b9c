#!/usr/bin/env bash
# GCRA checks against one local redis-server: rl's RedisStore, a bare redis-rs EVALSHA loop of
# a minimal GCRA script, and redis-benchmark running that EVALSHA, at concurrency 1, 16 and 64,
# with Redis's CPU per check from INFO commandstats.
# With --cluster, the same against a local 3-master, 3-replica Redis Cluster.
# Usage: benches/scripts/redis_throughput.sh [SECONDS] [--cluster]   (from the workspace root)
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-5}
cargo build --release -p benches --bin redis_throughput --quiet
if [ "${2:-}" = "--cluster" ]; then
  # shellcheck source=../../scripts/lib/redis-cluster.sh
  source scripts/lib/redis-cluster.sh
  dir=$(mktemp -d)
  trap 'stop_redis_cluster; rm -rf "$dir"' EXIT
  start_redis_cluster "$dir"
  out=$(target/release/redis_throughput "$REDIS_CLUSTER_URLS" "$secs")
  echo "$out" | grep -v '^EVALSHA'
  # redis-benchmark --cluster routes only its own placeholder keys, so it has no row here.
  exit 0
fi
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
# REDIS_ARGS: more redis-server arguments (a server without functions: see BENCHMARKS.md).
# shellcheck disable=SC2086
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" ${REDIS_ARGS:-} >/dev/null &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
out=$(target/release/redis_throughput "redis://127.0.0.1:$port" "$secs")
echo "$out" | grep -v '^EVALSHA'
read -r sha key interval burst < <(echo "$out" | sed -n 's/^EVALSHA //p')
echo
echo "| concurrency | redis-benchmark EVALSHA/s | p50 / p99 (ms) |"
echo "|---:|---:|---:|"
for c in 1 16 64; do
  line=$(redis-benchmark -p "$port" -c "$c" -n $((c == 1 ? 20000 : 200000)) --csv \
    EVALSHA "$sha" 1 "$key" "$interval" "$burst" | tail -n 1)
  # "EVALSHA ...","rps","avg","min","p50","p95","p99","max"
  echo "$line" | awk -F'","' -v c="$c" '{ for (i = 1; i <= NF; i++) gsub(/"/, "", $i); printf "| %s | %.0f | %s / %s |\n", c, $2, $5, $7 }'
done
