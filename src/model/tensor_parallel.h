// How a Llama-family model splits over `size` ranks (Megatron-LM's tensor parallelism): which
// query heads, KV heads, MLP columns and vocabulary rows rank r computes. The weight split that
// follows from it is model/weight_shard.h; the runner that runs the ranks is
// model/tensor_parallel_runner.h (docs/tensor-parallel.md).
//
//   query heads    hq / size each, rank r the r-th block (hq % size == 0)
//   KV heads       hkv >= size: hkv / size each (hkv % size == 0), the KV heads of its query heads;
//                  hkv < size: one each, replicated over the size / hkv ranks whose query heads
//                  use it (size % hkv == 0), as vLLM does
//   MLP            intermediate_size / size columns each (a multiple of size)
//   vocabulary     ceil(vocab / size) rows each, the last rank fewer; the LM head's logits are
//                  all-gathered in blocks of ceil(vocab / size) (NCCL gathers equal blocks)
// A size that breaks any of these is refused by name ("tensor_parallel_size").
#pragma once

#include <cstdint>

#include "model/config.h"
#include "model/shape.h"

namespace flashserve::model {

// One rank's part of the model.
struct RankShape {
  int64_t q_head_begin = 0, q_heads = 0;    // query heads [begin, begin + q_heads)
  int64_t kv_head_begin = 0, kv_heads = 0;  // KV heads its query heads read
  int64_t ffn_begin = 0, ffn = 0;           // gate/up rows, down columns
  int64_t vocab_begin = 0, vocab = 0;       // LM head rows (vocab may be < vocab_block)
  int64_t vocab_block = 0;                  // rows of every rank's block in the logits' gather
};

// Throws Error(kInvalidArgument, "tensor_parallel_size") when `config` cannot be split over
// `size` ranks (the rules above), naming the field that does not divide.
void check_tensor_parallel(const ModelConfig& config, int64_t size);

// Rank `rank`'s part (check_tensor_parallel first; rank in [0, size)).
RankShape rank_shape(const ModelConfig& config, int64_t size, int64_t rank);

// The ordinary model whose step costs what one rank's compute costs: the heads, MLP columns and
// vocabulary of rank 0, the same hidden size and layers (no communication). `flashserve profile
// --tensor-parallel-size N` times it on one device (Vidur's method: a rank's compute measured
// alone, the all-reduces costed from their own table).
ModelConfig rank_config(const ModelConfig& config, int64_t size);

// The cost model's sizes of one rank (rank 0, whose blocks are the largest): its query heads, KV
// heads, MLP columns and LM-head block, the whole embedding table; so weight_bytes() and
// kv_bytes_per_token() are what each GPU holds. The same rules and refusals as
// check_tensor_parallel.
ModelShape rank_model_shape(const ModelShape& model, int64_t size);

}  // namespace flashserve::model
