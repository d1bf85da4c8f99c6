#!/usr/bin/env bash
# v24 call 1: the codec tables in constant memory (tq_c_tab) instead of a ~0.7 KB kernel parameter. A fresh build of
# the working tree (llama-bench, test-backend-ops); the GPU quantizer vs the C codec (2^20 blocks a type, tables
# read from constant memory as the ggml kernels now do); test-backend-ops CUDA0 vs CPU for every op the tables
# reach; FA decode perf; a d0 decode step's host + GPU timeline (CUPTI with TRACE_API=1) for f16 / tq3 / tq4; then
# llama-bench tg128 at d0, f16 / tq3 / tq4 interleaved, 6 rounds of -r 5.
export RES=/root/res; mkdir -p $RES
exec > >(tee $OUT/call.log) 2>&1 # at most 8 files come back: the stages' logs stay in $RES, summaries here
(bash scripts/gpu/run_cuda.sh exact > $RES/exact.log 2>&1) & exact_pid=$!
BUILD_TARGETS="llama-bench test-backend-ops" bash scripts/gpu/run_cuda.sh build || { tail -30 $RES/build.log; cp $RES/build.log $OUT/; exit 1; }
wait $exact_pid; cp $RES/quant_exact.txt $OUT/; tail -7 $RES/exact.log
echo "build done at ${SECONDS}s"
OPS="SET_ROWS GET_ROWS CPY TQ_KV_WRITE FLASH_ATTN_EXT" timeout 240 bash scripts/gpu/run_cuda.sh ops
echo "ops done at ${SECONDS}s"
cp $RES/ops_FLASH_ATTN_EXT.log $OUT/
RES=$OUT timeout 60 bash scripts/gpu/run_cuda.sh perf > /dev/null
W=/root/lt; bin=$W/build/bin; LIBS=$bin
source bench/results/cuda/v24_const_tables/commands/common.sh
{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for kv in f16/f16 tq3/tq3 tq4/tq4; do n=${kv%/*}; trace "api_$n" $kv 1; done
python3 bench/cuda/step_timeline_stats.py $W/tr_api_f16.txt $W/tr_api_tq3.txt $W/tr_api_tq4.txt --json $OUT/timeline.json
for kv in f16/f16 tq3/tq3 tq4/tq4; do n=${kv%/*}; trace "k_$n" $kv; done
for r in 1 2 3 4 5 6; do
  [ $SECONDS -gt 560 ] && { echo "stopped before round $r (time)"; break; }
  for kv in f16/f16 tq3/tq3 tq4/tq4; do tg new 0 5 $kv; done
done
} 2>&1 | tee $OUT/final.txt
python3 - $OUT/final.txt <<'PY' | tee -a $OUT/final.txt
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.startswith("tg128")]
by = {}
for r in rows: by.setdefault(r[3], []).append(float(r[4]))
f = by.get("f16/f16", [])
for kv, v in by.items():
    ratios = [a / b for a, b in zip(v, f)] if f else []
    print(f"{kv}: median {statistics.median(v):.1f} t/s over {len(v)}; ratio to f16 by round: " + " ".join(f"{x:.3f}" for x in ratios) + (f" (median {statistics.median(ratios):.3f})" if ratios else ""))
PY
echo "total ${SECONDS}s"
