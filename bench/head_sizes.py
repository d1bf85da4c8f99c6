"""Issue 14: TQ cache types on every head size, CPU. Synthetic random-weight llama models with a byte vocabulary
(`llama_tq.synth`, so llama-perplexity runs) for head sizes 64, 96, 128, 192 and 256: the block each type is stored
in, its bits per value, the codec MSE of that block on unit vectors, and the mean KLD against an f16 cache of the
same run next to q4_0's (random weights make PPL meaningless, KLD still compares caches).

    python bench/head_sizes.py [--chunks 3] [--heads 64,96,128,192,256] [--speed]

--speed adds decode speed on the CPU: llama-bench -t 2 -fa 1 tg32 at depth 4096 on a larger synthetic model per head
size (4 layers, 8 heads on 2 KV heads, GQA 4), types interleaved over 2 rounds, ratio to q4_0 of the same run.
Writes bench/results/head_sizes.{md,json}. Text: the demo's embedded default (Python's pydoc topics).
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from pathlib import Path

import numpy as np

from llama_tq import _codec
from llama_tq import reference as ref
from llama_tq.cachetypes import for_head
from llama_tq.errors import UsageError
from llama_tq.harness import bench, ppl
from llama_tq.harness.common import KvConfig
from llama_tq.harness.demo import default_text
from llama_tq.synth import write_synth_model

ROOT = Path(__file__).resolve().parents[1]
TYPES = ("q4_0", "tq4", "tq3")


def unit_mse(kind: str, dim: int, n: int = 10_000) -> float:
    """MSE of a stored block type on n random unit vectors of its block size (q4_0: of 128 values)."""
    x = np.random.default_rng(0).standard_normal((n, dim))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    y = ref.q4_0_roundtrip(x) if kind == "q4_0" else _codec.dequantize(_codec.quantize(x, kind), kind)
    return float(np.mean(np.sum((x.astype(np.float64) - y) ** 2, axis=1)))


def tg_ratios(head: int, types: list[str], tmp: Path) -> dict[str, float]:
    """tg32 @ d4096 tokens/s of each type over q4_0's, same run (2 interleaved rounds x 2 repetitions)."""
    model = write_synth_model(tmp / f"speed_h{head}.gguf", n_layer=4, n_embd=8 * head, n_head=8, n_head_kv=2,
                              n_ff=4 * head, n_ctx=8192)  # fmt: skip
    configs = [KvConfig(t, t) for t in types]
    rows = bench.run(model, configs, depths="4096", prompt=0, gen=32, reps=2, rounds=2, threads=2)
    table = bench.table(rows, "q4_0/q4_0")
    return {str(r["config"]).split("/")[0]: float(r["ratio_vs_ref"]) for r in table if r["ratio_vs_ref"] is not None}


def cuda_tg_ratios(head: int) -> dict[str, str]:
    """tg128 over q4_0's at d4096 / d32768 from the H100 llama-bench tables of a head size (run_cuda.sh head64 /
    head96), or nothing where there is none."""
    path = ROOT / "bench" / "results" / "cuda" / f"head{head}" / f"h{head}_llama_bench.md"
    if not path.is_file():
        return {}
    tps: dict[tuple[str, int], float] = {}
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = re.fullmatch(r"tg128(?: @ d(\d+))?", cells[-2]) if len(cells) > 2 else None
        if m:
            kind = cells[5] if len(cells) == 10 else "f16"  # the f16 table has no type_k column
            tps[(kind, int(m.group(1) or 0))] = float(cells[-1].split()[0])
    out = {}
    for kind in TYPES:
        ratios = [tps[(kind, d)] / tps[("q4_0", d)] for d in (4096, 32768) if (kind, d) in tps and ("q4_0", d) in tps]
        if len(ratios) == 2:
            out[kind] = f"{ratios[0]:.2f} / {ratios[1]:.2f}"
    return out


def render(rows: list[dict[str, object]], meta: dict[str, object], out: Path) -> None:
    cuda = {h: cuda_tg_ratios(h) for h in (64, 96)}
    lines = ["# TQ cache types by head size (issue 14)", "", f"`{meta['command']}`: {meta['protocol']}.",
             "MSE: the stored block on 10,000 random unit vectors of its block size (q4_0: of 128 values).", "",
             "CPU tg: llama-bench -t 2 -fa 1 tg32 @ d4096 tokens/s over q4_0's, same run (with --speed).",
             "CUDA tg: H100, llama-bench -ngl 99 -fa 1 tg128 @ d4096 / d32768 over q4_0's, one run, on an 8-layer",
             "head-64 / head-96 synthetic model (32 heads / 8 KV heads): `RES=... bash scripts/gpu/run_cuda.sh build",
             "head64 head96` (bench/results/cuda/head64/, head96/). CUDA runs the 64-value blocks at head 64 and the",
             "96-value blocks at head 96 (decode in the TQ kernels, prefill through upstream's f16 kernels); head",
             "192 is refused with a GPU-resident cache (use -nkvo).", "",
             "| head | type | bits/value | MSE | KLD vs f16 | KLD vs q4_0 | CPU tg vs q4_0 | CUDA tg vs q4_0 "
             "| supported how |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if "bits" not in r:
            lines.append(f"| {r['head']} | {r['type']} | - | - | - | - | - | - | {r['supported']} |")
            continue
        ratio = f"{r['kld_vs_q4_0']:.2f}" if isinstance(r["kld_vs_q4_0"], float) else "-"
        kld = f"{r['kld']:.5f}" if isinstance(r["kld"], float) else "-"
        tg = f"{r['cpu_tg_vs_q4_0']:.2f}" if isinstance(r.get("cpu_tg_vs_q4_0"), float) else "-"
        gpu = cuda.get(int(str(r["head"])), {}).get(str(r["type"]), "-")
        lines.append(f"| {r['head']} | {r['type']} | {r['bits']:.3f} | {r['mse_unit']:.5f} | {kld} | {ratio} | {tg} | "
                     f"{gpu} | {r['supported']} |")  # fmt: skip
    lines += [
        "",
        "Head sizes not in the table:",
        "",
        "- 80, 112 (and any size that is not a multiple of 32): refused at context creation with a message",
        "  naming the head size. llama.cpp refuses its own quantized caches (q4_0, q8_0) there too (their",
        "  32-value blocks do not divide the head), so only f16/bf16/f32 caches run such models.",
        "- 160, 224, ... (multiples of 32, not of 64 or 96): refused (q4_0 / q8_0 work).",
        "- MLA (DeepSeek-style: K 576 = 512 latent + 64 RoPE values, V a 512-value view of K's rows): refused",
        "  with a message. Both widths are multiples of 64, so the 64-value blocks could hold the cache (V's",
        "  view would start on a block boundary), but the key transforms and the view path have not run on an",
        "  MLA model (the synthetic-model writer makes llama-architecture models only): off until tested.",
    ]
    (out / "head_sizes.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--heads", default="64,96,128,192,256")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--speed", action="store_true", help="add CPU decode speed ratios to q4_0 (tg32 @ d4096)")
    ap.add_argument("--render", action="store_true", help="only re-render head_sizes.md from head_sizes.json")
    args = ap.parse_args()
    if args.render:
        data = json.loads((args.out / "head_sizes.json").read_text())
        render(data["rows"], data["meta"], args.out)
        return
    heads = [int(h) for h in args.heads.split(",")]
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="llama-tq-heads-") as tmp:
        text = Path(tmp) / "text.txt"
        text.write_text(default_text())
        for head in heads:
            # 4 query heads on 2 KV heads (GQA 2), 2 layers
            model = write_synth_model(Path(tmp) / f"h{head}.gguf", n_layer=2, n_embd=4 * head, n_head=4, n_head_kv=2,
                                      n_ff=512, n_ctx=4096, byte_vocab=True)  # fmt: skip
            ok = [t for t in TYPES if for_head(t, head).row_bytes(head) is not None]
            results = {}
            if ok:
                configs = [KvConfig(t, t) for t in ok]
                out = Path(tmp) / f"runs_h{head}"
                for r in ppl.run_matrix(model, text, configs, ctx=args.ctx, chunks=args.chunks, out_dir=out):
                    results[r.config] = r
            q4 = results.get("q4_0/q4_0")
            speed = tg_ratios(head, ok, Path(tmp)) if args.speed and ok else {}
            for t in TYPES:
                stored = for_head(t, head)
                row: dict[str, object] = {"head": head, "type": t}
                if t not in ok:
                    row.update({"supported": "refused at context creation (TQ needs a multiple of 64 or 96)"})
                    rows.append(row)
                    continue
                r = results[f"{t}/{t}"]
                how = (f"{stored.block}-value blocks ({stored.name})" if stored.block in (64, 96) else
                       f"{stored.block}-value blocks") if t != "q4_0" else "32-value blocks"  # fmt: skip
                row.update({"supported": how, "stored": stored.name, "bits": stored.bits,
                            "mse_unit": unit_mse(stored.name, stored.block if t != "q4_0" else 128),
                            "kld": r.kld, "kld_vs_q4_0": (r.kld / q4.kld) if q4 and q4.kld and r.kld else None,
                            "ok": r.ok, "cpu_tg_vs_q4_0": speed.get(t)})  # fmt: skip
                rows.append(row)
    meta = {"command": f"python bench/head_sizes.py --chunks {args.chunks} --heads {args.heads}"
                       + (" --speed" if args.speed else ""),
            "protocol": f"llama-perplexity -c {args.ctx} -b 512 --chunks {args.chunks} -fa on -t 2, KLD vs f16 "
                        "(same run); synthetic 2-layer llama, 4 heads / 2 KV heads, byte vocabulary"}  # fmt: skip
    (args.out / "head_sizes.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    render(rows, meta, args.out)


if __name__ == "__main__":
    try:
        main()
    except UsageError as e:
        raise SystemExit(str(e)) from None
