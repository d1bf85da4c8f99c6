"""Exact key transforms for TQ keys (key-mean centering + channel equalization), end to end through the tools."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from llama_tq.harness.demo import default_text
from llama_tq.models import default_model

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("text") / "topics-head.txt"
    p.write_text(default_text()[:40_000])
    return p


def perplexity(text: Path, ctk: str, ctv: str, keys: str, fa: str = "on") -> tuple[float, str]:
    exe = shutil.which("llama-perplexity")
    assert exe
    proc = subprocess.run([exe, "-m", str(default_model()), "-f", str(text), "-c", "512", "-b", "512", "--chunks",
                           "3", "-t", "2", "-fa", fa, "-ctk", ctk, "-ctv", ctv, "-lv", "4", "--tq-keys", keys],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", log)
    assert m, log[-3000:]
    return float(m.group(1)), log


@pytest.mark.parametrize(("ctv", "fa"), [("tq3", "on"), ("f16", "off")])
def test_key_transforms_rescue_3bit_keys(text: Path, ctv: str, fa: str) -> None:
    """Measured on these 3 chunks: f16 13.03; tq3/tq3 20.96 without the transforms, 14.33 with; tq3/f16 with
    -fa off (K*Q as a MUL_MAT) 20.32 -> 13.53 (before the centering mask). The transforms are exact, so only the
    quantization error moves."""
    ppl_off, log_off = perplexity(text, "tq3", ctv, "0", fa)
    ppl_on, log_on = perplexity(text, "tq3", ctv, "auto", fa)
    assert "TQ key transforms: centering on, equalization on" in log_on
    assert "TQ key transforms" not in log_off
    # the centered channels follow the run's context (-c 512), for the SWA cache too (its owner passes the span)
    spans = re.findall(r"TQ key centering over (\d+) positions: ([0-9.]+)% of the key channels of (\d+) layers", log_on)
    assert [(n, layers) for n, _, layers in spans] == [("512", "3"), ("512", "15")], spans
    assert ppl_on < 0.8 * ppl_off, (ppl_on, ppl_off)


def test_each_transform_helps_alone(text: Path) -> None:
    off, _ = perplexity(text, "tq3", "tq3", "0")
    mean, log_mean = perplexity(text, "tq3", "tq3", "mean")
    eq, log_eq = perplexity(text, "tq3", "tq3", "eq")
    assert "centering on, equalization off" in log_mean and "centering off, equalization on" in log_eq
    assert mean < off and eq < off, (off, mean, eq)


def test_key_basis_from_the_weights_beats_diagonal_scales(text: Path) -> None:
    """--tq-keys matrix: equalization by a full matrix per KV head, from the weights and the run's context.
    Measured on these 3 chunks: f16 13.03, tq3/tq3 14.39 with the diagonal scales, 13.55 with the basis (the
    quantization's share of the PPL 1.36 -> 0.52); exact transforms, so only the quantization error moves. The
    basis of the sliding-window cache is averaged over the full context too (its owner tells it), once."""
    diag, _ = perplexity(text, "tq3", "tq3", "auto")
    basis, log = perplexity(text, "tq3", "tq3", "matrix")
    assert "centering on, equalization on (matrix)" in log
    spans = re.findall(r"TQ key basis over (\d+) positions: (\d+) of (\d+) layers from the weights", log)
    assert sorted(spans) == [("512", "15", "15"), ("512", "3", "3")], spans
    assert basis < diag - 0.4, (basis, diag)
    f16, _ = perplexity(text, "f16", "f16", "auto")
    assert basis - f16 < 0.6 * (diag - f16), (f16, diag, basis)


@pytest.mark.parametrize("keys", ["auto", "matrix"])
def test_context_shift_with_transformed_keys(keys: str) -> None:
    """A context shift (K-shift) maps stored TQ keys back to true keys, rotates them and stores them again: with the
    key transforms on, upstream's Hadamard rotation of K is off, and the shift graph used to dereference the absent
    rotation (a segfault). 300 tokens into a 256-token context shift it at least once."""
    exe = shutil.which("llama-completion")
    assert exe
    proc = subprocess.run([exe, "-m", str(default_model()), "-c", "256", "-n", "300", "--context-shift", "-no-cnv",
                           "--temp", "0", "-t", "2", "-fa", "on", "-ctk", "tq3", "-ctv", "tq3", "-lv", "5",
                           "-p", "The history of the Roman Empire", "--tq-keys", keys], capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "context full, swapping" in log, log[-3000:]
    assert len(proc.stdout.split()) > 150, proc.stdout[-1000:]


def test_bad_tq_keys_value_is_a_clear_error(text: Path) -> None:
    """A bad value, by flag or by its variable (LLAMA_ARG_TQ_KEYS, as upstream names them), stops before any work;
    libllama itself reads no environment for it (LLAMA_TQ_KEYS, the old alias, changes nothing)."""
    exe = shutil.which("llama-perplexity")
    assert exe
    args = [exe, "-m", str(default_model()), "-f", str(text), "-c", "512", "--chunks", "1", "-ctk", "tq3"]
    want = "--tq-keys must be auto, 1, 0, mean, eq or matrix (got '{}')"
    proc = subprocess.run([*args, "--tq-keys", "sometimes"], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and want.format("sometimes") in proc.stdout + proc.stderr
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "LLAMA_ARG_TQ_KEYS": "x"})  # fmt: skip
    assert proc.returncode != 0 and want.format("x") in proc.stdout + proc.stderr
    proc = subprocess.run([*args, "-lv", "4"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "LLAMA_TQ_KEYS": "0"})  # fmt: skip
    assert proc.returncode == 0 and "centering on, equalization on" in proc.stdout + proc.stderr
