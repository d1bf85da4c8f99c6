#!/usr/bin/env bash
# v23 call 6: tq3-only writes trigger right after the PDL wait (call 5: best for tq3); writes with a tq4 side:
# M trigger after the rotation (the build's default), S10 / S5 right after the wait with a 1000 / 500 ns sleep
# before it (S5 = v22's fix with the v23 quantizer), B right after the wait with no sleep (does this machine show
# the slowdown?). Each: tq4/tq4 traced at d0 (tq3/tq3 too for M), llama-bench tg128 at d0 f16 / tq3 / tq4
# interleaved (4 rounds of -r 5). Variants rebuild the write's unit only.
export RES=/root/res; mkdir -p $RES
BUILD_TARGETS="llama-bench" bash scripts/gpu/run_cuda.sh build || { tail -30 $RES/build.log; cp $RES/build.log $OUT/; exit 1; }
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
tg() { # variant depth reps kv
  $bin/llama-bench -m $W/synth.gguf -ngl 99 -fa 1 -p 0 -n 128 -d $2 -r $3 -ctk ${4%/*} -ctv ${4#*/} -o csv 2>/dev/null |
    tail -1 | awk -F, -v v=$1 -v d=$2 -v kv=$4 '{gsub(/"/, "", $(NF-1)); print "tg128 " v " d" d " " kv " " $(NF-1)}'
}
rebuild() { ( cd $W/build && /usr/bin/time -f "rebuild %e s" ninja llama-bench > $W/rb.log 2>&1; tail -1 $W/rb.log ); }
cp $T/ggml-tq-cuda.cu $W/write.orig
run_variant() { # name trigger-tq4 sleep-tq4 [bench]
  cp $W/write.orig $T/ggml-tq-cuda.cu
  sed -i -e "s/^#define TQ_WRITE_TRIGGER_TQ4 1$/#define TQ_WRITE_TRIGGER_TQ4 $2/" -e "s/^#define TQ_WRITE_SLEEP_TQ4 0$/#define TQ_WRITE_SLEEP_TQ4 $3/" $T/ggml-tq-cuda.cu
  [ "$2$3" = 10 ] || rebuild
  grep -n "^#define TQ_WRITE_" $T/ggml-tq-cuda.cu | tr '\n' ' '; echo
  [ "$1" = M ] && trace $1 tq3/tq3
  trace $1 tq4/tq4
  [ -n "${4:-}" ] && for r in 1 2 3 4; do for kv in f16/f16 tq3/tq3 tq4/tq4; do tg $1 0 5 $kv; done; done
}
{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
run_variant M 1 0 bench; run_variant S10 0 1000 bench; run_variant S5 0 500 bench; run_variant B 0 0
} 2>&1 | tee $OUT/variants.txt
awk '/^tg128/ {k=$2" "$3" "$4; s[k]+=$5; n[k]++} END {for (k in s) printf "%s mean %.1f t/s over %d rounds\n", k, s[k]/n[k], n[k]}' $OUT/variants.txt | sort | tee -a $OUT/variants.txt
