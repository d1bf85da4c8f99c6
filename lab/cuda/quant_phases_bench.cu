// Where the GPU quantizer's time goes: clock stamps at the phases of tq_cu_quantize_block (the 128-value path the
// fused K/V write runs, one CTA of 128 threads per block), for a decode token's write of `nb` blocks, tq3 and tq4.
// Also checks the bytes against the C codec. NOTES.md v23, lab/archive/cuda.tar.xz (cuda/v23_write). Needs the
// phase hooks of lab/patches/cuda-phases.patch: `bash lab/patch.sh apply cuda-phases` first.
//
//   gcc -O2 -std=c11 -ffp-contract=off -c -Icsrc/codec csrc/codec/tq_codec.c -o tq_codec.o
//   nvcc -O3 -std=c++17 -arch=sm_90 -use_fast_math -Icsrc/codec -Icsrc/llama.cpp/ggml/src/ggml-cuda/tq \
//        lab/cuda/quant_phases_bench.cu tq_codec.o -o quant_phases
//   ./quant_phases [nb=16] [launches=2000]
//
// Phases (thread 0's clock64, cycles): 0 entry -> 1 tables + input loaded -> 2 sum of squares ->
// 3 rotated (WHT) -> 4 multiplier picked -> 5 least-squares scale -> 6 packed and stored.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

__device__ long long g_ph[1024][8];
#define TQ_QPHASE(k)                                  \
    do {                                              \
        if (threadIdx.x == 0) {                       \
            g_ph[blockIdx.x][k] = clock64();          \
        }                                             \
    } while (0)

#include "../../tests/cuda/cuda_check.cuh"
#include "tq-cuda-codec.cuh"

#ifdef TQ_QP_ALL_TABLES // headers before v23 copy every table word
#define TQ_QP_LOAD(t, s, i) tq_cu_tables_load(t, s, i)
#else                    // as the K/V write copies them
#define TQ_QP_LOAD(t, s, i) tq_cu_tables_load<TQ_BLOCK, tq_cu_table_words<TQ_BLOCK>()>(t, s, i)
#endif

template <int BITS>
__global__ void __launch_bounds__(TQ_BLOCK) k_phases(const float * x, uint8_t * out,
                                                     const __grid_constant__ tq_cu_tables tab) {
    __shared__ tq_cu_tables t;
    __shared__ tq_cu_qscratch sm;
    TQ_QPHASE(0);
    TQ_QP_LOAD(t, tab, threadIdx.x);
    const float v = x[blockIdx.x * TQ_BLOCK + threadIdx.x];
    __syncthreads();
    TQ_QPHASE(1);
    tq_cu_quantize_block<BITS>(t, v, out + blockIdx.x * tq_cu_block_bytes(BITS), sm, threadIdx.x);
    TQ_QPHASE(6);
}

template <int BITS>
static void run(int nb, int launches, const tq_cu_tables & tab, int clock_khz) {
    const int bb = tq_cu_block_bytes(BITS);
    std::mt19937 rng(1234 + BITS);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> x((size_t) nb * TQ_BLOCK);
    for (float & v : x) {
        v = g(rng);
    }
    std::vector<uint8_t> ref((size_t) nb * bb), got((size_t) nb * bb);
    for (int b = 0; b < nb; ++b) {
        tq_quantize_block(BITS, x.data() + (size_t) b * TQ_BLOCK, ref.data() + (size_t) b * bb);
    }
    float * dx;
    uint8_t * dq;
    CK(cudaMalloc(&dx, x.size() * sizeof(float)));
    CK(cudaMalloc(&dq, got.size()));
    CK(cudaMemcpy(dx, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));

    double sum[6] = {0}, tot = 0;
    long long ph[1024][8];
    int n = 0;
    for (int l = 0; l < launches; ++l) {
        k_phases<BITS><<<nb, TQ_BLOCK>>>(dx, dq, tab);
        CK(cudaGetLastError());
        CK(cudaMemcpyFromSymbol(ph, g_ph, sizeof(long long) * 8 * nb));
        if (l < 10) {
            continue; // warm-up
        }
        for (int b = 0; b < nb; ++b) {
            for (int k = 0; k < 6; ++k) {
                sum[k] += (double) (ph[b][k + 1] - ph[b][k]);
            }
            tot += (double) (ph[b][6] - ph[b][0]);
            ++n;
        }
    }
    CK(cudaMemcpy(got.data(), dq, got.size(), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int b = 0; b < nb; ++b) {
        bad += memcmp(ref.data() + (size_t) b * bb, got.data() + (size_t) b * bb, bb) != 0;
    }
    static const char * names[6] = {"tables+load", "sum sq", "rotate", "search", "scale", "pack+store"};
    printf("tq%d, %d blocks, %d launches: bytes vs C codec %s (%d differing blocks)\n", BITS, nb, launches - 10,
           bad ? "DIFFER" : "equal", bad);
    for (int k = 0; k < 6; ++k) {
        printf("  %-12s %7.0f cycles %6.3f us\n", names[k], sum[k] / n, sum[k] / n / (clock_khz * 1e-3));
    }
    printf("  %-12s %7.0f cycles %6.3f us (at the %d MHz max clock)\n", "total", tot / n, tot / n / (clock_khz * 1e-3),
           clock_khz / 1000);
    CK(cudaFree(dx));
    CK(cudaFree(dq));
    if (bad) {
        exit(1);
    }
}

int main(int argc, char ** argv) {
    const int nb = argc > 1 ? atoi(argv[1]) : 16;
    const int launches = argc > 2 ? atoi(argv[2]) : 2000;
    if (nb < 1 || nb > 1024 || launches <= 10) {
        fprintf(stderr, "usage: %s [nb 1..1024] [launches > 10]\n", argv[0]);
        return 2;
    }
    tq_cu_tables tab;
    tq_cu_tables_init(&tab);
    int clock_khz = 0;
    CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    run<3>(nb, launches, tab, clock_khz);
    run<4>(nb, launches, tab, clock_khz);
    return 0;
}
