// llama-tq: TurboQuant TQ3/TQ4 (and their 64-value blocks) on Metal: quantize-on-write (SET_ROWS, CPY f32 -> tq),
// dequantize (GET_ROWS, CPY tq -> f32/f16) and a flash-attention kernel that reads TQ K and/or V directly.
//
// The block format and the algorithm are csrc/codec/tq_codec.h's; the quantizer here is a transliteration of
// tq_quantize_fmt() that must produce the same bytes:
//   - the codec's double-precision steps (the block norm, x / norm, the least-squares scale) run on a software
//     binary64 (tq_sd_*: 64-bit integers, round to nearest even), because Metal has no double;
//   - every float operation is the codec's, in its order, with contraction and reassociation off (the pragmas
//     below; the C codec is compiled with -ffp-contract=off);
//   - tables (centroids, boundaries, multipliers, signs) equal the codec's, checked by tests/test_metal_compat.py.
// One caveat that no compiler option removes: GPUs that flush float subnormals to zero differ on blocks whose
// rotated values are subnormal (|x_i| / ||x|| < 2^-126), which real activations do not produce.
//
// The flash-attention kernel works in the rotated domain as the CPU and CUDA paths do: the query is rotated once
// per TQ block of K, dot products read centroids straight from the packed indices, V is accumulated rotated and
// the output un-rotated once per row. One SIMD group per (query row, head); every lane holds the elements
// lane + 32 k of a row, so the Walsh-Hadamard butterflies of stride < 32 are lane shuffles.
//
// Written to the subset of the Metal Shading Language that tests/metal/metal_stdlib emulates on the CPU, so that
// CI compiles this file and runs its block functions and kernels against the C codec and a reference attention.

#include <metal_stdlib>

#include "ggml-metal-impl.h"

using namespace metal;

#if defined(__METAL_VERSION__)
#pragma clang fp contract(off)
#pragma clang fp reassociate(off)
#if __METAL_VERSION__ >= 320
#pragma METAL fp math_mode(safe)
#pragma METAL fp contract(off)
#endif
#endif

// ---------------------------------------------------------------------------------------------------------------
// Tables: the codebooks and sub-block scales are the codec's header, prepended by ggml-metal's CMake when it embeds
// the library (hence the guard) and found beside this file when it compiles one; the sign patterns are tq_codec.c's.
#ifndef TQ_CODEBOOKS_H
#include "tq_codebooks.h"
#endif
constant uint tq_mtl_signs[4]    = {0x76bcc29au, 0xec660926u, 0xfdbbf446u, 0x70d451fcu};
constant uint tq_mtl_signs_64[2] = {0x31de3918u, 0x1ab9667fu};

// Per format: bits 3/4, N = 128 (tq3, tq4) or 64 (tq3_64, tq4_64).
template <int BITS, int N> struct tq_mtl_fmt {
    static constexpr int bytes = 4 + N * BITS / 8;
    static constexpr int levels = 1 << BITS;
    static constexpr float wht_norm = N == 128 ? 0.08838834764831845f : 0.125f;
};

template <int BITS, int N> static inline float tq_mtl_cent(int i) {
    return N == 128 ? (BITS == 3 ? TQ3_CENTROIDS[i] : TQ4_CENTROIDS[i]) : (BITS == 3 ? TQ3_64_CENTROIDS[i] : TQ4_64_CENTROIDS[i]);
}
template <int BITS, int N> static inline float tq_mtl_bound(int i) {
    return N == 128 ? (BITS == 3 ? TQ3_BOUNDARIES[i] : TQ4_BOUNDARIES[i]) : (BITS == 3 ? TQ3_64_BOUNDARIES[i] : TQ4_64_BOUNDARIES[i]);
}
template <int N> static inline float tq_mtl_sign(int i) {
    const uint w = N == 128 ? tq_mtl_signs[i >> 5] : tq_mtl_signs_64[i >> 5];
    return (w >> (i & 31)) & 1u ? -1.0f : 1.0f;
}

// ---------------------------------------------------------------------------------------------------------------
// Software binary64 for the codec's double steps. A value is (-1)^neg * m * 2^e with m = 0 or 2^52 <= m < 2^53.
// Only what the codec meets: zero and normal doubles (products and quotients of finite floats stay far inside the
// normal range), round to nearest even everywhere.

struct tq_sd {
    ulong m;
    int e;
    bool neg;
};

static inline int tq_sd_msb(ulong x) { return 63 - (int) clz(x); }

// x * 2^e (x > 0), plus `sticky` = nonzero bits below x's last bit, rounded to 53 bits.
static inline tq_sd tq_sd_pack(ulong x, bool sticky, int e, bool neg) {
    tq_sd r;
    r.neg = neg;
    if (x == 0) {
        r.m = 0;
        r.e = 0;
        return r;
    }
    const int p = tq_sd_msb(x);
    if (p <= 52) {
        r.m = x << (52 - p);
        r.e = e - (52 - p);
        return r;
    }
    const int sh = p - 52;
    ulong m = x >> sh;
    const ulong rem = x & ((1ul << sh) - 1ul);
    const ulong half_ = 1ul << (sh - 1);
    if (rem > half_ || (rem == half_ && (sticky || (m & 1ul)))) {
        m += 1ul;
        if (m == (1ul << 53)) {
            m >>= 1;
            e += 1;
        }
    }
    r.m = m;
    r.e = e + sh;
    return r;
}

static inline tq_sd tq_sd_from_float(float f) {
    const uint u = as_type<uint>(f);
    const uint ex = (u >> 23) & 255u;
    const uint fr = u & 0x7fffffu;
    const bool neg = (u >> 31) != 0u;
    if (ex == 0u) {
        return tq_sd_pack((ulong) fr, false, -149, neg); // zero or subnormal: exact
    }
    return tq_sd_pack((ulong) (fr | 0x800000u), false, (int) ex - 150, neg);
}

// Exact product of two floats (24 x 24 bits fit in 53).
static inline tq_sd tq_sd_mul_ff(float a, float b) {
    const tq_sd x = tq_sd_from_float(a);
    const tq_sd y = tq_sd_from_float(b);
    if (x.m == 0 || y.m == 0) {
        return tq_sd_pack(0, false, 0, false);
    }
    // both mantissas are 53-bit normalized with 29 trailing zeros: multiply the 24-bit parts exactly
    return tq_sd_pack((x.m >> 29) * (y.m >> 29), false, x.e + y.e + 58, x.neg != y.neg);
}

// |a| >= |b| by magnitude
static inline bool tq_sd_mag_ge(tq_sd a, tq_sd b) {
    if (b.m == 0) {
        return true;
    }
    if (a.m == 0) {
        return false;
    }
    return a.e > b.e || (a.e == b.e && a.m >= b.m);
}

static inline tq_sd tq_sd_add(tq_sd a, tq_sd b) {
    if (!tq_sd_mag_ge(a, b)) {
        const tq_sd t = a;
        a = b;
        b = t;
    }
    if (b.m == 0) {
        return a;
    }
    // 10 guard bits: a cancellation that loses more than one leading bit needs an exponent gap <= 1, which
    // shifts no bit of b out
    const ulong A = a.m << 10;
    ulong B = b.m << 10;
    const int d = a.e - b.e;
    bool sticky = false;
    if (d >= 64) {
        sticky = true;
        B = 0;
    } else if (d > 0) {
        sticky = (B & ((1ul << d) - 1ul)) != 0;
        B >>= d;
    }
    if (a.neg == b.neg) {
        return tq_sd_pack(A + B, sticky, a.e - 10, a.neg);
    }
    ulong S = A - B;
    if (sticky) { // the true value lies strictly between S - 1 and S
        S -= 1ul;
    }
    return tq_sd_pack(S, sticky, a.e - 10, S != 0 && a.neg); // x + (-x) = +0
}

// 64 x 64 -> 128-bit product (hi, lo) from 32-bit halves
static inline void tq_sd_mul64(ulong a, ulong b, thread ulong & hi, thread ulong & lo) {
    const ulong a0 = a & 0xffffffffu, a1 = a >> 32, b0 = b & 0xffffffffu, b1 = b >> 32;
    const ulong p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
    const ulong mid = (p00 >> 32) + (p01 & 0xffffffffu) + (p10 & 0xffffffffu);
    lo = (p00 & 0xffffffffu) | (mid << 32);
    hi = p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
}

static inline tq_sd tq_sd_mul(tq_sd a, tq_sd b) {
    if (a.m == 0 || b.m == 0) {
        return tq_sd_pack(0, false, 0, false);
    }
    ulong hi, lo;
    tq_sd_mul64(a.m, b.m, hi, lo); // < 2^106: hi < 2^42, nonzero
    const int ph = tq_sd_msb(hi);
    const ulong x = (hi << (63 - ph)) | (lo >> (ph + 1));
    const bool sticky = (lo & ((1ul << (ph + 1)) - 1ul)) != 0;
    return tq_sd_pack(x, sticky, a.e + b.e + ph + 1, a.neg != b.neg);
}

static inline tq_sd tq_sd_div(tq_sd a, tq_sd b) { // b != 0
    if (a.m == 0) {
        return a;
    }
    ulong r = a.m, q = 0;
    for (int i = 0; i < 64; ++i) { // q = floor(a.m / b.m * 2^63), r != 0 <=> inexact
        q <<= 1;
        if (r >= b.m) {
            r -= b.m;
            q |= 1ul;
        }
        r <<= 1;
    }
    return tq_sd_pack(q, r != 0, a.e - b.e - 63, a.neg != b.neg);
}

static inline tq_sd tq_sd_sqrt(tq_sd a) { // a >= 0
    if (a.m == 0) {
        return a;
    }
    ulong m = a.m;
    int e = a.e;
    if (e & 1) {
        m <<= 1;
        e -= 1;
    }
    // digit by digit: root = floor(sqrt(m * 2^56)), m read as a 56-bit field (28 pairs) then 28 zero pairs
    ulong root = 0, rem = 0;
    for (int i = 0; i < 56; ++i) {
        const ulong pair = i < 28 ? (m >> (54 - 2 * i)) & 3ul : 0ul;
        rem = (rem << 2) | pair;
        const ulong trial = (root << 2) | 1ul;
        root <<= 1;
        if (rem >= trial) {
            rem -= trial;
            root |= 1ul;
        }
    }
    return tq_sd_pack(root, rem != 0, e / 2 - 28, false);
}

static inline float tq_sd_to_float(tq_sd a) { // round to nearest even; |a| below FLT_MAX
    if (a.m == 0) {
        return a.neg ? -0.0f : 0.0f;
    }
    const int E = a.e + 52; // a in [2^E, 2^(E+1))
    int sh = E >= -126 ? 29 : -(a.e + 149);
    uint bits = 0;
    if (sh < 64) {
        ulong m = a.m >> sh;
        const ulong rem = a.m & ((1ul << sh) - 1ul);
        const ulong half_ = 1ul << (sh - 1);
        if (rem > half_ || (rem == half_ && (m & 1ul))) {
            m += 1ul;
        }
        if (E >= -126) {
            // m in [2^23, 2^24]: a carry to 2^24 moves to the next binade through the exponent field
            bits = ((uint) (E + 127) << 23) + ((uint) m - 0x800000u);
        } else {
            bits = (uint) m; // subnormal (or the smallest normal after a carry)
        }
    }
    return as_type<float>(bits | (a.neg ? 0x80000000u : 0u));
}

static inline bool tq_sd_gt(tq_sd a, tq_sd b) { // a, b >= 0
    return a.m != 0 && (b.m == 0 || a.e > b.e || (a.e == b.e && a.m > b.m));
}

static inline ushort tq_mtl_fp32_to_bf16(float f) {
    uint u = as_type<uint>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (ushort) ((u >> 16) | 0x40u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (ushort) (u >> 16);
}

static inline float tq_mtl_bf16_to_fp32(ushort h) { return as_type<float>((uint) h << 16); }

// ---------------------------------------------------------------------------------------------------------------
// Block functions (one thread, one block), in the C codec's operation order.

template <int N> static inline void tq_mtl_fwht(thread float * v) {
    for (int h = 1; h < N; h <<= 1) {
        for (int i = 0; i < N; i += h << 1) {
            for (int j = i; j < i + h; ++j) {
                const float a = v[j];
                const float b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
        }
    }
}

template <int BITS, int N> static inline void tq_mtl_pack(thread const uchar * idx, device uchar * q) {
    if (BITS == 3) {
        for (int g = 0; g < N / 8; ++g) {
            uint w = 0;
            for (int j = 0; j < 8; ++j) {
                w |= (uint) (idx[8 * g + j] & 7u) << (3 * j);
            }
            q[3 * g + 0] = (uchar) (w & 0xffu);
            q[3 * g + 1] = (uchar) ((w >> 8) & 0xffu);
            q[3 * g + 2] = (uchar) ((w >> 16) & 0xffu);
        }
    } else {
        for (int j = 0; j < N / 2; ++j) {
            q[j] = (uchar) ((idx[j] & 15u) | ((idx[j + N / 2] & 15u) << 4));
        }
    }
}

// index i of a packed block's indices
template <int BITS, int N> static inline uint tq_mtl_index(device const uchar * q, int i) {
    if (BITS == 3) {
        const int g = i >> 3;
        const uint w = (uint) q[3 * g] | ((uint) q[3 * g + 1] << 8) | ((uint) q[3 * g + 2] << 16);
        return (w >> (3 * (i & 7))) & 7u;
    }
    return i < N / 2 ? q[i] & 15u : q[i - N / 2] >> 4;
}

// step 3 of the codec for one sub-block of N/4 rotated values: the multiplier with the smallest squared error
// (first on ties), errors summed in the codec's canonical order (8 lanes, then a fixed tree)
template <int BITS, int N> static inline uint tq_mtl_pick(thread const float * y, thread uchar * idx) {
    const int len = N / 4;
    const int nb = (1 << BITS) - 1;
    float best_err = INFINITY;
    uint best = 0;
    uchar cand[32];
    float sb[15];
    for (uint j = 0; j < 16; ++j) {
        const float m = TQ_SUBSCALE[j];
        for (int t = 0; t < nb; ++t) {
            sb[t] = m * tq_mtl_bound<BITS, N>(t);
        }
        float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int i = 0; i < len; ++i) {
            int k = 0;
            for (int t = 0; t < nb; ++t) {
                k += y[i] > sb[t] ? 1 : 0;
            }
            cand[i] = (uchar) k;
            const float c = m * tq_mtl_cent<BITS, N>(k);
            const float d = y[i] - c;
            const float dd = d * d;
            lane[i & 7] = lane[i & 7] + dd;
        }
        const float l04 = lane[0] + lane[4];
        const float l26 = lane[2] + lane[6];
        const float l15 = lane[1] + lane[5];
        const float l37 = lane[3] + lane[7];
        const float err = (l04 + l26) + (l15 + l37);
        if (err < best_err) {
            best_err = err;
            best = j;
            for (int i = 0; i < len; ++i) {
                idx[i] = cand[i];
            }
        }
    }
    return best;
}

// The codec's canonical double sum of a[i] * b[i] (tq_codec.c, tq_sum_canonical): 32 lanes, lane l summing terms
// l, l + 32, ... from 0 in sequence, then lanes l < d adding lane l + d for d = 16, 8, 4, 2, 1.
template <int N> static inline tq_sd tq_mtl_canon_sum(thread const float * a, thread const float * b) {
    tq_sd lane[32];
    for (int l = 0; l < 32; ++l) {
        lane[l] = tq_sd_pack(0, false, 0, false);
        for (int i = l; i < N; i += 32) {
            lane[l] = tq_sd_add(lane[l], tq_sd_mul_ff(a[i], b[i]));
        }
    }
    for (int d = 16; d >= 1; d >>= 1) {
        for (int l = 0; l < d; ++l) {
            lane[l] = tq_sd_add(lane[l], lane[l + d]);
        }
    }
    return lane[0];
}

template <typename TS, int BITS, int N> static inline void tq_mtl_quantize_block(device const TS * x, device uchar * out) {
    float y[N];
    uchar idx[N];
    bool finite = true;
    for (int i = 0; i < N; ++i) {
        y[i] = (float) x[i];
        finite = finite && ((as_type<uint>(y[i]) >> 23) & 255u) != 255u;
    }
    if (!finite) { // NaN or Inf: the poisoned block
        for (int i = 0; i < N; ++i) {
            idx[i] = 0;
        }
        tq_mtl_pack<BITS, N>(idx, out + 4);
        const ushort nan_bf16 = tq_mtl_fp32_to_bf16(as_type<float>(0x7fc00000u));
        out[0] = (uchar) (nan_bf16 & 0xffu);
        out[1] = (uchar) (nan_bf16 >> 8);
        out[2] = 0;
        out[3] = 0;
        return;
    }
    const tq_sd ss = tq_mtl_canon_sum<N>(y, y);
    const tq_sd norm = tq_sd_sqrt(ss);
    for (int i = 0; i < N; ++i) {
        y[i] = norm.m != 0 ? tq_sd_to_float(tq_sd_div(tq_sd_from_float(y[i]), norm)) : 0.0f;
    }
    for (int i = 0; i < N; ++i) {
        y[i] = y[i] * tq_mtl_sign<N>(i);
    }
    tq_mtl_fwht<N>(y);
    for (int i = 0; i < N; ++i) {
        y[i] = y[i] * tq_mtl_fmt<BITS, N>::wht_norm;
    }
    const int len = N / 4;
    uint subs = 0;
    float c[N];
    for (int k = 0; k < 4; ++k) {
        const uint j = tq_mtl_pick<BITS, N>(y + k * len, idx + k * len);
        subs |= j << (4 * k);
        for (int i = k * len; i < (k + 1) * len; ++i) {
            c[i] = TQ_SUBSCALE[j] * tq_mtl_cent<BITS, N>(idx[i]);
        }
    }
    const tq_sd yc = tq_mtl_canon_sum<N>(y, c);
    const tq_sd cc = tq_mtl_canon_sum<N>(c, c);
    tq_mtl_pack<BITS, N>(idx, out + 4);
    tq_sd s = tq_sd_mul(norm, tq_sd_div(yc, cc));
    const tq_sd smax = tq_sd_from_float(8.407367073e37f);
    if (tq_sd_gt(s, smax)) {
        s = smax;
    }
    const ushort sb = tq_mtl_fp32_to_bf16(tq_sd_to_float(s));
    out[0] = (uchar) (sb & 0xffu);
    out[1] = (uchar) (sb >> 8);
    out[2] = (uchar) (subs & 0xffu);
    out[3] = (uchar) (subs >> 8);
}

// value i of a block in the rotated domain, with its scale: s * m_k(i) * c[idx_i]
template <int BITS, int N> static inline float tq_mtl_rotated_value(device const uchar * blk, int i) {
    const float s = tq_mtl_bf16_to_fp32((ushort) (blk[0] | (blk[1] << 8)));
    const uint subs = (uint) blk[2] | ((uint) blk[3] << 8);
    const float c = TQ_SUBSCALE[(subs >> (4 * (i / (N / 4)))) & 15u] * tq_mtl_cent<BITS, N>((int) tq_mtl_index<BITS, N>(blk + 4, i));
    return s * c;
}

// the whole block, dequantized as tq_dequantize_fmt() does
template <int BITS, int N> static inline void tq_mtl_dequantize_block(device const uchar * blk, thread float * x) {
    const float s = tq_mtl_bf16_to_fp32((ushort) (blk[0] | (blk[1] << 8)));
    const uint subs = (uint) blk[2] | ((uint) blk[3] << 8);
    for (int i = 0; i < N; ++i) {
        x[i] = TQ_SUBSCALE[(subs >> (4 * (i / (N / 4)))) & 15u] * tq_mtl_cent<BITS, N>((int) tq_mtl_index<BITS, N>(blk + 4, i));
    }
    tq_mtl_fwht<N>(x);
    for (int i = 0; i < N; ++i) {
        x[i] = x[i] * (tq_mtl_fmt<BITS, N>::wht_norm * tq_mtl_sign<N>(i));
    }
    for (int i = 0; i < N; ++i) {
        x[i] = x[i] * s;
    }
}

// ---------------------------------------------------------------------------------------------------------------
// SET_ROWS / CPY f32 -> tq: one thread per block (the geometry of upstream's kernel_set_rows_q32 / cpy_f32_q).

template <typename TI, int BITS, int N>
kernel void kernel_tq_set_rows(
        constant ggml_metal_kargs_set_rows & args,
        device const  void * src0,
        device const  void * src1,
        device       float * dst,
        uint3                tgpig[[threadgroup_position_in_grid]],
        uint                 tiitg[[thread_index_in_threadgroup]],
        uint3                tptg [[threads_per_threadgroup]]) {
    const int32_t i03 = tgpig.z;
    const int32_t i02 = tgpig.y;
    const int32_t i12 = i03 % args.ne12;
    const int32_t i11 = i02 % args.ne11;
    const int32_t i01 = tgpig.x * tptg.y + tiitg / tptg.x;
    if (i01 >= args.ne01) {
        return;
    }
    const TI i1 = ((const device TI *) ((const device char *) src1 + i01 * args.nb10 + i11 * args.nb11 + i12 * args.nb12))[0];
    device uchar * dst_row = (device uchar *) dst + i1 * args.nb1 + i02 * args.nb2 + i03 * args.nb3;
    const device float * src_row = (const device float *) ((const device char *) src0 + i01 * args.nb01 + i02 * args.nb02 + i03 * args.nb03);
    for (int ind = tiitg % tptg.x; ind < args.nk0; ind += tptg.x) {
        tq_mtl_quantize_block<float, BITS, N>(src_row + N * ind, dst_row + tq_mtl_fmt<BITS, N>::bytes * ind);
    }
}

template <int BITS, int N>
kernel void kernel_tq_cpy_f32_tq(
        constant ggml_metal_kargs_cpy & args,
        device const char * src0,
        device       char * dst,
        uint3   tgpig[[threadgroup_position_in_grid]],
        ushort3 tpitg[[thread_position_in_threadgroup]],
        ushort3   ntg[[threads_per_threadgroup]]) {
    const int32_t i03 = tgpig[2];
    const int32_t i02 = tgpig[1];
    const int32_t i01 = ntg[1] == 1 ? tgpig[0] % args.ne01 : tgpig[0] * ntg[1] + tpitg[1];
    const int32_t iw0 = ntg[1] == 1 ? tgpig[0] / args.ne01 : 0;
    if (i01 >= args.ne01) {
        return;
    }
    const int64_t n = i03 * args.ne02 * args.ne01 * args.ne00 + i02 * args.ne01 * args.ne00 + i01 * args.ne00;
    const int32_t i3 = n / (args.ne2 * args.ne1 * args.ne0);
    const int32_t i2 = (n - i3 * args.ne2 * args.ne1 * args.ne0) / (args.ne1 * args.ne0);
    const int32_t i1 = (n - i3 * args.ne2 * args.ne1 * args.ne0 - i2 * args.ne1 * args.ne0) / args.ne0;
    const int32_t i0 = (n - i3 * args.ne2 * args.ne1 * args.ne0 - i2 * args.ne1 * args.ne0 - i1 * args.ne0) / N;
    device uchar * dst_data = (device uchar *) (dst + i3 * args.nb3 + i2 * args.nb2 + i1 * args.nb1 + i0 * args.nb0);
    const int32_t i00 = iw0 * ntg[0] + tpitg[0];
    if (i00 < args.nk0) {
        const device float * src = (const device float *) (src0 + i03 * args.nb03 + i02 * args.nb02 + i01 * args.nb01 + (i00 * N) * args.nb00);
        tq_mtl_quantize_block<float, BITS, N>(src, dst_data + tq_mtl_fmt<BITS, N>::bytes * i00);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// GET_ROWS / CPY tq -> f32|f16: upstream's geometry hands each thread 16 values (ne00t = ne00 / 16); the thread
// decodes its whole block (the inverse rotation mixes all N values) and writes its 16.

template <typename TD, int BITS, int N>
static inline void tq_mtl_write16(device const uchar * blk, int il, device TD * out) {
    float x[N];
    tq_mtl_dequantize_block<BITS, N>(blk, x);
    for (int i = 0; i < 16; ++i) {
        out[i] = (TD) x[16 * il + i];
    }
}

template <int BITS, int N>
kernel void kernel_tq_get_rows(
        constant ggml_metal_kargs_get_rows & args,
        device const void * src0,
        device const void * src1,
        device       void * dst,
        uint3               tgpig[[threadgroup_position_in_grid]],
        ushort              tiitg[[thread_index_in_threadgroup]],
        ushort3             ntg  [[threads_per_threadgroup]]) {
    const int32_t iw0 = tgpig.x / args.ne10;
    const int32_t i10 = tgpig.x % args.ne10;
    const int32_t i11 = tgpig.y;
    const int32_t i12 = tgpig.z;
    const int32_t r = ((const device int32_t *) ((const device char *) src1 + i12 * args.nb12 + i11 * args.nb11 + i10 * args.nb10))[0];
    const device uchar * psrc = (const device uchar *) src0 + i12 * args.nb03 + i11 * args.nb02 + r * args.nb01;
    device float * pdst = (device float *) ((device char *) dst + i12 * args.nb3 + i11 * args.nb2 + i10 * args.nb1);
    const int ind = iw0 * ntg.x + tiitg;
    if (ind < args.ne00t) {
        const int nl = N / 16;
        tq_mtl_write16<float, BITS, N>(psrc + tq_mtl_fmt<BITS, N>::bytes * (ind / nl), ind % nl, pdst + 16 * ind);
    }
}

template <typename TD, int BITS, int N>
kernel void kernel_tq_cpy_tq_t(
        constant ggml_metal_kargs_cpy & args,
        device  const char * src0,
        device        char * dst,
        uint3   tgpig[[threadgroup_position_in_grid]],
        ushort3 tpitg[[thread_position_in_threadgroup]],
        ushort3   ntg[[threads_per_threadgroup]]) {
    const int32_t i03 = tgpig[2];
    const int32_t i02 = tgpig[1];
    const int32_t i01 = ntg[1] == 1 ? tgpig[0] % args.ne01 : tgpig[0] * ntg[1] + tpitg[1];
    const int32_t iw0 = ntg[1] == 1 ? tgpig[0] / args.ne01 : 0;
    if (i01 >= args.ne01) {
        return;
    }
    const int64_t n = i03 * args.ne02 * args.ne01 * args.ne00 + i02 * args.ne01 * args.ne00 + i01 * args.ne00;
    const int32_t i3 = n / (args.ne2 * args.ne1 * args.ne0);
    const int32_t i2 = (n - i3 * args.ne2 * args.ne1 * args.ne0) / (args.ne1 * args.ne0);
    const int32_t i1 = (n - i3 * args.ne2 * args.ne1 * args.ne0 - i2 * args.ne1 * args.ne0) / args.ne0;
    const int32_t i0 = (n - i3 * args.ne2 * args.ne1 * args.ne0 - i2 * args.ne1 * args.ne0 - i1 * args.ne0);
    const device uchar * src_data = (const device uchar *) (src0 + i03 * args.nb03 + i02 * args.nb02 + i01 * args.nb01);
    device TD * dst_data = (device TD *) (dst + i3 * args.nb3 + i2 * args.nb2 + i1 * args.nb1 + i0 * args.nb0);
    const int32_t i00 = iw0 * ntg[0] + tpitg[0];
    if (i00 < args.nk0) {
        const int nl = N / 16;
        tq_mtl_write16<TD, BITS, N>(src_data + tq_mtl_fmt<BITS, N>::bytes * (i00 / nl), i00 % nl, dst_data + 16 * i00);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// FLASH_ATTN_EXT with a TQ K and/or V: one SIMD group (32 threads) per (query row, query head, i3), the whole KV
// in one pass with an online softmax. K/V element readers per type; TQ values come in the rotated domain.
// Arguments: upstream's ggml_metal_kargs_flash_attn_ext_vec, with n_kv_max_padded carrying flags (bit 0: a mask
// is bound, bit 1: sinks are bound) since this kernel has no padded KV.

enum { TQ_MTL_F16 = 0, TQ_MTL_Q8_0 = 1, TQ_MTL_TQ3 = 2, TQ_MTL_TQ4 = 3, TQ_MTL_TQ3_64 = 4, TQ_MTL_TQ4_64 = 5 };

template <int T> struct tq_mtl_kv {
    static constexpr bool tq = T >= TQ_MTL_TQ3;
    static constexpr int bits = T == TQ_MTL_TQ3 || T == TQ_MTL_TQ3_64 ? 3 : 4;
    static constexpr int n = T == TQ_MTL_TQ3_64 || T == TQ_MTL_TQ4_64 ? 64 : 128; // rotation size of a TQ type
};

template <int T> static inline float tq_mtl_kv_value(device const char * row, int e) {
    if (T == TQ_MTL_F16) {
        return (float) ((device const half *) row)[e];
    } else if (T == TQ_MTL_Q8_0) {
        device const uchar * b = (device const uchar *) row + 34 * (e / 32);
        const float d = (float) as_type<half>((ushort) (b[0] | (b[1] << 8)));
        return d * (float) as_type<char>(b[2 + e % 32]);
    } else {
        constexpr int BITS = tq_mtl_kv<T>::bits, N = tq_mtl_kv<T>::n;
        return tq_mtl_rotated_value<BITS, N>((device const uchar *) row + tq_mtl_fmt<BITS, N>::bytes * (e / N), e % N);
    }
}

// Walsh-Hadamard transform (unnormalized) of every N-block of a row held as v[k] = element lane + 32 k
template <int N, int E> static inline void tq_mtl_fwht_lanes(thread float * v, ushort lane) {
    for (int h = 1; h < N; h <<= 1) {
        if (h < 32) {
            for (int k = 0; k < E; ++k) {
                const float p = simd_shuffle_xor(v[k], (ushort) h);
                v[k] = (lane & h) ? p - v[k] : v[k] + p;
            }
        } else {
            const int kh = h / 32;
            for (int k = 0; k < E; ++k) {
                if (((k % (N / 32)) & kh) == 0) {
                    const float a = v[k];
                    const float b = v[k + kh];
                    v[k] = a + b;
                    v[k + kh] = a - b;
                }
            }
        }
    }
}

template <int KT, int VT, int D>
kernel void kernel_tq_flash_attn_ext(
        constant ggml_metal_kargs_flash_attn_ext_vec & args,
        device const char * q,
        device const char * k,
        device const char * v,
        device const char * mask,
        device const char * sinks,
        device       char * dst,
        uint3  tgpig[[threadgroup_position_in_grid]],
        ushort lane [[thread_index_in_simdgroup]]) {
    constexpr int E = D / 32;
    const int i1 = tgpig.x;
    const int i2 = tgpig.y;
    const int i3 = tgpig.z;
    const int ik2 = i2 / (args.ne02 / args.ne_12_2);
    const int ik3 = i3 / (args.ne03 / args.ne_12_3);
    const bool has_mask = (args.n_kv_max_padded & 1) != 0;
    const bool has_sinks = (args.n_kv_max_padded & 2) != 0;

    float qv[E];
    const device float * qrow = (const device float *) (q + i1 * args.nb01 + i2 * args.nb02 + i3 * args.nb03);
    for (int j = 0; j < E; ++j) {
        qv[j] = qrow[lane + 32 * j];
    }
    if (tq_mtl_kv<KT>::tq) { // rotate the query once: H D q / sqrt(N) per block
        constexpr int N = tq_mtl_kv<KT>::n;
        for (int j = 0; j < E; ++j) {
            qv[j] = qv[j] * tq_mtl_sign<N>((lane + 32 * j) % N);
        }
        tq_mtl_fwht_lanes<N, E>(qv, lane);
        for (int j = 0; j < E; ++j) {
            qv[j] = qv[j] * tq_mtl_fmt<3, N>::wht_norm;
        }
    }

    float slope = 1.0f;
    if (args.max_bias > 0.0f) {
        const int h = i2;
        const float base = h < args.n_head_log2 ? args.m0 : args.m1;
        const int exph = h < args.n_head_log2 ? h + 1 : 2 * (h - args.n_head_log2) + 1;
        slope = pow(base, (float) exph);
    }
    const device half * mrow = (const device half *) (mask + (has_mask ? i1 * args.nb31 + (i2 % args.ne32) * args.nb32 + (i3 % args.ne33) * args.nb33 : 0));

    float M = -FLT_MAX / 2;
    float S = 0.0f;
    float acc[E];
    for (int j = 0; j < E; ++j) {
        acc[j] = 0.0f;
    }
    for (int ic = 0; ic < args.ne11; ++ic) {
        const float mv = has_mask ? (float) mrow[ic] : 0.0f;
        if (mv == -INFINITY) {
            continue; // uniform over the SIMD group
        }
        const device char * krow = k + ic * args.nb11 + ik2 * args.nb12 + ik3 * args.nb13;
        float part = 0.0f;
        for (int j = 0; j < E; ++j) {
            part += qv[j] * tq_mtl_kv_value<KT>(krow, lane + 32 * j);
        }
        float s = simd_sum(part) * args.scale;
        if (args.logit_softcap != 0.0f) {
            s = args.logit_softcap * precise::tanh(s);
        }
        s += slope * mv;
        const float Mn = max(M, s);
        const float ms = exp(M - Mn);
        const float vs = exp(s - Mn);
        S = S * ms + vs;
        const device char * vrow = v + ic * args.nb21 + ik2 * args.nb22 + ik3 * args.nb23;
        for (int j = 0; j < E; ++j) {
            acc[j] = acc[j] * ms + vs * tq_mtl_kv_value<VT>(vrow, lane + 32 * j);
        }
        M = Mn;
    }
    if (has_sinks) {
        const float s = ((const device float *) sinks)[i2];
        if (s > M) {
            const float ms = exp(M - s);
            for (int j = 0; j < E; ++j) {
                acc[j] = acc[j] * ms;
            }
            S = S * ms + 1.0f;
        } else {
            S += exp(s - M);
        }
    }
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int j = 0; j < E; ++j) {
        acc[j] = acc[j] * inv;
    }
    if (tq_mtl_kv<VT>::tq) { // V was summed rotated: D H o / sqrt(N) per block
        constexpr int N = tq_mtl_kv<VT>::n;
        tq_mtl_fwht_lanes<N, E>(acc, lane);
        for (int j = 0; j < E; ++j) {
            acc[j] = acc[j] * (tq_mtl_fmt<3, N>::wht_norm * tq_mtl_sign<N>((lane + 32 * j) % N));
        }
    }
    // dst: [D, heads (ne1), rows (ne2), ne3], contiguous f32
    device float * out = (device float *) dst + ((int64_t) (i3 * args.ne2 + i1) * args.ne1 + i2) * D;
    for (int j = 0; j < E; ++j) {
        out[lane + 32 * j] = acc[j];
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Instantiations: names follow upstream's (ggml-metal-device.cpp builds them from ggml_type_name), except FA's.

#define TQ_MTL_TYPES(X) X(tq3, 3, 128) X(tq4, 4, 128) X(tq3_64, 3, 64) X(tq4_64, 4, 64)

typedef decltype(kernel_tq_set_rows<int64_t, 3, 128>) tq_set_rows_t;
typedef decltype(kernel_tq_cpy_f32_tq<3, 128>) tq_cpy_f32_tq_t;
typedef decltype(kernel_tq_get_rows<3, 128>) tq_get_rows_t;
typedef decltype(kernel_tq_cpy_tq_t<float, 3, 128>) tq_cpy_tq_t_t;

#define TQ_MTL_INST(name, BITS, N)                                                                                      \
    template [[host_name("kernel_set_rows_f32_i64_" #name)]] kernel tq_set_rows_t kernel_tq_set_rows<int64_t, BITS, N>; \
    template [[host_name("kernel_set_rows_f32_i32_" #name)]] kernel tq_set_rows_t kernel_tq_set_rows<int32_t, BITS, N>; \
    template [[host_name("kernel_cpy_f32_" #name)]] kernel tq_cpy_f32_tq_t kernel_tq_cpy_f32_tq<BITS, N>;               \
    template [[host_name("kernel_get_rows_" #name)]] kernel tq_get_rows_t kernel_tq_get_rows<BITS, N>;                  \
    template [[host_name("kernel_cpy_" #name "_f32")]] kernel tq_cpy_tq_t_t kernel_tq_cpy_tq_t<float, BITS, N>;         \
    template [[host_name("kernel_cpy_" #name "_f16")]] kernel tq_cpy_tq_t_t kernel_tq_cpy_tq_t<half, BITS, N>;

TQ_MTL_TYPES(TQ_MTL_INST)

// FA: kernel_tq_flash_attn_ext_<K>_<V>_d<D>, every pair with a TQ side of {f16, q8_0, tq3, tq4} (head sizes that
// are multiples of 128) or {f16, q8_0, tq3_64, tq4_64} (64 and 192)
typedef decltype(kernel_tq_flash_attn_ext<TQ_MTL_TQ3, TQ_MTL_TQ3, 128>) tq_fa_t;

#define TQ_MTL_FA(kn, KT, vn, VT, D) \
    template [[host_name("kernel_tq_flash_attn_ext_" #kn "_" #vn "_d" #D)]] kernel tq_fa_t kernel_tq_flash_attn_ext<KT, VT, D>;

#define TQ_MTL_FA_PAIRS(D, A, AT, B, BT)                                                                          \
    TQ_MTL_FA(A, AT, A, AT, D) TQ_MTL_FA(A, AT, B, BT, D) TQ_MTL_FA(B, BT, A, AT, D) TQ_MTL_FA(B, BT, B, BT, D)        \
    TQ_MTL_FA(f16, TQ_MTL_F16, A, AT, D) TQ_MTL_FA(A, AT, f16, TQ_MTL_F16, D)                                      \
    TQ_MTL_FA(f16, TQ_MTL_F16, B, BT, D) TQ_MTL_FA(B, BT, f16, TQ_MTL_F16, D)                                      \
    TQ_MTL_FA(q8_0, TQ_MTL_Q8_0, A, AT, D) TQ_MTL_FA(A, AT, q8_0, TQ_MTL_Q8_0, D)                                  \
    TQ_MTL_FA(q8_0, TQ_MTL_Q8_0, B, BT, D) TQ_MTL_FA(B, BT, q8_0, TQ_MTL_Q8_0, D)

TQ_MTL_FA_PAIRS(128, tq3, TQ_MTL_TQ3, tq4, TQ_MTL_TQ4)
TQ_MTL_FA_PAIRS(256, tq3, TQ_MTL_TQ3, tq4, TQ_MTL_TQ4)
TQ_MTL_FA_PAIRS(64, tq3_64, TQ_MTL_TQ3_64, tq4_64, TQ_MTL_TQ4_64)
TQ_MTL_FA_PAIRS(192, tq3_64, TQ_MTL_TQ3_64, tq4_64, TQ_MTL_TQ4_64)
