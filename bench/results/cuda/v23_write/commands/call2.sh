#!/usr/bin/env bash
# v23 call 2: quantizer variants in the phase harness (headers generated into .gpu/hv/<name>/ from the working
# tree's tq-cuda-codec.cuh, see v23_write/README.md): old (HEAD's linear count), A_sym (symmetric count for both),
# B_lin3 (symmetric for tq4, linear for tq3), C_tab66 (B + the 128-value quantizer loads only the 66 table words
# it reads), D_pref (B + the search's 16 values loaded first), E_tab66_pref (C + D), F_sym_tab66_pref (A + C + D).
W=/root/lt; mkdir -p $W
gcc -O2 -std=c11 -ffp-contract=off -c -Icsrc/codec csrc/codec/tq_codec.c -o $W/tq_codec.o || exit 1
vs=$(ls .gpu/hv)
for v in $vs; do
  nvcc -O3 -std=c++17 -arch=sm_90 -use_fast_math -Icsrc/codec -I.gpu/hv/$v -Icsrc/llama.cpp/ggml/src/ggml-cuda/tq \
    -Itests/cuda bench/cuda/quant_phases_bench.cu $W/tq_codec.o -o $W/qp_$v &
done
wait
{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for r in 1 2 3; do for v in $vs; do echo "== $v (round $r)"; $W/qp_$v 16 3000; done; done
for v in $vs; do echo "== $v 1024 blocks"; $W/qp_$v 1024 50 | grep bytes; done
} 2>&1 | tee $OUT/variants.txt
