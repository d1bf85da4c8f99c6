"""The NIAH checker, needle parsing, prompt construction and position parsing (no model runs)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from llama_tq.harness import niah

pytestmark = pytest.mark.unit

LOGS = Path(__file__).with_name("data") / "logs"
N = niah.Needle.parse(niah.DEFAULT_NEEDLE)


def test_default_needle() -> None:
    assert (N.cue, N.answer, N.phrase, N.number) == (
        "The secret code word is", "PURPLE ELEPHANT 7742", "PURPLE ELEPHANT", "7742"
    )  # fmt: skip
    custom = niah.Needle.parse("The magic number is 31337.")
    assert (custom.answer, custom.phrase, custom.number) == ("31337", "", "31337")
    with pytest.raises(ValueError, match="pass --answer"):
        niah.Needle.parse("Remember the blue whale.")
    with pytest.raises(ValueError, match="not in the needle"):
        niah.Needle.parse("The code is X1.", answer="Y2")


@pytest.mark.parametrize(
    ("said", "status"),
    [
        (" PURPLE ELEPHANT 7742.", "PASS"),
        ("\nIt is PURPLE ELEPHANT 7742, I think", "PASS"),
        (" purple elephant 7742", "PARTIAL_NUMBER"),  # case-sensitive
        (" PURPLE ELEPHANT 774", "PARTIAL_WORD"),  # truncated number
        (" PURPLE ELEPHANT 77421", "PARTIAL_WORD"),  # a longer number is not the number
        (" PURPLE ELEPHANT 7421.", "PARTIAL_WORD"),
        (" RED ELEPHANT 7742.", "PARTIAL_NUMBER"),
        (" the number 17742", "FAIL"),
        (" PURPLE", "FAIL"),
        ("", "FAIL"),
    ],
)
def test_checker(said: str, status: str) -> None:
    assert niah.check(said, N) == status


def test_prompt_echo_trap() -> None:
    """A run that echoes the prompt contains the needle; only what follows the prompt may count."""
    prompt = "Some text. The secret code word is PURPLE ELEPHANT 7742. More text.\n\nThe secret code word is"
    assert niah.check(niah.generated_only(prompt + " a mystery.", prompt), N) == "FAIL"
    assert niah.check(niah.generated_only(prompt + " PURPLE ELEPHANT 7742.", prompt), N) == "PASS"
    # echoed after some preamble (e.g. a chat template) still counts as an echo
    assert niah.check(niah.generated_only("<bos>" + prompt + " no idea", prompt), N) == "FAIL"
    # without the echo the generated text is taken as it is
    assert niah.generated_only(" PURPLE ELEPHANT 7742.[end of text]", prompt) == " PURPLE ELEPHANT 7742."


def test_think_block() -> None:
    assert niah.strip_think("<think>the code is PURPLE ELEPHANT 7742</think> RED") == (" RED", False)
    assert niah.strip_think("  <think>still thinking about PURPLE ELEPHANT 7742") == ("", True)
    assert niah.strip_think(" PURPLE") == (" PURPLE", False)
    body, _ = niah.strip_think("<think>PURPLE ELEPHANT 7742</think>I don't know")
    assert niah.check(body, N) == "FAIL"  # the answer must come after the thinking


def test_real_completion_log() -> None:
    """llama-completion output captured by `llama-tq demo` (q4_0 cache, needle in the middle)."""
    log = (LOGS / "completion_q4_0_middle.log").read_text()
    stdout = log.split("--- stdout ---\n", 1)[1].split("\n--- stderr ---", 1)[0]
    assert niah.check(niah.generated_only(stdout, ""), N) == "PARTIAL_WORD"
    assert "-no-cnv" in log and "--no-display-prompt" in log and "--temp 0" in log


def test_positions() -> None:
    assert niah.parse_positions("start,middle,end") == niah.POSITIONS
    assert niah.parse_positions("0.25, end") == {"0.25": 0.25, "end": 0.95}
    with pytest.raises(ValueError, match="unknown position 'top'"):
        niah.parse_positions("top")
    with pytest.raises(ValueError, match="outside"):
        niah.parse_positions("1.5")


def test_build_prompt_fits_the_budget() -> None:
    """With a stand-in tokenizer (one token per word, plus BOS): the prompt fills 97-100% of the budget and the
    needle sits at the requested fraction."""

    def count(text: str) -> int:
        return len(text.split()) + 1

    hay = " ".join(f"Sentence number {i} is here." for i in range(50))  # cycled to fill the budget
    for frac in (0.0, 0.5, 0.95):
        p = niah.build_prompt(count, hay, 1000, N, frac, "cloze")
        assert 970 <= p.tokens <= 1000, p.tokens
        assert p.text.endswith("\n\nThe secret code word is") and p.text.count(N.sentence) == 1
        assert abs(p.depth - frac) < 0.03
    q = niah.build_prompt(count, hay, 500, N, 0.5, "question")
    assert q.text.endswith(niah.QUESTION)
    with pytest.raises(niah.NiahError, match="no room"):
        niah.build_prompt(count, hay, 40, N, 0.5, "cloze")


@pytest.mark.parametrize(
    ("hay", "count"),
    [
        ("这是一段没有任何句号的中文文本用来检验针的位置" * 400, lambda t: len(t) + 1),  # CJK: a token a character
        (" ".join(f"word{i}" for i in range(20000)), lambda t: len(t.split()) + 1),  # one paragraph, no sentence end
    ],
    ids=["cjk", "one-paragraph"],
)
def test_build_prompt_places_the_needle_without_sentence_ends(hay: str, count: Callable[[str], int]) -> None:
    """A haystack without ASCII sentence ends is cut into short pieces, so start / middle / end land where asked
    (the needle used to land at token 0 of a 24-token prompt for every position)."""
    fixed = count(N.sentence + " " + "\n\n" + N.cue)
    for frac in (0.0, 0.5, 1.0):
        p = niah.build_prompt(count, hay, 1000, N, frac, "cloze")
        assert p.tokens >= 970, p.tokens
        assert abs(p.needle_token / (p.tokens - fixed) - frac) < 0.05, (frac, p.needle_token, p.tokens)


def test_build_prompt_refuses_a_needle_it_cannot_place() -> None:
    """Pieces too large to put the needle near the asked place (words of 300 tokens in a 1000-token prompt) are
    refused, not run at the wrong depth."""

    def count(text: str) -> int:
        return len(text) + 1  # a token a character

    with pytest.raises(niah.NiahError, match="landed"):
        niah.build_prompt(count, ("x" * 300 + " ") * 20, 1000, N, 0.5, "cloze")
