"""Where a decode step's GPU time goes, from kernel_trace.c's dump (CUPTI, LD_PRELOAD on llama-bench).

A CUDA graph launch's kernels share one correlation id: each such group is a decode step. For the last N steps
(llama-bench -n 128 -r 10 times 1280) it prints the step's GPU span (first kernel's start to last kernel's end), the
time some kernel runs (the union of their intervals) and the idle rest, then per kernel (short name): launches a step,
mean duration, and the mean gap from the previous kernel's end to its start (negative: it overlapped, PDL).

    python lab/cuda/kernel_trace_stats.py trace_tq3.txt trace_tq4.txt [--last 1200] [--timeline]
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import statistics
import subprocess


class Kernel:
    __slots__ = ("corr", "end", "name", "start")

    def __init__(self, start: int, end: int, name: str, corr: int = -1) -> None:
        self.start, self.end, self.name, self.corr = start, end, name, corr  # corr: the launch's correlation id


def short_names(mangled: set[str]) -> dict[str, str]:
    """Demangled names without template arguments and parameters (c++filt where installed)."""
    names = sorted(mangled)
    out = dict(zip(names, names, strict=True))
    if shutil.which("c++filt"):
        res = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=False)
        lines = res.stdout.splitlines()
        if len(lines) == len(names):
            out = dict(zip(names, lines, strict=True))
    short = {}
    for m, d in out.items():
        s = re.sub(r"^void ", "", d)
        depth, base = 0, []
        for ch in s:  # drop <...> and (...)
            if ch in "<(":
                depth += 1
            elif ch in ">)":
                depth -= 1
            elif depth == 0:
                base.append(ch)
        short[m] = "".join(base).strip() or m
    return short


def load_steps(path: str, last: int) -> list[list[Kernel]]:
    groups: dict[int, list[Kernel]] = collections.defaultdict(list)
    with open(path) as f:
        for line in f:
            parts = line.split(maxsplit=8)
            if len(parts) < 9:
                continue
            groups[int(parts[2])].append(Kernel(int(parts[0]), int(parts[1]), parts[8].strip(), int(parts[2])))
    steps = [sorted(g, key=lambda k: k.start) for _, g in sorted(groups.items())]
    if not steps:
        raise SystemExit(f"{path}: no kernels")
    # decode steps: the graph's kernel count (the most common among launches of 10+ kernels: a depth's prefill
    # ubatches run outside graphs, a kernel a correlation id)
    sizes = collections.Counter(len(s) for s in steps if len(s) >= 10) or collections.Counter(len(s) for s in steps)
    common = sizes.most_common(1)[0][0]
    steps = [s for s in steps if len(s) == common]
    return steps[-last:]


def busy_ns(step: list[Kernel]) -> int:
    total, cur_s, cur_e = 0, None, None
    for k in step:
        if cur_e is None or k.start > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = k.start, k.end
        else:
            cur_e = max(cur_e, k.end)
    return total + (cur_e - cur_s if cur_e is not None else 0)


def report(path: str, last: int, timeline: bool) -> None:
    steps = load_steps(path, last)
    names = short_names({k.name for s in steps for k in s})
    span = statistics.median((s[-1].end - s[0].start) / 1e3 for s in steps)
    busy = statistics.median(busy_ns(s) / 1e3 for s in steps)
    print(
        f"{path}: {len(steps)} steps of {len(steps[0])} kernels; GPU span {span:.1f} us, busy {busy:.1f}, "
        f"idle {span - busy:.1f} (medians)"
    )
    per: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0, 0])
    for s in steps:
        prev_end = None
        for k in s:
            p = per[names[k.name]]
            p[0] += 1
            p[1] += (k.end - k.start) / 1e3
            if prev_end is not None:
                p[2] += (k.start - prev_end) / 1e3
                p[3] += 1
            prev_end = k.end if prev_end is None else max(prev_end, k.end)
    n = len(steps)
    print(f"  {'kernel':60s} {'per step':>8s} {'us each':>8s} {'us/step':>8s} {'gap each':>8s}")
    for name, (cnt, dur, gap, ngap) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"  {name[:60]:60s} {cnt / n:8.1f} {dur / cnt:8.2f} {dur / n:8.1f} {gap / max(ngap, 1):8.2f}")
    if timeline:  # the mean step, kernel by kernel (same graph every step: positions line up)
        print("  position: start offset / duration (us, means), kernel")
        for i in range(len(steps[0])):
            off = statistics.fmean((s[i].start - s[0].start) / 1e3 for s in steps)
            dur = statistics.fmean((s[i].end - s[i].start) / 1e3 for s in steps)
            print(f"  {i:4d} {off:8.1f} {dur:7.2f}  {names[steps[0][i].name][:70]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--last", type=int, default=1200, help="the last N decode steps (default 1200)")
    ap.add_argument("--timeline", action="store_true", help="also the mean step kernel by kernel")
    args = ap.parse_args()
    for path in args.traces:
        report(path, args.last, args.timeline)


if __name__ == "__main__":
    main()
