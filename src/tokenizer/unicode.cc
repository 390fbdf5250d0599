#include "tokenizer/unicode.h"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/utf8.h>

#include "flashserve/error.h"

namespace flashserve::tokenizer::unicode {
namespace {

const icu::Normalizer2& normalizer(Form form) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case Form::kNFC:
      n = icu::Normalizer2::getNFCInstance(status);
      break;
    case Form::kNFD:
      n = icu::Normalizer2::getNFDInstance(status);
      break;
    case Form::kNFKC:
      n = icu::Normalizer2::getNFKCInstance(status);
      break;
    case Form::kNFKD:
      n = icu::Normalizer2::getNFKDInstance(status);
      break;
  }
  if (U_FAILURE(status) || !n)
    throw Error(ErrorKind::kInternal, "normalizer",
                std::string("ICU has no normalizer data: ") + u_errorName(status));
  return *n;
}

// Calls f(code point, begin byte, end byte) for each code point of valid UTF-8.
template <typename F>
void for_each_code_point(std::string_view s, F&& f) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const int32_t n = static_cast<int32_t>(s.size());
  for (int32_t i = 0; i < n;) {
    const int32_t b = i;
    UChar32 c;
    U8_NEXT(p, i, n, c);
    f(c, static_cast<size_t>(b), static_cast<size_t>(i));
  }
}

}  // namespace

std::string normalize(std::string_view text, Form form) {
  const icu::Normalizer2& n = normalizer(form);
  const icu::UnicodeString in = icu::UnicodeString::fromUTF8(
      icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  UErrorCode status = U_ZERO_ERROR;
  if (n.isNormalized(in, status) && U_SUCCESS(status)) return std::string(text);
  status = U_ZERO_ERROR;
  const icu::UnicodeString out = n.normalize(in, status);
  if (U_FAILURE(status))
    throw Error(ErrorKind::kInternal, "normalizer",
                std::string("ICU normalization failed: ") + u_errorName(status));
  std::string result;
  out.toUTF8String(result);
  return result;
}

std::string lowercase(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for_each_code_point(text, [&](UChar32 c, size_t, size_t) {
    if (c < 0x80) {
      out += static_cast<char>(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
      return;
    }
    // One code point alone: ICU's full mapping without any context (no final sigma).
    icu::UnicodeString one(c);
    one.toLower(icu::Locale::getRoot());
    one.toUTF8String(out);
  });
  return out;
}

std::string strip(std::string_view text, bool left, bool right) {
  size_t begin = text.size(), end = 0;  // the first and past-the-last non-space bytes
  for_each_code_point(text, [&](UChar32 c, size_t b, size_t e) {
    if (u_hasBinaryProperty(c, UCHAR_WHITE_SPACE)) return;
    if (begin == text.size()) begin = b;
    end = e;
  });
  if (begin == text.size()) return left || right ? std::string() : std::string(text);
  const size_t from = left ? begin : 0, to = right ? end : text.size();
  return std::string(text.substr(from, to - from));
}

std::string strip_accents(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for_each_code_point(text, [&](UChar32 c, size_t b, size_t e) {
    if ((U_GET_GC_MASK(c) & U_GC_M_MASK) == 0) out.append(text, b, e - b);
  });
  return out;
}

}  // namespace flashserve::tokenizer::unicode
