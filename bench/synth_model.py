"""Random-weight llama GGUF for speed runs (llama-bench only: the vocabulary is dummy tokens).

The issue's end-to-end speed protocol: 8 layers, n_embd 2048, 16 heads, 4 KV heads (head 128), Q8_0 weights.
Q8_0 blocks are written as raw bytes (random int8 and a fixed f16 scale), so it takes seconds.

    PYTHONPATH=<llama.cpp>/gguf-py python bench/synth_model.py out.gguf [--n-layer 8 ...]
"""

from __future__ import annotations

import argparse

import gguf
import numpy as np


def q8_0(rng: np.random.Generator, rows: int, cols: int, amp: float) -> np.ndarray:
    """rows x cols values as Q8_0 rows of 34-byte blocks {f16 d; int8 q[32]}."""
    nb = rows * cols // 32
    blk = np.empty((nb, 34), dtype=np.uint8)
    blk[:, :2] = np.full(nb, amp / 127.0, dtype=np.float16).view(np.uint8).reshape(nb, 2)
    blk[:, 2:] = rng.integers(-127, 128, size=(nb, 32), dtype=np.int8).view(np.uint8)
    return blk.reshape(rows, cols // 32 * 34)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--n-layer", type=int, default=8)
    ap.add_argument("--n-embd", type=int, default=2048)
    ap.add_argument("--n-head", type=int, default=16)
    ap.add_argument("--n-head-kv", type=int, default=4)
    ap.add_argument("--n-ff", type=int, default=5632)
    ap.add_argument("--n-vocab", type=int, default=32000)
    a = ap.parse_args()

    rng = np.random.default_rng(7)
    head = a.n_embd // a.n_head
    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name("llama-tq synthetic speed model")
    w.add_context_length(131072)
    w.add_embedding_length(a.n_embd)
    w.add_block_count(a.n_layer)
    w.add_feed_forward_length(a.n_ff)
    w.add_head_count(a.n_head)
    w.add_head_count_kv(a.n_head_kv)
    w.add_rope_dimension_count(head)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(a.n_vocab)
    w.add_file_type(7)  # mostly Q8_0
    w.add_tokenizer_model("none")

    def mat(name: str, ne0: int, ne1: int, amp: float = 0.05) -> None:
        w.add_tensor(name, q8_0(rng, ne1, ne0, amp), raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    def ones(name: str) -> None:
        w.add_tensor(name, np.ones(a.n_embd, dtype=np.float32))

    mat("token_embd.weight", a.n_embd, a.n_vocab, amp=1.0)
    ones("output_norm.weight")
    mat("output.weight", a.n_embd, a.n_vocab)
    for i in range(a.n_layer):
        p = f"blk.{i}."
        ones(p + "attn_norm.weight")
        mat(p + "attn_q.weight", a.n_embd, a.n_embd)
        mat(p + "attn_k.weight", a.n_embd, head * a.n_head_kv)
        mat(p + "attn_v.weight", a.n_embd, head * a.n_head_kv)
        mat(p + "attn_output.weight", a.n_embd, a.n_embd)
        ones(p + "ffn_norm.weight")
        mat(p + "ffn_gate.weight", a.n_embd, a.n_ff)
        mat(p + "ffn_up.weight", a.n_embd, a.n_ff)
        mat(p + "ffn_down.weight", a.n_ff, a.n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
