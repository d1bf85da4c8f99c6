// llama-tq: see llama-tq-attn-rot.h.
#include "llama-tq-attn-rot.h"

#include "llama-tq-types.h"

#include <cstdlib>
#include <cstring>

bool llama_tq_attn_rot(ggml_type type, bool is_k, bool keys_equalized) {
    type = llama_tq_base_type(type); // the 64-value blocks follow their bit width's default
    if (type != GGML_TYPE_TQ3 && type != GGML_TYPE_TQ4) {
        return true;
    }
    const char * env = std::getenv("LLAMA_TQ_ATTN_ROT");
    if (env != nullptr && *env != '\0' && std::strcmp(env, "auto") != 0) {
        return std::strcmp(env, "1") == 0 || std::strcmp(env, is_k ? "k" : "v") == 0;
    }
    return type == GGML_TYPE_TQ3 && is_k && !keys_equalized;
}
