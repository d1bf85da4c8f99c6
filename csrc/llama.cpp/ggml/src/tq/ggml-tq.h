/* llama-tq: the TQ types in ggml, generated from the format lists (tq_formats.h): the rows of ggml's type-traits
 * table (the patch puts GGML_TQ_TYPE_TRAITS into ggml.c's table), the case labels of the ops' type switches, and
 * the one is-a-TQ-type predicate every backend and libllama use. */
#ifndef GGML_TQ_H
#define GGML_TQ_H

#include <stdbool.h>

#include "ggml.h"
#include "tq_codec.h"

/* case labels: the storage types, and the rotated-query helper types */
#define GGML_TQ_CASE(name, NAME, ...) case GGML_TYPE_##NAME:
#define GGML_TQ_TYPE_CASES TQ_FORMATS(GGML_TQ_CASE)
#define GGML_TQ_QROT_TYPE_CASES TQ_QROT_FORMATS(GGML_TQ_CASE)

/* ggml.c's type_traits rows (the codec's row functions, tq_codec.h) */
#define GGML_TQ_TRAITS_ROW(name, NAME, values, bits, bytes, qrot)                                                   \
    [GGML_TYPE_##NAME] = {.type_name = #name, .blck_size = values, .type_size = bytes, .is_quantized = true,        \
                          .to_float = (ggml_to_float_t) name##_dequantize_row,                                     \
                          .from_float_ref = (ggml_from_float_t) name##_quantize_row},
#define GGML_TQ_QROT_TRAITS_ROW(name, NAME, values, sfx)                                                            \
    [GGML_TYPE_##NAME] = {.type_name = #name, .blck_size = values, .type_size = (values) * sizeof(float),           \
                          .is_quantized = false, .to_float = (ggml_to_float_t) tq_unrotate_row##sfx,               \
                          .from_float_ref = (ggml_from_float_t) tq_rotate_row##sfx},
#define GGML_TQ_TYPE_TRAITS TQ_FORMATS(GGML_TQ_TRAITS_ROW) TQ_QROT_FORMATS(GGML_TQ_QROT_TRAITS_ROW)

/* A TQ storage type (tq3, tq4 and their 64- / 96-value variants). */
static inline bool ggml_tq_is_tq(enum ggml_type t) {
    switch (t) {
        GGML_TQ_TYPE_CASES
        return true;
        default:
            return false;
    }
}

#endif /* GGML_TQ_H */
