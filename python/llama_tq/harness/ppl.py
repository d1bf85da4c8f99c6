"""`llama-tq ppl`: llama-perplexity over a matrix of KV cache configurations, with KLD against an f16 base.

Protocol (enforced): `-b 512`, at least 3 chunks (fewer only with --allow-noisy, and labelled), the
`Final estimate` / `Mean PPL(Q)` line as the PPL, mean / 99th-percentile KLD and same-top-p against an f16 base
produced in the same run (written to a temporary directory and deleted afterwards). With eviction settings
(`--triatt-*`, given to every config but not to the f16 base), the log's `triatt: evict:` lines are counted and a
run with none is marked invalid: it measured nothing about eviction.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

# bits per value of each cache type (block bytes * 8 / block values)
BITS = {"f32": 32.0, "f16": 16.0, "bf16": 16.0, "q8_0": 8.5, "q5_1": 6.0, "q5_0": 5.5, "q4_1": 5.0, "q4_0": 4.5,
        "iq4_nl": 4.5, "tq4": 4.25, "tq3": 3.25}  # fmt: skip


class ProtocolError(ValueError):
    """A run that would not meet the measurement protocol."""


# "@option" suffixes of a config: the environment they set for llama.cpp
_OPTIONS = {
    "rot": ("LLAMA_TQ_ATTN_ROT", "1"),  # upstream's Hadamard attention rotation also on TQ K and V
    "rotk": ("LLAMA_TQ_ATTN_ROT", "k"),  # ... on TQ K only
    "rotv": ("LLAMA_TQ_ATTN_ROT", "v"),  # ... on TQ V only
    "tqnorot": ("LLAMA_TQ_ATTN_ROT", "0"),  # ... on neither
    "norot": ("LLAMA_ATTN_ROT_DISABLE", "1"),  # upstream's rotation off for every type
}


@dataclass(frozen=True)
class KvConfig:
    k: str
    v: str
    env: tuple[tuple[str, str], ...] = ()  # extra environment from "@option" suffixes, e.g. "tq4/tq4@rot"

    @classmethod
    def parse(cls, spec: str) -> KvConfig:
        spec = spec.strip()
        base, _, opts = spec.partition("@")
        k, _, v = base.partition("/")
        v = v or k
        for t in (k, v):
            if t not in BITS:
                raise ValueError(f"unknown cache type '{t}' in '{spec}' (known: {', '.join(BITS)})")
        env: list[tuple[str, str]] = []
        for o in filter(None, opts.split("+")):
            if o not in _OPTIONS:
                raise ValueError(f"unknown option '@{o}' in '{spec}' (known: {', '.join('@' + k for k in _OPTIONS)})")
            env.append(_OPTIONS[o])
        return cls(k, v, tuple(env))

    @property
    def name(self) -> str:
        opts = "+".join(next(k for k, val in _OPTIONS.items() if val == e) for e in self.env)
        return f"{self.k}/{self.v}" + (f"@{opts}" if opts else "")

    @property
    def bits(self) -> float:
        return (BITS[self.k] + BITS[self.v]) / 2


@dataclass
class RunResult:
    config: str
    bits: float
    ppl: float | None = None
    ppl_err: float | None = None
    kld: float | None = None
    kld_err: float | None = None
    kld_p99: float | None = None
    same_top_p: float | None = None
    kv_mib: float | None = None
    wall_s: float = 0.0
    chunks: int = 0
    noisy: bool = False
    ok: bool = False
    error: str = ""
    evictions: int | None = None  # `triatt: evict:` lines in the log, when eviction was asked for
    extra: dict[str, float] = field(default_factory=dict)


_NUM = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"


def parse_perplexity_log(log: str) -> dict[str, float]:
    """Numbers from a llama-perplexity log (normal or KLD mode)."""
    out: dict[str, float] = {}
    pats = {
        "final_ppl": rf"Final estimate: PPL = {_NUM} \+/- {_NUM}",
        "mean_ppl_q": rf"Mean PPL\(Q\)\s*:\s*{_NUM}\s*±\s*{_NUM}",
        "kld": rf"Mean\s+KLD:\s*{_NUM}\s*±\s*{_NUM}",
        "kld_p99": rf"99\.0%\s+KLD:\s*{_NUM}",
        "same_top_p": rf"Same top p:\s*{_NUM}\s*±\s*{_NUM}",
    }
    for key, pat in pats.items():
        m = re.search(pat, log)
        if m:
            out[key] = float(m.group(1))
            if m.lastindex and m.lastindex >= 2:
                out[key + "_err"] = float(m.group(2))
    kv = re.findall(r"llama_kv_cache: size = +([0-9.]+) MiB", log)
    if kv:
        out["kv_mib"] = sum(float(x) for x in kv)
    return out


EVICT_LINE = re.compile(r"triatt: evict: evicted ")  # anywhere: -lv 4 prefixes a timestamp


def eviction_requested(args: list[str], env: dict[str, str] | None = None) -> bool:
    """Whether llama.cpp arguments (or the TRIATT_BUDGET fallback) turn eviction on: a budget > 0."""
    env = dict(os.environ) if env is None else env
    budget = env.get("TRIATT_BUDGET", "0")
    for i, a in enumerate(args):
        if a == "--triatt-budget" and i + 1 < len(args):
            budget = args[i + 1]
        elif a.startswith("--triatt-budget="):
            budget = a.split("=", 1)[1]
    try:
        return int(budget) > 0
    except ValueError:
        return True  # let llama.cpp reject it, and the run count as one that should have evicted


def _progress(line: str, label: str, n_chunks: int) -> None:
    """Normal mode prints `[n]ppl,` per chunk; KLD mode prints a table row per chunk starting with n."""
    m = re.findall(r"\[(\d+)\]", line) or re.findall(r"^\s*(\d+)\s+[0-9.]+\s+±", line)
    if m:
        print(f"\r  {label}: chunk {m[-1]}/{n_chunks}", end="", file=sys.stderr, flush=True)


def run_perplexity(
    exe: str, args: list[str], env_extra: tuple[tuple[str, str], ...], label: str, n_chunks: int, log_path: Path
) -> tuple[int, str, float]:
    env = dict(os.environ)
    env.update(dict(env_extra))
    t0 = time.monotonic()
    lines: list[str] = []
    with subprocess.Popen(
        [exe, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, bufsize=1
    ) as proc:
        assert proc.stdout is not None
        buf = ""
        while True:
            ch = proc.stdout.read(1)
            if not ch:
                break
            buf += ch
            if ch in "\n,":  # chunk values arrive comma-separated on one line
                lines.append(buf)
                _progress(buf, label, n_chunks)
                buf = ""
        lines.append(buf)
        rc = proc.wait()
    print(file=sys.stderr)
    log = "".join(lines)
    log_path.write_text(log)
    return rc, log, time.monotonic() - t0


def run_matrix(
    model: Path,
    text: Path,
    configs: list[KvConfig],
    ctx: int = 2048,
    chunks: int = 16,
    threads: int = 2,
    allow_noisy: bool = False,
    extra_args: list[str] | None = None,
    out_dir: Path | None = None,
    evict_args: list[str] | None = None,
) -> list[RunResult]:
    """extra_args go to every run; evict_args (eviction settings) to every config but not to the f16 base."""
    if chunks < 3 and not allow_noisy:
        raise ProtocolError(
            f"{chunks} chunks is below the protocol's minimum of 3 (pass --allow-noisy to run it anyway)"
        )
    exe = shutil.which("llama-perplexity")
    if not exe:
        raise FileNotFoundError("llama-perplexity is not on PATH (pip install llama-tq)")
    out_dir = out_dir or Path(tempfile.mkdtemp(prefix="llama-tq-ppl-"))
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    common = ["-m", str(model), "-c", str(ctx), "-b", "512", "--chunks", str(chunks), "-t", str(threads),
              "-fa", "on", "-lv", "4", *(extra_args or [])]  # fmt: skip
    results: list[RunResult] = []
    with tempfile.TemporaryDirectory(prefix="llama-tq-kld-") as tmp:
        base_file = Path(tmp) / "f16.kld"
        base = KvConfig("f16", "f16")
        print(f"[base] f16/f16 -> KLD base ({chunks} chunks of {ctx})", file=sys.stderr)
        rc, log, wall = run_perplexity(
            exe, [*common, "-f", str(text), "-ctk", "f16", "-ctv", "f16", "--kl-divergence-base", str(base_file)],
            (), "f16/f16 base", chunks, logs / "f16_f16_base.log",
        )  # fmt: skip
        r = _result(base, rc, log, wall, chunks, False)
        r.kld, r.kld_p99, r.same_top_p = 0.0, 0.0, 100.0
        results.append(r)
        if rc != 0:
            raise RuntimeError(f"the f16 base run failed (rc {rc}); log: {logs / 'f16_f16_base.log'}")
        for i, cfg in enumerate(configs, 1):
            print(f"[{i}/{len(configs)}] {cfg.name}", file=sys.stderr)
            rc, log, wall = run_perplexity(
                exe, [*common, *(evict_args or []), "-ctk", cfg.k, "-ctv", cfg.v, "--kl-divergence-base",
                      str(base_file), "--kl-divergence"],
                cfg.env, cfg.name, chunks, logs / f"{cfg.name.replace('/', '_').replace('@', '_')}.log",
            )  # fmt: skip
            env = {**os.environ, **dict(cfg.env)}
            results.append(_result(cfg, rc, log, wall, chunks, eviction_requested(evict_args or [], env)))
    return results


def _result(cfg: KvConfig, rc: int, log: str, wall: float, chunks: int, evict: bool) -> RunResult:
    p = parse_perplexity_log(log)
    r = RunResult(cfg.name, cfg.bits, wall_s=round(wall, 1), chunks=chunks, noisy=chunks < 3)
    r.ppl = p.get("mean_ppl_q", p.get("final_ppl"))
    r.ppl_err = p.get("mean_ppl_q_err", p.get("final_ppl_err"))
    r.kld, r.kld_err, r.kld_p99 = p.get("kld"), p.get("kld_err"), p.get("kld_p99")
    r.same_top_p, r.kv_mib = p.get("same_top_p"), p.get("kv_mib")
    r.ok = rc == 0 and r.ppl is not None
    if not r.ok:
        r.error = f"rc={rc}" + ("" if r.ppl is not None else ", no Final estimate / Mean PPL(Q) line")
    if evict:
        r.evictions = len(EVICT_LINE.findall(log))
        if r.ok and r.evictions == 0:
            r.ok = False
            r.error = "INVALID: eviction was enabled but the log has no 'triatt: evict:' line"
    return r


def print_table(results: list[RunResult], ref: str | None = "q4_0/q4_0") -> None:
    base = results[0].ppl
    refk = next((r.kld for r in results if r.config == ref), None)
    hdr = f"{'config':<18} {'bits/v':>6} {'KV MiB':>8} {'PPL':>17} {'dPPL':>7} {'mean KLD':>9} {'KLD p99':>8}"
    hdr += f" {'same top p':>10} {'KLD/ref':>7} {'wall s':>7}"
    evicting = any(r.evictions is not None for r in results)
    print(hdr + (f" {'evictions':>9}" if evicting else ""))
    for r in results:
        if not r.ok:
            print(f"{r.config:<18} FAILED: {r.error}")
            continue
        dppl = f"{100 * (r.ppl / base - 1):+.2f}%" if base and r.ppl else "-"
        rel = f"{r.kld / refk:.3f}" if refk and r.kld is not None else "-"
        ppl = f"{r.ppl:.4f} ± {r.ppl_err or 0:.4f}"
        print(
            f"{r.config + (' (noisy)' if r.noisy else ''):<18} {r.bits:>6.2f} {r.kv_mib or 0:>8.2f} {ppl:>17} "
            f"{dppl:>7} {r.kld or 0:>9.5f} {r.kld_p99 or 0:>8.4f} {r.same_top_p or 0:>9.2f}% {rel:>7} {r.wall_s:>7.1f}"
            + (f" {r.evictions if r.evictions is not None else '-':>9}" if evicting else "")
        )


def write_outputs(results: list[RunResult], out_dir: Path, meta: dict[str, object]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [asdict(r) for r in results]
    (out_dir / "ppl.json").write_text(json.dumps({"meta": meta, "results": rows}, indent=2) + "\n")
    with (out_dir / "ppl.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[k for k in rows[0] if k != "extra"])
        w.writeheader()
        for row in rows:
            row.pop("extra", None)
            w.writerow(row)
    plot_kld_vs_bits(results, out_dir / "kld_vs_bits.png", str(meta.get("title", "")))


def plot_kld_vs_bits(results: list[RunResult], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results[1:]:
        if r.ok and r.kld is not None:
            tq = "tq" in r.config
            ax.scatter(r.bits, r.kld, color="tab:red" if tq else "tab:blue", zorder=3)
            ax.annotate(r.config, (r.bits, r.kld), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("bits per value (mean of K and V)")
    ax.set_ylabel("mean KLD vs f16")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title or "KV cache quality vs size")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
