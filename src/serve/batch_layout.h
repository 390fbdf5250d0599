// A Batch flattened into the model's ForwardBatch (model/forward_batch.h): the arrays one forward
// pass consumes, built once per step on the host.
#pragma once

#include <cstdint>

#include "model/forward_batch.h"
#include "serve/batch.h"

namespace flashserve::serve {

// Throws Error(kInternal) if an entry's block table does not cover its kv_len.
model::ForwardBatch layout_batch(const Batch& batch, int32_t block_size);

}  // namespace flashserve::serve
