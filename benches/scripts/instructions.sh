#!/usr/bin/env bash
# Instructions per GCRA check (callgrind), rl's MemoryStore against governor, same quota and keys.
# Usage: benches/scripts/instructions.sh   (from the workspace root; needs valgrind)
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v valgrind >/dev/null || { echo "valgrind is missing: apt-get install valgrind" >&2; exit 1; }
cargo bench -p benches --bench instructions --no-run 2>/dev/null
bin=$(ls -t "${CARGO_TARGET_DIR:-target}"/release/deps/instructions-* | grep -v '\.d$' | head -n 1)
n=1000000
count() {
  CASE=$1 KEYS=$2 N=$3 valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" 2>&1 \
    | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
printf '| keys | key | rl | governor | rl / governor |\n|---:|---|---:|---:|---:|\n'
for keys in 1 10000; do
  for kind in u64 ip str; do
    declare -A per
    for impl in rl governor; do
      base=$(count "$impl/$kind" "$keys" 0)
      full=$(count "$impl/$kind" "$keys" "$n")
      per[$impl]=$(( (full - base) / n ))
    done
    ratio=$(awk -v a="${per[rl]}" -v b="${per[governor]}" 'BEGIN { printf "%.2f", a / b }')
    printf '| %s | %s | %s | %s | %s |\n' "$keys" "$kind" "${per[rl]}" "${per[governor]}" "$ratio"
  done
done
