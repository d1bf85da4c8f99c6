#!/usr/bin/env bash
# v24 call 4: final checks of the shipped code (HEAD 76fbe1a's CUDA sources, unchanged since 69e32f9) through the
# repo's GPU script: quantizer exactness, test-backend-ops CUDA0 vs CPU for every TQ op, FA decode perf (the
# issue's cases, all pairs with a TQ side, head 256), llama-bench f16 / tq3 / tq4 at d0 and d32768 (-r 3, as time
# allows), and summary.json from the perf and bench logs (scripts/gpu/summary.py, over the committed one).
export RES=/root/res; mkdir -p $RES
exec > >(tee $OUT/call.log) 2>&1
(bash scripts/gpu/run_cuda.sh exact > $RES/exact.log 2>&1) & exact_pid=$!
BUILD_TARGETS="llama-bench test-backend-ops" bash scripts/gpu/run_cuda.sh build || { tail -30 $RES/build.log; exit 1; }
wait $exact_pid; cp $RES/quant_exact.txt $OUT/; grep -E "^tq" $RES/quant_exact.txt | cut -c1-150
OPS="SET_ROWS GET_ROWS CPY MUL_MAT FLASH_ATTN_EXT TQ_KV_WRITE" timeout 150 bash scripts/gpu/run_cuda.sh ops
for f in $RES/ops_*.log; do printf '%s: %s\n' "$(basename $f .log)" "$(grep -E '[0-9]+/[0-9]+ tests passed' $f | tail -1)"; done
# (the ops logs stay on the machine: at most 8 files come back; their totals are in call.log)
echo "ops done at ${SECONDS}s"
RES=$OUT timeout 60 bash scripts/gpu/run_cuda.sh perf > /dev/null; echo "perf done at ${SECONDS}s"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
BENCH_TYPES="f16 tq3 tq4" BENCH_DEPTHS=0,32768 BENCH_REPS=3 RES=$OUT timeout $((520 - SECONDS)) bash scripts/gpu/run_cuda.sh bench
echo "bench done at ${SECONDS}s"
python3 scripts/gpu/summary.py $OUT bench/results/cuda/summary.json > $OUT/summary.json && echo "summary.json written"
echo "total ${SECONDS}s"
