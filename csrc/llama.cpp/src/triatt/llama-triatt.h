// TriAttention V3 eviction inside libllama: query capture, calibration, scoring of cached keys and eviction rounds.
// The algorithms are in triatt.c; this file only connects them to llama_context (two hooks) and the KV cache.
//
// It also holds the C API of include/llama.h (llama_triatt_default_params, llama_triatt_configure, ...).
//
// Log format (parsed by llama_tq.harness.common; keep them in step; the policy is V1, V2, V3, StreamingLLM or random):
//   info, when configured:  triatt: V3 eviction on: budget B, prefix P, window W, segments S, divide D, warmup U
//   info, one per round:    triatt: evict: evicted N/M cells round=R seq=S kept=K budget=B policy=V3 pos=P t_ms=T
//                           (P: the newest position in the sequence when the round ran)
//   warn (shown at the default verbosity), when the context ends:
//                           triatt: summary: policy=V3 budget=B rounds=R evicted=N t_ms=T
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "triatt.h"

struct llama_model;
struct llama_cparams;
struct llama_memory_i;
struct llama_ubatch;
class llama_kv_cache;

class llama_triatt {
public:
    // nullptr and a message in err if the settings are invalid or the model / memory cannot be handled.
    static std::unique_ptr<llama_triatt> create(const llama_model & model, const llama_cparams & cparams,
                                                llama_memory_i * memory, uint32_t n_seq_max, const triatt_config & cfg,
                                                std::string & err);
    ~llama_triatt();  // logs the summary line

    // Before a ubatch's graph runs: installs the query-capture callback (chained with the user's) while
    // calibrating, and gives the scheduler back the user's callback once calibrated.
    void begin_ubatch(const llama_ubatch & ubatch, ggml_backend_sched_t sched, ggml_backend_sched_eval_callback user_cb,
                      void * user_ud);

    // After a ubatch is in the cache: an eviction round for every sequence above budget + divide.
    void after_ubatch(llama_memory_i * memory);

    int32_t n_rounds() const { return rounds; }
    int64_t n_evicted() const { return evicted; }

private:
    struct layer_stats {
        int32_t il = -1;
        int32_t n_head = 0, n_head_kv = 0, head_dim = 0;
        triatt_rope rope{};
        std::vector<double> theta;                   // per rotated pair (freq factors folded in)
        std::vector<double> sum_re, sum_im, sum_mag;  // [n_head_kv][head_dim/2]
        std::vector<int64_t> count;                   // per KV head
        std::vector<float> mu_re, mu_im, mag;         // means, after calibration
    };

    llama_triatt(const llama_model & model, const llama_cparams & cparams, llama_kv_cache * kv, uint32_t n_seq_max,
                 const triatt_config & cfg);

    static bool eval_cb(ggml_tensor * t, bool ask, void * ud);
    layer_stats * capture_target(const ggml_tensor * t);
    void capture(layer_stats & ls, const ggml_tensor * t);
    bool finish_calibration();
    void evict_seq(int32_t seq, llama_memory_i * memory);

    const llama_model & model;
    llama_kv_cache * kv;  // the full-attention cache (the base cache of a sliding-window hybrid)
    uint32_t n_seq_max;
    int32_t n_threads;  // the context's batch threads: a round scores cell ranges in parallel
    triatt_config cfg;
    std::vector<layer_stats> layers;  // full-attention layers, in model order
    std::vector<int32_t> layer_slot;  // model layer -> index in layers, or -1

    bool calibrated = false;
    bool hook_installed = false;
    int64_t tokens_seen = 0;
    const llama_ubatch * cur = nullptr;
    ggml_backend_sched_eval_callback user_cb = nullptr;
    void * user_ud = nullptr;
    bool user_asked = false;

    int32_t rounds = 0;
    int64_t evicted = 0;
    double t_ms = 0.0;  // time spent in eviction rounds
    std::vector<std::vector<uint8_t>> slabs;  // K rows copied from a device cache, per scored layer, reused
    std::vector<float> rowbuf;
};
