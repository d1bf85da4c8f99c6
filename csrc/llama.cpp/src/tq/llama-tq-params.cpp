// llama-tq: the TQ cache options (include/llama-tq.h, llama-tq-params.h).
#include "llama-tq-params.h"

#include "llama-impl.h"

#include <cstdio>
#include <cstring>
#include <string>

namespace {

thread_local const llama_tq_params * g_making = nullptr;  // llama_init_from_model_tq's options, during the call

struct option_value {
    const char * name;
    int32_t mode;
};

// The flags' spellings ("1" is the old spelling of auto for the keys).
constexpr option_value KEYS[] = {{"auto", LLAMA_TQ_KEYS_AUTO}, {"1", LLAMA_TQ_KEYS_AUTO},  {"0", LLAMA_TQ_KEYS_NONE},
                                 {"mean", LLAMA_TQ_KEYS_MEAN}, {"eq", LLAMA_TQ_KEYS_EQ}, {"matrix", LLAMA_TQ_KEYS_MATRIX}};
constexpr option_value ATTN_ROT[] = {{"auto", LLAMA_TQ_ATTN_ROT_AUTO}, {"0", LLAMA_TQ_ATTN_ROT_NONE},
                                     {"1", LLAMA_TQ_ATTN_ROT_BOTH},    {"k", LLAMA_TQ_ATTN_ROT_K},
                                     {"v", LLAMA_TQ_ATTN_ROT_V}};

template <size_t N>
std::string spellings(const option_value (&values)[N]) {
    std::string s;
    for (size_t i = 0; i < N; ++i) {
        s += (i == 0 ? "" : i + 1 == N ? " or " : ", ") + std::string(values[i].name);
    }
    return s;
}

void set_err(char * err, size_t err_size, const std::string & msg) {
    if (err != nullptr && err_size > 0) {
        snprintf(err, err_size, "%s", msg.c_str());
    }
}

// A mode in range, or the message that says why not.
std::string check(const llama_tq_params & p) {
    if (p.keys < LLAMA_TQ_KEYS_AUTO || p.keys > LLAMA_TQ_KEYS_MATRIX) {
        return "llama_tq_params.keys must be an enum llama_tq_keys_mode (got " + std::to_string(p.keys) + ")";
    }
    if (p.attn_rot < LLAMA_TQ_ATTN_ROT_AUTO || p.attn_rot > LLAMA_TQ_ATTN_ROT_V) {
        return "llama_tq_params.attn_rot must be an enum llama_tq_attn_rot_mode (got " + std::to_string(p.attn_rot) +
               ")";
    }
    return "";
}

}  // namespace

llama_tq_params llama_tq_default_params(void) {
    return {LLAMA_TQ_KEYS_AUTO, LLAMA_TQ_ATTN_ROT_AUTO};
}

int32_t llama_tq_params_set(llama_tq_params * params, const char * name, const char * value, char * err,
                            size_t err_size) {
    const std::string n = name != nullptr ? name : "";
    const std::string v = value != nullptr ? value : "";
    auto pick = [&](const auto & values, int32_t & field, const char * flag) -> int32_t {
        for (const option_value & o : values) {
            if (v == o.name) {
                field = o.mode;
                return 0;
            }
        }
        set_err(err, err_size, std::string(flag) + " must be " + spellings(values) + " (got '" + v + "')");
        return -1;
    };
    if (params == nullptr) {
        set_err(err, err_size, "llama_tq_params_set: params is NULL");
        return -1;
    }
    if (n == "keys") {
        return pick(KEYS, params->keys, "--tq-keys");
    }
    if (n == "attn_rot") {
        return pick(ATTN_ROT, params->attn_rot, "--tq-attn-rot");
    }
    set_err(err, err_size, "unknown TQ option '" + n + "' (keys or attn_rot)");
    return -1;
}

llama_context * llama_init_from_model_tq(llama_model * model, llama_context_params params,
                                         const llama_tq_params * tq) {
    const llama_tq_params p = tq != nullptr ? *tq : llama_tq_default_params();
    const std::string msg = check(p);
    if (!msg.empty()) {
        LLAMA_LOG_ERROR("%s: %s\n", __func__, msg.c_str());
        return nullptr;
    }
    struct scope {  // restores the previous value however llama_init_from_model returns
        const llama_tq_params * prev = g_making;
        explicit scope(const llama_tq_params * p) { g_making = p; }
        ~scope() { g_making = prev; }
    } s(&p);
    return llama_init_from_model(model, params);
}

llama_tq_params llama_tq_params_for_new_cache() {
    return g_making != nullptr ? *g_making : llama_tq_default_params();
}
