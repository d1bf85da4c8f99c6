"""TQ3A, the grouped key format (tq_codec.h): the C codec against the independent NumPy reference, its invariants and
its edge cases."""

from __future__ import annotations

import numpy as np
import pytest

from llama_tq import _codec
from llama_tq import reference as ref
from llama_tq.tooling.codebook_solver import solve

pytestmark = pytest.mark.unit


def keys(rows: int, seed: int) -> np.ndarray:
    """Gaussian rows with norms over two decades, a quarter of them with a falling energy profile (as the ordered
    keys the format is for)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 256)) * rng.uniform(0.1, 10.0, (rows, 1))
    x[: rows // 4] *= np.linspace(3.0, 0.2, 256)
    return x.astype(np.float32)


def test_layout() -> None:
    groups = [(int(g["values"]), int(g["bits"])) for g in _codec.TQ3A_GROUPS]
    assert groups == [(n, b) for _, n, b in ref.TQ3A_GROUPS] == [(32, 5), (32, 4), (64, 3), (128, 2)]
    side = 4 * 16 + 8 * 4  # four bf16 scales, eight 4-bit multipliers
    assert _codec.TQ3A_BLOCK_BYTES == (sum(n * b for n, b in groups) + side) // 8 == 104
    assert _codec.TQ3A_BLOCK_BYTES * 8 / 256 == 3.25  # tq3's bits a value
    assert _codec.quantize(keys(3, 0), "tq3a").shape == (3, 104)
    with pytest.raises(ValueError, match="not a multiple of 256"):
        _codec.quantize(np.zeros((1, 128), np.float32), "tq3a")


def test_bytes_match_numpy_reference() -> None:
    """The C codec writes the reference's bytes (float32 vs float64 arithmetic may break a near-tie in a rare block:
    allow 0.5 %)."""
    x = keys(4000, 1)
    c, r = _codec.quantize(x, "tq3a"), ref.tq3a_quantize(x)
    differ = np.any(c != r, axis=1)
    assert differ.mean() <= 0.005, f"{differ.mean():.2%} of blocks differ from the reference"
    np.testing.assert_allclose(_codec.dequantize(c, "tq3a"), ref.tq3a_dequantize(c), rtol=1e-5, atol=1e-5)


def test_group_errors_follow_their_widths() -> None:
    """Each group's relative error is within its codebook's unit-vector MSE (the multipliers only lower it), and
    falls by ~4x a bit."""
    x = keys(4000, 2)
    xh = _codec.dequantize(_codec.quantize(x, "tq3a"), "tq3a")
    errs = []
    for off, n, bits in ref.TQ3A_GROUPS:
        xs, es = x[:, off : off + n].astype(np.float64), (xh - x)[:, off : off + n].astype(np.float64)
        rel = float(np.mean(np.sum(es**2, axis=1) / np.sum(xs**2, axis=1)))
        assert rel < solve(bits, dim=n).unit_vector_mse
        errs.append(rel)
    assert errs[0] < errs[1] < errs[2] < errs[3]
    assert errs[3] / errs[2] > 3.0


def test_rotated_domain_and_dot() -> None:
    rng = np.random.default_rng(3)
    q = rng.standard_normal((5, 256)).astype(np.float32)
    qr = _codec.tq3a_rotate(q)
    np.testing.assert_allclose(np.linalg.norm(qr, axis=1), np.linalg.norm(q, axis=1), rtol=1e-6)
    np.testing.assert_allclose(_codec.tq3a_unrotate(qr), q, atol=1e-5)
    for g, (off, n, _) in enumerate(ref.TQ3A_GROUPS):
        np.testing.assert_allclose(qr[:, off : off + n], q[:, off : off + n] @ ref.tq3a_rotation(g).T, atol=1e-5)
    blocks = _codec.quantize(keys(64, 4), "tq3a")
    deq = _codec.dequantize(blocks, "tq3a")
    np.testing.assert_allclose(_codec.tq3a_unrotate(_codec.tq3a_dequantize_rotated(blocks)), deq, atol=1e-4)
    for i in range(64):
        row = blocks[i : i + 1].reshape(-1)
        assert _codec.dot_rotated(row, qr[i % 5], "tq3a") == pytest.approx(float(deq[i] @ q[i % 5]), rel=1e-4, abs=1e-3)


def test_edge_cases() -> None:
    zero = np.zeros((1, 256), np.float32)
    np.testing.assert_array_equal(_codec.dequantize(_codec.quantize(zero, "tq3a"), "tq3a"), zero)
    poisoned = keys(1, 5)
    poisoned[0, 200] = np.nan  # in the last group: every group decodes to NaN
    assert np.isnan(_codec.dequantize(_codec.quantize(poisoned, "tq3a"), "tq3a")).all()
    poisoned[0, 200] = np.inf
    assert np.isnan(_codec.dequantize(_codec.quantize(poisoned, "tq3a"), "tq3a")).all()
    huge = np.zeros((1, 256), np.float32)
    fmax = np.finfo(np.float32).max
    huge[0, [0, 40, 100, 255]] = [fmax, -fmax, fmax, fmax]  # one in every group
    with np.errstate(over="ignore"):
        assert np.isfinite(_codec.dequantize(_codec.quantize(huge, "tq3a"), "tq3a")).all()
    tiny = np.full((1, 256), 1e-44, np.float32)  # subnormal: the direction is kept
    back = _codec.dequantize(_codec.quantize(tiny, "tq3a"), "tq3a")
    assert np.all(back >= 0)
    with pytest.raises(ValueError, match="per group"):
        _codec.codebook("tq3a")
