"""Pools `llama-tq niah` grids (their niah.json files) into one table per cache type, with paired comparisons.

One NIAH cell is one (context, needle, position) prompt; a cache type PASSes it or not. With a few cells per type a
difference of one or two cells is noise, so this pools many grids run on the same prompts and compares each type with
a reference type on the same cells (a paired, exact McNemar test: among the cells where the two differ, how likely
is a split at least this uneven if each were a coin flip). Only PASS counts; PARTIAL_* and FAIL are misses.

    python bench/niah_grid.py DIR [DIR ...] --ref f16/f16 --out out/niah_grid_16k
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections import defaultdict
from pathlib import Path

Cell = tuple[int, str, str, int]  # (context, needle, position, prompt tokens: tells haystacks apart)


def load(dirs: list[Path]) -> dict[str, dict[Cell, str]]:
    """config -> cell -> status, from every niah.json under the given folders."""
    out: dict[str, dict[Cell, str]] = defaultdict(dict)
    files = [f for d in dirs for f in ([d] if d.is_file() else sorted(d.rglob("niah.json")))]
    if not files:
        raise SystemExit(f"no niah.json under {', '.join(map(str, dirs))}")
    for f in files:
        data = json.loads(f.read_text())
        meta = data["meta"]
        for r in data["results"]:
            if not r.get("ok", True):
                continue  # a run that did not complete is no evidence either way
            cell = (int(meta["ctx"]), meta["needle"], r["position"], int(r["prompt_tokens"]))
            out[r["config"]][cell] = r["status"]
    return out


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def mcnemar_p(b: int, c: int) -> float:
    """Two-sided exact p of b vs c discordant cells under a fair coin."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def summarize(grid: dict[str, dict[Cell, str]], ref: str) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    ref_cells = grid.get(ref, {})
    for cfg in sorted(grid, key=lambda c: (c != ref, c)):
        cells = grid[cfg]
        ctxs = sorted({c[0] for c in cells})
        for ctx in [*ctxs, 0]:  # 0: every context pooled
            mine = {c: s for c, s in cells.items() if ctx in (0, c[0])}
            if ctx == 0 and len(ctxs) < 2:
                continue
            k = sum(s == "PASS" for s in mine.values())
            lo, hi = wilson(k, len(mine))
            shared = [c for c in mine if c in ref_cells]
            only_ref = sum(ref_cells[c] == "PASS" and mine[c] != "PASS" for c in shared)
            only_me = sum(ref_cells[c] != "PASS" and mine[c] == "PASS" for c in shared)
            rows.append({
                "config": cfg, "ctx": ctx or "all", "pass": k, "cells": len(mine),
                "rate": round(k / len(mine), 3) if mine else None, "ci95": [round(lo, 3), round(hi, 3)],
                "ref_only": only_ref if cfg != ref else None, "cfg_only": only_me if cfg != ref else None,
                "p_vs_ref": float(f"{mcnemar_p(only_ref, only_me):.2g}") if cfg != ref and shared else None,
            })  # fmt: skip
    return rows


def table(rows: list[dict[str, object]], ref: str) -> str:
    head = f"| K/V | ctx | PASS | rate (95 % CI) | {ref} only | this only | p (McNemar vs {ref}) |"
    lines = [head, "|" + "---|" * 7]
    for r in rows:
        ci = r["ci95"]
        assert isinstance(ci, list)
        dash = "-" if r["p_vs_ref"] is None else None
        lines.append(
            f"| {r['config']} | {r['ctx']} | {r['pass']}/{r['cells']} | {r['rate']:.2f} ({ci[0]:.2f}-{ci[1]:.2f}) | "
            f"{dash or r['ref_only']} | {dash or r['cfg_only']} | {dash or r['p_vs_ref']} |"
        )
    return "\n".join(lines)


def plot(grid: dict[str, dict[Cell, str]], ref: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = sorted(grid, key=lambda c: (c != ref, c))
    cells = sorted({c for g in grid.values() for c in g}, key=lambda c: (c[0], c[1], float(c[2])))
    code = {"PASS": 3, "PARTIAL_NUMBER": 2, "PARTIAL_WORD": 1, "FAIL": 0}
    mat = [[code.get(grid[cfg].get(c, ""), math.nan) for c in cells] for cfg in configs]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.12 * len(cells) + 2), 0.4 * len(configs) + 1.5))
    im = ax.imshow(mat, aspect="auto", cmap="RdYlGn", vmin=0, vmax=3, interpolation="nearest")
    ax.set_yticks(range(len(configs)), configs)
    ax.set_xticks([])
    ax.set_xlabel("cells: context, needle, position (left to right)")
    bar = fig.colorbar(im, ax=ax, ticks=[0, 1, 2, 3])
    bar.ax.set_yticklabels(["FAIL", "PART. WORD", "PART. NUM", "PASS"])
    ax.set_title("needle in a haystack, every cell")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+", type=Path, help="folders holding niah.json files (searched recursively)")
    ap.add_argument("--ref", default="f16/f16", help="the cache type every other is compared with, cell by cell")
    ap.add_argument("--out", type=Path, help="write summary.md/.json/.csv and cells.png here")
    args = ap.parse_args()
    grid = load(args.dirs)
    if args.ref not in grid:
        raise SystemExit(f"reference {args.ref} not in the grids ({', '.join(sorted(grid))})")
    rows = summarize(grid, args.ref)
    md = table(rows, args.ref)
    print(md)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "summary.md").write_text(md + "\n")
        (args.out / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
        with open(args.out / "summary.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        plot(grid, args.ref, args.out / "cells.png")


if __name__ == "__main__":
    main()
