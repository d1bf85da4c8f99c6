"""Tensors of a model's forward pass on the patched libraries: llama-cpp-python's low-level API with ggml's eval
callback, one ubatch of 512 tokens at a time (an f16 cache, no TQ transform). `llama-tq calibrate` and the bench /
lab studies of real queries and keys read Qcur / Kcur through it."""

from __future__ import annotations

import ctypes
import re
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .errors import ModelError, ToolError, UsageError


def run_capture(
    model: Path,
    text: str,
    n_tokens: int,
    want: re.Pattern[str],
    on_ubatch: Callable[[dict[str, np.ndarray]], None],
    threads: int = 2,
    what: str = "capture",
) -> None:
    """Runs the model over the first n_tokens of text; after each ubatch, on_ubatch gets {name: [tokens, heads, D]}
    for the F32 nodes whose names match want (the last node of a name in the graph: for Qcur / Kcur, after RoPE)."""
    from . import binding
    from .paths import lib_dir

    llama_cpp = binding.llama_cpp()
    ggml = ctypes.CDLL(str(lib_dir() / "libggml-base.so"))
    ggml.ggml_get_name.argtypes = [ctypes.c_void_p]
    ggml.ggml_get_name.restype = ctypes.c_char_p
    ggml.ggml_nbytes.argtypes = [ctypes.c_void_p]
    ggml.ggml_nbytes.restype = ctypes.c_size_t
    ggml.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    pending: dict[str, np.ndarray] = {}

    def on_tensor(t: int, ask: bool, _user: int) -> bool:
        name = ggml.ggml_get_name(t).decode()
        if not want.match(name):
            return False
        if ask:
            return True
        if int(ctypes.c_int32.from_address(t).value) != 0:  # struct ggml_tensor.type: GGML_TYPE_F32 only
            return True
        ne = np.ctypeslib.as_array((ctypes.c_int64 * 4).from_address(t + 16)).copy()  # struct ggml_tensor.ne
        buf = np.empty(int(np.prod(ne)), dtype=np.float32)
        ggml.ggml_backend_tensor_get(t, buf.ctypes.data, 0, ggml.ggml_nbytes(t))
        pending[name] = buf.reshape(int(ne[2]), int(ne[1]), int(ne[0]))  # the later node of a name replaces it
        return True

    cb = llama_cpp.ggml_backend_sched_eval_callback(on_tensor)
    llama_cpp.llama_backend_init()
    mdl = llama_cpp.llama_model_load_from_file(str(model).encode(), llama_cpp.llama_model_default_params())
    if not mdl:
        raise ModelError(f"could not load {model}")
    ctx = None
    try:
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = n_tokens
        cp.n_batch = cp.n_ubatch = 512
        cp.n_threads = cp.n_threads_batch = threads
        cp.cb_eval = cb
        cp.cb_eval_user_data = None
        ctx = llama_cpp.llama_init_from_model(mdl, cp)
        if not ctx:
            raise ToolError(f"could not create a context for the {what} (see the log above)")
        vocab = llama_cpp.llama_model_get_vocab(mdl)
        raw = text.encode()
        toks = (llama_cpp.llama_token * (len(raw) + 8))()
        n = llama_cpp.llama_tokenize(vocab, raw, len(raw), toks, len(toks), True, False)
        if n < n_tokens:
            raise UsageError(f"the text has {n} tokens, fewer than the {n_tokens} asked for")
        for i in range(0, n_tokens, 512):
            k = min(512, n_tokens - i)
            arr = (llama_cpp.llama_token * k)(*toks[i : i + k])
            if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, k)) != 0:
                raise ToolError(f"llama_decode failed during the {what}")
            on_ubatch(dict(pending))
            pending.clear()
            print(f"  {what}: {i + k}/{n_tokens} tokens", file=sys.stderr, flush=True)
    finally:
        if ctx:
            llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(mdl)
