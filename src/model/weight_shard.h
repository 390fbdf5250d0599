// The tensor-parallel split of every weight (WeightSpec::split over model/tensor_parallel.h's
// RankShape): the slice rank r holds, cutting a whole tensor into it, and putting the slices of
// all ranks back together (unshard(shard(W)) == W, tested for every weight). Element type
// agnostic (bytes of elem_size), so bf16 checkpoints are cut without widening.
#pragma once

#include <cstddef>
#include <cstdint>
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

}  // namespace flashserve::model
