// llama-tq: the Metal backend's TQ3/TQ4 hooks. SET_ROWS, CPY and GET_ROWS run through upstream's op code (the
// kernels carry upstream's names and argument layouts); flash attention with a TQ side is encoded here.
#include "ggml-metal-tq.h"

#include "ggml-backend-impl.h"
#include "ggml-impl.h"
#include "ggml-metal-impl.h"
#include "ggml-tq.h" // the TQ types and the backends' head sizes (tq_formats.h)

#include <cmath>
#include <cstdio>
#include <cstring>

// The TQ types kernels/tq.metal has: those of a block size with MTL rows in TQ_FA_HEADS (tq_formats.h). The others
// (the 96-value blocks) are left to upstream's checks, which refuse them: the scheduler runs them on the CPU.
static bool tq_is_tq(ggml_type t) {
    if (!ggml_tq_is_tq(t)) {
        return false;
    }
    const int64_t n = ggml_blck_size(t);
#define TQ_MTL_BLOCK(b, v, h)                     \
    if (std::strcmp(#b, "MTL") == 0 && n == (v)) { \
        return true;                              \
    }
    TQ_FA_HEADS(TQ_MTL_BLOCK)
#undef TQ_MTL_BLOCK
    return false;
}

static bool tq_is_64(ggml_type t) { return ggml_blck_size(t) == 64; }

bool ggml_metal_tq_involved(const ggml_tensor * op) {
    if (tq_is_tq(op->type)) {
        return true;
    }
    for (int i = 0; i < GGML_MAX_SRC; ++i) {
        if (op->src[i] != nullptr && tq_is_tq(op->src[i]->type)) {
            return true;
        }
    }
    return false;
}

// The K/V pairs and head sizes kernels/tq.metal instantiates: a TQ side, the other f16, q8_0 or TQ of the same
// block size; the head sizes of TQ_FA_HEADS's MTL rows (tq_formats.h).
static bool tq_fa_supported(const ggml_tensor * op) {
    const ggml_tensor * q = op->src[0], * k = op->src[1], * v = op->src[2], * mask = op->src[3], * sinks = op->src[4];
    const ggml_type tk = k->type, tv = v->type;
    const bool k_tq = tq_is_tq(tk), v_tq = tq_is_tq(tv);
    const bool b64 = k_tq ? tq_is_64(tk) : tq_is_64(tv);
    auto partner_ok = [&](ggml_type t) {
        return t == GGML_TYPE_F16 || t == GGML_TYPE_Q8_0 || (tq_is_tq(t) && tq_is_64(t) == b64);
    };
    const int64_t d = k->ne[0];
    const bool d_ok = tq_fa_head_ok("MTL", b64 ? 64 : 128, (int) d); // tq_formats.h: the head sizes instantiated
    return (k_tq || v_tq) && partner_ok(tk) && partner_ok(tv) && d_ok && v->ne[0] == d && q->ne[0] == d &&
           q->type == GGML_TYPE_F32 && op->type == GGML_TYPE_F32 && (mask == nullptr || mask->type == GGML_TYPE_F16) &&
           (sinks == nullptr || sinks->type == GGML_TYPE_F32) && q->ne[2] % k->ne[2] == 0 && q->ne[3] % k->ne[3] == 0;
}

bool ggml_metal_tq_supports_op(const ggml_tensor * op) {
    const ggml_tensor * s0 = op->src[0];
    switch (op->op) {
        case GGML_OP_SET_ROWS:
            return tq_is_tq(op->type) && s0->type == GGML_TYPE_F32 &&
                   (op->src[1]->type == GGML_TYPE_I64 || op->src[1]->type == GGML_TYPE_I32) &&
                   op->ne[0] % ggml_blck_size(op->type) == 0;
        case GGML_OP_CPY:
            return (s0->type == GGML_TYPE_F32 && tq_is_tq(op->type)) ||
                   (tq_is_tq(s0->type) && (op->type == GGML_TYPE_F32 || op->type == GGML_TYPE_F16));
        case GGML_OP_GET_ROWS:
            return tq_is_tq(s0->type) && op->src[1]->type == GGML_TYPE_I32 && op->type == GGML_TYPE_F32;
        case GGML_OP_FLASH_ATTN_EXT:
            return tq_fa_supported(op);
        default:
            return false;
    }
}

static ggml_metal_buffer_id tq_buffer_id(const ggml_tensor * t) {
    ggml_backend_buffer_t buffer = t->view_src ? t->view_src->buffer : t->buffer;
    return ggml_metal_buffer_get_id((ggml_metal_buffer_t) buffer->context, t);
}

int ggml_metal_tq_flash_attn_ext(ggml_metal_library_t lib, ggml_metal_encoder_t enc, const ggml_tensor * op) {
    const ggml_tensor * q = op->src[0], * k = op->src[1], * v = op->src[2], * mask = op->src[3], * sinks = op->src[4];
    if (!tq_is_tq(k->type) && !tq_is_tq(v->type)) {
        return 0;
    }
    float scale, max_bias, softcap;
    std::memcpy(&scale, (const float *) op->op_params + 0, sizeof(float));
    std::memcpy(&max_bias, (const float *) op->op_params + 1, sizeof(float));
    std::memcpy(&softcap, (const float *) op->op_params + 2, sizeof(float));
    if (softcap != 0.0f) {
        scale /= softcap; // the kernel computes softcap * tanh(scale * q.k), as the CPU does
    }
    const uint32_t n_head = (uint32_t) q->ne[2];
    const int32_t n_head_log2 = 1 << (int32_t) floorf(log2f((float) n_head));

    ggml_metal_kargs_flash_attn_ext_vec args = {};
    args.ne01 = (int32_t) q->ne[1];
    args.ne02 = (int32_t) q->ne[2];
    args.ne03 = (int32_t) q->ne[3];
    args.nb01 = q->nb[1];
    args.nb02 = q->nb[2];
    args.nb03 = q->nb[3];
    args.ne11 = (int32_t) k->ne[1];
    args.ne_12_2 = (int32_t) k->ne[2];
    args.ne_12_3 = (int32_t) k->ne[3];
    args.nb11 = k->nb[1];
    args.nb12 = k->nb[2];
    args.nb13 = k->nb[3];
    args.nb21 = v->nb[1];
    args.nb22 = v->nb[2];
    args.nb23 = v->nb[3];
    if (mask) {
        args.ne31 = (int32_t) mask->ne[1];
        args.ne32 = (int32_t) mask->ne[2];
        args.ne33 = (int32_t) mask->ne[3];
        args.nb31 = mask->nb[1];
        args.nb32 = mask->nb[2];
        args.nb33 = mask->nb[3];
    }
    args.ne1 = (int32_t) op->ne[1];
    args.ne2 = (int32_t) op->ne[2];
    args.ne3 = (int32_t) op->ne[3];
    args.scale = scale;
    args.max_bias = max_bias;
    args.m0 = powf(2.0f, -(max_bias) / n_head_log2);
    args.m1 = powf(2.0f, -(max_bias / 2.0f) / n_head_log2);
    args.n_head_log2 = n_head_log2;
    args.logit_softcap = softcap;
    args.n_kv_max_padded = (mask ? 1 : 0) | (sinks ? 2 : 0); // flags: the TQ kernel has no padded KV

    char name[128];
    snprintf(name, sizeof(name), "kernel_tq_flash_attn_ext_%s_%s_d%d", ggml_type_name(k->type), ggml_type_name(v->type),
             (int) k->ne[0]);
    ggml_metal_pipeline_with_params pipeline = ggml_metal_library_get_pipeline(lib, name);
    if (!pipeline.pipeline) {
        pipeline = ggml_metal_library_compile_pipeline(lib, name, name, nullptr);
    }
    GGML_ASSERT(pipeline.pipeline && "llama-tq: no Metal flash-attention kernel for this K/V pair (supports_op admits only instantiated ones)");

    ggml_metal_encoder_set_pipeline(enc, pipeline);
    ggml_metal_encoder_set_bytes(enc, &args, sizeof(args), 0);
    ggml_metal_encoder_set_buffer(enc, tq_buffer_id(q), 1);
    ggml_metal_encoder_set_buffer(enc, tq_buffer_id(k), 2);
    ggml_metal_encoder_set_buffer(enc, tq_buffer_id(v), 3);
    ggml_metal_encoder_set_buffer(enc, tq_buffer_id(mask ? mask : q), 4); // bound, unread without the flag
    ggml_metal_encoder_set_buffer(enc, tq_buffer_id(sinks ? sinks : q), 5);
    ggml_metal_encoder_set_buffer(enc, tq_buffer_id(op), 6);
    ggml_metal_encoder_dispatch_threadgroups(enc, (int) q->ne[1], (int) q->ne[2], (int) q->ne[3], 32, 1, 1);
    return 1;
}
