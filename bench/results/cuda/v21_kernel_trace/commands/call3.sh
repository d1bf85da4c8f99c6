#!/usr/bin/env bash
# v21 call 3: where tq4's +30 us a decode step at d0 comes from (PDL chain write -> FA): env knobs of this build
# (LLAMA_TQ_X_*: FA_PDL=0 plain FA launch; Q_EARLY=0; LUT_LATE=1 pair tables after the wait; LUT_SMEM=1 tables
# from a shared copy of the codebook; WRITE_TRIGGER_LATE=1 the write triggers at its exit), tq3 and tq4 at d0
export RES=/root/res; mkdir -p $RES
W=/root/lt; bin=$W/build/bin
BUILD_TARGETS="llama-bench" bash scripts/gpu/run_cuda.sh build || { tail -30 $RES/build.log; exit 1; }
PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$W/synth.gguf" > /dev/null
CUPTI_LIB=/usr/local/cuda-13.0/targets/x86_64-linux/lib
gcc -O2 -shared -fPIC -I/usr/local/cuda-13.0/targets/x86_64-linux/include -o $W/kernel_trace.so bench/cuda/kernel_trace.c -L$CUPTI_LIB -lcupti || exit 1
trace() { # name ctk ctv env...
  local n=$1 k=$2 v=$3; shift 3
  env "$@" TRACE_OUT=$W/trace_$n.txt LD_PRELOAD=$W/kernel_trace.so LD_LIBRARY_PATH=$CUPTI_LIB:${LD_LIBRARY_PATH:-} \
    $bin/llama-bench -m $W/synth.gguf -ngl 99 -fa 1 -p 0 -n 128 -d 0 -r 3 -ctk $k -ctv $v -o csv 2>$W/trace_$n.err | tail -1 | awk -F, -v n=$n '{print n " t/s (traced): " $(NF-1)}'
  python3 bench/cuda/kernel_trace_stats.py $W/trace_$n.txt --last 300 --timeline > $W/tl_$n.txt
  sed -n '1p' $W/tl_$n.txt; grep -E "tq_fa_mma_kernel|k_tq_quantize_rows2" $W/tl_$n.txt | head -2
  awk '/k_tq_quantize_rows2/{ws=$2; wd=$3} /tq_fa_mma_kernel/{s=s sprintf(" %.2f", $2+$3-ws-wd)} END{print "  FA end - write end by layer:" s}' $W/tl_$n.txt
}
{
for cfg in base:X=0 fapdl0:LLAMA_TQ_X_FA_PDL=0 qearly0:LLAMA_TQ_X_Q_EARLY=0 lutlate:LLAMA_TQ_X_LUT_LATE=1 lutsmem:LLAMA_TQ_X_LUT_SMEM=1 triglate:LLAMA_TQ_X_WRITE_TRIGGER_LATE=1; do
  for t in tq3 tq4; do trace ${cfg%%:*}_$t $t $t ${cfg#*:}; done
done
} 2>&1 | tee $OUT/knobs.txt
