"""Builds tests/c/test_tq_graph.cpp against the installed patched ggml and runs it (see that file)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import llama_tq

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parent


def test_tq_graphs_match_float_reference(tmp_path: Path) -> None:
    exe = tmp_path / "test_tq_graph"
    lib = llama_tq.lib_dir()
    cmd = [
        "g++", "-std=c++17", "-O2", "-Wall", "-I", str(llama_tq.include_dir()), str(HERE / "c" / "test_tq_graph.cpp"),
        "-L", str(lib), "-lggml-cpu", "-lggml-base", "-lggml", f"-Wl,-rpath,{lib}", "-o", str(exe),
    ]  # fmt: skip
    subprocess.run(cmd, check=True)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " 0 failures" in proc.stdout
