// TurboQuant codec on the GPU: the C codec (csrc/codec/tq_codec.c) transcribed to one warp per 128-value block.
//
// Quantizing must give the C codec's bytes exactly, so every float operation here is the codec's operation in
// the codec's order, written as inline PTX or _rn intrinsics: ggml-cuda builds with -use_fast_math, which would
// otherwise flush subnormals (-ftz) and fuse multiply-adds (-fmad), and either changes bytes. The tables come
// from the codec at run time (tq_cu_tables_init), so there is one copy of every constant.
//
// Lane l of the warp holds the values l, l + 32, l + 64, l + 96 of a block: value l + 32r is value l of
// sub-block r, which is how the sub-block search and the Walsh-Hadamard butterflies split across lanes.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "tq_codec.h"


struct tq_cu_tables {
    float cent3[8];
    float cent4[16];
    float bound3[7];
    float bound4[15];
    float sub[16];
    uint32_t signs[4];
};

// Filled from the C codec, the single source of every constant.
static inline void tq_cu_tables_init(tq_cu_tables * t) {
    for (int i = 0; i < 8; ++i) {
        t->cent3[i] = tq_centroids(3)[i];
    }
    for (int i = 0; i < 16; ++i) {
        t->cent4[i] = tq_centroids(4)[i];
        t->sub[i]   = tq_subscales()[i];
    }
    tq_scaled_boundaries(3, 1.0f, t->bound3); // 1 * b == b: the codec's boundaries exactly
    tq_scaled_boundaries(4, 1.0f, t->bound4);
    for (int i = 0; i < 4; ++i) {
        t->signs[i] = TQ_SIGNS[i];
    }
}

static __host__ __device__ constexpr int tq_cu_block_bytes(int bits) { return bits == 3 ? TQ3_BLOCK_BYTES : TQ4_BLOCK_BYTES; }

// Exact IEEE float ops: no flush to zero, never contracted into an FMA.
static __device__ __forceinline__ float tq_fadd(float a, float b) {
    float r;
    asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
static __device__ __forceinline__ float tq_fsub(float a, float b) {
    float r;
    asm("sub.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
static __device__ __forceinline__ float tq_fmul(float a, float b) {
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
static __device__ __forceinline__ bool tq_fgt(float a, float b) {
    uint32_t r;
    asm("{ .reg .pred p; setp.gt.f32 p, %1, %2; selp.u32 %0, 1, 0, p; }" : "=r"(r) : "f"(a), "f"(b));
    return r != 0;
}
static __device__ __forceinline__ bool tq_flt(float a, float b) { return tq_fgt(b, a); }
static __device__ __forceinline__ double tq_f2d(float f) { // exact, subnormals kept (no .ftz)
    double r;
    asm("cvt.f64.f32 %0, %1;" : "=d"(r) : "f"(f));
    return r;
}
static __device__ __forceinline__ float tq_d2f(double d) {
    float r;
    asm("cvt.rn.f32.f64 %0, %1;" : "=f"(r) : "d"(d));
    return r;
}

static __device__ __forceinline__ uint16_t tq_cu_fp32_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t) ((u >> 16) | 0x40u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t) (u >> 16);
}
static __device__ __forceinline__ float tq_cu_bf16_to_fp32(uint32_t h) { return __uint_as_float(h << 16); }

static __device__ __forceinline__ float tq_cu_sign(const tq_cu_tables & t, int i) {
    return (t.signs[i >> 5] >> (i & 31)) & 1u ? -1.0f : 1.0f;
}

// In-place unnormalized WHT of the warp's 128 values v[r] = value lane + 32r (the codec's butterflies:
// each stage is a fixed set of a+b / a-b pairs, so the order the lanes run them in cannot change a bit).
static __device__ __forceinline__ void tq_cu_fwht_warp(float v[4], int lane) {
#pragma unroll
    for (int h = 1; h < 32; h <<= 1) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const float o = __shfl_xor_sync(0xffffffffu, v[r], h);
            v[r] = (lane & h) ? tq_fsub(o, v[r]) : tq_fadd(v[r], o);
        }
    }
    float a = v[0], b = v[1], c = v[2], d = v[3];
    v[0] = tq_fadd(a, b); v[1] = tq_fsub(a, b); v[2] = tq_fadd(c, d); v[3] = tq_fsub(c, d);
    a = v[0]; b = v[1]; c = v[2]; d = v[3];
    v[0] = tq_fadd(a, c); v[2] = tq_fsub(a, c); v[1] = tq_fadd(b, d); v[3] = tq_fsub(b, d);
}

// The codec's canonical sum of one sub-block's 32 squared errors (lane l holds e_l): 8 running lanes
// b = i mod 8 summed in i order, then ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). Result in every lane.
static __device__ __forceinline__ float tq_cu_subblock_err(float e) {
    float t = tq_fadd(e, __shfl_down_sync(0xffffffffu, e, 8));
    t = tq_fadd(t, __shfl_down_sync(0xffffffffu, e, 16));
    t = tq_fadd(t, __shfl_down_sync(0xffffffffu, e, 24));
    float u = tq_fadd(t, __shfl_down_sync(0xffffffffu, t, 4));
    u = tq_fadd(u, __shfl_down_sync(0xffffffffu, u, 2));
    u = tq_fadd(u, __shfl_down_sync(0xffffffffu, u, 1));
    return __shfl_sync(0xffffffffu, u, 0);
}

// Sequential double sum in index order (the codec's loop), done by lane 0 from shared scratch. Unrolled so the
// shared loads are issued ahead of the dependent adds (same adds, same order: the result is bit-identical).
static __device__ __forceinline__ double tq_cu_seq_sum(const double * s) {
    double acc = 0.0;
#pragma unroll 32
    for (int i = 0; i < TQ_BLOCK; ++i) {
        acc = __dadd_rn(acc, s[i]);
    }
    return acc;
}
// Two independent sequential sums side by side (the least-squares scale's numerator and denominator).
static __device__ __forceinline__ void tq_cu_seq_sum2(const double * s, const double * t, double & a, double & b) {
    a = 0.0;
    b = 0.0;
#pragma unroll 32
    for (int i = 0; i < TQ_BLOCK; ++i) {
        a = __dadd_rn(a, s[i]);
        b = __dadd_rn(b, t[i]);
    }
}

// Quantizes one block; x[r] = value lane + 32r. scratch: 2*128 doubles + 128 bytes of shared memory per warp.
// out: the block's bytes (any alignment).
template <int BITS>
static __device__ void tq_cu_quantize_block(const tq_cu_tables & t, const float x[4], uint8_t * out,
                                            double * dscratch, uint8_t * iscratch, int lane) {
    constexpr int NB = (1 << BITS) - 1;
    const float * cent  = BITS == 3 ? t.cent3 : t.cent4;
    const float * bound = BITS == 3 ? t.bound3 : t.bound4;

#pragma unroll
    for (int r = 0; r < 4; ++r) {
        dscratch[lane + 32 * r] = __dmul_rn(tq_f2d(x[r]), tq_f2d(x[r]));
    }
    __syncwarp();
    double ss = lane == 0 ? tq_cu_seq_sum(dscratch) : 0.0;
    ss = __shfl_sync(0xffffffffu, ss, 0);
    __syncwarp();

    uint8_t idx[4] = {0, 0, 0, 0};
    uint32_t subs = 0;
    uint16_t scale_bits;
    if (!isfinite(ss)) {
        scale_bits = tq_cu_fp32_to_bf16(__uint_as_float(0x7fc00000u));
    } else {
        const double norm = __dsqrt_rn(ss);
        float y[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            y[r] = norm > 0.0 ? tq_d2f(__ddiv_rn(tq_f2d(x[r]), norm)) : 0.0f;
            y[r] = tq_fmul(y[r], tq_cu_sign(t, lane + 32 * r));
        }
        tq_cu_fwht_warp(y, lane);
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            y[r] = tq_fmul(y[r], TQ_WHT_NORM);
        }

        // The 16 multipliers are tried in the codec's order for each sub-block; the 4 sub-blocks run side by
        // side so their shuffle chains overlap (one warp's latency, not four).
        uint32_t pick[4] = {0, 0, 0, 0};
        float best_err[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            best_err[r] = __uint_as_float(0x7f800000u);
        }
        for (uint32_t j = 0; j < 16; ++j) {
            const float m = t.sub[j];
            float bm[NB];
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                bm[b] = tq_fmul(m, bound[b]);
            }
            int k[4];
            float err[4];
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                k[r] = 0;
#pragma unroll
                for (int b = 0; b < NB; ++b) {
                    k[r] += tq_fgt(y[r], bm[b]);
                }
                const float d = tq_fsub(y[r], tq_fmul(m, cent[k[r]]));
                err[r] = tq_cu_subblock_err(tq_fmul(d, d));
            }
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                if (tq_flt(err[r], best_err[r])) {
                    best_err[r] = err[r];
                    pick[r]     = j;
                    idx[r]      = (uint8_t) k[r];
                }
            }
        }
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            subs |= pick[r] << (4 * r);
        }

        // least-squares scale: sequential double sums over the block in index order (exact products)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const double c = tq_f2d(tq_fmul(t.sub[pick[r]], cent[idx[r]]));
            dscratch[lane + 32 * r]               = __dmul_rn(tq_f2d(y[r]), c);
            dscratch[TQ_BLOCK + lane + 32 * r] = __dmul_rn(c, c);
        }
        __syncwarp();
        double s = 0.0;
        if (lane == 0) {
            double yc, cc;
            tq_cu_seq_sum2(dscratch, dscratch + TQ_BLOCK, yc, cc);
            s = __dmul_rn(norm, __ddiv_rn(yc, cc));
            if (s > tq_f2d(TQ_BF16_MAX)) { // the largest finite bfloat16, as the codec clamps
                s = tq_f2d(TQ_BF16_MAX);
            }
        }
        s          = __shfl_sync(0xffffffffu, s, 0);
        scale_bits = tq_cu_fp32_to_bf16(tq_d2f(s));
        __syncwarp();
    }

#pragma unroll
    for (int r = 0; r < 4; ++r) {
        iscratch[lane + 32 * r] = idx[r];
    }
    __syncwarp();
    if (BITS == 3) {
        if (lane < 16) {
            uint32_t w = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                w |= (uint32_t) (iscratch[8 * lane + j] & 7u) << (3 * j);
            }
            out[TQ_HEADER_BYTES + 3 * lane + 0] = (uint8_t) (w & 0xffu);
            out[TQ_HEADER_BYTES + 3 * lane + 1] = (uint8_t) ((w >> 8) & 0xffu);
            out[TQ_HEADER_BYTES + 3 * lane + 2] = (uint8_t) ((w >> 16) & 0xffu);
        }
    } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int j = lane + 32 * h;
            out[TQ_HEADER_BYTES + j] = (uint8_t) ((iscratch[j] & 15u) | ((iscratch[j + 64] & 15u) << 4));
        }
    }
    if (lane == 0) {
        out[0] = (uint8_t) (scale_bits & 0xffu);
        out[1] = (uint8_t) (scale_bits >> 8);
        out[2] = (uint8_t) (subs & 0xffu);
        out[3] = (uint8_t) (subs >> 8);
    }
    __syncwarp();
}

// Index of value i (0..127) of a block from its packed bytes q (after the header).
template <int BITS>
static __device__ __forceinline__ uint32_t tq_cu_index(const uint8_t * q, int i) {
    if (BITS == 3) {
        const int bit = 3 * i;
        const uint32_t lo = q[bit >> 3];
        const uint32_t hi = (bit & 7) > 5 ? q[(bit >> 3) + 1] : 0u;
        return ((lo | (hi << 8)) >> (bit & 7)) & 7u;
    }
    return i < 64 ? (q[i] & 15u) : (q[i - 64] >> 4);
}

// Dequantizes one block into y[r] = value lane + 32r (the codec's tq_dequantize_block).
template <int BITS>
static __device__ __forceinline__ void tq_cu_dequantize_block(const tq_cu_tables & t, const uint8_t * blk,
                                                              float y[4], int lane) {
    const float * cent = BITS == 3 ? t.cent3 : t.cent4;
    const uint32_t s_bits = (uint32_t) blk[0] | ((uint32_t) blk[1] << 8);
    const uint32_t subs   = (uint32_t) blk[2] | ((uint32_t) blk[3] << 8);
    const float s = tq_cu_bf16_to_fp32(s_bits);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        y[r] = tq_fmul(t.sub[(subs >> (4 * r)) & 15u], cent[tq_cu_index<BITS>(blk + TQ_HEADER_BYTES, lane + 32 * r)]);
    }
    tq_cu_fwht_warp(y, lane);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        y[r] = tq_fmul(tq_fmul(y[r], tq_fmul(TQ_WHT_NORM, tq_cu_sign(t, lane + 32 * r))), s);
    }
}
