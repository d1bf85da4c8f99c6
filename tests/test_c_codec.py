"""Builds and runs the C edge-case test of the codec under AddressSanitizer and UBSan."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import llama_tq

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
CODEC = REPO / "csrc" / "codec"
CPU = REPO / "csrc" / "llama.cpp" / "ggml" / "src" / "tq"  # the CPU backend's TQ kernels, as installed


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_c_codec_under_sanitizers(tmp_path: Path) -> None:
    exe = tmp_path / "test_codec_edges"
    cmd = [
        "gcc", "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off",
        "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-I", str(CODEC),
        str(CODEC / "tq_codec.c"), str(REPO / "tests" / "c" / "test_codec_edges.c"), "-lm", "-o", str(exe),
    ]  # fmt: skip
    subprocess.run(cmd, check=True)
    proc = subprocess.run([str(exe)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok" in proc.stdout


def _host_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


# (expected ggml_tq_cpu_isa(), gcc flags, host CPU flags needed to run it)
ISAS = [
    ("scalar", ["-march=x86-64"], set()),
    ("avx2", ["-march=haswell"], {"avx2", "fma"}),
    ("avx512", ["-march=skylake-avx512"], {"avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl"}),
]


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
@pytest.mark.parametrize(("isa", "flags", "needs"), ISAS, ids=[i[0] for i in ISAS])
def test_cpu_kernels_match_codec(tmp_path: Path, isa: str, flags: list[str], needs: set[str]) -> None:
    """ggml-cpu's SIMD quantizer writes the codec's exact bytes; its dot products and V rows match the codec's."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86 instruction sets")
    missing = needs - _host_flags()
    if missing:
        pytest.skip(f"host lacks {sorted(missing)}")
    exe = tmp_path / "test_tq_cpu_kernels"
    cmd = [
        "gcc", "-std=c11", "-O2", *flags, "-ffp-contract=off", "-Wall", "-Wextra", "-Werror", "-I", str(CODEC),
        "-I", str(CPU), "-I", str(llama_tq.include_dir()),  # ggml.h, for the glue's ggml types
        str(CODEC / "tq_codec.c"), str(CPU / "ggml-tq-cpu.c"),
        str(REPO / "tests" / "c" / "test_tq_cpu_kernels.c"), "-lm", "-o", str(exe),
    ]  # fmt: skip
    subprocess.run(cmd, check=True)
    proc = subprocess.run([str(exe)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"isa {isa}\n" in proc.stdout, proc.stdout
    assert proc.stdout.count("0/400 rows differ") == 7, proc.stdout  # tq3, tq4, tq3_64, tq4_64, tq3_96, tq4_96, tq3a
