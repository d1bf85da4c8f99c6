"""No answer depends on another request: temperature-0 answers on llama-server are the same with --parallel 1 and 4
(unified cache or a stream per slot) and whatever was asked before, for every cache type where f16's are (issue 43:
with a key mean shared by the cache, tq3 matched for 0-1 of 12 prompts). The slot tests restore a sequence's state
beside other sequences' keys (before: refused, the means differed) and copy nothing of one slot into another."""

from __future__ import annotations

from pathlib import Path

import pytest

from server_util import llama_server, post

pytestmark = pytest.mark.e2e

PROMPTS = [
    "The capital of France is Paris. The capital of Germany is",
    "Water boils at a temperature of",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea, there lived",
]
UNRELATED = "Zebras, violins and the history of the printing press in sixteenth-century Venice: " * 6
BASE = ["-c", "2048", "-t", "2", "-fa", "on"]


def _ask(port: int, prompt: str, slot: int = -1) -> str:
    body: dict[str, object] = {"prompt": prompt, "n_predict": 24, "temperature": 0, "cache_prompt": False,
                               "id_slot": slot}  # fmt: skip
    return str(post(port, "/completion", body)["content"])


@pytest.mark.parametrize("kv", ["f16", "tq3", "tq4"])
def test_answers_do_not_depend_on_parallel_or_history(tmp_path: Path, kv: str) -> None:
    # --cache-ram 0: a finished slot's cells stay in the KV cache (the host prompt cache would move them out)
    cache = ["-t", "2", "-fa", "on", "-ctk", kv, "-ctv", kv, "--cache-ram", "0"]
    # the reference: one slot with the context each of the 4 slots has (a unified cache: all of it; a stream per
    # slot: a quarter, and the key transforms follow the positions a sequence can span)
    for ctx, mode in ((2048, "--kv-unified"), (512, "--no-kv-unified")):
        with llama_server([*cache, "-c", str(ctx), "-np", "1"], tmp_path / "np1.log") as port:
            want = [_ask(port, p) for p in PROMPTS]
        with llama_server([*cache, "-c", "2048", "-np", "4", mode], tmp_path / "np4.log") as port:
            _ask(port, UNRELATED, slot=0)  # another user's text first, still in the cache on slot 0
            got = [_ask(port, p, slot=(i % 3) + 1) for i, p in enumerate(PROMPTS)]
            again = _ask(port, PROMPTS[0], slot=2)  # after all of them, on another slot
        assert got == want, (kv, mode)
        assert again == want[0], (kv, mode)


def test_sequence_state_restores_beside_other_sequences(tmp_path: Path) -> None:
    """Slot 0's saved state restores while slot 1 holds another request's keys (each sequence carries its own key
    mean), and slot 0 then answers as it did before the save."""
    slots = tmp_path / "slots"
    slots.mkdir()
    args = [*BASE, "-ctk", "tq3", "-ctv", "tq3", "-np", "2", "--kv-unified", "--swa-full"]
    args += ["--slot-save-path", str(slots)]  # --swa-full: the restored prompt is reused (a window cache would not)
    prompt = "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is"
    with llama_server(args, tmp_path / "server.log") as port:
        body = {"prompt": prompt, "n_predict": 6, "temperature": 0, "cache_prompt": True, "id_slot": 0}
        want = post(port, "/completion", body)["content"]
        post(port, "/slots/0?action=save", {"filename": "s0.bin"})
        post(port, "/slots/0?action=erase", {})
        post(port, "/completion", {"prompt": UNRELATED, "n_predict": 4, "temperature": 0, "cache_prompt": True,
                                   "id_slot": 1})  # fmt: skip
        restored = post(port, "/slots/0?action=restore", {"filename": "s0.bin"})
        assert int(str(restored["n_restored"])) > 0
        got = post(port, "/completion", body)
        timings = got["timings"]
        assert got["content"] == want
        assert isinstance(timings, dict) and int(timings["cache_n"]) > 0  # the restored prompt was reused


@pytest.mark.parametrize("kv", ["f16", "tq3"])
def test_context_shift_beside_another_sequence(tmp_path: Path, kv: str) -> None:
    """A context shift (K-shift) of slot 1 while slot 0 holds another text: each cell goes back to its true key with
    its own sequence's key mean, so slot 1's long answer is the one a lone slot of the same size gives."""
    args = ["-t", "2", "-fa", "on", "-ctk", kv, "-ctv", kv, "--context-shift"]
    body: dict[str, object] = {"prompt": "The history of the Roman Empire", "n_predict": 600, "temperature": 0,
                               "cache_prompt": False}  # fmt: skip
    with llama_server([*args, "-c", "512", "-np", "1"], tmp_path / "np1.log") as port:
        want = post(port, "/completion", body)["content"]
    with llama_server([*args, "-c", "1024", "-np", "2", "--no-kv-unified"], tmp_path / "np2.log") as port:
        _ask(port, UNRELATED, slot=0)
        got = post(port, "/completion", {**body, "id_slot": 1})["content"]
    log = (tmp_path / "np2.log").read_text()
    assert "context shift" in log.lower() or "n_discard" in log, log[-2000:]
    assert got == want


def test_copied_sequences_answer_alike(tmp_path: Path) -> None:
    """n_cmpl = 2: llama-server evaluates the prompt once and copies its cells to a child slot (seq_cp); the child
    takes the parent's key mean with them, so both answers are the one a lone slot gives."""
    import json
    import urllib.request

    prompt = PROMPTS[3]
    cache = ["-t", "2", "-fa", "on", "-ctk", "tq3", "-ctv", "tq3", "-c", "2048", "--cache-ram", "0"]
    with llama_server([*cache, "-np", "1"], tmp_path / "np1.log") as port:
        want = _ask(port, prompt)
    with llama_server([*cache, "-np", "3", "--kv-unified"], tmp_path / "np3.log") as port:
        _ask(port, UNRELATED, slot=2)
        body = {"prompt": prompt, "n_predict": 24, "temperature": 0, "cache_prompt": False, "n_cmpl": 2}
        req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=300) as r:
            got = json.loads(r.read())
    assert isinstance(got, list) and len(got) == 2, got
    assert [g["content"] for g in got] == [want, want]
