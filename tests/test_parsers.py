"""Harness parsers on real captured logs (tests/data/logs), and the protocol checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from llama_tq import bench, ppl

LOGS = Path(__file__).with_name("data") / "logs"


def test_normal_mode_log() -> None:
    p = ppl.parse_perplexity_log((LOGS / "perplexity_normal_tq4_tq3.log").read_text())
    assert p["final_ppl"] == pytest.approx(16.9629) and p["final_ppl_err"] == pytest.approx(2.05548)
    assert p["kv_mib"] == pytest.approx(0.35 + 1.76)  # global + sliding-window cache
    assert "kld" not in p


def test_kld_mode_log() -> None:
    p = ppl.parse_perplexity_log((LOGS / "perplexity_kld_q8_0.log").read_text())
    assert p["mean_ppl_q"] == pytest.approx(15.282352) and p["mean_ppl_q_err"] == pytest.approx(0.357436)
    assert p["kld"] == pytest.approx(0.006946) and p["kld_err"] == pytest.approx(0.000080)
    assert p["kld_p99"] == pytest.approx(0.040047)
    assert p["same_top_p"] == pytest.approx(95.131)


def test_llama_bench_json() -> None:
    recs = bench.parse_llama_bench_json((LOGS / "llama_bench_tq3.json").read_text())
    names = [bench.test_name(r) for r in recs]
    assert names == ["pp16 @ d0", "tg4 @ d0", "pp16 @ d64", "tg4 @ d64"]
    assert all(r["type_k"] == "tq3" and float(r["avg_ts"]) > 0 for r in recs)


def test_kv_config_parsing() -> None:
    c = ppl.KvConfig.parse("q8_0/tq3")
    assert (c.k, c.v, c.bits) == ("q8_0", "tq3", pytest.approx((8.5 + 3.25) / 2))
    assert ppl.KvConfig.parse("tq4").name == "tq4/tq4"
    rot = ppl.KvConfig.parse("tq4/tq4@rot")
    assert rot.env == (("LLAMA_TQ_ATTN_ROT", "1"),) and rot.name == "tq4/tq4@rot"
    assert ppl.KvConfig.parse("tq3/tq3@rotk").env == (("LLAMA_TQ_ATTN_ROT", "k"),)
    with pytest.raises(ValueError, match="unknown cache type 'tq5'"):
        ppl.KvConfig.parse("tq5/tq3")
    with pytest.raises(ValueError, match="unknown option"):
        ppl.KvConfig.parse("tq4@fast")


def test_protocol_refuses_fewer_than_3_chunks(tmp_path: Path) -> None:
    with pytest.raises(ppl.ProtocolError, match="--allow-noisy"):
        ppl.run_matrix(tmp_path / "m.gguf", tmp_path / "t.raw", [ppl.KvConfig.parse("tq3")], chunks=2)


def test_llama_bench_markdown() -> None:
    recs = bench.parse_llama_bench_markdown((LOGS / "llama_bench_tq3.md").read_text())
    assert [bench.test_name(r) for r in recs] == ["pp16 @ d0", "tg4 @ d0", "pp16 @ d64", "tg4 @ d64"]
    assert recs[0]["type_k"] == "tq3" and recs[0]["avg_ts"] == pytest.approx(426.34)
    assert recs[3]["n_gen"] == 4 and recs[3]["n_depth"] == 64


def test_eviction_runs_without_evictions_are_invalid() -> None:
    cfg = ppl.KvConfig.parse("tq3")
    log = (LOGS / "perplexity_kld_q8_0.log").read_text()
    r = ppl._result(cfg, 0, log, 1.0, 16, evict=True)
    assert not r.ok and r.evictions == 0 and "INVALID" in r.error
    evicting = log + "triatt: evict: evicted 200/2248 cells round=1 seq=0 budget=2048\n" * 3
    r = ppl._result(cfg, 0, evicting, 1.0, 16, evict=True)
    assert r.ok and r.evictions == 3
    assert ppl._result(cfg, 0, log, 1.0, 16, evict=False).evictions is None


def test_eviction_requested() -> None:
    assert ppl.eviction_requested(["--triatt-budget", "1800"], env={})
    assert ppl.eviction_requested(["--triatt-budget=1800"], env={})
    assert not ppl.eviction_requested(["--triatt-budget", "0"], env={"TRIATT_BUDGET": "100"})  # the flag wins
    assert ppl.eviction_requested([], env={"TRIATT_BUDGET": "100"})
    assert not ppl.eviction_requested(["-c", "2048"], env={})
