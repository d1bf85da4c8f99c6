#!/usr/bin/env bash
# v22 call 6 (call6.sh is call5.sh with these lines changed): stop early on a machine without the tail; else
# A, N, G, E2 as in call 5 and C (the FA units stamped, the phases dumped).
# v22 call 5: call 4 (a machine with the tq4 FA tail) found that the write's entry and wait stamps (E) remove the
# tail (tq4/tq4 547.3 -> 532.9 us a step) as does its exit block (L, but it lengthens the write). Which part of E,
# and does something cheaper do it? As shipped (A), then the write's unit rebuilt with: E1 the entry atomic only,
# E2 the two atomics between the PDL wait and the trigger only, N a 500 ns sleep there instead, G thread 0's
# __threadfence there instead. Each tq3/tq3 and tq4/tq4 at d0 under the CUPTI tracer.
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
  awk '/k_tq_quantize_rows2/ && NF==4 {ws=$2; wd=$3} /tq_fa_mma_kernel/ && NF==4 {printf " %.2f/%.2f/%.2f", wd, $2-ws, $2+$3-ws-wd}' $W/tl_$n.txt
  echo " (write us / FA start after write start / FA end after write end, by layer)"
}
rebuild() { ( cd $W/build && /usr/bin/time -f "rebuild %e s" ninja llama-bench > $W/rb.log 2>&1; tail -1 $W/rb.log ); }
cp $T/ggml-tq-cuda.cu $W/write.orig
variant() { # name, then sed expressions for the write's unit
  local n=$1; shift
  cp $W/write.orig $T/ggml-tq-cuda.cu; sed -i "$@" $T/ggml-tq-cuda.cu; rebuild
  trace $n tq3/tq3; trace $n tq4/tq4
}
{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
trace A tq3/tq3; trace A tq4/tq4
d=$(awk -v a="$(tail_of $W/tl_A_tq3_tq3.txt)" -v b="$(tail_of $W/tl_A_tq4_tq4.txt)" 'BEGIN {print b - a}')
echo "tq4 tail - tq3 tail on this machine: $d us"
awk -v d="$d" 'BEGIN {exit !(d < 1.0)}' && { echo "no tail here: stop"; exit 0; }
variant N -e 's/^    TQ_STAMP_MAX(2);/    __nanosleep(500);/'
variant G -e 's/^    TQ_STAMP_MAX(2);/    if (threadIdx.x == 0) { __threadfence(); }/'
variant E2 -e '1i #define TQ_STAMPS' -e '/^    TQ_STAMP_LEAVE();/d' -e '/^    TQ_STAMP_MIN(0);/d'
cp $W/write.orig $T/ggml-tq-cuda.cu; sed -i '1i #define TQ_STAMPS' $T/tq-fattn-ktq3.cu $T/tq-fattn-ktq4.cu; rebuild
for kv in tq3 tq4; do
  TQ_STAMPS_OUT=$W/st_C_$kv $bin/llama-bench -m $W/synth.gguf -ngl 99 -fa 1 -p 0 -n 128 -d 0 -r 3 -ctk $kv -ctv $kv -o csv 2>/dev/null | tail -1 | awk -F, -v n=$kv '{print "C " n " t/s: " $(NF-1)}'
  python3 bench/cuda/stamps_stats.py - "$(ls $W/st_C_$kv.tq-fattn-k*.cu.* | head -1)"
done
} 2>&1 | tee $OUT/variants.txt
