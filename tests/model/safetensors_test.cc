// Our safetensors reader on files crafted byte by byte here (not by our writer), every malformed
// kind refused with an Error that names the file and the tensor; the writer's output parsed by hand
// against the format; round trips of every float dtype.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <random>

#include "flashserve/error.h"
#include "model/safetensors.h"
#include "test_dirs.h"

namespace flashserve::model {
namespace {

// A file: 8-byte little-endian `declared` length (the header's own when -1), the header, the data.
std::string write_raw(const std::string& header, const std::string& data, int64_t declared = -1,
                      const std::string& tag = "f") {
  const std::string path = testing::fresh_dir(tag) + "/model.safetensors";
  std::ofstream out(path, std::ios::binary);
  uint64_t n = declared < 0 ? header.size() : static_cast<uint64_t>(declared);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header << data;
  return path;
}

// Opens `path` and reads every tensor; expects an Error mentioning the file and each of `mentions`.
void expect_refused(const std::string& path, std::vector<std::string> mentions,
                    ErrorKind kind = ErrorKind::kInvalidArgument) {
  try {
    auto f = SafetensorsFile::open(path);
    for (const auto& name : f->names()) f->tensor(name);
    ADD_FAILURE() << "accepted " << path;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.kind(), kind) << what;
    mentions.push_back(path);
    for (const auto& m : mentions)
      EXPECT_NE(what.find(m), std::string::npos) << m << " in: " << what;
  }
}

std::string bytes(size_t n) {
  return std::string(n, '\x3f');
}

TEST(Safetensors, ReadsAHandCraftedFile) {
  // Two tensors, an unaligned header length (the reader must not assume 8-byte padding) and
  // metadata; values chosen so that a swapped offset or dtype shows.
  const float a[3] = {1.5f, -2.0f, 3.25f};
  const uint16_t b[2] = {0x3f80, 0xc000};  // bf16 1.0, -2.0
  std::string data(reinterpret_cast<const char*>(b), 4);
  data.append(reinterpret_cast<const char*>(a), 12);
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[3],"data_offsets":[4,16]},)"
      R"("b":{"dtype":"BF16","shape":[1,2],"data_offsets":[0,4]}})";
  const auto f = SafetensorsFile::open(write_raw(header, data));
  EXPECT_EQ(f->names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(f->metadata().at("format"), "pt");
  const TensorInfo ta = f->tensor("a"), tb = f->tensor("b");
  EXPECT_EQ(ta.dtype, DType::kFloat32);
  EXPECT_EQ(ta.shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(std::memcmp(ta.data, a, 12), 0);
  EXPECT_EQ(tb.dtype, DType::kBFloat16);
  EXPECT_EQ(tb.shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(std::memcmp(tb.data, b, 4), 0);
  EXPECT_EQ(tb.bytes, 4u);
  EXPECT_EQ(tb.file, f->path());
}

TEST(Safetensors, MalformedFilesAreRefusedNamingFileAndTensor) {
  const std::string ok = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  // Shorter than the length field.
  {
    const std::string path = testing::fresh_dir("short") + "/x.safetensors";
    std::ofstream(path, std::ios::binary) << "abc";
    expect_refused(path, {"truncated"});
  }
  expect_refused(write_raw(ok, bytes(16), 1000), {"past the end"});        // header past the end
  expect_refused(write_raw(ok, bytes(16), int64_t{1} << 60), {"header"});  // absurd length
  expect_refused(write_raw("{\"w\": {\"dtype\": ", ""), {"JSON"});         // bad JSON
  expect_refused(write_raw("[1,2,3]", ""), {"object"});
  expect_refused(write_raw(ok, bytes(10)), {"'w'", "past the end"});  // data truncated
  expect_refused(
      write_raw(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,16]}})", bytes(16)),
      {"'w'", "needs 24"});  // shape does not match the offsets
  expect_refused(
      write_raw(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[16,0]}})", bytes(16)),
      {"'w'", "end before begin"});
  expect_refused(write_raw(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                           R"("v":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                           bytes(20)),
                 {"'v'", "'w'", "overlap"});
  expect_refused(write_raw(R"({"w":{"dtype":"F33","shape":[4],"data_offsets":[0,16]}})", bytes(16)),
                 {"'w'", "F33"});  // not a dtype at all
  expect_refused(write_raw(R"({"w":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", bytes(16)),
                 {"'w'", "I64"}, ErrorKind::kUnsupported);  // a dtype we do not compute in
  expect_refused(
      write_raw(R"({"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", bytes(16)),
      {"'w'", "shape"});
  expect_refused(write_raw(R"({"w":{"dtype":"F32","shape":[4]}})", bytes(16)), {"'w'"});
  expect_refused(write_raw(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0]}})", bytes(16)),
                 {"'w'", "data_offsets"});
  expect_refused("/nonexistent/dir/model.safetensors", {"cannot be opened"});
  // A missing tensor names both.
  const auto f = SafetensorsFile::open(write_raw(ok, bytes(16)));
  try {
    f->tensor("model.norm.weight");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.norm.weight"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find(f->path()), std::string::npos);
  }
}

TEST(Safetensors, WriterOutputFollowsTheFormatAndReadsBack) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("FLASHSERVE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<float> f32(7 * 3);
  std::vector<uint16_t> f16(5), bf16(2 * 2 * 3);
  for (float& x : f32) x = std::uniform_real_distribution<float>(-1, 1)(rng);
  for (uint16_t& x : f16) x = static_cast<uint16_t>(rng());
  for (uint16_t& x : bf16) x = static_cast<uint16_t>(rng());
  const std::vector<TensorToWrite> ts = {
      {"z.f32", DType::kFloat32, {7, 3}, f32.data(), f32.size() * 4},
      {"a.f16", DType::kFloat16, {5}, f16.data(), f16.size() * 2},
      {"m.bf16", DType::kBFloat16, {2, 2, 3}, bf16.data(), bf16.size() * 2}};
  const std::string path = testing::fresh_dir("w") + "/x.safetensors";
  write_safetensors(path, ts, {{"format", "pt"}});

  // By hand: length, JSON, offsets covering the data exactly once, data start 8-aligned.
  std::ifstream in(path, std::ios::binary);
  std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(file[i]);
  ASSERT_LE(8 + n, file.size());
  EXPECT_EQ((8 + n) % 8, 0u);
  const auto header = nlohmann::json::parse(file.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  size_t covered = 0;
  for (const auto& t : ts) {
    const auto& e = header.at(t.name);
    EXPECT_EQ(e["dtype"], safetensors_dtype(t.dtype));
    EXPECT_EQ(e["shape"].get<std::vector<int64_t>>(), t.shape);
    const size_t b = e["data_offsets"][0], end = e["data_offsets"][1];
    ASSERT_EQ(end - b, t.bytes);
    EXPECT_EQ(std::memcmp(file.data() + 8 + n + b, t.data, t.bytes), 0) << t.name;
    covered += t.bytes;
  }
  EXPECT_EQ(8 + n + covered, file.size());

  const auto f = SafetensorsFile::open(path);
  for (const auto& t : ts) {
    const TensorInfo r = f->tensor(t.name);
    EXPECT_EQ(r.dtype, t.dtype);
    EXPECT_EQ(r.shape, t.shape);
    ASSERT_EQ(r.bytes, t.bytes);
    EXPECT_EQ(std::memcmp(r.data, t.data, t.bytes), 0);
  }
  // Writing fewer bytes than the shape needs is refused.
  EXPECT_THROW(write_safetensors(path, {{"x", DType::kFloat32, {4}, f32.data(), 8}}), Error);
}

TEST(Safetensors, TruncatedCopyOfAValidFileNamesItsLastTensor) {
  std::vector<float> w(64, 1.0f);
  const std::string path = testing::fresh_dir("t") + "/model.safetensors";
  write_safetensors(path, {{"first", DType::kFloat32, {64}, w.data(), 256},
                           {"second", DType::kFloat32, {64}, w.data(), 256}});
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 10);
  expect_refused(path, {"'second'", "truncated"});
}

// A shape whose byte size wraps 64 bits "needs" a few bytes: [2^62] F32 is 2^64 = 0 bytes, and
// was accepted with empty offsets as a tensor of 2^62 elements.
TEST(Safetensors, ShapesWhoseByteSizeOverflowsAreRefused) {
  expect_refused(write_raw(R"({"w":{"dtype":"F32","shape":[4611686018427387904],)"
                           R"("data_offsets":[0,0]}})",
                           ""),
                 {"'w'", "4611686018427387904", "64-bit"});
  expect_refused(write_raw(R"({"w":{"dtype":"F64","shape":[2305843009213693952,2],)"
                           R"("data_offsets":[0,0]}})",
                           ""),
                 {"'w'", "64-bit"});
  expect_refused(write_raw(R"({"w":{"dtype":"BF16","shape":[4294967296,4294967296,4],)"
                           R"("data_offsets":[0,0]}})",
                           ""),
                 {"'w'", "64-bit"});
  // An empty dimension keeps the product at 0 whatever the others are: valid, and empty.
  const auto f = SafetensorsFile::open(write_raw(
      R"({"w":{"dtype":"F32","shape":[0,4611686018427387904],"data_offsets":[0,0]}})", ""));
  EXPECT_EQ(f->tensor("w").numel(), 0);
  EXPECT_EQ(f->tensor("w").bytes, 0u);
}

// JSON keeps the last of two equal keys without a word: a tensor listed twice in a header was one
// of its two entries, silently.
TEST(Safetensors, ATensorListedTwiceIsRefused) {
  expect_refused(write_raw(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("w":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                           bytes(24)),
                 {"'w'", "twice"});
  expect_refused(write_raw(R"({"__metadata__":{"format":"pt","format":"np"}})", ""),
                 {"'format'", "twice"});
  // The same key in two different objects is fine.
  const auto f = SafetensorsFile::open(write_raw(
      R"({"__metadata__":{"w":"x"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
      bytes(8)));
  EXPECT_EQ(f->names(), std::vector<std::string>{"w"});
}

// A directory opened for reading and failed to map ("No such device"); a named pipe blocked the
// open forever, waiting for a writer.
TEST(Safetensors, PathsThatAreNotRegularFilesAreRefused) {
  const std::string dir = testing::fresh_dir("d");
  expect_refused(dir, {"is a directory"});
  const std::string fifo = dir + "/model.safetensors";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto opened =
      std::async(std::launch::async, [&] { expect_refused(fifo, {"not a regular file"}); });
  if (opened.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "opening a named pipe blocked";
    std::ofstream(fifo) << "x";  // a writer lets the blocked open return
  }
  opened.get();
}

// The mapping shows another writer's bytes as they land: weights read after the file was rewritten
// in place (or cut shorter, which raised SIGBUS when the bytes were read) were taken silently.
TEST(Safetensors, AFileThatChangesAfterOpenIsRefused) {
  std::vector<float> w(64, 1.0f);
  for (const bool cut : {false, true}) {
    const std::string path = testing::fresh_dir(cut ? "cut" : "rewrite") + "/model.safetensors";
    write_safetensors(path, {{"w", DType::kFloat32, {64}, w.data(), 256}});
    const auto f = SafetensorsFile::open(path);
    EXPECT_EQ(static_cast<const float*>(f->tensor("w").data)[63], 1.0f);
    if (cut) {
      std::filesystem::resize_file(path, std::filesystem::file_size(path) - 16);
    } else {
      std::fstream out(path, std::ios::in | std::ios::out | std::ios::binary);
      out.seekp(-4, std::ios::end);
      const float two = 2.0f;
      out.write(reinterpret_cast<const char*>(&two), 4);
    }
    // A later time, whatever the file system's clock granularity.
    std::filesystem::last_write_time(
        path, std::filesystem::last_write_time(path) + std::chrono::seconds(10));
    try {
      f->tensor("w");
      ADD_FAILURE() << "the file changed after open, and its tensor was still handed out";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path + ": changed while the model was loading"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace flashserve::model
