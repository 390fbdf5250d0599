#include "model/tensor_parallel.h"

#include <algorithm>
#include <string>

#include "flashserve/error.h"

namespace flashserve::model {

namespace {

[[noreturn]] void refuse(int64_t size, const std::string& why) {
  throw Error(ErrorKind::kInvalidArgument, "tensor_parallel_size",
              std::to_string(size) + " does not split this model: " + why);
}

// The split's rules (tensor_parallel.h) on the sizes they involve, named as config.json names them.
void check_split(int64_t heads, int64_t hkv, int64_t intermediate_size, int64_t size) {
  if (size < 1) refuse(size, "it must be at least 1");
  const auto n = std::to_string(size);
  if (heads % size != 0)
    refuse(size, "num_attention_heads " + std::to_string(heads) + " is not a multiple of " + n);
  // Fewer KV heads than ranks: each is replicated over size / hkv ranks, which must be a whole
  // number for every rank's query heads to share one KV head.
  if (hkv >= size ? hkv % size != 0 : size % hkv != 0)
    refuse(size, "num_key_value_heads " + std::to_string(hkv) +
                     (hkv >= size ? " is not a multiple of " + n
                                  : " does not divide it (a KV head would be replicated over a "
                                    "fractional number of ranks)"));
  if (intermediate_size % size != 0)
    refuse(size,
           "intermediate_size " + std::to_string(intermediate_size) + " is not a multiple of " + n);
}

}  // namespace

void check_tensor_parallel(const ModelConfig& c, int64_t size) {
  check_split(c.num_attention_heads, c.num_key_value_heads, c.intermediate_size, size);
}

RankShape rank_shape(const ModelConfig& c, int64_t size, int64_t rank) {
  check_tensor_parallel(c, size);
  if (rank < 0 || rank >= size)
    throw Error(ErrorKind::kInvalidArgument, "rank",
                std::to_string(rank) + " is outside [0, " + std::to_string(size) + ")");
  RankShape s;
  s.q_heads = c.num_attention_heads / size;
  s.q_head_begin = rank * s.q_heads;
  const int64_t hkv = c.num_key_value_heads;
  s.kv_heads = hkv >= size ? hkv / size : 1;
  // The KV head of its first query head: the group of hq / hkv query heads holds whole ranks'
  // blocks (hq / size divides hq / hkv when hkv < size), so every query head of the rank reads it.
  s.kv_head_begin = s.q_head_begin / (c.num_attention_heads / hkv);
  s.ffn = c.intermediate_size / size;
  s.ffn_begin = rank * s.ffn;
  s.vocab_block = (c.vocab_size + size - 1) / size;
  s.vocab_begin = std::min(c.vocab_size, rank * s.vocab_block);
  s.vocab = std::min(c.vocab_size, s.vocab_begin + s.vocab_block) - s.vocab_begin;
  return s;
}

ModelConfig rank_config(const ModelConfig& c, int64_t size) {
  const RankShape s = rank_shape(c, size, 0);
  ModelConfig r = c;
  r.num_attention_heads = s.q_heads;
  r.num_key_value_heads = s.kv_heads;
  r.intermediate_size = s.ffn;
  r.vocab_size = s.vocab_block;
  // Token ids of the original model must stay valid in the stand-in.
  r.bos_token_id = -1;
  r.eos_token_ids.clear();
  return r;
}

ModelShape rank_model_shape(const ModelShape& m, int64_t size) {
  check_split(m.heads, m.kv_heads, m.ffn, size);
  ModelShape r = m;
  r.heads = m.heads / size;
  r.kv_heads = m.kv_heads >= size ? m.kv_heads / size : 1;
  r.ffn = m.ffn / size;
  r.vocab = (m.vocab + size - 1) / size;
  r.embedding_rows = m.embedding_rows > 0 ? m.embedding_rows : m.vocab;
  return r;
}

}  // namespace flashserve::model
