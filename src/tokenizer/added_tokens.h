// Added tokens (tokenizer.json "added_tokens"): found in the text before the model sees it, the
// leftmost match first and the longest among those starting there, as Hugging Face does.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace flashserve::tokenizer {

struct AddedToken {
  int32_t id;
  std::string content;
  bool special;
  bool lstrip, rstrip;  // the match swallows the whitespace before / after it
  bool single_word;     // matches only between non-word characters
};

// A stretch of the input: text for the model, or one added token (id >= 0).
struct Segment {
  std::string_view text;
  int32_t id;
  size_t offset;  // where it starts in the input
};

class AddedTokens {
 public:
  explicit AddedTokens(const nlohmann::json& added_tokens);

  std::vector<Segment> split(std::string_view text) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  std::vector<AddedToken> tokens_;
  // By first byte, the tokens starting with it, longest first.
  std::array<std::vector<const AddedToken*>, 256> by_first_;  // by first byte, longest first
};

}  // namespace flashserve::tokenizer
