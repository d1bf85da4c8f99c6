// GPU quantizer == C codec, byte for byte, on N random blocks per type (default 1,048,576; tq3, tq4, the
// 64-value tq3_64, tq4_64, the 96-value tq3_96, tq4_96 and the 256-value key type tq3a), plus the GPU dequantizer
// within float tolerance of the codec's (tq3a: also how many values differ in any bit). Built with -use_fast_math like ggml-cuda, so it also proves
// that the kernel's float operations survive those flags.
//
//   nvcc -O2 -arch=sm_90 -use_fast_math -Icsrc/codec -Icsrc/llama.cpp/ggml/src/ggml-cuda/tq tests/cuda/tq_quant_exact.cu tq_codec.o -o tq_quant_exact
//   ./tq_quant_exact [n_blocks]          prints one line per type and exits non-zero on any mismatch
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "tq-cuda-codec.cuh"
#include "tq-cuda-convert.cuh"
#include "tq-cuda-tq3a.cuh"

#include "cuda_check.cuh"

template <int BITS, int N>
__global__ void k_quant(const float * x, uint8_t * out, int64_t n, const __grid_constant__ tq_cu_tables tab) {
    __shared__ tq_cu_tables t;
    __shared__ tq_cu_qscratch sm;
    tq_cu_tables_load<N, tq_cu_table_words<N>()>(t, tab, threadIdx.x); // as the K/V writes load them
    __syncthreads();
    const int64_t b = blockIdx.x; // one CTA of N threads per block, as ggml-cuda's SET_ROWS
    if (b >= n) {
        return;
    }
    if constexpr (N == TQ_BLOCK) {
        tq_cu_quantize_block<BITS>(t, x[b * N + threadIdx.x], out + b * tq_cu_block_bytes_n(BITS, N), sm, threadIdx.x);
    } else if constexpr (N == TQ_BLOCK_96) {
        tq_cu_quantize_block96<BITS>(t, x[b * N + threadIdx.x], out + b * tq_cu_block_bytes_n(BITS, N), sm, threadIdx.x);
    } else {
        tq_cu_quantize_block64<BITS>(t, x[b * N + threadIdx.x], out + b * tq_cu_block_bytes_n(BITS, N), sm, threadIdx.x);
    }
}

template <int BITS, int N>
__global__ void k_dequant(const uint8_t * in, float * y, int64_t n, tq_cu_tables tab) {
    __shared__ tq_cu_tables t;
    if (threadIdx.x == 0) {
        t = tab;
    }
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t b = (int64_t) blockIdx.x * 4 + warp;
    if (b >= n) {
        return;
    }
    float v[N / 32];
    if constexpr (N == TQ_BLOCK) {
        tq_cu_dequantize_block<BITS>(t, in + b * tq_cu_block_bytes_n(BITS, N), v, lane);
    } else if constexpr (N == TQ_BLOCK_96) {
        tq_cu_dequantize_block96<BITS>(t, in + b * tq_cu_block_bytes_n(BITS, N), v, lane);
    } else {
        tq_cu_dequantize_block64<BITS>(t, in + b * tq_cu_block_bytes_n(BITS, N), v, lane);
    }
    for (int r = 0; r < N / 32; ++r) {
        y[b * N + lane + 32 * r] = v[r];
    }
}

// Random blocks of many kinds: Gaussian at scales 1e-38..1e30, Laplace, offsets, one-hot, ramps; the first
// blocks are the edge cases (zero, huge, subnormal, NaN, Inf, mixed magnitudes).
static void make_inputs(std::vector<float> & x, int64_t n, uint64_t seed, int N) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    std::uniform_real_distribution<float> uni(0.0f, 1.0f);
    x.assign((size_t) n * N, 0.0f);
    for (int64_t b = 0; b < n; ++b) {
        float * v = x.data() + b * N;
        const int kind = b < 16 ? (int) b : 16 + (int) (rng() % 8);
        const float scale = powf(10.0f, -38.0f + 68.0f * uni(rng));
        for (int i = 0; i < N; ++i) {
            switch (kind) {
                case 0: v[i] = 0.0f; break;
                case 1: v[i] = 3.0e38f * (i % 2 ? 1.0f : -1.0f); break;
                case 2: v[i] = 1.0e-41f * gauss(rng); break;
                case 3: v[i] = i == 5 ? NAN : gauss(rng); break;
                case 4: v[i] = i == 77 % N ? INFINITY : gauss(rng); break;
                case 5: v[i] = i < 4 ? 1.0e30f * gauss(rng) : 1.0e-30f * gauss(rng); break;
                case 6: v[i] = i == 17 ? 3.0f : 0.0f; break;
                case 7: v[i] = 1.0f; break;
                case 8: v[i] = -2.5e38f; break;
                case 9: v[i] = 1.0e-45f * (float) (i % 3); break;
                case 10: v[i] = i == 3 ? 3.4028235e38f : 0.0f; break;           // one value at FLT_MAX (the scale clamp)
                case 11: v[i] = i == 40 % N ? -3.4028235e38f : gauss(rng); break;
                case 16: case 17: case 18: v[i] = scale * gauss(rng); break;
                case 19: v[i] = scale * (uni(rng) < 0.5f ? -1.0f : 1.0f) * -logf(uni(rng) + 1e-30f); break;
                case 20: v[i] = 5.0f + 1e-3f * gauss(rng); break;
                case 21: v[i] = (i % 3 == 0 ? 2.0f : -0.5f) * scale; break;
                case 22: v[i] = gauss(rng) * (i < 4 ? 30.0f : 1.0f); break;
                default: v[i] = gauss(rng) * (float) (1 + (i % 7)); break;
            }
        }
    }
}

// The device copies of one type's check: the inputs (copied), room for the blocks and for the decoded values.
static void device_buffers(const std::vector<float> & x, size_t bytes, float *& dx, uint8_t *& dq, float *& dy) {
    CK(cudaMalloc(&dx, x.size() * sizeof(float)));
    CK(cudaMalloc(&dq, bytes));
    CK(cudaMalloc(&dy, x.size() * sizeof(float)));
    CK(cudaMemcpy(dx, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
}

template <int BITS, int N>
static int check(int64_t n, const tq_cu_tables & tab) {
    const int bb = tq_cu_block_bytes_n(BITS, N);
    std::vector<float> x;
    make_inputs(x, n, 0x54510000u + BITS + N, N);

    std::vector<uint8_t> cpu((size_t) n * bb), gpu((size_t) n * bb);
    const int nt = (int) std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::thread> th;
    for (int t = 0; t < nt; ++t) {
        th.emplace_back([&, t] {
            for (int64_t b = t; b < n; b += nt) {
                tq_quantize_block_n(BITS, N, x.data() + b * N, cpu.data() + b * bb);
            }
        });
    }
    for (auto & t : th) {
        t.join();
    }

    float * dx;
    uint8_t * dq;
    float * dy;
    device_buffers(x, gpu.size(), dx, dq, dy);
    k_quant<BITS, N><<<(unsigned) n, N>>>(dx, dq, n, tab);
    CK(cudaGetLastError());
    CK(cudaMemcpy(gpu.data(), dq, gpu.size(), cudaMemcpyDeviceToHost));
    // speed: a decode token's write (4 blocks: one per KV head, one launch) and the whole batch
    float us_small, us_all;
    {
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        const int reps = 200;
        CK(cudaEventRecord(a));
        for (int i = 0; i < reps; ++i) {
            k_quant<BITS, N><<<(unsigned) std::min<int64_t>(n, 4), N>>>(dx, dq, std::min<int64_t>(n, 4), tab);
        }
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&us_small, a, b));
        us_small *= 1000.0f / reps;
        CK(cudaEventRecord(a));
        k_quant<BITS, N><<<(unsigned) n, N>>>(dx, dq, n, tab);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&us_all, a, b));
        us_all *= 1000.0f;
    }

    int64_t bad = 0;
    for (int64_t b = 0; b < n; ++b) {
        if (memcmp(cpu.data() + b * bb, gpu.data() + b * bb, bb) != 0) {
            if (bad < 5) {
                fprintf(stderr, "tq%d/%d block %lld differs (first bytes cpu %02x%02x%02x%02x gpu %02x%02x%02x%02x)\n", BITS, N,
                        (long long) b, cpu[b * bb], cpu[b * bb + 1], cpu[b * bb + 2], cpu[b * bb + 3], gpu[b * bb],
                        gpu[b * bb + 1], gpu[b * bb + 2], gpu[b * bb + 3]);
            }
            ++bad;
        }
    }

    // dequantize the (identical) bytes on both sides
    k_dequant<BITS, N><<<(unsigned) ((n + 3) / 4), 128>>>(dq, dy, n, tab);
    CK(cudaGetLastError());
    std::vector<float> ygpu(x.size()), ycpu(x.size());
    CK(cudaMemcpy(ygpu.data(), dy, ygpu.size() * sizeof(float), cudaMemcpyDeviceToHost));
    double max_rel = 0.0;
    int64_t nan_mismatch = 0;
    for (int64_t b = 0; b < n; ++b) {
        tq_dequantize_block_n(BITS, N, cpu.data() + b * bb, ycpu.data() + b * N);
        double num = 0.0, den = 0.0;
        for (int i = 0; i < N; ++i) {
            const float c = ycpu[b * N + i], g = ygpu[b * N + i];
            if (std::isnan(c) != std::isnan(g)) {
                ++nan_mismatch;
                continue;
            }
            if (std::isnan(c)) {
                continue;
            }
            num += ((double) c - g) * ((double) c - g);
            den += (double) c * c;
        }
        if (den > 0.0) {
            max_rel = std::max(max_rel, std::sqrt(num / den));
        }
    }
    // the prefill converter (four lanes per block) against the one-warp dequantizer: bit for bit, f32 and f16
    int64_t conv_bad = 0;
    if constexpr (N == TQ_BLOCK) {
        const tq_conv_shape sh = {1u, (uint32_t) n, bb, 0, 0, (int64_t) N * 4, 0, 0};
        CK(cudaMemset(dy, 0xff, x.size() * sizeof(float)));
        tq_convert128<float>(BITS, (const char *) dq, (char *) dy, sh, 1, 1, tab, 0);
        CK(cudaGetLastError());
        std::vector<float> yc(x.size());
        CK(cudaMemcpy(yc.data(), dy, yc.size() * sizeof(float), cudaMemcpyDeviceToHost));
        const tq_conv_shape shh = {1u, (uint32_t) n, bb, 0, 0, (int64_t) N * 2, 0, 0};
        tq_convert128<half>(BITS, (const char *) dq, (char *) dy, shh, 1, 1, tab, 0);
        CK(cudaGetLastError());
        std::vector<half> yh(x.size());
        CK(cudaMemcpy(yh.data(), dy, yh.size() * sizeof(half), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < yc.size(); ++i) {
            const half r = __float2half_rn(ygpu[i]);
            const bool nan = std::isnan(ygpu[i]);
            if (nan ? !std::isnan(yc[i]) || !__hisnan(yh[i])
                    : memcmp(&yc[i], &ygpu[i], 4) != 0 || memcmp(&yh[i], &r, 2) != 0) {
                if (conv_bad < 3) {
                    fprintf(stderr, "tq%d converter: value %zu %.9g vs %.9g\n", BITS, i, yc[i], ygpu[i]);
                }
                ++conv_bad;
            }
        }
    }
    CK(cudaFree(dx));
    CK(cudaFree(dq));
    CK(cudaFree(dy));
    const bool ok = bad == 0 && nan_mismatch == 0 && max_rel < 1e-6 && conv_bad == 0;
    printf("tq%d%s: %lld blocks, quantize bytes differ in %lld; dequantize max relative L2 error %.3g, NaN mismatches %lld, converter values differing %lld: %s"
           " | quantize 4 blocks %.1f us per launch, all %lld blocks %.0f us\n",
           BITS, N == TQ_BLOCK ? "" : N == TQ_BLOCK_64 ? "_64" : "_96", (long long) n, (long long) bad, max_rel, (long long) nan_mismatch, (long long) conv_bad, ok ? "PASS" : "FAIL", us_small,
           (long long) n, us_all);
    return ok ? 0 : 1;
}

__global__ void k_quant_tq3a(const float * x, uint8_t * out, int64_t n, const __grid_constant__ tq3a_cu_tables tab) {
    __shared__ tq3a_cu_tables t;
    __shared__ tq3a_cu_qscratch sm;
    tq3a_cu_tables_load<TQ3A_BLOCK>(t, tab, threadIdx.x);
    __syncthreads();
    const int64_t b = blockIdx.x; // one CTA of 256 threads per block, as ggml-cuda's SET_ROWS
    if (b < n) {
        tq3a_cu_quantize_block(t, x[b * TQ3A_BLOCK + threadIdx.x], out + b * TQ3A_BLOCK_BYTES, sm, threadIdx.x);
    }
}

__global__ void k_dequant_tq3a(const uint8_t * in, float * y, int64_t n, const __grid_constant__ tq3a_cu_tables tab) {
    __shared__ tq3a_cu_tables t;
    tq3a_cu_tables_load<128>(t, tab, threadIdx.x);
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const int64_t b = (int64_t) blockIdx.x * 4 + (threadIdx.x >> 5);
    if (b >= n) {
        return;
    }
    float v[TQ3A_BLOCK / 32];
    tq3a_cu_dequantize_block(t, in + b * TQ3A_BLOCK_BYTES, v, lane);
    for (int r = 0; r < TQ3A_BLOCK / 32; ++r) {
        y[b * TQ3A_BLOCK + lane + 32 * r] = v[r];
    }
}

static int check_tq3a(int64_t n) {
    constexpr int N = TQ3A_BLOCK, bb = TQ3A_BLOCK_BYTES;
    tq3a_cu_tables tab;
    tq3a_cu_tables_init(&tab);
    std::vector<float> x;
    make_inputs(x, n, 0x54A30000u, N);
    std::vector<uint8_t> cpu((size_t) n * bb), gpu((size_t) n * bb);
    std::vector<float> ycpu(x.size()), ygpu(x.size());
    const int nt = (int) std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::thread> th;
    for (int t = 0; t < nt; ++t) {
        th.emplace_back([&, t] {
            for (int64_t b = t; b < n; b += nt) {
                tq3a_quantize_block(x.data() + b * N, cpu.data() + b * bb);
                tq3a_dequantize_block(cpu.data() + b * bb, ycpu.data() + b * N);
            }
        });
    }
    for (auto & t : th) {
        t.join();
    }
    float * dx;
    uint8_t * dq;
    float * dy;
    device_buffers(x, gpu.size(), dx, dq, dy);
    k_quant_tq3a<<<(unsigned) n, N>>>(dx, dq, n, tab);
    CK(cudaGetLastError());
    CK(cudaMemcpy(gpu.data(), dq, gpu.size(), cudaMemcpyDeviceToHost));
    int64_t bad = 0;
    for (int64_t b = 0; b < n; ++b) {
        if (memcmp(cpu.data() + b * bb, gpu.data() + b * bb, bb) != 0) {
            if (bad < 5) {
                int at = 0;
                while (cpu[b * bb + at] == gpu[b * bb + at]) {
                    ++at;
                }
                fprintf(stderr, "tq3a block %lld differs from byte %d (cpu %02x gpu %02x)\n", (long long) b, at,
                        cpu[b * bb + at], gpu[b * bb + at]);
            }
            ++bad;
        }
    }
    CK(cudaMemcpy(dq, cpu.data(), cpu.size(), cudaMemcpyHostToDevice)); // dequantize the codec's own bytes
    k_dequant_tq3a<<<(unsigned) ((n + 3) / 4), 128>>>(dq, dy, n, tab);
    CK(cudaGetLastError());
    CK(cudaMemcpy(ygpu.data(), dy, ygpu.size() * sizeof(float), cudaMemcpyDeviceToHost));
    int64_t nan_mismatch = 0, bits_differ = 0;
    double max_rel = 0.0;
    for (int64_t b = 0; b < n; ++b) {
        double num = 0.0, den = 0.0;
        for (int i = 0; i < N; ++i) {
            const float c = ycpu[b * N + i], g = ygpu[b * N + i];
            if (std::isnan(c) || std::isnan(g)) {
                nan_mismatch += std::isnan(c) != std::isnan(g);
                continue;
            }
            bits_differ += memcmp(&c, &g, 4) != 0;
            num += ((double) c - g) * ((double) c - g);
            den += (double) c * c;
        }
        if (den > 0.0) {
            max_rel = std::max(max_rel, std::sqrt(num / den));
        }
    }
    CK(cudaFree(dx));
    CK(cudaFree(dq));
    CK(cudaFree(dy));
    const bool ok = bad == 0 && nan_mismatch == 0 && max_rel < 1e-6;
    printf("tq3a: %lld blocks, quantize bytes differ in %lld; dequantize max relative L2 error %.3g, values differing "
           "in any bit %lld, NaN mismatches %lld: %s\n",
           (long long) n, (long long) bad, max_rel, (long long) bits_differ, (long long) nan_mismatch, ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}

int main(int argc, char ** argv) {
    const int64_t n = argc > 1 ? atoll(argv[1]) : (1 << 20);
    tq_cu_tables tab;
    tq_cu_tables_init(&tab);
    return check<3, TQ_BLOCK>(n, tab) | check<4, TQ_BLOCK>(n, tab) | check<3, TQ_BLOCK_64>(n, tab) |
           check<4, TQ_BLOCK_64>(n, tab) | check<3, TQ_BLOCK_96>(n, tab) | check<4, TQ_BLOCK_96>(n, tab) |
           check_tq3a(n);
}
