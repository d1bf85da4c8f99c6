"""Achieved KV read rate of each FA decode case of a run_cuda.sh run (issue 12): bytes of K and V read per call
(from the case's shape and the cache types' row sizes) over the call's time in `fa_perf.log` (`perf` stage), as a
fraction of the device copy's rate in `convert_bench.txt` (`convert` stage: a cudaMemcpy of f16 bytes, read + write).

    python3 scripts/gpu/fa_bandwidth.py RES_DIR > RES_DIR/fa_bandwidth.md
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import NamedTuple

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


class FaCase(NamedTuple):
    head_k: int
    head_v: int
    kv_heads: int
    gqa: int
    seqs: int
    kv: int
    type_k: str
    type_v: str
    us: float
    mb: float  # K and V bytes one call reads
    tbs: float  # achieved read rate


def cases(perf: str) -> list[FaCase]:
    """The FA decode cases of a test-backend-ops perf log with the bytes each call reads and the rate it reached."""
    out = []
    for hk, hv, nh, gqa, ns, kv, tk, tv, us in CASE.findall(perf):
        mb = int(kv) * int(nh) * int(ns) * (row_bytes(tk, int(hk)) + row_bytes(tv, int(hv))) * 1e-6
        out.append(FaCase(int(hk), int(hv), int(nh), int(gqa), int(ns), int(kv), tk, tv, float(us), mb,
                          mb / float(us)))  # MB/µs = TB/s  # fmt: skip
    return out


def copy_tbs(convert: str) -> float | None:
    """The device copy's rate in TB/s (f16 bytes read + written) from convert_bench.txt, None without its line."""
    m = COPY.search(convert)
    return 2 * 2 * int(m.group(1)) / float(m.group(2)) * 1e-6 if m else None


def table(perf: str, convert: str) -> str:
    copy_rate = copy_tbs(convert)
    if copy_rate is None:
        raise SystemExit("no 'f16 copy of N values: T us' line in convert_bench.txt")
    lines = [
        f"Device copy: {copy_rate:.2f} TB/s (read + write). Decode, 1 query row a sequence, mask on.",
        "",
        "| head | KV heads x seqs | GQA | KV | K/V | µs | MB read | TB/s | of copy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cases(perf):
        lines.append(f"| {c.head_k} | {c.kv_heads} x {c.seqs} | {c.gqa} | {c.kv} | {c.type_k}/{c.type_v} | "
                     f"{c.us:.2f} | {c.mb:.0f} | {c.tbs:.2f} | {100 * c.tbs / copy_rate:.0f} % |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    res = Path(sys.argv[1])
    sys.stdout.write(table((res / "fa_perf.log").read_text(), (res / "convert_bench.txt").read_text()))


if __name__ == "__main__":
    main()
