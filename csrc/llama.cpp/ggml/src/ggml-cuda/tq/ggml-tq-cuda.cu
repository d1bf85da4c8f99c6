// llama-tq: ggml-cuda glue for TQ3/TQ4: quantize on write (SET_ROWS, CPY), dequantize (GET_ROWS, CPY, the
// to_fp16/to_fp32 converters that the FA prefill path and cuBLAS use), MUL_MAT for -fa off, FA decode dispatch.
#include "ggml-tq-cuda.cuh"

#include <cstring>
#include <map>
#include <mutex>

#include "fattn.cuh"
#include "tq-cuda-codec.cuh"
#include "tq-cuda-convert.cuh"
#include "tq-cuda-tq3a.cuh"
#include "tq-fattn.cuh"

// The kernels' tables, filled from the C codec once (INIT: tq_cu_tables_init or tq3a_cu_tables_init).
template <typename T, void (*INIT)(T *)>
static const T & tq_tables_of() {
    static const T t = [] {
        T v;
        INIT(&v);
        return v;
    }();
    return t;
}
static const tq_cu_tables & tq_tables() { return tq_tables_of<tq_cu_tables, tq_cu_tables_init>(); }
static const tq3a_cu_tables & tq3a_tables() { return tq_tables_of<tq3a_cu_tables, tq3a_cu_tables_init>(); }

// ---------------------------------------------------------------------------------------------------------
// Quantize rows: one CTA of N threads per N-value block (N = 128, 64 for TQ3_64 / TQ4_64, 96 for TQ3_96 / TQ4_96; a decode step
// writes a few blocks per launch, so the latency of one block is what counts). Row i1 of the source goes to row
// ids[i1] (SET_ROWS) or i1 (CPY). Dequantize: one warp per block.

static int tq_block_n_of(ggml_type t) { return (int) ggml_blck_size(t); }
static int tq_bits_of(ggml_type t) {
    switch (t) {
#define TQ_BITS_CASE(name, NAME, values, bits, ...) case GGML_TYPE_##NAME: return bits;
        TQ_FORMATS(TQ_BITS_CASE)
#undef TQ_BITS_CASE
        default: GGML_ABORT("not a TQ type");
    }
}

struct tq_rows_shape {
    int64_t nblk;          // blocks per row
    int64_t ne1, ne2, ne3; // rows of the source
    int64_t s1, s2, s3;    // source strides (bytes)
    int64_t d1, d2, d3;    // destination strides (bytes)
    int64_t i0, i1, i2;    // index strides (bytes); SET_ROWS only
    int64_t ine1, ine2;    // index broadcast sizes
};

// Where block g (of all rows) sits: block ib of row i1 of plane (i2, i3). False past the last block.
struct tq_rows_pos {
    int64_t ib, i1, i2, i3;
};
static __device__ __forceinline__ bool tq_rows_locate(const tq_rows_shape & sh, int64_t g, tq_rows_pos & p) {
    if (g >= sh.nblk * sh.ne1 * sh.ne2 * sh.ne3) {
        return false;
    }
    p.ib = g % sh.nblk;
    int64_t r = g / sh.nblk;
    p.i1 = r % sh.ne1;
    r /= sh.ne1;
    p.i2 = r % sh.ne2;
    p.i3 = r / sh.ne2;
    return true;
}

// The row index that SET_ROWS/GET_ROWS read for position p (index tensor broadcast over planes).
template <typename idx_t>
static __device__ __forceinline__ int64_t tq_rows_id(const char * ids, const tq_rows_shape & sh, const tq_rows_pos & p) {
    return (int64_t) *reinterpret_cast<const idx_t *>(ids + p.i1 * sh.i0 + (p.i2 % sh.ine1) * sh.i1 + (p.i3 % sh.ine2) * sh.i2);
}

// K's RoPE folded into the K write (ggml_cuda_tq_try_fuse): the write reads the ROPE's input x [D, H, T] and
// rotates each value as ggml-cuda's rope_norm / rope_neox do (same expressions and flags, so the same floats);
// modes norm and neox, f32, no offset. x == nullptr: no RoPE in the write.
struct tq_rope_fold {
    const char * x = nullptr;
    int64_t nb1 = 0, nb2 = 0;       // x's head and token strides (bytes)
    const int32_t * pos = nullptr;  // one position per token
    const float * ff = nullptr;     // frequency factors (n_dims / 2) or nullptr
    int D = 0, n_dims = 0;
    bool neox = false;
    float theta_scale = 0, freq_scale = 0, ext_factor = 0, attn_factor = 0, corr0 = 0, corr1 = 0;
};

// rope.cu's rope_yarn (forward), which is static there
static __device__ __forceinline__ void tq_rope_yarn(const tq_rope_fold & r, float theta_extrap, int i0, float & c,
                                                    float & s) {
    const float theta_interp = r.freq_scale * theta_extrap;
    float theta = theta_interp;
    float mscale = r.attn_factor;
    if (r.ext_factor != 0.0f) {
        const float y = (i0 / 2 - r.corr0) / max(0.001f, r.corr1 - r.corr0);
        const float ramp_mix = (1.0f - min(1.0f, max(0.0f, y))) * r.ext_factor;
        theta = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix;
        mscale *= 1.0f + 0.1f * logf(1.0f / r.freq_scale);
    }
    c = cosf(theta) * mscale;
    s = sinf(theta) * mscale;
}

// Value e (head e / D, channel e % D) of token t after the RoPE.
static __device__ __forceinline__ float tq_rope_value(const tq_rope_fold & r, int64_t t, int e) {
    const int h = e / r.D, c = e - h * r.D;
    const float * x = reinterpret_cast<const float *>(r.x + t * r.nb2 + h * r.nb1);
    if (c >= r.n_dims) {
        return x[c];
    }
    const int half = r.n_dims / 2;
    bool first;
    int ic;
    float x0, x1;
    if (r.neox) { // pairs (i, i + n_dims / 2)
        first = c < half;
        ic = first ? c : c - half;
        x0 = x[ic];
        x1 = x[ic + half];
    } else {      // pairs (2i, 2i + 1)
        first = (c & 1) == 0;
        ic = c >> 1;
        x0 = x[2 * ic];
        x1 = x[2 * ic + 1];
    }
    const int iw = 2 * ic;
    const float theta_base = r.pos[t] * powf(r.theta_scale, iw / 2.0f);
    const float freq_factor = r.ff != nullptr ? r.ff[ic] : 1.0f;
    float cos_theta, sin_theta;
    tq_rope_yarn(r, theta_base / freq_factor, iw, cos_theta, sin_theta);
    return first ? x0 * cos_theta - x1 * sin_theta : x0 * sin_theta + x1 * cos_theta;
}

// Block g of a rows job: every thread of the CTA calls it (the quantizer synchronizes the CTA); the tables are in
// shared memory (t) but not yet synchronized. mu / s (optional, one value per element of a source row): the key
// transforms' SUB and MUL folded in, x' = (x - mu) * s, in IEEE f32 as the graph's nodes compute them. rope
// (optional): the source row is the RoPE of rope->x's row (then src is not read). shadow (optional): the block's
// bytes go there instead (k_tq3a_quantize_kv's second half).
template <int BITS, int N, typename src_t, typename idx_t>
static __device__ __forceinline__ void tq_quantize_rows_block(const tq_cu_tables & t, tq_cu_qscratch & sm,
                                                              const char * src, const char * ids, char * dst,
                                                              const tq_rows_shape & sh, int64_t g, int tid,
                                                              const float * mu = nullptr, const float * s = nullptr,
                                                              const tq_rope_fold * rope = nullptr,
                                                              uint8_t * shadow = nullptr) {
    tq_rows_pos p;
    if (!tq_rows_locate(sh, g, p)) {
        return; // uniform over the CTA
    }
    const int64_t row = ids ? tq_rows_id<idx_t>(ids, sh, p) : p.i1;
    float v;
    if (rope != nullptr && rope->x != nullptr) {
        v = tq_rope_value(*rope, p.i1, (int) (p.ib * N) + tid);
    } else {
        v = (float) reinterpret_cast<const src_t *>(src + p.i1 * sh.s1 + p.i2 * sh.s2 + p.i3 * sh.s3)[p.ib * N + tid];
    }
    if (mu != nullptr) {
        v = tq_fsub(v, mu[p.ib * N + tid]);
    }
    if (s != nullptr) {
        v = tq_fmul(v, s[p.ib * N + tid]);
    }
    uint8_t * out = shadow != nullptr ? shadow
                                      : reinterpret_cast<uint8_t *>(dst + row * sh.d1 + p.i2 * sh.d2 + p.i3 * sh.d3) +
                                            p.ib * tq_cu_block_bytes_n(BITS, N);
    __syncthreads(); // the tables
    if constexpr (N == TQ_BLOCK) {
        tq_cu_quantize_block<BITS>(t, v, out, sm, tid);
    } else if constexpr (N == TQ_BLOCK_96) {
        tq_cu_quantize_block96<BITS>(t, v, out, sm, tid);
    } else {
        tq_cu_quantize_block64<BITS>(t, v, out, sm, tid);
    }
}

template <int BITS, int N, typename src_t, typename idx_t>
static __global__ void __launch_bounds__(N) k_tq_quantize_rows(const char * src, const char * ids, char * dst,
                                                               const tq_rows_shape sh,
                                                               const __grid_constant__ tq_cu_tables tab) {
    __shared__ tq_cu_tables t;
    __shared__ tq_cu_qscratch sm;
    tq_cu_tables_load<N, tq_cu_table_words<N>()>(t, tab, threadIdx.x);
    tq_quantize_rows_block<BITS, N, src_t, idx_t>(t, sm, src, ids, dst, sh, blockIdx.x, threadIdx.x);
}

// TQ3A keys (tq-cuda-tq3a.cuh): a CTA of 256 threads per block, as the other types' writes but with its own tables
template <typename src_t, typename idx_t>
static __global__ void __launch_bounds__(TQ3A_BLOCK) k_tq3a_quantize_rows(const char * src, const char * ids, char * dst,
                                                                         const tq_rows_shape sh,
                                                                         const __grid_constant__ tq3a_cu_tables tab) {
    __shared__ tq3a_cu_tables t;
    __shared__ tq3a_cu_qscratch sm;
    tq3a_cu_tables_load<TQ3A_BLOCK>(t, tab, threadIdx.x);
    tq_rows_pos p;
    if (!tq_rows_locate(sh, blockIdx.x, p)) {
        return; // uniform over the CTA
    }
    const int64_t row = ids ? tq_rows_id<idx_t>(ids, sh, p) : p.i1;
    const float v = (float) reinterpret_cast<const src_t *>(src + p.i1 * sh.s1 + p.i2 * sh.s2 + p.i3 * sh.s3)[p.ib * TQ3A_BLOCK + threadIdx.x];
    uint8_t * out = reinterpret_cast<uint8_t *>(dst + row * sh.d1 + p.i2 * sh.d2 + p.i3 * sh.d3) + p.ib * TQ3A_BLOCK_BYTES;
    __syncthreads(); // the tables
    tq3a_cu_quantize_block(t, v, out, sm, threadIdx.x);
}

// A layer's K and V writes in one launch (ggml_cuda_tq_try_fuse): blocks [0, n0) quantize job 0 (bits B0), the
// others job 1 (bits B1). A decode step's write is a few blocks, so each launch costs one block's latency.
struct tq_rows_job {
    const char * src;
    const char * ids;
    char * dst;
    tq_rows_shape sh;
    int64_t n; // blocks
    const float * mu = nullptr; // folded key transforms (tq_quantize_rows_block)
    const float * s = nullptr;
    tq_rope_fold rope;          // folded RoPE (rope.x set)
};
template <int B0, int B1, int N, typename idx_t>
static __global__ void __launch_bounds__(N) k_tq_quantize_rows2(const __grid_constant__ tq_rows_job j0,
                                                                const __grid_constant__ tq_rows_job j1,
                                                                const __grid_constant__ tq_cu_tables tab) {
    __shared__ tq_cu_tables t;
    __shared__ tq_cu_qscratch sm;
    tq_cu_tables_load<N, tq_cu_table_words<N>()>(t, tab, threadIdx.x);
    tq_pdl_wait();
    tq_pdl_trigger(); // the FA kernel that reads these blocks may build its pair tables meanwhile
    if ((int64_t) blockIdx.x < j0.n) { // uniform over the CTA
        tq_quantize_rows_block<B0, N, float, idx_t>(t, sm, j0.src, j0.ids, j0.dst, j0.sh, blockIdx.x, threadIdx.x,
                                                    j0.mu, j0.s, &j0.rope);
    } else {
        tq_quantize_rows_block<B1, N, float, idx_t>(t, sm, j1.src, j1.ids, j1.dst, j1.sh, blockIdx.x - j0.n, threadIdx.x,
                                                    j1.mu, j1.s, &j1.rope);
    }
}

// A TQ3A K write with a decode step's key transforms folded in (ggml_cuda_tq_try_fuse: the RoPE, SUB, MUL and the
// calibrated order's GET_ROWS) and, when it follows, the layer's V write of 128-value TQ blocks (bits BV) in the same
// launch, on CTAs of 256 threads. Blocks [0, j0.n) quantize a key head each: value c is channel order[c] of the
// head, as the GET_ROWS gathers it. The others quantize one V block each on threads 0..127, while threads 128..255
// quantize the same block into shared memory: the quantizer's barriers are the whole CTA's, so both halves must take
// the same path through it (a non-finite block takes another).
template <int BV>
static __global__ void __launch_bounds__(TQ3A_BLOCK) k_tq3a_quantize_kv(const __grid_constant__ tq_rows_job j0,
                                                                       const int32_t * __restrict__ order,
                                                                       const __grid_constant__ tq_rows_job j1,
                                                                       const __grid_constant__ tq3a_cu_tables tab3a,
                                                                       const __grid_constant__ tq_cu_tables tab) {
    __shared__ tq3a_cu_tables ta;
    __shared__ tq_cu_tables t;
    __shared__ union {
        tq3a_cu_qscratch a;
        tq_cu_qscratch v[2];
    } sm;
    __shared__ uint8_t shadow[TQ4_BLOCK_BYTES];
    const int tid = threadIdx.x;
    tq3a_cu_tables_load<TQ3A_BLOCK>(ta, tab3a, tid);
    tq_cu_tables_load<TQ3A_BLOCK, tq_cu_table_words<TQ_BLOCK>()>(t, tab, tid);
    tq_pdl_wait();
    tq_pdl_trigger(); // the FA kernel that reads these blocks may build its tables meanwhile
    if ((int64_t) blockIdx.x >= j0.n) { // uniform over the CTA
        const int half = tid / TQ_BLOCK;
        tq_quantize_rows_block<BV, TQ_BLOCK, float, int64_t>(t, sm.v[half], j1.src, j1.ids, j1.dst, j1.sh,
                                                             blockIdx.x - j0.n, tid % TQ_BLOCK, nullptr, nullptr,
                                                             nullptr, half != 0 ? shadow : nullptr);
        return;
    }
    tq_rows_pos p;
    if (!tq_rows_locate(j0.sh, blockIdx.x, p)) {
        return; // uniform over the CTA
    }
    const int64_t row = tq_rows_id<int64_t>(j0.ids, j0.sh, p);
    const int e = (int) p.ib * TQ3A_BLOCK + order[p.ib * TQ3A_BLOCK + tid]; // the element of the source row
    float v = j0.rope.x != nullptr
                  ? tq_rope_value(j0.rope, p.i1, e)
                  : reinterpret_cast<const float *>(j0.src + p.i1 * j0.sh.s1 + p.i2 * j0.sh.s2 + p.i3 * j0.sh.s3)[e];
    if (j0.mu != nullptr) {
        v = tq_fsub(v, j0.mu[e]);
    }
    if (j0.s != nullptr) {
        v = tq_fmul(v, j0.s[e]);
    }
    uint8_t * out = reinterpret_cast<uint8_t *>(j0.dst + row * j0.sh.d1 + p.i2 * j0.sh.d2 + p.i3 * j0.sh.d3) +
                    p.ib * TQ3A_BLOCK_BYTES;
    __syncthreads(); // the tables
    tq3a_cu_quantize_block(ta, v, out, sm.a, tid);
}

template <typename src_t, typename idx_t>
static void tq_quantize_rows(ggml_type type, const char * src, const char * ids, char * dst, const tq_rows_shape & sh,
                             cudaStream_t stream) {
    const int64_t n = sh.nblk * sh.ne1 * sh.ne2 * sh.ne3;
    if (n == 0) {
        return;
    }
    const dim3 grid((unsigned) n);
    switch (type) {
#define TQ_QUANTIZE_CASE(name, NAME, values, bits, ...)                                                          \
        case GGML_TYPE_##NAME:                                                                                   \
            k_tq_quantize_rows<bits, values, src_t, idx_t><<<grid, values, 0, stream>>>(src, ids, dst, sh, tq_tables()); \
            break;
        TQ_FORMATS(TQ_QUANTIZE_CASE)
#undef TQ_QUANTIZE_CASE
        case GGML_TYPE_TQ3A:
            k_tq3a_quantize_rows<src_t, idx_t><<<grid, TQ3A_BLOCK, 0, stream>>>(src, ids, dst, sh, tq3a_tables());
            break;
        default: GGML_ABORT("not a TQ type");
    }
    CUDA_CHECK(cudaGetLastError());
}

// ---------------------------------------------------------------------------------------------------------
// Dequantize rows: one warp per block; source row ids[i1] (GET_ROWS) or i1.

template <int BITS, int N, typename dst_t, bool IDS>
static __global__ void __launch_bounds__(128) k_tq_dequantize_rows(const char * src, const char * ids, char * dst,
                                                                   const tq_rows_shape sh,
                                                                   const __grid_constant__ tq_cu_tables tab) {
    __shared__ tq_cu_tables t;
    tq_cu_tables_load(t, tab, threadIdx.x);
    __syncthreads();
    const int lane = threadIdx.x & 31;
    tq_rows_pos p;
    if (!tq_rows_locate(sh, (int64_t) blockIdx.x * 4 + (threadIdx.x >> 5), p)) { // one warp per block
        return;
    }
    const int64_t row = IDS ? tq_rows_id<int32_t>(ids, sh, p) : p.i1;
    const uint8_t * blk = reinterpret_cast<const uint8_t *>(src + row * sh.s1 + p.i2 * sh.s2 + p.i3 * sh.s3) + p.ib * tq_cu_block_bytes_n(BITS, N);
    float y[N / 32];
    if constexpr (N == TQ_BLOCK) {
        tq_cu_dequantize_block<BITS>(t, blk, y, lane);
    } else if constexpr (N == TQ_BLOCK_96) {
        tq_cu_dequantize_block96<BITS>(t, blk, y, lane);
    } else {
        tq_cu_dequantize_block64<BITS>(t, blk, y, lane);
    }
    dst_t * o = reinterpret_cast<dst_t *>(dst + p.i1 * sh.d1 + p.i2 * sh.d2 + p.i3 * sh.d3) + p.ib * N;
#pragma unroll
    for (int k = 0; k < N / 32; ++k) {
        o[lane + 32 * k] = ggml_cuda_cast<dst_t>(y[k]);
    }
}

template <typename dst_t, bool IDS>
static __global__ void __launch_bounds__(128) k_tq3a_dequantize_rows(const char * src, const char * ids, char * dst,
                                                                     const tq_rows_shape sh,
                                                                     const __grid_constant__ tq3a_cu_tables tab) {
    __shared__ tq3a_cu_tables t;
    tq3a_cu_tables_load<128>(t, tab, threadIdx.x);
    __syncthreads();
    const int lane = threadIdx.x & 31;
    tq_rows_pos p;
    if (!tq_rows_locate(sh, (int64_t) blockIdx.x * 4 + (threadIdx.x >> 5), p)) { // one warp per block
        return;
    }
    const int64_t row = IDS ? tq_rows_id<int32_t>(ids, sh, p) : p.i1;
    const uint8_t * blk = reinterpret_cast<const uint8_t *>(src + row * sh.s1 + p.i2 * sh.s2 + p.i3 * sh.s3) + p.ib * TQ3A_BLOCK_BYTES;
    float y[TQ3A_BLOCK / 32];
    tq3a_cu_dequantize_block(t, blk, y, lane);
    dst_t * o = reinterpret_cast<dst_t *>(dst + p.i1 * sh.d1 + p.i2 * sh.d2 + p.i3 * sh.d3) + p.ib * TQ3A_BLOCK;
#pragma unroll
    for (int k = 0; k < TQ3A_BLOCK / 32; ++k) {
        o[lane + 32 * k] = ggml_cuda_cast<dst_t>(y[k]);
    }
}

template <typename dst_t, bool IDS>
static void tq_dequantize_rows(ggml_type type, const char * src, const char * ids, char * dst, const tq_rows_shape & sh,
                               cudaStream_t stream) {
    const int64_t n = sh.nblk * sh.ne1 * sh.ne2 * sh.ne3;
    if (n == 0) {
        return;
    }
    const dim3 grid((unsigned) ((n + 3) / 4));
    switch (type) {
#define TQ_DEQUANTIZE_CASE(name, NAME, values, bits, ...)                                                        \
        case GGML_TYPE_##NAME:                                                                                   \
            k_tq_dequantize_rows<bits, values, dst_t, IDS><<<grid, 128, 0, stream>>>(src, ids, dst, sh, tq_tables()); \
            break;
        TQ_FORMATS(TQ_DEQUANTIZE_CASE)
#undef TQ_DEQUANTIZE_CASE
        case GGML_TYPE_TQ3A:
            k_tq3a_dequantize_rows<dst_t, IDS><<<grid, 128, 0, stream>>>(src, ids, dst, sh, tq3a_tables());
            break;
        default: GGML_ABORT("not a TQ type");
    }
    CUDA_CHECK(cudaGetLastError());
}

// Same-type copy of whole blocks (rows of blocks with arbitrary strides).
static __global__ void k_tq_copy_blocks(const char * src, char * dst, const tq_rows_shape sh, int bb) {
    const int lane = threadIdx.x & 31;
    tq_rows_pos p;
    if (!tq_rows_locate(sh, (int64_t) blockIdx.x * 4 + (threadIdx.x >> 5), p)) { // one warp per block
        return;
    }
    const char * s = src + p.i1 * sh.s1 + p.i2 * sh.s2 + p.i3 * sh.s3 + p.ib * bb;
    char * d = dst + p.i1 * sh.d1 + p.i2 * sh.d2 + p.i3 * sh.d3 + p.ib * bb;
    for (int i = lane; i < bb; i += 32) {
        d[i] = s[i];
    }
}

// ---------------------------------------------------------------------------------------------------------
// Converters (convert.cu's getters hand these out).

// 128-value blocks: k_tq_convert128 where the shape allows (tq-cuda-convert.cuh: ~3x faster than the row
// dequantizer below, which cost ~8 % of a pp512 @ d32768 ubatch; NOTES.md v13)
template <typename T>
static bool tq_to_t_fast(ggml_type type, const void * x, T * y, int64_t nblk, int64_t ne1, int64_t ne2, int64_t ne3,
                         int64_t s1, int64_t s2, int64_t s3, cudaStream_t stream) {
    const int64_t d1 = nblk * TQ_BLOCK * (int64_t) sizeof(T);
    if (tq_block_n_of(type) != TQ_BLOCK || !tq_conv_ok(nblk, ne1, ne2, ne3, y, d1)) {
        return false;
    }
    const tq_conv_shape sh = {(uint32_t) nblk, (uint32_t) (nblk * ne1), s1, s2, s3, d1, d1 * ne1, d1 * ne1 * ne2};
    tq_convert128<T>(tq_bits_of(type), (const char *) x, (char *) y, sh, ne2, ne3, tq_tables(), stream);
    CUDA_CHECK(cudaGetLastError());
    return true;
}

template <typename T>
static void tq_to_t_cont(ggml_type type, const void * x, T * y, int64_t k, cudaStream_t stream) {
    const int64_t bb = (int64_t) ggml_type_size(type);
    const int64_t n = tq_block_n_of(type);
    if (tq_to_t_fast<T>(type, x, y, 1, k / n, 1, 1, bb, 0, 0, stream)) {
        return;
    }
    const tq_rows_shape sh = {1, k / n, 1, 1, bb, 0, 0, (int64_t) (n * sizeof(T)), 0, 0, 0, 0, 0, 1, 1};
    tq_dequantize_rows<T, false>(type, (const char *) x, nullptr, (char *) y, sh, stream);
}

template <typename T>
static void tq_to_t_nc(ggml_type type, const void * x, T * y, int64_t ne00, int64_t ne01, int64_t ne02, int64_t ne03,
                       int64_t s01, int64_t s02, int64_t s03, cudaStream_t stream) {
    const int64_t bb = (int64_t) ggml_type_size(type);
    if (tq_to_t_fast<T>(type, x, y, ne00 / TQ_BLOCK, ne01, ne02, ne03, s01 * bb, s02 * bb, s03 * bb, stream)) {
        return;
    }
    const int64_t d1 = ne00 * (int64_t) sizeof(T);
    const tq_rows_shape sh = {ne00 / tq_block_n_of(type), ne01, ne02, ne03, s01 * bb, s02 * bb, s03 * bb,
                              d1, d1 * ne01, d1 * ne01 * ne02, 0, 0, 0, 1, 1};
    tq_dequantize_rows<T, false>(type, (const char *) x, nullptr, (char *) y, sh, stream);
}

// convert.cu's function types, one instance per TQ type (the getters' cases come from tq_formats.h)
template <ggml_type Q, typename T> static void tq_to_cont(const void * x, T * y, int64_t k, cudaStream_t s) {
    tq_to_t_cont<T>(Q, x, y, k, s);
}
template <ggml_type Q, typename T>
static void tq_to_nc(const void * x, T * y, int64_t ne00, int64_t ne01, int64_t ne02, int64_t ne03, int64_t s01,
                     int64_t s02, int64_t s03, cudaStream_t s) {
    tq_to_t_nc<T>(Q, x, y, ne00, ne01, ne02, ne03, s01, s02, s03, s);
}

#define TQ_GETTER(RET, NAME, FN, T)                                                     \
    RET NAME(ggml_type type) {                                                          \
        switch (type) {                                                                 \
            TQ_FORMATS(TQ_GETTER_CASE_##FN##_##T)                                       \
            TQ_GETTER_CASE_##FN##_##T(tq3a, TQ3A)                                       \
            default: return nullptr;                                                    \
        }                                                                               \
    }
#define TQ_GETTER_CASE_tq_to_cont_half(name, NAME, ...)  case GGML_TYPE_##NAME: return tq_to_cont<GGML_TYPE_##NAME, half>;
#define TQ_GETTER_CASE_tq_to_cont_float(name, NAME, ...) case GGML_TYPE_##NAME: return tq_to_cont<GGML_TYPE_##NAME, float>;
#define TQ_GETTER_CASE_tq_to_nc_half(name, NAME, ...)    case GGML_TYPE_##NAME: return tq_to_nc<GGML_TYPE_##NAME, half>;
#define TQ_GETTER_CASE_tq_to_nc_float(name, NAME, ...)   case GGML_TYPE_##NAME: return tq_to_nc<GGML_TYPE_##NAME, float>;
TQ_GETTER(to_fp16_cuda_t, ggml_cuda_tq_get_to_fp16, tq_to_cont, half)
TQ_GETTER(to_fp32_cuda_t, ggml_cuda_tq_get_to_fp32, tq_to_cont, float)
TQ_GETTER(to_fp16_nc_cuda_t, ggml_cuda_tq_get_to_fp16_nc, tq_to_nc, half)
TQ_GETTER(to_fp32_nc_cuda_t, ggml_cuda_tq_get_to_fp32_nc, tq_to_nc, float)

// ---------------------------------------------------------------------------------------------------------
// Ops.

static bool tq_is_float(ggml_type t) { return t == GGML_TYPE_F32 || t == GGML_TYPE_F16; }

int ggml_cuda_tq_supports_op(const ggml_tensor * op) {
    const ggml_tensor * a = op->src[0];
    const ggml_tensor * b = op->src[1];
    switch (op->op) {
        case GGML_OP_SET_ROWS:
            if (!ggml_tq_is_tq(op->type)) {
                return -1;
            }
            return tq_is_float(a->type) && a->nb[0] == ggml_type_size(a->type) &&
                   (b->type == GGML_TYPE_I64 || b->type == GGML_TYPE_I32);
        case GGML_OP_GET_ROWS:
            if (!ggml_tq_is_tq(a->type)) {
                return -1;
            }
            return tq_is_float(op->type) && b->type == GGML_TYPE_I32 && op->nb[0] == ggml_type_size(op->type);
        case GGML_OP_CPY:
            if (!ggml_tq_is_tq(a->type) && !ggml_tq_is_tq(b->type)) {
                return -1;
            }
            if (!ggml_are_same_shape(a, b) || a->nb[0] != ggml_type_size(a->type) || b->nb[0] != ggml_type_size(b->type)) {
                return 0;
            }
            return (tq_is_float(a->type) && ggml_tq_is_tq(b->type)) ||
                   (ggml_tq_is_tq(a->type) && tq_is_float(b->type)) || a->type == b->type;
        case GGML_OP_MUL_MAT:
            if (!ggml_tq_is_tq(a->type)) {
                return -1;
            }
            return b->type == GGML_TYPE_F32 && op->type == GGML_TYPE_F32;
        case GGML_OP_MUL_MAT_ID:
            return ggml_tq_is_tq(a->type) ? 0 : -1;
        default:
            return -1;
    }
}

static tq_rows_shape tq_shape_of(const ggml_tensor * src, const ggml_tensor * dst, int64_t nblk) {
    tq_rows_shape sh = {};
    sh.nblk = nblk;
    sh.ne1 = src->ne[1]; sh.ne2 = src->ne[2]; sh.ne3 = src->ne[3];
    sh.s1 = src->nb[1]; sh.s2 = src->nb[2]; sh.s3 = src->nb[3];
    sh.d1 = dst->nb[1]; sh.d2 = dst->nb[2]; sh.d3 = dst->nb[3];
    sh.ine1 = 1; sh.ine2 = 1;
    return sh;
}

bool ggml_cuda_tq_compute_forward(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * a = dst->src[0];
    const ggml_tensor * b = dst->src[1];
    cudaStream_t stream = ctx.stream();
    switch (dst->op) {
        case GGML_OP_SET_ROWS: {
            if (!ggml_tq_is_tq(dst->type)) {
                return false;
            }
            tq_rows_shape sh = tq_shape_of(a, dst, a->ne[0] / tq_block_n_of(dst->type));
            sh.i0 = b->nb[0]; sh.i1 = b->nb[1]; sh.i2 = b->nb[2];
            sh.ine1 = b->ne[1]; sh.ine2 = b->ne[2];
            const char * s = (const char *) a->data;
            const char * ids = (const char *) b->data;
            char * d = (char *) dst->data;
            if (a->type == GGML_TYPE_F32) {
                b->type == GGML_TYPE_I64 ? tq_quantize_rows<float, int64_t>(dst->type, s, ids, d, sh, stream)
                                         : tq_quantize_rows<float, int32_t>(dst->type, s, ids, d, sh, stream);
            } else {
                b->type == GGML_TYPE_I64 ? tq_quantize_rows<half, int64_t>(dst->type, s, ids, d, sh, stream)
                                         : tq_quantize_rows<half, int32_t>(dst->type, s, ids, d, sh, stream);
            }
            return true;
        }
        case GGML_OP_GET_ROWS: {
            if (!ggml_tq_is_tq(a->type)) {
                return false;
            }
            // dst row (i1, i2, i3) = a row ids[i1, i2, i3] of plane (i2, i3)
            tq_rows_shape sh = {};
            sh.nblk = a->ne[0] / tq_block_n_of(a->type);
            sh.ne1 = dst->ne[1]; sh.ne2 = dst->ne[2]; sh.ne3 = dst->ne[3];
            sh.s1 = a->nb[1]; sh.s2 = a->nb[2]; sh.s3 = a->nb[3];
            sh.d1 = dst->nb[1]; sh.d2 = dst->nb[2]; sh.d3 = dst->nb[3];
            sh.i0 = b->nb[0]; sh.i1 = b->nb[1]; sh.i2 = b->nb[2];
            sh.ine1 = b->ne[1]; sh.ine2 = b->ne[2];
            if (dst->type == GGML_TYPE_F32) {
                tq_dequantize_rows<float, true>(a->type, (const char *) a->data, (const char *) b->data, (char *) dst->data, sh, stream);
            } else {
                tq_dequantize_rows<half, true>(a->type, (const char *) a->data, (const char *) b->data, (char *) dst->data, sh, stream);
            }
            return true;
        }
        case GGML_OP_CPY: {
            if (!ggml_tq_is_tq(a->type) && !ggml_tq_is_tq(b->type)) {
                return false;
            }
            const char * s = (const char *) a->data;
            char * d = (char *) b->data;
            const tq_rows_shape sh = tq_shape_of(a, b, a->ne[0] / tq_block_n_of(ggml_tq_is_tq(a->type) ? a->type : b->type));
            if (a->type == b->type) {
                const int64_t n = sh.nblk * sh.ne1 * sh.ne2 * sh.ne3;
                if (n > 0) {
                    k_tq_copy_blocks<<<(unsigned) ((n + 3) / 4), 128, 0, stream>>>(s, d, sh, (int) ggml_type_size(a->type));
                    CUDA_CHECK(cudaGetLastError());
                }
            } else if (ggml_tq_is_tq(b->type)) {
                a->type == GGML_TYPE_F32 ? tq_quantize_rows<float, int32_t>(b->type, s, nullptr, d, sh, stream)
                                         : tq_quantize_rows<half, int32_t>(b->type, s, nullptr, d, sh, stream);
            } else {
                b->type == GGML_TYPE_F32 ? tq_dequantize_rows<float, false>(a->type, s, nullptr, d, sh, stream)
                                         : tq_dequantize_rows<half, false>(a->type, s, nullptr, d, sh, stream);
            }
            return true;
        }
        default:
            return false;
    }
}

static bool tq_is_noop(const ggml_tensor * t) {
    return ggml_is_empty(t) || t->op == GGML_OP_NONE || t->op == GGML_OP_RESHAPE || t->op == GGML_OP_VIEW ||
           t->op == GGML_OP_PERMUTE || t->op == GGML_OP_TRANSPOSE;
}

// the next node after `from` that is not a view (at most 4 views in between), or -1
static int tq_next_real(const ggml_cgraph * cgraph, int from) {
    int j = from + 1;
    while (j < cgraph->n_nodes && j <= from + 4 && tq_is_noop(cgraph->nodes[j])) {
        ++j;
    }
    return j < cgraph->n_nodes && j <= from + 4 ? j : -1;
}

static bool tq_overlap(const ggml_tensor * a, const ggml_tensor * b) { // byte ranges of two tensors' data
    const char * a0 = (const char *) a->data, * b0 = (const char *) b->data;
    return a0 < b0 + ggml_nbytes(b) && b0 < a0 + ggml_nbytes(a);
}

// The FA node that directly follows the last fused K/V write launched on this thread (tq_fa_params::q_early);
// cleared by ggml_cuda_tq_try_fuse at any other computed node, and by the FA launch that reads it.
static thread_local const ggml_tensor * tq_fa_q_early_node = nullptr;

static tq_rows_job tq_job_of(const ggml_tensor * dst) {
    const ggml_tensor * a = dst->src[0], * b = dst->src[1];
    tq_rows_job j;
    j.sh = tq_shape_of(a, dst, a->ne[0] / tq_block_n_of(dst->type));
    j.sh.i0 = b->nb[0]; j.sh.i1 = b->nb[1]; j.sh.i2 = b->nb[2];
    j.sh.ine1 = b->ne[1]; j.sh.ine2 = b->ne[2];
    j.src = (const char *) a->data;
    j.ids = (const char *) b->data;
    j.dst = (char *) dst->data;
    j.n = j.sh.nblk * j.sh.ne1 * j.sh.ne2 * j.sh.ne3;
    return j;
}

template <int N>
static void tq_quantize_rows2(int b0, int b1, const tq_rows_job & j0, const tq_rows_job & j1, cudaStream_t stream) {
    const dim3 grid((unsigned) (j0.n + j1.n));
    const tq_cu_tables & tab = tq_tables();
    if (b0 == 3 && b1 == 3) {
        tq_launch(k_tq_quantize_rows2<3, 3, N, int64_t>, grid, N, stream, j0, j1, tab);
    } else if (b0 == 3) {
        tq_launch(k_tq_quantize_rows2<3, 4, N, int64_t>, grid, N, stream, j0, j1, tab);
    } else if (b1 == 3) {
        tq_launch(k_tq_quantize_rows2<4, 3, N, int64_t>, grid, N, stream, j0, j1, tab);
    } else {
        tq_launch(k_tq_quantize_rows2<4, 4, N, int64_t>, grid, N, stream, j0, j1, tab);
    }
    CUDA_CHECK(cudaGetLastError());
}

// k_tq3a_quantize_kv's launch: j1.n == 0 (no V write beside it) or V of 128-value blocks with bits bv
static void tq3a_quantize_kv(const tq_rows_job & j0, const int32_t * order, int bv, const tq_rows_job & j1,
                             cudaStream_t stream) {
    const dim3 grid((unsigned) (j0.n + j1.n));
    if (bv == 4) {
        tq_launch(k_tq3a_quantize_kv<4>, grid, TQ3A_BLOCK, stream, j0, order, j1, tq3a_tables(), tq_tables());
    } else {
        tq_launch(k_tq3a_quantize_kv<3>, grid, TQ3A_BLOCK, stream, j0, order, j1, tq3a_tables(), tq_tables());
    }
    CUDA_CHECK(cudaGetLastError());
}

// TQ3A's calibrated order after the key transforms of a decode step (llama-tq-keys.cpp): g a GET_ROWS of x's
// channels, x [256, H, 1] seen as [1, 256, H, 1], by an I32 order [256, H]; sets order.
static bool tq3a_order_at(const ggml_tensor * g, const ggml_tensor * x, const int32_t *& order) {
    const ggml_tensor * a = g->src[0], * b = g->src[1];
    if (g->op != GGML_OP_GET_ROWS || g->type != GGML_TYPE_F32 || a == nullptr || b == nullptr ||
        (a != x && a->view_src != x) || a->data != x->data || !ggml_is_contiguous(a) || a->ne[0] != 1 ||
        x->ne[0] != TQ3A_BLOCK || a->ne[1] != TQ3A_BLOCK || a->ne[2] != x->ne[1] || a->ne[3] != 1 || x->ne[2] != 1 ||
        b->type != GGML_TYPE_I32 || !ggml_is_contiguous(b) || b->ne[0] != TQ3A_BLOCK || b->ne[1] != x->ne[1] ||
        b->ne[2] != 1 || !ggml_is_contiguous(g)) {
        return false;
    }
    order = (const int32_t *) b->data;
    return true;
}

// The key transforms in front of a K write (llama-tq-keys.cpp): k' = k - mu [* s], mu and s one row [D, H, 1]
// broadcast over the tokens of k [D, H, T]. Node i is the SUB; on success *last is the node whose value the write
// takes (the SUB or the MUL after it: llama's graphs put the view of s's row between them), and mu / s are set.
static bool tq_key_transform_at(const ggml_cgraph * cgraph, int i, int & last, const float *& mu, const float *& s) {
    auto row_of = [](const ggml_tensor * x, const ggml_tensor * r) { // r: one contiguous f32 row of x's [D, H]
        return r->type == GGML_TYPE_F32 && ggml_is_contiguous(r) && r->ne[0] == x->ne[0] && r->ne[1] == x->ne[1] &&
               r->ne[2] == 1 && r->ne[3] == 1;
    };
    const ggml_tensor * sub = cgraph->nodes[i];
    if (sub->op != GGML_OP_SUB || sub->type != GGML_TYPE_F32 || sub->src[0]->type != GGML_TYPE_F32 ||
        !ggml_is_contiguous(sub->src[0]) || !ggml_is_contiguous(sub) || sub->ne[3] != 1 || !row_of(sub, sub->src[1])) {
        return false;
    }
    mu = (const float *) sub->src[1]->data;
    s = nullptr;
    last = i;
    const int m = tq_next_real(cgraph, i);
    if (m >= 0) {
        const ggml_tensor * mul = cgraph->nodes[m];
        if (mul->op == GGML_OP_MUL && mul->src[0] == sub && mul->type == GGML_TYPE_F32 && ggml_is_contiguous(mul) &&
            row_of(sub, mul->src[1])) {
            s = (const float *) mul->src[1]->data;
            last = m;
        }
    }
    return true;
}

// Whether any node other than nodes[first..last] reads t (directly or through a view), or t is a graph output.
static bool tq_read_elsewhere(const ggml_cgraph * cgraph, const ggml_tensor * t, int first, int last) {
    if (t->flags & GGML_TENSOR_FLAG_OUTPUT) {
        return true;
    }
    for (int n = 0; n < cgraph->n_nodes; ++n) {
        if (n >= first && n <= last) {
            continue;
        }
        for (const ggml_tensor * src : cgraph->nodes[n]->src) {
            if (src != nullptr && (src == t || src->view_src == t)) {
                return true;
            }
        }
    }
    return false;
}

// A ROPE the K write can apply itself (tq_rope_value): forward, norm or neox mode without an offset, f32 rows of
// [D, H, T]; fills r.
static bool tq_rope_foldable(const ggml_tensor * rope, tq_rope_fold & r) {
    const ggml_tensor * x = rope->src[0], * pos = rope->src[1], * ff = rope->src[2];
    const int32_t * op = (const int32_t *) rope->op_params;
    const int n_dims = op[1], mode = op[2], n_ctx_orig = op[4], n_offs = op[15];
    if (rope->op != GGML_OP_ROPE || (mode != 0 && mode != GGML_ROPE_TYPE_NEOX) || n_offs != 0 ||
        rope->type != GGML_TYPE_F32 || x->type != GGML_TYPE_F32 || x->nb[0] != sizeof(float) || x->ne[3] != 1 ||
        pos == nullptr || pos->type != GGML_TYPE_I32 || pos->ne[0] != x->ne[2] || !ggml_is_contiguous(pos) ||
        (ff != nullptr && (ff->type != GGML_TYPE_F32 || !ggml_is_contiguous(ff) || ff->ne[0] < n_dims / 2)) ||
        n_dims <= 0 || n_dims % 2 != 0 || n_dims > x->ne[0]) {
        return false;
    }
    float freq_base, beta_fast, beta_slow, corr[2];
    memcpy(&freq_base,     op + 5, sizeof(float));
    memcpy(&r.freq_scale,  op + 6, sizeof(float));
    memcpy(&r.ext_factor,  op + 7, sizeof(float));
    memcpy(&r.attn_factor, op + 8, sizeof(float));
    memcpy(&beta_fast,     op + 9, sizeof(float));
    memcpy(&beta_slow,     op + 10, sizeof(float));
    ggml_rope_yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow, corr);
    r.corr0 = corr[0];
    r.corr1 = corr[1];
    r.theta_scale = powf(freq_base, -2.0f / n_dims); // as rope.cu's launchers
    r.x = (const char *) x->data;
    r.nb1 = x->nb[1];
    r.nb2 = x->nb[2];
    r.pos = (const int32_t *) pos->data;
    r.ff = ff != nullptr ? (const float *) ff->data : nullptr;
    r.D = (int) x->ne[0];
    r.n_dims = n_dims;
    r.neox = mode == GGML_ROPE_TYPE_NEOX;
    return true;
}

// The key means of the sequences a ubatch starts (llama-tq-keys.cpp): for each sequence s,
// mu[:, s] = (sum_t x[:, t] w[t, s]) * mask + mu[:, s] keep[s] over the keys x [DH, T] after RoPE (w: 1 / (n_s + 16)
// on s's tokens, keep: 0 where s starts), which the graph spells CONT(PERMUTE) MUL_MAT MUL MUL ADD CPY: a transposed
// copy of the ubatch's keys, a GEMM and four small launches a layer. One launch instead: 32 columns per CTA and one
// sequence per grid row, a column's tokens in 32 slices (threads y, all loads of a slice in flight) summed in double,
// then the 32 partial sums added by one warp in a fixed butterfly order: deterministic, and a sequence's mean does
// not depend on how many sequences the context has (the CPU sums in float, so the two may differ in the last bits).
static __global__ void __launch_bounds__(1024) k_tq_key_mean(const float * __restrict__ x, int64_t dh, int64_t T,
                                                             const float * __restrict__ w, const float * __restrict__ mask,
                                                             const float * __restrict__ keep, float * mu) {
    __shared__ double part[32][33];
    const int64_t c0 = (int64_t) blockIdx.x * 32;
    const int64_t sq = blockIdx.y;
    const float * ws = w + sq * T;
    double acc = 0.0;
    if (c0 + threadIdx.x < dh) {
#pragma unroll 16
        for (int64_t t = threadIdx.y; t < T; t += 32) {
            acc += (double) x[t * dh + c0 + threadIdx.x] * (double) ws[t];
        }
    }
    part[threadIdx.x][threadIdx.y] = acc; // [column][slice]
    __syncthreads();
    const int64_t j = c0 + threadIdx.y; // warp y sums column y's slices
    double s = part[threadIdx.y][threadIdx.x];
#pragma unroll
    for (int d = 16; d >= 1; d >>= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, d);
    }
    if (threadIdx.x == 0 && j < dh) {
        float * m = mu + sq * dh + j;
        *m = __fadd_rn(__fmul_rn(__double2float_rn(s), mask[j]), __fmul_rn(*m, keep[sq]));
    }
}

// Node i a CONT of the key-mean chain (see k_tq_key_mean): runs the chain in one launch and returns the nodes
// consumed after node i, or 0.
static int tq_try_key_mean(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i) {
    auto next_real = [&](int from) { return tq_next_real(cgraph, from); };
    const ggml_tensor * c = cgraph->nodes[i];
    const ggml_tensor * p = c->src[0];
    const ggml_tensor * x = p != nullptr ? p->src[0] : nullptr;
    // CONT of PERMUTE(x, 1, 2, 0, 3), x contiguous f32 [D, H, T]: c [T, D, H] = the keys' columns as rows
    if (c->op != GGML_OP_CONT || c->type != GGML_TYPE_F32 || p->op != GGML_OP_PERMUTE || x == nullptr ||
        x->type != GGML_TYPE_F32 || !ggml_is_contiguous(x) || x->ne[3] != 1 || p->data != x->data ||
        p->nb[0] != x->nb[2] || p->nb[1] != x->nb[0] || p->nb[2] != x->nb[1] || p->ne[3] != 1) {
        return 0;
    }
    const int64_t dh = x->ne[0] * x->ne[1], T = x->ne[2];
    auto f32c = [](const ggml_tensor * t) { return t != nullptr && t->type == GGML_TYPE_F32 && ggml_is_contiguous(t); };
    auto node = [&](int at, ggml_op op) -> const ggml_tensor * {
        const ggml_tensor * t = at >= 0 ? cgraph->nodes[at] : nullptr;
        return t != nullptr && t->op == op && f32c(t) ? t : nullptr;
    };
    // MUL_MAT(c as [T, DH], w [T, S]) -> [DH, S]
    const int imm = next_real(i);
    const ggml_tensor * mm = node(imm, GGML_OP_MUL_MAT);
    if (mm == nullptr || mm->src[0]->data != c->data || (mm->src[0] != c && mm->src[0]->view_src != c) ||
        mm->src[0]->ne[0] != T || mm->src[0]->ne[1] != dh || !f32c(mm->src[1]) || mm->src[1]->ne[0] != T ||
        mm->src[1]->ne[2] != 1 || mm->src[1]->ne[3] != 1 || mm->ne[0] != dh) {
        return 0;
    }
    const int64_t S = mm->ne[1];
    // MUL(mm, mask [DH, 1]), MUL(mu [DH, S], keep [1, S]), ADD of the two, CPY into mu
    const int ia = next_real(imm);
    const ggml_tensor * ma = node(ia, GGML_OP_MUL);
    const int ib = next_real(ia);
    const ggml_tensor * mb = node(ib, GGML_OP_MUL);
    const int id = next_real(ib);
    const ggml_tensor * add = node(id, GGML_OP_ADD);
    const int ic = next_real(id);
    const ggml_tensor * cp = node(ic, GGML_OP_CPY);
    if (ma == nullptr || mb == nullptr || add == nullptr || cp == nullptr || ma->src[0] != mm ||
        !f32c(ma->src[1]) || ggml_nelements(ma->src[1]) != dh || !f32c(mb->src[0]) || !f32c(mb->src[1]) ||
        ggml_nelements(mb->src[0]) != dh * S || ggml_nelements(mb->src[1]) != S || add->src[0] != ma ||
        add->src[1] != mb || cp->src[0] != add || ggml_nelements(cp) != dh * S || cp->data != mb->src[0]->data ||
        tq_overlap(cp, x) || tq_overlap(cp, mm->src[1]) || tq_overlap(cp, ma->src[1]) || tq_overlap(cp, mb->src[1])) {
        return 0;
    }
    for (const ggml_tensor * t : {c, mm, ma, mb, add}) {
        if (tq_read_elsewhere(cgraph, t, i, ic)) {
            return 0;
        }
    }
    k_tq_key_mean<<<dim3((unsigned) ((dh + 31) / 32), (unsigned) S), dim3(32, 32), 0, ctx.stream()>>>(
        (const float *) x->data, dh, T, (const float *) mm->src[1]->data, (const float *) ma->src[1]->data,
        (const float *) mb->src[1]->data, (float *) cp->data);
    CUDA_CHECK(cudaGetLastError());
    return ic - i;
}

int ggml_cuda_tq_try_fuse(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i) {
    if (cgraph->nodes[i] != tq_fa_q_early_node) {
        tq_fa_q_early_node = nullptr; // q_early holds only for the very next computed node after the write
    }
    // a f32 -> TQ SET_ROWS with int64 row ids (what the KV cache's writes are): of TQ3A (its own kernel,
    // k_tq3a_quantize_kv, after its order's gather) or of the other TQ types
    auto is_write_of = [](const ggml_tensor * t, bool tq3a) {
        return t->op == GGML_OP_SET_ROWS && ggml_tq_is_tq(t->type) && ggml_tq_is_tq3a(t->type) == tq3a &&
               t->src[0]->type == GGML_TYPE_F32 &&
               t->src[1]->type == GGML_TYPE_I64 && (t->flags & GGML_TENSOR_FLAG_COMPUTE) != 0;
    };
    auto is_write = [&](const ggml_tensor * t) { return is_write_of(t, false); };
    auto next_real = [&](int from) { return tq_next_real(cgraph, from); };
    if (!ctx.stream_context().concurrent_events.empty()) {
        return 0; // (graph optimization's concurrent streams may put the nodes on different streams)
    }
    if (cgraph->nodes[i]->op == GGML_OP_CONT) {
        return tq_try_key_mean(ctx, cgraph, i);
    }
    const int first = i;
    // K's RoPE folded into the K write: ROPE views [SUB [MUL] views] SET_ROWS, where nothing else reads the ROPE's
    // output; the ROPE does not run, the write rotates the ROPE's input itself.
    tq_rope_fold rope;
    const ggml_tensor * roped = nullptr;
    if (cgraph->nodes[i]->op == GGML_OP_ROPE) {
        roped = cgraph->nodes[i];
        if (!ggml_is_contiguous(roped) || !tq_rope_foldable(roped, rope)) {
            return 0;
        }
        i = next_real(i);
        if (i < 0) {
            return 0;
        }
    }
    // a view of t as rows of D x H values (what the K write reads)
    auto rows_of = [](const ggml_tensor * a, const ggml_tensor * t) {
        return a != nullptr && (a == t || a->view_src == t) && a->data == t->data && ggml_is_contiguous(a) &&
               a->ne[0] == t->ne[0] * t->ne[1] && a->ne[1] == t->ne[2] && a->ne[2] == 1 && a->ne[3] == 1;
    };
    // the key transforms folded into the K write: SUB [MUL] views SET_ROWS, where the write reads the transformed
    // keys as rows of D x H values and nothing else reads them. The SUB and MUL do not run: the write reads the
    // SUB's input (same shape, both contiguous: same offsets) and applies them itself.
    // TQ3A keys: SUB [MUL] views GET_ROWS (the calibrated order) views SET_ROWS, the gather folded in as well.
    const float * mu = nullptr, * s = nullptr;
    const int32_t * order = nullptr;
    const ggml_tensor * keys_in = nullptr;
    int ik = i, last = i;
    if (tq_key_transform_at(cgraph, i, last, mu, s)) {
        keys_in = cgraph->nodes[i]->src[0];
        if (roped != nullptr && keys_in != roped &&
            (keys_in->view_src != roped || keys_in->data != roped->data || !ggml_are_same_shape(keys_in, roped))) {
            return 0; // (the SUB's input is contiguous, so it is the ROPE's output as it is)
        }
        const ggml_tensor * val = cgraph->nodes[last];
        ik = next_real(last);
        if (ik < 0) {
            return 0;
        }
        if (tq3a_order_at(cgraph->nodes[ik], val, order)) {
            if (tq_read_elsewhere(cgraph, val, i, ik)) {
                return 0;
            }
            val = cgraph->nodes[ik];
            last = ik;
            ik = next_real(ik);
            if (ik < 0) {
                return 0;
            }
        }
        const ggml_tensor * w = cgraph->nodes[ik];
        const ggml_tensor * a = is_write_of(w, order != nullptr) ? w->src[0] : nullptr;
        const int64_t dh = order != nullptr ? val->ne[1] * val->ne[2] : val->ne[0] * val->ne[1]; // (the gather: [1, D, H])
        if (a == nullptr || (a != val && a->view_src != val) || a->data != val->data || !ggml_is_contiguous(a) ||
            a->ne[0] != dh || a->ne[0] % tq_block_n_of(w->type) != 0 ||
            tq_overlap(w, val) || tq_overlap(w, keys_in) || tq_read_elsewhere(cgraph, val, i, ik) ||
            (last != i && tq_read_elsewhere(cgraph, cgraph->nodes[i], i, ik))) {
            return 0;
        }
    } else if (roped != nullptr) { // ROPE views SET_ROWS
        const ggml_tensor * w = cgraph->nodes[i];
        if (!is_write(w) || !rows_of(w->src[0], roped)) {
            return 0;
        }
    }
    const ggml_tensor * k = cgraph->nodes[ik];
    if (!is_write_of(k, order != nullptr)) {
        return 0;
    }
    const ggml_tensor * ka = k->src[0];
    if (roped != nullptr && (ka->ne[0] % tq_block_n_of(k->type) != 0 || ka->ne[1] != roped->ne[2] || ka->ne[2] != 1 ||
                             ka->ne[3] != 1 || tq_overlap(k, roped->src[0]) || tq_overlap(k, roped->src[1]) ||
                             tq_read_elsewhere(cgraph, roped, first, ik))) {
        return 0;
    }
    tq_rows_job j0 = tq_job_of(k);
    if (keys_in != nullptr) {
        j0.src = (const char *) keys_in->data;
        j0.mu = mu;
        j0.s = s;
    }
    if (roped != nullptr) {
        j0.rope = rope;
    }
    const int b0 = order != nullptr ? 0 : tq_bits_of(k->type);
    const int j = next_real(ik);
    const ggml_tensor * v = j >= 0 ? cgraph->nodes[j] : nullptr;
    // run side by side: neither may write what the other reads or writes
    const bool pair = v != nullptr && is_write(v) &&
                      tq_block_n_of(v->type) == (order != nullptr ? TQ_BLOCK : tq_block_n_of(k->type)) &&
                      !tq_overlap(k, v) && !tq_overlap(k, v->src[0]) && !tq_overlap(k, v->src[1]) &&
                      !tq_overlap(v, k->src[0]) && !tq_overlap(v, k->src[1]) &&
                      (keys_in == nullptr || !tq_overlap(v, keys_in)) &&
                      (roped == nullptr || (!tq_overlap(v, roped->src[0]) && !tq_overlap(v, roped->src[1])));
    if (!pair && mu == nullptr && roped == nullptr) {
        return 0; // a lone write without transforms: the plain SET_ROWS path
    }
    tq_rows_job j1 = pair ? tq_job_of(v) : tq_rows_job{};
    if (j0.n == 0 || (pair && j1.n == 0)) {
        return 0;
    }
    const int b1 = pair ? tq_bits_of(v->type) : b0;
    if (pair) { // the FA node that reads these caches, when it is the next kernel: it may read Q before its PDL wait
        int f = j + 1;
        while (f < cgraph->n_nodes && f <= j + 8 && tq_is_noop(cgraph->nodes[f])) {
            ++f;
        }
        const ggml_tensor * fa = f < cgraph->n_nodes && f <= j + 8 ? cgraph->nodes[f] : nullptr;
        tq_fa_q_early_node = fa != nullptr && fa->op == GGML_OP_FLASH_ATTN_EXT && fa->src[1] != nullptr &&
                                     fa->src[2] != nullptr && tq_overlap(fa->src[1], k) && tq_overlap(fa->src[2], v)
                                 ? fa
                                 : nullptr;
    }
    if (order != nullptr) {
        tq3a_quantize_kv(j0, order, b1, j1, ctx.stream());
    } else if (tq_block_n_of(k->type) == TQ_BLOCK) {
        tq_quantize_rows2<TQ_BLOCK>(b0, b1, j0, j1, ctx.stream());
    } else if (tq_block_n_of(k->type) == TQ_BLOCK_96) {
        tq_quantize_rows2<TQ_BLOCK_96>(b0, b1, j0, j1, ctx.stream());
    } else {
        tq_quantize_rows2<TQ_BLOCK_64>(b0, b1, j0, j1, ctx.stream());
    }
    return (pair ? j : ik) - first;
}

bool ggml_cuda_tq_mul_mat(ggml_backend_cuda_context & ctx, ggml_tensor * dst, ggml_cuda_mul_mat_fn mul_mat) {
    const ggml_tensor * a = dst->src[0];
    if (!ggml_tq_is_tq(a->type)) {
        return false;
    }
    // K*Q with -fa off: dequantize the K view to f16 once and let upstream pick its f16 kernel
    ggml_cuda_pool_alloc<half> a_f16(ctx.pool(), ggml_nelements(a));
    const int64_t bb = (int64_t) ggml_type_size(a->type);
    tq_to_t_nc<half>(a->type, a->data, a_f16.get(), a->ne[0], a->ne[1], a->ne[2], a->ne[3], a->nb[1] / bb,
                     a->nb[2] / bb, a->nb[3] / bb, ctx.stream());
    ggml_tensor a16 = *a;
    a16.type     = GGML_TYPE_F16;
    a16.data     = a_f16.get();
    a16.view_src = nullptr;
    a16.nb[0]    = sizeof(half);
    a16.nb[1]    = a16.nb[0] * a->ne[0];
    a16.nb[2]    = a16.nb[1] * a->ne[1];
    a16.nb[3]    = a16.nb[2] * a->ne[2];
    mul_mat(ctx, &a16, dst->src[1], dst);
    return true;
}

// ---------------------------------------------------------------------------------------------------------
// Flash attention decode.

int tq_fa_kind_of(ggml_type t) {
    switch (t) {
        case GGML_TYPE_F16:  return TQFA_F16;
        case GGML_TYPE_Q8_0: return TQFA_Q8_0;
#define TQFA_KIND_CASE(name, NAME, ...) case GGML_TYPE_##NAME: return TQFA_##NAME;
        TQ_FORMATS(TQFA_KIND_CASE)
#undef TQFA_KIND_CASE
        default:             return -1;
    }
}

bool ggml_cuda_tq_fattn_handles(const ggml_tensor * dst) {
    const ggml_tensor * Q = dst->src[0];
    const ggml_tensor * K = dst->src[1];
    const ggml_tensor * V = dst->src[2];
    const ggml_tensor * mask  = dst->src[3];
    const ggml_tensor * sinks = dst->src[4];
    if (!K || !V || (!ggml_tq_is_tq(K->type) && !ggml_tq_is_tq(V->type))) {
        return false;
    }
    if (tq_fa_kind_of(K->type) < 0 || tq_fa_kind_of(V->type) < 0 || Q->type != GGML_TYPE_F32 || dst->type != GGML_TYPE_F32) {
        return false;
    }
    const int64_t D = Q->ne[0];
    const int tk = tq_fa_kind_of(K->type), tv = tq_fa_kind_of(V->type);
    if (!tq_fa_pair_ok(tk, tv)) {
        return false; // one head size gives one block size
    }
    if (tq_fa_is_tq96(tk) && !tq_fa_is_tq(tv)) {
        return false; // a 96-value K with an f16 / q8_0 V: upstream's kernels after a conversion (3 V values a lane)
    }
    const int sw = tq_fa_slice(tk, tv);
    const bool d_ok = tq_fa_head_ok("CUDA", sw, (int) D); // tq_formats.h: the head sizes instantiated
    if (!d_ok || K->ne[0] != D || V->ne[0] != D) {
        return false;
    }
    if (K->ne[2] == 0 || Q->ne[2] % K->ne[2] != 0 || Q->ne[2] / K->ne[2] > TQ_FA_MAX_COLS || V->ne[2] != K->ne[2]) {
        return false;
    }
    if (Q->ne[1] > TQ_FA_MAX_COLS || Q->ne[3] % K->ne[3] != 0 || Q->ne[3] % V->ne[3] != 0 || K->ne[1] != V->ne[1]) {
        return false;
    }
    if (K->nb[0] != ggml_type_size(K->type) || V->nb[0] != ggml_type_size(V->type)) {
        return false;
    }
    for (const ggml_tensor * t : {K, V}) { // 4-byte loads of TQ rows, 2-byte loads of q8_0/f16 rows
        const size_t align = ggml_tq_is_tq(t->type) ? 4 : 2;
        if (t->nb[1] % align || t->nb[2] % align || t->nb[3] % align) {
            return false;
        }
    }
    if ((mask && mask->type != GGML_TYPE_F16) || (sinks && sinks->type != GGML_TYPE_F32)) {
        return false;
    }
    return K->ne[1] < INT32_MAX;
}

// One buffer per (device, stream), kept for the process's life: every launch leaves its counters at 0 again, so a
// buffer is never cleared after its allocation, and a stream handle that a later context reuses finds it ready.
// Keyed by stream, so kernels of two contexts running at once never share a counter.
unsigned * ggml_cuda_tq_fa_counters(ggml_backend_cuda_context & ctx, size_t n) {
    static const bool on = !tq_env_flag(TQ_ENV_CUDA_FUSED_MERGE_DISABLE);
    constexpr size_t N = TQ_FA_DONE_COUNTERS;
    if (!on || n > N) {
        return nullptr;
    }
    static std::mutex mu;
    static std::map<std::pair<int, cudaStream_t>, unsigned *> bufs;
    std::lock_guard<std::mutex> lock(mu);
    cudaStream_t stream = ctx.stream();
    const auto key = std::make_pair(ctx.device, stream);
    if (const auto it = bufs.find(key); it != bufs.end()) {
        return it->second;
    }
    cudaStreamCaptureStatus capturing;
    CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
    if (capturing != cudaStreamCaptureStatusNone) {
        return nullptr; // no allocation inside a capture (llama.cpp runs a graph uncaptured before it captures it)
    }
    unsigned * buf = nullptr;
    CUDA_CHECK(cudaMalloc(&buf, N * sizeof(unsigned)));
    CUDA_CHECK(cudaMemsetAsync(buf, 0, N * sizeof(unsigned), stream));
    bufs.emplace(key, buf);
    return buf;
}

void tq_fa_fill_params(ggml_backend_cuda_context & ctx, const ggml_tensor * dst, tq_fa_params & p, int & C,
                       int & n_chunks, int & n_kvh, int & n_seq, bool mma) {
    const ggml_tensor * Q = dst->src[0];
    const ggml_tensor * K = dst->src[1];
    const ggml_tensor * V = dst->src[2];
    const ggml_tensor * mask = dst->src[3];

    memset(&p, 0, sizeof p);
    p.q_early = dst == tq_fa_q_early_node && mma;
    tq_fa_q_early_node = nullptr;
    p.Q = (const char *) Q->data;
    p.K = (const char *) K->data;
    p.V = (const char *) V->data;
    p.mask = mask ? (const char *) mask->data : nullptr;
    p.nb01 = Q->nb[1]; p.nb02 = Q->nb[2]; p.nb03 = Q->nb[3];
    p.nb11 = K->nb[1]; p.nb12 = K->nb[2]; p.nb13 = K->nb[3];
    p.nb21 = V->nb[1]; p.nb22 = V->nb[2]; p.nb23 = V->nb[3];
    if (mask) {
        p.nb31 = mask->nb[1]; p.nb32 = mask->nb[2]; p.nb33 = mask->nb[3];
        p.ne32 = (int) mask->ne[2]; p.ne33 = (int) mask->ne[3];
    } else {
        p.ne32 = p.ne33 = 1;
    }
    p.n_kv   = (int) K->ne[1];
    p.n_q    = (int) Q->ne[1];
    p.n_head = (int) Q->ne[2];
    p.gqa    = (int) (Q->ne[2] / K->ne[2]);
    p.rk3    = (int) (Q->ne[3] / K->ne[3]);
    p.rv3    = (int) (Q->ne[3] / V->ne[3]);

    float scale, max_bias, softcap;
    memcpy(&scale,    (const float *) dst->op_params + 0, sizeof(float));
    memcpy(&max_bias, (const float *) dst->op_params + 1, sizeof(float));
    memcpy(&softcap,  (const float *) dst->op_params + 2, sizeof(float));
    if (softcap != 0.0f) {
        scale /= softcap;
    }
    p.scale = scale;
    p.softcap = softcap;
    p.max_bias = max_bias;
    p.n_head_log2 = 1 << (int) floorf(log2f((float) p.n_head));
    p.m0 = powf(2.0f, -(max_bias) / p.n_head_log2);
    p.m1 = powf(2.0f, -(max_bias / 2.0f) / p.n_head_log2);
    p.tab = tq_tables();

    // columns: query rows x GQA heads, at most 8 per block
    const int need = p.n_q * p.gqa;
    p.tpg = need <= TQ_FA_MAX_COLS ? p.n_q : std::max(1, TQ_FA_MAX_COLS / p.gqa);
    const int cols = p.tpg * p.gqa;
    C = cols <= 1 ? 1 : cols <= 2 ? 2 : cols <= 4 ? 4 : 8;
    p.ncol = C;
    p.n_groups = (p.n_q + p.tpg - 1) / p.tpg;

    n_kvh = (int) K->ne[2];
    n_seq = (int) Q->ne[3];
    p.n_cols_total = n_seq * n_kvh * p.n_groups * C;

    const int nsm    = ggml_cuda_info().devices[ctx.device].nsm;
    const int base   = n_kvh * p.n_groups * n_seq;
    const int tiles  = std::max(1, (p.n_kv + TQ_FA_TILE - 1) / TQ_FA_TILE);
    const int want   = tq_fa_want_chunks(tiles, base, nsm, mma);
    p.chunk_keys = TQ_FA_TILE * ((tiles + want - 1) / want);
    n_chunks = std::max(1, (p.n_kv + p.chunk_keys - 1) / p.chunk_keys);
}

bool ggml_cuda_tq_flash_attn_ext(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    if (!ggml_cuda_tq_fattn_handles(dst)) {
        return false;
    }
    switch (tq_fa_kind_of(dst->src[1]->type)) {
        case TQFA_F16:  tq_fa_run<TQFA_F16>(ctx, dst); break;
        case TQFA_Q8_0: tq_fa_run<TQFA_Q8_0>(ctx, dst); break;
#define TQFA_RUN_CASE(name, NAME, ...) case TQFA_##NAME: tq_fa_run<TQFA_##NAME>(ctx, dst); break;
        TQ_FORMATS(TQFA_RUN_CASE)
#undef TQFA_RUN_CASE
        default: GGML_ABORT("no TQ flash-attention kernel for this K type");
    }
    return true;
}
