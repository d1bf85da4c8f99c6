// TriAttention V3 eviction inside libllama: query capture, calibration, scoring of cached keys and eviction rounds.
// The algorithms are in triatt.c; this file only connects them to llama_context (two hooks) and the KV cache.
//
// It also holds the C API of include/llama-tq.h (llama_triatt_default_params, llama_triatt_configure, ...).
//
// Log format (parsed by llama_tq.harness.common; keep them in step; the policy is V1, V2, V3, StreamingLLM or random):
//   info, when configured:  triatt: V3 eviction on: budget B, prefix P, window W, segments S, divide D, warmup U
//   info, one per round:    triatt: evict: evicted N/M cells round=R seq=S kept=K budget=B policy=V3 pos=P t_ms=T folded=F wait_ms=W
//                           (P: the newest position in the sequence when the round ran; F: the cells whose keys
//                           were read and folded since the previous round, the others' folded keys were kept from
//                           earlier rounds; W: the time spent since then waiting for a device's copies of keys;
//                           a late round ends with " late=1", logged when it is applied, P the position it was decided at)
//
// Pipelining: the keys a ubatch writes are copied behind it (a device cache) and folded after the next ubatch is
// launched, while the device computes it. A round after a ubatch no longer than the window (decoding; prefill in
// short ubatches) does not need that ubatch's keys, since the window keeps its cells anyway, so it does not wait for
// the device. After a longer ubatch (every policy alike) the round is late: decided after the next ubatch is
// launched, when the longer ubatch's keys are folded while the device computes the next one, on the cells and
// positions the sequence had after the longer ubatch (the next ubatch's cells, newer than the round, stay). Only the
// removal comes a ubatch later: that ubatch attends to up to a ubatch of cells more than the budget, and the
// cache holds up to budget + divide + 2 ubatches in between. A round at once would have chosen from the same cells
// with the same keys the first time; later rounds differ slightly, since the keys a ubatch writes depend on the
// cells it attended to. The round is at once (reading the keys, waiting for the device) where the stream lacks room
// for another ubatch beside the cells it would remove, or with LLAMA_TQ_TRIATT_LATE_DISABLE=1 (tq_env.h, for
// comparison: the rounds of the measurements made before late rounds).
//   warn (shown at the default verbosity), when the context ends:
//                           triatt: summary: policy=V3 budget=B rounds=R evicted=N t_ms=T folded=F
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "llama-tq.h"
#include "triatt.h"

struct llama_model;
struct llama_cparams;
struct llama_memory_i;
struct llama_ubatch;
class llama_kv_cache;
class llama_kv_cells;

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

    // After a ubatch is in the cache: folds the previous ubatch's keys, queues this one's, and runs an eviction round
    // for every sequence above budget + divide.
    void after_ubatch();

    // Before a batch of n_tokens is placed in the cache: the late rounds still due are applied now when the batch is
    // no longer than the window (generation after a prompt), so that the tokens generated attend to the budget, as
    // after a round at once. A longer batch (prefill) leaves them to its first ubatch's after_ubatch.
    void before_batch(uint32_t n_tokens);

    // The cache's keys changed outside a ubatch (a K-shift, a copy between streams, a state read): every folded key
    // is read again at the next round.
    void forget_keys();

    int32_t n_rounds() const { return rounds; }
    int64_t n_evicted() const { return evicted; }
    int64_t n_folded() const { return folded_total; }
    size_t record_bytes() const { return rec_floats * sizeof(float); }  // a folded key's record (plus 8 B a cell)

private:
    struct layer_stats {
        int32_t il = -1;
        int32_t n_head = 0, n_head_kv = 0, head_dim = 0;
        triatt_rope rope{};
        std::vector<double> theta;                   // per rotated pair (freq factors folded in)
        std::vector<double> sum_re, sum_im, sum_mag;  // [n_head_kv][head_dim/2]
        std::vector<int64_t> count;                   // per KV head
        std::vector<float> mu_re, mu_im, mag;         // means, after calibration
        std::vector<float> w_re, w_im, b;             // triatt_weights per KV head, after calibration
        int32_t group = 0;                            // layers with the same RoPE angles fold into one state
        size_t z_off = 0;                             // where that state (z_re, then z_im) starts in a cell's record
                                                      // (its per-pair c terms start at z_off / 2 while folding)
    };

    // A cell's folded key (triatt_fold_key): per group of layers with the same angles z_re and z_im (np floats
    // each), then the constant c. Kept per stream and cell with the position the key had; a round folds only the
    // cells whose record is missing or stale (written by a ubatch since, moved, or forgotten), so a key is read from
    // the cache, decoded and folded once, not once per round.
    // Records live in slots, not one per cell (issue 43: a 1M-cell context with budget 300 took 1 GB at its first
    // round): a slot is taken when a cell is folded, given back when the cell is evicted or forgotten, and the slots
    // of cells that changed otherwise (seq_rm, overwritten) are swept before the slots grow past twice the live ones.
    // So the records follow the cells that hold keys (after a round: budget + divide + a ubatch per sequence).
    struct folded_keys {
        static constexpr uint32_t NO_SLOT = UINT32_MAX;
        std::vector<int32_t> pos;    // per cell: the position its record was folded at; INT32_MIN = none
        std::vector<uint32_t> slot;  // per cell: its record's slot; NO_SLOT = none
        std::vector<float> rec;      // [slot][rec_floats]
        std::vector<uint32_t> free;  // slots no cell holds
        size_t sweep_at = 256;       // slots at which a growth first sweeps
    };

    llama_triatt(const llama_model & model, const llama_cparams & cparams, llama_kv_cache * kv, uint32_t n_seq_max,
                 const triatt_config & cfg);

    static bool eval_cb(ggml_tensor * t, bool ask, void * ud);
    layer_stats * capture_target(const ggml_tensor * t);
    void capture(layer_stats & ls, const ggml_tensor * t);
    bool finish_calibration();
    // K rows of some cells of one stream, gathered for folding: read in place from a host cache, or copied from a
    // device into the slabs of one set (set 0: a round's own reads, waited for at once; set 1: a ubatch's new keys,
    // copied behind it and folded after the next ubatch was launched, while the device computes it).
    struct gathered {
        struct layer_rows {
            const layer_stats * ls;
            ggml_type type;
            int64_t n_embd;
            size_t row_bytes;
            const uint8_t * host;  // host cache: the stream's rows; else nullptr and the rows are in slabs[slab]
            size_t slab;
        };
        llama_seq_id seq = 0;  // a sequence of the stream (for its cells)
        uint32_t stream = 0;
        std::vector<uint32_t> cells;    // sorted
        std::vector<int32_t> pos;       // the position each cell held when gathered; INT32_MIN: rewritten since
        std::vector<size_t> slab_row;   // row of cells[j] in a layer's slab
        std::vector<layer_rows> lr;
        std::vector<ggml_backend_t> backends;  // backends with copies queued
    };

    void evict_seq(int32_t seq);
    // One round over the cells idx (positions pos, ascending: the newest is the round's position); fresh cells (the
    // newest ubatch's, all inside the window) are kept unscored.
    void round(llama_seq_id seq, const std::vector<uint32_t> & idx, const std::vector<int32_t> & pos,
               const std::vector<uint8_t> & fresh, bool late);
    // A round decided after a ubatch longer than the window, applied after the next ubatch was launched.
    struct late_round {
        llama_seq_id seq = 0;
        std::vector<uint32_t> idx;  // the sequence's cells when it was due, by position
        std::vector<int32_t> pos;
    };
    bool late_ok(const llama_kv_cells & kc) const;  // room for the next ubatch beside the cells a round would remove
    // the rounds due since the previous ubatch, on their cells (a changed one drops the round; after_new: a ubatch
    // was written since they were due, whose cells a round's must not be)
    void late_rounds(bool after_new);
    void forget_written();  // the records (and previous ubatch's copies) of the cells in newest
    // the cells a ubatch wrote, per stream: a sequence of the stream (-1: none) and the cells, sorted
    std::vector<std::pair<llama_seq_id, std::vector<uint32_t>>> written_cells(const llama_ubatch & ubatch) const;
    void gather(llama_seq_id seq, std::vector<uint32_t> cells, size_t set, gathered & g);
    // A device cache's rows of g.cells gathered on the device (a get_rows of every scored layer's rows as 32-bit
    // words, on the stream behind the ubatch) and copied to the slabs in one piece a layer; false where that does
    // not apply (host cache, few cells, rows of odd size, layers on several devices) and the caller copies ranges.
    bool gather_on_device(gathered & g, size_t set);
    // g has copies queued on be: await() waits for them (set 1: by be's event, made here the first time)
    void copies_on(gathered & g, ggml_backend_t be, size_t set);
    void await(const gathered & g, bool by_event);  // the copies of g are done (by_event: set 1's events)
    void fold(const gathered & g, const llama_kv_cells & kc);
    folded_keys & records(uint32_t stream, const llama_kv_cells & kc);
    // slots for these cells (those without one), after a sweep where the slots would grow past sweep_at
    void take_slots(folded_keys & fk, const llama_kv_cells & kc, const std::vector<uint32_t> & cells);
    void give_slot(folded_keys & fk, uint32_t cell);  // the cell's record is gone (evicted, forgotten, stale)
    float * record(folded_keys & fk, uint32_t cell) const { return fk.rec.data() + (size_t) fk.slot[cell] * rec_floats; }
    void fold_pending();  // the previous ubatch's keys (set 1), if any

    const llama_model & model;
    llama_kv_cache * kv;  // the full-attention cache (the base cache of a sliding-window hybrid)
    uint32_t n_seq_max;
    int32_t n_threads;  // the context's batch threads: a round scores cell ranges in parallel
    uint32_t n_ubatch;  // the context's ubatch size: the room a late round leaves for the next ubatch
    bool late_disabled;  // LLAMA_TQ_TRIATT_LATE_DISABLE=1: every round at once
    bool device_gather_disabled;  // LLAMA_TQ_TRIATT_DEVICE_GATHER_DISABLE=1: rows copied as ranges
    bool async_capture_disabled;  // LLAMA_TQ_TRIATT_ASYNC_CAPTURE_DISABLE=1: a device's queries summed in the callback
    bool device_gather_said = false;  // the first device gather is logged
    std::vector<std::pair<ggml_backend_t, ggml_gallocr_t>> gallocs;  // the device gathers' buffers, per backend
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
    int64_t folded_total = 0;  // keys read and folded (a key is folded again only after its cell changed)
    int64_t folded_at_round = 0;  // folded_total at the last round
    double t_ms = 0.0;     // time spent in rounds and in the folds between them
    double wait_ms = 0.0;  // waits for a device since the last round (in t_ms)
    ggml_backend_sched_t sched = nullptr;    // the ubatch's scheduler: its backends copy K rows behind the ubatch
    std::vector<const layer_stats *> group_rope;  // per group: a layer whose angles the group shares
    size_t rec_floats = 0;  // per cell: head_dim floats a group, then c
    size_t c_pairs = 0;     // per cell while folding: head_dim / 2 c terms a group
    std::vector<folded_keys> folded;         // per stream
    struct host_slab {  // K rows copied from a device cache for one scored layer, reused across rounds
        ggml_backend_buffer_ptr buf;  // pinned host memory of the cache's device, where it has one
        std::vector<uint8_t> mem;     // else pageable memory
        uint8_t * data = nullptr;
        size_t size = 0;
    };
    std::vector<host_slab> slabs;  // [set * layers.size() + layer], then captured queries: [2 * layers.size()]
                                   // in the callback, the next calib_ring_size the calibration ring's
    uint8_t * slab(size_t i, size_t bytes, ggml_backend_buffer_type_t dev_buft);
    std::vector<gathered> pending;  // set 1: the newest ubatch's keys, per stream, folded after the next ubatch
    std::vector<late_round> late;   // rounds due after the newest ubatch, applied after the next one
    std::vector<std::pair<llama_seq_id, std::vector<uint32_t>>> newest;  // written_cells of the newest ubatch
    std::vector<std::pair<ggml_backend_t, ggml_backend_event_t>> events;  // set 1's copies done, per backend
    ggml_backend_t copy_backend(ggml_backend_buffer_t buf) const;  // the scheduler's backend on buf's device
    std::shared_ptr<const std::vector<double>> phases;  // calibration: cos, then sin of the ubatch's positions for
                                                        // one group's angles
    int32_t phase_group = -1;
    int64_t phase_tokens = -1;   // tokens_seen when they were made (one ubatch)
    // calibration on a device: each captured layer's queries copied into a pinned slab of a small ring, summed by a
    // thread that waits for the copy's event while the device computes on; all joined at the end of the ubatch
    struct calib_slot {
        std::thread th;
        ggml_backend_t be = nullptr;
        ggml_backend_event_t ev = nullptr;
    };
    static constexpr size_t calib_ring_size = 3;
    std::vector<calib_slot> calib_ring = std::vector<calib_slot>(calib_ring_size);
    size_t calib_next = 0;
    void add_query_sums(layer_stats & ls, const float * q, int64_t n_tok, const std::vector<double> & ph);
    void calib_drain();
};
