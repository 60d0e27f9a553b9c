# Sourced by the HTTP bench scripts (from the workspace root): sets `work` to a scratch
# folder; `pid` and `redis_pid`, when set, are killed on exit. `need COMMAND PACKAGE` stops
# with a hint when COMMAND is missing; `free_port` prints a free loopback port;
# `build_http_server` builds the `http_server` bin and sets `server` to its path;
# `start_redis`, when redis-server is installed, starts one on a free port and exports
# REDIS_URL for the Redis modes.
need() { command -v "$1" >/dev/null || { echo "$1 is missing: apt-get install $2" >&2; exit 1; }; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
build_http_server() {
  cargo build --release -p benches --bin http_server --quiet
  server=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/http_server
}
start_redis() {
  command -v redis-server >/dev/null || return 0
  redis_port=$(free_port)
  redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >/dev/null &
  redis_pid=$!
  for _ in $(seq 100); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  export REDIS_URL="redis://127.0.0.1:$redis_port"
}
work=$(mktemp -d)
pid=""
redis_pid=""
trap '[ -n "$pid" ] && { kill $pid 2>/dev/null || true; }; [ -n "$redis_pid" ] && { kill $redis_pid 2>/dev/null || true; }; rm -rf "$work"' EXIT
