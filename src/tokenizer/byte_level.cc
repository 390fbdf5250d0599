#include "tokenizer/byte_level.h"

#include "tokenizer/utf8.h"

namespace flashserve::tokenizer {

const ByteLevelMap& ByteLevelMap::get() {
  static const ByteLevelMap map;
  return map;
}

ByteLevelMap::ByteLevelMap() {
  // Printable Latin-1 bytes map to themselves; the others (controls, space, 0x7F-0xA0, 0xAD)
  // take the code points from 256 on, in byte order.
  const auto printable = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const char32_t c = printable(b) ? static_cast<char32_t>(b) : next++;
    utf8::append(to_char_[b], c);
    to_byte_[c] = static_cast<uint8_t>(b);
  }
}

}  // namespace flashserve::tokenizer
