// llama-tq: how the TQ cache options of llama_init_from_model_tq() reach the KV caches a context makes.
//
// A context builds its caches inside llama_init_from_model, through llama_model::create_memory, which calls one of a
// dozen memory constructors per architecture. Rather than add an argument to each of them (and to upstream's
// patch surface), llama_init_from_model_tq() holds the caller's options for the duration of that one call on this
// thread, and a cache being built reads them here. Outside such a call (plain llama_init_from_model) a cache gets
// the defaults. The caches keep what they read: nothing changes for a context after it is made.
#pragma once

#include "llama-tq.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

// The options of the context being made on this thread (the defaults if none is).
llama_tq_params llama_tq_params_for_new_cache();

// TQ3A keys' calibration, a file written by `llama-tq calibrate` (python/llama_tq/calibrate.py has its format): per
// (layer, KV head) the query-weighted energy of each key channel, x_c = sqrt(E[q_c^2] E[(k_c - mean_c)^2]) over a
// calibration text (post-RoPE queries of the head's group, keys less their mean). The cache orders each head's RoPE
// pairs by it, so that TQ3A's 5-bit group holds the loudest (docs/key-transforms.md).
struct llama_tq_key_cal {
    std::string path;
    std::string arch;          // general.architecture of the model it was made on
    uint32_t n_layer = 0;
    uint32_t n_head_kv = 0;
    uint32_t head = 0;
    std::vector<uint8_t> have; // [n_layer]: the file has the layer (layers without KV have none)
    std::vector<float> x;      // [n_layer][n_head_kv][head]
    uint64_t hash = 0;         // FNV-1a of the energies' bytes: a saved state names the calibration its keys used
    const float * energies(uint32_t il, uint32_t h) const { return x.data() + ((size_t) il * n_head_kv + h) * head; }
};

// Reads and checks a calibration file; nullptr with the reason in err.
std::shared_ptr<const llama_tq_key_cal> llama_tq_key_cal_load(const char * path, std::string & err);
// The calibration of the context being made on this thread (nullptr if none was given).
std::shared_ptr<const llama_tq_key_cal> llama_tq_key_cal_for_new_cache();
