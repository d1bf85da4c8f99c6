"""Issue 45's table: decode and prefill of the 8B-shaped model (run_cuda.sh stages llama8b, llama8b_long) as each
round's t/s over the same round's f16, and the FA decode cases of the shape (stage llama8b_perf) with their bytes and
read rate beside the device copy's; every target of the issue met or not. Prints a markdown table and puts the same
numbers under "llama8b" in RES_DIR/summary.json (other keys kept).

    python3 scripts/gpu/llama8b.py RES_DIR > RES_DIR/llama8b_table.md
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fa_bandwidth import cases, copy_tbs  # the FA case parser, bytes and rates, and the copy's rate, shared
from summary import bench_tables  # the llama-bench table parser, shared

BENCH_FILES = ("llama8b.md", "llama8b_long.md")  # d0 / d32768 rounds; d131072 rounds
# (what, K/V pair, test or FA case, bound, the goal where the issue names one); ratios: at least, µs: at most
RATIO_TARGETS = [
    ("tg128 d0", "tq3/tq3", "tg128", 0.97, None),
    ("tg128 d0", "tq4/tq3", "tg128", 0.97, None),
    ("tg128 d32768", "tq3/tq3", "tg128 @ d32768", 1.30, 1.38),
    ("tg128 d32768", "tq4/tq3", "tg128 @ d32768", 1.25, None),
    ("tg128 d131072", "tq3/tq3", "tg128 @ d131072", 2.0, 2.2),
    ("tg128 d131072", "tq4/tq3", "tg128 @ d131072", 1.9, None),
    ("pp512 d32768", "tq3/tq3", "pp512 @ d32768", 0.95, None),
    ("pp512 d32768", "tq4/tq3", "pp512 @ d32768", 0.95, None),
]
# (what, head, KV heads, sequences, KV, bound µs, goal µs) for tq3/tq3
FA_TARGETS = [
    ("FA decode 1 seq x 4 KV heads x 32K, head 128", 128, 4, 1, 32768, 12.0, 8.0),
    ("FA decode 4 seq x 8 KV heads x 32K, head 128", 128, 8, 4, 32768, 60.0, None),
    ("FA decode 4 seq x 8 KV heads x 32K, head 256", 256, 8, 4, 32768, 100.0, None),
]
ROUND = re.compile(r"^round (\d+) ", re.M)


def bench_rounds(md: str) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """pair -> test -> [(t/s, same round's f16 t/s)] from a file of "round N KIND" runs (every KIND once a round)."""
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    chunks = ROUND.split(md)  # text before the first round, then (N, text) pairs
    # one round's runs: every table after a "round N" line of that N
    by_round: dict[str, list[tuple[str, dict[str, float]]]] = {}
    for i in range(1, len(chunks) - 1, 2):
        by_round.setdefault(chunks[i], []).extend(bench_tables(f"round {chunks[i]} " + chunks[i + 1]))
    for runs in by_round.values():
        f16 = next((rates for pair, rates in runs if pair == "f16/f16"), None)
        if f16 is None:
            continue  # a round without f16 has nothing to compare with
        for pair, rates in runs:
            for test, ts in rates.items():
                if test in f16:
                    out.setdefault(pair, {}).setdefault(test, []).append((ts, f16[test]))
    return out


def fa_cases(perf: str, copy_rate: float | None) -> list[dict[str, Any]]:
    return [{"head": c.head_k, "kv_heads": c.kv_heads, "gqa": c.gqa, "seqs": c.seqs, "kv": c.kv,
             "pair": f"{c.type_k}/{c.type_v}", "us": c.us, "mb": round(c.mb, 1), "tbs": round(c.tbs, 3),
             "of_copy": round(c.tbs / copy_rate, 3) if copy_rate else None} for c in cases(perf)]  # fmt: skip


def summarize(res: Path) -> dict[str, Any]:
    bench: dict[str, dict[str, dict[str, Any]]] = {}
    for name in BENCH_FILES:
        if (res / name).is_file():
            for pair, tests in bench_rounds((res / name).read_text()).items():
                for test, vals in tests.items():
                    bench.setdefault(pair, {})[test] = {
                        "ts": [round(v, 2) for v, _ in vals], "f16_ts": [round(f, 2) for _, f in vals],
                        "ratio": [round(v / f, 4) for v, f in vals],
                        "ratio_mean": round(statistics.fmean(v / f for v, f in vals), 4),
                    }  # fmt: skip
    convert = res / "convert_bench.txt"
    copy_rate = copy_tbs(convert.read_text()) if convert.is_file() else None
    perf = (res / "fa_perf_llama8b.log").read_text() if (res / "fa_perf_llama8b.log").is_file() else ""
    fa = fa_cases(perf, copy_rate)
    targets: list[dict[str, Any]] = []
    for what, pair, test, bound, goal in RATIO_TARGETS:
        got = bench.get(pair, {}).get(test, {}).get("ratio_mean")
        targets.append(
            {
                "target": f"{what} {pair} >= {bound}x",
                "goal": goal,
                "measured": got,
                "met": None if got is None else got >= bound,
            }
        )
    for what, head, nh, ns, kv, bound_us, goal_us in FA_TARGETS:
        us = next((r["us"] for r in fa if (r["head"], r["kv_heads"], r["seqs"], r["kv"], r["pair"]) ==
                   (head, nh, ns, kv, "tq3/tq3")), None)  # fmt: skip
        targets.append(
            {
                "target": f"{what} tq3 <= {bound_us} us",
                "goal": goal_us,
                "measured": us,
                "met": None if us is None else us <= bound_us,
            }
        )
    copy = round(copy_rate, 3) if copy_rate else None
    return {"bench": bench, "copy_tbs": copy, "fa_decode": fa, "targets": targets}


def table(s: dict[str, Any]) -> str:
    bench = s["bench"]
    lines = ["| K/V | test | t/s per round | f16 t/s | ratio per round | mean |", "|---|---|---|---|---|---|"]
    for pair, tests in bench.items():
        for test, v in tests.items():
            lines.append(f"| {pair} | {test} | {' / '.join(f'{x:.1f}' for x in v['ts'])} | "
                         f"{' / '.join(f'{x:.1f}' for x in v['f16_ts'])} | "
                         f"{' / '.join(f'{x:.3f}' for x in v['ratio'])} | {v['ratio_mean']:.3f} |")  # fmt: skip
    lines += ["", f"FA decode (1 query row a sequence, GQA 4); device copy {s['copy_tbs'] or '-'} TB/s:", "",
              "| head | KV heads x seqs | KV | K/V | µs | MB read | TB/s | of copy |",
              "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in s["fa_decode"]:
        frac = f"{100 * r['of_copy']:.0f} %" if r["of_copy"] else "-"
        lines.append(f"| {r['head']} | {r['kv_heads']} x {r['seqs']} | {r['kv']} | {r['pair']} | {r['us']:.2f} | "
                     f"{r['mb']:.0f} | {r['tbs']:.2f} | {frac} |")  # fmt: skip
    lines += ["", "| target | goal | measured | met |", "|---|---|---|---|"]
    for t in s["targets"]:
        met = "-" if t["met"] is None else "yes" if t["met"] else "**no**"
        got = "-" if t["measured"] is None else f"{t['measured']:.3f}"
        lines.append(f"| {t['target']} | {t['goal'] or '-'} | {got} | {met} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    res = Path(sys.argv[1])
    s = summarize(res)
    path = res / "summary.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    data["llama8b"] = s
    path.write_text(json.dumps(data, indent=2) + "\n")
    sys.stdout.write(table(s))


if __name__ == "__main__":
    main()
