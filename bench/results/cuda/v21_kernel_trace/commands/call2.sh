#!/usr/bin/env bash
# v21 call 2 (fresh machine): is it the FA kernel's shared memory (a tq4 side puts a block over 32 KB)? Build as
# shipped (tq4 pair table 16 copies at head 128), trace; then 8 copies (tq4/tq4 33.4 -> 25.2 KB, tq3/tq4 40.4 ->
# 32.2 KB), incremental rebuild of the FA units, trace again; one llama-bench round of each at d0 and d32768
export RES=/root/res; mkdir -p $RES
W=/root/lt; bin=$W/build/bin
BUILD_TARGETS="llama-bench" bash scripts/gpu/run_cuda.sh build || { tail -30 $RES/build.log; exit 1; }
PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$W/synth.gguf" > /dev/null
CUPTI_LIB=/usr/local/cuda-13.0/targets/x86_64-linux/lib
gcc -O2 -shared -fPIC -I/usr/local/cuda-13.0/targets/x86_64-linux/include -o $W/kernel_trace.so bench/cuda/kernel_trace.c -L$CUPTI_LIB -lcupti || exit 1
trace() { # name depth ctk ctv
  local n=$1 d=$2 k=$3 v=$4
  TRACE_OUT=$W/trace_$n.txt LD_PRELOAD=$W/kernel_trace.so LD_LIBRARY_PATH=$CUPTI_LIB:${LD_LIBRARY_PATH:-} \
    $bin/llama-bench -m $W/synth.gguf -ngl 99 -fa 1 -p 0 -n 128 -d $d -r 3 -ctk $k -ctv $v -o csv 2>$W/trace_$n.err | tail -1 | awk -F, -v n=$n '{print n " t/s (traced): " $(NF-1)}'
  python3 bench/cuda/kernel_trace_stats.py $W/trace_$n.txt --last 300 | sed -n '1p;3,6p'
}
bench() { for t in f16 tq3 tq4; do echo "$1 $t"; $bin/llama-bench -m $W/synth.gguf -ngl 99 -fa 1 -p 0 -n 128 -d 0,32768 -r 5 -ctk $t -ctv $t -o md 2>/dev/null | grep tg128; done; }
{
for v in rep16 rep8; do
  if [ $v = rep8 ]; then
    f=$(find $W/src -name tq-fattn-mma.cuh)
    sed -i 's/static constexpr int REP     = T == TQFA_TQ3 ? 32 : D == 128 ? 16 : 8;/static constexpr int REP     = T == TQFA_TQ3 ? 32 : 8;/' $f
    grep -n "constexpr int REP" $f
    ( cd $W/build && /usr/bin/time -f "rebuild %e s" ninja llama-bench 2>&1 | tail -1 )
  fi
  trace ${v}_tq3_d0 0 tq3 tq3
  trace ${v}_tq4_d0 0 tq4 tq4
  trace ${v}_tq3tq4_d0 0 tq3 tq4
  bench $v
done
} 2>&1 | tee $OUT/rep8.txt
