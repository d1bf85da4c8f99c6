#!/usr/bin/env bash
# v24 call 3: the shipped code (HEAD after the constant-table variant was dropped) at d0, measured by the token
# period in CUPTI kernel traces (bench/cuda/kernel_trace_stats.py: the median from one decode step's first kernel
# to the next one's, host time included) as well as the GPU span: f16 / tq3 / tq4 interleaved, 4 rounds of
# llama-bench -r 3 traced; then llama-bench tg128 at d0 untraced, 4 interleaved rounds of -r 5.
export RES=/root/res; mkdir -p $RES
exec > >(tee $OUT/call.log) 2>&1
BUILD_TARGETS="llama-bench" bash scripts/gpu/run_cuda.sh build || { tail -30 $RES/build.log; exit 1; }
W=/root/lt; bin=$W/build/bin; LIBS=$bin
source bench/results/cuda/v24_const_tables/commands/common.sh
{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for r in 1 2 3 4; do for kv in f16/f16 tq3/tq3 tq4/tq4; do n=${kv%/*}; trace "r${r}_$n" $kv; done; done
for r in 1 2 3 4; do
  [ $SECONDS -gt 560 ] && { echo "stopped before round $r (time)"; break; }
  for kv in f16/f16 tq3/tq3 tq4/tq4; do tg shipped 0 5 $kv; done
done
} 2>&1 | tee $OUT/final.txt
for n in f16 tq3 tq4; do python3 bench/cuda/kernel_trace_stats.py $W/tr_r4_$n.txt --last 300 --timeline > $OUT/steps_$n.txt 2>&1; done
python3 - $OUT/final.txt <<'PY' | tee -a $OUT/final.txt
import re, statistics, sys
span, per, tg = {}, {}, {}
for l in open(sys.argv[1]):
    m = re.match(r"tr_r(\d)_(\w+)\.txt: .*GPU span ([\d.]+) us.*period ([\d.]+) us", l)
    if m:
        span.setdefault(m[2], []).append(float(m[3])); per.setdefault(m[2], []).append(float(m[4]))
    elif l.startswith("tg128"):
        r = l.split(); tg.setdefault(r[3].split("/")[0], []).append(float(r[4]))
for n in ("f16", "tq3", "tq4"):
    rp = [b / a for a, b in zip(per[n], per["f16"])]
    rt = [a / b for a, b in zip(tg.get(n, []), tg.get("f16", []))]
    print(f"{n}: span {statistics.median(span[n]):.1f} us, period {statistics.median(per[n]):.1f} us "
          f"(rounds {' '.join(f'{x:.1f}' for x in per[n])}); f16 period / this period by round {' '.join(f'{x:.3f}' for x in rp)} "
          f"(median {statistics.median(rp):.3f}); llama-bench ratio by round {' '.join(f'{x:.3f}' for x in rt)}"
          + (f" (median {statistics.median(rt):.3f})" if rt else ""))
PY
echo "total ${SECONDS}s"
