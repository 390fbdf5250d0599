#include "model/weight_shard.h"

#include <cstring>
#include <string>

#include "flashserve/error.h"
#include "model/tensor_parallel.h"

namespace flashserve::model {

ShardSlice shard_slice(const WeightSpec& w, const ModelConfig& c, int64_t size, int64_t rank) {
  const RankShape r = rank_shape(c, size, rank);
  ShardSlice s;
  s.shape = w.shape;
  int64_t begin = 0, count = 0;
  switch (w.split) {
    case TpSplit::kReplicated:
      return s;
    case TpSplit::kQHeads:
      begin = r.q_head_begin * c.head_dim, count = r.q_heads * c.head_dim;
      break;
    case TpSplit::kKvHeads:
      begin = r.kv_head_begin * c.head_dim, count = r.kv_heads * c.head_dim;
      break;
    case TpSplit::kFfn:
      begin = r.ffn_begin, count = r.ffn;
      break;
    case TpSplit::kVocab:
      begin = r.vocab_begin, count = r.vocab;
      break;
  }
  if (w.split_dim < 0 || static_cast<size_t>(w.split_dim) >= w.shape.size())
    throw Error(ErrorKind::kInternal, w.name, "split dimension outside the tensor");
  s.dim = w.split_dim;
  s.begin = begin;
  s.end = begin + count;
  s.shape[static_cast<size_t>(s.dim)] = count;
  return s;
}

namespace {

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The tensor as [outer, extent, inner] around the split dimension: a slice is rows
// [begin, end) of the middle axis for every outer index.
struct Around {
  int64_t outer = 1, extent = 1, inner = 1;
};
Around around(const std::vector<int64_t>& shape, int dim) {
  Around a;
  for (int i = 0; i < static_cast<int>(shape.size()); ++i) {
    if (i < dim) a.outer *= shape[static_cast<size_t>(i)];
    if (i == dim) a.extent = shape[static_cast<size_t>(i)];
    if (i > dim) a.inner *= shape[static_cast<size_t>(i)];
  }
  return a;
}

}  // namespace

std::vector<std::byte> shard_tensor(const WeightSpec& w, const ModelConfig& c, int64_t size,
                                    int64_t rank, const void* full, size_t elem_size) {
  const ShardSlice s = shard_slice(w, c, size, rank);
  const auto* src = static_cast<const std::byte*>(full);
  std::vector<std::byte> out(static_cast<size_t>(numel(s.shape)) * elem_size);
  if (s.dim < 0) {
    if (!out.empty()) std::memcpy(out.data(), src, out.size());
    return out;
  }
  const Around a = around(w.shape, s.dim);
  const size_t run = static_cast<size_t>((s.end - s.begin) * a.inner) * elem_size;
  for (int64_t o = 0; o < a.outer; ++o)
    if (run > 0)
      std::memcpy(out.data() + static_cast<size_t>(o) * run,
                  src + static_cast<size_t>((o * a.extent + s.begin) * a.inner) * elem_size, run);
  return out;
}

std::vector<std::byte> unshard_tensor(const WeightSpec& w, const ModelConfig& c,
                                      const std::vector<std::vector<std::byte>>& slices,
                                      size_t elem_size) {
  const int64_t size = static_cast<int64_t>(slices.size());
  const size_t bytes = static_cast<size_t>(numel(w.shape)) * elem_size;
  std::vector<std::byte> out(bytes);
  // Which rank wrote each element first: a later rank holding it must agree.
  std::vector<int64_t> owner(static_cast<size_t>(numel(w.shape)), -1);
  for (int64_t r = 0; r < size; ++r) {
    const ShardSlice s = shard_slice(w, c, size, r);
    const std::vector<std::byte>& part = slices[static_cast<size_t>(r)];
    if (part.size() != static_cast<size_t>(numel(s.shape)) * elem_size)
      throw Error(ErrorKind::kInvalidArgument, w.name,
                  "rank " + std::to_string(r) + "'s slice has " + std::to_string(part.size()) +
                      " bytes, not " + std::to_string(numel(s.shape) * elem_size));
    const int dim = s.dim < 0 ? 0 : s.dim;
    const Around a = around(w.shape, dim);
    const int64_t begin = s.dim < 0 ? 0 : s.begin, end = s.dim < 0 ? a.extent : s.end;
    for (int64_t o = 0; o < a.outer; ++o)
      for (int64_t i = begin; i < end; ++i)
        for (int64_t k = 0; k < a.inner; ++k) {
          const int64_t at = (o * a.extent + i) * a.inner + k;
          const int64_t from = (o * (end - begin) + (i - begin)) * a.inner + k;
          std::byte* dst = out.data() + static_cast<size_t>(at) * elem_size;
          const std::byte* src = part.data() + static_cast<size_t>(from) * elem_size;
          int64_t& first = owner[static_cast<size_t>(at)];
          if (first < 0) {
            std::memcpy(dst, src, elem_size);
            first = r;
          } else if (std::memcmp(dst, src, elem_size) != 0) {
            throw Error(ErrorKind::kInvalidArgument, w.name,
                        "ranks " + std::to_string(first) + " and " + std::to_string(r) +
                            " hold different values of element " + std::to_string(at) +
                            " (a replicated part must be the same on every rank)");
          }
        }
  }
  for (size_t i = 0; i < owner.size(); ++i)
    if (owner[i] < 0)
      throw Error(ErrorKind::kInternal, w.name,
                  "element " + std::to_string(i) + " is held by no rank");
  return out;
}

RankWeights::RankWeights(const Checkpoint& ckpt, int64_t size, int64_t rank)
    : ckpt_(ckpt), size_(size), rank_(rank) {
  rank_shape(ckpt.config(), size, rank);  // refuses a size that does not split the model
  for (WeightSpec& w : weight_specs(ckpt.config())) specs_.emplace(w.name, std::move(w));
}

RankTensor RankWeights::tensor(const std::string& name) const {
  const auto spec = specs_.find(name);
  if (spec == specs_.end())
    throw Error(ErrorKind::kInvalidArgument, name, "is not a tensor of this model");
  RankTensor t(ckpt_.tensor(name));
  const WeightSpec& w = spec->second;
  if (size_ == 1 || w.split == TpSplit::kReplicated) return t;
  const ModelConfig& c = ckpt_.config();
  t.slice = shard_tensor(w, c, size_, rank_, t.info.data, dtype_size(t.info.dtype));
  t.info.data = t.slice.data();
  t.info.bytes = t.slice.size();
  t.info.shape = shard_slice(w, c, size_, rank_).shape;
  return t;
}

}  // namespace flashserve::model
