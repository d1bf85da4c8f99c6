// A decode step's attention chain without ggml, to study programmatic dependent launch (PDL) between our kernels:
// per layer, in one CUDA graph, [filler] -> K/V write (the codec's GPU quantizer, 4 K + 4 V blocks, PDL: waits,
// then triggers) -> tensor-core FA single pass (PDL, Q read before its wait, as q_early) -> next layer. The shape is
// llama-bench's at depth 0 (1 sequence, 4 KV heads, GQA 4, head 128, 256 cells of which `open` are unmasked); the
// filler stands in for the step's matmuls (all SMs, a few µs). Prints µs a layer for tq3/tq3, tq4/tq4, tq3/tq4 with
// PDL on and off; run it under lab/cuda/kernel_trace.so for per-kernel times (NOTES.md v21: tq4's FA ends
// 2-6 µs later after the write than tq3's inside llama-bench's graphs).
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -use_fast_math -Icsrc/codec -Icsrc/llama.cpp/ggml/src/ggml-cuda/tq \
//        lab/cuda/pdl_chain_bench.cu tq_codec.o -o pdl_chain_bench && ./pdl_chain_bench [filler iterations]
//   ./pdl_chain_bench ITERS PAIR PDL OPEN   one variant (PAIR 33 = tq3/tq3, 44, 34 = tq3 K / tq4 V, 43)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "tq-fattn-mma.cuh"

#include "../../tests/cuda/cuda_check.cuh"

constexpr int D = 128, NKVH = 4, GQA = 4, NHEAD = NKVH * GQA, NKV = 256, LAYERS = 8;

// the step's other kernels: every SM busy for a few µs, PDL-launched like upstream's
static __global__ void k_filler(float * x, int iters) {
    tq_pdl_wait();
    float a = x[blockIdx.x * blockDim.x + threadIdx.x];
    for (int i = 0; i < iters; ++i) {
        a = a * 0.999f + 0.001f;
    }
    tq_pdl_trigger();
    x[blockIdx.x * blockDim.x + threadIdx.x] = a;
}

// the step's matmuls also stream their weights through L2 (~60 MB a step on llama-bench's model): a filler that
// reads `n4` float4 of its layer's buffer
static __global__ void k_stream(const float4 * w, int64_t n4, float * out) {
    tq_pdl_wait();
    float a = 0.0f;
    for (int64_t i = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; i < n4; i += (int64_t) gridDim.x * blockDim.x) {
        const float4 v = w[i];
        a += v.x + v.y + v.z + v.w;
    }
    tq_pdl_trigger();
    out[blockIdx.x * blockDim.x + threadIdx.x] = a;
}

// every cell of a layer's cache written once (data = 1: real blocks in the open cells, not zeros)
template <int BK, int BV>
static __global__ void __launch_bounds__(TQ_BLOCK) k_write_all(const float * src, uint8_t * K, uint8_t * V,
                                                               const __grid_constant__ tq_cu_tables tab) {
    __shared__ tq_cu_tables t;
    __shared__ tq_cu_qscratch sm;
    tq_cu_tables_load<TQ_BLOCK>(t, tab, threadIdx.x);
    const int b = blockIdx.x, h = b % NKVH, cell = blockIdx.y;
    const float v = src[((size_t) cell * 2 * NKVH + b) * D + threadIdx.x];
    __syncthreads();
    if (b < NKVH) {
        tq_cu_quantize_block<BK>(t, v, K + ((size_t) cell * NKVH + h) * tq_cu_block_bytes(BK), sm, threadIdx.x);
    } else {
        tq_cu_quantize_block<BV>(t, v, V + ((size_t) cell * NKVH + h) * tq_cu_block_bytes(BV), sm, threadIdx.x);
    }
}

// the fused K/V write of one token (blocks 0-3: K heads, 4-7: V heads), as k_tq_quantize_rows2 runs it
template <int BK, int BV>
static __global__ void __launch_bounds__(TQ_BLOCK) k_write(const float * src, uint8_t * K, uint8_t * V, int cell,
                                                           const __grid_constant__ tq_cu_tables tab) {
    __shared__ tq_cu_tables t;
    __shared__ tq_cu_qscratch sm;
    tq_cu_tables_load<TQ_BLOCK>(t, tab, threadIdx.x);
    tq_pdl_wait();
    tq_pdl_trigger();
    const int b = blockIdx.x, h = b % NKVH;
    const float v = src[b * D + threadIdx.x];
    __syncthreads();
    if (b < NKVH) {
        tq_cu_quantize_block<BK>(t, v, K + ((size_t) cell * NKVH + h) * tq_cu_block_bytes(BK), sm, threadIdx.x);
    } else {
        tq_cu_quantize_block<BV>(t, v, V + ((size_t) cell * NKVH + h) * tq_cu_block_bytes(BV), sm, threadIdx.x);
    }
}

template <typename Kernel, typename... Args>
static void launch(bool pdl, Kernel kernel, dim3 grid, dim3 block, cudaStream_t s, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.stream = s;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = pdl ? 1 : 0;
    CK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

template <int TK, int TV>
static double run(bool pdl, int open, int filler_iters, bool data = false, bool stream = false) {
    constexpr int BK = TK == TQFA_TQ3 ? 3 : 4, BV = TV == TQFA_TQ3 ? 3 : 4;
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> q(D * NHEAD), src(2 * NKVH * D);
    for (auto & x : q) x = nd(rng);
    for (auto & x : src) x = nd(rng);
    std::vector<uint16_t> mask(NKV);
    for (int i = 0; i < NKV; ++i) {
        const __half m = __float2half(i < open ? 0.0f : -INFINITY);
        memcpy(&mask[i], &m, 2);
    }
    float *dq, *dsrc, *dout, *fill;
    char * dmask;
    std::vector<uint8_t *> dk(LAYERS), dv(LAYERS);
    CK(cudaMalloc(&dq, q.size() * 4));
    CK(cudaMalloc(&dsrc, src.size() * 4));
    CK(cudaMalloc(&dout, q.size() * 4));
    CK(cudaMalloc(&fill, 132 * 4 * 128 * 4));
    CK(cudaMalloc(&dmask, NKV * 2));
    CK(cudaMemset(fill, 0, 132 * 4 * 128 * 4));
    CK(cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dsrc, src.data(), src.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dmask, mask.data(), NKV * 2, cudaMemcpyHostToDevice));
    const size_t kbytes = (size_t) NKV * NKVH * tq_cu_block_bytes(BK), vbytes = (size_t) NKV * NKVH * tq_cu_block_bytes(BV);
    tq_cu_tables tab;
    tq_cu_tables_init(&tab);
    float * dall = nullptr;
    if (data) {
        std::vector<float> all((size_t) NKV * 2 * NKVH * D);
        for (auto & x : all) x = nd(rng);
        CK(cudaMalloc(&dall, all.size() * 4));
        CK(cudaMemcpy(dall, all.data(), all.size() * 4, cudaMemcpyHostToDevice));
    }
    for (int l = 0; l < LAYERS; ++l) {
        CK(cudaMalloc(&dk[l], kbytes));
        CK(cudaMalloc(&dv[l], vbytes));
        CK(cudaMemset(dk[l], 0, kbytes));
        CK(cudaMemset(dv[l], 0, vbytes));
        if (data) {
            k_write_all<BK, BV><<<dim3(2 * NKVH, NKV), TQ_BLOCK>>>(dall, dk[l], dv[l], tab);
            CK(cudaGetLastError());
        }
    }
    const int64_t w4 = stream ? (int64_t) (8 << 20) / 16 : 0; // 8 MB a layer
    float4 * dw = nullptr;
    if (stream) {
        CK(cudaMalloc(&dw, (size_t) w4 * 16 * (LAYERS + 1)));
        CK(cudaMemset(dw, 0, (size_t) w4 * 16 * (LAYERS + 1)));
    }

    tq_fa_params p;
    memset(&p, 0, sizeof p);
    p.Q = (const char *) dq;
    p.mask = dmask;
    p.nb01 = 4 * D; p.nb02 = p.nb01; p.nb03 = p.nb02 * NHEAD;
    p.nb11 = (int64_t) tq_cu_block_bytes(BK) * NKVH; p.nb12 = tq_cu_block_bytes(BK); p.nb13 = p.nb11 * NKV;
    p.nb21 = (int64_t) tq_cu_block_bytes(BV) * NKVH; p.nb22 = tq_cu_block_bytes(BV); p.nb23 = p.nb21 * NKV;
    p.nb31 = 2 * NKV; p.nb32 = p.nb31; p.nb33 = p.nb32;
    p.ne32 = 1; p.ne33 = 1;
    p.n_kv = NKV; p.n_q = 1; p.gqa = GQA; p.n_head = NHEAD; p.rk3 = 1; p.rv3 = 1;
    p.scale = 1.0f / sqrtf((float) D);
    p.n_head_log2 = 1;
    p.tab = tab;
    p.tpg = 1;
    p.ncol = GQA;
    p.n_groups = 1;
    p.n_cols_total = NKVH * GQA;
    p.chunk_keys = NKV; // one chunk: the single pass
    p.dst = (char *) dout;
    p.dnb1 = 4 * D; p.dnb2 = p.dnb1 * NHEAD; p.dnb3 = p.dnb2;
    p.q_early = pdl ? 1 : 0;
    CK(cudaMalloc(&p.part, sizeof(float) * p.n_cols_total * D));
    CK(cudaMalloc(&p.ml, sizeof(float2) * p.n_cols_total));

    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    auto filler = [&](int l) {
        if (stream) {
            launch(pdl, k_stream, dim3(132 * 4), dim3(128), s, (const float4 *) (dw + (size_t) l * w4), w4, fill);
        } else {
            launch(pdl, k_filler, dim3(132 * 4), dim3(128), s, fill, filler_iters);
        }
    };
    for (int l = 0; l < LAYERS; ++l) {
        filler(l);
        launch(pdl, k_write<BK, BV>, dim3(2 * NKVH), dim3(TQ_BLOCK), s, (const float *) dsrc, dk[l], dv[l], open - 1, tab);
        p.K = (const char *) dk[l];
        p.V = (const char *) dv[l];
        launch(pdl, tq_fa_mma_kernel<D, TK, TV>, dim3(1, NKVH, 1), dim3(TQ_MMA_WARPS * 32), s, p);
    }
    filler(LAYERS);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int w = 0; w < 50; ++w) CK(cudaGraphLaunch(ge, s));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const int reps = 400;
    CK(cudaEventRecord(e0, s));
    for (int r = 0; r < reps; ++r) CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaStreamDestroy(s));
    for (int l = 0; l < LAYERS; ++l) {
        CK(cudaFree(dk[l]));
        CK(cudaFree(dv[l]));
    }
    CK(cudaFree(dq)); CK(cudaFree(dsrc)); CK(cudaFree(dout)); CK(cudaFree(fill)); CK(cudaFree(dmask));
    CK(cudaFree(p.part)); CK(cudaFree(p.ml));
    if (dall) CK(cudaFree(dall));
    if (dw) CK(cudaFree(dw));
    return ms * 1e3 / reps / LAYERS;
}

int main(int argc, char ** argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 2000;
    if (argc > 4) { // one variant (for a tracer): pair (33, 44, 34, 43), pdl, open [, data, stream]
        const int pair = atoi(argv[2]), pdl = atoi(argv[3]), open = atoi(argv[4]);
        const bool data = argc > 5 && atoi(argv[5]), stream = argc > 6 && atoi(argv[6]);
        const double us = pair == 33 ? run<TQFA_TQ3, TQFA_TQ3>(pdl, open, iters, data, stream)
                          : pair == 44 ? run<TQFA_TQ4, TQFA_TQ4>(pdl, open, iters, data, stream)
                          : pair == 34 ? run<TQFA_TQ3, TQFA_TQ4>(pdl, open, iters, data, stream)
                                       : run<TQFA_TQ4, TQFA_TQ3>(pdl, open, iters, data, stream);
        printf("pair %d pdl %d open %d data %d stream %d: %.2f us a layer\n", pair, pdl, open, data, stream, us);
        return 0;
    }
    printf("graph of %d layers x [filler (528 blocks, %d iterations), K/V write, FA single pass]: us a layer\n", LAYERS, iters);
    for (int open : {64, 128}) {
        for (int ds : {0, 1, 2, 3}) { // cache data (bit 0), streaming filler (bit 1)
            for (int pdl : {1, 0}) {
                const bool d = ds & 1, st = ds & 2;
                printf("open %3d data %d stream %d pdl %d: tq3/tq3 %6.2f  tq4/tq4 %6.2f  tq3/tq4 %6.2f  tq4/tq3 %6.2f\n",
                       open, d, st, pdl, run<TQFA_TQ3, TQFA_TQ3>(pdl, open, iters, d, st),
                       run<TQFA_TQ4, TQFA_TQ4>(pdl, open, iters, d, st), run<TQFA_TQ3, TQFA_TQ4>(pdl, open, iters, d, st),
                       run<TQFA_TQ4, TQFA_TQ3>(pdl, open, iters, d, st));
            }
        }
    }
    return 0;
}
