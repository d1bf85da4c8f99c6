"""The repository stays a product: small tracked files, a curated bench/results, a user's README, and every archive
that a results page cites present in lab/archive/."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
MAX_FILE_BYTES = 1 << 20
MAX_RESULTS_FILES = 60
MAX_README_LINES = 200


def tracked() -> list[str]:
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p and (REPO / p).is_file()]


def test_no_tracked_file_over_1_mib() -> None:
    big = [(p, (REPO / p).stat().st_size) for p in tracked() if (REPO / p).stat().st_size > MAX_FILE_BYTES]
    assert not big, f"tracked files over 1 MiB (archive raw data compressed under lab/archive/): {big}"


def test_bench_results_is_curated() -> None:
    files = [p for p in tracked() if p.startswith("bench/results/")]
    assert len(files) <= MAX_RESULTS_FILES, f"{len(files)} files under bench/results (at most {MAX_RESULTS_FILES})"


def test_readme_is_a_manual() -> None:
    n = len((REPO / "README.md").read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES}; the rest goes to docs/)"


def test_cited_archives_exist() -> None:
    pages = [p for p in tracked() if p.endswith(".md")]
    cited = {m for p in pages for m in re.findall(r"lab/archive/[\w.-]+\.tar\.xz", (REPO / p).read_text())}
    assert cited, "no page cites an archive"
    missing = sorted(c for c in cited if not (REPO / c).is_file())
    assert not missing, f"cited but absent: {missing}"


def test_libraries_read_no_environment_but_switches() -> None:
    """Options are parameters (include/llama-tq.h): the only getenv in csrc/ is tq_env.h's, for the documented
    *_DISABLE switches it lists."""
    readers = sorted(
        str(p.relative_to(REPO))
        for p in (REPO / "csrc").rglob("*")
        if p.is_file() and p.suffix in {".c", ".h", ".cpp", ".cu", ".cuh", ".metal", ".m"} and "getenv" in p.read_text()
    )
    assert readers == ["csrc/codec/tq_env.h"], readers
    switches = re.findall(r'"(LLAMA_TQ_\w+)"', (REPO / "csrc/codec/tq_env.h").read_text())
    assert switches and all(s.endswith(("_DISABLE", "_DEBUG")) for s in switches), switches


@pytest.mark.parametrize("patch", sorted(p.name for p in (REPO / "lab" / "patches").glob("*.patch")))
def test_lab_patches_still_apply(patch: str) -> None:
    """The measuring hooks live in lab/patches/, outside the shipped libraries; they must keep applying."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    proc = subprocess.run(["git", "apply", "--check", f"lab/patches/{patch}"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_readme_support_matrix_is_the_capability_table() -> None:
    """The README's GPU rows say what TQ_FA_HEADS (tq_formats.h) says: a head-size column names TQ types for a backend
    exactly when the backend's flash-attention kernels take that head size with the block size it needs."""
    from llama_tq import _codec

    have = {(r["backend"], r["values"], r["head"]) for r in _codec.FA_HEADS}
    text = (REPO / "README.md").read_text()
    table = text[text.index("## Support matrix") :].split("\n\n")[1].splitlines()
    heads = [[int(h) for h in re.findall(r"\d+", c)] for c in table[0].strip("|").split("|")[1:]]
    rows = {r.strip("|").split("|")[0].strip().split()[0]: r.strip("|").split("|")[1:] for r in table[2:]}
    checked = 0
    for backend, label in (("CUDA", "CUDA"), ("MTL", "Metal")):
        for hs, cell in zip(heads, rows[label], strict=True):
            if not hs:  # "other heads, MLA"
                continue
            block = 128 if hs[0] % 128 == 0 else 64 if hs[0] % 64 == 0 else 96
            want = all((backend, block, h) in have for h in hs)
            assert ("tq3" in cell) == want, f"README {label} at head {hs}: {cell.strip()!r}, table says {want}"
            checked += 1
    assert checked == 8


def test_cuda_instance_files_are_generated() -> None:
    """The per-K-kind CUDA instance files are exactly what the format table generates (no stale or missing one)."""
    from llama_tq.tooling import cuda_instances

    assert cuda_instances.stale(REPO) == [], "run: python -m llama_tq.tooling.cuda_instances --write"
