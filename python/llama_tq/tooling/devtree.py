"""Developer workflow for the patch series: a git working copy of the base, and format-patch export.

llama-tq dev init DIR     # base as commit 'base', then one commit per patch; csrc files symlinked in
(edit, commit or amend in DIR)
llama-tq dev export DIR   # git format-patch base..HEAD into patches/, rewrite patches/series
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from . import base, patcher

_IDENT = ["-c", "user.name=llama-tq", "-c", "user.email=llama-tq@localhost"]


def _git(tree: Path, *args: str) -> str:
    proc = subprocess.run(["git", *_IDENT, *args], cwd=tree, capture_output=True, text=True)
    if proc.returncode != 0:
        raise patcher.PatchError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def init(dest: Path, series: patcher.Series | None = None) -> str:
    series = series or patcher.load_series()
    dest = dest.resolve()
    base.extract_base(dest)
    _git(dest, "init", "-q", "-b", "main")
    _git(dest, "add", "-A")
    _git(
        dest,
        "commit",
        "-q",
        "-m",
        f"llama.cpp {base.LLAMA_CPP_COMMIT[:7]} as vendored in llama-cpp-python {base.SDIST_VERSION}",
    )
    _git(dest, "tag", "base")
    for p in series.patches:
        _git(dest, "am", "-q", "--keep-cr", str(p))
    # Installed files are symlinks to the checkout, so edits to csrc/ reach the dev build directly;
    # they are excluded from git so that format-patch never exports them.
    exclude = dest / ".git" / "info" / "exclude"
    with exclude.open("a") as f:
        for src, rel in series.files:
            link = dest / rel
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(src.resolve())
            f.write(f"/{rel}\n")
    return f"dev tree at {dest}: base + {len(series.patches)} patch commits; build it with plain cmake"


def export(tree: Path, series: patcher.Series | None = None) -> str:
    series = series or patcher.load_series()
    pdir = series.root / "patches"
    if _git(tree, "status", "--porcelain", "--untracked-files=no").strip():
        raise patcher.PatchError(f"{tree} has uncommitted changes: commit them before exporting")
    for old in series.patches:
        old.unlink()
    out = _git(tree, "format-patch", "--no-numbered", "--zero-commit", "--no-signature", "-o", str(pdir), "base..HEAD")
    names = [Path(line).name for line in out.splitlines() if line.strip()]
    (pdir / "series").write_text("".join(f"{n}\n" for n in names))
    return f"exported {len(names)} patches to {pdir}"
