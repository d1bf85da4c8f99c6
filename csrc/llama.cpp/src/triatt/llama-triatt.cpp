// TriAttention V3 eviction inside libllama: see llama-triatt.h.
#include "llama-triatt.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "llama-batch.h"
#include "llama-context.h"
#include "llama-cparams.h"
#include "llama-impl.h"
#include "llama-kv-cache-iswa.h"
#include "llama-kv-cache.h"
#include "llama-model.h"
#include "tq_env.h"

namespace {

// The orthonormal Walsh-Hadamard rotation upstream applies to K when its attention rotation is on (H*H = I):
// applied again, it restores the post-RoPE key.
void unrotate_hadamard(float * x, int64_t n, int64_t block) {
    const float scale = 1.0f / std::sqrt((float) block);
    for (int64_t b0 = 0; b0 < n; b0 += block) {
        float * v = x + b0;
        for (int64_t len = 1; len < block; len <<= 1) {
            for (int64_t i = 0; i < block; i += 2 * len) {
                for (int64_t j = i; j < i + len; ++j) {
                    const float a = v[j], c = v[j + len];
                    v[j] = a + c;
                    v[j + len] = a - c;
                }
            }
        }
        for (int64_t j = 0; j < block; ++j) {
            v[j] *= scale;
        }
    }
}

// The post-RoPE query of layer il is the ROPE op upstream's graph builders name "Qcur-<il>" (their callback
// naming convention, also what imatrix and eval-callback read); a model that names it otherwise calibrates
// nothing, and finish_calibration() says so.
int32_t layer_of(const char * name) {  // "Qcur-12" -> 12
    if (std::strncmp(name, "Qcur-", 5) != 0) {
        return -1;
    }
    char * end = nullptr;
    const long il = std::strtol(name + 5, &end, 10);
    return (end != name + 5 && *end == '\0') ? (int32_t) il : -1;
}

// Future query offsets D = 1, 2, 4, ..., 2^16 of the score (triatt.h).
constexpr int32_t k_max_log2 = 16;

// Sorted cell indices as [lo, hi) ranges that cover them, one device-to-host copy per range and layer: a gap of
// more than min_gap cells splits (a copy's fixed cost is worth about that many rows), at most max_runs ranges (the
// largest gaps split first); smaller gaps are copied along.
std::vector<std::pair<uint32_t, uint32_t>> cell_ranges(const std::vector<uint32_t> & sorted, uint32_t min_gap,
                                                       size_t max_runs) {
    std::vector<std::pair<uint32_t, uint32_t>> runs;
    if (sorted.empty()) {
        return runs;
    }
    std::vector<std::pair<uint32_t, size_t>> gaps;  // (gap, index of the cell after it)
    for (size_t j = 1; j < sorted.size(); ++j) {
        if (sorted[j] - sorted[j - 1] - 1 > min_gap) {
            gaps.emplace_back(sorted[j] - sorted[j - 1] - 1, j);
        }
    }
    const size_t n_split = std::min(gaps.size(), max_runs - 1);
    std::partial_sort(gaps.begin(), gaps.begin() + n_split, gaps.end(),
                      [](const auto & a, const auto & b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
    std::vector<size_t> cuts;
    for (size_t g = 0; g < n_split; ++g) {
        cuts.push_back(gaps[g].second);
    }
    std::sort(cuts.begin(), cuts.end());
    size_t j0 = 0;
    for (size_t c : cuts) {
        runs.emplace_back(sorted[j0], sorted[c - 1] + 1);
        j0 = c;
    }
    runs.emplace_back(sorted[j0], sorted.back() + 1);
    return runs;
}

}  // namespace

std::unique_ptr<llama_triatt> llama_triatt::create(const llama_model & model, const llama_cparams & cparams,
                                                   llama_memory_i * memory, uint32_t n_seq_max,
                                                   const triatt_config & cfg, std::string & err) {
    char msg[256];
    if (triatt_config_check(&cfg, msg, sizeof msg) != 0) {
        err = msg;
        return nullptr;
    }
    llama_kv_cache * kv = dynamic_cast<llama_kv_cache *>(memory);
    if (auto * iswa = dynamic_cast<llama_kv_cache_iswa *>(memory)) {
        kv = iswa->get_base();  // sliding-window hybrid: act on the full-attention cache
    }
    if (kv == nullptr) {
        err = "TriAttention eviction needs a transformer KV cache; this model's memory (recurrent or hybrid "
              "recurrent, or none) is not supported";
        return nullptr;
    }
    const auto & hp = model.hparams;
    switch (hp.rope_type) {
        case LLAMA_ROPE_TYPE_NORM:
        case LLAMA_ROPE_TYPE_NEOX:
            break;
        case LLAMA_ROPE_TYPE_NONE:
            err = "TriAttention scores keys through RoPE; this model has no RoPE";
            return nullptr;
        default:
            err = "TriAttention does not handle this model's RoPE variant (M-RoPE / vision RoPE)";
            return nullptr;
    }
    if (hp.is_mla()) {
        err = "TriAttention does not handle multi-head latent attention caches";
        return nullptr;
    }
    std::unique_ptr<llama_triatt> t(new llama_triatt(model, cparams, kv, n_seq_max, cfg));
    if (t->layers.empty()) {
        err = "TriAttention found no full-attention layer with RoPE in the KV cache";
        return nullptr;
    }
    return t;
}

llama_triatt::llama_triatt(const llama_model & model, const llama_cparams & cparams, llama_kv_cache * kv,
                           uint32_t n_seq_max, const triatt_config & cfg)
    : model(model), kv(kv), n_seq_max(n_seq_max), n_threads(std::max(1, (int32_t) cparams.n_threads_batch)),
      n_ubatch(cparams.n_ubatch), late_disabled(tq_env_flag(TQ_ENV_TRIATT_LATE_DISABLE) != 0),
      device_gather_disabled(tq_env_flag(TQ_ENV_TRIATT_DEVICE_GATHER_DISABLE) != 0),
      async_capture_disabled(tq_env_flag(TQ_ENV_TRIATT_ASYNC_CAPTURE_DISABLE) != 0), cfg(cfg) {
    const auto & hp = model.hparams;
    layer_slot.assign(hp.n_layer(), -1);
    std::vector<uint32_t> ids = kv->get_layer_ids();
    std::sort(ids.begin(), ids.end());
    // boundary_skip: the first and last attention layers of the cache stay out of the score
    const size_t skip = std::min<size_t>((size_t) cfg.boundary_skip, ids.size() / 2);
    for (size_t k = skip; k + skip < ids.size(); ++k) {
        const uint32_t il = ids[k];
        if (!hp.has_rope(il) || kv->get_k_storage((int32_t) il) == nullptr) {
            continue;
        }
        layer_stats ls;
        ls.il = (int32_t) il;
        ls.n_head = (int32_t) hp.n_head(il);
        ls.n_head_kv = (int32_t) hp.n_head_kv(il);
        ls.head_dim = (int32_t) hp.n_embd_head_k(il);
        const size_t np = (size_t) ls.head_dim / 2;
        ls.sum_re.assign(np * ls.n_head_kv, 0.0);
        ls.sum_im.assign(np * ls.n_head_kv, 0.0);
        ls.sum_mag.assign(np * ls.n_head_kv, 0.0);
        ls.count.assign(ls.n_head_kv, 0);
        // the layer's RoPE as the graph applies it: the model's accessors for base, scale and frequency factors
        const int32_t n_rot = (int32_t) hp.n_rot(il);
        const float base = model.get_rope_freq_base(cparams, (int) il);
        const float scale = model.get_rope_freq_scale(cparams, (int) il);
        std::vector<float> ff;
        if (const ggml_tensor * f = model.get_rope_factors(cparams, (int) il); f != nullptr && f->type == GGML_TYPE_F32) {
            ff.resize((size_t) ggml_nelements(f));
            ggml_backend_tensor_get(f, ff.data(), 0, ff.size() * sizeof(float));
        }
        ls.theta.resize((size_t) n_rot / 2);
        for (size_t f = 0; f < ls.theta.size(); ++f) {
            ls.theta[f] = scale * std::pow((double) base, -2.0 * (double) f / n_rot) / (f < ff.size() ? ff[f] : 1.0);
        }
        ls.rope = triatt_rope{ls.head_dim, n_rot, hp.rope_type == LLAMA_ROPE_TYPE_NEOX ? 1 : 0, base, scale, nullptr};
        layer_slot[il] = (int32_t) layers.size();
        layers.push_back(std::move(ls));
    }
    for (auto & ls : layers) {
        ls.rope.theta = ls.theta.data();  // after the moves: the vectors' storage is final
        // layers with the same angles (all of them in most models) share one folded state per cell
        size_t g = 0;
        while (g < group_rope.size() && !(group_rope[g]->head_dim == ls.head_dim && group_rope[g]->rope.n_rot == ls.rope.n_rot &&
                                          group_rope[g]->theta == ls.theta)) {
            ++g;
        }
        if (g == group_rope.size()) {
            group_rope.push_back(&ls);
            ls.z_off = rec_floats;
            rec_floats += (size_t) ls.head_dim;  // 2 floats for each of head_dim / 2 pairs
        }
        ls.group = (int32_t) g;
        ls.z_off = group_rope[g]->z_off;
    }
    c_pairs = rec_floats / 2;
    rec_floats += 1;  // the constant c
}

llama_triatt::~llama_triatt() {
    // the context's backends are gone by now (freeing the pinned slabs waits for copies still queued into them)
    calib_drain();
    for (auto & cs : calib_ring) {
        if (cs.ev != nullptr) {
            ggml_backend_event_free(cs.ev);
        }
    }
    for (auto & [be, ev] : events) {
        if (ev != nullptr) {
            ggml_backend_event_free(ev);
        }
    }
    for (auto & [be, ga] : gallocs) {
        ggml_gallocr_free(ga);
    }
    LLAMA_LOG_WARN("triatt: summary: policy=%s budget=%d rounds=%d evicted=%lld t_ms=%.1f folded=%lld\n",
                   triatt_policy_name(cfg.hybrid), cfg.budget, rounds, (long long) evicted, t_ms, (long long) folded_total);
}

// ---- calibration -------------------------------------------------------------------------------------------------

void llama_triatt::begin_ubatch(const llama_ubatch & ubatch, ggml_backend_sched_t sched,
                                ggml_backend_sched_eval_callback ucb, void * uud) {
    calib_drain();  // a ubatch that failed before after_ubatch: its sums are done before this one's start
    cur = &ubatch;
    this->sched = sched;
    if (!calibrated) {
        user_cb = ucb;
        user_ud = uud;
        ggml_backend_sched_set_eval_callback(sched, eval_cb, this);
        hook_installed = true;
        tokens_seen += ubatch.n_tokens;
    } else if (hook_installed) {
        // calibrated: the capture hook goes, so the scheduler runs graphs unsplit again
        ggml_backend_sched_set_eval_callback(sched, ucb, uud);
        hook_installed = false;
    }
}

llama_triatt::layer_stats * llama_triatt::capture_target(const ggml_tensor * t) {
    if (calibrated || t->op != GGML_OP_ROPE || t->type != GGML_TYPE_F32) {
        return nullptr;
    }
    const int32_t il = layer_of(t->name);
    if (il < 0 || il >= (int32_t) layer_slot.size() || layer_slot[il] < 0) {
        return nullptr;
    }
    layer_stats & ls = layers[layer_slot[il]];
    return (t->ne[0] == ls.head_dim && t->ne[1] == ls.n_head) ? &ls : nullptr;
}

bool llama_triatt::eval_cb(ggml_tensor * t, bool ask, void * ud) {
    auto * self = static_cast<llama_triatt *>(ud);
    layer_stats * ls = self->capture_target(t);
    if (ask) {
        self->user_asked = self->user_cb != nullptr && self->user_cb(t, true, self->user_ud);
        return ls != nullptr || self->user_asked;
    }
    if (ls != nullptr) {
        self->capture(*ls, t);
    }
    return self->user_asked ? self->user_cb(t, false, self->user_ud) : true;
}

void llama_triatt::capture(layer_stats & ls, const ggml_tensor * t) {
    if (cur == nullptr || t->ne[2] != (int64_t) cur->n_tokens || !ggml_is_contiguous(t)) {
        return;
    }
    const int64_t n_tok = t->ne[2];
    const size_t m = (size_t) ls.head_dim / 2 * (size_t) n_tok;
    if (phases == nullptr || phase_group != ls.group || phase_tokens != tokens_seen) {
        // the un-rotation's cos and sin, shared by every head and every layer of the group in this ubatch (a new
        // table each time: the sums still running on threads keep theirs)
        std::vector<int32_t> pos(cur->pos, cur->pos + n_tok);
        auto ph = std::make_shared<std::vector<double>>(2 * m);
        triatt_calib_phases(&ls.rope, pos.data(), (int32_t) n_tok, ph->data(), ph->data() + m);
        phases = std::move(ph);
        phase_group = ls.group;
        phase_tokens = tokens_seen;
    }
    if (t->buffer != nullptr && ggml_backend_buffer_is_host(t->buffer)) {
        add_query_sums(ls, (const float *) t->data, n_tok, *phases);  // in place in host memory
        return;
    }
    // a device's queries: copied into the device's pinned host memory (into pageable memory a copy is staged and
    // several times slower). The scheduler waits for this callback before it launches the rest of the graph, so the
    // copy is queued behind the queries and a thread waits for it and adds the sums while the device goes on (done
    // in the callback, the copies and sums of 64 captures held the 8B shape's GPU ~95 ms: bench/results/v3_eviction.md)
    const size_t bytes = ggml_nbytes(t);
    ggml_backend_t be = async_capture_disabled || sched == nullptr
                            ? nullptr
                            : ggml_backend_sched_get_tensor_backend(sched, const_cast<ggml_tensor *>(t));
    if (be != nullptr) {
        calib_slot & cs = calib_ring[calib_next % calib_ring_size];
        if (cs.th.joinable()) {
            cs.th.join();  // the slot's previous layer is summed before its slab is reused
        }
        if (cs.be != be) {
            if (cs.ev != nullptr) {
                ggml_backend_event_free(cs.ev);
            }
            cs.ev = ggml_backend_event_new(ggml_backend_get_device(be));  // nullptr: a backend without events
            cs.be = be;
        }
        if (cs.ev != nullptr) {
            uint8_t * buf = slab(2 * layers.size() + 1 + calib_next % calib_ring_size, bytes,
                                 ggml_backend_buffer_get_type(t->buffer));
            ggml_backend_tensor_get_async(be, t, buf, 0, bytes);
            ggml_backend_event_record(cs.ev, be);
            ++calib_next;
            cs.th = std::thread([this, &ls, buf, n_tok, ph = phases, ev = cs.ev]() {
                ggml_backend_event_synchronize(ev);
                add_query_sums(ls, (const float *) buf, n_tok, *ph);
            });
            return;
        }
    }
    uint8_t * buf = slab(2 * layers.size(), bytes, ggml_backend_buffer_get_type(t->buffer));
    ggml_backend_tensor_get(t, buf, 0, bytes);  // the scheduler has synchronized before this callback
    add_query_sums(ls, (const float *) buf, n_tok, *phases);
}

void llama_triatt::add_query_sums(layer_stats & ls, const float * q, int64_t n_tok, const std::vector<double> & ph) {
    const size_t np = (size_t) ls.head_dim / 2, m = np * (size_t) n_tok;
    // GQA: query heads averaged into their KV head; the KV heads' sums spread over threads (each KV head's sums on
    // one thread, in head order: the same sums whatever the split, and whether the capture waits for them or not)
    const int32_t group = ls.n_head / ls.n_head_kv;
    auto add_heads = [&](int32_t hk0, int32_t hk1) {
        for (int32_t hk = hk0; hk < hk1; ++hk) {
            for (int32_t h = hk * group; h < (hk + 1) * group; ++h) {
                triatt_calib_add_ph(&ls.rope, q + (size_t) h * ls.head_dim, (size_t) ls.head_dim * ls.n_head,
                                    (int32_t) n_tok, ph.data(), ph.data() + m, &ls.sum_re[hk * np],
                                    &ls.sum_im[hk * np], &ls.sum_mag[hk * np]);
            }
            ls.count[hk] += n_tok;
        }
    };
    // at least 64k query pairs a thread, at most half the context's threads (as the folds: ggml's own threads share
    // the cores)
    const int64_t work = (int64_t) ls.n_head * n_tok * (int64_t) np;
    const int32_t n_thr = (int32_t) std::max<int64_t>(1, std::min<int64_t>({(int64_t) std::max(1, n_threads / 2),
                                                                         (int64_t) ls.n_head_kv, work / 65536}));
    std::vector<std::thread> pool;
    for (int32_t i = 1; i < n_thr; ++i) {
        pool.emplace_back(add_heads, ls.n_head_kv * i / n_thr, ls.n_head_kv * (i + 1) / n_thr);
    }
    add_heads(0, ls.n_head_kv / n_thr);
    for (auto & th : pool) {
        th.join();
    }
}

void llama_triatt::calib_drain() {
    for (auto & cs : calib_ring) {
        if (cs.th.joinable()) {
            cs.th.join();
        }
    }
}

bool llama_triatt::finish_calibration() {
    if (calibrated) {
        return true;
    }
    int32_t n_ok = 0;
    for (auto & ls : layers) {
        if (ls.count.empty() || ls.count[0] == 0) {
            continue;
        }
        const size_t np = (size_t) ls.head_dim / 2;
        ls.mu_re.resize(np * ls.n_head_kv);
        ls.mu_im.resize(np * ls.n_head_kv);
        ls.mag.resize(np * ls.n_head_kv);
        for (int32_t hk = 0; hk < ls.n_head_kv; ++hk) {
            const double inv = 1.0 / (double) std::max<int64_t>(1, ls.count[hk]);
            for (size_t f = 0; f < np; ++f) {
                ls.mu_re[hk * np + f] = (float) (ls.sum_re[hk * np + f] * inv);
                ls.mu_im[hk * np + f] = (float) (ls.sum_im[hk * np + f] * inv);
                ls.mag[hk * np + f] = (float) (ls.sum_mag[hk * np + f] * inv);
            }
        }
        ls.w_re.resize(np * ls.n_head_kv);
        ls.w_im.resize(np * ls.n_head_kv);
        ls.b.resize(np * ls.n_head_kv);
        for (int32_t hk = 0; hk < ls.n_head_kv; ++hk) {
            triatt_weights(&ls.rope, &ls.mu_re[hk * np], &ls.mu_im[hk * np], &ls.mag[hk * np], k_max_log2,
                           &ls.w_re[hk * np], &ls.w_im[hk * np], &ls.b[hk * np]);
        }
        ++n_ok;
    }
    if (n_ok == 0) {
        return false;
    }
    if (n_ok < (int32_t) layers.size()) {  // e.g. a graph that names its queries differently (see layer_of)
        LLAMA_LOG_WARN("triatt: queries captured for %d of %d full-attention layers; the others stay out of the score\n",
                       n_ok, (int32_t) layers.size());
    }
    calibrated = true;
    LLAMA_LOG_INFO("triatt: calibrated on %lld tokens over %d full-attention layers; query capture removed\n",
                   (long long) tokens_seen, n_ok);
    return true;
}

// ---- eviction ----------------------------------------------------------------------------------------------------

void llama_triatt::after_ubatch() {
    calib_drain();  // the ubatch's query sums, before calibration reads them
    bool just_calibrated = false;
    if (!calibrated && tokens_seen >= cfg.warmup) {
        just_calibrated = finish_calibration();  // after the whole ubatch: every layer saw the same tokens
    }
    if (cfg.budget == 0) {
        return;
    }
    newest = cur != nullptr ? written_cells(*cur) : decltype(newest){};
    forget_written();
    if (calibrated && triatt_policy_scored(cfg.hybrid)) {
        // the previous ubatch's keys were copied behind it: folded now, while the device computes this ubatch; this
        // ubatch's keys are copied behind it and folded after the next ubatch is launched
        const int64_t t0 = ggml_time_us();
        fold_pending();
        if (cur != nullptr) {
            for (const auto & [seq, cells] : newest) {
                if (cells.empty()) {
                    continue;
                }
                pending.emplace_back();
                if (!just_calibrated) {
                    gather(seq, cells, 1, pending.back());
                    continue;
                }
                // the keys cached before the score existed: copied behind this ubatch as well, so that the first
                // round finds them folded instead of reading them while the device waits
                const llama_kv_cells & kc = kv->get_cells(seq);
                std::vector<uint32_t> all;
                for (uint32_t c = 0; c < kc.size(); ++c) {
                    if (!kc.is_empty(c)) {
                        all.push_back(c);
                    }
                }
                gather(seq, std::move(all), 1, pending.back());
            }
            for (auto & [be, ev] : events) {  // one mark per backend, after all of this ubatch's copies
                const bool used = std::any_of(pending.begin(), pending.end(), [be = be](const gathered & g) {
                    return std::find(g.backends.begin(), g.backends.end(), be) != g.backends.end();
                });
                if (used && ev != nullptr) {
                    ggml_backend_event_record(ev, be);
                }
            }
        }
        t_ms += (ggml_time_us() - t0) / 1000.0;
    }
    late_rounds(true);  // the previous ubatch's keys are folded: its rounds, while the device computes this ubatch
    for (uint32_t s = 0; s < n_seq_max; ++s) {
        const llama_kv_cells & cells = kv->get_cells((llama_seq_id) s);
        if (cells.seq_pos_get((llama_seq_id) s).size() > (size_t) cfg.budget + (size_t) cfg.divide) {
            evict_seq((int32_t) s);
        }
    }
}

void llama_triatt::forget_keys() {
    for (auto & fk : folded) {
        fk = folded_keys();  // the records' memory too (records() sizes them again)
    }
    for (const auto & g : pending) {
        await(g, true);  // set 1's slabs may still be written to
    }
    pending.clear();
    newest.clear();
    late.clear();  // decided on keys that are gone
}

std::vector<std::pair<llama_seq_id, std::vector<uint32_t>>> llama_triatt::written_cells(const llama_ubatch & ubatch) const {
    std::vector<std::pair<llama_seq_id, std::vector<uint32_t>>> w;
    for (uint32_t i = 0; i < ubatch.n_tokens; ++i) {
        for (int32_t j = 0; j < ubatch.n_seq_id[i]; ++j) {
            const llama_seq_id s = ubatch.seq_id[i][j];
            const uint32_t stream = kv->get_stream(s);
            if (w.size() <= stream) {
                w.resize(stream + 1, {-1, {}});
            }
            w[stream].first = s;
            const auto & sp = kv->get_cells(s).seq_pos_get(s);
            for (auto it = sp.lower_bound({ubatch.pos[i], 0}); it != sp.end() && it->first == ubatch.pos[i]; ++it) {
                w[stream].second.push_back(it->second);
            }
        }
    }
    for (auto & [s, cells] : w) {
        std::sort(cells.begin(), cells.end());
        cells.erase(std::unique(cells.begin(), cells.end()), cells.end());
    }
    return w;
}

void llama_triatt::forget_written() {
    // a ubatch may write a cell at a position its old record also had (a sequence cut back and decoded again); the
    // previous ubatch's keys copied from such a cell are stale as well
    const auto & w = newest;
    for (uint32_t stream = 0; stream < w.size(); ++stream) {
        for (uint32_t c : w[stream].second) {
            if (stream < folded.size() && c < folded[stream].pos.size()) {
                folded[stream].pos[c] = INT32_MIN;
            }
        }
    }
    for (auto & g : pending) {
        const auto & ws = g.stream < w.size() ? w[g.stream].second : std::vector<uint32_t>{};
        for (size_t j = 0; j < g.cells.size(); ++j) {
            if (std::binary_search(ws.begin(), ws.end(), g.cells[j])) {
                g.pos[j] = INT32_MIN;
            }
        }
    }
}

ggml_backend_t llama_triatt::copy_backend(ggml_backend_buffer_t buf) const {
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(ggml_backend_buffer_get_type(buf));
    const int n = sched != nullptr && dev != nullptr ? ggml_backend_sched_get_n_backends(sched) : 0;
    for (int i = 0; i < n; ++i) {
        ggml_backend_t be = ggml_backend_sched_get_backend(sched, i);
        if (ggml_backend_get_device(be) == dev) {
            return be;
        }
    }
    return nullptr;
}

uint8_t * llama_triatt::slab(size_t i, size_t bytes, ggml_backend_buffer_type_t dev_buft) {
    if (slabs.size() <= i) {
        slabs.resize(i + 1);
    }
    host_slab & h = slabs[i];
    if (h.data == nullptr || h.size < bytes) {
        // the device's pinned host memory where it has one: a device-to-host copy into pageable memory is staged and
        // several times slower
        ggml_backend_dev_t dev = ggml_backend_buft_get_device(dev_buft);
        ggml_backend_buffer_type_t pinned = dev != nullptr ? ggml_backend_dev_host_buffer_type(dev) : nullptr;
        h.buf.reset(pinned != nullptr ? ggml_backend_buft_alloc_buffer(pinned, bytes + bytes / 4) : nullptr);
        if (h.buf) {
            h.data = (uint8_t *) ggml_backend_buffer_get_base(h.buf.get());
            h.size = ggml_backend_buffer_get_size(h.buf.get());
        } else {
            h.mem.resize(bytes + bytes / 4);
            h.data = h.mem.data();
            h.size = h.mem.size();
        }
    }
    return h.data;
}

llama_triatt::folded_keys & llama_triatt::records(uint32_t stream, const llama_kv_cells & kc) {
    if (folded.size() <= stream) {
        folded.resize(stream + 1);
    }
    folded_keys & fk = folded[stream];
    if (fk.pos.size() != kc.size()) {
        fk = folded_keys();
        fk.pos.assign(kc.size(), INT32_MIN);
        fk.slot.assign(kc.size(), folded_keys::NO_SLOT);
    }
    return fk;
}

void llama_triatt::give_slot(folded_keys & fk, uint32_t cell) {
    fk.pos[cell] = INT32_MIN;
    if (fk.slot[cell] != folded_keys::NO_SLOT) {
        fk.free.push_back(fk.slot[cell]);
        fk.slot[cell] = folded_keys::NO_SLOT;
    }
}

void llama_triatt::take_slots(folded_keys & fk, const llama_kv_cells & kc, const std::vector<uint32_t> & cells) {
    size_t need = 0;
    for (uint32_t c : cells) {
        need += fk.slot[c] == folded_keys::NO_SLOT ? 1 : 0;
    }
    const size_t n_slots = fk.rec.size() / rec_floats;
    if (need > fk.free.size() && n_slots + need - fk.free.size() > fk.sweep_at) {
        // the records of cells emptied or rewritten since they were folded (seq_rm, a new ubatch) are stale
        for (uint32_t c = 0; c < (uint32_t) fk.slot.size(); ++c) {
            if (fk.slot[c] != folded_keys::NO_SLOT && (kc.is_empty(c) || kc.pos_get(c) != fk.pos[c])) {
                give_slot(fk, c);
            }
        }
        need = 0;
        for (uint32_t c : cells) {
            need += fk.slot[c] == folded_keys::NO_SLOT ? 1 : 0;
        }
        fk.sweep_at = std::max<size_t>(256, 2 * (n_slots - fk.free.size() + need));
    }
    for (uint32_t c : cells) {
        if (fk.slot[c] != folded_keys::NO_SLOT) {
            continue;
        }
        if (fk.free.empty()) {
            fk.free.push_back((uint32_t) (fk.rec.size() / rec_floats));
            fk.rec.resize(fk.rec.size() + rec_floats);
        }
        fk.slot[c] = fk.free.back();
        fk.free.pop_back();
    }
}

void llama_triatt::gather(llama_seq_id seq, std::vector<uint32_t> cells, size_t set, gathered & g) {
    const llama_kv_cells & kc = kv->get_cells(seq);
    g.seq = seq;
    g.stream = kv->get_stream(seq);
    g.cells = std::move(cells);
    std::sort(g.cells.begin(), g.cells.end());
    g.pos.resize(g.cells.size());
    for (size_t j = 0; j < g.cells.size(); ++j) {
        g.pos[j] = kc.pos_get(g.cells[j]);
    }
    g.lr.clear();
    g.backends.clear();
    if (g.cells.empty()) {
        return;
    }
    if (gather_on_device(g, set)) {
        return;
    }
    // K rows: in place when the cache is in host memory; from a device, only the ranges that hold these cells
    size_t max_row = 1;
    for (const auto & ls : layers) {
        max_row = std::max(max_row, kv->get_k_storage(ls.il)->nb[1]);
    }
    const auto runs = cell_ranges(g.cells, (uint32_t) std::max<size_t>(1, (64u << 10) / max_row), 16);  // ~64 KiB a copy
    g.slab_row.resize(g.cells.size());
    {
        size_t r = 0, row0 = 0;
        for (size_t j = 0; j < g.cells.size(); ++j) {
            while (g.cells[j] >= runs[r].second) {
                row0 += runs[r].second - runs[r].first;
                ++r;
            }
            g.slab_row[j] = row0 + (g.cells[j] - runs[r].first);
        }
    }
    bool synced = false;
    for (size_t li = 0; li < layers.size(); ++li) {
        const layer_stats & ls = layers[li];
        if (ls.w_re.empty()) {
            continue;  // no queries captured for this layer
        }
        ggml_tensor * k = kv->get_k_storage(ls.il);
        gathered::layer_rows L{&ls, k->type, k->ne[0], k->nb[1], nullptr, set * layers.size() + li};
        if (k->buffer != nullptr && ggml_backend_buffer_is_host(k->buffer)) {
            L.host = (const uint8_t *) k->data + g.stream * k->nb[2];
        } else {
            // the copies go on the stream of the backend that computes with this cache, behind the ubatch that wrote
            // the keys; without such a backend, the scheduler is synchronized first
            ggml_backend_t be = copy_backend(k->buffer);
            if (be == nullptr && !synced && sched != nullptr) {
                const int64_t t0 = ggml_time_us();
                ggml_backend_sched_synchronize(sched);
                wait_ms += (ggml_time_us() - t0) / 1000.0;
                synced = true;
            }
            size_t rows = 0;
            for (const auto & [lo, hi] : runs) {
                rows += hi - lo;
            }
            uint8_t * buf = slab(L.slab, rows * L.row_bytes, ggml_backend_buffer_get_type(k->buffer));
            size_t off = 0;
            for (const auto & [lo, hi] : runs) {
                const size_t src = g.stream * k->nb[2] + L.row_bytes * lo, bytes = L.row_bytes * (hi - lo);
                if (be != nullptr) {
                    ggml_backend_tensor_get_async(be, k, buf + off, src, bytes);
                } else {
                    ggml_backend_tensor_get(k, buf + off, src, bytes);
                }
                off += bytes;
            }
            if (be != nullptr) {
                copies_on(g, be, set);
            }
        }
        g.lr.push_back(L);
    }
}

void llama_triatt::copies_on(gathered & g, ggml_backend_t be, size_t set) {
    if (std::find(g.backends.begin(), g.backends.end(), be) != g.backends.end()) {
        return;
    }
    g.backends.push_back(be);
    if (set == 1 && std::none_of(events.begin(), events.end(), [be](const auto & e) { return e.first == be; })) {
        events.emplace_back(be, ggml_backend_event_new(ggml_backend_get_device(be)));  // nullptr: none
    }
}

bool llama_triatt::gather_on_device(gathered & g, size_t set) {
    // a ubatch's cells lie scattered over the cache once rounds have evicted (new cells fill the holes): copied as
    // ranges, a 512-token ubatch of an 8B-shaped model moved ~250 MB of f16 rows to the host for 33 MB of keys
    // (scripts/gpu/run_cuda.sh evict8b). One small graph gathers the rows first; a decode step's few cells stay ranges
    if (device_gather_disabled || g.cells.size() < 32) {
        return false;
    }
    ggml_backend_t be = nullptr;
    for (const auto & ls : layers) {
        if (ls.w_re.empty()) {
            continue;
        }
        const ggml_tensor * k = kv->get_k_storage(ls.il);
        if (k->buffer == nullptr || ggml_backend_buffer_is_host(k->buffer) || k->nb[1] % 4 != 0) {
            return false;
        }
        ggml_backend_t b = copy_backend(k->buffer);
        if (b == nullptr || (be != nullptr && b != be)) {
            return false;  // no backend to order the gather behind the ubatch, or layers on several devices
        }
        be = b;
    }
    if (be == nullptr) {
        return false;
    }
    auto it = std::find_if(gallocs.begin(), gallocs.end(), [be](const auto & e) { return e.first == be; });
    if (it == gallocs.end()) {
        gallocs.emplace_back(be, ggml_gallocr_new(ggml_backend_get_default_buffer_type(be)));
        it = gallocs.end() - 1;
    }
    const size_t m = g.cells.size(), n_nodes = layers.size() + 1;
    ggml_init_params ip = {ggml_tensor_overhead() * (2 * layers.size() + 2) + ggml_graph_overhead_custom(n_nodes, false),
                           nullptr, true};
    ggml_context_ptr ctx(ggml_init(ip));
    ggml_cgraph * gf = ggml_new_graph_custom(ctx.get(), n_nodes, false);
    ggml_tensor * idx = ggml_new_tensor_1d(ctx.get(), GGML_TYPE_I32, (int64_t) m);
    ggml_set_input(idx);
    std::vector<ggml_tensor *> out(layers.size(), nullptr);
    for (size_t li = 0; li < layers.size(); ++li) {
        if (layers[li].w_re.empty()) {
            continue;
        }
        ggml_tensor * k = kv->get_k_storage(layers[li].il);
        // the stream's rows as 32-bit words over the cache's own memory (get_rows copies I32 rows as they are)
        ggml_tensor * words = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_I32, (int64_t) (k->nb[1] / 4), k->ne[1]);
        if (ggml_backend_tensor_alloc(k->buffer, words, (char *) k->data + g.stream * k->nb[2]) != GGML_STATUS_SUCCESS) {
            return false;
        }
        out[li] = ggml_get_rows(ctx.get(), words, idx);
        if (!ggml_backend_supports_op(be, out[li])) {
            return false;  // a backend without an I32 get_rows: ranges
        }
        ggml_set_output(out[li]);
        ggml_build_forward_expand(gf, out[li]);
    }
    if (!ggml_gallocr_alloc_graph(it->second, gf)) {
        return false;
    }
    // all on the stream of the backend that computes with this cache, behind the ubatch that wrote the keys; the
    // indices are read from g.cells, which lives until the copies are folded
    ggml_backend_tensor_set_async(be, idx, g.cells.data(), 0, m * sizeof(int32_t));
    if (ggml_backend_graph_compute_async(be, gf) != GGML_STATUS_SUCCESS) {
        return false;
    }
    g.slab_row.resize(m);
    for (size_t j = 0; j < m; ++j) {
        g.slab_row[j] = j;
    }
    for (size_t li = 0; li < layers.size(); ++li) {
        if (out[li] == nullptr) {
            continue;
        }
        const layer_stats & ls = layers[li];
        const ggml_tensor * k = kv->get_k_storage(ls.il);
        gathered::layer_rows L{&ls, k->type, k->ne[0], k->nb[1], nullptr, set * layers.size() + li};
        uint8_t * buf = slab(L.slab, m * L.row_bytes, ggml_backend_buffer_get_type(k->buffer));
        ggml_backend_tensor_get_async(be, out[li], buf, 0, m * L.row_bytes);
        g.lr.push_back(L);
    }
    copies_on(g, be, set);
    if (!device_gather_said) {
        LLAMA_LOG_INFO("triatt: keys gathered on %s before their copy to the host (%zu cells)\n", ggml_backend_name(be), m);
        device_gather_said = true;
    }
    return true;
}

void llama_triatt::await(const gathered & g, bool by_event) {
    const int64_t t0 = ggml_time_us();
    for (ggml_backend_t be : g.backends) {
        const auto it = std::find_if(events.begin(), events.end(), [be](const auto & e) { return e.first == be; });
        if (by_event && it != events.end() && it->second != nullptr) {
            ggml_backend_event_synchronize(it->second);  // not the ubatches queued after the copies
        } else {
            ggml_backend_synchronize(be);
        }
    }
    wait_ms += (ggml_time_us() - t0) / 1000.0;
}

void llama_triatt::fold(const gathered & g, const llama_kv_cells & kc) {
    folded_keys & fk = records(g.stream, kc);
    // the cells to fold: still holding the position they had when gathered, not folded since
    std::vector<size_t> todo;
    for (size_t j = 0; j < g.cells.size(); ++j) {
        if (g.pos[j] != INT32_MIN && !kc.is_empty(g.cells[j]) && kc.pos_get(g.cells[j]) == g.pos[j] &&
            fk.pos[g.cells[j]] != g.pos[j]) {
            todo.push_back(j);
        }
    }
    if (todo.empty()) {
        return;
    }
    std::vector<uint32_t> todo_cells(todo.size());
    for (size_t t = 0; t < todo.size(); ++t) {
        todo_cells[t] = g.cells[todo[t]];
    }
    take_slots(fk, kc, todo_cells);  // before the threads: the records may move
    folded_total += (int64_t) todo.size();
    const int64_t rot_block = kv->get_attn_rot_k_block();  // upstream's K rotation in use (0 = none)
    // cells todo[r0, r1) on one thread: decode, undo upstream's rotation and the key transforms, fold every layer's
    // KV heads into the cell's record (per pair, in model order whatever the split; c summed in double). In chunks of
    // 16 cells, all layers before the next chunk, so a chunk's records (~4 KB a cell at 8 layers) and keys stay cached.
    auto fold_range = [&](size_t r0, size_t r1) {
        std::vector<float> cacc, keys;  // per chunk, reused across the thread's chunks
        std::vector<int32_t> seqs;      // each cell's first sequence: whose key mean its key was centered on
        std::vector<int32_t> poss;      // each cell's position (a K bias kept out of the keys comes back there)
        for (size_t t0 = r0; t0 < r1; t0 += 16) {
            const size_t t1 = std::min(r1, t0 + 16);
            const size_t m = t1 - t0;
            cacc.assign(m * c_pairs, 0.0f);
            seqs.assign(m, -1);
            poss.resize(m);
            for (size_t t = t0; t < t1; ++t) {
                std::fill_n(record(fk, g.cells[todo[t]]), rec_floats, 0.0f);
                poss[t - t0] = g.pos[todo[t]];
                for (uint32_t s = 0; s < n_seq_max && seqs[t - t0] < 0; ++s) {
                    seqs[t - t0] = kc.seq_has(g.cells[todo[t]], (llama_seq_id) s) ? (int32_t) s : -1;
                }
            }
            for (const auto & L : g.lr) {
                keys.resize(m * L.n_embd);
                const auto * traits = ggml_get_type_traits(L.type);
                for (size_t t = t0; t < t1; ++t) {
                    const size_t j = todo[t];
                    const uint8_t * src = L.host ? L.host + L.row_bytes * g.cells[j]
                                                 : slabs[L.slab].data + L.row_bytes * g.slab_row[j];
                    float * dst = keys.data() + (t - t0) * L.n_embd;
                    if (L.type == GGML_TYPE_F32) {
                        std::memcpy(dst, src, L.n_embd * sizeof(float));
                    } else if (L.type == GGML_TYPE_F16) {
                        triatt_f16_to_f32(reinterpret_cast<const uint16_t *>(src), dst, (size_t) L.n_embd);  // F16C
                    } else {
                        traits->to_float(src, dst, L.n_embd);
                    }
                    if (rot_block > 0) {
                        unrotate_hadamard(dst, L.n_embd, rot_block);
                    }
                }
                // scores are computed on the true keys
                kv->get_tq_keys().true_keys(L.ls->il, seqs.data(), poss.data(), keys.data(), (int64_t) m);
                const size_t np = (size_t) L.ls->head_dim / 2;
                for (size_t c = 0; c < m; ++c) {
                    float * z = record(fk, g.cells[todo[t0 + c]]) + L.ls->z_off;
                    for (int32_t hk = 0; hk < L.ls->n_head_kv; ++hk) {
                        triatt_fold_key(&L.ls->rope, &L.ls->w_re[hk * np], &L.ls->w_im[hk * np], &L.ls->b[hk * np],
                                        keys.data() + c * L.n_embd + (size_t) hk * L.ls->head_dim, z, z + np,
                                        cacc.data() + c * c_pairs + L.ls->z_off / 2);
                    }
                }
            }
            for (size_t t = t0; t < t1; ++t) {
                double cs = 0.0;
                for (size_t f = 0; f < c_pairs; ++f) {
                    cs += cacc[(t - t0) * c_pairs + f];
                }
                const uint32_t cell = g.cells[todo[t]];
                record(fk, cell)[rec_floats - 1] = (float) cs;
                fk.pos[cell] = g.pos[todo[t]];
            }
        }
    };
    const size_t n = todo.size();
    // >= 64 cells a thread for f16/f32 keys, >= 32 for quantized ones (~3x the decode), and at most half the context's
    // threads: measured on a 16-core GPU host, 16 fold threads were slower than 8 (they share the cores with ggml's
    // own threads; lab/archive/cuda.tar.xz (cuda/evict/fold_mu_host))
    const bool quantized =
        std::any_of(g.lr.begin(), g.lr.end(), [](const auto & L) { return ggml_is_quantized(L.type); });
    const size_t max_thr = std::max<size_t>(1, (size_t) n_threads / 2);
    const size_t n_thr = std::max<size_t>(1, std::min<size_t>(max_thr, n / (quantized ? 32 : 64)));
    std::vector<std::thread> pool;
    for (size_t t = 1; t < n_thr; ++t) {
        pool.emplace_back(fold_range, n * t / n_thr, n * (t + 1) / n_thr);
    }
    fold_range(0, n / n_thr);
    for (auto & th : pool) {
        th.join();
    }
}

void llama_triatt::fold_pending() {
    for (const auto & g : pending) {
        await(g, true);
        fold(g, kv->get_cells(g.seq));
    }
    pending.clear();
}

void llama_triatt::evict_seq(int32_t seq) {
    if (!calibrated && !finish_calibration()) {
        static bool warned = false;
        if (!warned) {
            LLAMA_LOG_WARN("triatt: no queries captured yet, eviction postponed\n");
            warned = true;
        }
        return;
    }
    const llama_kv_cells & cells = kv->get_cells(seq);
    std::vector<uint32_t> idx;
    std::vector<int32_t> pos;
    for (const auto & [p, i] : cells.seq_pos_get(seq)) {
        pos.push_back(p);
        idx.push_back(i);
    }
    const int32_t n = (int32_t) pos.size();
    // The cells of the newest ubatch (their keys are folded after the next one): when all of them are inside the
    // window, which keeps them anyway, they are not scored in this round, so it does not wait for the device. After a
    // ubatch longer than the window the round is late: decided after the next ubatch is launched, when these keys are
    // folded, on the cells as they are now (every policy alike, so that they compare at the same budget), where the
    // stream has room for that ubatch; else it reads the keys now (waiting for the device). Either way every cell
    // competes in the round after the ubatch that wrote it.
    std::vector<uint8_t> fresh((size_t) n, 0);
    const uint32_t stream = kv->get_stream(seq);
    bool long_ubatch = false;
    if (stream < newest.size()) {
        const auto & nw = newest[stream].second;
        for (int32_t c = 0; c < n; ++c) {
            fresh[c] = std::binary_search(nw.begin(), nw.end(), idx[c]);
            long_ubatch = long_ubatch || (fresh[c] && (int64_t) pos[c] <= (int64_t) pos.back() - cfg.window);
        }
    }
    if (long_ubatch && late_ok(cells)) {
        late.push_back({seq, std::move(idx), std::move(pos)});
        return;
    }
    if (long_ubatch || !triatt_policy_scored(cfg.hybrid)) {
        std::fill(fresh.begin(), fresh.end(), 0);  // every cell scored now (the baselines score none)
    }
    round(seq, idx, pos, fresh, false);
}

bool llama_triatt::late_ok(const llama_kv_cells & kc) const {
    // the next ubatch is placed before a late round removes its cells: without room for it beside them, the
    // context's slot search would fail where a round at once would not
    return !late_disabled && kc.size() - kc.get_used() >= n_ubatch;
}

void llama_triatt::before_batch(uint32_t n_tokens) {
    if (late.empty() || (int64_t) n_tokens > cfg.window) {
        return;
    }
    // the tool has read the long ubatch's outputs by now (it samples from them), so its keys' copies are done
    const int64_t t0 = ggml_time_us();
    fold_pending();
    t_ms += (ggml_time_us() - t0) / 1000.0;
    LLAMA_LOG_DEBUG("triatt: %zu late round(s) applied before a batch of %u tokens\n", late.size(), n_tokens);
    late_rounds(false);
}

void llama_triatt::late_rounds(bool after_new) {
    std::vector<late_round> todo;
    todo.swap(late);
    for (auto & r : todo) {
        const llama_kv_cells & cells = kv->get_cells(r.seq);
        const uint32_t stream = kv->get_stream(r.seq);
        static const std::vector<uint32_t> none;
        const auto & ws = after_new && stream < newest.size() ? newest[stream].second : none;
        // the round holds only on the cells it was decided on: a seq_rm or a memory clear since (a cell emptied,
        // moved, or rewritten by the ubatch just launched) drops it, and the next round decides on the cells as they are
        bool same = true;
        for (size_t j = 0; same && j < r.idx.size(); ++j) {
            const uint32_t c = r.idx[j];
            same = !cells.is_empty(c) && cells.pos_get(c) == r.pos[j] && cells.seq_has(c, r.seq) &&
                   !std::binary_search(ws.begin(), ws.end(), c);
        }
        if (!same) {
            LLAMA_LOG_DEBUG("triatt: a late round of seq %d dropped: its cells changed since it was due\n", r.seq);
            continue;
        }
        round(r.seq, r.idx, r.pos, std::vector<uint8_t>(r.idx.size(), 0), true);
    }
}

void llama_triatt::round(llama_seq_id seq, const std::vector<uint32_t> & idx, const std::vector<int32_t> & pos,
                         const std::vector<uint8_t> & fresh, bool late) {
    const int64_t t0 = ggml_time_us();
    int64_t t_gather = t0, t_await = t0, t_fold = t0, t_score = t0;
    const llama_kv_cells & cells = kv->get_cells(seq);
    const int32_t n = (int32_t) pos.size();
    const int32_t t_now = pos.back();
    std::vector<float> score((size_t) n, 0.0f);
    if (triatt_policy_scored(cfg.hybrid)) {
        const uint32_t stream = kv->get_stream(seq);
        folded_keys & fk = records(stream, cells);
        std::vector<uint32_t> stale;
        for (int32_t c = 0; c < n; ++c) {
            if (!fresh[c] && fk.pos[idx[c]] != pos[c]) {
                stale.push_back(idx[c]);
            }
        }
        if (!stale.empty()) {
            gathered g;
            gather(seq, std::move(stale), 0, g);
            t_gather = ggml_time_us();
            await(g, false);
            t_await = ggml_time_us();
            fold(g, cells);
        }
        t_fold = ggml_time_us();
        // the round: each group's phase at t_now turns every folded key's state (np complex multiply-adds a cell)
        std::vector<std::vector<double>> ph(group_rope.size());  // per group: cos, then sin
        for (size_t g = 0; g < group_rope.size(); ++g) {
            const size_t np = (size_t) group_rope[g]->head_dim / 2;
            ph[g].resize(2 * np);
            triatt_phase(&group_rope[g]->rope, (double) t_now, ph[g].data(), ph[g].data() + np);
        }
        for (int32_t c = 0; c < n; ++c) {
            if (fresh[c]) {
                score[c] = -INFINITY;  // kept this round whatever it scores
                continue;
            }
            const float * r = record(fk, idx[c]);
            double sc = r[rec_floats - 1];
            for (size_t g = 0; g < group_rope.size(); ++g) {
                const int32_t np = group_rope[g]->head_dim / 2;
                const float * z = r + group_rope[g]->z_off;
                sc = triatt_score_folded(np, ph[g].data(), ph[g].data() + np, z, z + np, sc);
            }
            score[c] = (float) sc;
        }
    }
    t_score = ggml_time_us();
    std::vector<uint8_t> keep((size_t) n);
    const int32_t kept = triatt_select(&cfg, n, pos.data(), score.data(), keep.data());
    const int64_t t_select = ggml_time_us();
    if (kept < 0) {
        LLAMA_LOG_ERROR("triatt: selection failed (out of memory)\n");
        return;
    }
    // one pass over the evicted cells (a seq_rm per run of positions scanned the whole stream each time); a
    // sliding-window hybrid keeps its window cache: only the full-attention cache loses the cells
    std::vector<uint32_t> gone;
    for (int32_t c = 0; c < n; ++c) {
        if (!keep[c]) {
            gone.push_back(idx[c]);
        }
    }
    kv->seq_rm_cells(seq, gone);
    if (kv->get_stream(seq) < folded.size()) {
        folded_keys & fk = folded[kv->get_stream(seq)];
        for (uint32_t c : gone) {
            if (c < fk.slot.size()) {
                give_slot(fk, c);
            }
        }
    }
    const int32_t n_ev = (int32_t) gone.size();
    ++rounds;
    evicted += n_ev;
    const double ms = (ggml_time_us() - t0) / 1000.0;
    t_ms += ms;
    const int64_t n_folded = folded_total - folded_at_round;
    folded_at_round = folded_total;
    LLAMA_LOG_INFO("triatt: evict: evicted %d/%d cells round=%d seq=%d kept=%d budget=%d policy=%s pos=%d t_ms=%.1f "
                   "folded=%lld wait_ms=%.1f%s\n", n_ev, n, rounds, seq, n - n_ev, cfg.budget,
                   triatt_policy_name(cfg.hybrid), t_now, ms, (long long) n_folded, wait_ms, late ? " late=1" : "");
    wait_ms = 0.0;
    uint64_t kept_hash = 1469598103934665603ull;  // FNV-1a of the kept positions: a round at once and late compare
    for (int32_t c = 0; c < n; ++c) {
        if (keep[c]) {
            kept_hash = (kept_hash ^ (uint32_t) pos[c]) * 1099511628211ull;
        }
    }
    LLAMA_LOG_DEBUG("triatt: round %d ms: gather %.2f await %.2f fold %.2f score %.2f select %.2f seq_rm %.2f kept=%016llx\n",
                    rounds, (t_gather - t0) / 1e3, (t_await - t_gather) / 1e3, (t_fold - t_await) / 1e3,
                    (t_score - t_fold) / 1e3, (t_select - t_score) / 1e3,
                    (ggml_time_us() - t_select) / 1e3, (unsigned long long) kept_hash);
}

// ---- the C API (include/llama-tq.h) -----------------------------------------------------------------------------------

// Field by field, by name (triatt_params.h): the public struct has the retired slots, the engine's config does not.
#define LLAMA_TRIATT_SKIP(field)

llama_triatt_params llama_triatt_default_params(void) {
    triatt_config c;
    triatt_config_default(&c);  // the one definition of the defaults (triatt_params.h)
    llama_triatt_params p = {};
#define LLAMA_TRIATT_COPY(field, def, flag, hint, help) p.field = c.field;
    TRIATT_PARAMS(LLAMA_TRIATT_COPY, LLAMA_TRIATT_SKIP)
#undef LLAMA_TRIATT_COPY
    return p;
}

int32_t llama_triatt_configure(llama_context * ctx, const llama_triatt_params * params, char * err, size_t err_size) {
    const llama_triatt_params p = params != nullptr ? *params : llama_triatt_default_params();
    triatt_config cfg;
#define LLAMA_TRIATT_COPY(field, def, flag, hint, help) cfg.field = p.field;
    TRIATT_PARAMS(LLAMA_TRIATT_COPY, LLAMA_TRIATT_SKIP)
#undef LLAMA_TRIATT_COPY
    std::string msg;
    std::unique_ptr<llama_triatt> t;
    char check[256];
    if (triatt_config_check(&cfg, check, sizeof check) != 0) {
        msg = check;
    } else if (cfg.budget > 0) {
        t = llama_triatt::create(ctx->get_model(), ctx->get_cparams(), ctx->get_memory(), ctx->n_seq_max(), cfg, msg);
    }
    if (!msg.empty()) {
        LLAMA_LOG_ERROR("%s: %s\n", __func__, msg.c_str());
        if (err != nullptr && err_size > 0) {
            snprintf(err, err_size, "%s", msg.c_str());
        }
        return -1;
    }
    if (t) {
        LLAMA_LOG_INFO("triatt: %s eviction on: budget %d, prefix %d, window %d, segments %d, divide %d, warmup %d, "
                       "pool %d\n", triatt_policy_name(cfg.hybrid), cfg.budget, cfg.prefix, cfg.window, cfg.segments,
                       cfg.divide, cfg.warmup, cfg.pool);
        const uint32_t n_ctx_seq = ctx->get_cparams().n_ctx_seq;
        // the host memory of the folded keys: a record per cell that holds a key, the cells a sequence holds at most
        // before a round (budget + divide + a ubatch), twice that between sweeps; 8 B a cell of the cache beside
        const uint64_t held = std::min<uint64_t>(n_ctx_seq, (uint64_t) cfg.budget + cfg.divide + ctx->get_cparams().n_ubatch);
        LLAMA_LOG_INFO("triatt: folded keys on the host: %zu B a cell that holds a key, at most %u x %llu cells: "
                       "%.1f MiB (up to twice that between sweeps) + %.1f MiB of cell index\n", t->record_bytes(),
                       ctx->n_seq_max(), (unsigned long long) held,
                       (double) (t->record_bytes() * held * ctx->n_seq_max()) / (1 << 20),
                       8.0 * ctx->get_cparams().n_ctx / (1 << 20));
        if ((uint64_t) cfg.budget + (uint64_t) cfg.divide >= n_ctx_seq) {
            // a round starts above budget + divide cells of a sequence, which a sequence of this context never holds
            LLAMA_LOG_WARN("triatt: a sequence holds at most %u cells, never more than budget + divide = %lld: "
                           "nothing will be evicted (lower --triatt-budget or raise the context)\n", n_ctx_seq,
                           (long long) cfg.budget + cfg.divide);
        }
        if (triatt_policy_scored(cfg.hybrid) && cfg.pool > 0 && !triatt_pool_active(&cfg, triatt_free_slots(&cfg))) {
            // say so: a user who set --triatt-pool would otherwise not know that this budget ranks by own scores
            LLAMA_LOG_INFO("triatt: pooling off at this budget: its %lld free slots hold fewer than %d spans of %d "
                           "cells (--triatt-pool-spans 0 pools always)\n", (long long) triatt_free_slots(&cfg),
                           cfg.pool_spans, 2 * cfg.pool + 1);
        }
    }
    ctx->set_triatt(std::move(t));  // budget 0: eviction off
    return 0;
}

int32_t llama_triatt_n_rounds(const llama_context * ctx) {
    return ctx->get_triatt() ? ctx->get_triatt()->n_rounds() : 0;
}

int64_t llama_triatt_n_evicted(const llama_context * ctx) {
    return ctx->get_triatt() ? ctx->get_triatt()->n_evicted() : 0;
}

int64_t llama_triatt_n_folded(const llama_context * ctx) {
    return ctx->get_triatt() ? ctx->get_triatt()->n_folded() : 0;
}
