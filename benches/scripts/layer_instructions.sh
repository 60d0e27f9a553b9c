#!/usr/bin/env bash
# Instructions per admitted request through the layer (callgrind): rl's layer against
# tower_governor's (same rate, burst, key and rate headers) and the bare service.
# Usage: benches/scripts/layer_instructions.sh   (from the workspace root; needs valgrind)
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v valgrind >/dev/null || { echo "valgrind is missing: apt-get install valgrind" >&2; exit 1; }
cargo build -q --release -p benches --bin layer_instructions
bin=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/layer_instructions
n=20000
count() {
  CASE=$1 N=$2 valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" 2>&1 \
    | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
declare -A per
for impl in bare rl tower_governor; do
  per[$impl]=$(( ($(count "$impl" "$n") - $(count "$impl" 0)) / n ))
done
added() { echo $(( per[$1] - per[bare] )); }
printf '| service | instructions per request | added to bare |\n|---|---:|---:|\n'
printf '| bare | %s | - |\n' "${per[bare]}"
printf '| rl | %s | %s |\n' "${per[rl]}" "$(added rl)"
printf '| tower_governor | %s | %s |\n' "${per[tower_governor]}" "$(added tower_governor)"
awk -v a="$(added rl)" -v b="$(added tower_governor)" 'BEGIN { printf "rl / tower_governor, added: %.2f\n", a / b }'
