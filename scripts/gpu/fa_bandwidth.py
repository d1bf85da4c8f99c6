"""Achieved KV read rate of each FA decode case of a run_cuda.sh run (issue 12): bytes of K and V read per call
(from the case's shape and the cache types' row sizes) over the call's time in `fa_perf.log` (`perf` stage), as a
fraction of the device copy's rate in `convert_bench.txt` (`convert` stage: a cudaMemcpy of f16 bytes, read + write).

    python3 scripts/gpu/fa_bandwidth.py RES_DIR > RES_DIR/fa_bandwidth.md
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

CASE = re.compile(r"FLASH_ATTN_EXT\(hsk=(\d+),hsv=(\d+),nh=(\d+),nr23=\[(\d+),(\d+)\],kv=(\d+),nb=1,"
                  r".*?type_K=(\w+),type_V=(\w+),.*?([0-9.]+) us/run")  # fmt: skip
COPY = re.compile(r"f16 copy of (\d+) values: ([0-9.]+) us")
# bytes of one row of `head` values: (values per block, bytes per block)
BLOCKS = {"f16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18), "tq4": (128, 68), "tq3": (128, 52),
          "tq4_64": (64, 36), "tq3_64": (64, 28), "tq4_96": (96, 52), "tq3_96": (96, 40)}  # fmt: skip


def row_bytes(t: str, head: int) -> int:
    n, b = BLOCKS[t]
    if head % n:
        raise ValueError(f"head {head} is not a whole number of {t} blocks")
    return head // n * b


def table(perf: str, convert: str) -> str:
    m = COPY.search(convert)
    if not m:
        raise SystemExit("no 'f16 copy of N values: T us' line in convert_bench.txt")
    copy_rate = 2 * 2 * int(m.group(1)) / float(m.group(2)) * 1e-6  # TB/s: f16 bytes read + written
    lines = [
        f"Device copy: {copy_rate:.2f} TB/s (read + write). Decode, 1 query row a sequence, mask on.",
        "",
        "| head | KV heads x seqs | GQA | KV | K/V | µs | MB read | TB/s | of copy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for hk, hv, nh, gqa, ns, kv, tk, tv, us in CASE.findall(perf):
        cells = int(kv) * int(nh) * int(ns)
        mb = cells * (row_bytes(tk, int(hk)) + row_bytes(tv, int(hv))) * 1e-6
        rate = mb / float(us)  # MB/µs = TB/s
        lines.append(f"| {hk} | {nh} x {ns} | {gqa} | {kv} | {tk}/{tv} | {float(us):.2f} | {mb:.0f} | {rate:.2f} | "
                     f"{100 * rate / copy_rate:.0f} % |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    res = Path(sys.argv[1])
    sys.stdout.write(table((res / "fa_perf.log").read_text(), (res / "convert_bench.txt").read_text()))


if __name__ == "__main__":
    main()
