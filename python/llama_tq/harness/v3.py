"""`llama-tq v3`: the TriAttention V3 validation matrix, on the same protocols as `ppl` and `niah`.

1. PPL / KLD at `ctx` with `-b 512 --chunks 3` for each cache, without eviction and with V3 (`--triatt-policy v3`)
   at each retention (budget = retention x ctx); an eviction run whose log shows no round is INVALID.
2. Cloze NIAH at `niah_ctx` with the needle at start / middle / end: no eviction, V1 and V3 at
   `niah_retention`.
Writes v3.json (every row of every run) and v3.md (the summary table), and prints the table.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from . import niah, ppl
from .common import KvConfig, progress

POLICIES = {"none": None, "V1": "v1", "V3": "v3"}  # NIAH policies -> --triatt-policy


def run(
    model: Path,
    text: Path,
    haystack: str,
    caches: list[KvConfig],
    out_dir: Path,
    ctx: int = 8192,
    niah_ctx: int = 16384,
    retentions: tuple[int, ...] = (90, 75),
    niah_retention: int = 90,
    threads: int = 2,
    flags: list[str] | None = None,
) -> dict[str, Any]:
    flags = flags or []
    report: dict[str, Any] = {"model": str(model), "text": str(text), "ctx": ctx, "niah_ctx": niah_ctx,
                                 "flags": flags, "ppl": {}, "niah": {}}  # fmt: skip
    for pct in (0, *retentions):
        evict = [] if pct == 0 else ["--triatt-budget", str(ctx * pct // 100), "--triatt-policy", "v3", *flags]
        progress(f"== v3: PPL at {pct}% retention" if pct else "== v3: PPL without eviction")
        rows = ppl.run_matrix(model, text, caches, ctx=ctx, chunks=3, threads=threads, evict_args=evict,
                              out_dir=out_dir / f"ppl_{pct}")  # fmt: skip
        report["ppl"][str(pct)] = [asdict(r) for r in rows]
    budget = niah_ctx * niah_retention // 100
    needle = niah.Needle.parse(niah.DEFAULT_NEEDLE)
    for policy, name in POLICIES.items():
        extra = [] if name is None else ["--triatt-budget", str(budget), "--triatt-policy", name, *flags]
        progress(f"== v3: NIAH at {niah_ctx} tokens, policy {policy}")
        rows_n = niah.run_grid(model, haystack, [KvConfig("f16", "f16")], niah_ctx,
                               niah.parse_positions("start,middle,end"), needle, threads=threads, extra_args=extra,
                               out_dir=out_dir / f"niah_{policy}")  # fmt: skip
        report["niah"][policy] = [asdict(r) for r in rows_n]
    report["ok"] = all(r["ok"] for runs in (report["ppl"], report["niah"]) for rows in runs.values()
                       for r in rows)  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "v3.json").write_text(json.dumps(report, indent=2) + "\n")
    table = summary(report)
    (out_dir / "v3.md").write_text(table + "\n")
    print(table)
    return report


def summary(report: dict[str, Any]) -> str:
    """PPL and KLD per cache and retention (change against the same cache without eviction), then the NIAH grid."""
    runs: dict[str, list[dict[str, Any]]] = report["ppl"]
    pcts = list(runs)
    # row 0 of every matrix is the f16 KLD base (no eviction): a cache's cells are its own runs, rows 1..
    base = {str(r["config"]): r for r in runs["0"][1:]}
    lines = [f"PPL, -c {report['ctx']} -b 512 --chunks 3 (change vs the same cache without eviction)",
             "", "| cache | " + " | ".join("no eviction" if p == "0" else f"V3 {p} %" for p in pcts) + " |",
             "|---" * (len(pcts) + 1) + "|"]  # fmt: skip
    for name in [str(r["config"]) for r in runs["0"][1:]]:
        cells = []
        for p in pcts:
            r = next((x for x in runs[p][1:] if x["config"] == name), None)
            if r is None or not r["ok"]:
                cells.append("FAILED" if r is None else str(r["error"]))
                continue
            b = base.get(name)
            d = f" ({100 * (float(r['ppl']) / float(b['ppl']) - 1):+.2f} %)" if p != "0" and b and b["ppl"] else ""
            ev = f", {r['evictions']} rounds" if r["evictions"] is not None else ""
            cells.append(f"{float(r['ppl']):.4f}{d}, KLD {float(r['kld'] or 0):.4f}{ev}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    niah_runs: dict[str, list[dict[str, Any]]] = report["niah"]
    positions = list(dict.fromkeys(str(r["position"]) for rows in niah_runs.values() for r in rows))
    lines += ["", f"Cloze NIAH at {report['niah_ctx']} tokens, f16 cache", "",
              "| policy | " + " | ".join(positions) + " |", "|---" * (len(positions) + 1) + "|"]  # fmt: skip
    for policy, rows in niah_runs.items():
        cell = {str(r["position"]): str(r["status"]) + ("" if r["ok"] else f" ({r['error']})") for r in rows}
        lines.append(f"| {policy} | " + " | ".join(cell.get(p, "-") for p in positions) + " |")
    return "\n".join(lines)
