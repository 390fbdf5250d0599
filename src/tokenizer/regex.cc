#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "flashserve/error.h"
#include "tokenizer/utf8.h"

namespace flashserve::tokenizer {

struct Regex::Code {
  pcre2_code* re = nullptr;
  ~Code() { pcre2_code_free(re); }
};

Regex::Regex(const std::string& pattern, bool literal, const std::string& field)
    : code_(std::make_unique<Code>()) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  // PCRE2_LITERAL takes no UCP (nothing in a literal is a character class).
  const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  code_->re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                            &err, &offset, nullptr);
  if (!code_->re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    throw Error(ErrorKind::kUnsupported, field,
                "pattern '" + pattern + "' does not compile with PCRE2 at offset " +
                    std::to_string(offset) + ": " + reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(code_->re, PCRE2_JIT_COMPLETE);  // an optimisation: the interpreter remains
  if (literal) literal_ = pattern;
}

Regex::~Regex() = default;

void Regex::for_each_match(std::string_view text,
                           const std::function<void(size_t, size_t)>& f) const {
  if (!literal_.empty()) {
    for (size_t at = 0; (at = text.find(literal_, at)) != std::string_view::npos;
         at += literal_.size())
      f(at, at + literal_.size());
    return;
  }
  // Freed however this ends (f may throw: the tokenizer stops a prompt that is already too long).
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> owned(
      pcre2_match_data_create_from_pattern(code_->re, nullptr), &pcre2_match_data_free);
  pcre2_match_data* md = owned.get();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    const int rc =
        pcre2_match(code_->re, subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) {
      if (rc == PCRE2_ERROR_NOMATCH) break;
      throw Error(ErrorKind::kInternal, "text", "PCRE2 match failed (" + std::to_string(rc) + ")");
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (ov[1] > ov[0]) {
      f(ov[0], ov[1]);
      start = ov[1];
    } else {  // an empty match: step over one character
      if (ov[0] >= text.size()) break;
      const size_t n = utf8::valid_length(text, ov[0]);
      start = ov[0] + (n ? n : 1);
    }
  }
}

}  // namespace flashserve::tokenizer
