#!/usr/bin/env bash
# v20 call B (warm): FA perf fused vs separate merge; llama-bench f16 / tq3 / tq3 with the separate merge / tq4, interleaved
W=/root/lt; bin=$W/build/bin
re='hsk=128,hsv=128,nh=(4,nr23=\[4,1\],kv=32768|8,nr23=\[4,4\],kv=32768),nb=1,.*type_K=(f16|tq3|tq4),type_V=(f16|tq3|tq4)'
{ for m in 1 0 1 0; do echo "== LLAMA_TQ_CUDA_FUSED_MERGE=$m"
  LLAMA_TQ_CUDA_FUSED_MERGE=$m $bin/test-backend-ops perf -b CUDA0 -o FLASH_ATTN_EXT -p "$re" 2>&1 | grep FLASH_ATTN_EXT | sed 's/  */ /g'
done; } | tee $OUT/fa_perf_fused_vs_separate.txt | cut -c1-220
PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$W/synth.gguf" > /dev/null
{ echo "# llama-bench -m synth.gguf -ngl 99 -fa 1 -p 512 -n 128 -d 0,8192,32768 -r 10 -ctk T -ctv T -o md; tq3-sep: LLAMA_TQ_CUDA_FUSED_MERGE=0"
for r in 1 2; do for t in f16 tq3 tq3-sep tq4; do
  k=${t%-sep}; e=1; [ "$t" != "$k" ] && e=0
  echo "round $r $t"
  LLAMA_TQ_CUDA_FUSED_MERGE=$e $bin/llama-bench -m $W/synth.gguf -ngl 99 -fa 1 -p 512 -n 128 -d 0,8192,32768 -r 10 -ctk $k -ctv $k -o md 2>/dev/null
done; done; } | tee $OUT/llama_bench_v20.md | grep -E "round|tg128|pp512"
