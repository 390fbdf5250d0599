// Fuzzes loading a whole checkpoint directory (src/model/checkpoint.*, weights.*): the bytes
// choose a tiny config (layers, tied embeddings, q/k/v bias), a config.json that may disagree with
// the weights (a layer more or less, the other tie), and edits of the weights and their layout:
// a tensor dropped, misshapen, of an integer dtype, or extra (junk, a layer beyond the config, the
// tolerated rotary_emb.inv_freq and tied lm_head), dtypes mixed, one file or shards with
// model.safetensors.index.json, and the index edited (an entry dropped, one pointing at another
// shard or at a missing one, names "", "..", "a/b", a tensor listed twice, a shard that is a
// directory). The directory lives in /dev/shm.
//
// The harness knows which edits make the directory wrong, so it predicts the answer:
//   - a directory without a defect must load: Checkpoint::open + check_weights accept it, every
//     tensor the config names has its shape, and copy_as_float gives exactly the values written
//     (from the shard the index names);
//   - a directory with a defect must be refused with flashserve::Error naming a file or the
//     directory (never accepted, never another exception, crash or undefined behaviour).
// Registered in fuzz/CMakeLists.txt: flashserve_fuzz_target(checkpoint_dir flashserve_model).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "byte_reader.h"
#include "common/half.h"
#include "flashserve/error.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace {

using flashserve::DType;
using flashserve::Error;
namespace fm = flashserve::model;
namespace fsys = std::filesystem;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "checkpoint_dir fuzz: %s\n", what.c_str());
  std::abort();
}

const std::string& work_dir() {
  static const std::string dir = [] {
    const fsys::path base = fsys::exists("/dev/shm") ? "/dev/shm" : fsys::temp_directory_path();
    return (base / ("flashserve-fuzz-ckpt-" + std::to_string(::getpid()))).string();
  }();
  static const bool cleanup = [] {  // a crash leaves the directory to look at; an exit does not
    std::atexit([] {
      std::error_code ec;
      fsys::remove_all(dir, ec);
    });
    return true;
  }();
  (void)cleanup;
  return dir;
}

fm::ModelConfig tiny(int64_t layers, bool tied, bool qwen2) {
  fm::ModelConfig c;
  c.architecture = qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.vocab_size = 16;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = tied;
  c.attention_bias = qwen2;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

// One tensor as written: its values are float(seed + index) rounded to its dtype.
struct Written {
  fm::TensorToWrite t;
  std::vector<uint8_t> bytes;
  float first = 0;  // the value of element 0, distinct per tensor
};

Written make_tensor(const std::string& name, const std::vector<int64_t>& shape, DType dtype,
                    float first) {
  Written w;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  w.bytes.resize(static_cast<size_t>(n) * flashserve::dtype_size(dtype));
  for (int64_t i = 0; i < n; ++i) {
    const float v = first + static_cast<float>(i % 4) * 0.25f;
    if (dtype == DType::kInt32) {
      const int32_t x = static_cast<int32_t>(v);
      std::memcpy(w.bytes.data() + i * 4, &x, 4);
    } else {
      flashserve::store_float(w.bytes.data(), i, dtype, v);
    }
  }
  w.t = {name, dtype, shape, w.bytes.data(), w.bytes.size()};
  w.first = first;
  return w;
}

// Values are a multiple of 1/4 below 64 (at most 8 significant bits): exact in bf16 and fp16.
float expected_value(const Written& w, int64_t i) {
  return w.first + static_cast<float>(i % 4) * 0.25f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  flashserve::fuzz::ByteReader in(data, size);
  const int64_t layers = in.in(1, 2);
  const bool tied = in.flag(), qwen2 = in.one_in(3);
  const fm::ModelConfig config = tiny(layers, tied, qwen2);
  int defect = 0;  // the line of the harness that made the directory wrong, 0: none

  // The weights are those of a config that may differ from config.json's.
  int64_t weight_layers = layers;
  bool weight_tied = tied;
  // Whether these make the directory wrong is derived below, from what ends up listed: a missing
  // tensor the config needs, or an extra one it does not tolerate.
  if (in.one_in(8)) weight_layers = layers + (in.flag() ? 1 : -1);
  if (in.one_in(8)) weight_tied = !tied;
  std::map<std::string, std::vector<int64_t>> needed;  // what the config names
  for (const fm::WeightSpec& w : fm::weight_specs(config)) needed[w.name] = w.shape;
  std::vector<Written> tensors;
  {
    const std::vector<fm::WeightSpec> specs =
        fm::weight_specs(tiny(weight_layers, weight_tied, qwen2));
    const DType kFloats[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
    const DType file_dtype = kFloats[in.in(0, 2)];
    for (size_t i = 0; i < specs.size(); ++i) {
      std::vector<int64_t> shape = specs[i].shape;
      DType dtype = in.one_in(16) ? kFloats[in.in(0, 2)] : file_dtype;  // mixed: fine
      switch (in.in(0, 255)) {  // rare: most directories keep every tensor
        case 0:
          continue;  // dropped
        case 1:
          shape.back() += in.flag() ? 1 : -1;  // misshapen
          if (shape.back() == 0) shape.back() = 2;
          break;
        case 2:
          if (shape.size() == 2) std::swap(shape[0], shape[1]);
          break;
        case 3:
          dtype = DType::kInt32;
          break;
        case 4:
          shape.push_back(1);
          break;
        default:
          break;
      }
      // Only a tensor the config needs is read; a tolerated extra (a tied model's lm_head) is not.
      if (needed.count(specs[i].name) && (shape != specs[i].shape || dtype == DType::kInt32))
        defect = __LINE__;
      tensors.push_back(make_tensor(specs[i].name, shape, dtype, static_cast<float>(i + 1)));
    }
  }
  if (in.one_in(16)) {
    tensors.push_back(
        make_tensor("model.layers.0.self_attn.rotary_emb.inv_freq", {2}, DType::kFloat32, 90));
  }
  if (in.one_in(16)) {
    tensors.push_back(make_tensor("model.junk.weight", {3}, DType::kFloat32, 91));
  }
  // Dropped tensors are defects unless they were not needed.
  std::set<std::string> present;
  for (const Written& w : tensors) present.insert(w.t.name);
  for (const auto& [name, shape] : needed)
    if (!present.count(name)) defect = __LINE__;

  // Layout: one file, or shards with an index.
  std::error_code ec;
  fsys::remove_all(work_dir(), ec);
  fsys::create_directories(work_dir());
  const std::string dir = work_dir();
  { std::ofstream(dir + "/config.json") << config.to_json(); }
  const int shards = static_cast<int>(in.in(0, 3));  // 0: model.safetensors
  std::map<std::string, std::string> listed;         // index: tensor -> shard
  std::map<std::string, std::map<std::string, const Written*>> files;
  auto shard_name = [&](int s) {
    return "model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(shards) +
           ".safetensors";
  };
  for (const Written& w : tensors) {
    const std::string file = shards == 0 ? "model.safetensors" : shard_name(in.in(0, shards - 1));
    if (files[file].count(w.t.name)) {
      defect = __LINE__;  // written twice into one file: the writer refuses; skip it
      continue;
    }
    files[file][w.t.name] = &w;
    listed[w.t.name] = file;
  }
  if (shards == 0 && tensors.empty()) files["model.safetensors"];
  std::string index_extra;  // raw JSON text appended to the weight map
  if (shards > 0) {
    for (int s = 0; s < shards; ++s) files[shard_name(s)];  // every shard exists, maybe empty
    std::set<std::string> edited;  // one edit per entry: a later one must not undo an earlier
    for (int edits = static_cast<int>(in.in(0, 2)); edits > 0 && !listed.empty(); --edits) {
      auto it = listed.begin();
      std::advance(it, in.in(0, static_cast<int64_t>(listed.size()) - 1));
      if (!edited.insert(it->first).second) continue;
      switch (in.in(0, 7)) {
        case 0:  // not listed: missing if needed, invisible otherwise
          if (needed.count(it->first)) defect = __LINE__;
          listed.erase(it);
          break;
        case 1:  // listed for another shard that does not hold it
          if (shards > 1) {
            const std::string other = shard_name(in.in(0, shards - 1));
            if (!files[other].count(it->first)) defect = __LINE__;
            it->second = other;
          }
          break;
        case 2:
          it->second = "model-00009-of-00009.safetensors", defect = __LINE__;
          break;
        case 3:
          it->second = in.flag() ? "" : "..", defect = __LINE__;
          break;
        case 4:
          it->second = "a/b.safetensors", defect = __LINE__;
          break;
        case 5:  // a shard that is a directory
          fsys::create_directory(dir + "/model-00008-of-00009.safetensors");
          it->second = "model-00008-of-00009.safetensors";
          defect = __LINE__;
          break;
        default:
          break;
      }
    }
    if (!listed.empty() && in.one_in(8)) {  // listed twice: the JSON text repeats the key
      auto it = listed.begin();
      std::advance(it, in.in(0, static_cast<int64_t>(listed.size()) - 1));
      index_extra = ", \"" + it->first + "\": \"" + it->second + "\"";
      defect = __LINE__;
    }
  }
  try {
    for (const auto& [file, ts] : files) {
      std::vector<fm::TensorToWrite> list;
      for (const auto& [name, w] : ts) list.push_back(w->t);
      fm::write_safetensors(dir + "/" + file, list);
    }
  } catch (const Error& e) {
    fail(std::string("the harness could not write its directory: ") + e.what());
  }
  if (shards > 0) {
    std::string index = R"({"metadata": {"total_size": 0}, "weight_map": {)";
    bool first = true;
    for (const auto& [name, file] : listed) {
      index += (first ? "" : ", ") + ("\"" + name + "\": \"" + file + "\"");
      first = false;
    }
    if (first && !index_extra.empty()) index_extra.erase(0, 2);
    index += index_extra + "}}";
    std::ofstream(dir + "/model.safetensors.index.json") << index;
  }
  // Anything the loaders are handed as "the weights" must be listed (extras beyond the config's
  // tensors are refused unless tolerated); with one file, every tensor of it is listed.
  for (const auto& [name, file] : listed) {
    const bool tolerated =
        name.ends_with("rotary_emb.inv_freq") || (name == "lm_head.weight" && tied);
    if (!needed.count(name) && !tolerated) defect = __LINE__;
  }

  std::string refusal;
  try {
    const fm::Checkpoint ck = fm::Checkpoint::open(dir);
    fm::check_weights(ck);
    if (!(ck.config() == config)) fail("the checkpoint's config is not config.json's");
    for (const auto& [name, shape] : needed) {
      const fm::TensorInfo t = ck.tensor(name, shape);
      std::vector<float> values(static_cast<size_t>(t.numel()), -1.0f);
      fm::copy_as_float(t, values.data());
      const Written* w = files.at(listed.at(name)).at(name);
      for (size_t i = 0; i < values.size(); ++i)
        if (values[i] != expected_value(*w, static_cast<int64_t>(i)))
          fail("tensor " + name + " does not read back as written");
    }
  } catch (const Error& e) {
    refusal = e.what();
    if (refusal.find(dir) == std::string::npos)
      fail("a refusal that names no file of the directory: " + refusal);
  }
  static const bool print = std::getenv("FLASHSERVE_FUZZ_PRINT") != nullptr;  // to read a crash
  if (print)
    std::fprintf(stderr, "defect at line %d: %s\n", defect,
                 refusal.empty() ? "accepted" : refusal.c_str());
  if (defect && refusal.empty()) fail("accepted a directory with a defect");
  if (!defect && !refusal.empty()) fail("refused a good directory: " + refusal);
  return 0;
}
