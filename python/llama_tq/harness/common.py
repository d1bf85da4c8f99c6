"""What every protocol shares: the K/V config type, the patched tools (from this package's own bin/, never from
PATH, where an unpatched llama.cpp could be found first), one runner that logs, and eviction validity read from
what the tool printed (the harness does not re-parse llama.cpp flags or environment)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from ..cachetypes import CACHE_TYPES, cache_type
from ..errors import ToolError, UsageError
from ..paths import bin_dir

# The measurement protocols' fixed flags.
PPL_BATCH = 512  # llama-perplexity -b
MIN_CHUNKS = 3  # fewer only with --allow-noisy, and labelled NOISY
NIAH_FLAGS = ("-no-cnv", "--no-display-prompt", "--temp", "0")
LOG_FLAGS = ("-lv", "4")  # library info lines (KV sizes, eviction rounds) reach the log

# "@option" suffixes of a config: the flags they pass to llama.cpp's tools (llama-bench takes the --tq-* ones too)
OPTIONS: dict[str, tuple[str, str]] = {
    "rot": ("--tq-attn-rot", "1"),  # upstream's Hadamard attention rotation also on TQ K and V
    "rotk": ("--tq-attn-rot", "k"),  # ... on TQ K only
    "rotv": ("--tq-attn-rot", "v"),  # ... on TQ V only
    "tqnorot": ("--tq-attn-rot", "0"),  # ... on neither
    "nokeys": ("--tq-keys", "0"),  # no key transforms on TQ K (no centering, no equalization)
    "mean": ("--tq-keys", "mean"),  # key-mean centering only
    "eq": ("--tq-keys", "eq"),  # channel equalization only
    "matrix": ("--tq-keys", "matrix"),  # centering + equalization by a full matrix per KV head (the key basis)
}
# ... and those that are upstream's own environment switches (it has no flag for them)
ENV_OPTIONS: dict[str, tuple[str, str]] = {
    "norot": ("LLAMA_ATTN_ROT_DISABLE", "1"),  # upstream's rotation off for every type
}


@dataclass(frozen=True)
class KvConfig:
    k: str
    v: str
    opts: tuple[str, ...] = ()  # "@option" suffixes, e.g. "tq4/tq4@rot"
    args: tuple[str, ...] = ()  # more flags, set by code: e.g. a run's eviction settings
    label: str = ""  # set by code, not parsed: a run's own suffix, e.g. an eviction policy and budget

    @classmethod
    def parse(cls, spec: str) -> KvConfig:
        spec = spec.strip()
        base, _, opts = spec.partition("@")
        k, _, v = base.partition("/")
        v = v or k
        for t in (k, v):
            if t not in CACHE_TYPES:
                raise UsageError(f"unknown cache type '{t}' in '{spec}' (known: {', '.join(CACHE_TYPES)})")
        names = tuple(filter(None, opts.split("+")))
        for o in names:
            if o not in OPTIONS and o not in ENV_OPTIONS:
                known = ", ".join("@" + k for k in (*OPTIONS, *ENV_OPTIONS))
                raise UsageError(f"unknown option '@{o}' in '{spec}' (known: {known})")
        return cls(k, v, names)

    @classmethod
    def parse_list(cls, specs: str) -> list[KvConfig]:
        configs = [cls.parse(c) for c in specs.replace(" ", ",").split(",") if c.strip()]
        if not configs:
            raise UsageError(f"no K/V configuration in {specs!r} (e.g. 'tq3/tq3,q4_0/q4_0')")
        return configs

    @property
    def name(self) -> str:
        opts = "+".join(self.opts)
        return f"{self.k}/{self.v}" + (f"@{opts}" if opts else "") + (f" {self.label}" if self.label else "")

    @property
    def slug(self) -> str:
        """The name as a file name."""
        return self.name.replace("/", "_").replace("@", "_").replace(" ", "_").replace("%", "pct")

    @property
    def bits(self) -> float:
        return (cache_type(self.k).bits + cache_type(self.v).bits) / 2

    @property
    def flags(self) -> list[str]:
        return ["-ctk", self.k, "-ctv", self.v, *(a for o in self.opts if o in OPTIONS for a in OPTIONS[o]), *self.args]

    @property
    def env(self) -> tuple[tuple[str, str], ...]:
        return tuple(ENV_OPTIONS[o] for o in self.opts if o in ENV_OPTIONS)


def tool(name: str) -> Path:
    """A patched llama.cpp tool shipped in this package's bin/."""
    exe = bin_dir() / name
    if not exe.is_file():
        raise ToolError(f"{exe} is missing: this llama-tq install was built without the llama.cpp tools")
    return exe


@dataclass
class ToolRun:
    rc: int
    stdout: str
    stderr: str
    wall_s: float

    @property
    def log(self) -> str:
        return self.stdout + self.stderr


def run_tool(
    name: str,
    args: list[str],
    log_path: Path,
    env: tuple[tuple[str, str], ...] = (),
    on_output: Callable[[str], None] | None = None,
) -> ToolRun:
    """Run a shipped tool with extra environment; write the command and its whole output to log_path. With
    on_output, stdout and stderr are merged and streamed to it piece by piece (for progress), else kept apart."""
    cmd = [str(tool(name)), *args]
    full_env = {**os.environ, **dict(env)}
    t0 = time.monotonic()
    if on_output is None:
        p = subprocess.run(cmd, capture_output=True, text=True, env=full_env, stdin=subprocess.DEVNULL, check=False)
        run = ToolRun(p.returncode, p.stdout, p.stderr, time.monotonic() - t0)
    else:
        pieces: list[str] = []
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              text=True, env=full_env, bufsize=1) as proc:  # fmt: skip
            assert proc.stdout is not None
            buf = ""
            while ch := proc.stdout.read(1):
                buf += ch
                if ch in "\n,":  # llama-perplexity prints chunk values comma-separated on one line
                    pieces.append(buf)
                    on_output(buf)
                    buf = ""
            pieces.append(buf)
            rc = proc.wait()
        run = ToolRun(rc, "".join(pieces), "", time.monotonic() - t0)
    envs = " ".join(f"{k}={v}" for k, v in env)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text(f"$ {envs + ' ' if envs else ''}{' '.join(cmd)}\n--- stdout ---\n{run.stdout}\n"
                        f"--- stderr ---\n{run.stderr}")  # fmt: skip
    return run


def progress(msg: str, end: str = "\n") -> None:
    print(msg, end=end, file=sys.stderr, flush=True)


# ---- eviction, as libllama reports it (csrc/llama.cpp/src/triatt/llama-triatt.h documents the lines) ----------

POLICY = r"(V\d|StreamingLLM|random)"
EVICT_ON = re.compile(rf"triatt: {POLICY} eviction on: budget (\d+)")
EVICT_ROUND = re.compile(r"triatt: evict: evicted (\d+)/(\d+) cells")  # anywhere: -lv 4 may prefix a timestamp
EVICT_ROUND_POS = re.compile(r"triatt: evict: evicted \d+/\d+ cells .*? pos=(\d+)")  # the newest position
EVICT_SUMMARY = re.compile(rf"triatt: summary: policy={POLICY} budget=(\d+) rounds=(\d+) evicted=(\d+)")


@dataclass(frozen=True)
class Eviction:
    rounds: int  # eviction rounds logged
    evicted: int  # cells evicted over all rounds


def eviction_of(log: str) -> Eviction | None:
    """What the tool says about eviction: None if it was not turned on in this run."""
    if not (EVICT_ON.search(log) or EVICT_SUMMARY.search(log)):
        return None
    rounds = EVICT_ROUND.findall(log)
    return Eviction(len(rounds), sum(int(n) for n, _ in rounds))


INVALID_NO_EVICTION = "INVALID: eviction was enabled but the log has no 'triatt: evict:' line"


def eviction_check(log: str, rc: int) -> tuple[int | None, str]:
    """(eviction rounds or None when eviction was off, error): a finished run with eviction on and no round
    measured nothing about eviction, so it is INVALID."""
    ev = eviction_of(log)
    if ev is None:
        return None, ""
    return ev.rounds, (INVALID_NO_EVICTION if rc == 0 and ev.rounds == 0 else "")


def pyplot() -> ModuleType | None:
    """matplotlib.pyplot, headless; None (after saying how to get it) where matplotlib is not installed: the PNGs
    need the [plot] extra, the tables and JSON do not."""
    try:
        import matplotlib
    except ImportError:
        print("no PNG: matplotlib is not installed (pip install \"llama-tq[plot]\", or pip install matplotlib)",
              file=sys.stderr)  # fmt: skip
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
