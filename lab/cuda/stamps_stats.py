"""Line up the in-graph timestamps of a -DTQ_STAMPS build (lab/patches/cuda-stamps.patch): the fused K/V write's
file and the tensor-core FA kernel's, launch i of one with launch i of the other (a decode step has one of each per
layer), counted from the end. Prints per layer the mean times in µs from the write's first block entry (from the FA
kernel's first entry when only the FA kernel's unit was built with the stamps: WRITE_FILE "-").

    python lab/cuda/stamps_stats.py WRITE_FILE|- FA_FILE [--layers 8] [--last 300]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

WRITE_FIELDS = {0: "write entry", 1: "write wait returns (first)", 2: "write wait returns (last)", 7: "write exit"}
FA_FIELDS = {
    0: "FA entry",
    1: "FA b0 before wait",
    2: "FA b0 wait returns",
    3: "FA last wait returns",
    4: "FA b0 query fragments",
    5: "FA b0 tiles done",
    6: "FA b0 output written",
    7: "FA exit (last block)",
}


def load(path: Path) -> np.ndarray:
    """One row a launch: the 8 fields in ns (0: not set)."""
    rows = [line.split() for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return np.array([[int(v) for v in r[1:]] for r in rows], dtype=np.float64).reshape(-1, 8)


def line_up(w: np.ndarray | None, f: np.ndarray, layers: int, last: int) -> tuple[list[str], np.ndarray]:
    """Row names and per-layer means (rows x layers) in µs from the write's entry (or the FA kernel's)."""
    n = min(len(f) if w is None else min(len(w), len(f)), last * layers) // layers * layers
    if n == 0:
        raise SystemExit("no launches to line up")
    f = f[-n:]
    t0 = f[:, 0:1] if w is None else w[-n:, 0:1]
    rel_f = np.where(f > 0, (f - t0) / 1e3, np.nan)
    names = list(FA_FIELDS.values())
    cols = [rel_f[:, k] for k in FA_FIELDS]
    if w is not None:
        rel_w = (w[-n:] - t0) / 1e3
        names = [*WRITE_FIELDS.values(), *names, "FA exit - write exit"]
        cols = [rel_w[:, k] for k in WRITE_FIELDS] + cols + [rel_f[:, 7] - rel_w[:, 7]]
    return names, np.array([np.nanmean(c.reshape(-1, layers), axis=0) for c in cols])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("write", help="the write unit's file, or - (none)")
    ap.add_argument("fa", type=Path)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--last", type=int, default=300, help="decode steps, counted from the end")
    args = ap.parse_args()
    f = load(args.fa)
    w = load(Path(args.write)) if args.write != "-" else None
    names, means = line_up(w, f, args.layers, args.last)
    steps = min(len(f), args.last * args.layers) // args.layers
    whence = "the FA kernel's first entry" if w is None else "the write's first entry"
    print(f"{args.write} {args.fa.name}: the last {steps} steps x {args.layers} layers; µs from {whence}, means")
    print(f"{'':28}" + "".join(f"{'L' + str(i):>8}" for i in range(args.layers)) + f"{'all':>8}")
    for name, row in zip(names, means, strict=True):
        print(f"{name:28}" + "".join(f"{m:8.2f}" for m in row) + f"{np.nanmean(row):8.2f}")


if __name__ == "__main__":
    main()
