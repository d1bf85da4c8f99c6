// Dequantizes 128-value TQ3/TQ4 blocks to f16 / f32: what the FA prefill path converts the whole K and V caches
// with before each ubatch (fattn-common.cuh's to_fp16), and cuBLAS's to_fp16 / to_fp32 for -fa off.
//
// Four lanes per block, lane j holding values 32j .. 32j + 31 (its sub-block j: one multiplier, three (tq3) or
// eight (tq4) aligned index words): the WHT's strides 1..16 run in registers, 32 and 64 across the four lanes, in
// the codec's stage order and with its butterflies, so every value is bit-identical to the codec's (and to the
// one-warp-per-block dequantizer of GET_ROWS). A lane stores its 32 consecutive outputs with 16-byte stores.
// 32 blocks per CTA; the block index is 32-bit and the row split a 32-bit division (the general row locator's
// 64-bit divisions cost more than the dequantization itself).
#pragma once

#include "tq-cuda-codec.cuh"

#include <cuda_fp16.h>
#include <type_traits>

// Blocks [nblk per row] x [ne1 rows] x [ne2] x [ne3] (grid: x over blocks x rows / 32, y = i2, z = i3), byte
// strides of the source rows and of the (contiguous, 16-byte aligned) destination rows.
struct tq_conv_shape {
    uint32_t nblk, n; // blocks per row, blocks per (i2, i3) plane (nblk * ne1)
    int64_t s1, s2, s3;
    int64_t d1, d2, d3;
};

template <int BITS>
static __device__ __forceinline__ uint32_t tq_conv_index(const uint32_t (&w)[BITS == 3 ? 3 : 8], int k, int hi) {
    if constexpr (BITS == 3) {
        const int b = 3 * k, wi = b >> 5, o = b & 31;
        const uint32_t x = o <= 29 || wi == 2 ? w[wi] >> o : __funnelshift_r(w[wi], w[wi + 1], o);
        return x & 7u;
    } else {
        return (w[k >> 2] >> (8 * (k & 3) + 4 * hi)) & 15u;
    }
}

template <int BITS, typename dst_t>
static __global__ void __launch_bounds__(128) k_tq_convert128(const char * __restrict__ src, char * __restrict__ dst,
                                                              const tq_conv_shape sh, const tq_cu_tables tab) {
    __shared__ float cent[16], sub[16];
    __shared__ uint32_t signs[4];
    const int tid = threadIdx.x;
    if (tid < 16) {
        cent[tid] = BITS == 3 ? (tid < 8 ? tab.cent3[tid] : 0.0f) : tab.cent4[tid];
        sub[tid]  = tab.sub[tid];
    } else if (tid < 20) {
        signs[tid - 16] = tab.signs[tid - 16];
    }
    __syncthreads();
    const int lane = tid & 31, j = lane & 3;
    const uint32_t g = blockIdx.x * 32u + (uint32_t) (tid >> 2); // this lane group's block in the plane
    if (g >= sh.n) {
        return;
    }
    const uint32_t i1 = sh.nblk == 1 ? g : g / sh.nblk, ib = g - i1 * sh.nblk;
    constexpr int BB = BITS == 3 ? TQ3_BLOCK_BYTES : TQ4_BLOCK_BYTES;
    const uint32_t * blk = reinterpret_cast<const uint32_t *>(src + i1 * sh.s1 + blockIdx.y * sh.s2 +
                                                              blockIdx.z * sh.s3 + (int64_t) ib * BB);
    const uint32_t h = blk[0];
    const float s = tq_cu_bf16_to_fp32(h & 0xffffu);
    const float m = sub[(h >> (16 + 4 * j)) & 15u];
    constexpr int NW = BITS == 3 ? 3 : 8;
    uint32_t w[NW];
    const uint32_t * q = blk + 1 + (BITS == 3 ? 3 * j : 8 * (j & 1)); // tq4: bytes 32(j & 1).., nibble j >> 1
#pragma unroll
    for (int i = 0; i < NW; ++i) {
        w[i] = q[i];
    }
    float y[32];
#pragma unroll
    for (int k = 0; k < 32; ++k) {
        y[k] = tq_fmul(m, cent[tq_conv_index<BITS>(w, k, j >> 1)]);
    }
#pragma unroll
    for (int hs = 1; hs < 32; hs <<= 1) { // strides 1..16: value k pairs with k ^ hs in this lane
#pragma unroll
        for (int k = 0; k < 32; ++k) {
            if ((k & hs) == 0) {
                const float a = y[k], b = y[k + hs];
                y[k] = tq_fadd(a, b);
                y[k + hs] = tq_fsub(a, b);
            }
        }
    }
#pragma unroll
    for (int hl = 1; hl < 4; hl <<= 1) { // strides 32 and 64: the lane j ^ hl of the same block
#pragma unroll
        for (int k = 0; k < 32; ++k) {
            const float o = __shfl_xor_sync(0xffffffffu, y[k], hl);
            y[k] = (j & hl) ? tq_fsub(o, y[k]) : tq_fadd(y[k], o);
        }
    }
    // y * (NORM * sign) * s as the codec: NORM * -1 is exact, and so is negating a product
    const uint32_t sg = signs[j];
    dst_t * o = reinterpret_cast<dst_t *>(dst + i1 * sh.d1 + blockIdx.y * sh.d2 + blockIdx.z * sh.d3) +
                (int64_t) ib * TQ_BLOCK + 32 * j;
#pragma unroll
    for (int k = 0; k < 32; k += 8) {
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const float yn = __uint_as_float(__float_as_uint(tq_fmul(y[k + u], TQ_WHT_NORM)) ^
                                             (((sg >> (k + u)) & 1u) << 31));
            v[u] = tq_fmul(yn, s);
        }
        if constexpr (std::is_same<dst_t, half>::value) {
            uint4 pk;
            uint32_t * p = reinterpret_cast<uint32_t *>(&pk);
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const half2 h2 = __floats2half2_rn(v[2 * u], v[2 * u + 1]);
                p[u] = *reinterpret_cast<const uint32_t *>(&h2);
            }
            *reinterpret_cast<uint4 *>(o + k) = pk;
        } else {
            *reinterpret_cast<float4 *>(o + k)     = make_float4(v[0], v[1], v[2], v[3]);
            *reinterpret_cast<float4 *>(o + k + 4) = make_float4(v[4], v[5], v[6], v[7]);
        }
    }
}

// Whether k_tq_convert128 takes this shape: 128-value blocks, 32-bit block counts, 16-byte aligned output rows.
static inline bool tq_conv_ok(int64_t nblk, int64_t ne1, int64_t ne2, int64_t ne3, const void * dst, int64_t d1) {
    return nblk * ne1 < (int64_t) 1 << 31 && ne2 < 65536 && ne3 < 65536 && (uintptr_t) dst % 16 == 0 &&
           d1 % 16 == 0 && nblk > 0 && ne1 > 0;
}

template <typename dst_t>
static void tq_convert128(int bits, const char * src, char * dst, const tq_conv_shape & sh, int64_t ne2, int64_t ne3,
                          const tq_cu_tables & tab, cudaStream_t stream) {
    const dim3 grid((sh.n + 31) / 32, (unsigned) ne2, (unsigned) ne3);
    if (bits == 3) {
        k_tq_convert128<3, dst_t><<<grid, 128, 0, stream>>>(src, dst, sh, tab);
    } else {
        k_tq_convert128<4, dst_t><<<grid, 128, 0, stream>>>(src, dst, sh, tab);
    }
}
