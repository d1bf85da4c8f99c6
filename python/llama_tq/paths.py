"""Where llama-tq's files are: the built tools and libraries, and the patch series."""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def lib_dir() -> Path:
    """Directory with the patched shared libraries (libllama, libggml*): use it as LLAMA_CPP_LIB_PATH."""
    return PACKAGE_DIR / "lib"


def bin_dir() -> Path:
    """Directory with the patched llama.cpp tools (llama-perplexity, llama-completion, ...)."""
    return PACKAGE_DIR / "bin"


def include_dir() -> Path:
    """Directory with the headers of the shipped libraries (ggml*.h, llama.h, tq_codec.h)."""
    return PACKAGE_DIR / "include"


def series_root() -> Path:
    """Directory holding patches/ and csrc/: the source checkout when run from one, else the installed copy."""
    checkout = PACKAGE_DIR.parent.parent
    if (checkout / "patches" / "series").is_file() and (checkout / "csrc").is_dir():
        return checkout
    return PACKAGE_DIR / "data"
