"""Issue-14 groundwork: which TQ block fits head 64? MSE of candidate 64-value layouts next to padding to 128,
the shipped 128-value types and q4_0, with bits per value (NumPy; the shipped types through llama_tq.reference).

    python bench/head64_codec.py   # writes bench/results/head64_codec.{md,json}

A 64-value block uses its own 64-point randomized Hadamard rotation and the Lloyd-Max codebook of the d = 64
coordinate law (codebook_solver.solve(bits, dim=64)); the scale is the least-squares one rounded to bfloat16, as in
the 128-value codec. MSE = ||x - x_hat||^2 / ||x||^2 averaged over 10,000 vectors of 64 values.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np

from llama_tq import _codec
from llama_tq import reference as ref
from llama_tq.tooling.codebook_solver import Codebook, solve, subscales

ROOT = Path(__file__).resolve().parents[1]
N = 10_000
D = 64


@cache
def rotation64() -> np.ndarray:
    word = ref.splitmix64(0x5464, 1)[0]
    signs = np.array([-1.0 if (word >> i) & 1 else 1.0 for i in range(D)])
    return ref.hadamard(D) @ np.diag(signs)


@cache
def codebook64(bits: int) -> Codebook:
    return solve(bits, dim=D)


def round_mantissa(v: np.ndarray, mbits: int) -> np.ndarray:
    """v rounded to mbits explicit mantissa bits (exponent kept): a scale stored in 8 + mbits bits (v >= 0)."""
    m, e = np.frexp(v)
    return np.ldexp(np.round(m * 2.0 ** (mbits + 1)) / 2.0 ** (mbits + 1), e)


def quantize64(x: np.ndarray, bits: int, n_sub: int, n_mult: int = 16, scale_mbits: int = 7) -> np.ndarray:
    """Round trip of a 64-value block: least-squares scale with scale_mbits mantissa bits (7: bfloat16), n_sub
    sub-blocks choosing among n_mult of the codec's multipliers (n_sub 0: none)."""
    book = codebook64(bits)
    rot = rotation64()
    norm = np.linalg.norm(x, axis=1)
    y = np.divide(x, norm[:, None], out=np.zeros_like(x), where=norm[:, None] > 0) @ rot.T
    mults = subscales()[np.linspace(0, 15, n_mult).round().astype(int)] if n_sub else np.ones(1)
    groups = max(n_sub, 1)
    ys = y.reshape(len(x), groups, D // groups)
    best = np.full(ys.shape[:2], np.inf)
    c = np.zeros_like(ys)
    for m in mults:
        cand = m * book.centroids[np.searchsorted(m * book.boundaries, ys)]
        err = np.sum((ys - cand) ** 2, axis=2)
        win = err < best
        best = np.where(win, err, best)
        c = np.where(win[..., None], cand, c)
    c = c.reshape(len(x), D)
    scale = norm * np.sum(y * c, axis=1) / np.sum(c * c, axis=1)
    scale = ref.from_bf16(ref.to_bf16(scale)) if scale_mbits == 7 else round_mantissa(scale, scale_mbits)
    return scale[:, None] * (c @ rot)


def pad128(x: np.ndarray, bits: int) -> np.ndarray:
    """Zero-pad each 64-vector to a 128-value block of the shipped type (what other forks do)."""
    xp = np.concatenate([x, np.zeros_like(x)], axis=1)
    s, sub, idx = ref.quantize(xp, bits)
    return ref.dequantize(s, sub, idx, bits)[:, :D]


def rel_mse(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.sum((x - y) ** 2, axis=1) / np.sum(x * x, axis=1)))


def main() -> None:
    rng = np.random.default_rng(0)
    data = {"gaussian": rng.standard_normal((N, D))}
    outl = rng.standard_normal((N, D))
    outl[:, rng.choice(D, 2, replace=False)] *= 20.0  # a few dominant channels, as in real K caches
    data["outlier channels"] = outl
    g128 = rng.standard_normal((N, 128))
    rows: list[dict[str, object]] = []
    for bits in (3, 4):
        idx_bytes = D * bits // 8
        variants = {  # name: (bytes per 64 values, round trip)
            f"tq{bits}_64: bf16 scale + indices": (2 + idx_bytes, lambda x, b=bits: quantize64(x, b, 0)),
            f"tq{bits}_64: + 2 sub-block multipliers (1 byte)": (3 + idx_bytes, lambda x, b=bits: quantize64(x, b, 2)),
            f"tq{bits}_64: 12-bit scale + 2 sub-blocks x 4 multipliers": (
                2 + idx_bytes,
                lambda x, b=bits: quantize64(x, b, 2, 4, 3),
            ),
            f"tq{bits}_64: 12-bit scale + 1 block x 16 multipliers": (
                2 + idx_bytes,
                lambda x, b=bits: quantize64(x, b, 1, 16, 3),
            ),
            f"tq{bits}_64: the 128-value header (bf16 + 4 sub-blocks of 16)": (
                4 + idx_bytes,
                lambda x, b=bits: quantize64(x, b, 4),
            ),
            f"tq{bits}: padded to 128": (ref_bytes(bits), lambda x, b=bits: pad128(x, b)),
        }
        for name, (nbytes, fn) in variants.items():
            rows.append({"variant": name, "bits/value": 8 * nbytes / D, "bytes": nbytes,
                         **{k: rel_mse(x, fn(x)) for k, x in data.items()}})  # fmt: skip
        kind = f"tq{bits}_64"  # the variant the C codec ships (the 128-value header on 64 values)
        rows.append({"variant": f"{kind} (C codec, shipped)", "bits/value": 8 * ref_bytes(bits, 64) / D,
                     "bytes": ref_bytes(bits, 64),
                     **{k: rel_mse(x, _codec.dequantize(_codec.quantize(x.astype(np.float32), kind), kind))
                        for k, x in data.items()}})  # fmt: skip
        s, sub, idx = ref.quantize(g128, bits)
        mse128 = rel_mse(g128, ref.dequantize(s, sub, idx, bits))
        rows.append({"variant": f"tq{bits} (shipped, head 128)", "bits/value": 8 * ref_bytes(bits) / 128,
                     "bytes": ref_bytes(bits),
                     "gaussian": mse128, "outlier channels": None})  # fmt: skip
    rows.append({"variant": "q4_0", "bits/value": 4.5, "bytes": 18,
                 **{k: rel_mse(x, ref.q4_0_roundtrip(x)) for k, x in data.items()}})  # fmt: skip
    out = ROOT / "bench" / "results"
    (out / "head64_codec.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = ["# Head 64: candidate TQ blocks (issue 14 groundwork)", "",
             "`python bench/head64_codec.py`: relative MSE over 10,000 vectors of 64 values",
             "(the head-128 rows: 128-value blocks).",
             "Block bytes that are a multiple of 4 load as 32-bit words on GPUs (CUDA/Metal kernels read TQ blocks as",
             "words); the others need byte loads or funnel shifts across word boundaries.", "",
             "| variant | bytes | bits/value | MSE gaussian | MSE outlier channels |",
             "|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        o = r["outlier channels"]
        lines.append(f"| {r['variant']} | {r['bytes']} | {r['bits/value']:.3f} | {r['gaussian']:.5f} | "
                     + (f"{o:.5f} |" if isinstance(o, float) else "- |"))  # fmt: skip
    lines += ["", "Shipped in the C codec (`tq_codec.h`, kinds `tq3_64` / `tq4_64`): the 128-value header on 64 values",
              "(28 / 36 bytes, 3.5 / 4.5 bits). Of the candidates it has the lowest MSE (below tq3 / tq4 at 128), its",
              "blocks are whole 32-bit words (what the GPU kernels load), and it keeps the 128-value code paths (one",
              "header, 4 sub-blocks). The 3.25-bit candidates keep tq3's bytes per value at a higher MSE; padding a",
              "64-value head to a 128-value block doubles the bytes."]  # fmt: skip
    (out / "head64_codec.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def ref_bytes(bits: int, block: int = 128) -> int:
    return int(_codec.BLOCK_BYTES[f"tq{bits}" + ("" if block == 128 else f"_{block}")])


if __name__ == "__main__":
    main()
