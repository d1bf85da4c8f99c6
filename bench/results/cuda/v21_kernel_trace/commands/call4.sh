#!/usr/bin/env bash
# v21 call 4: tq4's FA tail, continued. Knobs of this build: LLAMA_TQ_X_WRITE_SMEM=N (the fused write takes N bytes
# of dynamic shared memory: no FA block fits beside a write block), LLAMA_TQ_X_WRITE_SPIN=C (every write block spins
# C clock cycles at its end: a longer write); SASS size of each FA / write instantiation
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
lib=$(ls $W/build/bin/libggml-cuda.so* 2>/dev/null | head -1); [ -n "$lib" ] || lib=$(find $W/build -name 'libggml-cuda.so*' | head -1)
echo "# SASS instructions per kernel ($lib)"
cuobjdump -sass "$lib" 2>/dev/null | awk '/Function : /{name=$3} /^ +\/\*[0-9a-f]{4}\*\/ /{n[name]++} END{for (k in n) print n[k], k}' | grep -E "tq_fa_mma_kernelILi128|k_tq_quantize_rows2ILi[34]ELi[34]ELi128" | sort -k2
for cfg in base:X=0 smem:LLAMA_TQ_X_WRITE_SMEM=100000 spin:LLAMA_TQ_X_WRITE_SPIN=1000; do
  for t in tq3 tq4; do trace ${cfg%%:*}_$t $t $t ${cfg#*:}; done
done
} 2>&1 | tee $OUT/knobs2.txt
