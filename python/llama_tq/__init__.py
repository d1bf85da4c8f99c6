"""llama-tq: TurboQuant KV cache types (TQ3/TQ4) and TriAttention eviction for llama.cpp.

The package by concern:
  runtime API (this module)   the codec on numpy arrays (compiled from csrc/codec/tq_codec.c, loaded on first
                              use so that the build can import the package before the module exists), the
                              shipped tools and libraries, llama-cpp-python bound to them, memory report, validate
  llama_tq.tooling            the pinned base, the patch applier, build preparation, the dev tree, codebook solver
  llama_tq.harness            the measurement protocols: ppl, niah, bench, demo, v3 (one implementation)
"""

from __future__ import annotations

from typing import Any

from .binding import llama_cpp, tq_configure, triatt_configure, triatt_default_params, triatt_stats
from .errors import LlamaTqError
from .paths import bin_dir, include_dir, lib_dir

__version__ = "0.1.0"

_CODEC_NAMES = {
    "quantize", "dequantize", "rotate", "unrotate", "codebook", "signs", "dot_rotated", "tq3a_rotate", "tq3a_unrotate",
}  # fmt: skip
__all__ = [
    "GGML_TYPE_TQ3",
    "GGML_TYPE_TQ3A",
    "GGML_TYPE_TQ3_64",
    "GGML_TYPE_TQ3_96",
    "GGML_TYPE_TQ4",
    "GGML_TYPE_TQ4_64",
    "GGML_TYPE_TQ4_96",
    "LlamaTqError",
    "bin_dir",
    "include_dir",
    "lib_dir",
    "llama_cpp",
    "memory_report",
    "tq_configure",
    "triatt_configure",
    "triatt_default_params",
    "triatt_stats",
    "validate",
    *sorted(_CODEC_NAMES),
]


def __getattr__(name: str) -> Any:
    if name in _CODEC_NAMES:
        from . import _codec

        return getattr(_codec, name)
    from . import binding

    if name in binding.TQ_TYPE_NAMES:  # the library's ids
        return getattr(binding, name)
    if name == "validate":
        from .validate import validate

        return validate
    if name == "memory_report":
        from .memory import memory_report

        return memory_report
    raise AttributeError(f"module 'llama_tq' has no attribute {name!r}")
