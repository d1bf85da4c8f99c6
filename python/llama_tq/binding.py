"""llama-cpp-python on the patched libraries: the matching version, installed from the same pinned sdist.

llama-tq python-binding          # pip install llama-cpp-python==0.3.36 without its own llama.cpp build
import llama_tq; llama_cpp = llama_tq.llama_cpp()   # LLAMA_CPP_LIB_PATH -> llama_tq.lib_dir(), then import
llm = llama_cpp.Llama(model, type_k=llama_tq.GGML_TYPE_TQ4, type_v=llama_tq.GGML_TYPE_TQ3, flash_attn=True)
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from types import ModuleType

from . import base
from .paths import lib_dir

# ggml_type values registered by the patch series (after upstream's last type, GGML_TYPE_Q2_0 = 42)
GGML_TYPE_TQ3 = 43
GGML_TYPE_TQ4 = 44

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
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return f"installed llama-cpp-python {base.SDIST_VERSION}; use it with LLAMA_CPP_LIB_PATH={lib_dir()}"


def llama_cpp() -> ModuleType:
    """Import llama_cpp bound to the patched libraries (sets LLAMA_CPP_LIB_PATH unless already set)."""
    if "llama_cpp" not in sys.modules:
        os.environ.setdefault("LLAMA_CPP_LIB_PATH", str(lib_dir()))
    try:
        return importlib.import_module("llama_cpp")
    except ImportError as e:
        raise ImportError("llama-cpp-python is not installed: run `llama-tq python-binding`") from e
