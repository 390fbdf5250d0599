#include "model/json_grammar.h"

namespace flashserve::model {
namespace {

bool is_ws(uint8_t b) {
  return b == ' ' || b == '\t' || b == '\n' || b == '\r';
}
bool is_digit(uint8_t b) {
  return b >= '0' && b <= '9';
}
bool is_hex(uint8_t b) {
  return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F');
}
constexpr const char* kLiterals[3] = {"true", "false", "null"};
constexpr uint8_t kLiteralLengths[3] = {4, 5, 4};

}  // namespace

bool JsonObjectRecognizer::whitespace(uint8_t b) {
  if (!is_ws(b) || spaces_ >= kMaxWhitespace) return false;
  ++spaces_;
  return true;
}

bool JsonObjectRecognizer::close(uint8_t b) {
  if (depth_ == 0 || stack_[depth_ - 1] != (b == '}' ? '{' : '[')) return false;
  --depth_;
  end_value();
  return true;
}

bool JsonObjectRecognizer::value_start(uint8_t b) {
  if (b == '{' || b == '[') {
    if (depth_ >= kMaxDepth) return false;
    stack_[depth_++] = static_cast<char>(b);
    mode_ = b == '{' ? Mode::kKeyOrEnd : Mode::kValueOrEnd;
  } else if (b == '"') {
    mode_ = Mode::kString;
    is_key_ = false;
  } else if (b == '-' || is_digit(b)) {
    mode_ = Mode::kNumber;
    number_ = b == '-' ? Num::kMinus : b == '0' ? Num::kZero : Num::kInt;
  } else if (b == 't' || b == 'f' || b == 'n') {
    mode_ = Mode::kLiteral;
    literal_ = b == 't' ? 0 : b == 'f' ? 1 : 2;
    literal_at_ = 1;
  } else {
    return false;
  }
  return true;
}

bool JsonObjectRecognizer::after_value(uint8_t b) {
  if (b == ',') {
    mode_ = stack_[depth_ - 1] == '{' ? Mode::kKey : Mode::kValue;
    return true;
  }
  return (b == '}' || b == ']') && close(b);
}

bool JsonObjectRecognizer::feed(uint8_t b) {
  const JsonObjectRecognizer before = *this;
  if (step(b)) return true;
  *this = before;
  return false;
}

bool JsonObjectRecognizer::step(uint8_t b) {
  const bool ws = is_ws(b);
  bool ok = false;
  switch (mode_) {
    case Mode::kStart:
      ok = b == '{' && value_start(b);
      break;
    case Mode::kValue:
      ok = ws ? whitespace(b) : value_start(b);
      break;
    case Mode::kValueOrEnd:
      ok = ws ? whitespace(b) : b == ']' ? close(b) : value_start(b);
      break;
    case Mode::kKeyOrEnd:
    case Mode::kKey:
      if (ws) {
        ok = whitespace(b);
      } else if (b == '"') {
        mode_ = Mode::kString;
        is_key_ = true;
        ok = true;
      } else {
        ok = mode_ == Mode::kKeyOrEnd && b == '}' && close(b);
      }
      break;
    case Mode::kColon:
      ok = ws ? whitespace(b) : b == ':';
      if (ok && !ws) mode_ = Mode::kValue;
      break;
    case Mode::kAfterValue:
      ok = ws ? whitespace(b) : after_value(b);
      break;
    case Mode::kString:
      if (b == '"') {
        if (is_key_)
          mode_ = Mode::kColon;
        else
          end_value();
        ok = true;
      } else if (b == '\\') {
        mode_ = Mode::kEscape;
        ok = true;
      } else {
        ok = b >= 0x20;  // control characters must be escaped
      }
      break;
    case Mode::kEscape:
      if (b == 'u') {
        mode_ = Mode::kUnicode;
        hex_left_ = 4;
        ok = true;
      } else {
        ok = b == '"' || b == '\\' || b == '/' || b == 'b' || b == 'f' || b == 'n' || b == 'r' ||
             b == 't';
        if (ok) mode_ = Mode::kString;
      }
      break;
    case Mode::kUnicode:
      ok = is_hex(b);
      if (ok && --hex_left_ == 0) mode_ = Mode::kString;
      break;
    case Mode::kLiteral:
      ok = b == static_cast<uint8_t>(kLiterals[literal_][literal_at_]);
      if (ok && ++literal_at_ == kLiteralLengths[literal_]) end_value();
      break;
    case Mode::kNumber: {
      // A number inside a container (the top level is an object): it ends at the first byte
      // that cannot continue it, which is then read as what follows a value.
      const Num n = number_;
      const bool ends = n == Num::kZero || n == Num::kInt || n == Num::kFrac || n == Num::kExp;
      if (is_digit(b) && n != Num::kZero) {
        number_ = n == Num::kMinus                   ? (b == '0' ? Num::kZero : Num::kInt)
                  : n == Num::kDot                   ? Num::kFrac
                  : n == Num::kE || n == Num::kESign ? Num::kExp
                                                     : n;
        ok = true;
      } else if (b == '.' && (n == Num::kZero || n == Num::kInt)) {
        number_ = Num::kDot;
        ok = true;
      } else if ((b == 'e' || b == 'E') && (n == Num::kZero || n == Num::kInt || n == Num::kFrac)) {
        number_ = Num::kE;
        ok = true;
      } else if ((b == '+' || b == '-') && n == Num::kE) {
        number_ = Num::kESign;
        ok = true;
      } else if (ends) {
        mode_ = Mode::kAfterValue;
        spaces_ = 0;
        ok = ws ? whitespace(b) : after_value(b);
      }
      break;
    }
    case Mode::kDone:
      ok = false;
      break;
  }
  if (!ok) return false;
  if (!ws || mode_ == Mode::kString || mode_ == Mode::kEscape) spaces_ = 0;
  return true;
}

}  // namespace flashserve::model
