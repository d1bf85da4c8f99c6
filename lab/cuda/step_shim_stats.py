"""Split decode steps into host time and GPU wait, from step_shim.c's dump (LD_PRELOAD on llama-bench).

A step runs from one cudaGraphLaunch to the next; the time spent inside cudaStreamSynchronize is the host waiting
for the GPU, the rest is host work. Prints the medians of the last 1200 steps (llama-bench -n 128 -r 10's timed
steps) per dump file:  python lab/cuda/step_shim_stats.py shim_*.txt
"""

from __future__ import annotations

import itertools
import statistics
import sys


def step_stats(path: str, last: int = 1200) -> str:
    events: list[tuple[str, float, float]] = []
    with open(path) as f:
        for line in f:
            kind, start, end = line.split()
            events.append((kind, float(start), float(end)))
    launches = [i for i, e in enumerate(events) if e[0] == "G"]
    steps = []
    for i0, i1 in itertools.pairwise(launches):
        total = events[i1][1] - events[i0][1]
        wait = sum(b - a for k, a, b in events[i0:i1] if k == "S")
        steps.append((total, wait, events[i0][2] - events[i0][1]))
    steps = steps[-last:]
    step = statistics.median(s[0] for s in steps)
    wait = statistics.median(s[1] for s in steps)
    host = statistics.median(s[0] - s[1] for s in steps)
    launch = statistics.median(s[2] for s in steps)
    return (
        f"{path}: steps {len(steps)}  step {step:.1f} us  sync-wait {wait:.1f}  host (step - wait) {host:.1f}  "
        f"graph-launch call {launch:.1f}"
    )


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(step_stats(p))
