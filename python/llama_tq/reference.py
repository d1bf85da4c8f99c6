"""Independent NumPy reference of the TurboQuant codec, written from the layout spec in csrc/codec/tq_codec.h.

It shares no code with the C implementation: the sign pattern is re-derived from splitmix64, the
Hadamard matrix is built by Sylvester's construction, and the arithmetic is float64 matrix algebra.
Options beyond the shipped design (two rotation rounds, the plain L2 norm or the inner-product-preserving scale,
the spec layout without sub-block multipliers) exist for bench/codec_design.py.
"""

from __future__ import annotations

import numpy as np

from llama_tq.tooling.codebook_solver import Codebook, solve, subscales

BLOCK = 128
_M64 = (1 << 64) - 1


def splitmix64(seed: int, n: int) -> list[int]:
    out, s = [], seed
    for _ in range(n):
        s = (s + 0x9E3779B97F4A7C15) & _M64
        z = s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        out.append(z ^ (z >> 31))
    return out


def sign_vector(seed: int = 0x5451, block: int = BLOCK) -> np.ndarray:
    bits = 0
    for k, word in enumerate(splitmix64(seed, -(-block // 64))):
        bits |= word << (64 * k)
    return np.array([-1.0 if (bits >> i) & 1 else 1.0 for i in range(block)])


def hadamard(n: int = BLOCK) -> np.ndarray:
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


H = hadamard()
D1 = sign_vector()
D2 = sign_vector(0x5452)  # second round, only for the design measurement
_BOOKS = {3: solve(3), 4: solve(4)}
# 64-value blocks (tq3_64 / tq4_64): their own rotation (signs from seed 0x5464) and the d = 64 codebooks
SIGN_SEED_64 = 0x5464
_BOOKS_64 = {3: solve(3, dim=64), 4: solve(4, dim=64)}
# 96-value blocks (tq3_96 / tq4_96): (Q kron H_32) D with the 3x3 orthogonal Q below, signs from seed 0x5496
SIGN_SEED_96 = 0x5496
MIX3 = np.array([[1.0, 2.0, 2.0], [2.0, 1.0, -2.0], [2.0, -2.0, 1.0]]) / 3.0
_BOOKS_96 = {3: solve(3, dim=96), 4: solve(4, dim=96)}


def book(bits: int, block: int = BLOCK) -> Codebook:
    return {BLOCK: _BOOKS, 64: _BOOKS_64, 96: _BOOKS_96}[block][bits]


def rotation(rounds: int = 1, block: int = BLOCK) -> np.ndarray:
    if block == 96:
        return np.kron(MIX3, hadamard(32)) @ np.diag(sign_vector(SIGN_SEED_96, 96))
    if block != BLOCK:
        return hadamard(block) @ np.diag(sign_vector(SIGN_SEED_64, block))
    r = H @ np.diag(D1)
    if rounds == 2:
        r = H @ np.diag(D2) @ r
    return r


SUBSCALES = subscales()


def to_bf16(v: np.ndarray) -> np.ndarray:
    """float64 -> bfloat16 bit patterns (via float32, round to nearest even), as uint16."""
    u = np.asarray(v, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return r.astype(np.uint16)


def from_bf16(h: np.ndarray) -> np.ndarray:
    return (np.asarray(h, dtype=np.uint32) << 16).view(np.float32).astype(np.float64)


def quantize(
    x: np.ndarray, bits: int, rounds: int = 1, scale: str = "ls", subscaled: bool = True, block: int = BLOCK
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x: (n, block). Returns (scale (n,), sub-scale indices (n, 4), idx (n, block)).

    scale: "ls" (shipped) the least-squares n <y, c> / <c, c>; "ip" n / <y, c>, inner-product preserving
    (<x_hat, x> = |x|^2, measured and not adopted: bench/results/codec_scale/README.md); "norm" the plain L2 norm.
    subscaled=False, scale="norm" is the paper's spec layout."""
    x = np.asarray(x, dtype=np.float64)
    cb = book(bits, block)
    norm = np.linalg.norm(x, axis=1)
    u = np.divide(x, norm[:, None], out=np.zeros_like(x), where=norm[:, None] > 0)
    y = u @ rotation(rounds, block).T
    n = len(x)
    mults = SUBSCALES if subscaled else np.ones(1)
    ys = y.reshape(n, 4, block // 4)
    best_err = np.full((n, 4), np.inf)
    sub = np.zeros((n, 4), dtype=np.int64)
    idx = np.zeros((n, 4, block // 4), dtype=np.int64)
    for j, m in enumerate(mults):
        cand = np.searchsorted(m * cb.boundaries, ys, side="left")
        err = np.sum((ys - m * cb.centroids[cand]) ** 2, axis=2)
        win = err < best_err
        best_err = np.where(win, err, best_err)
        sub = np.where(win, j, sub)
        idx = np.where(win[..., None], cand, idx)
    c = (mults[sub][..., None] * cb.centroids[idx]).reshape(n, block)
    yc = np.sum(y * c, axis=1)
    if scale == "ip":
        s = np.divide(norm, yc, out=np.zeros_like(norm), where=yc > 0)
    elif scale == "ls":
        s = norm * yc / np.sum(c * c, axis=1)
    elif scale == "norm":
        s = norm
    else:
        raise ValueError(f"unknown scale {scale!r} (ip, ls, norm)")
    if subscaled:
        s = from_bf16(to_bf16(s))
    return s, sub.astype(np.uint8), idx.reshape(n, block).astype(np.uint8)


def dequantize(
    scale: np.ndarray, sub: np.ndarray, idx: np.ndarray, bits: int, rounds: int = 1, block: int = BLOCK
) -> np.ndarray:
    mult = SUBSCALES[np.repeat(sub, block // 4, axis=1)] if sub.size else 1.0
    c = mult * book(bits, block).centroids[idx]
    return scale[:, None] * (c @ rotation(rounds, block))


def pack(scale: np.ndarray, sub: np.ndarray, idx: np.ndarray, bits: int) -> np.ndarray:
    """Blocks as bytes, per the layout documented in csrc/codec/tq_codec.h (the block size is idx's width)."""
    n, block = idx.shape
    subs = np.sum(sub.astype(np.uint32) << (4 * np.arange(4, dtype=np.uint32)), axis=1)
    head = np.stack([to_bf16(scale), subs.astype(np.uint16)], axis=1).astype("<u2").view(np.uint8).reshape(n, 4)
    if bits == 4:
        body = (idx[:, : block // 2] | (idx[:, block // 2 :] << 4)).astype(np.uint8)
    else:
        g = idx.reshape(n, block // 8, 8).astype(np.uint32)
        w = np.sum(g << (3 * np.arange(8, dtype=np.uint32)), axis=2)
        body = np.stack([w & 0xFF, (w >> 8) & 0xFF, (w >> 16) & 0xFF], axis=2).reshape(n, -1).astype(np.uint8)
    return np.concatenate([head, body], axis=1)


def unpack(blocks: np.ndarray, bits: int, block: int = BLOCK) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = blocks.shape[0]
    head = blocks[:, :4].copy().view("<u2").reshape(n, 2)
    scale = from_bf16(head[:, 0])
    sub = ((head[:, 1:2].astype(np.uint32) >> (4 * np.arange(4, dtype=np.uint32))) & 15).astype(np.uint8)
    body = blocks[:, 4:]
    if bits == 4:
        idx = np.concatenate([body & 15, body >> 4], axis=1)
    else:
        b = body.reshape(n, block // 8, 3).astype(np.uint32)
        w = b[:, :, 0] | (b[:, :, 1] << 8) | (b[:, :, 2] << 16)
        idx = ((w[:, :, None] >> (3 * np.arange(8, dtype=np.uint32))) & 7).reshape(n, block)
    return scale, sub, idx.astype(np.uint8)


def q4_0_roundtrip(x: np.ndarray) -> np.ndarray:
    """ggml's q4_0 (per-32 absmax scale, levels -8..7) in NumPy, for the comparison in the design bench."""
    b = np.asarray(x, dtype=np.float64).reshape(-1, 32)
    amax_i = np.argmax(np.abs(b), axis=1)
    m = b[np.arange(len(b)), amax_i]
    d = m / -8.0
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    q = np.clip(np.floor(b * inv[:, None] + 8.5), 0, 15)
    d16 = d.astype(np.float16).astype(np.float64)  # the stored scale is fp16
    return ((q - 8) * d16[:, None]).reshape(np.shape(x))


# TQ3A (tq_codec.h): 256-value key blocks in four groups (first value, values, bits), each coded as a block of its
# own size with its own rotation (signs: bits off..off+n-1 of splitmix64 seeded 0x54A3) and the d = n codebook.
TQ3A_SIGN_SEED = 0x54A3
TQ3A_GROUPS = ((0, 32, 5), (32, 32, 4), (64, 64, 3), (128, 128, 2))
TQ3A_BYTES = 104
_TQ3A_QOFF = (12, 32, 48, 72)  # first byte of each group's indices


_TQ3A_BOOKS: list[Codebook] = []  # solved on first use (the d = 32 books take a second)


def tq3a_book(g: int) -> Codebook:
    """Group g's codebook: the d = n coordinate law at its width."""
    if not _TQ3A_BOOKS:
        _TQ3A_BOOKS.extend(solve(bits, dim=n) for _, n, bits in TQ3A_GROUPS)
    return _TQ3A_BOOKS[g]


def tq3a_rotation(g: int) -> np.ndarray:
    """Group g's rotation y = H D x / sqrt(n)."""
    off, n, _ = TQ3A_GROUPS[g]
    return hadamard(n) @ np.diag(sign_vector(TQ3A_SIGN_SEED, 256)[off : off + n])


def tq3a_quantize(x: np.ndarray) -> np.ndarray:
    """x: (N, 256) -> (N, 104) uint8 blocks, from the layout spec (float64 algebra, finite input)."""
    x = np.asarray(x, dtype=np.float64)
    n_rows = len(x)
    out = np.zeros((n_rows, TQ3A_BYTES), np.uint8)
    subs = np.zeros(n_rows, np.uint64)
    for g, (off, n, bits) in enumerate(TQ3A_GROUPS):
        cb = tq3a_book(g)
        xg = x[:, off : off + n]
        norm = np.linalg.norm(xg, axis=1)
        u = np.divide(xg, norm[:, None], out=np.zeros_like(xg), where=norm[:, None] > 0)
        y = (u @ tq3a_rotation(g).T).reshape(n_rows, n // 32, 32)
        best = np.full(y.shape[:2], np.inf)
        sub = np.zeros(y.shape[:2], np.int64)
        idx = np.zeros(y.shape, np.int64)
        for j, m in enumerate(SUBSCALES):
            cand = np.searchsorted(m * cb.boundaries, y, side="left")
            err = np.sum((y - m * cb.centroids[cand]) ** 2, axis=2)
            win = err < best
            best, sub = np.where(win, err, best), np.where(win, j, sub)
            idx = np.where(win[..., None], cand, idx)
        c = SUBSCALES[sub][..., None] * cb.centroids[idx]
        s = norm * np.sum(y * c, axis=(1, 2)) / np.sum(c * c, axis=(1, 2))
        out[:, 2 * g : 2 * g + 2] = to_bf16(s).astype("<u2")[:, None].view(np.uint8)
        for k in range(n // 32):
            subs |= sub[:, k].astype(np.uint64) << np.uint64(4 * (off // 32 + k))
        out[:, _TQ3A_QOFF[g] : _TQ3A_QOFF[g] + n * bits // 8] = _tq3a_pack(idx.reshape(n_rows, n), bits)
    out[:, 8:12] = subs.astype("<u4")[:, None].view(np.uint8)
    return out


def _tq3a_pack(idx: np.ndarray, bits: int) -> np.ndarray:
    n_rows, n = idx.shape
    idx = idx.astype(np.uint64)
    if bits == 4:
        return (idx[:, : n // 2] | (idx[:, n // 2 :] << np.uint64(4))).astype(np.uint8)
    if bits == 2:
        q = n // 4
        packed = np.zeros((n_rows, q), np.uint64)
        for k in range(4):
            packed |= idx[:, k * q : (k + 1) * q] << np.uint64(2 * k)
        return packed.astype(np.uint8)
    per = {5: 5, 3: 3}[bits]  # bytes of 8 indices
    w = np.sum(idx.reshape(n_rows, n // 8, 8) << (np.uint64(bits) * np.arange(8, dtype=np.uint64)), axis=2)
    return (
        np.stack([(w >> np.uint64(8 * t)) & np.uint64(0xFF) for t in range(per)], axis=2)
        .reshape(n_rows, -1)
        .astype(np.uint8)
    )


def tq3a_unpack(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(N, 104) blocks -> (scales (N, 4), multiplier indices (N, 8), indices (N, 256))."""
    blocks = np.asarray(blocks, np.uint8)
    n_rows = len(blocks)
    scale = from_bf16(blocks[:, :8].copy().view("<u2"))
    subs = blocks[:, 8:12].copy().view("<u4")[:, 0].astype(np.uint64)
    sub = ((subs[:, None] >> (np.uint64(4) * np.arange(8, dtype=np.uint64))) & np.uint64(15)).astype(np.uint8)
    idx = np.zeros((n_rows, 256), np.uint8)
    for g, (off, n, bits) in enumerate(TQ3A_GROUPS):
        body = blocks[:, _TQ3A_QOFF[g] : _TQ3A_QOFF[g] + n * bits // 8].astype(np.uint64)
        if bits == 4:
            ig = np.concatenate([body & np.uint64(15), body >> np.uint64(4)], axis=1)
        elif bits == 2:
            ig = np.concatenate([(body >> np.uint64(2 * k)) & np.uint64(3) for k in range(4)], axis=1)
        else:
            per = bits  # 8 indices in `bits` bytes
            b = body.reshape(n_rows, n // 8, per)
            w = np.zeros((n_rows, n // 8), np.uint64)
            for t in range(per):
                w |= b[:, :, t] << np.uint64(8 * t)
            mask = np.uint64((1 << bits) - 1)
            ig = ((w[:, :, None] >> (np.uint64(bits) * np.arange(8, dtype=np.uint64))) & mask).reshape(n_rows, n)
        idx[:, off : off + n] = ig
    return scale, sub, idx


def tq3a_dequantize(blocks: np.ndarray) -> np.ndarray:
    scale, sub, idx = tq3a_unpack(blocks)
    out = np.zeros((len(scale), 256))
    for g, (off, n, _) in enumerate(TQ3A_GROUPS):
        c = (
            SUBSCALES[np.repeat(sub[:, off // 32 : (off + n) // 32], 32, axis=1)]
            * tq3a_book(g).centroids[idx[:, off : off + n]]
        )
        out[:, off : off + n] = scale[:, g : g + 1] * (c @ tq3a_rotation(g))
    return out
