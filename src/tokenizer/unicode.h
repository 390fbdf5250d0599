// The Unicode operations of Hugging Face's normalizers, on ICU (Debian's libicu-dev): the four
// normalization forms, lowercasing and whitespace stripping, on valid UTF-8 (the tokenizer makes
// its input valid before the normalizer runs).
#pragma once

#include <string>
#include <string_view>

namespace flashserve::tokenizer::unicode {

enum class Form { kNFC, kNFD, kNFKC, kNFKD };

std::string normalize(std::string_view text, Form form);

// Each code point to its full lowercase mapping on its own (Rust's char::to_lowercase, which
// Hugging Face's Lowercase applies): U+0130 becomes "i̇", and Σ becomes σ wherever it stands
// (no final-sigma rule, unlike str::to_lowercase and JavaScript's toLowerCase).
std::string lowercase(std::string_view text);

// Removes leading and/or trailing White_Space code points (Rust's char::is_whitespace).
std::string strip(std::string_view text, bool left, bool right);

// Removes the code points of general category Mn, Mc or Me (Hugging Face's StripAccents, which
// expects an NFD/NFKD text before it).
std::string strip_accents(std::string_view text);

}  // namespace flashserve::tokenizer::unicode
