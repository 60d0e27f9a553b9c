# Sourced by scripts that need a local Redis Cluster: `start_redis_cluster DIR` starts 3 masters
# and 3 replicas on loopback (each port below 22768 and free, with its cluster-bus twin, port +
# 10000, free too: below 32768, where Linux starts handing out ports to outgoing connections),
# waits for cluster_state:ok, and sets REDIS_CLUSTER_PORTS (array), REDIS_CLUSTER_PIDS (array)
# and REDIS_CLUSTER_URLS (comma separated). `stop_redis_cluster` stops it.
REDIS_CLUSTER_PIDS=()
REDIS_CLUSTER_PORTS=()

start_redis_cluster() {
  local dir=$1 base port nodes=()
  base=$(python3 -c '
import socket, random
def free(p):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p)); return True
    except OSError:
        return False
    finally:
        s.close()
for _ in range(500):
    b = random.randrange(10000, 22700)
    if all(free(p) and free(p + 10000) for p in range(b, b + 6)):
        print(b); break
')
  for port in $(seq "$base" $((base + 5))); do
    mkdir -p "$dir/$port"
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --cluster-enabled yes \
      --cluster-node-timeout 2000 --dir "$dir/$port" >/dev/null &
    REDIS_CLUSTER_PIDS+=($!)
    REDIS_CLUSTER_PORTS+=("$port")
    nodes+=("127.0.0.1:$port")
  done
  for port in "${REDIS_CLUSTER_PORTS[@]}"; do
    for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  done
  redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >/dev/null
  for port in "${REDIS_CLUSTER_PORTS[@]}"; do
    for _ in $(seq 300); do
      redis-cli -p "$port" cluster info | grep -q 'cluster_state:ok' && break; sleep 0.1
    done
  done
  REDIS_CLUSTER_URLS="redis://127.0.0.1:$base,redis://127.0.0.1:$((base + 1)),redis://127.0.0.1:$((base + 2))"
}

stop_redis_cluster() {
  for pid in "${REDIS_CLUSTER_PIDS[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${REDIS_CLUSTER_PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  REDIS_CLUSTER_PIDS=()
  REDIS_CLUSTER_PORTS=()
}
