"""The pinned llama.cpp base: fetch it from PyPI with pip, verify it, cache it, extract it.

The base is the llama.cpp tree vendored in the PyPI sdist named by patches/base.env. Nothing is
fetched from any other host. The verified sdist is cached (LLAMA_TQ_CACHE or ~/.cache/llama-tq),
so a second build does not fetch it again.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from .. import paths
from ..errors import BaseError


def read_pin(path: Path | None = None) -> dict[str, str]:
    """The KEY=VALUE lines of patches/base.env, the one file that names the pinned base."""
    path = path or paths.series_root() / "patches" / "base.env"
    pin = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            pin[key.strip()] = value.strip()
    return pin


_PIN = read_pin()
SDIST_NAME = _PIN["SDIST_NAME"]
SDIST_VERSION = _PIN["SDIST_VERSION"]
SDIST_SHA256 = _PIN["SDIST_SHA256"]
LLAMA_CPP_COMMIT = _PIN["LLAMA_CPP_COMMIT"]
SDIST_FILE = f"{SDIST_NAME.replace('-', '_')}-{SDIST_VERSION}.tar.gz"
VENDOR_PREFIX = f"{SDIST_NAME.replace('-', '_')}-{SDIST_VERSION}/vendor/llama.cpp/"


def cache_dir() -> Path:
    env = os.environ.get("LLAMA_TQ_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "llama-tq"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _pip_download(dest: Path) -> None:
    # --no-build-isolation: pip still prepares the sdist's metadata, and with isolation (plus
    # --no-binary :all:, which also covers build dependencies) it would compile cmake from source.
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(dest)]
    spec = f"{SDIST_NAME}=={SDIST_VERSION}"
    attempts = [[*base, "--no-build-isolation", spec], [*base, spec]]
    errors = []
    for cmd in attempts:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode == 0 and (dest / SDIST_FILE).is_file():
            return
        errors.append(f"$ {' '.join(cmd)}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    raise BaseError(f"pip could not download {spec}:\n" + "\n".join(errors))


def fetch_sdist(verbose: bool = True) -> Path:
    """Return the verified, cached sdist, downloading it with pip the first time."""
    cached = cache_dir() / SDIST_FILE
    if cached.is_file():
        if sha256_of(cached) == SDIST_SHA256:
            return cached
        cached.unlink()  # corrupt or tampered: fetch again
    cached.parent.mkdir(parents=True, exist_ok=True)
    if verbose:
        print(f"llama-tq: fetching {SDIST_NAME}=={SDIST_VERSION} from PyPI with pip", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=cached.parent) as tmp:
        _pip_download(Path(tmp))
        got = Path(tmp) / SDIST_FILE
        digest = sha256_of(got)
        if digest != SDIST_SHA256:
            raise BaseError(f"{SDIST_FILE}: sha256 {digest} does not match the pinned {SDIST_SHA256}")
        os.replace(got, cached)
    return cached


def _checked(members: list[tarfile.TarInfo], sdist: Path) -> list[tarfile.TarInfo]:
    """The members, if each stays inside the extraction folder as the "data" filter demands: relative paths without
    "..", plain files, folders and symbolic links that point inside; else BaseError (nothing extracted)."""
    for m in members:
        where = posixpath.join(posixpath.dirname(m.name), m.linkname) if m.issym() else m.name
        for path in {m.name, where}:
            if posixpath.isabs(path) or posixpath.normpath(path).split("/")[0] == "..":
                raise BaseError(f"{sdist}: refusing to extract {m.name!r}: it points outside the tree")
        if not (m.isfile() or m.isdir() or m.issym()):
            raise BaseError(f"{sdist}: refusing to extract {m.name!r}: not a file, folder or symbolic link")
        m.mode &= 0o755  # as the filter: no set-id bits, no write for others
    return members


def extract_base(dest: Path, sdist: Path | None = None) -> Path:
    """Extract the vendored llama.cpp tree into `dest` (which must not exist yet)."""
    sdist = sdist or fetch_sdist()
    if dest.exists():
        raise BaseError(f"{dest} already exists")
    tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=dest.parent))
    try:
        with tarfile.open(sdist, "r:gz") as tar:
            members = []
            for m in tar.getmembers():
                if m.name.startswith(VENDOR_PREFIX) and len(m.name) > len(VENDOR_PREFIX):
                    m.name = m.name[len(VENDOR_PREFIX) :]
                    if m.name != ".git":  # a dangling submodule gitlink in the sdist: not part of the tree
                        members.append(m)
            if not members:
                raise BaseError(f"{sdist} holds no {VENDOR_PREFIX}")
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, members=members, filter="data")
            else:  # Python 3.11.0-3.11.3 have no extraction filters: the same refusals, checked here
                tar.extractall(tmp, members=_checked(members, sdist))
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
