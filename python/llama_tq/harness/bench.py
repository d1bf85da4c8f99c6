"""`llama-tq bench`: llama-bench over KV cache configurations, with speed ratios against a reference measured in
the same run. Configurations are interleaved round by round, so slow drifts of the machine hit all of them alike.
"""

from __future__ import annotations

import csv
import json
import statistics
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import RunError
from .common import KvConfig, progress, run_tool


@dataclass
class SpeedRow:
    config: str
    test: str  # e.g. "pp512 @ d4096"
    tps: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.tps)


def parse_llama_bench_json(text: str) -> list[dict[str, Any]]:
    """llama-bench `-o json` output: a JSON array of test records."""
    start = text.index("[")
    return list(json.loads(text[start : text.rindex("]") + 1]))


def parse_llama_bench_markdown(text: str) -> list[dict[str, Any]]:
    """llama-bench's default markdown table: one record per row, keyed by the header; "t/s" becomes avg_ts and
    stdev_ts, and "pp512 @ d4096" becomes n_prompt / n_gen / n_depth as in the JSON output."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("|")]
    if len(lines) < 2:
        return []
    header = [h.strip() for h in lines[0].strip("|").split("|")]
    recs: list[dict[str, Any]] = []
    for ln in lines[2:]:
        rec: dict[str, Any] = dict(zip(header, (c.strip() for c in ln.strip("|").split("|")), strict=False))
        avg, _, dev = str(rec.get("t/s", "")).partition("±")
        rec["avg_ts"], rec["stdev_ts"] = float(avg), float(dev or 0)
        test, _, depth = str(rec.get("test", "")).partition(" @ d")
        kind, n = test[:2], int(test[2:])
        rec["n_prompt"], rec["n_gen"] = (n, 0) if kind == "pp" else (0, n)
        rec["n_depth"] = int(depth or 0)
        recs.append(rec)
    return recs


def test_name(rec: dict[str, Any]) -> str:
    n_p, n_g, d = int(rec["n_prompt"]), int(rec["n_gen"]), int(rec.get("n_depth", 0))
    name = f"pp{n_p}" if n_p else f"tg{n_g}"
    return f"{name} @ d{d}"


def run(
    model: Path,
    configs: list[KvConfig],
    depths: str = "0,4096",
    prompt: int = 512,
    gen: int = 64,
    reps: int = 3,
    rounds: int = 1,
    threads: int = 2,
    extra: list[str] | None = None,
    out_dir: Path | None = None,
) -> list[SpeedRow]:
    logs = (out_dir or Path(tempfile.mkdtemp(prefix="llama-tq-bench-"))) / "logs"
    rows: dict[tuple[str, str], SpeedRow] = {}
    for rnd in range(rounds):
        for i, cfg in enumerate(configs, 1):
            progress(f"[round {rnd + 1}/{rounds}] [{i}/{len(configs)}] {cfg.name}")
            args = ["-m", str(model), "-t", str(threads), "-fa", "1", "-p", str(prompt), "-n", str(gen), "-d", depths,
                    "-r", str(reps), *cfg.flags, "-o", "json", *(extra or [])]  # fmt: skip
            run = run_tool("llama-bench", args, logs / f"{cfg.slug}_round{rnd + 1}.log", env=cfg.env)
            if run.rc != 0:
                raise RunError(f"llama-bench failed for {cfg.name}: {run.stderr[-2000:]}")
            for rec in parse_llama_bench_json(run.stdout):
                key = (cfg.name, test_name(rec))
                samples = [float(x) for x in rec.get("samples_ts", [rec["avg_ts"]])]
                rows.setdefault(key, SpeedRow(cfg.name, key[1], [])).tps.extend(samples)
    return list(rows.values())


def table(rows: list[SpeedRow], ref: str) -> list[dict[str, Any]]:
    tests = list(dict.fromkeys(r.test for r in rows))
    refs = {r.test: r.median for r in rows if r.config == ref}
    out = []
    for r in rows:
        ratio = r.median / refs[r.test] if r.test in refs else None
        out.append({"config": r.config, "test": r.test, "tps_median": round(r.median, 2),
                    "tps_min": round(min(r.tps), 2), "tps_max": round(max(r.tps), 2), "n": len(r.tps),
                    "ratio_vs_ref": None if ratio is None else round(ratio, 3)})  # fmt: skip
    print(f"{'config':<14}" + "".join(f"{t:>22}" for t in tests))
    for cfg in dict.fromkeys(r.config for r in rows):
        cells = []
        for t in tests:
            row = next((o for o in out if o["config"] == cfg and o["test"] == t), None)
            cells.append("-" if row is None else f"{row['tps_median']:.1f} ({row['ratio_vs_ref'] or 0:.2f}x)")
        print(f"{cfg:<14}" + "".join(f"{c:>22}" for c in cells))
    print(f"(tokens/s, median of all samples; ratio vs {ref} in the same run)")
    return out


def write_outputs(out: list[dict[str, Any]], rows: list[SpeedRow], out_dir: Path, meta: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    samples = [asdict(r) for r in rows]
    (out_dir / "bench.json").write_text(json.dumps({"meta": meta, "table": out, "samples": samples}, indent=2) + "\n")
    with (out_dir / "bench.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(out[0]))
        w.writeheader()
        w.writerows(out)
