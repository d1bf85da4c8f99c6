// llama-tq: see llama-tq-attn-rot.h.
#include "llama-tq-attn-rot.h"

#include "llama-tq-types.h"

#include <cstdlib>
#include <cstring>

bool llama_tq_attn_rot(ggml_type type, bool is_k, bool keys_transformed) {
    if (!llama_tq_is_tq(type)) {
        return true;
    }
    const char * env = std::getenv("LLAMA_TQ_ATTN_ROT");
    if (env != nullptr && *env != '\0' && std::strcmp(env, "auto") != 0) {
        return std::strcmp(env, "1") == 0 || std::strcmp(env, is_k ? "k" : "v") == 0;
    }
    if (type == GGML_TYPE_TQ3_64 || type == GGML_TYPE_TQ4_64) {
        return false; // heads of 64 x odd: upstream's Hadamard is 64-point, within our own 64-value blocks
    }
    if (type == GGML_TYPE_TQ3_96 || type == GGML_TYPE_TQ4_96) {
        return false; // heads of 96: upstream rotates only heads that are a multiple of 64
    }
    return type == GGML_TYPE_TQ3 && is_k && !keys_transformed;
}
