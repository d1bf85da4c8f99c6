// llama-tq: state files that cannot crash or poison a context (issue 43).
#pragma once

#include "ggml.h"
#include "llama.h"

#include <cstddef>
#include <functional>

// Whether the TQ blocks in bytes [offset, offset + size) of a restored K or V tensor have finite scales (a NaN or Inf
// scale decodes to NaN / Inf keys or values: a corrupt or crafted file). True for other types.
bool llama_tq_rows_ok(const ggml_tensor * t, size_t offset, size_t size);

// Runs load() (a sequence-state restore into seq) so that a refused or failed restore leaves the sequence exactly as
// it was: its state is copied first and put back when load() returns 0 or throws. Returns what load() returned (0 on
// an exception, after logging it). restores = false: load() only reads the file's token count (llama-server asks for
// it first), nothing to copy.
size_t llama_tq_state_seq_load(llama_context * ctx, llama_seq_id seq, bool restores, const std::function<size_t()> & load);
