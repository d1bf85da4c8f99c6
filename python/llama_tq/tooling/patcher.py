"""Apply, check and revert the llama-tq patch series on a llama.cpp tree, atomically.

The series is `patches/series` (patch files, in order, made with `git format-patch`) plus the files
from csrc/ that the patches expect inside the tree, derived from the layout (`installed_files`):
csrc/llama.cpp/ mirrors their destinations, and the standalone codec and TriAttention engine go
where STANDALONE_DEST says. Every operation first computes the complete result in a
private staging copy of the touched files; the tree is written only after the whole series
succeeded there, and a failure while writing rolls every written file back. So the tree is
either fully patched or byte-identical to before.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .. import paths
from ..errors import PatchError, UsageError

# Standalone sources (built on their own for the Python modules) and where the series expects them in the tree.
STANDALONE_DEST = {"csrc/codec": "ggml/src/tq", "csrc/triatt": "src/triatt"}
# Sources that compile only inside a patched tree, at their destination paths below this directory.
MIRROR = "csrc/llama.cpp"


def installed_files(root: Path) -> list[tuple[Path, str]]:
    """(source in the checkout, destination in the tree) of every file the series installs."""
    out = [(f, f"{dest}/{f.name}") for src, dest in STANDALONE_DEST.items() for f in sorted((root / src).iterdir())
           if f.is_file()]  # fmt: skip
    mirror = root / MIRROR
    out += [(f, str(f.relative_to(mirror))) for f in sorted(mirror.rglob("*")) if f.is_file()]
    return out


@dataclass(frozen=True)
class Series:
    root: Path
    patches: tuple[Path, ...]
    files: tuple[tuple[Path, str], ...]  # (source file, destination relative to the tree)
    patched_paths: tuple[str, ...] = field(default=())

    @property
    def touched(self) -> tuple[str, ...]:
        return tuple(sorted({*self.patched_paths, *(d for _, d in self.files)}))


def _paths_in_patch(patch: Path) -> set[str]:
    found: set[str] = set()
    for line in patch.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("diff --git "):
            a, _, b = line[len("diff --git ") :].partition(" b/")
            found.add(a.removeprefix("a/"))
            found.add(b)
    return found


def load_series(root: Path | None = None) -> Series:
    root = root or paths.series_root()
    pdir = root / "patches"
    series_file = pdir / "series"
    if not series_file.is_file():
        raise PatchError(f"no patch series at {series_file}")
    names = [ln.strip() for ln in series_file.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    patches = tuple(pdir / n for n in names)
    for p in patches:
        if not p.is_file():
            raise PatchError(f"patches/series names {p.name}, which does not exist")
    files = installed_files(root)
    touched: set[str] = set()
    for p in patches:
        touched |= _paths_in_patch(p)
    return Series(root, patches, tuple(files), tuple(sorted(touched)))


# (content, mode) of a file, or None for "absent"
FileState = tuple[bytes, int] | None


def _read_state(path: Path) -> FileState:
    if not path.is_file():
        return None
    return path.read_bytes(), path.stat().st_mode & 0o777


def _git(args: list[str], cwd: Path, ceiling: Path | None = None) -> subprocess.CompletedProcess[str]:
    if shutil.which("git") is None:
        raise PatchError("git is required to apply patches (it is used as `git apply`), but it is not on PATH")
    env = dict(os.environ)
    if ceiling is not None:
        env["GIT_CEILING_DIRECTORIES"] = str(ceiling)  # never let `git apply` find an enclosing repository
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)


def _stage(tree: Path, series: Series, reverse: bool) -> dict[str, FileState]:
    """Run the whole series (or its reverse) on a private copy of the touched files."""
    with tempfile.TemporaryDirectory(prefix="llama-tq-stage-") as tmp:
        stage = Path(tmp) / "tree"
        stage.mkdir()
        for rel in series.patched_paths:
            src = tree / rel
            if src.is_file():
                (stage / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, stage / rel)
        for patch in reversed(series.patches) if reverse else series.patches:
            args = ["apply", "--whitespace=nowarn", *(["-R"] if reverse else []), str(patch)]
            proc = _git(args, stage, ceiling=Path(tmp))
            if proc.returncode != 0:
                what = "revert" if reverse else "apply"
                raise PatchError(f"{patch.name} does not {what}: {proc.stderr.strip()}")
        return {rel: _read_state(stage / rel) for rel in series.patched_paths}


def _install_states(series: Series, install: bool) -> dict[str, FileState]:
    return {dest: ((src.read_bytes(), 0o644) if install else None) for src, dest in series.files}


def _files_installed(tree: Path, series: Series) -> bool:
    return all((tree / d).is_file() and (tree / d).read_bytes() == s.read_bytes() for s, d in series.files)


def _git_dirty(tree: Path, rels: tuple[str, ...]) -> list[str]:
    """Files among `rels` with local changes, if `tree` is a git work tree; [] otherwise."""
    if shutil.which("git") is None:
        return []
    probe = _git(["rev-parse", "--show-toplevel"], tree)
    if probe.returncode != 0 or Path(probe.stdout.strip()).resolve() != tree.resolve():
        return []
    proc = _git(["status", "--porcelain", "--untracked-files=all", "--", *rels], tree)
    return [ln[3:] for ln in proc.stdout.splitlines() if ln.strip()]


def _commit(tree: Path, changes: dict[str, FileState]) -> None:
    """Write all changes or none: on any error, restore what was already written."""
    done: list[tuple[Path, FileState]] = []
    made_dirs: list[Path] = []
    try:
        for rel, new in sorted(changes.items()):
            dst = tree / rel
            done.append((dst, _read_state(dst)))
            _write_state(dst, new, made_dirs)
    except BaseException:
        for dst, old in reversed(done):
            _write_state(dst, old, [])
        for d in reversed(made_dirs):
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
        raise
    # Remove directories left empty by deletions (e.g. the directory that held installed files).
    for rel, new in changes.items():
        if new is None:
            _prune_empty_parents(tree, (tree / rel).parent)


def _write_state(dst: Path, state: FileState, made_dirs: list[Path]) -> None:
    if state is None:
        if dst.exists():
            dst.unlink()
        return
    data, mode = state
    missing = [p for p in [dst.parent, *dst.parent.parents] if not p.exists()]
    for d in reversed(missing):
        d.mkdir()
        made_dirs.append(d)
    tmp = dst.with_name(f".{dst.name}.llama-tq-tmp")
    tmp.write_bytes(data)
    os.chmod(tmp, mode)
    os.replace(tmp, dst)


def _prune_empty_parents(tree: Path, d: Path) -> None:
    root = tree.resolve()
    while d.resolve() != root and d.is_dir() and not any(d.iterdir()):
        d.rmdir()
        d = d.parent


@dataclass(frozen=True)
class CheckResult:
    state: str  # "applies", "applied" or "fails"
    message: str


def _require_tree(tree: Path) -> None:
    if not (tree / "ggml").is_dir() or not (tree / "CMakeLists.txt").is_file():
        raise UsageError(f"{tree} does not look like a llama.cpp tree (no ggml/ or CMakeLists.txt)")


def check(tree: Path, series: Series | None = None) -> CheckResult:
    """Say whether the series applies, is already applied, or which patch fails and why. Changes nothing."""
    series = series or load_series()
    _require_tree(tree)
    if _files_installed(tree, series):
        try:
            _stage(tree, series, reverse=True)
            return CheckResult("applied", f"already applied ({len(series.patches)} patches)")
        except PatchError:
            pass
    try:
        _stage(tree, series, reverse=False)
    except PatchError as e:
        return CheckResult("fails", str(e))
    clash = [d for s, d in series.files if (tree / d).exists() and (tree / d).read_bytes() != s.read_bytes()]
    if clash:
        names = ", ".join(clash)
        return CheckResult("fails", f"files the series installs already exist with other contents: {names}")
    return CheckResult(
        "applies", f"the series applies cleanly ({len(series.patches)} patches, {len(series.files)} files)"
    )


def apply(tree: Path, series: Series | None = None) -> str:
    series = series or load_series()
    result = check(tree, series)
    if result.state == "applied":
        return "already applied; nothing changed"
    dirty = _git_dirty(tree, series.touched)
    if dirty:
        raise PatchError(
            "refusing to patch: files the series touches have local changes: "
            + ", ".join(dirty)
            + " (commit or stash them first)"
        )
    if result.state == "fails":
        raise PatchError(result.message)
    changes = _stage(tree, series, reverse=False)
    changes.update(_install_states(series, install=True))
    _commit(tree, changes)
    return f"applied {len(series.patches)} patches and installed {len(series.files)} files"


def revert(tree: Path, series: Series | None = None) -> str:
    series = series or load_series()
    if check(tree, series).state != "applied":
        raise PatchError("the series is not applied to this tree (or it was changed since); nothing reverted")
    changes = _stage(tree, series, reverse=True)
    changes.update(_install_states(series, install=False))
    _commit(tree, changes)
    return f"reverted {len(series.patches)} patches and removed {len(series.files)} files"
