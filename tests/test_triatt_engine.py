"""The TriAttention engine (csrc/triatt/triatt.c via llama_tq._triatt): selection policies against an independent NumPy
implementation and their invariants, settings validation, and the score against a brute-force NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest

from llama_tq import _triatt as tri

pytestmark = pytest.mark.unit


def ref_pool(pos: np.ndarray, score: np.ndarray, r: int) -> np.ndarray:
    """Each cell's best score within r positions (NaN ignored unless all are NaN)."""
    near = np.abs(pos[:, None].astype(np.int64) - pos[None, :]) <= r
    vals = np.where(near & ~np.isnan(score)[None, :], score[None, :], -np.inf)
    best = vals.max(axis=1).astype(np.float32)
    best[np.isneginf(best)] = np.nan
    return best


def ref_select(pos: np.ndarray, score: np.ndarray, budget: int, hybrid: int, prefix: int, window: int,
               segments: int, pool: int = 0, pool_spans: int = 0) -> np.ndarray:  # fmt: skip
    n = len(pos)
    keep = np.zeros(n, bool)
    if n <= budget:
        return ~keep
    prot = pos > pos.max() - window
    if hybrid >= 2:  # V3 and the baselines protect the prefix (StreamingLLM's attention sinks)
        prot |= pos < prefix
    keep |= prot
    # pooling only where the free slots hold pool_spans spans of 2 pool + 1 cells (0: always)
    if pool > 0 and hybrid <= 2 and budget - int(prot.sum()) >= pool_spans * (2 * pool + 1):
        score = ref_pool(pos, score, pool)
    free = min(budget - int(prot.sum()), int((~prot).sum()))
    cand = np.flatnonzero(~prot)
    if hybrid == 3:  # StreamingLLM: the most recent cells
        score = pos.astype(np.float32)
    elif hybrid == 4:  # random: 24 bits of splitmix64 of the position, seeded 0x5452 * golden ratio
        m = (1 << 64) - 1
        z = (pos.astype(np.uint64) + np.uint64((0x9E3779B97F4A7C15 * 0x5452) & m)) & np.uint64(m)
        z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & np.uint64(m)
        z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & np.uint64(m)
        z ^= z >> np.uint64(31)
        score = (z >> np.uint64(40)).astype(np.float32)
    # ranking: score descending, older position first on ties
    rank = lambda idx: idx[np.lexsort((pos[idx], -score[idx]))]  # noqa: E731
    if hybrid in (0, 3, 4):
        keep[rank(cand)[:free]] = True
        return keep
    cand = cand[np.argsort(pos[cand], kind="stable")]
    s = min(segments, len(cand))
    given = 0
    for j in range(s):
        seg = cand[len(cand) * j // s : len(cand) * (j + 1) // s]
        quota = free * len(seg) // len(cand)
        keep[rank(seg)[:quota]] = True
        given += quota
    rest = cand[~keep[cand]]
    keep[rank(rest)[: free - given]] = True
    return keep


@pytest.mark.parametrize(
    ("pool", "pool_spans"),
    [(0, 0), (1, 0), (4, 0), (8, 0), (8, 64), (4, 40), (1, 300)],
)
@pytest.mark.parametrize("hybrid", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("seed", range(6))
def test_select_matches_reference(hybrid: int, seed: int, pool: int, pool_spans: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(300, 3000))
    pos = rng.permutation(n + 50)[:n].astype(np.int32)  # distinct, unordered, with holes (earlier evictions)
    score = rng.normal(size=n).astype(np.float32)
    score[rng.integers(0, n, 20)] = 0.5  # ties
    budget = int(rng.integers(300, n)) if n > 300 else 299
    segments = int(rng.integers(1, 12))
    score[rng.integers(0, n, 5)] = np.nan
    got = tri.select(pos, score, budget=budget, hybrid=hybrid, prefix=64, window=100, segments=segments, pool=pool,
                     pool_spans=pool_spans)  # fmt: skip
    want = ref_select(pos, score, budget, hybrid, 64, 100, segments, pool, pool_spans)
    assert np.array_equal(got, want)
    assert got.sum() == min(n, budget)


def test_select_invariants() -> None:
    rng = np.random.default_rng(1)
    n = 2000
    pos = np.arange(n, dtype=np.int32)
    score = rng.normal(size=n).astype(np.float32)
    score[:128] = -100.0  # the prefix scores worst: only V3 keeps it
    for hybrid in (0, 1, 2):
        keep = tri.select(pos, score, budget=1000, hybrid=hybrid, prefix=128, window=128, segments=8)
        assert keep.sum() == 1000
        assert keep[-128:].all()  # the recent window is always kept
        assert keep[:128].all() == (hybrid == 2)  # the prefix: V3 only
    # V1 keeps the global top scores among the unprotected cells (ranked by their own scores: pool 0)
    keep = tri.select(pos, score, budget=1000, hybrid=0, window=128, pool=0)
    cand = np.arange(n - 128)
    assert set(np.flatnonzero(keep[: n - 128])) == set(cand[np.argsort(-score[: n - 128], kind="stable")][:872])
    # V2: every segment keeps floor(share) or more of the free slots, whatever the scores
    score2 = score.copy()
    score2[: n // 2] += 50  # the older half scores far better: V1 would keep only it
    keep = tri.select(pos, score2, budget=1000, hybrid=1, window=128, segments=8)
    seg = np.array_split(np.arange(n - 128), 8)
    assert all(keep[s].sum() >= 872 * len(s) // (n - 128) for s in seg)
    assert tri.select(pos, score2, budget=1000, hybrid=0, window=128, pool=0)[n // 2 : n - 128].sum() == 0
    # StreamingLLM: the sinks (prefix) and the most recent cells, whatever the scores
    keep = tri.select(pos, score2, budget=1000, hybrid=3, prefix=128, window=128)
    assert keep[:128].all() and keep[n - 872 :].all() and keep.sum() == 1000
    # random: prefix and window kept, the rest spread evenly over the span, independent of the scores (the ranking
    # is a fixed function of the position, so later rounds do not reshuffle what earlier ones kept)
    keep = tri.select(pos, score, budget=1000, hybrid=4, prefix=128, window=128)
    assert np.array_equal(keep, tri.select(pos, score2, budget=1000, hybrid=4, prefix=128, window=128))
    assert keep[:128].all() and keep[-128:].all()
    mid = keep[128 : n - 128].reshape(8, -1).mean(axis=1)
    assert (abs(mid - 744 / (n - 256)) < 0.1).all(), mid


def test_pool_keeps_spans_whole() -> None:
    """A span with one high-scoring token (a fact: a name and its number) is kept whole with pooling, in pieces
    without it; the baselines ignore pooling."""
    n = 2000
    pos = np.arange(n, dtype=np.int32)
    score = np.random.default_rng(3).normal(size=n).astype(np.float32)
    span = np.arange(700, 713)  # 13 tokens around a peak at 706
    score[span] = -5.0
    score[706] = 50.0
    for hybrid in (0, 2):
        plain = tri.select(pos, score, budget=600, hybrid=hybrid, window=128, pool=0)
        pooled = tri.select(pos, score, budget=600, hybrid=hybrid, window=128, pool_spans=0)  # the default pool (8)
        assert plain[706] and not plain[span].all()
        assert pooled[span].all() and pooled.sum() == plain.sum() == 600
        # by default pooling waits for free slots enough for 96 spans of 17 cells (1632): none at budget 600 (344
        # or 472 free), and at budget 1900 (1644 free for V3, 1772 for V1) the span is kept whole again
        assert np.array_equal(tri.select(pos, score, budget=600, hybrid=hybrid, window=128), plain)
        big = {"budget": 1900, "hybrid": hybrid, "window": 128}
        assert tri.select(pos, score, **big)[span].all() and not tri.select(pos, score, pool=0, **big)[span].all()
        assert not tri.select(pos, score, pool_spans=200, **big)[span].all()
    for hybrid in (3, 4):
        assert np.array_equal(tri.select(pos, score, budget=600, hybrid=hybrid, window=128, pool=6),
                              tri.select(pos, score, budget=600, hybrid=hybrid, window=128))  # fmt: skip


def test_select_small_and_nan() -> None:
    pos = np.arange(10, dtype=np.int32)
    assert tri.select(pos, np.zeros(10), budget=300).all()  # under budget: nothing evicted
    score = np.arange(400, dtype=np.float32)
    score[:50] = np.nan  # NaN scores are evicted first
    keep = tri.select(np.arange(400, dtype=np.int32), score, budget=300, hybrid=0, window=10)
    assert not keep[:50].any() and keep.sum() == 300


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"budget": 256}, "must exceed the protected cells: window 128 \\+ prefix = 256"),
        ({"budget": 100, "hybrid": 0}, "must exceed the protected cells: window 128 = 128"),
        ({"budget": 1000, "hybrid": 5}, r"--triatt-policy must be v1, v2, v3, streaming or random \(--triatt-hyb"),
        ({"budget": 256, "hybrid": 3}, "must exceed the protected cells: window 128 \\+ prefix = 256"),
        ({"budget": 1000, "window": -1}, "--triatt-window must not be negative"),
        ({"budget": 1000, "segments": 0}, "--triatt-segments must be at least 1"),
        ({"budget": 1000, "pool": -2}, "--triatt-pool must not be negative"),
        ({"budget": 1000, "pool_spans": -1}, "--triatt-pool-spans must not be negative"),
        ({"budget": -5}, "--triatt-budget must not be negative"),
    ],
)
def test_invalid_settings(kw: dict[str, int], msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        tri.check(**kw)
    tri.check(budget=0)  # off is always valid
    tri.check(budget=257)


def test_one_schema() -> None:
    """The parameters come from one list (triatt_params.h): the binding's keywords, the flags and the public struct's
    fields (a removed option keeps its slot there, so the struct's layout does not change) agree."""
    names = [p["name"] for p in tri.PARAMS]
    assert names == ["budget", "hybrid", "prefix", "window", "segments", "divide", "warmup", "boundary_skip", "pool",
                     "pool_spans"]  # fmt: skip
    assert all(p["flag"] == "--triatt-" + p["name"].replace("_", "-") for p in tri.PARAMS)
    assert [*names[:9], "retired_pool_top", "pool_spans"] == tri.STRUCT_FIELDS
    assert tri.POLICIES == {"v1": 0, "v2": 1, "v3": 2, "streaming": 3, "random": 4}
    with pytest.raises(TypeError, match="unknown TriAttention setting 'pool_top'"):
        tri.check(budget=1000, pool_top=2)


def rope(x: np.ndarray, pos: np.ndarray, n_rot: int, neox: bool, base: float) -> np.ndarray:
    """NumPy RoPE (ggml's normal and NEOX pairings) on rows x at positions pos."""
    out = x.astype(np.float64).copy()
    half = n_rot // 2
    theta = base ** (-2.0 * np.arange(half) / n_rot)
    ang = pos[:, None] * theta[None, :]
    i_re = np.arange(half) if neox else 2 * np.arange(half)
    i_im = i_re + half if neox else i_re + 1
    a, b = x[:, i_re], x[:, i_im]
    out[:, i_re] = a * np.cos(ang) - b * np.sin(ang)
    out[:, i_im] = a * np.sin(ang) + b * np.cos(ang)
    return out


@pytest.mark.parametrize("t_now", [3000.0, 131071.0])  # the score turns a key's folded state by the round's phase
@pytest.mark.parametrize(("head", "n_rot", "neox"), [(64, 64, False), (128, 128, True), (256, 192, True)])
def test_calibration_and_score_match_brute_force(head: int, n_rot: int, neox: bool, t_now: float) -> None:
    rng = np.random.default_rng(head)
    base, max_log2 = 10000.0, 10
    centre = rng.normal(size=head) * 2
    q_pre = centre + 0.3 * rng.normal(size=(500, head))
    qpos = rng.integers(0, 1024, 500)
    mu_re, mu_im, mag = tri.calibrate(rope(q_pre, qpos, n_rot, neox, base).astype(np.float32), qpos, n_rot, neox,
                                      base)  # fmt: skip
    # calibration recovers the pre-RoPE mean and mean pair magnitude
    half = n_rot // 2
    tail = n_rot + 2 * np.arange((head - n_rot) // 2)  # unrotated dims, paired consecutively
    i_re = np.concatenate([np.arange(half) if neox else 2 * np.arange(half), tail])
    i_im = np.concatenate([np.arange(half) + half if neox else 2 * np.arange(half) + 1, tail + 1])
    np.testing.assert_allclose(mu_re, q_pre[:, i_re].mean(0), atol=1e-4)
    np.testing.assert_allclose(mu_im, q_pre[:, i_im].mean(0), atol=1e-4)
    np.testing.assert_allclose(mag, np.hypot(q_pre[:, i_re], q_pre[:, i_im]).mean(0), atol=1e-4)
    # score: post-RoPE keys vs the brute-force mean logit of the centre query at t_now + 2^e, plus the norm term
    kpos = rng.integers(0, int(t_now), 300)
    k_post = rope(rng.normal(size=(300, head)), kpos, n_rot, neox, base)
    got = tri.score(k_post.astype(np.float32), mu_re, mu_im, mag, t_now, n_rot, neox, base, max_log2=max_log2)
    mu = np.zeros(head)
    mu[i_re], mu[i_im] = mu_re, mu_im
    offsets = t_now + 2.0 ** np.arange(max_log2 + 1)
    q_future = rope(np.repeat(mu[None], len(offsets), 0), offsets, n_rot, neox, base)  # (n_off, head)
    want = (k_post @ q_future.T).mean(1)
    want += (np.hypot(k_post[:, i_re], k_post[:, i_im]) * np.maximum(mag - np.hypot(mu_re, mu_im), 0)).sum(1)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-3 * np.abs(want).max())


def test_f16_keys_convert_exactly() -> None:
    """A round converts f16 keys with F16C where the CPU has it, else a portable conversion: every one of the 65,536
    half bit patterns gives the float NumPy gives (NaNs stay NaNs)."""
    h = np.arange(1 << 16, dtype=np.uint16)
    got = tri.f16_to_f32(h)
    want = h.view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    assert np.array_equal(tri.f16_to_f32(h[3:20]), want[3:20])  # lengths that are not a multiple of 8
