#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "flashserve/error.h"
#include "model/unique_json.h"

namespace flashserve::model {

namespace {

using nlohmann::json;

// The format's own limit: a header bigger than this is a corrupt length, not a real header.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

[[noreturn]] void bad(const std::string& file, const std::string& what,
                      ErrorKind kind = ErrorKind::kInvalidArgument) {
  throw Error(kind, file, what);
}

// Bytes per element of every dtype the format defines (so that a file holding tensors we never
// read still validates); 0 for an unknown name.
size_t element_bytes(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2")
    return 1;
  return 0;
}

std::string errno_str() {
  return std::strerror(errno);
}

int64_t mtime_ns(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

}  // namespace

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const char* safetensors_dtype(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "F32";
    case DType::kFloat16:
      return "F16";
    case DType::kBFloat16:
      return "BF16";
    case DType::kFloat64:
      return "F64";
    case DType::kInt32:
      return "I32";
    case DType::kFloat8E4M3:
      return "F8_E4M3";
  }
  return "?";
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  // O_NONBLOCK: a named pipe must not block the open waiting for a writer (it is refused below).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) bad(path, "cannot be opened: " + errno_str());
  f->fd_ = fd;  // closed by the destructor, on every path from here
  struct stat st {};
  if (fstat(fd, &st) != 0) bad(path, "cannot be read: " + errno_str());
  // A directory opens for reading too, and then fails to map with "No such device".
  if (!S_ISREG(st.st_mode))
    bad(path,
        S_ISDIR(st.st_mode) ? "is a directory, not a safetensors file" : "is not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8)
    bad(path,
        "truncated: " + std::to_string(size) + " bytes, too short for the 8-byte header length");
  f->size_ = size;
  f->mtime_ns_ = mtime_ns(st);
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) bad(path, "cannot be mapped: " + errno_str());
  f->map_ = map;
  f->map_bytes_ = size;
  const auto* bytes = static_cast<const uint8_t*>(map);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];  // little-endian
  if (header_len > kMaxHeaderBytes)
    bad(path, "header length " + std::to_string(header_len) + " is implausible (over " +
                  std::to_string(kMaxHeaderBytes) + " bytes): not a safetensors file?");
  if (8 + header_len > size)
    bad(path, "header of " + std::to_string(header_len) + " bytes runs past the end of the file (" +
                  std::to_string(size) + " bytes): truncated?");
  f->data_ = bytes + 8 + header_len;
  const uint64_t data_bytes = size - 8 - header_len;

  // A name listed twice would otherwise keep one of its two entries silently.
  const json header = parse_unique_json(
      std::string_view(reinterpret_cast<const char*>(bytes + 8), header_len), path, "header");
  if (!header.is_object()) bad(path, "header is not a JSON object");
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) bad(path, "__metadata__ is not an object");
      for (const auto& [k, mv] : v.items())
        f->metadata_[k] = mv.is_string() ? mv.get<std::string>() : mv.dump();
      continue;
    }
    const std::string where = "tensor '" + name + "': ";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets"))
      bad(path, where + "entry needs dtype, shape and data_offsets");
    Entry e;
    if (!v.at("dtype").is_string()) bad(path, where + "dtype is not a string");
    e.dtype = v.at("dtype").get<std::string>();
    const size_t esize = element_bytes(e.dtype);
    if (esize == 0) bad(path, where + "unknown dtype '" + e.dtype + "'");
    const json& shape = v.at("shape");
    if (!shape.is_array()) bad(path, where + "shape is not a list");
    // The byte size in checked arithmetic: a product that wraps could match small offsets (a
    // [2^62] F32 tensor "needs" 2^64 = 0 bytes) and be accepted with a wrong element count.
    uint64_t nbytes = esize;
    for (const json& d : shape) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        bad(path, where + "shape " + shape.dump() + " has a dimension that is not a size");
      if (__builtin_mul_overflow(nbytes, d.get<uint64_t>(), &nbytes) ||
          nbytes > static_cast<uint64_t>(INT64_MAX))
        bad(path, where + "shape " + shape.dump() + " of " + e.dtype +
                      " has more bytes than 64-bit sizes hold");
      e.shape.push_back(d.get<int64_t>());
    }
    const json& off = v.at("data_offsets");
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      bad(path, where + "data_offsets " + off.dump() + " is not [begin, end]");
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    const std::string offs =
        "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
    if (e.end < e.begin) bad(path, where + offs + " end before begin");
    if (e.end > data_bytes)
      bad(path, where + offs + " run past the end of the data (" + std::to_string(data_bytes) +
                    " bytes): truncated file?");
    if (e.end - e.begin != nbytes)
      bad(path, where + offs + " hold " + std::to_string(e.end - e.begin) + " bytes, but " +
                    e.dtype + " " + shape_text(e.shape) + " needs " + std::to_string(nbytes));
    f->entries_.emplace(name, std::move(e));
  }
  // No two tensors may share bytes: a writer bug, or a crafted file aliasing weights.
  std::vector<std::pair<size_t, const std::string*>> order;
  for (const auto& [name, e] : f->entries_)
    if (e.end > e.begin) order.emplace_back(e.begin, &name);
  std::sort(order.begin(), order.end());
  for (size_t i = 1; i < order.size(); ++i) {
    const Entry& prev = f->entries_.at(*order[i - 1].second);
    if (order[i].first < prev.end)
      bad(path, "tensors '" + *order[i - 1].second + "' and '" + *order[i].second +
                    "' overlap in the data (data_offsets)");
  }
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(map_, map_bytes_);
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsFile::check_unchanged() const {
  struct stat st {};
  if (fstat(fd_, &st) != 0) bad(path_, "cannot be checked: " + errno_str());
  const auto now = static_cast<uint64_t>(st.st_size);
  if (now != size_ || mtime_ns(st) != mtime_ns_)
    bad(path_, "changed while the model was loading (" + std::to_string(size_) + " bytes, now " +
                   std::to_string(now) + (now == size_ ? ", rewritten" : "") +
                   "): its weights may be a mix of two versions");
}

TensorInfo SafetensorsFile::tensor(const std::string& name) const {
  check_unchanged();
  auto it = entries_.find(name);
  if (it == entries_.end()) bad(path_, "tensor '" + name + "' is not in the file");
  const Entry& e = it->second;
  TensorInfo t;
  t.name = name;
  t.file = path_;
  t.shape = e.shape;
  t.data = data_ + e.begin;
  t.bytes = e.end - e.begin;
  if (e.dtype == "F32")
    t.dtype = DType::kFloat32;
  else if (e.dtype == "F16")
    t.dtype = DType::kFloat16;
  else if (e.dtype == "BF16")
    t.dtype = DType::kBFloat16;
  else
    bad(path_, "tensor '" + name + "': dtype " + e.dtype + " is not supported (F32, F16, BF16)",
        ErrorKind::kUnsupported);
  return t;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

namespace {

// The header: sorted names (json objects are), offsets in the order given, padded with spaces to
// a multiple of 8 bytes so that the data section starts aligned.
std::string make_header(const std::vector<SafetensorsWriter::Spec>& specs,
                        const std::map<std::string, std::string>& metadata,
                        std::map<std::string, std::pair<size_t, size_t>>* ranges) {
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  size_t offset = 0;
  for (const auto& s : specs) {
    size_t bytes = dtype_size(s.dtype);
    for (int64_t d : s.shape) {
      if (d < 0) throw Error(ErrorKind::kInvalidArgument, s.name, "negative dimension");
      bytes *= static_cast<size_t>(d);
    }
    if (h.contains(s.name)) throw Error(ErrorKind::kInvalidArgument, s.name, "written twice");
    h[s.name] = {{"dtype", safetensors_dtype(s.dtype)},
                 {"shape", s.shape},
                 {"data_offsets", {offset, offset + bytes}}};
    (*ranges)[s.name] = {offset, offset + bytes};
    offset += bytes;
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

SafetensorsWriter::SafetensorsWriter(const std::string& path, const std::vector<Spec>& specs,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path) {
  const std::string header = make_header(specs, metadata, &ranges_);
  size_t total = 0;
  for (const auto& [name, r] : ranges_) total = std::max(total, r.second);
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) bad(path, "cannot be created: " + errno_str());
  uint8_t len[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  data_start_ = 8 + header.size();
  if (::pwrite(fd_, len, 8, 0) != 8 ||
      ::pwrite(fd_, header.data(), header.size(), 8) != static_cast<ssize_t>(header.size()) ||
      ::ftruncate(fd_, static_cast<off_t>(data_start_ + total)) != 0) {
    const std::string err = errno_str();
    ::close(fd_);
    fd_ = -1;
    bad(path, "cannot be written: " + err);
  }
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

size_t SafetensorsWriter::tensor_bytes(const std::string& name) const {
  auto it = ranges_.find(name);
  if (it == ranges_.end()) bad(path_, "tensor '" + name + "' is not in the header");
  return it->second.second - it->second.first;
}

void SafetensorsWriter::write(const std::string& name, size_t offset, const void* data,
                              size_t bytes) {
  auto it = ranges_.find(name);
  if (it == ranges_.end()) bad(path_, "tensor '" + name + "' is not in the header");
  const auto [begin, end] = it->second;
  if (offset + bytes > end - begin)
    bad(path_, "tensor '" + name + "': write of " + std::to_string(bytes) + " bytes at " +
                   std::to_string(offset) + " past its " + std::to_string(end - begin));
  const auto* p = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t w = ::pwrite(fd_, p + done, bytes - done,
                               static_cast<off_t>(data_start_ + begin + offset + done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) bad(path_, "tensor '" + name + "': write failed: " + errno_str());
    done += static_cast<size_t>(w);
  }
}

void SafetensorsWriter::close() {
  if (fd_ < 0) return;
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) bad(path_, "close failed: " + errno_str());
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsWriter::Spec> specs;
  for (const auto& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  SafetensorsWriter w(path, specs, metadata);
  for (const auto& t : tensors) {
    if (t.bytes != w.tensor_bytes(t.name))
      bad(path, "tensor '" + t.name + "': " + std::to_string(t.bytes) + " bytes given for " +
                    std::to_string(w.tensor_bytes(t.name)));
    w.write(t.name, 0, t.data, t.bytes);
  }
  w.close();
}

}  // namespace flashserve::model
