// llama-tq: its options in llama.cpp's common argument parser, and the context made with them.
#pragma once

#include "arg.h"
#include "common.h"

#include <functional>

// The TQ cache types of -ctk / -ctv (common/arg.cpp's kv_cache_types): tq3 / tq4 (their 64- and 96-value blocks are
// picked by themselves where heads need them, and may be named too) and tq3a (keys only, CPU, with --tq-keys-cal).
#define LLAMA_TQ_KV_CACHE_TYPES                                                                                     \
    GGML_TYPE_TQ3, GGML_TYPE_TQ4, GGML_TYPE_TQ3_64, GGML_TYPE_TQ4_64, GGML_TYPE_TQ3_96, GGML_TYPE_TQ4_96, GGML_TYPE_TQ3A,

// --tq-keys, --tq-attn-rot, --triatt-policy and every TriAttention parameter of triatt_params.h (--triatt-*), each
// with its LLAMA_ARG_* variable, into common_params::tq and common_params::triatt.
void llama_tq_add_args(const std::function<void(common_arg)> & add_opt, const common_params & params);

// common_init_result's context: made with params.tq and params.tq_keys_cal (llama_init_from_model_tq_cal), TriAttention configured from
// params.triatt. nullptr, after printing why, when either fails.
llama_context * llama_tq_init_context(llama_model * model, const llama_context_params & cparams,
                                      const common_params & params);
