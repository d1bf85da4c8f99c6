"""Regenerate tests/data/golden_tq.npz from the C codec (only when the layout changes on purpose).

python tests/make_golden.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llama_tq import _codec


def golden_inputs() -> np.ndarray:
    rng = np.random.default_rng(2504_19874)
    rows = [
        rng.standard_normal(128),  # plain Gaussian
        rng.standard_normal(128) * 1e-3 + 5.0,  # large common offset
        np.eye(128)[17] * 3.0,  # one-hot
        rng.laplace(size=128) * 40.0,  # heavy tails, larger scale
        np.linspace(-1.0, 1.0, 128),  # smooth ramp
        rng.standard_normal(128) * 1e-30,  # tiny norm
        np.where(np.arange(128) % 3 == 0, 2.0, -0.5),  # periodic pattern
        rng.standard_normal(128) * np.r_[np.full(4, 30.0), np.ones(124)],  # outlier channels
    ]
    return np.asarray(rows, dtype=np.float32)


def main() -> None:
    x = golden_inputs()
    out = Path(__file__).with_name("data") / "golden_tq.npz"
    kinds = ("tq3", "tq4", "tq3_64", "tq4_64")  # the 64-value kinds take each 128-row as two blocks
    x96 = np.ascontiguousarray(x[:, :96])  # the 96-value kinds: the first 96 values of each row, one block
    blocks = {k: _codec.quantize(x, k) for k in kinds} | {k: _codec.quantize(x96, k) for k in ("tq3_96", "tq4_96")}
    np.savez(out, x=x, x96=x96, **blocks)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
