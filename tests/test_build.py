"""The installed build: tools on PATH, libraries in the package, the codec inside ggml."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

import llama_tq
from llama_tq import _codec

pytestmark = pytest.mark.e2e

TOOLS = ["llama-perplexity", "llama-completion", "llama-cli", "llama-server", "llama-bench"]


def test_llama_cli_version_runs() -> None:
    exe = shutil.which("llama-cli")
    assert exe, "llama-cli is not on PATH"
    proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert "0c1e570" in out, out  # built from the pinned base


@pytest.mark.parametrize("tool", TOOLS)
def test_tool_on_path_and_runs(tool: str) -> None:
    exe = shutil.which(tool)
    assert exe, f"{tool} is not on PATH"
    assert (llama_tq.bin_dir() / tool).is_file()
    proc = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--cache-type-k" in proc.stdout + proc.stderr or tool == "llama-bench"


def test_shared_libraries_in_package() -> None:
    names = {p.name for p in llama_tq.lib_dir().iterdir()}
    for lib in ("libllama.so", "libggml.so", "libggml-base.so", "libggml-cpu.so"):
        assert any(n.startswith(lib) for n in names), f"{lib} missing from {llama_tq.lib_dir()}"


@pytest.mark.parametrize("kind,bits", [("tq3", 3), ("tq4", 4)])
def test_ggml_carries_the_same_codec(kind: str, bits: int) -> None:
    """libggml-base exports the codec from csrc/, and it produces the Python module's bytes exactly."""
    lib = ctypes.CDLL(str(next(llama_tq.lib_dir().glob("libggml-base.so*"))))
    fn = lib.tq_quantize_row
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn.restype = ctypes.c_int
    x = np.random.default_rng(9).standard_normal(128 * 64).astype(np.float32)
    out = np.zeros(64 * _codec.BLOCK_BYTES[kind], np.uint8)
    assert fn(bits, x.ctypes.data, out.ctypes.data, x.size) == 0
    np.testing.assert_array_equal(out, _codec.quantize(x, kind))
