#!/usr/bin/env bash
# v23 call 3: on top of F (call 2's best, now the working tree: symmetric count, the search's values loaded
# first, 66 table words), G1: the rotation's strides 32 and 64 from one exchange across warps (two barriers
# fewer), G2: every warp sums the squares itself (no broadcast, one barrier fewer), G12: both; old = HEAD.
W=/root/lt; mkdir -p $W
gcc -O2 -std=c11 -ffp-contract=off -c -Icsrc/codec csrc/codec/tq_codec.c -o $W/tq_codec.o || exit 1
vs=$(ls .gpu/hv)
for v in $vs; do
  d=-DTQ_QP_V23; [ $v = old ] && d=-DTQ_QP_ALL_TABLES
  nvcc -O3 -std=c++17 -arch=sm_90 -use_fast_math $d -Icsrc/codec -I.gpu/hv/$v -Icsrc/llama.cpp/ggml/src/ggml-cuda/tq \
    -Itests/cuda bench/cuda/quant_phases_bench.cu $W/tq_codec.o -o $W/qp_$v &
done
wait
{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for r in 1 2; do for v in $vs; do echo "== $v (round $r)"; $W/qp_$v 16 3000; done; done
for v in $vs; do echo "== $v 1024 blocks"; $W/qp_$v 1024 50 | grep bytes; done
} 2>&1 | tee $OUT/variants.txt
