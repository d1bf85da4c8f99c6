#!/bin/bash
# GPU session 2026-11-26 (sixth), call 8: issue 12's llama-bench targets on an H100 with this session's code:
# f16 / tq3 interleaved, tg128 at d0 and d32768, pp512 at d32768, -r 10, 3 rounds (synthetic model of the bench stage).
export RES=$OUT/r; mkdir -p $RES
W=/root/lt; bin=$W/build/bin
BUILD_TARGETS="llama-bench" bash scripts/gpu/run_cuda.sh build || exit 1
PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$W/synth.gguf" > /dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $RES/gpu.txt
for rep in 1 2 3; do for t in f16 tq3; do
  echo "== rep $rep $t"
  $bin/llama-bench -m $W/synth.gguf -ngl 99 -fa 1 -p 512 -n 128 -d 0,32768 -r 10 -ctk $t -ctv $t -o md 2>/dev/null | grep -E "tg128|pp512"
done; done | tee $RES/h100_bench.md
cd $OUT && tar czf r8.tgz r && rm -rf r
