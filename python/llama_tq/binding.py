"""llama-cpp-python on the patched libraries: the matching version, installed from the same pinned sdist.

llama-tq python-binding          # pip install llama-cpp-python==0.3.36 without its own llama.cpp build
import llama_tq; llama_cpp = llama_tq.llama_cpp()   # LLAMA_CPP_LIB_PATH -> llama_tq.lib_dir(), then import
llm = llama_cpp.Llama(model, type_k=llama_tq.GGML_TYPE_TQ4, type_v=llama_tq.GGML_TYPE_TQ3, flash_attn=True)
llama_tq.tq_configure(llm, keys="auto", attn_rot="auto")   # TQ cache options (remakes the context)
llama_tq.triatt_configure(llm, budget=4096)          # TriAttention V3 eviction on this context
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import os
import sys
from types import ModuleType
from typing import Any

from .errors import ToolError, UsageError
from .paths import lib_dir


def llama_cpp() -> ModuleType:
    """Import llama_cpp bound to the patched libraries (sets LLAMA_CPP_LIB_PATH unless already set)."""
    if "llama_cpp" not in sys.modules:
        os.environ.setdefault("LLAMA_CPP_LIB_PATH", str(lib_dir()))
    try:
        return importlib.import_module("llama_cpp")
    except ImportError as e:
        raise ToolError("llama-cpp-python is not installed: run `llama-tq python-binding`") from e


class TqParams(ctypes.Structure):
    """struct llama_tq_params (include/llama-tq.h)."""

    _fields_ = [("keys", ctypes.c_int32), ("attn_rot", ctypes.c_int32)]


@functools.cache
def _triatt_params_type() -> type[ctypes.Structure]:
    """struct llama_triatt_params (include/llama-tq.h), made from the same schema as the C struct (triatt_params.h,
    through the engine module), so that the two cannot disagree on a field or its place."""
    from . import _triatt

    fields = [(name, ctypes.c_int32) for name in _triatt.STRUCT_FIELDS]
    return type("TriattParams", (ctypes.Structure,), {"_fields_": fields})


def _settings() -> list[str]:
    from . import _triatt

    return [p["name"] for p in _triatt.PARAMS]


@functools.cache
def _libllama() -> ctypes.CDLL:
    path = lib_dir() / "libllama.so"
    if not path.is_file():
        raise ToolError(f"{path} is missing: this install was built without the llama.cpp libraries")
    lib = ctypes.CDLL(str(path))  # the same handle llama_cpp loaded
    TriattParams = _triatt_params_type()
    lib.llama_tq_default_params.argtypes = []
    lib.llama_tq_default_params.restype = TqParams
    lib.llama_tq_params_set.argtypes = [ctypes.POINTER(TqParams), ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                        ctypes.c_size_t]  # fmt: skip
    lib.llama_tq_params_set.restype = ctypes.c_int32
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
    """The library's TriAttention defaults (llama_triatt_default_params): the one definition, triatt_params.h."""
    p = _libllama().llama_triatt_default_params()
    return {name: int(getattr(p, name)) for name in _settings()}


def _ctx_ptr(llm_or_ctx: object) -> int:
    """The llama_context pointer of a llama_cpp.Llama (or a raw context pointer); UsageError for anything else."""
    ctx: Any = getattr(llm_or_ctx, "ctx", llm_or_ctx)
    ctx = getattr(ctx, "ctx", ctx)  # Llama._ctx (internal wrapper) -> its ctypes pointer
    what = "expected a llama_cpp.Llama or a llama_context pointer"
    try:
        ptr = ctx.value if isinstance(ctx, ctypes.c_void_p) else ctypes.cast(ctx, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError) as e:
        raise UsageError(f"{what}, got {type(llm_or_ctx).__name__}") from e
    if not ptr:
        raise UsageError(f"{what}, got {llm_or_ctx!r} (no context)")
    return int(ptr)


INT32 = (-(2**31), 2**31 - 1)


def triatt_configure(llm_or_ctx: object, budget: int, **settings: int | str) -> None:
    """TriAttention eviction on a llama-cpp-python context (llama_triatt_configure). `settings` override the
    library's defaults by name (triatt_default_params(); `policy` takes the --triatt-policy names v3, v2, v1,
    streaming, random); UsageError (a ValueError) with llama.cpp's message on bad settings or an unsupported
    model."""
    from . import _triatt

    lib = _libllama()
    ctx = _ctx_ptr(llm_or_ctx)
    params = lib.llama_triatt_default_params()
    known = _settings()
    if "policy" in settings:
        policy = settings.pop("policy")
        if policy not in _triatt.POLICIES:
            raise UsageError(f"policy must be one of {', '.join(_triatt.POLICIES)} (got {policy!r})")
        settings["hybrid"] = _triatt.POLICIES[policy]
    for name, value in {"budget": budget, **settings}.items():
        if name not in known:
            raise UsageError(f"unknown TriAttention setting {name!r} (known: policy, {', '.join(known)})")
        if isinstance(value, bool) or not isinstance(value, int) or not INT32[0] <= value <= INT32[1]:
            raise UsageError(f"TriAttention setting {name} must be a 32-bit integer (got {value!r})")
        setattr(params, name, value)
    err = ctypes.create_string_buffer(256)
    if lib.llama_triatt_configure(ctx, ctypes.byref(params), err, len(err)) != 0:
        raise UsageError(err.value.decode())


def tq_configure(
    llm: object, keys: str = "auto", attn_rot: str = "auto", keys_cal: str | os.PathLike[str] | None = None,
    type_k: int | None = None,
) -> None:  # fmt: skip
    """The TQ cache options of a llama_cpp.Llama (llama_tq_params: the key transforms, --tq-keys
    auto|1|mean|eq|0|matrix, and upstream's attention rotation on the TQ sides, --tq-attn-rot auto|0|1|k|v; keys_cal:
    the calibration file tq3a keys need, --tq-keys-cal; type_k: another K cache type, e.g. GGML_TYPE_TQ3A, which a
    Llama cannot be made with directly since it needs keys_cal). They are fixed when a context is made, so the Llama's
    context is made again with its own context parameters (llama_init_from_model_tq_cal): its cache starts empty, and
    TriAttention is configured after this, not before. UsageError for a bad value (llama.cpp's message) or something
    that is not a Llama; ToolError where libllama refuses the context (the log says why)."""
    llama_cpp = importlib.import_module("llama_cpp")
    wrapper = getattr(llm, "_ctx", None)
    if wrapper is None or not hasattr(wrapper, "params") or not hasattr(wrapper, "model"):
        raise UsageError(f"tq_configure needs a llama_cpp.Llama, got {type(llm).__name__}")
    lib = _libllama()
    params = lib.llama_tq_default_params()
    err = ctypes.create_string_buffer(256)
    for name, value in (("keys", keys), ("attn_rot", attn_rot)):
        if lib.llama_tq_params_set(ctypes.byref(params), name.encode(), str(value).encode(), err, len(err)) != 0:
            raise UsageError(err.value.decode())
    init = lib.llama_init_from_model_tq_cal
    init.argtypes = [ctypes.c_void_p, llama_cpp.llama_context_params, ctypes.POINTER(TqParams), ctypes.c_char_p]
    init.restype = ctypes.c_void_p
    cparams = llama_cpp.llama_context_params.from_buffer_copy(wrapper.params)
    if type_k is not None:
        cparams.type_k = type_k
    cal = os.fsencode(keys_cal) if keys_cal is not None else None
    new = init(wrapper.model.model, cparams, ctypes.byref(params), cal)
    if not new:
        raise ToolError("llama_init_from_model_tq_cal failed (the log says why)")
    wrapper.params = cparams
    old, wrapper.ctx = wrapper.ctx, llama_cpp.llama_context_p(new)
    wrapper.memory = llama_cpp.llama_get_memory(wrapper.ctx)
    llama_cpp.llama_free(old)
    if hasattr(llm, "n_tokens"):
        llm.n_tokens = 0  # the new cache is empty


def triatt_stats(llm_or_ctx: object) -> tuple[int, int, int]:
    """(eviction rounds, cells evicted, keys read and scored anew) so far on the context. A cached key is read once and
    reused by later rounds, until its cell is rewritten or the cache's keys change (a state read, a K-shift)."""
    lib, ctx = _libllama(), _ctx_ptr(llm_or_ctx)
    return (int(lib.llama_triatt_n_rounds(ctx)), int(lib.llama_triatt_n_evicted(ctx)),
            int(lib.llama_triatt_n_folded(ctx)))  # fmt: skip


TQ_TYPE_NAMES = ("GGML_TYPE_TQ3", "GGML_TYPE_TQ4", "GGML_TYPE_TQ3_64", "GGML_TYPE_TQ4_64", "GGML_TYPE_TQ3_96",
                 "GGML_TYPE_TQ4_96", "GGML_TYPE_TQ3A")  # fmt: skip


def __getattr__(name: str) -> int:
    """GGML_TYPE_TQ3 / GGML_TYPE_TQ4 (and the 64- and 96-value GGML_TYPE_TQ3_64 / TQ4_64 / TQ3_96 / TQ4_96, which
    libllama also picks by itself for heads that need them; GGML_TYPE_TQ3A, keys only, through tq_configure): the
    library's own ids for the TQ types."""
    if name in TQ_TYPE_NAMES:
        return ggml_type_id(name.removeprefix("GGML_TYPE_").lower())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
