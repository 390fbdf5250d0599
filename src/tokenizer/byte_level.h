// GPT-2's reversible map between bytes and printable code points: the byte-level BPE vocabulary
// is written in these characters (a space is "Ġ", U+0120), so every byte string has a spelling.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>

namespace flashserve::tokenizer {

class ByteLevelMap {
 public:
  static const ByteLevelMap& get();
  const std::string& encode(uint8_t byte) const { return to_char_[byte]; }
  // The byte a code point stands for, or -1 when it is not one of the 256.
  int decode(char32_t c) const {
    auto it = to_byte_.find(c);
    return it == to_byte_.end() ? -1 : it->second;
  }

 private:
  ByteLevelMap();
  std::array<std::string, 256> to_char_;
  std::unordered_map<char32_t, uint8_t> to_byte_;
};

}  // namespace flashserve::tokenizer
