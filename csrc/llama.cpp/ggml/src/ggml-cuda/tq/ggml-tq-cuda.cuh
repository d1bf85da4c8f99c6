// llama-tq: TQ3/TQ4 in ggml's CUDA backend. The patch series calls these from ggml-cuda.cu, convert.cu and
// fattn.cu; everything else about the types lives in csrc/llama.cpp/ggml/src/ggml-cuda/tq/.
#pragma once

#include "common.cuh"
#include "convert.cuh"
#include "ggml-tq.h" // ggml_tq_is_tq: the TQ types, from tq_formats.h
#include "tq_env.h"

#include <cstdlib>
#include <utility>

// Launches a kernel of a decode step (the fused K/V write, the tensor-core FA kernel) as upstream launches its own:
// with programmatic dependent launch on sm_90+ (ggml_cuda_kernel_launch; off with GGML_CUDA_PDL=0), so the step's
// chain of small kernels does not stall at ours. The kernels wait (tq_pdl_wait) before they touch graph memory and
// let the next kernel launch (tq_pdl_trigger) once little of their work is left. LLAMA_TQ_CUDA_PDL_DISABLE=1: plain
// launches (tq_env.h).
template <typename Kernel, typename... Args>
static void tq_launch(Kernel kernel, dim3 grid, dim3 block, cudaStream_t stream, Args &&... args) {
    static const bool pdl = !tq_env_flag(TQ_ENV_CUDA_PDL_DISABLE);
    if (pdl) {
        ggml_cuda_kernel_launch(kernel, ggml_cuda_kernel_launch_params(grid, block, (size_t) 0, stream),
                                std::forward<Args>(args)...);
        return;
    }
    kernel<<<grid, block, 0, stream>>>(std::forward<Args>(args)...);
    CUDA_CHECK(cudaGetLastError());
}

// supports_op for the ops the TQ types take part in. Returns -1 when no TQ type is involved (upstream decides),
// otherwise 0 or 1.
int ggml_cuda_tq_supports_op(const ggml_tensor * op);

// SET_ROWS, GET_ROWS and CPY with a TQ operand. Returns false (and does nothing) for any other op.
bool ggml_cuda_tq_compute_forward(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

// Graph fusion (called from ggml_cuda_try_fuse): node i a f32 -> TQ SET_ROWS and the next node that is not a view
// another one (a layer's K and V writes) run in one launch; K's ROPE (norm / neox) and the key transforms' SUB (and
// MUL) in front of a K write are folded into that launch. Returns the nodes consumed after node i (0: no fusion).
int ggml_cuda_tq_try_fuse(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i);

// MUL_MAT with a TQ src0 (the -fa off K*Q): src0 is dequantized to f16 and handed to upstream's mul_mat.
typedef void (*ggml_cuda_mul_mat_fn)(ggml_backend_cuda_context & ctx, const ggml_tensor * src0,
                                     const ggml_tensor * src1, ggml_tensor * dst);
bool ggml_cuda_tq_mul_mat(ggml_backend_cuda_context & ctx, ggml_tensor * dst, ggml_cuda_mul_mat_fn mul_mat);

// Dequantizers for convert.cu's getters (nullptr for other types).
to_fp16_cuda_t    ggml_cuda_tq_get_to_fp16(ggml_type type);
to_fp32_cuda_t    ggml_cuda_tq_get_to_fp32(ggml_type type);
to_fp16_nc_cuda_t ggml_cuda_tq_get_to_fp16_nc(ggml_type type);
to_fp32_nc_cuda_t ggml_cuda_tq_get_to_fp32_nc(ggml_type type);

// FLASH_ATTN_EXT decode with TQ K and/or V read from the cache (tq-fattn.cuh). handles() says whether the op
// is taken (then it needs no f16 copies of K/V); run() returns false when it is not.
bool ggml_cuda_tq_fattn_handles(const ggml_tensor * dst);
bool ggml_cuda_tq_flash_attn_ext(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
// n zeroed counters for the tensor-core decode's fused merge on ctx's current stream (tq_fa_params::done), or nullptr
// (the merge kernel runs): more than a buffer holds, the stream first seen during a graph capture, or
// LLAMA_TQ_CUDA_FUSED_MERGE_DISABLE=1 (tq_env.h).
unsigned * ggml_cuda_tq_fa_counters(ggml_backend_cuda_context & ctx, size_t n);
