// pybind11 bindings of the TriAttention engine (triatt.h) on numpy arrays: llama_tq._triatt.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <string>
#include <vector>

#include "triatt.h"

namespace py = pybind11;

namespace {

using f32 = py::array_t<float, py::array::c_style | py::array::forcecast>;
using i32 = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

triatt_config make_config(int budget, int hybrid, int prefix, int window, int segments, int divide, int warmup,
                          int boundary_skip, int pool, int pool_top, int pool_spans) {
    triatt_config c{budget, hybrid, prefix, window, segments, divide, warmup, boundary_skip, pool, pool_top,
                    pool_spans};
    char msg[256];
    if (triatt_config_check(&c, msg, sizeof msg) != 0) {
        throw py::value_error(msg);
    }
    return c;
}

triatt_rope make_rope(int head_dim, int n_rot, bool neox, float freq_base, float freq_scale) {
    if (head_dim <= 0 || head_dim % 2 || n_rot < 0 || n_rot % 2 || n_rot > head_dim) {
        throw py::value_error("need an even head_dim > 0 and an even n_rot <= head_dim");
    }
    return triatt_rope{head_dim, n_rot, neox ? 1 : 0, freq_base, freq_scale, nullptr};
}

}  // namespace

PYBIND11_MODULE(_triatt, m) {
    m.doc() = "TriAttention V3 eviction engine (csrc/triatt/triatt.c)";
    static const triatt_config D = [] {  // the defaults' one definition: triatt_config_default
        triatt_config c;
        triatt_config_default(&c);
        return c;
    }();

    m.def("check", [](int budget, int hybrid, int prefix, int window, int segments, int divide, int warmup,
                      int boundary_skip, int pool, int pool_top, int pool_spans) {
        make_config(budget, hybrid, prefix, window, segments, divide, warmup, boundary_skip, pool, pool_top,
                    pool_spans);
    }, py::arg("budget"), py::arg("hybrid") = D.hybrid, py::arg("prefix") = D.prefix, py::arg("window") = D.window,
       py::arg("segments") = D.segments, py::arg("divide") = D.divide, py::arg("warmup") = D.warmup,
       py::arg("boundary_skip") = D.boundary_skip, py::arg("pool") = D.pool, py::arg("pool_top") = D.pool_top,
       py::arg("pool_spans") = D.pool_spans, "Raise ValueError with llama.cpp's message if the settings are invalid.");

    m.def("select", [](const i32 & pos, const f32 & score, int budget, int hybrid, int prefix, int window,
                       int segments, int pool, int pool_top, int pool_spans) {
        if (pos.ndim() != 1 || score.ndim() != 1 || pos.size() != score.size()) {
            throw py::value_error("pos and score must be 1-D arrays of the same length");
        }
        const triatt_config c = make_config(budget, hybrid, prefix, window, segments, D.divide, D.warmup,
                                            D.boundary_skip, pool, pool_top, pool_spans);
        py::array_t<uint8_t> keep(pos.size());
        if (triatt_select(&c, (int32_t) pos.size(), pos.data(), score.data(), keep.mutable_data()) < 0) {
            throw std::bad_alloc();
        }
        return keep.attr("astype")("bool");
    }, py::arg("pos"), py::arg("score"), py::arg("budget"), py::arg("hybrid") = D.hybrid, py::arg("prefix") = D.prefix,
       py::arg("window") = D.window, py::arg("segments") = D.segments, py::arg("pool") = D.pool,
       py::arg("pool_top") = D.pool_top, py::arg("pool_spans") = D.pool_spans,
       "Boolean keep mask for one sequence's cells.");

    m.def("calibrate", [](const f32 & q, const i32 & pos, int n_rot, bool neox, float freq_base, float freq_scale) {
        if (q.ndim() != 2 || pos.ndim() != 1 || pos.shape(0) != q.shape(0)) {
            throw py::value_error("q must be (n, head_dim) and pos (n,)");
        }
        const triatt_rope r = make_rope((int) q.shape(1), n_rot, neox, freq_base, freq_scale);
        const size_t np = (size_t) r.head_dim / 2;
        std::vector<double> re(np), im(np), mag(np);
        if (triatt_calib_add(&r, q.data(), (size_t) q.shape(1), pos.data(), (int32_t) q.shape(0), re.data(), im.data(),
                             mag.data()) != 0) {
            throw std::bad_alloc();
        }
        f32 mu_re(np), mu_im(np), mean_mag(np);
        const double inv = q.shape(0) > 0 ? 1.0 / (double) q.shape(0) : 0.0;
        for (size_t f = 0; f < np; ++f) {
            mu_re.mutable_data()[f] = (float) (re[f] * inv);
            mu_im.mutable_data()[f] = (float) (im[f] * inv);
            mean_mag.mutable_data()[f] = (float) (mag[f] * inv);
        }
        return py::make_tuple(mu_re, mu_im, mean_mag);
    }, py::arg("q"), py::arg("pos"), py::arg("n_rot"), py::arg("neox"), py::arg("freq_base"),
       py::arg("freq_scale") = 1.0f, "Per-pair pre-RoPE query mean (re, im) and mean magnitude of post-RoPE rows.");

    m.def("score", [](const f32 & k, const f32 & mu_re, const f32 & mu_im, const f32 & mag, double t_now, int n_rot,
                      bool neox, float freq_base, float freq_scale, int max_log2) {
        if (k.ndim() != 2) {
            throw py::value_error("k must be (n, head_dim)");
        }
        const triatt_rope r = make_rope((int) k.shape(1), n_rot, neox, freq_base, freq_scale);
        const size_t np = (size_t) r.head_dim / 2;
        if ((size_t) mu_re.size() != np || (size_t) mu_im.size() != np || (size_t) mag.size() != np) {
            throw py::value_error("mu_re, mu_im and mag need head_dim/2 values");
        }
        // the library's path: W and B once, each key folded once, then the round's phase (triatt.h)
        std::vector<float> w_re(np), w_im(np), b(np), z(2 * np), c(np);
        std::vector<double> ph(2 * np);
        triatt_weights(&r, mu_re.data(), mu_im.data(), mag.data(), max_log2, w_re.data(), w_im.data(), b.data());
        triatt_phase(&r, t_now, ph.data(), ph.data() + np);
        py::array_t<float> out(k.shape(0));
        for (py::ssize_t i = 0; i < k.shape(0); ++i) {
            std::fill(z.begin(), z.end(), 0.0f);
            std::fill(c.begin(), c.end(), 0.0f);
            triatt_fold_key(&r, w_re.data(), w_im.data(), b.data(), k.data() + i * k.shape(1), z.data(), z.data() + np,
                            c.data());
            double cs = 0.0;
            for (float v : c) {
                cs += v;
            }
            out.mutable_data()[i] = (float) triatt_score_folded((int32_t) np, ph.data(), ph.data() + np, z.data(),
                                                                z.data() + np, cs);
        }
        return out;
    }, py::arg("k"), py::arg("mu_re"), py::arg("mu_im"), py::arg("mag"), py::arg("t_now"), py::arg("n_rot"),
       py::arg("neox"), py::arg("freq_base"), py::arg("freq_scale") = 1.0f, py::arg("max_log2") = 16,
       "TriAttention score of post-RoPE key rows of one head.");
    m.def("f16_to_f32", [](py::array_t<uint16_t, py::array::c_style | py::array::forcecast> h) {
        py::array_t<float> out(h.size());
        triatt_f16_to_f32(h.data(), out.mutable_data(), (size_t) h.size());
        return out;
    }, py::arg("h"), "IEEE half bit patterns to float32, as a round converts f16 keys.");
}
