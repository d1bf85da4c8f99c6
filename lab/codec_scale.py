"""Issue 13: the codec's stored scale, least-squares (shipped) against inner-product preserving, on the needle.

The codec stores s = n <y, c'> / <c', c'> (least squares: the smallest MSE), so x_hat = (1 - e) x + noise with e the
block's relative MSE: every key shrinks along itself, a uniform softening of sharp attention. The alternative
s = n / <y, c'> keeps <x_hat, x> = |x|^2 (no shrinkage) at +2.7 % MSE. Here both on the NIAH prompts at 16k: the
attention mass that the prompt's last token puts on the needle (best head) in global layers 5 and 11, exact keys
against tq3 / tq4 keys with the shipped transforms (key mean + diagonal s) and tq3 with the key basis. The
inner-product-preserving reconstruction is the codec's output rescaled per 128-value block by |x|^2 / <x_hat, x>
(the same blocks and indices, only the scale differs, as the codec would store it up to bf16 rounding).

    python lab/codec_scale.py [--tokens 16384] [--positions 0.05,0.15,...] [--out out/codec_scale]
    python lab/codec_scale.py --compare SHIPPED_GRID OTHER_GRID   # NIAH cells of two codec builds, paired
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # key_transforms, niah_grid
sys.path.insert(0, str(Path(__file__).resolve().parent))
import key_basis as kb
import key_transforms as kt
import niah_grid
from llama_tq.harness import demo, niah
from llama_tq.models import default_model

LS_TQ = kt.tq


def ip_tq(k: np.ndarray, kind: str) -> np.ndarray:
    """The codec's blocks with the inner-product-preserving scale: x_hat * |x|^2 / <x_hat, x> per block."""
    kh = LS_TQ(k, kind)
    x, xh = k.reshape(-1, 128), kh.reshape(-1, 128)
    num, den = (x * x).sum(1), (x * xh).sum(1)
    f = np.divide(num, den, out=np.ones_like(num), where=den > 0)
    return (xh * f[:, None]).reshape(kh.shape)


def compare(shipped: Path, other: Path) -> str:
    """Per config, the NIAH cells of two grids (same prompts, two codec builds): PASS counts, cells only one
    passes, exact McNemar p; pooled over the configs with TQ in them."""
    a, b = niah_grid.load([shipped]), niah_grid.load([other])
    out = ["| K/V | shipped PASS | other PASS | shipped only | other only | p |", "|---|---|---|---|---|---|"]
    for cfg in sorted(set(a) & set(b)):
        cells = sorted(set(a[cfg]) & set(b[cfg]))
        pa = [a[cfg][c] == "PASS" for c in cells]
        pb = [b[cfg][c] == "PASS" for c in cells]
        lost = sum(x and not y for x, y in zip(pa, pb, strict=True))
        won = sum(y and not x for x, y in zip(pa, pb, strict=True))
        p = niah_grid.mcnemar_p(lost, won)
        out.append(f"| {cfg} | {sum(pa)}/{len(cells)} | {sum(pb)}/{len(cells)} | {lost} | {won} | {p:.2g} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("SHIPPED", "OTHER"))
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--positions", default="0.05,0.15,0.25,0.35,0.45,0.55,0.65,0.75,0.85,0.95")
    ap.add_argument("--needle", default=niah.DEFAULT_NEEDLE)
    ap.add_argument("--out", type=Path, default=Path("out/codec_scale"))
    args = ap.parse_args()
    if args.compare:
        print(compare(*args.compare))
        return
    t0 = time.time()
    kt.WANT = re.compile(r"^[QKV]cur(_normed)?-(" + "|".join(map(str, kb.GLOBAL)) + r")$")
    model = default_model()
    reader = gguf.GGUFReader(str(model))
    theta = float(reader.fields["gemma3.rope.freq_base"].parts[-1][0]) ** (-np.arange(kb.H) * 2.0 / kb.D)
    n = args.tokens
    needle = niah.Needle.parse(args.needle)
    count = niah.tokenizer_for(model)
    n_tok = count(needle.sentence) - 1
    rows: list[dict[str, float]] = []
    for pos in args.positions.split(","):
        pr = niah.build_prompt(count, demo.default_text(), n - 20, needle, float(pos), "cloze")  # as the harness
        cap = kt.capture(model, pr.text, pr.tokens)
        row = {"position": float(pos)}
        for il in kb.GLOBAL[:2]:  # layer 17 puts ~1 % on the needle with every key set
            q = cap[f"Qcur-{il}"].astype(np.float64)[-1] / np.sqrt(kb.D)
            k = cap[f"Kcur-{il}"][:, 0].astype(np.float64)
            b = kb.bases(cap, reader, il, n, theta)
            variants = {"exact": k}
            for scale, fn in (("ls", LS_TQ), ("ip", ip_tq)):
                kt.tq = fn
                variants[f"tq3 {scale}"] = kb.quantized(k, b["mu"], b["diag (shipped)"], "tq3")
                variants[f"tq4 {scale}"] = kb.quantized(k, b["mu"], b["diag (shipped)"], "tq4")
                variants[f"tq3 matrix {scale}"] = kb.quantized(k, b["mu"], b["basis, weights"], "tq3")
            kt.tq = LS_TQ
            for name, kk in variants.items():
                row[f"L{il} {name}"] = kb.needle_mass(q, kk, pr.needle_token, n_tok)
        rows.append(row)
        print(json.dumps(row), flush=True)
    names = [k[3:] for k in rows[0] if k.startswith("L5 ") and k != "L5 exact"]
    lines = ["| keys | mean \\|log(mass / exact)\\| | mean log(mass / exact) |", "|---|---|---|"]
    summary = {}
    for name in names:
        s = np.array([np.log(r[f"L{il} {name}"] / r[f"L{il} exact"]) for r in rows for il in kb.GLOBAL[:2]])
        summary[name] = {"mean_abs_log": float(np.abs(s).mean()), "mean_log": float(s.mean())}
        lines.append(f"| {name} | {np.abs(s).mean():.3f} | {s.mean():+.3f} |")
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"model": model.name, "tokens": n, "needle": args.needle, "seconds": round(time.time() - t0)}
    out = args.out / f"needle_{n}.json"
    out.write_text(json.dumps({"meta": meta, "summary": summary, "rows": rows}, indent=1) + "\n")
    print("\n".join(lines))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
