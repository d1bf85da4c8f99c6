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

// One setting of triatt_params.h by name: the engine's field.
struct setting {
    const char * name;
    int32_t triatt_config::*field;
};
const setting SETTINGS[] = {
#define TRIATT_PY_SETTING(field, def, flag, hint, help) {#field, &triatt_config::field},
#define TRIATT_PY_SKIP(field)
    TRIATT_PARAMS(TRIATT_PY_SETTING, TRIATT_PY_SKIP)
#undef TRIATT_PY_SETTING
};

// The defaults, overridden by keyword: TypeError for a name that is not a setting, ValueError (llama.cpp's message)
// for invalid values.
triatt_config make_config(const py::kwargs & kw) {
    triatt_config c;
    triatt_config_default(&c);
    for (const auto & [key, value] : kw) {
        const std::string name = py::str(key);
        const setting * s = std::find_if(std::begin(SETTINGS), std::end(SETTINGS),
                                         [&](const setting & x) { return name == x.name; });
        if (s == std::end(SETTINGS)) {
            std::string known;
            for (const setting & x : SETTINGS) {
                known += (known.empty() ? "" : ", ") + std::string(x.name);
            }
            throw py::type_error("unknown TriAttention setting '" + name + "' (known: " + known + ")");
        }
        c.*(s->field) = value.cast<int32_t>();
    }
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
    py::list params;  // the schema (triatt_params.h): what the flags and the C struct are made of
#define TRIATT_PY_PARAM(field, def, flag, hint, help) \
    params.append(py::dict(py::arg("name") = #field, py::arg("default") = def, py::arg("flag") = flag, py::arg("help") = help));
    TRIATT_PARAMS(TRIATT_PY_PARAM, TRIATT_PY_SKIP)
#undef TRIATT_PY_PARAM
    m.attr("PARAMS") = params;
    py::list fields;  // struct llama_triatt_params (include/llama-tq.h), in order, retired slots included
#define TRIATT_PY_FIELD(field, def, flag, hint, help) fields.append(#field);
#define TRIATT_PY_RETIRED(field) fields.append("retired_" #field);
    TRIATT_PARAMS(TRIATT_PY_FIELD, TRIATT_PY_RETIRED)
#undef TRIATT_PY_FIELD
#undef TRIATT_PY_RETIRED
    m.attr("STRUCT_FIELDS") = fields;
    py::dict policies;  // --triatt-policy names -> the `hybrid` value
#define TRIATT_PY_POLICY(id, flag_name, name) policies[flag_name] = id;
    TRIATT_POLICIES(TRIATT_PY_POLICY)
#undef TRIATT_PY_POLICY
    m.attr("POLICIES") = policies;

    m.def("check", [](const py::kwargs & kw) { make_config(kw); },
          "check(**settings): raise ValueError with llama.cpp's message if the settings are invalid (TypeError for "
          "an unknown name); settings not given keep their defaults (PARAMS).");

    m.def("select", [](const i32 & pos, const f32 & score, const py::kwargs & kw) {
        if (pos.ndim() != 1 || score.ndim() != 1 || pos.size() != score.size()) {
            throw py::value_error("pos and score must be 1-D arrays of the same length");
        }
        const triatt_config c = make_config(kw);
        py::array_t<uint8_t> keep(pos.size());
        if (triatt_select(&c, (int32_t) pos.size(), pos.data(), score.data(), keep.mutable_data()) < 0) {
            throw std::bad_alloc();
        }
        return keep.attr("astype")("bool");
    }, py::arg("pos"), py::arg("score"),
       "select(pos, score, **settings): boolean keep mask for one sequence's cells.");

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
