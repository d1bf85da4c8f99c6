// llama-tq: the TQ cache options (include/llama-tq.h, llama-tq-params.h).
#include "llama-tq-params.h"

#include "llama-impl.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace {

thread_local const llama_tq_params * g_making = nullptr;  // llama_init_from_model_tq's options, during the call
thread_local std::shared_ptr<const llama_tq_key_cal> g_making_cal;  // llama_init_from_model_tq_cal's, likewise

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
    return llama_init_from_model_tq_cal(model, params, tq, nullptr);
}

llama_context * llama_init_from_model_tq_cal(llama_model * model, llama_context_params params,
                                             const llama_tq_params * tq, const char * key_cal) {
    const llama_tq_params p = tq != nullptr ? *tq : llama_tq_default_params();
    const std::string msg = check(p);
    if (!msg.empty()) {
        LLAMA_LOG_ERROR("%s: %s\n", __func__, msg.c_str());
        return nullptr;
    }
    std::shared_ptr<const llama_tq_key_cal> cal;
    if (key_cal != nullptr && key_cal[0] != '\0') {
        std::string err;
        cal = llama_tq_key_cal_load(key_cal, err);
        if (cal == nullptr) {
            LLAMA_LOG_ERROR("%s: TQ key calibration %s: %s\n", __func__, key_cal, err.c_str());
            return nullptr;
        }
    }
    struct scope {  // restores the previous values however llama_init_from_model returns
        const llama_tq_params * prev = g_making;
        std::shared_ptr<const llama_tq_key_cal> prev_cal = g_making_cal;
        scope(const llama_tq_params * p, std::shared_ptr<const llama_tq_key_cal> c) {
            g_making = p;
            g_making_cal = std::move(c);
        }
        ~scope() {
            g_making = prev;
            g_making_cal = prev_cal;
        }
    } s(&p, cal);
    return llama_init_from_model(model, params);
}

llama_tq_params llama_tq_params_for_new_cache() {
    return g_making != nullptr ? *g_making : llama_tq_default_params();
}

std::shared_ptr<const llama_tq_key_cal> llama_tq_key_cal_for_new_cache() { return g_making_cal; }

// The format (text, one record a line; python/llama_tq/calibrate.py writes it):
//   llama-tq-key-cal 1
//   arch <general.architecture>
//   shape <n_layer> <n_head_kv> <head>
//   x <layer> <kv head> <head non-negative finite floats>      (once per KV head of every layer with a KV cache)
// Anything else, a repeated or missing record, or a value out of range is refused.
std::shared_ptr<const llama_tq_key_cal> llama_tq_key_cal_load(const char * path, std::string & err) {
    std::ifstream in(path);
    if (!in) {
        err = "cannot be read";
        return nullptr;
    }
    auto cal = std::make_shared<llama_tq_key_cal>();
    cal->path = path;
    std::string line;
    int lineno = 0;
    auto fail = [&](const std::string & why) {
        err = "line " + std::to_string(lineno) + ": " + why;
        return nullptr;
    };
    std::vector<uint8_t> seen;
    while (std::getline(in, line)) {
        ++lineno;
        std::istringstream ls(line);
        std::string key;
        if (!(ls >> key)) {
            continue;
        }
        if (lineno == 1) {
            int version = 0;
            if (key != "llama-tq-key-cal" || !(ls >> version) || version != 1) {
                return fail("not a llama-tq key calibration (expected 'llama-tq-key-cal 1'; write one with `llama-tq "
                            "calibrate`)");
            }
        } else if (key == "arch") {
            if (!(ls >> cal->arch)) {
                return fail("arch without a name");
            }
        } else if (key == "shape") {
            long long nl = 0, nh = 0, hd = 0;
            if (!cal->x.empty() || !(ls >> nl >> nh >> hd) || nl <= 0 || nh <= 0 || hd <= 0 || nl > 4096 ||
                nh > 4096 || hd > 4096) {
                return fail("shape must come once, before the energies, as three positive numbers");
            }
            cal->n_layer = (uint32_t) nl;
            cal->n_head_kv = (uint32_t) nh;
            cal->head = (uint32_t) hd;
            cal->x.assign((size_t) nl * nh * hd, 0.0f);
            cal->have.assign((size_t) nl, 0);
            seen.assign((size_t) nl * nh, 0);
        } else if (key == "x") {
            long long il = -1, h = -1;
            if (cal->x.empty() || !(ls >> il >> h) || il < 0 || h < 0 || il >= (long long) cal->n_layer || h >= (long long) cal->n_head_kv) {
                return fail("energies before the shape, or of a layer / KV head outside it");
            }
            const size_t at = (size_t) il * cal->n_head_kv + (size_t) h;
            if (seen[at]) {
                return fail("layer " + std::to_string(il) + " KV head " + std::to_string(h) + " given twice");
            }
            seen[at] = 1;
            float * dst = cal->x.data() + at * cal->head;
            for (uint32_t c = 0; c < cal->head; ++c) {
                double v = 0.0;
                if (!(ls >> v) || !std::isfinite(v) || v < 0.0 || v > 1e30) {
                    return fail("energy " + std::to_string(c) + " of layer " + std::to_string(il) +
                                " is missing, negative or not finite");
                }
                dst[c] = (float) v;
            }
            std::string extra;
            if (ls >> extra) {
                return fail("more than " + std::to_string(cal->head) + " energies");
            }
            cal->have[(size_t) il] = 1;
        } else {
            return fail("unknown record '" + key + "'");
        }
    }
    if (lineno == 0) {
        err = "is empty";
        return nullptr;
    }
    if (cal->arch.empty() || cal->x.empty()) {
        err = "has no arch or shape record";
        return nullptr;
    }
    for (uint32_t il = 0; il < cal->n_layer; ++il) {
        for (uint32_t h = 0; h < cal->n_head_kv && cal->have[il]; ++h) {
            if (!seen[(size_t) il * cal->n_head_kv + h]) {
                err = "layer " + std::to_string(il) + " lacks KV head " + std::to_string(h);
                return nullptr;
            }
        }
    }
    uint64_t hash = 1469598103934665603ull;  // FNV-1a over the energies' bytes
    const auto * bytes = reinterpret_cast<const uint8_t *>(cal->x.data());
    for (size_t i = 0; i < cal->x.size() * sizeof(float); ++i) {
        hash = (hash ^ bytes[i]) * 1099511628211ull;
    }
    cal->hash = hash;
    return cal;
}
