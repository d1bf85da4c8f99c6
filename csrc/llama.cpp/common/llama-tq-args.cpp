// llama-tq: see llama-tq-args.h. The flags are generated from the parameter lists (triatt_params.h) and parsed by
// the library's own functions (llama_tq_params_set), so a flag, its variable and the C API cannot disagree.
#include "llama-tq-args.h"

#include "log.h"

#include <cctype>
#include <deque>
#include <stdexcept>
#include <string>

namespace {

// "--triatt-pool-spans" -> "LLAMA_ARG_TRIATT_POOL_SPANS", kept alive for common_arg::set_env
const char * env_name(const char * flag) {
    static std::deque<std::string> names;
    std::string s = "LLAMA_ARG_";
    for (const char * c = flag + 2; *c != '\0'; ++c) {
        s += *c == '-' ? '_' : (char) std::toupper((unsigned char) *c);
    }
    return names.emplace_back(std::move(s)).c_str();
}

void set_tq(common_params & p, const char * name, const std::string & value) {
    char err[256];
    if (llama_tq_params_set(&p.tq, name, value.c_str(), err, sizeof err) != 0) {
        throw std::invalid_argument(err);
    }
}

}  // namespace

void llama_tq_add_args(const std::function<void(common_arg)> & add_opt, const common_params & params) {
    add_opt(common_arg(
        {"--tq-keys"}, "{auto,0,mean,eq,1,matrix}",
        "exact key transforms for tq3/tq4 keys: auto/1 = key-mean centering + channel equalization, mean = centering "
        "only, eq = equalization only, matrix = centering + equalization by a full matrix per KV head, 0 = none "
        "(default: auto)",
        [](common_params & p, const std::string & v) { set_tq(p, "keys", v); }).set_env("LLAMA_ARG_TQ_KEYS"));
    add_opt(common_arg(
        {"--tq-keys-cal"}, "FILE",
        "calibration of this model for tq3a keys (-ctk tq3a), written by `llama-tq calibrate`: the query-weighted "
        "energy of each key channel, which orders the channels into tq3a's 5/4/3/2-bit groups (default: none)",
        [](common_params & p, const std::string & v) { p.tq_keys_cal = v; }).set_env("LLAMA_ARG_TQ_KEYS_CAL"));
    add_opt(common_arg(
        {"--tq-attn-rot"}, "{auto,0,1,k,v}",
        "upstream's Hadamard attention rotation on the tq3/tq4 sides of the KV cache: auto = the measured default, "
        "0 = none, 1 = both, k = K only, v = V only (default: auto)",
        [](common_params & p, const std::string & v) { set_tq(p, "attn_rot", v); }).set_env("LLAMA_ARG_TQ_ATTN_ROT"));

    add_opt(common_arg(
        {"--triatt-policy"}, "{v3,v2,v1,streaming,random}",
        "TriAttention policy: v3 = per-segment quota + protected prefix, v2 = per-segment quota, v1 = global "
        "ranking; baselines: streaming = StreamingLLM (prefix + recent), random (default: v3)",
        [](common_params & p, const std::string & v) {
#define LLAMA_TQ_POLICY_SET(id, flag_name, name) \
    if (v == flag_name) {                        \
        p.triatt.hybrid = id;                    \
        return;                                  \
    }
            TRIATT_POLICIES(LLAMA_TQ_POLICY_SET)
#undef LLAMA_TQ_POLICY_SET
            throw std::invalid_argument("--triatt-policy must be v3, v2, v1, streaming or random (got '" + v + "')");
        }).set_env("LLAMA_ARG_TRIATT_POLICY"));

#define LLAMA_TQ_TRIATT_FLAG(field, def, flag, hint, help)                                                   \
    add_opt(common_arg({flag}, hint, std::string(help) + " (default: " + std::to_string(params.triatt.field) + ")", \
                       [](common_params & p, int v) { p.triatt.field = v; })                                 \
                .set_env(env_name(flag)));
#define LLAMA_TQ_TRIATT_RETIRED(field)
    TRIATT_PARAMS(LLAMA_TQ_TRIATT_FLAG, LLAMA_TQ_TRIATT_RETIRED)
#undef LLAMA_TQ_TRIATT_FLAG
#undef LLAMA_TQ_TRIATT_RETIRED
}

llama_context * llama_tq_init_context(llama_model * model, const llama_context_params & cparams,
                                      const common_params & params) {
    llama_context * lctx = llama_init_from_model_tq_cal(model, cparams, &params.tq, params.tq_keys_cal.c_str());
    if (lctx == nullptr) {
        return nullptr;
    }
    char err[256];
    if (llama_triatt_configure(lctx, &params.triatt, err, sizeof err) != 0) {
        LOG_ERR("TriAttention: %s\n", err);
        llama_free(lctx);
        return nullptr;
    }
    return lctx;
}
