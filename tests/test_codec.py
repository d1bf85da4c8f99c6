"""The C codec through its Python module, against targets, invariants and the NumPy reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llama_tq import _codec, validate
from llama_tq import reference as ref

pytestmark = pytest.mark.unit

KINDS = {"tq3": 3, "tq4": 4, "tq3_64": 3, "tq4_64": 4, "tq3_96": 3, "tq4_96": 4}
BLOCKS = {"tq3": 128, "tq4": 128, "tq3_64": 64, "tq4_64": 64, "tq3_96": 96, "tq4_96": 96}
GOLDEN = Path(__file__).with_name("data") / "golden_tq.npz"


def test_block_sizes() -> None:
    x = np.random.default_rng(0).standard_normal((3, 256)).astype(np.float32)
    assert _codec.quantize(x, "tq3").shape == (3, 2 * 52)
    assert _codec.quantize(x, "tq4").shape == (3, 2 * 68)
    assert _codec.quantize(x, "tq3_64").shape == (3, 4 * 28)
    assert _codec.quantize(x, "tq4_64").shape == (3, 4 * 36)
    x96 = x[:, :192]
    assert _codec.quantize(x96, "tq3_96").shape == (3, 2 * 40)  # 3.33 bits per value
    assert _codec.quantize(x96, "tq4_96").shape == (3, 2 * 52)  # 4.33 bits per value
    assert _codec.BLOCK_BYTES == {"tq3": 52, "tq4": 68, "tq3_64": 28, "tq4_64": 36, "tq3_96": 40, "tq4_96": 52}
    assert _codec.BLOCK_VALUES == BLOCKS


def test_one_format_table() -> None:
    """The formats come from one list (tq_formats.h): the module's table, its block sizes and the layout's sizes
    (a 4-byte header and values x bits of indices) agree, and every format quantizes through its own name."""
    names = [f["name"] for f in _codec.FORMATS]
    assert names == list(_codec.BLOCK_VALUES) == list(_codec.BLOCK_BYTES) == list(BLOCKS)
    for f in _codec.FORMATS:
        name, n, bits, nbytes = str(f["name"]), int(f["values"]), int(f["bits"]), int(f["bytes"])
        assert (n, nbytes) == (_codec.BLOCK_VALUES[name], _codec.BLOCK_BYTES[name])
        assert nbytes == 4 + n * bits // 8 and bits == int(name[2])
        x = np.random.default_rng(n).standard_normal((2, n)).astype(np.float32)
        assert _codec.quantize(x, name).shape == (2, nbytes)


@pytest.mark.parametrize(
    "kind,target",
    [("tq3", 0.0340), ("tq4", 0.0093), ("tq3_64", 0.0340), ("tq4_64", 0.0093), ("tq3_96", 0.0340), ("tq4_96", 0.0093)],
)
def test_mse_targets(kind: str, target: float) -> None:
    row = validate.measure(kind, n=10_000, seed=0)
    assert row.mse <= target, f"{kind} MSE {row.mse:.6f} above target {target}"
    # and within TurboQuant's proven band [4^-b, sqrt(3) pi / 2 * 4^-b]
    assert row.lower < row.mse < row.upper


def test_rotation_is_orthogonal() -> None:
    x = np.random.default_rng(1).standard_normal((500, 128)).astype(np.float32)
    y = _codec.rotate(x)
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), np.linalg.norm(x, axis=1), rtol=1e-6)
    np.testing.assert_allclose(_codec.unrotate(y), x, atol=1e-6)
    np.testing.assert_allclose(_codec.rotate(_codec.unrotate(x)), x, atol=1e-6)
    # it is exactly the documented matrix H * D / sqrt(128)
    np.testing.assert_allclose(y, x @ ref.rotation(1).T, atol=1e-5)
    # the 64-value blocks' own rotation: H_64 * D_64 / 8
    x64 = x.reshape(-1, 64)
    y64 = _codec.rotate(x64, block=64)
    np.testing.assert_allclose(y64, x64 @ ref.rotation(1, 64).T, atol=1e-5)
    np.testing.assert_allclose(_codec.unrotate(y64, block=64), x64, atol=1e-6)
    # the 96-value blocks': (Q kron H_32) * D_96 / sqrt(32), every output a mix of all 96 inputs
    x96 = x[:, :96].copy()
    y96 = _codec.rotate(x96, block=96)
    np.testing.assert_allclose(y96, x96 @ ref.rotation(1, 96).T, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(y96, axis=1), np.linalg.norm(x96, axis=1), rtol=1e-6)
    np.testing.assert_allclose(_codec.unrotate(y96, block=96), x96, atol=1e-6)
    assert np.all(ref.rotation(1, 96) != 0.0)
    with pytest.raises(ValueError, match="block must be 128, 64 or 96"):
        _codec.rotate(x, block=32)


def test_sign_pattern_matches_documented_derivation() -> None:
    np.testing.assert_array_equal(_codec.signs(), ref.sign_vector(0x5451))
    np.testing.assert_array_equal(_codec.signs(64), ref.sign_vector(ref.SIGN_SEED_64, 64))
    np.testing.assert_array_equal(_codec.signs(96), ref.sign_vector(ref.SIGN_SEED_96, 96))


@pytest.mark.parametrize("kind", KINDS)
def test_pack_unpack_every_index_pattern(kind: str) -> None:
    levels, n = 1 << KINDS[kind], BLOCKS[kind]
    rng = np.random.default_rng(2)
    patterns = [np.full(n, v, dtype=np.uint8) for v in range(levels)]  # every value at every position
    patterns += [np.arange(n, dtype=np.uint8) % levels, (np.arange(n, dtype=np.uint8) * 5 + 3) % levels]
    patterns += [rng.integers(0, levels, n, dtype=np.uint8) for _ in range(200)]
    for idx in patterns:
        packed = _codec.pack_indices(idx, kind)
        block = np.concatenate([np.zeros(4, np.uint8), packed])
        np.testing.assert_array_equal(_codec.unpack_indices(block, kind), idx)
        assert len(block) == _codec.BLOCK_BYTES[kind]
        ref_block = ref.pack(np.zeros(1), np.zeros((1, 4), np.uint8), idx[None, :], KINDS[kind])[0]
        np.testing.assert_array_equal(block, ref_block)  # same bytes as the documented layout
    with pytest.raises(ValueError):
        _codec.pack_indices(np.full(n, levels, dtype=np.uint8), kind)


@pytest.mark.parametrize("kind", KINDS)
def test_matches_numpy_reference(kind: str) -> None:
    bits, n = KINDS[kind], BLOCKS[kind]
    x = np.random.default_rng(3).standard_normal((2000, n)).astype(np.float32) * 3.0
    blocks = _codec.quantize(x, kind)
    scale_c, sub_c, idx_c = ref.unpack(blocks, bits, n)
    scale_r, sub_r, idx_r = ref.quantize(x, bits, block=n)
    # float32 (C) and float64 (NumPy) may disagree only on near-ties: a value on a cell boundary, or two
    # sub-block multipliers with almost the same error. Such blocks must be rare...
    differ = (sub_c != sub_r).any(axis=1) | (idx_c != idx_r).any(axis=1)
    assert differ.mean() < 0.01, f"{differ.mean():.2%} of blocks differ from the reference"
    # ...and where C chose differently, its choice must be as good as the reference's (to float32 precision).
    y = (x / np.linalg.norm(x.astype(np.float64), axis=1, keepdims=True)) @ ref.rotation(1, n).T
    for sub, idx in ((sub_c, idx_c), (sub_r, idx_r)):
        c = ref.SUBSCALES[np.repeat(sub, n // 4, axis=1)] * ref.book(bits, n).centroids[idx]
        err = np.sum(((y - c) ** 2).reshape(-1, 4, n // 4), axis=2)
        if sub is sub_c:
            err_c = err
        else:
            err_r = err
    np.testing.assert_allclose(err_c[differ], err_r[differ], rtol=1e-4, atol=1e-7)
    same = ~differ
    np.testing.assert_array_equal(scale_c[same], scale_r[same])  # bf16 bit patterns agree
    np.testing.assert_allclose(
        _codec.dequantize(blocks, kind), ref.dequantize(scale_c, sub_c, idx_c, bits, block=n), rtol=1e-5, atol=1e-5
    )


def _dequantize_in_c_float_order(blocks: np.ndarray, kind: str) -> np.ndarray:
    """The codec's dequantization in float32, operation by operation as the C reference defines it: c' = m * c[idx],
    the Walsh-Hadamard butterflies stage by stage, then * (1/sqrt(n) * sign), then * scale."""
    bits, n = KINDS[kind], BLOCKS[kind]
    scale, sub, idx = ref.unpack(blocks, bits, n)
    m = np.asarray(_codec.subscales(), np.float32)[np.repeat(sub, n // 4, axis=1)]  # the C tables' floats
    x = m * np.asarray(_codec.codebook(kind), np.float32)[idx]
    h = 1
    while h < n:
        v = x.reshape(len(x), n // (2 * h), 2, h)
        x = np.stack((v[:, :, 0] + v[:, :, 1], v[:, :, 0] - v[:, :, 1]), axis=2).reshape(len(x), n)
        h *= 2
    w = np.float32(1.0 / np.sqrt(n)) * np.asarray(_codec.signs(n), np.float32)
    return (x * w) * scale.astype(np.float32).reshape(-1, 1)  # a bf16 value: exact in float32


@pytest.mark.parametrize("kind", ["tq3", "tq4", "tq3_64", "tq4_64"])
def test_dequantize_is_bit_exact_to_the_reference_order(kind: str) -> None:
    # the fast paths (fixed n, registers for the first stages, signs as bit flips) must not change a single bit
    x = np.random.default_rng(5).standard_normal((3000, BLOCKS[kind])).astype(np.float32) * 5.0
    x[7] = 0.0
    x[8, 3] = 3e38
    blocks = _codec.quantize(x, kind)
    got = _codec.dequantize(blocks, kind)
    want = _dequantize_in_c_float_order(blocks, kind)
    assert got.dtype == np.float32 and want.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("kind", KINDS)
def test_golden_vectors(kind: str) -> None:
    g = np.load(GOLDEN)
    n = BLOCKS[kind]
    xg = g["x96"] if n == 96 else g["x"]  # the 96-value kinds: the first 96 values of each row
    got = _codec.quantize(xg, kind)
    np.testing.assert_array_equal(got, g[kind], err_msg="the bytes of the committed golden blocks changed")
    # the golden bytes decode, under the NumPy reference of the documented layout, to a good reconstruction
    scale, sub, idx = ref.unpack(g[kind].reshape(-1, _codec.BLOCK_BYTES[kind]), KINDS[kind], n)
    back = ref.dequantize(scale, sub, idx, KINDS[kind], block=n).reshape(xg.shape)
    x = xg.astype(np.float64)
    rel = np.sum((back - x) ** 2, axis=1) / np.sum(x * x, axis=1)
    assert np.all(rel < (0.06 if KINDS[kind] == 3 else 0.02))


@pytest.mark.parametrize("kind", KINDS)
def test_dot_rotated_equals_dot_of_dequantized(kind: str) -> None:
    rng = np.random.default_rng(4)
    k = rng.standard_normal(768).astype(np.float32)  # 768: whole blocks of 128, 64 and 96
    q = rng.standard_normal(768).astype(np.float32)
    blocks = _codec.quantize(k, kind)
    want = float(np.dot(_codec.dequantize(blocks, kind).astype(np.float64), q))
    got = _codec.dot_rotated(blocks, _codec.rotate(q, block=BLOCKS[kind]), kind)
    assert got == pytest.approx(want, rel=1e-4, abs=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_edge_cases(kind: str) -> None:
    W = 384  # whole blocks of every kind
    zero = np.zeros((1, W), np.float32)
    out = _codec.dequantize(_codec.quantize(zero, kind), kind)
    assert np.all(out == 0.0) and not np.isnan(out).any()

    tiny = np.random.default_rng(5).standard_normal((1, W)).astype(np.float32) * np.float32(1e-41)
    back = _codec.dequantize(_codec.quantize(tiny, kind), kind)
    assert np.all(np.isfinite(back))
    b64, t64 = back[0].astype(np.float64) * 1e40, tiny[0].astype(np.float64) * 1e40
    cos = np.dot(b64, t64) / (np.linalg.norm(b64) * np.linalg.norm(t64))
    assert 0.9 < cos <= 1.0 + 1e-9  # the direction survives subnormal input

    huge = np.full((1, W), 3.0e38, np.float32)
    blk = _codec.quantize(huge, kind)
    assert blk[0, :2].view("<u2")[0] == 0x7E7D  # scale saturated at TQ_SCALE_MAX (tq_codec.h)
    assert np.all(np.isfinite(_codec.dequantize(blk, kind)))
    # one value at or near FLT_MAX, the rest small or zero: the worst case for the decoded spike (it used to be Inf
    # for tq4 / tq4_64, whose largest centroids reach furthest)
    fmax = np.finfo(np.float32).max
    for spike in (fmax, -fmax, np.float32(3.397e38)):
        for rest in (0.0, 1.0):
            x = np.full((1, W), rest, np.float32)
            x[0, 3] = spike
            dec = _codec.dequantize(_codec.quantize(x, kind), kind)
            assert np.all(np.isfinite(dec)), (kind, spike, rest)
            assert abs(dec[0, 3]) > 1e37 and np.sign(dec[0, 3]) == np.sign(spike)

    for bad in (np.nan, np.inf, -np.inf):
        x = np.ones((2, W), np.float32)
        x[1, 7] = bad
        dec = _codec.dequantize(_codec.quantize(x, kind), kind)
        n = BLOCKS[kind]  # value 7 lies in the row's first block
        assert np.all(np.isnan(dec[1, :n])), "a block with NaN/Inf decodes as NaN"
        assert np.all(np.isfinite(dec[0])) and np.all(np.isfinite(dec[1, n:])), "other blocks are untouched"


def test_bad_shapes_and_kinds() -> None:
    with pytest.raises(ValueError, match="multiple of 128"):
        _codec.quantize(np.zeros((2, 100), np.float32), "tq3")
    with pytest.raises(ValueError, match="multiple of 52"):
        _codec.dequantize(np.zeros(50, np.uint8), "tq3")
    with pytest.raises(ValueError, match="unknown TurboQuant kind"):
        _codec.quantize(np.zeros(128, np.float32), "tq5")
    with pytest.raises(ValueError, match="unknown TurboQuant kind"):
        _codec.quantize(np.zeros(128, np.float32), "tq3_32")
    with pytest.raises(ValueError, match="multiple of 64"):
        _codec.quantize(np.zeros((2, 96), np.float32), "tq3_64")
    with pytest.raises(ValueError, match="multiple of 28"):
        _codec.dequantize(np.zeros(30, np.uint8), "tq3_64")
    with pytest.raises(ValueError, match="multiple of 96"):
        _codec.quantize(np.zeros((2, 128), np.float32), "tq3_96")
    with pytest.raises(ValueError):
        _codec.rotate(np.zeros(64, np.float32))


def test_multidimensional_arrays_keep_their_shape() -> None:
    x = np.random.default_rng(6).standard_normal((2, 3, 384)).astype(np.float32)
    for kind in KINDS:
        b = _codec.quantize(x, kind)
        assert b.shape[:2] == (2, 3)
        assert _codec.dequantize(b, kind).shape == x.shape
