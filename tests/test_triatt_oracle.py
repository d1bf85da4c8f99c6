"""Which tokens does the TriAttention score call important? An oracle on the real default model.

tests/c/dump_qk.cpp records the post-RoPE queries and keys of every layer while Gemma 3 270M reads 2048 tokens of
the embedded default text (Python's pydoc_data topics). At T = 1536 the cache holds keys 0..T-1; the oracle is the
attention mass each of them then receives from the 512 later queries (softmax over everything before the query,
summed over heads of the full-attention layers). The score is calibrated on the queries of the first 1024 tokens, as
the llama.cpp hook does, and keys are scored at t_now = T - 1. Every selection keeps the last 128 positions plus B
others; the share of the oracle mass they keep decides the direction: keeping the highest scores (the paper) must
beat keeping the lowest (what the reference implementation does), random choice and plain recency."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

import llama_tq
from llama_tq import _triatt as tri
from llama_tq.harness.demo import default_text
from llama_tq.memory import read_attn_params
from llama_tq.models import default_model

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parent
N, T, WARMUP, WINDOW = 2048, 1536, 1024, 128


def make_dump(work: Path) -> Path:
    """Builds tests/c/dump_qk.cpp against the installed library and runs it into work (also used by
    lab/triatt_hindsight.py)."""
    exe = work / "dump_qk"
    lib = llama_tq.lib_dir()
    subprocess.run(["g++", "-std=c++17", "-O2", "-I", str(llama_tq.include_dir()), str(HERE / "c" / "dump_qk.cpp"),
                    "-L", str(lib), "-lllama", "-lggml-base", "-lggml", f"-Wl,-rpath,{lib}", "-o", str(exe)],
                   check=True)  # fmt: skip
    text = work / "wiki.txt"
    text.write_text(default_text()[200_000:260_000])  # well inside the text: no start-of-document effects
    subprocess.run([str(exe), str(default_model()), str(text), str(N), str(work)], check=True, timeout=600)
    return work


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dump(tmp_path_factory.mktemp("qk"))


def oracle_and_score(dump: Path) -> tuple[np.ndarray, np.ndarray]:
    params = read_attn_params(default_model())
    mass = np.zeros(T)
    score = np.zeros(T, np.float32)
    pos = np.arange(N)
    for line in (dump / "meta.txt").read_text().splitlines():
        il, n_head, n_kv, hd, n_rot, neox, base, scale = line.split()
        il, n_head, n_kv, hd, n_rot = int(il), int(n_head), int(n_kv), int(hd), int(n_rot)
        if params.is_swa(il):
            continue  # the hook scores the full-attention cache only
        q = np.fromfile(dump / f"q{il}.f32", np.float32).reshape(N, n_head, hd)
        k = np.fromfile(dump / f"k{il}.f32", np.float32).reshape(N, n_kv, hd)
        group = n_head // n_kv
        for h in range(n_head):
            kh = k[:, h // group]
            logits = q[T:, h] @ kh.T / np.sqrt(hd)  # (N - T, N)
            logits[np.arange(N)[None, :] > pos[T:, None]] = -np.inf  # causal
            p = np.exp(logits - logits.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            mass += p[:, :T].sum(0)
        for hk in range(n_kv):
            rows = q[:WARMUP, hk * group : (hk + 1) * group].transpose(1, 0, 2).reshape(-1, hd)
            rpos = np.tile(pos[:WARMUP], group).astype(np.int32)
            mu_re, mu_im, mag = tri.calibrate(rows, rpos, n_rot, neox == "1", float(base), float(scale))
            score += tri.score(k[:T, hk], mu_re, mu_im, mag, T - 1, n_rot, neox == "1", float(base), float(scale))
    return mass, score


def test_score_direction_oracle(dump: Path) -> None:
    mass, score = oracle_and_score(dump)
    total = mass.sum()
    window = np.arange(T) >= T - WINDOW
    rng = np.random.default_rng(0)
    rows = []
    for budget in (384, 768, 1152):
        others = budget - WINDOW
        cand = np.flatnonzero(~window)

        def share(pick: np.ndarray, kept: int = budget) -> float:
            keep = window.copy()
            keep[pick] = True
            assert keep.sum() == kept
            return float(mass[keep].sum() / total)

        high = share(cand[np.argsort(-score[cand], kind="stable")][:others])
        low = share(cand[np.argsort(score[cand], kind="stable")][:others])
        recent = share(cand[-others:])
        rand = float(np.mean([share(rng.choice(cand, others, replace=False)) for _ in range(20)]))

        def v3(budget: int = budget, **kw: int) -> float:
            keep = tri.select(np.arange(T, dtype=np.int32), score, budget=budget, hybrid=2, window=WINDOW, **kw)
            return float(mass[keep].sum() / total)

        # V3 as shipped (the library's default prefix, segments and pooling: at these budgets the free slots hold
        # fewer than 96 spans, so cells rank by their own scores), and pooling at any budget
        rows.append((budget, high, low, rand, recent, v3(), v3(pool_spans=0)))
    print("\nbudget  keep-high  keep-low  random  recency  V3     V3-pool-always  (share of the later queries' "
          "attention mass kept)")  # fmt: skip
    for r in rows:
        print(f"{r[0]:>6}  {r[1]:9.3f}  {r[2]:8.3f}  {r[3]:6.3f}  {r[4]:7.3f}  {r[5]:.3f}  {r[6]:.3f}")
    for budget, high, low, rand, recent, shipped, _ in rows:
        assert high > low, f"budget {budget}: keeping the highest scores must beat keeping the lowest"
        assert high > rand and high > recent, f"budget {budget}: the score must beat random and recency"
        assert shipped > rand and shipped > recent, f"budget {budget}: the shipped V3 must beat random and recency"
