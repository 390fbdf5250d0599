// Structured output (response_format json_object or json_schema, tool calls): the tokens that keep
// a completion a prefix of a JSON object of a grammar (model/json_grammar.h, read by
// model/json_recognizer.h), as a model::TokenConstraint the engine applies per step. The
// vocabulary is a trie of the tokens' bytes, built once per tokenizer; a step's mask walks it
// from the recognizer's state, copying the state at each branch and pruning a subtree at its first
// byte that cannot follow, so the tokens that share a prefix share its work. Inside a string most
// tokens are plain string content (whole UTF-8 characters, no '"', '\\' or control character):
// those are one precomputed mask there, and only the others are walked.
// Special tokens and tokens without bytes are never allowed (the request's stop and eos tokens
// are the executor's: allowed once the object is complete). If no token can continue an
// incomplete object (a vocabulary without the bytes it needs), the object is reported complete so
// that only the stop tokens remain: the completion ends, cut short, rather than sampling from an
// empty set.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/json_grammar.h"
#include "model/json_recognizer.h"
#include "model/token_constraint.h"

namespace flashserve::server {

class TextCodec;

class VocabTrie {
 public:
  // Tokens 0 .. vocab - 1 of `codec` (vocab: the model's vocabulary, at most the tokenizer's):
  // their token_bytes, skipping special ones and empty ones.
  static std::shared_ptr<const VocabTrie> build(const TextCodec& codec, int32_t vocab);
  // From explicit byte strings (tests); an empty string is no token.
  explicit VocabTrie(const std::vector<std::string>& token_bytes);

  int32_t vocab() const { return vocab_; }
  // Sets in `allowed` the bit of every token whose bytes `state` accepts in full.
  void allowed_from(const model::JsonRecognizer& state, std::vector<uint32_t>& allowed) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // (byte, node), sorted by byte
    std::vector<int32_t> tokens;                        // tokens whose bytes end here
  };
  struct Trie {
    std::vector<Node> nodes{Node{}};
    void add(const std::string& bytes, int32_t token);
    int32_t child(int32_t node, uint8_t byte);
    void walk(int32_t node, const model::JsonRecognizer& state,
              std::vector<uint32_t>& allowed) const;
  };

  Trie all_;                     // every token with bytes
  Trie unplain_;                 // those that are not plain string content
  std::vector<uint32_t> plain_;  // the plain ones, as a mask
  int32_t vocab_ = 0;
  std::vector<std::string> bytes_;  // each token's bytes, for accept()
  friend class JsonConstraint;
};

class JsonConstraint final : public model::TokenConstraint {
 public:
  JsonConstraint(std::shared_ptr<const VocabTrie> trie,
                 std::shared_ptr<const model::JsonGrammar> grammar)
      : trie_(std::move(trie)), grammar_(std::move(grammar)), state_(grammar_.get()) {}
  bool allowed_next(std::vector<uint32_t>& allowed) override;
  void accept(int32_t token) override;

 private:
  std::shared_ptr<const VocabTrie> trie_;
  std::shared_ptr<const model::JsonGrammar> grammar_;  // state_ reads it
  model::JsonRecognizer state_;
  bool stuck_ = false;  // no token could continue: only the stop tokens remain
};

}  // namespace flashserve::server
