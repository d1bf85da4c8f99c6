"""TriAttention V3 overhead: llama-perplexity wall time with V3 eviction vs without, interleaved in one run.

Protocol: default model, wikitext-2 test, -c 4096 -b 512 --chunks 3 -fa on -t 2; V3 at 90 % retention
(--triatt-budget 3686; --budget-pct), calibration on the default 1024 warm-up tokens. Each round runs both,
alternating which goes first; the ratio uses each side's fastest run. At 90 % the one round a chunk comes after its
last ubatch (at once: the cache is full); at 50 % rounds follow 512-token ubatches during the prefill (late rounds).
Writes bench/results/triatt_overhead.{md,json}: one section per budget, the other budgets' kept.

    python bench/triatt_overhead.py [--rounds 3] [--ctx 4096] [--budget-pct 90]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from llama_tq.harness.common import run_tool
from llama_tq.models import default_model

ROOT = Path(__file__).resolve().parents[1]
WIKI = ROOT.parent / "shared" / "data" / "wikitext-2-raw" / "wiki.test.raw"


def run(args: list[str], log_path: Path) -> tuple[float, str]:
    r = run_tool("llama-perplexity", args, log_path)
    if r.rc != 0 or "Final estimate" not in r.log:
        sys.exit(f"llama-perplexity failed (rc {r.rc}):\n{r.log[-2000:]}")
    return r.wall_s, r.log


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--budget-pct", type=int, default=90, help="V3's budget in percent of the context")
    ap.add_argument("--text", type=Path, default=WIKI, help="evaluation text (default: wikitext-2 from ../shared)")
    args = ap.parse_args()
    budget = args.ctx * args.budget_pct // 100
    base = ["-m", str(default_model()), "-f", str(args.text), "-c", str(args.ctx), "-b", "512", "--chunks", "3",
            "-fa", "on", "-t", "2", "-lv", "4"]  # fmt: skip
    sides = {"off": base, "V3": [*base, "--triatt-budget", str(budget), "--triatt-hybrid", "2"]}
    walls: dict[str, list[float]] = {k: [] for k in sides}
    rounds = {}
    ppl = {}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            print(f"[round {r + 1}/{args.rounds}] {name} ...", end="", flush=True, file=sys.stderr)
            wall, log = run(sides[name], ROOT / "out" / "triatt_overhead" / f"{name}_{args.budget_pct}_{r}.log")
            walls[name].append(round(wall, 2))
            rounds[name] = len(re.findall(r"triatt: evict: evicted ", log))
            m = re.search(r"Final estimate: PPL = ([0-9.]+)", log)
            ppl[name] = float(m.group(1)) if m else None
            print(f" {wall:.1f}s", file=sys.stderr)
    ratio = min(walls["V3"]) / min(walls["off"])
    cmd = f"python bench/triatt_overhead.py --rounds {args.rounds} --ctx {args.ctx}"
    cmd += f" --budget-pct {args.budget_pct}" if args.budget_pct != 90 else ""
    lines = [
        f"## V3 at {args.budget_pct} %",
        "",
        f"`{cmd}`: llama-perplexity -c {args.ctx} -b 512 --chunks 3 -fa on on wikitext-2, with and without",
        f"`--triatt-budget {budget} --triatt-hybrid 2`, {args.rounds} interleaved rounds, fastest run of each.",
        "",
        "| run | wall s (each round) | fastest | eviction rounds | PPL |",
        "|---|---|---:|---:|---:|",
    ]
    for name in sides:
        lines.append(f"| {name} | {', '.join(f'{w:.1f}' for w in walls[name])} | {min(walls[name]):.1f} | "
                     f"{rounds[name]} | {ppl[name]} |")  # fmt: skip
    verdict = "met" if ratio <= 1.02 else "NOT met"
    lines += ["", f"V3 / off wall-time ratio: **{ratio:.3f}** (target <= 1.02: {verdict})"]
    section = "\n".join(lines) + "\n"
    print(section)
    out = ROOT / "bench" / "results"
    js = out / "triatt_overhead.json"
    runs = json.loads(js.read_text()) if js.exists() else {}  # per budget percent, as a string key
    runs[str(args.budget_pct)] = {"command": cmd, "walls": walls, "rounds": rounds, "ppl": ppl, "ratio": ratio,
                                  "md": section}  # fmt: skip
    js.write_text(json.dumps(runs, indent=1) + "\n")
    order = sorted(runs, key=int, reverse=True)
    (out / "triatt_overhead.md").write_text(
        "# TriAttention V3 overhead (CPU, 2 threads)\n\n" + "\n".join(runs[k]["md"] for k in order))


if __name__ == "__main__":
    main()
