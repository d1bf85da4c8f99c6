/* CPU kernels of the TQ3/TQ4 KV types and their 64-/96-value variants TQ3_64/TQ4_64, TQ3_96/TQ4_96 for ggml's
 * CPU backend (entries of its type_traits_cpu table).
 *
 * K.Q runs in the rotated domain: the query is converted once per row to GGML_TYPE_TQ_QROT (float32 values,
 * rotated block by block with tq_rotate), and the dot product of a TQ row with it is
 *   sum over blocks of s * sum_i m_k(i) * c[idx_i] * q_rot_i,
 * so no key is ever un-rotated. Quantizing on KV write is the codec itself (tq_codec.c), so the CPU cache
 * holds exactly the codec's bytes. */
#ifndef GGML_TQ_CPU_H
#define GGML_TQ_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The instruction set these kernels were compiled for: "avx512", "avx2" or "scalar" (the codec's C loops). */
const char *ggml_tq_cpu_isa(void);

void ggml_tq3_from_float(const float *x, void *y, int64_t k);
void ggml_tq4_from_float(const float *x, void *y, int64_t k);
void ggml_tq_qrot_from_float(const float *x, void *y, int64_t k);

void ggml_vec_dot_tq3_qrot(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, int nrc);
void ggml_vec_dot_tq4_qrot(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, int nrc);

/* GGML_TYPE_TQ3_64 / TQ4_64 (64-value blocks) and their query helper GGML_TYPE_TQ_QROT_64 (rotated per 64). */
void ggml_tq3_64_from_float(const float *x, void *y, int64_t k);
void ggml_tq4_64_from_float(const float *x, void *y, int64_t k);
void ggml_tq_qrot_64_from_float(const float *x, void *y, int64_t k);
void ggml_vec_dot_tq3_64_qrot(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by,
                              int nrc);
void ggml_vec_dot_tq4_64_qrot(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by,
                              int nrc);

/* GGML_TYPE_TQ3_96 / TQ4_96 (96-value blocks) and their query helper GGML_TYPE_TQ_QROT_96 (rotated per 96). */
void ggml_tq3_96_from_float(const float *x, void *y, int64_t k);
void ggml_tq4_96_from_float(const float *x, void *y, int64_t k);
void ggml_tq_qrot_96_from_float(const float *x, void *y, int64_t k);
void ggml_vec_dot_tq3_96_qrot(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by,
                              int nrc);
void ggml_vec_dot_tq4_96_qrot(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by,
                              int nrc);

/* FLASH_ATTN_EXT's V path. For a TQ V type, returns a to_float that leaves rows in the rotated domain
 * (s * c', no inverse WHT per row) and sets *unrotate to the function that maps the attention-weighted sum
 * back, once per query row (the sum is linear, so this equals un-rotating every row). NULL for other types. */
typedef void (*ggml_tq_unrotate_t)(float *v, int64_t n);
ggml_to_float_t ggml_tq_fa_v_to_float(enum ggml_type type, ggml_tq_unrotate_t *unrotate);

void ggml_tq3_to_float_rotated(const void *x, float *y, int64_t k);
void ggml_tq4_to_float_rotated(const void *x, float *y, int64_t k);
void ggml_tq_unrotate_inplace(float *v, int64_t n);

#ifdef __cplusplus
}
#endif

#endif /* GGML_TQ_CPU_H */
