"""TriAttention V3 eviction through the real tools: flags, environment fallbacks, clear errors, eviction rounds."""

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


def perplexity(text: Path, *flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("llama-perplexity")
    assert exe
    args = [exe, "-m", str(default_model()), "-f", str(text), "-c", "2048", "-b", "512", "--chunks", "3", "-t", "2",
            "-fa", "on", "-lv", "4", *flags]  # fmt: skip
    return subprocess.run(args, capture_output=True, text=True, timeout=900, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("text") / "topics.txt"
    p.write_text(default_text()[:60_000])  # 3 chunks of 2048 tokens
    return p


def final_ppl(log: str) -> float:
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", log)
    assert m, log[-2000:]
    return float(m.group(1))


ROUND = re.compile(r"^.*triatt: evict: evicted (\d+)/(\d+) cells round=(\d+) seq=0 kept=768 budget=768 policy=V3 "
                   r"pos=(\d+) t_ms=[0-9.]+ folded=(\d+) wait_ms=[0-9.]+( late=1)?$", re.M)  # fmt: skip
KEPT = re.compile(r"triatt: round (\d+) ms: .* kept=([0-9a-f]{16})$", re.M)  # the debug line (-v)


@pytest.mark.parametrize("kv", [("f16", "f16"), ("tq3", "tq3"), ("q8_0", "tq3")])
def test_v3_evicts_and_stays_close(text: Path, kv: tuple[str, str]) -> None:
    """-c 2048 in ubatches of 512, budget 768: after the 2nd and 4th ubatch of each chunk the cache (1024, then 1280
    cells) is above 768 + 128; each round is late (a ubatch longer than the window: decided then, applied after the
    next ubatch), so it goes back to 768 during the 3rd and after the 4th (that round is dropped: the next chunk
    clears the cache). The scored 2nd half of every chunk sees evicted caches; V3 keeps PPL within 5% of the same
    cache without eviction."""
    base = perplexity(text, "-ctk", kv[0], "-ctv", kv[1])
    assert base.returncode == 0 and "triatt: evict:" not in base.stderr
    baseline = final_ppl(base.stdout + base.stderr)
    proc = perplexity(text, "-ctk", kv[0], "-ctv", kv[1], "--triatt-budget", "768", "--triatt-warmup", "256")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    rounds = ROUND.findall(log)
    expect = [(1024, 1023, " late=1"), (1280, 1535, " late=1")] * 3
    assert [(int(n), int(p), late) for _, n, _, p, _, late in rounds] == expect, log[-3000:]
    assert all(int(ev) == int(n) - 768 for ev, n, *_ in rounds)
    # each key is read once: a chunk's first round reads all 1024 (the chunk started on an empty cache), later rounds
    # only the 512 written since
    assert [int(f) for *_, f, _ in rounds] == [1024, 512] * 3, log[-3000:]
    assert "calibrated on" in log and "query capture removed" in log
    ppl = final_ppl(log)
    assert ppl != baseline and baseline < ppl * 1.02 and ppl < baseline * 1.05, (baseline, ppl)


def test_late_rounds_decide_as_rounds_at_once(text: Path) -> None:
    """A late round is decided on the cells and keys a round at once sees: with LLAMA_TQ_TRIATT_LATE_DISABLE=1 the
    same rounds come at once (plus each chunk's last, after its last ubatch), the first keeps the same positions
    (FNV hash of the debug line) and later ones differ only through the keys of ubatches that attended to more cells.
    Where the stream has no room for another ubatch beside the cells a round would remove (-c 1280), it is at once."""
    flags = ("--triatt-budget", "768", "--triatt-warmup", "256", "-v", "--chunks", "2")
    late = perplexity(text, *flags)
    once = perplexity(text, *flags, env={"LLAMA_TQ_TRIATT_LATE_DISABLE": "1"})
    logs = [p.stdout + p.stderr for p in (late, once)]
    assert late.returncode == 0 and once.returncode == 0, logs[0][-2000:] + logs[1][-2000:]
    r_late, r_once = (ROUND.findall(x) for x in logs)
    assert [(n, p) for _, n, _, p, _, flag in r_late if flag] == [("1024", "1023"), ("1280", "1535")] * 2
    assert [(n, p, flag) for _, n, _, p, _, flag in r_once] == [("1024", "1023", ""), ("1280", "1535", ""),
                                                                ("1280", "2047", "")] * 2  # fmt: skip
    k_late, k_once = (dict(KEPT.findall(x)) for x in logs)
    assert k_late["1"] == k_once["1"] and k_late["3"] == k_once["4"], (k_late, k_once)  # each chunk's first round
    final_ppl(logs[0])
    tight = perplexity(text, "--triatt-budget", "768", "--triatt-warmup", "256", "-c", "1280", "--chunks", "1")
    log = tight.stdout + tight.stderr
    assert tight.returncode == 0, log[-2000:]
    ev = re.findall(r"triatt: evict: evicted (\d+)/(\d+) cells .* pos=(\d+) .*wait_ms=[0-9.]+(.*)$", log, re.M)
    # 1280 - 1024 cells free, less than a ubatch: both rounds at once (after the 2nd ubatch and the 3rd, of 256 tokens)
    assert ev == [("256", "1024", "1023", ""), ("256", "1024", "1279", "")], log[-2000:]


def test_generation_starts_on_the_budget(text: Path, tmp_path: Path) -> None:
    """A prompt ending in a long ubatch leaves its round late; the round is applied before the first generated token
    is placed (llama-completion, -v: the debug line), so generation attends to the budget as after a round at once."""
    exe = shutil.which("llama-completion")
    assert exe
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(text.read_text()[:6000])  # ~1500 tokens: ubatches of 512, 512, ~480
    args = [exe, "-m", str(default_model()), "-f", str(prompt), "-c", "2048", "-b", "2048", "-ub", "512", "-n", "4",
            "-no-cnv", "--no-display-prompt", "--temp", "0", "-t", "2", "-fa", "on", "-v", "--triatt-budget", "768",
            "--triatt-warmup", "256"]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert len(re.findall(r"triatt: evict: evicted \d+/\d+ cells .* late=1$", log, re.M)) == 2, log[-3000:]
    assert "triatt: 1 late round(s) applied before a batch of 1 tokens" in log, log[-3000:]


def test_default_verbosity_shows_a_summary(text: Path) -> None:
    """Without -lv 4 a user still sees that eviction happened: one summary line per context (rounds, cells, time)."""
    exe = shutil.which("llama-perplexity")
    assert exe
    args = [exe, "-m", str(default_model()), "-f", str(text), "-c", "2048", "-b", "512", "--chunks", "3", "-t", "2",
            "-fa", "on", "--triatt-budget", "768", "--triatt-warmup", "256"]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "triatt: evict:" not in proc.stderr  # the per-round lines stay at -lv 4
    (m,) = re.findall(r"triatt: summary: policy=V3 budget=768 rounds=(\d+) evicted=(\d+) t_ms=[0-9.]+", proc.stderr)
    # late rounds (test_v3_evicts_and_stays_close): two a chunk, the third dropped when the next chunk clears the cache
    assert int(m[0]) == 6 and int(m[1]) == 3 * (256 + 512)


def test_env_fallback_and_flag_wins(text: Path) -> None:
    """LLAMA_ARG_TRIATT_* as upstream names its variables (the flag wins); the old TRIATT_* aliases are gone;
    --triatt-policy takes names, and --triatt-hybrid stays one release as its integer alias."""
    proc = perplexity(text, env={"LLAMA_ARG_TRIATT_BUDGET": "700", "LLAMA_ARG_TRIATT_POLICY": "v1"})
    assert proc.returncode == 0 and "budget=700 policy=V1" in proc.stderr, proc.stderr[-2000:]
    proc = perplexity(text, "--triatt-budget", "800", env={"LLAMA_ARG_TRIATT_BUDGET": "700"})
    assert proc.returncode == 0 and "budget=800 policy=V3" in proc.stderr, proc.stderr[-2000:]
    proc = perplexity(text, "--triatt-budget", "700", "--triatt-hybrid", "3")
    assert proc.returncode == 0 and "budget=700 policy=StreamingLLM" in proc.stderr, proc.stderr[-2000:]
    proc = perplexity(text, env={"TRIATT_BUDGET": "700"})
    assert proc.returncode == 0 and "triatt:" not in proc.stderr


@pytest.fixture(scope="module")
def v3_default(text: Path) -> subprocess.CompletedProcess[str]:
    """V3 at budget 768 with the library's defaults otherwise: shared by the pooling tests."""
    return perplexity(text, "--triatt-budget", "768", "--triatt-warmup", "256")


@pytest.fixture(scope="module")
def v3_pooled(text: Path) -> subprocess.CompletedProcess[str]:
    """V3 at budget 768 pooling whatever the budget (--triatt-pool-spans 0)."""
    return perplexity(text, "--triatt-budget", "768", "--triatt-warmup", "256", "--triatt-pool-spans", "0")


def test_pool_reaches_the_engine(text: Path, v3_default: subprocess.CompletedProcess[str],
                                 v3_pooled: subprocess.CompletedProcess[str]) -> None:  # fmt: skip
    """--triatt-pool (default 8), --triatt-pool-spans (default 96) and LLAMA_ARG_TRIATT_POOL reach libllama's
    eviction: at budget 768 the 512 free slots hold fewer than 96 spans of 17 cells, so by default cells rank by their
    own scores (the same run as pool 0, and the log says so); with spans 0 it pools and evicts other cells."""
    off = "triatt: pooling off at this budget: its 512 free slots hold fewer than 96 spans of 17 cells"
    default = v3_default
    assert default.returncode == 0 and re.search(r"triatt: V3 eviction on: budget 768, .*, pool 8$", default.stderr,
                                                 re.M)  # fmt: skip
    assert off in default.stderr and "triatt: evict:" in default.stderr
    proc = perplexity(text, "--triatt-budget", "768", "--triatt-warmup", "256", env={"LLAMA_ARG_TRIATT_POOL": "0"})
    assert proc.returncode == 0 and re.search(r"triatt: V3 eviction on: budget 768, .*, pool 0$", proc.stderr, re.M)
    assert "triatt: evict:" in proc.stderr and "pooling off" not in proc.stderr
    assert final_ppl(proc.stderr) == final_ppl(default.stderr)
    assert v3_pooled.returncode == 0 and "pooling off" not in v3_pooled.stderr
    assert final_ppl(v3_pooled.stderr) != final_ppl(default.stderr)


def test_removed_option_is_refused(text: Path) -> None:
    """--triatt-pool-top measured worse than the default and was removed: the flag is an error, not ignored."""
    proc = perplexity(text, "--triatt-budget", "768", "--triatt-pool-top", "2")
    assert proc.returncode != 0 and "--triatt-pool-top" in proc.stderr, proc.stderr[-1500:]


@pytest.mark.parametrize(("policy", "name"), [("streaming", "StreamingLLM"), ("random", "random")])
def test_baseline_policies_evict(text: Path, policy: str, name: str) -> None:
    """The baselines of the eviction protocol run through the same hook as V3: the same (late) rounds at the same
    positions and the same budget (they rank cells by position alone; tests/test_triatt_engine.py checks which ones)."""
    proc = perplexity(text, "--triatt-budget", "768", "--triatt-warmup", "256", "--triatt-policy", policy)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert f"triatt: {name} eviction on: budget 768" in log
    rounds = re.findall(rf"triatt: evict: evicted \d+/(\d+) cells round=\d+ seq=0 kept=768 budget=768 policy={name} "
                        r"pos=(\d+)", log)  # fmt: skip
    # late, as V3's (test_v3_evicts_and_stays_close): a chunk's last round dropped as the next chunk clears the cache
    assert [int(n) for n, _ in rounds] == [1024, 1280] * 3, log[-3000:]
    assert [int(p) for _, p in rounds] == [1023, 1535] * 3
    assert len(re.findall(rf"policy={name} pos=\d+ .* late=1$", log, re.M)) == 6, log[-3000:]
    assert final_ppl(log) < 100.0


@pytest.mark.parametrize(
    ("flags", "msg"),
    [
        (["--triatt-budget", "200"], "--triatt-budget 200 must exceed the protected cells: window 128 + prefix = 256"),
        (
            ["--triatt-budget", "900", "--triatt-hybrid", "5"],
            "--triatt-policy must be v1, v2, v3, streaming or random (--triatt-hybrid 0-4; got 5)",
        ),
        (
            ["--triatt-budget", "900", "--triatt-policy", "v4"],
            "--triatt-policy must be v3, v2, v1, streaming or random (got 'v4')",
        ),
        (["--triatt-budget", "900", "--triatt-window", "-3"], "--triatt-window must not be negative"),
        (["--triatt-budget", "900", "--triatt-segments", "0"], "--triatt-segments must be at least 1"),
        (["--triatt-budget", "900", "--triatt-pool", "-1"], "--triatt-pool must not be negative"),
        (["--triatt-budget", "900", "--triatt-pool-spans", "-2"], "--triatt-pool-spans must not be negative"),
    ],
)
def test_invalid_settings_fail_clearly(text: Path, flags: list[str], msg: str) -> None:
    proc = perplexity(text, *flags)
    assert proc.returncode != 0 and msg in proc.stdout + proc.stderr, (proc.returncode, proc.stderr[-1500:])
    assert "Final estimate" not in proc.stdout + proc.stderr


def test_each_sequence_gets_its_own_budget(text: Path) -> None:
    """llama-perplexity -c 1024 -b 2048 evaluates two chunks at once as sequences 0 and 1 (n_seq = 2): both are
    evicted, each to its own budget."""
    exe = shutil.which("llama-perplexity")
    assert exe
    args = [exe, "-m", str(default_model()), "-f", str(text), "-c", "1024", "-b", "2048", "-ub", "512", "--chunks",
            "4", "-t", "2", "-fa", "on", "-lv", "4", "--triatt-budget", "600", "--triatt-warmup", "256"]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "n_seq=2" in log, log[-3000:]
    seqs = re.findall(r"triatt: evict: evicted \d+/\d+ cells round=\d+ seq=(\d) kept=600 budget=600", log)
    assert {"0", "1"} <= set(seqs), log[-3000:]
    final_ppl(log)


def test_a_budget_no_sequence_reaches_is_said(text: Path) -> None:
    """-c 2048 with --triatt-budget 2000: a round starts above budget + divide = 2128 cells, which a sequence of this
    context never holds; the log says so at configuration (before: silence, and no eviction)."""
    proc = perplexity(text, "--triatt-budget", "2000")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "a sequence holds at most 2048 cells, never more than budget + divide = 2128" in log, log[-3000:]
    assert "triatt: evict:" not in log


def _max_rss_mib(args: list[str]) -> tuple[float, str]:
    """Peak resident memory of one run of args (in a child of its own, so that no other run's peak counts)."""
    import json
    import sys

    probe = ("import json, resource, subprocess, sys; p = subprocess.run(json.loads(sys.argv[1]), capture_output=True, "
             "text=True); print(json.dumps([resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, p.returncode, "
             "p.stdout + p.stderr]))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", probe, json.dumps(args)], capture_output=True, text=True, timeout=900)
    rss_kib, rc, log = json.loads(out.stdout)
    assert rc == 0, log[-3000:]
    return rss_kib / 1024, log


def test_host_memory_follows_the_budget_not_the_context(text: Path) -> None:
    """A 131072-cell context with budget 300: the folded keys' records follow the cells that hold keys, not the
    context (before: 1028 B for each of the 131072 cells, +135 MB at the first round; the log said nothing)."""
    exe = shutil.which("llama-completion")
    assert exe
    prompt = text.parent / "prompt.txt"
    prompt.write_text(default_text()[:6000])  # ~1400 tokens: rounds during the prefill
    args = [exe, "-m", str(default_model()), "-f", str(prompt), "-c", "131072", "-n", "4", "-no-cnv", "-t", "2",
            "-fa", "on", "-ctk", "tq3", "-ctv", "tq3", "--temp", "0", "-lv", "4"]  # fmt: skip
    plain, _ = _max_rss_mib(args)
    evicting, log = _max_rss_mib([*args, "--triatt-budget", "300", "--triatt-warmup", "256"])
    assert "triatt: evict:" in log, log[-3000:]
    assert re.search(r"triatt: folded keys on the host: 1028 B a cell that holds a key, at most 1 x 940 cells", log)
    assert evicting - plain < 40, (plain, evicting)
