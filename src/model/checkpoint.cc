#include "model/checkpoint.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/read_file.h"
#include "flashserve/error.h"
#include "model/unique_json.h"

namespace flashserve::model {

Checkpoint Checkpoint::open(const std::string& dir) {
  namespace fsys = std::filesystem;
  std::error_code ec;  // the throwing overloads would escape as filesystem_error, not Error
  if (!fsys::is_directory(dir, ec))
    throw Error(ErrorKind::kInvalidArgument, dir, "is not a model directory");
  Checkpoint c;
  c.dir_ = dir;
  c.config_ = ModelConfig::load(dir);
  const fsys::path index = fsys::path(dir) / "model.safetensors.index.json";
  const fsys::path single = fsys::path(dir) / "model.safetensors";
  if (fsys::exists(index, ec)) {
    // A tensor listed twice in weight_map is refused, not resolved to one of its shards.
    const nlohmann::json j = parse_unique_json(read_file(index.string()), index.string(), "index");
    if (!j.is_object() || !j.contains("weight_map") || !j.at("weight_map").is_object())
      throw Error(ErrorKind::kInvalidArgument, index.string(), "has no weight_map object");
    std::map<std::string, size_t> file_index;
    for (const auto& [name, file] : j.at("weight_map").items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos ||
          file == "" || file == "." || file == "..")
        throw Error(ErrorKind::kInvalidArgument, index.string(),
                    "tensor '" + name + "': shard " + file.dump() + " is not a file name");
      const std::string shard = file.get<std::string>();
      auto it = file_index.find(shard);
      if (it == file_index.end()) {
        c.files_.push_back(SafetensorsFile::open((fsys::path(dir) / shard).string()));
        it = file_index.emplace(shard, c.files_.size() - 1).first;
      }
      if (!c.files_[it->second]->has(name))
        throw Error(ErrorKind::kInvalidArgument, c.files_[it->second]->path(),
                    "tensor '" + name + "' is listed in " + index.filename().string() +
                        " but not in the shard");
      c.where_[name] = it->second;
    }
  } else if (fsys::exists(single, ec)) {
    c.files_.push_back(SafetensorsFile::open(single.string()));
    for (const auto& name : c.files_[0]->names()) c.where_[name] = 0;
  } else {
    throw Error(ErrorKind::kInvalidArgument, dir,
                "has neither model.safetensors nor model.safetensors.index.json");
  }
  return c;
}

TensorInfo Checkpoint::tensor(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end())
    throw Error(ErrorKind::kInvalidArgument, dir_, "tensor '" + name + "' is missing");
  return files_[it->second]->tensor(name);
}

TensorInfo Checkpoint::tensor(const std::string& name, const std::vector<int64_t>& shape) const {
  TensorInfo t = tensor(name);
  if (t.shape != shape)
    throw Error(ErrorKind::kInvalidArgument, t.file,
                "tensor '" + name + "' has shape " + shape_text(t.shape) + ", the config needs " +
                    shape_text(shape));
  return t;
}

void Checkpoint::check_unchanged() const {
  for (const auto& f : files_) f->check_unchanged();
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, i] : where_) out.push_back(name);
  return out;
}

}  // namespace flashserve::model
