#!/usr/bin/env bash
# Instructions redis-server spends per GCRA check (callgrind: noise-free, unlike commandstats
# on a shared machine): the store's script for a check alone, its batch script with 32 and 64
# checks of one key and of as many keys, a minimal GCRA script and `return 1` (a call's
# dispatch), each script by EVALSHA and the library's functions by FCALL. Each case runs a
# redis-server of its own under callgrind, once with N calls of redis-benchmark and once with
# none; the difference over the checks is the cost of one.
# The scripts are assembled from crates/ratewarden-redis/src/lua as src/script.rs does.
# Usage: benches/scripts/redis_instructions.sh   (from the workspace root; needs valgrind)
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v valgrind >/dev/null || { echo "valgrind is missing: apt-get install valgrind" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work" <<'PY'
import hashlib, sys
out, lua = sys.argv[1], "crates/ratewarden-redis/src/lua/"
read = lambda name: open(lua + name).read()
algorithms = [("g", "gcra"), ("t", "token_bucket"), ("f", "fixed_window"),
              ("w", "sliding_window"), ("l", "sliding_log")]
def block(letter, name):
    return ("do\nlocal KEYS, ARGV\n" + read("prelude.lua") + read(name + ".lua")
            + f"run.{letter} = function(keys, args)\n  KEYS, ARGV = keys, args\n  return main()\nend\nend\n")
head = read("clock.lua") + read("arith.lua") + read("reply.lua") + "local run = {}\n"
every = head + "".join(block(l, n) for l, n in algorithms) + read("batch.lua")
open(f"{out}/single.lua", "w").write(head + block("g", "gcra") + "return alone(run.g(KEYS, ARGV))\n")
open(f"{out}/batch.lua", "w").write(every + "return packed(batch(KEYS, ARGV))\n")
body = every + read("library.lua")
name = "ratewarden_" + hashlib.sha1(body.encode()).hexdigest()[:16]
open(f"{out}/library.lua", "w").write(f"#!lua name={name}\nlocal prefix = '{name}_'\n" + body)
open(f"{out}/prefix", "w").write(name + "_")
open(f"{out}/minimal.lua", "w").write(open("benches/lua/minimal_gcra.lua").read())
open(f"{out}/return1.lua", "w").write("return 1")
PY

# instructions SCRIPT CALLS ARGS...: what redis-server executed, start to shutdown. SCRIPT is
# run by EVALSHA, or, given as library.lua:NAME, loaded as the library and NAME called by FCALL.
instructions() {
  local script=$1 calls=$2 port dir
  shift 2
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  dir=$(mktemp -d -p "$work")
  valgrind --tool=callgrind --callgrind-out-file="$dir/out" redis-server --port "$port" \
    --bind 127.0.0.1 --save '' --appendonly no --hz 1 --dir "$dir" >/dev/null 2>"$dir/log" &
  local pid=$!
  for _ in $(seq 300); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  local call
  case $script in
    *:*)
      redis-cli -p "$port" FUNCTION LOAD "$(cat "${script%%:*}")" >/dev/null
      call=(FCALL "$(cat "$work/prefix")${script#*:}") ;;
    *) call=(EVALSHA "$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$script")")") ;;
  esac
  if [ "$calls" -gt 0 ]; then
    redis-benchmark -p "$port" -c 1 -n "$calls" -q "${call[@]}" "$@" >/dev/null 2>&1
  fi
  redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
  wait "$pid" || true
  sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$dir/log"
}

# row NAME SCRIPT CHECKS_PER_CALL ARGS...: the base is the same server with the same script or
# library loaded and no call (loading a library costs far more than a script).
calls=300
row() {
  local name=$1 script=$2 per_call=$3
  shift 3
  local base total
  base=$(instructions "$script" 0)
  total=$(instructions "$script" "$calls" "$@")
  printf '| %s | %s | %s |\n' "$name" "$per_call" $(( (total - base) / calls / per_call ))
}
interval=1 burst=1000000
batch_args() { # batch_args CHECKS DISTINCT_KEYS: one GCRA shape, CHECKS checks
  local n=$1 distinct=$2 keys=() checks=()
  for i in $(seq "$n"); do
    if [ "$distinct" = 1 ]; then keys+=("bench:{k$i}"); else keys+=("bench:{k}"); fi
    checks+=(1 1)
  done
  echo "$n ${keys[*]} 1 g 1 8 c '' '' $interval $burst '' 0 0 ${checks[*]}"
}
printf '| script | checks per call | instructions per check |\n|---|---:|---:|\n'
row "return 1 (a call's dispatch)" "$work/return1.lua" 1 0
row "minimal GCRA (TIME, GET, SET PX)" "$work/minimal.lua" 1 1 'bench:{k}' "$interval" "$burst"
row "rl, a check alone (EVALSHA)" "$work/single.lua" 1 1 'bench:{k}' c 1 '' "$interval" "$burst" '' 0 0
row "rl, a check alone (FCALL)" "$work/library.lua:g" 1 1 'bench:{k}' c 1 '' "$interval" "$burst" '' 0 0
eval "set -- $(batch_args 1 0)"
row "rl batch of one check (EVALSHA)" "$work/batch.lua" 1 "$@"
row "rl batch of one check (FCALL)" "$work/library.lua:batch" 1 "$@"
for n in 8 32 64; do
  eval "set -- $(batch_args "$n" 0)"
  row "rl batch, one key (EVALSHA)" "$work/batch.lua" "$n" "$@"
  row "rl batch, one key (FCALL)" "$work/library.lua:batch" "$n" "$@"
  eval "set -- $(batch_args "$n" 1)"
  row "rl batch, $n keys (EVALSHA)" "$work/batch.lua" "$n" "$@"
  row "rl batch, $n keys (FCALL)" "$work/library.lua:batch" "$n" "$@"
done
