"""`llama-tq niah`: strict needle-in-a-haystack through the installed `llama-completion`.

A prompt is built from a text at a target context length, measured with the model's own tokenizer
(`llama-tokenize`), with the needle inserted at a sentence boundary at each requested position. The model is
run with `-no-cnv --no-display-prompt --temp 0 -n N`, and only the generated text is checked, case-sensitively:

  PASS            the exact answer (e.g. `PURPLE ELEPHANT 7742`, not followed by another digit)
  PARTIAL_WORD    the phrase (`PURPLE ELEPHANT`) without the right number
  PARTIAL_NUMBER  the number (`7742`) without the phrase
  FAIL            neither
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import LlamaTqError, UsageError
from .common import LOG_FLAGS, NIAH_FLAGS, KvConfig, eviction_check, progress, pyplot, run_tool, tool

DEFAULT_NEEDLE = "The secret code word is PURPLE ELEPHANT 7742."
POSITIONS = {"start": 0.05, "middle": 0.5, "end": 0.95}
STATUSES = ("PASS", "PARTIAL_WORD", "PARTIAL_NUMBER", "FAIL")
QUESTION = "\n\nQuestion: What is the secret code word in the text above?\nAnswer:"
THINK_TOKENS = 2048


class NiahError(LlamaTqError):
    """A prompt cannot be built (tokenizer failure, no room for a haystack)."""


@dataclass(frozen=True)
class Needle:
    sentence: str  # inserted into the haystack
    cue: str  # cloze cue: the sentence up to the answer ("The secret code word is")
    answer: str  # what must come back ("PURPLE ELEPHANT 7742")

    @classmethod
    def parse(cls, sentence: str, answer: str | None = None) -> Needle:
        """The answer defaults to what follows the sentence's last " is " (trailing period dropped)."""
        sentence = sentence.strip()
        if answer is None:
            _, sep, tail = sentence.rpartition(" is ")
            if not sep:
                raise UsageError(f"cannot find the answer in the needle {sentence!r}: pass --answer")
            answer = tail.rstrip(".")
        i = sentence.find(answer)
        if not answer or i < 0:
            raise UsageError(f"the answer {answer!r} is not in the needle {sentence!r}")
        return cls(sentence, sentence[:i].rstrip(), answer)

    @property
    def phrase(self) -> str:
        return " ".join(w for w in self.answer.split() if not any(c.isdigit() for c in w))

    @property
    def number(self) -> str:
        return " ".join(w for w in self.answer.split() if any(c.isdigit() for c in w))


def generated_only(output: str, prompt: str) -> str:
    """The generated part of llama-completion's stdout. If the prompt was echoed anyway (the echo trap: the needle
    is in the prompt, so a checker reading the echo would pass every run), everything up to its end is dropped."""
    text = output.replace("[end of text]", "")
    if prompt and text.startswith(prompt):
        return text[len(prompt) :]
    tail = prompt[-200:].strip()
    if tail and tail in text:
        return text[text.rindex(tail) + len(tail) :]
    return text


def strip_think(text: str) -> tuple[str, bool]:
    """Text after a leading <think>...</think> block; the flag says whether an unfinished block was found."""
    s = text.lstrip()
    if not s.startswith("<think>"):
        return text, False
    end = s.find("</think>")
    return ("", True) if end < 0 else (s[end + len("</think>") :], False)


def check(generated: str, needle: Needle) -> str:
    """PASS / PARTIAL_WORD / PARTIAL_NUMBER / FAIL for the generated text only (case-sensitive)."""
    if re.search(re.escape(needle.answer) + r"(?!\d)", generated):
        return "PASS"
    if needle.phrase and needle.phrase in generated:
        return "PARTIAL_WORD"
    if needle.number and re.search(r"(?<!\d)" + re.escape(needle.number) + r"(?!\d)", generated):
        return "PARTIAL_NUMBER"
    return "FAIL"


# ---- prompt construction ---------------------------------------------------------------------------------------


def tokenizer_for(model: Path) -> Callable[[str], int]:
    """Token count of a text (with BOS, as llama-completion sees it) by the model's tokenizer."""
    exe = str(tool("llama-tokenize"))

    def count(text: str) -> int:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(text)
        try:
            out = subprocess.run([exe, "-m", str(model), "-f", f.name, "--ids", "--log-disable"],
                                 capture_output=True, text=True, check=False)  # fmt: skip
        finally:
            os.unlink(f.name)
        m = re.search(r"\[([0-9,\s]*)\]\s*$", out.stdout)
        if out.returncode != 0 or not m:
            raise NiahError(f"llama-tokenize failed (rc {out.returncode}): {out.stderr[-500:]}")
        return len([t for t in m.group(1).split(",") if t.strip()])

    return count


UNIT_CHARS = 200  # the longest piece of haystack between two places the needle may go (~50 tokens of English)
CHAR_CUT = 32  # a text without whitespace (CJK) is cut every CHAR_CUT characters (about as many tokens)


def sentences(text: str) -> list[str]:
    """The text cut after sentence ends and blank lines, each piece keeping its trailing whitespace. A piece longer
    than UNIT_CHARS (a text without ASCII sentence ends: CJK, one long paragraph) is cut further, at whitespace where
    it has some, else every CHAR_CUT characters, so the needle can go near any depth."""
    parts = re.split(r"(?<=[.!?])(\s+)|(\n\s*\n)", text)
    out: list[str] = []
    for i in range(0, len(parts), 3):
        piece = parts[i] or ""
        seps = "".join(p for p in parts[i + 1 : i + 3] if p)
        if piece.strip():
            out.extend(_cut(piece + (seps or " ")))
    return out


def _cut(piece: str) -> list[str]:
    if len(piece) <= UNIT_CHARS:
        return [piece]
    words = re.findall(r"\S+\s*", piece)
    if len(words) < 2:  # no whitespace inside: cut by characters
        return [piece[i : i + CHAR_CUT] for i in range(0, len(piece), CHAR_CUT)]
    out, cur = [], ""
    for w in words:
        if cur and len(cur) + len(w) > UNIT_CHARS:
            out.append(cur)
            cur = ""
        cur += w
    return [*out, cur] if cur else out


@dataclass
class Prompt:
    text: str
    tokens: int  # measured, with BOS
    needle_token: int  # tokens before the needle (measured)
    fraction: float  # requested needle position

    @property
    def depth(self) -> float:
        return self.needle_token / max(1, self.tokens)


def build_prompt(
    count: Callable[[str], int], haystack: str, n_tokens: int, needle: Needle, fraction: float, style: str
) -> Prompt:
    """A prompt of at most n_tokens tokens (and within 3% of it): haystack sentences with the needle at a sentence
    boundary at `fraction` of the haystack, then the cue (cloze) or a question."""
    if not 0.0 <= fraction <= 1.0:
        raise UsageError(f"needle position {fraction} is outside [0, 1]")
    units = sentences(haystack)
    if not units:
        raise NiahError("the haystack text has no sentences")
    suffix = "\n\n" + needle.cue if style == "cloze" else QUESTION
    fixed = count(needle.sentence + " " + suffix)
    if n_tokens - fixed < 64:
        raise NiahError(f"a context of {n_tokens} tokens leaves no room for a haystack")
    sample = "".join(units[: min(len(units), 400)])
    chars_per_token = len(sample) / max(1, count(sample) - 1)
    budget = n_tokens - fixed
    best: Prompt | None = None
    for _ in range(6):  # refine the character budget from measured counts
        target_chars = int(budget * chars_per_token)
        hay: list[str] = []
        n = 0
        i = 0
        while n < target_chars:
            u = units[i % len(units)]  # cycle a short text
            hay.append(u)
            n += len(u)
            i += 1
        # the piece boundary nearest the asked fraction of the haystack's characters (pieces differ in length)
        total, cum = 0, [0]
        for u in hay:
            total += len(u)
            cum.append(total)
        cut = min(range(len(cum)), key=lambda k: abs(cum[k] - fraction * total))
        before = "".join(hay[:cut])
        text = before + needle.sentence + " " + "".join(hay[cut:]).rstrip() + suffix
        got = count(text)
        if got <= n_tokens and (best is None or got > best.tokens):
            best = Prompt(text, got, count(before) - 1 if before else 0, fraction)
        if n_tokens * 0.97 <= got <= n_tokens:
            break
        chars_per_token *= (n_tokens - fixed) / max(1, got - fixed)
        if got > n_tokens:  # whole pieces overshoot: aim a little lower, or the estimate settles just above
            chars_per_token *= 0.985
        budget = n_tokens - fixed
    if best is None:
        raise NiahError(f"could not fit a prompt into {n_tokens} tokens")
    if best.tokens < 0.8 * n_tokens:
        raise NiahError(f"the haystack filled only {best.tokens} of {n_tokens} tokens around the needle")
    landed = best.needle_token / max(1, best.tokens - fixed)  # the needle's place within the haystack
    if abs(landed - fraction) > 0.1:  # the measured place, not the requested one, is what a result means
        raise NiahError(f"the needle landed at {landed:.2f} of the haystack, not {fraction:.2f}: the haystack has too "
                        "few places to put it")  # fmt: skip
    return best


# ---- running -------------------------------------------------------------------------------------------------


@dataclass
class NiahResult:
    config: str
    position: str
    fraction: float
    depth: float  # measured needle token offset / prompt tokens
    prompt_tokens: int
    status: str
    said: str
    wall_s: float
    ok: bool = True
    error: str = ""
    evictions: int | None = None  # eviction rounds in the log, when eviction was asked for


def run_completion(
    model: Path, prompt: Prompt, cfg: KvConfig, ctx: int, n_predict: int, threads: int, extra: list[str], log: Path
) -> tuple[int, str, str]:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(prompt.text)
    args = ["-m", str(model), "-f", f.name, "-c", str(ctx), "-n", str(n_predict), *NIAH_FLAGS, "-t", str(threads),
            "-fa", "on", *LOG_FLAGS, *cfg.flags, *extra]  # fmt: skip
    try:
        run = run_tool("llama-completion", args, log, env=cfg.env)
    finally:
        os.unlink(f.name)
    return run.rc, run.stdout, run.stderr


def run_grid(
    model: Path,
    haystack: str,
    configs: list[KvConfig],
    ctx: int,
    positions: dict[str, float],
    needle: Needle,
    style: str = "cloze",
    n_predict: int = 16,
    think: bool = False,
    threads: int = 2,
    extra_args: list[str] | None = None,
    out_dir: Path | None = None,
) -> list[NiahResult]:
    count = tokenizer_for(model)
    n_gen = max(n_predict, THINK_TOKENS) if think else n_predict
    prompt_budget = ctx - n_gen - 4
    out_dir = out_dir or Path(tempfile.mkdtemp(prefix="llama-tq-niah-"))
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    prompts: dict[str, Prompt] = {}
    for name, frac in positions.items():
        prompts[name] = build_prompt(count, haystack, prompt_budget, needle, frac, style)
        p = prompts[name]
        progress(f"[niah] prompt '{name}': {p.tokens} tokens, needle at token {p.needle_token} ({p.depth:.2f})")
    results: list[NiahResult] = []
    total = len(configs) * len(prompts)
    for ci, cfg in enumerate(configs):
        for pi, (name, prompt) in enumerate(prompts.items()):
            k = ci * len(prompts) + pi + 1
            progress(f"[niah {k}/{total}] {cfg.name} @ {name} ...", end="")
            log = logs / f"{cfg.slug}_{name}.log"
            t0 = time.monotonic()
            rc, out, err = run_completion(model, prompt, cfg, ctx, n_gen, threads, extra_args or [], log)
            gen = generated_only(out, prompt.text)
            body, unfinished = strip_think(gen)
            if unfinished and not think:  # a thinking model: give it room, then judge the answer after </think>
                progress(" <think> seen, rerunning with a larger -n ...", end="")
                rc, out, err = run_completion(model, prompt, cfg, ctx + THINK_TOKENS, THINK_TOKENS, threads,
                                              extra_args or [], log)  # fmt: skip
                body, unfinished = strip_think(generated_only(out, prompt.text))
            status = check(body, needle) if rc == 0 else "FAIL"
            r = NiahResult(cfg.name, name, prompt.fraction, round(prompt.depth, 3), prompt.tokens, status,
                           " ".join(body.split())[:160], round(time.monotonic() - t0, 1), ok=rc == 0)  # fmt: skip
            if rc != 0:
                r.error = f"llama-completion rc={rc}: {err.strip().splitlines()[-1] if err.strip() else ''}"
            elif unfinished:
                r.error = "the <think> block did not finish"
            r.evictions, invalid = eviction_check(err, rc)
            if invalid:
                r.ok, r.error = False, invalid
            results.append(r)
            progress(f" {status} ({r.wall_s:.0f}s) said: {r.said[:60]!r}")
    return results


# ---- output --------------------------------------------------------------------------------------------------


def grid(results: list[NiahResult]) -> tuple[list[str], list[str], dict[tuple[str, str], str]]:
    configs = list(dict.fromkeys(r.config for r in results))
    positions = list(dict.fromkeys(r.position for r in results))
    return configs, positions, {(r.config, r.position): r.status for r in results}


def print_table(results: list[NiahResult]) -> None:
    configs, positions, cell = grid(results)
    print(f"{'config':<18}" + "".join(f" {p:>15}" for p in positions) + "   passed")
    for c in configs:
        row = [cell.get((c, p), "-") for p in positions]
        print(f"{c:<18}" + "".join(f" {s:>15}" for s in row) + f"   {row.count('PASS')}/{len(row)}")
    depths = {r.position: r.depth for r in results}  # measured (needle tokens before / prompt tokens)
    print("needle depth (measured): " + ", ".join(f"{p} {depths[p]:.2f}" for p in positions if p in depths))
    for r in results:
        if r.error:
            print(f"note: {r.config} @ {r.position}: {r.error}")


def write_outputs(results: list[NiahResult], out_dir: Path, meta: dict[str, object]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "niah.json").write_text(json.dumps({"meta": meta, "results": [asdict(r) for r in results]},
                                                  indent=2) + "\n")  # fmt: skip
    plot_heatmap(results, out_dir / "niah.png", str(meta.get("title", "")))


def plot_heatmap(results: list[NiahResult], path: Path, title: str = "") -> None:
    plt = pyplot()
    if plt is None:
        return
    from matplotlib.colors import ListedColormap

    configs, positions, cell = grid(results)
    colors = ["#2ca02c", "#ffbf00", "#ff7f0e", "#d62728"]  # PASS, PARTIAL_WORD, PARTIAL_NUMBER, FAIL
    data = [[STATUSES.index(cell.get((c, p), "FAIL")) for p in positions] for c in configs]
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(positions), 0.9 + 0.45 * len(configs)))
    ax.imshow(data, cmap=ListedColormap(colors), vmin=0, vmax=3, aspect="auto")
    for i, c in enumerate(configs):
        for j, p in enumerate(positions):
            ax.text(j, i, cell.get((c, p), "-"), ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(positions)), positions)
    ax.set_yticks(range(len(configs)), configs)
    ax.set_title(title or "needle in a haystack")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_positions(spec: str) -> dict[str, float]:
    """ "start,middle,end,0.25" -> {"start": 0.05, "middle": 0.5, "end": 0.95, "0.25": 0.25}."""
    out: dict[str, float] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        if item in POSITIONS:
            out[item] = POSITIONS[item]
            continue
        try:
            f = float(item)
        except ValueError:
            known = ", ".join(POSITIONS)
            raise UsageError(f"unknown position '{item}' (use {known} or a fraction in [0, 1])") from None
        if not 0.0 <= f <= 1.0:
            raise UsageError(f"position {f} is outside [0, 1]")
        out[item] = f
    if not out:
        raise UsageError("no needle positions given")
    return out
