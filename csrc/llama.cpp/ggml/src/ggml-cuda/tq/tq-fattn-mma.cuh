// FLASH_ATTN_EXT decode with TQ K and TQ V on tensor cores (mma.sync m16n8k16, f16 in, f32 accumulate).
//
// Same split-K grid, parameters and partial-output layout as tq_fa_decode_kernel (tq-fattn-decode.cuh), so the
// merge kernel is shared. The difference is where the arithmetic happens: each warp owns a 16-key tile, and
//  - K: S^T = K Q^T as mma with A = the key tile decoded straight from its indices into fragments (rows = the
//    tile's 16 keys: lane (g, t) decodes keys g and g + 8) and B = the rotated query (columns = the block's <= 8
//    query columns: GQA heads x query rows). The dot product is a sum over coordinates, so each lane's fragment
//    slots may hold any coordinates as long as the query uses the same ones: lane (g, t) decodes exactly one
//    sub-block of each of its keys (tq3: coordinates 32t..32t+31; tq4: the bytes 16t..16t+15, i.e. coordinates
//    16t.. and 64+16t..), so one index field and one multiplier pair per key. A fragment value pair is one
//    lookup in a (c[a], c[b]) pair table times the multiplier pair (HMUL2); the block scale multiplies the f32
//    score. Two movmatrix transposes turn the scores' layout into the V step's P^T.
//  - V: O^T = V^T P^T with A = the value tile (rows = coordinates, columns = keys) and B = P^T. A m-tile never
//    leaves one sub-block, so s * m of each key folds into B and A is pure codebook values: a pair-table lookup
//    per two keys. Lane (g, t) holds the coordinates 32k + 4g .. 32k + 4g + 3 of each sub-block k: one index field.
//  - Both tiles come through shared memory with 4-byte cp.async, two stages per warp; the pair tables are
//    replicated across banks (tq3 32 copies, tq4 16 or 8) so that data-dependent lookups rarely conflict.
// The decode is ~2 instructions per value and the multiply-adds are the tensor cores', against ~8 per value
// for the SIMT kernel (bench/results/cuda/NOTES.md).
#pragma once

#include "tq-fattn-decode.cuh"

#define TQ_MMA_WARPS  4
#define TQ_MMA_KEYS   16 // keys per warp tile
#define TQ_MMA_STAGES 2
#ifndef TQ_MMA_MIN_BLOCKS
#define TQ_MMA_MIN_BLOCKS 4 // head 128: 4 blocks (16 warps) per SM, i.e. at most 128 registers
#endif

// Pair table of type T in a kernel for head size D. Copies: lane l reads copy l % REP, so 32 copies are conflict
// free; tq4's 256 entries get 16 copies at D = 128 (8 copies conflicted 2.5x: ncu, NOTES.md) and 8 at D = 256,
// where 16 would pass the 48 KB of static shared memory.
template <int T, int D> struct tq_mma_lut_t {
    static constexpr int ENTRIES = tq_fa_bits(T) == 3 ? 64 : 256; // (a, b) index pairs
    static constexpr int REP     = tq_fa_bits(T) == 3 ? 32 : D == 128 ? 16 : 8;
    static constexpr int WORDS   = ENTRIES * REP;
    static constexpr int LOG2_STRIDE = REP == 32 ? 7 : REP == 16 ? 6 : 5; // log2(REP * 4 bytes): the entry stride
    static_assert(1 << LOG2_STRIDE == REP * 4, "a copy count the lookup's mask does not cover");
};

static __device__ __forceinline__ uint32_t tq_mma_h2(float lo, float hi) {
    const half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}

// Fills a pair table (entry e = a | b << bits holds half2(c[a], c[b]), REP copies side by side) with the block's
// threads; a compile-time trip count, so the loop is unrolled and the table's loads overlap (short KV: the prologue
// is much of a block's time; tq4's 4096 words took ~1 us less, NOTES.md v5).
template <int T, int D>
static __device__ __forceinline__ void tq_mma_fill_lut(uint32_t * lut, const tq_cu_tables & tab, int tid) {
    using L = tq_mma_lut_t<T, D>;
    constexpr int NT = TQ_MMA_WARPS * 32;
    static_assert(L::WORDS % NT == 0, "whole passes over the block");
#pragma unroll 8
    for (int j = 0; j < L::WORDS / NT; ++j) {
        const int e = (tid + NT * j) / L::REP;
        lut[tid + NT * j] = tq_fa_bits(T) == 3 ? tq_mma_h2(tab.cent3[e & 7], tab.cent3[e >> 3])
                                          : tq_mma_h2(tab.cent4[e & 15], tab.cent4[e >> 4]);
    }
}
static __device__ __forceinline__ uint32_t tq_mma_hmul2(uint32_t a, uint32_t b) {
    half2 r = __hmul2(*reinterpret_cast<const half2 *>(&a), *reinterpret_cast<const half2 *>(&b));
    return *reinterpret_cast<const uint32_t *>(&r);
}

static __device__ __forceinline__ void tq_mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                    uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ uint32_t tq_mma_opaque(uint32_t x) {
    uint32_t y;
    asm volatile("mov.b32 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}

// 8x8 transpose of 16-bit values across the warp (lane (r, c) holds row r, columns 2c, 2c + 1)
static __device__ __forceinline__ half2 tq_mma_trans(half2 x) {
    uint32_t in = *reinterpret_cast<const uint32_t *>(&x), out;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(out) : "r"(in));
    return *reinterpret_cast<const half2 *>(&out);
}

static __device__ __forceinline__ void tq_mma_cp4(uint32_t * dst, const void * src) {
    const uint32_t s = (uint32_t) __cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(src));
}
static __device__ __forceinline__ void tq_mma_cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> static __device__ __forceinline__ void tq_mma_cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// bits [sh, sh + 12) of the little-endian stream w[0], w[1], ...; sh is a compile-time constant after unrolling
static __device__ __forceinline__ uint32_t tq_mma_bits(const uint32_t * w, int sh) {
    const int wi = sh >> 5, o = sh & 31;
    return o <= 20 ? w[wi] >> o : __funnelshift_r(w[wi], w[wi + 1], o);
}
// the same for a run-time shift: always a funnel shift (one instruction, no branch on the offset); it may read the
// word after the field, which is why the staging buffer has one word of padding
static __device__ __forceinline__ uint32_t tq_mma_bits_rt(const uint32_t * w, int sh) {
    const int wi = sh >> 5;
    return __funnelshift_r(w[wi], w[wi + 1], sh & 31);
}

// One lane's share of a 128-value block row: the index field (tq3: sub-block t, 3 words; tq4: bytes 16t..16t+15,
// 4 words) and the multiplier pair as half2 (tq3: m_t twice; tq4: m of coordinates 16t.. and of 64 + 16t..).
template <int T> struct tq_mma_field {
    uint32_t w[4];
    uint32_t mm;
    uint32_t h; // the block's header word (bf16 scale in the low half)
};
template <int T>
static __device__ __forceinline__ tq_mma_field<T> tq_mma_load_field(const uint32_t * blk, int t, const float * sub) {
    tq_mma_field<T> f;
    const uint32_t h = blk[0];
    f.h = h;
    if constexpr (tq_fa_bits(T) == 3) {
        const float m = sub[(h >> (16 + 4 * t)) & 15u];
        f.mm = tq_mma_h2(m, m);
        f.w[0] = blk[1 + 3 * t];
        f.w[1] = blk[2 + 3 * t];
        f.w[2] = blk[3 + 3 * t];
        f.w[3] = 0u;
    } else {
        f.mm = tq_mma_h2(sub[(h >> (16 + 4 * (t >> 1))) & 15u], sub[(h >> (24 + 4 * (t >> 1))) & 15u]);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            f.w[i] = blk[1 + 4 * t + i];
        }
    }
    return f;
}
// Byte offset of pair-table entry ((v >> sh) & MASK) in this lane's copy: one shift and one LOP3 ((x & M) | lo,
// the lane's copy offset lo sitting in the bits below the entry stride), the table base being the shared load's
// uniform base, so a lookup is three instructions.
template <int T, int L> static __device__ __forceinline__ uint32_t tq_mma_lut_off(uint32_t v, int sh, uint32_t lo) {
    constexpr uint32_t M = (tq_fa_bits(T) == 3 ? 63u : 255u) << L; // L: log2 of the entry stride in bytes
    return ((sh >= L ? v >> (sh - L) : v << (L - sh)) & M) | lo;
}
template <int T> static __device__ __forceinline__ uint32_t tq_mma_lut(const char * lutl, uint32_t off) {
    return *reinterpret_cast<const uint32_t *>(lutl + off);
}

// Pairs 2j and 2j + 1 of the lane's 16 value pairs, as half2 (m * c[a], m * c[b]): tq3 coordinates
// 32t + 4j + {0,1} and + {2,3}; tq4 (16t + 2j, 64 + 16t + 2j) and (16t + 2j + 1, 64 + 16t + 2j + 1).
// lut: the pair table; lo: this lane's copy offset in bytes.
template <int T, int L>
static __device__ __forceinline__ void tq_mma_decode2(const tq_mma_field<T> & f, int j, const char * lut, uint32_t lo,
                                                      uint32_t & p0, uint32_t & p1) {
    if constexpr (tq_fa_bits(T) == 3) {
        const uint32_t x = tq_mma_bits(f.w, 12 * j);
        p0 = tq_mma_hmul2(tq_mma_lut<T>(lut, tq_mma_lut_off<T, L>(x, 0, lo)), f.mm);
        p1 = tq_mma_hmul2(tq_mma_lut<T>(lut, tq_mma_lut_off<T, L>(x, 6, lo)), f.mm);
    } else {
        const uint32_t x = f.w[j >> 1];
        p0 = tq_mma_hmul2(tq_mma_lut<T>(lut, tq_mma_lut_off<T, L>(x, 16 * (j & 1), lo)), f.mm);
        p1 = tq_mma_hmul2(tq_mma_lut<T>(lut, tq_mma_lut_off<T, L>(x, 16 * (j & 1) + 8, lo)), f.mm);
    }
}
// 4 three-bit groups (bits 0..11) spread to the low bits of 4 bytes.
static __device__ __forceinline__ uint32_t tq_mma_spread3(uint32_t x) {
    x = (x & 0x3fu) | ((x & 0xfc0u) << 10);
    return (x & 0x00070007u) | ((x & 0x00380038u) << 5);
}

// The V step of one 128-value block of a 16-key tile: O^T m-tiles acc[2k + hh] += V^T P^T. vb: the tile's first row
// at this block (VW words a row); pk: P[g][2t + i] and P[g][2t + 8 + i]; nk: the tile's valid keys. This lane's keys
// are 2t, 2t + 1 (nh 0) and 2t + 8, 2t + 9 (nh 1); s * m of each key folds into B, m-tile 2k + hh covers sub-block
// k, rows g + 8e = coordinates 32k + 4g + 2hh + e, and A is pure codebook pairs across two keys.
template <int TV, int VW, int LOG2>
static __device__ __forceinline__ void tq_mma_v_step(float (&acc)[8][4], const uint32_t * vb, const float (&pk)[4], int nk,
                                                     int g, int t, const char * lv, uint32_t lov, const float * sub) {
    const int keys[4] = {2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9};
    uint32_t hv[4];
    float ps[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) { // an empty slot (past the chunk) is exactly 0 even if its stale scale is NaN
        hv[i] = vb[keys[i] * VW];
        ps[i] = keys[i] < nk ? pk[i] * tq_cu_bf16_to_fp32(hv[i] & 0xffffu) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        float fac[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            fac[i] = ps[i] * sub[(hv[i] >> (16 + 4 * k)) & 15u];
        }
        const uint32_t bf0 = tq_mma_h2(fac[0], fac[1]);
        const uint32_t bf1 = tq_mma_h2(fac[2], fac[3]);
        uint32_t pa, pb; // byte n: the pair index (key A | key B << bits) of coordinate 32k + 4g + n
        if constexpr (tq_fa_bits(TV) == 3) {
            uint32_t f[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                f[i] = tq_mma_bits_rt(vb + keys[i] * VW + 1 + 3 * k, 12 * g);
            }
            pa = tq_mma_spread3(f[0]) | (tq_mma_spread3(f[1]) << 3);
            pb = tq_mma_spread3(f[2]) | (tq_mma_spread3(f[3]) << 3);
        } else {
            const int sh = 4 * (k >> 1);
            uint32_t wv[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                wv[i] = (vb[keys[i] * VW + 1 + 8 * (k & 1) + g] >> sh) & 0x0f0f0f0fu;
            }
            pa = wv[0] | (wv[1] << 4);
            pb = wv[2] | (wv[3] << 4);
        }
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int s0 = 16 * hh, s1 = 16 * hh + 8;
            tq_mma_16816(acc[2 * k + hh], tq_mma_lut<TV>(lv, tq_mma_lut_off<TV, LOG2>(pa, s0, lov)),
                         tq_mma_lut<TV>(lv, tq_mma_lut_off<TV, LOG2>(pa, s1, lov)),
                         tq_mma_lut<TV>(lv, tq_mma_lut_off<TV, LOG2>(pb, s0, lov)),
                         tq_mma_lut<TV>(lv, tq_mma_lut_off<TV, LOG2>(pb, s1, lov)), bf0, bf1);
        }
    }
}

// Column c's max and sum of exponentials over the warps (red: each warp's).
static __device__ __forceinline__ float2 tq_mma_col_ml(const float (&red)[2][TQ_MMA_WARPS][8], int c) {
    float m = -INFINITY, l = 0.0f;
#pragma unroll
    for (int w = 0; w < TQ_MMA_WARPS; ++w) {
        m = fmaxf(m, red[0][w][c]);
    }
#pragma unroll
    for (int w = 0; w < TQ_MMA_WARPS; ++w) {
        l += red[0][w][c] == -INFINITY ? 0.0f : red[1][w][c] * __expf(red[0][w][c] - m);
    }
    return make_float2(m, l);
}

// Single pass: each column's output factor 1 / l (threads 0..7, column tid), with the sink's term as the merge adds it.
static __device__ __forceinline__ void tq_mma_single_pass_fac(const tq_fa_params & p, const float (&red)[2][TQ_MMA_WARPS][8],
                                                              float * fac, int kvh, int tid) {
    if (tid < 8) {
        const float2 ml = tq_mma_col_ml(red, tid);
        const float m = ml.x;
        float l = ml.y;
        float f = m == -INFINITY ? 0.0f : 1.0f;
        if (p.sinks != nullptr) {
            const float sk = p.sinks[kvh * p.gqa + tid % p.gqa], mx = fmaxf(m, sk);
            f = m == -INFINITY ? 0.0f : __expf(m - mx);
            l = l * f + __expf(sk - mx);
        }
        fac[tid] = l > 0.0f ? f / l : 0.0f;
    }
}


template <int D, int TK, int TV>
__global__ void __launch_bounds__(TQ_MMA_WARPS * 32, D == 128 ? TQ_MMA_MIN_BLOCKS : 2) tq_fa_mma_kernel(const tq_fa_params p) {
    static_assert(tq_fa_is_tq128(TK) && tq_fa_is_tq128(TV), "tensor-core path: TQ K and TQ V, 128-value blocks");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap(); // mma.sync m16n8k16 f16 and cp.async need sm_80: the host picks the SIMT kernel on older GPUs
#else
    constexpr int NB  = D / 128;
    constexpr int KBW = tq_fa_block_words(TK), VBW = tq_fa_block_words(TV);
    constexpr int KW  = KBW * NB, VW = VBW * NB; // words per row
    constexpr int TILE_WORDS = TQ_MMA_KEYS * (KW + VW);
    using LK = tq_mma_lut_t<TK, D>;
    using LV = tq_mma_lut_t<TV, D>;
    constexpr bool SAME = TK == TV;
    // the cross-warp sum's parked O^T: two (split-K), or at D = 128 all four warps' (single pass: one barrier;
    // at D = 256 four would pass the 48 KB of static shared memory)
    constexpr int OUT_SLOTS = D == 128 ? 4 : 2;
    constexpr int OUT_WORDS = OUT_SLOTS * 8 * D;
    constexpr int STAGE_WORDS = TQ_MMA_WARPS * TQ_MMA_STAGES * TILE_WORDS;

    __shared__ __align__(16) uint32_t stage[(STAGE_WORDS > OUT_WORDS ? STAGE_WORDS : OUT_WORDS) + 1]; // + 1: tq_mma_bits_rt
    __shared__ uint32_t lutk[LK::WORDS];
    __shared__ uint32_t lutv[SAME ? 1 : LV::WORDS];
    __shared__ float sub[16];
    __shared__ float red[2][TQ_MMA_WARPS][8];
    __shared__ float fac[8]; // single pass: each column's output factor
    __shared__ int krange[2][TQ_MMA_WARPS]; // per warp: the first and one past the last key some column sees

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int kvh = blockIdx.y / p.n_groups, grp = blockIdx.y % p.n_groups, z = blockIdx.z;
    const int C = p.tpg * p.gqa; // valid columns (<= 8)

    // pair tables: entry e = a | b << bits holds half2(c[a], c[b]); built before the wait for the previous kernel
    // (the K/V write, launched with PDL: tq_launch), so they overlap its tail
    tq_mma_fill_lut<TK, D>(lutk, p.tab, tid);
    if constexpr (!SAME) {
        tq_mma_fill_lut<TV, D>(lutv, p.tab, tid);
    }
    if (tid < 16) {
        sub[tid] = p.tab.sub[tid];
    }
    if (!p.q_early) {
        tq_pdl_wait();
    }

    // the query, rotated and scaled, in the permuted coordinate order of the K fragments (rows g >= C: zero).
    // The prologue is most of a block's time at a short KV (NOTES.md v14): the query's loads go first, all in flight
    // together, then the mask scan's.
    uint32_t qa[NB][8][2];
    {
        constexpr int NT = TQ_MMA_WARPS * 32, QPT = 8 * D / NT; // query values per thread
        float qv[QPT];
#pragma unroll
        for (int u = 0; u < QPT; ++u) {
            const int i = tid + NT * u, c = i / D, d = i % D;
            const int tk = grp * p.tpg + c / p.gqa, h = kvh * p.gqa + c % p.gqa;
            qv[u] = c < C && tk < p.n_q
                        ? *reinterpret_cast<const float *>(p.Q + z * p.nb03 + h * p.nb02 + tk * p.nb01 + 4 * d)
                        : 0.0f;
        }
        { // single pass (short KV): the keys that some column's mask leaves open; the loop below runs over [first,
          // last] only (a decode step's KV is padded to 256 cells, most of them masked at a short depth; a sliding
          // window masks the front). Keys masked (-inf) for every column weigh exactly 0: skipping them changes nothing.
            const int c0 = blockIdx.x * p.chunk_keys, c1 = min(p.n_kv, c0 + p.chunk_keys);
            int kb = c1, ke = c0;
            if (p.mask == nullptr || p.dst == nullptr) { // only the single pass (a short KV) scans: at 32K the scan
                                                         // cost 4 % of the kernel and found little to skip
                kb = c0;
                ke = c1;
            } else {
                for (int c = 0; c < C; ++c) {
                    const int tk = grp * p.tpg + c / p.gqa, h = kvh * p.gqa + c % p.gqa;
                    if (tk >= p.n_q || (p.ne32 == 1 && c % p.gqa != 0)) { // heads share a mask row unless ne32 > 1
                        continue;
                    }
                    const half * mr = reinterpret_cast<const half *>(p.mask + tk * p.nb31 + (h % p.ne32) * p.nb32 +
                                                                     (z % p.ne33) * p.nb33);
                    for (int k8 = c0 + tid; k8 < c1; k8 += 8 * TQ_MMA_WARPS * 32) { // 8 loads in flight per thread
                        float m[8];
#pragma unroll
                        for (int u = 0; u < 8; ++u) {
                            const int key = k8 + u * TQ_MMA_WARPS * 32;
                            m[u] = key < c1 ? __half2float(mr[key]) : -INFINITY;
                        }
#pragma unroll
                        for (int u = 0; u < 8; ++u) {
                            if (m[u] != -INFINITY) {
                                const int key = k8 + u * TQ_MMA_WARPS * 32;
                                kb = min(kb, key);
                                ke = max(ke, key + 1);
                            }
                        }
                    }
                }
            }
            kb = __reduce_min_sync(0xffffffffu, kb);
            ke = __reduce_max_sync(0xffffffffu, ke);
            if (lane == 0) {
                krange[0][warp] = kb;
                krange[1][warp] = ke;
            }
        }
        if (p.q_early) { // the K/V tiles (the new token's cell) only after the write has finished
            tq_pdl_wait();
        }
        float * qs = reinterpret_cast<float *>(stage); // [8][D] scratch before the main loop
#pragma unroll
        for (int u = 0; u < QPT; ++u) {
            qs[tid + NT * u] = qv[u] * p.scale;
        }
        __syncthreads();
        for (int r = warp; r < 8 * NB; r += TQ_MMA_WARPS) { // q_rot = H D q / sqrt(128) per 128 slice
            if (r % 8 >= C) {
                continue; // a padding row: zero, and so is its rotation (warp-uniform)
            }
            float * q = qs + (r % 8) * D + 128 * (r / 8);
            float v[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                v[i] = q[lane + 32 * i] * tq_cu_sign(p.tab, lane + 32 * i);
            }
            tq_cu_fwht_warp(v, lane);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                q[lane + 32 * i] = v[i] * TQ_WHT_NORM;
            }
        }
        __syncthreads();
        const float * q = qs + g * D;
#pragma unroll
        for (int b = 0; b < NB; ++b) {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const float * qb = q + 128 * b;
                if constexpr (tq_fa_bits(TK) == 3) {
                    const int c0 = 32 * t + 4 * j;
                    qa[b][j][0] = tq_mma_h2(qb[c0], qb[c0 + 1]);
                    qa[b][j][1] = tq_mma_h2(qb[c0 + 2], qb[c0 + 3]);
                } else {
                    const int c0 = 16 * t + 2 * j;
                    qa[b][j][0] = tq_mma_h2(qb[c0], qb[64 + c0]);
                    qa[b][j][1] = tq_mma_h2(qb[c0 + 1], qb[64 + c0 + 1]);
                }
            }
        }
        __syncthreads(); // qs (the staging buffer) is reused below
    }
    const char * lk = reinterpret_cast<const char *>(lutk);
    const char * lv = reinterpret_cast<const char *>(SAME ? lutk : lutv);
    // the lanes' copy offsets, opaque to the compiler: otherwise it re-derives them from the lane id inside every
    // lookup and splits the (x & M) | lo into two LOP3s
    const uint32_t lok = tq_mma_opaque(4u * (lane & (LK::REP - 1))), lov = tq_mma_opaque(4u * (lane & (LV::REP - 1)));

    // this lane's score columns 2t, 2t + 1 (query head x query row)
    const half * mrow[2];
    float slope[2];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        const int col = 2 * t + c, tok = grp * p.tpg + col / p.gqa, head = kvh * p.gqa + col % p.gqa;
        const bool ok = col < C && tok < p.n_q;
        mrow[c] = p.mask && ok ? reinterpret_cast<const half *>(p.mask + tok * p.nb31 + (head % p.ne32) * p.nb32 +
                                                                  (z % p.ne33) * p.nb33)
                               : nullptr;
        slope[c] = tq_fa_alibi(p, head);
    }

    const char * Kb = p.K + kvh * p.nb12 + (z / p.rk3) * p.nb13;
    const char * Vb = p.V + kvh * p.nb22 + (z / p.rv3) * p.nb23;
    int k0 = krange[0][0], k1 = krange[1][0];
#pragma unroll
    for (int w = 1; w < TQ_MMA_WARPS; ++w) {
        k0 = min(k0, krange[0][w]);
        k1 = max(k1, krange[1][w]);
    }
    k1 = max(k0, k1); // every key masked: no tile (M = -inf, L = 0, as the merge expects of an empty chunk)
    const int n_tiles = (k1 - k0 + TQ_MMA_KEYS - 1) / TQ_MMA_KEYS;

    uint32_t * wst = stage + warp * TQ_MMA_STAGES * TILE_WORDS;
    // Copy slots: word w = lane + 32 s of the tile's K rows then V rows (consecutive lanes, consecutive words:
    // the fewest L1 wavefronts per instruction for 4-byte aligned rows). Offsets are fixed per lane and unsigned,
    // so a copy is a 64-bit add and the cp.async; a full tile (all but a chunk's last) needs no bounds checks.
    constexpr int KS = (TQ_MMA_KEYS * KW + 31) / 32, VS = (TQ_MMA_KEYS * VW + 31) / 32;
    uint32_t koff[KS], voff[VS];
#pragma unroll
    for (int s2 = 0; s2 < KS; ++s2) {
        const int w = lane + 32 * s2, r = min(w / KW, TQ_MMA_KEYS - 1);
        koff[s2] = (uint32_t) (r * p.nb11 + 4 * (w - r * KW));
    }
#pragma unroll
    for (int s2 = 0; s2 < VS; ++s2) {
        const int w = lane + 32 * s2, r = min(w / VW, TQ_MMA_KEYS - 1);
        voff[s2] = (uint32_t) (r * p.nb21 + 4 * (w - r * VW));
    }
    auto load_tile = [&](int it, int st) { // tile it of this warp into stage st
        const int t0 = k0 + (it * TQ_MMA_WARPS + warp) * TQ_MMA_KEYS;
        const int nk = min(TQ_MMA_KEYS, k1 - t0); // <= 0: nothing to load
        uint32_t * ks = wst + st * TILE_WORDS;
        uint32_t * vs = ks + TQ_MMA_KEYS * KW;
        const char * kt = Kb + (int64_t) t0 * p.nb11;
        const char * vt = Vb + (int64_t) t0 * p.nb21;
        if (nk == TQ_MMA_KEYS) { // warp-uniform
#pragma unroll
            for (int s2 = 0; s2 < KS; ++s2) {
                if (32 * s2 + 32 <= TQ_MMA_KEYS * KW || lane + 32 * s2 < TQ_MMA_KEYS * KW) {
                    tq_mma_cp4(ks + lane + 32 * s2, kt + koff[s2]);
                }
            }
#pragma unroll
            for (int s2 = 0; s2 < VS; ++s2) {
                if (32 * s2 + 32 <= TQ_MMA_KEYS * VW || lane + 32 * s2 < TQ_MMA_KEYS * VW) {
                    tq_mma_cp4(vs + lane + 32 * s2, vt + voff[s2]);
                }
            }
        } else {
#pragma unroll
            for (int s2 = 0; s2 < KS; ++s2) {
                if (lane + 32 * s2 < nk * KW) {
                    tq_mma_cp4(ks + lane + 32 * s2, kt + koff[s2]);
                }
            }
#pragma unroll
            for (int s2 = 0; s2 < VS; ++s2) {
                if (lane + 32 * s2 < nk * VW) {
                    tq_mma_cp4(vs + lane + 32 * s2, vt + voff[s2]);
                }
            }
        }
        tq_mma_cp_commit();
    };

    float M[2] = {-INFINITY, -INFINITY}, L[2] = {0.0f, 0.0f}; // columns 2t, 2t + 1 (the same in all 8 lanes of a t)
    float oacc[NB][8][4]; // O^T m-tiles (2k + hh: see the V step), columns = the 8 rows of Q
#pragma unroll
    for (int b = 0; b < NB; ++b) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                oacc[b][i][r] = 0.0f;
            }
        }
    }

    const int n_it = (n_tiles + TQ_MMA_WARPS - 1) / TQ_MMA_WARPS;
    load_tile(0, 0);
    for (int it = 0; it < n_it; ++it) {
        load_tile(it + 1, (it + 1) % TQ_MMA_STAGES);
        tq_mma_cp_wait<1>();
        __syncwarp();
        { // every warp runs every iteration (a tile past the chunk has nk <= 0: scores -inf, weights 0), so the
          // warp-collective instructions below never sit in divergent code
            const int t0 = k0 + (it * TQ_MMA_WARPS + warp) * TQ_MMA_KEYS;
            const int nk = min(TQ_MMA_KEYS, k1 - t0);
            const uint32_t * ks = wst + (it % TQ_MMA_STAGES) * TILE_WORDS;
            const uint32_t * vs = ks + TQ_MMA_KEYS * KW;

            // ---- S^T = K Q^T: A = the key tile (lane rows: keys g and g + 8, each one sub-block t as above), B = the
            // rotated query (columns: the block's <= 8 query columns), so no zero padding rows are passed around and
            // one mma covers all 16 keys. Lane scores: keys g + 8e, columns 2t + c.
            float sc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                const tq_mma_field<TK> f0 = tq_mma_load_field<TK>(ks + g * KW + b * KBW, t, sub);
                const tq_mma_field<TK> f1 = tq_mma_load_field<TK>(ks + (g + 8) * KW + b * KBW, t, sub);
                float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    uint32_t a0, a1, a2, a3;
                    tq_mma_decode2<TK, LK::LOG2_STRIDE>(f0, j, lk, lok, a0, a2);
                    tq_mma_decode2<TK, LK::LOG2_STRIDE>(f1, j, lk, lok, a1, a3);
                    tq_mma_16816(acc, a0, a1, a2, a3, qa[b][j][0], qa[b][j][1]);
                }
                const float s0 = tq_cu_bf16_to_fp32(f0.h & 0xffffu), s1 = tq_cu_bf16_to_fp32(f1.h & 0xffffu);
                sc[0][0] += s0 * acc[0];
                sc[0][1] += s0 * acc[1];
                sc[1][0] += s1 * acc[2];
                sc[1][1] += s1 * acc[3];
            }
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int key = g + 8 * e;
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    float x = sc[e][c];
                    if (p.softcap != 0.0f) {
                        x = p.softcap * tanhf(x);
                    }
                    if (mrow[c]) {
                        x += slope[c] * __half2float(mrow[c][min(t0 + key, k1 - 1)]);
                    }
                    sc[e][c] = key < nk ? x : -INFINITY;
                }
            }

            // ---- online softmax per column (its 16 keys live in the 8 lanes of one t)
            float pr[2][2], alpha[2];
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                float mx = fmaxf(sc[0][c], sc[1][c]);
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
                const float mn = fmaxf(M[c], mx);
                alpha[c] = M[c] == -INFINITY ? 0.0f : __expf(M[c] - mn);
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    pr[e][c] = sc[e][c] == -INFINITY ? 0.0f : __expf(sc[e][c] - mn);
                }
                L[c] = L[c] * alpha[c] + (pr[0][c] + pr[1][c]);
                M[c] = mn;
            }
            // O^T's columns are 2t, 2t + 1: this lane's own factors
            if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) { // once the maxima settle, most tiles skip this
#pragma unroll
                for (int b = 0; b < NB; ++b) {
#pragma unroll
                    for (int i = 0; i < 8; ++i) {
                        oacc[b][i][0] *= alpha[0];
                        oacc[b][i][1] *= alpha[1];
                        oacc[b][i][2] *= alpha[0];
                        oacc[b][i][3] *= alpha[1];
                    }
                }
            }
            // P^T for the V step's B: the lane holds P[2t + c][g + 8e]; two 8x8 transposes (one per e) give it
            // P[g][2t + i] and P[g][2t + 8 + i], the K step's old accumulator layout.
            float pk[4];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const half2 tr = tq_mma_trans(__floats2half2_rn(pr[e][0], pr[e][1]));
                pk[2 * e]     = __low2float(tr);
                pk[2 * e + 1] = __high2float(tr);
            }

            // ---- O^T += V^T P^T, a 128-value block at a time (B = P^T, the K step's accumulator layout)
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                tq_mma_v_step<TV, VW, LV::LOG2_STRIDE>(oacc[b], vs + b * VBW, pk, nk, g, t, lv, lov, sub);
            }
        }
        __syncwarp(); // the stage just read is refilled by the next iteration's load
    }
    tq_mma_cp_wait<0>();
    tq_pdl_trigger(); // the next kernel may launch during the merge and output (~1 us at a short KV)

    // ---- merge the warps: column sums over the 8 lanes of a t, then max / sum per column through shared memory
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        L[c] += __shfl_xor_sync(0xffffffffu, L[c], 4);
        L[c] += __shfl_xor_sync(0xffffffffu, L[c], 8);
        L[c] += __shfl_xor_sync(0xffffffffu, L[c], 16);
        if (g == 0) {
            red[0][warp][2 * t + c] = M[c];
            red[1][warp][2 * t + c] = L[c];
        }
    }
    __syncthreads();
    float fw[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) { // the columns 2t + i of this lane's O^T
        const int c = 2 * t + i;
        float m = -INFINITY;
#pragma unroll
        for (int w = 0; w < TQ_MMA_WARPS; ++w) {
            m = fmaxf(m, red[0][w][c]);
        }
        fw[i] = red[0][warp][c] == -INFINITY ? 0.0f : __expf(red[0][warp][c] - m);
    }
    // Cross-warp sum in a fixed order, (w0 + w2) + (w1 + w3): two warps park their rescaled O^T in shared memory and
    // the other two add it to their registers, twice; warp 0 then writes the chunk's result. Plain stores and
    // independent loads: shared-memory atomics here (4 warps on the same words) cost ~13k cycles a block, a
    // warp-by-warp read-modify-write ~11k (dependent chains), which dominated a short chunk's time.
    static_assert(TQ_MMA_WARPS == 4, "the cross-warp sum pairs 4 warps");
    float * xb = reinterpret_cast<float *>(stage); // [2][8][D]; every warp has left the main loop
    // m-tile i = 2k + hh, row g + 8e: coordinate d = 32k + 4g + 2hh + e; this lane's columns are 2t + c
    auto xb_at = [&](int slot, int b, int i, int e, int c) -> float & {
        return xb[(slot * 8 + 2 * t + c) * D + 128 * b + 32 * (i >> 1) + 4 * g + 2 * (i & 1) + e];
    };
    auto park = [&](int slot) { // this warp's O^T into a slot, column c at (slot * 8 + c) * D
#pragma unroll
        for (int b = 0; b < NB; ++b) {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    xb_at(slot, b, i, r >> 1, r & 1) = oacc[b][i][r];
                }
            }
        }
    };
#pragma unroll
    for (int b = 0; b < NB; ++b) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                oacc[b][i][r] *= fw[r & 1];
            }
        }
    }
    if (OUT_SLOTS == 4 && p.dst != nullptr) { // single pass: every warp parks its O^T, a warp per output row sums
                                              // the four in the fixed order (w0 + w2) + (w1 + w3) and writes it
        park(warp);
        tq_mma_single_pass_fac(p, red, fac, kvh, tid);
        __syncthreads();
        for (int c = warp; c < C; c += TQ_MMA_WARPS) {
            const int tk = grp * p.tpg + c / p.gqa, h = kvh * p.gqa + c % p.gqa;
            if (tk >= p.n_q) {
                continue;
            }
            const float * x0 = xb + c * D, * x1 = x0 + 8 * D, * x2 = x1 + 8 * D, * x3 = x2 + 8 * D;
            float o[D / 32];
#pragma unroll
            for (int r = 0; r < D / 32; ++r) {
                const int d = lane + 32 * r;
                o[r] = ((x0[d] + x2[d]) + (x1[d] + x3[d])) * fac[c];
            }
            tq_fa_out_row<D, 128>(o, lane, p.tab,
                                  reinterpret_cast<float *>(p.dst + h * p.dnb1 + tk * p.dnb2 + z * p.dnb3));
        }
        return;
    }
#pragma unroll 1
    for (int round = 0; round < 2; ++round) {
        const int n_send = round == 0 ? 2 : 1; // round 0: w2 -> w0, w3 -> w1; round 1: w1 -> w0
        if (warp >= n_send && warp < 2 * n_send) {
            park(warp - n_send);
        }
        __syncthreads();
        if (warp < n_send) {
#pragma unroll
            for (int b = 0; b < NB; ++b) {
#pragma unroll
                for (int i = 0; i < 8; ++i) {
#pragma unroll
                    for (int r = 0; r < 4; ++r) {
                        oacc[b][i][r] += xb_at(warp, b, i, r >> 1, r & 1);
                    }
                }
            }
        }
        __syncthreads();
    }
    if (p.dst != nullptr) { // single pass: the merge's work for one chunk, here (no partials, no merge launch)
        if (warp == 0) { // O^T to slot 0, column c at c * D (every reader of the slots passed the barrier above)
            park(0);
        }
        tq_mma_single_pass_fac(p, red, fac, kvh, tid);
        __syncthreads();
        for (int c = warp; c < C; c += TQ_MMA_WARPS) { // a warp per output row
            const int tk = grp * p.tpg + c / p.gqa, h = kvh * p.gqa + c % p.gqa;
            if (tk >= p.n_q) {
                continue;
            }
            float o[D / 32];
#pragma unroll
            for (int r = 0; r < D / 32; ++r) {
                o[r] = xb[c * D + lane + 32 * r] * fac[c];
            }
            tq_fa_out_row<D, 128>(o, lane, p.tab,
                                  reinterpret_cast<float *>(p.dst + h * p.dnb1 + tk * p.dnb2 + z * p.dnb3));
        }
        return;
    }
    const int col0 = ((z * (int) (gridDim.y / p.n_groups) + kvh) * p.n_groups + grp) * p.ncol;
    const int64_t base = (int64_t) blockIdx.x * p.n_cols_total + col0;
    if (warp == 0) {
#pragma unroll
        for (int b = 0; b < NB; ++b) {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const int c = 2 * t + (r & 1), d = 128 * b + 32 * (i >> 1) + 4 * g + 2 * (i & 1) + (r >> 1);
                    if (c < p.ncol) {
                        p.part[(base + c) * D + d] = oacc[b][i][r];
                    }
                }
            }
        }
    }
    if (tid < p.ncol) {
        p.ml[base + tid] = tq_mma_col_ml(red, tid);
    }
    if (p.done == nullptr) {
        return; // the merge kernel follows
    }
    // fused merge: the last chunk of the column group to finish merges all of them (a release / acquire pair of
    // fences around the count, as in CUDA's threadFenceReduction sample; partials read through L2)
    __shared__ int is_last;
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        unsigned * cnt = p.done + blockIdx.y + gridDim.y * blockIdx.z;
        is_last = atomicAdd(cnt, 1u) == gridDim.x - 1;
        if (is_last) {
            *cnt = 0u; // every chunk has counted: ready for the next launch
        }
    }
    __syncthreads();
    if (!is_last) {
        return;
    }
    __threadfence();
    // a warp per output row over all chunks, the block's columns side by side (one column at a time with the chunks
    // shared by the four warps was ~2x slower: four latency chains in a row, NOTES.md v20)
    for (int c = warp; c < C; c += TQ_MMA_WARPS) {
        const int tk = grp * p.tpg + c / p.gqa, h = kvh * p.gqa + c % p.gqa;
        if (tk >= p.n_q) {
            continue;
        }
        float o[D / 32], inv;
        tq_fa_merge_column<D, true>(p.part, p.ml, p.sinks, h, (int) gridDim.x, p.n_cols_total, col0 + c, 0, 1, lane,
                                    o, inv);
#pragma unroll
        for (int r = 0; r < D / 32; ++r) {
            o[r] *= inv;
        }
        tq_fa_out_row<D, 128>(o, lane, p.tab, reinterpret_cast<float *>(p.mdst + h * p.dnb1 + tk * p.dnb2 + z * p.dnb3));
    }
#endif // __CUDA_ARCH__ >= 800
}
