"""llama-server with a TQ cache under bounded loopback load (issue 43): concurrent completions on 4 slots, malformed
request bodies and clients that disconnect mid-stream, with and without eviction. Every well-formed request is
answered, every malformed one gets an HTTP error, and the server stays healthy."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from server_util import healthy, llama_server, post

pytestmark = pytest.mark.e2e

MALFORMED = [
    b"{",  # cut JSON
    b"[1, 2, 3]",  # not an object
    b'{"prompt": 42, "n_predict": 4}',  # prompt of the wrong type
    b'{"prompt": "x", "n_predict": "many"}',
    b'{"prompt": "x", "temperature": "hot"}',
    b"\xff\xfe not utf-8",
]


def malformed(port: int, body: bytes) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=body,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def disconnect_mid_stream(port: int) -> None:
    """A streaming completion whose client goes away after the first bytes."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"prompt": "Count slowly from one to one hundred:", "n_predict": 64, "stream": True})
    conn.request("POST", "/completion", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    resp.read(16)
    conn.sock.shutdown(socket.SHUT_RDWR)  # type: ignore[union-attr]
    conn.close()


@pytest.mark.parametrize("evict", [False, True], ids=["no-eviction", "eviction"])
def test_load_malformed_and_disconnects(evict: bool, tmp_path: Path) -> None:
    args = ["-c", "4096", "-np", "4", "-t", "2", "-fa", "on", "-ctk", "tq3", "-ctv", "tq3"]
    if evict:
        args += ["--triatt-budget", "384", "--triatt-divide", "64", "--triatt-warmup", "64", "-lv", "4"]
    prompts = [f"Item {i}: the list of fruit in basket {i} starts with apples, pears and" for i in range(8)]
    answers: dict[int, str] = {}
    errors: list[str] = []
    with llama_server(args, tmp_path / "server.log") as port:

        def work(i: int) -> None:
            try:
                if i % 4 == 3:
                    disconnect_mid_stream(port)
                long = " ".join(prompts) * (4 if evict else 1)  # past budget + divide when evicting
                out = post(port, "/completion", {"prompt": long + prompts[i], "n_predict": 8, "temperature": 0})
                answers[i] = str(out["content"])
            except Exception as e:
                errors.append(f"{i}: {e!r}")

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        codes = [malformed(port, b) for b in MALFORMED]
        for t in threads:
            t.join(timeout=600)
        assert not errors, errors
        assert sorted(answers) == list(range(len(prompts))) and all(answers.values()), answers
        assert all(400 <= c < 600 for c in codes), codes  # upstream answers a JSON parse error with 500
        assert healthy(port)
        if evict:  # eviction confirmed from the log, not assumed
            assert "triatt: evict: evicted" in (tmp_path / "server.log").read_text()
