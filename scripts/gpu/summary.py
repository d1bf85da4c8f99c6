"""Machine-readable summary of one run_cuda.sh run (issue 12): per K/V pair the FA decode times of the 4-sequence
and 1-sequence cases (fa_perf.log, `perf` stage) and llama-bench's tg128 @ d0 / d32768 and pp512 @ d32768
(llama_bench.md, `bench` stage), next to f16's values from the same run.

    python3 scripts/gpu/summary.py RES_DIR > RES_DIR/summary.json
    python3 scripts/gpu/summary.py RES_DIR OLD.json > summary.json   # what RES_DIR measured replaces OLD's

With OLD.json the merge is by value: a run of only some stages, or one whose perf stage stopped part-way, replaces
the values it measured (each with f16's value of the same run beside it) and keeps OLD's others.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

FA = re.compile(r"FLASH_ATTN_EXT\(hsk=128,hsv=128,nh=(\d+),nr23=\[4,(\d)\],kv=32768,nb=1,"
                r".*?type_K=(\w+),type_V=(\w+),.*?([0-9.]+) us/run")  # fmt: skip
ROW = re.compile(r"^\|(.+)\|\s*$")
ROUND = re.compile(r"^round \d+ (\S+)\s*$")  # "round N KIND": a run of an interleaved file, maybe without headers


def fa_times(log: str) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for nh, nr3, tk, tv, us in FA.findall(log):
        key = "fa_decode_us" if (nh, nr3) == ("8", "4") else "fa_decode_1seq_us" if (nh, nr3) == ("4", "1") else None
        if key:
            out.setdefault(f"{tk}/{tv}", {})[key] = float(us)
    return out


BENCH_NAMES = {"tg128": "tg128_d0", "tg128 @ d32768": "tg128_d32768", "pp512 @ d32768": "pp512_d32768",
               "pp512": "pp512_d0"}  # fmt: skip


def bench_tables(md: str) -> list[tuple[str, dict[str, float]]]:
    """llama-bench -o md tables in the order they were printed, one per llama-bench run: (K/V pair, t/s per test).
    A table without type_k/type_v columns is f16/f16. A line "round N KIND" starts a run whose rows may come without
    their header (the last two cells: test, t/s); KIND is a K/V pair or one type for both (e.g. tq3, tq3-sep)."""
    tables: list[tuple[str, dict[str, float]]] = []
    cols: list[str] = []
    for line in md.splitlines():
        r = ROUND.match(line)
        if r:
            kind = r.group(1)
            tables.append((kind if "/" in kind else f"{kind}/{kind}", {}))
            cols = []
            continue
        m = ROW.match(line)
        if not m:
            continue
        cells = [c.strip() for c in m.group(1).split("|")]
        if "test" in cells:
            cols = cells
            tables.append(("", {}))
            continue
        if set(cells[0]) <= {"-", ":"}:
            continue
        if not cols:
            if tables and len(cells) >= 2:  # a header-less row of a "round" run
                pair, rates = tables[-1]
                tables[-1] = (pair, {**rates, cells[-2]: float(cells[-1].split("±")[0])})
            continue
        row = dict(zip(cols, cells, strict=False))
        pair = f"{row.get('type_k', 'f16')}/{row.get('type_v', 'f16')}"
        tables[-1] = (pair, {**tables[-1][1], row["test"]: float(row["t/s"].split("±")[0])})
    return [t for t in tables if t[1]]


def bench_rates(md: str) -> dict[str, dict[str, float]]:
    """Per K/V pair the mean t/s of the summary's tests; a pair benchmarked more than once in the run (interleaved
    repeats, to show the run-to-run noise) gets the mean of its runs."""
    runs: dict[str, dict[str, list[float]]] = {}
    for pair, rates in bench_tables(md):
        for test, ts in rates.items():
            if test in BENCH_NAMES:
                runs.setdefault(pair, {}).setdefault(BENCH_NAMES[test], []).append(ts)
    return {pair: {k: round(sum(v) / len(v), 2) for k, v in vals.items()} for pair, vals in runs.items()}


def main() -> None:
    res = Path(sys.argv[1])
    base = json.loads(Path(sys.argv[2]).read_text()) if len(sys.argv) > 2 else {}  # pairs this run did not measure
    data: dict[str, dict[str, float]] = {}
    for log, parse in (("fa_perf.log", fa_times), ("llama_bench.md", bench_rates)):
        if not (res / log).is_file():  # a run of only some stages
            continue
        for pair, vals in parse((res / log).read_text()).items():
            data.setdefault(pair, {}).update(vals)
    json.dump(merge(base, data), sys.stdout, indent=2)
    print()


def merge(base: dict[str, dict[str, float]], data: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """base with this run's values (data: pair -> measure -> value) put in, each next to f16's value of this run
    (f16_<measure>; dropped where this run has none, so a value never sits beside another run's f16). Values this
    run did not measure keep theirs, f16's included."""
    f16 = data.get("f16/f16", {})
    out = {pair: dict(vals) for pair, vals in base.items()}
    for pair, vals in data.items():
        row = out.setdefault(pair, {})
        for k, v in vals.items():
            row[k] = v
            if pair == "f16/f16":
                continue
            if k in f16:
                row[f"f16_{k}"] = f16[k]
            else:
                row.pop(f"f16_{k}", None)
    return {pair: dict(sorted(row.items())) for pair, row in sorted(out.items())}


if __name__ == "__main__":
    main()
