/* llama-tq: the TQ types in ggml, generated from the format lists (tq_formats.h): the rows of ggml's type-traits
 * table (the patch puts GGML_TQ_TYPE_TRAITS into ggml.c's table), the case labels of the ops' type switches, and
 * the one is-a-TQ-type predicate every backend and libllama use. */
#ifndef GGML_TQ_H
#define GGML_TQ_H

#include <stdbool.h>

#include "ggml.h"
#include "tq_codec.h"

/* case labels: the storage types (TQ3A, the grouped key type, included), and the rotated-query helper types */
#define GGML_TQ_CASE(name, NAME, ...) case GGML_TYPE_##NAME:
#define GGML_TQ_TYPE_CASES TQ_FORMATS(GGML_TQ_CASE) case GGML_TYPE_TQ3A:
#define GGML_TQ_QROT_TYPE_CASES TQ_QROT_FORMATS(GGML_TQ_CASE) case GGML_TYPE_TQ_QROT_A:

/* ggml.c's type_traits rows (the codec's row functions, tq_codec.h) */
#define GGML_TQ_TRAITS_ROW(name, NAME, values, bits, bytes, qrot)                                                   \
    [GGML_TYPE_##NAME] = {.type_name = #name, .blck_size = values, .type_size = bytes, .is_quantized = true,        \
                          .to_float = (ggml_to_float_t) name##_dequantize_row,                                     \
                          .from_float_ref = (ggml_from_float_t) name##_quantize_row},
#define GGML_TQ_QROT_TRAITS_ROW(name, NAME, values, sfx)                                                            \
    [GGML_TYPE_##NAME] = {.type_name = #name, .blck_size = values, .type_size = (values) * sizeof(float),           \
                          .is_quantized = false, .to_float = (ggml_to_float_t) tq_unrotate_row##sfx,               \
                          .from_float_ref = (ggml_from_float_t) tq_rotate_row##sfx},
/* TQ3A (tq_codec.h: four groups of their own width in 256 values) and its rotated-query helper type */
#define GGML_TQ3A_TRAITS_ROWS                                                                                       \
    [GGML_TYPE_TQ3A] = {.type_name = "tq3a", .blck_size = TQ3A_BLOCK, .type_size = TQ3A_BLOCK_BYTES,               \
                        .is_quantized = true, .to_float = (ggml_to_float_t) tq3a_dequantize_row,                   \
                        .from_float_ref = (ggml_from_float_t) tq3a_quantize_row},                                  \
    [GGML_TYPE_TQ_QROT_A] = {.type_name = "tq_qrot_a", .blck_size = TQ3A_BLOCK,                                    \
                             .type_size = TQ3A_BLOCK * sizeof(float), .is_quantized = false,                        \
                             .to_float = (ggml_to_float_t) tq3a_unrotate_row,                                      \
                             .from_float_ref = (ggml_from_float_t) tq3a_rotate_row},
#define GGML_TQ_TYPE_TRAITS TQ_FORMATS(GGML_TQ_TRAITS_ROW) TQ_QROT_FORMATS(GGML_TQ_QROT_TRAITS_ROW) GGML_TQ3A_TRAITS_ROWS

/* ggml_quantize_chunk's cases of the TQ types (the patch puts them into its switch; they name that function's
 * arguments and locals: src, dst, start, start_row, row_size, nrows, n_per_row, imatrix, result). */
#define GGML_TQ_QUANTIZE_CASE(name, NAME, ...)                                                                       \
    case GGML_TYPE_##NAME:                                                                                           \
        result = quantize_##name(src + start, (char *) dst + start_row * row_size, nrows, n_per_row, imatrix);       \
        break;
#define GGML_TQ_QUANTIZE_CHUNK_CASES TQ_FORMATS(GGML_TQ_QUANTIZE_CASE) GGML_TQ_QUANTIZE_CASE(tq3a, TQ3A)

/* TQ3A: keys only, with kernels on the CPU and CUDA (Metal has none: its supports_op declines it). */
static inline bool ggml_tq_is_tq3a(enum ggml_type t) { return t == GGML_TYPE_TQ3A; }

/* A TQ storage type: tq3, tq4, their 64- / 96-value variants and tq3a. */
static inline bool ggml_tq_is_tq(enum ggml_type t) {
    switch (t) {
        GGML_TQ_TYPE_CASES
        return true;
        default:
            return false;
    }
}

#endif /* GGML_TQ_H */
