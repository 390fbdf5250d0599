// The tensor-parallel split (model/tensor_parallel.h, model/weight_shard.h): every weight of each
// architecture cut for TP=2 and TP=4 and put back together bit for bit, the slices checked against
// what Megatron's split means (the query heads of a rank read the KV heads it holds, column splits
// concatenate to the whole, replicated parts are copies), and the sizes that cannot split a model
// refused by name.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "flashserve/error.h"
#include "model/tensor_parallel.h"
#include "model/weight_shard.h"
#include "model/weights.h"
#include "test_dirs.h"

namespace flashserve::model {
namespace {

ModelConfig config_of(const std::string& variant) {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.num_hidden_layers = 2;
  c.hidden_size = 64;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;  // GQA: TP=2 splits the KV heads, TP=4 replicates each over 2 ranks
  c.head_dim = 16;
  c.intermediate_size = 96;
  c.vocab_size = 301;  // not a multiple of 2 or 4: the last vocabulary block is short
  c.max_position_embeddings = 128;
  if (variant == "qwen2") {  // q/k/v biases, tied head, MQA (one KV head on every rank)
    c.architecture = "Qwen2ForCausalLM";
    c.attention_bias = true;
    c.tie_word_embeddings = true;
    c.num_key_value_heads = 1;
  } else if (variant == "qwen3") {  // q/k norms, MHA
    c.architecture = "Qwen3ForCausalLM";
    c.qk_norm = true;
    c.num_key_value_heads = 8;
  }
  c.validate();
  return c;
}

std::vector<std::byte> random_bytes(std::mt19937_64& rng, size_t n) {
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng() & 0xff);
  return out;
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

class WeightShard : public ::testing::TestWithParam<std::string> {};

TEST_P(WeightShard, UnshardOfShardIsEveryWeightBitForBit) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("FLASHSERVE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const ModelConfig c = config_of(GetParam());
  for (int64_t tp : {2, 4}) {
    for (size_t elem : {size_t{4}, size_t{2}}) {  // float32 and bf16 checkpoints
      for (const WeightSpec& w : weight_specs(c)) {
        SCOPED_TRACE("TP=" + std::to_string(tp) + " " + w.name + " elem " + std::to_string(elem));
        const std::vector<std::byte> full =
            random_bytes(rng, static_cast<size_t>(numel(w.shape)) * elem);
        std::vector<std::vector<std::byte>> slices;
        for (int64_t r = 0; r < tp; ++r) {
          slices.push_back(shard_tensor(w, c, tp, r, full.data(), elem));
          const ShardSlice s = shard_slice(w, c, tp, r);
          ASSERT_EQ(slices.back().size(), static_cast<size_t>(numel(s.shape)) * elem);
        }
        EXPECT_EQ(unshard_tensor(w, c, slices, elem), full);
      }
    }
  }
}

// What the split means, checked on the slices rather than on the code that cuts them: rank r's
// q_proj rows are those of query heads [r hq/N, (r+1) hq/N); each of those heads reads, by GQA's
// rule (head h uses KV head h / (hq / hkv)), a KV head whose k_proj rows the rank holds; o_proj's
// columns go with the query heads; the MLP and vocabulary blocks tile their dimension in rank
// order.
TEST_P(WeightShard, SlicesAreTheRanksHeadsColumnsAndVocabulary) {
  const ModelConfig c = config_of(GetParam());
  const int64_t d = c.head_dim, group = c.num_attention_heads / c.num_key_value_heads;
  for (int64_t tp : {2, 4}) {
    int64_t ffn_next = 0, vocab_next = 0;
    for (int64_t r = 0; r < tp; ++r) {
      SCOPED_TRACE("TP=" + std::to_string(tp) + " rank " + std::to_string(r));
      const RankShape s = rank_shape(c, tp, r);
      EXPECT_EQ(s.q_heads * tp, c.num_attention_heads);
      EXPECT_EQ(s.q_head_begin, r * s.q_heads);
      for (int64_t h = s.q_head_begin; h < s.q_head_begin + s.q_heads; ++h) {
        EXPECT_GE(h / group, s.kv_head_begin) << "query head " << h;
        EXPECT_LT(h / group, s.kv_head_begin + s.kv_heads) << "query head " << h;
      }
      EXPECT_EQ(s.ffn_begin, ffn_next);
      ffn_next += s.ffn;
      EXPECT_EQ(s.vocab_begin, vocab_next);
      EXPECT_LE(s.vocab, s.vocab_block);
      vocab_next += s.vocab;
      for (const WeightSpec& w : weight_specs(c)) {
        const ShardSlice sl = shard_slice(w, c, tp, r);
        if (w.name.ends_with("q_proj.weight")) {
          EXPECT_EQ(sl.begin, s.q_head_begin * d);
          EXPECT_EQ(sl.shape[0], s.q_heads * d);
        }
        if (w.name.ends_with("o_proj.weight")) {
          EXPECT_EQ(sl.dim, 1);
          EXPECT_EQ(sl.begin, s.q_head_begin * d);
        }
        if (w.name.ends_with("k_proj.weight") || w.name.ends_with("v_proj.bias")) {
          EXPECT_EQ(sl.begin, s.kv_head_begin * d);
          EXPECT_EQ(sl.shape[0], s.kv_heads * d);
        }
        if (w.name.ends_with("down_proj.weight")) EXPECT_EQ(sl.dim, 1);
        if (w.role == WeightRole::kNorm || w.role == WeightRole::kEmbedding)
          EXPECT_EQ(sl.dim, -1) << w.name << " is replicated";
      }
    }
    EXPECT_EQ(ffn_next, c.intermediate_size);
    EXPECT_EQ(vocab_next, c.vocab_size);
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, WeightShard, ::testing::Values("llama", "qwen2", "qwen3"));

// Split without replication (TP=2, two KV heads): the ranks' k_proj slices, stacked in rank order,
// are k_proj. Replicated (MQA at TP=4): every rank's k_proj slice is all of k_proj.
TEST(WeightShardLayout, ColumnSplitsStackAndReplicasCopy) {
  std::mt19937_64 rng(7);
  for (const char* variant : {"llama", "qwen2"}) {
    const ModelConfig c = config_of(variant);
    const int64_t tp = c.num_key_value_heads == 1 ? 4 : 2;
    const WeightSpec k = weight_specs(c)[3];
    ASSERT_EQ(k.name, layer_weight(0, "self_attn.k_proj.weight"));
    const std::vector<std::byte> full = random_bytes(rng, static_cast<size_t>(numel(k.shape)) * 4);
    std::vector<std::byte> stacked;
    for (int64_t r = 0; r < tp; ++r) {
      const std::vector<std::byte> s = shard_tensor(k, c, tp, r, full.data(), 4);
      if (c.num_key_value_heads == 1)
        EXPECT_EQ(s, full) << variant << " rank " << r;
      else
        stacked.insert(stacked.end(), s.begin(), s.end());
    }
    if (c.num_key_value_heads > 1) EXPECT_EQ(stacked, full) << variant;
  }
}

TEST(WeightShardLayout, ReplicasThatDisagreeAreRefusedByName) {
  const ModelConfig c = config_of("qwen2");  // MQA: k_proj is on all 4 ranks
  const WeightSpec k = weight_specs(c)[3];
  std::mt19937_64 rng(3);
  const std::vector<std::byte> full = random_bytes(rng, static_cast<size_t>(numel(k.shape)) * 4);
  std::vector<std::vector<std::byte>> slices;
  for (int64_t r = 0; r < 4; ++r) slices.push_back(shard_tensor(k, c, 4, r, full.data(), 4));
  slices[2][5] ^= std::byte{1};
  try {
    unshard_tensor(k, c, slices, 4);
    FAIL() << "a replica that differs was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), k.name);
    EXPECT_NE(std::string(e.what()).find("ranks 0 and 2"), std::string::npos) << e.what();
  }
  slices[2].pop_back();
  EXPECT_THROW(unshard_tensor(k, c, slices, 4), Error);  // a slice of the wrong size
}

TEST(TensorParallelSize, SizesThatDoNotSplitTheModelAreRefusedByName) {
  auto refused = [](const ModelConfig& c, int64_t tp, const std::string& field) {
    try {
      check_tensor_parallel(c, tp);
      ADD_FAILURE() << "TP=" << tp << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_EQ(e.argument(), "tensor_parallel_size");
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  ModelConfig c = config_of("llama");  // 8 query heads, 2 KV heads, ffn 96
  refused(c, 0, "at least 1");
  refused(c, 3, "num_attention_heads");
  refused(c, 16, "num_attention_heads");
  c.num_attention_heads = 12;
  c.num_key_value_heads = 3;
  refused(c, 2, "num_key_value_heads 3 is not a multiple");
  c.num_key_value_heads = 2;    // 6 ranks over 2 KV heads would be fine; 12 query heads over 3...
  refused(c, 3, "fractional");  // 3 ranks cannot share 2 KV heads evenly
  c = config_of("llama");
  c.intermediate_size = 90;
  refused(c, 4, "intermediate_size");
  EXPECT_NO_THROW(check_tensor_parallel(config_of("llama"), 8));  // 1 query head, KV x4 copies
  EXPECT_THROW(rank_shape(config_of("llama"), 2, 2), Error);      // rank outside the group
}

// The model that stands for one rank's compute in a profile: rank 0's sizes, nothing else changed.
TEST(TensorParallelSize, RankConfigHasOneRanksHeadsColumnsAndVocabulary) {
  const ModelConfig c = config_of("llama");
  const ModelConfig r = rank_config(c, 4);
  EXPECT_EQ(r.num_attention_heads, 2);
  EXPECT_EQ(r.num_key_value_heads, 1);
  EXPECT_EQ(r.intermediate_size, 24);
  EXPECT_EQ(r.vocab_size, 76);  // ceil(301 / 4)
  EXPECT_EQ(r.hidden_size, c.hidden_size);
  EXPECT_EQ(r.head_dim, c.head_dim);
  EXPECT_EQ(r.num_hidden_layers, c.num_hidden_layers);
  EXPECT_NO_THROW(r.validate());
}

}  // namespace
}  // namespace flashserve::model
