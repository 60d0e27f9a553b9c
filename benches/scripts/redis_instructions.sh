#!/usr/bin/env bash
# Instructions redis-server spends per GCRA check (callgrind: noise-free, unlike commandstats
# on a shared machine): the store's script for a check alone, its batch script with 32 and 64
# checks of one key and of as many keys, a minimal GCRA script and `return 1` (a call's
# dispatch), each script by EVALSHA and the library's functions by FCALL. Each case runs a
# redis-server of its own under callgrind, once with N calls of redis-benchmark and once with
# none; the difference over the checks is the cost of one. The calls go one at a time, each
# after the last one's reply, from a small client (below) that can send a batch's binary
# argument, which redis-benchmark's command line cannot.
# The scripts are assembled from crates/ratewarden-redis/src/lua as src/script/mod.rs does.
# Usage: [ROWS=REGEX] benches/scripts/redis_instructions.sh   (from the workspace root; needs
# valgrind; ROWS keeps the rows whose title matches, e.g. ROWS='batch, one key.*FCALL')
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v valgrind >/dev/null || { echo "valgrind is missing: apt-get install valgrind" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work" <<'PY'
import hashlib, struct, sys
out, lua = sys.argv[1], "crates/ratewarden-redis/src/lua/"
read = lambda name: open(lua + name).read()
algorithms = [("g", "gcra"), ("t", "token_bucket"), ("f", "fixed_window"),
              ("w", "sliding_window"), ("l", "sliding_log")]
def block(letter, name):
    return ("do\nlocal KEYS, ARGV\n" + read("prelude.lua") + read(name + ".lua")
            + f"run.{letter} = function(keys, args)\n  KEYS, ARGV = keys, args\n  return main()\nend\nend\n")
head = (read("clock.lua") + read("arith.lua") + read("reply.lua") + read("args.lua")
        + "local run = {}\n")
every = head + "".join(block(l, n) for l, n in algorithms) + read("batch.lua")
open(f"{out}/single.lua", "w").write(head + block("g", "gcra") + "return alone(run.g(KEYS, arguments(ARGV[1], ARGV[2], ARGV[3])))\n")
open(f"{out}/batch.lua", "w").write(every + "return packed(batch(KEYS, ARGV))\n")
body = every + read("library.lua")
name = "ratewarden_" + hashlib.sha1(body.encode()).hexdigest()[:16]
open(f"{out}/library.lua", "w").write(f"#!lua name={name}\nlocal prefix = '{name}_'\n" + body)
open(f"{out}/minimal.lua", "w").write(open("benches/lua/minimal_gcra.lua").read())
open(f"{out}/return1.lua", "w").write("return 1")

# Each row's call, as RESP, in a file of its own: "SCRIPT:NAME" (a function of the library, by
# FCALL) or "SCRIPT" (by EVALSHA), then its keys and arguments.
def resp(*args):
    args = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)
def call(script, keys, args):
    if ":" in script:
        head = ["FCALL", name + "_" + script.split(":")[1]]
    else:
        # As loaded below: `$(cat FILE)` drops the file's last newlines.
        source = open(f"{out}/{script}").read().rstrip("\n")
        head = ["EVALSHA", hashlib.sha1(source.encode()).hexdigest()]
    return resp(*head, len(keys), *keys, *args)
interval, burst = 1, 1000000
# A GCRA check's arguments as args.lua reads them: mode, missing-state letter, then the cost,
# the time (-1: Redis's clock), interval, burst, shortest TTL and split slack as doubles.
def gcra(cost):
    return ["c", "", struct.pack("<6d", cost, -1, interval, burst, 0, 0)]
def batch(n, distinct):
    # One GCRA shape (its cost 0), then each check: its shape, cost and key (u32 LE).
    keys = [f"bench:{{k{i}}}" for i in range(1, n + 1)] if distinct else ["bench:{k}"]
    checks = b"".join(struct.pack("<III", 1, 1, i + 1 if distinct else 1) for i in range(n))
    return keys, [1, "g", 1, *gcra(0), checks]
rows = [("return 1 (a call's dispatch)", "return1.lua", 1, [], [0]),
        ("minimal GCRA (TIME, GET, SET PX)", "minimal.lua", 1, ["bench:{k}"], [interval, burst]),
        ("rl, a check alone (EVALSHA)", "single.lua", 1, ["bench:{k}"], gcra(1)),
        ("rl, a check alone (FCALL)", "library.lua:g", 1, ["bench:{k}"], gcra(1)),
        ("rl batch of one check (EVALSHA)", "batch.lua", 1, *batch(1, False)),
        ("rl batch of one check (FCALL)", "library.lua:batch", 1, *batch(1, False))]
for n in (8, 32, 64):
    rows += [("rl batch, one key (EVALSHA)", "batch.lua", n, *batch(n, False)),
             ("rl batch, one key (FCALL)", "library.lua:batch", n, *batch(n, False)),
             (f"rl batch, {n} keys (EVALSHA)", "batch.lua", n, *batch(n, True)),
             (f"rl batch, {n} keys (FCALL)", "library.lua:batch", n, *batch(n, True))]
with open(f"{out}/rows", "w") as listing:
    for i, (title, script, per_call, keys, args) in enumerate(rows):
        open(f"{out}/call{i}", "wb").write(call(script, keys, args))
        listing.write(f"{title}\t{script}\t{per_call}\t{out}/call{i}\n")

# The client: sends the call in FILE COUNT times to PORT, one at a time, reading each reply.
open(f"{out}/client.py", "w").write('''
import socket, sys
port, count, command = int(sys.argv[1]), int(sys.argv[2]), open(sys.argv[3], "rb").read()
connection = socket.create_connection(("127.0.0.1", port))
replies = connection.makefile("rb")
def reply():
    line = replies.readline()
    if line[:1] == b"-":
        sys.exit("error reply: " + line.decode())
    if line[:1] == b"$" and int(line[1:]) >= 0:
        replies.read(int(line[1:]) + 2)
    if line[:1] == b"*":
        for _ in range(int(line[1:])):
            reply()
for _ in range(count):
    connection.sendall(command)
    reply()
''')
PY

# instructions SCRIPT CALLS [FILE]: what redis-server executed, start to shutdown, with the
# call in FILE made CALLS times. SCRIPT is loaded as a script, or, given as library.lua:NAME,
# as the library.
instructions() {
  local script=$1 calls=$2 file=${3:-} port dir
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  dir=$(mktemp -d -p "$work")
  valgrind --tool=callgrind --callgrind-out-file="$dir/out" redis-server --port "$port" \
    --bind 127.0.0.1 --save '' --appendonly no --hz 1 --dir "$dir" >/dev/null 2>"$dir/log" &
  local pid=$!
  for _ in $(seq 300); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  case $script in
    *:*) redis-cli -p "$port" FUNCTION LOAD "$(cat "$work/${script%%:*}")" >/dev/null ;;
    *) redis-cli -p "$port" SCRIPT LOAD "$(cat "$work/$script")" >/dev/null ;;
  esac
  if [ "$calls" -gt 0 ]; then
    python3 "$work/client.py" "$port" "$calls" "$file"
  fi
  redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
  wait "$pid" || true
  sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$dir/log"
}

# Each row's base is the same server with the same script or library loaded and no call
# (loading a library costs far more than a script).
calls=300
printf '| script | checks per call | instructions per check |\n|---|---:|---:|\n'
while IFS=$'\t' read -r title script per_call file; do
  [[ $title =~ ${ROWS:-.} ]] || continue
  base=$(instructions "$script" 0)
  total=$(instructions "$script" "$calls" "$file")
  printf '| %s | %s | %s |\n' "$title" "$per_call" $(( (total - base) / calls / per_call ))
done < "$work/rows"
