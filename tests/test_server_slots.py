"""llama-server slot save/restore with a TQ cache round-trips the slot's KV bytes exactly (loopback only)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from server_util import llama_server, post

pytestmark = pytest.mark.e2e


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    slots = tmp_path / "slots"
    slots.mkdir()
    args = ["-c", "1024", "-np", "1", "-t", "2", "-fa", "on", "-ctk", "tq4", "-ctv", "tq3"]
    args += ["--slot-save-path", str(slots)]
    with llama_server(args, tmp_path / "server.log") as port:
        yield port, slots


def test_slot_save_restore_is_bit_exact(server: tuple[int, Path]) -> None:
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


def _k_rows_offset(data: bytes) -> int:
    """Where the first layer's K rows start in a slot file (llama_state_seq_save_file's layout: magic, version,
    token count, tokens, then the memory's state: streams, cells (pos, seq ids), v_trans, layers, K type, row size)."""
    import struct

    ntok = struct.unpack_from("<I", data, 8)[0]
    off = 12 + 4 * ntok
    n_stream, cells = struct.unpack_from("<II", data, off)
    assert n_stream == 1 and cells > 0
    off += 8
    for _ in range(cells):
        _pos, nseq = struct.unpack_from("<iI", data, off)
        off += 8 + 4 * nseq
    return off + 4 + 4 + 4 + 8  # v_trans, n_layer, K type, K row size


def _restore_fails(port: int, name: str) -> str:
    import urllib.error

    try:
        post(port, "/slots/0?action=restore", {"filename": name})
    except urllib.error.HTTPError as e:
        return e.read().decode()
    raise AssertionError(f"restoring {name} succeeded")


def test_corrupt_slot_files_are_refused_and_change_nothing(server: tuple[int, Path]) -> None:
    """A slot file cut short, padded, with a NaN TQ scale or a NaN / huge key mean is refused with an error; the
    server keeps serving and its answers are the ones before (before: a cut file aborted llama-server; a NaN scale or
    mean restored with HTTP 200 and changed the output)."""
    import struct

    port, slots = server
    prompt = {"prompt": "The capital of France is Paris. The capital of Germany is", "n_predict": 6, "temperature": 0}
    want = post(port, "/completion", prompt)["content"]
    post(port, "/slots/0?action=save", {"filename": "good.bin"})
    good = (slots / "good.bin").read_bytes()
    k0 = _k_rows_offset(good)
    mean = good.index(struct.pack("<I", 0x324B5154)) + 16  # "TQK2", flags, rows (1), set, the first layer's mean
    bad = {
        "cut.bin": good[:-1],
        "cut_more.bin": good[: len(good) // 2],
        "padded.bin": good + b"\0" * 64,
        "nan_scale.bin": good[:k0] + struct.pack("<H", 0x7FC0) + good[k0 + 2 :],
        "nan_mean.bin": good[:mean] + struct.pack("<f", float("nan")) + good[mean + 4 :],
        "huge_mean.bin": good[:mean] + struct.pack("<f", 1e30) + good[mean + 4 :],
    }
    for name, data in bad.items():
        (slots / name).write_bytes(data)
        assert "Unable to restore slot" in _restore_fails(port, name), name
        assert post(port, "/completion", prompt)["content"] == want, name
    restored = post(port, "/slots/0?action=restore", {"filename": "good.bin"})
    assert int(str(restored["n_restored"])) > 0
