#!/usr/bin/env bash
# Redis CPU per request for several limits decided together, against one quota (see
# benches/src/bin/redis_limits.rs), on a local redis-server of its own.
# Usage: benches/scripts/redis_limits.sh [REQUESTS]   (from the workspace root)
set -euo pipefail
cd "$(dirname "$0")/../.."
requests=${1:-20000}
cargo build --release -p benches --bin redis_limits --quiet
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" >/dev/null &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
target/release/redis_limits "redis://127.0.0.1:$port" "$requests"
