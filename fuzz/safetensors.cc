// Fuzzes our safetensors reader (src/model/safetensors.*). The first byte picks how the rest
// becomes a file:
//   even: the rest is the file, byte for byte (the seeds are real files; mutations reach the
//         length field, the JSON and the data);
//   odd:  the rest drives a generator of headers a careless or hostile writer makes: several
//         tensors of every dtype (and unknown ones), shapes with dimensions of 0, 1, 2^31, 2^32,
//         2^61, 2^62, 2^63 - 1 and 2^64 - 1, offsets laid out correctly and then shifted,
//         swapped, overlapped, reversed or pushed past the end, names repeated, __metadata__ of
//         every JSON type, values of the wrong type, a declared header length off by a few bytes,
//         and the file cut short.
// The file lives in a memfd (no disk), opened by its /proc path. Whatever the bytes:
//   - open() and tensor() either succeed or throw flashserve::Error naming the file
//     (kInvalidArgument; kUnsupported from tensor() for a dtype we do not compute in), never
//     another exception, a crash or undefined behaviour (ASan + UBSan);
//   - an accepted file satisfies an independent reading of its header (nlohmann, exact 128-bit
//     arithmetic): every name appears once, every tensor's view is its declared bytes of the
//     file (the same bytes, inside the data section), its byte size is the dtype's size times the
//     product of its shape, and no two tensors share a byte.
// Registered in fuzz/CMakeLists.txt: flashserve_fuzz_target(safetensors flashserve_model ...).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "byte_reader.h"
#include "flashserve/error.h"
#include "model/safetensors.h"

namespace {

using flashserve::Error;
using flashserve::ErrorKind;
using nlohmann::json;
namespace fm = flashserve::model;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "safetensors fuzz: %s\n", what.c_str());
  std::abort();
}

// The fuzz input as a file: one memfd for the whole run, rewritten for each input.
const std::string& file_with(const std::string& bytes) {
  static const int fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (fd < 0 || ftruncate(fd, 0) != 0 ||
      pwrite(fd, bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size()))
    fail("cannot write the memfd");
  return path;
}

std::string with_length(const std::string& header, uint64_t declared) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((declared >> (8 * i)) & 0xff);
  return out + header;
}

// Headers a writer could produce, right and wrong, from the fuzzer's bytes.
std::string generate(flashserve::fuzz::ByteReader& in) {
  static const char* kDtypes[] = {"F32",  "F16",     "BF16", "F64", "I32", "I64", "U8",
                                  "BOOL", "F8_E4M3", "I8",   "F33", "",    "f32"};
  static const uint64_t kDims[] = {0,
                                   1,
                                   2,
                                   3,
                                   7,
                                   1u << 16,
                                   uint64_t{1} << 31,
                                   uint64_t{1} << 32,
                                   uint64_t{1} << 61,
                                   uint64_t{1} << 62,
                                   (uint64_t{1} << 63) - 1,
                                   ~uint64_t{0}};
  static const size_t kSizes[] = {4, 2, 2, 8, 4, 8, 1, 1, 1, 1, 4, 4, 4};
  const int n = static_cast<int>(in.in(0, 5));
  std::string header = "{";
  uint64_t offset = 0;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (int t = 0; t < n; ++t) {
    const int dt = static_cast<int>(in.in(0, 12));
    const int rank = static_cast<int>(in.in(0, 3));
    std::string shape = "[";
    uint64_t numel = 1;
    for (int r = 0; r < rank; ++r) {
      // Mostly small dimensions, so that valid tensors stay small; sometimes huge ones.
      const uint64_t d = in.one_in(4) ? kDims[in.in(0, 11)] : static_cast<uint64_t>(in.in(0, 5));
      numel *= d;  // unsigned: wraps like a careless writer's product would
      shape += (r ? "," : "") + std::to_string(d);
      if (in.one_in(32)) shape += ",-1";
    }
    shape += "]";
    if (in.one_in(32)) shape = in.flag() ? "\"4\"" : "[1.5]";
    uint64_t bytes = numel * kSizes[dt];
    if (bytes > 4096) bytes = in.in(0, 64);  // a huge (or wrapped) shape with a small range
    uint64_t begin = offset, end = offset + bytes;
    switch (in.in(0, 15)) {
      case 0:
        begin += in.in(1, 8), end += in.in(0, 8);
        break;  // shifted, misaligned
      case 1:
        std::swap(begin, end);
        break;  // reversed
      case 2:
        end = begin + bytes + in.in(-4, 4);
        break;  // size off by a few bytes
      case 3:
        if (!ranges.empty()) {  // overlapping an earlier tensor
          begin = ranges.back().first + in.in(0, 4);
          end = begin + bytes;
        }
        break;
      case 4:
        end = begin + (uint64_t{1} << in.in(32, 63));
        break;  // past any end
      case 5:
        begin = ~uint64_t{0} - in.in(0, 8), end = begin + bytes;
        break;  // wraps
      default:
        break;
    }
    offset = std::max(offset, end) + (in.one_in(8) ? in.in(1, 7) : 0);  // sometimes a hole
    ranges.push_back({begin, end});
    std::string name = "t" + std::to_string(in.one_in(8) ? 0 : t);  // sometimes repeated
    if (in.one_in(32)) name = in.flag() ? "" : "__metadata__";
    std::string entry = "{\"dtype\":\"" + std::string(kDtypes[dt]) + "\",\"shape\":" + shape +
                        ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) +
                        "]}";
    switch (in.in(0, 31)) {
      case 0:
        entry = "{\"dtype\":\"F32\",\"shape\":[1]}";
        break;
      case 1:
        entry = "[1,2]";
        break;
      case 2:
        entry = "{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}";
        break;
      case 3:
        entry = "{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}";
        break;
      case 4:
        entry = "{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}";
        break;
      case 5:
        entry = "{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0.0,4.0]}";
        break;
      default:
        break;
    }
    header += (t ? "," : "") + ("\"" + name + "\":") + entry;
  }
  if (in.one_in(3)) {
    static const char* kMeta[] = {"{\"format\":\"pt\"}",
                                  "{\"a\":1,\"b\":[1]}",
                                  "[]",
                                  "null",
                                  "\"pt\"",
                                  "{\"format\":\"pt\",\"format\":\"np\"}"};
    header += std::string(n ? "," : "") + "\"__metadata__\":" + kMeta[in.in(0, 5)];
  }
  header += "}";
  header.append(in.in(0, 7), ' ');  // the reference writer pads to 8 bytes; others do not
  uint64_t declared = header.size();
  if (in.one_in(8)) declared += in.in(-3, 3);
  if (in.one_in(32)) declared = uint64_t{1} << in.in(20, 63);
  std::string file = with_length(header, declared);
  for (uint64_t i = 0; i < offset && i < (1u << 16); ++i)
    file.push_back(static_cast<char>(i * 131 + 7));
  if (in.one_in(8)) file.resize(file.size() - std::min<size_t>(file.size(), in.in(1, 16)));
  return file;
}

// The header as an independent reader sees it: name -> (dtype, shape, begin, end), or false when
// it could not be read (the reader must then have refused the file).
struct Declared {
  std::string dtype;
  std::vector<uint64_t> shape;
  uint64_t begin = 0, end = 0;
};

size_t element_size(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  return 0;  // not one that tensor() returns
}

void check_accepted(const fm::SafetensorsFile& f, const std::string& file) {
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(file[i]);
  if (header_len > file.size() - 8) fail("accepted a header longer than the file");
  const json h = json::parse(file.begin() + 8, file.begin() + 8 + header_len);
  const uint64_t data_bytes = file.size() - 8 - header_len;
  const char* data = file.data() + 8 + header_len;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  const std::vector<std::string> names = f.names();
  if (names.size() != h.size() - (h.contains("__metadata__") ? 1 : 0))
    fail("accepted names differ from the header's");
  for (const std::string& name : names) {
    const json& e = h.at(name);
    const uint64_t begin = e.at("data_offsets").at(0).get<uint64_t>();
    const uint64_t end = e.at("data_offsets").at(1).get<uint64_t>();
    if (begin > end || end > data_bytes) fail("accepted offsets outside the data: " + name);
    ranges.push_back({begin, end});
    fm::TensorInfo t;
    try {
      t = f.tensor(name);
    } catch (const Error& err) {
      if (err.kind() != ErrorKind::kUnsupported || element_size(e.at("dtype")) != 0)
        fail(std::string("tensor() refused an accepted tensor: ") + err.what());
      continue;
    }
    unsigned __int128 bytes = element_size(e.at("dtype"));
    std::vector<int64_t> shape;
    for (const json& d : e.at("shape")) {
      bytes *= d.get<uint64_t>();
      if (bytes > ~uint64_t{0}) bytes = static_cast<unsigned __int128>(~uint64_t{0}) + 1;
      shape.push_back(d.get<int64_t>());
    }
    if (t.shape != shape || t.name != name) fail("wrong shape or name: " + name);
    if (bytes != end - begin || t.bytes != end - begin)
      fail("byte size is not dtype size x product(shape): " + name);
    if (static_cast<unsigned __int128>(t.numel()) * element_size(e.at("dtype")) != bytes)
      fail("numel() disagrees with the bytes: " + name);
    if (t.bytes && std::memcmp(t.data, data + begin, t.bytes) != 0)
      fail("view is not the declared bytes of the file: " + name);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second && ranges[i].first < ranges[i].second &&
        ranges[i - 1].first < ranges[i - 1].second)
      fail("accepted overlapping tensors");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  flashserve::fuzz::ByteReader in(data, size);
  const bool raw = (in.raw<uint8_t>() & 1) == 0;
  const std::string file = raw ? in.rest() : generate(in);
  const std::string& path = file_with(file);
  std::shared_ptr<fm::SafetensorsFile> f;
  try {
    f = fm::SafetensorsFile::open(path);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kInvalidArgument || std::string(e.what()).find(path) != 0)
      fail(std::string("refusal of another kind or not naming the file: ") + e.what());
    return 0;
  }
  check_accepted(*f, file);
  return 0;
}
