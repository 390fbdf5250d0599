// The JSON that a completion may write under structured output, as a graph of nodes: any JSON
// value, objects of given properties (in a fixed order), arrays of given items, strings, numbers,
// integers, sets of literal values (enum, const, booleans, null) and unions told apart by their
// first byte. server/json_schema.h compiles a JSON Schema (response_format json_schema, a tool's
// parameters) into one; response_format json_object is the builtin any_object() grammar.
// model/json_recognizer.h reads bytes against it. Immutable once built and shared by every
// recognizer of a request (recognizers hold a pointer to it and node numbers).
//
// Choices that keep the recognizer a small copyable state and every prefix completable:
//   - A typed object writes its properties in the order given, each at most once; optional ones
//     may be left out; no other key is written. A key is matched against the literal texts of the
//     keys still allowed (a trie), so a key is whole before its value starts.
//   - Literal sets (enum, const, true/false/null) are the JSON texts of their values, matched
//     byte by byte through a trie; a union (anyOf) picks its branch by the value's first byte, so
//     branches must start differently (a type and null, a string and a number ...).
//   - A discriminated object (tool calls: {"name": one of the tools, "arguments": ...}) is an
//     object whose first property is a literal set; the literal written selects the object node
//     that the rest of its properties follow.
#pragma once

#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace flashserve::model {

class JsonGrammar {
 public:
  enum class Kind : uint8_t {
    kAny,
    kObject,
    kArray,
    kString,
    kNumber,
    kInteger,
    kLiterals,
    kAnyOf
  };

  // Builtin nodes, present in every grammar.
  static constexpr int32_t kAnyValue = 0;    // any JSON value
  static constexpr int32_t kAnyObject = 1;   // any object (any keys, any values)
  static constexpr int32_t kAnyArray = 2;    // any array
  static constexpr int32_t kAnyLiteral = 3;  // true, false, null
  // Node numbers and property indices fit the recognizer's 16-bit stack frames.
  static constexpr size_t kMaxNodes = 65535;

  struct Property {
    std::string key;  // the key's JSON text, quotes included ("\"name\"")
    int32_t value = kAnyValue;
    bool required = true;
  };

  struct Node {
    Kind kind = Kind::kAny;
    std::bitset<256> first;  // the bytes a value of this node may start with
    // kObject: free (any keys, any values: kAnyObject), or the typed properties below.
    bool free_keys = false;
    std::vector<int32_t> values;          // each property's value node, in order
    std::vector<uint16_t> next_required;  // [i]: the first required property at or after i
    int32_t keys = -1;                    // trie of the keys' texts; a key's value: its index
    std::vector<int32_t> select;  // discriminated: the first property's literal -> object node
    // kArray
    int32_t items = kAnyValue;
    // kLiterals: trie of the values' texts; a text's value: its index
    int32_t literals = -1;
    // kAnyOf: branches with disjoint first bytes (none a kAnyOf)
    std::vector<int32_t> branches;
  };

  struct TrieNode {
    std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
    int32_t value = -1;                                 // >= 0: a text ends here
    std::vector<int32_t> below;  // the values of the texts through here, sorted
  };

  JsonGrammar();  // the builtins; the root is kAnyObject
  // response_format json_object's grammar: any object.
  static std::shared_ptr<const JsonGrammar> any_object();

  // Builders: each returns the new node's number. Throw std::length_error past kMaxNodes.
  int32_t object(const std::vector<Property>& properties);
  // An object whose first property is `key` with one of `literals` (JSON texts); literal i then
  // continues as `objects[i]`, an object node whose property 0 is that same key.
  int32_t discriminated(const std::string& key, const std::vector<std::string>& literals,
                        const std::vector<int32_t>& objects);
  int32_t array(int32_t items);
  int32_t scalar(Kind kind);  // kString, kNumber or kInteger
  // Literal JSON texts (distinct, each a whole JSON scalar: "\"red\"", "1.5", "true", "null").
  int32_t literals(const std::vector<std::string>& texts);
  // A union of `branches` (anyOf branches are flattened). Returns -1 when two branches may start
  // with the same byte (the recognizer could not tell them apart there): `clash` gets that byte.
  int32_t any_of(const std::vector<int32_t>& branches, uint8_t* clash = nullptr);
  // The top-level value: an object node (a completion is one JSON object).
  void set_root(int32_t object_node);

  int32_t root() const { return root_; }
  const Node& node(int32_t n) const { return nodes_[static_cast<size_t>(n)]; }
  size_t size() const { return nodes_.size(); }
  // The trie node after `at` by byte `b`; -1 when no text continues so.
  int32_t trie_child(int32_t at, uint8_t b) const;
  const TrieNode& trie(int32_t at) const { return trie_[static_cast<size_t>(at)]; }

 private:
  int32_t add(Node n);
  int32_t trie_of(const std::vector<std::string>& texts);  // returns the root

  std::vector<Node> nodes_;
  std::vector<TrieNode> trie_;
  int32_t root_ = kAnyObject;
};

}  // namespace flashserve::model
