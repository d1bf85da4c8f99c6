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
/* The 16 indices of tq3 groups 2h and 2h+1 (values 16h..16h+15, 6 bytes). */
static inline __m512i tq3_indices16(const uint8_t *q, int h) {
    const uint8_t *p = q + 6 * h;
    const int w0 = p[0] | (p[1] << 8) | (p[2] << 16);
    const int w1 = p[3] | (p[4] << 8) | (p[5] << 16);
    const __m512i w = _mm512_mask_blend_epi32(0xFF00, _mm512_set1_epi32(w0), _mm512_set1_epi32(w1));
    const __m512i shifts = _mm512_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21, 0, 3, 6, 9, 12, 15, 18, 21);
    return _mm512_and_si512(_mm512_srlv_epi32(w, shifts), _mm512_set1_epi32(7));
}

/* Lanes 8..15 (AVX512F only: the f32x8 extract needs DQ). */
static inline __m256 tq_upper8(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

/* A codebook as a 16-entry table (tq3's 8 centroids repeated: its indices are < 8). */
static inline __m512 tq_table16(const float *cent, int bits) {
    const __m256 lo = _mm256_loadu_ps(cent);
    return bits == 4 ? _mm512_loadu_ps(cent)
                     : _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)),
                                                           _mm256_castps_pd(lo), 1));
}

/* tq_pick_subscale, 16 values per instruction, bit-identical to it: the AVX2 picker's comparisons and
 * products, and the lane-by-lane error (lane = value index mod 8) rebuilt in the same order before the
 * canonical reduction: ((d0 + d1) + d2) + d3 for the four 8-value runs. */
static unsigned tq_pick_subscale_avx512(int bits, const float *y, uint8_t *idx) {
    const float *sub = tq_subscales();
    const int nb = (1 << bits) - 1;
    const __m512 table = tq_table16(tq_centroids(bits), bits);
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

#define TQ_PICKER tq_pick_subscale_avx512
#elif defined(GGML_TQ_AVX2)
#define TQ_PICKER tq_pick_subscale_avx2
#else
#define TQ_PICKER tq_pick_subscale
#endif

/* One K dot and one V-row decoder for every block size nb (tq_formats.h). Sub-block k holds values (nb/4)k ..
 * (nb/4)(k+1)-1: for tq3 the 3-byte groups of 8 values (nb/32)k + j; for tq4 the low (k < 2) or high (k >= 2)
 * nibbles of bytes (nb/4)(k & 1) + .. (byte i holds values i and i + nb/2). 16 values per instruction under AVX-512
 * where a sub-block is a multiple of 16 values (nb = 64, 128), 8 under AVX2 (and nb = 96 under AVX-512), the
 * codec's C loops otherwise. */
#if defined(GGML_TQ_AVX2)
/* Values (nb/4)k + 8j .. +7 of sub-block k. */
static inline __m256 tq_lookup8(int bits, int nb, __m256 lo, __m256 hi, const uint8_t *p, int k, int j) {
    if (bits == 3) {
        return tq3_lookup(lo, tq3_indices8(p, nb / 32 * k + j));
    }
    const __m256i raw = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + nb / 4 * (k & 1) + 8 * j)));
    const __m256i idx = _mm256_and_si256(_mm256_srl_epi32(raw, _mm_cvtsi32_si128(k >= 2 ? 4 : 0)),
                                         _mm256_set1_epi32(15));
    return tq4_lookup(lo, hi, idx);
}
#endif

#if defined(GGML_TQ_AVX512)
/* Values (nb/4)k + 16h .. +15 of sub-block k. */
static inline __m512 tq_lookup16(int bits, int nb, __m512 table, const uint8_t *p, int k, int h) {
    if (bits == 3) {
        return _mm512_permutexvar_ps(tq3_indices16(p, nb / 64 * k + h), table);
    }
    const __m512i raw = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + nb / 4 * (k & 1) + 16 * h)));
    const __m512i idx = _mm512_and_si512(_mm512_srl_epi32(raw, _mm_cvtsi32_si128(k >= 2 ? 4 : 0)),
                                         _mm512_set1_epi32(15));
    return _mm512_permutexvar_ps(idx, table);
}

static float tq_dot16(int bits, int nb, int n, const uint8_t *x, const float *q) {
    const float *sub = tq_subscales();
    const __m512 table = tq_table16(tq_centroids_n(bits, nb), bits);
    const size_t bb = tq_block_bytes_n(bits, nb);
    const int len = nb / 4;
    __m512 total = _mm512_setzero_ps();
    for (int b = 0; b < n / nb; ++b, x += bb, q += nb) {
        const unsigned subs = tq_subs_of(x);
        const uint8_t *p = x + TQ_HEADER_BYTES;
        __m512 blk = _mm512_setzero_ps();
        for (int k = 0; k < 4; ++k) {
            __m512 acc = _mm512_mul_ps(tq_lookup16(bits, nb, table, p, k, 0), _mm512_loadu_ps(q + len * k));
            for (int h = 1; h < len / 16; ++h) {
                acc = _mm512_fmadd_ps(tq_lookup16(bits, nb, table, p, k, h), _mm512_loadu_ps(q + len * k + 16 * h), acc);
            }
            blk = _mm512_fmadd_ps(_mm512_set1_ps(sub[(subs >> (4 * k)) & 15u]), acc, blk);
        }
        total = _mm512_fmadd_ps(_mm512_set1_ps(tq_scale_of(x)), blk, total);
    }
    return _mm512_reduce_add_ps(total);
}

static void tq_rows16(int bits, int nb, const uint8_t *x, float *y, int64_t k) {
    const float *sub = tq_subscales();
    const __m512 table = tq_table16(tq_centroids_n(bits, nb), bits);
    const size_t bb = tq_block_bytes_n(bits, nb);
    const int len = nb / 4;
    for (int64_t b = 0; b < k / nb; ++b, x += bb, y += nb) {
        const float s = tq_scale_of(x);
        const unsigned subs = tq_subs_of(x);
        const uint8_t *p = x + TQ_HEADER_BYTES;
        for (int kk = 0; kk < 4; ++kk) {
            const __m512 f = _mm512_set1_ps(s * sub[(subs >> (4 * kk)) & 15u]);
            for (int h = 0; h < len / 16; ++h) {
                _mm512_storeu_ps(y + len * kk + 16 * h, _mm512_mul_ps(f, tq_lookup16(bits, nb, table, p, kk, h)));
            }
        }
    }
}
#endif

static float tq_dot(int bits, int nb, int n, const uint8_t *x, const float *q) {
#if defined(GGML_TQ_AVX512)
    if (nb % 64 == 0) {
        return tq_dot16(bits, nb, n, x, q);
    }
#endif
#if defined(GGML_TQ_AVX2)
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
            __m256 acc = _mm256_mul_ps(tq_lookup8(bits, nb, lo, hi, p, k, 0), _mm256_loadu_ps(q + len * k));
            for (int j = 1; j < len / 8; ++j) {
                acc = _mm256_fmadd_ps(tq_lookup8(bits, nb, lo, hi, p, k, j), _mm256_loadu_ps(q + len * k + 8 * j), acc);
            }
            blk = _mm256_fmadd_ps(_mm256_set1_ps(sub[(subs >> (4 * k)) & 15u]), acc, blk);
        }
        total = _mm256_fmadd_ps(_mm256_set1_ps(tq_scale_of(x)), blk, total);
    }
    return tq_hsum(total);
#else
    return tq_dot_rotated_row_n(bits, nb, x, q, n);
#endif
}

/* Rotated-domain row decode for the FA V path: y = s * m_k * c[idx] per value. */
static void tq_rows_rotated(int bits, int nb, const uint8_t *x, float *y, int64_t k) {
#if defined(GGML_TQ_AVX512)
    if (nb % 64 == 0) {
        tq_rows16(bits, nb, x, y, k);
        return;
    }
#endif
#if defined(GGML_TQ_AVX2)
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
            for (int j = 0; j < len / 8; ++j) {
                _mm256_storeu_ps(y + len * kk + 8 * j, _mm256_mul_ps(f, tq_lookup8(bits, nb, lo, hi, p, kk, j)));
            }
        }
    }
#else
    (void)tq_dequantize_row_rotated_n(bits, nb, x, y, k);
#endif
}

/* Quantizing is the codec (the CPU cache holds exactly its bytes); the 128-value blocks, the common case, search
 * their sub-block scales with SIMD (bit-identical to tq_pick_subscale), the others run the codec's C code (one
 * row per token and KV head: the dot and the V rows, which run over the whole cache, are what needs speed). */
static void tq_quantize(int bits, int nb, const float *x, void *y, int64_t k) {
    if (nb == TQ_BLOCK) {
        (void)tq_quantize_row_with(bits, x, y, k, TQ_PICKER);
    } else {
        (void)tq_quantize_row_n(bits, nb, x, y, k);
    }
}

/* The ggml entry points, one set per format (tq_formats.h). */
#define TQ_CPU_ENTRIES(name, NAME, values, bits, bytes, qrot)                                                        \
    void ggml_##name##_from_float(const float *x, void *y, int64_t k) { tq_quantize(bits, values, x, y, k); }       \
    void ggml_vec_dot_##name##_qrot(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, \
                                    int nrc) {                                                                       \
        (void)bs; (void)bx; (void)by; (void)nrc;                                                                     \
        *s = tq_dot(bits, values, n, (const uint8_t *)vx, (const float *)vy);                                        \
    }                                                                                                                \
    static void tq_rows_rotated_##NAME(const void *x, float *y, int64_t k) {                                         \
        tq_rows_rotated(bits, values, (const uint8_t *)x, y, k);                                                     \
    }
#define TQ_CPU_QROT_ENTRIES(name, NAME, values, sfx)                                                                 \
    void ggml_##name##_from_float(const float *x, void *y, int64_t k) { tq_rotate_row##sfx(x, y, k); }              \
    static void tq_unrotate_##NAME(float *v, int64_t n) { tq_unrotate_row##sfx(v, v, n); }
TQ_FORMATS(TQ_CPU_ENTRIES)
TQ_QROT_FORMATS(TQ_CPU_QROT_ENTRIES)

ggml_to_float_t ggml_tq_fa_v_to_float(enum ggml_type type, ggml_tq_unrotate_t *unrotate) {
    switch (type) {
#define TQ_CPU_FA_V_CASE(name, NAME, values, bits, bytes, qrot)                                                      \
    case GGML_TYPE_##NAME:                                                                                           \
        *unrotate = tq_unrotate_##qrot;                                                                              \
        return tq_rows_rotated_##NAME;
        TQ_FORMATS(TQ_CPU_FA_V_CASE)
#undef TQ_CPU_FA_V_CASE
        default:
            return NULL;
    }
}

/* TQ3A (keys only): the codec's own quantizer (one row per token and KV head); the dot, which runs over every cached
 * key, decodes each sub-block of 32 values straight from the packed bytes (tq_codec.h's layout) against the query
 * rotated group by group: 8 values per instruction under AVX2, the codec's C loop otherwise. */
void ggml_tq3a_from_float(const float *x, void *y, int64_t k) { tq3a_quantize_row(x, y, k); }

#if defined(GGML_TQ_AVX2)
/* Values 8j..8j+7 of sub-block sb as centroid indices (int32 lanes). */
static inline __m256i tq3a_indices8(const uint8_t *b, int sb, int j) {
    if (sb == 0) { /* 5 bits: the 40-bit word of values 8j..8j+7; lanes 6, 7 read it from byte 1 on */
        const uint8_t *p = b + 12 + 5 * j;
        const uint32_t lo = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
        const uint32_t hi = (uint32_t)p[1] | ((uint32_t)p[2] << 8) | ((uint32_t)p[3] << 16) | ((uint32_t)p[4] << 24);
        const __m256i w = _mm256_setr_epi32((int)lo, (int)lo, (int)lo, (int)lo, (int)lo, (int)lo, (int)hi, (int)hi);
        const __m256i sh = _mm256_setr_epi32(0, 5, 10, 15, 20, 25, 22, 27);
        return _mm256_and_si256(_mm256_srlv_epi32(w, sh), _mm256_set1_epi32(31));
    }
    if (sb == 1) { /* 4 bits: values 0..15 the low nibbles of bytes 32..47, 16..31 their high nibbles */
        const __m256i raw = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + 32 + 8 * (j & 1))));
        return _mm256_and_si256(_mm256_srl_epi32(raw, _mm_cvtsi32_si128(j >= 2 ? 4 : 0)), _mm256_set1_epi32(15));
    }
    if (sb < 4) { /* 3 bits: group 2's 3-byte words, sub-block 2 the first four, 3 the next */
        return tq3_indices8(b + 48, 4 * (sb - 2) + j);
    }
    /* 2 bits: quarter sb - 4 of group 3 is bits 2(sb - 4) of bytes 72..103 */
    const __m256i raw = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + 72 + 8 * j)));
    return _mm256_and_si256(_mm256_srl_epi32(raw, _mm_cvtsi32_si128(2 * (sb - 4))), _mm256_set1_epi32(3));
}

/* Centroids of up to 32 entries: lo, hi hold entries 0..7, 8..15 (and lo2, hi2 16..31); bits 3 and 4 of the index
 * pick the table (moved to the sign bit for the blends). */
static inline __m256 tq3a_lookup(const __m256 *t, int bits, __m256i idx) {
    if (bits <= 3) {
        return _mm256_permutevar8x32_ps(t[0], idx);
    }
    const __m256 a = tq4_lookup(t[0], t[1], idx);
    if (bits == 4) {
        return a;
    }
    const __m256 c = tq4_lookup(t[2], t[3], idx);
    return _mm256_blendv_ps(a, c, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 27)));
}

static float tq3a_dot_avx2(const uint8_t *x, const float *q, int n) {
    static const int bits_of[8] = {5, 4, 3, 3, 2, 2, 2, 2};
    static const int group_of[8] = {0, 1, 2, 2, 3, 3, 3, 3};
    const float *sub = tq_subscales();
    __m256 t[4][4];
    for (int g = 0; g < TQ3A_GROUPS_N; ++g) { /* the groups' codebooks, padded to whole tables */
        float pad[32] = {0};
        const int levels = 1 << TQ3A_GROUP_BITS[g];
        memcpy(pad, tq3a_centroids(g), (size_t)levels * sizeof(float));
        for (int k = 0; k < 4; ++k) {
            t[g][k] = _mm256_loadu_ps(pad + 8 * k);
        }
    }
    __m256 total = _mm256_setzero_ps();
    for (int b = 0; b < n / TQ3A_BLOCK; ++b, x += TQ3A_BLOCK_BYTES, q += TQ3A_BLOCK) {
        const unsigned subs = (unsigned)x[8] | ((unsigned)x[9] << 8) | ((unsigned)x[10] << 16) | ((unsigned)x[11] << 24);
        __m256 grp[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int sb = 0; sb < 8; ++sb) {
            const int g = group_of[sb];
            __m256 acc = _mm256_mul_ps(tq3a_lookup(t[g], bits_of[sb], tq3a_indices8(x, sb, 0)), _mm256_loadu_ps(q + 32 * sb));
            for (int j = 1; j < 4; ++j) {
                acc = _mm256_fmadd_ps(tq3a_lookup(t[g], bits_of[sb], tq3a_indices8(x, sb, j)),
                                      _mm256_loadu_ps(q + 32 * sb + 8 * j), acc);
            }
            grp[g] = _mm256_fmadd_ps(_mm256_set1_ps(sub[(subs >> (4 * sb)) & 15u]), acc, grp[g]);
        }
        for (int g = 0; g < TQ3A_GROUPS_N; ++g) {
            const float s = tq_bf16_to_fp32((uint16_t)(x[2 * g] | (x[2 * g + 1] << 8)));
            total = _mm256_fmadd_ps(_mm256_set1_ps(s), grp[g], total);
        }
    }
    return tq_hsum(total);
}
#endif

void ggml_vec_dot_tq3a_qrot(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by,
                            int nrc) {
    (void)bs; (void)bx; (void)by; (void)nrc;
#if defined(GGML_TQ_AVX2)
    *s = tq3a_dot_avx2((const uint8_t *)vx, (const float *)vy, n);
#else
    *s = tq3a_dot_rotated_row(vx, (const float *)vy, n);
#endif
}
void ggml_tq_qrot_a_from_float(const float *x, void *y, int64_t k) { tq3a_rotate_row(x, y, k); }
