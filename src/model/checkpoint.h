// A Hugging Face model directory: config.json and the weights, either one model.safetensors or the
// shards that model.safetensors.index.json maps each tensor to.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/safetensors.h"

namespace flashserve::model {

class Checkpoint {
 public:
  // Reads config.json and opens every weight file. Errors name the file (and tensor) at fault.
  static Checkpoint open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  // Error(kInvalidArgument) naming the directory and the tensor when absent.
  TensorInfo tensor(const std::string& name) const;
  // The tensor after checking its shape: Error(kInvalidArgument) naming file, tensor, both shapes.
  TensorInfo tensor(const std::string& name, const std::vector<int64_t>& shape) const;
  std::vector<std::string> names() const;  // sorted
  // SafetensorsFile::check_unchanged for every file: a loader calls it once it has copied the
  // weights, so that none of them was read across another writer's change.
  void check_unchanged() const;

 private:
  std::string dir_;
  ModelConfig config_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor -> index into files_
};

}  // namespace flashserve::model
