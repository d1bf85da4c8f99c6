"""llama-server on loopback for the e2e tests: a free port, JSON POSTs, health, and a started server."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from llama_tq.models import default_model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(port: int, path: str, body: dict[str, object], timeout: float = 300) -> dict[str, object]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return dict(json.loads(r.read()))


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@contextmanager
def llama_server(args: list[str], log: Path, model: Path | None = None) -> Iterator[int]:
    """llama-server on the default model (or `model`) with `args`, its stderr in `log`; yields the port."""
    exe = shutil.which("llama-server")
    assert exe, "llama-server is not installed"
    port = free_port()
    with log.open("w") as err:
        proc = subprocess.Popen(
            [exe, "-m", str(model or default_model()), "--host", "127.0.0.1", "--port", str(port), "--no-webui", *args],
            stdout=subprocess.DEVNULL, stderr=err, text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while not healthy(port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"llama-server did not become healthy: {log.read_text()[-2000:]}")
                time.sleep(0.3)
            yield port
        finally:
            proc.terminate()
            proc.wait(timeout=30)
