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
#include "ggml-tq.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The instruction set these kernels were compiled for: "avx512", "avx2" or "scalar" (the codec's C loops). */
const char *ggml_tq_cpu_isa(void);

/* Per TQ type (tq_formats.h): ggml_NAME_from_float (the codec's bytes, SIMD-searched) and the K.Q dot against
 * its rotated-query helper type; per helper type: ggml_NAME_from_float (rotates the query block by block). */
#define GGML_TQ_CPU_DECLS(name, NAME, values, bits, bytes, qrot)                                                      \
    void ggml_##name##_from_float(const float *x, void *y, int64_t k);                                               \
    void ggml_vec_dot_##name##_qrot(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, \
                                    int nrc);
#define GGML_TQ_CPU_QROT_DECLS(name, NAME, values, sfx) void ggml_##name##_from_float(const float *x, void *y, int64_t k);
TQ_FORMATS(GGML_TQ_CPU_DECLS)
TQ_QROT_FORMATS(GGML_TQ_CPU_QROT_DECLS)
#undef GGML_TQ_CPU_DECLS
#undef GGML_TQ_CPU_QROT_DECLS

/* The rows of ggml-cpu.c's type_traits_cpu table (the patch puts GGML_TQ_CPU_TYPE_TRAITS there). */
#define GGML_TQ_CPU_TRAITS_ROW(name, NAME, values, bits, bytes, qrot)                                               \
    [GGML_TYPE_##NAME] = {.from_float = ggml_##name##_from_float, .vec_dot = ggml_vec_dot_##name##_qrot,            \
                          .vec_dot_type = GGML_TYPE_##qrot, .nrows = 1},
#define GGML_TQ_CPU_QROT_TRAITS_ROW(name, NAME, values, sfx) [GGML_TYPE_##NAME] = {.from_float = ggml_##name##_from_float},
/* TQ3A: the codec's quantizer, and K.Q against its helper type (the query rotated group by group). */
void ggml_tq3a_from_float(const float *x, void *y, int64_t k);
void ggml_vec_dot_tq3a_qrot(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, int nrc);
void ggml_tq_qrot_a_from_float(const float *x, void *y, int64_t k);
#define GGML_TQ3A_CPU_TRAITS_ROWS                                                                                   \
    [GGML_TYPE_TQ3A] = {.from_float = ggml_tq3a_from_float, .vec_dot = ggml_vec_dot_tq3a_qrot,                      \
                        .vec_dot_type = GGML_TYPE_TQ_QROT_A, .nrows = 1},                                          \
    [GGML_TYPE_TQ_QROT_A] = {.from_float = ggml_tq_qrot_a_from_float},
#define GGML_TQ_CPU_TYPE_TRAITS                                                                                     \
    TQ_FORMATS(GGML_TQ_CPU_TRAITS_ROW) TQ_QROT_FORMATS(GGML_TQ_CPU_QROT_TRAITS_ROW) GGML_TQ3A_CPU_TRAITS_ROWS

/* FLASH_ATTN_EXT's V path. For a TQ V type, returns a to_float that leaves rows in the rotated domain
 * (s * c', no inverse WHT per row) and sets *unrotate to the function that maps the attention-weighted sum
 * back, once per query row (the sum is linear, so this equals un-rotating every row). NULL for other types. */
typedef void (*ggml_tq_unrotate_t)(float *v, int64_t n);
ggml_to_float_t ggml_tq_fa_v_to_float(enum ggml_type type, ggml_tq_unrotate_t *unrotate);

#ifdef __cplusplus
}
#endif

#endif /* GGML_TQ_CPU_H */
