"""Issue 46's overhead table: TriAttention V3 on the 8B shape (run_cuda.sh stage evict8b) as each repetition's time
over the same repetition's run without eviction, per cache and protocol: prefill (llama-perplexity's total time)
after 512-token ubatches (V3 with late rounds, the default, and with rounds at once) and after 128-token ones, and
decode (llama-completion's per-token eval time) with a round every 128 tokens. Prints a markdown table and writes
the ratios as JSON beside the log (evict8b.json: "cuda.ub512", "cuda.ub128", "cuda.decode" per cache).

    python3 scripts/gpu/evict8b.py RES_DIR/evict8b.txt
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

LINE = re.compile(
    r"^evict8b kv (\S+) proto (\S+) cfg (\S+) rep (\d+) \| (.*?) \| (.*?) \| (.*?) \| rounds (\d+) late (\d+)", re.M
)
TOTAL = re.compile(r"total time = *([0-9.]+) ms")
EVAL = re.compile(r"eval time = *([0-9.]+) ms / *(\d+) runs")
PPL = re.compile(r"PPL = ([0-9.]+)")
TARGETS = {"ub512": 1.03, "ub128": 1.02, "decode": 1.02}  # issue 46: overhead at most (CUDA)


def parse(text: str) -> dict[tuple[str, str, str, int], dict[str, float]]:
    runs: dict[tuple[str, str, str, int], dict[str, float]] = {}
    for m in LINE.finditer(text):
        kv, proto, cfg, rep = m.group(1), m.group(2), m.group(3), int(m.group(4))
        r: dict[str, float] = {"rounds": float(m.group(8)), "late": float(m.group(9))}
        if proto == "decode":
            e = EVAL.search(m.group(6))
            if e is None:
                continue
            r["time"] = float(e.group(1)) / max(1, int(e.group(2)))  # ms a generated token
        else:
            t = TOTAL.search(m.group(5))
            if t is None:
                continue
            r["time"] = float(t.group(1))
        p = PPL.search(m.group(7))
        if p is not None:
            r["ppl"] = float(p.group(1))
        runs[(kv, proto, cfg, rep)] = r
    return runs


def main(argv: list[str]) -> int:
    path = Path(argv[1])
    runs = parse(path.read_text())
    if not runs:
        print(f"no evict8b runs in {path}", file=sys.stderr)
        return 1
    out: dict[str, dict[str, dict[str, object]]] = {}
    print("| cache | protocol | V3 | time / none (each repetition) | mean | target | met | rounds (late) "
          "| PPL none / V3 |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for kv, proto, cfg in sorted({(k, p, c) for k, p, c, _ in runs if c != "none"}):
        reps = sorted(r for k, p, c, r in runs if (k, p, c) == (kv, proto, cfg) and (k, p, "none", r) in runs)
        if not reps:
            continue
        ratios = [runs[(kv, proto, cfg, r)]["time"] / runs[(kv, proto, "none", r)]["time"] for r in reps]
        mean = statistics.fmean(ratios)
        last = runs[(kv, proto, cfg, reps[-1])]
        ppl = (runs[(kv, proto, "none", reps[-1])].get("ppl"), last.get("ppl"))
        target = TARGETS[proto] if cfg == "late" else None
        met = "" if target is None else ("yes" if mean <= target else "no")
        name = "late rounds (default)" if cfg == "late" else "rounds at once"
        ppl_s = f"{ppl[0]} / {ppl[1]}" if ppl[0] is not None else "-"
        bound = "" if target is None else f"<= {target}"
        reps_s = ", ".join(f"{x:.3f}" for x in ratios)
        print(f"| {kv} | {proto} | {name} | {reps_s} | {mean:.3f} | {bound} | {met} | "
              f"{int(last['rounds'])} ({int(last['late'])}) | {ppl_s} |")  # fmt: skip
        key = f"cuda.{proto}" if cfg == "late" else f"cuda.{proto}.at_once"
        out.setdefault(key, {})[kv] = {"ratio": round(mean, 4), "reps": [round(x, 4) for x in ratios],
                                       "target": target, "met": None if target is None else mean <= target}  # fmt: skip
    path.with_suffix(".json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
