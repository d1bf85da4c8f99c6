#!/usr/bin/env bash
# v23 call 7 (final): a fresh build of the working tree; test-backend-ops SET_ROWS, CPY, TQ_KV_WRITE on CUDA0 vs
# CPU; where each write lets the FA kernel launch, chosen on this machine by the GPU time of a d0 decode step:
# A (the build's default) tq3 right after the PDL wait, tq4 after the rotation; C both right after the wait with a
# 1000 ns sleep before the trigger; the better one per type is rebuilt and traced again (F), then llama-bench tg128
# f16 / tq3 / tq4 interleaved, 4 rounds at d0 (-r 5) and 2 at d32768 (-r 3).
export RES=/root/res; mkdir -p $RES
BUILD_TARGETS="llama-bench test-backend-ops" bash scripts/gpu/run_cuda.sh build || { tail -30 $RES/build.log; cp $RES/build.log $OUT/; exit 1; }
OPS="SET_ROWS CPY TQ_KV_WRITE" RES=$OUT bash scripts/gpu/run_cuda.sh ops
W=/root/lt; bin=$W/build/bin; T=$W/src/ggml/src/ggml-cuda/tq
PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$W/synth.gguf" > /dev/null
CUDA_INC=$(dirname "$(find / -name cupti.h -path '*include*' 2>/dev/null | head -1)")
CUPTI_LIB=$(dirname "$(find / -name 'libcupti.so*' 2>/dev/null | grep -v stub | head -1)")
gcc -O2 -shared -fPIC -I"$CUDA_INC" -o $W/kernel_trace.so bench/cuda/kernel_trace.c -L"$CUPTI_LIB" -lcupti || exit 1
trace() { # variant ctk/ctv
  local n=$1_$2; n=${n/\//_}
  TRACE_OUT=$W/tr_$n.txt LD_PRELOAD=$W/kernel_trace.so LD_LIBRARY_PATH=$CUPTI_LIB:${LD_LIBRARY_PATH:-} \
    $bin/llama-bench -m $W/synth.gguf -ngl 99 -fa 1 -p 0 -n 128 -d 0 -r 3 -ctk ${2%/*} -ctv ${2#*/} -o csv 2>/dev/null > /dev/null
  python3 bench/cuda/kernel_trace_stats.py $W/tr_$n.txt --last 300 --timeline > $W/tl_$n.txt 2>&1
  echo "$1 $2: $(head -1 $W/tl_$n.txt | sed 's/.*: //')"
  awk '/k_tq_quantize_rows2/ && NF==4 {ws=$2; wd=$3} /tq_fa_mma_kernel/ && NF==4 {printf " %.2f/%.2f/%.2f", wd, $2-ws, $2+$3-ws-wd}' $W/tl_$n.txt
  echo " (write us / FA start after write start / FA end after write end, by layer)"
}
span() { head -1 $W/tl_$1.txt | sed 's/.*GPU span \([0-9.]*\) us.*/\1/'; }
tg() { # depth reps kv
  $bin/llama-bench -m $W/synth.gguf -ngl 99 -fa 1 -p 0 -n 128 -d $1 -r $2 -ctk ${3%/*} -ctv ${3#*/} -o csv 2>/dev/null |
    tail -1 | awk -F, -v d=$1 -v kv=$3 '{gsub(/"/, "", $(NF-1)); print "tg128 d" d " " kv " " $(NF-1)}'
}
cp $T/ggml-tq-cuda.cu $W/write.orig
config() { # trigger-tq3 sleep-tq3 trigger-tq4 sleep-tq4
  cp $W/write.orig $T/ggml-tq-cuda.cu
  sed -i -e "s/^#define TQ_WRITE_TRIGGER_TQ3 .*/#define TQ_WRITE_TRIGGER_TQ3 $1/" -e "s/^#define TQ_WRITE_SLEEP_TQ3 .*/#define TQ_WRITE_SLEEP_TQ3 $2/" \
         -e "s/^#define TQ_WRITE_TRIGGER_TQ4 .*/#define TQ_WRITE_TRIGGER_TQ4 $3/" -e "s/^#define TQ_WRITE_SLEEP_TQ4 .*/#define TQ_WRITE_SLEEP_TQ4 $4/" $T/ggml-tq-cuda.cu
  cmp -s $T/ggml-tq-cuda.cu $W/write.orig || ( cd $W/build && ninja llama-bench > $W/rb.log 2>&1; tail -1 $W/rb.log )
  grep "^#define TQ_WRITE_" $T/ggml-tq-cuda.cu | tr '\n' ' '; echo
}
{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
config 0 0 1 0; trace A tq3/tq3; trace A tq4/tq4
config 0 1000 0 1000; trace C tq3/tq3; trace C tq4/tq4
c3="0 0"; awk -v a="$(span A_tq3_tq3)" -v c="$(span C_tq3_tq3)" 'BEGIN {exit !(c < a)}' && c3="0 1000"
c4="1 0"; awk -v a="$(span A_tq4_tq4)" -v c="$(span C_tq4_tq4)" 'BEGIN {exit !(c < a)}' && c4="0 1000"
echo "chosen: tq3 trigger/sleep $c3, tq4 trigger/sleep $c4"
config $c3 $c4; trace F tq3/tq3; trace F tq4/tq4
for r in 1 2 3 4; do for kv in f16/f16 tq3/tq3 tq4/tq4; do tg 0 5 $kv; done; done
for r in 1 2; do for kv in f16/f16 tq3/tq3 tq4/tq4; do tg 32768 3 $kv; done; done
} 2>&1 | tee $OUT/final.txt
awk '/^tg128/ {k=$2" "$3; s[k]+=$4; n[k]++} END {for (k in s) printf "%s mean %.1f t/s over %d rounds\n", k, s[k]/n[k], n[k]}' $OUT/final.txt | sort | tee -a $OUT/final.txt
