"""Issue 13: equalization by a full matrix per KV head (the key basis, LLAMA_TQ_KEYS=matrix) against the shipped
diagonal scales, on the default model's real queries and keys of its global-attention layers (offline).

Keys are stored as A (k - mu) and queries used as A^-T q (exact). A^T A = Sk^-1 # Sq minimizes the logit error of
TQ's isotropic quantization error for key/query second moments Sk, Sq averaged over the RoPE rotations of the
context (`rope_avg`). Bases compared (mu: the shipped key mean of the first 512 tokens on the slow RoPE pairs):
  diag (shipped)  s from the QK-norm gains (llama-tq-keys.cpp's default)
  basis, weights  Sk, Sq from the weights (W diag(g_attn^2) W^T, RMS-normalized, times the QK-norm gains), their
                  off-diagonal entries halved, as LLAMA_TQ_KEYS=matrix computes it
  basis, weights, unshrunk   the same with the off-diagonal entries as they are
  basis, first 512 tokens  Sk, Sq from the first 512 tokens' pre-RoPE keys and queries (a calibration)
Modes: `text` (default): logit-error RMS and attention KL of the last 512 queries over --tokens tokens of the demo
text; `needle`: a NIAH prompt of `llama-tq niah` (cloze, --tokens context), the attention mass that the prompt's
last token puts on the needle's tokens in each global layer (best head), exact keys against each basis.

    python lab/key_basis.py --tokens 16384 [--mode needle --positions 0.05,0.25,...] --out out/key_basis
    python lab/key_basis.py --table out/key_basis/needle_16384.json   # the markdown table of a run
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
from gguf.quants import dequantize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # key_transforms, niah_grid
sys.path.insert(0, str(Path(__file__).resolve().parent))
import key_transforms as kt
from llama_tq.harness import demo, niah
from llama_tq.models import default_model

GLOBAL = (5, 11, 17)  # Gemma 3 270M: every 6th layer attends globally
D, H = 256, 128
CAL = 512
NAMES = ("diag (shipped)", "basis, weights", "basis, weights, unshrunk", "basis, first 512 tokens")


def psd_pow(s: np.ndarray, p: float) -> np.ndarray:
    w, v = np.linalg.eigh(s)
    return (v * np.maximum(w, 1e-9 * w.max()) ** p) @ v.T


def rope_avg(s: np.ndarray, n: int, theta: np.ndarray, samples: int = 4096) -> np.ndarray:
    """Mean of R(p) S R(p)^T over positions 0 .. n - 1 (NEOX pairs (i, i + 128)), sampled."""
    p = np.linspace(0, n - 1, samples)
    c, sn = np.cos(np.outer(p, theta)), np.sin(np.outer(p, theta))
    ecc, ecs, ess = c.T @ c / samples, c.T @ sn / samples, sn.T @ sn / samples
    esc = ecs.T
    sxx, sxy, syx, syy = s[:H, :H], s[:H, H:], s[H:, :H], s[H:, H:]
    tl = ecc * sxx - ecs * sxy - esc * syx + ess * syy
    tr = ecs * sxx + ecc * sxy - ess * syx - esc * syy
    br = ess * sxx + esc * sxy + ecs * syx + ecc * syy
    return np.block([[tl, tr], [tr.T, br]])


def basis(sk: np.ndarray, sq: np.ndarray) -> np.ndarray:
    skh = psd_pow(sk, 0.5)
    m = psd_pow(sk, -0.5) @ psd_pow(skh @ sq @ skh, 0.5) @ psd_pow(sk, -0.5)
    a = psd_pow(m, 0.5)
    return a / np.exp(np.linalg.slogdet(a)[1] / D)


def weight_moments(reader: gguf.GGUFReader, il: int, n: int, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t = {x.name: x for x in reader.tensors if x.name.startswith(f"blk.{il}.")}

    def f(name: str) -> np.ndarray:
        x = t[f"blk.{il}.{name}"]
        return dequantize(x.data, x.tensor_type).astype(np.float64)

    ga, gq, gk = f("attn_norm.weight"), f("attn_q_norm.weight"), f("attn_k_norm.weight")

    def moment(w: np.ndarray, g: np.ndarray) -> np.ndarray:
        c = (w * ga**2) @ w.T
        return np.outer(g, g) * c * (D / np.trace(c))

    wq, wk = f("attn_q.weight"), f("attn_k.weight")
    sq = sum(moment(wq[h * D : (h + 1) * D], gq) for h in range(wq.shape[0] // D))
    return rope_avg(moment(wk, gk), n, theta), rope_avg(sq, n, theta)


def bases(cap: dict[str, np.ndarray], reader: gguf.GGUFReader, il: int, n: int, theta: np.ndarray) -> dict:
    tens = {x.name: np.array(x.data, dtype=np.float64) for x in reader.tensors if x.name.startswith(f"blk.{il}.")}
    k = cap[f"Kcur-{il}"][:, 0].astype(np.float64)
    kp = cap[f"Kcur_normed-{il}"][:, 0].astype(np.float64)
    qp = cap[f"Qcur_normed-{il}"].astype(np.float64) / np.sqrt(D)
    mu = np.where(np.tile(theta * n <= 1.0, 2), k[:CAL].mean(0), 0.0)  # the shipped mean: slow pairs only
    s_w = kt.eq_scale(kt.pair_mean(tens[f"blk.{il}.attn_q_norm.weight"] ** 2),
                      kt.pair_mean(tens[f"blk.{il}.attn_k_norm.weight"] ** 2))  # fmt: skip
    kc, qc = kp[:CAL] - mu, qp[:CAL].reshape(-1, D)
    sk_w, sq_w = weight_moments(reader, il, n, theta)
    return {
        "mu": mu,
        "diag (shipped)": np.diag(s_w),
        "basis, weights": basis(shrink(sk_w), shrink(sq_w)),
        "basis, weights, unshrunk": basis(sk_w, sq_w),
        "basis, first 512 tokens": basis(rope_avg(kc.T @ kc / CAL, n, theta), rope_avg(qc.T @ qc / len(qc), n, theta)),
    }


def needle_mass(q: np.ndarray, k: np.ndarray, start: int, n_tok: int) -> float:
    """The attention mass that queries q [H, D] put on keys start .. start + n_tok - 1 of k, the best head's."""
    lg = q @ k.T
    p = np.exp(lg - lg.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    return float(p[:, start : start + n_tok].sum(1).max())


def shrink(s: np.ndarray, f: float = 0.5) -> np.ndarray:
    """Off-diagonal entries times 1 - f (llama-tq-keys.cpp's shrink_offdiag)."""
    return (1 - f) * s + f * np.diag(np.diag(s))


def quantized(k: np.ndarray, mu: np.ndarray, a: np.ndarray, kind: str) -> np.ndarray:
    return np.linalg.solve(a, kt.tq((k - mu) @ a.T, kind).T).T + mu


def table(data: dict) -> str:
    """The markdown table of a run: per layer and key set (text), or per position and layer with the mean
    |log(mass / exact mass)| over them (needle)."""
    rows = data["rows"]
    if data["meta"]["mode"] == "text":
        keys = list(dict.fromkeys(r["keys"] for r in rows))
        out = ["| keys | " + " | ".join(f"L{il} attn KL | L{il} logit RMS" for il in GLOBAL) + " |",
               "|---|" + "---|---|" * len(GLOBAL)]  # fmt: skip
        for k in keys:
            by = {r["layer"]: r for r in rows if r["keys"] == k}
            out.append(
                f"| {k} | " + " | ".join(f"{by[il]['attn_kl']:.4f} | {by[il]['logit_rms']:.3f}" for il in GLOBAL) + " |"
            )
        return "\n".join(out)
    names = [f"tq3, {n}" for n in NAMES] + ["tq4, diag (shipped)"]
    out = ["| position | layer | exact | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    err: dict[str, list[float]] = {n: [] for n in names}
    for r in rows:
        for il in GLOBAL[:2]:  # layer 17 puts ~1 % on the needle with every key set
            ex = r[f"L{il} exact"]
            out.append(
                f"| {r['position']} | {il} | {ex:.3f} | " + " | ".join(f"{r[f'L{il} {n}']:.3f}" for n in names) + " |"
            )
            for n in names:
                err[n].append(abs(float(np.log(r[f"L{il} {n}"] / ex))))
    out.append(
        "| mean \\|log(mass / exact mass)\\| | | | " + " | ".join(f"**{np.mean(err[n]):.3f}**" for n in names) + " |"
    )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--mode", choices=["text", "needle"], default="text")
    ap.add_argument("--needle", default=niah.DEFAULT_NEEDLE)
    ap.add_argument("--positions", default="0.05,0.25,0.5,0.75,0.95")
    ap.add_argument("--out", type=Path, default=Path("out/key_basis"))
    ap.add_argument("--table", type=Path, help="print the markdown table of an earlier run's JSON and stop")
    args = ap.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return
    t0 = time.time()
    kt.WANT = re.compile(r"^[QKV]cur(_normed)?-(" + "|".join(map(str, GLOBAL)) + r")$")
    model = default_model()
    reader = gguf.GGUFReader(str(model))
    theta = float(reader.fields["gemma3.rope.freq_base"].parts[-1][0]) ** (-np.arange(H) * 2.0 / D)
    n = args.tokens
    rows: list[dict[str, object]] = []
    if args.mode == "text":
        cap = kt.capture(model, demo.default_text(), n)
        qpos = np.arange(n - 512, n)
        for il in GLOBAL:
            q = cap[f"Qcur-{il}"].astype(np.float64)[qpos] / np.sqrt(D)
            k = cap[f"Kcur-{il}"][:, 0].astype(np.float64)
            v = cap[f"Vcur-{il}"][:, 0].astype(np.float64)
            p0, _ = kt.attention(q, k, v, qpos, n + 1)
            causal = (np.arange(n)[None, :] <= qpos[:, None])[:, None, :]
            b = bases(cap, reader, il, n, theta)
            for name in NAMES:
                for kind in ("tq3", "tq4") if name == "diag (shipped)" else ("tq3",):
                    kh = quantized(k, b["mu"], b[name], kind)
                    p1, _ = kt.attention(q, kh, v, qpos, n + 1)
                    with np.errstate(divide="ignore", invalid="ignore"):
                        kl = np.where(p0 > 0, p0 * (np.log(p0) - np.log(np.maximum(p1, 1e-300))), 0.0).sum(-1).mean()
                    err = np.einsum("qhd,td->qht", q, kh - k)
                    rms = float(np.sqrt((err**2 * causal).sum() / causal.sum() / q.shape[1]))
                    rows.append({"layer": il, "keys": f"{kind}, {name}", "attn_kl": float(kl), "logit_rms": rms})
                    print(f"layer {il:2d} {kind} {name:24s} attn KL {kl:.4f}  logit error RMS {rms:.4f}", flush=True)
    else:
        needle = niah.Needle.parse(args.needle)
        count = niah.tokenizer_for(model)
        n_tok = count(needle.sentence) - 1
        for pos in args.positions.split(","):
            pr = niah.build_prompt(count, demo.default_text(), n - 20, needle, float(pos), "cloze")  # as the harness
            cap = kt.capture(model, pr.text, pr.tokens)
            row: dict[str, object] = {"position": float(pos), "needle_token": pr.needle_token, "tokens": pr.tokens}
            for il in GLOBAL:
                q = cap[f"Qcur-{il}"].astype(np.float64)[-1] / np.sqrt(D)  # the last prompt token's heads
                k = cap[f"Kcur-{il}"][:, 0].astype(np.float64)
                b = bases(cap, reader, il, n, theta)
                variants = {"exact": k}
                for name in NAMES:
                    variants[f"tq3, {name}"] = quantized(k, b["mu"], b[name], "tq3")
                variants["tq4, diag (shipped)"] = quantized(k, b["mu"], b["diag (shipped)"], "tq4")
                for name, kk in variants.items():
                    row[f"L{il} {name}"] = needle_mass(q, kk, pr.needle_token, n_tok)
            rows.append(row)
            print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"model": model.name, "tokens": n, "mode": args.mode, "seconds": round(time.time() - t0),
            "needle": args.needle if args.mode == "needle" else None}  # fmt: skip
    (args.out / f"{args.mode}_{n}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(table({"meta": meta, "rows": rows}))
    print(f"wrote {args.out / f'{args.mode}_{n}.json'}")


if __name__ == "__main__":
    main()
