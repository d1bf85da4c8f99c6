"""The Metal kernels, checked as far as Linux allows (there is no Metal compiler or Apple GPU here).

1. kernels/tq.metal, embedded as the patched ggml-metal CMake embeds it (kernels/common.h prepended, includes
   stripped, ggml-metal-impl.h inlined), compiles as C++ against tests/metal/metal_stdlib, a CPU stand-in for
   the subset of the Metal Shading Language it uses: syntax and type errors fail here, not on a user's Mac.
2. tests/metal/test_tq_metal.cpp runs the same source on the CPU: the software binary64 against the machine's
   (10^6 cases per operation), quantize and dequantize bit for bit against the C codec on 2^18 random blocks per
   block format (> 10^6 blocks in all), the SET_ROWS / CPY / GET_ROWS kernels in upstream's dispatch geometry,
   and the flash-attention kernel per threadgroup on an emulated 32-lane SIMD group against a double-precision
   attention over codec-dequantized K/V for every K/V pair and head size it is instantiated for, and (built against
   the installed patched ggml) against ggml's CPU FLASH_ATTN_EXT on the same bytes, test-backend-ops' reference.
3. The patched tree wires it: the kernel library and the host hooks are in ggml-metal's CMake lists and library
   table, supports_op and the FA op call the hooks, and the host C++ (ggml-metal-tq.cpp and the patched
   ggml-metal-ops.cpp) compiles. ggml-metal-device.m is Objective-C and is only read.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from llama_tq.tooling import patcher

REPO = Path(__file__).resolve().parents[1]
METAL_SRC = REPO / "csrc/llama.cpp/ggml/src/ggml-metal"
COMPAT = REPO / "tests/metal"
CXX = shutil.which("g++") or shutil.which("clang++")
CC = shutil.which("gcc") or shutil.which("clang")
pytestmark = [pytest.mark.skipif(CXX is None or CC is None, reason="no C/C++ compiler")]

# what stands in for the Metal compiler's built-in types and its unknown-to-C++ attributes and pragmas
CXXFLAGS = ["-std=c++17", "-ffp-contract=off", "-Wall", "-Wno-attributes", "-Wno-unknown-pragmas"]
BUILTIN_TYPES = ["-include", "cstddef", "-include", "cstdint"]


def embedded_source(tree: Path) -> str:
    """kernels/tq.metal as ggml-metal's CMake embeds it (the steps of its add_custom_command, in Python)."""
    k = tree / "ggml/src/ggml-metal"
    headers = [k / "kernels/common.h", REPO / "csrc/codec/tq_codebooks.h"]  # the patch adds the codebooks for tq
    text = "".join(h.read_text() for h in headers) + (METAL_SRC / "kernels/tq.metal").read_text()
    drop = (
        '#include "common.h"',
        '#include "dequantize.h"',
        '#include "quantize.h"',
        '#include "fa_common.metal"',
        '#include "fa_vec_common.metal"',
        "#pragma once",
    )
    lines = [ln for ln in text.splitlines() if not any(d in ln for d in drop)]
    assert not any("__embed_ggml-common.h__" in ln for ln in lines), "tq.metal does not need ggml-common.h"
    impl = (k / "ggml-metal-impl.h").read_text().splitlines()
    out: list[str] = []
    for ln in lines:
        out.extend(impl if '#include "ggml-metal-impl.h"' in ln else [ln])
    return "\n".join(out) + "\n"


def test_embedded_metal_source_compiles_as_cpp(base_tree: Path, tmp_path: Path) -> None:
    src = tmp_path / "ggml-metal-embed-tq.metal"
    src.write_text(embedded_source(base_tree))
    proc = subprocess.run(
        [
            CXX,
            *CXXFLAGS,
            *BUILTIN_TYPES,
            "-fsyntax-only",
            "-x",
            "c++",
            "-I",
            str(COMPAT),
            "-DGGML_METAL_EMBED_LIBRARY",
            str(src),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "warning" not in proc.stderr, proc.stderr[-4000:]


def build_metal_test(
    out: Path, name: str, base_tree: Path, kernels: Path = METAL_SRC / "kernels", extra: tuple[str, ...] = ()
) -> Path:
    """Compiles tests/metal/test_tq_metal.cpp (with the C codec) against the tq.metal in `kernels`; extra: more
    compiler/linker arguments. Fails the test with the compiler's message."""
    codec = out / "tq_codec.o"
    if not codec.exists():
        subprocess.run(
            [CC, "-O2", "-ffp-contract=off", "-c", str(REPO / "csrc/codec/tq_codec.c"), "-o", str(codec)], check=True
        )
    exe = out / name
    proc = subprocess.run(
        [
            CXX, *CXXFLAGS, "-O2", "-I", str(COMPAT), "-I", str(kernels), "-I", str(base_tree / "ggml/src/ggml-metal"),
            "-I", str(REPO / "csrc/codec"), str(COMPAT / "test_tq_metal.cpp"), str(codec), "-o", str(exe), "-pthread",
            *extra,
        ],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return exe


@pytest.fixture(scope="module")
def metal_test_binary(base_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_metal_test(tmp_path_factory.mktemp("metal"), "test_tq_metal", base_tree)


def test_metal_kernels_match_the_codec_on_the_cpu(metal_test_binary: Path) -> None:
    proc = subprocess.run([str(metal_test_binary), str(1 << 18)], capture_output=True, text=True, timeout=1200)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    out = proc.stdout
    assert "soft binary64: 1000000 cases; differing add 0 mul 0 div 0 sqrt 0 float->double 0 double->float 0" in out
    codec = re.findall(
        r"codec tq(\d) \((\d+)-value blocks\): (\d+) blocks, quantize differs in (\d+), dequantize in (\d+)", out
    )
    assert {(b, n) for b, n, *_ in codec} == {("3", "128"), ("4", "128"), ("3", "64"), ("4", "64")}
    assert sum(int(c[2]) for c in codec) >= 1_000_000
    assert all(c[3] == "0" and c[4] == "0" for c in codec), codec
    assert out.count("SET_ROWS exact, CPY f32->tq exact, GET_ROWS exact, CPY ->f32 exact, ->f16 exact") == 4
    fa = re.findall(r"^FA (\S+)\s+K / (\S+)\s+V d(\d+) .* NMSE (\S+) (\S+)$", out, re.M)
    assert len(fa) == 32 and all(r[4] == "ok" for r in fa), fa
    assert {r[2] for r in fa} == {"64", "128", "192", "256"}
    assert {(r[0], r[1]) for r in fa} >= {("tq3", "tq3"), ("tq4", "q8_0"), ("f16", "tq3"), ("tq3_64", "f16")}
    assert "PASSED: 0 failure(s)" in out


def test_a_wrong_kernel_fails_the_cpu_check(base_tree: Path, tmp_path: Path) -> None:
    """The check can fail: a copy of tq.metal with the soft binary64's tie rule broken is caught."""
    src = (METAL_SRC / "kernels/tq.metal").read_text()
    broken = src.replace("(rem == half_ && (sticky || (m & 1ul)))", "(rem == half_ && (m & 1ul))", 1)
    assert broken != src
    (tmp_path / "tq.metal").write_text(broken)
    exe = build_metal_test(tmp_path, "test_broken", base_tree, kernels=tmp_path)
    proc = subprocess.run([str(exe), "1000"], capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "FAIL: soft binary64" in proc.stdout


def test_patched_tree_wires_the_metal_kernels(tree: Path) -> None:
    patcher.apply(tree)
    m = tree / "ggml/src/ggml-metal"
    assert (m / "kernels/tq.metal").read_text() == (METAL_SRC / "kernels/tq.metal").read_text()
    cmake = (m / "CMakeLists.txt").read_text()
    sources = re.search(r"set\(METALLIB_KERNEL_SOURCES(.*?)\)", cmake, re.S)
    assert sources and "kernels/tq.metal" in sources.group(1), "the embedded / precompiled library includes tq.metal"
    backend = re.search(r"ggml_add_backend_library\(ggml-metal(.*?)\)", cmake, re.S)
    assert backend and "ggml-metal-tq.cpp" in backend.group(1)
    # tq.metal includes the codec's codebooks: prepended where the library is embedded, copied where it is compiled
    embed = r'if\s*\(kind STREQUAL "tq"\)[^\n]*\n\s*list\(APPEND HEADERS_FOR_SRC [^)]*tq/tq_codebooks\.h\)'
    assert re.search(embed, cmake)
    assert re.search(r"configure_file\(\.\./tq/tq_codebooks\.h\s+\$\{CMAKE_RUNTIME_OUTPUT_DIRECTORY\}/kernels/", cmake)
    device = (m / "ggml-metal-device.m").read_text()
    libs = re.search(r"#define GGML_METAL_LIBS(.*?)\n\n", device, re.S)
    assert libs and re.search(r"X\(TQ,\s+tq\)", libs.group(1)), "kernels/tq.metal is a library kind (embedded symbol)"
    assert "ggml_metal_tq_supports_op(op)" in device
    ops = (m / "ggml-metal-ops.cpp").read_text()
    assert "ggml_metal_tq_flash_attn_ext(ctx->lib, ctx->enc, op)" in ops
    # the host C++ compiles on Linux (the Objective-C part cannot)
    for f in ("ggml-metal-tq.cpp", "ggml-metal-ops.cpp"):
        proc = subprocess.run(
            [
                CXX,
                "-std=c++17",
                "-fsyntax-only",
                "-I",
                str(tree / "ggml/include"),
                "-I",
                str(tree / "ggml/src"),
                "-I",
                str(tree / "ggml/src/tq"),  # ggml-base's public include directory (patch 0001)
                "-I",
                str(m),
                str(m / f),
            ],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, f + proc.stderr[-3000:]


def test_every_kernel_name_the_host_asks_for_is_instantiated(base_tree: Path) -> None:
    """The host builds kernel names from ggml_type_name() (upstream's op code for SET_ROWS, CPY and GET_ROWS,
    ggml-metal-tq.cpp for FA): each name it can request is a host_name in the preprocessed source."""
    proc = subprocess.run(
        [
            CXX,
            *BUILTIN_TYPES,
            "-E",
            "-P",
            "-x",
            "c++",
            "-I",
            str(COMPAT),
            "-I",
            str(base_tree / "ggml/src/ggml-metal"),
            "-I",
            str(REPO / "csrc/codec"),
            str(METAL_SRC / "kernels/tq.metal"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    # macro-built names stay adjacent string literals after preprocessing: join them
    names = {
        "".join(re.findall(r'"([^"]*)"', m)) for m in re.findall(r'host_name\(((?:\s*"[^"]*")+)\s*\)', proc.stdout)
    }
    want = set()
    for t in ("tq3", "tq4", "tq3_64", "tq4_64"):
        want |= {
            f"kernel_set_rows_f32_i64_{t}",
            f"kernel_set_rows_f32_i32_{t}",
            f"kernel_cpy_f32_{t}",
            f"kernel_get_rows_{t}",
            f"kernel_cpy_{t}_f32",
            f"kernel_cpy_{t}_f16",
        }
    # the head sizes supports_op admits: TQ_FA_HEADS's MTL rows (tq_formats.h)
    from llama_tq import _codec

    heads = {n: [r["head"] for r in _codec.FA_HEADS if r["backend"] == "MTL" and r["values"] == n] for n in (128, 64)}
    for tqs, ds in ((("tq3", "tq4"), heads[128]), (("tq3_64", "tq4_64"), heads[64])):
        sides = ("f16", "q8_0", *tqs)
        for d in ds:
            want |= {f"kernel_tq_flash_attn_ext_{k}_{v}_d{d}" for k in sides for v in sides if k in tqs or v in tqs}
    assert want <= names, sorted(want - names)
    assert len(names) == len(want), sorted(names - want)
    host = (METAL_SRC / "ggml-metal-tq.cpp").read_text()
    assert '"kernel_tq_flash_attn_ext_%s_%s_d%d"' in host
    assert 'tq_fa_head_ok("MTL"' in host


def test_metal_fa_kernel_matches_ggml_cpu_backend(base_tree: Path, tmp_path: Path) -> None:
    """The emulated FA kernel against the installed patched ggml's CPU FLASH_ATTN_EXT on the same bytes (the
    reference test-backend-ops compares a GPU backend with), within test-backend-ops' FA tolerance."""
    import llama_tq

    lib = llama_tq.lib_dir()
    exe = build_metal_test(
        tmp_path, "test_tq_metal_ggml", base_tree,
        extra=("-DTQ_METAL_WITH_GGML", "-I", str(llama_tq.include_dir()), "-L", str(lib), "-lggml-cpu", "-lggml-base",
               "-lggml", f"-Wl,-rpath,{lib}"),
    )  # fmt: skip
    run = subprocess.run([str(exe), "1000"], capture_output=True, text=True, timeout=600)
    print(run.stdout)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    cpu = re.findall(r"vs ggml CPU (\S+) (ok|FAIL)$", run.stdout, re.M)
    assert len(cpu) == 32 and all(r[1] == "ok" and float(r[0]) < 5e-4 for r in cpu), cpu
