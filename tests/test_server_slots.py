"""llama-server slot save/restore with a TQ cache round-trips the slot's KV bytes exactly (loopback only)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from llama_tq.models import default_model

pytestmark = pytest.mark.e2e


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(port: int, path: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return dict(json.loads(r.read()))


@pytest.fixture
def server(tmp_path: Path):  # type: ignore[no-untyped-def]
    exe = shutil.which("llama-server")
    assert exe
    port = free_port()
    slots = tmp_path / "slots"
    slots.mkdir()
    proc = subprocess.Popen(
        [exe, "-m", str(default_model()), "--host", "127.0.0.1", "--port", str(port), "-c", "1024", "-np", "1",
         "-t", "2", "-fa", "on", "-ctk", "tq4", "-ctv", "tq3", "--slot-save-path", str(slots), "--no-webui"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("llama-server did not become healthy")
        yield port, slots
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_slot_save_restore_is_bit_exact(server) -> None:  # type: ignore[no-untyped-def]
    port, slots = server
    out = post(port, "/completion", {"prompt": "The capital of France is Paris. The capital of Germany is",
                                      "n_predict": 4, "temperature": 0, "cache_prompt": True})  # fmt: skip
    assert "Berlin" in str(out["content"])
    post(port, "/slots/0?action=save", {"filename": "a.bin"})
    post(port, "/slots/0?action=erase", {})
    restored = post(port, "/slots/0?action=restore", {"filename": "a.bin"})
    assert int(restored["n_restored"]) > 0  # type: ignore[call-overload]
    post(port, "/slots/0?action=save", {"filename": "b.bin"})
    a, b = (slots / "a.bin").read_bytes(), (slots / "b.bin").read_bytes()
    assert a == b and len(a) > 0
