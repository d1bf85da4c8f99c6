#!/usr/bin/env bash
# v22 call 1: a -DTQ_STAMPS build of llama-bench (tq-stamps.cuh: global-timer stamps inside the fused K/V write and
# the tensor-core FA kernel, in the real decode graphs); tq3/tq3, tq4/tq4, tq3/tq4, tq4/tq3 at d0, the write and FA
# lined up per layer (bench/cuda/stamps_stats.py); tq4/tq4 also without PDL; untraced t/s of the same build
export RES=/root/res; mkdir -p $RES
CMAKE_EXTRA="-DCMAKE_CUDA_FLAGS=-DTQ_STAMPS" BUILD_TARGETS="llama-bench" bash scripts/gpu/run_cuda.sh build ||
  { tail -30 $RES/build.log; cp $RES/build.log $OUT/; exit 1; }
W=/root/lt; bin=$W/build/bin
PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$W/synth.gguf" > /dev/null
run() { # name ctk ctv [env...]
  local n=$1 k=$2 v=$3; shift 3
  rm -f $W/st_$n.*
  env "$@" TQ_STAMPS_OUT=$W/st_$n $bin/llama-bench -m $W/synth.gguf -ngl 99 -fa 1 -p 0 -n 128 -d 0 -r 3 -ctk $k -ctv $v \
    -o csv 2>$W/st_$n.err | tail -1 | awk -F, -v n=$n '{print n " t/s: " $(NF-1)}'
  grep -h TQ_STAMPS $W/st_$n.err
  ls $W/st_$n.* | grep -v err
  local wf fa
  wf=$(ls $W/st_$n.ggml-tq-cuda.cu.* | head -1); fa=$(ls $W/st_$n.tq-fattn-k*.cu.* | head -1)
  python3 bench/cuda/stamps_stats.py "$wf" "$fa" --last 300
}
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
run tq3 tq3 tq3
run tq4 tq4 tq4
run tq3tq4 tq3 tq4
run tq4tq3 tq4 tq3
run tq4_nopdl tq4 tq4 LLAMA_TQ_CUDA_PDL=0
run tq3_nopdl tq3 tq3 LLAMA_TQ_CUDA_PDL=0
run tq4_again tq4 tq4
run tq3_again tq3 tq3
} 2>&1 | tee $OUT/stamps.txt
