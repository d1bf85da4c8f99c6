// FLASH_ATTN_EXT decode with TQ K and/or V: host side (launch, kernel choice); kernels in tq-fattn-decode.cuh
// (SIMT, any pair with a TQ side) and tq-fattn-mma.cuh (tensor cores, TQ K with TQ V).
#pragma once

#include "ggml-tq-cuda.cuh"
#include "tq-fattn-decode.cuh"
#include "tq-fattn-mma.cuh"

// Host side: one entry per K kind (tq-fattn-k*.cu instantiate them), V kind and head size chosen inside.
template <int TK>
void tq_fa_run(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
template <> void tq_fa_run<TQFA_F16>(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
template <> void tq_fa_run<TQFA_Q8_0>(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
#define TQFA_RUN_DECL(name, NAME, ...) template <> void tq_fa_run<TQFA_##NAME>(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
TQ_FORMATS(TQFA_RUN_DECL)
#undef TQFA_RUN_DECL

int tq_fa_kind_of(ggml_type t);

template <int D, int C, int TK, int TV>
static void tq_fa_launch(ggml_backend_cuda_context & ctx, ggml_tensor * dst, tq_fa_params & p, int n_chunks,
                         int n_kvh, int n_seq) {
    cudaStream_t stream = ctx.stream();
    ggml_cuda_pool_alloc<float>  part(ctx.pool(), (size_t) n_chunks * p.n_cols_total * D);
    ggml_cuda_pool_alloc<float2> ml(ctx.pool(), (size_t) n_chunks * p.n_cols_total);
    p.part = part.get();
    p.ml   = ml.get();
    const dim3 grid(n_chunks, n_kvh * p.n_groups, n_seq);
    const ggml_tensor * sinks = dst->src[4];
    bool mma = false; // both sides TQ (128-value blocks) on sm_80 or newer: tensor cores
    if constexpr (tq_fa_is_tq128(TK) && tq_fa_is_tq128(TV)) {
        if (ampere_mma_available(ggml_cuda_info().devices[ctx.device].cc)) {
            p.done = n_chunks > 1 ? ggml_cuda_tq_fa_counters(ctx, (size_t) grid.y * grid.z) : nullptr;
            if (n_chunks == 1 || p.done != nullptr) { // the kernel writes dst: single pass, or the fused merge
                (n_chunks == 1 ? p.dst : p.mdst) = (char *) dst->data;
                p.dnb1 = dst->nb[1]; p.dnb2 = dst->nb[2]; p.dnb3 = dst->nb[3];
                p.sinks = sinks ? (const float *) sinks->data : nullptr;
            }
            tq_launch(tq_fa_mma_kernel<D, TK, TV>, grid, TQ_MMA_WARPS * 32, stream, p);
            mma = true;
        }
    }
    if (!mma) {
        tq_fa_decode_kernel<D, C, TK, TV><<<grid, TQ_FA_THREADS, 0, stream>>>(p);
    }
    CUDA_CHECK(cudaGetLastError());
    if (p.dst != nullptr || p.done != nullptr) {
        return;
    }
    tq_fa_merge_kernel<D, tq_fa_block_n(TV)><<<tq_fa_merge_blocks(p.n_cols_total, n_chunks), 128, 0, stream>>>(
        p.part, p.ml, sinks ? (const float *) sinks->data : nullptr, (char *) dst->data, dst->nb[1], dst->nb[2],
        dst->nb[3], n_chunks, p.n_cols_total, C, p.n_groups, n_kvh, p.tpg, p.gqa, p.n_q, p.tab);
    CUDA_CHECK(cudaGetLastError());
}

// mma: the tensor-core kernel will run (it has a single-pass path for short KV)
void tq_fa_fill_params(ggml_backend_cuda_context & ctx, const ggml_tensor * dst, tq_fa_params & p, int & C,
                       int & n_chunks, int & n_kvh, int & n_seq, bool mma);

template <int D, int TK, int TV>
static void tq_fa_run_dv(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    tq_fa_params p;
    int C, n_chunks, n_kvh, n_seq;
    const bool mma = tq_fa_is_tq128(TK) && tq_fa_is_tq128(TV) &&
                     ampere_mma_available(ggml_cuda_info().devices[ctx.device].cc);
    tq_fa_fill_params(ctx, dst, p, C, n_chunks, n_kvh, n_seq, mma);
    switch (C) {
        case 1: tq_fa_launch<D, 1, TK, TV>(ctx, dst, p, n_chunks, n_kvh, n_seq); break;
        case 2: tq_fa_launch<D, 2, TK, TV>(ctx, dst, p, n_chunks, n_kvh, n_seq); break;
        case 4: tq_fa_launch<D, 4, TK, TV>(ctx, dst, p, n_chunks, n_kvh, n_seq); break;
        default: tq_fa_launch<D, 8, TK, TV>(ctx, dst, p, n_chunks, n_kvh, n_seq); break;
    }
}

// Head sizes: TQ_FA_HEADS's CUDA rows (tq_formats.h), which ggml_cuda_tq_fattn_handles admits.
static constexpr bool tq_cstr_eq(const char * a, const char * b) {
    return *a == *b && (*a == '\0' || tq_cstr_eq(a + 1, b + 1));
}

template <int TK, int TV>
static void tq_fa_run_v(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const int D = (int) dst->src[0]->ne[0];
#define TQ_FA_RUN_HEAD(b, v, h)                                                  \
    if constexpr (tq_fa_slice(TK, TV) == (v) && tq_cstr_eq(#b, "CUDA")) {        \
        if (D == (h)) {                                                          \
            tq_fa_run_dv<h, TK, TV>(ctx, dst);                                   \
            return;                                                              \
        }                                                                        \
    }
    TQ_FA_HEADS(TQ_FA_RUN_HEAD)
#undef TQ_FA_RUN_HEAD
    GGML_ABORT("llama-tq: no CUDA flash-attention kernel for head size %d (ggml_cuda_tq_fattn_handles admits it)", D);
}

// The pairs: a TQ K with f16, q8_0 (not for the 96-value kinds: see ggml_cuda_tq_fattn_handles) or a TQ V of the
// same block size; f16 / q8_0 K with any TQ V.
#define TQ_FA_RUN_PAIR(TK, TV)                                                                                   \
    case TV:                                                                                                     \
        if constexpr ((tq_fa_is_tq(TK) || tq_fa_is_tq(TV)) && tq_fa_pair_ok(TK, TV) &&                           \
                      !(tq_fa_is_tq96(TK) && !tq_fa_is_tq(TV))) {                                                \
            tq_fa_run_v<TK, TV>(ctx, dst);                                                                       \
        }                                                                                                        \
        break;
#define TQ_FA_RUN_V_KIND(name, NAME, ...) TQ_FA_RUN_PAIR(TK, TQFA_##NAME)
#define TQ_FA_DEFINE_RUN(KIND)                                                         \
    template <> void tq_fa_run<KIND>(ggml_backend_cuda_context & ctx, ggml_tensor * dst) { \
        constexpr int TK = KIND;                                                       \
        switch (tq_fa_kind_of(dst->src[2]->type)) {                                    \
            TQ_FA_RUN_PAIR(TK, TQFA_F16)                                               \
            TQ_FA_RUN_PAIR(TK, TQFA_Q8_0)                                              \
            TQ_FORMATS(TQ_FA_RUN_V_KIND)                                               \
            default: break;                                                            \
        }                                                                              \
    }
