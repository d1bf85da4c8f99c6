// llama-tq: see llama-tq-attn-rot.h.
#include "llama-tq-attn-rot.h"

#include "llama-tq-params.h"
#include "llama-tq-types.h"


bool llama_tq_attn_rot(ggml_type type, bool is_k, bool keys_transformed) {
    if (ggml_tq_is_tq3a(type)) {
        return false; // its channels are ordered by energy: a Hadamard over the head would spread them again
    }
    if (!ggml_tq_is_tq(type)) {
        return true;
    }
    switch (llama_tq_params_for_new_cache().attn_rot) {  // --tq-attn-rot (llama_init_from_model_tq)
        case LLAMA_TQ_ATTN_ROT_NONE: return false;
        case LLAMA_TQ_ATTN_ROT_BOTH: return true;
        case LLAMA_TQ_ATTN_ROT_K:    return is_k;
        case LLAMA_TQ_ATTN_ROT_V:    return !is_k;
        default:                     break;  // the measured default below
    }
    if (type == GGML_TYPE_TQ3_64 || type == GGML_TYPE_TQ4_64) {
        return false; // heads of 64 x odd: upstream's Hadamard is 64-point, within our own 64-value blocks
    }
    if (type == GGML_TYPE_TQ3_96 || type == GGML_TYPE_TQ4_96) {
        return false; // heads of 96: upstream rotates only heads that are a multiple of 64
    }
    return type == GGML_TYPE_TQ3 && is_k && !keys_transformed;
}
