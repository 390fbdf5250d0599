// A synthetic vocabulary for structured output's cost (server/json_constraint.h): tokens of 1-8
// random bytes each from letters, spaces, digits and JSON punctuation (about 8% of the tokens
// hold a '"', more than a real tokenizer's), the same for a given size and seed.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace flashserve::bench {

inline std::vector<std::string> synthetic_vocab(int32_t size, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  const std::string chars = "abcdefghijklmnopqrstuvwxyz      ETAOIN,.:;\"{}[]0123456789-_'!?\n";
  std::vector<std::string> bytes(static_cast<size_t>(size > 0 ? size : 1));
  for (auto& t : bytes)
    for (int i = 0, n = 1 + static_cast<int>(rng() % 8); i < n; ++i)
      t += chars[rng() % chars.size()];
  return bytes;
}

}  // namespace flashserve::bench
