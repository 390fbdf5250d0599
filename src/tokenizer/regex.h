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

  // The [begin, end) byte ranges of every non-overlapping, non-empty match in valid UTF-8 text.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;
  // The same ranges, handed to `f(begin, end)` in order as they are found.
  void for_each_match(std::string_view text, const std::function<void(size_t, size_t)>& f) const;

 private:
  struct Code;
  std::unique_ptr<Code> code_;
};

}  // namespace flashserve::tokenizer
