// llama-tq: see llama-tq-keys.h.
#include "llama-tq-keys.h"
#include "llama-tq-params.h"

#include "llama-graph.h"
#include "llama-impl.h"
#include "llama-io.h"
#include "llama-kv-cells.h"
#include "llama-model.h"
#include "llama-tq-linalg.h"
#include "llama-tq-types.h"
#include "tq_env.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <atomic>

namespace {

// One per graph (its layers share it): each token's sequence and, in a graph that sets means, which tokens start
// which sequence's mean. A graph that sets means is reused only for a ubatch that starts one, and the reverse.
// set_input runs right before the graph computes; it marks the ubatch's new sequences' mu as set.
// With a K bias removed: each cell's position (the mask's cells, streams in the mask's order) and what the layers
// built from it.
class llm_graph_input_tq_keys : public llm_graph_input_i {
public:
    llm_graph_input_tq_keys(const llama_tq_keys * keys, bool centers, bool sets_mu)
        : keys(keys), centers(centers), sets_mu(sets_mu) {}

    void set_input(const llama_ubatch * ubatch) override {
        if (centers) {
            keys->fill_inputs(*ubatch, tok_seq, w, keep);
        }
        if (cell_pos != nullptr) {
            fill_cell_pos(*ubatch);
        }
    }

    bool can_reuse(const llm_graph_params & params) override {
        return !centers || sets_mu == keys->starts_mean(params.ubatch);
    }

    void fill_cell_pos(const llama_ubatch & ub) const {
        const int64_t n = ggml_nelements(cell_pos);
        const int64_t n_kv = n / n_stream;
        const uint32_t tps = ub.n_tokens / (uint32_t) n_stream;
        std::vector<int32_t> pos((size_t) n, 0);  // an empty cell's position does not matter: the mask drops it
        for (int64_t s = 0; s < n_stream; ++s) {
            const int32_t seq = ub.seq_id != nullptr ? ub.seq_id[(size_t) s * tps][0] : 0;
            const llama_kv_cells & c = cells->size() == 1 ? (*cells)[0] : (*cells)[(size_t) seq];
            for (int64_t j = 0; j < n_kv && j < (int64_t) c.size(); ++j) {
                pos[(size_t) (s * n_kv + j)] = c.is_empty((uint32_t) j) ? 0 : c.pos_get((uint32_t) j);
            }
        }
        ggml_backend_tensor_set(cell_pos, pos.data(), 0, pos.size() * sizeof(int32_t));
    }

    const llama_tq_keys * keys;
    const bool centers;
    const bool sets_mu;
    ggml_tensor * tok_seq = nullptr;  // I32 [T]: each token's (first) sequence; none with one sequence
    ggml_tensor * w = nullptr;        // F32 [T, n_seq]: 1 / (n_s + 16) where token t counts for sequence s's new mean
    ggml_tensor * keep = nullptr;     // F32 [1, n_seq]: 1 where sequence s keeps its mu, 0 where it takes a new one
    // K bias
    const std::vector<llama_kv_cells> * cells = nullptr;
    int64_t n_stream = 1;
    ggml_tensor * cell_pos = nullptr;   // I32 [n_kv * streams]
    ggml_tensor * pair_rope = nullptr;  // T * kq_scale: F32 [D, n_kv, 1, streams], made by the first layer needing it
    int32_t pair_rope_params[16] = {};  // the RoPE it was made with
    float pair_rope_scale = 0.0f;       // and the scale (T times kq_scale)
    std::map<int32_t, const ggml_tensor *> add_back;  // layers whose keys attention reads with b added: their RoPE
};

// The K-shift graph's input: each cell's (first) sequence, cells of every stream in order.
class llm_graph_input_tq_shift : public llm_graph_input_i {
public:
    llm_graph_input_tq_shift(const std::vector<llama_kv_cells> & cells, uint32_t n_seq) : cells(cells), n_seq(n_seq) {}

    void set_input(const llama_ubatch * ubatch) override {
        GGML_UNUSED(ubatch);
        std::vector<int32_t> seq((size_t) ggml_nelements(cell_seq), 0);
        size_t i = 0;
        for (const auto & c : cells) {
            for (uint32_t j = 0; j < c.size(); ++j, ++i) {
                for (uint32_t s = 0; s < n_seq && !c.is_empty(j); ++s) {
                    if (c.seq_has(j, (llama_seq_id) s)) {
                        seq[i] = (int32_t) s;
                        break;
                    }
                }
            }
        }
        ggml_backend_tensor_set(cell_seq, seq.data(), 0, seq.size() * sizeof(int32_t));
    }

    const std::vector<llama_kv_cells> & cells;
    const uint32_t n_seq;
    ggml_tensor * cell_seq = nullptr;  // I32 [cells of every stream]
};

// x through the same RoPE as the node `like` (its parameters, positions pos, its frequency factors).
ggml_tensor * rope_like(ggml_context * ctx, ggml_tensor * x, ggml_tensor * pos, const ggml_tensor * like) {
    float f[6];
    std::memcpy(f, like->op_params + 5, sizeof(f));
    ggml_tensor * r = ggml_rope_ext(ctx, x, pos, like->src[2], like->op_params[1], like->op_params[2],
                                    like->op_params[4], f[0], f[1], f[2], f[3], f[4], f[5]);
    std::memcpy(r->op_params, like->op_params, sizeof(int32_t) * 16);
    return r;
}

// k = RoPE(reshape or view of (y + bias)) with bias the K bias tensor (its K part at element kb_off): the same RoPE
// of y alone; nullptr where the graph is built another way (the bias then stays in the keys).
ggml_tensor * rope_without_bias(ggml_context * ctx, ggml_tensor * k, const ggml_tensor * bias, int64_t kb_off) {
    const int32_t mode = k->op != GGML_OP_ROPE ? -1 : k->op_params[2];
    if (mode != LLAMA_ROPE_TYPE_NORM && mode != LLAMA_ROPE_TYPE_NEOX) {
        return nullptr;
    }
    ggml_tensor * x = k->src[0];
    ggml_tensor * a = x->src[0];
    if ((x->op != GGML_OP_RESHAPE && x->op != GGML_OP_VIEW) || a == nullptr || a->op != GGML_OP_ADD ||
        a->src[1] != bias || !ggml_is_contiguous(a) || !ggml_is_contiguous(a->src[0]) ||
        !ggml_are_same_shape(a, a->src[0]) || a->type != a->src[0]->type) {
        return nullptr;
    }
    ggml_tensor * y = a->src[0];
    ggml_tensor * x2 = nullptr;
    if (x->op == GGML_OP_RESHAPE && kb_off == 0) {
        x2 = ggml_reshape_3d(ctx, y, x->ne[0], x->ne[1], x->ne[2]);
    } else if (x->op == GGML_OP_VIEW && (int64_t) (x->view_offs / ggml_element_size(a)) == kb_off) {
        x2 = ggml_view_3d(ctx, y, x->ne[0], x->ne[1], x->ne[2], x->nb[1], x->nb[2], x->view_offs);
    }
    return x2 != nullptr ? rope_like(ctx, x2, k->src[1], k) : nullptr;
}

// s^4 = g_q^2 / g_k^2 per channel from the QK-norm gains, averaged over RoPE pairs, geometric mean 1, in [1/16, 16].
// Channels where either gain is ~0 carry no logit; their scale is arbitrary and only the clip bounds it.
std::vector<float> scales_from_gains(const std::vector<float> & gq, const std::vector<float> & gk, bool neox) {
    const size_t d = gq.size();
    std::vector<double> eq(d), ek(d);
    for (size_t c = 0; c < d; ++c) {
        const size_t p = neox ? (c + d / 2) % d : (c ^ 1);  // RoPE partner: NEOX (i, i + d/2), normal (2i, 2i + 1)
        eq[c] = 0.5 * ((double) gq[c] * gq[c] + (double) gq[p] * gq[p]);
        ek[c] = 0.5 * ((double) gk[c] * gk[c] + (double) gk[p] * gk[p]);
    }
    double mq = 0.0, mk = 0.0;
    for (size_t c = 0; c < d; ++c) {
        mq += eq[c] / (double) d;
        mk += ek[c] / (double) d;
    }
    const double eps = 1e-9 * std::max({mq, mk, 1e-30});
    std::vector<double> s(d);
    double log_sum = 0.0;
    for (size_t c = 0; c < d; ++c) {
        s[c] = std::clamp(std::pow((eq[c] + eps) / (ek[c] + eps), 0.25), 1.0 / 16, 16.0);
        log_sum += std::log(s[c]);
    }
    const double g = std::exp(log_sum / (double) d);
    std::vector<float> out(d);
    for (size_t c = 0; c < d; ++c) {
        out[c] = (float) (s[c] / g);
    }
    return out;
}

// 1 on the RoPE pairs of layer il that turn by at most 1 rad over n_pos positions, 0 on the others (all 1 without RoPE).
// A post-RoPE mean only stays aligned with the keys on such pairs: a static offset rotated by d rad is left as
// 2 sin(d/2) of itself, worse than not centering past pi/3.
std::vector<float> slow_pairs(const llama_model & model, int32_t il, int64_t n, int64_t head_dim, uint32_t n_pos) {
    const auto & hp = model.hparams;
    const bool neox = hp.rope_type == LLAMA_ROPE_TYPE_NEOX;
    const bool swa = hp.is_swa((uint32_t) il);
    const double base = swa ? hp.rope_freq_base_train_swa : hp.rope_freq_base_train;
    const double fscale = swa ? hp.rope_freq_scale_train_swa : hp.rope_freq_scale_train;
    std::vector<float> keep((size_t) n, 1.0f);
    for (int64_t c = 0; hp.has_rope((uint32_t) il) && c < n; ++c) {
        const int64_t d = c % head_dim;
        const int64_t pair = neox ? d % (head_dim / 2) : d / 2;
        const double theta = fscale * std::pow(base, -2.0 * (double) pair / (double) head_dim);
        keep[c] = theta * (double) n_pos <= 1.0 ? 1.0f : 0.0f;
    }
    return keep;
}

std::vector<float> tensor_floats(const ggml_tensor * t) {
    std::vector<float> v((size_t) ggml_nelements(t));
    ggml_backend_tensor_get(t, v.data(), 0, v.size() * sizeof(float));
    return v;
}

// A per-head QK-norm's gains (one F32 vector of head_dim shared by the heads), or nothing if g is not one.
std::vector<float> head_gains(const ggml_tensor * g, int64_t head_dim) {
    const bool ok = g != nullptr && g->type == GGML_TYPE_F32 && g->ne[0] == head_dim && ggml_nelements(g) == head_dim;
    return ok ? tensor_floats(g) : std::vector<float>();
}

// The dequantized rows of a weight, or nothing where its buffer cannot be read back as it was loaded (the CPU's
// repacking buffer types keep another layout and cannot be read at all).
std::vector<float> weight_floats(const ggml_tensor * w) {
    if (w == nullptr || w->buffer == nullptr || !ggml_is_contiguous(w)) {
        return {};
    }
    ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(w->buffer);
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
    const bool readable = ggml_backend_buft_is_host(buft) ||
                          (dev != nullptr && ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU);
    const auto * tt = ggml_get_type_traits(w->type);
    if (!readable || (w->type != GGML_TYPE_F32 && tt->to_float == nullptr)) {
        return {};
    }
    std::vector<uint8_t> raw(ggml_nbytes(w));
    ggml_backend_tensor_get(w, raw.data(), 0, raw.size());
    const int64_t ne0 = w->ne[0];
    const int64_t rows = ggml_nrows(w);
    std::vector<float> out((size_t) (ne0 * rows));
    for (int64_t r = 0; r < rows; ++r) {
        if (w->type == GGML_TYPE_F32) {
            std::memcpy(out.data() + r * ne0, raw.data() + r * w->nb[1], (size_t) ne0 * sizeof(float));
        } else {
            tt->to_float(raw.data() + r * w->nb[1], out.data() + r * ne0, ne0);
        }
    }
    return out;
}

namespace la = llama_tq_linalg;

// Second moment of one head's projection outputs (rows r0 .. r0 + d of w [n_embd, *]) for an input whose channels are
// uncorrelated with variances ga^2 (the normed residual stream, its gains ga); with a per-head QK-norm (gains g) the
// head's vector is RMS-normalized first and then scaled by g.
la::mat head_moment(const std::vector<float> & w, int64_t n_embd, int64_t r0, int64_t d, const std::vector<float> & ga,
                    const std::vector<float> & g) {
    std::vector<double> wg((size_t) (d * n_embd));  // the head's rows times the input's gains
    for (int64_t a = 0; a < d; ++a) {
        for (int64_t j = 0; j < n_embd; ++j) {
            wg[(size_t) (a * n_embd + j)] = (double) w[(size_t) ((r0 + a) * n_embd + j)] * (ga.empty() ? 1.0 : ga[(size_t) j]);
        }
    }
    la::mat c((size_t) (d * d), 0.0);
    for (int64_t a = 0; a < d; ++a) {
        const double * wa = &wg[(size_t) (a * n_embd)];
        for (int64_t b = a; b < d; ++b) {
            const double * wb = &wg[(size_t) (b * n_embd)];
            double s = 0.0;
            for (int64_t j = 0; j < n_embd; ++j) {
                s += wa[j] * wb[j];
            }
            c[(size_t) (a * d + b)] = c[(size_t) (b * d + a)] = s;
        }
    }
    if (!g.empty()) {
        double tr = 0.0;
        for (int64_t a = 0; a < d; ++a) {
            tr += c[(size_t) (a * d + a)];
        }
        const double norm = tr > 0.0 ? (double) d / tr : 1.0;
        for (int64_t a = 0; a < d; ++a) {
            for (int64_t b = 0; b < d; ++b) {
                c[(size_t) (a * d + b)] *= norm * g[(size_t) a] * g[(size_t) b];
            }
        }
    }
    return c;
}

// The average of R(p) S R(p)^T over positions p = 0 .. n_pos - 1 (the rotations RoPE applies to layer il): what a
// fixed basis sees of keys and queries spread over the context.
la::mat rope_average(const la::mat & s, int64_t d, const llama_model & model, int32_t il, uint32_t n_pos) {
    const auto & hp = model.hparams;
    if (!hp.has_rope((uint32_t) il)) {
        return s;
    }
    const bool neox = hp.rope_type == LLAMA_ROPE_TYPE_NEOX;
    const bool swa = hp.is_swa((uint32_t) il);
    const double base = swa ? hp.rope_freq_base_train_swa : hp.rope_freq_base_train;
    const double fscale = swa ? hp.rope_freq_scale_train_swa : hp.rope_freq_scale_train;
    std::vector<double> theta((size_t) d), sign((size_t) d);
    std::vector<int64_t> partner((size_t) d);
    for (int64_t c = 0; c < d; ++c) {
        const int64_t pair = neox ? c % (d / 2) : c / 2;
        const bool x = neox ? c < d / 2 : c % 2 == 0;  // x' = x cos - y sin, y' = y cos + x sin
        theta[(size_t) c] = fscale * std::pow(base, -2.0 * (double) pair / (double) d);
        sign[(size_t) c] = x ? -1.0 : 1.0;
        partner[(size_t) c] = neox ? (c + d / 2) % d : (c ^ 1);
    }
    const double n = (double) std::max<uint32_t>(n_pos, 1);
    auto mean_cs = [n](double w, double & mc, double & ms) {  // means of cos(w p), sin(w p) over p = 0 .. n - 1
        const double h = std::sin(0.5 * w);
        if (std::fabs(h) < 1e-12) {
            mc = 1.0;
            ms = 0.0;
            return;
        }
        const double k = std::sin(0.5 * n * w) / (n * h);
        mc = k * std::cos(0.5 * (n - 1) * w);
        ms = k * std::sin(0.5 * (n - 1) * w);
    };
    la::mat out((size_t) (d * d));
    for (int64_t a = 0; a < d; ++a) {
        for (int64_t b = 0; b < d; ++b) {
            double cm, sm, cp, sp;
            mean_cs(theta[(size_t) a] - theta[(size_t) b], cm, sm);
            mean_cs(theta[(size_t) a] + theta[(size_t) b], cp, sp);
            const double ecc = 0.5 * (cm + cp), ess = 0.5 * (cm - cp);
            const double ecs = 0.5 * (sp - sm), esc = 0.5 * (sp + sm);  // E[cos_a sin_b], E[sin_a cos_b]
            const int64_t pa = partner[(size_t) a], pb = partner[(size_t) b];
            const double ea = sign[(size_t) a], eb = sign[(size_t) b];
            out[(size_t) (a * d + b)] = ecc * s[(size_t) (a * d + b)] + eb * ecs * s[(size_t) (a * d + pb)] +
                                        ea * esc * s[(size_t) (pa * d + b)] + ea * eb * ess * s[(size_t) (pa * d + pb)];
        }
    }
    return out;
}

// Off-diagonal moments times (1 - f): the weights' estimate of how channels co-vary is rougher than of their
// variances (the real input is not isotropic), and a basis that trusts it fully loses some needles.
la::mat shrink_offdiag(la::mat s, double f) {
    const size_t d = (size_t) std::llround(std::sqrt((double) s.size()));
    for (size_t i = 0; i < d; ++i) {
        for (size_t j = 0; j < d; ++j) {
            s[i * d + j] *= i == j ? 1.0 : 1.0 - f;
        }
    }
    return s;
}

// A with A^T A = Sk^-1 # Sq (the matrix geometric mean): minimizes E|A k|^2 E|A^-T q|^2, the logit error of a
// quantizer whose error is isotropic with a variance proportional to |A k|^2 (TQ's, after its rotation). With
// Sk = L L^T and L^T Sq L = V W V^T: A = V W^(1/4) V^T L^-1. Scaled to |det A| = 1; both sides regularized so that
// A stays well conditioned in float (q'.k' = q.k up to rounding).
bool balanced_basis(la::mat sk, la::mat sq, size_t d, std::vector<float> & a_out, std::vector<float> & inv_out) {
    for (la::mat * m : {&sk, &sq}) {
        double tr = 0.0;
        for (size_t i = 0; i < d; ++i) {
            tr += (*m)[i * d + i];
        }
        for (size_t i = 0; i < d; ++i) {
            (*m)[i * d + i] += 1e-4 * tr / (double) d;
        }
    }
    la::mat l;
    if (!la::cholesky(sk, d, l)) {
        return false;
    }
    const la::mat x = la::matmul(la::matmul(la::transpose(l, d), sq, d), l, d);
    std::vector<double> w;
    la::mat v;
    la::sym_eig(x, d, w, v);
    const double wmax = *std::max_element(w.begin(), w.end());
    if (!(wmax > 0.0)) {
        return false;
    }
    double logdet = 0.0;
    la::mat vp(d * d), vm(d * d);  // V W^(1/4), V W^(-1/4)
    for (size_t j = 0; j < d; ++j) {
        const double r = std::pow(std::max(w[j], 1e-8 * wmax), 0.25);
        logdet += std::log(r) - std::log(l[j * d + j]);
        for (size_t i = 0; i < d; ++i) {
            vp[i * d + j] = v[i * d + j] * r;
            vm[i * d + j] = v[i * d + j] / r;
        }
    }
    const double g = std::exp(-logdet / (double) d);
    const la::mat vt = la::transpose(v, d);
    const la::mat a = la::matmul(la::matmul(vp, vt, d), la::lower_inverse(l, d), d);
    const la::mat inv = la::matmul(l, la::matmul(vm, vt, d), d);
    a_out.resize(d * d);
    inv_out.resize(d * d);
    for (size_t i = 0; i < d * d; ++i) {
        a_out[i] = (float) (a[i] * g);
        inv_out[i] = (float) (inv[i] / g);
    }
    return true;
}

}  // namespace

llama_tq_keys::~llama_tq_keys() {
    for (auto * b : bufs) {
        ggml_backend_buffer_free(b);
    }
    for (auto * c : ctxs) {
        ggml_free(c);
    }
}

void llama_tq_keys::configure(const llama_hparams & hp, ggml_type type_k, bool allowed) {
    const int32_t mode = llama_tq_params_for_new_cache().keys;  // --tq-keys (llama_init_from_model_tq)
    center = equalize = matrix = kbias = false;
    grouped = ggml_tq_is_tq3a(type_k);  // checked at context creation: a calibration, heads of 256, RoPE pairs
    cal = grouped ? llama_tq_key_cal_for_new_cache() : nullptr;
    const bool tq = ggml_tq_is_tq(type_k) || grouped;
    if (!allowed || !tq || hp.is_mla() || hp.n_layer() == 0) {
        return;
    }
    head_dim = hp.n_embd_head_k(0);
    for (uint32_t il = 0; il < hp.n_layer(); ++il) {
        if (!hp.has_kv(il)) {
            continue;
        }
        // one head size, RoPE over the whole head (a K-shift maps stored keys back through it)
        if (hp.n_embd_head_k(il) != head_dim || (hp.has_rope(il) && (int64_t) hp.n_rot(il) != head_dim)) {
            LLAMA_LOG_WARN("%s: key transforms off: layer %u has head %u, RoPE over %u dims\n", __func__, il,
                           hp.n_embd_head_k(il), hp.n_rot(il));
            return;
        }
    }
    center = mode != LLAMA_TQ_KEYS_EQ && mode != LLAMA_TQ_KEYS_NONE;
    equalize = mode != LLAMA_TQ_KEYS_MEAN && mode != LLAMA_TQ_KEYS_NONE &&
               (hp.rope_type == LLAMA_ROPE_TYPE_NORM || hp.rope_type == LLAMA_ROPE_TYPE_NEOX);
    matrix = equalize && (mode == LLAMA_TQ_KEYS_MATRIX || grouped);  // TQ3A: the calibrated order as the matrix
    if (center && hp.attn_soft_cap) {
        center = false;  // tanh(logit / cap) does not ignore a common shift
    }
    // a K bias comes back through the mask (added after tanh) or as f16 keys
    kbias = !hp.attn_soft_cap && (hp.rope_type == LLAMA_ROPE_TYPE_NORM || hp.rope_type == LLAMA_ROPE_TYPE_NEOX) &&
            !tq_env_flag(TQ_ENV_KEY_BIAS_DISABLE);
    rope_neox = hp.rope_type == LLAMA_ROPE_TYPE_NEOX;
    if (!center && !equalize) {
        return;
    }
    LLAMA_LOG_INFO("%s: TQ key transforms: centering %s, equalization %s (--tq-keys)\n", __func__,
                   center ? "on" : "off",
                   equalize ? (grouped ? "on (with the calibrated order)" : matrix ? "on (matrix)" : "on") : "off");
}

void llama_tq_keys::add_layer(ggml_backend_buffer_type_t buft, int32_t il, int64_t n_embd_k_gqa) {
    if (center || equalize) {
        layer & L = layers[il];
        L.il = il;
        L.n = n_embd_k_gqa;
        L.buft = buft;
    }
}

void llama_tq_keys::allocate(const llama_model & model, uint32_t n_pos, uint32_t n_seq_max,
                             const std::vector<llama_kv_cells> & cells) {
    model_ = &model;
    cells_ = &cells;
    n_seq = std::max<uint32_t>(n_seq_max, 1);
    mu_ready.assign(n_seq, 0);
    if ((center || equalize) && model.split_mode() == LLAMA_SPLIT_MODE_TENSOR) {
        // upstream's experimental tensor split shards each op over the GPUs by rules that do not cover the
        // transforms' ops (it aborts on them); the TQ types themselves run there
        LLAMA_LOG_WARN("%s: TQ key transforms off: -sm tensor cannot split them (as --tq-keys 0: prefer tq4 keys, "
                       "or -sm layer)\n", __func__);
        center = equalize = matrix = kbias = false;
        layers.clear();
        return;
    }
    // the K bias of each layer (the K part of a fused QKV bias): removed where it is not zero
    size_t n_kb = 0;
    for (auto & [il, L] : layers) {
        const llama_layer & ml = model.layers[il];
        const ggml_tensor * bt = kbias ? (ml.wk_b ? ml.wk_b : ml.wqkv != nullptr ? ml.wqkv_b : nullptr) : nullptr;
        const int64_t off = ml.wk_b ? 0 : (int64_t) model.hparams.n_head((uint32_t) il) * head_dim;
        const std::vector<float> all = bt != nullptr && bt->type == GGML_TYPE_F32 ? weight_floats(bt) : std::vector<float>();
        if ((int64_t) all.size() >= off + L.n &&
            std::any_of(all.begin() + off, all.begin() + off + L.n, [](float v) { return v != 0.0f; })) {
            L.kb = bt;
            L.kb_off = off;
            L.b.assign(all.begin() + off, all.begin() + off + L.n);
            ++n_kb;
        }
    }
    kbias = n_kb > 0;
    std::map<ggml_backend_buffer_type_t, ggml_context *> by_buft;
    for (auto & [il, L] : layers) {
        ggml_context *& ctx = by_buft[L.buft];
        if (ctx == nullptr) {
            ggml_init_params ip = {5 * layers.size() * ggml_tensor_overhead(), nullptr, true};
            ctx = ggml_init(ip);
            if (ctx == nullptr) {
                throw std::runtime_error("failed to create the ggml context of the TQ key transforms");
            }
            ctxs.push_back(ctx);
        }
        L.t = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, L.n, N_ROWS);
        ggml_format_name(L.t, "tq_keys_l%d", il);
        L.mu = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, L.n, n_seq);
        ggml_format_name(L.mu, "tq_keys_mu_l%d", il);
        if (matrix) {
            L.m = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, head_dim, head_dim, L.n / head_dim, 3);
            ggml_format_name(L.m, "tq_keys_basis_l%d", il);
        }
        if (grouped) {
            L.perm = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, head_dim, L.n / head_dim);
            ggml_format_name(L.perm, "tq_keys_order_l%d", il);
        }
        if (L.kb != nullptr) {
            L.mb = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, head_dim, head_dim, L.n / head_dim);
            ggml_format_name(L.mb, "tq_keys_bias_l%d", il);
        }
    }
    for (auto & [buft, ctx] : by_buft) {
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft);
        if (buf == nullptr) {
            throw std::runtime_error("failed to allocate the TQ key transforms");
        }
        ggml_backend_buffer_clear(buf, 0);
        bufs.push_back(buf);
    }
    const bool neox = model.hparams.rope_type == LLAMA_ROPE_TYPE_NEOX;
    int32_t n_eq = 0;
    for (auto & [il, L] : layers) {
        const llama_layer & ml = model.layers[il];
        std::vector<float> s1((size_t) head_dim, 1.0f);
        const std::vector<float> gq = equalize ? head_gains(ml.attn_q_norm, head_dim) : std::vector<float>();
        const std::vector<float> gk = equalize ? head_gains(ml.attn_k_norm, head_dim) : std::vector<float>();
        if (!gq.empty() && !gk.empty()) {
            s1 = scales_from_gains(gq, gk, neox);
            ++n_eq;
        }
        L.s.resize((size_t) L.n);
        std::vector<float> inv((size_t) L.n);
        for (int64_t c = 0; c < L.n; ++c) {
            L.s[c] = s1[(size_t) (c % head_dim)];
            inv[c] = 1.0f / L.s[c];
        }
        ggml_backend_tensor_set(L.t, L.s.data(), ROW_S * (size_t) L.n * sizeof(float), (size_t) L.n * sizeof(float));
        ggml_backend_tensor_set(L.t, inv.data(), ROW_INV_S * (size_t) L.n * sizeof(float), (size_t) L.n * sizeof(float));
        // RoPE pairs (a, c): NEOX (i, i + D/2), normal (2i, 2i + 1). T(p) = RoPE of 1 at a: (cos, sin) at (a, c).
        // qb = B^T q with rows a: (b_a, b_c), c: (-b_c, b_a) on (q_a, q_c): qb . T(p) = q . R(p) b
        std::vector<float> pair((size_t) L.n, 0.0f), mb;
        for (int64_t c = 0; c < L.n; ++c) {
            const int64_t d = c % head_dim;
            pair[(size_t) c] = (neox ? d < head_dim / 2 : d % 2 == 0) ? 1.0f : 0.0f;
        }
        ggml_backend_tensor_set(L.t, pair.data(), ROW_PAIR * (size_t) L.n * sizeof(float), (size_t) L.n * sizeof(float));
        if (L.mb != nullptr) {
            const std::vector<float> & b = L.b;
            const int64_t D = head_dim;
            mb.assign((size_t) (L.n * D), 0.0f);
            for (int64_t h = 0; h < L.n / D; ++h) {
                float * M = mb.data() + h * D * D;  // element (k, i) at i * D + k: qb_i = sum_k M(k, i) q_k
                const float * bh = b.data() + h * D;
                for (int64_t a = 0; a < D; ++a) {
                    if (pair[(size_t) a] == 0.0f) {
                        continue;
                    }
                    const int64_t c = neox ? a + D / 2 : a + 1;
                    M[a * D + a] = bh[a];
                    M[a * D + c] = bh[c];
                    M[c * D + c] = bh[a];
                    M[c * D + a] = -bh[c];
                }
            }
            ggml_backend_tensor_set(L.mb, mb.data(), 0, mb.size() * sizeof(float));
        }
    }
    if (kbias) {
        LLAMA_LOG_INFO("%s: TQ keys: the K bias of %zu layers is kept out of the stored keys and added back exactly "
                       "in attention\n", __func__, n_kb);
    }
    set_center_span(model, n_pos);
    if (equalize && n_eq == 0 && !matrix) {
        equalize = false;  // no per-head QK-norm gains: s = 1 everywhere, skip the multiplications
        LLAMA_LOG_INFO("%s: TQ key transforms: no per-head QK-norm gains, equalization off\n", __func__);
    }
}

// The centering mask: pairs that stay within 1 rad over the positions this cache can hold (not the trained context:
// a 4k context centers many more pairs of a 32k-trained model). Only the next mu reads it; a mu already set (or
// restored from a state) stays as it is, so the stored keys keep their meaning.
void llama_tq_keys::set_center_span(const llama_model & model, uint32_t n_pos) {
    const bool told = n_pos > 0;  // 0: an SWA child before its owner sets the span (not worth a log line)
    n_pos = told ? n_pos : model.hparams.n_ctx_train;
    if (matrix && !layers.empty() && told && n_pos != basis_span) {
        compute_basis(model, n_pos);
    }
    if (!center || layers.empty()) {
        return;
    }
    int64_t kept = 0, total = 0;
    for (auto & [il, L] : layers) {
        const std::vector<float> keep = slow_pairs(model, il, L.n, head_dim, n_pos);
        ggml_backend_tensor_set(L.t, keep.data(), ROW_CENTER_MASK * (size_t) L.n * sizeof(float),
                                (size_t) L.n * sizeof(float));
        for (float v : keep) {
            kept += v > 0.0f ? 1 : 0;
        }
        total += L.n;
    }
    if (!told) {
        return;
    }
    LLAMA_LOG_INFO("%s: TQ key centering over %u positions: %.1f%% of the key channels of %zu layers\n", __func__,
                   n_pos, 100.0 * (double) kept / (double) std::max<int64_t>(total, 1), layers.size());
}

const llama_tq_keys::layer * llama_tq_keys::find(int32_t il) const {
    const auto it = layers.find(il);
    return it == layers.end() ? nullptr : &it->second;
}

// Row r of layer L as [head_dim, n_head_kv, 1]: broadcasts over the tokens of a [head_dim, n_head_kv, T] tensor.
ggml_tensor * llama_tq_keys::row(ggml_context * ctx, const layer & L, row_id r) const {
    const size_t f = sizeof(float);
    return ggml_view_3d(ctx, L.t, head_dim, L.n / head_dim, 1, head_dim * f, L.n * f, r * L.n * f);
}

ggml_tensor * llama_tq_keys::mu_rows(ggml_context * ctx, ggml_tensor * table, const layer & L,
                                     ggml_tensor * seq_of_token) const {
    const int64_t hkv = L.n / head_dim;
    if (n_seq == 1 || seq_of_token == nullptr) {  // one sequence: its row, broadcast
        const size_t f = sizeof(float);
        return ggml_view_3d(ctx, table, head_dim, hkv, 1, head_dim * f, L.n * f, 0);
    }
    ggml_tensor * m = ggml_get_rows(ctx, table, seq_of_token);  // [n, T]
    return ggml_reshape_3d(ctx, m, head_dim, hkv, seq_of_token->ne[0]);
}

// The sequence a token's key is centered for: its first (tokens without one only occur in reserve graphs).
static int32_t token_seq(const llama_ubatch & ub, uint32_t t) {
    return ub.n_seq_id != nullptr && ub.n_seq_id[t] > 0 ? ub.seq_id[t][0] : 0;
}

// Per sequence: the ubatch's tokens of it while its mu is not set (a token of a reserve graph, which has no sequence,
// counts for sequence 0).
std::vector<uint32_t> llama_tq_keys::new_tokens(const llama_ubatch & ub) const {
    std::vector<uint32_t> n((size_t) n_seq, 0);
    for (uint32_t t = 0; t < ub.n_tokens; ++t) {
        const int32_t k = ub.n_seq_id != nullptr && ub.n_seq_id[t] > 0 ? ub.n_seq_id[t] : 1;
        for (int32_t j = 0; j < k; ++j) {
            const int32_t sq = j == 0 ? token_seq(ub, t) : ub.seq_id[t][j];
            n[(size_t) sq] += sq >= 0 && (uint32_t) sq < n_seq && !mu_ready[(size_t) sq] ? 1 : 0;
        }
    }
    return n;
}

bool llama_tq_keys::starts_mean(const llama_ubatch & ub) const {
    const std::vector<uint32_t> n = new_tokens(ub);
    return std::any_of(n.begin(), n.end(), [](uint32_t c) { return c >= 2; });
}

void llama_tq_keys::fill_inputs(const llama_ubatch & ub, ggml_tensor * tok_seq, ggml_tensor * w,
                                ggml_tensor * keep) const {
    const uint32_t T = ub.n_tokens;
    const std::vector<uint32_t> n = new_tokens(ub);  // tokens of each sequence that has no mu yet
    if (tok_seq != nullptr) {
        std::vector<int32_t> ts(T);
        for (uint32_t t = 0; t < T; ++t) {
            ts[t] = token_seq(ub, t);
        }
        ggml_backend_tensor_set(tok_seq, ts.data(), 0, ts.size() * sizeof(int32_t));
    }
    if (w != nullptr) {  // mean over the sequence's tokens, shrunk towards 0: sum / (n + 16); one token: mu = 0
        std::vector<float> wv((size_t) T * n_seq, 0.0f), kv((size_t) n_seq, 1.0f);
        for (uint32_t t = 0; t < T; ++t) {
            for (int32_t j = 0; j < ub.n_seq_id[t]; ++j) {
                const int32_t sq = ub.seq_id[t][j];
                if (n[(size_t) sq] >= 2) {
                    wv[(size_t) sq * T + t] = 1.0f / (float) (n[(size_t) sq] + 16);
                }
            }
        }
        for (uint32_t sq = 0; sq < n_seq; ++sq) {
            kv[sq] = n[sq] > 0 ? 0.0f : 1.0f;
        }
        ggml_backend_tensor_set(w, wv.data(), 0, wv.size() * sizeof(float));
        ggml_backend_tensor_set(keep, kv.data(), 0, kv.size() * sizeof(float));
    }
    bool changed = false;
    for (uint32_t sq = 0; sq < n_seq; ++sq) {
        changed = changed || n[sq] > 0;
        mu_ready[sq] = mu_ready[sq] || n[sq] > 0;
    }
    if (changed) {
        drop_mu_host();  // the graph about to run writes the new means
    }
}

// The graph's input (one per graph), made by the first layer that needs it.
static llm_graph_input_tq_keys * graph_input(const llama_tq_keys * keys, llm_graph_result * res) {
    for (const auto & i : res->inputs) {
        auto * c = dynamic_cast<llm_graph_input_tq_keys *>(i.get());
        if (c != nullptr && c->keys == keys) {
            return c;
        }
    }
    return nullptr;
}

void llama_tq_keys::apply(ggml_context * ctx, ggml_cgraph * gf, llm_graph_result * res, const llama_ubatch & ubatch,
                          ggml_tensor *& q, ggml_tensor *& k, int32_t il, bool center_ok, ggml_tensor ** kq_mask,
                          float kq_scale, const ggml_tensor * k_rot) const {
    const layer * lp = find(il);
    if (lp == nullptr) {
        return;
    }
    const layer & L = *lp;
    const int64_t hkv = L.n / head_dim;
    const size_t f = sizeof(float);
    ensure_basis();
    llm_graph_input_tq_keys * inp = graph_input(this, res);
    auto input = [&]() {
        if (inp == nullptr) {
            const bool centers = center && center_ok;
            auto made = std::make_unique<llm_graph_input_tq_keys>(this, centers, centers && starts_mean(ubatch));
            const int64_t T = k->ne[2];
            if (centers && n_seq > 1) {
                made->tok_seq = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, T);
                ggml_set_input(made->tok_seq);
            }
            if (made->sets_mu) {
                made->w = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, T, n_seq);
                made->keep = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 1, n_seq);
                ggml_set_input(made->w);
                ggml_set_input(made->keep);
            }
            inp = static_cast<llm_graph_input_tq_keys *>(res->add_input(std::move(made)));
        }
        return inp;
    };
    // the K bias: keys without it, and q . R(p) b back through the mask (few rows) or the keys attention reads
    ggml_tensor * unbiased = L.mb != nullptr && kq_mask != nullptr && *kq_mask != nullptr && k_rot == nullptr
                                 ? rope_without_bias(ctx, k, L.kb, L.kb_off) : nullptr;
    if (unbiased != nullptr) {
        {
            std::lock_guard<std::mutex> lock(mu_host_mutex);  // for true_keys (TriAttention's fold threads)
            std::memcpy(rope_host, k->op_params + 5, 2 * sizeof(float));
            std::memcpy(rope_host + 2, k->op_params + 8, sizeof(float));
            L.b_out = true;
        }
        ggml_tensor * mask = *kq_mask;
        auto * in = input();
        const int64_t n_kv = mask->ne[0], rows = mask->ne[1], n_str = mask->ne[3], H = q->ne[1];
        if (in->cell_pos == nullptr) {
            in->cells = cells_;
            in->n_stream = n_str;
            in->cell_pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_kv * n_str);
            ggml_set_input(in->cell_pos);
        }
        if (rows * H <= L.n) {  // the per-head products are no larger than one f32 copy of the keys
            // T(p) * kq_scale, once per graph (layers with the same RoPE and scale share it)
            const bool same = in->pair_rope != nullptr && in->pair_rope_scale == kq_scale &&
                              std::memcmp(in->pair_rope_params, k->op_params, sizeof(in->pair_rope_params)) == 0;
            ggml_tensor * tab = same ? in->pair_rope : nullptr;
            if (tab == nullptr) {
                ggml_tensor * pat = ggml_view_3d(ctx, L.t, head_dim, 1, 1, head_dim * f, head_dim * f, ROW_PAIR * L.n * f);
                tab = rope_like(ctx, ggml_repeat_4d(ctx, pat, head_dim, 1, n_kv * n_str, 1), in->cell_pos, k);
                tab = ggml_scale(ctx, ggml_reshape_4d(ctx, tab, head_dim, n_kv, 1, n_str), kq_scale);
                if (in->pair_rope == nullptr) {
                    in->pair_rope = tab;
                    in->pair_rope_scale = kq_scale;
                    std::memcpy(in->pair_rope_params, k->op_params, sizeof(in->pair_rope_params));
                }
            }
            ggml_tensor * qb = heads_times(ctx, L.mb, q);  // [D, T, H]: T = rows x streams, each stream's rows
            if (n_str > 1) {
                qb = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, qb, head_dim, rows, n_str, H), 0, 1, 3, 2));
            }
            // one product per stream: [n_kv, rows x H] (no broadcast over the heads: T is read once)
            ggml_tensor * beta = ggml_mul_mat(ctx, tab, ggml_reshape_4d(ctx, qb, head_dim, rows * H, 1, n_str));
            beta = ggml_reshape_4d(ctx, beta, n_kv, rows, H, n_str);
            *kq_mask = ggml_add(ctx, mask->type == GGML_TYPE_F32 ? beta : ggml_cast(ctx, beta, mask->type), mask);
        } else {
            in->add_back[il] = k;
        }
        k = unbiased;
    }
    if (equalize && L.m != nullptr) {
        q = mat_mul_heads(ctx, L, MAT_INV_T, q);
    } else if (equalize) {
        q = ggml_is_contiguous(q) ? q : ggml_cont(ctx, q);
        const int64_t nh = q->ne[1];
        const int64_t nt = q->ne[2];
        // query head h reads KV head h / (nh / hkv), as ggml's broadcast in attention does
        ggml_tensor * q4 = ggml_reshape_4d(ctx, q, head_dim, nh / hkv, hkv, nt);
        ggml_tensor * inv =
            ggml_view_4d(ctx, L.t, head_dim, 1, hkv, 1, head_dim * f, head_dim * f, L.n * f, ROW_INV_S * L.n * f);
        q = ggml_reshape_3d(ctx, ggml_mul(ctx, q4, inv), head_dim, nh, nt);
    }
    if (equalize) {
        // into the graph now, ahead of the K/V writes: then the FA node directly follows the writes, and on CUDA
        // it may read Q before waiting for them (tq_fa_params::q_early)
        ggml_build_forward_expand(gf, q);
    }
    if (center && center_ok) {
        k = ggml_is_contiguous(k) ? k : ggml_cont(ctx, k);
        const int64_t T = k->ne[2];
        auto * in = input();
        ggml_tensor * table = L.mu;
        if (in->sets_mu) {
            // new means of the starting sequences (one mat-mul: keys [T, n] by weights [T, n_seq]), slow pairs only,
            // the other sequences' rows kept; the SUB below reads the table through the CPY
            ggml_tensor * kt = ggml_cont(ctx, ggml_permute(ctx, k, 1, 2, 0, 3));  // [T, D, H]
            ggml_tensor * m = ggml_mul_mat(ctx, ggml_reshape_2d(ctx, kt, T, L.n), in->w);  // [n, n_seq]
            ggml_tensor * mask = ggml_view_2d(ctx, L.t, L.n, 1, L.n * f, ROW_CENTER_MASK * L.n * f);
            m = ggml_add(ctx, ggml_mul(ctx, m, mask), ggml_mul(ctx, L.mu, in->keep));
            table = ggml_cpy(ctx, m, L.mu);
        }
        ggml_tensor * mu = mu_rows(ctx, table, L, in->tok_seq);
        if (in->tok_seq != nullptr) {
            // the gather into the graph ahead of K's RoPE: then a one-token ubatch's RoPE, SUB [MUL] and K write
            // stay adjacent, and CUDA still runs them as one launch (ggml-tq-cuda.cu, tq_key_transform_at)
            ggml_build_forward_expand(gf, mu);
        }
        k = ggml_sub(ctx, k, mu);
    }
    if (equalize && L.perm != nullptr && k->ne[2] == 1 && k->ne[3] == 1) {
        // TQ3A, one token (a decode step): A = P diag(s) as what it is, a MUL and a gather of channels (the same
        // floats as the mat-mul's: one product and exact zeros), which CUDA folds into the K write with the RoPE and
        // the SUB (ggml-tq-cuda.cu): decode is launch-bound there
        const int64_t hkv = k->ne[1];
        k = ggml_mul(ctx, k, row(ctx, L, ROW_S));
        k = ggml_get_rows(ctx, ggml_reshape_4d(ctx, k, 1, head_dim, hkv, 1), L.perm);
        k = ggml_reshape_3d(ctx, k, head_dim, hkv, 1);
    } else if (equalize) {
        k = L.m != nullptr ? mat_mul_heads(ctx, L, MAT_A, k) : ggml_mul(ctx, k, row(ctx, L, ROW_S));
    }
}

ggml_tensor * llama_tq_keys::attn_keys(ggml_context * ctx, llm_graph_result * res, ggml_tensor * k, int32_t il) const {
    const llm_graph_input_tq_keys * in = kbias ? graph_input(this, res) : nullptr;
    const auto it = in != nullptr ? in->add_back.find(il) : decltype(in->add_back)::const_iterator();
    if (in == nullptr || it == in->add_back.end()) {
        return k;
    }
    const layer & L = *find(il);
    const size_t f = sizeof(float);
    const int64_t hkv = k->ne[1], n = k->ne[2] * k->ne[3];
    // R(p) b at each cell, in the stored keys' basis (the centering's shift needs nothing: softmax ignores it); the sum
    // in f32 (the CPU dequantizes TQ rows to f32 only), read by attention as f16
    ggml_tensor * b = ggml_view_3d(ctx, const_cast<ggml_tensor *>(L.kb), head_dim, hkv, 1, head_dim * f, L.n * f, L.kb_off * f);
    ggml_tensor * rb = rope_like(ctx, ggml_repeat_4d(ctx, b, head_dim, hkv, n, 1), in->cell_pos, it->second);
    if (equalize) {
        rb = L.m != nullptr ? mat_mul_heads(ctx, L, MAT_A, rb) : ggml_mul(ctx, rb, row(ctx, L, ROW_S));
    }
    ggml_tensor * kf = ggml_cast(ctx, k, GGML_TYPE_F32);
    kf = ggml_add(ctx, kf, ggml_reshape_4d(ctx, rb, k->ne[0], k->ne[1], k->ne[2], k->ne[3]));
    return ggml_cast(ctx, kf, GGML_TYPE_F16);
}

ggml_tensor * llama_tq_keys::mat(ggml_context * ctx, const layer & L, mat_id m) const {
    const int64_t hkv = L.n / head_dim;
    return ggml_view_3d(ctx, L.m, head_dim, head_dim, hkv, L.m->nb[1], L.m->nb[2], (size_t) m * L.m->nb[3]);
}

ggml_tensor * llama_tq_keys::heads_times(ggml_context * ctx, ggml_tensor * m3, ggml_tensor * x) const {
    // [D, H, T] -> [D, T, H]: ggml_mul_mat broadcasts the n_head_kv matrices over the heads in groups of H / n_head_kv,
    // as attention maps query heads to KV heads. One token (a decode step): the same bytes, so a reshape, not a copy
    // (each copy is a launch a layer, and decode on a GPU is launch-bound)
    const bool one = x->ne[2] == 1 && x->ne[3] == 1 && ggml_is_contiguous(x);
    ggml_tensor * xt = one ? ggml_reshape_3d(ctx, x, x->ne[0], 1, x->ne[1]) : ggml_cont(ctx, ggml_permute(ctx, x, 0, 2, 1, 3));
    return ggml_mul_mat(ctx, m3, xt);  // row i of the matrix dotted with each vector
}

ggml_tensor * llama_tq_keys::mat_mul_heads(ggml_context * ctx, const layer & L, mat_id m, ggml_tensor * x) const {
    ggml_tensor * y = heads_times(ctx, mat(ctx, L, m), x);  // [D, T, H], back to [D, H, T]
    return y->ne[1] == 1 ? ggml_reshape_3d(ctx, y, y->ne[0], y->ne[2], 1) : ggml_cont(ctx, ggml_permute(ctx, y, 0, 2, 1, 3));
}

// TQ3A: A = P diag(s) per KV head, P the calibration's order of RoPE pairs (falling energy, ties by pair index) cut into
// the block's groups (16, 16, 32, 64 pairs), each group's first channels then its second ones. Exact: a permutation.
static void tq3a_basis(const llama_tq_key_cal & cal, int32_t il, int64_t h, const float * s, int64_t d, bool neox,
                       float * a, float * inv_t, float * inv, int32_t * order_out) {
    const float * x = cal.energies((uint32_t) il, (uint32_t) h);
    const int64_t np = d / 2;
    std::vector<int64_t> order((size_t) np);
    std::vector<double> px((size_t) np);
    for (int64_t i = 0; i < np; ++i) {
        order[(size_t) i] = i;
        px[(size_t) i] = neox ? (double) x[i] + (double) x[i + np] : (double) x[2 * i] + (double) x[2 * i + 1];
    }
    std::stable_sort(order.begin(), order.end(), [&](int64_t l, int64_t r) { return px[(size_t) l] > px[(size_t) r]; });
    std::vector<int64_t> perm;  // value j of the block <- channel perm[j]
    int64_t at = 0;
    for (int g = 0; g < TQ3A_GROUPS_N; ++g) {
        const int64_t p = TQ3A_GROUP_VALUES[g] / 2;
        for (int half = 0; half < 2; ++half) {
            for (int64_t i = at; i < at + p; ++i) {
                const int64_t pair = order[(size_t) i];
                perm.push_back(neox ? pair + half * np : 2 * pair + half);
            }
        }
        at += p;
    }
    std::fill(a, a + d * d, 0.0f);
    std::fill(inv_t, inv_t + d * d, 0.0f);
    std::fill(inv, inv + d * d, 0.0f);
    for (int64_t j = 0; j < d; ++j) {  // row-major: stored k'_j = s_c (k - mu)_c, q'_j = q_c / s_c, c = perm[j]
        const int64_t c = perm[(size_t) j];
        order_out[j] = (int32_t) c;
        a[j * d + c] = s[c];
        inv_t[j * d + c] = 1.0f / s[c];
        inv[c * d + j] = 1.0f / s[c];
    }
}

void llama_tq_keys::compute_basis(const llama_model & model, uint32_t n_pos, bool only_if_unset) const {
    std::lock_guard<std::mutex> lock(basis_mutex);
    if (only_if_unset && basis_span != 0) {
        return;  // another thread computed it
    }
    basis_span = n_pos;
    if (grouped) {  // the order does not depend on the span
        const size_t dd = (size_t) (head_dim * head_dim);
        for (const auto & [il, L] : layers) {
            const int64_t hkv = L.n / head_dim;
            std::vector<float> all(3 * (size_t) hkv * dd);
            std::vector<int32_t> order((size_t) L.n);
            for (int64_t h = 0; h < hkv; ++h) {
                tq3a_basis(*cal, il, h, L.s.data() + h * head_dim, head_dim, rope_neox,
                           &all[(size_t) (MAT_A * hkv + h) * dd], &all[(size_t) (MAT_INV_T * hkv + h) * dd],
                           &all[(size_t) (MAT_INV * hkv + h) * dd], &order[(size_t) (h * head_dim)]);
            }
            ggml_backend_tensor_set(L.m, all.data(), 0, all.size() * sizeof(float));
            ggml_backend_tensor_set(L.perm, order.data(), 0, order.size() * sizeof(int32_t));
            L.a_inv.assign(all.begin() + (std::ptrdiff_t) (MAT_INV * hkv * (int64_t) dd), all.end());
        }
        LLAMA_LOG_INFO("%s: TQ3A keys: each KV head's RoPE pairs ordered by the energies of %s\n", __func__,
                       cal->path.c_str());
        return;
    }
    const auto & hp = model.hparams;
    const size_t d = (size_t) head_dim;
    const int64_t n_embd = hp.n_embd;
    struct result {
        std::vector<float> all;  // A, A^-T, A^-1 of every KV head, as L.m holds them
        bool from_weights = false;
    };
    std::vector<const layer *> todo;
    for (const auto & [il, L] : layers) {
        if (L.m != nullptr) {
            todo.push_back(&L);
        }
    }
    std::vector<result> out(todo.size());
    const double shrink = 0.5;  // off-diagonal moments halved: the weights' estimate of how channels co-vary is rough
    auto one = [&](size_t t) {  // host reads and math only: several layers at once
        const layer & L = *todo[t];
        const int32_t il = L.il;
        const llama_layer & ml = model.layers[il];
        const int64_t hkv = L.n / head_dim;
        const int64_t nh = hp.n_head((uint32_t) il);
        const std::vector<float> gq = head_gains(ml.attn_q_norm, head_dim), gk = head_gains(ml.attn_k_norm, head_dim);
        std::vector<float> ga;
        if (ml.attn_norm != nullptr && ml.attn_norm->type == GGML_TYPE_F32 && ggml_nelements(ml.attn_norm) == n_embd) {
            ga = tensor_floats(ml.attn_norm);
        }
        const bool shapes = ml.wq != nullptr && ml.wk != nullptr && ml.wq->ne[0] == n_embd && ml.wk->ne[0] == n_embd &&
                            ml.wq->ne[1] == nh * head_dim && ml.wk->ne[1] == L.n && nh % hkv == 0 &&
                            gq.empty() == gk.empty();
        const std::vector<float> wq = shapes ? weight_floats(ml.wq) : std::vector<float>();
        const std::vector<float> wk = shapes && !wq.empty() ? weight_floats(ml.wk) : std::vector<float>();
        result & r = out[t];
        r.all.assign(3 * (size_t) hkv * d * d, 0.0f);
        r.from_weights = !wk.empty();
        for (int64_t h = 0; h < hkv; ++h) {
            std::vector<float> a, inv;
            bool ok = false;
            if (r.from_weights) {
                const int64_t group = nh / hkv;
                la::mat sq(d * d, 0.0);
                for (int64_t j = 0; j < group; ++j) {
                    const la::mat c = head_moment(wq, n_embd, (h * group + j) * head_dim, head_dim, ga, gq);
                    for (size_t i = 0; i < d * d; ++i) {
                        sq[i] += c[i];
                    }
                }
                const la::mat sk = head_moment(wk, n_embd, h * head_dim, head_dim, ga, gk);
                ok = balanced_basis(shrink_offdiag(rope_average(sk, head_dim, model, il, n_pos), shrink),
                                    shrink_offdiag(rope_average(sq, head_dim, model, il, n_pos), shrink), d, a, inv);
            }
            if (!ok) {  // the diagonal scales (1 without QK-norm gains) as a matrix
                r.from_weights = false;
                a.assign(d * d, 0.0f);
                inv.assign(d * d, 0.0f);
                for (size_t i = 0; i < d; ++i) {
                    a[i * d + i] = L.s[(size_t) h * d + i];
                    inv[i * d + i] = 1.0f / a[i * d + i];
                }
            }
            float * dst_a = &r.all[(size_t) ((MAT_A * hkv + h) * (int64_t) (d * d))];
            float * dst_t = &r.all[(size_t) ((MAT_INV_T * hkv + h) * (int64_t) (d * d))];
            float * dst_i = &r.all[(size_t) ((MAT_INV * hkv + h) * (int64_t) (d * d))];
            for (size_t i = 0; i < d; ++i) {
                for (size_t j = 0; j < d; ++j) {
                    dst_a[i * d + j] = a[i * d + j];
                    dst_t[i * d + j] = inv[j * d + i];
                    dst_i[i * d + j] = inv[i * d + j];
                }
            }
        }
    };
    const size_t n_threads = std::min<size_t>(todo.size(), std::max(1u, std::thread::hardware_concurrency()));
    std::vector<std::thread> workers;
    std::atomic<size_t> next{0};
    for (size_t w = 0; w < n_threads; ++w) {
        workers.emplace_back([&] {
            for (size_t t = next++; t < todo.size(); t = next++) {
                one(t);
            }
        });
    }
    for (auto & w : workers) {
        w.join();
    }
    int32_t n_from_weights = 0;
    for (size_t t = 0; t < todo.size(); ++t) {
        ggml_backend_tensor_set(todo[t]->m, out[t].all.data(), 0, out[t].all.size() * sizeof(float));
        const auto inv = out[t].all.begin() + (std::ptrdiff_t) (MAT_INV * out[t].all.size() / 3);  // its A^-1 block
        todo[t]->a_inv.assign(inv, out[t].all.end());
        n_from_weights += out[t].from_weights ? 1 : 0;
    }
    LLAMA_LOG_INFO("%s: TQ key basis over %u positions: %d of %zu layers from the weights (the others: diagonal scales)\n",
                   __func__, n_pos, n_from_weights, todo.size());
}

// The basis of an SWA cache waits for its owner's span (set_center_span); one nobody tells takes the trained context.
void llama_tq_keys::ensure_basis() const {
    if (matrix && model_ != nullptr && basis_span == 0) {
        compute_basis(*model_, model_->hparams.n_ctx_train, true);
    }
}

void llama_tq_keys::reset() {
    for (uint32_t sq = 0; sq < n_seq && !layers.empty(); ++sq) {
        set_seq_mu((int32_t) sq, nullptr);
    }
}

// Sequence seq's mu in every layer: rows (one per layer, ascending il) or zero; set (rows) or not yet (zero).
void llama_tq_keys::set_seq_mu(int32_t seq, const std::vector<std::vector<float>> * rows) const {
    size_t i = 0;
    for (const auto & [il, L] : layers) {
        if (L.mu == nullptr) {
            continue;
        }
        const size_t off = (size_t) seq * (size_t) L.n * sizeof(float), len = (size_t) L.n * sizeof(float);
        if (rows != nullptr) {
            ggml_backend_tensor_set(L.mu, (*rows)[i++].data(), off, len);
        } else {
            ggml_backend_tensor_memset(L.mu, 0, off, len);
        }
    }
    mu_ready[(size_t) seq] = rows != nullptr;
    drop_mu_host();
}

bool llama_tq_keys::seq_empty(int32_t seq, const std::vector<llama_kv_cells> & cells) const {
    return std::all_of(cells.begin(), cells.end(), [seq](const llama_kv_cells & c) { return c.seq_pos_min(seq) < 0; });
}

void llama_tq_keys::forget_empty(const std::vector<llama_kv_cells> & cells) {
    for (uint32_t sq = 0; sq < n_seq && center; ++sq) {
        if (mu_ready[sq] && seq_empty((int32_t) sq, cells)) {
            set_seq_mu((int32_t) sq, nullptr);  // zero until the sequence's next ubatch of two or more tokens
        }
    }
}

void llama_tq_keys::seq_cp(int32_t src, int32_t dst, const std::vector<llama_kv_cells> & cells) {
    if (!center || src == dst || src < 0 || dst < 0 || (uint32_t) src >= n_seq || (uint32_t) dst >= n_seq) {
        return;
    }
    std::vector<std::vector<float>> rows;
    for (const auto & [il, L] : layers) {
        rows.emplace_back((size_t) L.n);
        ggml_backend_tensor_get(L.mu, rows.back().data(), (size_t) src * L.n * sizeof(float), L.n * sizeof(float));
    }
    if (seq_empty(dst, cells)) {
        set_seq_mu(dst, mu_ready[(size_t) src] ? &rows : nullptr);
        return;
    }
    size_t i = 0;
    for (const auto & [il, L] : layers) {  // both hold keys: the copied cells keep the source's centering
        std::vector<float> d((size_t) L.n);
        ggml_backend_tensor_get(L.mu, d.data(), (size_t) dst * L.n * sizeof(float), L.n * sizeof(float));
        if (std::memcmp(d.data(), rows[i++].data(), d.size() * sizeof(float)) != 0) {
            LLAMA_LOG_WARN("%s: sequence %d holds keys centered on another key mean than sequence %d's: attention "
                           "over the copied cells is not exact (copy into an empty sequence)\n", __func__, dst, src);
            break;
        }
    }
}

void llama_tq_keys::shift_input(ggml_context * ctx, llm_graph_result * res, const std::vector<llama_kv_cells> & cells) const {
    shift_seq = nullptr;
    if (!center || n_seq == 1 || layers.empty()) {
        return;  // one sequence: every cell has its mu
    }
    int64_t n_cells = 0;
    for (const auto & c : cells) {
        n_cells += c.size();
    }
    auto inp = std::make_unique<llm_graph_input_tq_shift>(cells, n_seq);
    inp->cell_seq = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_cells);
    ggml_set_input(inp->cell_seq);
    shift_seq = inp->cell_seq;
    res->add_input(std::move(inp));
}

ggml_tensor * llama_tq_keys::to_true(ggml_context * ctx, ggml_tensor * cur, int32_t il) const {
    ensure_basis();
    const layer * L = find(il);
    if (L != nullptr && equalize) {
        cur = L->m != nullptr ? mat_mul_heads(ctx, *L, MAT_INV, cur) : ggml_mul(ctx, cur, row(ctx, *L, ROW_INV_S));
    }
    return L != nullptr && center ? ggml_add(ctx, cur, mu_rows(ctx, L->mu, *L, shift_seq)) : cur;
}

ggml_tensor * llama_tq_keys::from_true(ggml_context * ctx, ggml_tensor * cur, int32_t il) const {
    ensure_basis();
    const layer * L = find(il);
    if (L != nullptr && center) {
        cur = ggml_sub(ctx, cur, mu_rows(ctx, L->mu, *L, shift_seq));
    }
    if (L != nullptr && equalize) {
        cur = L->m != nullptr ? mat_mul_heads(ctx, *L, MAT_A, cur) : ggml_mul(ctx, cur, row(ctx, *L, ROW_S));
    }
    return cur;
}

void llama_tq_keys::true_keys(int32_t il, const int32_t * seq, const int32_t * pos, float * rows, int64_t n_rows) const {
    ensure_basis();
    const layer * lp = find(il);
    if (lp == nullptr) {
        return;
    }
    const layer & L = *lp;
    const std::vector<float> zero((size_t) L.n, 0.0f);
    std::shared_ptr<const std::vector<float>> table;  // this layer's means, all sequences (kept alive if dropped)
    if (center) {
        std::lock_guard<std::mutex> lock(mu_host_mutex);
        auto & t = mu_host[il];
        if (t == nullptr) {
            auto v = std::make_shared<std::vector<float>>((size_t) L.n * n_seq);
            ggml_backend_tensor_get(L.mu, v->data(), 0, v->size() * sizeof(float));
            t = std::move(v);
        }
        table = t;
    }
    std::vector<float> y((size_t) head_dim);
    for (int64_t r = 0; r < n_rows; ++r) {
        float * x = rows + r * L.n;
        const bool known = table != nullptr && seq[r] >= 0 && (uint32_t) seq[r] < n_seq;
        const float * mu = known ? table->data() + (size_t) seq[r] * L.n : zero.data();
        if (L.m != nullptr && equalize) {
            for (int64_t h = 0; h < L.n / head_dim; ++h) {  // x_h = A_h^-1 x_h
                const float * inv = &L.a_inv[(size_t) (h * head_dim * head_dim)];
                float * xh = x + h * head_dim;
                for (int64_t i = 0; i < head_dim; ++i) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < head_dim; ++j) {
                        acc += (double) inv[i * head_dim + j] * xh[j];
                    }
                    y[(size_t) i] = (float) acc;
                }
                std::memcpy(xh, y.data(), (size_t) head_dim * sizeof(float));
            }
            for (int64_t c = 0; c < L.n; ++c) {
                x[c] += mu[c];
            }
            continue;
        }
        for (int64_t c = 0; c < L.n; ++c) {
            x[c] = x[c] / L.s[c] + mu[c];
        }
    }
    float rope[3];
    bool b_out = false;  // only where a graph kept b out (not where the graph's shape or K rotation kept it in)
    {
        std::lock_guard<std::mutex> lock(mu_host_mutex);
        std::memcpy(rope, rope_host, sizeof(rope));
        b_out = L.b_out;
    }
    if (!b_out || L.b.empty() || pos == nullptr || rope[0] <= 0.0f) {
        return;
    }
    const int64_t D = head_dim, np = D / 2;
    for (int64_t r = 0; r < n_rows; ++r) {  // + R(p) b: pair i turns by p * freq_scale * base^(-2i/D)
        float * x = rows + r * L.n;
        for (int64_t i = 0; i < np; ++i) {
            const double th = (double) pos[r] * rope[1] * std::pow((double) rope[0], -2.0 * (double) i / (double) D);
            const float cs = (float) std::cos(th) * rope[2], sn = (float) std::sin(th) * rope[2];
            const int64_t a = rope_neox ? i : 2 * i, c = rope_neox ? i + np : 2 * i + 1;
            for (int64_t h = 0; h < L.n / D; ++h) {
                const float ba = L.b[(size_t) (h * D + a)], bc = L.b[(size_t) (h * D + c)];
                x[h * D + a] += ba * cs - bc * sn;
                x[h * D + c] += ba * sn + bc * cs;
            }
        }
    }
}

// Layout: uint32 magic, uint32 flags (flags_()), [uint32 basis span with a matrix], [uint64 calibration hash for TQ3A],
// uint32 n_rows (1: one sequence's, else every sequence's), then per row uint32 set (0/1) and per layer (ascending
// il) n floats of mu. The magic makes a state saved without the transforms (or by the build before per-sequence
// means, "TQK1") fail to load instead of being misread.
static const uint32_t TQ_KEYS_MAGIC = 0x324b5154;  // "TQK2"

void llama_tq_keys::state_write(llama_io_write_i & io, int32_t seq) const {
    if (!enabled()) {
        return;
    }
    io.write(&TQ_KEYS_MAGIC, sizeof(TQ_KEYS_MAGIC));
    const uint32_t flags = flags_();
    io.write(&flags, sizeof(flags));
    if (matrix) {
        ensure_basis();
        io.write(&basis_span, sizeof(basis_span));  // the basis follows from the model and this span
    }
    if (grouped) {
        io.write(&cal->hash, sizeof(cal->hash));  // TQ3A: the calibration that ordered the saved keys
    }
    const uint32_t n_rows = seq >= 0 ? 1 : n_seq;
    io.write(&n_rows, sizeof(n_rows));
    for (uint32_t r = 0; r < n_rows; ++r) {
        const uint32_t sq = seq >= 0 ? (uint32_t) seq : r;
        const uint32_t set = mu_ready[sq];
        io.write(&set, sizeof(set));
        for (const auto & [il, L] : layers) {
            io.write_tensor(L.mu, (size_t) sq * L.n * sizeof(float), (size_t) L.n * sizeof(float));
        }
    }
}

bool llama_tq_keys::state_read(llama_io_read_i & io, int32_t seq, const std::vector<llama_kv_cells> & cells) {
    if (!enabled()) {
        return true;
    }
    uint32_t magic = 0;
    uint32_t flags = 0;
    io.read(&magic, sizeof(magic));
    if (magic != TQ_KEYS_MAGIC) {
        LLAMA_LOG_ERROR("%s: the state has no TQ key transform section (saved with --tq-keys 0 or by another "
                        "build); restore it with the same setting and build\n", __func__);
        return false;
    }
    io.read(&flags, sizeof(flags));
    if (flags != flags_()) {
        LLAMA_LOG_ERROR("%s: the state was saved with other TQ key transforms (flags %u; this cache: centering %d, "
                        "equalization %d, matrix %d, K bias removed %d, TQ3A order %d; see --tq-keys)\n", __func__,
                        flags, center, equalize, matrix, kbias, grouped);
        return false;
    }
    uint32_t span = basis_span;
    if (matrix) {
        io.read(&span, sizeof(span));
        if (span == 0 || span > (1u << 30)) {
            LLAMA_LOG_ERROR("%s: the state's TQ key basis span (%u) is corrupt\n", __func__, span);
            return false;
        }
        bool others = false;  // keys of sequences this restore leaves in place, stored in the current basis
        for (uint32_t sq = 0; sq < n_seq && seq >= 0; ++sq) {
            others = others || ((int32_t) sq != seq && !seq_empty((int32_t) sq, cells));
        }
        if (span != basis_span && others) {
            LLAMA_LOG_ERROR("%s: the state's keys use the TQ key basis of a %u-position context, this cache holds "
                            "other keys in the basis of %u positions; restore into an emptied cache\n", __func__, span,
                            basis_span);
            return false;
        }
    }
    if (grouped) {
        uint64_t hash = 0;
        io.read(&hash, sizeof(hash));
        if (hash != cal->hash) {
            LLAMA_LOG_ERROR("%s: the state's tq3a keys were ordered by another calibration than %s: restore it with "
                            "the calibration it was saved with\n", __func__, cal->path.c_str());
            return false;
        }
    }
    uint32_t n_rows = 0;
    io.read(&n_rows, sizeof(n_rows));
    if (seq >= 0 ? n_rows != 1 : (n_rows == 0 || n_rows > n_seq)) {
        LLAMA_LOG_ERROR("%s: the state holds %u key means; this restore takes %s\n", __func__, n_rows,
                        seq >= 0 ? "one (a sequence's state)" : "one per sequence of this context, or fewer");
        return false;
    }
    std::vector<std::pair<uint32_t, std::vector<std::vector<float>>>> got;
    for (uint32_t r = 0; r < n_rows; ++r) {
        uint32_t set = 0;
        io.read(&set, sizeof(set));
        std::vector<std::vector<float>> rows;
        for (const auto & [il, L] : layers) {
            std::vector<float> mu((size_t) L.n);
            io.read(mu.data(), mu.size() * sizeof(float));
            // a key mean is a mean of keys: not NaN / Inf, nor beyond any key's magnitude (a corrupt or crafted file)
            if (set > 1 || std::any_of(mu.begin(), mu.end(), [](float v) { return !std::isfinite(v) || std::fabs(v) > 1e6f; })) {
                LLAMA_LOG_ERROR("%s: the state's key mean of layer %d is not finite or out of range: refused\n",
                                __func__, il);
                return false;
            }
            rows.push_back(std::move(mu));
        }
        got.emplace_back(set, std::move(rows));
    }
    if (matrix && span != basis_span && model_ != nullptr) {
        compute_basis(*model_, span);  // the saved keys were stored in the basis of the saving context's span
    }
    for (uint32_t r = 0; r < n_rows; ++r) {
        set_seq_mu(seq >= 0 ? seq : (int32_t) r, got[r].first != 0 ? &got[r].second : nullptr);
    }
    return true;
}
