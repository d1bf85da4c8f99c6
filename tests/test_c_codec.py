"""Builds and runs the C edge-case test of the codec under AddressSanitizer and UBSan."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import llama_tq

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


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_cpu_kernels_match_codec(tmp_path: Path) -> None:
    """ggml-cpu's SIMD quantizer writes the codec's exact bytes; its dot products match the codec's."""
    exe = tmp_path / "test_tq_cpu_kernels"
    cmd = [
        "gcc", "-std=c11", "-O2", "-march=native", "-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16",
        "-ffp-contract=off", "-Wall", "-Wextra", "-Werror", "-I", str(REPO / "csrc"),
        "-I", str(llama_tq.include_dir()),  # ggml.h, for the glue's ggml types
        str(REPO / "csrc" / "tq_codec.c"), str(REPO / "csrc" / "ggml-tq-cpu.c"),
        str(REPO / "tests" / "c" / "test_tq_cpu_kernels.c"), "-lm", "-o", str(exe),
    ]  # fmt: skip
    subprocess.run(cmd, check=True)
    proc = subprocess.run([str(exe)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("0/400 rows differ") == 2, proc.stdout
