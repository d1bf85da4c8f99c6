"""llama-server with TriAttention eviction and 4 slots (issue 15): concurrent completions of different lengths, each
slot evicted to its own budget, no errors, the server healthy after, and an evicted slot's save/restore exact."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from llama_tq.models import default_model
from server_util import free_port, healthy, post

pytestmark = pytest.mark.e2e

BUDGET, DIVIDE = 256, 128  # a round starts above budget + divide cells (triatt.h)
EVICT = re.compile(r"triatt: evict: evicted (\d+)/(\d+) cells round=\d+ seq=(\d+) kept=(\d+) budget=(\d+)")
# prompt lengths in words: ~130 tokens (never evicted) up to ~920 (several rounds); the slot context is 1024
WORDS = (100, 400, 600, 700)
TEXT = " ".join(
    f"Item {i} of the inventory is a box of {i * 7 % 13} red apples kept in room {i % 9}." for i in range(200)
)


def test_slots_evict_to_their_budget_and_restore_exactly(tmp_path: Path) -> None:
    exe = shutil.which("llama-server")
    assert exe
    port, slots, log = free_port(), tmp_path / "slots", tmp_path / "server.log"
    slots.mkdir()
    with log.open("w") as err:
        proc = subprocess.Popen(
            [exe, "-m", str(default_model()), "--host", "127.0.0.1", "--port", str(port), "-c", "4096", "-np", "4",
             "-t", "2", "-fa", "on", "-ctk", "tq4", "-ctv", "tq3", "--triatt-budget", str(BUDGET),
             "--triatt-prefix", "32", "--triatt-window", "64", "--triatt-warmup", "128",
             "--slot-save-path", str(slots), "--no-webui", "-lv", "4"],  # -lv 4: libllama's info lines (rounds)
            stdout=subprocess.DEVNULL, stderr=err, text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while not healthy(port):
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.5)

            results: dict[int, dict[str, object]] = {}
            errors: list[BaseException] = []

            def complete(n: int) -> None:
                try:
                    prompt = " ".join(TEXT.split()[:n]) + " The"
                    results[n] = post(port, "/completion", {"prompt": prompt, "n_predict": 8, "temperature": 0})
                except BaseException as e:  # collected and asserted below
                    errors.append(e)

            threads = [threading.Thread(target=complete, args=(n,)) for n in WORDS]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not errors, errors
            assert all(str(r["content"]).strip() for r in results.values())
            assert healthy(port)

            rounds = [tuple(map(int, m)) for m in EVICT.findall(log.read_text())]
            assert rounds, "no eviction round logged"
            by_seq: dict[int, list[tuple[int, ...]]] = {}
            for ev, n, seq, kept, budget in rounds:
                assert kept == budget == BUDGET and n - ev == kept  # back to its own budget every round
                by_seq.setdefault(seq, []).append((ev, n))
            for r in results.values():
                slot, n_tok = int(r["id_slot"]), int(r["tokens_evaluated"])  # type: ignore[call-overload]
                assert (slot in by_seq) == (n_tok > BUDGET + DIVIDE), (slot, n_tok, sorted(by_seq))
            assert len(by_seq) == 3  # the three long prompts, each in its own slot

            slot = max(by_seq, key=lambda s: len(by_seq[s]))  # the slot evicted most often
            post(port, f"/slots/{slot}?action=save", {"filename": "a.bin"})
            post(port, f"/slots/{slot}?action=erase", {})
            restored = post(port, f"/slots/{slot}?action=restore", {"filename": "a.bin"})
            assert int(restored["n_restored"]) > 0  # type: ignore[call-overload]
            post(port, f"/slots/{slot}?action=save", {"filename": "b.bin"})
            a, b = (slots / "a.bin").read_bytes(), (slots / "b.bin").read_bytes()
            assert a == b and len(a) > 0
            assert healthy(port)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
