"""Summarizes a scripts/v3_validation.sh run into bench/results/v3_eviction.md: PPL / KLD deltas of V3 at 90 % and
75 % retention against no eviction, per cache, and the NIAH grid for no eviction / V1 / V3, with the issue's
targets (V3 at 90 %: <= +0.3 % PPL and NIAH 3/3; V3 >= V1 at every position) marked met or not.

    python bench/v3_table.py [RUN_DIR=bench/results/v3]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RANK = {"PASS": 3, "PARTIAL_WORD": 2, "PARTIAL_NUMBER": 1, "FAIL": 0}


def ppl_rows(path: Path) -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines()[3:]:
        f = line.split()
        if f and not f[0].endswith("(base)"):
            rows[f[0]] = f
    return rows


def niah_rows(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    if not path.is_file():
        return out
    for line in path.read_text().splitlines()[2:]:
        f = line.split()
        if len(f) >= 4:
            out[f[1]] = f[3]
    return out


def main() -> None:
    run = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "bench" / "results" / "v3"
    head = (run / "v3_validation_results.txt").read_text().splitlines()[0]
    base = ppl_rows(run / "v3_ppl_0" / "ppl_matrix_results.txt")
    for extra in sorted(run.glob("v3_ppl_0?")):  # no-eviction rows completed by a separate run
        base.update(ppl_rows(extra / "ppl_matrix_results.txt"))
    lines = [
        "# TriAttention V3 eviction: quality (CPU, Gemma 3 270M Q4_K_M, wikitext-2)",
        "",
        f"Runs: {head.lstrip('# ')}",
        "",
        "Summarized by `python bench/v3_table.py` (full protocol: `scripts/v3_validation.sh`).",
        "PPL: `-c 8192 -b 512 --chunks 3 -fa on`, KLD against an f16 base of the same script run; budget =",
        "retention x 8192, V3 (`--triatt-hybrid 2`, prefix 128, window 128, 8 segments). Every eviction run's log has",
        "eviction rounds (`evictions` column); a run without would be marked INVALID. Caveat of this protocol: with",
        "ubatches of 512, a 90 % budget (7372) is first exceeded by more than the divide (128) after the 15th ubatch",
        "of a chunk, so only the last 512 of the 4096 scored tokens per chunk see an evicted cache (2 rounds/chunk).",
        "",
        "| cache K/V | retention | PPL | dPPL vs no eviction | mean KLD vs f16 | evictions | target (90 %: +0.3 %) |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for cfg, b in base.items():
        lines.append(f"| {cfg} | 100 % (off) | {b[1]} | - | {b[3]} | - | |")
        for pct in (90, 75):
            f = ppl_rows(run / f"v3_ppl_{pct}" / "ppl_matrix_results.txt").get(cfg)
            if not f:
                lines.append(f"| {cfg} | {pct} % | not run | | | | |")
                continue
            d = 100 * (float(f[1]) / float(b[1]) - 1)
            tgt = ("met" if d <= 0.3 else "NOT met") if pct == 90 else ""
            lines.append(f"| {cfg} | {pct} % | {f[1]} | {d:+.3f} % | {f[3]} | {f[6]} | {tgt} |")
    grid = {p: niah_rows(run / f"v3_niah_{p}" / "niah_strict_results.txt") for p in ("none", "V1", "V3")}
    positions = list(grid["none"]) or ["start", "middle", "end"]
    lines += [
        "",
        "Cloze NIAH (`scripts/niah_strict.sh`, f16 cache, 16384-token prompts, needle at start / middle / end;",
        "V1 and V3 at 90 % retention):",
        "",
        "| policy | " + " | ".join(positions) + " | passed |",
        "|---|" + "---|" * len(positions) + "---:|",
    ]
    for p, row in grid.items():
        cells = [row.get(q, "not run") for q in positions]
        lines.append(f"| {p} | " + " | ".join(cells) + f" | {cells.count('PASS')}/{len(cells)} |")
    v3_ge_v1 = all(RANK.get(grid["V3"].get(q, "FAIL"), 0) >= RANK.get(grid["V1"].get(q, "FAIL"), 0) for q in positions)
    v3_pass = sum(grid["V3"].get(q) == "PASS" for q in positions)
    if not grid["V3"]:
        v3_ge_v1 = False
    if grid["V3"] and grid["V1"]:
        verdict = "met" if v3_pass == 3 else "NOT met"
        lines += ["", f"- V3 NIAH at 90 %: {v3_pass}/{len(positions)} (target 3/3: {verdict})",
                  f"- V3 >= V1 at every position: {'met' if v3_ge_v1 else 'NOT met'}"]  # fmt: skip
    else:
        lines += ["", "- NIAH targets (V3 3/3 at 90 %, V3 >= V1 everywhere): not measured yet"]
    text = "\n".join(lines) + "\n"
    print(text)
    (ROOT / "bench" / "results" / "v3_eviction.md").write_text(text)


if __name__ == "__main__":
    main()
