/* TurboQuant codec: see tq_codec.h for the algorithm and the exact bit layout. */
#include "tq_codec.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "tq_codebooks.h"

const uint32_t TQ_SIGNS[4] = {0x76bcc29au, 0xec660926u, 0xfdbbf446u, 0x70d451fcu};

size_t tq_block_bytes(int bits) {
    return bits == 3 ? TQ3_BLOCK_BYTES : bits == 4 ? TQ4_BLOCK_BYTES : 0;
}

const float *tq_centroids(int bits) {
    return bits == 3 ? TQ3_CENTROIDS : bits == 4 ? TQ4_CENTROIDS : NULL;
}

static int tq_levels(int bits) { return 1 << bits; }

static const float *tq_boundaries(int bits) { return bits == 3 ? TQ3_BOUNDARIES : TQ4_BOUNDARIES; }

static float tq_sign(int i) { return (TQ_SIGNS[i >> 5] >> (i & 31)) & 1u ? -1.0f : 1.0f; }

/* Unnormalized in-place fast Walsh-Hadamard transform, natural (Sylvester) order. The butterfly order is
 * fixed so that every backend that copies it gets the same float results. */
static void tq_fwht(float *v) {
    for (int h = 1; h < TQ_BLOCK; h <<= 1) {
        for (int i = 0; i < TQ_BLOCK; i += h << 1) {
            for (int j = i; j < i + h; ++j) {
                const float a = v[j];
                const float b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
        }
    }
}

void tq_rotate(const float *x, float *y) {
    for (int i = 0; i < TQ_BLOCK; ++i) {
        y[i] = x[i] * tq_sign(i);
    }
    tq_fwht(y);
    for (int i = 0; i < TQ_BLOCK; ++i) {
        y[i] *= TQ_WHT_NORM;
    }
}

void tq_unrotate(const float *y, float *x) {
    if (x != y) {
        memcpy(x, y, TQ_BLOCK * sizeof(float));
    }
    tq_fwht(x);
    for (int i = 0; i < TQ_BLOCK; ++i) {
        x[i] *= TQ_WHT_NORM * tq_sign(i);
    }
}

void tq_pack_indices(int bits, const uint8_t *idx, uint8_t *q) {
    if (bits == 3) {
        for (int g = 0; g < 16; ++g) {
            uint32_t w = 0;
            for (int j = 0; j < 8; ++j) {
                w |= (uint32_t)(idx[8 * g + j] & 7u) << (3 * j);
            }
            q[3 * g + 0] = (uint8_t)(w & 0xffu);
            q[3 * g + 1] = (uint8_t)((w >> 8) & 0xffu);
            q[3 * g + 2] = (uint8_t)((w >> 16) & 0xffu);
        }
    } else {
        for (int j = 0; j < 64; ++j) {
            q[j] = (uint8_t)((idx[j] & 15u) | ((idx[j + 64] & 15u) << 4));
        }
    }
}

void tq_unpack_indices(int bits, const uint8_t *q, uint8_t *idx) {
    if (bits == 3) {
        for (int g = 0; g < 16; ++g) {
            const uint32_t w = (uint32_t)q[3 * g] | ((uint32_t)q[3 * g + 1] << 8) | ((uint32_t)q[3 * g + 2] << 16);
            for (int j = 0; j < 8; ++j) {
                idx[8 * g + j] = (uint8_t)((w >> (3 * j)) & 7u);
            }
        }
    } else {
        for (int j = 0; j < 64; ++j) {
            idx[j] = q[j] & 15u;
            idx[j + 64] = q[j] >> 4;
        }
    }
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

/* Picks the multiplier of one sub-block: for each of the 16, nearest centroids of m * c and their squared
 * error, in a fixed order (SIMD and GPU kernels reproduce it bit for bit). Writes the indices of the winner. */
void tq_scaled_boundaries(int bits, float m, float *out) {
    const float *bounds = tq_boundaries(bits);
    for (int t = 0; t < tq_levels(bits) - 1; ++t) {
        out[t] = m * bounds[t];
    }
}

unsigned tq_pick_subscale(int bits, const float *y, uint8_t *idx) {
    const float *cent = tq_centroids(bits);
    const int nb = tq_levels(bits) - 1;
    float sb[15];
    uint8_t cand[TQ_SUBBLOCK];
    float best_err = INFINITY;
    unsigned best = 0;
    for (unsigned j = 0; j < 16; ++j) {
        const float m = TQ_SUBSCALE[j];
        tq_scaled_boundaries(bits, m, sb);
        /* Canonical summation order: 8 lanes (lane = i mod 8) summed in sequence, then the fixed tree
         * ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), which 8-wide SIMD reproduces exactly. */
        float lane[8] = {0};
        for (int i = 0; i < TQ_SUBBLOCK; ++i) {
            cand[i] = tq_nearest(sb, nb, y[i]);
            const float d = y[i] - m * cent[cand[i]];
            lane[i & 7] += d * d;
        }
        const float err = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
        if (err < best_err) {
            best_err = err;
            best = j;
            memcpy(idx, cand, sizeof cand);
        }
    }
    return best;
}

static void tq_quantize_block_with(int bits, const float *x, void *block, tq_subscale_picker pick) {
    uint8_t *out = (uint8_t *)block;
    uint8_t idx[TQ_BLOCK];
    float y[TQ_BLOCK];

    double ss = 0.0;
    for (int i = 0; i < TQ_BLOCK; ++i) {
        ss += (double)x[i] * (double)x[i];
    }
    if (!isfinite(ss)) { /* NaN or Inf somewhere: poison the block, read nothing more */
        memset(idx, 0, sizeof idx);
        tq_pack_indices(bits, idx, out + TQ_HEADER_BYTES);
        tq_store_header(out, tq_fp32_to_bf16(NAN), 0);
        return;
    }
    const double norm = sqrt(ss);
    for (int i = 0; i < TQ_BLOCK; ++i) {
        y[i] = norm > 0.0 ? (float)((double)x[i] / norm) : 0.0f;
    }
    tq_rotate(y, y);

    const float *cent = tq_centroids(bits);
    unsigned subs = 0;
    double yc = 0.0;
    double cc = 0.0;
    for (int k = 0; k < TQ_BLOCK / TQ_SUBBLOCK; ++k) {
        const unsigned j = pick(bits, y + k * TQ_SUBBLOCK, idx + k * TQ_SUBBLOCK);
        subs |= j << (4 * k);
        for (int i = k * TQ_SUBBLOCK; i < (k + 1) * TQ_SUBBLOCK; ++i) {
            const double c = (double)(TQ_SUBSCALE[j] * cent[idx[i]]);
            yc += (double)y[i] * c;
            cc += c * c;
        }
    }
    tq_pack_indices(bits, idx, out + TQ_HEADER_BYTES);
    double s = norm * (yc / cc); /* cc > 0: no centroid is zero */
    if (s > (double)TQ_BF16_MAX) {
        s = (double)TQ_BF16_MAX;
    }
    tq_store_header(out, tq_fp32_to_bf16((float)s), (uint16_t)subs);
}

void tq_quantize_block(int bits, const float *x, void *block) {
    tq_quantize_block_with(bits, x, block, tq_pick_subscale);
}

/* The block's reconstruction in the rotated domain, without the scale: c'_i = m_k(i) * c[idx_i]. */
static void tq_block_rotated(int bits, const uint8_t *block, float *c) {
    uint8_t idx[TQ_BLOCK];
    const float *cent = tq_centroids(bits);
    const unsigned subs = tq_load_subs(block);
    tq_unpack_indices(bits, block + TQ_HEADER_BYTES, idx);
    for (int i = 0; i < TQ_BLOCK; ++i) {
        c[i] = TQ_SUBSCALE[(subs >> (4 * (i / TQ_SUBBLOCK))) & 15u] * cent[idx[i]];
    }
}

void tq_dequantize_block(int bits, const void *block, float *x) {
    const float s = tq_load_scale((const uint8_t *)block);
    tq_block_rotated(bits, (const uint8_t *)block, x);
    tq_unrotate(x, x);
    for (int i = 0; i < TQ_BLOCK; ++i) {
        x[i] *= s;
    }
}

static int tq_row_ok(int bits, int64_t n) { return tq_block_bytes(bits) != 0 && n >= 0 && n % TQ_BLOCK == 0; }

int tq_quantize_row_with(int bits, const float *x, void *dst, int64_t n, tq_subscale_picker pick) {
    if (!tq_row_ok(bits, n)) {
        return -1;
    }
    const size_t bb = tq_block_bytes(bits);
    for (int64_t b = 0; b < n / TQ_BLOCK; ++b) {
        tq_quantize_block_with(bits, x + b * TQ_BLOCK, (uint8_t *)dst + b * bb, pick ? pick : tq_pick_subscale);
    }
    return 0;
}

int tq_quantize_row(int bits, const float *x, void *dst, int64_t n) {
    return tq_quantize_row_with(bits, x, dst, n, tq_pick_subscale);
}

int tq_dequantize_row(int bits, const void *src, float *x, int64_t n) {
    if (!tq_row_ok(bits, n)) {
        return -1;
    }
    const size_t bb = tq_block_bytes(bits);
    for (int64_t b = 0; b < n / TQ_BLOCK; ++b) {
        tq_dequantize_block(bits, (const uint8_t *)src + b * bb, x + b * TQ_BLOCK);
    }
    return 0;
}

int tq_dequantize_row_rotated(int bits, const void *src, float *x, int64_t n) {
    if (!tq_row_ok(bits, n)) {
        return -1;
    }
    const size_t bb = tq_block_bytes(bits);
    for (int64_t b = 0; b < n / TQ_BLOCK; ++b) {
        const uint8_t *blk = (const uint8_t *)src + b * bb;
        float *xb = x + b * TQ_BLOCK;
        const float s = tq_load_scale(blk);
        tq_block_rotated(bits, blk, xb);
        for (int i = 0; i < TQ_BLOCK; ++i) {
            xb[i] *= s;
        }
    }
    return 0;
}

float tq_dot_rotated_row(int bits, const void *src, const float *q_rot, int64_t n) {
    if (!tq_row_ok(bits, n)) {
        return NAN;
    }
    const size_t bb = tq_block_bytes(bits);
    float c[TQ_BLOCK];
    float total = 0.0f;
    for (int64_t b = 0; b < n / TQ_BLOCK; ++b) {
        const uint8_t *blk = (const uint8_t *)src + b * bb;
        const float *qb = q_rot + b * TQ_BLOCK;
        tq_block_rotated(bits, blk, c);
        float acc = 0.0f;
        for (int i = 0; i < TQ_BLOCK; ++i) {
            acc += c[i] * qb[i];
        }
        total += tq_load_scale(blk) * acc;
    }
    return total;
}

void tq_rotate_row(const float *x, void *y, int64_t k) {
    for (int64_t b = 0; b < k / TQ_BLOCK; ++b) {
        tq_rotate(x + b * TQ_BLOCK, (float *)y + b * TQ_BLOCK);
    }
}

void tq_unrotate_row(const void *y, float *x, int64_t k) {
    for (int64_t b = 0; b < k / TQ_BLOCK; ++b) {
        tq_unrotate((const float *)y + b * TQ_BLOCK, x + b * TQ_BLOCK);
    }
}

void tq3_quantize_row(const float *x, void *dst, int64_t k) { (void)tq_quantize_row(3, x, dst, k); }
void tq4_quantize_row(const float *x, void *dst, int64_t k) { (void)tq_quantize_row(4, x, dst, k); }
void tq3_dequantize_row(const void *src, float *y, int64_t k) { (void)tq_dequantize_row(3, src, y, k); }
void tq4_dequantize_row(const void *src, float *y, int64_t k) { (void)tq_dequantize_row(4, src, y, k); }

static size_t quantize_rows(int bits, const float *src, void *dst, int64_t nrows, int64_t n_per_row) {
    if (n_per_row % TQ_BLOCK != 0 || tq_quantize_row(bits, src, dst, nrows * n_per_row) != 0) {
        return 0;
    }
    return (size_t)(nrows * (n_per_row / TQ_BLOCK)) * tq_block_bytes(bits);
}

size_t quantize_tq3(const float *src, void *dst, int64_t nrows, int64_t n_per_row, const float *imatrix) {
    (void)imatrix;
    return quantize_rows(3, src, dst, nrows, n_per_row);
}

size_t quantize_tq4(const float *src, void *dst, int64_t nrows, int64_t n_per_row, const float *imatrix) {
    (void)imatrix;
    return quantize_rows(4, src, dst, nrows, n_per_row);
}
