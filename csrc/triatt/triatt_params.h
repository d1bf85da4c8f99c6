/* TriAttention's parameters, written once. Everything else is generated from this list: the engine's
 * triatt_config and its defaults (triatt.h), the public struct llama_triatt_params (include/llama-tq.h, whose
 * layout follows this order), the range check, the --triatt-* flags and their LLAMA_ARG_TRIATT_* variables
 * (common/llama-tq-args.cpp), and the Python binding's fields and keywords (llama_tq._triatt.PARAMS).
 *
 * X(field, default, flag, value hint, help) for a parameter; RETIRED(field) for a slot of the public struct that a
 * removed option left behind (kept so that the struct's layout does not change; ignored). Values are int32, and
 * none may be negative. The defaults are measured: bench/results/v3_eviction.md. */
#ifndef TRIATT_PARAMS_H
#define TRIATT_PARAMS_H

#define TRIATT_PARAMS(X, RETIRED)                                                                                     \
    X(budget, 0, "--triatt-budget", "N",                                                                              \
      "TriAttention eviction: keep each sequence's full-attention KV cache at N cells (0 = off)")                     \
    X(hybrid, 2, "--triatt-hybrid", "N",                                                                              \
      "deprecated integer form of --triatt-policy: 0 v1, 1 v2, 2 v3, 3 streaming, 4 random")                          \
    X(prefix, 128, "--triatt-prefix", "N", "TriAttention V3 and baselines: the first N positions are never evicted")  \
    X(window, 128, "--triatt-window", "N", "TriAttention: the last N positions are never evicted")                    \
    X(segments, 2, "--triatt-segments", "N", "TriAttention V2/V3: segments with their own share of the budget")       \
    X(divide, 128, "--triatt-divide", "N", "TriAttention: evict once a sequence holds more than budget + N cells")    \
    X(warmup, 1024, "--triatt-warmup", "N", "TriAttention: tokens whose queries calibrate the score")                 \
    X(boundary_skip, 0, "--triatt-boundary-skip", "N",                                                                \
      "TriAttention: attention layers at each end of the stack left out of the score")                                \
    X(pool, 8, "--triatt-pool", "N",                                                                                  \
      "TriAttention V1-V3: rank a cell by the best score within N positions of it, so a span is kept or evicted "     \
      "whole (0 = its own score)")                                                                                    \
    RETIRED(pool_top)                                                                                                 \
    X(pool_spans, 96, "--triatt-pool-spans", "S",                                                                     \
      "TriAttention V1-V3: pool only where a sequence's free slots (budget minus prefix and window) hold S spans "    \
      "of 2 pool + 1 cells, else rank by own scores (0 = always pool)")

/* The policies, by their --triatt-policy names (the value of the `hybrid` field). */
#define TRIATT_POLICIES(P)                                                                                            \
    P(0, "v1", "V1")                                                                                                  \
    P(1, "v2", "V2")                                                                                                  \
    P(2, "v3", "V3")                                                                                                  \
    P(3, "streaming", "StreamingLLM")                                                                                 \
    P(4, "random", "random")

#endif /* TRIATT_PARAMS_H */
