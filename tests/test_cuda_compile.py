"""CI has no GPU: compile-check the CUDA sources with nvcc instead (the GPU tests are scripts/gpu/run_cuda.sh).

Compiled for sm_90 with ggml-cuda's own flags (-use_fast_math -extended-lambda), from the base with the whole
series applied: every csrc/llama.cpp/ggml/src/ggml-cuda/tq/*.cu as installed in ggml/src/ggml-cuda/tq/ (warnings
are errors; the write's and the tq4 FA unit also with lab's timestamp patch), the patched
upstream convert.cu and ggml-cuda.cu, and the standalone exactness test tests/cuda/tq_quant_exact.cu, linked
against the C codec. fattn.cu is left out: it needs the per-type-pair defines that ggml-cuda's CMake generates.
ggml-cuda's headers include cuBLAS's, which the CUDA compiler package here lacks: the headers are taken from
PyPI's nvidia-cublas wheel once (only include/ is kept, in the llama-tq cache).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from llama_tq.tooling import base, patcher

REPO = Path(__file__).resolve().parents[1]
CUDA_SRC = "csrc/llama.cpp/ggml/src/ggml-cuda/tq"  # our CUDA sources, at their place in the tree
NVCC = shutil.which("nvcc")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(NVCC is None, reason="nvcc not installed: the CUDA sources cannot be compile-checked"),
]

FLAGS = ["-O2", "-std=c++17", "-use_fast_math", "-extended-lambda", "-DGGML_USE_CUDA"]


def cublas_headers() -> Path:
    inc = base.cache_dir() / "cublas-include"
    if (inc / "cublas_v2.h").is_file():
        return inc
    wheels = base.cache_dir() / "cublas-wheel"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
            str(wheels),
            "nvidia-cublas>=13,<14",
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cuBLAS headers unavailable (pip download nvidia-cublas failed): {proc.stderr[-300:]}")
    whl = next(wheels.glob("nvidia_cublas-*.whl"))
    tmp = inc.with_name("cublas-include.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(whl) as z:
        for name in z.namelist():
            if "/include/" in name and not name.endswith("/"):
                target = tmp / name.split("/include/", 1)[1]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(z.read(name))
    shutil.rmtree(wheels)
    tmp.rename(inc)
    return inc


@pytest.fixture(scope="module")
def patched(base_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("cuda") / "llama.cpp"
    shutil.copytree(base_tree, dst, symlinks=True, ignore=shutil.ignore_patterns("models", "docs", "examples"))
    patcher.apply(dst)
    return dst


def lab_patched(root: Path, name: str, dst: Path, strip: int) -> Path:
    """A copy of root (csrc/, strip=2, or a patched tree, strip=3) with lab/patches/<name>.patch applied."""
    shutil.copytree(root, dst, symlinks=False, ignore=shutil.ignore_patterns(".git", "build", ".venv", "models"))
    patch = REPO / "lab" / "patches" / f"{name}.patch"
    proc = subprocess.run(["patch", f"-p{strip}", "--forward", "-d", str(dst), "-i", str(patch)], capture_output=True,
                          text=True)  # fmt: skip
    assert proc.returncode == 0, f"{patch.name} no longer applies: {proc.stdout[-1500:]}{proc.stderr[-500:]}"
    return dst


def nvcc(args: list[str], cwd: Path, arch: str = "sm_90") -> subprocess.CompletedProcess[str]:
    assert NVCC is not None
    return subprocess.run([NVCC, *FLAGS, f"-arch={arch}", *args], cwd=cwd, capture_output=True, text=True)


def test_cuda_sources_compile(patched: Path, tmp_path: Path) -> None:
    cuda = patched / "ggml" / "src" / "ggml-cuda"
    inc = [
        f"-I{p}"
        for p in (
            patched / "ggml/include",
            patched / "ggml/src",
            cuda,
            cuda / "tq",
            patched / "ggml/src/tq",
            cublas_headers(),
        )
    ]
    ours = sorted((cuda / "tq").glob("*.cu"))
    assert {p.name for p in ours} == {p.name for p in (REPO / CUDA_SRC).glob("*.cu")}
    jobs = [
        ([*inc, "-Werror", "all-warnings", "-c", str(p), "-o", str(tmp_path / f"{p.stem}.o")], p.name, "sm_90")
        for p in ours
    ]
    # a pre-Ampere build (sm_75: no m16n8k16 f16 mma, no cp.async): the tensor-core decode kernel compiles to a trap
    # there and the host picks the SIMT kernel
    ktq3 = cuda / "tq" / "tq-fattn-ktq3.cu"
    jobs += [
        ([*inc, "-Werror", "all-warnings", "-c", str(ktq3), "-o", str(tmp_path / "ktq3_75.o")], "ktq3 sm_75", "sm_75")
    ]
    # the measuring patches of lab/patches/ still apply and build: the in-graph timestamps (cuda-stamps,
    # lab/cuda/stamps_stats.py) of the write's and an FA kernel's unit
    stamped = lab_patched(patched, "cuda-stamps", tmp_path / "stamps", strip=3)
    sinc = [i.replace(str(patched), str(stamped)) for i in inc]
    jobs += [
        ([*sinc, "-DTQ_STAMPS", "-Werror", "all-warnings", "-c", str(stamped / "ggml/src/ggml-cuda/tq" / f"{n}.cu"),
          "-o", str(tmp_path / f"{n}_st.o")], f"{n} TQ_STAMPS", "sm_90")
        for n in ("ggml-tq-cuda", "tq-fattn-ktq4")
    ]  # fmt: skip
    jobs += [
        ([*inc, "-c", str(cuda / f"{n}.cu"), "-o", str(tmp_path / f"{n}.o")], f"{n}.cu (patched)", "sm_90")
        for n in ("convert", "ggml-cuda")
    ]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = list(pool.map(lambda j: (j[1], nvcc(j[0], cuda, j[2])), jobs))
    failed = {name: proc.stderr[-2000:] for name, proc in results if proc.returncode != 0}
    assert not failed, failed


@pytest.mark.parametrize(
    ("source", "defines", "lab_patch"),
    [
        ("tests/cuda/tq_quant_exact.cu", [], ""),
        ("lab/cuda/fa_decode_bench.cu", [], ""),
        ("lab/cuda/fa_decode_bench.cu", ["-DTQ_FA_PHASES"], "cuda-phases"),  # `phases` (v14_fa_prologue)
        ("lab/cuda/carveout_bench.cu", [], ""),
        ("lab/cuda/param_size_bench.cu", [], ""),
        ("lab/cuda/tq_convert_bench.cu", [], ""),
        ("lab/cuda/quant_phases_bench.cu", [], "cuda-phases"),
        ("lab/cuda/v_step_bench.cu", [], ""),
    ],
)
def test_standalone_gpu_programs_build(source: str, defines: list[str], lab_patch: str, tmp_path: Path) -> None:
    """The quantizer exactness test and the GPU harnesses (decode kernels, run by scripts/gpu/run_cuda.sh; the
    shared-memory carveout and parameter-size probes of cuda/v12_rope_fold (lab/archive/cuda.tar.xz), the prefill
    converter's speed probe of v13_convert, the quantizer's phase clock of v23_write, the V step alone of issue 45)."""
    src = REPO
    if lab_patch:  # a measuring build: csrc/ with a patch of lab/patches/ applied
        src = tmp_path / "repo"
        src.mkdir()
        lab_patched(REPO / "csrc", lab_patch, src / "csrc", strip=2)
    codec = tmp_path / "tq_codec.o"
    subprocess.run(
        ["gcc", "-O2", "-std=c11", "-ffp-contract=off", "-c", str(REPO / "csrc/codec/tq_codec.c"), "-o", str(codec)],
        check=True,
    )
    exe = tmp_path / Path(source).stem
    proc = nvcc(
        ["-std=c++17", *defines, "-I" + str(src / "csrc/codec"), "-I" + str(src / CUDA_SRC), str(REPO / source),
         str(codec), "-o", str(exe)],
        tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert exe.stat().st_size > 0
