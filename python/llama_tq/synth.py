"""Random-weight llama GGUFs, for speed runs and for tests of the cache types on shapes the real model lacks.

The default shape is the end-to-end speed protocol's (8 layers, n_embd 2048, 16 heads, 4 KV heads, head 128);
weights are Q8_0 blocks written as raw bytes (random int8 and a fixed f16 scale), so a model takes seconds. The
vocabulary is `n_vocab` dummy tokens (tokenizer model "none"): enough for llama-bench and for context creation,
not for tools that tokenize text. `byte_vocab=True` (`--byte-vocab`) writes a real SentencePiece vocabulary
instead: <unk>, <s>, </s> and the 256 byte tokens, so any text tokenizes (byte fallback) and llama-perplexity /
llama-completion run on the model (random weights make PPL meaningless; KLD still compares caches).

    python -m llama_tq.synth out.gguf [--n-layer 8 --n-embd 2048 --n-head 16 --n-head-kv 4 ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gguf
import numpy as np


def q8_0(rng: np.random.Generator, rows: int, cols: int, amp: float) -> np.ndarray:
    """rows x cols values as Q8_0 rows of 34-byte blocks {f16 d; int8 q[32]}."""
    nb = rows * cols // 32
    blk = np.empty((nb, 34), dtype=np.uint8)
    blk[:, :2] = np.full(nb, amp / 127.0, dtype=np.float16).view(np.uint8).reshape(nb, 2)
    blk[:, 2:] = rng.integers(-127, 128, size=(nb, 32), dtype=np.int8).view(np.uint8)
    return blk.reshape(rows, cols // 32 * 34)


def write_synth_model(
    path: Path | str,
    n_layer: int = 8,
    n_embd: int = 2048,
    n_head: int = 16,
    n_head_kv: int = 4,
    n_ff: int = 5632,
    n_vocab: int = 32000,
    n_ctx: int = 131072,
    seed: int = 7,
    byte_vocab: bool = False,
) -> Path:
    """Write a random-weight llama GGUF with head size n_embd / n_head; returns its path."""
    if byte_vocab:
        n_vocab = 3 + 256
    if n_embd % n_head or n_embd % 32 or n_ff % 32:
        raise ValueError(f"n_embd {n_embd} must be a multiple of n_head {n_head} and of 32, n_ff {n_ff} of 32")
    rng = np.random.default_rng(seed)
    head = n_embd // n_head
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("llama-tq synthetic model")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(7)  # mostly Q8_0
    if byte_vocab:
        tt = gguf.TokenType
        w.add_tokenizer_model("llama")
        w.add_token_list(["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))])
        w.add_token_scores([0.0] * n_vocab)
        w.add_token_types([tt.UNKNOWN, tt.CONTROL, tt.CONTROL, *([tt.BYTE] * 256)])
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
    else:
        w.add_tokenizer_model("none")

    def mat(name: str, ne0: int, ne1: int, amp: float = 0.05) -> None:
        w.add_tensor(name, q8_0(rng, ne1, ne0, amp), raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    def ones(name: str) -> None:
        w.add_tensor(name, np.ones(n_embd, dtype=np.float32))

    mat("token_embd.weight", n_embd, n_vocab, amp=1.0)
    ones("output_norm.weight")
    mat("output.weight", n_embd, n_vocab)
    for i in range(n_layer):
        p = f"blk.{i}."
        ones(p + "attn_norm.weight")
        mat(p + "attn_q.weight", n_embd, n_embd)
        mat(p + "attn_k.weight", n_embd, head * n_head_kv)
        mat(p + "attn_v.weight", n_embd, head * n_head_kv)
        mat(p + "attn_output.weight", n_embd, n_embd)
        ones(p + "ffn_norm.weight")
        mat(p + "ffn_gate.weight", n_embd, n_ff)
        mat(p + "ffn_up.weight", n_embd, n_ff)
        mat(p + "ffn_down.weight", n_ff, n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    for name, default in (("n-layer", 8), ("n-embd", 2048), ("n-head", 16), ("n-head-kv", 4), ("n-ff", 5632),
                          ("n-vocab", 32000), ("n-ctx", 131072), ("seed", 7)):  # fmt: skip
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--byte-vocab", action="store_true", help="a byte-level SentencePiece vocabulary (tokenizes text)")
    a = ap.parse_args(argv)
    write_synth_model(a.out, a.n_layer, a.n_embd, a.n_head, a.n_head_kv, a.n_ff, a.n_vocab, a.n_ctx, a.seed,
                      a.byte_vocab)  # fmt: skip
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
