/* llama-tq: the only environment variables the shipped libraries read, all of them switches that turn a
 * mechanism off for debugging or comparison (upstream's *_DISABLE convention). Options are parameters:
 * llama_tq_params and llama_triatt_params (include/llama-tq.h), filled by the common argument parser.
 *
 *   LLAMA_TQ_CUDA_PDL_DISABLE=1           CUDA: launch the TQ K/V write and decode kernels without programmatic
 *                                         dependent launch (upstream's own switch for its kernels is GGML_CUDA_PDL=0)
 *   LLAMA_TQ_CUDA_FUSED_MERGE_DISABLE=1   CUDA: merge the tensor-core decode's splits in a separate kernel instead
 *                                         of in the kernel's last chunk
 *   LLAMA_TQ_KEY_BIAS_DISABLE=1           TQ keys keep a model's K bias (Qwen2) in the stored keys instead of adding
 *                                         it back exactly in attention (llama-tq-keys.h): for comparison
 *   LLAMA_TQ_TRIATT_LATE_DISABLE=1        TriAttention decides a round after a ubatch longer than the window at once
 *                                         (reading that ubatch's keys, waiting for the device) instead of after the
 *                                         next ubatch (llama-triatt.h): for comparison
 *   LLAMA_TQ_TRIATT_DEVICE_GATHER_DISABLE=1  TriAttention copies a device cache's keys to the host as ranges of rows
 *                                         instead of gathering the cells' rows on the device first: for comparison
 *   LLAMA_TQ_TRIATT_ASYNC_CAPTURE_DISABLE=1  TriAttention sums a device's calibration queries in the scheduler's
 *                                         callback (the device waits) instead of on threads behind it: for comparison
 *
 * A test (tests/test_repo_layout.py) keeps every environment read of csrc/ in this file. */
#ifndef TQ_ENV_H
#define TQ_ENV_H

#include <stdlib.h>
#include <string.h>

#define TQ_ENV_CUDA_PDL_DISABLE "LLAMA_TQ_CUDA_PDL_DISABLE"
#define TQ_ENV_CUDA_FUSED_MERGE_DISABLE "LLAMA_TQ_CUDA_FUSED_MERGE_DISABLE"
#define TQ_ENV_KEY_BIAS_DISABLE "LLAMA_TQ_KEY_BIAS_DISABLE"
#define TQ_ENV_TRIATT_LATE_DISABLE "LLAMA_TQ_TRIATT_LATE_DISABLE"
#define TQ_ENV_TRIATT_DEVICE_GATHER_DISABLE "LLAMA_TQ_TRIATT_DEVICE_GATHER_DISABLE"
#define TQ_ENV_TRIATT_ASYNC_CAPTURE_DISABLE "LLAMA_TQ_TRIATT_ASYNC_CAPTURE_DISABLE"

/* 1 when the *_DISABLE switch is set to anything but "" or "0". */
static inline int tq_env_flag(const char * name_DISABLE) {
    const char * v = getenv(name_DISABLE);
    return v != NULL && v[0] != '\0' && strcmp(v, "0") != 0;
}

#endif /* TQ_ENV_H */
