"""Issue 13 groundwork: how much do exact key transforms help 3-bit keys, measured on the default model's real
queries and keys (offline, attention-level; not yet model-level KLD).

Runs Gemma 3 270M through the patched libllama (llama-cpp-python, an eval callback captures Qcur/Kcur/Vcur after
RoPE), then per layer compares the attention distributions of exact keys with those of quantized keys:
  - q4_0 with upstream's Hadamard rotation (the bar), tq3 and tq4 as they are;
  - key-mean centering: k - mu, mu the mean key of the first CAL tokens (softmax is unchanged by a common key
    shift: every logit of a query moves by q.mu);
  - channel equalization: k * s, q / s, s equal within each RoPE pair (so it commutes with RoPE), from the
    calibration tokens (s^4 = E[q^2] / E[k^2]) or from the weights alone (Gemma's attn_q_norm / attn_k_norm gains);
  - both; and robustness to a common key offset of 10x the mean key norm (raw vs centered).
Metric: mean KL(p_exact || p_quant) over the evaluation queries (tokens after the calibration window), heads and
layers, and the attention-output relative error; ratios to rotated q4_0.

    python bench/key_transforms.py [--model M.gguf] [--text T] [--tokens 2048] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import gguf
import numpy as np

from llama_tq import _codec
from llama_tq.capture import run_capture
from llama_tq.harness.demo import default_text
from llama_tq.models import default_model

WANT = re.compile(r"^[QKV]cur-\d+$")


def capture(model: Path, text: str, n_tokens: int) -> dict[str, np.ndarray]:
    """Run the model over the first n_tokens of text; return {'Qcur-L': [T, H, D], ...} (post-RoPE, unscaled) for
    the names WANT matches (set at call time: the lab scripts narrow it to some layers)."""
    parts: dict[str, list[np.ndarray]] = {}

    def keep(tensors: dict[str, np.ndarray]) -> None:
        for name, arr in tensors.items():
            parts.setdefault(name, []).append(arr)

    run_capture(model, text, n_tokens, WANT, keep)
    return {name: np.concatenate(lst, axis=0) for name, lst in parts.items()}


def q4_0_rot(k: np.ndarray) -> np.ndarray:
    """Upstream's rotated q4_0 on rows of D (a power of 2): orthonormal Hadamard, q4_0 blocks of 32, back."""
    d = k.shape[-1]
    h = np.array([[1.0]])
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    h /= np.sqrt(d)
    x = (k @ h).reshape(-1, 32)
    amax_i = np.abs(x).argmax(axis=1)
    mx = x[np.arange(len(x)), amax_i]
    dd = (mx / -8.0).astype(np.float16).astype(np.float64)
    inv = np.divide(1.0, dd, out=np.zeros_like(dd), where=dd != 0)
    q = np.clip(np.trunc(x * inv[:, None] + 8.5), 0, 15)
    return (((q - 8) * dd[:, None]).reshape(k.shape)) @ h.T


def tq(k: np.ndarray, kind: str) -> np.ndarray:
    kk = np.ascontiguousarray(k, dtype=np.float32)
    return _codec.dequantize(_codec.quantize(kk, kind), kind).astype(np.float64)


def pair_mean(x: np.ndarray) -> np.ndarray:
    """Average over NEOX RoPE pairs (i, i + D/2) and spread back: scales that commute with RoPE."""
    h = x.shape[-1] // 2
    m = 0.5 * (x[:h] + x[h:])
    return np.concatenate([m, m])


def eq_scale(eq: np.ndarray, ek: np.ndarray) -> np.ndarray:
    """s with s^4 = E[q^2] / E[k^2] per channel, geometric mean 1; channels where either side is ~0 carry no
    logit, so their scale is arbitrary: kept in [1/16, 16]."""
    eps = 1e-9 * max(float(eq.mean()), float(ek.mean()), 1e-30)
    s = np.clip(((eq + eps) / (ek + eps)) ** 0.25, 1 / 16, 16)
    return s / np.exp(np.log(s).mean())


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, qpos: np.ndarray, window: int) -> tuple:
    """q [nq, H, D] at positions qpos; k, v [T, D]; causal (+ sliding window). Returns (p [nq,H,T], out)."""
    logits = np.einsum("qhd,td->qht", q, k)
    t = np.arange(k.shape[0])
    mask = (t[None, :] <= qpos[:, None]) & (t[None, :] > qpos[:, None] - window)
    logits = np.where(mask[:, None, :], logits, -np.inf)
    logits -= logits.max(axis=-1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=-1, keepdims=True)
    return p, np.einsum("qht,td->qhd", p, v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--text", type=Path, default=None, help="default: the demo's embedded text")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--cal", type=int, default=256, help="calibration tokens (mean, scales)")
    ap.add_argument("--queries", type=int, default=512, help="evaluation queries (the last ones)")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args()
    model = args.model or default_model()
    text = args.text.read_text(errors="replace") if args.text else default_text()
    t0 = time.time()
    cap = capture(model, text, args.tokens)
    reader = gguf.GGUFReader(str(model))
    tens = {t.name: np.array(t.data, dtype=np.float64) for t in reader.tensors if "norm" in t.name}
    swa = int(reader.fields["gemma3.attention.sliding_window"].parts[-1][0])
    n_layer = sum(1 for k in cap if k.startswith("Kcur-"))
    print("  captured:", {k: v.shape for k, v in cap.items() if k.endswith("-0")}, file=sys.stderr)
    scale = 1.0 / np.sqrt(cap["Qcur-0"].shape[-1])
    qpos = np.arange(args.tokens - args.queries, args.tokens)
    rng = np.random.default_rng(0)

    configs = ["q4_0 rot", "tq4", "tq3", "tq3 + mean", "tq3 + eq(weights)", "tq3 + eq(cal)",
               "tq3 + mean + eq(cal)", "tq3 + mean + eq(weights)", "tq3, offset 10x", "tq3 + mean, offset 10x",
               "q4_0 rot, offset 10x"]  # fmt: skip
    kl = {c: [] for c in configs}
    oerr = {c: [] for c in configs}
    for il in range(n_layer):
        q = cap[f"Qcur-{il}"].astype(np.float64) * scale  # [T, Hq, D]
        k = cap[f"Kcur-{il}"].astype(np.float64)  # [T, Hkv, D]
        v = cap[f"Vcur-{il}"].astype(np.float64)
        window = args.tokens + 1 if (il + 1) % 6 == 0 else swa  # Gemma 3: every 6th layer is global
        gq, gk = tens.get(f"blk.{il}.attn_q_norm.weight"), tens.get(f"blk.{il}.attn_k_norm.weight")
        hq, hkv = q.shape[1], k.shape[1]
        for h in range(hkv):
            kh, vh = k[:, h], v[:, h]
            qh = q[qpos][:, h * (hq // hkv) : (h + 1) * (hq // hkv)]
            qcal = q[: args.cal, h * (hq // hkv) : (h + 1) * (hq // hkv)].reshape(-1, q.shape[-1])
            mu = kh[: args.cal].mean(axis=0)
            s_cal = eq_scale(pair_mean((qcal**2).mean(axis=0)), pair_mean((kh[: args.cal] ** 2).mean(axis=0)))
            s_w = eq_scale(pair_mean(gq**2), pair_mean(gk**2)) if gq is not None else np.ones_like(mu)
            off = rng.standard_normal(kh.shape[1])
            off *= 10 * np.linalg.norm(kh, axis=1).mean() / np.linalg.norm(off)
            p0, o0 = attention(qh, kh, vh, qpos, window)
            p0o, o0o = attention(qh, kh + off, vh, qpos, window)

            def khat(
                c: str, kk: np.ndarray, mu_: np.ndarray, s_cal: np.ndarray = s_cal, s_w: np.ndarray = s_w
            ) -> np.ndarray:
                s = s_cal if "eq(cal)" in c else s_w if "eq(weights)" in c else np.ones_like(mu_)
                m = mu_ if "mean" in c else np.zeros_like(mu_)
                base = (kk - m) * s
                deq = q4_0_rot(base) if c.startswith("q4_0") else tq(base, "tq4" if c == "tq4" else "tq3")
                return deq / s + m

            for c in configs:
                offset = "offset" in c
                kk = kh + off if offset else kh
                mu_c = kk[: args.cal].mean(axis=0)
                p1, o1 = attention(qh, khat(c, kk, mu_c), vh, qpos, window)
                pr, orf = (p0o, o0o) if offset else (p0, o0)
                with np.errstate(divide="ignore", invalid="ignore"):
                    terms = np.where(pr > 0, pr * (np.log(pr) - np.log(np.maximum(p1, 1e-300))), 0.0)
                kl[c].append(float(terms.sum(axis=-1).mean()))
                oerr[c].append(float(np.linalg.norm(o1 - orf) / np.linalg.norm(orf)))
        print(f"  layer {il + 1}/{n_layer} ({time.time() - t0:.0f} s)", file=sys.stderr)

    ref_kl, ref_o = np.mean(kl["q4_0 rot"]), np.mean(oerr["q4_0 rot"])
    rows = []
    print(f"\n{'keys':28s} {'attn KL':>10s} {'vs q4_0 rot':>12s} {'out err':>9s} {'vs q4_0 rot':>12s}")
    for c in configs:
        k_m, o_m = float(np.mean(kl[c])), float(np.mean(oerr[c]))
        rows.append({"keys": c, "kl": k_m, "kl_vs_q4_0_rot": k_m / ref_kl, "out_err": o_m,
                     "out_err_vs_q4_0_rot": o_m / ref_o, "kl_per_layer": kl[c]})  # fmt: skip
        print(f"{c:28s} {k_m:10.5f} {k_m / ref_kl:11.2f}x {o_m:9.4f} {o_m / ref_o:11.2f}x")
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"model": str(model.name), "tokens": args.tokens, "cal": args.cal, "queries": args.queries,
            "text": str(args.text) if args.text else "demo default (pydoc topics)",
            "seconds": round(time.time() - t0)}  # fmt: skip
    (args.out / "key_transforms.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"\nwrote {args.out / 'key_transforms.json'}")


if __name__ == "__main__":
    main()
