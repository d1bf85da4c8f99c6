"""Issue-3 speed protocol: llama-bench -t 2 -fa 1 -p 512 -n 64 -d 0,4096 on Gemma 3 270M Q4_K_M, all cache types
in one run (interleaved rounds), ratios against q4_0 from the same run. Writes bench/results/kv_speed.{md,json,csv}.

    python bench/kv_speed.py [--reps 3] [--rounds 1]
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from llama_tq.harness import bench
from llama_tq.harness.common import KvConfig
from llama_tq.models import default_model

ROOT = Path(__file__).resolve().parents[1]
KV = "f16/f16,q8_0/q8_0,q4_0/q4_0,tq4/tq4,tq3/tq3,tq4/tq3"
TARGETS = {"tg64 @ d4096": 1.0, "pp512 @ d0": 0.9, "pp512 @ d4096": 0.9}  # min ratio vs q4_0 for tq3 and tq4


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--kv", default=KV)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    configs = KvConfig.parse_list(args.kv)
    rows = bench.run(default_model(), configs, depths="0,4096", prompt=512, gen=64, reps=args.reps,
                     rounds=args.rounds, threads=2)  # fmt: skip
    table = bench.table(rows, "q4_0/q4_0")
    cmd = f"python bench/kv_speed.py --reps {args.reps} --rounds {args.rounds} --kv {args.kv}"
    meta = {"command": cmd, "protocol": "llama-bench -t 2 -fa 1 -p 512 -n 64 -d 0,4096", "ref": "q4_0/q4_0"}
    work = args.out / "kv_speed_run"
    bench.write_outputs(table, rows, work, meta)
    shutil.copy(work / "bench.json", args.out / "kv_speed.json")
    shutil.copy(work / "bench.csv", args.out / "kv_speed.csv")
    tests = list(dict.fromkeys(r["test"] for r in table))
    lines = [
        "# KV cache speed (issue 3 protocol, CPU)",
        "",
        f"`{cmd}` — {meta['protocol']}, Gemma 3 270M Q4_K_M, {args.reps} repetitions x {args.rounds} round(s).",
        "Tokens/s (median of all samples) and the ratio to q4_0 measured in the same run.",
        "",
        "| K/V | " + " | ".join(tests) + " |",
        "|---|" + "---|" * len(tests),
    ]
    for cfg in dict.fromkeys(str(r["config"]) for r in table):
        cells = []
        for t in tests:
            row = next(r for r in table if r["config"] == cfg and r["test"] == t)
            cells.append(f"{row['tps_median']:.1f} ({row['ratio_vs_ref']:.2f}x)")
        lines.append(f"| {cfg} | " + " | ".join(cells) + " |")
    lines += ["", "Targets (tq3 and tq4 vs q4_0): " + ", ".join(f"{t} ≥ {v}x" for t, v in TARGETS.items()), ""]
    for cfg in ("tq4/tq4", "tq3/tq3"):
        for t, v in TARGETS.items():
            row = next((r for r in table if r["config"] == cfg and r["test"] == t), None)
            if row:
                ratio = float(row["ratio_vs_ref"])  # type: ignore[arg-type]
                lines.append(f"- {cfg} {t}: {ratio:.2f}x — {'met' if ratio >= v else 'NOT met'}")
    (args.out / "kv_speed.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / 'kv_speed.md'}")


if __name__ == "__main__":
    main()
