// llama-tq: whether upstream's Hadamard attention rotation also runs on a TQ side of the KV cache.
#pragma once

#include "ggml.h"

// TQ types rotate every 128-value block internally (tq_codec.h); upstream's rotation over the whole head on top
// is a measured per-type, per-side default (mean KLD vs f16, Gemma 3 270M, bench/results/kv_quality.md): on for
// tq3 K without the key transforms' equalization (tq3/tq3 0.441 -> 0.408), off for tq3 K with it (0.0907 -> 0.0883
// without), off for tq3 V (q8_0/tq3 0.0231 -> 0.0242 with it) and for tq4 (tq4/tq4 0.081; K 0.085, V 0.084, both
// 0.091 with it; equalized: 0.0243, 0.0245 with it on K). The override is `--tq-attn-rot` (common args), whose value reaches
// libllama as LLAMA_TQ_ATTN_ROT=auto|0|1|k|v (auto = the measured default; none, both, K only, V only).
// Other types always get true: upstream's own rules decide for them.
bool llama_tq_attn_rot(ggml_type type, bool is_k, bool keys_equalized = false);
