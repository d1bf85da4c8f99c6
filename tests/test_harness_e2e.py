"""The harness end to end with the real default model, on small protocols: SMOKE runs (a few chunks, short
contexts) that prove the commands work and their outputs are complete, not quality measurements."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from llama_tq.harness.demo import default_text

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]


def llama_tq(*args: str, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("llama-tq")
    assert exe, "llama-tq not on PATH"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("text") / "topics.txt"
    p.write_text(default_text()[:60_000])
    return p


def test_ppl_refuses_noisy_protocol(text: Path, tmp_path: Path) -> None:
    proc = llama_tq("ppl", "--text", str(text), "--chunks", "2", "--out", str(tmp_path))
    assert proc.returncode == 2 and "below the protocol's minimum of 3" in proc.stderr, proc.stderr
    assert not (tmp_path / "ppl.json").exists()


def test_ppl_smoke(text: Path, tmp_path: Path) -> None:
    proc = llama_tq("ppl", "--text", str(text), "--kv", "q4_0/q4_0,tq3/tq3", "--ctx", "512", "--chunks", "3",
                    "--out", str(tmp_path))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "chunk 3/3" in proc.stderr  # progress
    data = json.loads((tmp_path / "ppl.json").read_text())
    rows = {r["config"]: r for r in data["results"]}
    assert set(rows) == {"f16/f16", "q4_0/q4_0", "tq3/tq3"}
    assert all(r["ok"] and r["ppl"] > 1 for r in rows.values())
    # tq3 with its key transforms lands near rotated q4_0 (16 chunks: 0.9x); issue 13's bound is 2.5x
    assert rows["f16/f16"]["kld"] == 0 and 0 < rows["tq3/tq3"]["kld"] < 2.5 * rows["q4_0/q4_0"]["kld"]
    assert (tmp_path / "ppl.csv").read_text().count("\n") == 4 and (tmp_path / "kld_vs_bits.png").stat().st_size > 0
    assert "tq3/tq3" in proc.stdout and "KLD/ref" in proc.stdout  # the table


def test_niah_smoke(text: Path, tmp_path: Path) -> None:
    proc = llama_tq("niah", "--text", str(text), "--kv", "f16/f16", "--ctx", "512", "--positions", "start,end",
                    "--out", str(tmp_path))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    data = json.loads((tmp_path / "niah.json").read_text())
    res = data["results"]
    assert [(r["config"], r["position"]) for r in res] == [("f16/f16", "start"), ("f16/f16", "end")]
    assert all(400 < r["prompt_tokens"] <= 512 - 16 for r in res)  # measured with the model's tokenizer
    assert res[0]["depth"] < 0.15 < 0.8 < res[1]["depth"]
    # the f16 cache retrieves a needle inside a 512-token context (deterministic at --temp 0)
    assert [r["status"] for r in res] == ["PASS", "PASS"], res
    assert (tmp_path / "niah.png").stat().st_size > 0 and "f16/f16" in proc.stdout


def test_demo_smoke(tmp_path: Path) -> None:
    """The README's main job on its embedded default text, cut down to two configs and a 512 context."""
    proc = llama_tq("demo", "--ctx", "512", "--kv", "f16/f16,q8_0/tq3", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    report = json.loads((tmp_path / "demo.json").read_text())
    assert "pydoc_data" in report["text"]
    rows = {r["config"]: r for r in report["rows"]}
    assert rows["f16/f16"]["kv_bytes_per_token"] == 18 * 2 * 512  # 18 layers x (K + V) x 256 f16 values
    assert rows["q8_0/tq3"]["kv_bytes_per_token"] == 18 * (272 + 104)
    assert rows["q8_0/tq3"]["kld"] > 0 and all(r["ppl_ok"] for r in rows.values())
    assert set(rows["f16/f16"]["niah"]) == {"start", "middle", "end"}
    assert (tmp_path / "demo.png").stat().st_size > 0
    assert "NIAH start" in proc.stdout and "q8_0/tq3" in proc.stdout


def test_niah_with_eviction_counts_rounds(text: Path, tmp_path: Path) -> None:
    """--extra eviction flags: the rounds are counted from the log; a run that never evicts is INVALID (exit 1)."""
    proc = llama_tq("niah", "--text", str(text), "--kv", "f16/f16", "--ctx", "1024", "--positions", "end",
                    "--extra", "--triatt-budget 600 --triatt-warmup 256", "--out", str(tmp_path / "a"))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    (r,) = json.loads((tmp_path / "a" / "niah.json").read_text())["results"]
    assert r["evictions"] >= 1 and r["ok"]
    proc = llama_tq("niah", "--text", str(text), "--kv", "f16/f16", "--ctx", "1024", "--positions", "end",
                    "--extra", "--triatt-budget 4000", "--out", str(tmp_path / "b"))  # fmt: skip
    assert proc.returncode == 1 and "INVALID" in proc.stdout
    (r,) = json.loads((tmp_path / "b" / "niah.json").read_text())["results"]
    assert r["evictions"] == 0 and not r["ok"]


def test_evict_protocol_smoke(text: Path, tmp_path: Path) -> None:
    """`llama-tq evict`: policies side by side at one budget, rounds during the prefill (-ub 128, warmup 256), every
    scored token after the first round, the KLD that eviction adds, the table, JSON and plot."""
    proc = llama_tq("evict", "--text", str(text), "--ctx", "1024", "--budgets", "50", "--policies",
                    "V3,StreamingLLM", "--out", str(tmp_path))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    rows = {(r["policy"], r["budget_pct"]): r for r in json.loads((tmp_path / "evict.json").read_text())["rows"]}
    assert set(rows) == {("none", 100), ("V3", 50), ("StreamingLLM", 50)}
    assert rows[("none", 100)]["evictions"] is None
    for pol in ("V3", "StreamingLLM"):
        r = rows[(pol, 50)]
        # budget 512 + divide 64: the first round after 640 tokens of each chunk, i.e. before the scored half ends
        assert r["ok"] and r["evictions"] >= 6 and r["seen"] == pytest.approx((1024 - 640) / 512), r
        assert r["kld"] > rows[("none", 100)]["kld"]
    assert "| f16/f16 | 50 % |" in proc.stdout and (tmp_path / "evict_kld_vs_budget.png").stat().st_size > 0
