#include "model/json_grammar.h"

#include <algorithm>
#include <stdexcept>

namespace flashserve::model {
namespace {

std::bitset<256> bytes_of(const std::string& chars) {
  std::bitset<256> out;
  for (char c : chars) out.set(static_cast<uint8_t>(c));
  return out;
}
const std::bitset<256> kNumberStart = bytes_of("-0123456789");

}  // namespace

JsonGrammar::JsonGrammar() {
  Node any;
  any.kind = Kind::kAny;
  any.first = bytes_of("{[\"tfn") | kNumberStart;
  add(std::move(any));
  Node object;
  object.kind = Kind::kObject;
  object.free_keys = true;
  object.first = bytes_of("{");
  add(std::move(object));
  array(kAnyValue);
  literals({"true", "false", "null"});
}

std::shared_ptr<const JsonGrammar> JsonGrammar::any_object() {
  static const auto grammar = std::make_shared<const JsonGrammar>();
  return grammar;
}

int32_t JsonGrammar::add(Node n) {
  if (nodes_.size() >= kMaxNodes)
    throw std::length_error("a grammar of more than " + std::to_string(kMaxNodes) + " nodes");
  nodes_.push_back(std::move(n));
  return static_cast<int32_t>(nodes_.size() - 1);
}

int32_t JsonGrammar::trie_child(int32_t at, uint8_t b) const {
  const auto& kids = trie_[static_cast<size_t>(at)].children;
  auto it = std::lower_bound(kids.begin(), kids.end(), b,
                             [](const auto& kid, uint8_t x) { return kid.first < x; });
  return it != kids.end() && it->first == b ? it->second : -1;
}

int32_t JsonGrammar::trie_of(const std::vector<std::string>& texts) {
  const int32_t root = static_cast<int32_t>(trie_.size());
  trie_.emplace_back();
  for (size_t i = 0; i < texts.size(); ++i) {
    const int32_t value = static_cast<int32_t>(i);
    int32_t at = root;
    trie_[static_cast<size_t>(at)].below.push_back(value);
    for (char c : texts[i]) {
      const auto b = static_cast<uint8_t>(c);
      int32_t next = trie_child(at, b);
      if (next < 0) {
        next = static_cast<int32_t>(trie_.size());
        auto& kids = trie_[static_cast<size_t>(at)].children;
        kids.insert(std::lower_bound(kids.begin(), kids.end(), b,
                                     [](const auto& kid, uint8_t x) { return kid.first < x; }),
                    {b, next});
        trie_.emplace_back();  // (after the insert: it may move the node `kids` belongs to)
      }
      at = next;
      trie_[static_cast<size_t>(at)].below.push_back(value);  // values rise: stays sorted
    }
    trie_[static_cast<size_t>(at)].value = value;
  }
  return root;
}

int32_t JsonGrammar::object(const std::vector<Property>& properties) {
  if (properties.size() >= kMaxNodes)
    throw std::length_error("an object of more than " + std::to_string(kMaxNodes) + " properties");
  Node n;
  n.kind = Kind::kObject;
  n.first = bytes_of("{");
  std::vector<std::string> keys;
  for (const Property& p : properties) {
    keys.push_back(p.key);
    n.values.push_back(p.value);
  }
  n.next_required.assign(properties.size() + 1, static_cast<uint16_t>(properties.size()));
  for (size_t i = properties.size(); i-- > 0;)
    n.next_required[i] = properties[i].required ? static_cast<uint16_t>(i) : n.next_required[i + 1];
  n.keys = trie_of(keys);
  return add(std::move(n));
}

int32_t JsonGrammar::discriminated(const std::string& key, const std::vector<std::string>& literal,
                                   const std::vector<int32_t>& objects) {
  const int32_t n = object({{key, literals(literal), true}});
  nodes_[static_cast<size_t>(n)].select = objects;
  return n;
}

int32_t JsonGrammar::array(int32_t items) {
  Node n;
  n.kind = Kind::kArray;
  n.first = bytes_of("[");
  n.items = items;
  return add(std::move(n));
}

int32_t JsonGrammar::scalar(Kind kind) {
  Node n;
  n.kind = kind;
  n.first = kind == Kind::kString ? bytes_of("\"") : kNumberStart;
  return add(std::move(n));
}

int32_t JsonGrammar::literals(const std::vector<std::string>& texts) {
  Node n;
  n.kind = Kind::kLiterals;
  for (const std::string& t : texts)
    if (!t.empty()) n.first.set(static_cast<uint8_t>(t[0]));
  n.literals = trie_of(texts);
  return add(std::move(n));
}

int32_t JsonGrammar::any_of(const std::vector<int32_t>& branches, uint8_t* clash) {
  Node n;
  n.kind = Kind::kAnyOf;
  for (int32_t b : branches) {
    const Node& x = node(b);
    const std::vector<int32_t> flat = x.kind == Kind::kAnyOf ? x.branches : std::vector{b};
    for (int32_t f : flat) {
      const std::bitset<256> both = n.first & node(f).first;
      if (both.any()) {
        for (size_t c = 0; clash && c < 256; ++c)
          if (both.test(c)) {
            *clash = static_cast<uint8_t>(c);
            break;
          }
        return -1;
      }
      n.first |= node(f).first;
      n.branches.push_back(f);
    }
  }
  return add(std::move(n));
}

void JsonGrammar::set_root(int32_t object_node) {
  if (node(object_node).kind != Kind::kObject)
    throw std::invalid_argument("the root of a JSON grammar is an object");
  root_ = object_node;
}

}  // namespace flashserve::model
