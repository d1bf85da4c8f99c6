"""TQ caches across machines with llama.cpp's own RPC backend: two `ggml-rpc-server` processes (built from the
patched tree, shipped with the package) on loopback hold the model's layers and their KV cache, split by layer
(`-sm layer`); perplexity is the one the same cache gives computed locally. The GPU script runs a CUDA rpc-server."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from llama_tq.harness.demo import default_text
from llama_tq.models import default_model
from server_util import free_port

pytestmark = pytest.mark.e2e


def _listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@contextmanager
def rpc_server(log: Path) -> Iterator[str]:
    """A CPU ggml-rpc-server on loopback; yields its HOST:PORT once it listens."""
    exe = shutil.which("ggml-rpc-server")
    assert exe, "ggml-rpc-server is not installed"
    port = free_port()
    with log.open("w") as out:
        proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port), "-t", "1"], stdout=out, stderr=out)
        try:
            deadline = time.monotonic() + 60
            while not _listens(port):  # (its banner goes to a block-buffered stdout: poll the port instead)
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"ggml-rpc-server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)
            yield f"127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def _ppl(text: Path, *flags: str) -> tuple[float, str]:
    exe = shutil.which("llama-perplexity")
    assert exe
    args = [exe, "-m", str(default_model()), "-f", str(text), "-c", "512", "-b", "512", "--chunks", "3", "-t", "2",
            "-fa", "on", "-ctk", "tq3", "-ctv", "tq3", *flags]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", log)
    assert m, log[-2000:]
    return float(m.group(1)), log


def test_tq_cache_split_over_two_rpc_servers(tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    text.write_text(default_text()[:12_000])
    local, _ = _ppl(text, "--no-repack")  # a remote CPU backend gets the weights as they are (no repacking)
    with ExitStack() as stack:
        ends = [stack.enter_context(rpc_server(tmp_path / f"rpc{i}.log")) for i in range(2)]
        remote, log = _ppl(text, "--rpc", ",".join(ends), "-ngl", "99", "-sm", "layer", "-lv", "4")
    # both servers hold layers and a part of the TQ cache
    for end in ends:
        assert re.search(rf"RPC\d*\[{re.escape(end)}\] KV buffer size", log), log[-3000:]
    assert re.search(r"offloaded \d+/\d+ layers", log), log[-3000:]
    assert remote == local, (local, remote)  # the same ops on the same bytes: the same result
