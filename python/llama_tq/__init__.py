"""llama-tq: TurboQuant KV cache types (TQ3/TQ4) and TriAttention eviction for llama.cpp.

The codec functions come from the compiled module `llama_tq._codec` (built from csrc/tq_codec.c);
they are loaded on first use so that the build can import this package before the module exists.
"""

from __future__ import annotations

from typing import Any

from .binding import GGML_TYPE_TQ3, GGML_TYPE_TQ4, llama_cpp, triatt_configure, triatt_stats
from .paths import bin_dir, include_dir, lib_dir

__version__ = "0.1.0"

_CODEC_NAMES = {"quantize", "dequantize", "rotate", "unrotate", "codebook", "signs", "dot_rotated"}
__all__ = [
    "GGML_TYPE_TQ3",
    "GGML_TYPE_TQ4",
    "bin_dir",
    "include_dir",
    "lib_dir",
    "llama_cpp",
    "memory_report",
    "triatt_configure",
    "triatt_stats",
    "validate",
    *sorted(_CODEC_NAMES),
]


def __getattr__(name: str) -> Any:
    if name in _CODEC_NAMES:
        from . import _codec

        return getattr(_codec, name)
    if name == "validate":
        from .validate import validate

        return validate
    if name == "memory_report":
        from .memory import memory_report

        return memory_report
    raise AttributeError(f"module 'llama_tq' has no attribute {name!r}")
