# Sourced by the HTTP bench scripts (from the workspace root): sets `work` to a scratch
# folder; `pid` and `redis_pid`, when set, are killed on exit. `need COMMAND PACKAGE` stops
# with a hint when COMMAND is missing; `free_port` prints a free loopback port;
# `build_http_server` builds the `http_server` bin and sets `server` to its path.
need() { command -v "$1" >/dev/null || { echo "$1 is missing: apt-get install $2" >&2; exit 1; }; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
build_http_server() {
  cargo build --release -p benches --bin http_server --quiet
  server=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/http_server
}
work=$(mktemp -d)
pid=""
redis_pid=""
trap '[ -n "$pid" ] && { kill $pid 2>/dev/null || true; }; [ -n "$redis_pid" ] && { kill $redis_pid 2>/dev/null || true; }; rm -rf "$work"' EXIT
