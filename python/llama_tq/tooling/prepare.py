"""Prepare the patched llama.cpp source tree for the build (called by CMakeLists.txt at configure time).

    python -m llama_tq.tooling.prepare DEST [--src DIR]

Without --src (and without LLAMA_TQ_LLAMA_SRC in the environment) the pinned base is used: fetched
with pip once, verified by sha256, cached. With a user's tree, its series check runs first and the tree
is copied, never modified. A stamp (hash of the patches and the base's identity) makes re-configuring a
no-op when they did not change; edited csrc/ files are refreshed in place, and a changed series is prepared
aside and synced in file by file, so only what changed recompiles. After changing your own tree, delete the
build directory to copy it again.
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


def _copy_ignore(root: str, names: list[str]) -> set[str]:
    """VCS data and build-output folders stay behind; only folders: cmake/build-info.cmake and
    common/build-info.cpp.in are sources every llama.cpp tree needs."""
    out = {n for n in names if n in (".git", "node_modules", "__pycache__")}
    out |= {n for n in names if (n == "build" or n.startswith("build-")) and os.path.isdir(os.path.join(root, n))}
    return out


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


def _sync_tree(new: Path, old: Path) -> int:
    """Make `old` identical to `new`, touching only files whose content or mode differ, so that an incremental
    build recompiles just what a changed patch changed. Returns the number of files written or removed."""
    changed = 0
    seen: set[str] = set()
    for dirpath, _, files in os.walk(new):
        for f in files:
            n = Path(dirpath) / f
            rel = str(n.relative_to(new))
            seen.add(rel)
            o = old / rel
            same = (o.is_file() and not o.is_symlink() and n.stat().st_mode == o.stat().st_mode
                    and n.read_bytes() == o.read_bytes())  # fmt: skip
            if not same:
                o.parent.mkdir(parents=True, exist_ok=True)
                if o.is_symlink() or o.exists():
                    o.unlink()
                shutil.copy2(n, o, follow_symlinks=False)
                os.utime(o, follow_symlinks=False)
                changed += 1
    for dirpath, _, files in os.walk(old):
        for f in files:
            o = Path(dirpath) / f
            if str(o.relative_to(old)) not in seen:
                o.unlink()
                changed += 1
    return changed


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
    staging = dest.with_name(dest.name + ".new")
    if staging.exists():
        shutil.rmtree(staging)
    staging.parent.mkdir(parents=True, exist_ok=True)
    if src is None:
        base.extract_base(staging)
    else:
        shutil.copytree(src, staging, symlinks=True, ignore=_copy_ignore)
    msg = patcher.apply(staging, series)
    if dest.is_dir():
        changed = _sync_tree(staging, dest)
        shutil.rmtree(staging)
        msg += f"; {changed} files changed in the prepared tree"
    else:
        os.replace(staging, dest)
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
