#!/usr/bin/env bash
# v23 call 4: the faster quantizer in a fresh build (symmetric boundary count, the search's values loaded first,
# 66 table words, the sum of squares without a broadcast): the quantizer vs the C codec on 2^20 blocks a type,
# tq3/tq3 and tq4/tq4 traced at d0 (CUPTI), llama-bench tg128 at d0 f16 / tq3 / tq4 interleaved (3 rounds of -r 5),
# then test-backend-ops SET_ROWS, CPY and TQ_KV_WRITE (the fused write) on CUDA0 vs CPU.
export RES=/root/res; mkdir -p $RES
BUILD_TARGETS="llama-bench test-backend-ops" bash scripts/gpu/run_cuda.sh build || { tail -30 $RES/build.log; cp $RES/build.log $OUT/; exit 1; }
W=/root/lt; bin=$W/build/bin
RES=$OUT bash scripts/gpu/run_cuda.sh exact
PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$W/synth.gguf" > /dev/null
CUDA_INC=$(dirname "$(find / -name cupti.h -path '*include*' 2>/dev/null | head -1)")
CUPTI_LIB=$(dirname "$(find / -name 'libcupti.so*' 2>/dev/null | grep -v stub | head -1)")
gcc -O2 -shared -fPIC -I"$CUDA_INC" -o $W/kernel_trace.so bench/cuda/kernel_trace.c -L"$CUPTI_LIB" -lcupti || exit 1
trace() { # ctk/ctv
  local n=${1/\//_}
  TRACE_OUT=$W/tr_$n.txt LD_PRELOAD=$W/kernel_trace.so LD_LIBRARY_PATH=$CUPTI_LIB:${LD_LIBRARY_PATH:-} \
    $bin/llama-bench -m $W/synth.gguf -ngl 99 -fa 1 -p 0 -n 128 -d 0 -r 3 -ctk ${1%/*} -ctv ${1#*/} -o csv 2>/dev/null > /dev/null
  python3 bench/cuda/kernel_trace_stats.py $W/tr_$n.txt --last 300 --timeline > $OUT/tl_$n.txt 2>&1
  echo "$1: $(head -1 $OUT/tl_$n.txt | sed 's/.*: //')"
  awk '/k_tq_quantize_rows2|k_set_rows/ && NF==4 {ws=$2; wd=$3} /tq_fa_mma_kernel|flash_attn/ && NF==4 {printf " %.2f/%.2f/%.2f", wd, $2-ws, $2+$3-ws-wd}' $OUT/tl_$n.txt
  echo " (write us / FA start after write start / FA end after write end, by layer)"
}
tg() { # depth reps kv
  $bin/llama-bench -m $W/synth.gguf -ngl 99 -fa 1 -p 0 -n 128 -d $1 -r $2 -ctk ${3%/*} -ctv ${3#*/} -o csv 2>/dev/null |
    tail -1 | awk -F, -v d=$1 -v kv=$3 '{gsub(/"/, "", $(NF-1)); print "tg128 d" d " " kv " " $(NF-1)}'
}
{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
trace f16/f16; trace tq3/tq3; trace tq4/tq4
for r in 1 2 3; do for kv in f16/f16 tq3/tq3 tq4/tq4; do tg 0 5 $kv; done; done
} 2>&1 | tee $OUT/final.txt
awk '/^tg128/ {k=$2" "$3; s[k]+=$4; n[k]++} END {for (k in s) printf "%s mean %.1f t/s over %d rounds\n", k, s[k]/n[k], n[k]}' $OUT/final.txt | sort | tee -a $OUT/final.txt
OPS="SET_ROWS CPY TQ_KV_WRITE" RES=$OUT bash scripts/gpu/run_cuda.sh ops
