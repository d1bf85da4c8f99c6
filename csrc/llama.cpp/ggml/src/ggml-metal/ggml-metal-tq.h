// llama-tq: the Metal backend's TQ3/TQ4 hooks (kernels in kernels/tq.metal).
#pragma once

#include "ggml.h"
#include "ggml-metal-device.h"

#ifdef __cplusplus
extern "C" {
#endif

// Whether the op touches a TQ type (tq3, tq4, tq3_64, tq4_64) in its result or sources.
bool ggml_metal_tq_involved(const struct ggml_tensor * op);

// For an op that ggml_metal_tq_involved(): whether kernels/tq.metal runs it. What it refuses (MUL_MAT with a TQ
// weight, i.e. -fa off; TQ -> TQ copies; a K/V pair or head size without a kernel) runs on the CPU through the
// scheduler.
bool ggml_metal_tq_supports_op(const struct ggml_tensor * op);

// FLASH_ATTN_EXT with a TQ K or V: encodes kernel_tq_flash_attn_ext_<K>_<V>_d<D> and returns 1; 0 when neither
// side is TQ (upstream's kernels run it).
int ggml_metal_tq_flash_attn_ext(ggml_metal_library_t lib, ggml_metal_encoder_t enc, const struct ggml_tensor * op);

#ifdef __cplusplus
}
#endif
