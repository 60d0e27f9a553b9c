#!/usr/bin/env python3
"""Reads criterion's output (stdin) and prints a Markdown table of `rl` against the peer named
in the benchmark id (`group/kind/rl/row` beside `group/kind/PEER/row`), with the ratio rl/peer."""
import re
import sys

UNITS = {"ps": 1e-3, "ns": 1.0, "µs": 1e3, "us": 1e3, "ms": 1e6, "s": 1e9}
results = {}
name = None
for line in sys.stdin:
    line = line.rstrip()
    m = re.match(r"^(\S+/\S+)\s*(time:.*)?$", line)
    if m and not line.startswith(("Benchmarking", " ")):
        name = m.group(1)
    t = re.search(r"time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]", line)
    if t and name:
        results[name] = float(t.group(1)) * UNITS[t.group(2)]
        name = None

rows = {}
for full, ns in results.items():
    parts = full.split("/")
    # group/kind/impl/rest...
    if len(parts) < 4:
        continue
    key = (parts[0], parts[1], "/".join(parts[3:]))
    rows.setdefault(key, {})[parts[2]] = ns

print("| benchmark | keys / threads | rl | peer | rl / peer |")
print("|---|---|---:|---:|---:|")
for (group, kind, rest), impls in rows.items():
    ours = impls.get("rl")
    peers = [(k, v) for k, v in impls.items() if k != "rl"]
    for peer, theirs in peers:
        ratio = f"{ours / theirs:.2f}" if ours else "-"
        print(f"| {group}/{kind} | {rest} | {ours:.1f} ns | {peer} {theirs:.1f} ns | {ratio} |")
