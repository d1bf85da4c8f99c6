"""Issue 47, gate 1: would 3-bit-class keys that spend their bits where the query-weighted energy is beat tq3's key
error by enough (a <= 0.75)? Offline, on the default model's real post-RoPE Q/K of its global layers.

Per global layer (one KV head on this model) it measures
- the weighted energy of each RoPE pair, x_i = sqrt(E[q_i^2] E[k_i^2]) summed over the pair's two channels (after
  the key mean is removed), from a calibration span of the capture and from the q/k norm gains alone; x does not
  change under the diagonal equalization tq3 keys get, so the allocation can be read in either domain;
- the Gaussian prediction: logit error of one rotated uniform code, (sum x)^2 / N 2^-2R, against reverse
  water-filling over the channels, sum min(theta, x_i^2) at the same R = 3 bits (a_pred = the square root of the
  ratio);
- a concrete block scheme: the pairs sorted by x and cut into groups of 16, 32, 64 or 128 pairs (32..256 channels),
  each group rotated by its own random-sign Hadamard transform and coded as the codec codes a block (Lloyd-Max
  levels of a Gaussian at 0..5 bits, a 4-bit multiplier per 32 values, a least-squares bf16 scale; nothing for 0
  bits), the widths chosen by dynamic programming on the calibration's predicted error within 3.25 bits a value in
  all (scales and multipliers included), the grouping the best of every cut; keys with the mean removed and tq3's
  equalization, as tq3 keys are stored;
- the query-weighted key error of each, E[(q . (k_hat - k))^2] over the evaluation span's real queries and keys
  (exactly: the trace of the queries' second moment times the errors'), as a = sqrt(error / tq3's error), tq3 being
  the real codec with the shipped transforms; the emulated quantizer in tq3's own layout (blocks of 128 channels, 3
  bits) checks the emulation (a ~ 1).

    python lab/key_allocation.py [--tokens 16384] [--cal 2048] [--cal-text FILE] [--out out/lab]
    python lab/key_allocation.py --tokens 4096 --cal 2048 --all-layers --profiles   # one profile for all layers?

Writes key_allocation.json (gate1_a per global layer, the widths, bits per value) and prints a table.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import gguf
import numpy as np

from llama_tq.harness.demo import default_text
from llama_tq.models import default_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
kt = importlib.import_module("key_transforms")  # the capture, tq(), the equalization

WIDTHS = range(6)  # bits per coordinate a group may get
NORM_BITS = 16  # a bf16 scale per coded group
SUB = 32  # values a sub-block multiplier covers: 4 bits each, as the codec's header (csrc/codec/tq_codec.h)
SUBSCALE = 0.6 * (1.5 / 0.6) ** (np.arange(16) / 15)  # the codec's multipliers (TQ_SUBSCALE)
PAIR_UNIT = 16  # group sizes are 1, 2, 4 or 8 of these (16..128 pairs)


def lloyd_max(bits: int, n: int = 400_000, iters: int = 80) -> tuple[np.ndarray, float]:
    """Levels of the Lloyd-Max quantizer of a unit Gaussian and its distortion (0 bits: the mean, distortion 1)."""
    x = np.sort(np.random.default_rng(1).standard_normal(n))
    if bits == 0:
        return np.zeros(1), float(np.mean(x**2))
    levels = 1 << bits
    c = np.quantile(x, (np.arange(levels) + 0.5) / levels)
    for _ in range(iters):
        idx = np.searchsorted((c[1:] + c[:-1]) / 2, x)
        c = np.bincount(idx, weights=x, minlength=levels) / np.maximum(np.bincount(idx, minlength=levels), 1)
    idx = np.searchsorted((c[1:] + c[:-1]) / 2, x)
    return c, float(np.mean((x - c[idx]) ** 2))


CODEBOOKS = {b: lloyd_max(b) for b in WIDTHS}


def input_signs(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).choice([-1.0, 1.0], size=n)


def hadamard(n: int, seed: int) -> np.ndarray:
    """Orthonormal Sylvester Hadamard of size n (a power of 2) with random signs on its input: a fixed rotation."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return (h * input_signs(n, seed)[None, :]) / np.sqrt(n)  # y = H x


def bf16(x: np.ndarray) -> np.ndarray:
    """Round to bfloat16 (nearest even), as a stored scale."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def code_group(x: np.ndarray, bits: int, seed: int) -> np.ndarray:
    """One group's keys [T, n] through the block code: rotation, Lloyd-Max of the coordinates at unit RMS, a fitted
    scale, back. 0 bits: the group decodes to zero."""
    if bits == 0:
        return np.zeros_like(x)
    n = x.shape[1]
    h = hadamard(n, seed)
    y = x @ h.T
    rms = np.linalg.norm(y, axis=1) / np.sqrt(n)
    c, _ = CODEBOOKS[bits]
    u = y / np.maximum(rms, 1e-30)[:, None]
    # each sub-block of SUB values takes the multiplier of the codebook with the least squared error (as the codec)
    best_err = np.full((u.shape[0], n // SUB), np.inf)
    uq = np.zeros_like(u)
    for m in SUBSCALE:
        cand = m * c[np.searchsorted(m * (c[1:] + c[:-1]) / 2, u)]
        err = ((u - cand) ** 2).reshape(u.shape[0], n // SUB, SUB).sum(axis=2)
        take = err < best_err
        best_err = np.where(take, err, best_err)
        uq = np.where(np.repeat(take, SUB, axis=1), cand, uq)
    # the stored scale: the least-squares fit of the levels to the rotated key (one bf16 value a group)
    scale = bf16(np.sum(y * uq, axis=1) / np.maximum(np.sum(uq * uq, axis=1), 1e-30))
    return (uq * scale[:, None]) @ h


def side_bits(n: int) -> int:
    """A coded group's side data: its bf16 scale and a 4-bit multiplier per sub-block."""
    return NORM_BITS + 4 * (n // SUB)


def groupings(n_pairs: int) -> list[tuple[int, ...]]:
    """Every cut of the sorted pairs into runs of 1, 2, 4 or 8 units of PAIR_UNIT pairs."""
    units = n_pairs // PAIR_UNIT
    out: list[tuple[int, ...]] = []

    def rec(left: int, acc: tuple[int, ...]) -> None:
        if left == 0:
            out.append(acc)
            return
        for p in (1, 2, 4, 8):
            if p <= left:
                rec(left - p, (*acc, p * PAIR_UNIT))

    rec(units, ())
    return out


def allocate(qe: np.ndarray, ke: np.ndarray, sizes: tuple[int, ...], budget: int) -> tuple[float, list[int]]:
    """Widths for groups (channel energies qe, ke of the groups' channels, in order) minimizing the predicted
    logit error sum_g Q_g (K_g / n_g) D(b_g) within budget bits a key: dynamic programming over the bits used."""
    opts = []
    at = 0
    for p in sizes:
        n = 2 * p
        qg, kg = qe[at : at + n].sum(), ke[at : at + n].sum()
        at += n
        opts.append([(b, n * b + (side_bits(n) if b else 0), qg * kg / n * CODEBOOKS[b][1]) for b in WIDTHS])
    best: dict[int, tuple[float, list[int]]] = {0: (0.0, [])}
    for o in opts:
        nxt: dict[int, tuple[float, list[int]]] = {}
        for used, (err, ws) in best.items():
            for b, cost, e in o:
                u = used + cost
                if u <= budget and (u not in nxt or nxt[u][0] > err + e):
                    nxt[u] = (err + e, [*ws, b])
        best = nxt
    return min(best.values(), key=lambda t: t[0])


def code_groups(base: np.ndarray, groups: list[tuple[np.ndarray, int, int]]) -> np.ndarray:
    """Keys [T, D] (stored domain) through a grouped code: each (channels, bits, rotation seed) group coded alone."""
    out = np.zeros_like(base)
    for ch, b, gseed in groups:
        out[:, ch] = code_group(base[:, ch], b, seed=gseed)
    return out


def scheme_groups(
    d: int, order: np.ndarray, sizes: tuple[int, ...], widths: list[int], seed: int
) -> list[tuple[np.ndarray, int, int]]:
    """The scheme's groups: group g = both channels (NEOX: i, i + D/2) of the next sizes[g] pairs of order, at
    widths[g] bits: (channels in the rotation's input order, bits, the rotation's seed)."""
    out = []
    at = 0
    for g, (p, b) in enumerate(zip(sizes, widths, strict=True)):
        sel = order[at : at + p]
        out.append((np.concatenate([sel, sel + d // 2]), b, seed + g))
        at += p
    return out


Emitted = list[tuple[int, int, int, list[tuple[np.ndarray, int, int]]]]  # (layer, KV head, head size, groups)


def emit(path: Path, layers: Emitted) -> None:
    """An allocation file for the measuring hook (lab/patches/keys-measuring.patch: LLAMA_TQ_KEYS_EMULATE=alloc:path;
    the harness options @alloc / @alloc3 read --out out/key_alloc's): the codebooks, the multipliers and every
    (layer, KV head)'s groups."""
    lines = ["tq-key-alloc-1", "subscale 16 " + " ".join(repr(float(m)) for m in SUBSCALE)]
    lines += [f"book {b} {1 << b} " + " ".join(repr(float(c)) for c in CODEBOOKS[b][0]) for b in WIDTHS if b]
    for il, h, d, groups in layers:
        for ch, b, seed in groups:
            signs = " ".join(str(int(x)) for x in input_signs(ch.size, seed))
            lines.append(f"group {il} {h} {d} {b} {ch.size} " + " ".join(map(str, ch)) + " " + signs)
    path.write_text("\n".join(lines) + "\n")


def group_sums(e: np.ndarray, sizes: tuple[int, ...]) -> np.ndarray:
    """Channel energies e (pairs in order, then their partners) regrouped: each group's pairs, then their partners."""
    half = e.size // 2
    starts = itertools.accumulate((0, *sizes[:-1]))
    return np.concatenate(
        [np.concatenate([e[a : a + p], e[half + a : half + a + p]]) for a, p in zip(starts, sizes, strict=True)]
    )


def reverse_waterfill(var: np.ndarray, rate: float) -> float:
    """Sum of min(theta, var_i) with sum max(0, log2(var_i / theta) / 2) = rate * N (Gaussian channels)."""
    v = var[var > 0]
    lo, hi = np.log2(v.min()) - 60, np.log2(v.max())
    for _ in range(200):
        mid = (lo + hi) / 2
        r = np.maximum(0.0, 0.5 * (np.log2(v) - mid)).sum()
        lo, hi = (mid, hi) if r > rate * var.size else (lo, mid)
    theta = 2.0**hi
    return float(np.minimum(theta, var).sum())


def logit_error(cq: np.ndarray, err: np.ndarray) -> float:
    """E over queries and keys of (q . e)^2 = trace(C_q C_e)."""
    return float(np.sum(cq * (err.T @ err) / err.shape[0]))


def describe(sizes: Sequence[int], widths: Sequence[int]) -> str:
    """A profile as "pairs:bits" groups, largest energy first."""
    return " ".join(f"{p}:{b}" for p, b in zip(sizes, widths, strict=True))


class LayerCtx(NamedTuple):
    """One (layer, KV head) as main() scored it: its calibrated pair order, stored-domain keys, transforms, the
    evaluation's keys and query moments, tq3's error, and the calibration energies in that order."""

    il: int
    h: int
    order: np.ndarray
    base: np.ndarray
    s: np.ndarray
    mu: np.ndarray
    kv: np.ndarray
    cq: np.ndarray
    err_tq3: float
    qe_o: np.ndarray
    ke_o: np.ndarray
    order_weights: np.ndarray  # the pair order from the q/k norm gains alone (no calibration)


def fixed_profiles(ctx: list[LayerCtx], rows: list[dict], budget: int) -> tuple[dict, tuple[int, ...], list[int]]:
    """One (group sizes, widths) profile for every layer, so that a cache type could have one block layout (the
    per-(layer, KV head) part then only the pair order and the rotations' signs): every layer's own best profile and
    the best for the pooled energies (each layer's sorted energies normalized to sum 1, averaged), each applied to
    every layer in that layer's energy order (the pooled one also in the order of the q/k norm gains alone, which
    needs no calibration); a per layer, and their mean and worst against the per-layer optimum. Also returns the
    pooled profile (group sizes, widths)."""
    d = ctx[0].base.shape[1]
    cands: dict[str, tuple[tuple[int, ...], list[int]]] = {}
    for r in rows:
        c = r["scheme_calibration"]
        cands.setdefault(describe(c["groups_pairs"], c["widths"]), (tuple(c["groups_pairs"]), list(c["widths"])))
    qe = np.mean([c.qe_o / c.qe_o.sum() for c in ctx], axis=0)
    ke = np.mean([c.ke_o / c.ke_o.sum() for c in ctx], axis=0)
    _, pooled_ws, pooled_sizes = min(
        ((*allocate(group_sums(qe, sz), group_sums(ke, sz), sz, budget), sz) for sz in groupings(d // 2)),
        key=lambda t: t[0],
    )
    pooled_desc = describe(pooled_sizes, pooled_ws)
    cands.setdefault(pooled_desc, (pooled_sizes, pooled_ws))
    own = np.array([r["scheme_calibration"]["a"] for r in rows])
    out = []
    for desc, (sizes, ws) in cands.items():
        for by in ("calibration", "weights") if desc == pooled_desc else ("calibration",):
            a = []
            for c in ctx:
                order = c.order if by == "calibration" else c.order_weights
                kq = code_groups(c.base, scheme_groups(d, order, sizes, ws, 1000 * c.il)) / c.s + c.mu
                a.append(float(np.sqrt(logit_error(c.cq, kq - c.kv) / c.err_tq3)))
            names = [f"{c.il}.{c.h}" for c in ctx]
            out.append({"profile": desc, "pooled": desc == pooled_desc, "order": by,
                        "a": dict(zip(names, a, strict=True)), "a_mean": float(np.mean(a)),
                        "a_worst": float(np.max(a)), "worst_vs_own": float(np.max(np.array(a) / own))})  # fmt: skip
    out.sort(key=lambda t: t["a_mean"])
    print(f"\none profile for every layer ({len(ctx)} (layer, KV head)s; own optimum: mean a {own.mean():.3f}):")
    for o in out:
        tag = (" (pooled)" if o["pooled"] else "") + (
            "" if o["order"] == "calibration" else ", pair order from the gains"
        )
        head = f"  mean a {o['a_mean']:.3f} worst {o['a_worst']:.3f} worst/own {o['worst_vs_own']:.3f}"
        print(f"{head}  {o['profile']}{tag}")
    return {"own_a_mean": float(own.mean()), "profiles": out}, pooled_sizes, pooled_ws


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--text", type=Path, default=None, help="default: the demo's embedded text")
    ap.add_argument("--cal-text", type=Path, default=None, help="calibrate on this text's first --cal tokens instead")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--cal", type=int, default=2048, help="calibration tokens (mean, energies, widths)")
    ap.add_argument("--bpv", type=float, default=3.25, help="bits a key value, side data included")
    ap.add_argument("--all-layers", action="store_true", help="every layer, not only the global ones (for KLD)")
    ap.add_argument("--out", type=Path, default=Path("out/lab"))
    ap.add_argument(
        "--profiles",
        action="store_true",
        help="also score one width profile shared by every layer (gate 3's fixed block layout): each layer's own "
        "best and the pooled energies' best, applied to every layer in its own energy order (with --emit: "
        "key_alloc_profile.txt, every layer with the pooled profile)",
    )
    ap.add_argument(
        "--emit",
        action="store_true",
        help="also write the calibrated scheme (key_alloc.txt) and the "
        "check in tq3's layout (key_alloc_tq3layout.txt) for LLAMA_TQ_KEYS_EMULATE=alloc:FILE (gate 2)",
    )
    args = ap.parse_args()
    model = args.model or default_model()
    text = args.text.read_text(errors="replace") if args.text else default_text()
    t0 = time.time()
    reader = gguf.GGUFReader(str(model))
    n_layer = int(reader.fields["gemma3.block_count"].parts[-1][0])
    glob = [il for il in range(n_layer) if args.all_layers or (il + 1) % 6 == 0]  # Gemma 3: every 6th is global
    kt.WANT = re.compile(r"^[QK]cur-(" + "|".join(map(str, glob)) + r")$")
    cap = kt.capture(model, text, args.tokens)
    capc = kt.capture(model, args.cal_text.read_text(errors="replace"), args.cal) if args.cal_text else cap
    tens = {t.name: np.array(t.data, dtype=np.float64) for t in reader.tensors if "norm" in t.name}
    cal = slice(0, args.cal)
    ev = slice(args.cal, args.tokens)
    rows = []
    emitted: dict[str, Emitted] = {"": [], "_tq3layout": []}
    ctx: list[LayerCtx] = []  # what --profiles re-codes each (layer, KV head) with
    for il in glob:
        q = cap[f"Qcur-{il}"].astype(np.float64)  # [T, Hq, D]
        k = cap[f"Kcur-{il}"].astype(np.float64)  # [T, Hkv, D]
        d, hq, hkv = k.shape[2], q.shape[1], k.shape[1]
        gq, gk = tens[f"blk.{il}.attn_q_norm.weight"], tens[f"blk.{il}.attn_k_norm.weight"]
        s = kt.eq_scale(kt.pair_mean(gq**2), kt.pair_mean(gk**2))  # tq3's equalization (from the weights)
        for h in range(hkv):
            qh = q[:, h * (hq // hkv) : (h + 1) * (hq // hkv)]
            kh = k[:, h]
            qcal = capc[f"Qcur-{il}"][cal, h * (hq // hkv) : (h + 1) * (hq // hkv)].astype(np.float64)
            kcal = capc[f"Kcur-{il}"][cal, h].astype(np.float64)
            mu = kcal.mean(axis=0)
            # energies in the stored domain (centered, equalized): q' = q / s, k' = (k - mu) s
            qe = ((qcal / s) ** 2).mean(axis=(0, 1))
            ke = (((kcal - mu) * s) ** 2).mean(axis=0)
            x = np.sqrt(qe * ke)  # per channel; per pair below (NEOX: i, i + D/2)
            xw = np.sqrt((gq**2 / s**2) * (gk**2 * s**2))  # from the gains alone
            pair_x = x[: d // 2] + x[d // 2 :]
            pred_uniform = x.sum() ** 2 / d * 2.0**-6
            pred_rw = reverse_waterfill(x**2, 3.0)
            dead = int(np.sum(xw < 0.01 * xw.max()))
            # the evaluation: queries (every head, the evaluation span) against the evaluation keys
            qv = qh[ev].reshape(-1, d)
            cq = qv.T @ qv / qv.shape[0]
            kv = kh[ev]
            base = (kv - mu) * s
            e_tq3 = kt.tq(base, "tq3") / s + mu - kv
            err_tq3 = logit_error(cq, e_tq3)
            mse_tq3 = float(np.mean(e_tq3**2))

            budget = int(args.bpv * d)
            results = {}
            xw_pairs = xw[: d // 2] + xw[d // 2 :]
            for src, px in (("calibration", pair_x), ("weights", xw_pairs)):
                order = np.argsort(-px)
                qe_o = np.concatenate([qe[order], qe[order + d // 2]])
                ke_o = np.concatenate([ke[order], ke[order + d // 2]])
                best: tuple[float, tuple[int, ...], list[int]] | None = None
                for sizes in groupings(d // 2):
                    err, ws = allocate(group_sums(qe_o, sizes), group_sums(ke_o, sizes), sizes, budget)
                    if best is None or err < best[0]:
                        best = (err, sizes, ws)
                assert best is not None
                _, sizes, ws = best
                groups = scheme_groups(d, order, sizes, ws, 1000 * il)
                if src == "calibration":
                    emitted[""].append((il, h, d, groups))
                    ctx.append(LayerCtx(il, h, order, base, s, mu, kv, cq, err_tq3, qe_o, ke_o, np.argsort(-xw_pairs)))
                kq = code_groups(base, groups) / s + mu
                bits = sum(2 * p * b + (side_bits(2 * p) if b else 0) for p, b in zip(sizes, ws, strict=True))
                results[src] = {
                    "a": float(np.sqrt(logit_error(cq, kq - kv) / err_tq3)),
                    "mse_ratio": float(np.mean((kq - kv) ** 2) / mse_tq3),
                    "groups_pairs": list(sizes), "widths": ws, "bpv": bits / d,
                    "zero_bit_channels": int(sum(2 * p for p, b in zip(sizes, ws, strict=True) if b == 0)),
                }  # fmt: skip
            # the emulation checked: the same quantizer in tq3's own layout (blocks of 128 channels in channel order,
            # 3 bits) should have tq3's error (a ~ 1)
            tq3_layout = [(np.arange(b0, b0 + 128), 3, 1000 * il + 100 + b0) for b0 in range(0, d, 128)]
            ku = code_groups(base, tq3_layout) / s + mu
            emitted["_tq3layout"].append((il, h, d, tq3_layout))
            row = {
                "layer": il, "kv_head": h,
                "a_pred_waterfill": float(np.sqrt(pred_rw / pred_uniform)),
                "dead_channels_weights": dead,
                "a_tq3_emulated": float(np.sqrt(logit_error(cq, ku - kv) / err_tq3)),
                "tq3_logit_err": err_tq3, "tq3_mse": mse_tq3,
                "scheme_calibration": results["calibration"], "scheme_weights": results["weights"],
            }  # fmt: skip
            rows.append(row)
            print(f"  layer {il} head {h}: {time.time() - t0:.0f} s", file=sys.stderr)
    print(f"\n{'layer':>5s} {'a_pred':>7s} {'tq3 (emulated)':>14s} {'a (cal widths)':>15s} {'a (weight widths)':>18s}"
          f" {'bpv':>5s}  widths (pairs:bits)")  # fmt: skip
    for r in rows:
        c, w = r["scheme_calibration"], r["scheme_weights"]
        desc = describe(c["groups_pairs"], c["widths"])
        print(f"{r['layer']:5d} {r['a_pred_waterfill']:7.3f} {r['a_tq3_emulated']:14.3f} {c['a']:15.3f}"
              f" {w['a']:18.3f} {c['bpv']:5.2f}  {desc}")  # fmt: skip
    gate = {str(r["layer"]): r["scheme_calibration"]["a"] for r in rows}
    passed = all(v <= 0.75 for il, v in gate.items() if (int(il) + 1) % 6 == 0)
    print(f"\ngate 1 (a <= 0.75 on every global layer): {'PASS' if passed else 'FAIL'} {gate}")
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"model": model.name, "tokens": args.tokens, "cal": args.cal, "bpv_budget": args.bpv,
            "text": str(args.text) if args.text else "demo default (pydoc topics)",
            "cal_text": str(args.cal_text) if args.cal_text else "the first --cal tokens of the text",
            "seconds": round(time.time() - t0)}  # fmt: skip
    out = {"meta": meta, "gate1_a": gate, "gate1_pass": passed, "rows": rows}
    if args.profiles:
        out["fixed_profiles"], sizes, ws = fixed_profiles(ctx, rows, int(args.bpv * ctx[0].base.shape[1]))
        emitted["_profile"] = [  # every layer with the pooled profile, in its own pair order (@allocp)
            (c.il, c.h, c.base.shape[1], scheme_groups(c.base.shape[1], c.order, sizes, ws, 1000 * c.il)) for c in ctx
        ]
    (args.out / "key_allocation.json").write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out / 'key_allocation.json'}")
    if args.emit:
        for suffix, layers in emitted.items():
            emit(args.out / f"key_alloc{suffix}.txt", layers)
            print(f"wrote {args.out / f'key_alloc{suffix}.txt'}")


if __name__ == "__main__":
    main()
