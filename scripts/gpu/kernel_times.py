"""Sum the GPU time per kernel name of the last decode steps in an `ncu --csv --metrics gpu__time_duration.sum`
capture of llama-bench (run_cuda.sh's profile stage). Prints one table: kernel, launches per step, µs per step.

    python3 scripts/gpu/kernel_times.py prof.csv K/V DEPTH [--steps 8]
"""

from __future__ import annotations

import argparse
import collections
import csv
import re


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("kv")
    ap.add_argument("depth")
    ap.add_argument("--steps", type=int, default=8, help="decode steps to average over (the last ones)")
    args = ap.parse_args()
    rows = []
    with open(args.csv, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu prints its own log lines before the table
    for r in csv.DictReader(lines):
        if r.get("Metric Name") == "gpu__time_duration.sum":
            scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
            unit = r.get("Metric Unit", "ns")
            if unit not in scale:
                raise SystemExit(f"{args.csv}: unknown time unit {unit!r}")
            us = float(r["Metric Value"].replace(",", "")) * scale[unit]
            rows.append((r["Kernel Name"], us))
    # decode steps launch the same kernel sequence: its period is the shortest p with names[-p:] == names[-2p:-p]
    if not rows:
        print(f"{args.kv} d{args.depth}: no kernels captured")
        return
    names = [n for n, _ in rows]
    period = next((q for q in range(1, len(names) // 3 + 1) if names[-q:] == names[-2 * q : -q]), 0)
    if not period:
        print(f"{args.kv} d{args.depth}: no repeating decode step found in {len(rows)} launches")
        return
    n_steps = min(args.steps, len(rows) // period)
    steps = [rows[len(rows) - (i + 1) * period : len(rows) - i * period] for i in range(n_steps)]
    per = collections.defaultdict(lambda: [0, 0.0])
    for st in steps:
        for n, us in st:
            short = re.sub(r"\(.*", "", n)[:60]
            per[short][0] += 1
            per[short][1] += us
    total = sum(v[1] for v in per.values()) / len(steps)
    print(f"== {args.kv} @ d{args.depth}: {total:.1f} µs of kernel time per decode step ({len(steps)} steps)")
    for name, (cnt, us) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"  {us / len(steps):8.1f} µs  {cnt / len(steps):5.1f} launches  {name}")


if __name__ == "__main__":
    main()
