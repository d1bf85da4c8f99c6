#!/usr/bin/env bash
# v20 call F: the fused merge in real graphs: llama-perplexity on the head-128 synthetic model, decode ubatches of 1 and
# 8 tokens (-c 512: 4 chunks a launch, so the fused merge runs) on the GPU vs the CPU; and the GPU with the merge kernel
export RES=/root/res; mkdir -p $RES
BUILD_TARGETS="llama-perplexity" bash scripts/gpu/run_cuda.sh build || { tail -30 $RES/build.log; exit 1; }
GP_UB="1 8" bash scripts/gpu/run_cuda.sh graphppl 2>&1 | grep graphppl | tee $OUT/graphppl_fused.txt
W=/root/lt; bin=$W/build/bin
for kv in tq3/tq3 tq4/tq3; do for ub in 1 8; do
  LLAMA_TQ_CUDA_FUSED_MERGE=0 $bin/llama-perplexity -m $W/synth_ev.gguf -f $W/ev_text.txt -c 512 -b 512 -ub $ub --chunks 3 -fa on \
    -ctk ${kv%/*} -ctv ${kv#*/} -ngl 99 -t 16 2>&1 | grep -o 'Final estimate: PPL = [0-9.]*' | sed "s|^|graphppl $kv ub $ub gpu, LLAMA_TQ_CUDA_FUSED_MERGE=0: |"
done; done | tee -a $OUT/graphppl_fused.txt
