"""A tq3a calibration for lab/tq3a_gpu.sh's synthetic head-256 model (18 layers, one KV head), for speed runs only.

The kernel's speed does not depend on which RoPE pairs land in which group, so any valid order serves: lognormal
energies per pair (both channels of a pair alike), fixed seed. Real calibrations come from `llama-tq calibrate`.

    python lab/tq3a_synth_cal.py [-o .gpu/h256/m.tqcal] [--n-layer 18]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from llama_tq import calibrate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", type=Path, default=Path(".gpu/h256/m.tqcal"))
    ap.add_argument("--n-layer", type=int, default=18, help="the synthetic model's layers")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    x = {il: np.repeat(rng.lognormal(0.0, 1.0, (1, 128)), 2, axis=1) for il in range(args.n_layer)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    calibrate.write(args.out, "llama", args.n_layer, x)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
