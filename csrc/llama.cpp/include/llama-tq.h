// llama-tq: the public C API of the TQ KV cache options and TriAttention eviction, beside llama.h (no field is added
// to any of upstream's structs: llama-cpp-python reads those with ctypes).
//
// Options are parameters, handed to a context when it is made: llama_init_from_model_tq() for the TQ cache options,
// llama_triatt_configure() for eviction. llama.cpp's common argument parser fills both from --tq-* / --triatt-* (and
// their LLAMA_ARG_* variables); the library reads no environment for them.
#pragma once

#include "llama.h"
#include "triatt_params.h"

#ifdef __cplusplus
extern "C" {
#endif

// Exact key transforms for TQ keys (docs/key-transforms.md): applied to tq3/tq4 K caches, never to other types.
enum llama_tq_keys_mode {
    LLAMA_TQ_KEYS_AUTO   = 0, // key-mean centering + channel equalization (the measured default; "auto" or "1")
    LLAMA_TQ_KEYS_NONE   = 1, // "0"
    LLAMA_TQ_KEYS_MEAN   = 2, // centering only
    LLAMA_TQ_KEYS_EQ     = 3, // equalization only
    LLAMA_TQ_KEYS_MATRIX = 4, // centering + equalization by a full matrix per KV head (the key basis)
};

// Upstream's Hadamard attention rotation on the TQ sides of the cache (other types keep upstream's rules).
enum llama_tq_attn_rot_mode {
    LLAMA_TQ_ATTN_ROT_AUTO = 0, // the measured default per type and side (docs/codec.md)
    LLAMA_TQ_ATTN_ROT_NONE = 1, // "0"
    LLAMA_TQ_ATTN_ROT_BOTH = 2, // "1"
    LLAMA_TQ_ATTN_ROT_K    = 3, // "k"
    LLAMA_TQ_ATTN_ROT_V    = 4, // "v"
};

struct llama_tq_params {
    int32_t keys;     // enum llama_tq_keys_mode
    int32_t attn_rot; // enum llama_tq_attn_rot_mode
};

LLAMA_API struct llama_tq_params llama_tq_default_params(void);

// Sets one option by its flag's name and value as the command line spells them ("keys": auto|1|mean|eq|0|matrix,
// "attn_rot": auto|0|1|k|v). Returns 0, or -1 with a message in err (if not NULL); params is unchanged then.
LLAMA_API int32_t llama_tq_params_set(struct llama_tq_params * params, const char * name, const char * value,
                                      char * err, size_t err_size);

// llama_init_from_model with TQ cache options (NULL: the defaults). Returns NULL, after logging why, for invalid
// options or where llama_init_from_model would.
LLAMA_API struct llama_context * llama_init_from_model_tq(struct llama_model * model,
                                                          struct llama_context_params params,
                                                          const struct llama_tq_params * tq);

// llama_init_from_model_tq with the calibration that tq3a keys need (key_cal: a file written by `llama-tq
// calibrate` for this model, NULL or "" for none; a tq3a K cache without one is refused). Other cache types ignore it.
LLAMA_API struct llama_context * llama_init_from_model_tq_cal(struct llama_model * model,
                                                              struct llama_context_params params,
                                                              const struct llama_tq_params * tq, const char * key_cal);

// TriAttention V3 eviction (docs/triattention.md). The fields, their defaults and meanings: triatt_params.h.
struct llama_triatt_params {
#define LLAMA_TRIATT_FIELD(field, def, flag, hint, help) int32_t field;
#define LLAMA_TRIATT_RETIRED(field) int32_t retired_##field; // a removed option's slot: ignored
    TRIATT_PARAMS(LLAMA_TRIATT_FIELD, LLAMA_TRIATT_RETIRED)
#undef LLAMA_TRIATT_FIELD
#undef LLAMA_TRIATT_RETIRED
};

LLAMA_API struct llama_triatt_params llama_triatt_default_params(void);

// Returns 0, or -1 with a message in err (if not NULL) for invalid settings or an unsupported model; nothing
// changes then. A budget of 0 turns eviction off.
LLAMA_API int32_t llama_triatt_configure(struct llama_context * ctx, const struct llama_triatt_params * params,
                                         char * err, size_t err_size);

// Eviction rounds run, cells evicted and cached keys read and scored anew so far (0 when eviction is off).
// A key is read once and reused by later rounds until its cell is rewritten or the cache's keys change.
LLAMA_API int32_t llama_triatt_n_rounds (const struct llama_context * ctx);
LLAMA_API int64_t llama_triatt_n_evicted(const struct llama_context * ctx);
LLAMA_API int64_t llama_triatt_n_folded (const struct llama_context * ctx);

#ifdef __cplusplus
}
#endif
