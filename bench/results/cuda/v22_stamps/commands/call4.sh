#!/usr/bin/env bash
# v22 call 4: the tq4 FA tail comes and goes between machines (call 2's had it, call 3's did not). As shipped (A),
# tq3/tq3 and tq4/tq4 traced; then the write's bytes as whole words from one warp (this checkout's tq-cuda-codec.cuh
# copied over the build's shipped one, W), exactness of the new stores (stage exact, 2^20 blocks per type), traced again; where W leaves the tail,
# the write's entry stamps (E) or exit block (L) on top of W.
# (The word-store version of tq-cuda-codec.cuh was in the working tree for this call only: it did not help and was not
# committed; README.md describes it.)
export RES=/root/res; mkdir -p $RES
BUILD_TARGETS="llama-bench" bash scripts/gpu/run_cuda.sh build || { tail -30 $RES/build.log; cp $RES/build.log $OUT/; exit 1; }
W=/root/lt; bin=$W/build/bin; T=$W/src/ggml/src/ggml-cuda/tq
PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$W/synth.gguf" > /dev/null
CUDA_INC=$(dirname "$(find / -name cupti.h -path '*include*' 2>/dev/null | head -1)")
CUPTI_LIB=$(dirname "$(find / -name 'libcupti.so*' 2>/dev/null | grep -v stub | head -1)")
gcc -O2 -shared -fPIC -I"$CUDA_INC" -o $W/kernel_trace.so bench/cuda/kernel_trace.c -L"$CUPTI_LIB" -lcupti || exit 1
tail_of() { awk '/k_tq_quantize_rows2/ && NF==4 {ws=$2; wd=$3} /tq_fa_mma_kernel/ && NF==4 {s+=$2+$3-ws-wd; n++} END {printf "%.2f", s/n}' "$1"; }
trace() { # variant ctk/ctv
  local n=$1_$2; n=${n/\//_}
  TRACE_OUT=$W/tr_$n.txt LD_PRELOAD=$W/kernel_trace.so LD_LIBRARY_PATH=$CUPTI_LIB:${LD_LIBRARY_PATH:-} \
    $bin/llama-bench -m $W/synth.gguf -ngl 99 -fa 1 -p 0 -n 128 -d 0 -r 3 -ctk ${2%/*} -ctv ${2#*/} -o csv 2>/dev/null > /dev/null
  python3 bench/cuda/kernel_trace_stats.py $W/tr_$n.txt --last 300 --timeline > $W/tl_$n.txt 2>&1
  echo "$1 $2: $(head -1 $W/tl_$n.txt | sed 's/.*: //')"
  awk '/k_tq_quantize_rows2/ && NF==4 {ws=$2; wd=$3} /tq_fa_mma_kernel/ && NF==4 {printf " %.2f/%.2f", wd, $2+$3-ws-wd}' $W/tl_$n.txt
  echo " (write us / FA end after write end, by layer)"
}
rebuild() { ( cd $W/build && /usr/bin/time -f "rebuild %e s" ninja llama-bench > $W/rb.log 2>&1; tail -1 $W/rb.log ); }
{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.limit,ecc.mode.current --format=csv,noheader
trace A tq3/tq3; trace A tq4/tq4
bad=$(awk -v a="$(tail_of $W/tl_A_tq3_tq3.txt)" -v b="$(tail_of $W/tl_A_tq4_tq4.txt)" 'BEGIN {print (b - a > 1.0) ? 1 : 0}')
echo "tq4 tail present on this machine: $bad"
cp csrc/llama.cpp/ggml/src/ggml-cuda/tq/tq-cuda-codec.cuh $T/ # this checkout's: the word stores
RES=$RES bash scripts/gpu/run_cuda.sh exact | tail -3
rebuild
trace W tq3/tq3; trace W tq4/tq4; trace A2_W tq4/tq4
if [ "$bad" = 1 ]; then
  cp $T/ggml-tq-cuda.cu $W/write.w
  sed -i -e '1i #define TQ_STAMPS' -e '/^    TQ_STAMP_LEAVE();/d' $T/ggml-tq-cuda.cu; rebuild; trace WE tq3/tq3; trace WE tq4/tq4
  cp $W/write.w $T/ggml-tq-cuda.cu
  sed -i -e '1i #define TQ_STAMPS' -e '/^    TQ_STAMP_MIN(0);/d' -e '/^    TQ_STAMP_MIN(1);/d' -e '/^    TQ_STAMP_MAX(2);/d' $T/ggml-tq-cuda.cu
  rebuild; trace WL tq3/tq3; trace WL tq4/tq4
fi
} 2>&1 | tee $OUT/variants.txt
