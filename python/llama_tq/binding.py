"""llama-cpp-python on the patched libraries: the matching version, installed from the same pinned sdist.

llama-tq python-binding          # pip install llama-cpp-python==0.3.36 without its own llama.cpp build
import llama_tq; llama_cpp = llama_tq.llama_cpp()   # LLAMA_CPP_LIB_PATH -> llama_tq.lib_dir(), then import
llm = llama_cpp.Llama(model, type_k=llama_tq.GGML_TYPE_TQ4, type_v=llama_tq.GGML_TYPE_TQ3, flash_attn=True)
llama_tq.triatt_configure(llm, budget=4096)          # TriAttention V3 eviction on this context
"""

from __future__ import annotations

import ctypes
import importlib
import os
import subprocess
import sys
from types import ModuleType

from . import base
from .paths import lib_dir

# ggml_type values registered by the patch series (after upstream's last type, GGML_TYPE_Q2_0 = 42)
GGML_TYPE_TQ3 = 43
GGML_TYPE_TQ4 = 44

_RUNTIME_DEPS = ["typing-extensions>=4.5", "diskcache>=5.6", "jinja2>=2.11"]


def install_llama_cpp_python() -> str:
    """pip-install the llama-cpp-python of the pinned sdist, Python package only (LLAMA_BUILD=OFF)."""
    sdist = base.fetch_sdist()
    env = {**os.environ, "CMAKE_ARGS": "-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"}
    for cmd in (
        [sys.executable, "-m", "pip", "install", "--no-deps", str(sdist)],
        [sys.executable, "-m", "pip", "install", *_RUNTIME_DEPS],
    ):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return f"installed llama-cpp-python {base.SDIST_VERSION}; use it with LLAMA_CPP_LIB_PATH={lib_dir()}"


def llama_cpp() -> ModuleType:
    """Import llama_cpp bound to the patched libraries (sets LLAMA_CPP_LIB_PATH unless already set)."""
    if "llama_cpp" not in sys.modules:
        os.environ.setdefault("LLAMA_CPP_LIB_PATH", str(lib_dir()))
    try:
        return importlib.import_module("llama_cpp")
    except ImportError as e:
        raise ImportError("llama-cpp-python is not installed: run `llama-tq python-binding`") from e


def _libllama() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(lib_dir() / "libllama.so"))  # the same handle llama_cpp loaded
    lib.llama_triatt_configure.argtypes = [ctypes.c_void_p, *([ctypes.c_int32] * 8), ctypes.c_char_p, ctypes.c_size_t]
    lib.llama_triatt_configure.restype = ctypes.c_int32
    lib.llama_triatt_n_rounds.argtypes = [ctypes.c_void_p]
    lib.llama_triatt_n_rounds.restype = ctypes.c_int32
    lib.llama_triatt_n_evicted.argtypes = [ctypes.c_void_p]
    lib.llama_triatt_n_evicted.restype = ctypes.c_int64
    return lib


def _ctx_ptr(llm_or_ctx: object) -> int:
    """The llama_context pointer of a llama_cpp.Llama (or a raw context pointer)."""
    ctx = getattr(llm_or_ctx, "ctx", llm_or_ctx)
    ctx = getattr(ctx, "ctx", ctx)  # Llama._ctx (internal wrapper) -> its ctypes pointer
    if isinstance(ctx, ctypes.c_void_p):
        return int(ctx.value or 0)
    return int(ctypes.cast(ctx, ctypes.c_void_p).value or 0)


def triatt_configure(
    llm_or_ctx: object,
    budget: int,
    hybrid: int = 2,
    prefix: int = 128,
    window: int = 128,
    segments: int = 8,
    divide: int = 128,
    warmup: int = 1024,
    boundary_skip: int = 0,
) -> None:
    """TriAttention V3 eviction on a llama-cpp-python context (llama_triatt_configure); ValueError on bad settings."""
    err = ctypes.create_string_buffer(256)
    rc = _libllama().llama_triatt_configure(_ctx_ptr(llm_or_ctx), budget, hybrid, prefix, window, segments, divide,
                                            warmup, boundary_skip, err, len(err))  # fmt: skip
    if rc != 0:
        raise ValueError(err.value.decode())


def triatt_stats(llm_or_ctx: object) -> tuple[int, int]:
    """(eviction rounds, cells evicted) so far on the context."""
    lib, ctx = _libllama(), _ctx_ptr(llm_or_ctx)
    return int(lib.llama_triatt_n_rounds(ctx)), int(lib.llama_triatt_n_evicted(ctx))
