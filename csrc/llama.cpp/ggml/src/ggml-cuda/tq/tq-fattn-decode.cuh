// FLASH_ATTN_EXT decode (a few query rows) with K and/or V stored as TQ3/TQ4, read straight from the cache: the
// device code, free of ggml so that lab/cuda/fa_decode_bench.cu builds it standalone. SIMT kernel (any pair
// with a TQ side) and the merge; the tensor-core kernel for TQ K with TQ V is tq-fattn-mma.cuh.
//
// Split-K ("flash decoding"): a CUDA block owns one KV head of one sequence, all of its GQA query heads (and up
// to 8 query rows: C columns), and one chunk of the cache; a second kernel merges the chunks.
//  - K: the query is rotated once per block (tq_rotate per 128 slice, or per 64 / 96 slice for the 64- / 96-value
//    kinds) and pre-scaled; each key is scored in
//    the rotated domain straight from its codebook indices: s * sum_k m_k * sum_i c[idx_i] * q_rot_i.
//    One thread per key, the query read from shared memory as a broadcast, so one decode serves C columns.
//  - V: rows are never un-rotated: the block accumulates sum_t p_t * s_t * m_k * c[idx] in the rotated domain
//    and the merge kernel applies the inverse rotation once per output row (the sum is linear).
//  - TQ rows are staged through shared memory with coalesced 4-byte cp.async (rows are 4-byte aligned: 52/68 B
//    per block), the next tile's in flight where two buffers fit; f16 K rows per warp through shared memory
//    (16-byte cp.async at head 128), f16/q8_0 V rows are read directly.
#pragma once

#include <cuda_fp16.h>
#include <cuda_pipeline.h>

#include <algorithm>

#include "tq-cuda-codec.cuh"

// The K / V kinds of the decode kernels: f16, q8_0 and the TQ formats (tq_formats.h, in its order).
enum tq_fa_kind {
    TQFA_F16 = 0, TQFA_Q8_0 = 1,
#define TQFA_KIND(name, NAME, ...) TQFA_##NAME,
    TQ_FORMATS(TQFA_KIND)
#undef TQFA_KIND
};

// Values per block of a TQ kind (its rotation size), 0 for f16 / q8_0.
static __host__ __device__ constexpr int tq_fa_block_n(int kind) {
    switch (kind) {
#define TQFA_VALUES_CASE(name, NAME, values, ...) case TQFA_##NAME: return values;
        TQ_FORMATS(TQFA_VALUES_CASE)
#undef TQFA_VALUES_CASE
        default: return 0;
    }
}
// Bits per value of a TQ kind, 0 for f16 / q8_0.
static __host__ __device__ constexpr int tq_fa_bits(int kind) {
    switch (kind) {
#define TQFA_BITS_CASE(name, NAME, values, bits, ...) case TQFA_##NAME: return bits;
        TQ_FORMATS(TQFA_BITS_CASE)
#undef TQFA_BITS_CASE
        default: return 0;
    }
}
// 32-bit words of one TQ block (52 / 68 / 28 / 36 / 40 / 52 bytes).
static __host__ __device__ constexpr int tq_fa_block_words(int kind) {
    switch (kind) {
#define TQFA_WORDS_CASE(name, NAME, values, bits, bytes, ...) case TQFA_##NAME: return bytes / 4;
        TQ_FORMATS(TQFA_WORDS_CASE)
#undef TQFA_WORDS_CASE
        default: return 0;
    }
}
static __host__ __device__ constexpr bool tq_fa_is_tq(int kind) { return tq_fa_block_n(kind) != 0; }
static __host__ __device__ constexpr bool tq_fa_is_tq128(int kind) { return tq_fa_block_n(kind) == 128; }
static __host__ __device__ constexpr bool tq_fa_is_tq64(int kind) { return tq_fa_block_n(kind) == 64; }
static __host__ __device__ constexpr bool tq_fa_is_tq96(int kind) { return tq_fa_block_n(kind) == 96; }
// Whether a K and a V kind can meet: at most one block size (both come from the same head size).
static __host__ __device__ constexpr bool tq_fa_pair_ok(int tk, int tv) {
    return tq_fa_block_n(tk) == 0 || tq_fa_block_n(tv) == 0 || tq_fa_block_n(tk) == tq_fa_block_n(tv);
}
// The kernel's slice width: the rotation size of its TQ side(s) (64, 96 or 128). V is accumulated SW / 32
// coordinates per lane per slice, and the query is rotated per slice.
static __host__ __device__ constexpr int tq_fa_slice(int tk, int tv) {
    return tq_fa_block_n(tk) ? tq_fa_block_n(tk) : tq_fa_block_n(tv) ? tq_fa_block_n(tv) : 128;
}

#define TQ_FA_THREADS 128
#define TQ_FA_TILE    128
#define TQ_FA_MAX_COLS 8
#ifndef TQ_FA_SINGLE_TILES
#define TQ_FA_SINGLE_TILES 2 // the tensor-core kernel runs KV of at most this many tiles in one chunk (measured: NOTES.md)
#endif

struct tq_fa_params {
    const char * Q;
    const char * K;
    const char * V;
    const char * mask;
    float * part;   // [n_chunks][n_cols_total][D]  un-normalized partial outputs
    float2 * ml;    // [n_chunks][n_cols_total]     (running max, sum of exp)
    int64_t nb01, nb02, nb03;
    int64_t nb11, nb12, nb13;
    int64_t nb21, nb22, nb23;
    int64_t nb31, nb32, nb33;
    int ne32, ne33;
    int n_kv, n_q, gqa, n_head, rk3, rv3;
    int chunk_keys, n_groups, tpg, n_cols_total;
    int ncol; // columns per block in the partial-output layout (the decode kernels' C: 1, 2, 4 or 8)
    // single pass (the tensor-core kernel with one chunk): it writes dst itself, no partials, no merge launch;
    // nullptr otherwise
    char * dst;
    int64_t dnb1, dnb2, dnb3;
    const float * sinks;
    // split-K with the merge fused into the tensor-core kernel (nullptr: the merge kernel runs): a counter per
    // (KV head x column group, sequence), 0 between launches; the chunk that finishes last merges its column group's
    // chunks and writes mdst (strides dnb1..3), so a decode step has one launch less per layer (NOTES.md v20)
    unsigned * done; // TQ_FA_DONE_COUNTERS of them in a buffer
    char * mdst;
    float scale, softcap, m0, m1, max_bias;
    int n_head_log2;
    // the tensor-core kernel may read Q and the mask before its PDL wait: its predecessor is the fused K/V write,
    // which triggers only after its own wait, so whatever came before the write (Q's RoPE) is complete
    // (ggml_cuda_tq_try_fuse marks such an FA node)
    int q_early;
    tq_cu_tables tab;
};

#define TQ_FA_DONE_COUNTERS 16384 // a fused-merge counter buffer (64 KB): sequences x KV heads x column groups

// Chunks per (sequence, KV head, column group): enough for ~4 blocks per SM, each a whole number of tiles; with the
// tensor-core kernel, one (its single pass: no partials, no merge launch) when the KV is short, where a block's time
// is its prologue and a few tiles and the merge launch costs more than the parallelism saves, and at most
// TQ_FA_MMA_MAX_CHUNKS: one sequence at 32K ran 128 chunks of 2 tiles, whose merge (a warp per column over all
// chunks) cost more than the blocks saved (NOTES.md v20: 64 chunks 25.0 us, 128 30.5).
#ifndef TQ_FA_MMA_MAX_CHUNKS
#define TQ_FA_MMA_MAX_CHUNKS 64
#endif
static inline int tq_fa_want_chunks(int tiles, int base, int nsm, bool mma) {
    if (mma && tiles <= TQ_FA_SINGLE_TILES) {
        return 1;
    }
    const int want = std::max(1, std::min(tiles, (4 * nsm + base - 1) / base));
    return mma ? std::min(want, TQ_FA_MMA_MAX_CHUNKS) : want;
}

// 4-byte asynchronous copies global -> shared (cp.async on sm_80+, a plain copy before): a tile's loads all in
// flight at once
static __device__ __forceinline__ void tq_fa_cp4(uint32_t * dst, const void * src) {
    __pipeline_memcpy_async(dst, src, 4);
}
static __device__ __forceinline__ void tq_fa_cp_commit() { __pipeline_commit(); }
template <int N> static __device__ __forceinline__ void tq_fa_cp_wait() { __pipeline_wait_prior(N); }

static __device__ __forceinline__ float tq_fa_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;
}
static __device__ __forceinline__ float tq_fa_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

static __device__ __forceinline__ float tq_fa_alibi(const tq_fa_params & p, int h) {
    if (p.max_bias <= 0.0f) {
        return 1.0f;
    }
    return h < p.n_head_log2 ? powf(p.m0, (float) (h + 1)) : powf(p.m1, (float) (2 * (h - p.n_head_log2) + 1));
}

// acc[c] += v * q[c] for the C columns of one coordinate (q: C consecutive floats in shared memory).
template <int C>
static __device__ __forceinline__ void tq_fa_fma_q(float * acc, float v, const float * q) {
    if constexpr (C % 4 == 0) {
#pragma unroll
        for (int c = 0; c < C; c += 4) {
            const float4 q4 = *reinterpret_cast<const float4 *>(q + c);
            acc[c + 0] += v * q4.x;
            acc[c + 1] += v * q4.y;
            acc[c + 2] += v * q4.z;
            acc[c + 3] += v * q4.w;
        }
    } else {
#pragma unroll
        for (int c = 0; c < C; ++c) {
            acc[c] += v * q[c];
        }
    }
}

// The score of one key for the C columns. TQ rows come from shared memory (krow), others from global (kg).
template <int D, int C, int TK>
static __device__ __forceinline__ void tq_fa_score(float * sc, const uint32_t * krow, const char * kg,
                                                   const float * qs, const float * cb) {
#pragma unroll
    for (int c = 0; c < C; ++c) {
        sc[c] = 0.0f;
    }
    if constexpr (tq_fa_is_tq128(TK)) {
        constexpr int BW = tq_fa_block_words(TK);
        const float * cent = tq_fa_bits(TK) == 3 ? cb : cb + 8;
#pragma unroll
        for (int b = 0; b < D / 128; ++b) {
            const uint32_t * blk = krow + b * BW;
            const uint32_t h = blk[0];
            float bsum[C];
#pragma unroll
            for (int c = 0; c < C; ++c) {
                bsum[c] = 0.0f;
            }
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                float a[C];
#pragma unroll
                for (int c = 0; c < C; ++c) {
                    a[c] = 0.0f;
                }
                const float * q = qs + (b * 128 + 32 * k) * C;
                if constexpr (tq_fa_bits(TK) == 3) {
                    const uint32_t w[4] = {blk[1 + 3 * k], blk[2 + 3 * k], blk[3 + 3 * k], 0u};
#pragma unroll
                    for (int i = 0; i < 32; ++i) {
                        const int bit = 3 * i, wi = bit >> 5, sh = bit & 31;
                        const uint32_t bits = sh <= 29 ? (w[wi] >> sh) : __funnelshift_r(w[wi], w[wi + 1], sh);
                        tq_fa_fma_q<C>(a, cent[bits & 7u], q + i * C);
                    }
                } else {
                    const int nib = k >= 2 ? 4 : 0;
#pragma unroll
                    for (int wj = 0; wj < 8; ++wj) {
                        const uint32_t w = blk[1 + 8 * (k & 1) + wj];
#pragma unroll
                        for (int n = 0; n < 4; ++n) {
                            tq_fa_fma_q<C>(a, cent[(w >> (8 * n + nib)) & 15u], q + (4 * wj + n) * C);
                        }
                    }
                }
                const float m = cb[24 + ((h >> (16 + 4 * k)) & 15u)];
#pragma unroll
                for (int c = 0; c < C; ++c) {
                    bsum[c] += m * a[c];
                }
            }
            const float s = tq_cu_bf16_to_fp32(h & 0xffffu);
#pragma unroll
            for (int c = 0; c < C; ++c) {
                sc[c] += s * bsum[c];
            }
        }
    } else if constexpr (tq_fa_is_tq64(TK) || tq_fa_is_tq96(TK)) {
        // 64- and 96-value blocks: sub-blocks of L = 16 / 24 values; cb holds the block size's codebooks here
        constexpr int NBV = tq_fa_block_n(TK), L = NBV / 4, BW = tq_fa_block_words(TK);
        const float * cent = tq_fa_bits(TK) == 3 ? cb : cb + 8;
#pragma unroll
        for (int b = 0; b < D / NBV; ++b) {
            const uint32_t * blk = krow + b * BW;
            const uint32_t h = blk[0];
            float bsum[C];
#pragma unroll
            for (int c = 0; c < C; ++c) {
                bsum[c] = 0.0f;
            }
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                float a[C];
#pragma unroll
                for (int c = 0; c < C; ++c) {
                    a[c] = 0.0f;
                }
                const float * q = qs + (b * NBV + L * k) * C;
                if constexpr (tq_fa_bits(TK) == 3) { // 3L bits from bit 3Lk of the index words
#pragma unroll
                    for (int i = 0; i < L; ++i) {
                        const int bit = 3 * L * k + 3 * i, wi = bit >> 5, sh = bit & 31;
                        const uint32_t bits = sh <= 29 ? (blk[1 + wi] >> sh) : __funnelshift_r(blk[1 + wi], blk[2 + wi], sh);
                        tq_fa_fma_q<C>(a, cent[bits & 7u], q + i * C);
                    }
                } else { // bytes L (k & 1) .. +L-1, low nibbles for sub-blocks 0-1, high for 2-3
                    const int nib = k >= 2 ? 4 : 0;
#pragma unroll
                    for (int wj = 0; wj < L / 4; ++wj) {
                        const uint32_t w = blk[1 + L / 4 * (k & 1) + wj];
#pragma unroll
                        for (int n = 0; n < 4; ++n) {
                            tq_fa_fma_q<C>(a, cent[(w >> (8 * n + nib)) & 15u], q + (4 * wj + n) * C);
                        }
                    }
                }
                const float m = cb[24 + ((h >> (16 + 4 * k)) & 15u)];
#pragma unroll
                for (int c = 0; c < C; ++c) {
                    bsum[c] += m * a[c];
                }
            }
            const float s = tq_cu_bf16_to_fp32(h & 0xffffu);
#pragma unroll
            for (int c = 0; c < C; ++c) {
                sc[c] += s * bsum[c];
            }
        }
    } else if constexpr (TK == TQFA_F16) { // (rows that are all 16-byte aligned go through tq_fa_score_f16_staged)
        const half2 * r = reinterpret_cast<const half2 *>(kg);
#pragma unroll 8
        for (int i = 0; i < D / 2; ++i) {
            const float2 v = __half22float2(r[i]);
            tq_fa_fma_q<C>(sc, v.x, qs + (2 * i) * C);
            tq_fa_fma_q<C>(sc, v.y, qs + (2 * i + 1) * C);
        }
    } else { // q8_0: 34-byte blocks {half d; int8 qs[32]}, 2-byte aligned
#pragma unroll
        for (int blk = 0; blk < D / 32; ++blk) {
            const uint16_t * r = reinterpret_cast<const uint16_t *>(kg + 34 * blk);
            const float d = __half2float(__ushort_as_half(r[0]));
            float a[C];
#pragma unroll
            for (int c = 0; c < C; ++c) {
                a[c] = 0.0f;
            }
#pragma unroll
            for (int i = 0; i < 16; ++i) {
                const uint16_t two = r[1 + i];
                tq_fa_fma_q<C>(a, (float) (int8_t) (two & 0xffu), qs + (blk * 32 + 2 * i) * C);
                tq_fa_fma_q<C>(a, (float) (int8_t) (two >> 8), qs + (blk * 32 + 2 * i + 1) * C);
            }
#pragma unroll
            for (int c = 0; c < C; ++c) {
                sc[c] += d * a[c];
            }
        }
    }
}

// acc[b][j][c] += w[c] * value(coordinate SW b + (SW / 32) lane + j) of one V row (rotated domain for TQ), SW the
// kernel's slice width (tq_fa_slice).
template <int D, int C, int TV, int SW>
static __device__ __forceinline__ void tq_fa_accum_v(float (*acc)[SW / 32][C], const float * pw, const uint32_t * vrow,
                                                     const char * vg, const float * cb, int lane) {
    constexpr int VPL = SW / 32;
#pragma unroll
    for (int b = 0; b < D / SW; ++b) {
        float v[VPL];
        float w[C];
        if constexpr (tq_fa_is_tq128(TV)) {
            constexpr int BW = tq_fa_block_words(TV);
            const uint32_t * blk = vrow + b * BW;
            const uint32_t h = blk[0];
            const float sm = tq_cu_bf16_to_fp32(h & 0xffffu) * cb[24 + ((h >> (16 + 4 * (lane >> 3))) & 15u)];
            if constexpr (tq_fa_bits(TV) == 3) {
                const int bit = 12 * lane;
                const uint32_t bits = __funnelshift_r(blk[1 + (bit >> 5)], blk[2 + (bit >> 5)], bit & 31);
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    v[j] = cb[(bits >> (3 * j)) & 7u];
                }
            } else {
                const uint32_t wd = blk[1 + (lane & 15)] >> (lane >= 16 ? 4 : 0);
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    v[j] = cb[8 + ((wd >> (8 * j)) & 15u)];
                }
            }
#pragma unroll
            for (int c = 0; c < C; ++c) {
                w[c] = pw[c] * sm;
            }
        } else if constexpr (tq_fa_is_tq64(TV)) { // coordinates 2 lane, 2 lane + 1: sub-block lane / 8
            constexpr int BW = tq_fa_block_words(TV);
            const uint32_t * blk = vrow + b * BW;
            const uint32_t h = blk[0];
            const float sm = tq_cu_bf16_to_fp32(h & 0xffffu) * cb[24 + ((h >> (16 + 4 * (lane >> 3))) & 15u)];
            if constexpr (tq_fa_bits(TV) == 3) {
                const int bit = 6 * lane;
                const uint32_t bits = __funnelshift_r(blk[1 + (bit >> 5)], blk[2 + (bit >> 5)], bit & 31);
                v[0] = cb[bits & 7u];
                v[1] = cb[(bits >> 3) & 7u];
            } else {
                const uint32_t wd = blk[1 + ((lane & 15) >> 1)] >> (16 * (lane & 1) + (lane >= 16 ? 4 : 0));
                v[0] = cb[8 + (wd & 15u)];
                v[1] = cb[8 + ((wd >> 8) & 15u)];
            }
#pragma unroll
            for (int c = 0; c < C; ++c) {
                w[c] = pw[c] * sm;
            }
        } else if constexpr (tq_fa_is_tq96(TV)) { // coordinates 3 lane .. 3 lane + 2: sub-block lane / 8
            constexpr int BW = tq_fa_block_words(TV);
            const uint32_t * blk = vrow + b * BW;
            const uint32_t h = blk[0];
            const float sm = tq_cu_bf16_to_fp32(h & 0xffffu) * cb[24 + ((h >> (16 + 4 * (lane >> 3))) & 15u)];
            if constexpr (tq_fa_bits(TV) == 3) {
                const int bit = 9 * lane;
                const uint32_t bits = __funnelshift_r(blk[1 + (bit >> 5)], blk[2 + (bit >> 5)], bit & 31);
#pragma unroll
                for (int j = 0; j < 3; ++j) {
                    v[j] = cb[(bits >> (3 * j)) & 7u];
                }
            } else { // bytes 3 (lane & 15) .. +2: low nibbles (values < 48) or high nibbles (values 48..95)
                const int byte = 3 * (lane & 15);
                const uint32_t bits = __funnelshift_r(blk[1 + (byte >> 2)], blk[2 + (byte >> 2)], 8 * (byte & 3)) >>
                                      (lane >= 16 ? 4 : 0);
#pragma unroll
                for (int j = 0; j < 3; ++j) {
                    v[j] = cb[8 + ((bits >> (8 * j)) & 15u)];
                }
            }
#pragma unroll
            for (int c = 0; c < C; ++c) {
                w[c] = pw[c] * sm;
            }
        } else if constexpr (TV == TQFA_F16) {
            const half2 * r = reinterpret_cast<const half2 *>(vg + 2 * (SW * b + VPL * lane));
#pragma unroll
            for (int j = 0; j < VPL; j += 2) {
                const float2 a = __half22float2(r[j / 2]);
                v[j] = a.x;
                v[j + 1] = a.y;
            }
#pragma unroll
            for (int c = 0; c < C; ++c) {
                w[c] = pw[c];
            }
        } else {
            const int d0 = SW * b + VPL * lane;
            const char * blk = vg + 34 * (d0 >> 5);
            const float d = __half2float(__ushort_as_half(*reinterpret_cast<const uint16_t *>(blk)));
            const uint16_t * q = reinterpret_cast<const uint16_t *>(blk + 2 + (d0 & 31));
#pragma unroll
            for (int j = 0; j < VPL; j += 2) {
                const uint16_t two = q[j / 2];
                v[j] = (float) (int8_t) (two & 0xffu);
                v[j + 1] = (float) (int8_t) (two >> 8);
            }
#pragma unroll
            for (int c = 0; c < C; ++c) {
                w[c] = pw[c] * d;
            }
        }
#pragma unroll
        for (int j = 0; j < VPL; ++j) {
#pragma unroll
            for (int c = 0; c < C; ++c) {
                acc[b][j][c] += w[c] * v[j];
            }
        }
    }
}

// sc[c] += the 8 f16 values of u (coordinates d .. d + 7) times the query's (q: coordinate d's C columns on)
template <int C>
static __device__ __forceinline__ void tq_fa_fma_f16x8(float (&sc)[C], const uint4 u, const float * q) {
    const uint32_t w4[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const float2 v = __half22float2(*reinterpret_cast<const half2 *>(&w4[k]));
        tq_fa_fma_q<C>(sc, v.x, q + (2 * k) * C);
        tq_fa_fma_q<C>(sc, v.y, q + (2 * k + 1) * C);
    }
}

// Scores of f16 keys with 16-byte aligned rows, one key per lane (key r0 + lane of the tile at K, rows past nk read
// row nk - 1): the warp stages its 32 rows through shared memory 32 values (64 bytes) at a time, four lanes per
// row (coalesced: a load instruction covers 8 whole 64-byte segments), the next chunk's loads in flight while the
// lanes score the current one. st: this warp's [32 rows][5] uint4 (stride 5: the 8 lanes of a shared-memory
// phase read distinct 16-byte bank groups). A thread reading its own row instead touches 32 rows per load.
template <int D, int C>
static __device__ __forceinline__ void tq_fa_score_f16_staged(float (&sc)[C], const char * K, int64_t nb11, int r0,
                                                              int nk, const float * qs, uint4 * st, int lane) {
#pragma unroll
    for (int c = 0; c < C; ++c) {
        sc[c] = 0.0f;
    }
    const char * src[4];
    uint4 nxt[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) { // copy slot r: row e >> 2, 16 bytes (e & 3) of the chunk, e = lane + 32 r
        const int e = lane + 32 * r;
        src[r] = K + (int64_t) min(r0 + (e >> 2), nk - 1) * nb11 + 16 * (e & 3);
        nxt[r] = *reinterpret_cast<const uint4 *>(src[r]);
    }
#pragma unroll
    for (int ch = 0; ch < D / 32; ++ch) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int e = lane + 32 * r;
            st[(e >> 2) * 5 + (e & 3)] = nxt[r];
        }
        __syncwarp();
        if (ch + 1 < D / 32) {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                nxt[r] = *reinterpret_cast<const uint4 *>(src[r] + 64 * (ch + 1));
            }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            tq_fa_fma_f16x8<C>(sc, st[lane * 5 + j], qs + (32 * ch + 8 * j) * C);
        }
        __syncwarp();
    }
}

// f16 K at D = 128 with 16-byte aligned rows: each warp's 32 rows (8 KB) come through shared memory by cp.async,
// all four 64-byte column chunks in flight at once, one copy group per chunk (the register-staged path above keeps
// one chunk in flight). st: this warp's [32 rows][16] uint4, unit u of row r at r * 16 + (u ^ (r & 7)), so the 8
// lanes of a shared-memory phase, each reading its own row, hit distinct 16-byte bank groups.
static __device__ __forceinline__ void tq_fa_f16_rows_async(uint4 * st, const char * K, int64_t nb11, int r0, int nk,
                                                            int lane) {
#pragma unroll
    for (int ch = 0; ch < 4; ++ch) {
#pragma unroll
        for (int r = 0; r < 4; ++r) { // copy slot r: row e >> 2, unit 4 ch + (e & 3), e = lane + 32 r
            const int e = lane + 32 * r, row = e >> 2, u = 4 * ch + (e & 3);
            const char * src = K + (int64_t) min(r0 + row, nk - 1) * nb11 + 16 * u;
            __pipeline_memcpy_async(st + row * 16 + (u ^ (row & 7)), src, 16);
        }
        tq_fa_cp_commit();
    }
}
// Scores of the rows tq_fa_f16_rows_async copied, one key per lane; PEND: the copy groups committed after the four
// chunks' (they may stay in flight).
template <int C, int PEND>
static __device__ __forceinline__ void tq_fa_score_f16_async(float (&sc)[C], const float * qs, const uint4 * st,
                                                             int lane) {
#pragma unroll
    for (int c = 0; c < C; ++c) {
        sc[c] = 0.0f;
    }
#pragma unroll
    for (int ch = 0; ch < 4; ++ch) {
        // chunk ch has landed (this lane's copies; the warp's: __syncwarp); ch is a constant after unrolling
        if (ch == 0) {
            tq_fa_cp_wait<PEND + 3>();
        } else if (ch == 1) {
            tq_fa_cp_wait<PEND + 2>();
        } else if (ch == 2) {
            tq_fa_cp_wait<PEND + 1>();
        } else {
            tq_fa_cp_wait<PEND>();
        }
        __syncwarp();
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            tq_fa_fma_f16x8<C>(sc, st[lane * 16 + ((4 * ch + j) ^ (lane & 7))], qs + (32 * ch + 8 * j) * C);
        }
    }
}

// The TQ rows of the tile at t (none past k1) into kt / vt, as one cp.async group (an empty one past k1, so that
// the groups pair up with tiles).
template <int TK, int TV, int KW, int VW>
static __device__ __forceinline__ void tq_fa_load_tq(uint32_t * kt, uint32_t * vt, const char * Kb, const char * Vb,
                                                     int64_t nb11, int64_t nb21, int t, int k1, int tid) {
    const int n = min(TQ_FA_TILE, k1 - t);
    if constexpr (tq_fa_is_tq(TK)) {
#pragma unroll 1
        for (int w = tid; w < n * KW; w += TQ_FA_THREADS) {
            const int key = w / KW, o = w - key * KW;
            tq_fa_cp4(kt + w, Kb + (int64_t) (t + key) * nb11 + 4 * o);
        }
    }
    if constexpr (tq_fa_is_tq(TV)) {
#pragma unroll 1
        for (int w = tid; w < n * VW; w += TQ_FA_THREADS) {
            const int key = w / VW, o = w - key * VW;
            tq_fa_cp4(vt + w, Vb + (int64_t) (t + key) * nb21 + 4 * o);
        }
    }
    tq_fa_cp_commit();
}

// At D = 128 at least 4 blocks an SM (<= 128 registers: with cp.async the compiler otherwise took 150-250, NOTES.md
// v19); 0 leaves other head sizes to the compiler, as no minimum does.
template <int D, int C, int TK, int TV>
__global__ void __launch_bounds__(TQ_FA_THREADS, D == 128 ? 4 : 0) tq_fa_decode_kernel(const tq_fa_params p) {
    constexpr int SW = tq_fa_slice(TK, TV), NB = D / SW, VPL = SW / 32; // a TQ side has one block per slice
    static_assert(D % SW == 0, "head size: a multiple of the slice width");
    constexpr int KW = tq_fa_is_tq(TK) ? tq_fa_block_words(TK) * NB : 1;
    constexpr int VW = tq_fa_is_tq(TV) ? tq_fa_block_words(TV) * NB : 1;

    // TQ tiles: +1 word, the tq3 V decode of the last row reads one word past it. Two buffers (the next tile's
    // copies in flight during this tile's work) where they fit the 48 KB of static shared memory, else one.
    constexpr int KTW = tq_fa_is_tq(TK) ? TQ_FA_TILE * KW + 1 : 0, VTW = tq_fa_is_tq(TV) ? TQ_FA_TILE * VW + 1 : 0;
    constexpr int BASE = 4 * (D * C + TQ_FA_TILE * C + 40 + 4 * C); // qs, ps, cb, red
    // f16 K: whole tiles by cp.async (tq_fa_f16_rows_async) at D = 128 where 32 KB of staging fit
    constexpr bool F16A = TK == TQFA_F16 && D == 128 && BASE + 16 * 4 * 32 * 16 + 4 * VTW <= 47 * 1024;
    constexpr int KSTU = F16A ? 4 * 32 * 16 : TK == TQFA_F16 ? 4 * 32 * 5 : 1; // f16 K staging, 16-byte units
    constexpr int REST = BASE + (TK == TQFA_F16 ? 16 * KSTU : 0);
    constexpr int NBUF = REST + 8 * (KTW + VTW) <= 46 * 1024 ? 2 : 1;
    __shared__ __align__(16) float qs[D * C]; // the query; at the end the block's partial output
    __shared__ uint32_t kt[KTW ? NBUF * KTW : 1];
    __shared__ __align__(16) uint4 kst[KSTU]; // f16 K: each warp's staged rows
    __shared__ uint32_t vt[VTW ? NBUF * VTW : 1];
    __shared__ __align__(16) float ps[TQ_FA_TILE * C];
    __shared__ float cb[40]; // tq3 centroids, tq4 centroids, sub-block multipliers
    __shared__ float red[4 * C];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kvh = blockIdx.y / p.n_groups, grp = blockIdx.y % p.n_groups, z = blockIdx.z;

    if (tid < 8) {
        cb[tid] = SW == 64 ? p.tab.cent3_64[tid] : SW == 96 ? p.tab.cent3_96[tid] : p.tab.cent3[tid];
    }
    if (tid < 16) {
        cb[8 + tid]  = SW == 64 ? p.tab.cent4_64[tid] : SW == 96 ? p.tab.cent4_96[tid] : p.tab.cent4[tid];
        cb[24 + tid] = p.tab.sub[tid];
    }

    int tok[C], head[C];
    bool ok[C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
        tok[c]  = grp * p.tpg + c / p.gqa;
        head[c] = kvh * p.gqa + c % p.gqa;
        ok[c]   = c < p.tpg * p.gqa && tok[c] < p.n_q;
    }
    for (int i = tid; i < D * C; i += TQ_FA_THREADS) {
        const int d = i / C, c = i % C;
        const int t = grp * p.tpg + c / p.gqa, h = kvh * p.gqa + c % p.gqa;
        const bool valid = c < p.tpg * p.gqa && t < p.n_q;
        qs[i] = valid ? *reinterpret_cast<const float *>(p.Q + z * p.nb03 + h * p.nb02 + t * p.nb01 + 4 * d) * p.scale : 0.0f;
    }
    __syncthreads();
    if constexpr (tq_fa_is_tq(TK)) { // q_rot = H D q / sqrt(SW) per slice, once per block
        for (int pair = warp; pair < C * NB; pair += 4) {
            const int c = pair % C, b = pair / C;
            float v[VPL];
#pragma unroll
            for (int r = 0; r < VPL; ++r) {
                const int i = lane + 32 * r;
                v[r] = qs[(SW * b + i) * C + c] * (SW == 64   ? tq_cu_sign64(p.tab, i)
                                                   : SW == 96 ? tq_cu_sign96(p.tab, i)
                                                              : tq_cu_sign(p.tab, i));
            }
            if constexpr (SW == 64) {
                tq_cu_fwht_warp64(v, lane);
            } else if constexpr (SW == 96) {
                tq_cu_transform96_warp(v, lane);
            } else {
                tq_cu_fwht_warp(v, lane);
            }
#pragma unroll
            for (int r = 0; r < VPL; ++r) {
                qs[(SW * b + lane + 32 * r) * C + c] =
                    v[r] * (SW == 64 ? TQ_WHT_NORM_64 : SW == 96 ? TQ_WHT_NORM_96 : TQ_WHT_NORM);
            }
        }
        __syncthreads();
    }

    const char * Kb = p.K + kvh * p.nb12 + (z / p.rk3) * p.nb13;
    const char * Vb = p.V + kvh * p.nb22 + (z / p.rv3) * p.nb23;
    const char * mrow[C];
    float slope[C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
        mrow[c]  = p.mask && ok[c] ? p.mask + tok[c] * p.nb31 + (head[c] % p.ne32) * p.nb32 + (z % p.ne33) * p.nb33 : nullptr;
        slope[c] = tq_fa_alibi(p, head[c]);
    }

    const int k0 = blockIdx.x * p.chunk_keys;
    const int k1 = min(p.n_kv, k0 + p.chunk_keys);

    float M[C], L[C];
    float acc[NB][VPL][C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
        M[c] = -INFINITY;
        L[c] = 0.0f;
#pragma unroll
        for (int b = 0; b < NB; ++b) {
#pragma unroll
            for (int j = 0; j < VPL; ++j) {
                acc[b][j][c] = 0.0f;
            }
        }
    }

    // f16 K rows all 16-byte aligned (uniform over the block): staged through shared memory, by cp.async (f16a)
    // or through registers; otherwise each thread reads its own row (tq_fa_score)
    const bool f16_rows16 = TK == TQFA_F16 && ((reinterpret_cast<uintptr_t>(Kb) | (uintptr_t) p.nb11) & 15u) == 0;
    const bool f16a = F16A && f16_rows16;
    if constexpr (NBUF == 2) {
        tq_fa_load_tq<TK, TV, KW, VW>(kt, vt, Kb, Vb, p.nb11, p.nb21, k0, k1, tid);
    }
    for (int t0 = k0, it = 0; t0 < k1; t0 += TQ_FA_TILE, ++it) {
        const int nk = min(TQ_FA_TILE, k1 - t0);
        const int buf = NBUF == 2 ? it & 1 : 0;
        // f16a: this tile's K rows first, so that the copy groups of the next tile's TQ V below may stay in flight
        // while the keys are scored
        if (f16a) {
            tq_fa_f16_rows_async(kst + warp * 512, Kb + (int64_t) t0 * p.nb11, p.nb11, 32 * warp, nk, lane);
        }
        if constexpr (NBUF == 2) { // the other buffer was last read before the previous tile's final barrier
            tq_fa_load_tq<TK, TV, KW, VW>(kt + (buf ^ 1) * KTW, vt + (buf ^ 1) * VTW, Kb, Vb, p.nb11, p.nb21,
                                          t0 + TQ_FA_TILE, k1, tid);
            if (!f16a) { // (f16a: the score waits chunk by chunk, which covers this tile's TQ V: it is older)
                tq_fa_cp_wait<1>();
            }
        } else {
            tq_fa_load_tq<TK, TV, KW, VW>(kt, vt, Kb, Vb, p.nb11, p.nb21, t0, k1, tid);
            if (!f16a) {
                tq_fa_cp_wait<0>();
            }
        }
        __syncthreads(); // TQ tiles visible (f16a: after the score's waits, at the barrier that follows it)
        const uint32_t * ktb = kt + buf * KTW;
        const uint32_t * vtb = vt + buf * VTW;

        float s[C];
        bool staged = false;
        if constexpr (F16A) {
            if (f16a) {
                // one group after the chunks': the TQ V tile (the next one, or with one buffer this one: then
                // waited for here, before the barrier after the scores makes it visible)
                tq_fa_score_f16_async<C, 1>(s, qs, kst + warp * 512, lane);
                if constexpr (NBUF == 1) {
                    tq_fa_cp_wait<0>();
                }
                staged = true;
            }
        } else if constexpr (TK == TQFA_F16) {
            if (f16_rows16) {
                tq_fa_score_f16_staged<D, C>(s, Kb + (int64_t) t0 * p.nb11, p.nb11, 32 * warp, nk, qs, kst + warp * 160,
                                             lane);
                staged = true;
            }
        }
        if (tid < nk) {
            if (!staged) {
                tq_fa_score<D, C, TK>(s, ktb + tid * KW, Kb + (int64_t) (t0 + tid) * p.nb11, qs, cb);
            }
#pragma unroll
            for (int c = 0; c < C; ++c) {
                if (p.softcap != 0.0f) {
                    s[c] = p.softcap * tanhf(s[c]);
                }
                if (mrow[c]) {
                    s[c] += slope[c] * __half2float(reinterpret_cast<const half *>(mrow[c])[t0 + tid]);
                }
            }
        } else {
#pragma unroll
            for (int c = 0; c < C; ++c) {
                s[c] = -INFINITY;
            }
        }
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const float mx = tq_fa_warp_max(s[c]);
            if (lane == 0) {
                red[warp * C + c] = mx;
            }
        }
        __syncthreads();
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const float tmax = fmaxf(fmaxf(red[c], red[C + c]), fmaxf(red[2 * C + c], red[3 * C + c]));
            const float mn = fmaxf(M[c], tmax);
            const float alpha = M[c] == -INFINITY ? 0.0f : __expf(M[c] - mn);
            const float pr = s[c] == -INFINITY ? 0.0f : __expf(s[c] - mn);
            ps[tid * C + c] = pr;
            L[c] = L[c] * alpha + pr;
            M[c] = mn;
#pragma unroll
            for (int b = 0; b < NB; ++b) {
#pragma unroll
                for (int j = 0; j < VPL; ++j) {
                    acc[b][j][c] *= alpha;
                }
            }
        }
        __syncthreads();

        if constexpr (TV == TQFA_F16 || TV == TQFA_Q8_0) {
            // V rows straight from global memory: unrolled so that several rows' loads are in flight at once
#pragma unroll 4
            for (int t = warp; t < nk; t += 4) {
                tq_fa_accum_v<D, C, TV, SW>(acc, ps + t * C, vtb + t * VW, Vb + (int64_t) (t0 + t) * p.nb21, cb, lane);
            }
        } else {
            for (int t = warp; t < nk; t += 4) {
                tq_fa_accum_v<D, C, TV, SW>(acc, ps + t * C, vtb + t * VW, Vb + (int64_t) (t0 + t) * p.nb21, cb, lane);
            }
        }
        __syncthreads();
    }

    // merge the 4 warps: sum of exp per column, partial outputs through shared memory (qs is free now)
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const float l = tq_fa_warp_sum(L[c]);
        if (lane == 0) {
            red[warp * C + c] = l;
        }
    }
    // the warps add their partial outputs one after the other, warp 0 storing (it covers every entry): a fixed
    // summation order, and no shared-memory atomics (contended by every warp, the slowest step of a short chunk)
#pragma unroll 1
    for (int w = 0; w < TQ_FA_THREADS / 32; ++w) {
        if (warp == w) {
#pragma unroll
            for (int b = 0; b < NB; ++b) {
#pragma unroll
                for (int j = 0; j < VPL; ++j) {
#pragma unroll
                    for (int c = 0; c < C; ++c) {
                        float & o = qs[(SW * b + VPL * lane + j) * C + c];
                        o = w == 0 ? acc[b][j][c] : o + acc[b][j][c];
                    }
                }
            }
        }
        __syncthreads();
    }
    const int col0 = ((z * (int) (gridDim.y / p.n_groups) + kvh) * p.n_groups + grp) * C;
    const int64_t base = (int64_t) blockIdx.x * p.n_cols_total + col0;
    for (int i = tid; i < D * C; i += TQ_FA_THREADS) {
        const int d = i / C, c = i % C;
        p.part[(base + c) * D + d] = qs[i];
    }
    if (tid < C) {
        const float l = red[tid] + red[C + tid] + red[2 * C + tid] + red[3 * C + tid];
        p.ml[base + tid] = make_float2(M[tid], l);
    }
}

// A finished output row (a warp; o[r] is d = lane + 32 r, normalized): un-rotates a TQ V result once (VROT: the
// rotation size, 128, 96 or 64; 0 for none) and writes it.
template <int D, int VROT>
static __device__ __forceinline__ void tq_fa_out_row(float (&o)[D / 32], int lane, const tq_cu_tables & tab,
                                                     float * drow) {
    if constexpr (VROT == 96) { // x = D M y per 96 slice: o[3 s + r] is d = 96 s + lane + 32 r
#pragma unroll
        for (int sl = 0; sl < D / 96; ++sl) {
            float * v = o + 3 * sl;
            tq_cu_transform96_warp(v, lane);
#pragma unroll
            for (int r = 0; r < 3; ++r) {
                v[r] *= TQ_WHT_NORM_96 * tq_cu_sign96(tab, lane + 32 * r);
            }
        }
    } else if constexpr (VROT == 64) { // x = D H y / sqrt(64) per 64 slice: o[2 s + r] is d = 64 s + lane + 32 r
#pragma unroll
        for (int sl = 0; sl < D / 64; ++sl) {
            float * v = o + 2 * sl;
            tq_cu_fwht_warp64(v, lane);
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                v[r] *= TQ_WHT_NORM_64 * tq_cu_sign64(tab, lane + 32 * r);
            }
        }
    } else if constexpr (VROT == 128) { // x = D H y / sqrt(128) per 128 slice: o[4 s + r] is d = 128 s + lane + 32 r
#pragma unroll
        for (int sl = 0; sl < D / 128; ++sl) {
            float * v = o + 4 * sl;
            tq_cu_fwht_warp(v, lane);
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                v[r] *= TQ_WHT_NORM * tq_cu_sign(tab, lane + 32 * r);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < D / 32; ++r) {
        drow[lane + 32 * r] = o[r];
    }
}

// Merges the chunks of a column, un-rotates a TQ V result once (VROT: the rotation size, 128, 96 or 64; 0 for none),
// writes dst (f32 [DV, n_head, n_q, n_seq]). 128-thread blocks; with few chunks a warp per column (4 columns a
// block, no barrier), with many (one sequence's decode: ~128) the 4 warps of a block share a column's chunks and
// add up through shared memory once. Chunk weights stay in registers, shuffled to the lanes. (A block per column
// with shared-memory reductions took ~7 us on the 4-sequence case: NOTES.md.)
static __host__ __device__ __forceinline__ int tq_fa_merge_cols(int n_chunks) { // columns per block
    return n_chunks <= 32 ? 4 : 1;
}
static inline unsigned tq_fa_merge_blocks(int n_cols_total, int n_chunks) { // the merge launch's grid
    return (unsigned) ((n_cols_total + tq_fa_merge_cols(n_chunks) - 1) / tq_fa_merge_cols(n_chunks));
}
// One column's merge by one warp, over the chunks of its share (group k of 32 chunks when k % wpc == ws): o gets the
// chunks' partial outputs weighed by e^(max_i - max), inv the column's 1 / sum (sinks included). The chunks' (max, sum)
// pairs: up to 32 MLR of them held in registers, their loads all in flight at once (a loop over them waited on each
// load, twice: ~half of the merge's time, NOTES.md v19); more: re-read. CG: loads through L2 only (the fused merge
// reads partials other blocks of the same launch wrote).
template <int D, bool CG>
static __device__ __forceinline__ void tq_fa_merge_column(const float * part, const float2 * ml, const float * sinks,
                                                          int head, int n_chunks, int n_cols_total, int col, int ws,
                                                          int wpc, int lane, float (&o)[D / 32], float & inv) {
    auto ldml = [&](int i) -> float2 {
        const float2 * a = ml + (int64_t) i * n_cols_total + col;
        return CG ? __ldcg(a) : *a;
    };
    constexpr int MLR = 4;
    const bool held = n_chunks <= 32 * MLR;
    float2 e[MLR];
#pragma unroll
    for (int k = 0; k < MLR; ++k) {
        const int i = lane + 32 * k;
        e[k] = held && i < n_chunks ? ldml(i) : make_float2(-INFINITY, 0.0f);
    }
    float mx = -INFINITY;
    if (held) {
#pragma unroll
        for (int k = 0; k < MLR; ++k) {
            mx = fmaxf(mx, e[k].x);
        }
    } else {
        for (int i = lane; i < n_chunks; i += 32) {
            mx = fmaxf(mx, ldml(i).x);
        }
    }
    mx = tq_fa_warp_max(mx);
    if (sinks) {
        mx = fmaxf(mx, sinks[head]);
    }
    float l = 0.0f; // the same terms in the same order either way
    if (held) {
#pragma unroll
        for (int k = 0; k < MLR; ++k) {
            l += e[k].x == -INFINITY ? 0.0f : e[k].y * __expf(e[k].x - mx);
        }
    } else {
        for (int i = lane; i < n_chunks; i += 32) {
            const float2 ei = ldml(i);
            l += ei.x == -INFINITY ? 0.0f : ei.y * __expf(ei.x - mx);
        }
    }
    l = tq_fa_warp_sum(l);
    if (sinks && mx != -INFINITY) {
        l += __expf(sinks[head] - mx);
    }
    inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int r = 0; r < D / 32; ++r) {
        o[r] = 0.0f;
    }
    // chunks i0 .. i0 + n - 1 into o, chunk i0 + lane weighing wl (this warp's groups of 32 in ascending order)
    auto add_chunks = [&](int i0, int n, float wl) {
#pragma unroll 16 // loads in flight
        for (int i = 0; i < n; ++i) {
            const float wi = __shfl_sync(0xffffffffu, wl, i);
            const float * pr = part + ((int64_t) (i0 + i) * n_cols_total + col) * D + lane;
#pragma unroll
            for (int r = 0; r < D / 32; ++r) {
                o[r] += (CG ? __ldcg(pr + 32 * r) : pr[32 * r]) * wi;
            }
        }
    };
    if (held) { // group k from e[k]: unrolled, so that e stays in registers
#pragma unroll
        for (int k = 0; k < MLR; ++k) {
            const int i0 = 32 * k, n = min(32, n_chunks - i0);
            if (k % wpc == ws && n > 0) {
                add_chunks(i0, n, lane < n && e[k].x != -INFINITY ? __expf(e[k].x - mx) : 0.0f);
            }
        }
    } else {
        for (int i0 = 32 * ws; i0 < n_chunks; i0 += 32 * wpc) {
            const int n = min(32, n_chunks - i0);
            float wl = 0.0f; // weight of chunk i0 + lane
            if (lane < n) {
                const float2 ei = ldml(i0 + lane);
                wl = ei.x == -INFINITY ? 0.0f : __expf(ei.x - mx);
            }
            add_chunks(i0, n, wl);
        }
    }
}

template <int D, int VROT>
__global__ void __launch_bounds__(128) tq_fa_merge_kernel(const float * part, const float2 * ml, const float * sinks,
                                                          char * dst, int64_t nb1, int64_t nb2, int64_t nb3,
                                                          int n_chunks, int n_cols_total, int C, int n_groups,
                                                          int n_kvh, int tpg, int gqa, int n_q, tq_cu_tables tab) {
    constexpr int R = D / 32; // values per lane: d = lane + 32 r
    __shared__ float acc[3][D];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int cpb = tq_fa_merge_cols(n_chunks), wpc = 4 / cpb; // columns per block, warps per column (block-uniform)
    const int col = blockIdx.x * cpb + warp / wpc, ws = warp % wpc;
    const int c = col % C, grp = (col / C) % n_groups, kvh = (col / (C * n_groups)) % n_kvh;
    const int z = col / (C * n_groups * n_kvh);
    const int tok = grp * tpg + c / gqa, head = kvh * gqa + c % gqa;
    if (col >= n_cols_total || c >= tpg * gqa || tok >= n_q) {
        return; // warp-uniform; block-uniform when the warps share a column
    }
    float o[R], inv;
    tq_fa_merge_column<D, false>(part, ml, sinks, head, n_chunks, n_cols_total, col, ws, wpc, lane, o, inv);
    if (wpc > 1) { // block-uniform
        if (ws > 0) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                acc[ws - 1][lane + 32 * r] = o[r];
            }
        }
        __syncthreads();
        if (ws > 0) {
            return;
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            o[r] += (acc[0][lane + 32 * r] + acc[1][lane + 32 * r]) + acc[2][lane + 32 * r];
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        o[r] *= inv;
    }
    tq_fa_out_row<D, VROT>(o, lane, tab, reinterpret_cast<float *>(dst + head * nb1 + tok * nb2 + z * nb3));
}

