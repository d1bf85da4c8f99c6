"""Issue 13 (3-bit caches that retrieve like f16): exact transforms of the *values*, measured offline on the default
model's real attention (the tq4/tq3 NIAH misses, lab/archive/cuda.tar.xz (cuda/niah_span), point at 3-bit V too).

The attention output of a query head is o = sum_i p_i v_i with sum_i p_i = 1, so two transforms of the stored values
are exact once undone on o (a broadcast op after attention, nothing in the K.Q or P.V loops):
  - value-mean centering: store v - mu, add mu to o (mu: the mean value of the first CAL tokens, per KV head);
    exact where the weights sum to 1 (no attention sinks);
  - channel equalization toward the output projection: store v * s, divide o by s. The codec's rotation spreads a
    block's error evenly over its channels, so the error that reaches the model, W_o e / s, is smallest with
    s_c^2 proportional to sqrt(w_c / a_c): w_c the squared norm of W_o's columns that read channel c (over the
    group's query heads), a_c = E[v_c^2] over the calibration tokens; geometric mean 1, clipped to [1/16, 16].
Metric: the relative error of W_o o over the last QUERIES queries of every layer (exact keys and softmax), i.e. the
error the values add to the residual stream, and the plain relative error of o; ratios to upstream's rotated q4_0.

    python lab/value_transforms.py [--tokens 2048] [--out out/lab]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import gguf
import numpy as np
from gguf.quants import dequantize

from key_transforms import attention, capture, eq_scale, q4_0_rot, tq
from llama_tq.harness.demo import default_text
from llama_tq.models import default_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--cal", type=int, default=256, help="calibration tokens (mean, a_c)")
    ap.add_argument("--queries", type=int, default=512, help="evaluation queries (the last ones)")
    ap.add_argument("--out", type=Path, default=Path("out/lab"))
    args = ap.parse_args()
    model = default_model()
    t0 = time.time()
    cap = capture(model, default_text(), args.tokens)
    reader = gguf.GGUFReader(str(model))
    wo = {t.name: t for t in reader.tensors if t.name.endswith("attn_output.weight")}
    swa = int(reader.fields["gemma3.attention.sliding_window"].parts[-1][0])
    n_layer = sum(1 for k in cap if k.startswith("Vcur-"))
    scale = 1.0 / np.sqrt(cap["Qcur-0"].shape[-1])
    qpos = np.arange(args.tokens - args.queries, args.tokens)
    configs = ["q4_0 rot", "tq4", "tq3", "tq3 + mean", "tq3 + eq(W_o)", "tq3 + mean + eq(W_o)", "tq4 + mean + eq(W_o)"]
    res: dict[str, list[float]] = {c: [] for c in configs}
    raw: dict[str, list[float]] = {c: [] for c in configs}
    for il in range(n_layer):
        q = cap[f"Qcur-{il}"].astype(np.float64) * scale
        k = cap[f"Kcur-{il}"].astype(np.float64)
        v = cap[f"Vcur-{il}"].astype(np.float64)
        t = wo[f"blk.{il}.attn_output.weight"]
        w = dequantize(t.data, t.tensor_type).astype(np.float64)  # [n_embd, Hq * D]
        window = args.tokens + 1 if (il + 1) % 6 == 0 else swa  # Gemma 3: every 6th layer is global
        hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
        g = hq // hkv
        ocat = {c: np.zeros((len(qpos), hq, d)) for c in ["exact", *configs]}
        for h in range(hkv):
            kh, vh = k[:, h], v[:, h]
            qh = q[qpos][:, h * g : (h + 1) * g]
            cols = w[:, h * g * d : (h + 1) * g * d].reshape(w.shape[0], g, d)  # the group's W_o columns
            wc = (cols**2).sum(axis=(0, 1))
            mu = vh[: args.cal].mean(axis=0)
            a = ((vh[: args.cal] - mu) ** 2).mean(axis=0)
            s_m = eq_scale(wc, a)  # s^4 = w / a: key_transforms' formula with W_o's weights in the query's place
            s_0 = eq_scale(wc, (vh[: args.cal] ** 2).mean(axis=0))
            p, o = attention(qh, kh, vh, qpos, window)
            ocat["exact"][:, h * g : (h + 1) * g] = o
            for c in configs:
                m = mu if "mean" in c else np.zeros_like(mu)
                s = (s_m if "mean" in c else s_0) if "eq" in c else np.ones_like(mu)
                base = (vh - m) * s
                deq = q4_0_rot(base) if c.startswith("q4_0") else tq(base, "tq4" if c.startswith("tq4") else "tq3")
                ocat[c][:, h * g : (h + 1) * g] = np.einsum("qht,td->qhd", p, deq) / s + m
        outs = {c: ocat[c].reshape(len(qpos), hq * d) @ w.T for c in ocat}
        for c in configs:
            res[c].append(float(np.linalg.norm(outs[c] - outs["exact"]) / np.linalg.norm(outs["exact"])))
            raw[c].append(float(np.linalg.norm(ocat[c] - ocat["exact"]) / np.linalg.norm(ocat["exact"])))
        print(f"  layer {il + 1}/{n_layer} ({time.time() - t0:.0f} s)", file=sys.stderr)
    ref, ref_raw = np.mean(res["q4_0 rot"]), np.mean(raw["q4_0 rot"])
    lines = [
        "| values | error of W_o o | vs q4_0 rot | error of o | vs q4_0 rot |",
        "|---|---|---|---|---|",
    ]
    rows = []
    for c in configs:
        e, r = float(np.mean(res[c])), float(np.mean(raw[c]))
        rows.append({"values": c, "wo_err": e, "o_err": r, "wo_err_per_layer": res[c]})
        lines.append(f"| {c} | {e:.4f} | {e / ref:.2f}x | {r:.4f} | {r / ref_raw:.2f}x |")
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"model": model.name, "tokens": args.tokens, "cal": args.cal, "queries": args.queries,
            "seconds": round(time.time() - t0)}  # fmt: skip
    (args.out / "value_transforms.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
