// pybind11 bindings of the C codec (tq_codec.h) on numpy arrays: llama_tq._codec.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>

#include "tq_codec.h"

namespace py = pybind11;

namespace {

using f32_array = py::array_t<float, py::array::c_style | py::array::forcecast>;
using u8_array = py::array_t<uint8_t, py::array::c_style>;

int kind_bits(const std::string & kind) {
    if (kind == "tq3") {
        return 3;
    }
    if (kind == "tq4") {
        return 4;
    }
    throw py::value_error("unknown TurboQuant kind '" + kind + "': expected 'tq3' or 'tq4'");
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
    const int bits = kind_bits(kind);
    auto shape = checked_shape(x, TQ_BLOCK, "quantize input");
    const py::ssize_t n = x.size();
    shape.back() = shape.back() / TQ_BLOCK * (py::ssize_t) tq_block_bytes(bits);
    u8_array out(shape);
    {
        py::gil_scoped_release nogil;
        tq_quantize_row(bits, x.data(), out.mutable_data(), n);
    }
    return out;
}

py::array dequantize(const u8_array & blocks, const std::string & kind) {
    const int bits = kind_bits(kind);
    const auto bb = (py::ssize_t) tq_block_bytes(bits);
    auto shape = checked_shape(blocks, bb, "dequantize input (bytes)");
    const py::ssize_t nblocks = blocks.size() / bb;
    shape.back() = shape.back() / bb * TQ_BLOCK;
    f32_array out(shape);
    {
        py::gil_scoped_release nogil;
        tq_dequantize_row(bits, blocks.data(), out.mutable_data(), nblocks * TQ_BLOCK);
    }
    return out;
}

template <void (*fn)(const float *, float *)> py::array per_block(const f32_array & x) {
    auto shape = checked_shape(x, TQ_BLOCK, "input");
    f32_array out(shape);
    const float * src = x.data();
    float * dst = out.mutable_data();
    for (py::ssize_t b = 0; b < x.size() / TQ_BLOCK; ++b) {
        fn(src + b * TQ_BLOCK, dst + b * TQ_BLOCK);
    }
    return out;
}

float dot_rotated(const u8_array & blocks, const f32_array & q_rot, const std::string & kind) {
    const int bits = kind_bits(kind);
    const auto bb = (py::ssize_t) tq_block_bytes(bits);
    if (blocks.ndim() != 1 || q_rot.ndim() != 1) {
        throw py::value_error("dot_rotated takes one row: 1-D blocks and 1-D q_rot");
    }
    if (blocks.size() % bb != 0 || blocks.size() / bb * TQ_BLOCK != q_rot.size()) {
        throw py::value_error("dot_rotated: " + std::to_string(blocks.size()) + " bytes of " + kind +
                              " blocks do not match a query of " + std::to_string(q_rot.size()) + " values");
    }
    return tq_dot_rotated_row(bits, blocks.data(), q_rot.data(), q_rot.size());
}

py::array codebook(const std::string & kind) {
    const int bits = kind_bits(kind);
    f32_array out(1 << bits);
    const float * c = tq_centroids(bits);
    std::copy(c, c + (1 << bits), out.mutable_data());
    return out;
}

py::array subscales() {
    f32_array out(16);
    std::copy(tq_subscales(), tq_subscales() + 16, out.mutable_data());
    return out;
}

py::array signs() {
    f32_array out(TQ_BLOCK);
    for (int i = 0; i < TQ_BLOCK; ++i) {
        out.mutable_data()[i] = (TQ_SIGNS[i >> 5] >> (i & 31)) & 1u ? -1.0f : 1.0f;
    }
    return out;
}

py::array unpack_indices(const u8_array & block, const std::string & kind) {
    const int bits = kind_bits(kind);
    if (block.ndim() != 1 || block.size() != (py::ssize_t) tq_block_bytes(bits)) {
        throw py::value_error("unpack_indices takes exactly one " + kind + " block (" +
                              std::to_string(tq_block_bytes(bits)) + " bytes)");
    }
    u8_array out(TQ_BLOCK);
    tq_unpack_indices(bits, block.data() + TQ_HEADER_BYTES, out.mutable_data());
    return out;
}

py::array pack_indices(const u8_array & idx, const std::string & kind) {
    const int bits = kind_bits(kind);
    if (idx.ndim() != 1 || idx.size() != TQ_BLOCK) {
        throw py::value_error("pack_indices takes 128 indices");
    }
    for (py::ssize_t i = 0; i < TQ_BLOCK; ++i) {
        if (idx.data()[i] >= (1u << bits)) {
            throw py::value_error("index " + std::to_string(idx.data()[i]) + " out of range for " + kind);
        }
    }
    u8_array out((py::ssize_t) tq_block_bytes(bits) - TQ_HEADER_BYTES);
    tq_pack_indices(bits, idx.data(), out.mutable_data());
    return out;
}

}  // namespace

PYBIND11_MODULE(_codec, m) {
    m.doc() = "TurboQuant TQ3/TQ4 codec (C implementation in csrc/codec/tq_codec.c)";
    m.attr("BLOCK") = TQ_BLOCK;
    m.attr("BLOCK_BYTES") = py::dict(py::arg("tq3") = TQ3_BLOCK_BYTES, py::arg("tq4") = TQ4_BLOCK_BYTES);
    m.def("quantize", &quantize, py::arg("x"), py::arg("kind"),
          "Quantize float32 values (last axis a multiple of 128) into uint8 blocks.");
    m.def("dequantize", &dequantize, py::arg("blocks"), py::arg("kind"),
          "Decode uint8 blocks (last axis a multiple of the block size) into float32 values.");
    m.def("rotate", &per_block<tq_rotate>, py::arg("x"), "Randomized Walsh-Hadamard rotation of each 128-block.");
    m.def("unrotate", &per_block<tq_unrotate>, py::arg("y"), "Inverse of rotate().");
    m.def("dot_rotated", &dot_rotated, py::arg("blocks"), py::arg("q_rot"), py::arg("kind"),
          "Dot product of one quantized row with a query already rotated block by block.");
    m.def("codebook", &codebook, py::arg("kind"), "The Lloyd-Max centroids (ascending).");
    m.def("subscales", &subscales, "The 16 sub-block scale multipliers.");
    m.def("signs", &signs, "The fixed +-1 sign pattern D of the rotation.");
    m.def("pack_indices", &pack_indices, py::arg("idx"), py::arg("kind"));
    m.def("unpack_indices", &unpack_indices, py::arg("block"), py::arg("kind"));
}
