// llama-tq: state files that cannot crash or poison a context (issue 43). llama-server's POST /slots/N?action=restore
// used to abort on a file cut short by one byte (an assert in upstream's loader), and a file with non-finite TQ
// scales or key means restored "successfully" and silently changed every later answer.
#include "llama-tq-state.h"

#include "ggml-backend.h"
#include "ggml-tq.h"
#include "llama-impl.h"

#include <exception>
#include <vector>

bool llama_tq_rows_ok(const ggml_tensor * t, size_t offset, size_t size) {
    if ((!ggml_tq_is_tq(t->type) && !ggml_tq_is_tq3a(t->type)) || size == 0) {
        return true;
    }
    const size_t bb = ggml_type_size(t->type);
    const int n_scales = ggml_tq_is_tq3a(t->type) ? TQ3A_GROUPS_N : 1; // bf16 scales at the block's start
    std::vector<uint8_t> buf(size);
    ggml_backend_tensor_get(t, buf.data(), offset, size);
    for (size_t b = 0; b + bb <= size; b += bb) {
        for (int g = 0; g < n_scales; ++g) {
            const uint8_t * s = buf.data() + b + 2 * g;
            const unsigned exp = ((unsigned) s[1] << 1 | (unsigned) s[0] >> 7) & 0xffu; // bits 14..7 of the LE u16
            if (exp == 0xffu) { // bfloat16 scale: all exponent bits set is Inf or NaN
                LLAMA_LOG_ERROR("%s: the state's %s rows hold a block with a non-finite scale (byte %zu): refused\n",
                                __func__, ggml_type_name(t->type), offset + b);
                return false;
            }
        }
    }
    return true;
}

size_t llama_tq_state_seq_load(llama_context * ctx, llama_seq_id seq, bool restores, const std::function<size_t()> & load) {
    if (!restores) {
        return load();
    }
    std::vector<uint8_t> before(llama_state_seq_get_size(ctx, seq));
    before.resize(llama_state_seq_get_data(ctx, before.data(), before.size(), seq));
    size_t n = 0;
    try {
        n = load();
    } catch (const std::exception & e) {
        LLAMA_LOG_ERROR("%s: error loading sequence state file: %s\n", __func__, e.what());
    }
    if (n == 0) { // the sequence as it was before the refused restore
        llama_memory_seq_rm(llama_get_memory(ctx), seq, -1, -1);
        if (!before.empty() && llama_state_seq_set_data(ctx, before.data(), before.size(), seq) == 0) {
            LLAMA_LOG_ERROR("%s: could not put sequence %d back as it was\n", __func__, seq);
        }
    }
    return n;
}
