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


def test_memory_report_triatt_host_memory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """TriAttention's host memory as libllama states it at configure time (test_triatt_e2e.py checks the log line for
    the same context): a 1028 B record (256 + 1 floats) for at most 300 + 128 + 512 cells a sequence."""
    args = ["memory", "--ctx", "131072", "--triatt-budget", "300", "--np", "2", "--json", str(tmp_path / "m.json")]
    assert main(args) == 0
    t = json.loads((tmp_path / "m.json").read_text())["triatt"]
    assert t == {"record_bytes": 1028, "cells": 2 * 940, "records_bytes": 1028 * 2 * 940, "index_bytes": 8 * 131072}
    assert "1028 B a held cell x 1,880 cells = 1.84 MiB" in capsys.readouterr().out


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


# Bad invocations of every subcommand: each a one-line error and exit 2 (bad input), no traceback, before any tool
# runs. "{text}" is a real text file, "{notgguf}" a file that is not a GGUF.
BAD_INVOCATIONS = [
    "validate -n 0",
    "validate -n -1",
    "validate -n abc",
    "memory {notgguf}",
    "memory {missing}",
    "memory --ctx -5",
    "memory --triatt-budget -1",
    "memory --np 0",
    "memory --ctx 0",
    "patch {notgguf}",
    "patch {missing}",
    "ppl --text {text} --kv ''",
    "ppl --text {text} --kv tq9/tq9",
    "ppl --text {text} --extra='\"x'",
    "ppl --text {text} --evict='\"x'",
    "ppl --text {text} --ctx 0",
    "ppl --text {text} --chunks -3",
    "ppl --text {text} --threads 0",
    "ppl --text {missing}",
    "niah --text {missing}",
    "niah --text {text} --ctx -1",
    "niah --text {text} --positions 2",
    "niah --text {text} -n 0",
    "niah --text {text} --extra='\"x'",
    "demo --text {missing}",
    "demo --text {text} --ctx -100",
    "demo --text {text} --kv ''",
    "bench --depths abc",
    "bench --depths -1",
    "bench --reps 0",
    "bench --rounds 0",
    "bench --prompt 0 --gen 0",
    "bench --ref f16/f16 --kv tq3/tq3",
    "v3 --text {text} --retention 200",
    "v3 --text {text} --retention abc",
    "v3 --text {text} --niah-retention 0",
    "v3 --text {text} --flags='\"x'",
    "v3 --text {missing}",
    "v3 --text {text} --caches ''",
    "evict --text {text} --budgets abc",
    "evict --text {text} --budgets -0.5",
    "evict --text {text} --budgets 100",
    "evict --text {text} --policies V9",
    "evict --text {missing}",
    "dev frobnicate {missing}",
]


@pytest.mark.parametrize("cmd", BAD_INVOCATIONS)
def test_bad_invocation_is_one_line_and_exit_2(cmd: str, tmp_path: Path) -> None:
    import shlex
    import sys

    text = tmp_path / "text.txt"
    text.write_text("Some text. More text.\n" * 50)
    notgguf = tmp_path / "notagguf.txt"
    notgguf.write_text("hello\n")
    argv = shlex.split(cmd.format(text=text, notgguf=notgguf, missing=tmp_path / "nonexistent"))
    proc = subprocess.run([sys.executable, "-m", "llama_tq", *argv], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2, (cmd, proc.returncode, proc.stderr[-2000:], proc.stdout[-500:])
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "error:" in last, proc.stderr
    assert not list(tmp_path.glob("out")), "nothing ran"
