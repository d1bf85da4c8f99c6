// llama-tq: its options in llama.cpp's common argument parser, and the context made with them.
#pragma once

#include "arg.h"
#include "common.h"

#include <functional>

// --tq-keys, --tq-attn-rot, --triatt-policy and every TriAttention parameter of triatt_params.h (--triatt-*), each
// with its LLAMA_ARG_* variable, into common_params::tq and common_params::triatt.
void llama_tq_add_args(const std::function<void(common_arg)> & add_opt, const common_params & params);

// common_init_result's context: made with params.tq (llama_init_from_model_tq), TriAttention configured from
// params.triatt. nullptr, after printing why, when either fails.
llama_context * llama_tq_init_context(llama_model * model, const llama_context_params & cparams,
                                      const common_params & params);
