// llama-tq: how the TQ cache options of llama_init_from_model_tq() reach the KV caches a context makes.
//
// A context builds its caches inside llama_init_from_model, through llama_model::create_memory, which calls one of a
// dozen memory constructors per architecture. Rather than add an argument to each of them (and to upstream's
// patch surface), llama_init_from_model_tq() holds the caller's options for the duration of that one call on this
// thread, and a cache being built reads them here. Outside such a call (plain llama_init_from_model) a cache gets
// the defaults. The caches keep what they read: nothing changes for a context after it is made.
#pragma once

#include "llama-tq.h"

// The options of the context being made on this thread (the defaults if none is).
llama_tq_params llama_tq_params_for_new_cache();
