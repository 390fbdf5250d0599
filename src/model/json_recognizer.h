// A byte-at-a-time recognizer of JSON text (RFC 8259) that follows a JsonGrammar
// (model/json_grammar.h): response_format json_object (any object), json_schema and tool calls
// (server/json_constraint.h turns it into the mask of the tokens that may come next). Trivially
// copyable (a fixed-depth stack of 4-byte frames and a pointer to the shared grammar), so that a
// search over a vocabulary copies it at each branch.
//
// Beyond the RFC, to keep a sampled completion from running away: the top level is an object
// starting with '{' at once (no leading whitespace), nothing follows its closing '}', at most
// kMaxWhitespace whitespace bytes in a row, and objects/arrays nest at most kMaxDepth deep. Strings
// are UTF-8 (RFC 3629: no overlong forms, no surrogates), checked byte by byte, so a token may end
// inside a character and the next ones complete it. An invalid sequence would not stay inside its
// string in the text: byte fallback (Llama's, Mistral's tokenizers) shows a run of byte tokens
// that is not UTF-8 as one U+FFFD per byte, the '"' byte after a lone lead byte included.
#pragma once

#include <cstdint>

#include "model/json_grammar.h"

namespace flashserve::model {

class JsonRecognizer {
 public:
  static constexpr int kMaxDepth = 32;
  static constexpr int kMaxWhitespace = 8;

  // Any JSON object (json_object's grammar).
  JsonRecognizer() : JsonRecognizer(JsonGrammar::any_object().get()) {}
  // `grammar` outlives the recognizer (and its copies).
  explicit JsonRecognizer(const JsonGrammar* grammar) : g_(grammar) {}

  // Takes one byte; false (the state unchanged) when no text of the grammar has the bytes so far
  // followed by this one as a prefix.
  bool feed(uint8_t byte);
  // feed without the restore: after false the state is unspecified (a search that discards it).
  bool step(uint8_t byte);
  // Whether the bytes so far are a whole JSON object of the grammar.
  bool complete() const { return mode_ == Mode::kDone; }
  // Inside a string of any content, between characters, no escape pending: a token whose bytes
  // are whole characters, none a control character, '"' or '\\', is taken and leaves the state
  // as it is.
  bool in_string_body() const { return mode_ == Mode::kString && utf8_left_ == 0; }

 private:
  enum class Mode : uint8_t {
    kStart,       // nothing yet: '{'
    kValue,       // a value of node want_ (after ':' or ',' in an array)
    kValueOrEnd,  // after '[': a value or ']'
    kKeyOrEnd,    // after '{': a key or '}'
    kKey,         // after ',' in an object: a key
    kColon,       // after a key (want_: the value's node)
    kAfterValue,  // after a value in a container: ',' or its closing bracket
    kString,      // inside a string of any content (is_key_ says whether a free object's key)
    kEscape,      // after '\' in a string
    kUnicode,     // inside \uXXXX (hex_left_ digits to go)
    kNumber,      // inside a number (number_ says where; integer_: no fraction or exponent)
    kLiteral,     // inside one of a literal set's texts (trie_: where)
    kKeyLiteral,  // inside one of a typed object's keys (trie_: where)
    kDone,        // the top-level object is closed
  };
  enum class Num : uint8_t { kMinus, kZero, kInt, kDot, kFrac, kE, kESign, kExp };
  // An open object or array: its node, and (typed object) the index of the next property.
  struct Frame {
    uint16_t node;
    uint16_t next;
  };

  const JsonGrammar::Node& top() const { return g_->node(stack_[depth_ - 1].node); }
  bool value_start(int32_t node, uint8_t b);
  bool key_start();
  bool key_step(uint8_t b);
  bool key_allowed(int32_t trie_node) const;
  bool literal_step(uint8_t b);
  void end_literal();
  bool after_value(uint8_t b);
  bool close(uint8_t b);  // '}' or ']' matching the innermost container
  bool whitespace(uint8_t b);
  bool string_byte(uint8_t b);  // a byte of a string's content, but '"' and '\\'
  void end_value() { mode_ = depth_ == 0 ? Mode::kDone : Mode::kAfterValue; }

  const JsonGrammar* g_;
  int32_t trie_ = -1;
  uint16_t want_ = 0;
  Mode mode_ = Mode::kStart;
  Num number_ = Num::kInt;
  bool is_key_ = false;
  bool integer_ = false;
  uint8_t hex_left_ = 0;
  uint8_t utf8_left_ = 0;  // continuation bytes the string's character still needs
  uint8_t utf8_lo_ = 0x80, utf8_hi_ = 0xBF;  // the range of the next one
  uint8_t spaces_ = 0;
  uint8_t depth_ = 0;
  Frame stack_[kMaxDepth] = {};
};

}  // namespace flashserve::model
