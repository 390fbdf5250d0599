// A byte-at-a-time recognizer of JSON text (RFC 8259) whose top-level value is an object: what
// response_format {"type": "json_object"} asks of a completion (server/json_constraint.h turns
// it into the mask of the tokens that may come next). Trivially copyable (a fixed-depth stack),
// so that a search over a vocabulary copies it at each branch.
//
// Beyond the RFC, to keep a sampled completion from running away: the top level starts with '{'
// at once (no leading whitespace), nothing follows its closing '}', at most kMaxWhitespace
// whitespace bytes in a row, and objects/arrays nest at most kMaxDepth deep. Bytes >= 0x80 are
// taken inside strings without checking UTF-8 (a byte-level tokenizer's token may end inside a
// character; the text stream shows an invalid sequence as U+FFFD, still a valid string).
#pragma once

#include <cstdint>

namespace flashserve::model {

class JsonObjectRecognizer {
 public:
  static constexpr int kMaxDepth = 32;
  static constexpr int kMaxWhitespace = 8;

  // Takes one byte; false (the state unchanged) when no JSON object text has the bytes so far
  // followed by this one as a prefix.
  bool feed(uint8_t byte);
  // feed without the restore: after false the state is unspecified (a search that discards it).
  bool step(uint8_t byte);
  // Whether the bytes so far are a whole JSON object.
  bool complete() const { return mode_ == Mode::kDone; }
  // Inside a string, no escape pending: any byte >= 0x20 but '"' and '\\' is taken and leaves
  // the state as it is.
  bool in_string_body() const { return mode_ == Mode::kString; }

 private:
  enum class Mode : uint8_t {
    kStart,       // nothing yet: '{'
    kValue,       // a value (after ':' or ',' in an array)
    kValueOrEnd,  // after '[': a value or ']'
    kKeyOrEnd,    // after '{': a key or '}'
    kKey,         // after ',' in an object: a key
    kColon,       // after a key
    kAfterValue,  // after a value in a container: ',' or its closing bracket
    kString,      // inside a string (is_key_ says which)
    kEscape,      // after '\' in a string
    kUnicode,     // inside \uXXXX (hex_left_ digits to go)
    kNumber,      // inside a number (number_ says where)
    kLiteral,     // inside true / false / null
    kDone,        // the top-level object is closed
  };
  enum class Num : uint8_t { kMinus, kZero, kInt, kDot, kFrac, kE, kESign, kExp };

  bool value_start(uint8_t b);
  bool after_value(uint8_t b);
  bool close(uint8_t b);  // '}' or ']' matching the innermost container
  bool whitespace(uint8_t b);
  void end_value() { mode_ = depth_ == 0 ? Mode::kDone : Mode::kAfterValue; }

  Mode mode_ = Mode::kStart;
  Num number_ = Num::kInt;
  bool is_key_ = false;
  uint8_t hex_left_ = 0;
  uint8_t literal_ = 0;  // 0 true, 1 false, 2 null
  uint8_t literal_at_ = 0;
  uint8_t spaces_ = 0;
  uint8_t depth_ = 0;
  char stack_[kMaxDepth] = {};  // '{' or '['
};

}  // namespace flashserve::model
