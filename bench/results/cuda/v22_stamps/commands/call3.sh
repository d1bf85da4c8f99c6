#!/usr/bin/env bash
# v22 call 3: call 2 found that the stamps in the fused write's unit alone remove the tq4 FA tail. Which part of
# them? As shipped (A); then the write's unit rebuilt with parts of its stamps (sed on the build's source):
# E entry and wait stamps only (no exit block), L the exit block only (__syncthreads + atomics + fence), S a bare
# __syncthreads at the write's end, F that plus thread 0's __threadfence; C the FA units stamped (dumped: the FA
# kernel's phases in the shipped chain). Each tq3/tq3 and tq4/tq4 at d0 under the CUPTI tracer.
export RES=/root/res; mkdir -p $RES
BUILD_TARGETS="llama-bench" bash scripts/gpu/run_cuda.sh build || { tail -30 $RES/build.log; cp $RES/build.log $OUT/; exit 1; }
W=/root/lt; bin=$W/build/bin; T=$W/src/ggml/src/ggml-cuda/tq
PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$W/synth.gguf" > /dev/null
CUDA_INC=$(dirname "$(find / -name cupti.h -path '*include*' 2>/dev/null | head -1)")
CUPTI_LIB=$(dirname "$(find / -name 'libcupti.so*' 2>/dev/null | grep -v stub | head -1)")
gcc -O2 -shared -fPIC -I"$CUDA_INC" -o $W/kernel_trace.so bench/cuda/kernel_trace.c -L"$CUPTI_LIB" -lcupti || exit 1
trace() { # variant ctk/ctv
  local n=$1_$2; n=${n/\//_}
  TQ_STAMPS_OUT=$W/st_$n TRACE_OUT=$W/tr_$n.txt LD_PRELOAD=$W/kernel_trace.so LD_LIBRARY_PATH=$CUPTI_LIB:${LD_LIBRARY_PATH:-} \
    $bin/llama-bench -m $W/synth.gguf -ngl 99 -fa 1 -p 0 -n 128 -d 0 -r 3 -ctk ${2%/*} -ctv ${2#*/} -o csv 2>/dev/null > /dev/null
  python3 bench/cuda/kernel_trace_stats.py $W/tr_$n.txt --last 300 --timeline > $W/tl_$n.txt 2>&1
  echo "$1 $2: $(head -1 $W/tl_$n.txt | sed 's/.*: //')"
  awk '/k_tq_quantize_rows2/ && NF==4 {ws=$2; wd=$3} /tq_fa_mma_kernel/ && NF==4 {printf " %.2f", $2+$3-ws-wd}' $W/tl_$n.txt
  echo " (FA end after write end, by layer)"
}
rebuild() { ( cd $W/build && /usr/bin/time -f "rebuild %e s" ninja llama-bench > $W/rb.log 2>&1; tail -1 $W/rb.log ); }
cp $T/ggml-tq-cuda.cu $W/write.orig
variant() { # name, then sed expressions for the write's unit
  local n=$1; shift
  cp $W/write.orig $T/ggml-tq-cuda.cu; sed -i "$@" $T/ggml-tq-cuda.cu; rebuild
  trace $n tq3/tq3; trace $n tq4/tq4
}
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
trace A tq3/tq3; trace A tq4/tq4
variant E -e '1i #define TQ_STAMPS' -e '/^    TQ_STAMP_LEAVE();/d'
variant L -e '1i #define TQ_STAMPS' -e '/^    TQ_STAMP_MIN(0);/d' -e '/^    TQ_STAMP_MIN(1);/d' -e '/^    TQ_STAMP_MAX(2);/d'
variant S -e 's/^    TQ_STAMP_LEAVE();/    __syncthreads();/'
variant F -e 's/^    TQ_STAMP_LEAVE();/    __syncthreads(); if (threadIdx.x == 0) { __threadfence(); }/'
cp $W/write.orig $T/ggml-tq-cuda.cu; sed -i '1i #define TQ_STAMPS' $T/tq-fattn-ktq3.cu $T/tq-fattn-ktq4.cu; rebuild
trace C tq3/tq3; trace C tq4/tq4
for kv in tq3 tq4; do python3 bench/cuda/stamps_stats.py - "$(ls $W/st_C_${kv}_$kv.tq-fattn-k*.cu.* | head -1)"; done
} 2>&1 | tee $OUT/variants.txt
cp $W/tl_*.txt $OUT/
