// pybind11 bindings of the C codec (tq_codec.h) on numpy arrays: llama_tq._codec.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>

#include "tq_codec.h"

namespace py = pybind11;

namespace {

using f32_array = py::array_t<float, py::array::c_style | py::array::forcecast>;
using u8_array = py::array_t<uint8_t, py::array::c_style>;

// A block format: "tq3"/"tq4" (128 values a block), "tq3_64"/"tq4_64" (64 values) or "tq3_96"/"tq4_96" (96 values),
// the last two for heads that are not a multiple of 128.
struct Kind {
    int bits;  // 0 for tq3a (four groups of their own width)
    int n;
    py::ssize_t bytes;
};

Kind kind_of(const std::string & kind) {
    if (kind == "tq3a") {
        return {0, TQ3A_BLOCK, TQ3A_BLOCK_BYTES};
    }
    const int bits = kind.rfind("tq3", 0) == 0 ? 3 : kind.rfind("tq4", 0) == 0 ? 4 : 0;
    const std::string tail = kind.size() > 3 ? kind.substr(3) : "";
    const int n = tail.empty() ? TQ_BLOCK : tail == "_64" ? TQ_BLOCK_64 : tail == "_96" ? TQ_BLOCK_96 : 0;
    if (bits == 0 || n == 0) {
        throw py::value_error("unknown TurboQuant kind '" + kind +
                              "': expected 'tq3', 'tq4', 'tq3_64', 'tq4_64', 'tq3_96', 'tq4_96' or 'tq3a'");
    }
    return {bits, n, (py::ssize_t) tq_block_bytes_n(bits, n)};
}

int block_values(int block) {
    if (block != TQ_BLOCK && block != TQ_BLOCK_64 && block != TQ_BLOCK_96) {
        throw py::value_error("block must be 128, 64 or 96, not " + std::to_string(block));
    }
    return block;
}

// Checks that the last axis is a positive multiple of `unit` and returns the array's shape.
std::vector<py::ssize_t> checked_shape(const py::array & a, py::ssize_t unit, const char * what) {
    if (a.ndim() < 1) {
        throw py::value_error(std::string(what) + " must have at least one axis");
    }
    std::vector<py::ssize_t> shape(a.shape(), a.shape() + a.ndim());
    const py::ssize_t last = shape.back();
    if (last % unit != 0) {
        throw py::value_error(std::string(what) + ": last axis has length " + std::to_string(last) +
                              ", which is not a multiple of " + std::to_string(unit));
    }
    return shape;
}

py::array quantize(const f32_array & x, const std::string & kind) {
    const Kind k = kind_of(kind);
    auto shape = checked_shape(x, k.n, "quantize input");
    const py::ssize_t n = x.size();
    shape.back() = shape.back() / k.n * k.bytes;
    u8_array out(shape);
    {
        py::gil_scoped_release nogil;
        if (k.bits == 0) {
            tq3a_quantize_row(x.data(), out.mutable_data(), n);
        } else {
            tq_quantize_row_n(k.bits, k.n, x.data(), out.mutable_data(), n);
        }
    }
    return out;
}

py::array dequantize(const u8_array & blocks, const std::string & kind) {
    const Kind k = kind_of(kind);
    auto shape = checked_shape(blocks, k.bytes, "dequantize input (bytes)");
    const py::ssize_t nblocks = blocks.size() / k.bytes;
    shape.back() = shape.back() / k.bytes * k.n;
    f32_array out(shape);
    {
        py::gil_scoped_release nogil;
        if (k.bits == 0) {
            tq3a_dequantize_row(blocks.data(), out.mutable_data(), nblocks * k.n);
        } else {
            tq_dequantize_row_n(k.bits, k.n, blocks.data(), out.mutable_data(), nblocks * k.n);
        }
    }
    return out;
}

template <int (*fn)(int, const float *, float *)> py::array per_block(const f32_array & x, int block) {
    const int n = block_values(block);
    auto shape = checked_shape(x, n, "input");
    f32_array out(shape);
    const float * src = x.data();
    float * dst = out.mutable_data();
    for (py::ssize_t b = 0; b < x.size() / n; ++b) {
        fn(n, src + b * n, dst + b * n);
    }
    return out;
}

float dot_rotated(const u8_array & blocks, const f32_array & q_rot, const std::string & kind) {
    const Kind k = kind_of(kind);
    if (blocks.ndim() != 1 || q_rot.ndim() != 1) {
        throw py::value_error("dot_rotated takes one row: 1-D blocks and 1-D q_rot");
    }
    if (blocks.size() % k.bytes != 0 || blocks.size() / k.bytes * k.n != q_rot.size()) {
        throw py::value_error("dot_rotated: " + std::to_string(blocks.size()) + " bytes of " + kind +
                              " blocks do not match a query of " + std::to_string(q_rot.size()) + " values");
    }
    if (k.bits == 0) {
        return tq3a_dot_rotated_row(blocks.data(), q_rot.data(), q_rot.size());
    }
    return tq_dot_rotated_row_n(k.bits, k.n, blocks.data(), q_rot.data(), q_rot.size());
}

// tq3a's query-side rotation (each group by its own transform) and its inverse, rows of 256-value blocks.
template <void (*fn)(const float *, float *, int64_t)> py::array tq3a_rows(const f32_array & x) {
    auto shape = checked_shape(x, TQ3A_BLOCK, "input");
    f32_array out(shape);
    fn(x.data(), out.mutable_data(), x.size());
    return out;
}

void tq3a_rotate_floats(const float * x, float * y, int64_t k) { tq3a_rotate_row(x, y, k); }
void tq3a_unrotate_floats(const float * y, float * x, int64_t k) { tq3a_unrotate_row(y, x, k); }

py::array tq3a_dequantize_rotated(const u8_array & blocks) {
    auto shape = checked_shape(blocks, TQ3A_BLOCK_BYTES, "dequantize_rotated input (bytes)");
    const py::ssize_t nblocks = blocks.size() / TQ3A_BLOCK_BYTES;
    shape.back() = shape.back() / TQ3A_BLOCK_BYTES * TQ3A_BLOCK;
    f32_array out(shape);
    tq3a_dequantize_row_rotated(blocks.data(), out.mutable_data(), nblocks * TQ3A_BLOCK);
    return out;
}

py::array codebook(const std::string & kind) {
    const Kind k = kind_of(kind);
    if (k.bits == 0) {
        throw py::value_error("tq3a has a codebook per group: its groups are tq3a_groups()");
    }
    f32_array out(1 << k.bits);
    const float * c = tq_centroids_n(k.bits, k.n);
    std::copy(c, c + (1 << k.bits), out.mutable_data());
    return out;
}

py::array subscales() {
    f32_array out(16);
    std::copy(tq_subscales(), tq_subscales() + 16, out.mutable_data());
    return out;
}

py::array signs(int block) {
    const int n = block_values(block);
    const uint32_t * words = n == TQ_BLOCK ? TQ_SIGNS : n == TQ_BLOCK_64 ? TQ_SIGNS_64 : TQ_SIGNS_96;
    f32_array out(n);
    for (int i = 0; i < n; ++i) {
        out.mutable_data()[i] = (words[i >> 5] >> (i & 31)) & 1u ? -1.0f : 1.0f;
    }
    return out;
}

// Kinds whose indices follow a 4-byte header: every one but tq3a.
Kind header_kind(const std::string & kind) {
    const Kind k = kind_of(kind);
    if (k.bits == 0) {
        throw py::value_error("tq3a's indices are packed per group (tq_codec.h has the layout)");
    }
    return k;
}

py::array unpack_indices(const u8_array & block, const std::string & kind) {
    const Kind k = header_kind(kind);
    if (block.ndim() != 1 || block.size() != k.bytes) {
        throw py::value_error("unpack_indices takes exactly one " + kind + " block (" + std::to_string(k.bytes) +
                              " bytes)");
    }
    u8_array out(k.n);
    tq_unpack_indices_n(k.bits, k.n, block.data() + TQ_HEADER_BYTES, out.mutable_data());
    return out;
}

py::array pack_indices(const u8_array & idx, const std::string & kind) {
    const Kind k = header_kind(kind);
    if (idx.ndim() != 1 || idx.size() != k.n) {
        throw py::value_error("pack_indices takes " + std::to_string(k.n) + " indices for " + kind);
    }
    for (py::ssize_t i = 0; i < k.n; ++i) {
        if (idx.data()[i] >= (1u << k.bits)) {
            throw py::value_error("index " + std::to_string(idx.data()[i]) + " out of range for " + kind);
        }
    }
    u8_array out(k.bytes - TQ_HEADER_BYTES);
    tq_pack_indices_n(k.bits, k.n, idx.data(), out.mutable_data());
    return out;
}

}  // namespace

PYBIND11_MODULE(_codec, m) {
    m.doc() = "TurboQuant TQ3/TQ4 codec (C implementation in csrc/codec/tq_codec.c)";
    m.attr("BLOCK") = TQ_BLOCK;
    py::dict values, bytes;  // per storage format, in tq_formats.h's order: the one table of the formats
    py::list formats;
#define TQ_PY_FORMAT(name, NAME, n, bits, nbytes, qrot)                                                               \
    values[#name] = n;                                                                                               \
    bytes[#name] = nbytes;                                                                                           \
    formats.append(py::dict(py::arg("name") = #name, py::arg("values") = n, py::arg("bits") = bits,                  \
                            py::arg("bytes") = nbytes));
    TQ_FORMATS(TQ_PY_FORMAT)
#undef TQ_PY_FORMAT
    m.attr("BLOCK_VALUES") = values;
    m.attr("BLOCK_BYTES") = bytes;
    m.attr("FORMATS") = formats;
    py::list fa_heads;  // the GPU backends' flash-attention head sizes per block size (tq_formats.h)
#define TQ_PY_FA_HEAD(b, v, h)                                                                                        \
    fa_heads.append(py::dict(py::arg("backend") = #b, py::arg("values") = v, py::arg("head") = h));
    TQ_FA_HEADS(TQ_PY_FA_HEAD)
#undef TQ_PY_FA_HEAD
    m.attr("FA_HEADS") = fa_heads;
    m.def("quantize", &quantize, py::arg("x"), py::arg("kind"),
          "Quantize float32 values (last axis a multiple of the kind's block: 128, 64 for tq3_64/tq4_64, 96 for "
          "tq3_96/tq4_96) "
          "into uint8 blocks.");
    m.def("dequantize", &dequantize, py::arg("blocks"), py::arg("kind"),
          "Decode uint8 blocks (last axis a multiple of the block size) into float32 values.");
    m.def("rotate", &per_block<tq_rotate_n>, py::arg("x"), py::arg("block") = TQ_BLOCK,
          "Randomized Walsh-Hadamard rotation of each block (128 values, 64, or 96: three 32-point transforms "
          "mixed by a 3x3 orthogonal matrix).");
    m.def("unrotate", &per_block<tq_unrotate_n>, py::arg("y"), py::arg("block") = TQ_BLOCK, "Inverse of rotate().");
    m.def("dot_rotated", &dot_rotated, py::arg("blocks"), py::arg("q_rot"), py::arg("kind"),
          "Dot product of one quantized row with a query already rotated block by block.");
    m.def("codebook", &codebook, py::arg("kind"), "The Lloyd-Max centroids (ascending).");
    m.def("subscales", &subscales, "The 16 sub-block scale multipliers.");
    m.def("signs", &signs, py::arg("block") = TQ_BLOCK, "The fixed +-1 sign pattern D of the rotation (128, 64 or 96).");
    py::list groups;  // tq3a's groups (tq_codec.h): values and bits, in block order
    for (int g = 0; g < TQ3A_GROUPS_N; ++g) {
        groups.append(py::dict(py::arg("values") = TQ3A_GROUP_VALUES[g], py::arg("bits") = TQ3A_GROUP_BITS[g]));
    }
    m.attr("TQ3A_GROUPS") = groups;
    m.attr("TQ3A_BLOCK_BYTES") = TQ3A_BLOCK_BYTES;
    m.def("tq3a_rotate", &tq3a_rows<tq3a_rotate_floats>, py::arg("x"),
          "tq3a's query-side rotation: each group of every 256-value block by its own randomized Walsh-Hadamard "
          "transform.");
    m.def("tq3a_unrotate", &tq3a_rows<tq3a_unrotate_floats>, py::arg("y"), "Inverse of tq3a_rotate().");
    m.def("tq3a_dequantize_rotated", &tq3a_dequantize_rotated, py::arg("blocks"),
          "tq3a blocks decoded in their groups' rotated domain (s_g * c'_g).");
    m.def("pack_indices", &pack_indices, py::arg("idx"), py::arg("kind"));
    m.def("unpack_indices", &unpack_indices, py::arg("block"), py::arg("kind"));
}
