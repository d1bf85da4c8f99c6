// TQ3A on the GPU (issue 47): the C codec's tq3a_quantize_block / tq3a_dequantize_block (csrc/codec/tq_codec.c)
// transcribed with the helpers of tq-cuda-codec.cuh, so quantizing gives the codec's bytes exactly.
//
// A block is a head of 256 key values in four groups of their own width (tq_codec.h has the layout): values 0-31 at
// 5 bits, 32-63 at 4, 64-127 at 3, 128-255 at 2, each group normalized, rotated and coded as a tq3 block is. Quantizing
// runs a block on a CTA of 256 threads (thread i holds value i, so warp w is sub-block w: warp 0 is group 0, warp 1
// group 1, warps 2-3 group 2, warps 4-7 group 3); dequantizing on one warp, lane l holding values l + 32r (r = 0..7:
// r 0 group 0, r 1 group 1, r 2-3 group 2, r 4-7 group 3).
#pragma once

#include "tq-cuda-codec.cuh"

struct tq3a_cu_tables {
    float sub[16];
    float cent5[32], cent4[16], cent3[8], cent2[4];     // the groups' codebooks (tq3a_centroids)
    float bound5[31], bound4[15], bound3[7], bound2[3]; // and their cell boundaries (tq3a_boundaries)
    uint32_t signs[8];                                  // TQ3A_SIGNS: bit i negates value i before its group's WHT
};

// Filled from the C codec, the single source of every constant; aborts if a codebook's boundaries are not symmetric
// around a middle 0 (tq_cu_nearest counts on it).
static inline void tq3a_cu_tables_init(tq3a_cu_tables * t) {
    float * cent[TQ3A_GROUPS_N]  = {t->cent5, t->cent4, t->cent3, t->cent2};
    float * bound[TQ3A_GROUPS_N] = {t->bound5, t->bound4, t->bound3, t->bound2};
    bool ok = true;
    for (int g = 0; g < TQ3A_GROUPS_N; ++g) {
        const int levels = 1 << TQ3A_GROUP_BITS[g], nb = levels - 1;
        for (int i = 0; i < levels; ++i) {
            cent[g][i] = tq3a_centroids(g)[i];
        }
        for (int i = 0; i < nb; ++i) {
            bound[g][i] = tq3a_boundaries(g)[i];
        }
        ok = ok && bound[g][nb / 2] == 0.0f;
        for (int b = 0; b < nb; ++b) {
            ok = ok && bound[g][b] == -bound[g][nb - 1 - b];
        }
    }
    for (int i = 0; i < 16; ++i) {
        t->sub[i] = tq_subscales()[i];
        ok = ok && t->sub[i] > 0.0f;
    }
    for (int i = 0; i < 8; ++i) {
        t->signs[i] = TQ3A_SIGNS[i];
    }
    if (!ok) {
        fprintf(stderr, "tq3a_cu_tables_init: the codec's tq3a boundaries are not symmetric around 0\n");
        abort();
    }
}

template <int NT>
static __device__ __forceinline__ void tq3a_cu_tables_load(tq3a_cu_tables & dst, const tq3a_cu_tables & src, int tid) {
    static_assert(sizeof(tq3a_cu_tables) % 4 == 0, "tables: whole words");
    for (int i = tid; i < (int) (sizeof(tq3a_cu_tables) / 4); i += NT) {
        reinterpret_cast<uint32_t *>(&dst)[i] = reinterpret_cast<const uint32_t *>(&src)[i];
    }
}

// Group of sub-block (warp) w, and the group's first value, size and 1/sqrt(size).
static __host__ __device__ constexpr int tq3a_cu_group_of(int w) { return w == 0 ? 0 : w == 1 ? 1 : w < 4 ? 2 : 3; }
static __device__ __forceinline__ int tq3a_cu_group_off(int g) { return g == 0 ? 0 : g == 1 ? 32 : g == 2 ? 64 : 128; }
static __device__ __forceinline__ float tq3a_cu_wht_norm(int g) {
    return g < 2 ? TQ_WHT_NORM_32 : g == 2 ? TQ_WHT_NORM_64 : TQ_WHT_NORM;
}

struct tq3a_cu_qscratch {
    double   d[2][TQ3A_BLOCK];
    float    y[8][33];
    uint8_t  idx[TQ3A_BLOCK];
    uint32_t pick[8];
    uint16_t scale[TQ3A_GROUPS_N];
};

// The canonical double sum of group g's terms s[off..off+n) (tq_codec.c, tq_sum_canonical over the group), run by
// one warp of the group; every lane returns it.
static __device__ __forceinline__ double tq3a_cu_group_sum(const double * s, int g, int lane) {
    const int off = tq3a_cu_group_off(g);
    return g < 2 ? tq_cu_canon_sum<32>(s + off, lane) : g == 2 ? tq_cu_canon_sum<64>(s + off, lane)
                                                               : tq_cu_canon_sum<128>(s + off, lane);
}

// Quantizes one block with a CTA of 256 threads (every thread must call it; it synchronizes the CTA); out: the
// block's 104 bytes (any alignment).
static __device__ void tq3a_cu_quantize_block(const tq3a_cu_tables & t, float x, uint8_t * out, tq3a_cu_qscratch & sm,
                                              int tid) {
    const int w = tid >> 5, lane = tid & 31;
    const int g = tq3a_cu_group_of(w);
    const float * cent  = g == 0 ? t.cent5 : g == 1 ? t.cent4 : g == 2 ? t.cent3 : t.cent2;
    const float * bound = g == 0 ? t.bound5 : g == 1 ? t.bound4 : g == 2 ? t.bound3 : t.bound2;

    sm.d[0][tid] = __dmul_rn(tq_f2d(x), tq_f2d(x));
    __syncthreads();
    const double ss = tq3a_cu_group_sum(sm.d[0], g, lane); // every warp of the group the same sum
    // any NaN or Inf in the block poisons every group (the codec's memset, then four NaN scales)
    const bool finite = __syncthreads_and(isfinite(ss)) != 0;

    uint32_t idx = 0, pick = 0;
    if (!finite) {
        if (tid < TQ3A_GROUPS_N) {
            sm.scale[tid] = tq_cu_fp32_to_bf16(__uint_as_float(0x7fc00000u));
        }
    } else {
        const double norm = __dsqrt_rn(ss);
        float y = norm > 0.0 ? tq_d2f(__ddiv_rn(tq_f2d(x), norm)) : 0.0f;
        y = tq_fmul(y, (t.signs[tid >> 5] >> (tid & 31)) & 1u ? -1.0f : 1.0f);
        // the codec's butterflies: strides 1..16 inside the warp, then 32 (groups 2 and 3) and 64 (group 3) across
        // the group's warps through shared memory (its warps start at a multiple of their count, so w ^ hw stays in)
#pragma unroll
        for (int h = 1; h < 32; h <<= 1) {
            y = tq_cu_wht_lane_stage(y, lane, h);
        }
#pragma unroll
        for (int hw = 1; hw <= 2; hw <<= 1) {
            sm.y[w][lane] = y;
            __syncthreads();
            if ((g == 2 && hw == 1) || g == 3) {
                const float o = sm.y[w ^ hw][lane];
                y = (w & hw) ? tq_fsub(o, y) : tq_fadd(y, o);
            }
            __syncthreads();
        }
        y = tq_fmul(y, tq3a_cu_wht_norm(g));
        sm.y[w][lane] = y;
        __syncthreads();

        // the multiplier of this warp's sub-block, then this thread's index under it
        if (g == 0) {
            pick = tq_cu_pick_sub32<15>(sm.y[w], cent, bound, t.sub, lane);
            idx = tq_cu_nearest_scaled<15>(y, t.sub[pick], bound);
        } else if (g == 1) {
            pick = tq_cu_pick_sub32<7>(sm.y[w], cent, bound, t.sub, lane);
            idx = tq_cu_nearest_scaled<7>(y, t.sub[pick], bound);
        } else if (g == 2) {
            pick = tq_cu_pick_sub32<3>(sm.y[w], cent, bound, t.sub, lane);
            idx = tq_cu_nearest_scaled<3>(y, t.sub[pick], bound);
        } else {
            pick = tq_cu_pick_sub32<1>(sm.y[w], cent, bound, t.sub, lane);
            idx = tq_cu_nearest_scaled<1>(y, t.sub[pick], bound);
        }

        // each group's least-squares scale: the codec's canonical double sums over the group, on its first warp
        const double c = tq_f2d(tq_fmul(t.sub[pick], cent[idx]));
        sm.d[0][tid] = __dmul_rn(tq_f2d(y), c);
        sm.d[1][tid] = __dmul_rn(c, c);
        __syncthreads();
        if (w == (g < 2 ? g : g == 2 ? 2 : 4)) {
            const int off = tq3a_cu_group_off(g);
            double yc, cc;
            if (g < 2) {
                tq_cu_canon_sum2<32>(sm.d[0] + off, sm.d[1] + off, lane, yc, cc);
            } else if (g == 2) {
                tq_cu_canon_sum2<64>(sm.d[0] + off, sm.d[1] + off, lane, yc, cc);
            } else {
                tq_cu_canon_sum2<128>(sm.d[0] + off, sm.d[1] + off, lane, yc, cc);
            }
            double s = __dmul_rn(norm, __ddiv_rn(yc, cc)); // cc > 0: no centroid is zero
            if (s > tq_f2d(TQ3A_SCALE_MAX)) {
                s = tq_f2d(TQ3A_SCALE_MAX);
            }
            if (lane == 0) {
                sm.scale[g] = tq_cu_fp32_to_bf16(tq_d2f(s));
            }
        }
    }

    sm.idx[tid] = (uint8_t) idx;
    if (lane == 0) {
        sm.pick[w] = pick;
    }
    __syncthreads();
    if (tid < 4) { // group 0: 8 indices of 5 bits in each 40-bit word
        uint64_t wd = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            wd |= (uint64_t) (sm.idx[8 * tid + j] & 31u) << (5 * j);
        }
#pragma unroll
        for (int b = 0; b < 5; ++b) {
            out[12 + 5 * tid + b] = (uint8_t) ((wd >> (8 * b)) & 0xffu);
        }
    } else if (tid < 20) { // group 1: byte j holds index j and j + 16
        const int j = tid - 4;
        out[32 + j] = (uint8_t) ((sm.idx[32 + j] & 15u) | ((sm.idx[48 + j] & 15u) << 4));
    } else if (tid < 28) { // group 2: 8 indices of 3 bits in each 3 bytes, as tq3
        const int b = tid - 20;
        uint32_t wd = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            wd |= (uint32_t) (sm.idx[64 + 8 * b + j] & 7u) << (3 * j);
        }
        out[48 + 3 * b + 0] = (uint8_t) (wd & 0xffu);
        out[48 + 3 * b + 1] = (uint8_t) ((wd >> 8) & 0xffu);
        out[48 + 3 * b + 2] = (uint8_t) ((wd >> 16) & 0xffu);
    } else if (tid < 60) { // group 3: byte j holds index j + 32k at bits 2k
        const int j = tid - 28;
        out[72 + j] = (uint8_t) ((sm.idx[128 + j] & 3u) | ((sm.idx[160 + j] & 3u) << 2) |
                                 ((sm.idx[192 + j] & 3u) << 4) | ((sm.idx[224 + j] & 3u) << 6));
    } else if (tid < 60 + TQ3A_GROUPS_N) { // the four bf16 scales
        const int gi = tid - 60;
        out[2 * gi] = (uint8_t) (sm.scale[gi] & 0xffu);
        out[2 * gi + 1] = (uint8_t) (sm.scale[gi] >> 8);
    } else if (tid == 64) { // the eight multipliers
        uint32_t subs = 0;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            subs |= sm.pick[k] << (4 * k);
        }
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            out[8 + b] = (uint8_t) ((subs >> (8 * b)) & 0xffu);
        }
    }
}

// Index of value i of group g from the block's bytes (tq_codec.c, tq3a_unpack).
static __device__ __forceinline__ uint32_t tq3a_cu_index(const uint8_t * blk, int g, int i) {
    if (g == 0) { // one little-endian bit stream of 5-bit indices (the 40-bit words back to back)
        const int bit = 5 * i;
        const uint32_t v = (uint32_t) blk[12 + (bit >> 3)] | ((uint32_t) blk[12 + (bit >> 3) + 1] << 8);
        return (v >> (bit & 7)) & 31u;
    }
    if (g == 1) {
        return i < 16 ? (blk[32 + i] & 15u) : (blk[32 + i - 16] >> 4);
    }
    if (g == 2) {
        return tq_cu_index<3>(blk + 48, i);
    }
    return (blk[72 + (i & 31)] >> (2 * (i >> 5))) & 3u;
}

// Dequantizes one block into y[r] = value lane + 32r (the codec's tq3a_dequantize_block: each group's c' = m * c,
// its WHT, times 1/sqrt(n) and the sign, times the scale, in that order).
static __device__ __forceinline__ void tq3a_cu_dequantize_block(const tq3a_cu_tables & t, const uint8_t * blk,
                                                                float y[8], int lane) {
    const uint32_t subs = (uint32_t) blk[8] | ((uint32_t) blk[9] << 8) | ((uint32_t) blk[10] << 16) |
                          ((uint32_t) blk[11] << 24);
#pragma unroll
    for (int r = 0; r < 8; ++r) {
        const int g = tq3a_cu_group_of(r);
        const float * cent = g == 0 ? t.cent5 : g == 1 ? t.cent4 : g == 2 ? t.cent3 : t.cent2;
        y[r] = tq_fmul(t.sub[(subs >> (4 * r)) & 15u], cent[tq3a_cu_index(blk, g, lane + 32 * r - tq3a_cu_group_off(g))]);
    }
#pragma unroll
    for (int h = 1; h < 32; h <<= 1) { // strides 1..16: every group across the lanes
        y[0] = tq_cu_wht_lane_stage(y[0], lane, h);
        y[1] = tq_cu_wht_lane_stage(y[1], lane, h);
        y[2] = tq_cu_wht_lane_stage(y[2], lane, h);
        y[3] = tq_cu_wht_lane_stage(y[3], lane, h);
        y[4] = tq_cu_wht_lane_stage(y[4], lane, h);
        y[5] = tq_cu_wht_lane_stage(y[5], lane, h);
        y[6] = tq_cu_wht_lane_stage(y[6], lane, h);
        y[7] = tq_cu_wht_lane_stage(y[7], lane, h);
    }
    { // stride 32 in registers: group 2 (r 2, 3) and group 3 (r 4, 5 and 6, 7)
        float a = y[2], b = y[3];
        y[2] = tq_fadd(a, b); y[3] = tq_fsub(a, b);
        a = y[4]; b = y[5];
        y[4] = tq_fadd(a, b); y[5] = tq_fsub(a, b);
        a = y[6]; b = y[7];
        y[6] = tq_fadd(a, b); y[7] = tq_fsub(a, b);
        // stride 64: group 3 (r 4, 6 and 5, 7)
        a = y[4]; b = y[6];
        y[4] = tq_fadd(a, b); y[6] = tq_fsub(a, b);
        a = y[5]; b = y[7];
        y[5] = tq_fadd(a, b); y[7] = tq_fsub(a, b);
    }
#pragma unroll
    for (int r = 0; r < 8; ++r) {
        const int g = tq3a_cu_group_of(r);
        const float sign = (t.signs[r] >> lane) & 1u ? -1.0f : 1.0f;
        const float s = tq_cu_bf16_to_fp32((uint32_t) blk[2 * g] | ((uint32_t) blk[2 * g + 1] << 8));
        y[r] = tq_fmul(tq_fmul(y[r], tq_fmul(tq3a_cu_wht_norm(g), sign)), s);
    }
}
