// UTF-8 helpers shared by the tokenizer's stages: code point iteration and the lossy conversion
// (each maximal invalid subsequence becomes one U+FFFD, as Rust's from_utf8_lossy and the WHATWG
// TextDecoder do, so our decode() matches Hugging Face's byte for byte).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace flashserve::tokenizer::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// The length of the valid UTF-8 sequence starting at s[i], or 0 when the bytes there are not one.
inline size_t valid_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = b(i);
  if (c < 0x80) return 1;
  size_t n;
  uint8_t lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;  // no overlong forms
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
  } else {
    return 0;
  }
  if (i + 1 >= s.size() || b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (i + k >= s.size() || (b(i + k) & 0xC0) != 0x80) return 0;
  return n;
}

// How many bytes from s[i] one U+FFFD replaces: the maximal prefix of a valid sequence (at least
// 1).
inline size_t invalid_length(std::string_view s, size_t i) {
  const uint8_t c = static_cast<uint8_t>(s[i]);
  size_t n = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF)
    n = 2;
  else if (c >= 0xE0 && c <= 0xEF)
    n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
  else if (c >= 0xF0 && c <= 0xF4)
    n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
  else
    return 1;
  size_t k = 1;
  for (; k < n && i + k < s.size(); ++k) {
    const uint8_t x = static_cast<uint8_t>(s[i + k]);
    if (k == 1 ? (x < lo || x > hi) : (x & 0xC0) != 0x80) break;
  }
  return k;
}

inline bool is_valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = valid_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

inline std::string lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t run = 0;  // the start of the valid bytes not yet copied, copied in one go
  for (size_t i = 0; i < s.size();) {
    const size_t n = valid_length(s, i);
    if (n) {
      i += n;
    } else {
      out.append(s.substr(run, i - run)).append(kReplacement);
      i += invalid_length(s, i);
      run = i;
    }
  }
  return out.append(s.substr(run));
}

// The code point of the valid sequence at s[i] (its length in *len).
inline char32_t decode(std::string_view s, size_t i, size_t* len) {
  const size_t n = valid_length(s, i);
  *len = n;
  const auto b = [&](size_t k) { return static_cast<char32_t>(static_cast<uint8_t>(s[i + k])); };
  switch (n) {
    case 1:
      return b(0);
    case 2:
      return (b(0) & 0x1F) << 6 | (b(1) & 0x3F);
    case 3:
      return (b(0) & 0x0F) << 12 | (b(1) & 0x3F) << 6 | (b(2) & 0x3F);
    default:
      return (b(0) & 0x07) << 18 | (b(1) & 0x3F) << 12 | (b(2) & 0x3F) << 6 | (b(3) & 0x3F);
  }
}

inline void append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

}  // namespace flashserve::tokenizer::utf8
