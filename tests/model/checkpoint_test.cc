// Checkpoint directories: make-checkpoint's output (single file and shards with the index) loads
// and has the weight statistics it promises; activations stay in range through every layer of the
// float64 reference and the CPU runner agrees with it on bf16 weights; broken directories (missing,
// unexpected or misshapen tensor, index pointing nowhere, no weights) are refused naming file and
// tensor, by the checkpoint and by the runner.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "common/half.h"
#include "flashserve/error.h"
#include "model/checkpoint.h"
#include "model/forward_batch.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"
#include "model/runner.h"
#include "model/weights.h"
#include "reference_model.h"
#include "support/worst.h"
#include "test_dirs.h"

namespace flashserve::model {
namespace {

namespace fsys = std::filesystem;

struct Stats {
  double mean, sd, n;
};

// Mean, standard deviation and element count of a tensor, read through the reference's widening.
Stats stats(const Checkpoint& ck, const std::string& name) {
  const std::vector<double> v = testing::ref_read(ck, name);
  double s = 0, ss = 0;
  for (double x : v) s += x, ss += x * x;
  const double n = static_cast<double>(v.size()), mean = s / n;
  return {mean, std::sqrt(ss / n - mean * mean), n};
}

TEST(Checkpoint, ShardedRandomCheckpointLoadsWithThePromisedScales) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("FLASHSERVE_TEST_SEED=" + std::to_string(seed));
  const ModelConfig c = preset_config("tiny");
  const std::string dir = testing::fresh_dir("shards");
  RandomCheckpointOptions o;
  o.seed = seed;
  o.max_shard_bytes = 1 << 20;  // force several shards out of tiny's ~6 MB
  const uint64_t bytes = write_random_checkpoint(c, dir, o);
  ASSERT_TRUE(fsys::exists(dir + "/model.safetensors.index.json"));
  ASSERT_FALSE(fsys::exists(dir + "/model.safetensors"));
  std::ifstream in(dir + "/model.safetensors.index.json");
  const auto index = nlohmann::json::parse(in);
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), bytes);
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items()) shards.insert(file);
  EXPECT_GE(shards.size(), 3u);
  EXPECT_TRUE(shards.count("model-00001-of-0000" + std::to_string(shards.size()) + ".safetensors"));

  const Checkpoint ck = Checkpoint::open(dir);
  EXPECT_EQ(ck.config(), [&] {
    ModelConfig bf = c;
    bf.torch_dtype = "bfloat16";
    return bf;
  }());
  check_weights(ck);
  EXPECT_EQ(ck.names().size(), weight_specs(c).size());
  // The scales of random_checkpoint.h, within 6 standard errors of the sample mean (sd / sqrt(n))
  // and of the sample sd (at most sd / sqrt(2n), a normal's; a uniform's is smaller), plus bf16's
  // rounding (half an ulp near 1 is 2^-9), so that no seed fails: a 6-sigma miss is one in 5e8.
  // For the smallest tensor, the norm's 256 weights, that is 0.38 sd on the mean and 0.27 sd on
  // the sd: still tight enough to catch a wrong scale.
  const double H = static_cast<double>(c.hidden_size), L = static_cast<double>(c.num_hidden_layers);
  auto expect_std = [&](const std::string& name, double mean, double sd) {
    const Stats st = stats(ck, name);
    EXPECT_NEAR(st.mean, mean, 6 * sd / std::sqrt(st.n) + 0x1p-9) << name;
    EXPECT_NEAR(st.sd, sd, 6 * sd / std::sqrt(2 * st.n) + 0x1p-9) << name;
  };
  expect_std("model.embed_tokens.weight", 0, 1.0);
  expect_std("lm_head.weight", 0, 3 / std::sqrt(H));
  expect_std("model.layers.1.self_attn.q_proj.weight", 0, 1 / std::sqrt(H));
  expect_std("model.layers.2.self_attn.o_proj.weight", 0,
             1 / std::sqrt(static_cast<double>(c.q_size()) * 2 * L));
  expect_std("model.layers.3.mlp.down_proj.weight", 0,
             1 / std::sqrt(static_cast<double>(c.intermediate_size) * 2 * L));
  expect_std("model.norm.weight", 1.0, 0.1 / std::sqrt(3.0));

  // Same seed, same bytes, whatever the sharding; another seed, other bytes.
  const std::string single = testing::fresh_dir("single");
  write_random_checkpoint(c, single, {seed, DType::kBFloat16});
  const Checkpoint one = Checkpoint::open(single);
  const std::string name = "model.layers.2.mlp.up_proj.weight";
  ASSERT_EQ(one.tensor(name).bytes, ck.tensor(name).bytes);
  EXPECT_EQ(std::memcmp(one.tensor(name).data, ck.tensor(name).data, ck.tensor(name).bytes), 0);
  const std::string other = testing::fresh_dir("other");
  write_random_checkpoint(c, other, {seed + 1, DType::kBFloat16});
  EXPECT_NE(std::memcmp(Checkpoint::open(other).tensor(name).data, ck.tensor(name).data, 64), 0);
}

// make-checkpoint's promise: through every layer the residual stream stays near unit RMS and no
// intermediate value is large, for the tiny shape and a deeper, wider one; and the CPU runner
// computes the same logits as the float64 reference from the bf16 file.
TEST(Checkpoint, RandomWeightsKeepActivationsInRangeThroughEveryLayer) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("FLASHSERVE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ModelConfig deep = preset_config("tiny");
  deep.num_hidden_layers = 12;
  deep.architecture = "Qwen2ForCausalLM";
  deep.attention_bias = true;
  deep.tie_word_embeddings = true;
  for (const ModelConfig& c : {preset_config("tiny"), deep}) {
    const std::string dir = testing::fresh_dir("range");
    write_random_checkpoint(c, dir, {seed, DType::kBFloat16});
    const testing::RefModel ref = testing::ref_load(dir);
    std::vector<int32_t> tokens(48);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % c.vocab_size);
    const testing::RefTrace tr = testing::ref_forward(ref, tokens);
    const double first =
        c.tie_word_embeddings ? 3 / std::sqrt(static_cast<double>(c.hidden_size)) : 1.0;
    for (size_t l = 0; l < tr.layer_rms.size(); ++l) {
      EXPECT_GT(tr.layer_rms[l], 0.5 * first) << "layer " << l;
      EXPECT_LT(tr.layer_rms[l], 2.5) << "layer " << l;
    }
    EXPECT_LT(tr.max_abs_activation, 30.0);
    double rms = 0;
    for (double x : tr.logits.back()) rms += x * x;
    rms = std::sqrt(rms / static_cast<double>(c.vocab_size));
    EXPECT_GT(rms, 1.5);
    EXPECT_LT(rms, 6.0);

    if (!kHaveBlas) continue;
    auto runner = make_cpu_runner(dir);
    runner->allocate_kv(4, 16);
    ForwardBatchBuilder b(16);
    b.add(tokens.data(), 0, static_cast<int64_t>(tokens.size()), {3, 0, 2}, true);
    runner->forward(std::move(b).build());
    const std::vector<float> logits = runner->logits();
    double max_abs = 0;
    for (int64_t i = 0; i < c.vocab_size; ++i)
      max_abs = flashserve::testing::worse(max_abs, std::fabs(logits[i] - tr.logits.back()[i]));
    EXPECT_LE(max_abs, 3e-5 * rms) << c.num_hidden_layers << " layers";
  }
}

// A copy of a valid tiny directory with its model.safetensors rewritten by `edit` (the list of
// tensors to write, as read).
std::string broken_copy(const std::string& tag,
                        const std::function<void(std::vector<TensorToWrite>&)>& edit,
                        std::vector<std::vector<uint8_t>>& keep) {
  const std::string src = testing::fresh_dir(tag + "_src"), dir = testing::fresh_dir(tag);
  ModelConfig c = preset_config("tiny");
  c.num_hidden_layers = 1;
  write_random_checkpoint(c, src, {1, DType::kFloat32});
  const Checkpoint ck = Checkpoint::open(src);
  std::vector<TensorToWrite> ts;
  for (const auto& name : ck.names()) {
    const TensorInfo t = ck.tensor(name);
    keep.emplace_back(static_cast<const uint8_t*>(t.data),
                      static_cast<const uint8_t*>(t.data) + t.bytes);
    ts.push_back({name, t.dtype, t.shape, keep.back().data(), t.bytes});
  }
  edit(ts);
  fsys::copy_file(src + "/config.json", dir + "/config.json");
  write_safetensors(dir + "/model.safetensors", ts);
  return dir;
}

void expect_refused(const std::string& dir, std::vector<std::string> mentions) {
  for (int via_runner = 0; via_runner < (kHaveBlas ? 2 : 1); ++via_runner) {
    try {
      if (via_runner)
        make_cpu_runner(dir);
      else
        check_weights(Checkpoint::open(dir));
      ADD_FAILURE() << "accepted " << dir;
    } catch (const Error& e) {
      for (const auto& m : mentions)
        EXPECT_NE(std::string(e.what()).find(m), std::string::npos) << m << " in: " << e.what();
    }
  }
}

TEST(Checkpoint, BrokenDirectoriesAreRefusedNamingFileAndTensor) {
  std::vector<std::vector<uint8_t>> keep;
  keep.reserve(64);
  const std::string norm = "model.layers.0.post_attention_layernorm.weight";
  std::string dir = broken_copy(
      "missing",
      [&](auto& ts) { std::erase_if(ts, [&](const TensorToWrite& t) { return t.name == norm; }); },
      keep);
  expect_refused(dir, {norm, "missing"});
  dir = broken_copy(
      "unexpected",
      [&](auto& ts) {
        TensorToWrite extra = ts.back();
        extra.name = "model.layers.1.mlp.up_proj.weight";  // a layer the config does not have
        ts.push_back(extra);
      },
      keep);
  expect_refused(dir, {"model.layers.1.mlp.up_proj.weight", "unexpected", "model.safetensors"});
  dir = broken_copy(
      "shape",
      [&](auto& ts) {
        for (auto& t : ts)
          if (t.name == "model.layers.0.mlp.down_proj.weight") std::swap(t.shape[0], t.shape[1]);
      },
      keep);
  expect_refused(dir, {"model.layers.0.mlp.down_proj.weight", "[512, 256]", "[256, 512]",
                       "model.safetensors"});
  dir = broken_copy(
      "dtype",
      [&](auto& ts) {
        for (auto& t : ts)
          if (t.name == norm) t.dtype = DType::kInt32;
      },
      keep);
  expect_refused(dir, {norm, "I32"});

  // The index names a shard file that is absent, and a tensor its shard lacks.
  dir = broken_copy(
      "index", [](auto&) {}, keep);
  fsys::rename(dir + "/model.safetensors", dir + "/model-00001-of-00001.safetensors");
  {
    nlohmann::json idx = {{"metadata", {{"total_size", 0}}},
                          {"weight_map",
                           {{"model.norm.weight", "model-00001-of-00001.safetensors"},
                            {"model.ghost.weight", "model-00001-of-00001.safetensors"}}}};
    std::ofstream(dir + "/model.safetensors.index.json") << idx.dump();
  }
  expect_refused(dir, {"model.ghost.weight", "model-00001-of-00001.safetensors"});
  {
    nlohmann::json idx = {
        {"weight_map", {{"model.norm.weight", "model-00002-of-00002.safetensors"}}}};
    std::ofstream(dir + "/model.safetensors.index.json") << idx.dump();
  }
  expect_refused(dir, {"model-00002-of-00002.safetensors", "cannot be opened"});
  std::ofstream(dir + "/model.safetensors.index.json") << "{\"weight_map\": ";
  expect_refused(dir, {"model.safetensors.index.json", "JSON"});

  fsys::remove(dir + "/model.safetensors.index.json");
  fsys::remove(dir + "/model-00001-of-00001.safetensors");
  expect_refused(dir, {dir, "neither model.safetensors"});
  fsys::remove(dir + "/config.json");
  expect_refused(dir, {"config.json"});
  expect_refused(dir + "/nope", {"nope"});
}

// The shard index and the paths of a directory, as a careless or hostile writer leaves them. Each
// was accepted or refused with a misleading message before the hardening of model loading.
TEST(Checkpoint, IndexListingATensorTwiceOrNamingNoFileIsRefused) {
  std::vector<std::vector<uint8_t>> keep;
  const std::string dir = broken_copy(
      "twice", [](auto&) {}, keep);
  const std::string shard = "model-00001-of-00002.safetensors";
  const std::vector<std::string> names = Checkpoint::open(dir).names();
  fsys::rename(dir + "/model.safetensors", dir + "/" + shard);
  fsys::copy_file(dir + "/" + shard, dir + "/model-00002-of-00002.safetensors");
  auto index = [&](const std::string& weight_map) {
    std::ofstream(dir + "/model.safetensors.index.json")
        << R"({"metadata": {"total_size": 0}, "weight_map": )" + weight_map + "}";
  };
  // Every tensor in shard 1, and model.norm.weight listed again for shard 2: both shards hold it,
  // and JSON kept the second entry without a word (the directory loaded).
  std::string all = "{";
  for (const std::string& name : names) all += "\"" + name + "\": \"" + shard + "\", ";
  index(all + R"("model.norm.weight": "model-00002-of-00002.safetensors"})");
  expect_refused(dir, {"model.safetensors.index.json", "'model.norm.weight'", "twice"});
  // Shard names that are the directory itself: it was opened and failed to map ("No such
  // device").
  for (const std::string name : {"", ".", ".."}) {
    index(R"({"model.norm.weight": ")" + name + R"("})");
    expect_refused(dir, {"model.safetensors.index.json", "not a file name"});
  }
  // A shard that is a directory.
  fsys::create_directory(dir + "/model-00003-of-00003.safetensors");
  index(R"({"model.norm.weight": "model-00003-of-00003.safetensors"})");
  expect_refused(dir, {"model-00003-of-00003.safetensors", "is a directory"});
  // An index that is a directory read as an empty string: "not valid JSON".
  fsys::remove(dir + "/model.safetensors.index.json");
  fsys::create_directory(dir + "/model.safetensors.index.json");
  expect_refused(dir, {"model.safetensors.index.json", "is a directory"});
  // A single model.safetensors that is a directory.
  fsys::remove(dir + "/model.safetensors.index.json");
  fsys::create_directory(dir + "/model.safetensors");
  expect_refused(dir, {"model.safetensors", "is a directory"});
  // A directory name the file system refuses (ENAMETOOLONG) threw std::filesystem's own error.
  expect_refused(std::string(5000, 'x'), {"not a model directory"});
}

// A shard rewritten in place after the directory was opened: its weights were read as they then
// were, a mix of two versions if the rewrite came mid-load. Now every tensor lookup and the
// loaders' last step check that no file changed since open.
TEST(Checkpoint, AShardRewrittenWhileLoadingIsRefused) {
  std::vector<std::vector<uint8_t>> keep;
  const std::string dir = broken_copy(
      "rewritten", [](auto&) {}, keep);
  const Checkpoint ck = Checkpoint::open(dir);
  check_weights(ck);
  ck.check_unchanged();
  const std::string file = dir + "/model.safetensors";
  fsys::last_write_time(file, fsys::last_write_time(file) + std::chrono::seconds(10));
  for (const auto& check : std::vector<std::function<void()>>{[&] { check_weights(ck); },
                                                              [&] { ck.check_unchanged(); }}) {
    try {
      check();
      ADD_FAILURE() << "a file that changed after open was still read";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(file + ": changed"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace flashserve::model
