"""`llama-tq calibrate`: the calibration that tq3a keys need, from a model and a text.

tq3a codes a head of 256 key values in four groups of 5, 4, 3 and 2 bits (csrc/codec/tq_codec.h). Which channels
get the bits is decided per (layer, KV head) by the query-weighted energy of each key channel,
    x_c = sqrt(E[q_c^2] E[(k_c - mean_c)^2])
over the first tokens of a text (post-RoPE queries of the head's query group, keys less their mean): libllama sums it
over each RoPE pair and puts the pairs in falling order into the groups (llama-tq-keys.cpp, tq3a_basis). The order
comes from real activations: the weights' norm gains alone order them worse than tq3's uniform code
(bench/results/key_allocation.md). One calibration serves a model at every context size; a text of another kind
carries over (calibrated on the NIAH haystack, wikitext-2 KLD 0.63x rotated q4_0).

    llama-tq calibrate [--model M.gguf] [--text T] [--tokens 2048] -o M.tqcal
    llama-cli -m M.gguf -ctk tq3a --tq-keys-cal M.tqcal ...

The file (text; libllama's reader in llama-tq-params.cpp refuses anything else):
    llama-tq-key-cal 1
    arch <general.architecture>
    shape <n_layer> <n_head_kv> <head>
    x <layer> <kv head> <head energies>
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np

from .errors import ModelError, ToolError, UsageError

_NAME = re.compile(r"^([QK])cur-(\d+)$")
HEADER = "llama-tq-key-cal 1"


@dataclass
class _Sums:
    """Per layer: sums over the calibration tokens (float64)."""

    q2: dict[int, np.ndarray] = field(default_factory=dict)  # [H, D] sum of q^2 per query head
    k1: dict[int, np.ndarray] = field(default_factory=dict)  # [Hkv, D] sum of k
    k2: dict[int, np.ndarray] = field(default_factory=dict)  # [Hkv, D] sum of k^2

    def add(self, name: str, arr: np.ndarray) -> None:
        """arr: [tokens, heads, D], the last node of that name in one ubatch's graph (after RoPE)."""
        m = _NAME.match(name)
        assert m is not None
        kind, il = m.group(1), int(m.group(2))
        a = arr.astype(np.float64)
        if kind == "Q":
            self.q2[il] = self.q2.get(il, 0.0) + np.sum(a * a, axis=0)
        else:
            self.k1[il] = self.k1.get(il, 0.0) + np.sum(a, axis=0)
            self.k2[il] = self.k2.get(il, 0.0) + np.sum(a * a, axis=0)


def energies(q2: np.ndarray, k1: np.ndarray, k2: np.ndarray, n: int) -> np.ndarray:
    """x [Hkv, D] from the sums over n tokens: query head i belongs to KV head i // (H / Hkv), as in llama.cpp."""
    hq, d = q2.shape
    hkv = k1.shape[0]
    if hq % hkv != 0 or n <= 0:
        raise ToolError(f"cannot calibrate: {hq} query heads over {hkv} KV heads, {n} tokens")
    eq = q2.reshape(hkv, hq // hkv, d).mean(axis=1) / n
    var_k = np.maximum(k2 / n - (k1 / n) ** 2, 0.0)
    return np.sqrt(eq * var_k)


def write(path: Path, arch: str, n_layer: int, x: dict[int, np.ndarray]) -> None:
    shapes = {v.shape for v in x.values()}
    if len(shapes) != 1:
        raise ToolError(f"cannot write one calibration for layers of different shapes {sorted(shapes)}")
    (hkv, d) = shapes.pop()
    lines = [HEADER, f"arch {arch}", f"shape {n_layer} {hkv} {d}"]
    for il in sorted(x):
        for h in range(hkv):
            lines.append(f"x {il} {h} " + " ".join(f"{v:.7g}" for v in x[il][h]))
    path.write_text("\n".join(lines) + "\n")


def read(path: Path) -> tuple[str, int, dict[int, np.ndarray]]:
    """(arch, n_layer, {layer: x [Hkv, D]}) of a calibration file (for tests and tools; libllama reads it itself)."""
    lines = path.read_text().splitlines()
    if not lines or lines[0] != HEADER:
        raise UsageError(f"{path} is not a llama-tq key calibration")
    arch = lines[1].split()[1]
    n_layer, hkv, d = (int(v) for v in lines[2].split()[1:])
    x: dict[int, np.ndarray] = {}
    for ln in lines[3:]:
        parts = ln.split()
        il, h = int(parts[1]), int(parts[2])
        x.setdefault(il, np.zeros((hkv, d)))[h] = np.array([float(v) for v in parts[3:]])
    return arch, n_layer, x


def _architecture(model: Path) -> tuple[str, int]:
    reader = gguf.GGUFReader(str(model))
    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        raise ModelError(f"{model} has no general.architecture")
    arch = bytes(arch_field.parts[-1]).decode()
    n_layer_field = reader.fields.get(f"{arch}.block_count")
    if n_layer_field is None:
        raise ModelError(f"{model} has no {arch}.block_count")
    return arch, int(n_layer_field.parts[-1][0])


def calibrate(model: Path, text: str, n_tokens: int, out: Path, threads: int = 2) -> dict[int, np.ndarray]:
    """Runs the model (an f16 cache) over the first n_tokens of text, capturing each layer's post-RoPE Qcur / Kcur
    (capture.py), and writes the energies to out."""
    from .capture import run_capture

    if n_tokens < 64:
        raise UsageError(f"--tokens must be at least 64 (got {n_tokens})")
    arch, n_layer = _architecture(model)
    sums = _Sums()

    def on_ubatch(tensors: dict[str, np.ndarray]) -> None:
        for name, arr in tensors.items():
            sums.add(name, arr)

    run_capture(model, text, n_tokens, _NAME, on_ubatch, threads=threads, what="calibrate")
    layers = sorted(set(sums.q2) & set(sums.k1))
    if not layers:
        raise ToolError(f"no Qcur / Kcur tensors were seen: cannot calibrate a {arch} model this way")
    x = {il: energies(sums.q2[il], sums.k1[il], sums.k2[il], n_tokens) for il in layers}
    write(out, arch, n_layer, x)
    return x
