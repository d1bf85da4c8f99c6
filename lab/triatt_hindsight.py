"""Issue 15: how much of the later queries' attention can any causal selection keep? A hindsight bound on the oracle
of tests/test_triatt_oracle.py.

The test's dump (tests/c/dump_qk.cpp: Gemma 3 270M reads 2048 tokens of the default text; post-RoPE queries and keys
of every layer) gives, at T = 1536 cached keys, the attention mass each key receives from the 512 later queries over
the full-attention layers (the cache the hook evicts). Every selection keeps the last 128 positions plus the rest of
the budget; the table is the share of that mass it keeps:
  hindsight   the keys with the most later mass (needs the future: an upper bound for every policy)
  SnapKV-W    the keys the last W queries before T attended to most (observed attention, summed over heads); for
              W = 32 also through V3's selection (segments, prefix) without pooling, and with pooling 2 / 8
  TriAtt top  the highest TriAttention scores (V1 without pooling), V3 shipped / without pooling, V3 with pooling
              only around the top 2 / 5 / 10 % of scores, V3 with a narrower pool (2 positions either side) and with
              a forward-only pool (a cell takes the best score of itself and the 4 positions before it),
              StreamingLLM (prefix 128 + most recent), random (the hook's fixed hash), all through the library's
              triatt_select.

    python lab/triatt_hindsight.py [--out out/evict_hindsight]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from llama_tq import _triatt as tri
from llama_tq.memory import read_attn_params
from llama_tq.models import default_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import test_triatt_oracle as oracle  # the dump and the oracle: one implementation

N, T, W = oracle.N, oracle.T, oracle.WINDOW


def observed(dump: Path, w: int) -> np.ndarray:
    """Attention of the w queries before T over the keys before T, summed over queries and heads (full layers)."""
    params = read_attn_params(default_model())
    obs = np.zeros(T)
    pos = np.arange(N)
    for line in (dump / "meta.txt").read_text().splitlines():
        il, n_head, n_kv, hd = (int(x) for x in line.split()[:4])
        if params.is_swa(il):
            continue
        q = np.fromfile(dump / f"q{il}.f32", np.float32).reshape(N, n_head, hd)
        k = np.fromfile(dump / f"k{il}.f32", np.float32).reshape(N, n_kv, hd)
        for h in range(n_head):
            lg = q[T - w : T, h] @ k[:T, h // (n_head // n_kv)].T / np.sqrt(hd)
            lg[pos[None, :T] > pos[T - w : T, None]] = -np.inf
            p = np.exp(lg - lg.max(1, keepdims=True))
            obs += (p / p.sum(1, keepdims=True)).sum(0)
    return obs


def window_max(s: np.ndarray, before: int, after: int) -> np.ndarray:
    """Each position's best score from `before` positions before it to `after` positions after it."""
    return np.array([s[max(0, i - before) : i + after + 1].max() for i in range(len(s))])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("out/evict_hindsight"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print("dumping queries and keys (2048 tokens)...", flush=True)
        dump = oracle.make_dump(Path(tmp))
        mass, score = oracle.oracle_and_score(dump)
        snap = {w: observed(dump, w) for w in (32, 128)}
    total = mass.sum()
    window = np.arange(T) >= T - W
    cand = np.flatnonzero(~window)

    def top(s: np.ndarray, budget: int) -> float:
        keep = window.copy()
        keep[cand[np.argsort(-s[cand], kind="stable")][: budget - W]] = True
        return float(mass[keep].sum() / total)

    def select(s: np.ndarray, budget: int, **kw: int) -> float:
        keep = tri.select(np.arange(T, dtype=np.int32), s.astype(np.float32), budget=budget, window=W, **kw)
        return float(mass[keep].sum() / total)

    # pooling only around strong peaks: a cell takes the best score within 8 positions only when that score is in
    # the top q of all scores (a needle's span kept whole; elsewhere each cell its own score), then V3 without pooling
    pooled = window_max(score, 8, 8)
    peaks = {q: np.where(pooled >= np.quantile(score, 1 - q), pooled, score) for q in (0.02, 0.05, 0.10)}
    forward = window_max(score, 4, 0)  # what follows a peak stays with it
    cols = ["hindsight", "SnapKV-32", "SnapKV-128", "SnapKV-32 V3", "SnapKV-32 V3 pool 2", "SnapKV-32 V3 pool 8",
            "TriAtt top", "V3 shipped", "V3 no pool", "V3 peaks 2%",
            "V3 peaks 5%", "V3 peaks 10%", "V3 pool 2", "V3 fwd pool 4", "StreamingLLM", "random"]  # fmt: skip
    rows = []
    for budget in (384, 768, 1152):
        vals = [top(mass, budget), top(snap[32], budget), top(snap[128], budget),
                *(select(snap[32], budget, hybrid=2, pool=r) for r in (0, 2, 8)), top(score, budget),
                select(score, budget, hybrid=2), select(score, budget, hybrid=2, pool=0),
                *(select(peaks[q], budget, hybrid=2, pool=0) for q in (0.02, 0.05, 0.10)),
                select(score, budget, hybrid=2, pool=2), select(forward, budget, hybrid=2, pool=0),
                select(score, budget, hybrid=3), select(score, budget, hybrid=4)]  # fmt: skip
        rows.append({"budget": budget, **dict(zip(cols, vals, strict=True))})
    lines = [f"Share of the 512 later queries' attention mass kept among {T} cached keys (window {W} kept), "
             "default model and text; `python lab/triatt_hindsight.py`.", "",
             "| budget | " + " | ".join(cols) + " | missing mass: hindsight / StreamingLLM |",
             "|---|" + "---|" * (len(cols) + 1)]  # fmt: skip
    for r in rows:
        miss = (1 - r["hindsight"]) / (1 - r["StreamingLLM"])
        lines.append(f"| {r['budget']} | " + " | ".join(f"{r[c]:.3f}" for c in cols) + f" | {miss:.2f} |")
    table = "\n".join(lines) + "\n"
    print(table)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "hindsight.md").write_text(table)
    (a.out / "hindsight.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
