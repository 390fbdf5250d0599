// The BPE model of tokenizer.json: a vocabulary, merges by rank, and for characters outside the
// vocabulary either the `<0xXX>` byte tokens (byte_fallback) or the unknown token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace flashserve::tokenizer {

class Bpe {
 public:
  // `model` is tokenizer.json's "model" object; errors name "tokenizer.json: model.<field>".
  explicit Bpe(const nlohmann::json& model);

  // Appends the ids of one pre-tokenized word and returns true; or, when the word's ids would
  // certainly take `out` past max_out ids, returns false at once with `out` unchanged.
  bool encode_word(std::string_view word, std::vector<int32_t>& out,
                   size_t max_out = SIZE_MAX) const;

  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32 | static_cast<uint32_t>(b);
  }

  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<uint64_t, Merge> merges_;
  int32_t byte_ids_[256];  // <0xXX> ids when byte_fallback and all 256 exist, else -1
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  bool fuse_unk_ = false;
  int32_t unk_id_ = -1;
  size_t max_token_bytes_ = 1;  // the longest token string in the vocabulary
};

}  // namespace flashserve::tokenizer
