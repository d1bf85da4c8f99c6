"""`llama_tq.validate()`: the codec's measured MSE against TurboQuant's theoretical bounds."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from . import _codec

# Issue targets (paper / ik_llama measurements were 0.0341 and 0.00925); the 64- and 96-value blocks (heads that are
# not a multiple of 128) must do at least as well on unit vectors of R^64 / R^96.
TARGET_MSE = {"tq3": 0.0340, "tq4": 0.0093, "tq3_64": 0.0340, "tq4_64": 0.0093, "tq3_96": 0.0340, "tq4_96": 0.0093}
KINDS = tuple(TARGET_MSE)


@dataclass(frozen=True)
class MseRow:
    kind: str
    bits: int
    dim: int
    vectors: int
    mse: float
    lower: float  # 4^-b: no b-bit quantizer of unit vectors does better (paper, Thm. 3)
    upper: float  # sqrt(3) * pi / 2 * 4^-b: TurboQuant's proven bound
    target: float

    @property
    def ratio(self) -> float:
        return self.mse / self.lower

    @property
    def ok(self) -> bool:
        return self.mse <= self.target


def random_unit_vectors(n: int, seed: int = 0, dim: int = 128) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def measure(kind: str, n: int = 10_000, seed: int = 0) -> MseRow:
    bits = int(kind[2])
    dim = int(_codec.BLOCK_VALUES[kind])
    x = random_unit_vectors(n, seed, dim)
    y = _codec.dequantize(_codec.quantize(x, kind), kind)
    mse = float(np.mean(np.sum((x.astype(np.float64) - y) ** 2, axis=1)))
    lower = 4.0**-bits
    return MseRow(kind, bits, dim, n, mse, lower, math.sqrt(3) * math.pi / 2 * lower, TARGET_MSE[kind])


def validate(n: int = 10_000, seed: int = 0, quiet: bool = False) -> list[dict[str, float | int | str | bool]]:
    """Measure the MSE of every TQ block (tq3/tq4 on R^128, tq3_64/tq4_64 on R^64, tq3_96/tq4_96 on R^96) on n
    random unit vectors (fixed seed) and print the table against theory."""
    rows = [measure(k, n, seed) for k in KINDS]
    if not quiet:
        print(f"TurboQuant MSE on {n} random unit vectors of each block's size (seed {seed})")
        print(
            f"{'type':<7} {'dim':>4} {'bits':>4} {'MSE':>9} {'4^-b':>9} {'bound':>9} {'MSE/4^-b':>9} {'target':>8}  ok"
        )
        for r in rows:
            print(
                f"{r.kind:<7} {r.dim:>4} {r.bits:>4} {r.mse:>9.6f} {r.lower:>9.6f} {r.upper:>9.6f} {r.ratio:>9.3f} "
                f"{r.target:>8.4f}  {'yes' if r.ok else 'NO'}"
            )
    return [{**asdict(r), "ratio": r.ratio, "ok": r.ok} for r in rows]
