/* TurboQuant codec: see tq_codec.h for the algorithm and the exact bit layout. */
#include "tq_codec.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "tq_codebooks.h"

#define TQ_S128_0 0x76bcc29au
#define TQ_S128_1 0xec660926u
#define TQ_S128_2 0xfdbbf446u
#define TQ_S128_3 0x70d451fcu
#define TQ_S64_0 0x31de3918u
#define TQ_S64_1 0x1ab9667fu
const uint32_t TQ_SIGNS[4] = {TQ_S128_0, TQ_S128_1, TQ_S128_2, TQ_S128_3};
const uint32_t TQ_SIGNS_64[2] = {TQ_S64_0, TQ_S64_1};
const uint32_t TQ_SIGNS_96[3] = {0xee925594u, 0x732130adu, 0xd04c4e8bu};

/* One block format: 128-value blocks (TQ3/TQ4), 64-value blocks (TQ3_64/TQ4_64) or 96-value blocks
 * (TQ3_96/TQ4_96). All have the 4-byte header and 4 sub-blocks (of n/4 values); they differ in the rotation, its
 * signs and the codebook's law. The rotation is a Walsh-Hadamard transform of n values, or for n = 96 three
 * 32-point transforms mixed by the 3x3 orthogonal matrix (1/3)[1 2 2; 2 1 -2; 2 -2 1] (tq_mix3). */
typedef struct {
    int bits;
    int n;
    size_t bytes;
    const float *cent;
    const float *bounds;
    const uint32_t *signs;
    float wht_norm; /* 1/sqrt(n) (n = 96: 1/(3 sqrt(32)), the mix's 1/3 included) */
    int wht_n;      /* size of each Walsh-Hadamard transform: n, or 32 for n = 96 */
} tq_fmt;

static const tq_fmt TQ_FMT3 = {3,        TQ_BLOCK,    TQ3_BLOCK_BYTES, TQ3_CENTROIDS, TQ3_BOUNDARIES,
                               TQ_SIGNS, TQ_WHT_NORM, TQ_BLOCK};
static const tq_fmt TQ_FMT4 = {4,        TQ_BLOCK,    TQ4_BLOCK_BYTES, TQ4_CENTROIDS, TQ4_BOUNDARIES,
                               TQ_SIGNS, TQ_WHT_NORM, TQ_BLOCK};
static const tq_fmt TQ_FMT3_64 = {3,           TQ_BLOCK_64,    TQ3_64_BLOCK_BYTES, TQ3_64_CENTROIDS,
                                  TQ3_64_BOUNDARIES, TQ_SIGNS_64, TQ_WHT_NORM_64, TQ_BLOCK_64};
static const tq_fmt TQ_FMT4_64 = {4,           TQ_BLOCK_64,    TQ4_64_BLOCK_BYTES, TQ4_64_CENTROIDS,
                                  TQ4_64_BOUNDARIES, TQ_SIGNS_64, TQ_WHT_NORM_64, TQ_BLOCK_64};
static const tq_fmt TQ_FMT3_96 = {3,           TQ_BLOCK_96,    TQ3_96_BLOCK_BYTES, TQ3_96_CENTROIDS,
                                  TQ3_96_BOUNDARIES, TQ_SIGNS_96, TQ_WHT_NORM_96, 32};
static const tq_fmt TQ_FMT4_96 = {4,           TQ_BLOCK_96,    TQ4_96_BLOCK_BYTES, TQ4_96_CENTROIDS,
                                  TQ4_96_BOUNDARIES, TQ_SIGNS_96, TQ_WHT_NORM_96, 32};

static const tq_fmt *tq_fmt_of(int bits, int n) {
    if (n == TQ_BLOCK) {
        return bits == 3 ? &TQ_FMT3 : bits == 4 ? &TQ_FMT4 : NULL;
    }
    if (n == TQ_BLOCK_64) {
        return bits == 3 ? &TQ_FMT3_64 : bits == 4 ? &TQ_FMT4_64 : NULL;
    }
    if (n == TQ_BLOCK_96) {
        return bits == 3 ? &TQ_FMT3_96 : bits == 4 ? &TQ_FMT4_96 : NULL;
    }
    return NULL;
}

size_t tq_block_bytes_n(int bits, int n) {
    const tq_fmt *f = tq_fmt_of(bits, n);
    return f ? f->bytes : 0;
}

size_t tq_block_bytes(int bits) { return tq_block_bytes_n(bits, TQ_BLOCK); }

const float *tq_centroids_n(int bits, int n) {
    const tq_fmt *f = tq_fmt_of(bits, n);
    return f ? f->cent : NULL;
}

const float *tq_centroids(int bits) { return tq_centroids_n(bits, TQ_BLOCK); }

static int tq_levels(int bits) { return 1 << bits; }

static float tq_sign(const uint32_t *signs, int i) { return (signs[i >> 5] >> (i & 31)) & 1u ? -1.0f : 1.0f; }

/* Unnormalized in-place fast Walsh-Hadamard transform of n values, natural (Sylvester) order: its butterfly stages
 * h0, 2 h0, ..., n/2 (tq_fwht: all of them). The butterfly order is fixed so that every backend that copies it gets
 * the same float results. */
static inline void tq_fwht_from(float *v, int n, int h0) {
    for (int h = h0; h < n; h <<= 1) {
        for (int i = 0; i < n; i += h << 1) {
            for (int j = i; j < i + h; ++j) {
                const float a = v[j];
                const float b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
        }
    }
}

static void tq_fwht(float *v, int n) { tq_fwht_from(v, n, 1); }

/* The 96-point rotation's mix across the three 32-value thirds, unnormalized: 3Q = [1 2 2; 2 1 -2; 2 -2 1], each
 * coordinate b of the thirds in this evaluation order (the doublings are exact). 3Q is symmetric and (3Q)^2 = 9I,
 * so the same mix, after the same transforms, undoes it. */
static void tq_mix3(float *v) {
    for (int b = 0; b < 32; ++b) {
        const float u0 = v[b];
        const float u1 = v[b + 32];
        const float u2 = v[b + 64];
        v[b] = (u0 + 2.0f * u1) + 2.0f * u2;
        v[b + 32] = (2.0f * u0 + u1) - 2.0f * u2;
        v[b + 64] = (2.0f * u0 - 2.0f * u1) + u2;
    }
}

/* The unnormalized transform of a format: one Walsh-Hadamard transform of n values, or for n = 96 a 32-point one
 * on each third, then the mix. */
static void tq_transform(const tq_fmt *f, float *v) {
    for (int o = 0; o < f->n; o += f->wht_n) {
        tq_fwht(v + o, f->wht_n);
    }
    if (f->wht_n != f->n) {
        tq_mix3(v);
    }
}

static void tq_rotate_fmt(const tq_fmt *f, const float *x, float *y) {
    for (int i = 0; i < f->n; ++i) {
        y[i] = x[i] * tq_sign(f->signs, i);
    }
    tq_transform(f, y);
    for (int i = 0; i < f->n; ++i) {
        y[i] *= f->wht_norm;
    }
}

static void tq_unrotate_fmt(const tq_fmt *f, const float *y, float *x) {
    if (x != y) {
        memcpy(x, y, (size_t)f->n * sizeof(float));
    }
    tq_transform(f, x);
    for (int i = 0; i < f->n; ++i) {
        x[i] *= f->wht_norm * tq_sign(f->signs, i);
    }
}

void tq_rotate(const float *x, float *y) { tq_rotate_fmt(&TQ_FMT3, x, y); }
void tq_unrotate(const float *y, float *x) { tq_unrotate_fmt(&TQ_FMT3, y, x); }

int tq_rotate_n(int n, const float *x, float *y) {
    const tq_fmt *f = tq_fmt_of(3, n);
    if (!f) {
        return -1;
    }
    tq_rotate_fmt(f, x, y);
    return 0;
}

int tq_unrotate_n(int n, const float *y, float *x) {
    const tq_fmt *f = tq_fmt_of(3, n);
    if (!f) {
        return -1;
    }
    tq_unrotate_fmt(f, y, x);
    return 0;
}

/* 3 bits: groups of 8 indices in 3 bytes; 4 bits: byte j holds index j and index j + n/2 (n indices). */
static void tq_pack34(int bits, int n, const uint8_t *idx, uint8_t *q) {
    if (bits == 3) {
        for (int g = 0; g < n / 8; ++g) {
            uint32_t w = 0;
            for (int j = 0; j < 8; ++j) {
                w |= (uint32_t)(idx[8 * g + j] & 7u) << (3 * j);
            }
            q[3 * g + 0] = (uint8_t)(w & 0xffu);
            q[3 * g + 1] = (uint8_t)((w >> 8) & 0xffu);
            q[3 * g + 2] = (uint8_t)((w >> 16) & 0xffu);
        }
    } else {
        const int half = n / 2;
        for (int j = 0; j < half; ++j) {
            q[j] = (uint8_t)((idx[j] & 15u) | ((idx[j + half] & 15u) << 4));
        }
    }
}

static void tq_unpack34(int bits, int n, const uint8_t *q, uint8_t *idx) {
    if (bits == 3) {
        for (int g = 0; g < n / 8; ++g) {
            const uint32_t w = (uint32_t)q[3 * g] | ((uint32_t)q[3 * g + 1] << 8) | ((uint32_t)q[3 * g + 2] << 16);
            for (int j = 0; j < 8; ++j) {
                idx[8 * g + j] = (uint8_t)((w >> (3 * j)) & 7u);
            }
        }
    } else {
        const int half = n / 2;
        for (int j = 0; j < half; ++j) {
            idx[j] = q[j] & 15u;
            idx[j + half] = q[j] >> 4;
        }
    }
}

static void tq_pack_fmt(const tq_fmt *f, const uint8_t *idx, uint8_t *q) { tq_pack34(f->bits, f->n, idx, q); }
static void tq_unpack_fmt(const tq_fmt *f, const uint8_t *q, uint8_t *idx) { tq_unpack34(f->bits, f->n, q, idx); }

void tq_pack_indices(int bits, const uint8_t *idx, uint8_t *q) { tq_pack_fmt(tq_fmt_of(bits, TQ_BLOCK), idx, q); }
void tq_unpack_indices(int bits, const uint8_t *q, uint8_t *idx) {
    tq_unpack_fmt(tq_fmt_of(bits, TQ_BLOCK), q, idx);
}

int tq_pack_indices_n(int bits, int n, const uint8_t *idx, uint8_t *q) {
    const tq_fmt *f = tq_fmt_of(bits, n);
    if (!f) {
        return -1;
    }
    tq_pack_fmt(f, idx, q);
    return 0;
}

int tq_unpack_indices_n(int bits, int n, const uint8_t *q, uint8_t *idx) {
    const tq_fmt *f = tq_fmt_of(bits, n);
    if (!f) {
        return -1;
    }
    tq_unpack_fmt(f, q, idx);
    return 0;
}

/* Nearest centroid = number of boundaries strictly below v (ties go to the lower cell). */
static uint8_t tq_nearest(const float *bounds, int nb, float v) {
    int k = 0;
    for (int j = 0; j < nb; ++j) {
        k += v > bounds[j];
    }
    return (uint8_t)k;
}

const float *tq_subscales(void) { return TQ_SUBSCALE; }

uint16_t tq_fp32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    }
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float tq_bf16_to_fp32(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Header access byte by byte: blocks inside ggml rows need not be aligned, and the layout is little-endian
 * whatever the host. */
static void tq_store_header(uint8_t *block, uint16_t scale, uint16_t subs) {
    block[0] = (uint8_t)(scale & 0xffu);
    block[1] = (uint8_t)(scale >> 8);
    block[2] = (uint8_t)(subs & 0xffu);
    block[3] = (uint8_t)(subs >> 8);
}

static float tq_load_scale(const uint8_t *block) {
    return tq_bf16_to_fp32((uint16_t)(block[0] | (block[1] << 8)));
}

static unsigned tq_load_subs(const uint8_t *block) { return (unsigned)block[2] | ((unsigned)block[3] << 8); }

static void tq_scaled_bounds_fmt(const tq_fmt *f, float m, float *out) {
    for (int t = 0; t < tq_levels(f->bits) - 1; ++t) {
        out[t] = m * f->bounds[t];
    }
}

void tq_scaled_boundaries(int bits, float m, float *out) { tq_scaled_bounds_fmt(tq_fmt_of(bits, TQ_BLOCK), m, out); }

int tq_scaled_boundaries_n(int bits, int n, float m, float *out) {
    const tq_fmt *f = tq_fmt_of(bits, n);
    if (!f) {
        return -1;
    }
    tq_scaled_bounds_fmt(f, m, out);
    return 0;
}

/* Picks the multiplier of one sub-block of len (<= 32) values coded with the 2^bits centroids cent (boundaries
 * bounds): for each of the 16, nearest centroids of m * c and their squared error, in a fixed order (SIMD and GPU
 * kernels reproduce it bit for bit). Writes the indices of the winner. */
static unsigned tq_pick_book(int bits, const float *cent, const float *bounds, int len, const float *y,
                             uint8_t *idx) {
    const int nb = tq_levels(bits) - 1;
    float sb[31];
    uint8_t cand[TQ_SUBBLOCK];
    float best_err = INFINITY;
    unsigned best = 0;
    for (unsigned j = 0; j < 16; ++j) {
        const float m = TQ_SUBSCALE[j];
        for (int t = 0; t < nb; ++t) {
            sb[t] = m * bounds[t];
        }
        /* Canonical summation order: 8 lanes (lane = i mod 8) summed in sequence, then the fixed tree
         * ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), which 8-wide SIMD reproduces exactly. */
        float lane[8] = {0};
        for (int i = 0; i < len; ++i) {
            cand[i] = tq_nearest(sb, nb, y[i]);
            const float d = y[i] - m * cent[cand[i]];
            lane[i & 7] += d * d;
        }
        const float err = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
        if (err < best_err) {
            best_err = err;
            best = j;
            memcpy(idx, cand, (size_t)len);
        }
    }
    return best;
}

/* One sub-block (n/4 values) of a format. */
static unsigned tq_pick_fmt(const tq_fmt *f, const float *y, uint8_t *idx) {
    return tq_pick_book(f->bits, f->cent, f->bounds, f->n / 4, y, idx);
}

unsigned tq_pick_subscale(int bits, const float *y, uint8_t *idx) { return tq_pick_fmt(tq_fmt_of(bits, TQ_BLOCK), y, idx); }

/* The codec's double sums (the block's squared norm, the least-squares scale's <y, c'> and <c', c'>) in a canonical
 * order that a GPU warp reproduces without a sequential chain: 32 lanes, lane l summing terms l, l + 32, l + 64, ...
 * from 0.0 in sequence, then the butterfly tree of lanes at distances 16, 8, 4, 2, 1 (lane l < d adds lane l + d),
 * the result in lane 0. Terms are products of two floats, exact in double; only the sums round. */
static double tq_sum_canonical(const double *t, int n) {
    double lane[32];
    for (int l = 0; l < 32; ++l) {
        lane[l] = 0.0;
        for (int i = l; i < n; i += 32) {
            lane[l] += t[i];
        }
    }
    for (int d = 16; d >= 1; d >>= 1) {
        for (int l = 0; l < d; ++l) {
            lane[l] += lane[l + d];
        }
    }
    return lane[0];
}

/* pick: a replacement of the reference picker for 128-value blocks (SIMD), or NULL for the reference. */
static void tq_quantize_fmt(const tq_fmt *f, const float *x, void *block, tq_subscale_picker pick) {
    uint8_t *out = (uint8_t *)block;
    uint8_t idx[TQ_BLOCK];
    float y[TQ_BLOCK];
    double t0[TQ_BLOCK], t1[TQ_BLOCK];
    const int n = f->n;

    for (int i = 0; i < n; ++i) {
        t0[i] = (double)x[i] * (double)x[i];
    }
    const double ss = tq_sum_canonical(t0, n);
    if (!isfinite(ss)) { /* NaN or Inf somewhere: poison the block, read nothing more */
        memset(idx, 0, sizeof idx);
        tq_pack_fmt(f, idx, out + TQ_HEADER_BYTES);
        tq_store_header(out, tq_fp32_to_bf16(NAN), 0);
        return;
    }
    const double norm = sqrt(ss);
    for (int i = 0; i < n; ++i) {
        y[i] = norm > 0.0 ? (float)((double)x[i] / norm) : 0.0f;
    }
    tq_rotate_fmt(f, y, y);

    const int len = n / 4;
    unsigned subs = 0;
    for (int k = 0; k < 4; ++k) {
        const unsigned j = pick ? pick(f->bits, y + k * len, idx + k * len) : tq_pick_fmt(f, y + k * len, idx + k * len);
        subs |= j << (4 * k);
        for (int i = k * len; i < (k + 1) * len; ++i) {
            const double c = (double)(TQ_SUBSCALE[j] * f->cent[idx[i]]);
            t0[i] = (double)y[i] * c;
            t1[i] = c * c;
        }
    }
    tq_pack_fmt(f, idx, out + TQ_HEADER_BYTES);
    const double yc = tq_sum_canonical(t0, n);
    const double cc = tq_sum_canonical(t1, n);
    double s = norm * (yc / cc); /* cc > 0: no centroid is zero */
    if (s > (double)TQ_SCALE_MAX) {
        s = (double)TQ_SCALE_MAX;
    }
    tq_store_header(out, tq_fp32_to_bf16((float)s), (uint16_t)subs);
}

void tq_quantize_block(int bits, const float *x, void *block) {
    tq_quantize_fmt(tq_fmt_of(bits, TQ_BLOCK), x, block, NULL);
}

/* The block's reconstruction in the rotated domain, without the scale: c'_i = m_k(i) * c[idx_i]. */
static void tq_block_rotated(const tq_fmt *f, const uint8_t *block, float *c) {
    uint8_t idx[TQ_BLOCK];
    const unsigned subs = tq_load_subs(block);
    const int len = f->n / 4;
    tq_unpack_fmt(f, block + TQ_HEADER_BYTES, idx);
    for (int i = 0; i < f->n; ++i) {
        c[i] = TQ_SUBSCALE[(subs >> (4 * (i / len))) & 15u] * f->cent[idx[i]];
    }
}

/* The sign bits of TQ_SIGNS / TQ_SIGNS_64 as float sign masks (bit 31), for the fast dequantization below. */
#define TQ_SB(w, j) ((((w) >> (j)) & 1u) << 31)
#define TQ_SB4(w, j) TQ_SB(w, j), TQ_SB(w, j + 1), TQ_SB(w, j + 2), TQ_SB(w, j + 3)
#define TQ_SB32(w)                                                                                                   \
    TQ_SB4(w, 0), TQ_SB4(w, 4), TQ_SB4(w, 8), TQ_SB4(w, 12), TQ_SB4(w, 16), TQ_SB4(w, 20), TQ_SB4(w, 24), TQ_SB4(w, 28)
static const uint32_t TQ_SIGNMASK_128[128] = {TQ_SB32(TQ_S128_0), TQ_SB32(TQ_S128_1), TQ_SB32(TQ_S128_2),
                                              TQ_SB32(TQ_S128_3)};
static const uint32_t TQ_SIGNMASK_64[64] = {TQ_SB32(TQ_S64_0), TQ_SB32(TQ_S64_1)};

/* Stages h = 1, 2, 4 of tq_fwht on 8 values, in registers (the pairs of a stage are independent, so computing them
 * in another order gives the same floats). */
static inline void tq_fwht8(float *v) {
    const float a0 = v[0] + v[1], a1 = v[0] - v[1], a2 = v[2] + v[3], a3 = v[2] - v[3];
    const float a4 = v[4] + v[5], a5 = v[4] - v[5], a6 = v[6] + v[7], a7 = v[6] - v[7];
    const float b0 = a0 + a2, b2 = a0 - a2, b1 = a1 + a3, b3 = a1 - a3;
    const float b4 = a4 + a6, b6 = a4 - a6, b5 = a5 + a7, b7 = a5 - a7;
    v[0] = b0 + b4;
    v[4] = b0 - b4;
    v[1] = b1 + b5;
    v[5] = b1 - b5;
    v[2] = b2 + b6;
    v[6] = b2 - b6;
    v[3] = b3 + b7;
    v[7] = b3 - b7;
}

/* tq_dequantize_fmt for one Walsh-Hadamard transform of n = 64 or 128 values (n a constant after inlining): the
 * reference's float operations on the same values, so bit-identical, in loops a compiler unrolls and vectorizes
 * (decoding keys for TriAttention's scores and ggml's to_float run it for every cached block). c'_i = m * c[idx] from
 * a per-sub-block table; x * (norm * -1) = -(x * norm) exactly, so the signs are applied as bit flips. */
static inline void tq_dequantize_wht(const tq_fmt *f, const uint8_t *block, float *x, const int n,
                                     const uint32_t *signmask) {
    const float s = tq_load_scale(block);
    const unsigned subs = tq_load_subs(block);
    const uint8_t *q = block + TQ_HEADER_BYTES;
    const int len = n / 4;
    float mc[4][16];
    for (int k = 0; k < 4; ++k) {
        const float m = TQ_SUBSCALE[(subs >> (4 * k)) & 15u];
        for (int c = 0; c < tq_levels(f->bits); ++c) {
            mc[k][c] = m * f->cent[c];
        }
    }
    if (f->bits == 3) {
        for (int g = 0; g < n / 8; ++g) {
            const uint32_t w = (uint32_t)q[3 * g] | ((uint32_t)q[3 * g + 1] << 8) | ((uint32_t)q[3 * g + 2] << 16);
            const float *t = mc[(8 * g) / len];
            for (int j = 0; j < 8; ++j) {
                x[8 * g + j] = t[(w >> (3 * j)) & 7u];
            }
        }
    } else {
        for (int k = 0; k < 2; ++k) { /* byte j: index j (sub-block k) and index j + n/2 (sub-block k + 2) */
            for (int j = k * len; j < (k + 1) * len; ++j) {
                x[j] = mc[k][q[j] & 15u];
                x[j + 2 * len] = mc[k + 2][q[j] >> 4];
            }
        }
    }
    for (int i = 0; i < n; i += 8) {
        tq_fwht8(x + i);
    }
    tq_fwht_from(x, n, 8);
    uint32_t u[TQ_BLOCK];
    for (int i = 0; i < n; ++i) {
        x[i] *= f->wht_norm;
    }
    memcpy(u, x, (size_t)n * sizeof(float));
    for (int i = 0; i < n; ++i) {
        u[i] ^= signmask[i];
    }
    memcpy(x, u, (size_t)n * sizeof(float));
    for (int i = 0; i < n; ++i) {
        x[i] *= s;
    }
}

static void tq_dequantize_fmt(const tq_fmt *f, const void *block, float *x) {
    if (f->n == TQ_BLOCK && f->wht_n == TQ_BLOCK) {
        tq_dequantize_wht(f, (const uint8_t *)block, x, TQ_BLOCK, TQ_SIGNMASK_128);
        return;
    }
    if (f->n == TQ_BLOCK_64 && f->wht_n == TQ_BLOCK_64) {
        tq_dequantize_wht(f, (const uint8_t *)block, x, TQ_BLOCK_64, TQ_SIGNMASK_64);
        return;
    }
    const float s = tq_load_scale((const uint8_t *)block);
    tq_block_rotated(f, (const uint8_t *)block, x);
    tq_unrotate_fmt(f, x, x);
    for (int i = 0; i < f->n; ++i) {
        x[i] *= s;
    }
}

void tq_dequantize_block(int bits, const void *block, float *x) {
    tq_dequantize_fmt(tq_fmt_of(bits, TQ_BLOCK), block, x);
}

int tq_quantize_block_n(int bits, int n, const float *x, void *block) {
    const tq_fmt *f = tq_fmt_of(bits, n);
    if (!f) {
        return -1;
    }
    tq_quantize_fmt(f, x, block, NULL);
    return 0;
}

int tq_dequantize_block_n(int bits, int n, const void *block, float *x) {
    const tq_fmt *f = tq_fmt_of(bits, n);
    if (!f) {
        return -1;
    }
    tq_dequantize_fmt(f, block, x);
    return 0;
}

/* The format of a row of len values in blocks of n, or NULL. */
static const tq_fmt *tq_row_fmt(int bits, int n, int64_t len) {
    const tq_fmt *f = tq_fmt_of(bits, n);
    return f && len >= 0 && len % n == 0 ? f : NULL;
}

static int tq_quantize_rows_fmt(const tq_fmt *f, const float *x, void *dst, int64_t len, tq_subscale_picker pick) {
    if (!f) {
        return -1;
    }
    for (int64_t b = 0; b < len / f->n; ++b) {
        tq_quantize_fmt(f, x + b * f->n, (uint8_t *)dst + b * f->bytes, pick);
    }
    return 0;
}

int tq_quantize_row_with(int bits, const float *x, void *dst, int64_t n, tq_subscale_picker pick) {
    return tq_quantize_rows_fmt(tq_row_fmt(bits, TQ_BLOCK, n), x, dst, n, pick);
}

int tq_quantize_row(int bits, const float *x, void *dst, int64_t n) {
    return tq_quantize_rows_fmt(tq_row_fmt(bits, TQ_BLOCK, n), x, dst, n, NULL);
}

int tq_quantize_row_n(int bits, int n, const float *x, void *dst, int64_t len) {
    return tq_quantize_rows_fmt(tq_row_fmt(bits, n, len), x, dst, len, NULL);
}

int tq_dequantize_row_n(int bits, int n, const void *src, float *x, int64_t len) {
    const tq_fmt *f = tq_row_fmt(bits, n, len);
    if (!f) {
        return -1;
    }
    for (int64_t b = 0; b < len / n; ++b) {
        tq_dequantize_fmt(f, (const uint8_t *)src + b * f->bytes, x + b * n);
    }
    return 0;
}

int tq_dequantize_row(int bits, const void *src, float *x, int64_t n) {
    return tq_dequantize_row_n(bits, TQ_BLOCK, src, x, n);
}

int tq_dequantize_row_rotated_n(int bits, int n, const void *src, float *x, int64_t len) {
    const tq_fmt *f = tq_row_fmt(bits, n, len);
    if (!f) {
        return -1;
    }
    for (int64_t b = 0; b < len / n; ++b) {
        const uint8_t *blk = (const uint8_t *)src + b * f->bytes;
        float *xb = x + b * n;
        const float s = tq_load_scale(blk);
        tq_block_rotated(f, blk, xb);
        for (int i = 0; i < n; ++i) {
            xb[i] *= s;
        }
    }
    return 0;
}

int tq_dequantize_row_rotated(int bits, const void *src, float *x, int64_t n) {
    return tq_dequantize_row_rotated_n(bits, TQ_BLOCK, src, x, n);
}

float tq_dot_rotated_row_n(int bits, int n, const void *src, const float *q_rot, int64_t len) {
    const tq_fmt *f = tq_row_fmt(bits, n, len);
    if (!f) {
        return NAN;
    }
    float c[TQ_BLOCK];
    float total = 0.0f;
    for (int64_t b = 0; b < len / n; ++b) {
        const uint8_t *blk = (const uint8_t *)src + b * f->bytes;
        const float *qb = q_rot + b * n;
        tq_block_rotated(f, blk, c);
        float acc = 0.0f;
        for (int i = 0; i < n; ++i) {
            acc += c[i] * qb[i];
        }
        total += tq_load_scale(blk) * acc;
    }
    return total;
}

float tq_dot_rotated_row(int bits, const void *src, const float *q_rot, int64_t n) {
    return tq_dot_rotated_row_n(bits, TQ_BLOCK, src, q_rot, n);
}

/* Rows of a format's blocks (row length k, a whole number of blocks: ggml guarantees it): the ggml-style entry
 * points of every block size below share these. */
static void tq_rotate_rows_fmt(const tq_fmt *f, const float *x, float *y, int64_t k) {
    for (int64_t b = 0; b < k / f->n; ++b) {
        tq_rotate_fmt(f, x + b * f->n, y + b * f->n);
    }
}

static void tq_unrotate_rows_fmt(const tq_fmt *f, const float *y, float *x, int64_t k) {
    for (int64_t b = 0; b < k / f->n; ++b) {
        tq_unrotate_fmt(f, y + b * f->n, x + b * f->n);
    }
}

/* ggml_quantize_chunk's contract: bytes written, 0 if n_per_row is not a whole number of blocks. */
static size_t tq_quantize_chunk_n(int bits, int n, const float *src, void *dst, int64_t nrows, int64_t n_per_row) {
    if (n_per_row % n != 0 || tq_quantize_row_n(bits, n, src, dst, nrows * n_per_row) != 0) {
        return 0;
    }
    return (size_t)(nrows * (n_per_row / n)) * tq_block_bytes_n(bits, n);
}

void tq_rotate_row(const float *x, void *y, int64_t k) { tq_rotate_rows_fmt(&TQ_FMT3, x, (float *)y, k); }
void tq_unrotate_row(const void *y, float *x, int64_t k) { tq_unrotate_rows_fmt(&TQ_FMT3, (const float *)y, x, k); }

/* Every format's ggml-style row functions and ggml_quantize_chunk entry (tq_formats.h). */
#define TQ_ROW_FUNCTIONS(name, NAME, values, bits, bytes, qrot)                                                       \
    void name##_quantize_row(const float *x, void *dst, int64_t k) { (void)tq_quantize_row_n(bits, values, x, dst, k); } \
    void name##_dequantize_row(const void *src, float *y, int64_t k) {                                               \
        (void)tq_dequantize_row_n(bits, values, src, y, k);                                                          \
    }                                                                                                                \
    size_t quantize_##name(const float *src, void *dst, int64_t nrows, int64_t n_per_row, const float *imatrix) {    \
        (void)imatrix;                                                                                               \
        return tq_quantize_chunk_n(bits, values, src, dst, nrows, n_per_row);                                        \
    }
TQ_FORMATS(TQ_ROW_FUNCTIONS)
#undef TQ_ROW_FUNCTIONS

/* The rotated-query helper types of the 64- and 96-value blocks (row length k, a multiple of 64 / 96). */
void tq_rotate_row_64(const float *x, void *y, int64_t k) { tq_rotate_rows_fmt(&TQ_FMT3_64, x, (float *)y, k); }
void tq_unrotate_row_64(const void *y, float *x, int64_t k) {
    tq_unrotate_rows_fmt(&TQ_FMT3_64, (const float *)y, x, k);
}
void tq_rotate_row_96(const float *x, void *y, int64_t k) { tq_rotate_rows_fmt(&TQ_FMT3_96, x, (float *)y, k); }
void tq_unrotate_row_96(const void *y, float *x, int64_t k) {
    tq_unrotate_rows_fmt(&TQ_FMT3_96, (const float *)y, x, k);
}


/* ---- TQ3A: key blocks of 256 values in four groups of their own width (tq_codec.h has the layout) ---- */

/* The groups' rotation signs: 256 bits from the first four outputs of splitmix64 seeded with 0x54A3 (low word
 * first); group g uses the bits of its own values (coordinate i of the block <-> bit i). */
const uint32_t TQ3A_SIGNS[8] = {0xcce94bfcu, 0x8f4a89b5u, 0x8f39f14au, 0x4587ac96u,
                                0x3d91986eu, 0x2a21760au, 0x9e29e342u, 0x8039c98cu};

typedef struct {
    int off;  /* first value of the block */
    int n;    /* values (a power of two: one Walsh-Hadamard transform) */
    int bits; /* index width */
    int qoff; /* first byte of its indices in the block */
    const float *cent;
    const float *bounds;
    float wht_norm; /* 1/sqrt(n) */
} tq3a_group;

static const tq3a_group TQ3A_GROUPS[TQ3A_GROUPS_N] = {
    {0, 32, 5, 12, TQ5_32_CENTROIDS, TQ5_32_BOUNDARIES, TQ_WHT_NORM_32},
    {32, 32, 4, 32, TQ4_32_CENTROIDS, TQ4_32_BOUNDARIES, TQ_WHT_NORM_32},
    {64, 64, 3, 48, TQ3_64_CENTROIDS, TQ3_64_BOUNDARIES, TQ_WHT_NORM_64},
    {128, 128, 2, 72, TQ2_CENTROIDS, TQ2_BOUNDARIES, TQ_WHT_NORM},
};

const int TQ3A_GROUP_VALUES[TQ3A_GROUPS_N] = {32, 32, 64, 128};

const float *tq3a_centroids(int g) { return g >= 0 && g < TQ3A_GROUPS_N ? TQ3A_GROUPS[g].cent : NULL; }
const float *tq3a_boundaries(int g) { return g >= 0 && g < TQ3A_GROUPS_N ? TQ3A_GROUPS[g].bounds : NULL; }
const int TQ3A_GROUP_BITS[TQ3A_GROUPS_N] = {5, 4, 3, 2};

/* Indices of one group: 5 bits: 8 indices in 5 bytes (40-bit word, index 8g+j at bit 5j); 4 bits: byte j holds
 * index j (low nibble) and j + n/2; 3 bits: as tq3 (8 in 3 bytes); 2 bits: byte j holds index j + k n/4 at bits
 * 2k (k = 0..3), so 32 lanes each read one byte for four sub-blocks' values. */
static void tq3a_pack(const tq3a_group *g, const uint8_t *idx, uint8_t *q) {
    const int n = g->n;
    if (g->bits == 5) {
        for (int b = 0; b < n / 8; ++b) {
            uint64_t w = 0;
            for (int j = 0; j < 8; ++j) {
                w |= (uint64_t)(idx[8 * b + j] & 31u) << (5 * j);
            }
            for (int t = 0; t < 5; ++t) {
                q[5 * b + t] = (uint8_t)((w >> (8 * t)) & 0xffu);
            }
        }
    } else if (g->bits == 2) {
        const int quarter = n / 4;
        for (int j = 0; j < quarter; ++j) {
            q[j] = (uint8_t)((idx[j] & 3u) | ((idx[j + quarter] & 3u) << 2) | ((idx[j + 2 * quarter] & 3u) << 4) |
                             ((idx[j + 3 * quarter] & 3u) << 6));
        }
    } else {
        tq_pack34(g->bits, n, idx, q);
    }
}

static void tq3a_unpack(const tq3a_group *g, const uint8_t *q, uint8_t *idx) {
    const int n = g->n;
    if (g->bits == 5) {
        for (int b = 0; b < n / 8; ++b) {
            uint64_t w = 0;
            for (int t = 0; t < 5; ++t) {
                w |= (uint64_t)q[5 * b + t] << (8 * t);
            }
            for (int j = 0; j < 8; ++j) {
                idx[8 * b + j] = (uint8_t)((w >> (5 * j)) & 31u);
            }
        }
    } else if (g->bits == 2) {
        const int quarter = n / 4;
        for (int j = 0; j < quarter; ++j) {
            for (int k = 0; k < 4; ++k) {
                idx[j + k * quarter] = (q[j] >> (2 * k)) & 3u;
            }
        }
    } else {
        tq_unpack34(g->bits, n, q, idx);
    }
}

/* The group's rotation y = H D x / sqrt(n) (in place allowed) and its inverse, in tq_rotate_fmt's order. */
static void tq3a_rotate_group(const tq3a_group *g, const float *x, float *y) {
    for (int i = 0; i < g->n; ++i) {
        y[i] = x[i] * tq_sign(TQ3A_SIGNS, g->off + i);
    }
    tq_fwht(y, g->n);
    for (int i = 0; i < g->n; ++i) {
        y[i] *= g->wht_norm;
    }
}

static void tq3a_unrotate_group(const tq3a_group *g, const float *y, float *x) {
    if (x != y) {
        memcpy(x, y, (size_t)g->n * sizeof(float));
    }
    tq_fwht(x, g->n);
    for (int i = 0; i < g->n; ++i) {
        x[i] *= g->wht_norm * tq_sign(TQ3A_SIGNS, g->off + i);
    }
}

static void tq3a_store_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v & 0xffu);
    p[1] = (uint8_t)(v >> 8);
}

static uint32_t tq3a_load_subs(const uint8_t *block) {
    return (uint32_t)block[8] | ((uint32_t)block[9] << 8) | ((uint32_t)block[10] << 16) | ((uint32_t)block[11] << 24);
}

static float tq3a_load_scale(const uint8_t *block, int g) {
    return tq_bf16_to_fp32((uint16_t)(block[2 * g] | (block[2 * g + 1] << 8)));
}

void tq3a_quantize_block(const float *x, void *block) {
    uint8_t *out = (uint8_t *)block;
    uint8_t idx[TQ3A_BLOCK];
    float y[TQ3A_BLOCK];
    double t0[TQ3A_BLOCK], t1[TQ3A_BLOCK];
    double ss[TQ3A_GROUPS_N];
    int finite = 1;
    for (int gi = 0; gi < TQ3A_GROUPS_N; ++gi) {
        const tq3a_group *g = &TQ3A_GROUPS[gi];
        for (int i = 0; i < g->n; ++i) {
            t0[i] = (double)x[g->off + i] * (double)x[g->off + i];
        }
        ss[gi] = tq_sum_canonical(t0, g->n);
        finite &= isfinite(ss[gi]) != 0;
    }
    if (!finite) { /* NaN or Inf somewhere: poison the whole block (every group decodes to NaN) */
        memset(out, 0, TQ3A_BLOCK_BYTES);
        for (int gi = 0; gi < TQ3A_GROUPS_N; ++gi) {
            tq3a_store_u16(out + 2 * gi, tq_fp32_to_bf16(NAN));
        }
        return;
    }
    uint32_t subs = 0;
    for (int gi = 0; gi < TQ3A_GROUPS_N; ++gi) {
        const tq3a_group *g = &TQ3A_GROUPS[gi];
        const double norm = sqrt(ss[gi]);
        float *yg = y + g->off;
        uint8_t *ig = idx + g->off;
        for (int i = 0; i < g->n; ++i) {
            yg[i] = norm > 0.0 ? (float)((double)x[g->off + i] / norm) : 0.0f;
        }
        tq3a_rotate_group(g, yg, yg);
        for (int k = 0; k < g->n / TQ_SUBBLOCK; ++k) {
            const int sb = (g->off / TQ_SUBBLOCK) + k; /* the block's sub-block index, 0..7 */
            const unsigned j =
                tq_pick_book(g->bits, g->cent, g->bounds, TQ_SUBBLOCK, yg + k * TQ_SUBBLOCK, ig + k * TQ_SUBBLOCK);
            subs |= (uint32_t)j << (4 * sb);
            for (int i = k * TQ_SUBBLOCK; i < (k + 1) * TQ_SUBBLOCK; ++i) {
                const double c = (double)(TQ_SUBSCALE[j] * g->cent[ig[i]]);
                t0[i] = (double)yg[i] * c;
                t1[i] = c * c;
            }
        }
        tq3a_pack(g, ig, out + g->qoff);
        const double yc = tq_sum_canonical(t0, g->n);
        const double cc = tq_sum_canonical(t1, g->n);
        double s = norm * (yc / cc); /* cc > 0: no centroid is zero */
        if (s > (double)TQ3A_SCALE_MAX) {
            s = (double)TQ3A_SCALE_MAX;
        }
        tq3a_store_u16(out + 2 * gi, tq_fp32_to_bf16((float)s));
    }
    for (int t = 0; t < 4; ++t) {
        out[8 + t] = (uint8_t)((subs >> (8 * t)) & 0xffu);
    }
}

/* One group's reconstruction in its rotated domain, without the scale: c'_i = m_k(i) * c[idx_i]. */
static void tq3a_group_rotated(const tq3a_group *g, const uint8_t *block, uint32_t subs, float *c) {
    uint8_t idx[TQ3A_BLOCK];
    tq3a_unpack(g, block + g->qoff, idx);
    for (int i = 0; i < g->n; ++i) {
        c[i] = TQ_SUBSCALE[(subs >> (4 * ((g->off + i) / TQ_SUBBLOCK))) & 15u] * g->cent[idx[i]];
    }
}

void tq3a_dequantize_block(const void *block, float *x) {
    const uint8_t *b = (const uint8_t *)block;
    const uint32_t subs = tq3a_load_subs(b);
    for (int gi = 0; gi < TQ3A_GROUPS_N; ++gi) {
        const tq3a_group *g = &TQ3A_GROUPS[gi];
        const float s = tq3a_load_scale(b, gi);
        float *xg = x + g->off;
        tq3a_group_rotated(g, b, subs, xg);
        tq3a_unrotate_group(g, xg, xg);
        for (int i = 0; i < g->n; ++i) {
            xg[i] *= s;
        }
    }
}

void tq3a_quantize_row(const float *x, void *dst, int64_t k) {
    for (int64_t b = 0; b < k / TQ3A_BLOCK; ++b) {
        tq3a_quantize_block(x + b * TQ3A_BLOCK, (uint8_t *)dst + b * TQ3A_BLOCK_BYTES);
    }
}

void tq3a_dequantize_row(const void *src, float *y, int64_t k) {
    for (int64_t b = 0; b < k / TQ3A_BLOCK; ++b) {
        tq3a_dequantize_block((const uint8_t *)src + b * TQ3A_BLOCK_BYTES, y + b * TQ3A_BLOCK);
    }
}

size_t quantize_tq3a(const float *src, void *dst, int64_t nrows, int64_t n_per_row, const float *imatrix) {
    (void)imatrix;
    if (n_per_row % TQ3A_BLOCK != 0 || nrows < 0) {
        return 0;
    }
    tq3a_quantize_row(src, dst, nrows * n_per_row);
    return (size_t)(nrows * (n_per_row / TQ3A_BLOCK)) * TQ3A_BLOCK_BYTES;
}

void tq3a_rotate_row(const float *x, void *y, int64_t k) {
    float *out = (float *)y;
    for (int64_t b = 0; b < k / TQ3A_BLOCK; ++b) {
        for (int gi = 0; gi < TQ3A_GROUPS_N; ++gi) {
            const tq3a_group *g = &TQ3A_GROUPS[gi];
            tq3a_rotate_group(g, x + b * TQ3A_BLOCK + g->off, out + b * TQ3A_BLOCK + g->off);
        }
    }
}

void tq3a_unrotate_row(const void *y, float *x, int64_t k) {
    const float *in = (const float *)y;
    for (int64_t b = 0; b < k / TQ3A_BLOCK; ++b) {
        for (int gi = 0; gi < TQ3A_GROUPS_N; ++gi) {
            const tq3a_group *g = &TQ3A_GROUPS[gi];
            tq3a_unrotate_group(g, in + b * TQ3A_BLOCK + g->off, x + b * TQ3A_BLOCK + g->off);
        }
    }
}

void tq3a_dequantize_row_rotated(const void *src, float *x, int64_t k) {
    for (int64_t b = 0; b < k / TQ3A_BLOCK; ++b) {
        const uint8_t *blk = (const uint8_t *)src + b * TQ3A_BLOCK_BYTES;
        const uint32_t subs = tq3a_load_subs(blk);
        for (int gi = 0; gi < TQ3A_GROUPS_N; ++gi) {
            const tq3a_group *g = &TQ3A_GROUPS[gi];
            float *xg = x + b * TQ3A_BLOCK + g->off;
            const float s = tq3a_load_scale(blk, gi);
            tq3a_group_rotated(g, blk, subs, xg);
            for (int i = 0; i < g->n; ++i) {
                xg[i] *= s;
            }
        }
    }
}

float tq3a_dot_rotated_row(const void *src, const float *q_rot, int64_t k) {
    float c[TQ3A_BLOCK];
    float total = 0.0f;
    for (int64_t b = 0; b < k / TQ3A_BLOCK; ++b) {
        const uint8_t *blk = (const uint8_t *)src + b * TQ3A_BLOCK_BYTES;
        const uint32_t subs = tq3a_load_subs(blk);
        for (int gi = 0; gi < TQ3A_GROUPS_N; ++gi) {
            const tq3a_group *g = &TQ3A_GROUPS[gi];
            const float *qg = q_rot + b * TQ3A_BLOCK + g->off;
            tq3a_group_rotated(g, blk, subs, c);
            float lane[8] = {0}; /* 8 partial sums: the loop vectorizes without reassociation */
            for (int i = 0; i < g->n; ++i) {
                lane[i & 7] += c[i] * qg[i];
            }
            const float acc = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
            total += tq3a_load_scale(blk, gi) * acc;
        }
    }
    return total;
}
