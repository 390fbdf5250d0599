#include "model/random_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/half.h"
#include "common/thread_pool.h"
#include "flashserve/error.h"
#include "model/safetensors.h"
#include "model/sampling.h"
#include "model/weights.h"

namespace flashserve::model {

namespace {

// The distribution of one tensor: uniform on [center - half_width, center + half_width].
struct Dist {
  float center = 0, half_width = 0;
};

Dist dist_of(const WeightSpec& w, const ModelConfig& c) {
  const double sqrt3 = std::sqrt(3.0);  // a uniform on [-a, a] has standard deviation a / sqrt(3)
  const double head_std = 3.0 / std::sqrt(static_cast<double>(c.hidden_size));
  double stddev = 0;
  switch (w.role) {
    case WeightRole::kNorm:
      return {1.0f, 0.1f};
    case WeightRole::kBias:
      stddev = 0.1;
      break;
    case WeightRole::kEmbedding:
      stddev = c.tie_word_embeddings ? head_std : 1.0;
      break;
    case WeightRole::kLmHead:
      stddev = head_std;
      break;
    case WeightRole::kLinear:
      stddev = 1.0 / std::sqrt(static_cast<double>(w.fan_in));
      if (w.residual_branch) stddev /= std::sqrt(2.0 * static_cast<double>(c.num_hidden_layers));
      break;
  }
  return {0.0f, static_cast<float>(stddev * sqrt3)};
}

uint64_t numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

}  // namespace

uint64_t write_random_checkpoint(const ModelConfig& config, const std::string& dir,
                                 const RandomCheckpointOptions& o) {
  namespace fsys = std::filesystem;
  config.validate();
  if (o.dtype != DType::kBFloat16 && o.dtype != DType::kFloat16 && o.dtype != DType::kFloat32)
    throw Error(ErrorKind::kInvalidArgument, "dtype", "must be bf16, fp16 or fp32");
  std::error_code ec;
  fsys::create_directories(dir, ec);
  if (!fsys::is_directory(dir)) throw Error(ErrorKind::kInvalidArgument, dir, "cannot be created");

  ModelConfig c = config;
  c.torch_dtype = o.dtype == DType::kFloat32   ? "float32"
                  : o.dtype == DType::kFloat16 ? "float16"
                                               : "bfloat16";
  {
    std::ofstream out(fsys::path(dir) / "config.json");
    out << c.to_json();
    if (!out) throw Error(ErrorKind::kInvalidArgument, dir + "/config.json", "cannot be written");
  }

  // Shards filled greedily in checkpoint order, as transformers' save_pretrained does.
  const std::vector<WeightSpec> specs = weight_specs(c);
  const size_t esize = dtype_size(o.dtype);
  std::vector<std::vector<SafetensorsWriter::Spec>> shards(1);
  std::vector<size_t> shard_of(specs.size());
  uint64_t shard_bytes = 0, total_bytes = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const uint64_t bytes = numel(specs[i].shape) * esize;
    if (shard_bytes > 0 && shard_bytes + bytes > o.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back({specs[i].name, o.dtype, specs[i].shape});
    shard_of[i] = shards.size() - 1;
    shard_bytes += bytes;
    total_bytes += bytes;
  }
  const bool sharded = shards.size() > 1;
  std::vector<std::unique_ptr<SafetensorsWriter>> writers;
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string name = sharded ? shard_name(s, shards.size()) : "model.safetensors";
    writers.push_back(
        std::make_unique<SafetensorsWriter>((fsys::path(dir) / name).string(), shards[s],
                                            std::map<std::string, std::string>{{"format", "pt"}}));
    for (const auto& spec : shards[s]) weight_map[spec.name] = name;
  }

  // Work items of at most 4 Mi elements, spread over the pool; each draws, rounds and writes its
  // own range, so memory stays at a few buffers per thread whatever the model's size.
  constexpr uint64_t kChunk = uint64_t{1} << 22;
  struct Item {
    size_t spec;
    uint64_t begin, end;
  };
  std::vector<Item> items;
  for (size_t i = 0; i < specs.size(); ++i) {
    const uint64_t n = numel(specs[i].shape);
    for (uint64_t b = 0; b < n; b += kChunk) items.push_back({i, b, std::min(n, b + kChunk)});
  }
  ThreadPool& pool = ThreadPool::global();
  std::vector<std::vector<uint8_t>> buffers(static_cast<size_t>(pool.size()),
                                            std::vector<uint8_t>(kChunk * esize));
  pool.parallel_for(static_cast<int64_t>(items.size()), [&](int64_t task, int worker) {
    const Item& it = items[task];
    const WeightSpec& w = specs[it.spec];
    const Dist d = dist_of(w, c);
    const uint64_t stream = splitmix64(o.seed ^ splitmix64(0x5eed0000ull + it.spec));
    uint8_t* buf = buffers[worker].data();
    for (uint64_t i = it.begin; i < it.end; ++i) {
      // 24 random bits -> uniform in [-1, 1).
      const float r =
          static_cast<float>(splitmix64(stream + i) >> 40) * (2.0f / 16777216.0f) - 1.0f;
      const float v = d.center + d.half_width * r;
      store_float(buf, static_cast<int64_t>(i - it.begin), o.dtype, v);
    }
    writers[shard_of[it.spec]]->write(w.name, it.begin * esize, buf, (it.end - it.begin) * esize);
  });
  for (auto& w : writers) w->close();

  if (sharded) {
    nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}},
                            {"weight_map", weight_map}};
    std::ofstream out(fsys::path(dir) / "model.safetensors.index.json");
    out << index.dump(2) << "\n";
    if (!out)
      throw Error(ErrorKind::kInvalidArgument, dir + "/model.safetensors.index.json",
                  "cannot be written");
  } else {
    fsys::remove(fsys::path(dir) / "model.safetensors.index.json", ec);
  }
  return total_bytes;
}

}  // namespace flashserve::model
