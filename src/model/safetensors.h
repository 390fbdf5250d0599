// Our reader and writer of the safetensors format: an 8-byte little-endian header length, a JSON
// header {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the
// raw tensor bytes (offsets relative to the end of the header). The file is mapped, not read: a
// tensor's data points into the mapping, so loading copies nothing until the weights are converted
// or uploaded. Every inconsistency is an Error naming the file and the tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "flashserve/tensor.h"

namespace flashserve::model {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // into the file's mapping; valid while the file is open
  size_t bytes = 0;
  std::string file;

  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Maps and validates the whole header (lengths, JSON, dtypes, shapes against offsets, offsets
  // inside the data and not overlapping).
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  // Error(kInvalidArgument) when absent; Error(kUnsupported) for a dtype we do not compute in
  // (anything but F32, F16, BF16).
  TensorInfo tensor(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Error(kInvalidArgument) naming the file when its size or modification time is not what open()
  // saw: the mapping shows another writer's bytes as they land, so weights read across such a
  // change may be a mix of two versions. tensor() checks it; loaders check it again once every
  // tensor is copied. (A file cut shorter while it is read raises SIGBUS before any check can run:
  // a directory being written is not a checkpoint to load.)
  void check_unchanged() const;

 private:
  struct Entry {
    std::string dtype;  // safetensors spelling: F32, BF16, ...
    std::vector<int64_t> shape;
    size_t begin = 0, end = 0;  // into the data section
  };
  SafetensorsFile() = default;

  std::string path_;
  int fd_ = -1;  // kept open to see whether the file changes under the mapping
  uint64_t size_ = 0;
  int64_t mtime_ns_ = 0;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// A tensor to write: its bytes are taken as they are (row-major, `dtype`).
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
};

// Writes a safetensors file with the tensors in the given order (the header lists them sorted, as
// the format's reference writer does). Throws Error naming the path on I/O failure.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// A writer for files too big to hold in memory: the header is fixed by the list of (name, dtype,
// shape) first, then each tensor's bytes are written at its offset, from any thread, in any order.
class SafetensorsWriter {
 public:
  struct Spec {
    std::string name;
    DType dtype = DType::kFloat32;
    std::vector<int64_t> shape;
  };
  SafetensorsWriter(const std::string& path, const std::vector<Spec>& specs,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Writes `bytes` bytes at byte `offset` within tensor `name` (pwrite: thread-safe).
  void write(const std::string& name, size_t offset, const void* data, size_t bytes);
  size_t tensor_bytes(const std::string& name) const;
  void close();  // flushes and closes; throws on failure (the destructor closes silently)

 private:
  std::string path_;
  int fd_ = -1;
  size_t data_start_ = 0;
  std::map<std::string, std::pair<size_t, size_t>> ranges_;  // name -> [begin, end) in data
};

// "[4096, 128]": a shape as errors print it.
std::string shape_text(const std::vector<int64_t>& shape);

// Spelling of a dtype in safetensors headers ("F32", "F16", "BF16", "F64", "I32").
const char* safetensors_dtype(DType dtype);

}  // namespace flashserve::model
