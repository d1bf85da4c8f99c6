// Standalone harness for the TQ flash-attention decode kernels (no ggml): the SIMT kernel and the tensor-core
// kernel side by side on the same quantized cache, checked against a CPU reference built on the C codec, and
// timed with CUDA events. Layouts are ggml's: K/V [D, n_kv, n_kvh, 1] (all sequences share the cache, as in
// test-backend-ops' perf cases), Q f32 [D, n_q, n_head, n_seq], mask f16 [n_kv, n_q], dst [D, n_head, n_q, n_seq].
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -use_fast_math -Icsrc/codec -Icsrc/llama.cpp/ggml/src/ggml-cuda/tq \
//        lab/cuda/fa_decode_bench.cu tq_codec.o -o fa_decode_bench
//   ./fa_decode_bench            correctness cases, then the perf cases; exit 1 on any mismatch
//   ./fa_decode_bench perf [N]   the perf cases only (or only the N-th; N = tq: the TQ-pair cases only)
//   ./fa_decode_bench phases     (-DTQ_FA_PHASES, after `bash lab/patch.sh apply cuda-phases`) where a single-pass block's time goes at depth 0
//   ./fa_decode_bench short      decode at short KV (1 sequence, as llama-bench at depth 0): the host's chunking,
//                                then one chunk (the tensor-core kernel's single pass), per KV length
//   ./fa_decode_bench depth      llama-bench's decode at KV 2K / 8K / 32K (1 sequence, 4 KV heads, GQA 4) by chunk count
//   TQ_FA_SEPARATE_MERGE=1      the tensor-core kernel's partials merged by the merge kernel (default: fused, as the host)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "tq-fattn-mma.cuh"

#include "../../tests/cuda/cuda_check.cuh"
#include "copy_bandwidth.cuh"

struct Case {
    int D, n_kv, n_kvh, gqa, n_q, n_seq, tk, tv;
    bool mask;
    float softcap;
    bool perf;
    int chunks = 0; // 0: the host's chunking; n: n chunks (1: the tensor-core kernel's single pass)
    int open = 0;   // > 0: only the first `open` keys unmasked (a decode step at depth 0 pads the KV to 256 cells)
};

static const char * kname(int k) {
    return k == TQFA_F16 ? "f16" : k == TQFA_TQ3 ? "tq3" : k == TQFA_TQ4 ? "tq4" : k == TQFA_TQ3_64 ? "tq3_64" : "tq4_64";
}
static int kbits(int k) { return k == TQFA_F16 ? 16 : k == TQFA_TQ3 || k == TQFA_TQ3_64 ? 3 : 4; }
static int kblock(int k) { return tq_fa_is_tq64(k) ? TQ_BLOCK_64 : TQ_BLOCK; }
// bytes of one row of D values (bits 16: f16)
static size_t row_bytes(int bits, int bn, int D) { return bits == 16 ? 2 * (size_t) D : tq_block_bytes_n(bits, bn) * (D / bn); }
// one stored row back to floats (the reference's view of the cache)
static void dequantize_row(int bits, int bn, const uint8_t * src, float * dst, int D) {
    if (bits == 16) {
        for (int d = 0; d < D; ++d) {
            __half h;
            memcpy(&h, src + 2 * d, 2);
            dst[d] = __half2float(h);
        }
    } else {
        tq_dequantize_row_n(bits, bn, src, dst, D);
    }
}

static void quantize_rows(int bits, int bn, const std::vector<float> & x, std::vector<uint8_t> & out, int64_t rows, int D) {
    const size_t rb = row_bytes(bits, bn, D);
    out.resize(rb * rows);
    if (bits == 16) {
        for (int64_t i = 0; i < rows * D; ++i) {
            const __half h = __float2half(x[i]);
            memcpy(out.data() + 2 * i, &h, 2);
        }
        return;
    }
    const int nt = (int) std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::thread> th;
    for (int i = 0; i < nt; ++i) {
        th.emplace_back([&, i] {
            for (int64_t r = i; r < rows; r += nt) {
                tq_quantize_row_n(bits, bn, x.data() + r * D, out.data() + r * rb, D);
            }
        });
    }
    for (auto & t : th) {
        t.join();
    }
}

template <int D, int TK, int TV>
static void launch(int mma, tq_fa_params & p, int n_chunks, int n_kvh, int n_seq, const float * sinks, float * dst,
                   int64_t nb1, int64_t nb2, int64_t nb3) {
    const dim3 grid(n_chunks, n_kvh * p.n_groups, n_seq);
    p.dst = nullptr;
    p.done = nullptr;
    if constexpr (tq_fa_is_tq128(TK) && tq_fa_is_tq128(TV)) {
        if (mma) {
            // the merge fused into the kernel, as the host runs it (TQ_FA_SEPARATE_MERGE=1: the merge kernel)
            static unsigned * counters = [] {
                unsigned * c = nullptr;
                CK(cudaMalloc(&c, TQ_FA_DONE_COUNTERS * sizeof(unsigned)));
                CK(cudaMemset(c, 0, TQ_FA_DONE_COUNTERS * sizeof(unsigned)));
                return c;
            }();
            static const bool separate = getenv("TQ_FA_SEPARATE_MERGE") && atoi(getenv("TQ_FA_SEPARATE_MERGE"));
            if (mma == 1 && n_chunks > 1 && !separate && grid.y * grid.z <= TQ_FA_DONE_COUNTERS) {
                p.done = counters;
                p.mdst = (char *) dst;
            }
            if (n_chunks == 1) { // single pass, as the host runs it
                p.dst = (char *) dst;
            }
            if (n_chunks == 1 || p.done != nullptr) {
                p.dnb1 = nb1; p.dnb2 = nb2; p.dnb3 = nb3;
                p.sinks = sinks;
            }
            tq_fa_mma_kernel<D, TK, TV><<<grid, TQ_MMA_WARPS * 32>>>(p);
        }
    }
    if (!mma || tq_fa_is_tq64(TK)) {
        switch (p.ncol) {
            case 1: tq_fa_decode_kernel<D, 1, TK, TV><<<grid, TQ_FA_THREADS>>>(p); break;
            case 2: tq_fa_decode_kernel<D, 2, TK, TV><<<grid, TQ_FA_THREADS>>>(p); break;
            case 4: tq_fa_decode_kernel<D, 4, TK, TV><<<grid, TQ_FA_THREADS>>>(p); break;
            default: tq_fa_decode_kernel<D, 8, TK, TV><<<grid, TQ_FA_THREADS>>>(p); break;
        }
    }
    if (mma == 2 || p.dst != nullptr || p.done != nullptr) {
        return; // kernel alone, no merge (or the single pass / the fused merge: no merge to run)
    }
    tq_fa_merge_kernel<D, tq_fa_block_n(TV)><<<tq_fa_merge_blocks(p.n_cols_total, n_chunks), 128>>>(p.part, p.ml, sinks, (char *) dst, nb1, nb2, nb3, n_chunks,
                                                        p.n_cols_total, p.ncol, p.n_groups, n_kvh, p.tpg, p.gqa,
                                                        p.n_q, p.tab);
}

template <int D>
static void launch_kinds(int tk, int tv, int mma, tq_fa_params & p, int n_chunks, int n_kvh, int n_seq, float * dst,
                         int64_t nb1, int64_t nb2, int64_t nb3) {
    if (tk == TQFA_TQ3 && tv == TQFA_TQ3) launch<D, TQFA_TQ3, TQFA_TQ3>(mma, p, n_chunks, n_kvh, n_seq, nullptr, dst, nb1, nb2, nb3);
    if (tk == TQFA_TQ3 && tv == TQFA_TQ4) launch<D, TQFA_TQ3, TQFA_TQ4>(mma, p, n_chunks, n_kvh, n_seq, nullptr, dst, nb1, nb2, nb3);
    if (tk == TQFA_TQ4 && tv == TQFA_TQ3) launch<D, TQFA_TQ4, TQFA_TQ3>(mma, p, n_chunks, n_kvh, n_seq, nullptr, dst, nb1, nb2, nb3);
    if (tk == TQFA_TQ4 && tv == TQFA_TQ4) launch<D, TQFA_TQ4, TQFA_TQ4>(mma, p, n_chunks, n_kvh, n_seq, nullptr, dst, nb1, nb2, nb3);
    // mixed pairs with an f16 side: the SIMT kernel
    if (tk == TQFA_F16 && tv == TQFA_TQ3) launch<D, TQFA_F16, TQFA_TQ3>(0, p, n_chunks, n_kvh, n_seq, nullptr, dst, nb1, nb2, nb3);
    if (tk == TQFA_F16 && tv == TQFA_TQ4) launch<D, TQFA_F16, TQFA_TQ4>(0, p, n_chunks, n_kvh, n_seq, nullptr, dst, nb1, nb2, nb3);
    if (tk == TQFA_TQ3 && tv == TQFA_F16) launch<D, TQFA_TQ3, TQFA_F16>(0, p, n_chunks, n_kvh, n_seq, nullptr, dst, nb1, nb2, nb3);
    if (tk == TQFA_TQ4 && tv == TQFA_F16) launch<D, TQFA_TQ4, TQFA_F16>(0, p, n_chunks, n_kvh, n_seq, nullptr, dst, nb1, nb2, nb3);
}
// The 64-value kinds (head 64; SIMT kernel only).
static void launch_kinds64(int tk, int tv, tq_fa_params & p, int n_chunks, int n_kvh, int n_seq, float * dst,
                           int64_t nb1, int64_t nb2, int64_t nb3) {
    if (tk == TQFA_TQ3_64 && tv == TQFA_TQ3_64) launch<64, TQFA_TQ3_64, TQFA_TQ3_64>(0, p, n_chunks, n_kvh, n_seq, nullptr, dst, nb1, nb2, nb3);
    if (tk == TQFA_TQ3_64 && tv == TQFA_TQ4_64) launch<64, TQFA_TQ3_64, TQFA_TQ4_64>(0, p, n_chunks, n_kvh, n_seq, nullptr, dst, nb1, nb2, nb3);
    if (tk == TQFA_TQ4_64 && tv == TQFA_TQ3_64) launch<64, TQFA_TQ4_64, TQFA_TQ3_64>(0, p, n_chunks, n_kvh, n_seq, nullptr, dst, nb1, nb2, nb3);
    if (tk == TQFA_TQ4_64 && tv == TQFA_TQ4_64) launch<64, TQFA_TQ4_64, TQFA_TQ4_64>(0, p, n_chunks, n_kvh, n_seq, nullptr, dst, nb1, nb2, nb3);
}

static bool run_case(const Case & cs, int nsm, std::mt19937 & rng, double copy_gbs) {
    const int D = cs.D, BN = kblock(cs.tk == TQFA_F16 ? cs.tv : cs.tk);
    const bool only_simt = tq_fa_is_tq64(cs.tk) || cs.tk == TQFA_F16 || cs.tv == TQFA_F16;
    const int n_head = cs.n_kvh * cs.gqa;
    const int kb = kbits(cs.tk), vb = kbits(cs.tv);
    const int64_t krb = (int64_t) row_bytes(kb, BN, D), vrb = (int64_t) row_bytes(vb, BN, D);
    const int64_t rows = (int64_t) cs.n_kv * cs.n_kvh;

    // K with a per-channel offset and spread (real keys are not isotropic), V plain Gaussian
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> chan(D);
    for (int d = 0; d < D; ++d) {
        chan[d] = 0.5f + 2.0f * (float) (d % 7) / 7.0f;
    }
    std::vector<float> kf(rows * D), vf(rows * D), qf((size_t) D * cs.n_q * n_head * cs.n_seq);
    for (int64_t i = 0; i < rows * D; ++i) {
        kf[i] = nd(rng) * chan[i % D] + 0.3f;
        vf[i] = nd(rng);
    }
    for (auto & q : qf) {
        q = nd(rng);
    }
    std::vector<uint8_t> kq, vq;
    quantize_rows(kb, BN, kf, kq, rows, D); // row r = token t * n_kvh + head: ggml's [D, n_kvh, n_kv] cache order
    quantize_rows(vb, BN, vf, vq, rows, D);
    std::vector<uint16_t> maskh;
    std::vector<float> maskf;
    if (cs.mask) {
        maskh.resize((size_t) cs.n_kv * cs.n_q);
        maskf.resize(maskh.size());
        std::uniform_real_distribution<float> ud(0.0f, 1.0f);
        for (size_t i = 0; i < maskh.size(); ++i) {
            const float u = ud(rng);
            const float m = cs.open > 0 ? ((int) (i % cs.n_kv) < cs.open ? u - 0.5f : -INFINITY)
                                        : u < 0.2f ? -INFINITY : (u - 0.5f);
            const __half h = __float2half(m);
            memcpy(&maskh[i], &h, 2);
            maskf[i] = __half2float(h);
        }
    }

    char *dK, *dV, *dQ, *dM = nullptr;
    float * dO;
    CK(cudaMalloc(&dK, kq.size()));
    CK(cudaMalloc(&dV, vq.size()));
    CK(cudaMalloc(&dQ, qf.size() * 4));
    CK(cudaMalloc(&dO, qf.size() * 4));
    CK(cudaMemcpy(dK, kq.data(), kq.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dV, vq.data(), vq.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dQ, qf.data(), qf.size() * 4, cudaMemcpyHostToDevice));
    if (cs.mask) {
        CK(cudaMalloc(&dM, maskh.size() * 2));
        CK(cudaMemcpy(dM, maskh.data(), maskh.size() * 2, cudaMemcpyHostToDevice));
    }

    tq_fa_params p;
    memset(&p, 0, sizeof p);
    p.Q = dQ; p.K = dK; p.V = dV; p.mask = dM;
    p.nb01 = 4 * D; p.nb02 = p.nb01 * cs.n_q; p.nb03 = p.nb02 * n_head;
    p.nb11 = krb * cs.n_kvh; p.nb12 = krb; p.nb13 = p.nb11 * cs.n_kv;
    p.nb21 = vrb * cs.n_kvh; p.nb22 = vrb; p.nb23 = p.nb21 * cs.n_kv;
    p.nb31 = 2 * cs.n_kv; p.nb32 = p.nb31 * cs.n_q; p.nb33 = p.nb32;
    p.ne32 = 1; p.ne33 = 1;
    p.n_kv = cs.n_kv; p.n_q = cs.n_q; p.gqa = cs.gqa; p.n_head = n_head; p.rk3 = cs.n_seq; p.rv3 = cs.n_seq;
    const float scale0 = 1.0f / sqrtf((float) D);
    p.scale = cs.softcap != 0.0f ? scale0 / cs.softcap : scale0;
    p.softcap = cs.softcap;
    p.max_bias = 0.0f;
    p.n_head_log2 = 1;
    tq_cu_tables_init(&p.tab);
    const int need = cs.n_q * cs.gqa;
    p.tpg = need <= TQ_FA_MAX_COLS ? cs.n_q : std::max(1, TQ_FA_MAX_COLS / cs.gqa);
    const int cols = p.tpg * cs.gqa;
    p.ncol = cols <= 1 ? 1 : cols <= 2 ? 2 : cols <= 4 ? 4 : 8;
    p.n_groups = (cs.n_q + p.tpg - 1) / p.tpg;
    p.n_cols_total = cs.n_seq * cs.n_kvh * p.n_groups * p.ncol;
    const int base = cs.n_kvh * p.n_groups * cs.n_seq;
    const int tiles = std::max(1, (cs.n_kv + TQ_FA_TILE - 1) / TQ_FA_TILE);
    const int want = cs.chunks > 0 ? std::min(tiles, cs.chunks) : tq_fa_want_chunks(tiles, base, nsm, true);
    p.chunk_keys = TQ_FA_TILE * ((tiles + want - 1) / want);
    const int n_chunks = std::max(1, (cs.n_kv + p.chunk_keys - 1) / p.chunk_keys);
    CK(cudaMalloc(&p.part, sizeof(float) * (size_t) n_chunks * p.n_cols_total * D));
    CK(cudaMalloc(&p.ml, sizeof(float2) * (size_t) n_chunks * p.n_cols_total));
    const int64_t onb1 = 4 * D, onb2 = onb1 * n_head, onb3 = onb2 * cs.n_q;

    // CPU reference for a sample of output rows (all of them for small cases)
    struct Col { int z, h, q; };
    std::vector<Col> check;
    for (int z = 0; z < cs.n_seq; ++z) {
        for (int h = 0; h < n_head; ++h) {
            for (int q = 0; q < cs.n_q; ++q) {
                if (!cs.perf || (h % 7 == 0 && q == 0 && z == cs.n_seq - 1)) {
                    check.push_back({z, h, q});
                }
            }
        }
    }
    std::vector<std::vector<double>> ref(check.size(), std::vector<double>(D));
    {
        const int nt = (int) std::max(1u, std::thread::hardware_concurrency());
        std::vector<std::thread> th;
        for (int i = 0; i < nt; ++i) {
            th.emplace_back([&, i] {
                std::vector<float> kr(D), vr(D);
                std::vector<double> s(cs.n_kv);
                for (size_t c = i; c < check.size(); c += nt) {
                    const Col & cl = check[c];
                    const float * q = qf.data() + ((size_t) (cl.z * n_head + cl.h) * cs.n_q + cl.q) * D;
                    const int kvh = cl.h / cs.gqa;
                    double mx = -INFINITY;
                    for (int t = 0; t < cs.n_kv; ++t) {
                        dequantize_row(kb, BN, kq.data() + ((int64_t) t * cs.n_kvh + kvh) * krb, kr.data(), D);
                        double dot = 0.0;
                        for (int d = 0; d < D; ++d) {
                            dot += (double) q[d] * kr[d];
                        }
                        dot *= scale0;
                        if (cs.softcap != 0.0f) {
                            dot = cs.softcap * tanh(dot / cs.softcap);
                        }
                        if (cs.mask) {
                            dot += maskf[(size_t) cl.q * cs.n_kv + t];
                        }
                        s[t] = dot;
                        mx = std::max(mx, dot);
                    }
                    double l = 0.0;
                    std::vector<double> & o = ref[c];
                    std::fill(o.begin(), o.end(), 0.0);
                    for (int t = 0; t < cs.n_kv; ++t) {
                        if (s[t] == -INFINITY) {
                            continue;
                        }
                        const double w = exp(s[t] - mx);
                        l += w;
                        dequantize_row(vb, BN, vq.data() + ((int64_t) t * cs.n_kvh + kvh) * vrb, vr.data(), D);
                        for (int d = 0; d < D; ++d) {
                            o[d] += w * vr[d];
                        }
                    }
                    for (int d = 0; d < D; ++d) {
                        o[d] /= l;
                    }
                }
            });
        }
        for (auto & t : th) {
            t.join();
        }
    }

    bool ok = true;
    float us[3] = {0, 0, 0};
    double err[2] = {0, 0};
    for (int mma = 0; mma < (only_simt ? 1 : cs.perf ? 3 : 2); ++mma) {
        CK(cudaMemset(dO, 0xff, qf.size() * 4)); // NaN: an unwritten output fails the check
        auto go = [&] {
            if (D == 64) {
                launch_kinds64(cs.tk, cs.tv, p, n_chunks, cs.n_kvh, cs.n_seq, dO, onb1, onb2, onb3);
            } else if (D == 128) {
                launch_kinds<128>(cs.tk, cs.tv, mma, p, n_chunks, cs.n_kvh, cs.n_seq, dO, onb1, onb2, onb3);
            } else {
                launch_kinds<256>(cs.tk, cs.tv, mma, p, n_chunks, cs.n_kvh, cs.n_seq, dO, onb1, onb2, onb3);
            }
        };
        go();
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        std::vector<float> out(qf.size());
        CK(cudaMemcpy(out.data(), dO, out.size() * 4, cudaMemcpyDeviceToHost));
        double e = 0.0, mag = 0.0;
        for (size_t c = 0; c < check.size(); ++c) {
            const Col & cl = check[c];
            const float * o = out.data() + ((size_t) (cl.z * cs.n_q + cl.q) * n_head + cl.h) * D;
            for (int d = 0; d < D; ++d) {
                const double diff = std::isnan(o[d]) ? INFINITY : fabs(o[d] - ref[c][d]);
                e = std::max(e, diff);
                mag = std::max(mag, fabs(ref[c][d]));
            }
        }
        if (mma < 2) {
            err[mma] = e / std::max(mag, 1e-30);
            if (!(err[mma] < 5e-3)) {
                ok = false;
            }
        }
        if (cs.perf) {
            cudaEvent_t a, b;
            CK(cudaEventCreate(&a));
            CK(cudaEventCreate(&b));
            for (int i = 0; i < 5; ++i) {
                go();
            }
            const int iters = 50;
            CK(cudaEventRecord(a));
            for (int i = 0; i < iters; ++i) {
                go();
            }
            CK(cudaEventRecord(b));
            CK(cudaEventSynchronize(b));
            float ms;
            CK(cudaEventElapsedTime(&ms, a, b));
            us[mma] = 1000.0f * ms / iters;
        }
    }
    const double bytes = (double) cs.n_seq * cs.n_kv * cs.n_kvh * (krb + vrb);
    printf("D%-3d %s/%s kv %6d kvh %d gqa %d q %d seq %d mask %d softcap %4.1f chunks %4d | rel.err simt %.2e mma %.2e %s",
           D, kname(cs.tk), kname(cs.tv), cs.n_kv, cs.n_kvh, cs.gqa, cs.n_q, cs.n_seq, (int) cs.mask, cs.softcap,
           n_chunks, err[0], err[1], ok ? "ok" : "MISMATCH");
    if (cs.perf && only_simt) {
        printf(" | simt %7.1f us  KV read %.2f TB/s = %.0f %% of copy", us[0], bytes / (us[0] * 1e-6) / 1e12,
               100.0 * bytes / (us[0] * 1e-6) / (copy_gbs * 1e9));
    } else if (cs.perf) {
        printf(" | simt %7.1f us  mma %7.1f us (kernel alone %6.1f)  %.2fx  mma KV read %.2f TB/s = %.0f %% of copy",
               us[0], us[1], us[2], us[0] / us[1], bytes / (us[1] * 1e-6) / 1e12, 100.0 * bytes / (us[1] * 1e-6) / (copy_gbs * 1e9));
    }
    printf("\n");
    fflush(stdout);
    cudaFree(dK); cudaFree(dV); cudaFree(dQ); cudaFree(dO); cudaFree(p.part); cudaFree(p.ml);
    if (dM) {
        cudaFree(dM);
    }
    return ok;
}

int main(int argc, char ** argv) {
    const bool perf_only = argc > 1 && (strcmp(argv[1], "perf") == 0 || strcmp(argv[1], "short") == 0 ||
                                        strcmp(argv[1], "phases") == 0 || strcmp(argv[1], "depth") == 0);
    int nsm;
    CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    const double gbs = copy_bandwidth();
    printf("device SMs %d, copy bandwidth %.0f GB/s\n", nsm, gbs);
    std::mt19937 rng(42);
    const int kinds[4][2] = {{TQFA_TQ3, TQFA_TQ3}, {TQFA_TQ4, TQFA_TQ4}, {TQFA_TQ3, TQFA_TQ4}, {TQFA_TQ4, TQFA_TQ3}};
    bool ok = true;
    // the host's chunking: one KV head / GQA 4, GQA 1 with 3 rows and 2 sequences, GQA 8, softcap, 8 query rows
    auto chunked_cases = [&](int D, int tk, int tv) {
        ok &= run_case({D, 113, 2, 4, 1, 1, tk, tv, false, 0.0f, false}, nsm, rng, gbs);
        ok &= run_case({D, 1000, 2, 1, 3, 2, tk, tv, true, 0.0f, false}, nsm, rng, gbs);
        ok &= run_case({D, 4096, 1, 8, 1, 1, tk, tv, true, 0.0f, false}, nsm, rng, gbs);
        ok &= run_case({D, 777, 2, 4, 2, 1, tk, tv, true, 30.0f, false}, nsm, rng, gbs);
        ok &= run_case({D, 2000, 1, 2, 8, 1, tk, tv, false, 0.0f, false}, nsm, rng, gbs);
    };
    if (!perf_only) {
        for (auto & k : kinds) {
            for (int D : {128, 256}) {
                chunked_cases(D, k[0], k[1]);
                // one chunk: the tensor-core kernel's single pass (normalizes, un-rotates and writes dst itself)
                ok &= run_case({D, 1000, 2, 1, 3, 2, k[0], k[1], true, 0.0f, false, 1}, nsm, rng, gbs);
                ok &= run_case({D, 777, 2, 4, 2, 1, k[0], k[1], true, 30.0f, false, 1}, nsm, rng, gbs);
                ok &= run_case({D, 300, 1, 2, 8, 1, k[0], k[1], false, 0.0f, false, 1}, nsm, rng, gbs);
            }
        }
    }
    const int kinds16[4][2] = {{TQFA_F16, TQFA_TQ3}, {TQFA_F16, TQFA_TQ4}, {TQFA_TQ3, TQFA_F16}, {TQFA_TQ4, TQFA_F16}};
    if (!perf_only) {
        for (auto & k : kinds16) {
            for (int D : {128, 256}) {
                chunked_cases(D, k[0], k[1]);
            }
        }
    }
    const int kinds64[4][2] = {{TQFA_TQ3_64, TQFA_TQ3_64}, {TQFA_TQ4_64, TQFA_TQ4_64}, {TQFA_TQ3_64, TQFA_TQ4_64},
                               {TQFA_TQ4_64, TQFA_TQ3_64}};
    if (!perf_only) {
        for (auto & k : kinds64) {
            chunked_cases(64, k[0], k[1]);
        }
    }
    if (argc > 1 && strcmp(argv[1], "phases") == 0) { // where a single-pass block's time goes at depth 0
#ifdef TQ_FA_PHASES
        int khz;
        CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
        for (auto & k : kinds) {
            for (int open : {16, 64, 128}) {
                ok &= run_case(Case{128, 256, 8, 4, 1, 1, k[0], k[1], true, 0.0f, true, 1, open}, nsm, rng, gbs);
                long long clk[64][8];
                CK(cudaMemcpyFromSymbol(clk, tq_fa_phase_clk, sizeof clk));
                double m[7] = {0};
                for (int b = 0; b < 8; ++b) {
                    for (int i = 1; i < 7; ++i) {
                        m[i] += (double) (clk[b][i] - clk[b][0]) / 8.0 / (khz * 1e-3);
                    }
                }
                printf("  open %3d: us from block entry (thread 0, mean of 8 blocks, %.2f GHz clock): tables+q load+mask "
                       "scan %.2f | q rotation %.2f | q fragments %.2f | tiles %.2f | warp merge %.2f | output %.2f\n",
                       open, khz * 1e-6, m[1], m[2], m[3], m[4], m[5], m[6]);
            }
        }
        return ok ? 0 : 1;
#else
        fprintf(stderr, "build with -DTQ_FA_PHASES\n");
        return 2;
#endif
    }
    if (argc > 1 && strcmp(argv[1], "short") == 0) { // decode at short KV (llama-bench tg at depth 0): chunks vs single pass
        for (auto & k : kinds) {
            for (int kv : {256, 512, 1024, 2048}) {
                for (int ch : {0, 1}) {
                    ok &= run_case(Case{128, kv, 4, 4, 1, 1, k[0], k[1], true, 0.0f, true, ch}, nsm, rng, gbs);
                }
            }
        }
        printf("%s\n", ok ? "all cases match the C codec reference" : "MISMATCH");
        return ok ? 0 : 1;
    }
    if (argc > 1 && strcmp(argv[1], "depth") == 0) { // llama-bench's decode (1 seq, 4 KV heads, GQA 4) by chunk count
        for (auto & k : {kinds[0], kinds[1]}) {
            for (int kv : {2048, 8192, 32768}) {
                for (int ch : {0, 4, 8, 16, 32, 64, 128}) {
                    ok &= run_case(Case{128, kv, 4, 4, 1, 1, k[0], k[1], true, 0.0f, true, ch}, nsm, rng, gbs);
                }
            }
        }
        printf("%s\n", ok ? "all cases match the C codec reference" : "MISMATCH");
        return ok ? 0 : 1;
    }
    const bool tq_only = argc > 2 && strcmp(argv[2], "tq") == 0; // perf tq: the 12 TQ-pair cases (kernel_ab)
    const int only = argc > 2 && !tq_only ? atoi(argv[2]) : -1; // perf N: only the N-th perf case (for profilers)
    int n = 0;
    for (auto & k : kinds) {
        for (const Case & c : {Case{128, 32768, 8, 4, 1, 4, k[0], k[1], true, 0.0f, true},
                               Case{128, 32768, 4, 4, 1, 1, k[0], k[1], true, 0.0f, true},
                               Case{256, 32768, 8, 4, 1, 4, k[0], k[1], true, 0.0f, true}}) {
            if (only < 0 || only == n) {
                ok &= run_case(c, nsm, rng, gbs);
            }
            ++n;
        }
    }
    for (auto & k : kinds16) {
        for (const Case & c : {Case{128, 32768, 8, 4, 1, 4, k[0], k[1], true, 0.0f, true},
                               Case{256, 32768, 8, 4, 1, 4, k[0], k[1], true, 0.0f, true}}) {
            if (!tq_only && (only < 0 || only == n)) {
                ok &= run_case(c, nsm, rng, gbs);
            }
            ++n;
        }
    }
    for (auto & k : kinds64) {
        if (!tq_only && (only < 0 || only == n)) {
            ok &= run_case(Case{64, 32768, 8, 4, 1, 4, k[0], k[1], true, 0.0f, true}, nsm, rng, gbs);
        }
        ++n;
    }
    printf("%s\n", ok ? "all cases match the C codec reference" : "MISMATCH");
    return ok ? 0 : 1;
}
