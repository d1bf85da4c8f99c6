"""`llama_tq.memory_report()`: KV cache bytes per token and in total, per cache type, for a GGUF model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import gguf
import numpy as np

from .cachetypes import REPORT_TYPES, cache_type, for_head, is_tq
from .errors import ModelError, UsageError

# Architectures whose sliding-window layer pattern llama.cpp hard-codes (every n-th layer is global).
_SWA_PATTERN = {"gemma3": 6, "gemma2": 2, "cohere2": 4}


@dataclass(frozen=True)
class AttnParams:
    arch: str
    n_layer: int
    n_head_kv: list[int]  # per layer
    head_k: int
    head_v: int
    sliding_window: int  # 0 = none
    swa_pattern: int  # every swa_pattern-th layer is global; 0 = all global

    def is_swa(self, layer: int) -> bool:
        return self.sliding_window > 0 and self.swa_pattern > 0 and (layer + 1) % self.swa_pattern != 0


def _field(reader: gguf.GGUFReader, key: str, default: object = None) -> object:
    f = reader.get_field(key)
    return default if f is None else f.contents()


def _int(value: object, key: str) -> int:
    """A metadata value that must be an integer; UsageError (not a traceback) for a file that says otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(f"GGUF metadata {key} is {value!r}, not a number")
    return int(value)


def _ints(value: object, key: str, n: int) -> list[int]:
    """A per-layer count: a list of n integers, or one integer for every layer."""
    return [_int(v, key) for v in value] if isinstance(value, list) else [_int(value, key)] * n


def read_attn_params(path: Path) -> AttnParams:
    try:
        r = gguf.GGUFReader(path)
    except (ValueError, OSError, IndexError) as e:  # gguf raises ValueError on a bad magic, IndexError when short
        raise ModelError(f"{path} is not a readable GGUF file ({e})") from None
    arch = str(_field(r, "general.architecture"))
    n_layer = _int(_field(r, f"{arch}.block_count"), "block_count")
    n_head = _ints(_field(r, f"{arch}.attention.head_count"), "head_count", n_layer)
    n_head_kv = _ints(_field(r, f"{arch}.attention.head_count_kv", n_head), "head_count_kv", n_layer)
    n_embd = _int(_field(r, f"{arch}.embedding_length"), "embedding_length")
    head_k = _int(_field(r, f"{arch}.attention.key_length", n_embd // n_head[0]), "key_length")
    head_v = _int(_field(r, f"{arch}.attention.value_length", head_k), "value_length")
    window = _int(_field(r, f"{arch}.attention.sliding_window", 0) or 0, "sliding_window")
    return AttnParams(arch, n_layer, n_head_kv, head_k, head_v, window, _SWA_PATTERN.get(arch, 0) if window else 0)


def row_bytes(kind: str, n_values: int) -> int | None:
    """Bytes of one head row of n_values as llama.cpp stores it (tq3/tq4 in 64-value blocks where the head needs
    them), or None if the row is not a whole number of blocks."""
    return for_head(kind, n_values).row_bytes(n_values)


def kv_bytes_per_token(p: AttnParams, k_type: str, v_type: str) -> int | None:
    """KV bytes one token takes over all layers (K in k_type, V in v_type); None if a head size does not fit."""
    k, v = row_bytes(k_type, p.head_k), row_bytes(v_type, p.head_v)
    if k is None or v is None:
        return None
    return int(sum((k + v) * h for h in p.n_head_kv))


class MemoryRow(TypedDict, total=False):
    type: str
    supported: bool
    bytes_per_token: int
    total_bytes: int


def triatt_host_bytes(p: AttnParams, n_ctx: int, budget: int, n_seq: int = 1, n_ubatch: int = 512) -> dict[str, int]:
    """TriAttention's host memory as libllama logs it at configure time: a folded key record per cell that holds a key
    (head_k + 1 floats for the full-attention layers, which share one RoPE group in the supported models), for at
    most budget + divide + n_ubatch cells a sequence (twice that between sweeps), plus 8 B a cache cell."""
    from . import _triatt

    divide = int(next(q["default"] for q in _triatt.PARAMS if q["name"] == "divide"))
    record = 4 * (p.head_k + 1)
    cells = min(n_ctx, budget + divide + n_ubatch) * n_seq
    return {"record_bytes": record, "cells": cells, "records_bytes": record * cells, "index_bytes": 8 * n_ctx}


def memory_report(
    gguf_path: str | Path,
    n_ctx: int = 4096,
    n_ubatch: int = 512,
    quiet: bool = False,
    triatt_budget: int = 0,
    n_seq: int = 1,
) -> dict[str, Any]:
    """Print (and return) KV bytes per token and totals for f16, q8_0, q4_0, tq4 and tq3; with a TriAttention
    budget, also the eviction's host memory for n_seq sequences."""
    p = read_attn_params(Path(gguf_path))
    rows: list[MemoryRow] = []
    notes: list[str] = []
    for kind in REPORT_TYPES:
        k = row_bytes(kind, p.head_k)
        v = row_bytes(kind, p.head_v)
        if k is None or v is None:
            need = "64 or 96 (TQ blocks of 128, 64 or 96 values)" if is_tq(kind) else str(cache_type(kind).block)
            notes.append(f"{kind}: head size K={p.head_k}/V={p.head_v} is not a multiple of {need}: unsupported")
            rows.append({"type": kind, "supported": False})
            continue
        types = {for_head(kind, p.head_k), for_head(kind, p.head_v)}
        stored = sorted(t.name for t in types)
        if stored != [kind]:
            blocks = "/".join(sorted({f"{t.block}-value" for t in types}))
            heads = f"K={p.head_k}/V={p.head_v}"
            notes.append(f"{kind}: stored as {'/'.join(stored)} ({blocks} blocks) for head size {heads}")
        per_layer = [(k + v) * h for h in p.n_head_kv]
        per_token = int(np.sum(per_layer))
        cells = [min(n_ctx, p.sliding_window + n_ubatch) if p.is_swa(i) else n_ctx for i in range(p.n_layer)]
        total = int(sum(b * c for b, c in zip(per_layer, cells, strict=True)))
        rows.append({"type": kind, "supported": True, "bytes_per_token": per_token, "total_bytes": total})
    f16 = rows[0]["bytes_per_token"]
    report = {"model": str(gguf_path), "n_ctx": n_ctx, "params": p.__dict__, "rows": rows, "notes": notes}
    triatt = triatt_host_bytes(p, n_ctx, triatt_budget, n_seq, n_ubatch) if triatt_budget > 0 else None
    if triatt is not None:
        report["triatt"] = triatt
    if not quiet:
        n_swa = sum(p.is_swa(i) for i in range(p.n_layer))
        print(
            f"{Path(gguf_path).name}: {p.arch}, {p.n_layer} layers ({n_swa} sliding-window of {p.sliding_window}), "
            f"KV heads {sorted(set(p.n_head_kv))}, head size K {p.head_k} / V {p.head_v}, n_ctx {n_ctx}"
        )
        print(f"{'type':<6} {'bytes/token':>12} {'vs f16':>7} {'KV total (MiB)':>15}")
        for r in rows:
            if r["supported"]:
                ratio = f16 / r["bytes_per_token"]
                print(f"{r['type']:<6} {r['bytes_per_token']:>12,} {ratio:>6.2f}x {r['total_bytes'] / 2**20:>15.2f}")
            else:
                print(f"{r['type']:<6} {'unsupported':>12}")
        if n_swa:
            print(f"(total: global layers hold n_ctx cells, sliding-window layers window + n_ubatch={n_ubatch})")
        for n in notes:
            print(f"note: {n}")
        if triatt is not None:
            t = triatt
            print(
                f"TriAttention host memory (budget {triatt_budget}, {n_seq} sequence(s)): {t['record_bytes']} B a held "
                f"cell x {t['cells']:,} cells = {t['records_bytes'] / 2**20:.2f} MiB (up to twice that between sweeps)"
                f" + {t['index_bytes'] / 2**20:.2f} MiB cell index"
            )
    return report
