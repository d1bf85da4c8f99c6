#!/usr/bin/env bash
# v21 call 6: the chain harness closer to llama-bench: real blocks in the cache's open cells (data) and a filler that
# streams 8 MB of "weights" a layer through L2 (stream); traces of tq3/tq3 and tq4/tq4 with both
W=/root/lt; mkdir -p $W
CUPTI_LIB=/usr/local/cuda-13.0/targets/x86_64-linux/lib
gcc -O2 -std=c11 -ffp-contract=off -c csrc/codec/tq_codec.c -o $W/tq_codec.o || exit 1
nvcc -O3 -std=c++17 -arch=sm_90 -use_fast_math -Icsrc/codec -Icsrc/llama.cpp/ggml/src/ggml-cuda/tq \
  bench/cuda/pdl_chain_bench.cu $W/tq_codec.o -o $W/pdl_chain_bench || exit 1
gcc -O2 -shared -fPIC -I/usr/local/cuda-13.0/targets/x86_64-linux/include -o $W/kernel_trace.so bench/cuda/kernel_trace.c -L$CUPTI_LIB -lcupti || exit 1
{
$W/pdl_chain_bench 2000
for pair in 33 44; do
  TRACE_OUT=$W/t_$pair.txt LD_PRELOAD=$W/kernel_trace.so LD_LIBRARY_PATH=$CUPTI_LIB $W/pdl_chain_bench 2000 $pair 1 64 1 1
  python3 bench/cuda/kernel_trace_stats.py $W/t_$pair.txt --last 300 --timeline | sed -n '1,16p'
done
} 2>&1 | tee $OUT/chain2.txt
