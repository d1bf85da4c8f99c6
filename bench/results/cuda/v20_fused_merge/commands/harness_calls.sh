#!/usr/bin/env bash
# calls 3-5: the standalone harness (no llama.cpp build). 3: `depth` and `short` on the tree before the fused merge
# (harness_depth_before.txt, harness_short.txt); 4: the fused merge v1 (a warp per column; harness_depth_fused_v1.txt,
# ptxas_mma_v1.txt, harness_correctness_v1.txt); 5: v2, a column at a time with its chunks shared by the 4 warps
# (harness_depth_fused_v2_rejected.txt; the command also ran `perf` and hit the 10-minute limit)
gcc -O2 -std=c11 -ffp-contract=off -c csrc/codec/tq_codec.c -o /tmp/tq_codec.o
nvcc -O3 -std=c++17 -arch=sm_90 -use_fast_math -Icsrc/codec -Icsrc/llama.cpp/ggml/src/ggml-cuda/tq -Xptxas -v \
  bench/cuda/fa_decode_bench.cu /tmp/tq_codec.o -o /tmp/fa 2> /tmp/ptxas.txt || exit 1
grep -A2 "tq_fa_mma_kernel" /tmp/ptxas.txt | grep -E "Compiling|registers|spill" > $OUT/ptxas_mma.txt
/tmp/fa > $OUT/harness_correctness.txt 2>&1
{ for r in 1 2; do
  echo "== round $r fused"; /tmp/fa depth | sed 's/rel.err simt [^ ]* mma [^ ]* //'
  echo "== round $r separate"; TQ_FA_SEPARATE_MERGE=1 /tmp/fa depth | sed 's/rel.err simt [^ ]* mma [^ ]* //'
done; } > $OUT/harness_depth_fused.txt 2>&1
