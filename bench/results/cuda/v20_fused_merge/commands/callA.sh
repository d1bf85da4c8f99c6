#!/usr/bin/env bash
# v20 call A: build; FLASH_ATTN_EXT correctness with the fused merge (default) and with LLAMA_TQ_CUDA_FUSED_MERGE=0
export RES=/root/res; mkdir -p $RES
BUILD_TARGETS="test-backend-ops llama-bench" bash scripts/gpu/run_cuda.sh build || { tail -30 $RES/build.log; cp $RES/build.log $OUT/; exit 1; }
OPS=FLASH_ATTN_EXT bash scripts/gpu/run_cuda.sh ops; cp $RES/ops_FLASH_ATTN_EXT.log $OUT/ops_FLASH_ATTN_EXT_fused.log
LLAMA_TQ_CUDA_FUSED_MERGE=0 OPS=FLASH_ATTN_EXT bash scripts/gpu/run_cuda.sh ops; cp $RES/ops_FLASH_ATTN_EXT.log $OUT/ops_FLASH_ATTN_EXT_separate.log
grep -E "tests passed" $OUT/ops_FLASH_ATTN_EXT_*.log
