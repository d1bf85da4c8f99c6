"""Prepare the patched llama.cpp source tree for the build (called by CMakeLists.txt at configure time).

    python -m llama_tq.prepare DEST [--src DIR]

Without --src (and without LLAMA_TQ_LLAMA_SRC in the environment) the pinned base is used: fetched
with pip once, verified by sha256, cached. With a user's tree, its series check runs first and the tree
is copied, never modified. A stamp (hash of the patches and the base's identity) makes re-configuring a
no-op when they did not change; edited csrc/ files are refreshed in place, so only they recompile. After
changing your own tree, delete the build directory to copy it again.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

from . import base, patcher

_COPY_IGNORE = shutil.ignore_patterns(".git", "build", "build-*", "node_modules", "__pycache__")


def _inputs_digest(series: patcher.Series, src: Path | None) -> str:
    h = hashlib.sha256()
    h.update(f"base={src.resolve() if src else base.SDIST_SHA256}\n".encode())
    for p in series.patches:
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def _sync_installed_files(dest: Path, series: patcher.Series) -> int:
    """Refresh the csrc copies in a prepared tree; unchanged files keep their mtime (no rebuild)."""
    n = 0
    for src, rel in series.files:
        target = dest / rel
        data = src.read_bytes()
        if not target.is_file() or target.read_bytes() != data:
            target.write_bytes(data)
            n += 1
    return n


def _touch_all(root: Path) -> None:
    """Give every file the current mtime: extraction keeps archive mtimes, which can be older than the
    objects of a previous build in the same build directory, and the build would then skip them."""
    now = time.time()
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                os.utime(p, (now, now))


def prepare(dest: Path, src: Path | None = None, series: patcher.Series | None = None) -> str:
    series = series or patcher.load_series()
    stamp = dest.with_name(dest.name + ".stamp")
    digest = _inputs_digest(series, src)
    if src is not None:
        result = patcher.check(src, series)
        if result.state == "fails":
            raise patcher.PatchError(f"LLAMA_TQ_LLAMA_SRC={src}: {result.message}")
    if dest.is_dir() and stamp.is_file() and stamp.read_text() == digest:
        n = _sync_installed_files(dest, series)
        return f"{dest} is up to date" + (f" ({n} csrc files refreshed)" if n else "")
    stamp.unlink(missing_ok=True)
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src is None:
        base.extract_base(dest)
    else:
        shutil.copytree(src, dest, symlinks=True, ignore=_COPY_IGNORE)
    msg = patcher.apply(dest, series)
    _touch_all(dest)
    stamp.write_text(digest)
    origin = src or f"{base.SDIST_NAME}=={base.SDIST_VERSION} (sha256 verified)"
    return f"prepared {dest} from {origin}: {msg}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dest", type=Path)
    ap.add_argument("--src", type=Path, default=os.environ.get("LLAMA_TQ_LLAMA_SRC") or None)
    args = ap.parse_args(argv)
    try:
        print(prepare(args.dest.resolve(), args.src.resolve() if args.src else None))
    except (patcher.PatchError, base.BaseError) as e:
        print(f"llama-tq: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
