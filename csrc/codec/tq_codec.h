/* TurboQuant KV codec (arXiv:2504.19874): the single source of truth for TQ3 and TQ4.
 *
 * C11, no dependency on ggml. ggml's CPU backend, the Python module and the tests all call it.
 *
 * One block = 128 values. Quantizing a block:
 *   1. n = ||x||_2 (accumulated in double; never overflows for finite float input). The double sums here and in
 *      step 4 run in a fixed order a GPU warp reproduces (tq_codec.c, tq_sum_canonical).
 *   2. u = x / n, then the fixed randomized Walsh-Hadamard rotation y = H * D * u / sqrt(128):
 *      D = diag(+-1) from TQ_SIGNS (bit i of the 128-bit constant set => coordinate i negated),
 *      H = the 128-point Sylvester Hadamard matrix (natural order). One round (bench/results/codec_design.md).
 *   3. Each of the 4 sub-blocks of 32 rotated values picks one of 16 multipliers m_j (TQ_SUBSCALE) for the
 *      Lloyd-Max codebook c (tq_codebooks.h, d = 128 coordinate law): for every j, each value takes its nearest
 *      centroid of m_j * c, and the j with the smallest squared error wins (first on ties).
 *   4. The stored scale is the least-squares scale s = n * <y, c'> / <c', c'> for the chosen
 *      c'_i = m_k(i) * c[idx_i], rounded to bfloat16: it minimizes ||x - s * R^T c'||^2, and bf16 keeps
 *      float's range (a block norm can exceed fp16's 65504) at a relative error <= 2^-9 (MSE cost ~1e-6).
 * Dequantizing: x_hat = s * D * H * c' / sqrt(128).
 * Why the sub-block multipliers: they cost the 16 bits that a float32 norm spends beyond bf16, and cut the
 * MSE on rotated Gaussian data by 23% (tq3) and 35% (tq4) versus the spec layout {float norm; indices}
 * (bench/results/codec_design.md); tq4 then beats q4_0 (4.5 bits) at 4.25 bits.
 *
 * Bit layout (all multi-byte fields little-endian):
 *   block_tq3, 52 bytes: [0..1]  bfloat16 scale s (upper half of the float32 bit pattern)
 *                        [2..3]  uint16: sub-block k (values 32k..32k+31) uses TQ_SUBSCALE[(v >> 4k) & 15]
 *                        [4..51] 16 groups of 3 bytes; group g holds indices 8g..8g+7 as the 24-bit
 *                                word w = b0 | b1 << 8 | b2 << 16, index 8g+j = (w >> 3j) & 7.
 *   block_tq4, 68 bytes: [0..3]  as tq3
 *                        [4..67] 64 bytes; byte j holds index j in its low nibble and index j+64 in its
 *                                high nibble (both halves of the block load as contiguous nibble runs).
 *
 * 64-value blocks (TQ3_64 / TQ4_64: heads of 64, 192, ... whose size is not a multiple of 128): the same algorithm
 * on 64 values with their own 64-point rotation (signs TQ_SIGNS_64, 1/sqrt(64)) and the codebooks of the d = 64
 * coordinate law; the 4-byte header is the same, its 4 multipliers covering sub-blocks of 16 values
 * (bench/results/head64_codec.md: at 3.5 / 4.5 bits, lower MSE than tq3 / tq4 at 128, and word-sized blocks).
 *   block_tq3_64, 28 bytes: [0..3] header; [4..27] 8 groups of 3 bytes, as tq3.
 *   block_tq4_64, 36 bytes: [0..3] header; [4..35] 32 bytes; byte j holds index j (low nibble) and j + 32.
 *
 * 96-value blocks (TQ3_96 / TQ4_96: heads of 96, 288, ...: Phi-3): the same algorithm on 96 values; the rotation
 * is y = M D x with D = diag(+-1) from TQ_SIGNS_96 and M = (Q (x) H_32) / sqrt(32), Q = (1/3)[1 2 2; 2 1 -2; 2 -2 1]
 * (symmetric orthogonal, no zero entry, so every output mixes all 96 inputs): a 32-point Walsh-Hadamard transform of
 * each third, then coordinate b of the thirds mixed by 3Q (tq_codec.c's evaluation order), then 1/(3 sqrt(32)).
 * Codebooks of the d = 96 law; sub-blocks of 24 values.
 *   block_tq3_96, 40 bytes: [0..3] header; [4..39] 12 groups of 3 bytes, as tq3 (3.33 bits per value).
 *   block_tq4_96, 52 bytes: [0..3] header; [4..51] 48 bytes; byte j holds index j (low nibble) and j + 48
 *                           (4.33 bits per value).
 *
 * Edge cases (all tested):
 *   - all-zero block -> s = 0, decodes to exact zeros;
 *   - any NaN or Inf in the block -> s = NaN, indices 0: the whole block decodes to NaN ("poisoned"),
 *     as an f16 cache would propagate it; nothing is read or written out of bounds;
 *   - huge finite values -> s saturates at TQ_SCALE_MAX (~8.4e37), so every decoded value stays finite
 *     (below FLT_MAX) even for a single value at FLT_MAX;
 *   - tiny (subnormal) values -> normalized in double, so the direction is kept.
 */
#ifndef TQ_CODEC_H
#define TQ_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "tq_formats.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TQ_BLOCK 128
#define TQ3_BLOCK_BYTES 52
#define TQ4_BLOCK_BYTES 68

#define TQ_BLOCK_64 64
#define TQ3_64_BLOCK_BYTES 28
#define TQ4_64_BLOCK_BYTES 36

#define TQ_BLOCK_96 96
#define TQ3_96_BLOCK_BYTES 40
#define TQ4_96_BLOCK_BYTES 52

#define TQ_SUBBLOCK 32
#define TQ_HEADER_BYTES 4
/* 32-bit words per block (CUDA kernels load blocks as words) */
#define TQ3_BLOCK_WORDS (TQ3_BLOCK_BYTES / 4)
#define TQ4_BLOCK_WORDS (TQ4_BLOCK_BYTES / 4)
/* 1/sqrt(128): makes the Walsh-Hadamard matrix H orthonormal */
#define TQ_WHT_NORM 0.08838834764831845f
#define TQ_WHT_NORM_64 0.125f
/* 1/sqrt(32): tq3a's 32-value groups */
#define TQ_WHT_NORM_32 0.17677669529663687f
/* 1/(3 sqrt(32)): the 96-point rotation's 32-point Hadamard and 3-point mix made orthonormal */
#define TQ_WHT_NORM_96 0.05892556509887896f
/* The largest scale (bfloat16 0x7e7d = 1.9765625 * 2^125): a decoded value is s * u_i with |u_i| <= ||c'||_2 <=
 * sqrt(n) * 1.5 * (the largest centroid) < 4.04 for every format (tq4: 4.033), so s <= FLT_MAX / 4.04 keeps every
 * finite input's decoded values finite (the largest finite bfloat16 would let a single huge value decode to Inf). */
#define TQ_SCALE_MAX 8.407367073e37f

typedef struct {
    uint16_t scale_bf16;
    uint16_t subscales;
    uint8_t q[48];
} tq3_block;

typedef struct {
    uint16_t scale_bf16;
    uint16_t subscales;
    uint8_t q[64];
} tq4_block;

/* Sign pattern D: 128 bits, word w bit b <-> coordinate 32*w + b. Derived from the first two outputs of
 * splitmix64 seeded with 0x5451 (low word first); any fixed pattern works, this one is documented. */
extern const uint32_t TQ_SIGNS[4];
/* The 64-point rotation's signs: the first output of splitmix64 seeded with 0x5464 (low word first). */
extern const uint32_t TQ_SIGNS_64[2];
/* The 96-point rotation's signs: the first 96 bits of splitmix64 seeded with 0x5496 (low word first). */
extern const uint32_t TQ_SIGNS_96[3];

/* Bytes per block for bits = 3 or 4, 0 for anything else. */
size_t tq_block_bytes(int bits);

/* The 2^bits centroids (ascending), or NULL for unsupported bits. */
const float *tq_centroids(int bits);

/* The 16 sub-block scale multipliers. */
const float *tq_subscales(void);

/* float <-> bfloat16 bits (round to nearest even; NaN stays NaN). */
uint16_t tq_fp32_to_bf16(float f);
float tq_bf16_to_fp32(uint16_t h);

/* Forward rotation y = H D x / sqrt(128) and its inverse x = D H y / sqrt(128), one block each.
 * In-place use (x == y) is allowed. */
void tq_rotate(const float *x, float *y);
void tq_unrotate(const float *y, float *x);

/* Index (un)packing for one block; idx holds 128 values < 2^bits. */
void tq_pack_indices(int bits, const uint8_t *idx, uint8_t *q);
void tq_unpack_indices(int bits, const uint8_t *q, uint8_t *idx);

/* One block: x[128] <-> block (tq_block_bytes(bits) bytes). */
void tq_quantize_block(int bits, const float *x, void *block);
void tq_dequantize_block(int bits, const void *block, float *x);

/* Step 3 for one sub-block of 32 rotated values y: writes the 32 indices, returns the multiplier index (0..15).
 * tq_pick_subscale is the reference; a SIMD kernel may replace it in tq_quantize_row_with() only if it returns
 * identical results (same comparisons, and the error summed in the canonical order documented in tq_codec.c). */
typedef unsigned (*tq_subscale_picker)(int bits, const float *y, uint8_t *idx);
/* The cell boundaries of m * c: out[t] = m * boundary[t] (float), 2^bits - 1 values. */
void tq_scaled_boundaries(int bits, float m, float *out);
unsigned tq_pick_subscale(int bits, const float *y, uint8_t *idx);

/* Rows of n values (n a multiple of 128). Return 0, or -1 if bits or n is invalid (nothing written). */
int tq_quantize_row(int bits, const float *x, void *dst, int64_t n);
int tq_dequantize_row(int bits, const void *src, float *x, int64_t n);
/* Dequantize without the inverse rotation: x = s * c' per block (what tq_dequantize_row returns, rotated by
 * tq_rotate). Attention sums such rows and un-rotates the sum once. */
int tq_dequantize_row_rotated(int bits, const void *src, float *x, int64_t n);
int tq_quantize_row_with(int bits, const float *x, void *dst, int64_t n, tq_subscale_picker pick);

/* <dequantize(src), q> for a row of n values when q_rot holds the query already rotated block by block
 * (tq_rotate on each 128-slice): sum over blocks of s * <c', q_rot>. No inverse rotation per key. */
float tq_dot_rotated_row(int bits, const void *src, const float *q_rot, int64_t n);

/* ggml-style fixed-type entry points (row length k, a multiple of 128). tq_rotate_row / tq_unrotate_row
 * convert between float rows and the rotated-query helper type (tq_rotate on each 128-block). */
void tq_rotate_row(const float *x, void *y, int64_t k);
void tq_unrotate_row(const void *y, float *x, int64_t k);
/* Per format of tq_formats.h (tq3, tq4, tq3_64, ...): NAME_quantize_row, NAME_dequantize_row (row length k, a
 * multiple of the format's block) and quantize_NAME, ggml_quantize_chunk's signature (ggml-quants.h): nrows rows of
 * n_per_row values; imatrix is unused (the codec has no importance weighting); the bytes written, 0 if n_per_row is
 * not a whole number of blocks. */
#define TQ_ROW_DECLS(name, NAME, values, bits, bytes, qrot)                                                           \
    void name##_quantize_row(const float *x, void *dst, int64_t k);                                                  \
    void name##_dequantize_row(const void *src, float *y, int64_t k);                                                \
    size_t quantize_##name(const float *src, void *dst, int64_t nrows, int64_t n_per_row, const float *imatrix);
TQ_FORMATS(TQ_ROW_DECLS)
#undef TQ_ROW_DECLS

/* Any block format: n = TQ_BLOCK (128, the functions above), TQ_BLOCK_64 or TQ_BLOCK_96. Invalid bits / n / length: 0 bytes,
 * NULL, -1 or NaN, nothing written. */
size_t tq_block_bytes_n(int bits, int n);
const float *tq_centroids_n(int bits, int n);
int tq_scaled_boundaries_n(int bits, int n, float m, float *out);
int tq_rotate_n(int n, const float *x, float *y);
int tq_unrotate_n(int n, const float *y, float *x);
int tq_pack_indices_n(int bits, int n, const uint8_t *idx, uint8_t *q);
int tq_unpack_indices_n(int bits, int n, const uint8_t *q, uint8_t *idx);
int tq_quantize_block_n(int bits, int n, const float *x, void *block);
int tq_dequantize_block_n(int bits, int n, const void *block, float *x);
int tq_quantize_row_n(int bits, int n, const float *x, void *dst, int64_t len);
int tq_dequantize_row_n(int bits, int n, const void *src, float *x, int64_t len);
int tq_dequantize_row_rotated_n(int bits, int n, const void *src, float *x, int64_t len);
float tq_dot_rotated_row_n(int bits, int n, const void *src, const float *q_rot, int64_t len);

/* ggml-style entry points of the 64-value blocks (row length k, a multiple of 64): GGML_TYPE_TQ3_64 / TQ4_64 and
 * their rotated-query helper type (tq_rotate_n(64, ...) on each 64-block). */
void tq_rotate_row_64(const float *x, void *y, int64_t k);
void tq_unrotate_row_64(const void *y, float *x, int64_t k);

/* ggml-style entry points of the 96-value blocks (row length k, a multiple of 96): GGML_TYPE_TQ3_96 / TQ4_96 and
 * their rotated-query helper type. */
void tq_rotate_row_96(const float *x, void *y, int64_t k);
void tq_unrotate_row_96(const void *y, float *x, int64_t k);

/* TQ3A: 3-bit-class keys that spend their bits where the queries look (issue 47; docs/key-transforms.md). One
 * block = 256 values (a head of 256) in 104 bytes, 3.25 bits a value, side data included. libllama orders each
 * (layer, KV head)'s channels by query-weighted energy before they reach the block (a calibrated permutation of RoPE
 * pairs, applied to keys and queries alike), so the block is four groups of falling energy, each rotated by its own
 * randomized Walsh-Hadamard transform and coded at its own width:
 *   group 0: values   0..31,  5 bits (d = 32 codebook)     group 2: values  64..127, 3 bits (d = 64: TQ3_64's)
 *   group 1: values  32..63,  4 bits (d = 32 codebook)     group 3: values 128..255, 2 bits (d = 128)
 * Each group is quantized as a tq3 block is (its own norm, rotation y = H D u / sqrt(n) with D from TQ3A_SIGNS bits
 * off..off+n-1, a multiplier per 32 values picked from TQ_SUBSCALE, a least-squares bf16 scale), with the canonical
 * double sums of tq_codec.c; any NaN or Inf in the block poisons every group (all scales NaN).
 *   block_tq3a, 104 bytes: [0..7]    four bfloat16 scales, group g at bytes 2g, 2g+1
 *                          [8..11]   uint32: values 32k..32k+31 use TQ_SUBSCALE[(v >> 4k) & 15], k = 0..7
 *                          [12..31]  group 0: 4 x 5 bytes; a 40-bit word w each, index 8b+j = (w >> 5j) & 31
 *                          [32..47]  group 1: byte j holds index j (low nibble) and j + 16
 *                          [48..71]  group 2: 8 x 3 bytes, as tq3
 *                          [72..103] group 3: byte j holds index j + 32k at bits 2k..2k+1 (k = 0..3)
 * Where the 3.25 bits go (bench/results/key_allocation.md): on the default model's keys in that order, the
 * query-weighted key error is 0.73x tq3's on average over its 18 layers. */
#define TQ3A_BLOCK 256
#define TQ3A_BLOCK_BYTES 104
#define TQ3A_GROUPS_N 4
/* A decoded value is s * u_i with |u_i| <= sqrt(n) * 1.5 * (the largest centroid) < 4.5 for every group (the d = 32,
 * 5-bit book: 4.47), so s <= 2^125 keeps every finite input's decoded values finite. */
#define TQ3A_SCALE_MAX 4.253529586e37f

extern const uint32_t TQ3A_SIGNS[8];
extern const int TQ3A_GROUP_VALUES[TQ3A_GROUPS_N];
extern const int TQ3A_GROUP_BITS[TQ3A_GROUPS_N];

/* Group g's 2^bits centroids (ascending) and its 2^bits - 1 cell boundaries, or NULL. */
const float *tq3a_centroids(int g);
const float *tq3a_boundaries(int g);
void tq3a_quantize_block(const float *x, void *block);
void tq3a_dequantize_block(const void *block, float *x);
/* Rows of k values (k a multiple of 256; ggml guarantees it), ggml's signatures. */
void tq3a_quantize_row(const float *x, void *dst, int64_t k);
void tq3a_dequantize_row(const void *src, float *y, int64_t k);
size_t quantize_tq3a(const float *src, void *dst, int64_t nrows, int64_t n_per_row, const float *imatrix);
/* The query in each group's rotated domain (the vec_dot operand), and back. */
void tq3a_rotate_row(const float *x, void *y, int64_t k);
void tq3a_unrotate_row(const void *y, float *x, int64_t k);
/* s_g * c'_g per group, without the inverse rotations. */
void tq3a_dequantize_row_rotated(const void *src, float *x, int64_t k);
/* <dequantize(src), q> with q_rot = tq3a_rotate_row(q): sum over groups of s_g * <c'_g, q_rot_g>. */
float tq3a_dot_rotated_row(const void *src, const float *q_rot, int64_t k);

#ifdef __cplusplus
}
#endif

#endif /* TQ_CODEC_H */
