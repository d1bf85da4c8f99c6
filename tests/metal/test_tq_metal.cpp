// Runs the Metal TQ source (kernels/tq.metal) on the CPU through tests/metal/metal_stdlib and compares it with
// the C codec: tables; quantize and dequantize of every block format bit for bit on `blocks` random blocks per
// format (several value distributions and the codec's edge cases); the SET_ROWS / CPY / GET_ROWS kernels in
// upstream's dispatch geometry; the flash-attention kernel, each threadgroup run as an emulated SIMD group of 32
// lanes, against a double-precision attention over codec-dequantized K/V (the semantics of test-backend-ops'
// CPU reference) for every K/V pair and head size it is instantiated for, with masks, ALiBi, softcap, sinks, GQA;
// built with -DTQ_METAL_WITH_GGML (and the installed ggml) also against ggml's CPU FLASH_ATTN_EXT on the same bytes.
//   test_tq_metal [blocks_per_format]        exit status 0 = all equal / within tolerance
// the standard headers first: the stand-in erases `thread`, `device` and `constant`, which they use as names
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tq_codec.h"

#ifdef TQ_METAL_WITH_GGML // the installed patched ggml: its CPU backend is the FA reference (as test-backend-ops')
#include "ggml-cpu.h"
#include "ggml.h"
#endif

using worker_thread = std::thread;

#include "tq.metal"

static int g_fail = 0;

#define CHECK(cond, ...)                    \
    do {                                    \
        if (!(cond)) {                      \
            std::printf("FAIL: " __VA_ARGS__); \
            std::printf("\n");              \
            ++g_fail;                       \
        }                                   \
    } while (0)

static uint32_t fbits(float f) { return metal::as_type<uint32_t>(f); }

// ---------------------------------------------------------------------------------------------------------------
static void test_tables() {
    for (int n : {128, 64}) {
        for (int bits : {3, 4}) {
            const float * c = tq_centroids_n(bits, n);
            float b[15];
            tq_scaled_boundaries_n(bits, n, 1.0f, b);
            for (int i = 0; i < (1 << bits); ++i) {
                const float m = n == 128 ? (bits == 3 ? tq_mtl_cent<3, 128>(i) : tq_mtl_cent<4, 128>(i))
                                         : (bits == 3 ? tq_mtl_cent<3, 64>(i) : tq_mtl_cent<4, 64>(i));
                CHECK(fbits(m) == fbits(c[i]), "centroid %d of bits %d n %d", i, bits, n);
            }
            for (int i = 0; i < (1 << bits) - 1; ++i) {
                const float m = n == 128 ? (bits == 3 ? tq_mtl_bound<3, 128>(i) : tq_mtl_bound<4, 128>(i))
                                         : (bits == 3 ? tq_mtl_bound<3, 64>(i) : tq_mtl_bound<4, 64>(i));
                CHECK(fbits(m) == fbits(b[i]), "boundary %d of bits %d n %d", i, bits, n);
            }
        }
    }
    for (int w = 0; w < 4; ++w) {
        CHECK(tq_mtl_signs[w] == TQ_SIGNS[w], "sign word %d", w);
    }
    for (int w = 0; w < 2; ++w) {
        CHECK(tq_mtl_signs_64[w] == TQ_SIGNS_64[w], "64-point sign word %d", w);
    }
    const bool sizes = tq_mtl_fmt<3, 128>::bytes == TQ3_BLOCK_BYTES && tq_mtl_fmt<4, 128>::bytes == TQ4_BLOCK_BYTES &&
                       tq_mtl_fmt<3, 64>::bytes == TQ3_64_BLOCK_BYTES && tq_mtl_fmt<4, 64>::bytes == TQ4_64_BLOCK_BYTES;
    CHECK(sizes, "block sizes");
}

// ---------------------------------------------------------------------------------------------------------------
// The software binary64 against the machine's, bit for bit: add (with cancellation and exact ties), mul, div,
// sqrt, float -> double, double -> float (normal and subnormal results).
static tq_sd sd_of(double d) {
    if (d == 0.0) {
        return tq_sd_pack(0, false, 0, std::signbit(d));
    }
    int ex;
    const double fr = std::frexp(std::fabs(d), &ex); // d = fr * 2^ex, fr in [0.5, 1)
    return tq_sd_pack((ulong) std::ldexp(fr, 53), false, ex - 53, d < 0);
}
static double double_of(tq_sd a) { return (a.neg ? -1.0 : 1.0) * std::ldexp((double) a.m, a.e); }
static uint64_t dbits(double d) { return metal::as_type<uint64_t>(d); }

static void test_soft_double(int64_t n) {
    std::mt19937_64 rng(4242);
    std::uniform_int_distribution<int> expo(-60, 60), small(0, 3), gap(0, 70);
    auto rnd = [&](int e) { // random 53-bit mantissa, exponent e, random sign
        const ulong m = (rng() >> 11) | (1ul << 52);
        return (rng() & 1 ? -1.0 : 1.0) * std::ldexp((double) m, e - 52);
    };
    int64_t bad_add = 0, bad_mul = 0, bad_div = 0, bad_sqrt = 0, bad_f2d = 0, bad_d2f = 0;
    for (int64_t i = 0; i < n; ++i) {
        const double a = rnd(expo(rng));
        double b = rnd(expo(rng));
        switch (small(rng)) {
            case 0: b = rnd((int) std::ilogb(a) - gap(rng)); break;                    // close exponents
            case 1: b = -a * (1.0 + std::ldexp((double) (rng() % 64), -52)); break;   // cancellation
            case 2: b = std::copysign(std::ldexp(1.0, (int) std::ilogb(a) - 53), rng() & 1 ? a : -a); break; // a tie
            default: break;
        }
        bad_add += dbits(double_of(tq_sd_add(sd_of(a), sd_of(b)))) != dbits(a + b);
        bad_mul += dbits(double_of(tq_sd_mul(sd_of(a), sd_of(b)))) != dbits(a * b);
        bad_div += dbits(double_of(tq_sd_div(sd_of(a), sd_of(b)))) != dbits(a / b);
        bad_sqrt += dbits(double_of(tq_sd_sqrt(sd_of(std::fabs(a))))) != dbits(std::sqrt(std::fabs(a)));
        const float f = metal::as_type<float>((uint32_t) rng()); // any float bits
        if (std::isfinite(f)) {
            bad_f2d += dbits(double_of(tq_sd_from_float(f))) != dbits((double) f);
        }
        // to float: results in the normal and the subnormal range, and exact float midpoints
        const int fe = (int) (rng() % 300) - 160;
        double d = rnd(fe > 120 ? 120 : fe);
        if (rng() % 4 == 0) {
            d = (double) metal::as_type<float>((uint32_t) rng() & 0x7effffffu) +
                std::ldexp(1.0, std::ilogb(d) - 24); // near a float midpoint
        }
        bad_d2f += metal::as_type<uint32_t>(tq_sd_to_float(sd_of(d))) != metal::as_type<uint32_t>((float) d);
    }
    std::printf("soft binary64: %lld cases; differing add %lld mul %lld div %lld sqrt %lld float->double %lld "
                "double->float %lld\n", (long long) n, (long long) bad_add, (long long) bad_mul, (long long) bad_div,
                (long long) bad_sqrt, (long long) bad_f2d, (long long) bad_d2f);
    CHECK(bad_add + bad_mul + bad_div + bad_sqrt + bad_f2d + bad_d2f == 0, "soft binary64");
}

// ---------------------------------------------------------------------------------------------------------------
// Random blocks: the distribution cycles with the block index (kind = b % 10).
static void make_block(std::mt19937_64 & rng, int n, int64_t b, float * x) {
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::exponential_distribution<float> ex(1.0f);
    const int kind = (int) (b % 10);
    const float scale = std::pow(10.0f, uni(rng) * 3.0f);
    for (int i = 0; i < n; ++i) {
        switch (kind) {
            case 0: case 1: case 2: x[i] = gauss(rng) * scale; break;                           // Gaussian
            case 3: x[i] = (uni(rng) < 0 ? -1.0f : 1.0f) * ex(rng) * ex(rng) * scale; break;     // heavy tail
            case 4: x[i] = 10.0f * scale + gauss(rng) * scale * 0.1f; break;                     // common offset
            case 5: x[i] = uni(rng) < 0.9f ? 0.0f : gauss(rng) * scale; break;                   // sparse
            case 6: x[i] = gauss(rng) * 1e-39f; break;                                           // subnormal floats
            case 7: x[i] = gauss(rng) * 1e37f; break;                                            // huge
            case 8: x[i] = (float) ((int) (uni(rng) * 4.0f)); break;                              // ties, exact values
            default: x[i] = uni(rng) * scale; break;                                             // uniform
        }
    }
    if (b % 1000 == 7) { // the codec's edge cases
        const int e = (int) ((b / 1000) % 4);
        if (e == 0) { std::fill(x, x + n, 0.0f); }
        if (e == 1) { x[b % n] = NAN; }
        if (e == 2) { x[b % n] = -INFINITY; }
        if (e == 3) { std::fill(x, x + n, 3.0e38f); }
    }
}

template <int BITS, int N> static int64_t test_codec_range(uint64_t seed, int64_t b0, int64_t b1, int64_t * deq_bad) {
    std::mt19937_64 rng(seed);
    constexpr int BB = tq_mtl_fmt<BITS, N>::bytes;
    float x[N], ya[N], yb[N];
    uchar qa[BB], qb[BB];
    int64_t bad = 0;
    for (int64_t b = b0; b < b1; ++b) {
        make_block(rng, N, b, x);
        tq_quantize_block_n(BITS, N, x, qa);
        tq_mtl_quantize_block<float, BITS, N>(x, qb);
        if (std::memcmp(qa, qb, BB) != 0) {
            if (bad < 3) {
                std::printf("  bits %d n %d block %lld (kind %lld): bytes differ (scale %02x%02x vs %02x%02x)\n", BITS, N,
                            (long long) b, (long long) (b % 10), qa[1], qa[0], qb[1], qb[0]);
            }
            ++bad;
        }
        tq_dequantize_block_n(BITS, N, qa, ya);
        tq_mtl_dequantize_block<BITS, N>(qa, yb);
        for (int i = 0; i < N; ++i) {
            if (fbits(ya[i]) != fbits(yb[i])) {
                ++*deq_bad;
                break;
            }
        }
    }
    return bad;
}

template <int BITS, int N> static void test_codec(int64_t blocks) {
    // two threads, each with its own seed and half of the block indices
    int64_t bad[2] = {0, 0}, dbad[2] = {0, 0};
    worker_thread t([&] { bad[1] = test_codec_range<BITS, N>(1000 + BITS * 7 + N, blocks / 2, blocks, &dbad[1]); });
    bad[0] = test_codec_range<BITS, N>(BITS * 7 + N, 0, blocks / 2, &dbad[0]);
    t.join();
    std::printf("codec tq%d (%d-value blocks): %lld blocks, quantize differs in %lld, dequantize in %lld\n", BITS, N,
                (long long) blocks, (long long) (bad[0] + bad[1]), (long long) (dbad[0] + dbad[1]));
    CHECK(bad[0] + bad[1] == 0, "quantize tq%d/%d", BITS, N);
    CHECK(dbad[0] + dbad[1] == 0, "dequantize tq%d/%d", BITS, N);
}

// ---------------------------------------------------------------------------------------------------------------
// SET_ROWS, CPY f32 -> tq, GET_ROWS, CPY tq -> f32/f16 through the kernels, with upstream's dispatch geometry
// (ggml-metal-ops.cpp: set_rows nth = min(32, nk0) threads x nrptg rows; cpy to a quantized type one thread per
// block; get_rows / cpy from a quantized type one thread per 16 values).
template <int BITS, int N> static void test_rows_kernels() {
    constexpr int BB = tq_mtl_fmt<BITS, N>::bytes;
    const int ne0 = 4 * N, nrows = 6, nheads = 2, dst_rows = 9;
    const int nk0 = ne0 / N;
    std::mt19937_64 rng(77 + BITS + N);
    std::vector<float> src((size_t) ne0 * nrows * nheads);
    for (int64_t b = 0; b < (int64_t) src.size() / N; ++b) {
        make_block(rng, N, b, &src[b * N]);
    }
    std::vector<int64_t> ids = {3, 0, 8, 5, 1, 7};
    std::vector<uchar> dst((size_t) BB * nk0 * dst_rows * nheads, 0xAB), ref = dst;
    for (int h = 0; h < nheads; ++h) {
        for (int r = 0; r < nrows; ++r) {
            tq_quantize_row_n(BITS, N, &src[((size_t) h * nrows + r) * ne0], &ref[((size_t) h * dst_rows + ids[r]) * BB * nk0], ne0);
        }
    }
    ggml_metal_kargs_set_rows a = {};
    a.nk0 = nk0; a.ne01 = nrows; a.nb01 = ne0 * 4; a.nb02 = (uint64_t) ne0 * 4 * nrows; a.nb03 = a.nb02 * nheads;
    a.ne11 = 1; a.ne12 = 1; a.nb10 = 8; a.nb11 = 8 * nrows; a.nb12 = 8 * nrows;
    a.nb1 = BB * nk0; a.nb2 = (uint64_t) BB * nk0 * dst_rows; a.nb3 = a.nb2 * nheads;
    const int nth = std::min(32, nk0);
    const int nrptg = std::max(1, 32 / nk0);
    for (int z = 0; z < 1; ++z) {
        for (int y = 0; y < nheads; ++y) {
            for (int x = 0; x < (nrows + nrptg - 1) / nrptg; ++x) {
                for (int t = 0; t < nth * nrptg; ++t) {
                    kernel_tq_set_rows<int64_t, BITS, N>(a, src.data(), ids.data(), (float *) dst.data(), uint3{(uint) x, (uint) y, (uint) z},
                                                         (uint) t, uint3{(uint) nth, (uint) nrptg, 1});
                }
            }
        }
    }
    CHECK(dst == ref, "SET_ROWS tq%d/%d", BITS, N);

    // CPY f32 -> tq (contiguous rows)
    std::vector<uchar> cq((size_t) BB * nk0 * nrows * nheads), cref(cq.size());
    tq_quantize_row_n(BITS, N, src.data(), cref.data(), (int64_t) src.size());
    ggml_metal_kargs_cpy c = {};
    c.nk0 = nk0; c.ne00 = ne0; c.ne01 = nrows; c.ne02 = nheads; c.ne03 = 1;
    c.nb00 = 4; c.nb01 = ne0 * 4; c.nb02 = (uint64_t) ne0 * 4 * nrows; c.nb03 = c.nb02 * nheads;
    c.ne0 = ne0; c.ne1 = nrows; c.ne2 = nheads; c.ne3 = 1;
    c.nb0 = BB; c.nb1 = BB * nk0; c.nb2 = (uint64_t) BB * nk0 * nrows; c.nb3 = c.nb2 * nheads;
    for (int y = 0; y < nheads; ++y) {
        for (int x = 0; x < nrows; ++x) {
            for (int t = 0; t < nk0; ++t) {
                kernel_tq_cpy_f32_tq<BITS, N>(c, (const char *) src.data(), (char *) cq.data(), uint3{(uint) x, (uint) y, 0},
                                              ushort3{(ushort) t, 0, 0}, ushort3{(ushort) nk0, 1, 1});
            }
        }
    }
    CHECK(cq == cref, "CPY f32 -> tq%d/%d", BITS, N);

    // GET_ROWS and CPY tq -> f32 / f16 against the codec's dequantization
    std::vector<float> deq(src.size());
    tq_dequantize_row_n(BITS, N, cref.data(), deq.data(), (int64_t) deq.size());
    std::vector<int32_t> gids = {5, 2, 2, 0};
    std::vector<float> g((size_t) ne0 * gids.size() * nheads, -1.0f);
    ggml_metal_kargs_get_rows gr = {};
    gr.ne00t = ne0 / 16; gr.ne00 = ne0; gr.nb01 = BB * nk0; gr.nb02 = (uint64_t) BB * nk0 * nrows; gr.nb03 = gr.nb02 * nheads;
    gr.ne10 = (int32_t) gids.size(); gr.nb10 = 4; gr.nb11 = 0; gr.nb12 = 0; // the same ids for every head
    gr.nb1 = ne0 * 4; gr.nb2 = (uint64_t) ne0 * 4 * gids.size(); gr.nb3 = gr.nb2 * nheads;
    const int gnth = std::min(gr.ne00t, 32);
    const int nw0 = (gr.ne00t + gnth - 1) / gnth;
    for (int y = 0; y < nheads; ++y) {
        for (int x = 0; x < nw0 * gr.ne10; ++x) {
            for (int t = 0; t < gnth; ++t) {
                kernel_tq_get_rows<BITS, N>(gr, cref.data(), gids.data(), g.data(), uint3{(uint) x, (uint) y, 0}, (ushort) t,
                                            ushort3{(ushort) gnth, 1, 1});
            }
        }
    }
    bool same = true;
    for (int y = 0; y < nheads; ++y) {
        for (size_t r = 0; r < gids.size(); ++r) {
            same = same && std::memcmp(&g[((size_t) y * gids.size() + r) * ne0], &deq[((size_t) y * nrows + gids[r]) * ne0], ne0 * 4) == 0;
        }
    }
    CHECK(same, "GET_ROWS tq%d/%d", BITS, N);

    std::vector<float> o32(src.size());
    std::vector<half> o16(src.size());
    ggml_metal_kargs_cpy d = c;
    d.nk0 = ne0 / 16; d.nb00 = 0; d.nb01 = BB * nk0; d.nb02 = (uint64_t) BB * nk0 * nrows; d.nb03 = d.nb02 * nheads;
    for (int f16 = 0; f16 < 2; ++f16) {
        const int es = f16 ? 2 : 4;
        d.nb0 = es; d.nb1 = (uint64_t) es * ne0; d.nb2 = d.nb1 * nrows; d.nb3 = d.nb2 * nheads;
        for (int y = 0; y < nheads; ++y) {
            for (int x = 0; x < nrows; ++x) {
                for (int t = 0; t < d.nk0; ++t) {
                    if (f16) {
                        kernel_tq_cpy_tq_t<half, BITS, N>(d, (const char *) cref.data(), (char *) o16.data(), uint3{(uint) x, (uint) y, 0},
                                                          ushort3{(ushort) t, 0, 0}, ushort3{(ushort) d.nk0, 1, 1});
                    } else {
                        kernel_tq_cpy_tq_t<float, BITS, N>(d, (const char *) cref.data(), (char *) o32.data(), uint3{(uint) x, (uint) y, 0},
                                                           ushort3{(ushort) t, 0, 0}, ushort3{(ushort) d.nk0, 1, 1});
                    }
                }
            }
        }
    }
    bool s32 = std::memcmp(o32.data(), deq.data(), deq.size() * 4) == 0, s16 = true;
    for (size_t i = 0; i < deq.size(); ++i) {
        const half h = (half) deq[i];
        s16 = s16 && std::memcmp(&h, &o16[i], 2) == 0;
    }
    CHECK(s32, "CPY tq%d/%d -> f32", BITS, N);
    CHECK(s16, "CPY tq%d/%d -> f16", BITS, N);
    std::printf("kernels tq%d/%d: SET_ROWS %s, CPY f32->tq %s, GET_ROWS %s, CPY ->f32 %s, ->f16 %s\n", BITS, N,
                dst == ref ? "exact" : "DIFF", cq == cref ? "exact" : "DIFF", same ? "exact" : "DIFF", s32 ? "exact" : "DIFF",
                s16 ? "exact" : "DIFF");
}

// ---------------------------------------------------------------------------------------------------------------
// Flash attention.
struct kv_buf {
    int type; // TQ_MTL_*
    int row_bytes;
    std::vector<uchar> data;
    std::vector<float> deq; // what the reference sees
};

static const char * kv_name(int t) {
    static const char * names[] = {"f16", "q8_0", "tq3", "tq4", "tq3_64", "tq4_64"};
    return names[t];
}

static kv_buf make_kv(int type, int D, int rows, std::mt19937_64 & rng) {
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    std::vector<float> x((size_t) D * rows);
    for (auto & v : x) {
        v = gauss(rng);
    }
    kv_buf k;
    k.type = type;
    k.deq.resize(x.size());
    if (type == TQ_MTL_F16) {
        k.row_bytes = D * 2;
        k.data.resize((size_t) k.row_bytes * rows);
        for (size_t i = 0; i < x.size(); ++i) {
            const half h = (half) x[i];
            std::memcpy(&k.data[2 * i], &h, 2);
            k.deq[i] = (float) h;
        }
    } else if (type == TQ_MTL_Q8_0) {
        k.row_bytes = D / 32 * 34;
        k.data.resize((size_t) k.row_bytes * rows);
        for (size_t b = 0; b < x.size() / 32; ++b) {
            float amax = 0.0f;
            for (int i = 0; i < 32; ++i) {
                amax = std::max(amax, std::fabs(x[b * 32 + i]));
            }
            const half d = (half) (amax / 127.0f);
            uchar * o = &k.data[b * 34];
            std::memcpy(o, &d, 2);
            for (int i = 0; i < 32; ++i) {
                const int q = (float) d == 0.0f ? 0 : (int) std::lround(x[b * 32 + i] / (float) d);
                o[2 + i] = (uchar) (int8_t) q;
                k.deq[b * 32 + i] = (float) d * (float) q;
            }
        }
    } else {
        const int bits = type == TQ_MTL_TQ3 || type == TQ_MTL_TQ3_64 ? 3 : 4;
        const int n = type >= TQ_MTL_TQ3_64 ? 64 : 128;
        k.row_bytes = (int) (D / n * tq_block_bytes_n(bits, n));
        k.data.resize((size_t) k.row_bytes * rows);
        for (int r = 0; r < rows; ++r) {
            tq_quantize_row_n(bits, n, &x[(size_t) r * D], &k.data[(size_t) r * k.row_bytes], D);
            tq_dequantize_row_n(bits, n, &k.data[(size_t) r * k.row_bytes], &k.deq[(size_t) r * D], D);
        }
    }
    return k;
}

#ifdef TQ_METAL_WITH_GGML
static ggml_type ggml_of(int t) {
    static const ggml_type types[] = {GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_TQ3, GGML_TYPE_TQ4, GGML_TYPE_TQ3_64,
                                      GGML_TYPE_TQ4_64};
    return types[t];
}

// ggml's CPU FLASH_ATTN_EXT on the same bytes: the output [D, heads, rows] (what test-backend-ops compares with)
static std::vector<float> ggml_cpu_fa(int D, int KT, int VT, int n_kv, int n_rows, int n_head, int n_head_kv,
                                      const std::vector<float> & q, const kv_buf & k, const kv_buf & v,
                                      const std::vector<half> * mask, const std::vector<float> * sinks, float scale,
                                      float max_bias, float softcap) {
    ggml_init_params ip = {(size_t) 256 << 20, nullptr, false};
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * tq = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, n_rows, n_head, 1);
    ggml_tensor * tk = ggml_new_tensor_4d(ctx, ggml_of(KT), D, n_kv, n_head_kv, 1);
    ggml_tensor * tv = ggml_new_tensor_4d(ctx, ggml_of(VT), D, n_kv, n_head_kv, 1);
    std::memcpy(tq->data, q.data(), ggml_nbytes(tq));
    std::memcpy(tk->data, k.data.data(), ggml_nbytes(tk));
    std::memcpy(tv->data, v.data.data(), ggml_nbytes(tv));
    ggml_tensor * tm = nullptr;
    if (mask) {
        tm = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_kv, n_rows, 1, 1);
        std::memcpy(tm->data, mask->data(), ggml_nbytes(tm));
    }
    ggml_tensor * out = ggml_flash_attn_ext(ctx, tq, tk, tv, tm, scale, max_bias, softcap);
    if (sinks) {
        ggml_tensor * ts = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n_head);
        std::memcpy(ts->data, sinks->data(), ggml_nbytes(ts));
        ggml_flash_attn_ext_add_sinks(out, ts);
    }
    ggml_prec_set_acc(out, GGML_PREC_F32);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    std::vector<float> r;
    if (ggml_graph_compute_with_ctx(ctx, gf, 1) == GGML_STATUS_SUCCESS) {
        r.assign((const float *) out->data, (const float *) out->data + ggml_nelements(out));
    }
    ggml_free(ctx);
    return r;
}
#endif

template <int KT, int VT, int D> struct fa_case {
    static inline double nmse_ggml = -1.0; // vs ggml's CPU backend (TQ_METAL_WITH_GGML builds), else -1
    static double run(int n_kv, int n_rows, int n_head, int n_head_kv, bool mask, float softcap, float max_bias, bool sinks,
                      uint64_t seed) {
        std::mt19937_64 rng(seed);
        std::normal_distribution<float> gauss(0.0f, 1.0f);
        std::vector<float> q((size_t) D * n_rows * n_head);
        for (auto & v : q) {
            v = gauss(rng);
        }
        kv_buf k = make_kv(KT, D, n_kv * n_head_kv, rng);
        kv_buf v = make_kv(VT, D, n_kv * n_head_kv, rng);
        std::vector<half> m((size_t) n_kv * n_rows);
        for (int r = 0; r < n_rows; ++r) {
            for (int c = 0; c < n_kv; ++c) {
                m[(size_t) r * n_kv + c] = (half) ((c + r) % 5 == 3 ? -INFINITY : 0.25f * gauss(rng));
            }
        }
        std::vector<float> sk(n_head);
        for (auto & s : sk) {
            s = gauss(rng);
        }
        const float scale = 1.0f / std::sqrt((float) D);
        const int n_head_log2 = 1 << (int) std::floor(std::log2((float) n_head));
        const float m0 = std::pow(2.0f, -max_bias / n_head_log2);
        const float m1 = std::pow(2.0f, -(max_bias / 2.0f) / n_head_log2);

        ggml_metal_kargs_flash_attn_ext_vec a = {};
        a.ne01 = n_rows; a.ne02 = n_head; a.ne03 = 1;
        a.nb01 = D * 4; a.nb02 = (uint64_t) D * 4 * n_rows; a.nb03 = a.nb02 * n_head;
        a.ne11 = n_kv; a.ne_12_2 = n_head_kv; a.ne_12_3 = 1;
        a.nb11 = k.row_bytes; a.nb12 = (uint64_t) k.row_bytes * n_kv; a.nb13 = a.nb12 * n_head_kv;
        a.nb21 = v.row_bytes; a.nb22 = (uint64_t) v.row_bytes * n_kv; a.nb23 = a.nb22 * n_head_kv;
        a.ne31 = n_rows; a.ne32 = 1; a.ne33 = 1; a.nb31 = n_kv * 2; a.nb32 = a.nb31 * n_rows; a.nb33 = a.nb32;
        a.ne1 = n_head; a.ne2 = n_rows; a.ne3 = 1;
        a.scale = softcap != 0.0f ? scale / softcap : scale; // as the host passes it
        a.max_bias = max_bias; a.m0 = m0; a.m1 = m1; a.n_head_log2 = n_head_log2; a.logit_softcap = softcap;
        a.n_kv_max_padded = (mask ? 1 : 0) | (sinks ? 2 : 0);

        std::vector<float> out((size_t) D * n_head * n_rows, NAN);
        for (int h = 0; h < n_head; ++h) {
            for (int r = 0; r < n_rows; ++r) {
                tq_emu::run_simdgroup([&](ushort lane) {
                    kernel_tq_flash_attn_ext<KT, VT, D>(a, (const char *) q.data(), (const char *) k.data.data(),
                                                        (const char *) v.data.data(), (const char *) m.data(),
                                                        (const char *) sk.data(), (char *) out.data(),
                                                        uint3{(uint) r, (uint) h, 0}, lane);
                });
            }
        }
#ifdef TQ_METAL_WITH_GGML
        {
            const std::vector<float> cpu = ggml_cpu_fa(D, KT, VT, n_kv, n_rows, n_head, n_head_kv, q, k, v, mask ? &m : nullptr,
                                                       sinks ? &sk : nullptr, scale, max_bias, softcap);
            double e = 0.0, r2 = 0.0;
            for (size_t i = 0; i < cpu.size() && cpu.size() == out.size(); ++i) {
                e += ((double) out[i] - cpu[i]) * ((double) out[i] - cpu[i]);
                r2 += (double) cpu[i] * cpu[i];
            }
            nmse_ggml = cpu.size() == out.size() ? e / r2 : INFINITY;
        }
#endif
        // reference in double
        double err = 0.0, ref2 = 0.0;
        for (int h = 0; h < n_head; ++h) {
            const int hk = h / (n_head / n_head_kv);
            double slope = 1.0;
            if (max_bias > 0.0f) {
                slope = h < n_head_log2 ? std::pow(m0, h + 1) : std::pow(m1, 2 * (h - n_head_log2) + 1);
            }
            for (int r = 0; r < n_rows; ++r) {
                std::vector<double> s(n_kv);
                double M = -INFINITY;
                for (int c = 0; c < n_kv; ++c) {
                    const double mv = mask ? (double) (float) m[(size_t) r * n_kv + c] : 0.0;
                    double dot = 0.0;
                    for (int i = 0; i < D; ++i) {
                        dot += (double) q[((size_t) h * n_rows + r) * D + i] * k.deq[((size_t) hk * n_kv + c) * D + i];
                    }
                    double x = dot * scale;
                    if (softcap != 0.0f) {
                        x = softcap * std::tanh(x / softcap);
                    }
                    s[c] = x + slope * mv;
                    M = std::max(M, s[c]);
                }
                if (sinks) {
                    M = std::max(M, (double) sk[h]);
                }
                double S = sinks ? std::exp(sk[h] - M) : 0.0;
                std::vector<double> o(D, 0.0);
                for (int c = 0; c < n_kv; ++c) {
                    const double p = std::exp(s[c] - M);
                    S += p;
                    for (int i = 0; i < D; ++i) {
                        o[i] += p * v.deq[((size_t) hk * n_kv + c) * D + i];
                    }
                }
                for (int i = 0; i < D; ++i) {
                    const double ref = o[i] / S;
                    const double got = out[((size_t) r * n_head + h) * D + i];
                    err += (got - ref) * (got - ref);
                    ref2 += ref * ref;
                }
            }
        }
        return err / ref2; // NMSE, as test-backend-ops measures
    }
};

template <int KT, int VT, int D> static void fa(int n_kv, int n_rows, int n_head, int n_head_kv, bool mask, float softcap,
                                                float max_bias, bool sinks) {
    const double nmse = fa_case<KT, VT, D>::run(n_kv, n_rows, n_head, n_head_kv, mask, softcap, max_bias, sinks,
                                                (uint64_t) (KT * 131 + VT * 17 + D + n_kv));
    const double ng = fa_case<KT, VT, D>::nmse_ggml;
    // vs ggml's CPU backend: test-backend-ops' FA tolerance (its f16 K/V paths round Q and V sums to f16)
    const bool ok = nmse < 1e-6 && (ng < 0.0 || ng < 5e-4);
    char cpu[48] = "";
    if (ng >= 0.0) {
        std::snprintf(cpu, sizeof cpu, ", vs ggml CPU %.2e", ng);
    }
    std::printf("FA %-6s K / %-6s V d%-3d kv %3d rows %d heads %d/%d mask %d softcap %.0f alibi %.0f sinks %d: NMSE %.2e%s %s\n",
                kv_name(KT), kv_name(VT), D, n_kv, n_rows, n_head, n_head_kv, mask, softcap, max_bias, sinks, nmse, cpu,
                ok ? "ok" : "FAIL");
    CHECK(ok, "FA");
}

template <int A, int B, int D> static void fa_pairs() {
    fa<A, A, D>(77, 2, 4, 2, true, 0.0f, 0.0f, false);
    fa<A, B, D>(33, 1, 2, 1, false, 0.0f, 0.0f, false);
    fa<B, A, D>(33, 1, 4, 4, true, 0.0f, 0.0f, true);
    fa<B, B, D>(65, 3, 8, 2, true, 30.0f, 0.0f, false);
    fa<TQ_MTL_F16, A, D>(40, 1, 4, 1, true, 0.0f, 8.0f, false);
    fa<A, TQ_MTL_F16, D>(40, 2, 2, 2, true, 0.0f, 0.0f, false);
    fa<TQ_MTL_Q8_0, B, D>(31, 1, 2, 1, true, 0.0f, 0.0f, false);
    fa<B, TQ_MTL_Q8_0, D>(31, 1, 2, 1, false, 0.0f, 0.0f, true);
}

int main(int argc, char ** argv) {
    const int64_t blocks = argc > 1 ? std::atoll(argv[1]) : (1 << 18);
    test_tables();
    test_soft_double(1000000);
    test_codec<3, 128>(blocks);
    test_codec<4, 128>(blocks);
    test_codec<3, 64>(blocks);
    test_codec<4, 64>(blocks);
    test_rows_kernels<3, 128>();
    test_rows_kernels<4, 128>();
    test_rows_kernels<3, 64>();
    test_rows_kernels<4, 64>();
    fa_pairs<TQ_MTL_TQ3, TQ_MTL_TQ4, 128>();
    fa_pairs<TQ_MTL_TQ3, TQ_MTL_TQ4, 256>();
    fa_pairs<TQ_MTL_TQ3_64, TQ_MTL_TQ4_64, 64>();
    fa_pairs<TQ_MTL_TQ3_64, TQ_MTL_TQ4_64, 192>();
    std::printf("%s: %d failure(s)\n", g_fail ? "FAILED" : "PASSED", g_fail);
    return g_fail ? 1 : 0;
}
