"""Eviction measured where it evicts (issue 15): KLD and PPL of each policy at budgets of 25/50/75 % of the
context, against the same cache without eviction, with rounds during the prefill.

llama-perplexity scores the second half of every chunk. With the defaults (warmup 1024, divide 128, ubatch 512) a
budget of 90 % fires its first round after the 15th ubatch of an 8k chunk, so almost no scored token sees an
evicted cache. Here the score is calibrated on the first `warmup` tokens (256), rounds fire every `divide` cells
past the budget (64) after every ubatch of `ubatch` tokens (128, with the protocol's -b 512), and each run reports
the fraction of scored tokens whose ubatch came after its chunk's first round (`seen`, from the round lines).

Policies (--triatt-policy): V3, V2, V1, StreamingLLM (streaming: the prefix as attention sinks + the most recent
cells) and random (prefix, window and a fixed hash of the position), all at the same budget; V3-nopool is V3 ranking
each cell by its own score (--triatt-pool 0) instead of the library's default pooling (which pools only where the free
slots hold 96 spans of 17 cells).
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from . import ppl
from .common import EVICT_ROUND_POS, KvConfig, progress, pyplot

# name -> --triatt-* settings (the library's defaults for the rest)
POLICIES: dict[str, dict[str, str | int]] = {
    "V3": {"policy": "v3"},
    "V3-nopool": {"policy": "v3", "pool": 0},
    "V2": {"policy": "v2"},
    "V1": {"policy": "v1"},
    "StreamingLLM": {"policy": "streaming"},
    "random": {"policy": "random"},
}


def triatt_flags(settings: dict[str, str | int]) -> tuple[str, ...]:
    """{"budget": 512, "pool_spans": 0} -> ("--triatt-budget", "512", "--triatt-pool-spans", "0")."""
    return tuple(a for k, v in settings.items() for a in (f"--triatt-{k.replace('_', '-')}", str(v)))


def seen_fraction(log: str, ctx: int) -> float | None:
    """Mean over chunks of the share of scored positions (ctx/2 .. ctx-1) processed after the chunk's first round.

    Each round line gives the newest position when it ran; positions restart with every chunk (the cache is
    cleared), so a round whose position is below the previous round's opens a chunk, and its position + 1 tokens of
    that chunk had been processed before any eviction."""
    firsts: list[int] = []
    last = None
    for p in (int(x) for x in EVICT_ROUND_POS.findall(log)):
        if last is None or p < last:
            firsts.append(p + 1)
        last = p
    if not firsts:
        return None
    half = ctx // 2
    return sum(max(0, ctx - max(p0, half)) / half for p0 in firsts) / len(firsts)


def configs(
    caches: list[KvConfig],
    ctx: int,
    budgets: tuple[int, ...],
    policies: dict[str, dict[str, str | int]],
    warmup: int,
    divide: int,
) -> list[KvConfig]:
    """Per cache: the cache without eviction, then each budget x policy (settings as --triatt-* flags)."""
    out: list[KvConfig] = []
    for cache in caches:
        out.append(cache)
        for pct in budgets:
            for name, settings in policies.items():
                flags = triatt_flags({"budget": ctx * pct // 100, **settings, "warmup": warmup, "divide": divide})
                out.append(replace(cache, args=cache.args + flags, label=f"{name} {pct}%"))
    return out


def run(
    model: Path,
    text: Path,
    out_dir: Path,
    caches: list[KvConfig] | None = None,
    ctx: int = 2048,
    chunks: int = 3,
    budgets: tuple[int, ...] = (25, 50, 75),
    policies: dict[str, dict[str, str | int]] | None = None,
    ubatch: int = 128,
    warmup: int = 256,
    divide: int = 64,
    threads: int = 2,
) -> dict[str, Any]:
    caches = caches or [KvConfig("f16", "f16")]
    policies = policies or POLICIES
    cfgs = configs(caches, ctx, budgets, policies, warmup, divide)
    results = ppl.run_matrix(model, text, cfgs, ctx=ctx, chunks=chunks, threads=threads,
                             extra_args=["-ub", str(ubatch)], out_dir=out_dir)  # fmt: skip
    rows = []
    for cfg, r in zip(cfgs, results[1:], strict=True):
        log = (out_dir / "logs" / f"{cfg.slug}.log").read_text(errors="replace")
        policy, _, pct = cfg.label.partition(" ")
        rows.append({**asdict(r), "cache": f"{cfg.k}/{cfg.v}", "policy": policy or "none",
                     "budget_pct": int(pct.rstrip("%")) if pct else 100, "seen": seen_fraction(log, ctx)})  # fmt: skip
    meta = {"model": str(model), "text": str(text), "ctx": ctx, "chunks": chunks, "ubatch": ubatch,
            "warmup": warmup, "divide": divide,
            "protocol": f"llama-perplexity -c {ctx} -b 512 -ub {ubatch} --chunks {chunks} -fa on, KLD vs f16 (same "
                        f"run); --triatt-warmup {warmup} --triatt-divide {divide}"}  # fmt: skip
    report = {"meta": meta, "rows": rows}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "evict.json").write_text(json.dumps(report, indent=2) + "\n")
    table = summary(report)
    (out_dir / "evict.md").write_text(table + "\n")
    plot(report, out_dir / "evict_kld_vs_budget.png")
    progress("")
    print(table)
    return report


def _base(rows: list[dict[str, Any]], cache: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["cache"] == cache and r["policy"] == "none"), None)


def summary(report: dict[str, Any]) -> str:
    """One row per cache and budget: each policy's KLD minus the no-eviction KLD, its PPL change, rounds, seen."""
    meta: dict[str, Any] = report["meta"]
    rows: list[dict[str, Any]] = report["rows"]
    policies = list(dict.fromkeys(str(r["policy"]) for r in rows if r["policy"] != "none"))
    lines = [f"{meta['protocol']}.", "Cell: mean KLD added by eviction (KLD - the same cache's KLD without "
             "eviction), PPL change, rounds, share of scored tokens that saw an evicted cache.", "",
             "| cache | budget | " + " | ".join(policies) + " |", "|---" * (len(policies) + 2) + "|"]  # fmt: skip
    for cache in dict.fromkeys(str(r["cache"]) for r in rows):
        base = _base(rows, cache)
        for pct in sorted({int(r["budget_pct"]) for r in rows if r["cache"] == cache and r["policy"] != "none"}):
            cells = []
            for pol in policies:
                r = next((x for x in rows if x["cache"] == cache and x["policy"] == pol and x["budget_pct"] == pct),
                         None)  # fmt: skip
                if r is None or not r["ok"] or base is None or not base["ok"]:
                    cells.append("-" if r is None else f"FAILED ({r['error']})")
                    continue
                dk = float(r["kld"]) - float(base["kld"] or 0.0)
                dp = 100 * (float(r["ppl"]) / float(base["ppl"]) - 1)
                seen = f", seen {100 * float(r['seen']):.0f} %" if r["seen"] is not None else ""
                cells.append(f"{dk:.4f} ({dp:+.1f} % PPL, {r['evictions']} rounds{seen})")
            lines.append(f"| {cache} | {pct} % | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return

    rows: list[dict[str, Any]] = report["rows"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for cache in dict.fromkeys(str(r["cache"]) for r in rows):
        base = _base(rows, cache)
        for pol in dict.fromkeys(str(r["policy"]) for r in rows if r["policy"] != "none"):
            pts = sorted((int(r["budget_pct"]), float(r["kld"]) - float(base["kld"] or 0.0))
                         for r in rows if r["cache"] == cache and r["policy"] == pol and r["ok"] and base)  # fmt: skip
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=f"{pol} ({cache})")
    ax.set_xlabel("budget, % of the context")
    ax.set_ylabel("mean KLD added by eviction")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(str(report["meta"]["protocol"])[:80], fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
