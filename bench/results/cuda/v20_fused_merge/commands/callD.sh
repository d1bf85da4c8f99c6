#!/usr/bin/env bash
# v20 call D (warm): the llama-bench set, f16 / tq3 / tq4 x2 interleaved, -r 5
W=/root/lt; bin=$W/build/bin
{ echo "# llama-bench -m synth.gguf -ngl 99 -fa 1 -p 512 -n 128 -d 0,8192,32768 -r 5 -ctk T -ctv T -o md"
for r in 1 2; do for t in f16 tq3 tq4; do
  echo "round $r $t"
  timeout 140 $bin/llama-bench -m $W/synth.gguf -ngl 99 -fa 1 -p 512 -n 128 -d 0,8192,32768 -r 5 -ctk $t -ctv $t -o md 2>/dev/null | grep -E "pp512|tg128"
done; done; } | tee $OUT/llama_bench_v20_x2.md
