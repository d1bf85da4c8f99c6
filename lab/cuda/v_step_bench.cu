// Issue 45, item 2, measured cheaply first: the tensor-core decode kernel's V step alone (O^T += V^T P^T over 16-key
// tiles of a 128-value TQ V cache), two ways, on the same tiles:
//  0 "pairs"  the shipped step (tq-fattn-mma.cuh): A = codebook pairs across two keys, so each lane gathers the 3- or
//             4-bit fields of four keys and spreads them into pair-table indices per sub-block (NOTES.md v4 put that
//             index work at ~2/3 of a tile; today's SASS says ~1/3, v25); s * m folded into P.
//  1 "smem"   each lane decodes half of one key's row with the K step's own lookups (adjacent coordinates, one field,
//             no spreading; s * m folded into the multiplier pair), stores it as f16 to a per-warp [16][136] tile in
//             shared memory, and the A fragments come back with ldmatrix.x4.trans (tq4 keeps its byte order: slot 2B
//             holds coordinate B, slot 2B + 1 coordinate 64 + B).
// Prediction (written before any GPU run, from the SASS: the loop's static instructions tq3 510 -> 345, tq4 424 ->
// 391, NOTES.md v25): "smem" / "pairs" time ~0.7 for tq3 and ~0.9-1.0 for tq4 where issue-bound. The tiles stream
// from global memory through the kernel's 2-stage cp.async pipeline, V only (no K step, no softmax), so the timing is
// the V step's issue cost plus its loads.
//
//   gcc -O2 -std=c11 -ffp-contract=off -c csrc/codec/tq_codec.c -o tq_codec.o
//   nvcc -O3 -std=c++17 -arch=sm_90 -use_fast_math -Icsrc/codec -Icsrc/llama.cpp/ggml/src/ggml-cuda/tq \
//        lab/cuda/v_step_bench.cu tq_codec.o -o v_step_bench && ./v_step_bench
// Prints per type and variant: max relative error against a CPU reference (small case), then the time of a large
// case (tiles per SM as in the 4 x 8 x 32K decode), the V bytes' read rate and the speedup of "smem".
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "tq-fattn-mma.cuh"

#include "../../tests/cuda/cuda_check.cuh"
#include "copy_bandwidth.cuh"

#define VB_WARPS 4
#define VB_ROW   136 // halves per key row of the decoded tile: 272 B, so ldmatrix's 8 rows fall in 8 bank quads

// P of (tile, key, column), the same on host and device; rounded to f16 where the kernels round it
static __host__ __device__ inline float vb_p(int tile, int key, int col) {
    return (float) (((tile * 16 + key) * 7 + col * 3) % 11) / 11.0f + 0.05f;
}

// coordinate held by accumulator (m-tile i, row r = g + 8e) of each variant, inside one 128-value block
template <int VAR, int T> static __host__ __device__ inline int vb_coord(int i, int r) {
    if (VAR == 0) { // m-tile 2k + hh, row g + 8e: 32k + 4g + 2hh + e
        const int k = i >> 1, hh = i & 1, g = r & 7, e = r >> 3;
        return 32 * k + 4 * g + 2 * hh + e;
    }
    const int slot = 16 * i + r;
    return tq_fa_bits(T) == 3 ? slot : (slot & 1) * 64 + (slot >> 1);
}

template <int T, int VAR>
__global__ void __launch_bounds__(VB_WARPS * 32) vb_kernel(const char * V, int n_tiles, int nb21, float * out,
                                                           const tq_cu_tables tab) {
    constexpr int VW = tq_fa_block_words(T), TILE_WORDS = TQ_MMA_KEYS * VW;
    using LV = tq_mma_lut_t<T, 128>;
    __shared__ __align__(16) uint32_t stage[VB_WARPS * TQ_MMA_STAGES * TILE_WORDS + 1];
    __shared__ uint32_t lutv[LV::WORDS];
    __shared__ __align__(16) half vsm[VAR == 1 ? VB_WARPS * TQ_MMA_KEYS * VB_ROW : 8];
    __shared__ float sub[16];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    tq_mma_fill_lut<T, 128>(lutv, tab, tid);
    if (tid < 16) {
        sub[tid] = tab.sub[tid];
    }
    __syncthreads();
    const char * lv = reinterpret_cast<const char *>(lutv);
    const uint32_t lov = tq_mma_opaque(4u * (lane & (LV::REP - 1)));
    const int gw = blockIdx.x * VB_WARPS + warp, nw = gridDim.x * VB_WARPS;
    const int n_it = (n_tiles - gw + nw - 1) / nw; // this warp's tiles: gw, gw + nw, ...
    uint32_t * wst = stage + warp * TQ_MMA_STAGES * TILE_WORDS;
    constexpr int VS = (TILE_WORDS + 31) / 32;
    auto load_tile = [&](int it, int st) {
        if (it < n_it) {
            const char * vt = V + (int64_t) (gw + it * nw) * TQ_MMA_KEYS * nb21;
#pragma unroll
            for (int s2 = 0; s2 < VS; ++s2) {
                const int w = lane + 32 * s2;
                if (w < TILE_WORDS) {
                    const int r = w / VW;
                    tq_mma_cp4(wst + st * TILE_WORDS + w, vt + r * nb21 + 4 * (w - r * VW));
                }
            }
        }
        tq_mma_cp_commit();
    };
    float oacc[8][4] = {};
    load_tile(0, 0);
    for (int it = 0; it < n_it; ++it) {
        load_tile(it + 1, (it + 1) % TQ_MMA_STAGES);
        tq_mma_cp_wait<1>();
        __syncwarp();
        const int tile = gw + it * nw;
        const uint32_t * vs = wst + (it % TQ_MMA_STAGES) * TILE_WORDS;
        float pk[4]; // P[g][2t + i], P[g][2t + 8 + i]: the FA kernel's layout after its transposes
#pragma unroll
        for (int e = 0; e < 2; ++e) {
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                pk[2 * e + i] = __half2float(__float2half(vb_p(tile, 2 * t + 8 * e + i, g)));
            }
        }
        if constexpr (VAR == 0) { // the shipped V step (nk = 16: full tiles)
            tq_mma_v_step<T, VW, LV::LOG2_STRIDE>(oacc, vs, pk, TQ_MMA_KEYS, g, t, lv, lov, sub);
        } else { // decode to shared memory, A by ldmatrix.trans
            half * ws = vsm + warp * TQ_MMA_KEYS * VB_ROW;
            const int key = lane >> 1, hf = lane & 1;
            const uint32_t * row = vs + key * VW;
            const float s = tq_cu_bf16_to_fp32(row[0] & 0xffffu);
            const uint32_t sh2 = tq_mma_h2(s, s);
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const int sb = 2 * hf + u; // tq3: sub-block sb; tq4: bytes 16 sb .. 16 sb + 15
                tq_mma_field<T> f = tq_mma_load_field<T>(row, sb, sub);
                f.mm = tq_mma_hmul2(f.mm, sh2);
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    uint32_t p0, p1;
                    tq_mma_decode2<T, LV::LOG2_STRIDE>(f, j, lv, lov, p0, p1);
                    *reinterpret_cast<uint2 *>(ws + key * VB_ROW + 32 * sb + 4 * j) = make_uint2(p0, p1);
                }
            }
            __syncwarp();
            const uint32_t b0 = tq_mma_h2(pk[0], pk[1]), b1 = tq_mma_h2(pk[2], pk[3]);
            const int mi = lane >> 3, mr = lane & 7; // ldmatrix: lanes 8m..8m+7 address matrix m's rows
            const uint32_t base = (uint32_t) __cvta_generic_to_shared(ws + (mr + 8 * (mi >> 1)) * VB_ROW + 8 * (mi & 1));
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                uint32_t a0, a1, a2, a3;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                             : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3)
                             : "r"(base + 32u * i));
                tq_mma_16816(oacc[i], a0, a1, a2, a3, b0, b1);
            }
        }
        __syncwarp(); // the stage (and the decoded tile) just read are refilled next iteration
    }
    tq_mma_cp_wait<0>();
    // out[gw][column][coordinate]
    float * o = out + (size_t) gw * 8 * 128;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            o[(2 * t + (r & 1)) * 128 + vb_coord<VAR, T>(i, g + 8 * (r >> 1))] = oacc[i][r];
        }
    }
}

template <int T, int VAR> static void vb_launch(const char * dV, int n_tiles, int nb21, float * dO, const tq_cu_tables & tab, int blocks) {
    vb_kernel<T, VAR><<<blocks, VB_WARPS * 32>>>(dV, n_tiles, nb21, dO, tab);
    CK(cudaGetLastError());
}

template <int T> static bool vb_type(const char * name, int nsm, double gbs) {
    constexpr int bits = tq_fa_bits(T), VW = tq_fa_block_words(T), nb21 = 4 * VW;
    tq_cu_tables tab;
    tq_cu_tables_init(&tab);
    std::mt19937 rng(7);
    bool ok = true;
    // small case: 4 blocks x 4 warps, 3 tiles a warp; random index bits, multiplier nibbles and a bf16 scale near 1
    for (int big = 0; big < 2; ++big) {
        const int blocks = big ? 4 * nsm : 4, n_tiles = big ? 4 * nsm * VB_WARPS * 64 : blocks * VB_WARPS * 3;
        std::vector<uint32_t> hv((size_t) n_tiles * TQ_MMA_KEYS * VW);
        for (size_t r = 0; r < hv.size() / VW; ++r) {
            for (int w = 0; w < VW; ++w) {
                hv[r * VW + w] = rng();
            }
            const float s = 0.5f + (rng() % 1000) / 1000.0f;
            uint32_t sb;
            memcpy(&sb, &s, 4);
            hv[r * VW] = (hv[r * VW] & 0xffff0000u) | (sb >> 16);
        }
        char * dV;
        float * dO[2];
        const int nw = blocks * VB_WARPS;
        CK(cudaMalloc(&dV, hv.size() * 4));
        CK(cudaMemcpy(dV, hv.data(), hv.size() * 4, cudaMemcpyHostToDevice));
        for (auto & o : dO) {
            CK(cudaMalloc(&o, (size_t) nw * 8 * 128 * 4));
        }
        std::vector<float> ref;
        if (!big) { // O[w][col][d] = sum over the warp's tiles and keys of f16(P) * value
            ref.assign((size_t) nw * 8 * 128, 0.0f);
            for (int tile = 0; tile < n_tiles; ++tile) {
                const int w = tile % nw;
                for (int key = 0; key < TQ_MMA_KEYS; ++key) {
                    float vr[128]; // the codec's rotated-domain values (s * m * c[idx]), as the kernels read them
                    tq_dequantize_row_rotated(bits, hv.data() + ((size_t) tile * TQ_MMA_KEYS + key) * VW, vr, 128);
                    for (int d = 0; d < 128; ++d) {
                        for (int c = 0; c < 8; ++c) {
                            ref[((size_t) w * 8 + c) * 128 + d] += __half2float(__float2half(vb_p(tile, key, c))) * vr[d];
                        }
                    }
                }
            }
        }
        float us[2] = {0, 0};
        for (int var = 0; var < 2; ++var) {
            auto run = [&] {
                var == 0 ? vb_launch<T, 0>(dV, n_tiles, nb21, dO[0], tab, blocks)
                         : vb_launch<T, 1>(dV, n_tiles, nb21, dO[1], tab, blocks);
            };
            run();
            CK(cudaDeviceSynchronize());
            if (!big) {
                std::vector<float> o(ref.size());
                CK(cudaMemcpy(o.data(), dO[var], o.size() * 4, cudaMemcpyDeviceToHost));
                double num = 0, den = 0;
                for (size_t i = 0; i < o.size(); ++i) {
                    num += (o[i] - ref[i]) * (double) (o[i] - ref[i]);
                    den += ref[i] * (double) ref[i];
                }
                const double rel = std::sqrt(num / den);
                printf("%s %-5s rel. RMS error vs CPU %.2e %s\n", name, var ? "smem" : "pairs", rel, rel < 2e-3 ? "ok" : "MISMATCH");
                ok &= rel < 2e-3;
            } else {
                cudaEvent_t e0, e1;
                CK(cudaEventCreate(&e0));
                CK(cudaEventCreate(&e1));
                CK(cudaEventRecord(e0));
                for (int r = 0; r < 20; ++r) {
                    run();
                }
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                us[var] = ms * 1e3f / 20;
                const double bytes = (double) hv.size() * 4;
                printf("%s %-5s %d tiles (%d a warp): %8.1f us, V read %.2f TB/s = %.0f %% of copy\n", name,
                       var ? "smem" : "pairs", n_tiles, n_tiles / nw, us[var], bytes / (us[var] * 1e-6) / 1e12,
                       100.0 * bytes / (us[var] * 1e-6) / (gbs * 1e9 / 2));
            }
        }
        if (big) {
            printf("%s smem / pairs time: %.3f\n", name, us[1] / us[0]);
        }
        CK(cudaFree(dV));
        for (auto & o : dO) {
            CK(cudaFree(o));
        }
    }
    return ok;
}

int main() {
    int nsm;
    CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    const double gbs = copy_bandwidth();
    printf("device SMs %d, copy %.0f GB/s (read + write)\n", nsm, gbs);
    bool ok = vb_type<TQFA_TQ3>("tq3", nsm, gbs);
    ok &= vb_type<TQFA_TQ4>("tq4", nsm, gbs);
    printf("%s\n", ok ? "both variants match the CPU reference" : "MISMATCH");
    return ok ? 0 : 1;
}
