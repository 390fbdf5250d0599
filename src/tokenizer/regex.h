// A compiled pre-tokenizer pattern on PCRE2 (UTF + UCP, so \p{L}, \s and \w are Unicode-aware as
// in Oniguruma, which Hugging Face's tokenizers use). Immutable and shareable across threads.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flashserve::tokenizer {

class Regex {
 public:
  // `literal`: the pattern is a plain string (tokenizer.json's {"String": ...} patterns).
  Regex(const std::string& pattern, bool literal, const std::string& field);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Hands `f(begin, end)` the byte range of every non-overlapping, non-empty match in valid UTF-8
  // text, in order, as they are found.
  void for_each_match(std::string_view text, const std::function<void(size_t, size_t)>& f) const;

 private:
  struct Code;
  std::unique_ptr<Code> code_;
  std::string literal_;  // a non-empty literal pattern, matched by plain search (much faster)
};

}  // namespace flashserve::tokenizer
