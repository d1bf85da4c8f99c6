"""tq3a keys through the patched tools and libraries: `llama-tq calibrate` on the default model, llama-perplexity with
-ctk tq3a --tq-keys-cal (KLD against the f16 cache beside tq3's), its refusals, and a state round trip through
llama-cpp-python (tq_configure with type_k / keys_cal)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from llama_tq import calibrate
from llama_tq.harness.demo import default_text
from llama_tq.models import default_model
from llama_tq.synth import write_synth_model
from llama_tq.tooling.binding_install import install_llama_cpp_python

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A calibration of the default model over the first 1024 tokens of the demo's text."""
    if importlib.util.find_spec("llama_cpp") is None:  # importing it here would bind the wrong libraries
        install_llama_cpp_python()
    out = tmp_path_factory.mktemp("cal") / "gemma3-270m.tqcal"
    proc = subprocess.run([sys.executable, "-m", "llama_tq", "calibrate", "--tokens", "1024", "-o", str(out)],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert f"--tq-keys-cal {out}" in proc.stdout
    return out


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's text after its first 20 kB (not the calibration's tokens): enough for 4 chunks of 512."""
    p = tmp_path_factory.mktemp("text") / "topics.txt"
    p.write_text(default_text()[20_000:120_000])
    return p


def _run(tool: str, *args: str) -> tuple[int, str]:
    exe = shutil.which(tool)
    assert exe, f"{tool} is not installed"
    proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=900)
    return proc.returncode, proc.stdout + proc.stderr


def _perplexity(text: Path, *flags: str) -> str:
    rc, log = _run("llama-perplexity", "-m", str(default_model()), "-f", str(text), "-c", "512", "-b", "512",
                   "--chunks", "4", "-t", "2", "-fa", "on", "-lv", "4", *flags)  # fmt: skip
    assert rc == 0, log[-3000:]
    done = r"^Mean +KLD:" if "--kl-divergence" in flags else r"Final estimate: PPL = [0-9.]+"
    assert re.search(done, log, re.M), log[-3000:]
    return log


def test_calibration_file(cal: Path) -> None:
    arch, n_layer, x = calibrate.read(cal)
    assert (arch, n_layer, sorted(x)) == ("gemma3", 18, list(range(18)))
    for il, e in x.items():
        assert e.shape == (1, 256) and np.all(np.isfinite(e)) and np.all(e >= 0), il
        pair = np.sort(e[0, :128] + e[0, 128:])[::-1]  # NEOX pairs (i, i + 128), loudest first
        # uneven, as the allocation needs: the loudest 16 of 128 pairs (tq3a's 5-bit group) carry over twice their
        # even share (measured: 0.32-0.59 of the energy on this model)
        assert pair[:16].sum() > 0.25 * pair.sum(), f"layer {il}: the energies are nearly even, nothing to allocate"


def test_tq3a_keys_beat_tq3(cal: Path, text: Path, tmp_path: Path) -> None:
    """KLD against the f16 cache of the same run: tq3a keys (3.25 bits, as tq3) below tq3 keys, values tq3 in both;
    the log says the calibrated order is used."""
    base = tmp_path / "f16.kld"
    _perplexity(text, "--kl-divergence-base", str(base))
    kld = {}
    for ctk in ("tq3", "tq3a"):
        log = _perplexity(text, "--kl-divergence-base", str(base), "--kl-divergence", "-ctk", ctk, "-ctv", "tq3",
                          "--tq-keys-cal", str(cal))  # fmt: skip
        m = re.search(r"^Mean +KLD: +(-?[0-9.]+)", log, re.M)
        assert m, log[-3000:]
        kld[ctk] = float(m.group(1))
        assert ("RoPE pairs ordered by the energies of" in log) == (ctk == "tq3a"), log[-3000:]
    assert kld["tq3a"] < 0.9 * kld["tq3"], kld


def test_refusals(cal: Path, text: Path, tmp_path: Path) -> None:
    """Each refused with a message that says what to do, before any token is evaluated."""
    common = ("-m", str(default_model()), "-f", str(text), "-c", "512", "--chunks", "1", "-t", "2")
    bad = tmp_path / "bad.tqcal"
    lines = cal.read_text().splitlines()
    cases = {
        "need a calibration of this model": ("-ctk", "tq3a"),
        "is a key type": ("-ctk", "tq3", "-ctv", "tq3a", "--tq-keys-cal", str(cal)),
        "always take the key transforms": ("-ctk", "tq3a", "--tq-keys", "0", "--tq-keys-cal", str(cal)),
        "cannot be read": ("-ctk", "tq3a", "--tq-keys-cal", str(tmp_path / "missing.tqcal")),
    }
    for expect, flags in cases.items():
        rc, log = _run("llama-perplexity", *common, *flags)
        assert rc != 0 and expect in log, (expect, log[-2000:])
    for broken, expect in (
        ([lines[0], lines[1], lines[2], *lines[4:]], "has no energies of layer 0"),  # a record missing
        ([*lines[:3], lines[3].rsplit(" ", 1)[0] + " nan", *lines[4:]], "missing, negative or not finite"),
        (["llama-tq-key-cal 2", *lines[1:]], "not a llama-tq key calibration"),
        ([*lines, lines[3]], "given twice"),
    ):
        bad.write_text("\n".join(broken) + "\n")
        rc, log = _run("llama-perplexity", *common, "-ctk", "tq3a", "--tq-keys-cal", str(bad))
        assert rc != 0 and expect in log, (expect, log[-2000:])
    other = write_synth_model(tmp_path / "llama256.gguf", n_layer=2, n_embd=512, n_head=2, n_head_kv=1, n_ff=512,
                              n_ctx=1024, byte_vocab=True)  # fmt: skip
    rc, log = _run("llama-perplexity", "-m", str(other), "-f", str(text), "-c", "512", "--chunks", "1", "-t", "2",
                   "-ctk", "tq3a", "--tq-keys-cal", str(cal))  # fmt: skip
    assert rc != 0 and "is of another model" in log, log[-2000:]


STATE_SCRIPT = textwrap.dedent(
    """
    import sys, llama_tq
    llama_cpp = llama_tq.llama_cpp()
    model, cal = sys.argv[1], sys.argv[2]
    llm = llama_cpp.Llama(model, n_ctx=512, flash_attn=True, verbose=False, n_threads=2, logits_all=True)
    llama_tq.tq_configure(llm, keys_cal=cal, type_k=llama_tq.GGML_TYPE_TQ3A)
    llm.eval(llm.tokenize(b"The capital of France is Paris. The capital of Germany is"))
    saved = llm.save_state()
    nxt = llm.tokenize(b" Berlin", add_bos=False)
    llm.eval(nxt)
    before = llm.scores[llm.n_tokens - 1].copy()
    llm.reset()
    llm.load_state(saved)
    llm.eval(nxt)
    after = llm.scores[llm.n_tokens - 1]
    assert abs(before).max() > 0 and (before == after).all(), abs(before - after).max()
    print("STATE OK")
    """
)


def test_state_round_trip_through_python(cal: Path) -> None:
    """A tq3a context made through llama_tq.tq_configure saves and restores its keys (the state carries the
    calibration's hash): the next token's logits are identical."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-c", STATE_SCRIPT, str(default_model()), str(cal)], capture_output=True,
                          text=True, timeout=600, env=env)  # fmt: skip
    assert proc.returncode == 0 and "STATE OK" in proc.stdout, (proc.stdout + proc.stderr)[-3000:]
