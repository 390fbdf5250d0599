// Where the checked-in tokenizer fixtures are (tests/tokenizer/fixtures, trained by train.mjs).
#pragma once

#include <string>

namespace flashserve::tokenizer {

inline std::string fixture_dir(const std::string& name) {
  return std::string(FLASHSERVE_TOKENIZER_FIXTURES) + "/" + name;
}

}  // namespace flashserve::tokenizer
