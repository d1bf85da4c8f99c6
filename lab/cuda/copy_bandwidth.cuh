// The device's copy rate, the yardstick of the standalone harnesses' read rates: a device-to-device copy of 1 GiB,
// read + write bytes per second (GB/s), after one warm-up copy.
#pragma once

#include <cuda_runtime.h>

#include "../../tests/cuda/cuda_check.cuh"

static double copy_bandwidth() {
    const size_t n = (size_t) 1 << 30;
    char *a, *b;
    CK(cudaMalloc(&a, n));
    CK(cudaMalloc(&b, n));
    CK(cudaMemset(a, 1, n));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e0));
    for (int i = 0; i < 10; ++i) {
        CK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
    }
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaFree(a));
    CK(cudaFree(b));
    return 2.0 * n * 10 / (ms * 1e-3) / 1e9;
}
