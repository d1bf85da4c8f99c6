#!/usr/bin/env bash
# v22 call 2: call 1's stamps build had no tq4 penalty. Which part of the stamps removes it? One build as shipped
# (A), then the stamps compiled into one translation unit at a time by a `#define TQ_STAMPS` at its top (incremental
# rebuilds): B the fused write's unit only, C the FA units only; each variant tq3/tq3 and tq4/tq4 at d0 traced with
# the CUPTI tracer (GPU span of a decode step, per-kernel times) and llama-bench t/s untraced
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
  awk '/k_tq_quantize_rows2/ && NF==4 {ws=$2; wd=$3} /tq_fa_mma_kernel/ && NF==4 {printf " %.2f", $2+$3-ws-wd}' $W/tl_$n.txt
  echo " (FA end after write end, by layer)"
}
tps() { # variant
  for r in 1 2; do for kv in tq3/tq3 tq4/tq4; do
    printf '%s %s t/s: ' "$1" $kv
    $bin/llama-bench -m $W/synth.gguf -ngl 99 -fa 1 -p 0 -n 128 -d 0 -r 5 -ctk ${kv%/*} -ctv ${kv#*/} -o csv 2>/dev/null | tail -1 | awk -F, '{print $(NF-1)}'
  done; done
}
rebuild() { ( cd $W/build && /usr/bin/time -f "rebuild %e s" ninja llama-bench > $W/rb.log 2>&1; tail -1 $W/rb.log ); }
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
trace A tq3/tq3; trace A tq4/tq4; tps A
sed -i '1i #define TQ_STAMPS' $T/ggml-tq-cuda.cu; rebuild
trace B tq3/tq3; trace B tq4/tq4; tps B
sed -i '1d' $T/ggml-tq-cuda.cu; sed -i '1i #define TQ_STAMPS' $T/tq-fattn-ktq3.cu $T/tq-fattn-ktq4.cu; rebuild
trace C tq3/tq3; trace C tq4/tq4; tps C
} 2>&1 | tee $OUT/variants.txt
cp $W/tl_*.txt $OUT/
