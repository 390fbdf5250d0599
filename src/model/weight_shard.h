// The tensor-parallel split of every weight (WeightSpec::split over model/tensor_parallel.h's
// RankShape): the slice rank r holds, cutting a whole tensor into it, and putting the slices of
// all ranks back together (unshard(shard(W)) == W, tested for every weight). Element type
// agnostic (bytes of elem_size), so bf16 checkpoints are cut without widening.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace flashserve::model {

// Rank `rank`'s slice of weight `w`: rows (dim 0) or columns (dim 1) [begin, end) of w.shape, or
// all of it (replicated: dim -1).
struct ShardSlice {
  int dim = -1;
  int64_t begin = 0, end = 0;
  std::vector<int64_t> shape;  // the slice's shape
};

ShardSlice shard_slice(const WeightSpec& w, const ModelConfig& config, int64_t size, int64_t rank);

// The slice of `full` (w.shape, row-major, elem_size bytes an element) that rank `rank` holds,
// row-major in its own shape.
std::vector<std::byte> shard_tensor(const WeightSpec& w, const ModelConfig& config, int64_t size,
                                    int64_t rank, const void* full, size_t elem_size);

// The whole tensor from the slices of ranks 0..size-1 (each as shard_tensor gives it). Every
// element is covered; one that several ranks hold (a replicated tensor, a KV head shared by ranks)
// must be the same on each: Error(kInvalidArgument, w.name) naming the ranks that disagree, and
// for a slice of the wrong byte size.
std::vector<std::byte> unshard_tensor(const WeightSpec& w, const ModelConfig& config,
                                      const std::vector<std::vector<std::byte>>& slices,
                                      size_t elem_size);

// A checkpoint tensor as one rank holds it: the file's mapping where the rank holds all of it,
// else a copy of its slice (info's data, bytes and shape then describe the slice). Move-only: a
// move keeps the slice's buffer, so info.data stays valid, where a copy would leave it pointing
// into the original.
struct RankTensor {
  TensorInfo info;
  std::vector<std::byte> slice;  // info.data points here when the tensor is split
  explicit RankTensor(TensorInfo t) : info(std::move(t)) {}
  RankTensor(RankTensor&&) = default;
  RankTensor& operator=(RankTensor&&) = default;
  RankTensor(const RankTensor&) = delete;
  RankTensor& operator=(const RankTensor&) = delete;
};

// The tensors of a checkpoint as rank `rank` of `size` holds them: what both runners load
// through. Refuses a size that does not split the model (rank_shape's error); `ckpt` must outlive
// it and what it returns.
class RankWeights {
 public:
  RankWeights(const Checkpoint& ckpt, int64_t size, int64_t rank);
  // Error(kInvalidArgument) naming the tensor when the checkpoint or the model has no such one.
  RankTensor tensor(const std::string& name) const;

 private:
  const Checkpoint& ckpt_;
  int64_t size_, rank_;
  std::map<std::string, WeightSpec> specs_;
};

}  // namespace flashserve::model
