"""Installs the llama-cpp-python of the pinned sdist (its Python package only) for use with llama-tq's libraries:
`llama-tq python-binding`."""

from __future__ import annotations

import os
import subprocess
import sys

from ..errors import ToolError
from ..paths import lib_dir
from . import base

_RUNTIME_DEPS = ["typing-extensions>=4.5", "diskcache>=5.6", "jinja2>=2.11"]


def install_llama_cpp_python() -> str:
    """pip-install the llama-cpp-python of the pinned sdist, Python package only (LLAMA_BUILD=OFF)."""
    sdist = base.fetch_sdist()
    env = {**os.environ, "CMAKE_ARGS": "-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"}
    for cmd in (
        [sys.executable, "-m", "pip", "install", "--no-deps", str(sdist)],
        [sys.executable, "-m", "pip", "install", *_RUNTIME_DEPS],
    ):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ToolError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return f"installed llama-cpp-python {base.SDIST_VERSION}; use it with LLAMA_CPP_LIB_PATH={lib_dir()}"
