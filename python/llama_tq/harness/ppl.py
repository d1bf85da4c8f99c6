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
import re
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..cachetypes import is_tq
from ..errors import ProtocolError, RunError
from .common import LOG_FLAGS, MIN_CHUNKS, PPL_BATCH, KvConfig, eviction_check, progress, pyplot, run_tool


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


def _chunk_progress(label: str, n_chunks: int) -> Callable[[str], None]:
    """Normal mode prints `[n]ppl,` per chunk; KLD mode prints a table row per chunk starting with n."""

    def show(piece: str) -> None:
        m = re.findall(r"\[(\d+)\]", piece) or re.findall(r"^\s*(\d+)\s+[0-9.]+\s+±", piece)
        if m:
            progress(f"\r  {label}: chunk {m[-1]}/{n_chunks}", end="")

    return show


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
    if chunks < MIN_CHUNKS and not allow_noisy:
        raise ProtocolError(
            f"{chunks} chunks is below the protocol's minimum of {MIN_CHUNKS} (pass --allow-noisy to run it anyway)"
        )
    if not text.is_file():
        raise ProtocolError(f"no such text file: {text}")
    out_dir = out_dir or Path(tempfile.mkdtemp(prefix="llama-tq-ppl-"))
    logs = out_dir / "logs"
    common = ["-m", str(model), "-f", str(text), "-c", str(ctx), "-b", str(PPL_BATCH), "--chunks", str(chunks),
              "-t", str(threads), "-fa", "on", *LOG_FLAGS, *(extra_args or [])]  # fmt: skip
    results: list[RunResult] = []
    with tempfile.TemporaryDirectory(prefix="llama-tq-kld-") as tmp:  # the KLD base can be many GB
        base_file = Path(tmp) / "f16.kld"
        base = KvConfig("f16", "f16")
        progress(f"[base] f16/f16 -> KLD base ({chunks} chunks of {ctx})")
        run = run_tool("llama-perplexity", [*common, *base.flags, "--kl-divergence-base", str(base_file)],
                       logs / "f16_f16_base.log", on_output=_chunk_progress("f16/f16 base", chunks))  # fmt: skip
        progress("")
        r = _result(base, run.rc, run.log, run.wall_s, chunks)
        r.kld, r.kld_p99, r.same_top_p = 0.0, 0.0, 100.0
        results.append(r)
        if run.rc != 0:
            raise RunError(f"the f16 base run failed (rc {run.rc}); log: {logs / 'f16_f16_base.log'}")
        for i, cfg in enumerate(configs, 1):
            progress(f"[{i}/{len(configs)}] {cfg.name}")
            args = [*common, *(evict_args or []), *cfg.flags, "--kl-divergence-base", str(base_file),
                    "--kl-divergence"]  # fmt: skip
            run = run_tool("llama-perplexity", args, logs / f"{cfg.slug}.log", env=cfg.env,
                           on_output=_chunk_progress(cfg.name, chunks))  # fmt: skip
            progress("")
            results.append(_result(cfg, run.rc, run.log, run.wall_s, chunks))
    return results


def _result(cfg: KvConfig, rc: int, log: str, wall: float, chunks: int) -> RunResult:
    p = parse_perplexity_log(log)
    r = RunResult(cfg.name, cfg.bits, wall_s=round(wall, 1), chunks=chunks, noisy=chunks < MIN_CHUNKS)
    r.ppl = p.get("mean_ppl_q", p.get("final_ppl"))
    r.ppl_err = p.get("mean_ppl_q_err", p.get("final_ppl_err"))
    r.kld, r.kld_err, r.kld_p99 = p.get("kld"), p.get("kld_err"), p.get("kld_p99")
    r.same_top_p, r.kv_mib = p.get("same_top_p"), p.get("kv_mib")
    r.ok = rc == 0 and r.ppl is not None
    if not r.ok:
        r.error = f"rc={rc}" + ("" if r.ppl is not None else ", no Final estimate / Mean PPL(Q) line")
    r.evictions, invalid = eviction_check(log, rc)
    if r.ok and invalid:
        r.ok, r.error = False, invalid
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
    plt = pyplot()
    if plt is None:
        return

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results[1:]:
        if r.ok and r.kld is not None:
            tq = any(is_tq(t) for t in r.config.split("@")[0].split("/"))
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
