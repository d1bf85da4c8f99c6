#!/usr/bin/env bash
# call 1: build, FA correctness of the reviewed SIMT kernel, host/GPU split per decode step for f16 / tq3 / tq4 at d0
export RES=/root/res; mkdir -p $RES
BUILD_TARGETS="test-backend-ops llama-bench" bash scripts/gpu/run_cuda.sh build || { tail -30 $RES/build.log; cp $RES/build.log $OUT/; exit 1; }
OPS=FLASH_ATTN_EXT bash scripts/gpu/run_cuda.sh ops
cp $RES/ops_FLASH_ATTN_EXT.log $OUT/
W=/root/lt; bin=$W/build/bin
PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$W/synth.gguf" > /dev/null
gcc -O2 -shared -fPIC -o $W/step_shim.so bench/cuda/step_shim.c -ldl
{
echo "# LD_PRELOAD=step_shim.so llama-bench -m synth.gguf -ngl 99 -fa 1 -p 0 -n 128 -r 10 -ctk T -ctv T; f16/tq3/tq4 x3 interleaved"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
for r in 1 2 3; do for t in f16 tq3 tq4; do
  SHIM_OUT=$W/shim_${t}_$r.txt LD_PRELOAD=$W/step_shim.so $bin/llama-bench -m $W/synth.gguf -ngl 99 -fa 1 -p 0 -n 128 -r 10 -ctk $t -ctv $t -o csv 2>/dev/null | tail -1 | awk -F, -v t=$t -v r=$r '{print "round " r " " t " t/s: " $(NF-1)}'
  python3 bench/cuda/step_shim_stats.py $W/shim_${t}_$r.txt
done; done
} 2>&1 | tee $OUT/shim_d0_f16_tq3_tq4.txt
