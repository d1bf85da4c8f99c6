#!/usr/bin/env bash
# call 2 (warm): attribute tq4's extra GPU time per decode step: K / V side, key transforms, depth
W=/root/lt; bin=$W/build/bin
sh1() { # $1 label, $2 K, $3 V, $4 depth, rest: env
  local l=$1 k=$2 v=$3 d=$4; shift 4
  env "$@" SHIM_OUT=$W/s.txt LD_PRELOAD=$W/step_shim.so $bin/llama-bench -m $W/synth.gguf -ngl 99 -fa 1 -p 0 -n 128 -d $d -r 10 -ctk $k -ctv $v -o csv 2>/dev/null | tail -1 | awk -F, -v l="$l" '{printf "%-28s t/s %s  ", l, $(NF-1)}'
  python3 bench/cuda/step_shim_stats.py $W/s.txt | sed 's/.*steps/steps/'
}
{
echo "# LD_PRELOAD=step_shim.so llama-bench -m synth.gguf -ngl 99 -fa 1 -p 0 -n 128 -d D -r 10 -ctk K -ctv V (median of the last 1200 steps)"
for r in 1 2; do
  for d in 0 8192; do
    sh1 "f16/f16 d$d" f16 f16 $d
    sh1 "tq3/tq3 d$d" tq3 tq3 $d
    sh1 "tq4/tq4 d$d" tq4 tq4 $d
    sh1 "tq4/tq3 d$d" tq4 tq3 $d
    sh1 "tq3/tq4 d$d" tq3 tq4 $d
  done
  sh1 "tq3/tq3 d0 KEYS=0" tq3 tq3 0 LLAMA_TQ_KEYS=0
  sh1 "tq4/tq4 d0 KEYS=0" tq4 tq4 0 LLAMA_TQ_KEYS=0
  sh1 "f16/tq4 d0" f16 tq4 0
  sh1 "tq4/f16 d0" tq4 f16 0
  sh1 "f16/tq3 d0" f16 tq3 0
  sh1 "tq3/f16 d0" tq3 f16 0
done
} 2>&1 | tee $OUT/shim_split_tq4.txt
