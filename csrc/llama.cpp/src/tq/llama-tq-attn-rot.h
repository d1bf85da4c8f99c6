// llama-tq: whether upstream's Hadamard attention rotation also runs on a TQ side of the KV cache.
#pragma once

#include "ggml.h"

// TQ types rotate every 128-value block internally (tq_codec.h); upstream's rotation over the whole head on top
// is a measured per-type, per-side default (mean KLD vs f16, Gemma 3 270M, 16-chunk protocol of
// bench/results/kv_quality.md): on only for tq3 K whose keys get neither of the key transforms (llama-tq-keys.h),
// where it helps (tq3/tq3 0.441 -> 0.408). With centering alone it no longer does (0.2193 without, 0.2246 with:
// bench/results/attn_rot_centered/), nor with equalization (0.0883 without, 0.0907 with). Off for tq3 V
// (q8_0/tq3 0.0231 -> 0.0242 with it) and for tq4 (tq4/tq4 0.081; K 0.085, V 0.084, both 0.091 with it;
// equalized: 0.0243, 0.0245 with it on K). Off also saves a Hadamard mat-mul of Q and of K per layer.
// The override is llama_tq_params.attn_rot (`--tq-attn-rot auto|0|1|k|v` in the common args: the measured default;
// none, both, K only, V only), read while a context makes its caches (llama-tq-params.h).
// The 64-value blocks (heads of 64, 192, ...: 64 x an odd number) get it off on both sides: there upstream's
// Hadamard is the largest power of two dividing the head, 64, so it only re-rotates each of our blocks (head-64
// synthetic model on the H100, bench/results/cuda/head64/: tq3 K 0.0987 with it vs 0.0984 without, V 0.111 with
// it; tq4 K 0.0259 vs 0.0258). (Gemma forced to 64-value blocks at head 256, where upstream's rotation would mix
// four blocks, gains ~10 % from it on K, but no model gets 64-value blocks at a power-of-two head.)
// Other types always get true: upstream's own rules decide for them.
bool llama_tq_attn_rot(ggml_type type, bool is_k, bool keys_transformed = false);
