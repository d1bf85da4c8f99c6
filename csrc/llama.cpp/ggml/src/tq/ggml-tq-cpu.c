/* CPU kernels of the TQ3/TQ4 KV types: see ggml-tq-cpu.h. Compiled inside ggml-cpu with its arch flags. */
#include "ggml-tq-cpu.h"

#include <math.h>
#include <string.h>

#include "tq_codec.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define GGML_TQ_AVX2 1
#endif
/* AVX-512 (F is enough): 16 lanes per instruction, and a 16-entry in-register table lookup (vpermps) that
 * serves tq4's codebook without the two-lookup blend AVX2 needs. */
#if defined(GGML_TQ_AVX2) && defined(__AVX512F__)
#define GGML_TQ_AVX512 1
#endif

const char *ggml_tq_cpu_isa(void) {
#if defined(GGML_TQ_AVX512)
    return "avx512";
#elif defined(GGML_TQ_AVX2)
    return "avx2";
#else
    return "scalar";
#endif
}

void ggml_tq_qrot_from_float(const float *x, void *y, int64_t k) { tq_rotate_row(x, y, k); }

static inline float tq_scale_of(const uint8_t *blk) {
    return tq_bf16_to_fp32((uint16_t)(blk[0] | (blk[1] << 8)));
}

/* The block's 4 sub-block multiplier indices (4 bits each, sub-block k at bits 4k..4k+3). */
static inline unsigned tq_subs_of(const uint8_t *blk) { return (unsigned)blk[2] | ((unsigned)blk[3] << 8); }

#ifdef GGML_TQ_AVX2
static float tq_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 centroids for 8 indices: one in-register table lookup. */
static inline __m256 tq3_lookup(__m256 table, __m256i idx) { return _mm256_permutevar8x32_ps(table, idx); }

/* 16 centroids: two 8-entry lookups, bit 3 of the index selects between them (moved to the sign bit). */
static inline __m256 tq4_lookup(__m256 lo, __m256 hi, __m256i idx) {
    const __m256 a = _mm256_permutevar8x32_ps(lo, idx);
    const __m256 b = _mm256_permutevar8x32_ps(hi, idx);
    return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
}

/* The 8 indices of values 8g..8g+7 of a tq3 block (group g: 3 bytes). */
static inline __m256i tq3_indices8(const uint8_t *q, int g) {
    const int w = q[3 * g] | (q[3 * g + 1] << 8) | (q[3 * g + 2] << 16);
    const __m256i shifts = _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21);
    return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w), shifts), _mm256_set1_epi32(7));
}

/* The 8 indices of values 32k+8j..32k+8j+7 of a tq4 block: low nibbles of bytes 32(k&1)+8j.. for k < 2, high
 * nibbles for k >= 2 (byte j holds values j and j+64). */
static inline __m256i tq4_indices8(const uint8_t *q, int k, int j) {
    const __m256i raw = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 32 * (k & 1) + 8 * j)));
    return _mm256_and_si256(_mm256_srl_epi32(raw, _mm_cvtsi32_si128(k >= 2 ? 4 : 0)), _mm256_set1_epi32(15));
}

#ifndef GGML_TQ_AVX512 /* superseded there */
/* tq_pick_subscale with 8 values per instruction. Bit-identical to it: the same float comparisons against
 * m * boundary, d = y - m * c and d * d without fused multiply-adds, and the error summed lane by lane
 * (lane = value index mod 8) then reduced in the codec's canonical tree (tq_hsum below). */
static unsigned tq_pick_subscale_avx2(int bits, const float *y, uint8_t *idx) {
    const float *cent = tq_centroids(bits);
    const float *sub = tq_subscales();
    const int nb = (1 << bits) - 1;
    const __m256 c_lo = _mm256_loadu_ps(cent);
    const __m256 c_hi = bits == 4 ? _mm256_loadu_ps(cent + 8) : c_lo;
    const __m256i one = _mm256_set1_epi32(1);
    __m256 yv[4];
    for (int v = 0; v < 4; ++v) {
        yv[v] = _mm256_loadu_ps(y + 8 * v);
    }
    float best_err = INFINITY;
    unsigned best = 0;
    __m256i best_idx[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                           _mm256_setzero_si256()};
    float sb[15];
    for (unsigned j = 0; j < 16; ++j) {
        const float m = sub[j];
        tq_scaled_boundaries(bits, m, sb);
        const __m256 mv = _mm256_set1_ps(m);
        __m256 acc = _mm256_setzero_ps();
        __m256i cand[4];
        for (int v = 0; v < 4; ++v) {
            __m256i cnt = _mm256_setzero_si256();
            for (int t = 0; t < nb; ++t) {
                const __m256 gt = _mm256_cmp_ps(yv[v], _mm256_set1_ps(sb[t]), _CMP_GT_OQ);
                cnt = _mm256_add_epi32(cnt, _mm256_and_si256(_mm256_castps_si256(gt), one));
            }
            cand[v] = cnt;
            const __m256 c = bits == 4 ? tq4_lookup(c_lo, c_hi, cnt) : tq3_lookup(c_lo, cnt);
            const __m256 d = _mm256_sub_ps(yv[v], _mm256_mul_ps(mv, c));
            acc = _mm256_add_ps(acc, _mm256_mul_ps(d, d));
        }
        const float err = tq_hsum(acc);
        if (err < best_err) {
            best_err = err;
            best = j;
            for (int v = 0; v < 4; ++v) {
                best_idx[v] = cand[v];
            }
        }
    }
    for (int v = 0; v < 4; ++v) {
        int32_t tmp[8];
        _mm256_storeu_si256((__m256i *)tmp, best_idx[v]);
        for (int i = 0; i < 8; ++i) {
            idx[8 * v + i] = (uint8_t)tmp[i];
        }
    }
    return best;
}
#endif /* !GGML_TQ_AVX512 */
#endif

#ifdef GGML_TQ_AVX512
/* The 16 indices of values 16h..16h+15 of a tq3 block (groups 2h and 2h+1, 6 bytes). */
static inline __m512i tq3_indices16(const uint8_t *q, int h) {
    const uint8_t *p = q + 6 * h;
    const int w0 = p[0] | (p[1] << 8) | (p[2] << 16);
    const int w1 = p[3] | (p[4] << 8) | (p[5] << 16);
    const __m512i w = _mm512_mask_blend_epi32(0xFF00, _mm512_set1_epi32(w0), _mm512_set1_epi32(w1));
    const __m512i shifts = _mm512_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21, 0, 3, 6, 9, 12, 15, 18, 21);
    return _mm512_and_si512(_mm512_srlv_epi32(w, shifts), _mm512_set1_epi32(7));
}

/* The 16 indices of values 32k+16h..32k+16h+15 of a tq4 block (see tq4_indices8). */
static inline __m512i tq4_indices16(const uint8_t *q, int k, int h) {
    const __m512i raw = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 32 * (k & 1) + 16 * h)));
    return _mm512_and_si512(_mm512_srl_epi32(raw, _mm_cvtsi32_si128(k >= 2 ? 4 : 0)), _mm512_set1_epi32(15));
}

/* Lanes 8..15 (AVX512F only: the f32x8 extract needs DQ). */
static inline __m256 tq_upper8(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

/* The codebook as a 16-entry table (tq3's 8 centroids repeated: its indices are < 8). */
static inline __m512 tq_table16(int bits) {
    const __m256 lo = _mm256_loadu_ps(tq_centroids(bits));
    return bits == 4 ? _mm512_loadu_ps(tq_centroids(4)) : _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(lo), 1));
}

static inline __m512 tq_lookup16(int bits, __m512 table, const uint8_t *q, int k, int h) {
    return _mm512_permutexvar_ps(bits == 3 ? tq3_indices16(q, 2 * k + h) : tq4_indices16(q, k, h), table);
}

/* tq_pick_subscale, 16 values per instruction, bit-identical to it: the AVX2 picker's comparisons and
 * products, and the lane-by-lane error (lane = value index mod 8) rebuilt in the same order before the
 * canonical reduction: ((d0 + d1) + d2) + d3 for the four 8-value runs. */
static unsigned tq_pick_subscale_avx512(int bits, const float *y, uint8_t *idx) {
    const float *sub = tq_subscales();
    const int nb = (1 << bits) - 1;
    const __m512 table = tq_table16(bits);
    const __m512i one = _mm512_set1_epi32(1);
    const __m512 y0 = _mm512_loadu_ps(y), y1 = _mm512_loadu_ps(y + 16);
    float best_err = INFINITY;
    unsigned best = 0;
    __m512i best0 = _mm512_setzero_si512(), best1 = _mm512_setzero_si512();
    float sb[15];
    for (unsigned j = 0; j < 16; ++j) {
        const float m = sub[j];
        tq_scaled_boundaries(bits, m, sb);
        const __m512 mv = _mm512_set1_ps(m);
        __m512i c0 = _mm512_setzero_si512(), c1 = _mm512_setzero_si512();
        for (int t = 0; t < nb; ++t) { /* linear count: independent compares beat a binary search's chain */
            const __m512 b = _mm512_set1_ps(sb[t]);
            c0 = _mm512_mask_add_epi32(c0, _mm512_cmp_ps_mask(y0, b, _CMP_GT_OQ), c0, one);
            c1 = _mm512_mask_add_epi32(c1, _mm512_cmp_ps_mask(y1, b, _CMP_GT_OQ), c1, one);
        }
        const __m512 d0 = _mm512_sub_ps(y0, _mm512_mul_ps(mv, _mm512_permutexvar_ps(c0, table)));
        const __m512 d1 = _mm512_sub_ps(y1, _mm512_mul_ps(mv, _mm512_permutexvar_ps(c1, table)));
        const __m512 e0 = _mm512_mul_ps(d0, d0), e1 = _mm512_mul_ps(d1, d1);
        __m256 acc = _mm256_add_ps(_mm512_castps512_ps256(e0), tq_upper8(e0));
        acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e1));
        acc = _mm256_add_ps(acc, tq_upper8(e1));
        const float err = tq_hsum(acc);
        if (err < best_err) {
            best_err = err;
            best = j;
            best0 = c0;
            best1 = c1;
        }
    }
    _mm_storeu_si128((__m128i *)idx, _mm512_cvtepi32_epi8(best0));
    _mm_storeu_si128((__m128i *)(idx + 16), _mm512_cvtepi32_epi8(best1));
    return best;
}

static float tq_dot_avx512(int bits, int n, const uint8_t *x, const float *q) {
    const float *sub = tq_subscales();
    const __m512 table = tq_table16(bits);
    const size_t bb = tq_block_bytes(bits);
    __m512 total = _mm512_setzero_ps();
    for (int b = 0; b < n / TQ_BLOCK; ++b, x += bb, q += TQ_BLOCK) {
        const unsigned subs = tq_subs_of(x);
        const uint8_t *p = x + TQ_HEADER_BYTES;
        __m512 blk = _mm512_setzero_ps();
        for (int k = 0; k < 4; ++k) {
            __m512 acc = _mm512_mul_ps(tq_lookup16(bits, table, p, k, 0), _mm512_loadu_ps(q + 32 * k));
            acc = _mm512_fmadd_ps(tq_lookup16(bits, table, p, k, 1), _mm512_loadu_ps(q + 32 * k + 16), acc);
            blk = _mm512_fmadd_ps(_mm512_set1_ps(sub[(subs >> (4 * k)) & 15u]), acc, blk);
        }
        total = _mm512_fmadd_ps(_mm512_set1_ps(tq_scale_of(x)), blk, total);
    }
    return _mm512_reduce_add_ps(total);
}

static void tq_to_float_rotated_avx512(int bits, const uint8_t *x, float *y, int64_t k) {
    const float *sub = tq_subscales();
    const __m512 table = tq_table16(bits);
    const size_t bb = tq_block_bytes(bits);
    for (int64_t b = 0; b < k / TQ_BLOCK; ++b, x += bb, y += TQ_BLOCK) {
        const float s = tq_scale_of(x);
        const unsigned subs = tq_subs_of(x);
        const uint8_t *p = x + TQ_HEADER_BYTES;
        for (int kk = 0; kk < 4; ++kk) {
            const __m512 f = _mm512_set1_ps(s * sub[(subs >> (4 * kk)) & 15u]);
            _mm512_storeu_ps(y + 32 * kk, _mm512_mul_ps(f, tq_lookup16(bits, table, p, kk, 0)));
            _mm512_storeu_ps(y + 32 * kk + 16, _mm512_mul_ps(f, tq_lookup16(bits, table, p, kk, 1)));
        }
    }
}
#define TQ_PICKER tq_pick_subscale_avx512
#elif defined(GGML_TQ_AVX2)
#define TQ_PICKER tq_pick_subscale_avx2
#else
#define TQ_PICKER tq_pick_subscale
#endif

void ggml_tq3_from_float(const float *x, void *y, int64_t k) { tq_quantize_row_with(3, x, y, k, TQ_PICKER); }
void ggml_tq4_from_float(const float *x, void *y, int64_t k) { tq_quantize_row_with(4, x, y, k, TQ_PICKER); }

void ggml_vec_dot_tq3_qrot(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, int nrc) {
    (void)bs; (void)bx; (void)by; (void)nrc;
#if defined(GGML_TQ_AVX512)
    *s = tq_dot_avx512(3, n, (const uint8_t *)vx, (const float *)vy);
#elif defined(GGML_TQ_AVX2)
    const uint8_t *x = (const uint8_t *)vx;
    const float *q = (const float *)vy;
    const float *sub = tq_subscales();
    const __m256 table = _mm256_loadu_ps(tq_centroids(3));
    __m256 total = _mm256_setzero_ps();
    for (int b = 0; b < n / TQ_BLOCK; ++b, x += TQ3_BLOCK_BYTES, q += TQ_BLOCK) {
        const unsigned subs = tq_subs_of(x);
        const uint8_t *p = x + TQ_HEADER_BYTES;
        __m256 blk = _mm256_setzero_ps();
        for (int k = 0; k < 4; ++k) {
            __m256 acc = _mm256_setzero_ps();
            for (int g = 4 * k; g < 4 * k + 4; ++g) { /* group g: values 8g..8g+7 in 3 bytes */
                acc = _mm256_fmadd_ps(tq3_lookup(table, tq3_indices8(p, g)), _mm256_loadu_ps(q + 8 * g), acc);
            }
            blk = _mm256_fmadd_ps(_mm256_set1_ps(sub[(subs >> (4 * k)) & 15u]), acc, blk);
        }
        total = _mm256_fmadd_ps(_mm256_set1_ps(tq_scale_of(x)), blk, total);
    }
    *s = tq_hsum(total);
#else
    *s = tq_dot_rotated_row(3, vx, (const float *)vy, n);
#endif
}

void ggml_vec_dot_tq4_qrot(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, int nrc) {
    (void)bs; (void)bx; (void)by; (void)nrc;
#if defined(GGML_TQ_AVX512)
    *s = tq_dot_avx512(4, n, (const uint8_t *)vx, (const float *)vy);
#elif defined(GGML_TQ_AVX2)
    const uint8_t *x = (const uint8_t *)vx;
    const float *q = (const float *)vy;
    const float *sub = tq_subscales();
    const __m256 lo = _mm256_loadu_ps(tq_centroids(4));
    const __m256 hi = _mm256_loadu_ps(tq_centroids(4) + 8);
    __m256 total = _mm256_setzero_ps();
    for (int b = 0; b < n / TQ_BLOCK; ++b, x += TQ4_BLOCK_BYTES, q += TQ_BLOCK) {
        const unsigned subs = tq_subs_of(x);
        const uint8_t *p = x + TQ_HEADER_BYTES;
        __m256 blk = _mm256_setzero_ps();
        for (int k = 0; k < 4; ++k) {
            __m256 acc = _mm256_setzero_ps();
            for (int j = 0; j < 4; ++j) {
                const __m256 c = tq4_lookup(lo, hi, tq4_indices8(p, k, j));
                acc = _mm256_fmadd_ps(c, _mm256_loadu_ps(q + 32 * k + 8 * j), acc);
            }
            blk = _mm256_fmadd_ps(_mm256_set1_ps(sub[(subs >> (4 * k)) & 15u]), acc, blk);
        }
        total = _mm256_fmadd_ps(_mm256_set1_ps(tq_scale_of(x)), blk, total);
    }
    *s = tq_hsum(total);
#else
    *s = tq_dot_rotated_row(4, vx, (const float *)vy, n);
#endif
}

/* Rotated-domain row decode for the FA V path: y = s * m_k * c[idx] per value. */
#if defined(GGML_TQ_AVX2) && !defined(GGML_TQ_AVX512)
static void tq_to_float_rotated_avx2(int bits, const uint8_t *x, float *y, int64_t k) {
    const float *cent = tq_centroids(bits);
    const float *sub = tq_subscales();
    const __m256 c_lo = _mm256_loadu_ps(cent);
    const __m256 c_hi = bits == 4 ? _mm256_loadu_ps(cent + 8) : c_lo;
    const size_t bb = tq_block_bytes(bits);
    for (int64_t b = 0; b < k / TQ_BLOCK; ++b, x += bb, y += TQ_BLOCK) {
        const float s = tq_scale_of(x);
        const unsigned subs = tq_subs_of(x);
        const uint8_t *p = x + TQ_HEADER_BYTES;
        for (int kk = 0; kk < 4; ++kk) {
            const __m256 f = _mm256_set1_ps(s * sub[(subs >> (4 * kk)) & 15u]);
            for (int j = 0; j < 4; ++j) {
                const int g = 4 * kk + j; /* 8 values 8g..8g+7 */
                const __m256 c = bits == 3 ? tq3_lookup(c_lo, tq3_indices8(p, g))
                                           : tq4_lookup(c_lo, c_hi, tq4_indices8(p, kk, j));
                _mm256_storeu_ps(y + 8 * g, _mm256_mul_ps(f, c));
            }
        }
    }
}
#endif

void ggml_tq3_to_float_rotated(const void *x, float *y, int64_t k) {
#if defined(GGML_TQ_AVX512)
    tq_to_float_rotated_avx512(3, (const uint8_t *)x, y, k);
#elif defined(GGML_TQ_AVX2)
    tq_to_float_rotated_avx2(3, (const uint8_t *)x, y, k);
#else
    tq_dequantize_row_rotated(3, x, y, k);
#endif
}

void ggml_tq4_to_float_rotated(const void *x, float *y, int64_t k) {
#if defined(GGML_TQ_AVX512)
    tq_to_float_rotated_avx512(4, (const uint8_t *)x, y, k);
#elif defined(GGML_TQ_AVX2)
    tq_to_float_rotated_avx2(4, (const uint8_t *)x, y, k);
#else
    tq_dequantize_row_rotated(4, x, y, k);
#endif
}

void ggml_tq_unrotate_inplace(float *v, int64_t n) { tq_unrotate_row(v, v, n); }

/* Blocks of nb = 64 or 96 values, 8 per instruction (AVX2; under AVX-512 the 64-value blocks have 16-wide code of
 * their own). Sub-block k is values (nb/4)k .. (nb/4)(k+1)-1, nb/32 groups of 8: for tq3 the 3-byte groups
 * (nb/32)k + j; for tq4 the low (k < 2) or high (k >= 2) nibbles of bytes (nb/4)(k & 1) + 8j .. (byte i holds
 * values i and i + nb/2). Without AVX2: the codec's C loops. */
#if defined(GGML_TQ_AVX2)
static inline __m256 tqn_lookup8(int bits, int nb, __m256 lo, __m256 hi, const uint8_t *p, int k, int j) {
    if (bits == 3) {
        return tq3_lookup(lo, tq3_indices8(p, nb / 32 * k + j));
    }
    const __m256i raw = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + nb / 4 * (k & 1) + 8 * j)));
    const __m256i idx = _mm256_and_si256(_mm256_srl_epi32(raw, _mm_cvtsi32_si128(k >= 2 ? 4 : 0)),
                                         _mm256_set1_epi32(15));
    return tq4_lookup(lo, hi, idx);
}

static float tqn_dot(int bits, int nb, int n, const uint8_t *x, const float *q) {
    const float *sub = tq_subscales();
    const float *cent = tq_centroids_n(bits, nb);
    const __m256 lo = _mm256_loadu_ps(cent);
    const __m256 hi = bits == 4 ? _mm256_loadu_ps(cent + 8) : lo;
    const size_t bb = tq_block_bytes_n(bits, nb);
    const int len = nb / 4;
    __m256 total = _mm256_setzero_ps();
    for (int b = 0; b < n / nb; ++b, x += bb, q += nb) {
        const unsigned subs = tq_subs_of(x);
        const uint8_t *p = x + TQ_HEADER_BYTES;
        __m256 blk = _mm256_setzero_ps();
        for (int k = 0; k < 4; ++k) {
            __m256 acc = _mm256_mul_ps(tqn_lookup8(bits, nb, lo, hi, p, k, 0), _mm256_loadu_ps(q + len * k));
            for (int j = 1; j < nb / 32; ++j) {
                const __m256 c = tqn_lookup8(bits, nb, lo, hi, p, k, j);
                acc = _mm256_fmadd_ps(c, _mm256_loadu_ps(q + len * k + 8 * j), acc);
            }
            blk = _mm256_fmadd_ps(_mm256_set1_ps(sub[(subs >> (4 * k)) & 15u]), acc, blk);
        }
        total = _mm256_fmadd_ps(_mm256_set1_ps(tq_scale_of(x)), blk, total);
    }
    return tq_hsum(total);
}

static void tqn_to_float_rotated(int bits, int nb, const uint8_t *x, float *y, int64_t k) {
    const float *sub = tq_subscales();
    const float *cent = tq_centroids_n(bits, nb);
    const __m256 lo = _mm256_loadu_ps(cent);
    const __m256 hi = bits == 4 ? _mm256_loadu_ps(cent + 8) : lo;
    const size_t bb = tq_block_bytes_n(bits, nb);
    const int len = nb / 4;
    for (int64_t b = 0; b < k / nb; ++b, x += bb, y += nb) {
        const float s = tq_scale_of(x);
        const unsigned subs = tq_subs_of(x);
        const uint8_t *p = x + TQ_HEADER_BYTES;
        for (int kk = 0; kk < 4; ++kk) {
            const __m256 f = _mm256_set1_ps(s * sub[(subs >> (4 * kk)) & 15u]);
            for (int j = 0; j < nb / 32; ++j) {
                _mm256_storeu_ps(y + len * kk + 8 * j, _mm256_mul_ps(f, tqn_lookup8(bits, nb, lo, hi, p, kk, j)));
            }
        }
    }
}
#else
static float tqn_dot(int bits, int nb, int n, const uint8_t *x, const float *q) {
    return tq_dot_rotated_row_n(bits, nb, x, q, n);
}

static void tqn_to_float_rotated(int bits, int nb, const uint8_t *x, float *y, int64_t k) {
    (void)tq_dequantize_row_rotated_n(bits, nb, x, y, k);
}
#endif

/* The 64-value blocks (heads that are not a multiple of 128). Quantizing is the codec's C code (one row per token
 * and KV head); the K dot and the FA V rows, which run over the whole cache, have SIMD versions. Sub-block k is
 * values 16k..16k+15: for tq3 the 3-byte groups 2k and 2k+1, as in the 128-value layout; for tq4 the low (k < 2)
 * or high (k >= 2) nibbles of bytes 16(k & 1).. (byte j holds values j and j + 32). */
void ggml_tq3_64_from_float(const float *x, void *y, int64_t k) { (void)tq_quantize_row_n(3, TQ_BLOCK_64, x, y, k); }
void ggml_tq4_64_from_float(const float *x, void *y, int64_t k) { (void)tq_quantize_row_n(4, TQ_BLOCK_64, x, y, k); }
void ggml_tq_qrot_64_from_float(const float *x, void *y, int64_t k) { tq_rotate_row_64(x, y, k); }

#if defined(GGML_TQ_AVX512)
static inline __m512i tq4_64_indices16(const uint8_t *q, int k) {
    const __m512i raw = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16 * (k & 1))));
    return _mm512_and_si512(_mm512_srl_epi32(raw, _mm_cvtsi32_si128(k >= 2 ? 4 : 0)), _mm512_set1_epi32(15));
}

/* The d = 64 codebook as a 16-entry table (tq3's 8 centroids repeated). */
static inline __m512 tq64_table16(int bits) {
    const float *c = tq_centroids_n(bits, TQ_BLOCK_64);
    const __m256 lo = _mm256_loadu_ps(c);
    return bits == 4 ? _mm512_loadu_ps(c)
                     : _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)),
                                                           _mm256_castps_pd(lo), 1));
}

static inline __m512 tq64_lookup16(int bits, __m512 table, const uint8_t *p, int k) {
    return _mm512_permutexvar_ps(bits == 3 ? tq3_indices16(p, k) : tq4_64_indices16(p, k), table);
}

static float tq64_dot(int bits, int n, const uint8_t *x, const float *q) {
    const float *sub = tq_subscales();
    const __m512 table = tq64_table16(bits);
    const size_t bb = tq_block_bytes_n(bits, TQ_BLOCK_64);
    __m512 total = _mm512_setzero_ps();
    for (int b = 0; b < n / TQ_BLOCK_64; ++b, x += bb, q += TQ_BLOCK_64) {
        const unsigned subs = tq_subs_of(x);
        const uint8_t *p = x + TQ_HEADER_BYTES;
        __m512 blk = _mm512_setzero_ps();
        for (int k = 0; k < 4; ++k) {
            const __m512 acc = _mm512_mul_ps(tq64_lookup16(bits, table, p, k), _mm512_loadu_ps(q + 16 * k));
            blk = _mm512_fmadd_ps(_mm512_set1_ps(sub[(subs >> (4 * k)) & 15u]), acc, blk);
        }
        total = _mm512_fmadd_ps(_mm512_set1_ps(tq_scale_of(x)), blk, total);
    }
    return _mm512_reduce_add_ps(total);
}

static void tq64_to_float_rotated(int bits, const uint8_t *x, float *y, int64_t k) {
    const float *sub = tq_subscales();
    const __m512 table = tq64_table16(bits);
    const size_t bb = tq_block_bytes_n(bits, TQ_BLOCK_64);
    for (int64_t b = 0; b < k / TQ_BLOCK_64; ++b, x += bb, y += TQ_BLOCK_64) {
        const float s = tq_scale_of(x);
        const unsigned subs = tq_subs_of(x);
        const uint8_t *p = x + TQ_HEADER_BYTES;
        for (int kk = 0; kk < 4; ++kk) {
            const __m512 f = _mm512_set1_ps(s * sub[(subs >> (4 * kk)) & 15u]);
            _mm512_storeu_ps(y + 16 * kk, _mm512_mul_ps(f, tq64_lookup16(bits, table, p, kk)));
        }
    }
}
#else
static float tq64_dot(int bits, int n, const uint8_t *x, const float *q) { return tqn_dot(bits, TQ_BLOCK_64, n, x, q); }

static void tq64_to_float_rotated(int bits, const uint8_t *x, float *y, int64_t k) {
    tqn_to_float_rotated(bits, TQ_BLOCK_64, x, y, k);
}
#endif

void ggml_vec_dot_tq3_64_qrot(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by,
                              int nrc) {
    (void)bs; (void)bx; (void)by; (void)nrc;
    *s = tq64_dot(3, n, (const uint8_t *)vx, (const float *)vy);
}

void ggml_vec_dot_tq4_64_qrot(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by,
                              int nrc) {
    (void)bs; (void)bx; (void)by; (void)nrc;
    *s = tq64_dot(4, n, (const uint8_t *)vx, (const float *)vy);
}

static void tq3_64_to_float_rotated(const void *x, float *y, int64_t k) { tq64_to_float_rotated(3, x, y, k); }
static void tq4_64_to_float_rotated(const void *x, float *y, int64_t k) { tq64_to_float_rotated(4, x, y, k); }
static void tq_unrotate_64_inplace(float *v, int64_t n) { tq_unrotate_row_64(v, v, n); }

/* The 96-value blocks (heads of 96: Phi-3). Quantizing is the codec's C code; the K dot and the FA V rows are
 * tqn_dot / tqn_to_float_rotated (8 values per instruction under AVX2 and AVX-512). */
void ggml_tq3_96_from_float(const float *x, void *y, int64_t k) { (void)tq_quantize_row_n(3, TQ_BLOCK_96, x, y, k); }
void ggml_tq4_96_from_float(const float *x, void *y, int64_t k) { (void)tq_quantize_row_n(4, TQ_BLOCK_96, x, y, k); }
void ggml_tq_qrot_96_from_float(const float *x, void *y, int64_t k) { tq_rotate_row_96(x, y, k); }


void ggml_vec_dot_tq3_96_qrot(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by,
                              int nrc) {
    (void)bs; (void)bx; (void)by; (void)nrc;
    *s = tqn_dot(3, TQ_BLOCK_96, n, (const uint8_t *)vx, (const float *)vy);
}

void ggml_vec_dot_tq4_96_qrot(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by,
                              int nrc) {
    (void)bs; (void)bx; (void)by; (void)nrc;
    *s = tqn_dot(4, TQ_BLOCK_96, n, (const uint8_t *)vx, (const float *)vy);
}

static void tq3_96_to_float_rotated(const void *x, float *y, int64_t k) {
    tqn_to_float_rotated(3, TQ_BLOCK_96, x, y, k);
}
static void tq4_96_to_float_rotated(const void *x, float *y, int64_t k) {
    tqn_to_float_rotated(4, TQ_BLOCK_96, x, y, k);
}
static void tq_unrotate_96_inplace(float *v, int64_t n) { tq_unrotate_row_96(v, v, n); }

ggml_to_float_t ggml_tq_fa_v_to_float(enum ggml_type type, ggml_tq_unrotate_t *unrotate) {
    switch (type) {
        case GGML_TYPE_TQ3_96:
            *unrotate = tq_unrotate_96_inplace;
            return tq3_96_to_float_rotated;
        case GGML_TYPE_TQ4_96:
            *unrotate = tq_unrotate_96_inplace;
            return tq4_96_to_float_rotated;
        case GGML_TYPE_TQ3_64:
            *unrotate = tq_unrotate_64_inplace;
            return tq3_64_to_float_rotated;
        case GGML_TYPE_TQ4_64:
            *unrotate = tq_unrotate_64_inplace;
            return tq4_64_to_float_rotated;
        case GGML_TYPE_TQ3:
            *unrotate = ggml_tq_unrotate_inplace;
            return ggml_tq3_to_float_rotated;
        case GGML_TYPE_TQ4:
            *unrotate = ggml_tq_unrotate_inplace;
            return ggml_tq4_to_float_rotated;
        default:
            return NULL;
    }
}
