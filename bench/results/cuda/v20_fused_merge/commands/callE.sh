#!/usr/bin/env bash
# v20 call D (warm): the llama-bench set, f16 / tq3 / tq4 x8 interleaved, -r 10
W=/root/lt; bin=$W/build/bin
{ echo "# llama-bench -m synth.gguf -ngl 99 -fa 1 -p 512 -n 128 -d 0,8192,32768 -r 10 -ctk T -ctv T -o md"
for r in 1 2 3 4 5 6 7 8; do for t in f16 tq3 tq4; do
  echo "round $r $t"
  timeout 140 $bin/llama-bench -m $W/synth.gguf -ngl 99 -fa 1 -p 512 -n 128 -d 0,8192,32768 -r 10 -ctk $t -ctv $t -o md 2>/dev/null | grep -E "pp512|tg128"
done; done; } | tee $OUT/llama_bench_v20_x8.md
