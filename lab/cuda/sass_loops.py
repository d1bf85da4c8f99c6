"""Static instructions of a kernel's main loop, from `cuobjdump -sass` output (NOTES.md v25's counts).

The main loop is the backward branch's span that holds at least --mma HMMA instructions and fewer than 2000
instructions (the tile loop; larger spans are the epilogue's unrolled merges). cuobjdump is not installed on the
development machines: PyPI's `nvidia-cuda-cuobjdump` wheel carries it (`pip download --no-deps`, unzip).

    cuobjdump -sass fa_decode_bench > fa.sass
    python lab/cuda/sass_loops.py fa.sass 'tq_fa_mma_kernelILi128' [--mma 16]
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

FUNC = re.compile(r"\s+Function : (\S+)")
INSN = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);")
BRANCH = re.compile(r"BRA.*?0x([0-9a-f]+)")


def functions(sass: str) -> dict[str, list[tuple[int, str]]]:
    """Each function's (address, instruction) list."""
    out: dict[str, list[tuple[int, str]]] = {}
    cur = None
    for line in sass.splitlines():
        if m := FUNC.match(line):
            cur = m.group(1)
            out[cur] = []
        elif (m := INSN.match(line)) and cur is not None:
            out[cur].append((int(m.group(1), 16), m.group(2).strip()))
    return out


def opcode(insn: str) -> str:
    """The opcode without its predicate and modifiers."""
    return (insn.split()[1] if insn.startswith("@") else insn.split()[0]).split(".")[0]


def main_loops(ins: list[tuple[int, str]], mma: int) -> list[collections.Counter[str]]:
    """Opcode counts of every backward-branch span with at least mma HMMA and fewer than 2000 instructions."""
    out = []
    for addr, txt in ins:
        m = BRANCH.search(txt)
        if m and int(m.group(1), 16) < addr:
            ops = collections.Counter(opcode(t) for a, t in ins if int(m.group(1), 16) <= a <= addr)
            if ops["HMMA"] >= mma and sum(ops.values()) < 2000:
                out.append(ops)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sass", type=Path)
    ap.add_argument("pattern", help="regular expression on the mangled kernel names")
    ap.add_argument("--mma", type=int, default=16, help="HMMA instructions a tile loop holds at least")
    a = ap.parse_args()
    for name, ins in functions(a.sass.read_text()).items():
        if re.search(a.pattern, name):
            for ops in main_loops(ins, a.mma):
                top = " ".join(f"{k}:{v}" for k, v in ops.most_common(12))
                print(f"{name[:48]:48s} loop {sum(ops.values()):5d}  {top}")


if __name__ == "__main__":
    main()
