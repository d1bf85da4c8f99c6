/* The TQ storage formats, written once. Everything that names the formats one by one is generated from these
 * lists: the codec's ggml-style row functions (tq_codec.h), ggml's type-traits rows and the CPU backend's
 * (ggml-tq.h, ggml-tq-cpu.h), the CPU op switches, the one is-a-TQ-type predicate, and Python's format table
 * (llama_tq._codec.FORMATS). A block is a 4-byte header (bf16 scale + 16 bits of sub-block multipliers) and
 * `values` indices of `bits` bits (tq_codec.h has the layout).
 *
 * TQ_FORMATS(X): X(name, NAME, values per block, bits per value, bytes per block, NAME of its query helper type)
 * TQ_QROT_FORMATS(X): X(name, NAME, values per block, suffix of its codec row functions): the f32 query rotated
 * block by block, the vec_dot operand of the TQ types on the CPU (not a storage format). */
#ifndef TQ_FORMATS_H
#define TQ_FORMATS_H

#include <string.h>

#define TQ_FORMATS(X)                                                                                                 \
    X(tq3, TQ3, 128, 3, 52, TQ_QROT)                                                                                  \
    X(tq4, TQ4, 128, 4, 68, TQ_QROT)                                                                                  \
    X(tq3_64, TQ3_64, 64, 3, 28, TQ_QROT_64)                                                                          \
    X(tq4_64, TQ4_64, 64, 4, 36, TQ_QROT_64)                                                                          \
    X(tq3_96, TQ3_96, 96, 3, 40, TQ_QROT_96)                                                                          \
    X(tq4_96, TQ4_96, 96, 4, 52, TQ_QROT_96)

#define TQ_QROT_FORMATS(X)                                                                                            \
    X(tq_qrot, TQ_QROT, 128, )                                                                                        \
    X(tq_qrot_64, TQ_QROT_64, 64, _64)                                                                                \
    X(tq_qrot_96, TQ_QROT_96, 96, _96)

/* Each format's size follows from the layout: a 4-byte header and values * bits / 8 bytes of indices. */
#define TQ_FORMAT_SIZE_CHECK(name, NAME, values, bits, bytes, qrot)                                                   \
    typedef char tq_format_size_##name[(bytes) == 4 + (values) * (bits) / 8 ? 1 : -1];
TQ_FORMATS(TQ_FORMAT_SIZE_CHECK)
#undef TQ_FORMAT_SIZE_CHECK

/* What each GPU backend's flash-attention kernels take, by ggml registry name: X(backend, values per block, head
 * size) for a TQ cache of that block size (K, V or both). The CPU takes every head size a block divides. Read by the
 * backends' supports_op (CUDA's ggml_cuda_tq_fattn_handles, Metal's ggml_metal_tq_supports_op), by libllama's choice
 * of block size (llama_tq_type_for_heads refuses a 64- or 96-value cache on a GPU backend without its head size), and
 * checked against the README's support matrix (llama_tq._codec.FA_HEADS, tests/test_repo_layout.py). */
#define TQ_FA_HEADS(X)                                                                                                \
    X(CUDA, 128, 128) X(CUDA, 128, 256) X(CUDA, 64, 64) X(CUDA, 96, 96)                                               \
    X(MTL, 128, 128) X(MTL, 128, 256) X(MTL, 64, 64) X(MTL, 64, 192)

/* Whether backend `backend` (a registry name: "CUDA", "MTL") has a flash-attention kernel for TQ blocks of `values`
 * at head size `head`. */
static inline int tq_fa_head_ok(const char *backend, int values, int head) {
#define TQ_FA_HEAD_MATCH(b, v, h)                                                                                     \
    if (strcmp(backend, #b) == 0 && values == (v) && head == (h)) {                                                   \
        return 1;                                                                                                     \
    }
    TQ_FA_HEADS(TQ_FA_HEAD_MATCH)
#undef TQ_FA_HEAD_MATCH
    return 0;
}

#endif /* TQ_FORMATS_H */
