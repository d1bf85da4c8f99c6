"""llama-cpp-python on the patched libraries: the matching version, installed from the same pinned sdist.

llama-tq python-binding          # pip install llama-cpp-python==0.3.36 without its own llama.cpp build
import llama_tq; llama_cpp = llama_tq.llama_cpp()   # LLAMA_CPP_LIB_PATH -> llama_tq.lib_dir(), then import
llm = llama_cpp.Llama(model, type_k=llama_tq.GGML_TYPE_TQ4, type_v=llama_tq.GGML_TYPE_TQ3, flash_attn=True)
llama_tq.triatt_configure(llm, budget=4096)          # TriAttention V3 eviction on this context
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import os
import subprocess
import sys
from types import ModuleType

from .errors import ToolError, UsageError
from .paths import lib_dir
from .tooling import base

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
            raise ToolError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return f"installed llama-cpp-python {base.SDIST_VERSION}; use it with LLAMA_CPP_LIB_PATH={lib_dir()}"


def llama_cpp() -> ModuleType:
    """Import llama_cpp bound to the patched libraries (sets LLAMA_CPP_LIB_PATH unless already set)."""
    if "llama_cpp" not in sys.modules:
        os.environ.setdefault("LLAMA_CPP_LIB_PATH", str(lib_dir()))
    try:
        return importlib.import_module("llama_cpp")
    except ImportError as e:
        raise ToolError("llama-cpp-python is not installed: run `llama-tq python-binding`") from e


class TriattParams(ctypes.Structure):
    """struct llama_triatt_params (include/llama.h, patch 0004)."""

    _fields_ = [(name, ctypes.c_int32) for name in
                ("budget", "hybrid", "prefix", "window", "segments", "divide", "warmup", "boundary_skip",
                 "pool", "pool_top", "pool_spans")]  # fmt: skip


@functools.cache
def _libllama() -> ctypes.CDLL:
    path = lib_dir() / "libllama.so"
    if not path.is_file():
        raise ToolError(f"{path} is missing: this install was built without the llama.cpp libraries")
    lib = ctypes.CDLL(str(path))  # the same handle llama_cpp loaded
    lib.llama_triatt_default_params.argtypes = []
    lib.llama_triatt_default_params.restype = TriattParams
    lib.llama_triatt_configure.argtypes = [ctypes.c_void_p, ctypes.POINTER(TriattParams), ctypes.c_char_p,
                                           ctypes.c_size_t]  # fmt: skip
    lib.llama_triatt_configure.restype = ctypes.c_int32
    lib.llama_triatt_n_rounds.argtypes = [ctypes.c_void_p]
    lib.llama_triatt_n_rounds.restype = ctypes.c_int32
    lib.llama_triatt_n_evicted.argtypes = [ctypes.c_void_p]
    lib.llama_triatt_n_evicted.restype = ctypes.c_int64
    lib.llama_triatt_n_folded.argtypes = [ctypes.c_void_p]
    lib.llama_triatt_n_folded.restype = ctypes.c_int64
    return lib


@functools.cache
def ggml_type_id(name: str) -> int:
    """The ggml_type value the shipped libggml gives a type name (e.g. "tq3"), read at run time, not assumed."""
    path = next(lib_dir().glob("libggml-base.so*"), None)
    if path is None:
        raise ToolError(f"libggml-base is missing from {lib_dir()}")
    lib = ctypes.CDLL(str(path))
    lib.ggml_type_name.argtypes = [ctypes.c_int]
    lib.ggml_type_name.restype = ctypes.c_char_p
    for i in range(256):  # ggml_type_name answers "NONE" past GGML_TYPE_COUNT
        if lib.ggml_type_name(i) == name.encode():
            return i
    raise ToolError(f"the shipped libggml has no type named {name!r}")


def triatt_default_params() -> dict[str, int]:
    """The library's TriAttention defaults (llama_triatt_default_params): the one definition, in csrc/triatt."""
    p = _libllama().llama_triatt_default_params()
    return {name: int(getattr(p, name)) for name, _ in TriattParams._fields_}


def _ctx_ptr(llm_or_ctx: object) -> int:
    """The llama_context pointer of a llama_cpp.Llama (or a raw context pointer)."""
    ctx = getattr(llm_or_ctx, "ctx", llm_or_ctx)
    ctx = getattr(ctx, "ctx", ctx)  # Llama._ctx (internal wrapper) -> its ctypes pointer
    if isinstance(ctx, ctypes.c_void_p):
        return int(ctx.value or 0)
    return int(ctypes.cast(ctx, ctypes.c_void_p).value or 0)


def triatt_configure(llm_or_ctx: object, budget: int, **settings: int) -> None:
    """TriAttention V3 eviction on a llama-cpp-python context (llama_triatt_configure). `settings` override the
    library's defaults by name (hybrid, prefix, window, segments, divide, warmup, boundary_skip, pool,
    pool_top, pool_spans); UsageError (a ValueError) with llama.cpp's message on bad settings or an unsupported
    model."""
    lib = _libllama()
    params = lib.llama_triatt_default_params()
    for name, value in {"budget": budget, **settings}.items():
        if name not in dict(TriattParams._fields_):
            raise UsageError(f"unknown TriAttention setting {name!r} (known: "
                             f"{', '.join(n for n, _ in TriattParams._fields_)})")  # fmt: skip
        setattr(params, name, int(value))
    err = ctypes.create_string_buffer(256)
    if lib.llama_triatt_configure(_ctx_ptr(llm_or_ctx), ctypes.byref(params), err, len(err)) != 0:
        raise UsageError(err.value.decode())


def triatt_stats(llm_or_ctx: object) -> tuple[int, int, int]:
    """(eviction rounds, cells evicted, keys read and scored anew) so far on the context. A cached key is read once and
    reused by later rounds, until its cell is rewritten or the cache's keys change (a state read, a K-shift)."""
    lib, ctx = _libllama(), _ctx_ptr(llm_or_ctx)
    return (int(lib.llama_triatt_n_rounds(ctx)), int(lib.llama_triatt_n_evicted(ctx)),
            int(lib.llama_triatt_n_folded(ctx)))  # fmt: skip


TQ_TYPE_NAMES = ("GGML_TYPE_TQ3", "GGML_TYPE_TQ4", "GGML_TYPE_TQ3_64", "GGML_TYPE_TQ4_64", "GGML_TYPE_TQ3_96",
                 "GGML_TYPE_TQ4_96")  # fmt: skip


def __getattr__(name: str) -> int:
    """GGML_TYPE_TQ3 / GGML_TYPE_TQ4 (and the 64- and 96-value GGML_TYPE_TQ3_64 / TQ4_64 / TQ3_96 / TQ4_96, which
    libllama also picks by itself for heads that need them): the library's own ids for the TQ types."""
    if name in TQ_TYPE_NAMES:
        return ggml_type_id(name.removeprefix("GGML_TYPE_").lower())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
