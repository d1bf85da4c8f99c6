// TurboQuant codec on the GPU: the C codec (csrc/codec/tq_codec.c) transcribed to one warp per 128-value block.
//
// Quantizing must give the C codec's bytes exactly, so every float operation here is the codec's operation in
// the codec's order, written as inline PTX or _rn intrinsics: ggml-cuda builds with -use_fast_math, which would
// otherwise flush subnormals (-ftz) and fuse multiply-adds (-fmad), and either changes bytes. The tables come
// from the codec at run time (tq_cu_tables_init), so there is one copy of every constant.
//
// Quantizing runs a block on a CTA of 128 threads (thread i holds value i); dequantizing on one warp, where lane l
// holds the values l, l + 32, l + 64, l + 96 (value l + 32r is value l of sub-block r).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#include "tq_codec.h"

// Programmatic dependent launch (tq_launch in ggml-tq-cuda.cuh): a kernel launched with the attribute may start
// while its predecessor still runs, so it must call tq_pdl_wait() before it reads or writes memory of the graph
// (before: only its parameters and shared memory). tq_pdl_trigger() lets the next kernel launch; that one still
// waits for this one to finish. Both are no-ops in a plain launch.
static __device__ __forceinline__ void tq_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && CUDART_VERSION >= 11080
    cudaGridDependencySynchronize();
#endif
}
static __device__ __forceinline__ void tq_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && CUDART_VERSION >= 11080
    cudaTriggerProgrammaticLaunchCompletion();
#endif
}

struct tq_cu_tables {
    float cent3[8];
    float cent4[16];
    float bound3[7];
    float bound4[15];
    float sub[16];
    uint32_t signs[4];
    // the 64-value blocks (TQ3_64 / TQ4_64): the d = 64 codebooks and their own rotation's signs
    float cent3_64[8];
    float cent4_64[16];
    float bound3_64[7];
    float bound4_64[15];
    uint32_t signs64[2];
    // the 96-value blocks (TQ3_96 / TQ4_96): the d = 96 codebooks and their rotation's signs
    float cent3_96[8];
    float cent4_96[16];
    float bound3_96[7];
    float bound4_96[15];
    uint32_t signs96[3];
};

// Filled from the C codec, the single source of every constant.
static inline void tq_cu_tables_init(tq_cu_tables * t) {
    for (int i = 0; i < 8; ++i) {
        t->cent3[i]    = tq_centroids(3)[i];
        t->cent3_64[i] = tq_centroids_n(3, TQ_BLOCK_64)[i];
        t->cent3_96[i] = tq_centroids_n(3, TQ_BLOCK_96)[i];
    }
    for (int i = 0; i < 16; ++i) {
        t->cent4[i]    = tq_centroids(4)[i];
        t->cent4_64[i] = tq_centroids_n(4, TQ_BLOCK_64)[i];
        t->cent4_96[i] = tq_centroids_n(4, TQ_BLOCK_96)[i];
        t->sub[i]      = tq_subscales()[i];
    }
    tq_scaled_boundaries(3, 1.0f, t->bound3); // 1 * b == b: the codec's boundaries exactly
    tq_scaled_boundaries(4, 1.0f, t->bound4);
    tq_scaled_boundaries_n(3, TQ_BLOCK_64, 1.0f, t->bound3_64);
    tq_scaled_boundaries_n(4, TQ_BLOCK_64, 1.0f, t->bound4_64);
    tq_scaled_boundaries_n(3, TQ_BLOCK_96, 1.0f, t->bound3_96);
    tq_scaled_boundaries_n(4, TQ_BLOCK_96, 1.0f, t->bound4_96);
    for (int i = 0; i < 4; ++i) {
        t->signs[i] = TQ_SIGNS[i];
    }
    for (int i = 0; i < 2; ++i) {
        t->signs64[i] = TQ_SIGNS_64[i];
    }
    for (int i = 0; i < 3; ++i) {
        t->signs96[i] = TQ_SIGNS_96[i];
    }
    // tq_cu_nearest counts on symmetric boundaries around a middle 0 and positive multipliers
    const float * bounds[6] = {t->bound3, t->bound4, t->bound3_64, t->bound4_64, t->bound3_96, t->bound4_96};
    bool ok = true;
    for (int k = 0; k < 6; ++k) {
        const int nb = k % 2 ? 15 : 7;
        ok = ok && bounds[k][nb / 2] == 0.0f;
        for (int b = 0; b < nb; ++b) {
            ok = ok && bounds[k][b] == -bounds[k][nb - 1 - b];
        }
    }
    for (int i = 0; i < 16; ++i) {
        ok = ok && t->sub[i] > 0.0f;
    }
    if (!ok) {
        fprintf(stderr, "tq_cu_tables_init: the codec's boundaries are not symmetric around 0\n");
        abort();
    }
}

static __host__ __device__ constexpr int tq_cu_block_bytes(int bits) { return bits == 3 ? TQ3_BLOCK_BYTES : TQ4_BLOCK_BYTES; }
// Bytes of a block of N = 128, 64 or 96 values.
static __host__ __device__ constexpr int tq_cu_block_bytes_n(int bits, int n) {
    return n == TQ_BLOCK      ? tq_cu_block_bytes(bits)
           : n == TQ_BLOCK_64 ? (bits == 3 ? TQ3_64_BLOCK_BYTES : TQ4_64_BLOCK_BYTES)
                              : (bits == 3 ? TQ3_96_BLOCK_BYTES : TQ4_96_BLOCK_BYTES);
}

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

// The codec's tq_nearest (how many of the NB = 2H + 1 scaled boundaries lie strictly below v) from the bit
// patterns ub of the H positive ones, with half the comparisons of a linear count. The boundaries are symmetric
// around a middle 0 (tq_cu_tables_init checks) and the multiplier positive, so the scaled ones are too: positive
// floats order as their bits, and for v <= 0 the boundaries below v are the negative ones -u with u > |v|, H minus
// those with |v| >= u, i.e. bits(|v|) + 1 > bits(u). NaN and -Inf give 0 and +Inf NB, as the linear count.
template <int H>
static __device__ __forceinline__ void tq_cu_scaled_upper(float m, const float * bound, uint32_t (&ub)[H]) {
#pragma unroll
    for (int b = 0; b < H; ++b) {
        ub[b] = __float_as_uint(tq_fmul(m, bound[H + 1 + b]));
    }
}
template <int H>
static __device__ __forceinline__ uint32_t tq_cu_nearest(float v, const uint32_t (&ub)[H]) {
    const bool pos = tq_fgt(v, 0.0f);
    const uint32_t e = (__float_as_uint(v) & 0x7fffffffu) + (pos ? 0u : 1u);
    uint32_t c = 0;
#pragma unroll
    for (int b = 0; b < H; ++b) {
        c += e > ub[b] ? 1u : 0u;
    }
    return pos ? H + 1 + c : H - c;
}
// One value against the boundaries scaled by m (a thread's own index once its sub-block's multiplier is picked).
template <int H>
static __device__ __forceinline__ uint32_t tq_cu_nearest_scaled(float v, float m, const float * bound) {
    uint32_t ub[H];
    tq_cu_scaled_upper(m, bound, ub);
    return tq_cu_nearest(v, ub);
}
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
static __device__ __forceinline__ float tq_cu_sign64(const tq_cu_tables & t, int i) {
    return (t.signs64[i >> 5] >> (i & 31)) & 1u ? -1.0f : 1.0f;
}
static __device__ __forceinline__ float tq_cu_sign96(const tq_cu_tables & t, int i) {
    return (t.signs96[i >> 5] >> (i & 31)) & 1u ? -1.0f : 1.0f;
}

// The 96-point rotation's mix of the three 32-value thirds (tq_codec.c, tq_mix3): u[a] = value b of third a.
static __device__ __forceinline__ void tq_cu_mix3(float u[3]) {
    const float u0 = u[0], u1 = u[1], u2 = u[2];
    u[0] = tq_fadd(tq_fadd(u0, tq_fmul(2.0f, u1)), tq_fmul(2.0f, u2));
    u[1] = tq_fsub(tq_fadd(tq_fmul(2.0f, u0), u1), tq_fmul(2.0f, u2));
    u[2] = tq_fadd(tq_fsub(tq_fmul(2.0f, u0), tq_fmul(2.0f, u1)), u2);
}

// One butterfly stage of stride h < 32 across the lanes of a warp: the lower lane of each pair keeps a + b, the
// upper one a - b (a: the lower lane's value).
static __device__ __forceinline__ float tq_cu_wht_lane_stage(float v, int lane, int h) {
    const float o = __shfl_xor_sync(0xffffffffu, v, h);
    return (lane & h) ? tq_fsub(o, v) : tq_fadd(v, o);
}

// The 96-point rotation's unnormalized transform (tq_codec.c, tq_transform) of a warp's 96 values v[r] = value
// lane + 32r: a 32-point WHT of each third across the lanes, then the mix in registers.
static __device__ __forceinline__ void tq_cu_transform96_warp(float v[3], int lane) {
#pragma unroll
    for (int h = 1; h < 32; h <<= 1) {
#pragma unroll
        for (int r = 0; r < 3; ++r) {
            v[r] = tq_cu_wht_lane_stage(v[r], lane, h);
        }
    }
    tq_cu_mix3(v);
}

// In-place unnormalized WHT of the warp's 128 values v[r] = value lane + 32r (the codec's butterflies:
// each stage is a fixed set of a+b / a-b pairs, so the order the lanes run them in cannot change a bit).
static __device__ __forceinline__ void tq_cu_fwht_warp(float v[4], int lane) {
#pragma unroll
    for (int h = 1; h < 32; h <<= 1) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            v[r] = tq_cu_wht_lane_stage(v[r], lane, h);
        }
    }
    float a = v[0], b = v[1], c = v[2], d = v[3];
    v[0] = tq_fadd(a, b); v[1] = tq_fsub(a, b); v[2] = tq_fadd(c, d); v[3] = tq_fsub(c, d);
    a = v[0]; b = v[1]; c = v[2]; d = v[3];
    v[0] = tq_fadd(a, c); v[2] = tq_fsub(a, c); v[1] = tq_fadd(b, d); v[3] = tq_fsub(b, d);
}

// The same for 64 values v[r] = value lane + 32r (r = 0, 1): strides 1..16 across lanes, 32 in registers.
static __device__ __forceinline__ void tq_cu_fwht_warp64(float v[2], int lane) {
#pragma unroll
    for (int h = 1; h < 32; h <<= 1) {
        v[0] = tq_cu_wht_lane_stage(v[0], lane, h);
        v[1] = tq_cu_wht_lane_stage(v[1], lane, h);
    }
    const float a = v[0], b = v[1];
    v[0] = tq_fadd(a, b);
    v[1] = tq_fsub(a, b);
}

// The codec's canonical double sum (tq_codec.c, tq_sum_canonical) of N terms in shared memory, run by one warp:
// lane l sums terms l, l + 32, ... from 0.0 in sequence, then the xor butterfly over distances 16..1 (lane l adds lane
// l ^ d, which for l < d is the codec's lane[l] + lane[l + d]: IEEE addition is commutative). Every lane returns the
// sum. Two sums side by side: the least-squares scale's numerator and denominator.
template <int N>
static __device__ __forceinline__ double tq_cu_canon_sum(const double * s, int lane) {
    double acc = 0.0;
#pragma unroll
    for (int i = 0; i < N / 32; ++i) {
        acc = __dadd_rn(acc, s[lane + 32 * i]);
    }
#pragma unroll
    for (int d = 16; d >= 1; d >>= 1) {
        acc = __dadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, d));
    }
    return acc;
}
template <int N>
static __device__ __forceinline__ void tq_cu_canon_sum2(const double * s, const double * t, int lane, double & a,
                                                        double & b) {
    a = 0.0;
    b = 0.0;
#pragma unroll
    for (int i = 0; i < N / 32; ++i) {
        a = __dadd_rn(a, s[lane + 32 * i]);
        b = __dadd_rn(b, t[lane + 32 * i]);
    }
#pragma unroll
    for (int d = 16; d >= 1; d >>= 1) {
        const double ao = __shfl_xor_sync(0xffffffffu, a, d);
        const double bo = __shfl_xor_sync(0xffffffffu, b, d);
        a = __dadd_rn(a, ao);
        b = __dadd_rn(b, bo);
    }
}

// The multiplier of one sub-block of 32 rotated values ys (shared memory), picked by one warp as the codec's
// tq_pick_book does: lanes 2j and 2j + 1 sum the even and odd canonical accumulators of multiplier j, then an
// (error, j) minimum over the warp picks the codec's winner (the first j with the smallest error). Every lane returns
// it. H: the positive boundaries of the codebook (2H + 1 in all).
template <int H>
static __device__ __forceinline__ uint32_t tq_cu_pick_sub32(const float * ys, const float * cent, const float * bound,
                                                            const float * sub, int lane) {
    const uint32_t j = (uint32_t) lane >> 1;
    const int half = lane & 1;
    const float m = sub[j];
    uint32_t ub[H];
    tq_cu_scaled_upper(m, bound, ub);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}; // canonical accumulator 2a + half
    float vs[TQ_SUBBLOCK / 2]; // this lane's 16 values loaded first, so the loads overlap (NOTES.md v23)
#pragma unroll
    for (int q = 0; q < TQ_SUBBLOCK / 2; ++q) {
        vs[q] = ys[2 * q + half];
    }
    uint32_t ks[TQ_SUBBLOCK / 2];
#pragma unroll
    for (int q = 0; q < TQ_SUBBLOCK / 2; ++q) {
        ks[q] = tq_cu_nearest(vs[q], ub);
    }
#pragma unroll
    for (int q = 0; q < TQ_SUBBLOCK / 2; ++q) { // value 2q + half: canonical accumulator q % 4
        const float d = tq_fsub(vs[q], tq_fmul(m, cent[ks[q]]));
        acc[q & 3] = tq_fadd(acc[q & 3], tq_fmul(d, d));
    }
    // ((l0+l4)+(l2+l6)) on even lanes, ((l1+l5)+(l3+l7)) on odd lanes, then even + odd
    const float part = tq_fadd(tq_fadd(acc[0], acc[2]), tq_fadd(acc[1], acc[3]));
    const float other = __shfl_xor_sync(0xffffffffu, part, 1);
    float err = half ? tq_fadd(other, part) : tq_fadd(part, other);
    uint32_t jb = j;
#pragma unroll
    for (int o = 2; o < 32; o <<= 1) {
        const float eo = __shfl_xor_sync(0xffffffffu, err, o);
        const uint32_t jo = __shfl_xor_sync(0xffffffffu, jb, o);
        if (tq_flt(eo, err) || (!tq_flt(err, eo) && jo < jb)) {
            err = eo;
            jb  = jo;
        }
    }
    return jb;
}

// Shared memory of one block's quantization (one CTA of 128 threads per block).
struct tq_cu_qscratch {
    double   d[2][TQ_BLOCK]; // products for the codec's double sums
    float    y[4][33];       // rotated values by sub-block (padded: the search's two lanes of a pair hit other banks)
    uint8_t  idx[TQ_BLOCK];
    uint32_t pick[4];
    double   bcast;
};

// The words of the tables that quantizing an N-value block reads: for 128 values the ones before the 64-value
// codebooks (66 of 183: the copy of the rest cost the write ~0.3 us, NOTES.md v23), else all.
template <int N>
static __host__ __device__ constexpr int tq_cu_table_words() {
    return N == TQ_BLOCK ? (int) (offsetof(tq_cu_tables, cent3_64) / 4) : (int) (sizeof(tq_cu_tables) / 4);
}

// Copies the tables into shared memory, a word per thread per step (a by-value kernel parameter: __grid_constant__);
// WORDS: only the first ones (tq_cu_table_words: what a quantizer of one block size reads).
template <int NT = TQ_BLOCK, int WORDS = (int) (sizeof(tq_cu_tables) / 4)>
static __device__ __forceinline__ void tq_cu_tables_load(tq_cu_tables & dst, const tq_cu_tables & src, int tid) {
    static_assert(sizeof(tq_cu_tables) % 4 == 0, "tables: whole words");
#pragma unroll
    for (int i = tid; i < WORDS; i += NT) {
        reinterpret_cast<uint32_t *>(&dst)[i] = reinterpret_cast<const uint32_t *>(&src)[i];
    }
}

// Quantizes one block with a CTA of 128 threads: thread i holds value i (its warp is sub-block i / 32). Every
// thread of the CTA must call it (it synchronizes the CTA). out: the block's bytes (any alignment).
// The multiplier search runs in parallel: in warp r, lanes 2j and 2j + 1 sum the even and odd canonical
// accumulators of multiplier j for sub-block r, then a (error, j) minimum over the warp picks the codec's winner
// (the first j with the smallest error). The double sums run in the codec's canonical order: the sum of squares on
// every warp (the same sum, so no broadcast), the least-squares scale's on warp 0.
template <int BITS>
static __device__ void tq_cu_quantize_block(const tq_cu_tables & t, float x, uint8_t * out, tq_cu_qscratch & sm,
                                            int tid) {
    constexpr int NB = (1 << BITS) - 1;
    const float * cent  = BITS == 3 ? t.cent3 : t.cent4;
    const float * bound = BITS == 3 ? t.bound3 : t.bound4;
    const int w = tid >> 5, lane = tid & 31;

    sm.d[0][tid] = __dmul_rn(tq_f2d(x), tq_f2d(x));
    __syncthreads();
    const double ss = tq_cu_canon_sum<TQ_BLOCK>(sm.d[0], lane); // every warp the same sum: no broadcast

    uint32_t idx = 0, pick = 0;
    uint16_t scale_bits = 0;
    if (!isfinite(ss)) { // uniform over the CTA
        scale_bits = tq_cu_fp32_to_bf16(__uint_as_float(0x7fc00000u));
    } else {
        const double norm = __dsqrt_rn(ss);
        float y = norm > 0.0 ? tq_d2f(__ddiv_rn(tq_f2d(x), norm)) : 0.0f;
        y = tq_fmul(y, tq_cu_sign(t, tid));
        // the codec's butterflies: strides 1..16 inside the warp, 32 and 64 across warps through shared memory
#pragma unroll
        for (int h = 1; h < 32; h <<= 1) {
            y = tq_cu_wht_lane_stage(y, lane, h);
        }
#pragma unroll
        for (int hw = 1; hw <= 2; hw <<= 1) {
            sm.y[w][lane] = y;
            __syncthreads();
            const float o = sm.y[w ^ hw][lane];
            y = (w & hw) ? tq_fsub(o, y) : tq_fadd(y, o);
            __syncthreads();
        }
        y = tq_fmul(y, TQ_WHT_NORM);
        sm.y[w][lane] = y;
        __syncthreads();

        pick = tq_cu_pick_sub32<NB / 2>(sm.y[w], cent, bound, t.sub, lane);
        idx = tq_cu_nearest_scaled<NB / 2>(y, t.sub[pick], bound);

        // least-squares scale: the codec's canonical double sums over the block (exact products)
        const double c = tq_f2d(tq_fmul(t.sub[pick], cent[idx]));
        sm.d[0][tid] = __dmul_rn(tq_f2d(y), c);
        sm.d[1][tid] = __dmul_rn(c, c);
        __syncthreads();
        if (w == 0) {
            double yc, cc;
            tq_cu_canon_sum2<TQ_BLOCK>(sm.d[0], sm.d[1], lane, yc, cc);
            double s = __dmul_rn(norm, __ddiv_rn(yc, cc));
            if (s > tq_f2d(TQ_SCALE_MAX)) { // TQ_SCALE_MAX, as the codec clamps (decoded values stay finite)
                s = tq_f2d(TQ_SCALE_MAX);
            }
            scale_bits = tq_cu_fp32_to_bf16(tq_d2f(s));
        }
    }

    sm.idx[tid] = (uint8_t) idx;
    if (lane == 0) {
        sm.pick[w] = pick;
    }
    __syncthreads();
    if (BITS == 3) {
        if (tid < 16) {
            uint32_t wd = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                wd |= (uint32_t) (sm.idx[8 * tid + j] & 7u) << (3 * j);
            }
            out[TQ_HEADER_BYTES + 3 * tid + 0] = (uint8_t) (wd & 0xffu);
            out[TQ_HEADER_BYTES + 3 * tid + 1] = (uint8_t) ((wd >> 8) & 0xffu);
            out[TQ_HEADER_BYTES + 3 * tid + 2] = (uint8_t) ((wd >> 16) & 0xffu);
        }
    } else if (tid < 64) {
        out[TQ_HEADER_BYTES + tid] = (uint8_t) ((sm.idx[tid] & 15u) | ((sm.idx[tid + 64] & 15u) << 4));
    }
    if (tid == 0) {
        const uint32_t subs = sm.pick[0] | sm.pick[1] << 4 | sm.pick[2] << 8 | sm.pick[3] << 12;
        out[0] = (uint8_t) (scale_bits & 0xffu);
        out[1] = (uint8_t) (scale_bits >> 8);
        out[2] = (uint8_t) (subs & 0xffu);
        out[3] = (uint8_t) (subs >> 8);
    }
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

// ---------------------------------------------------------------------------------------------------------
// 64-value blocks (TQ3_64 / TQ4_64): the same algorithm on a CTA of 64 threads (thread i holds value i; sub-block
// i / 16, so warp w holds sub-blocks 2w and 2w + 1) and, for dequantizing, a warp with lane l holding values l and
// l + 32.

// Quantizes one 64-value block with a CTA of 64 threads (every thread must call it). The multiplier search: in
// warp w, lane l tries multiplier l & 15 on sub-block 2w + (l >> 4), summing its 16 squared errors in the codec's
// canonical order (accumulator i & 7, then the fixed tree), and a 16-lane (error, j) minimum picks the winner.
template <int BITS>
static __device__ void tq_cu_quantize_block64(const tq_cu_tables & t, float x, uint8_t * out, tq_cu_qscratch & sm,
                                              int tid) {
    constexpr int NB = (1 << BITS) - 1;
    const float * cent  = BITS == 3 ? t.cent3_64 : t.cent4_64;
    const float * bound = BITS == 3 ? t.bound3_64 : t.bound4_64;
    const int w = tid >> 5, lane = tid & 31;

    sm.d[0][tid] = __dmul_rn(tq_f2d(x), tq_f2d(x));
    __syncthreads();
    if (w == 0) {
        const double ss0 = tq_cu_canon_sum<TQ_BLOCK_64>(sm.d[0], lane);
        if (lane == 0) {
            sm.bcast = ss0;
        }
    }
    __syncthreads();
    const double ss = sm.bcast;

    uint32_t idx = 0, pick = 0;
    uint16_t scale_bits = 0;
    if (!isfinite(ss)) { // uniform over the CTA
        scale_bits = tq_cu_fp32_to_bf16(__uint_as_float(0x7fc00000u));
    } else {
        const double norm = __dsqrt_rn(ss);
        float y = norm > 0.0 ? tq_d2f(__ddiv_rn(tq_f2d(x), norm)) : 0.0f;
        y = tq_fmul(y, tq_cu_sign64(t, tid));
#pragma unroll
        for (int h = 1; h < 32; h <<= 1) {
            y = tq_cu_wht_lane_stage(y, lane, h);
        }
        sm.y[w][lane] = y; // stride 32: across the two warps
        __syncthreads();
        const float o = sm.y[w ^ 1][lane];
        y = w ? tq_fsub(o, y) : tq_fadd(y, o);
        __syncthreads();
        y = tq_fmul(y, TQ_WHT_NORM_64);
        sm.y[w][lane] = y;
        __syncthreads();

        {
            const uint32_t j = (uint32_t) lane & 15u;
            const float * ys = &sm.y[w][lane & 16]; // this lane's sub-block: 16 values
            const float m = t.sub[j];
            uint32_t ub[NB / 2];
            tq_cu_scaled_upper(m, bound, ub);
            float acc[8];
#pragma unroll
            for (int i = 0; i < 16; ++i) {
                const float v = ys[i];
                const uint32_t k = tq_cu_nearest(v, ub);
                const float d = tq_fsub(v, tq_fmul(m, cent[k]));
                acc[i & 7] = i < 8 ? tq_fadd(0.0f, tq_fmul(d, d)) : tq_fadd(acc[i & 7], tq_fmul(d, d));
            }
            float err = tq_fadd(tq_fadd(tq_fadd(acc[0], acc[4]), tq_fadd(acc[2], acc[6])),
                                tq_fadd(tq_fadd(acc[1], acc[5]), tq_fadd(acc[3], acc[7])));
            uint32_t jb = j;
#pragma unroll
            for (int o2 = 1; o2 < 16; o2 <<= 1) {
                const float eo = __shfl_xor_sync(0xffffffffu, err, o2);
                const uint32_t jo = __shfl_xor_sync(0xffffffffu, jb, o2);
                if (tq_flt(eo, err) || (!tq_flt(err, eo) && jo < jb)) {
                    err = eo;
                    jb  = jo;
                }
            }
            pick = jb; // the winner of sub-block 2w + (lane >> 4) = tid >> 4: this thread's own value's
        }
        idx = tq_cu_nearest_scaled<NB / 2>(y, t.sub[pick], bound);

        const double c = tq_f2d(tq_fmul(t.sub[pick], cent[idx]));
        sm.d[0][tid] = __dmul_rn(tq_f2d(y), c);
        sm.d[1][tid] = __dmul_rn(c, c);
        __syncthreads();
        if (w == 0) {
            double yc, cc;
            tq_cu_canon_sum2<TQ_BLOCK_64>(sm.d[0], sm.d[1], lane, yc, cc);
            double s = __dmul_rn(norm, __ddiv_rn(yc, cc));
            if (s > tq_f2d(TQ_SCALE_MAX)) {
                s = tq_f2d(TQ_SCALE_MAX);
            }
            scale_bits = tq_cu_fp32_to_bf16(tq_d2f(s));
        }
    }

    sm.idx[tid] = (uint8_t) idx;
    if ((tid & 15) == 0) {
        sm.pick[tid >> 4] = pick;
    }
    __syncthreads();
    if (BITS == 3) {
        if (tid < 8) {
            uint32_t wd = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                wd |= (uint32_t) (sm.idx[8 * tid + j] & 7u) << (3 * j);
            }
            out[TQ_HEADER_BYTES + 3 * tid + 0] = (uint8_t) (wd & 0xffu);
            out[TQ_HEADER_BYTES + 3 * tid + 1] = (uint8_t) ((wd >> 8) & 0xffu);
            out[TQ_HEADER_BYTES + 3 * tid + 2] = (uint8_t) ((wd >> 16) & 0xffu);
        }
    } else if (tid < 32) {
        out[TQ_HEADER_BYTES + tid] = (uint8_t) ((sm.idx[tid] & 15u) | ((sm.idx[tid + 32] & 15u) << 4));
    }
    if (tid == 0) {
        const uint32_t subs = sm.pick[0] | sm.pick[1] << 4 | sm.pick[2] << 8 | sm.pick[3] << 12;
        out[0] = (uint8_t) (scale_bits & 0xffu);
        out[1] = (uint8_t) (scale_bits >> 8);
        out[2] = (uint8_t) (subs & 0xffu);
        out[3] = (uint8_t) (subs >> 8);
    }
}

// Index of value i (0..63) of a 64-value block from its packed bytes q (after the header).
template <int BITS>
static __device__ __forceinline__ uint32_t tq_cu_index64(const uint8_t * q, int i) {
    if (BITS == 3) {
        return tq_cu_index<3>(q, i); // the same 3-byte groups
    }
    return i < 32 ? (q[i] & 15u) : (q[i - 32] >> 4);
}

// Dequantizes one 64-value block into y[r] = value lane + 32r (the codec's tq_dequantize_block_n(.., 64, ..)).
template <int BITS>
static __device__ __forceinline__ void tq_cu_dequantize_block64(const tq_cu_tables & t, const uint8_t * blk,
                                                                float y[2], int lane) {
    const float * cent = BITS == 3 ? t.cent3_64 : t.cent4_64;
    const uint32_t s_bits = (uint32_t) blk[0] | ((uint32_t) blk[1] << 8);
    const uint32_t subs   = (uint32_t) blk[2] | ((uint32_t) blk[3] << 8);
    const float s = tq_cu_bf16_to_fp32(s_bits);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int i = lane + 32 * r;
        y[r] = tq_fmul(t.sub[(subs >> (4 * (i >> 4))) & 15u], cent[tq_cu_index64<BITS>(blk + TQ_HEADER_BYTES, i)]);
    }
    tq_cu_fwht_warp64(y, lane);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        y[r] = tq_fmul(tq_fmul(y[r], tq_fmul(TQ_WHT_NORM_64, tq_cu_sign64(t, lane + 32 * r))), s);
    }
}

// ---------------------------------------------------------------------------------------------------------
// 96-value blocks (TQ3_96 / TQ4_96): the same algorithm on a CTA of 96 threads (thread i holds value i; warp w holds
// third w of the 96-point rotation, which is a 32-point WHT per warp and then the 3x3 mix across the warps) and, for
// dequantizing, a warp with lane l holding values l, l + 32 and l + 64 (the mix then runs in registers).

// Quantizes one 96-value block with a CTA of 96 threads (every thread must call it). The multiplier search: thread
// t < 64 tries multiplier t & 15 on sub-block t >> 4 (24 values, summed in the codec's canonical order: accumulator
// i & 7, then the fixed tree), and a 16-lane (error, j) minimum picks the winner; warp 2 waits.
template <int BITS>
static __device__ void tq_cu_quantize_block96(const tq_cu_tables & t, float x, uint8_t * out, tq_cu_qscratch & sm,
                                              int tid) {
    constexpr int NB = (1 << BITS) - 1;
    const float * cent  = BITS == 3 ? t.cent3_96 : t.cent4_96;
    const float * bound = BITS == 3 ? t.bound3_96 : t.bound4_96;
    const int w = tid >> 5, lane = tid & 31;

    if (tid < 4) {
        sm.pick[tid] = 0; // a poisoned block keeps multiplier 0
    }
    sm.d[0][tid] = __dmul_rn(tq_f2d(x), tq_f2d(x));
    __syncthreads();
    if (w == 0) {
        const double ss0 = tq_cu_canon_sum<TQ_BLOCK_96>(sm.d[0], lane);
        if (lane == 0) {
            sm.bcast = ss0;
        }
    }
    __syncthreads();
    const double ss = sm.bcast;

    uint32_t idx = 0;
    uint16_t scale_bits = 0;
    if (!isfinite(ss)) { // uniform over the CTA
        scale_bits = tq_cu_fp32_to_bf16(__uint_as_float(0x7fc00000u));
    } else {
        const double norm = __dsqrt_rn(ss);
        float y = norm > 0.0 ? tq_d2f(__ddiv_rn(tq_f2d(x), norm)) : 0.0f;
        y = tq_fmul(y, tq_cu_sign96(t, tid));
#pragma unroll
        for (int h = 1; h < 32; h <<= 1) {
            y = tq_cu_wht_lane_stage(y, lane, h);
        }
        sm.y[w][lane] = y;
        __syncthreads();
        {
            float u[3] = {sm.y[0][lane], sm.y[1][lane], sm.y[2][lane]};
            tq_cu_mix3(u);
            y = u[w];
        }
        __syncthreads();
        y = tq_fmul(y, TQ_WHT_NORM_96);
        sm.y[w][lane] = y;
        __syncthreads();

        if (tid < 64) { // warps 0 and 1: sub-blocks 0, 1 and 2, 3
            const uint32_t j = (uint32_t) tid & 15u;
            const int k = tid >> 4;
            const float m = t.sub[j];
            uint32_t ub[NB / 2];
            tq_cu_scaled_upper(m, bound, ub);
            float acc[8];
#pragma unroll
            for (int i = 0; i < 24; ++i) {
                const int vi = 24 * k + i;
                const float v = sm.y[vi >> 5][vi & 31];
                const uint32_t c = tq_cu_nearest(v, ub);
                const float d = tq_fsub(v, tq_fmul(m, cent[c]));
                acc[i & 7] = i < 8 ? tq_fadd(0.0f, tq_fmul(d, d)) : tq_fadd(acc[i & 7], tq_fmul(d, d));
            }
            float err = tq_fadd(tq_fadd(tq_fadd(acc[0], acc[4]), tq_fadd(acc[2], acc[6])),
                                tq_fadd(tq_fadd(acc[1], acc[5]), tq_fadd(acc[3], acc[7])));
            uint32_t jb = j;
#pragma unroll
            for (int o2 = 1; o2 < 16; o2 <<= 1) {
                const float eo = __shfl_xor_sync(0xffffffffu, err, o2);
                const uint32_t jo = __shfl_xor_sync(0xffffffffu, jb, o2);
                if (tq_flt(eo, err) || (!tq_flt(err, eo) && jo < jb)) {
                    err = eo;
                    jb  = jo;
                }
            }
            if ((tid & 15) == 0) {
                sm.pick[k] = jb;
            }
        }
        __syncthreads();
        const uint32_t pick = sm.pick[tid / 24];
        idx = tq_cu_nearest_scaled<NB / 2>(y, t.sub[pick], bound);

        const double c = tq_f2d(tq_fmul(t.sub[pick], cent[idx]));
        sm.d[0][tid] = __dmul_rn(tq_f2d(y), c);
        sm.d[1][tid] = __dmul_rn(c, c);
        __syncthreads();
        if (w == 0) {
            double yc, cc;
            tq_cu_canon_sum2<TQ_BLOCK_96>(sm.d[0], sm.d[1], lane, yc, cc);
            double s = __dmul_rn(norm, __ddiv_rn(yc, cc));
            if (s > tq_f2d(TQ_SCALE_MAX)) {
                s = tq_f2d(TQ_SCALE_MAX);
            }
            scale_bits = tq_cu_fp32_to_bf16(tq_d2f(s));
        }
    }

    sm.idx[tid] = (uint8_t) idx;
    __syncthreads();
    if (BITS == 3) {
        if (tid < 12) {
            uint32_t wd = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                wd |= (uint32_t) (sm.idx[8 * tid + j] & 7u) << (3 * j);
            }
            out[TQ_HEADER_BYTES + 3 * tid + 0] = (uint8_t) (wd & 0xffu);
            out[TQ_HEADER_BYTES + 3 * tid + 1] = (uint8_t) ((wd >> 8) & 0xffu);
            out[TQ_HEADER_BYTES + 3 * tid + 2] = (uint8_t) ((wd >> 16) & 0xffu);
        }
    } else if (tid < 48) {
        out[TQ_HEADER_BYTES + tid] = (uint8_t) ((sm.idx[tid] & 15u) | ((sm.idx[tid + 48] & 15u) << 4));
    }
    if (tid == 0) {
        const uint32_t subs = sm.pick[0] | sm.pick[1] << 4 | sm.pick[2] << 8 | sm.pick[3] << 12;
        out[0] = (uint8_t) (scale_bits & 0xffu);
        out[1] = (uint8_t) (scale_bits >> 8);
        out[2] = (uint8_t) (subs & 0xffu);
        out[3] = (uint8_t) (subs >> 8);
    }
}

// Index of value i (0..95) of a 96-value block from its packed bytes q (after the header).
template <int BITS>
static __device__ __forceinline__ uint32_t tq_cu_index96(const uint8_t * q, int i) {
    if (BITS == 3) {
        return tq_cu_index<3>(q, i); // groups of 8 in 3 bytes, as the 128-value layout
    }
    return i < 48 ? (q[i] & 15u) : (q[i - 48] >> 4);
}

// Dequantizes one 96-value block into y[r] = value lane + 32r (the codec's tq_dequantize_block_n(bits, 96)).
template <int BITS>
static __device__ __forceinline__ void tq_cu_dequantize_block96(const tq_cu_tables & t, const uint8_t * blk,
                                                                float y[3], int lane) {
    const float * cent = BITS == 3 ? t.cent3_96 : t.cent4_96;
    const uint32_t s_bits = (uint32_t) blk[0] | ((uint32_t) blk[1] << 8);
    const uint32_t subs   = (uint32_t) blk[2] | ((uint32_t) blk[3] << 8);
    const float s = tq_cu_bf16_to_fp32(s_bits);
#pragma unroll
    for (int r = 0; r < 3; ++r) {
        const int i = lane + 32 * r;
        y[r] = tq_fmul(t.sub[(subs >> (4 * (i / 24))) & 15u], cent[tq_cu_index96<BITS>(blk + TQ_HEADER_BYTES, i)]);
    }
    tq_cu_transform96_warp(y, lane);
#pragma unroll
    for (int r = 0; r < 3; ++r) {
        y[r] = tq_fmul(tq_fmul(y[r], tq_fmul(TQ_WHT_NORM_96, tq_cu_sign96(t, lane + 32 * r))), s);
    }
}
