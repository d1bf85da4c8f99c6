"""Issue 46's summary: the eviction overhead ratios and V3's KLD against StreamingLLM's at 50 %, from the files the
measurements wrote, into one JSON (bench/results/eviction_summary.json; the table is in v3_eviction.md).

    python bench/eviction_summary.py --cuda RUN/evict8b.json [--cuda DECODE_RUN/evict8b.json] \\
        --cpu bench/results/triatt_overhead.json --kld wikitext=kld_wikitext/evict.json \\
        --kld default_text=kld_default_text/evict.json > bench/results/eviction_summary.json

--cuda: scripts/gpu/evict8b.py's JSON (the first file given wins a key); --cpu: bench/triatt_overhead.py's (its
50 % run); --kld: `llama-tq evict`'s evict.json of a text (rows with policy, budget_pct, kld).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

TARGETS = {"cuda.ub512": 1.03, "cuda.ub128": 1.02, "cuda.decode": 1.02, "cpu.ub512": 1.02}
KLD_TARGET = 0.5  # V3's KLD at 50 % over StreamingLLM's, at most


def kld_ratio(path: Path) -> float:
    rows = json.loads(path.read_text())["rows"]
    at50 = {r["policy"]: r["kld"] for r in rows if r.get("budget_pct") == 50}
    if "V3" not in at50 or "StreamingLLM" not in at50:
        raise SystemExit(f"{path}: no V3 and StreamingLLM rows at 50 %")
    return float(at50["V3"]) / float(at50["StreamingLLM"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cuda", type=Path, action="append", default=[])
    ap.add_argument("--cpu", type=Path, required=True)
    ap.add_argument("--kld", action="append", default=[], help="TEXT=evict.json")
    a = ap.parse_args(argv)
    out: dict[str, Any] = {}
    for f in a.cuda:
        for key, per_cache in json.loads(f.read_text()).items():
            if key in TARGETS and key not in out:
                out[key] = {**per_cache, "source": str(f)}
    cpu = json.loads(a.cpu.read_text()).get("50")
    if cpu is None:
        raise SystemExit(f"{a.cpu}: no 50 % run (python bench/triatt_overhead.py --budget-pct 50)")
    out["cpu.ub512"] = {"ratio": round(cpu["ratio"], 4), "target": TARGETS["cpu.ub512"],
                        "met": cpu["ratio"] <= TARGETS["cpu.ub512"], "command": cpu["command"]}  # fmt: skip
    kld: dict[str, Any] = {}
    for item in a.kld:
        text, _, path = item.partition("=")
        r = kld_ratio(Path(path))
        kld[text] = {"ratio": round(r, 4), "target": KLD_TARGET, "met": r <= KLD_TARGET}
    out["kld_vs_streaming_50"] = kld
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
