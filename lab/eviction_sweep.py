"""V3's segment quota and protected prefix on the eviction protocol of `llama-tq evict` (issue 15).

    python lab/eviction_sweep.py [--text wiki.test.raw] [--out out/evict_tuning]
    python lab/eviction_sweep.py --pooled [--text T] --out out/evict_pool_segments

f16 cache, -c 2048 -b 512 -ub 128, 3 chunks, rounds during the prefill (warmup 256, divide 64); budgets 25 and 50 %;
V3 with segments x prefix in {8, 2, 1} x {128, 32} (TRIATT_SEGMENTS / TRIATT_PREFIX), cells ranked by their own
scores (TRIATT_POOL=0, as when evict/tuning/sweep.txt was made). Prints KLD vs f16 per run.
--pooled: the segment quota with pooled scores (the library's default pool), budgets 25/50/75 %, through
`llama_tq.harness.evict` (evict.json, evict.md, the plot): segments 1, 2, 4 and 1 with prefix 32.
--window-prefix: the shipped V3 (pool 8, 2 segments) with other windows and prefixes, and StreamingLLM / random with
prefix 64 and window 256, budgets 25/50/75 % (lab/archive/evict-window_prefix.tar.xz (evict/window_prefix)): sweep.txt.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from llama_tq.harness import evict, ppl
from llama_tq.harness.common import KvConfig
from llama_tq.models import default_model

ROOT = Path(__file__).resolve().parents[1]
WIKI = ROOT.parent / "shared" / "data" / "wikitext-2-raw" / "wiki.test.raw"
SETTINGS = ((8, 128), (2, 128), (1, 128), (8, 32), (1, 32))  # (segments, prefix)
# (name, budget %, TRIATT_* settings): the window x prefix sweep (lab/archive/evict-window_prefix.tar.xz)
WP_V3 = (
    (256, 128, (25, 50, 75)),
    (256, 64, (25, 50, 75)),
    (256, 32, (25, 50, 75)),
    (128, 32, (50,)),
    (192, 128, (50,)),
    (384, 128, (50,)),
    (512, 128, (50,)),
)  # (window, prefix, budgets)
WINDOW_PREFIX = [(f"V3 W{w} P{p}", n, {"HYBRID": 2, "WINDOW": w, "PREFIX": p}) for w, p, ns in WP_V3 for n in ns]
WINDOW_PREFIX += [
    (f"V3 W{w} pool4", n, {"HYBRID": 2, "WINDOW": w, "POOL": 4}) for w, n in ((128, 25), (256, 25), (256, 50))
]
WINDOW_PREFIX += [
    (f"{n} W256 P64", pct, {"HYBRID": h, "WINDOW": 256, "PREFIX": 64})
    for n, h in (("StreamingLLM", 3), ("random", 4))
    for pct in (25, 50, 75)
]
POOLED = {"V3-s1": {"HYBRID": 2, "SEGMENTS": 1}, "V3-s2": {"HYBRID": 2, "SEGMENTS": 2},
          "V3-s4": {"HYBRID": 2, "SEGMENTS": 4}, "V3-s1-p32": {"HYBRID": 2, "SEGMENTS": 1, "PREFIX": 32}}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text", type=Path, default=WIKI)
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "evict_tuning")
    ap.add_argument("--pooled", action="store_true", help="the pooled-score segment sweep (budgets 25/50/75 %%)")
    ap.add_argument("--window-prefix", action="store_true", help="the window x prefix sweep (25/50/75 %%)")
    args = ap.parse_args()
    if args.pooled:
        evict.run(default_model(), args.text, args.out, policies=POOLED)
        return
    ctx = 2048
    cfgs = [KvConfig("f16", "f16")]
    if args.window_prefix:
        for name, pct, kw in WINDOW_PREFIX:
            env = (("TRIATT_BUDGET", str(ctx * pct // 100)), ("TRIATT_WARMUP", "256"), ("TRIATT_DIVIDE", "64"),
                   *((f"TRIATT_{k}", str(v)) for k, v in kw.items()))  # fmt: skip
            cfgs.append(KvConfig("f16", "f16", env, f"{name} {pct}%"))
    else:
        for pct in (25, 50):
            for seg, pre in SETTINGS:
                env = (("TRIATT_BUDGET", str(ctx * pct // 100)), ("TRIATT_HYBRID", "2"), ("TRIATT_WARMUP", "256"),
                       ("TRIATT_DIVIDE", "64"), ("TRIATT_SEGMENTS", str(seg)), ("TRIATT_PREFIX", str(pre)),
                       ("TRIATT_POOL", "0"))  # fmt: skip
                cfgs.append(KvConfig("f16", "f16", env, f"V3 seg{seg} prefix{pre} {pct}%"))
    res = ppl.run_matrix(default_model(), args.text, cfgs, ctx=ctx, chunks=3, threads=2, extra_args=["-ub", "128"],
                         out_dir=args.out / "run")  # fmt: skip
    pairs = zip(cfgs, res[1:], strict=True)
    lines = [f"{c.name:40s} KLD {r.kld:.4f} PPL {r.ppl:.4f} rounds {r.evictions}" for c, r in pairs]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sweep.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
