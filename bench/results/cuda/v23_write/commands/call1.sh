#!/usr/bin/env bash
# v23 call 1: where the quantizer's time goes (bench/cuda/quant_phases_bench.cu, clock stamps by phase, 16 blocks a
# launch as a decode token's K/V write), the shipped linear boundary count (.gpu/old_tq: HEAD's header with the
# phase hooks) against the symmetric count (tq_cu_nearest), then the quantizer vs the C codec on 2^20 blocks a type.
W=/root/lt; mkdir -p $W
gcc -O2 -std=c11 -ffp-contract=off -c -Icsrc/codec csrc/codec/tq_codec.c -o $W/tq_codec.o || exit 1
for v in old new; do
  inc=csrc/llama.cpp/ggml/src/ggml-cuda/tq; [ $v = old ] && inc=.gpu/old_tq
  nvcc -O3 -std=c++17 -arch=sm_90 -use_fast_math -Icsrc/codec -I$inc -Icsrc/llama.cpp/ggml/src/ggml-cuda/tq \
    -Itests/cuda bench/cuda/quant_phases_bench.cu $W/tq_codec.o -o $W/qp_$v || exit 1
done
{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for r in 1 2; do for v in old new; do echo "== $v (round $r)"; $W/qp_$v 16 3000; done; done
echo "== new, 132 blocks"; $W/qp_new 132 1000; echo "== old, 132 blocks"; $W/qp_old 132 1000
} 2>&1 | tee $OUT/phases.txt
RES=$OUT bash scripts/gpu/run_cuda.sh exact
