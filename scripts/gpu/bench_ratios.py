"""Ratios to f16 of an interleaved llama-bench run (run_cuda.sh's bench stage with BENCH_TYPES repeating, e.g.
"f16 tq3 tq4 f16 tq3 tq4"): per test and K/V pair every round's t/s and its ratio to the same round's f16 (the
n-th run of a pair against the n-th f16 run), so the run-to-run noise shows beside the ratio, and with more than two
rounds the median ratio. A markdown table. Also reads "round N KIND" files (bench_tables).

    python3 scripts/gpu/bench_ratios.py llama_bench.md
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from summary import bench_tables  # the llama-bench table parser, shared


def ratio_table(md: str) -> str:
    rounds: dict[str, list[dict[str, float]]] = {}
    for pair, rates in bench_tables(md):
        rounds.setdefault(pair, []).append(rates)
    base = rounds.get("f16/f16")
    if not base:
        raise SystemExit("no f16/f16 run to compare against")
    pairs = [p for p in rounds if p != "f16/f16"]
    tests = list(dict.fromkeys(t for r in base for t in r))
    out = ["| test | f16/f16 t/s | " + " | ".join(f"{p} t/s (ratio)" for p in pairs) + " |",
           "|---|---|" + "---|" * len(pairs)]  # fmt: skip
    for test in tests:
        f16 = [r.get(test) for r in base]
        cells = [" / ".join(f"{v:.0f}" for v in f16 if v is not None)]
        for p in pairs:
            vals = [(r[test], f) for r, f in zip(rounds[p], f16, strict=False) if test in r and f]
            ratios = " / ".join(f"{v / f:.3f}" for v, f in vals)
            med = f", median {statistics.median(v / f for v, f in vals):.3f}" if len(vals) > 2 else ""
            cells.append(" / ".join(f"{v:.0f}" for v, _ in vals) + f" ({ratios}{med})")
        out.append(f"| {test} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(ratio_table(Path(sys.argv[1]).read_text()))
