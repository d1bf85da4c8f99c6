"""Issue 46, item 3, offline first: would value norms make V3's selection see more of what attention delivers?

On the oracle of tests/test_triatt_oracle.py (Gemma 3 270M reads 2048 tokens of the default text; T = 1536 cached
keys, the 512 later queries of the full-attention layers; window 128 kept), each selection is scored two ways:
  mass    the share of the later queries' attention mass it keeps (lab/triatt_hindsight.py's measure);
  output  the relative error of the attention outputs, sum ||o_S - o||^2 / sum ||o||^2 over layers, heads and later
          queries, o_S renormalized over what is kept (the later tokens' own keys always are): what eviction
          actually changes, where an evicted key costs its attention times its value's size.
Selections: the hindsight bounds (the most later mass; the most later mass times value norm), V3 as shipped (pool 8)
and without pooling, V3 on score + lam * std(score) * log(w) with w each position's value norm (geometric mean over
the full-attention layers and KV heads, relative to its mean), SnapKV's observation (the attention of the 32 queries
before T) through V3's selection alone and added to V3's score (z-scores: score + lam * log-observation), StreamingLLM
and random, all through triatt_select. Those select once, at T; the "rolling" ones run rounds as the hook does (after
every 128-token ubatch once calibrated on the first 512 queries, each evicting down to the budget), the observation
taken from each round's own last 32 queries over the keys still kept.

    python lab/triatt_values.py [--out out/triatt_values]
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
LAMBDAS = (0.25, 0.5, 1.0, 2.0)
UBATCH, WARM = 128, 512  # rolling rounds: after every ubatch once calibrated (on the first WARM queries)


class Attention:
    """The full-attention layers' later-query attention, to re-evaluate outputs under any kept set."""

    def __init__(self, dump: Path) -> None:
        params = read_attn_params(default_model())
        self.heads: list[tuple[np.ndarray, np.ndarray]] = []  # (weights (N - T, N) before normalization, v (N, hd))
        self.qk: list[tuple[np.ndarray, np.ndarray]] = []  # per layer and head: q (N, hd), its KV head's k (N, hd)
        self.scorers: list = []  # per layer and KV head: keys -> TriAttention score at t_now (calibrated on WARM)
        self.vnorm_log = np.zeros(N)
        n_layers = 0
        for line in (dump / "meta.txt").read_text().splitlines():
            il, n_head, n_kv, hd = (int(x) for x in line.split()[:4])
            if params.is_swa(il):
                continue
            n_layers += 1
            q = np.fromfile(dump / f"q{il}.f32", np.float32).reshape(N, n_head, hd)
            k = np.fromfile(dump / f"k{il}.f32", np.float32).reshape(N, n_kv, hd)
            v = np.fromfile(dump / f"v{il}.f32", np.float32).reshape(N, n_kv, hd)
            for hk in range(n_kv):
                self.vnorm_log += np.log(np.linalg.norm(v[:, hk], axis=1) + 1e-12) / n_kv
            rot = line.split()
            n_rot, neox, base, scale = int(rot[4]), rot[5] == "1", float(rot[6]), float(rot[7])
            group = n_head // n_kv
            for hk in range(n_kv):
                rows = q[:WARM, hk * group : (hk + 1) * group].transpose(1, 0, 2).reshape(-1, hd)
                rpos = np.tile(np.arange(WARM), group).astype(np.int32)
                mu = tri.calibrate(rows, rpos, n_rot, neox, base, scale)
                kk = k[:, hk].copy()
                self.scorers.append(
                    lambda idx, t_now, mu=mu, kk=kk, n_rot=n_rot, neox=neox, base=base, scale=scale: tri.score(
                        kk[idx], *mu, t_now, n_rot, neox, base, scale
                    )
                )
            for h in range(n_head):
                hk = h // (n_head // n_kv)
                self.qk.append((q[:, h].astype(np.float64), k[:, hk].astype(np.float64)))
                lg = q[T:, h].astype(np.float64) @ k[:, hk].T.astype(np.float64) / np.sqrt(hd)
                lg[np.arange(N)[None, :] > np.arange(T, N)[:, None]] = -np.inf  # causal
                e = np.exp(lg - lg.max(1, keepdims=True))
                self.heads.append((e, v[:, hk].astype(np.float64)))
        self.vnorm_log /= n_layers
        probs = [e / e.sum(1, keepdims=True) for e, _ in self.heads]
        self.full = [pr @ v for pr, (_, v) in zip(probs, self.heads, strict=True)]
        # later attention mass, and mass times value norm, of each cached position
        self.mass = sum(pr[:, :T].sum(0) for pr in probs)
        self.vmass = sum(pr[:, :T].sum(0) * np.linalg.norm(v[:T], axis=1)
                         for pr, (_, v) in zip(probs, self.heads, strict=True))  # fmt: skip

    def observed(self, t: int, keep: np.ndarray, w: int = 32) -> np.ndarray:
        """Attention the w queries before t paid the kept keys before t (summed over layers and heads)."""
        obs = np.zeros(T)
        cols = np.flatnonzero(keep[:t])
        for q, k in self.qk:
            lg = q[t - w : t] @ k[cols].T / np.sqrt(q.shape[1])
            lg[cols[None, :] > np.arange(t - w, t)[:, None]] = -np.inf
            e = np.exp(lg - lg.max(1, keepdims=True))
            obs[cols] += (e / e.sum(1, keepdims=True)).sum(0)
        return obs

    def output_error(self, keep: np.ndarray) -> float:
        cols = np.concatenate([keep, np.ones(N - T, bool)])
        num = den = 0.0
        for (e, v), o in zip(self.heads, self.full, strict=True):
            ek = e[:, cols]
            os_ = (ek / ek.sum(1, keepdims=True)) @ v[cols]
            num += float(((os_ - o) ** 2).sum())
            den += float((o**2).sum())
        return num / den


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("out/triatt_values"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print("dumping queries, keys and values (2048 tokens)...", flush=True)
        dump = oracle.make_dump(Path(tmp))
        _, score = oracle.oracle_and_score(dump)
        att = Attention(dump)
    snap = att.observed(T, np.ones(T, bool))  # SnapKV's observation: the 32 queries before T over every key
    window = np.arange(T) >= T - W
    cand = np.flatnonzero(~window)
    logw = att.vnorm_log[:T] - att.vnorm_log[:T].mean()
    sd = float(score.std())
    # the observation as a z-score of its log, added to V3's z-scored score (both on the same scale)
    zs = (score - score.mean()) / sd
    lo = np.log(snap + 1e-6)
    zo = (lo - lo.mean()) / lo.std()

    def top(s: np.ndarray, budget: int) -> np.ndarray:
        keep = window.copy()
        keep[cand[np.argsort(-s[cand], kind="stable")][: budget - W]] = True
        return keep

    def select(s: np.ndarray, budget: int, **kw: int) -> np.ndarray:
        idx = tri.select(np.arange(T, dtype=np.int32), s.astype(np.float32), budget=budget, window=W, **kw)
        keep = np.zeros(T, bool)
        keep[idx] = True
        return keep

    def rolling(budget: int, lam: float | None) -> np.ndarray:
        """Rounds after every ubatch once calibrated, each evicting down to the budget: V3 on its own score
        (lam None), on z(score) + lam z(log observation) of the ubatch's last 32 queries, or (lam inf) on the
        observation alone; the kept set at T."""
        keep = np.zeros(T, bool)
        for t_end in range(UBATCH, T + 1, UBATCH):
            keep[t_end - UBATCH : t_end] = True
            if t_end < WARM or keep.sum() <= budget:
                continue
            idx = np.flatnonzero(keep)
            sc = sum(f(idx, t_end - 1) for f in att.scorers).astype(np.float64)
            if lam is not None:
                lo = np.log(att.observed(t_end, keep)[idx] + 1e-6)
                zo = (lo - lo.mean()) / lo.std()
                sc = zo if np.isinf(lam) else (sc - sc.mean()) / sc.std() + lam * zo
            m = tri.select(idx.astype(np.int32), sc.astype(np.float32), budget=budget, window=W, hybrid=2)
            keep[idx[~np.asarray(m, bool)]] = False
        return keep

    rows = []
    for budget in (384, 768, 1152):
        sels: dict[str, np.ndarray] = {
            "hindsight mass": top(att.mass, budget),
            "hindsight mass x ‖v‖": top(att.vmass, budget),
            "V3 shipped": select(score, budget, hybrid=2),
            "V3 no pool": select(score, budget, hybrid=2, pool=0),
        }
        for lam in LAMBDAS:
            sels[f"V3 + {lam} log‖v‖"] = select(score + lam * sd * logw, budget, hybrid=2)
            sels[f"V3 no pool + {lam} log‖v‖"] = select(score + lam * sd * logw, budget, hybrid=2, pool=0)
        sels["SnapKV-32 through V3"] = select(snap, budget, hybrid=2)
        for lam in LAMBDAS:
            sels[f"V3 + {lam} SnapKV-32"] = select(zs + lam * zo, budget, hybrid=2)
        sels["rolling V3"] = rolling(budget, None)
        for lam in (0.5, 1.0, 2.0, float("inf")):
            sels[f"rolling V3 + {lam} SnapKV-32"] = rolling(budget, lam)
        sels["StreamingLLM"] = select(score, budget, hybrid=3)
        sels["random"] = select(score, budget, hybrid=4)
        for name, keep in sels.items():
            rows.append({"budget": budget, "selection": name, "kept": int(keep.sum()),
                         "mass": float(att.mass[keep].sum() / att.mass.sum()),
                         "output_error": att.output_error(keep)})  # fmt: skip
            print(
                f"{budget:5d} {name:28s} mass {rows[-1]['mass']:.3f} output error {rows[-1]['output_error']:.5f}",
                flush=True,
            )
    stream = {r["budget"]: r["output_error"] for r in rows if r["selection"] == "StreamingLLM"}
    lines = [f"Eviction of {T} cached keys to a budget (window {W} kept), default model and text, the 512 later "
             "queries of the full-attention layers; `python lab/triatt_values.py`.", "",
             "| budget | selection | mass kept | output error | / StreamingLLM's |",
             "|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['budget']} | {r['selection']} | {r['mass']:.3f} | {r['output_error']:.5f} | "
                     f"{r['output_error'] / stream[r['budget']]:.2f} |")  # fmt: skip
    table = "\n".join(lines) + "\n"
    print(table)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "values.md").write_text(table)
    (a.out / "values.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
