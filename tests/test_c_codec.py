"""Builds and runs the C edge-case test of the codec under AddressSanitizer and UBSan."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_c_codec_under_sanitizers(tmp_path: Path) -> None:
    exe = tmp_path / "test_codec_edges"
    cmd = [
        "gcc", "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off",
        "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-I", str(REPO / "csrc"),
        str(REPO / "csrc" / "tq_codec.c"), str(REPO / "tests" / "c" / "test_codec_edges.c"), "-lm", "-o", str(exe),
    ]  # fmt: skip
    subprocess.run(cmd, check=True)
    proc = subprocess.run([str(exe)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok" in proc.stdout
