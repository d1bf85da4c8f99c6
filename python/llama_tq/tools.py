"""Console entry points that run the patched llama.cpp tools shipped inside the package.

The binaries live in llama_tq/bin next to llama_tq/lib (RPATH $ORIGIN/../lib), which works for any
install layout; these wrappers put them on the environment's PATH by exec'ing them unchanged.
"""

from __future__ import annotations

import os
import sys

from .paths import bin_dir


def run_tool(name: str) -> None:
    exe = bin_dir() / name
    if not exe.is_file():
        sys.exit(f"llama-tq: {exe} is missing: this install was built without the llama.cpp tools")
    os.execv(exe, [name, *sys.argv[1:]])


def llama_perplexity() -> None:
    run_tool("llama-perplexity")


def llama_completion() -> None:
    run_tool("llama-completion")


def llama_cli() -> None:
    run_tool("llama-cli")


def llama_server() -> None:
    run_tool("llama-server")


def llama_bench() -> None:
    run_tool("llama-bench")


def llama_tokenize() -> None:
    run_tool("llama-tokenize")


def ggml_rpc_server() -> None:
    run_tool("ggml-rpc-server")
