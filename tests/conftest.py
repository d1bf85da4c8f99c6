"""Shared fixtures: the pinned base tree (extracted once per session from the cached sdist)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from llama_tq.tooling import base

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def base_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pristine extraction of the pinned llama.cpp base; tests must not modify it."""
    return base.extract_base(tmp_path_factory.mktemp("base") / "llama.cpp")


@pytest.fixture
def tree(base_tree: Path, tmp_path: Path) -> Path:
    """A private copy of the directories of the base that the series touches (enough for the patch applier)."""
    dst = tmp_path / "llama.cpp"
    dst.mkdir()
    for d in ("ggml", "src", "common", "include", "tools/llama-bench", "tests", "cmake"):
        shutil.copytree(base_tree / d, dst / d, symlinks=True)
    for name in ("CMakeLists.txt", "LICENSE"):
        shutil.copy2(base_tree / name, dst / name)
    return dst


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Every file and directory under root: content hash and mode, for byte-identity checks."""
    out: dict[str, tuple[str, int]] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_dir():
            out[rel] = ("dir", p.stat().st_mode)
        else:
            out[rel] = (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mode)
    return out
