"""llama-cpp-python (the pinned sdist's Python package) on the patched libraries: TQ caches and their state."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llama_tq.models import default_model
from llama_tq.synth import write_synth_model
from llama_tq.tooling.binding_install import install_llama_cpp_python

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def binding() -> None:
    if importlib.util.find_spec("llama_cpp") is None:  # importing it here would bind the wrong libraries
        install_llama_cpp_python()


SCRIPT = textwrap.dedent(
    """
    import sys, llama_tq
    llama_cpp = llama_tq.llama_cpp()
    model, tk, tv = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    # logits_all: llama-cpp-python keeps no logits in `scores` without it (they would all read 0)
    llm = llama_cpp.Llama(model, n_ctx=512, type_k=tk, type_v=tv, flash_attn=True, verbose=False, n_threads=2,
                          logits_all=True)
    llm.eval(llm.tokenize(b"The capital of France is Paris. The capital of Germany is"))
    s1 = llm.save_state()
    nxt = llm.tokenize(b" Berlin", add_bos=False)
    llm.eval(nxt)
    before = llm.scores[llm.n_tokens - 1].copy()
    assert abs(before).max() > 0
    llm.reset()
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)  # really empty the cache
    llm.load_state(s1)
    same_state = bytes(s1.llama_state) == bytes(llm.save_state().llama_state)
    llm.eval(nxt)  # attends over the restored cache
    same_logits = bool((llm.scores[llm.n_tokens - 1] == before).all())
    print("STATE", s1.llama_state_size, same_state, same_logits)
    """
)


def state_of(tk: int, tv: int, model: Path | None = None) -> tuple[int, bool, bool]:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(model or default_model()), str(tk), str(tv)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("STATE")), None)
    assert proc.returncode == 0 and line, proc.stdout[-2000:] + proc.stderr[-3000:]
    _, size, same, same_logits = line.split()
    return int(size), same == "True", same_logits == "True"


def test_tq_cache_state_round_trips_bit_exactly(binding: None) -> None:
    import llama_tq

    size_f16, same_f16, logits_f16 = state_of(1, 1)
    size_tq3, same_tq3, logits_tq3 = state_of(llama_tq.GGML_TYPE_TQ3, llama_tq.GGML_TYPE_TQ3)
    size_tq4, same_tq4, logits_tq4 = state_of(llama_tq.GGML_TYPE_TQ4, llama_tq.GGML_TYPE_TQ3)
    assert same_f16 and same_tq3 and same_tq4, "save -> load -> save must give identical state bytes"
    assert logits_f16 and logits_tq3 and logits_tq4, "the next token must see exactly the cache it saw before"
    assert size_tq3 < size_tq4 < size_f16  # the state carries the TQ blocks, not f16


@pytest.mark.parametrize("head", [64, 96])
def test_64_and_96_value_block_states_round_trip(binding: None, tmp_path: Path, head: int) -> None:
    """Heads 64 and 96: type_k/type_v = GGML_TYPE_TQ3 store 64- or 96-value blocks (libllama picks tq3_64 / tq3_96);
    the state holds them and restores bit-exactly, at 28/128 (40/192) of f16's KV bytes."""
    import llama_tq

    model = write_synth_model(tmp_path / f"h{head}.gguf", n_layer=2, n_embd=4 * head, n_head=4, n_head_kv=2,
                              n_ff=512, n_vocab=512, n_ctx=1024, byte_vocab=True)  # fmt: skip
    size_f16, same_f16, logits_f16 = state_of(1, 1, model)
    size_tq3, same_tq3, logits_tq3 = state_of(llama_tq.GGML_TYPE_TQ3, llama_tq.GGML_TYPE_TQ3, model)
    assert same_f16 and same_tq3 and logits_f16 and logits_tq3
    assert size_tq3 < size_f16 / 3  # the TQ blocks (28 B per 64 values, 40 B per 96), not f16's 2 B per value


# a saves sequence 0 after a prompt, then scores one more token: what a restore elsewhere must reproduce
SEQ_SAVED = textwrap.dedent(
    """
    import ctypes, sys, llama_tq
    llama_cpp = llama_tq.llama_cpp()
    def make(n_ctx=512):
        llm = llama_cpp.Llama(sys.argv[1], n_ctx=n_ctx, type_k=llama_tq.GGML_TYPE_TQ3, type_v=llama_tq.GGML_TYPE_TQ3,
                              flash_attn=True, verbose=False, n_threads=2, logits_all=True)
        if len(sys.argv) > 2:  # the key transforms to use
            llama_tq.tq_configure(llm, keys=sys.argv[2])
        return llm
    a = make()
    p1 = a.tokenize(b"The capital of France is Paris. The capital of Germany is")
    a.eval(p1)
    size = llama_cpp.llama_state_seq_get_size(a.ctx, 0)
    buf = (ctypes.c_uint8 * size)()
    assert llama_cpp.llama_state_seq_get_data(a.ctx, buf, size, 0) == size
    nxt = a.tokenize(b" Berlin", add_bos=False)
    a.eval(nxt)
    want = a.scores[a.n_tokens - 1].copy()
    assert abs(want).max() > 0
    def restore(other):  # sequence 0 of a into other, then the same token
        ok = llama_cpp.llama_state_seq_set_data(other.ctx, buf, size, 0)
        other.n_tokens = len(p1)
        other.input_ids[: len(p1)] = p1
        other.eval(nxt)
        return ok > 0, other.scores[other.n_tokens - 1]
    """
)

SEQ_SCRIPT = SEQ_SAVED + textwrap.dedent(
    """
    b = make()
    # b first fills its cache from other text: its key mean differs from a's
    b.eval(b.tokenize(b"def main():\\n    x = [i * i for i in range(100)]\\n    print(sum(x))\\n" * 4))
    ok, got = restore(b)
    print("SEQ", ok, bool((got == want).all()))
    """
)


def test_seq_restore_adopts_the_saved_key_mean(binding: None) -> None:
    """Restoring a sequence into a context whose cache was centered on another key mean: seq_rm empties the cache
    first, so the restore adopts the saved mean and the next token sees exactly the keys it saw before."""
    proc = subprocess.run([sys.executable, "-c", SEQ_SCRIPT, str(default_model())], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("SEQ")), None)
    assert proc.returncode == 0 and line, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert line.split()[1:] == ["True", "True"], line


BASIS_SCRIPT = SEQ_SAVED + textwrap.dedent(
    """
    out = []
    for other in (make(512), make(1024)):  # the same context size; another one, whose own key basis differs
        ok, got = restore(other)
        out += [ok, float(abs(got - want).max()), int(got.argmax()) == int(want.argmax())]
    print("BASIS", *out)
    """
)


def test_key_basis_state_restores_into_any_context_size(binding: None) -> None:
    """tq_configure(llm, keys="matrix"): the key basis follows from the model and the context size, so the state
    stores the size; a restore into a context of the same size sees exactly the saved keys, one into another size
    computes the saved size's basis (the same keys, up to the other cache's padding of the attention sums)."""
    proc = subprocess.run([sys.executable, "-c", BASIS_SCRIPT, str(default_model()), "matrix"], capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("BASIS")), None)
    assert proc.returncode == 0 and line, proc.stdout[-2000:] + proc.stderr[-3000:]
    ok_b, diff_b, top_b, ok_c, diff_c, top_c = line.split()[1:]
    assert ok_b == ok_c == top_b == top_c == "True", line
    assert float(diff_b) == 0.0, line
    assert float(diff_c) < 0.05, line


TRIATT_SCRIPT = textwrap.dedent(
    """
    import sys, llama_tq
    llama_cpp = llama_tq.llama_cpp()
    llm = llama_cpp.Llama(sys.argv[1], n_ctx=2048, n_batch=512, type_k=llama_tq.GGML_TYPE_TQ3,
                          type_v=llama_tq.GGML_TYPE_TQ3, flash_attn=True, verbose=False, n_threads=2)
    try:
        llama_tq.triatt_configure(llm, budget=200)
    except ValueError as e:
        print("ERROR", e)
    try:
        llama_tq.triatt_configure(llm, budget=600, pool_spans=-1)  # the struct's last field reaches the library
    except ValueError as e:
        print("ERROR", e)
    for bad in ({"budget": 2**32}, {"budget": 600, "policy": "v9"}, {"budget": 600, "pool_top": 2}):
        try:
            llama_tq.triatt_configure(llm, **bad)
        except ValueError as e:
            print("ERROR", e)
    for call in (lambda: llama_tq.triatt_configure(None, budget=1000), lambda: llama_tq.triatt_stats(None)):
        try:
            call()
        except ValueError as e:
            print("ERROR", e)
    print("DEFAULTS", *sorted(llama_tq.triatt_default_params().items()))
    llama_tq.triatt_configure(llm, budget=600, warmup=256, policy="v3")
    text = open(sys.argv[2]).read()
    toks = llm.tokenize(text.encode())
    llm.eval(toks[:1400])
    llm.eval(toks[1400:1401])  # as generation would: the prompt's last round (late) is applied before this token
    print("STATS", *llama_tq.triatt_stats(llm))
    """
)


def test_triatt_from_python(binding: None, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """TriAttention V3 on a llama-cpp-python context through the new C API: bad settings raise with llama.cpp's
    message (the last field, pool_spans, included) and the defaults read back; 1400 tokens against a budget of 600,
    then one more, evict (a round each time the cache passes 600 + 128; the prompt's last one late, applied before
    the next token)."""
    from llama_tq.harness.demo import default_text

    text = tmp_path / "t.txt"
    text.write_text(default_text()[:20_000])
    proc = subprocess.run([sys.executable, "-c", TRIATT_SCRIPT, str(default_model()), str(text)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "ERROR --triatt-budget 200 must exceed the protected cells" in proc.stdout
    assert "ERROR --triatt-pool-spans must not be negative (got -1)" in proc.stdout
    assert "ERROR TriAttention setting budget must be a 32-bit integer (got 4294967296)" in proc.stdout
    assert "ERROR policy must be one of v1, v2, v3, streaming, random (got 'v9')" in proc.stdout
    assert "ERROR unknown TriAttention setting 'pool_top'" in proc.stdout
    assert proc.stdout.count("ERROR expected a llama_cpp.Llama or a llama_context pointer, got None") == 2
    defaults = next(ln for ln in proc.stdout.splitlines() if ln.startswith("DEFAULTS"))
    for field in ("('budget', 0)", "('pool', 8)", "('pool_spans', 96)", "('window', 128)", "('hybrid', 2)"):
        assert field in defaults, defaults
    assert "pool_top" not in defaults, defaults
    stats = next(ln for ln in proc.stdout.splitlines() if ln.startswith("STATS")).split()
    rounds, evicted = int(stats[1]), int(stats[2])
    assert rounds >= 2 and evicted >= 1401 - 600 - 128 * rounds, proc.stdout


FOLD_SCRIPT = textwrap.dedent(
    """
    import sys, llama_tq
    llama_cpp = llama_tq.llama_cpp()
    llm = llama_cpp.Llama(sys.argv[1], n_ctx=2048, n_batch=64, n_ubatch=64, type_k=llama_tq.GGML_TYPE_TQ3,
                          type_v=llama_tq.GGML_TYPE_TQ3, flash_attn=True, verbose=False, n_threads=2)
    llama_tq.triatt_configure(llm, budget=600, warmup=256)
    toks = llm.tokenize(open(sys.argv[2]).read().encode())
    llm.eval(toks[:1000])
    print("STATS", *llama_tq.triatt_stats(llm))
    llm.eval(toks[1000:1200])
    print("STATS", *llama_tq.triatt_stats(llm))
    llm.load_state(llm.save_state())  # the same keys come back, but a state read forgets every folded key
    llm.eval(toks[1200:1400])
    print("STATS", *llama_tq.triatt_stats(llm))
    """
)


def test_triatt_reads_each_key_once(binding: None, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A round reads and scores only the keys written since the last one (the others' folded scores are kept), and a
    state read makes the next round read every key again: (rounds, evicted, folded) after 1000, 1200 and 1400 tokens
    in ubatches of 64 against a budget of 600."""
    from llama_tq.harness.demo import default_text

    text = tmp_path / "t.txt"
    text.write_text(default_text()[:20_000])
    proc = subprocess.run([sys.executable, "-c", FOLD_SCRIPT, str(default_model()), str(text)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (r1, _, f1), (r2, _, f2), (r3, _, f3) = (
        map(int, ln.split()[1:]) for ln in proc.stdout.splitlines() if ln.startswith("STATS"))  # fmt: skip
    assert r1 >= 1 and f1 >= 600 + 128, proc.stdout  # the first round reads every cached key
    # later: only new keys, the 200 tokens' and the last ubatch's before them (read after the next ubatch)
    assert r2 > r1 and 0 < f2 - f1 <= 200 + 64, proc.stdout
    assert r3 > r2 and f3 - f2 >= 600, proc.stdout  # after the state read: every kept key again


TQ_SCRIPT = textwrap.dedent(
    """
    import sys, llama_tq
    llama_cpp = llama_tq.llama_cpp()
    llm = llama_cpp.Llama(sys.argv[1], n_ctx=512, type_k=llama_tq.GGML_TYPE_TQ3, type_v=llama_tq.GGML_TYPE_TQ3,
                          flash_attn=True, verbose=False, n_threads=2, logits_all=True)
    tokens = llm.tokenize(b"The capital of France is Paris. The capital of Germany is")
    def last_logits():
        llm.reset()
        llm.eval(tokens)
        return llm.scores[llm.n_tokens - 1].copy()
    auto = last_logits()
    assert abs(auto).max() > 0
    for keys in ("0", "auto"):
        llama_tq.tq_configure(llm, keys=keys)
        print("KEYS", keys, bool((last_logits() == auto).all()))
    for bad in ({"keys": "sometimes"}, {"attn_rot": "x"}):
        try:
            llama_tq.tq_configure(llm, **bad)
        except ValueError as e:
            print("ERROR", e)
    try:
        llama_tq.tq_configure(object())
    except ValueError as e:
        print("ERROR", e)
    """
)


def test_tq_configure_from_python(binding: None) -> None:
    """tq_configure: the TQ cache options reach the context (llama_init_from_model_tq) without any environment:
    tq3 keys without the key transforms give other logits than with them, and the defaults give them back; bad
    values raise with llama.cpp's message."""
    proc = subprocess.run(
        [sys.executable, "-c", TQ_SCRIPT, str(default_model())],
        capture_output=True,
        text=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if not k.startswith("LLAMA_")},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "KEYS 0 False" in proc.stdout and "KEYS auto True" in proc.stdout, proc.stdout
    assert "ERROR --tq-keys must be auto, 1, 0, mean, eq or matrix (got 'sometimes')" in proc.stdout
    assert "ERROR --tq-attn-rot must be auto, 0, 1, k or v (got 'x')" in proc.stdout
    assert "ERROR tq_configure needs a llama_cpp.Llama, got object" in proc.stdout
