#!/usr/bin/env bash
# v20 call C (warm): decode only, f16 / tq3 fused merge / tq3 separate merge (LLAMA_TQ_CUDA_FUSED_MERGE=0), x3 interleaved
W=/root/lt; bin=$W/build/bin
{ echo "# llama-bench -m synth.gguf -ngl 99 -fa 1 -p 0 -n 128 -d 8192,32768 -r 5 -ctk T -ctv T -o md; tq3-sep: LLAMA_TQ_CUDA_FUSED_MERGE=0"
for r in 1 2 3; do for t in f16 tq3 tq3-sep; do
  k=${t%-sep}; e=1; [ "$t" != "$k" ] && e=0
  echo "round $r $t"
  LLAMA_TQ_CUDA_FUSED_MERGE=$e timeout 100 $bin/llama-bench -m $W/synth.gguf -ngl 99 -fa 1 -p 0 -n 128 -d 8192,32768 -r 5 -ctk $k -ctv $k -o md 2>/dev/null | grep tg128
done; done; } | tee $OUT/llama_bench_v20_merge.md
