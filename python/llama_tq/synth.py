"""Random-weight llama / qwen2 GGUFs, for speed runs and for tests of the cache types on shapes the real model lacks.

The default shape is the end-to-end speed protocol's (8 layers, n_embd 2048, 16 heads, 4 KV heads, head 128);
weights are Q8_0 blocks written as raw bytes (random int8 and a fixed f16 scale), so a model takes seconds. The
vocabulary is `n_vocab` dummy tokens (tokenizer model "none"): enough for llama-bench and for context creation,
not for tools that tokenize text. `byte_vocab=True` (`--byte-vocab`) writes a real SentencePiece vocabulary
instead: <unk>, <s>, </s> and the 256 byte tokens, so any text tokenizes (byte fallback) and llama-perplexity /
llama-completion run on the model (random weights make PPL meaningless; KLD still compares caches).

`arch="qwen2"` (`--arch qwen2`) writes the Qwen2 / Qwen2.5 layout instead: NEOX RoPE (base `rope_base`, 1e6 as
Qwen2.5) and Q/K/V biases. The K bias is added before RoPE, so after RoPE it turns with the position; it is a random
direction per layer and KV head with norm `k_bias` times the mean key norm (0: a zero bias, the same model
otherwise), on all RoPE pairs, on the slow ones only (turning by at most 1 rad over `k_bias_span` positions: the
pairs the key-mean centering covers at that context) or on the fast ones only (`k_bias_pairs`). Q and V get small
random biases.

    python -m llama_tq.synth out.gguf [--n-layer 8 --n-embd 2048 --n-head 16 --n-head-kv 4 ...]
    python -m llama_tq.synth q.gguf --arch qwen2 --n-layer 4 --n-embd 1024 --n-head 8 --n-head-kv 2 --byte-vocab \
        --k-bias 10 --k-bias-pairs all
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
    arch: str = "llama",
    rope_base: float | None = None,
    k_bias: float = 0.0,
    k_bias_pairs: str = "all",
    k_bias_span: int = 1024,
) -> Path:
    """Write a random-weight llama (or qwen2) GGUF with head size n_embd / n_head; returns its path."""
    if arch not in ("llama", "qwen2"):
        raise ValueError(f"arch {arch!r}: llama or qwen2")
    if k_bias_pairs not in ("all", "slow", "fast"):
        raise ValueError(f"k_bias_pairs {k_bias_pairs!r}: all, slow or fast")
    if k_bias and arch != "qwen2":
        raise ValueError("a K bias needs arch qwen2")
    if byte_vocab:
        n_vocab = 3 + 256
    if n_embd % n_head or n_embd % 32 or n_ff % 32:
        raise ValueError(f"n_embd {n_embd} must be a multiple of n_head {n_head} and of 32, n_ff {n_ff} of 32")
    rng = np.random.default_rng(seed)
    head = n_embd // n_head
    base = rope_base if rope_base is not None else (1e6 if arch == "qwen2" else 10000.0)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("llama-tq synthetic model")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    if arch == "llama":
        w.add_rope_dimension_count(head)
    w.add_rope_freq_base(base)
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

    # biases from their own generator, so that models differing only in the K bias share every weight
    brng = np.random.default_rng(seed + 1)

    def bias(name: str, n: int, amp: float = 0.05) -> None:
        w.add_tensor(name, (amp * brng.standard_normal(n)).astype(np.float32))

    def k_bias_of_layer() -> np.ndarray:
        # mean key norm: rows of Q8_0 uniform in +-0.05 (std 0.05 / sqrt 3) times RMS-normed inputs (norm sqrt n_embd)
        key_norm = 0.05 / np.sqrt(3.0) * np.sqrt(n_embd) * np.sqrt(head)
        i = np.arange(head) % (head // 2)  # NEOX: channel i and i + head / 2 form pair i
        slow = base ** (-2.0 * i / head) * k_bias_span <= 1.0
        on = {"all": np.ones(head, bool), "slow": slow, "fast": ~slow}[k_bias_pairs]
        out = np.zeros((n_head_kv, head), dtype=np.float64)
        for h in range(n_head_kv):
            d = brng.standard_normal(head) * on
            out[h] = k_bias * key_norm * d / max(float(np.linalg.norm(d)), 1e-30)
        return out.reshape(-1).astype(np.float32)

    mat("token_embd.weight", n_embd, n_vocab, amp=1.0)
    ones("output_norm.weight")
    mat("output.weight", n_embd, n_vocab)
    for i in range(n_layer):
        p = f"blk.{i}."
        ones(p + "attn_norm.weight")
        mat(p + "attn_q.weight", n_embd, n_embd)
        mat(p + "attn_k.weight", n_embd, head * n_head_kv)
        mat(p + "attn_v.weight", n_embd, head * n_head_kv)
        if arch == "qwen2":
            bias(p + "attn_q.bias", n_embd)
            w.add_tensor(p + "attn_k.bias", k_bias_of_layer())
            bias(p + "attn_v.bias", head * n_head_kv)
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
    ap.add_argument("--arch", choices=("llama", "qwen2"), default="llama")
    ap.add_argument("--rope-base", type=float, default=None, help="RoPE base (default 1e4 llama, 1e6 qwen2)")
    ap.add_argument("--k-bias", type=float, default=0.0, help="qwen2: K bias norm in mean key norms (0: zero bias)")
    ap.add_argument("--k-bias-pairs", choices=("all", "slow", "fast"), default="all")
    ap.add_argument("--k-bias-span", type=int, default=1024, help="positions that define the slow RoPE pairs")
    a = ap.parse_args(argv)
    try:
        write_synth_model(a.out, a.n_layer, a.n_embd, a.n_head, a.n_head_kv, a.n_ff, a.n_vocab, a.n_ctx, a.seed,
                          a.byte_vocab, a.arch, a.rope_base, a.k_bias, a.k_bias_pairs, a.k_bias_span)  # fmt: skip
    except ValueError as e:
        ap.error(str(e))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
