"""A K bias added before RoPE (Qwen2 / Qwen2.5) stays out of the stored TQ keys and comes back exactly in attention
(llama-tq-keys.h), on small random qwen2 models from `llama_tq.synth --arch qwen2` (byte vocabulary, CPU).

The bias is 10x the mean key norm on every RoPE pair; the same model with LLAMA_TQ_KEY_BIAS_DISABLE=1 stores the
biased keys as before (the comparison). Few query rows take the bias back through a per-head mask, many rows
through f16 keys with it added: -ub 8 and -ub 512 drive each way."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import gguf
import numpy as np
import pytest

from llama_tq.harness.demo import default_text
from llama_tq.synth import write_synth_model

pytestmark = pytest.mark.e2e

N_EMBD, N_HEAD, N_HEAD_KV, HEAD = 512, 4, 2, 128


def _model(path: Path, k_bias: float, pairs: str = "all") -> Path:
    return write_synth_model(path, n_layer=2, n_embd=N_EMBD, n_head=N_HEAD, n_head_kv=N_HEAD_KV, n_ff=512,
                             n_ctx=4096, byte_vocab=True, arch="qwen2", k_bias=k_bias, k_bias_pairs=pairs)  # fmt: skip


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~20 kB of the demo's default text: 3 chunks of 512 byte tokens (a byte vocabulary tokenizes slowly)."""
    p = tmp_path_factory.mktemp("text") / "topics-head.txt"
    p.write_text(default_text()[:20_000])
    return p


@pytest.fixture(scope="module")
def biased(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _model(tmp_path_factory.mktemp("qwen2") / "q10.gguf", 10.0)


def _perplexity(model: Path, text: Path, *flags: str, env: dict[str, str] | None = None) -> str:
    exe = shutil.which("llama-perplexity")
    assert exe
    args = [exe, "-m", str(model), "-f", str(text), "-c", "512", "-b", "512", "--chunks", "3", "-t", "2", "-lv", "4",
            *flags]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, timeout=900, env={**os.environ, **(env or {})})
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    return log


def _kld(model: Path, text: Path, base: Path, *flags: str, env: dict[str, str] | None = None) -> tuple[float, str]:
    log = _perplexity(model, text, "--kl-divergence-base", str(base), "--kl-divergence", *flags, env=env)
    m = re.search(r"^Mean +KLD: +(-?[0-9.]+)", log, re.M)
    assert m, log[-3000:]
    return float(m.group(1)), log


@pytest.fixture(scope="module")
def base(biased: Path, text: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("kld") / "f16.kld"
    _perplexity(biased, text, "-fa", "on", "--kl-divergence-base", str(out))
    return out


@pytest.mark.parametrize(("fa", "ub", "ctv"), [("on", "512", "tq3"), ("on", "8", "tq3"), ("off", "512", "f16")])
def test_k_bias_comes_back_exactly(biased: Path, text: Path, base: Path, fa: str, ub: str, ctv: str) -> None:
    """tq3 keys without the bias: KLD against the f16 cache under half the keys' with it (measured 0.00069 vs
    0.0023 here, the mask way 0.00069 vs 0.0032; tq3 K / f16 V on the 4-layer model of bench/results/key_bias.md:
    0.0091 vs 0.213); the log names the layers."""
    flags = ("-fa", fa, "-ub", ub, "-ctk", "tq3", "-ctv", ctv)
    kld, log = _kld(biased, text, base, *flags)
    assert "the K bias of 2 layers is kept out of the stored keys" in log, log[-3000:]
    kld_kept, log_kept = _kld(biased, text, base, *flags, env={"LLAMA_TQ_KEY_BIAS_DISABLE": "1"})
    assert "K bias" not in log_kept
    assert 0.0 <= kld < 0.5 * kld_kept, (kld, kld_kept)


@pytest.mark.parametrize("ub", ["512", "32"])
def test_k_bias_with_a_stream_per_sequence(biased: Path, text: Path, tmp_path: Path, ub: str) -> None:
    """Four sequences at once (-c 128 -b 512), each in its own stream (--no-kv-unified): the products of the mask
    way (-ub 32: 8 rows a stream) and the f16 keys (-ub 512) follow each stream's cells; KLD as with one stream."""
    ctx = ("-c", "128", "-b", "512", "--chunks", "8")
    base = tmp_path / "f16.kld"
    _perplexity(biased, text, *ctx, "-fa", "on", "--kl-divergence-base", str(base))
    got: dict[tuple[str, bool], float] = {}
    for streams in ("--no-kv-unified", "--kv-unified"):
        for env in ({}, {"LLAMA_TQ_KEY_BIAS_DISABLE": "1"}):
            flags = (*ctx, "-fa", "on", "-ub", ub, streams, "-ctk", "tq3", "-ctv", "tq3")
            got[streams, bool(env)] = _kld(biased, text, base, *flags, env=env)[0]
    assert got["--no-kv-unified", False] < 0.5 * got["--no-kv-unified", True], got
    assert got["--no-kv-unified", False] == pytest.approx(got["--kv-unified", False], rel=0.1), got


def test_zero_bias_costs_nothing(tmp_path: Path, text: Path) -> None:
    """A zero K bias is not removed (nothing to remove: no mask products, no f16 keys)."""
    log = _perplexity(_model(tmp_path / "q0.gguf", 0.0), text, "-fa", "on", "-ctk", "tq3", "-ctv", "tq3")
    assert "K bias" not in log and "Final estimate" in log


@pytest.mark.parametrize("pairs", ["all", "slow", "fast"])
def test_synth_writes_the_k_bias(tmp_path: Path, pairs: str) -> None:
    """--k-bias sets each KV head's bias norm in mean key norms, on the RoPE pairs asked for (slow: turning by at
    most 1 rad over --k-bias-span positions, as the key-mean centering covers)."""
    path = _model(tmp_path / f"{pairs}.gguf", 10.0, pairs)
    r = gguf.GGUFReader(path)
    assert r.get_field("general.architecture").contents() == "qwen2"  # type: ignore[union-attr]
    b = np.asarray(next(t for t in r.tensors if t.name == "blk.0.attn_k.bias").data, dtype=np.float64)
    b = b.reshape(N_HEAD_KV, HEAD)
    key_norm = 0.05 / np.sqrt(3.0) * np.sqrt(N_EMBD) * np.sqrt(HEAD)
    np.testing.assert_allclose(np.linalg.norm(b, axis=1), 10.0 * key_norm, rtol=1e-5)
    i = np.arange(HEAD) % (HEAD // 2)
    slow = 1e6 ** (-2.0 * i / HEAD) * 1024 <= 1.0
    off = {"all": np.zeros(HEAD, bool), "slow": ~slow, "fast": slow}[pairs]
    assert np.all(b[:, off] == 0.0) and np.all(b[:, ~off] != 0.0)


def test_slot_state_records_the_k_bias(tmp_path: Path, biased: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """llama-server decodes with the bias added back through the mask; a slot saved with the bias kept out of its
    keys restores to the same answer, and a server that keeps the bias in its keys refuses it (state flag 16)."""
    import urllib.error

    from server_util import llama_server, post

    slots = tmp_path / "slots"
    slots.mkdir()
    args = [
        "-c",
        "512",
        "-np",
        "1",
        "-t",
        "2",
        "-fa",
        "on",
        "-ctk",
        "tq3",
        "-ctv",
        "tq3",
        "--slot-save-path",
        str(slots),
    ]
    prompt = {"prompt": "The capital of France is Paris. The capital of Germany is", "n_predict": 8, "temperature": 0,
              "cache_prompt": True}  # fmt: skip
    with llama_server(args, tmp_path / "removed.log", model=biased) as port:
        want = post(port, "/completion", prompt)["content"]
        post(port, "/slots/0?action=save", {"filename": "s.bin"})
        post(port, "/slots/0?action=erase", {})
        assert int(post(port, "/slots/0?action=restore", {"filename": "s.bin"})["n_restored"]) > 0  # type: ignore[call-overload]
        assert post(port, "/completion", prompt)["content"] == want
    monkeypatch.setenv("LLAMA_TQ_KEY_BIAS_DISABLE", "1")
    log = tmp_path / "kept.log"
    with llama_server(args, log, model=biased) as port:
        with pytest.raises(urllib.error.HTTPError):
            post(port, "/slots/0?action=restore", {"filename": "s.bin"})
        assert post(port, "/completion", {**prompt, "cache_prompt": False})["content"] is not None
    assert "K bias removed 0" in log.read_text(), log.read_text()[-3000:]
