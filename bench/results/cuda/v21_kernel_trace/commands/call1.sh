#!/usr/bin/env bash
# v21 call 1: build llama-bench + llama-perplexity; CUPTI kernel timeline of decode steps (bench/cuda/kernel_trace.c)
# for f16 / tq3 / tq4 / tq3-tq4 at d0 and f16 / tq3 at d8192; graph PPL of the fused merge (v20's call F)
export RES=/root/res; mkdir -p $RES
BUILD_TARGETS="llama-bench llama-perplexity" bash scripts/gpu/run_cuda.sh build || { tail -30 $RES/build.log; cp $RES/build.log $OUT/; exit 1; }
W=/root/lt; bin=$W/build/bin
PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$W/synth.gguf" > /dev/null
CUDA_INC=$(dirname "$(find / -name cupti.h -path '*include*' 2>/dev/null | head -1)")
CUPTI_LIB=$(dirname "$(find / -name 'libcupti.so*' 2>/dev/null | grep -v stub | head -1)")
echo "cupti.h in $CUDA_INC, libcupti in $CUPTI_LIB"
gcc -O2 -shared -fPIC -I"$CUDA_INC" -o $W/kernel_trace.so bench/cuda/kernel_trace.c -L"$CUPTI_LIB" -lcupti || exit 1
trace() { # name depth ctk ctv [env...]
  local n=$1 d=$2 k=$3 v=$4; shift 4
  env "$@" TRACE_OUT=$W/trace_$n.txt LD_PRELOAD=$W/kernel_trace.so LD_LIBRARY_PATH=$CUPTI_LIB:${LD_LIBRARY_PATH:-} \
    $bin/llama-bench -m $W/synth.gguf -ngl 99 -fa 1 -p 0 -n 128 -d $d -r 3 -ctk $k -ctv $v -o csv 2>$W/trace_$n.err | tail -1 | awk -F, -v n=$n '{print n " t/s (traced): " $(NF-1)}'
  tail -1 $W/trace_$n.err
}
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
trace f16_d0 0 f16 f16
trace tq3_d0 0 tq3 tq3
trace tq4_d0 0 tq4 tq4
trace tq3tq4_d0 0 tq3 tq4
trace tq4_d0_nopdl 0 tq4 tq4 LLAMA_TQ_CUDA_PDL=0
trace tq3_d0_nopdl 0 tq3 tq3 LLAMA_TQ_CUDA_PDL=0
trace f16_d8192 8192 f16 f16
trace tq3_d8192 8192 tq3 tq3
for n in f16_d0 tq3_d0 tq4_d0 tq3tq4_d0 tq4_d0_nopdl tq3_d0_nopdl f16_d8192 tq3_d8192; do
  python3 bench/cuda/kernel_trace_stats.py $W/trace_$n.txt --last 300
done
} 2>&1 | tee $OUT/trace_summary.txt
for n in f16_d0 tq3_d0 tq4_d0 tq3_d8192; do python3 bench/cuda/kernel_trace_stats.py $W/trace_$n.txt --last 300 --timeline > $OUT/timeline_$n.txt 2>&1; done
# graph PPL: fused merge vs CPU, and the merge kernel
GP_UB="1 8" RES=$RES bash scripts/gpu/run_cuda.sh graphppl 2>&1 | grep graphppl | tee $OUT/graphppl_fused.txt
for kv in tq3/tq3 tq4/tq3; do for ub in 1 8; do
  LLAMA_TQ_CUDA_FUSED_MERGE=0 $bin/llama-perplexity -m $W/synth_ev.gguf -f $W/ev_text.txt -c 512 -b 512 -ub $ub --chunks 3 -fa on \
    -ctk ${kv%/*} -ctv ${kv#*/} -ngl 99 -t 16 2>&1 | grep -o 'Final estimate: PPL = [0-9.]*' | sed "s|^|graphppl $kv ub $ub gpu, LLAMA_TQ_CUDA_FUSED_MERGE=0: |"
done; done | tee -a $OUT/graphppl_fused.txt
