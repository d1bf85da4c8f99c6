// Speed of the prefill converter (tq-cuda-convert.cuh): one layer's K cache of a llama-bench pp512 @ d32768 step on
// the synthetic head-128 model (33280 cells x 8 KV heads x 128 values) dequantized to f16, against a device-to-device
// copy of the f16 bytes (the bandwidth reference). Exactness is tests/cuda/tq_quant_exact.cu's job.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -use_fast_math -Icsrc/codec -Icsrc/llama.cpp/ggml/src/ggml-cuda/tq \
//        lab/cuda/tq_convert_bench.cu tq_codec.o -o tq_convert_bench && ./tq_convert_bench
#include <cstdio>
#include <random>
#include <vector>

#include "tq-cuda-convert.cuh"

#include "../../tests/cuda/cuda_check.cuh"

template <typename F> static float time_us(F f, int reps) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    f();
    CK(cudaEventRecord(a));
    for (int i = 0; i < reps; ++i) {
        f();
    }
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    return 1000.0f * ms / reps;
}

int main() {
    const int64_t cells = 33280, heads = 8, n = cells * heads; // blocks
    tq_cu_tables tab;
    tq_cu_tables_init(&tab);
    std::mt19937 rng(7);
    std::normal_distribution<float> gauss;
    std::vector<float> x(128);
    half * dy;
    CK(cudaMalloc(&dy, n * 128 * sizeof(half)));
    half * dy2;
    CK(cudaMalloc(&dy2, n * 128 * sizeof(half)));
    CK(cudaMemset(dy2, 0, n * 128 * sizeof(half)));
    const float copy = time_us([&] { CK(cudaMemcpyAsync(dy, dy2, n * 128 * sizeof(half), cudaMemcpyDeviceToDevice)); }, 50);
    printf("f16 copy of %lld values: %.1f us (%.0f GB/s read + write)\n", (long long) n * 128, copy,
           2.0 * n * 128 * 2 / copy * 1e-3);
    for (int bits = 3; bits <= 4; ++bits) {
        const int bb = (int) tq_block_bytes(bits);
        std::vector<uint8_t> blocks(64 * bb), all((size_t) n * bb);
        for (int b = 0; b < 64; ++b) { // 64 distinct blocks tiled over the cache (the bytes, not their values, set the speed)
            for (float & v : x) {
                v = gauss(rng);
            }
            tq_quantize_block(bits, x.data(), blocks.data() + b * bb);
        }
        for (int64_t b = 0; b < n; ++b) {
            memcpy(all.data() + b * bb, blocks.data() + (b % 64) * bb, bb);
        }
        char * dq;
        CK(cudaMalloc(&dq, all.size()));
        CK(cudaMemcpy(dq, all.data(), all.size(), cudaMemcpyHostToDevice));
        // as fattn-common.cuh converts a K view [128, 8, cells]: contiguous, one block per row
        const tq_conv_shape sh = {1u, (uint32_t) n, bb, 0, 0, 128 * 2, 0, 0};
        const float us = time_us([&] { tq_convert128<half>(bits, dq, (char *) dy, sh, 1, 1, tab, 0); }, 50);
        CK(cudaGetLastError());
        printf("tq%d -> f16, %lld blocks: %.1f us (%.0f GB/s read + write, %.2fx the copy's time); a pp512 ubatch "
               "converts 16 such tensors: %.2f ms\n",
               bits, (long long) n, us, (double) (all.size() + n * 256) / us * 1e-3, us / copy, 16 * us * 1e-3);
        CK(cudaFree(dq));
    }
    return 0;
}
