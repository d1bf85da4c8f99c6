// ggml graphs with TQ3/TQ4 (and TQ3A key) tensors on the patched CPU backend, against float references built from the codec's
// own dequantized values (built and run by tests/test_ggml_graph.py).
//
// Checked: SET_ROWS writes exactly the codec's bytes; GET_ROWS returns exactly the codec's dequantization;
// MUL_MAT (the -fa off K*Q path) and FLASH_ATTN_EXT with TQ K and/or V, including mixed pairs, match a double
// precision reference on the dequantized K/V. Tolerances: the reference uses the same dequantized K/V, so what
// remains is float accumulation order (TQ K: rotated f32 query) or the query conversion of the K type
// (q8_0 K: query quantized to q8_0; f16 K: query rounded to f16), see tol_for().
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ggml-cpu.h"
#include "ggml.h"
#include "tq_codec.h"

static int g_failures = 0;
static int g_checks = 0;

static void check(bool ok, const std::string & what) {
    ++g_checks;
    if (!ok) {
        ++g_failures;
        std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    }
}

static std::vector<float> randn(size_t n, std::mt19937 & rng, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto & x : v) {
        x = d(rng);
    }
    return v;
}

// Row-wise dequantization through the type's to_float: the values the kernels see.
static std::vector<float> dequant(ggml_type t, const ggml_tensor * x) {
    const int64_t n = x->ne[0];
    const int64_t rows = ggml_nrows(x);
    std::vector<float> out(n * rows);
    const auto * tr = ggml_get_type_traits(t);
    for (int64_t r = 0; r < rows; ++r) {
        const char * src = (const char *) x->data + r * x->nb[1];
        if (t == GGML_TYPE_F32) {
            std::memcpy(out.data() + r * n, src, n * sizeof(float));
        } else {
            tr->to_float(src, out.data() + r * n, n);
        }
    }
    return out;
}

static ggml_tensor * new_filled(ggml_context * ctx, ggml_type t, int64_t ne0, int64_t ne1, int64_t ne2,
                                const std::vector<float> & src) {
    ggml_tensor * x = ggml_new_tensor_3d(ctx, t, ne0, ne1, ne2);
    if (t == GGML_TYPE_F32) {
        std::memcpy(x->data, src.data(), src.size() * sizeof(float));
    } else {
        ggml_quantize_init(t);
        const auto * cpu = ggml_get_type_traits_cpu(t);
        for (int64_t r = 0; r < ne1 * ne2; ++r) {
            cpu->from_float(src.data() + r * ne0, (char *) x->data + r * x->nb[1], ne0);
        }
    }
    return x;
}

static void compute(ggml_context * ctx, ggml_tensor * out, int n_threads) {
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    check(ggml_graph_compute_with_ctx(ctx, gf, n_threads) == GGML_STATUS_SUCCESS, "graph compute");
}

static double max_rel_err(const float * got, const std::vector<double> & want) {
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        num = std::fmax(num, std::fabs(got[i] - want[i]));
        den = std::fmax(den, std::fabs(want[i]));
    }
    return num / (den > 0 ? den : 1.0);
}

static ggml_context * new_ctx(size_t mb) {
    ggml_init_params p = {mb << 20, nullptr, false};
    return ggml_init(p);
}

// SET_ROWS f32 -> TQ must store the codec's bytes; GET_ROWS must return the codec's dequantization.
static void test_set_get_rows(ggml_type t, int bits, int64_t d, std::mt19937 & rng) {
    ggml_context * ctx = new_ctx(64);
    const int64_t n_cells = 37, n_new = 11;
    ggml_tensor * cache = ggml_new_tensor_2d(ctx, t, d, n_cells);
    std::memset(cache->data, 0, ggml_nbytes(cache));
    auto vals = randn(d * n_new, rng, 2.0f);
    ggml_tensor * src = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, d, n_new);
    std::memcpy(src->data, vals.data(), vals.size() * sizeof(float));
    ggml_tensor * idx = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, n_new);
    for (int64_t i = 0; i < n_new; ++i) {
        ((int64_t *) idx->data)[i] = (i * 7 + 3) % n_cells;
    }
    compute(ctx, ggml_set_rows(ctx, cache, src, idx), 2);

    const int nb = (int) ggml_blck_size(t);  // 128, or 64 for the 64-value variants, 256 for TQ3A
    const bool grouped = t == GGML_TYPE_TQ3A;  // four groups of their own width (bits unused)
    std::vector<uint8_t> want(ggml_type_size(t) * (d / nb));
    std::vector<float> deq(d);
    ggml_tensor * gidx = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_new);
    for (int64_t i = 0; i < n_new; ++i) {
        ((int32_t *) gidx->data)[i] = (int32_t) ((int64_t *) idx->data)[i];
    }
    ggml_tensor * got = ggml_get_rows(ctx, cache, gidx);
    compute(ctx, got, 2);
    bool bytes_ok = true, rows_ok = true;
    for (int64_t i = 0; i < n_new; ++i) {
        const int64_t cell = ((int64_t *) idx->data)[i];
        if (grouped) {
            tq3a_quantize_row(vals.data() + i * d, want.data(), d);
        } else {
            tq_quantize_row_n(bits, nb, vals.data() + i * d, want.data(), d);
        }
        bytes_ok &= std::memcmp((char *) cache->data + cell * cache->nb[1], want.data(), want.size()) == 0;
        if (grouped) {
            tq3a_dequantize_row(want.data(), deq.data(), d);
        } else {
            tq_dequantize_row_n(bits, nb, want.data(), deq.data(), d);
        }
        rows_ok &= std::memcmp((float *) got->data + i * d, deq.data(), d * sizeof(float)) == 0;
    }
    check(bytes_ok, std::string("SET_ROWS bytes == codec, ") + ggml_type_name(t) + " d=" + std::to_string(d));
    check(rows_ok, std::string("GET_ROWS == codec dequant, ") + ggml_type_name(t) + " d=" + std::to_string(d));
    ggml_free(ctx);
}

// MUL_MAT(K, Q): the K*Q product of -fa off, with K in the rotated-query vec_dot path.
static void test_mul_mat(ggml_type t, int64_t d, int64_t n_kv, std::mt19937 & rng) {
    ggml_context * ctx = new_ctx(256);
    const int64_t n_q = 5;
    ggml_tensor * k = new_filled(ctx, t, d, n_kv, 1, randn(d * n_kv, rng));
    ggml_tensor * q = new_filled(ctx, GGML_TYPE_F32, d, n_q, 1, randn(d * n_q, rng));
    ggml_tensor * kq = ggml_mul_mat(ctx, k, q);
    compute(ctx, kq, 2);
    const auto kd = dequant(t, k);
    const auto * qd = (const float *) q->data;
    std::vector<double> want(n_kv * n_q);
    for (int64_t j = 0; j < n_q; ++j) {
        for (int64_t i = 0; i < n_kv; ++i) {
            double acc = 0;
            for (int64_t e = 0; e < d; ++e) {
                acc += (double) kd[i * d + e] * qd[j * d + e];
            }
            want[j * n_kv + i] = acc;
        }
    }
    const double err = max_rel_err((const float *) kq->data, want);
    check(err < 1e-5, std::string("MUL_MAT ") + ggml_type_name(t) + " d=" + std::to_string(d) + " n_kv=" +
                          std::to_string(n_kv) + " rel err " + std::to_string(err));
    ggml_free(ctx);
}

static double tol_for(ggml_type tk, ggml_type tv) {
    // what the kernel does beyond the dequantized reference: how Q meets K, and V in f16 accumulation
    double tol = 2e-5;
    if (tk == GGML_TYPE_Q8_0) {
        tol = 2e-2;  // Q is quantized to q8_0 for the dot product
    } else if (tk == GGML_TYPE_F16) {
        tol = 5e-3;  // Q is rounded to f16
    }
    if (tv == GGML_TYPE_F16) {
        tol = std::fmax(tol, 1.5e-2);  // upstream's f16-V path accumulates V*p in f16 (~6e-3 seen at 600 cells)
    }
    return tol;
}

// FLASH_ATTN_EXT with any K/V type pair, GQA ratio r, optional mask.
static void test_flash_attn(ggml_type tk, ggml_type tv, int64_t d, int64_t n_kv, int64_t r, bool masked,
                            std::mt19937 & rng) {
    ggml_context * ctx = new_ctx(512);
    const int64_t n_head_kv = 2, n_head = n_head_kv * r, n_q = 3;
    ggml_tensor * q = new_filled(ctx, GGML_TYPE_F32, d, n_q, n_head, randn(d * n_q * n_head, rng));
    ggml_tensor * k = new_filled(ctx, tk, d, n_kv, n_head_kv, randn(d * n_kv * n_head_kv, rng));
    ggml_tensor * v = new_filled(ctx, tv, d, n_kv, n_head_kv, randn(d * n_kv * n_head_kv, rng));
    ggml_tensor * mask = nullptr;
    std::vector<float> mvals(n_kv * n_q, 0.0f);
    if (masked) {
        mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_kv, n_q);
        std::uniform_real_distribution<float> u(0.0f, 1.0f);
        for (int64_t j = 0; j < n_q; ++j) {
            for (int64_t i = 0; i < n_kv; ++i) {
                // causal-like: the last n_q - 1 - j cells hidden, plus random holes; cell 0 always visible
                const bool hide = (i > 0) && (i >= n_kv - (n_q - 1 - j) || u(rng) < 0.2f);
                mvals[j * n_kv + i] = hide ? -INFINITY : 0.0f;
                ((ggml_fp16_t *) mask->data)[j * n_kv + i] = ggml_fp32_to_fp16(mvals[j * n_kv + i]);
            }
        }
    }
    const float scale = 1.0f / std::sqrt((float) d);
    ggml_tensor * out = ggml_flash_attn_ext(ctx, q, k, v, mask, scale, 0.0f, 0.0f);
    compute(ctx, out, 2);

    const auto kd = dequant(tk, k);
    const auto vd = dequant(tv, v);
    const auto * qd = (const float *) q->data;
    std::vector<double> want(d * n_head * n_q);  // out layout: [d, n_head, n_q]
    std::vector<double> p(n_kv);
    for (int64_t h = 0; h < n_head; ++h) {
        const int64_t hk = h / r;
        for (int64_t j = 0; j < n_q; ++j) {
            double mx = -INFINITY;
            for (int64_t i = 0; i < n_kv; ++i) {
                double s = 0;
                for (int64_t e = 0; e < d; ++e) {
                    s += (double) qd[(h * n_q + j) * d + e] * kd[(hk * n_kv + i) * d + e];
                }
                p[i] = s * scale + mvals[j * n_kv + i];
                mx = std::fmax(mx, p[i]);
            }
            double sum = 0;
            for (int64_t i = 0; i < n_kv; ++i) {
                p[i] = std::exp(p[i] - mx);
                sum += p[i];
            }
            for (int64_t e = 0; e < d; ++e) {
                double acc = 0;
                for (int64_t i = 0; i < n_kv; ++i) {
                    acc += p[i] * vd[(hk * n_kv + i) * d + e];
                }
                want[(j * n_head + h) * d + e] = acc / sum;
            }
        }
    }
    const double err = max_rel_err((const float *) out->data, want);
    check(err < tol_for(tk, tv), std::string("FLASH_ATTN_EXT K=") + ggml_type_name(tk) + " V=" + ggml_type_name(tv) +
                                      " d=" + std::to_string(d) + " n_kv=" + std::to_string(n_kv) + " gqa=" +
                                      std::to_string(r) + (masked ? " masked" : "") + " rel err " + std::to_string(err));
    ggml_free(ctx);
}

int main() {
    std::mt19937 rng(1234);
    const struct {
        ggml_type t;
        int bits;
    } tq[] = {{GGML_TYPE_TQ3, 3}, {GGML_TYPE_TQ4, 4}};
    for (int64_t d : {128, 256}) {
        for (const auto & x : tq) {
            test_set_get_rows(x.t, x.bits, d, rng);
            for (int64_t n_kv : {1, 33, 512}) {
                test_mul_mat(x.t, d, n_kv, rng);
            }
        }
        const ggml_type pairs[][2] = {
            {GGML_TYPE_TQ3, GGML_TYPE_TQ3},  {GGML_TYPE_TQ4, GGML_TYPE_TQ4},  {GGML_TYPE_Q8_0, GGML_TYPE_TQ3},
            {GGML_TYPE_TQ4, GGML_TYPE_TQ3},  {GGML_TYPE_F16, GGML_TYPE_TQ3},  {GGML_TYPE_TQ3, GGML_TYPE_Q8_0},
            {GGML_TYPE_TQ4, GGML_TYPE_F16},
        };
        for (const auto & pr : pairs) {
            for (int64_t n_kv : {1, 70, 600}) {
                for (int64_t r : {1, 4, 7}) {
                    test_flash_attn(pr[0], pr[1], d, n_kv, r, n_kv > 1 && r != 4, rng);
                }
            }
        }
    }
    // the 64-value variants (heads that are not a multiple of 128), on their own and paired with other types
    const struct {
        ggml_type t;
        int bits;
    } tq64[] = {{GGML_TYPE_TQ3_64, 3}, {GGML_TYPE_TQ4_64, 4}};
    for (int64_t d : {64, 192}) {
        for (const auto & x : tq64) {
            test_set_get_rows(x.t, x.bits, d, rng);
            for (int64_t n_kv : {1, 33}) {
                test_mul_mat(x.t, d, n_kv, rng);
            }
        }
        const ggml_type pairs[][2] = {
            {GGML_TYPE_TQ3_64, GGML_TYPE_TQ3_64}, {GGML_TYPE_TQ4_64, GGML_TYPE_TQ4_64}, {GGML_TYPE_TQ4_64, GGML_TYPE_TQ3_64},
            {GGML_TYPE_Q8_0, GGML_TYPE_TQ3_64},   {GGML_TYPE_F16, GGML_TYPE_TQ4_64},    {GGML_TYPE_TQ3_64, GGML_TYPE_F16},
        };
        for (const auto & pr : pairs) {
            for (int64_t n_kv : {1, 70, 600}) {
                for (int64_t r : {1, 4}) {
                    test_flash_attn(pr[0], pr[1], d, n_kv, r, n_kv > 1, rng);
                }
            }
        }
    }
    // TQ3A keys (heads of 256, K only): with TQ, q8_0 and f16 values
    for (int64_t d : {256, 512}) {
        test_set_get_rows(GGML_TYPE_TQ3A, 0, d, rng);
        for (int64_t n_kv : {1, 33}) {
            test_mul_mat(GGML_TYPE_TQ3A, d, n_kv, rng);
        }
    }
    for (ggml_type tv : {GGML_TYPE_TQ3, GGML_TYPE_TQ4, GGML_TYPE_Q8_0, GGML_TYPE_F16}) {
        for (int64_t n_kv : {1, 70, 600}) {
            for (int64_t r : {1, 4}) {
                test_flash_attn(GGML_TYPE_TQ3A, tv, 256, n_kv, r, n_kv > 1, rng);
            }
        }
    }
    std::printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
