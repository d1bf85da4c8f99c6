"""The `llama-tq` command: help, validate, memory report, paths."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from llama_tq.cli import main
from llama_tq.memory import memory_report
from llama_tq.models import default_model

pytestmark = pytest.mark.unit


def test_help_lists_subcommands() -> None:
    exe = shutil.which("llama-tq")
    assert exe
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True).stdout
    for sub in ("validate", "memory", "patch", "paths"):
        assert sub in out


def test_validate_meets_targets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "-n", "2000", "--json", str(tmp_path / "v.json")]) == 0
    out = capsys.readouterr().out
    assert "tq3" in out and "tq4" in out and "MSE/4^-b" in out
    rows = json.loads((tmp_path / "v.json").read_text())
    assert [r["kind"] for r in rows] == ["tq3", "tq4", "tq3_64", "tq4_64", "tq3_96", "tq4_96"]
    assert [r["dim"] for r in rows] == [128, 128, 64, 64, 96, 96]
    assert all(r["lower"] < r["mse"] < r["upper"] for r in rows)


def test_memory_report_default_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "--ctx", "8192", "--json", str(tmp_path / "m.json")]) == 0
    rep = json.loads((tmp_path / "m.json").read_text())
    rows = {r["type"]: r for r in rep["rows"]}
    # Gemma 3 270M: 18 layers x 1 KV head x (256 + 256) values per token
    assert rows["f16"]["bytes_per_token"] == 18 * 512 * 2
    assert rows["tq3"]["bytes_per_token"] == 18 * 4 * 52
    assert rows["tq4"]["bytes_per_token"] == 18 * 4 * 68
    assert rows["q4_0"]["bytes_per_token"] == 18 * 16 * 18
    # 3 global layers hold 8192 cells, 15 sliding-window layers 512 + 512
    assert rows["f16"]["total_bytes"] == 1024 * (3 * 8192 + 15 * 1024)
    assert "4.92x" in capsys.readouterr().out


def header_only_model(path: Path, head: int) -> Path:
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_embedding_length(4 * head)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_key_length(head)
    w.add_value_length(head)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_memory_report_flags_unsupported_head_size(tmp_path: Path) -> None:
    # head 160: a multiple of 32 (q8_0's block), not of 64 or 96
    rep = memory_report(header_only_model(tmp_path / "h160.gguf", 160), n_ctx=1024, quiet=True)
    rows = {r["type"]: r for r in rep["rows"]}
    assert not rows["tq3"]["supported"] and not rows["tq4"]["supported"]
    assert rows["q8_0"]["supported"]
    assert any("160" in n and "multiple of 64 or 96" in n for n in rep["notes"])


def test_memory_report_head_96_counts_96_value_blocks(tmp_path: Path) -> None:
    """Head 96 (Phi-3): tq3/tq4 are stored as tq3_96/tq4_96 (40 / 52 bytes per 96 values), as libllama picks them."""
    rep = memory_report(header_only_model(tmp_path / "h96.gguf", 96), n_ctx=1024, quiet=True)
    rows = {r["type"]: r for r in rep["rows"]}
    assert rows["tq3"]["bytes_per_token"] == 2 * 2 * 2 * 40
    assert rows["tq4"]["bytes_per_token"] == 2 * 2 * 2 * 52
    assert rows["q4_0"]["bytes_per_token"] == 2 * 2 * 2 * 54
    assert any("stored as tq3_96 (96-value blocks)" in n for n in rep["notes"])


def test_memory_report_head_64_counts_64_value_blocks(tmp_path: Path) -> None:
    """Head 64: tq3/tq4 are stored as tq3_64/tq4_64 (28 / 36 bytes per 64 values), as libllama picks them."""
    rep = memory_report(header_only_model(tmp_path / "h64.gguf", 64), n_ctx=1024, quiet=True)
    rows = {r["type"]: r for r in rep["rows"]}
    # 2 layers x 2 KV heads x (K + V) rows of 64 values
    assert rows["tq3"]["bytes_per_token"] == 2 * 2 * 2 * 28
    assert rows["tq4"]["bytes_per_token"] == 2 * 2 * 2 * 36
    assert rows["f16"]["bytes_per_token"] == 2 * 2 * 2 * 128
    assert any("stored as tq3_64" in n for n in rep["notes"])


def test_memory_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "/nonexistent.gguf"]) == 2
    assert "no such model file" in capsys.readouterr().err


def test_default_model_is_assembled() -> None:
    p = default_model()
    assert p.is_file() and p.stat().st_size == 253_113_024


def test_paths(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["paths"]) == 0
    assert "LLAMA_CPP_LIB_PATH=" in capsys.readouterr().out
