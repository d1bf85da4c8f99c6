"""The committed codebook header is exactly what the documented solver produces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llama_tq import _codec
from llama_tq.tooling.codebook_solver import header_books, render_header, solve

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]


def test_header_is_solver_output() -> None:
    books = header_books()
    assert [(b.bits, b.dim) for b in books] == [
        (3, 128), (4, 128), (3, 64), (4, 64), (3, 96), (4, 96), (5, 32), (4, 32), (2, 128),
    ]  # fmt: skip
    assert (REPO / "csrc" / "codec" / "tq_codebooks.h").read_text() == render_header(books)


def test_codebooks_are_symmetric_and_sorted() -> None:
    for kind, n in (("tq3", 8), ("tq4", 16), ("tq3_64", 8), ("tq4_64", 16), ("tq3_96", 8), ("tq4_96", 16)):
        c = _codec.codebook(kind)
        assert c.shape == (n,)
        assert np.all(np.diff(c) > 0)
        np.testing.assert_array_equal(c, -c[::-1])


def test_solver_mse_matches_known_values() -> None:
    # Lloyd-Max on the d=128 coordinate law; close to the Gaussian values 0.03454 / 0.009497 (x d/(d+...)).
    assert abs(solve(3).unit_vector_mse - 0.033966) < 2e-6
    assert abs(solve(4).unit_vector_mse - 0.009315) < 2e-6
