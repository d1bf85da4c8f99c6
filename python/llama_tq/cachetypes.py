"""The KV cache types llama.cpp accepts (`-ctk` / `-ctv`), with their block geometry: one table for the package.

Upstream types take their (values, bytes) per block from gguf's GGML_QUANT_SIZES, the TQ types from the compiled
codec (`_codec.BLOCK`, `_codec.BLOCK_BYTES`), so a layout change reaches every user of the table.
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf

from . import _codec
from .errors import UsageError

_Q = gguf.GGMLQuantizationType
# upstream's kv_cache_types (common/arg.cpp), in its order
_UPSTREAM = {"f32": _Q.F32, "f16": _Q.F16, "bf16": _Q.BF16, "q8_0": _Q.Q8_0, "q4_0": _Q.Q4_0, "q4_1": _Q.Q4_1,
             "iq4_nl": _Q.IQ4_NL, "q5_0": _Q.Q5_0, "q5_1": _Q.Q5_1}  # fmt: skip
# the codec's formats (csrc/codec/tq_formats.h); the _64 / _96 variants, 64- and 96-value blocks, are picked for
# heads that need them
TQ_TYPES = (*_codec.BLOCK_VALUES, "tq3a")  # tq3a: keys only, heads of 256, with a calibration (llama-tq calibrate)


@dataclass(frozen=True)
class CacheType:
    name: str
    block: int  # values per block
    block_bytes: int

    @property
    def bits(self) -> float:
        return self.block_bytes * 8 / self.block

    @property
    def is_tq(self) -> bool:
        return self.name in TQ_TYPES

    def row_bytes(self, n_values: int) -> int | None:
        """Bytes of a row of n_values, or None if the row is not a whole number of blocks."""
        return None if n_values % self.block else n_values // self.block * self.block_bytes


CACHE_TYPES: dict[str, CacheType] = {
    **{n: CacheType(n, *gguf.GGML_QUANT_SIZES[t]) for n, t in _UPSTREAM.items()},
    **{n: CacheType(n, _codec.BLOCK_VALUES[n], _codec.BLOCK_BYTES[n]) for n in _codec.BLOCK_VALUES},
    "tq3a": CacheType("tq3a", 256, _codec.TQ3A_BLOCK_BYTES),
}
# what `llama-tq memory` and the demo compare, smallest-loss first
REPORT_TYPES = ("f16", "q8_0", "q4_0", "tq4", "tq3")


def cache_type(name: str) -> CacheType:
    try:
        return CACHE_TYPES[name]
    except KeyError:
        raise UsageError(f"unknown cache type '{name}' (known: {', '.join(CACHE_TYPES)})") from None


def for_head(name: str, head: int) -> CacheType:
    """The type llama.cpp stores for a head size: tq3/tq4 switch to their 64-value blocks (tq3_64/tq4_64) where the
    head is a multiple of 64 but not of 128, to their 96-value blocks (tq3_96/tq4_96) where it is a multiple of 96
    only, as libllama does at context creation (llama-tq-types.h)."""
    if name in ("tq3", "tq4") and head % 128:
        if head % 64 == 0:
            name = f"{name}_64"
        elif head % 96 == 0:
            name = f"{name}_96"
    return cache_type(name)


def is_tq(name: str) -> bool:
    """Whether a cache type name is one of llama-tq's TurboQuant types (not upstream's tq1_0 / tq2_0 weights)."""
    return name in TQ_TYPES
