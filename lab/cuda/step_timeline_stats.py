"""Where a decode token's period goes, host and GPU: kernel_trace.c's dump taken with TRACE_API=1 (kernels in
TRACE_OUT, runtime API calls and copies in TRACE_OUT.api, all on CUPTI's one clock).

A decode step is a CUDA graph launch (kernel_trace_stats.load_steps). From one step's cudaGraphLaunch to the next
one's, the period splits into: the launch call; the launch to the first kernel; the GPU span (first kernel's start
to last kernel's end); the wake-up (GPU done to the end of the host call that waited for it: the logits copy and
the synchronize); the host rest until the next launch (sampling, the next graph's build and inputs). Per trace the
medians over the last N steps, then every runtime API name with its calls and host microseconds a step; with
several traces the columns stand side by side. Tracing costs host time (on an H100, kernel tracing alone stretched a
~590 us d0 token to 710-915 us, mostly inside cudaGraphLaunch, NOTES.md v24): compare traces with each other, and
take decode rates from untraced runs.

    python lab/cuda/step_timeline_stats.py tr_f16.txt tr_tq3.txt [--last 300] [--json out.json]
"""

from __future__ import annotations

import argparse
import bisect
import collections
import itertools
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_trace_stats import load_steps

PARTS = ("period", "launch call", "launch to 1st kernel", "GPU span", "wake-up", "host rest")


class Api:
    __slots__ = ("corr", "end", "name", "start")

    def __init__(self, start: int, end: int, corr: int, name: str) -> None:
        self.start, self.end, self.corr, self.name = start, end, corr, name


def load_api(path: str) -> tuple[list[Api], list[tuple[int, int, int, int]]]:
    """Runtime calls and copies (start, end, bytes, kind), each sorted by start."""
    calls, copies = [], []
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) >= 5 and p[0] == "R":
                calls.append(Api(int(p[1]), int(p[2]), int(p[3]), p[4].split("_v")[0]))  # cudaX_v3020 -> cudaX
            elif len(p) >= 6 and p[0] in "MS":
                copies.append((int(p[1]), int(p[2]), int(p[4]), int(p[5]) if p[0] == "M" else -1))
    if not calls:
        raise SystemExit(f"{path}: no runtime API records (was TRACE_API=1 set?)")
    calls.sort(key=lambda a: a.start)
    copies.sort()
    return calls, copies


def analyse(trace: str, last: int) -> dict:
    steps = load_steps(trace, last + 1)
    calls, copies = load_api(trace + ".api")
    by_corr = {a.corr: a for a in calls}
    starts = [a.start for a in calls]
    copy_starts = [c[0] for c in copies]
    parts: dict[str, list[float]] = {k: [] for k in PARTS}
    per_name: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    copy_stats: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    n = 0
    for cur, nxt in itertools.pairwise(steps):
        la, lb = by_corr.get(cur[0].corr), by_corr.get(nxt[0].corr)
        if la is None or lb is None:
            continue
        k_first, k_last = cur[0].start, max(k.end for k in cur)
        i0, i1 = bisect.bisect_left(starts, la.start), bisect.bisect_left(starts, lb.start)
        window = calls[i0:i1]
        waits = [a for a in window if a.end >= k_last and a.start <= k_last]
        woke = max((a.end for a in waits), default=k_last)
        parts["period"].append((lb.start - la.start) / 1e3)
        parts["launch call"].append((la.end - la.start) / 1e3)
        parts["launch to 1st kernel"].append((k_first - la.start) / 1e3)
        parts["GPU span"].append((k_last - k_first) / 1e3)
        parts["wake-up"].append((woke - k_last) / 1e3)
        parts["host rest"].append((lb.start - woke) / 1e3)
        for a in window:
            per_name[a.name][0] += 1
            per_name[a.name][1] += (a.end - a.start) / 1e3
        j0, j1 = bisect.bisect_left(copy_starts, la.start), bisect.bisect_left(copy_starts, lb.start)
        for s, e, nbytes, kind in copies[j0:j1]:  # the copies that start within this step's period
            key = {1: "HtoD", 2: "DtoH", 8: "DtoD", -1: "memset"}.get(kind, f"kind {kind}")
            c = copy_stats[key]
            c[0] += 1
            c[1] += nbytes
            c[2] += (e - s) / 1e3
        n += 1
    if n == 0:
        raise SystemExit(f"{trace}: no step with its graph launch in the API records")
    return {
        "trace": trace,
        "steps": n,
        "parts_us": {k: statistics.median(v) for k, v in parts.items()},
        "api_per_step": {k: {"calls": v[0] / n, "us": v[1] / n} for k, v in per_name.items()},
        "copies_per_step": {
            k: {"count": v[0] / n, "bytes": v[1] / n, "gpu_us": v[2] / n} for k, v in copy_stats.items()
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+", help="kernel_trace.c dumps (each with its .api file)")
    ap.add_argument("--last", type=int, default=300, help="the last N decode steps (default 300)")
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args()
    res = [analyse(t, args.last) for t in args.traces]
    w = max(12, *(len(Path(r["trace"]).stem) for r in res))
    head = "".join(f"{Path(r['trace']).stem:>{w}s}" for r in res)
    print(f"{'median us a step':32s}{head}")
    for k in PARTS:
        print(f"{k:32s}" + "".join(f"{r['parts_us'][k]:{w}.1f}" for r in res))
    print(f"{'runtime API: calls / us a step':32s}")
    names = sorted(
        {k for r in res for k in r["api_per_step"]},
        key=lambda k: -max(r["api_per_step"].get(k, {"us": 0.0})["us"] for r in res),
    )
    for k in names:
        cells = []
        for r in res:
            v = r["api_per_step"].get(k)
            cells.append(f"{v['calls']:.1f} / {v['us']:.1f}" if v else "-")
        print(f"  {k[:30]:30s}" + "".join(f"{c:>{w}s}" for c in cells))
    print(f"{'copies: count / bytes / GPU us a step':32s}")
    for k in sorted({k for r in res for k in r["copies_per_step"]}):
        cells = []
        for r in res:
            v = r["copies_per_step"].get(k)
            cells.append(f"{v['count']:.1f}/{v['bytes']:.0f}/{v['gpu_us']:.1f}" if v else "-")
        print(f"  {k:30s}" + "".join(f"{c:>{w}s}" for c in cells))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
