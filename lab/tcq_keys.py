"""Issue 13 groundwork: would trellis-coded quantization (TCQ) make better 3-bit keys than tq3's scalar codebook, at
the same 52 bytes per 128 values? Offline, on Gaussian data and on the default model's real keys.

TCQ here: Marcellin & Fischer's 4-state trellis with a feed-forward state (the last two branch bits), over the
block's rotated coordinates (the codec's own rotation, `_codec.rotate`). A union codebook of 16 levels (Lloyd-Max
for a unit Gaussian, times a gain) is split into 4 subsets D_j = levels j, j + 4, ...; each coordinate stores 3 bits,
a branch bit and 2 bits for the level within the subset the trellis allows, and a Viterbi search picks the path
of least squared error. Because the state is the last two branch bits, a coordinate's value depends on 5 stored bits
(its own 3 and the branch bits of the two before it): decoding is a table lookup with no sequential dependence (two
coordinates per lookup: a 256-entry pair table, the size of tq4's), so the K.Q loop would cost about what tq4's does.
Block layout for the comparison: bf16 norm + a 4-bit gain index (the header tq3 uses for its scale and sub-block
multipliers) + 384 bits of trellis data = 52 bytes, as tq3.

    python lab/tcq_keys.py [--tokens 2048] [--out out/lab]

Prints the relative MSE of tq3 and TCQ on unit Gaussian blocks, then the attention-level KL of the default model's
real keys (as bench/key_transforms.py measures it: key-mean centering + weight-derived equalization, i.e. what
tq3/tq3 ships with) for tq3 and TCQ against rotated q4_0; writes tcq_keys.json.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from llama_tq import _codec
from llama_tq.harness.demo import default_text
from llama_tq.models import default_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # key_transforms, niah_grid
sys.path.insert(0, str(Path(__file__).resolve().parent))
kt = importlib.import_module("key_transforms")  # the capture and the attention metric, shared

NEXT = np.array([[0, 1], [2, 3], [0, 1], [2, 3]])  # state after a branch bit: 2 * (state & 1) + bit
SUBSET = np.array([[0, 2], [1, 3], [2, 0], [3, 1]])  # the subset a (state, branch bit) allows
GAINS = np.linspace(0.74, 1.04, 16)  # the 4-bit gain index's values (unit-RMS blocks)


def lloyd_max(levels: int, n: int = 1_000_000, iters: int = 60) -> np.ndarray:
    x = np.sort(np.random.default_rng(0).standard_normal(n))
    c = np.quantile(x, (np.arange(levels) + 0.5) / levels)
    for _ in range(iters):
        idx = np.searchsorted((c[1:] + c[:-1]) / 2, x)
        c = np.array([x[idx == j].mean() for j in range(levels)])
    return c


def tcq(x: np.ndarray, cb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Viterbi over the 4-state trellis for rows x [B, N], starting in state 0: (reconstruction, squared error per
    row)."""
    b, n = x.shape
    subsets = [cb[j::4] for j in range(4)]
    cost = np.full((b, 4), np.inf)
    cost[:, 0] = 0.0
    back = np.zeros((n, b, 4), np.int8)
    vals = np.zeros((n, b, 4))
    rows = np.arange(b)
    for i in range(n):
        best_v, best_e = np.empty((b, 4)), np.empty((b, 4))
        for j, sub in enumerate(subsets):
            d = (x[:, i, None] - sub[None, :]) ** 2
            k = d.argmin(axis=1)
            best_v[:, j], best_e[:, j] = sub[k], d[rows, k]
        new = np.full((b, 4), np.inf)
        for s in range(4):
            for bit in range(2):
                ns, j = NEXT[s, bit], SUBSET[s, bit]
                c = cost[:, s] + best_e[:, j]
                better = c < new[:, ns]
                new[:, ns] = np.where(better, c, new[:, ns])
                back[i, :, ns] = np.where(better, s, back[i, :, ns])
                vals[i, :, ns] = np.where(better, best_v[:, j], vals[i, :, ns])
        cost = new
    s = cost.argmin(axis=1)
    err = cost[rows, s]
    out = np.empty((b, n))
    for i in range(n - 1, -1, -1):
        out[:, i] = vals[i][rows, s]
        s = back[i][rows, s]
    return out, err


def tcq_blocks(x: np.ndarray, cb: np.ndarray) -> np.ndarray:
    """Rows of 128 values through the codec's rotation, TCQ with the best of GAINS per block, and back."""
    shape = x.shape
    r = np.asarray(_codec.rotate(np.ascontiguousarray(x.reshape(-1, 128), dtype=np.float32)), dtype=np.float64)
    rms = np.sqrt((r**2).mean(axis=1, keepdims=True))
    rms = np.where(rms > 0, rms, 1.0).astype(np.float32).astype(np.float64)  # stored as a float: ~exact
    u = r / rms
    best = np.full(len(u), np.inf)
    rec = np.zeros_like(u)
    for g in GAINS:
        y, e = tcq(u, cb * g)
        take = e < best
        best = np.where(take, e, best)
        rec[take] = y[take]
    back = np.asarray(_codec.unrotate(np.ascontiguousarray(rec * rms, dtype=np.float32)), dtype=np.float64)
    return back.reshape(shape)


def gaussian(cb: np.ndarray) -> dict[str, float]:
    x = np.random.default_rng(1).standard_normal((2000, 128)).astype(np.float32)
    out = {}
    for kind in ("tq3", "tq4"):
        y = np.asarray(_codec.dequantize(_codec.quantize(x, kind), kind)).reshape(x.shape)
        out[kind] = float(((x - y) ** 2).sum() / (x**2).sum())
    y = tcq_blocks(x.astype(np.float64), cb)
    out["tcq3"] = float(((x - y) ** 2).sum() / (x**2).sum())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--cal", type=int, default=256, help="tokens for the key mean")
    ap.add_argument("--queries", type=int, default=512, help="evaluation queries (the last ones)")
    ap.add_argument("--out", type=Path, default=Path("out/lab"))
    args = ap.parse_args()
    t0 = time.time()
    cb = lloyd_max(16)
    mse = gaussian(cb)
    print("relative MSE on unit Gaussian blocks (2000 x 128):", {k: round(v, 5) for k, v in mse.items()})

    import gguf  # the model's norm gains, for the weight-derived equalization

    model = default_model()
    cap = kt.capture(model, default_text(), args.tokens)
    reader = gguf.GGUFReader(str(model))
    tens = {t.name: np.array(t.data, dtype=np.float64) for t in reader.tensors if "norm" in t.name}
    swa = int(reader.fields["gemma3.attention.sliding_window"].parts[-1][0])
    n_layer = sum(1 for k in cap if k.startswith("Kcur-"))
    scale = 1.0 / np.sqrt(cap["Qcur-0"].shape[-1])
    qpos = np.arange(args.tokens - args.queries, args.tokens)
    configs = ["q4_0 rot", "tq3 + mean + eq(weights)", "tcq3 + mean + eq(weights)", "tq4 + mean + eq(weights)"]
    kl: dict[str, list[float]] = {c: [] for c in configs}
    for il in range(n_layer):
        q = cap[f"Qcur-{il}"].astype(np.float64) * scale
        k = cap[f"Kcur-{il}"].astype(np.float64)
        v = cap[f"Vcur-{il}"].astype(np.float64)
        window = args.tokens + 1 if (il + 1) % 6 == 0 else swa
        gq, gk = tens.get(f"blk.{il}.attn_q_norm.weight"), tens.get(f"blk.{il}.attn_k_norm.weight")
        hq, hkv = q.shape[1], k.shape[1]
        for h in range(hkv):
            kh, vh = k[:, h], v[:, h]
            qh = q[qpos][:, h * (hq // hkv) : (h + 1) * (hq // hkv)]
            mu = kh[: args.cal].mean(axis=0)
            s = kt.eq_scale(kt.pair_mean(gq**2), kt.pair_mean(gk**2)) if gq is not None else np.ones_like(mu)
            p0, _ = kt.attention(qh, kh, vh, qpos, window)
            for c in configs:
                if c.startswith("q4_0"):
                    kq = kt.q4_0_rot(kh)
                else:
                    base = (kh - mu) * s
                    deq = tcq_blocks(base, cb) if c.startswith("tcq3") else kt.tq(base, c.split()[0])
                    kq = deq / s + mu
                p1, _ = kt.attention(qh, kq, vh, qpos, window)
                with np.errstate(divide="ignore", invalid="ignore"):
                    terms = np.where(p0 > 0, p0 * (np.log(p0) - np.log(np.maximum(p1, 1e-300))), 0.0)
                kl[c].append(float(terms.sum(axis=-1).mean()))
        print(f"  layer {il + 1}/{n_layer} ({time.time() - t0:.0f} s)", file=sys.stderr)
    ref = float(np.mean(kl["q4_0 rot"]))
    rows = []
    print(f"\n{'keys':28s} {'attn KL':>10s} {'vs q4_0 rot':>12s}")
    for c in configs:
        m = float(np.mean(kl[c]))
        rows.append({"keys": c, "kl": m, "kl_vs_q4_0_rot": m / ref, "kl_per_layer": kl[c]})
        print(f"{c:28s} {m:10.5f} {m / ref:11.2f}x")
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"model": model.name, "tokens": args.tokens, "cal": args.cal, "queries": args.queries,
            "text": "demo default (pydoc topics)", "gains": GAINS.tolist(),
            "seconds": round(time.time() - t0)}  # fmt: skip
    out = {"meta": meta, "gaussian_rel_mse": mse, "rows": rows}
    (args.out / "tcq_keys.json").write_text(json.dumps(out, indent=1))
    print(f"\nwrote {args.out / 'tcq_keys.json'}")


if __name__ == "__main__":
    main()
