// llama-tq: the TQ cache types and the block size that fits a model's heads (issue 14).
//
// Users pick tq3 / tq4. A head size that is a multiple of 128 keeps the 128-value types (52 / 68 bytes per block);
// one that is a multiple of 64 but not of 128 (64, 192, ...) gets the 64-value variants tq3_64 / tq4_64 (28 / 36
// bytes: the same algorithm with a 64-point rotation, tq_codec.h); one that is a multiple of 96 only (96: Phi-3,
// 288, ...) the 96-value variants tq3_96 / tq4_96 (40 / 52 bytes, 3.33 / 4.33 bits per value). Other head sizes
// (80, 112, ...), and MLA caches, are refused at context creation with a message that names the head size.
#pragma once

#include "ggml-backend.h" // the device probe of llama_tq3a_dev_writes
#include "ggml.h"
#include "ggml-tq.h" // ggml_tq_is_tq: the TQ types, from tq_formats.h
#include "llama-hparams.h"
#include "llama-impl.h"
#include "llama-model.h"
#include "llama-tq-params.h" // the options and the TQ3A calibration of the context being made

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>


// TQ3_64 / TQ3_96 -> TQ3, TQ4_64 / TQ4_96 -> TQ4 (the policies are decided per bit width); other types unchanged.
inline ggml_type llama_tq_base_type(ggml_type t) {
    return t == GGML_TYPE_TQ3_64 || t == GGML_TYPE_TQ3_96   ? GGML_TYPE_TQ3
           : t == GGML_TYPE_TQ4_64 || t == GGML_TYPE_TQ4_96 ? GGML_TYPE_TQ4
                                                             : t;
}

// Whether dev's backend writes a TQ3A cache (its SET_ROWS from f32 rows): CPU and CUDA do, Metal does not yet.
inline bool llama_tq3a_dev_writes(ggml_backend_dev_t dev) {
    const ggml_init_params ip = {4 * ggml_tensor_overhead(), nullptr, true}; // tensors without data: a probe
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * cache = ggml_new_tensor_2d(ctx, GGML_TYPE_TQ3A, TQ3A_BLOCK, 1);
    ggml_tensor * op = ggml_set_rows(ctx, cache, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, TQ3A_BLOCK, 1),
                                     ggml_new_tensor_1d(ctx, GGML_TYPE_I64, 1));
    const bool ok = ggml_backend_dev_supports_op(dev, op);
    ggml_free(ctx);
    return ok;
}

// TQ3A (keys only, CPU and CUDA kernels, heads of 256, a calibration of this model): whether this context can have it,
// after logging why not. Its block is the head, ordered by the calibration's energies and coded in four groups of
// their own width, so the key transforms are not optional (llama-tq-keys.h) and upstream's K rotation stays off.
inline bool llama_tq3a_check(const llama_model & model, bool is_k, bool offload_kqv) {
    const llama_hparams & hp = model.hparams;
    if (!is_k) {
        LLAMA_LOG_ERROR("%s: tq3a is a key type (its bits follow the queries' energy); use tq3 or tq4 for V\n",
                        __func__);
        return false;
    }
    if (hp.is_mla() || (hp.rope_type != LLAMA_ROPE_TYPE_NORM && hp.rope_type != LLAMA_ROPE_TYPE_NEOX)) {
        LLAMA_LOG_ERROR("%s: tq3a keys need a model with plain RoPE attention (normal or NEOX; no MLA); use tq3 or "
                        "tq4\n", __func__);
        return false;
    }
    for (uint32_t il = 0; il < hp.n_layer(); ++il) {
        if (hp.has_kv(il) && (hp.n_embd_head_k(il) != TQ3A_BLOCK || (hp.has_rope(il) && hp.n_rot(il) != TQ3A_BLOCK))) {
            LLAMA_LOG_ERROR("%s: tq3a keys need heads of %d values with RoPE over all of them (layer %u: head %u, RoPE "
                            "over %u); use tq3 or tq4\n", __func__, TQ3A_BLOCK, il, hp.n_embd_head_k(il), hp.n_rot(il));
            return false;
        }
        if (offload_kqv && hp.has_kv(il) && !llama_tq3a_dev_writes(model.dev_layer((int) il))) {
            LLAMA_LOG_ERROR("%s: %s has no tq3a kernels (CPU and CUDA have them): keep the KV cache on the CPU "
                            "(--no-kv-offload / -nkvo) or use tq3 / tq4 keys\n", __func__,
                            ggml_backend_dev_name(model.dev_layer((int) il)));
            return false;
        }
    }
    if (hp.no_alloc) {
        return true; // a memory probe (common's fit to device memory) of a model without weights: nothing runs
    }
    const int32_t mode = llama_tq_params_for_new_cache().keys;
    if (mode != LLAMA_TQ_KEYS_AUTO && mode != LLAMA_TQ_KEYS_MATRIX) {
        LLAMA_LOG_ERROR("%s: tq3a keys always take the key transforms (--tq-keys auto)\n", __func__);
        return false;
    }
    const auto cal = llama_tq_key_cal_for_new_cache();
    if (cal == nullptr) {
        LLAMA_LOG_ERROR("%s: tq3a keys need a calibration of this model: `llama-tq calibrate --model MODEL -o "
                        "MODEL.tqcal`, then --tq-keys-cal MODEL.tqcal\n", __func__);
        return false;
    }
    const std::string arch = model.arch_name();
    bool fits = cal->arch == arch && cal->n_layer == hp.n_layer() && cal->head == hp.n_embd_head_k(0);
    for (uint32_t il = 0; fits && il < hp.n_layer(); ++il) {
        fits = !hp.has_kv(il) || cal->n_head_kv == hp.n_head_kv(il);
    }
    for (uint32_t il = 0; fits && il < hp.n_layer(); ++il) {
        if (hp.has_kv(il) && !cal->have[il]) {
            LLAMA_LOG_ERROR("%s: the TQ key calibration %s has no energies of layer %u: write it again with "
                            "`llama-tq calibrate`\n", __func__, cal->path.c_str(), il);
            return false;
        }
    }
    if (!fits) {
        LLAMA_LOG_ERROR("%s: the TQ key calibration %s is of another model (%s, %u layers, %u KV heads of %u; this "
                        "model: %s, %u layers, heads of %u): calibrate this one with `llama-tq calibrate`\n", __func__,
                        cal->path.c_str(), cal->arch.c_str(), cal->n_layer, cal->n_head_kv, cal->head, arch.c_str(),
                        hp.n_layer(), hp.n_embd_head_k(0));
        return false;
    }
    return true;
}

// The cache type for a side (K or V) of this model: tq3/tq4 switch to their 64- or 96-value blocks where a head size
// needs it. Returns GGML_TYPE_COUNT (after logging why) when no TQ block fits; other types pass through.
// offload_kqv: layers whose device is not the CPU keep their KV there. The CPU takes every head size; a GPU backend
// takes a 64- or 96-value cache only at the head sizes its flash-attention kernels have (TQ_FA_HEADS, tq_formats.h:
// the table its supports_op reads), anything else is refused here rather than run on the CPU a step at a time. The
// 128-value blocks are never refused: where a backend lacks the head size, upstream's kernels run after a conversion.
inline ggml_type llama_tq_type_for_heads(ggml_type t, const llama_model & model, bool is_k, bool offload_kqv) {
    if (t == GGML_TYPE_TQ3A) {
        return llama_tq3a_check(model, is_k, offload_kqv) ? t : GGML_TYPE_COUNT;
    }
    if (t != GGML_TYPE_TQ3 && t != GGML_TYPE_TQ4) {
        return t;
    }
    const llama_hparams & hp = model.hparams;
    std::vector<std::string> gpus; // registry names of the non-CPU backends that hold KV layers
    for (uint32_t il = 0; offload_kqv && il < hp.n_layer(); ++il) {
        ggml_backend_dev_t dev = model.dev_layer((int) il);
        if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
            continue;
        }
        // (a device of -sm tensor's meta backend belongs to no registry: its own name, which has no TQ_FA_HEADS row)
        ggml_backend_reg_t r = ggml_backend_dev_backend_reg(dev);
        const char * reg = r != nullptr ? ggml_backend_reg_name(r) : ggml_backend_dev_name(dev);
        const std::string name = reg != nullptr ? reg : "?";
        if (std::find(gpus.begin(), gpus.end(), name) == gpus.end()) {
            gpus.push_back(name);
        }
    }
    const char * side = is_k ? "K" : "V";
    if (hp.is_mla()) {
        LLAMA_LOG_ERROR("%s: %s cache type %s: MLA caches (a K of %u values with V a view of it) are not supported by "
                        "the TQ types yet; use f16, q8_0 or q4_0\n", __func__, side, ggml_type_name(t),
                        hp.n_embd_head_k_mla());
        return GGML_TYPE_COUNT;
    }
    bool all128 = true, all64 = true, all96 = true;
    for (uint32_t il = 0; il < hp.n_layer(); ++il) {
        if (!hp.has_kv(il)) {
            continue;
        }
        const uint32_t head = is_k ? hp.n_embd_head_k(il) : hp.n_embd_head_v(il);
        all128 = all128 && head % 128 == 0;
        all64  = all64 && head % 64 == 0;
        all96  = all96 && head % 96 == 0;
        if (head % 64 != 0 && head % 96 != 0) {
            LLAMA_LOG_ERROR("%s: %s cache type %s does not support head size %u (layer %u): TQ types need a multiple "
                            "of 64 or 96 (128-value blocks for multiples of 128, 64- or 96-value blocks otherwise); "
                            "use f16, or q8_0 / q4_0 where the head size is a multiple of 32\n", __func__, side,
                            ggml_type_name(t), head, il);
            return GGML_TYPE_COUNT;
        }
    }
    if (all128) {
        return t;
    }
    if (!all64 && !all96) {
        LLAMA_LOG_ERROR("%s: %s cache type %s: this model's layers mix head sizes that no one TQ block size divides "
                        "(64 or 96); use q4_0 or q8_0\n", __func__, side, ggml_type_name(t));
        return GGML_TYPE_COUNT;
    }
    const ggml_type tn = all64 ? (t == GGML_TYPE_TQ3 ? GGML_TYPE_TQ3_64 : GGML_TYPE_TQ4_64)
                               : (t == GGML_TYPE_TQ3 ? GGML_TYPE_TQ3_96 : GGML_TYPE_TQ4_96);
    const int64_t bs = ggml_blck_size(tn);
    for (const std::string & gpu : gpus) {
        for (uint32_t il = 0; il < hp.n_layer(); ++il) {
            const uint32_t head = is_k ? hp.n_embd_head_k(il) : hp.n_embd_head_v(il);
            if (!hp.has_kv(il) || tq_fa_head_ok(gpu.c_str(), (int) bs, (int) head)) {
                continue;
            }
            std::string heads; // what this backend has for the block size
#define TQ_HEADS_OF(b, v, h)                                                                                      \
    if (gpu == #b && (v) == bs) {                                                                                 \
        heads += (heads.empty() ? "" : ", ") + std::to_string(h);                                                 \
    }
            TQ_FA_HEADS(TQ_HEADS_OF)
#undef TQ_HEADS_OF
            LLAMA_LOG_ERROR("%s: %s cache type %s needs %d-value blocks (%s) for head size %u, which the %s backend has "
                            "no kernels for (%s): keep the KV cache on the CPU (--no-kv-offload / -nkvo) or use q4_0\n",
                            __func__, side, ggml_type_name(t), (int) bs, ggml_type_name(tn), head, gpu.c_str(),
                            heads.empty() ? "it has none for these blocks" : ("it has head sizes " + heads).c_str());
            return GGML_TYPE_COUNT;
        }
    }
    LLAMA_LOG_INFO("%s: %s cache type %s uses %d-value blocks (%s, %.3f bits per value) for this model's head size\n",
                   __func__, side, ggml_type_name(t), (int) bs, ggml_type_name(tn),
                   8.0 * (double) ggml_type_size(tn) / (double) bs);
    return tn;
}
