// llama-tq: exact key transforms for TQ keys (issue 13): key-mean centering and channel equalization.
//
// What is stored for a key k of layer l, KV head h (post-RoPE, before upstream's Hadamard rotation):
//     k' = (k - mu) * s          and every query uses   q' = q / s
// so q'.k' = q.k - q.mu: the same shift for every key a query sees, which softmax ignores. mu moves the
// quantizer's input towards zero (a large common key offset then costs nothing); s moves the quantization error
// to channels where queries do not look (QServe's SmoothAttention idea). Both are exact in exact arithmetic.
//
// Where they come from (bench/results/key_transforms.md measures the options):
//   s  from the weights: s^4 = g_q^2 / g_k^2 with g the attn_q_norm / attn_k_norm gains (models with per-head
//      QK-norm: Gemma 3, Qwen3, ...), averaged over each RoPE pair so that it commutes with RoPE (a K-shift
//      rotates stored keys), geometric mean 1, clipped to [1/16, 16]. Deterministic: nothing to store.
//      Models without per-head QK-norm get s = 1 (centering only).
//   mu per sequence, from that sequence's first ubatch (its own tokens in it), shrunk towards 0 as sum / (n + 16) so
//      that a short first ubatch cannot make keys larger, on the RoPE pairs that turn by at most 1 rad over the
//      context this cache serves (n_ctx, not the trained context: a post-RoPE mean of faster pairs would not stay
//      aligned with later keys); fixed until the sequence has no cells again. Per sequence, so that no output depends
//      on another sequence's tokens (issue 43: a mean shared by the cache made one request's answer depend on the
//      requests before it). seq_cp gives an empty destination the source's mean; the saved state carries it. A first
//      ubatch of one token (decoding from scratch) sets mu = 0 instead (its mean would be 1/17 of one key): so the
//      first step's graph is the later steps' graph, and a CUDA graph is not re-captured after every cache clear.
//      A cell shared by several sequences was centered on the mean of the first sequence of the token that wrote it.
// Where centering is not exact, it is off: attention sinks (a logit that does not move with q.mu) and logit
// soft-capping (tanh is not shift-invariant). Equalization stays exact there.
//
// Key basis (--tq-keys matrix): instead of the diagonal s, a full matrix A per (layer, KV head) stores A (k - mu)
// and uses A^-T q (exact for any invertible A). A minimizes the logit error of TQ's isotropic quantization error
// (A^T A = Sk^-1 # Sq, the matrix geometric mean) for key and query second moments estimated from the weights
// (W diag(g_attn_norm^2) W^T per head, RMS-normalized and scaled by the QK-norm gains where the model has them) and
// averaged over the RoPE rotations of the cache's positions: deterministic from the model and n_ctx (the state
// stores n_ctx). Costs two small mat-muls per layer; layers whose weights cannot be read back keep the diagonal s.
// Off-diagonal moments are halved (bench/results/key_basis/).
//
// K bias (issue 44: Qwen2 / Qwen2.5 add a bias b to K before RoPE): after RoPE it is R(pos) b, a vector that turns
// with the position and can be many times a key's norm, so TQ's error (proportional to what it stores) grew with it
// and centering removed only its slow pairs. b is a weight, so its part is known exactly at every position: the
// stored key is RoPE(k - b) (the model's own RoPE node applied to the projection without its bias: no rounding), and
// attention gets q . R(p) b back exactly for each cell p, in one of two ways chosen per graph by size:
//   - few query rows (decode): q . R(p) b = qb . T(p), with qb = B^T q per KV head (B: b's 2x2 block per RoPE pair)
//     and T(p) = RoPE of a (1, 0) pair pattern at the cell's position (cos, sin per pair; the same RoPE op as the
//     keys, once per graph); the [n_kv, rows, heads] products join the mask, per head (scaled by kq_scale);
//   - many rows (prefill): K' = K + RoPE(b) at each cell's position, in f16 (the f16 cache's own precision), read
//     by attention instead of K (the per-head mask would be rows x heads x cells).
// Layers whose graph does not add b right before RoPE keep it in the keys (as before). Off with soft-capping (the
// mask is added after tanh), with upstream's K rotation on, and with LLAMA_TQ_KEY_BIAS_DISABLE=1 (for comparison).
// Policy: on for tq3/tq4 K by default; llama_tq_params.keys (--tq-keys auto|0|mean|eq|1|matrix) overrides it.
#pragma once

#include "ggml-backend.h"
#include "ggml.h"
#include "llama-tq-params.h" // TQ3A's calibration
#include "llama-tq-state.h" // the state-file checks, beside the keys' own state

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

struct llama_model;
struct llama_hparams;
class llm_graph_result;
class llama_kv_cells;
struct llama_ubatch;
class llama_io_write_i;
class llama_io_read_i;

class llama_tq_keys {
public:
    // Before the cache creates its layers: decides what is on for this model and K type.
    void configure(const llama_hparams & hp, ggml_type type_k, bool allowed);
    // For each layer the cache creates (buft: where that layer's K lives).
    void add_layer(ggml_backend_buffer_type_t buft, int32_t il, int64_t n_embd_k_gqa);
    // After the layers: allocates mu/s on their devices and uploads s; n_pos: the positions this cache can hold
    // (its size; 0: not known yet, the trained context until set_center_span says otherwise); n_seq: the sequences
    // it holds (one mean each).
    // cells: the cache's cells per stream (the K bias's positions)
    void allocate(const llama_model & model, uint32_t n_pos, uint32_t n_seq, const std::vector<llama_kv_cells> & cells);
    // Which channels the next mu centers: the RoPE pairs that turn by at most 1 rad over n_pos positions. An SWA
    // cache holds fewer cells than the positions it sees: its owner passes the full context.
    void set_center_span(const llama_model & model, uint32_t n_pos);

    bool enabled() const { return center || equalize; }
    // Equalized keys take upstream's Hadamard rotation on K off by default (llama-tq-attn-rot.h: measured, and it
    // saves two mat-muls per layer).
    bool equalizes() const { return equalize; }
    bool uses_matrix() const { return matrix; }

    // The cache became empty: every sequence's next ubatch sets a new mu (zero until then).
    void reset();
    // After cells were removed (seq_rm, seq_keep): a sequence left without cells takes a new mu. cells: per stream.
    void forget_empty(const std::vector<llama_kv_cells> & cells);
    // Before seq_cp: an empty destination takes the source's mu (the copied cells were centered on it).
    void seq_cp(int32_t src, int32_t dst, const std::vector<llama_kv_cells> & cells);

    // Graph: q' = q / s, k' = (k - mu[seq]) * s for layer il (before upstream's rotation), each token with its
    // sequence's mu. center = false where a shift of the logits is not exact (sinks, soft-capping). The graph input
    // (one per graph) gives each token its sequence and, in a graph that sets means, which sequences start.
    // kq_mask (nullable: no K-bias removal): the attention mask [n_kv, rows, 1, streams], replaced by one per head
    // where the K bias comes back through it; k_rot: upstream's K rotation input (bias removal is off with it).
    void apply(ggml_context * ctx, ggml_cgraph * gf, llm_graph_result * res, const llama_ubatch & ubatch,
               ggml_tensor *& q, ggml_tensor *& k, int32_t il, bool center, ggml_tensor ** kq_mask = nullptr,
               float kq_scale = 1.0f, const ggml_tensor * k_rot = nullptr) const;
    // The cache's K view [D, H_kv, n_kv, streams] as attention reads it: with the K bias added back (f16) where
    // apply chose that way for layer il, else k.
    ggml_tensor * attn_keys(ggml_context * ctx, llm_graph_result * res, ggml_tensor * k, int32_t il) const;
    bool removes_key_bias() const { return kbias; }
    // K-shift graph: shift_input first (each cell's sequence, for its mu), then per layer stored keys back to true
    // keys (x / s + mu) and forward again; cur is [n, H, cells of every stream].
    void shift_input(ggml_context * ctx, llm_graph_result * res, const std::vector<llama_kv_cells> & cells) const;
    ggml_tensor * to_true(ggml_context * ctx, ggml_tensor * cur, int32_t il) const;
    ggml_tensor * from_true(ggml_context * ctx, ggml_tensor * cur, int32_t il) const;

    // Host: rows of stored keys (n_embd_k_gqa floats each, upstream's rotation already undone) back to true keys,
    // row r with sequence seq[r]'s mean (its cell's first sequence) and, where a K bias was kept out, R(pos[r]) b
    // (TriAttention scores true keys; the host RoPE follows the graph's frequencies, without YaRN's ramp).
    void true_keys(int32_t il, const int32_t * seq, const int32_t * pos, float * rows, int64_t n_rows) const;

    // State: after a stream's cells; seq -1: every sequence's mu, else that sequence's (restored into seq). cells:
    // per stream (a restore in another key basis is refused where other sequences hold keys).
    void state_write(llama_io_write_i & io, int32_t seq) const;
    bool state_read(llama_io_read_i & io, int32_t seq, const std::vector<llama_kv_cells> & cells);

    // for the graph input: which of the ubatch's sequences take their mu from it (not set yet, >= 2 tokens in it)
    bool starts_mean(const llama_ubatch & ubatch) const;
    void fill_inputs(const llama_ubatch & ubatch, ggml_tensor * tok_seq, ggml_tensor * w, ggml_tensor * keep) const;

private:
    struct layer {
        int32_t il;
        int64_t n;                         // n_embd_k_gqa
        ggml_backend_buffer_type_t buft;
        ggml_tensor * t = nullptr;         // F32 [n, N_ROWS]: the rows of row_id
        ggml_tensor * mu = nullptr;        // F32 [n, n_seq]: each sequence's mean
        std::vector<float> s;              // host copy of s
        ggml_tensor * m = nullptr;         // key basis: F32 [D, D, n_head_kv, 3]: A, A^-T, A^-1 (row-major), or null
        ggml_tensor * perm = nullptr;      // TQ3A: I32 [D, n_head_kv], A's order (stored channel j <- perm[j]), or null
        mutable std::vector<float> a_inv;  // host copy of A^-1 per KV head (true_keys)
        const ggml_tensor * kb = nullptr;  // the model's K bias (or fused QKV bias) when it is removed, else null
        int64_t kb_off = 0;                // K's first element in it
        ggml_tensor * mb = nullptr;        // F32 [D, D, n_head_kv]: q -> qb, qb . T(p) = q . R(p) b
        std::vector<float> b;              // host copy of the K bias (true_keys)
        mutable bool b_out = false;        // a graph kept b out of this layer's keys (true_keys adds it back)
    };
    enum mat_id { MAT_A, MAT_INV_T, MAT_INV };
    ggml_tensor * mat(ggml_context * ctx, const layer & L, mat_id m) const;
    // x [D, H, T] -> per head matrix m times x (the head's KV matrix: query head h reads KV head h / (H / n_head_kv))
    ggml_tensor * mat_mul_heads(ggml_context * ctx, const layer & L, mat_id m, ggml_tensor * x) const;
    // m3 [D, D, n_head_kv] times x [D, H, T] per head, as [D, T, H]
    ggml_tensor * heads_times(ggml_context * ctx, ggml_tensor * m3, ggml_tensor * x) const;
    void compute_basis(const llama_model & model, uint32_t n_pos, bool only_if_unset = false) const;
    void ensure_basis() const;
    enum row_id { ROW_S, ROW_INV_S, ROW_CENTER_MASK, ROW_PAIR, N_ROWS };  // the rows of layer::t (ROW_PAIR: 1 at
                                                                          // each RoPE pair's first channel)
    const layer * find(int32_t il) const;  // nullptr where layer il has no transforms
    ggml_tensor * row(ggml_context * ctx, const layer & L, row_id r) const;
    // mu per token of cur [D, H, T]: one row broadcast with one sequence, else the rows of seq_of_token [T]
    ggml_tensor * mu_rows(ggml_context * ctx, ggml_tensor * table, const layer & L, ggml_tensor * seq_of_token) const;
    void set_seq_mu(int32_t seq, const std::vector<std::vector<float>> * rows) const;  // nullptr: zero
    bool seq_empty(int32_t seq, const std::vector<llama_kv_cells> & cells) const;
    std::vector<uint32_t> new_tokens(const llama_ubatch & ubatch) const;  // per sequence, while its mu is unset

    bool center = false;
    bool equalize = false;
    bool matrix = false;       // equalization by a full matrix per KV head (the key basis, or TQ3A's order)
    bool grouped = false;      // TQ3A keys: the matrix is the calibration's order of RoPE pairs times diag(s)
    std::shared_ptr<const llama_tq_key_cal> cal;  // TQ3A's calibration (llama-tq-params.h)
    // the state's flags: 1 centering, 2 equalization, 8 matrix, 16 K bias removed, 32 TQ3A order
    uint32_t flags_() const {
        return (center ? 1u : 0u) | (equalize ? 2u : 0u) | (matrix ? 8u : 0u) | (kbias ? 16u : 0u) |
               (grouped ? 32u : 0u);
    }
    bool kbias = false;        // a K bias is removed from the stored keys (some layer has one)
    bool rope_neox = false;
    const std::vector<llama_kv_cells> * cells_ = nullptr;
    mutable uint32_t basis_span = 0;  // the positions the basis was averaged over (0: not computed yet)
    mutable std::mutex basis_mutex;
    const llama_model * model_ = nullptr;  // for a basis of another span (a restored state)
    int64_t head_dim = 0;
    int64_t n_head = 0;
    int64_t n_head_kv = 0;
    std::map<int32_t, layer> layers;
    std::vector<ggml_context *> ctxs;
    std::vector<ggml_backend_buffer_t> bufs;
    uint32_t n_seq = 1;
    mutable float rope_host[3] = {0.0f, 0.0f, 0.0f};  // the graph's K RoPE: freq_base, freq_scale, attn_factor
    mutable std::vector<uint8_t> mu_ready;  // per sequence: its mu is set (graph inputs set it, hence mutable)
    mutable ggml_tensor * shift_seq = nullptr;  // the K-shift graph's cell -> sequence input (while it is built)
    // host copies of each layer's mu table for true_keys, filled on first use: TriAttention's folds call it per chunk
    // of keys from several threads, and a device read each time is a synchronous copy (~4 ms a round on a GPU)
    mutable std::mutex mu_host_mutex;
    mutable std::map<int32_t, std::shared_ptr<const std::vector<float>>> mu_host;  // per layer: [n_seq][n]
    void drop_mu_host() const {
        std::lock_guard<std::mutex> lock(mu_host_mutex);
        mu_host.clear();
    }

public:
    llama_tq_keys() = default;
    llama_tq_keys(const llama_tq_keys &) = delete;
    llama_tq_keys & operator=(const llama_tq_keys &) = delete;
    ~llama_tq_keys();
};
