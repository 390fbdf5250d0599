#include "model/json_recognizer.h"

#include <algorithm>

namespace flashserve::model {
namespace {

using Kind = JsonGrammar::Kind;

bool is_ws(uint8_t b) {
  return b == ' ' || b == '\t' || b == '\n' || b == '\r';
}
bool is_digit(uint8_t b) {
  return b >= '0' && b <= '9';
}
bool is_hex(uint8_t b) {
  return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F');
}

}  // namespace

bool JsonRecognizer::whitespace(uint8_t b) {
  if (!is_ws(b) || spaces_ >= kMaxWhitespace) return false;
  ++spaces_;
  return true;
}

bool JsonRecognizer::string_byte(uint8_t b) {
  if (utf8_left_ > 0) {
    if (b < utf8_lo_ || b > utf8_hi_) return false;
    --utf8_left_;
    utf8_lo_ = 0x80;
    utf8_hi_ = 0xBF;
    return true;
  }
  if (b < 0x80) return b >= 0x20;  // control characters must be escaped
  // RFC 3629's table: the lead byte says how many continuation bytes follow, and the first of
  // them is narrowed where a wider one would be overlong (E0, F0), a surrogate (ED) or past
  // U+10FFFF (F4).
  if (b >= 0xC2 && b <= 0xDF) {
    utf8_left_ = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    utf8_left_ = 2;
    if (b == 0xE0) utf8_lo_ = 0xA0;
    if (b == 0xED) utf8_hi_ = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    utf8_left_ = 3;
    if (b == 0xF0) utf8_lo_ = 0x90;
    if (b == 0xF4) utf8_hi_ = 0x8F;
  } else {
    return false;  // a continuation byte without a lead, C0, C1, F5-FF
  }
  return true;
}

bool JsonRecognizer::close(uint8_t b) {
  if (depth_ == 0) return false;
  const JsonGrammar::Node& n = top();
  if (n.kind != (b == '}' ? Kind::kObject : Kind::kArray)) return false;
  // A typed object closes once no required property is left.
  if (b == '}' && !n.free_keys && n.next_required[stack_[depth_ - 1].next] < n.values.size())
    return false;
  --depth_;
  end_value();
  return true;
}

bool JsonRecognizer::value_start(int32_t node, uint8_t b) {
  const JsonGrammar::Node* n = &g_->node(node);
  if (!n->first.test(b)) return false;
  if (n->kind == Kind::kAnyOf)  // the branch that starts with b (the grammar keeps them apart)
    for (int32_t branch : n->branches)
      if (g_->node(branch).first.test(b)) {
        node = branch;
        n = &g_->node(branch);
        break;
      }
  switch (n->kind) {
    case Kind::kAny:
      if (b == '{') return value_start(JsonGrammar::kAnyObject, b);
      if (b == '[') return value_start(JsonGrammar::kAnyArray, b);
      if (b == 't' || b == 'f' || b == 'n') return value_start(JsonGrammar::kAnyLiteral, b);
      [[fallthrough]];  // a string or a number, of any content
    case Kind::kString:
    case Kind::kNumber:
    case Kind::kInteger:
      if (b == '"') {
        mode_ = Mode::kString;
        is_key_ = false;
      } else {
        mode_ = Mode::kNumber;
        integer_ = n->kind == Kind::kInteger;
        number_ = b == '-' ? Num::kMinus : b == '0' ? Num::kZero : Num::kInt;
      }
      return true;
    case Kind::kObject:
    case Kind::kArray:
      if (depth_ >= kMaxDepth) return false;
      stack_[depth_++] = {static_cast<uint16_t>(node), 0};
      mode_ = n->kind == Kind::kObject ? Mode::kKeyOrEnd : Mode::kValueOrEnd;
      return true;
    case Kind::kLiterals:
      trie_ = n->literals;
      mode_ = Mode::kLiteral;
      return literal_step(b);
    case Kind::kAnyOf:
      break;
  }
  return false;
}

bool JsonRecognizer::literal_step(uint8_t b) {
  const int32_t next = g_->trie_child(trie_, b);
  if (next >= 0) {
    trie_ = next;
    const JsonGrammar::TrieNode& t = g_->trie(next);
    if (t.value >= 0 && t.children.empty()) end_literal();  // whole, and nothing continues it
    return true;
  }
  // A text that another continues (1 of 1 and 10) ends at the first byte that cannot continue
  // it, which is then read as what follows a value.
  if (g_->trie(trie_).value < 0) return false;
  end_literal();
  spaces_ = 0;
  return is_ws(b) ? whitespace(b) : after_value(b);
}

void JsonRecognizer::end_literal() {
  // A discriminated object's first value chooses the object that its other properties follow.
  if (depth_ > 0) {
    Frame& f = stack_[depth_ - 1];
    const JsonGrammar::Node& n = g_->node(f.node);
    if (!n.select.empty() && f.next == 1)
      f.node = static_cast<uint16_t>(n.select[static_cast<size_t>(g_->trie(trie_).value)]);
  }
  end_value();
}

bool JsonRecognizer::key_allowed(int32_t trie_node) const {
  // The keys still allowed: from the next property up to the first required one left.
  const JsonGrammar::Node& n = top();
  const uint16_t lo = stack_[depth_ - 1].next;
  const int32_t hi =
      std::min<int32_t>(n.next_required[lo], static_cast<int32_t>(n.values.size()) - 1);
  const auto& below = g_->trie(trie_node).below;
  const auto it = std::lower_bound(below.begin(), below.end(), static_cast<int32_t>(lo));
  return it != below.end() && *it <= hi;
}

bool JsonRecognizer::key_start() {
  const JsonGrammar::Node& n = top();
  if (n.free_keys) {
    mode_ = Mode::kString;
    is_key_ = true;
    return true;
  }
  if (stack_[depth_ - 1].next >= n.values.size()) return false;
  trie_ = n.keys;
  mode_ = Mode::kKeyLiteral;
  return key_step('"');
}

bool JsonRecognizer::key_step(uint8_t b) {
  const int32_t next = g_->trie_child(trie_, b);
  if (next < 0 || !key_allowed(next)) return false;
  trie_ = next;
  const int32_t p = g_->trie(next).value;
  if (p >= 0) {  // the key's closing quote: its value comes next
    Frame& f = stack_[depth_ - 1];
    f.next = static_cast<uint16_t>(p + 1);
    want_ = static_cast<uint16_t>(top().values[static_cast<size_t>(p)]);
    mode_ = Mode::kColon;
  }
  return true;
}

bool JsonRecognizer::after_value(uint8_t b) {
  if (b == ',') {
    const JsonGrammar::Node& n = top();
    if (n.kind == Kind::kArray) {
      mode_ = Mode::kValue;
      want_ = static_cast<uint16_t>(n.items);
      return true;
    }
    // A typed object takes a comma only while a property is left to write.
    if (!n.free_keys && stack_[depth_ - 1].next >= n.values.size()) return false;
    mode_ = Mode::kKey;
    return true;
  }
  return (b == '}' || b == ']') && close(b);
}

bool JsonRecognizer::feed(uint8_t b) {
  const JsonRecognizer before = *this;
  if (step(b)) return true;
  *this = before;
  return false;
}

bool JsonRecognizer::step(uint8_t b) {
  const bool ws = is_ws(b);
  bool ok = false;
  switch (mode_) {
    case Mode::kStart:
      ok = b == '{' && value_start(g_->root(), b);
      break;
    case Mode::kValue:
      ok = ws ? whitespace(b) : value_start(want_, b);
      break;
    case Mode::kValueOrEnd:
      ok = ws ? whitespace(b) : b == ']' ? close(b) : value_start(top().items, b);
      break;
    case Mode::kKeyOrEnd:
    case Mode::kKey:
      if (ws)
        ok = whitespace(b);
      else if (b == '"')
        ok = key_start();
      else
        ok = mode_ == Mode::kKeyOrEnd && b == '}' && close(b);
      break;
    case Mode::kColon:
      ok = ws ? whitespace(b) : b == ':';
      if (ok && !ws) mode_ = Mode::kValue;
      break;
    case Mode::kAfterValue:
      ok = ws ? whitespace(b) : after_value(b);
      break;
    case Mode::kString:
      if (utf8_left_ > 0) {
        ok = string_byte(b);
      } else if (b == '"') {
        if (is_key_) {
          mode_ = Mode::kColon;
          want_ = JsonGrammar::kAnyValue;  // a free object's values are any values
        } else {
          end_value();
        }
        ok = true;
      } else if (b == '\\') {
        mode_ = Mode::kEscape;
        ok = true;
      } else {
        ok = string_byte(b);
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
      ok = literal_step(b);
      break;
    case Mode::kKeyLiteral:
      ok = key_step(b);
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
      } else if (b == '.' && !integer_ && (n == Num::kZero || n == Num::kInt)) {
        number_ = Num::kDot;
        ok = true;
      } else if ((b == 'e' || b == 'E') && !integer_ &&
                 (n == Num::kZero || n == Num::kInt || n == Num::kFrac)) {
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
  if (!ws || mode_ == Mode::kString || mode_ == Mode::kEscape || mode_ == Mode::kLiteral ||
      mode_ == Mode::kKeyLiteral)
    spaces_ = 0;
  return true;
}

}  // namespace flashserve::model
