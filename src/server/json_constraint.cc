#include "server/json_constraint.h"

#include <algorithm>

#include "flashserve/error.h"
#include "server/text_codec.h"

namespace flashserve::server {

VocabTrie::VocabTrie(const std::vector<std::string>& token_bytes)
    : vocab_(static_cast<int32_t>(token_bytes.size())), bytes_(token_bytes) {
  plain_.assign((static_cast<size_t>(vocab_) + 31) / 32, 0u);
  // Plain: taken inside a string, between characters, and back there after it (whole UTF-8
  // characters, none a control character, '"' or '\\'); the recognizer itself decides.
  model::JsonRecognizer body;
  for (const char c : std::string("{\"\":\"")) body.feed(static_cast<uint8_t>(c));
  for (int32_t id = 0; id < vocab_; ++id) {
    const std::string& b = bytes_[static_cast<size_t>(id)];
    if (b.empty()) continue;
    all_.add(b, id);
    model::JsonRecognizer s = body;
    const bool plain =
        std::all_of(b.begin(), b.end(), [&](char c) { return s.feed(static_cast<uint8_t>(c)); }) &&
        s.in_string_body();
    if (plain)
      plain_[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
    else
      unplain_.add(b, id);
  }
}

void VocabTrie::Trie::add(const std::string& bytes, int32_t token) {
  int32_t at = 0;
  for (char c : bytes) at = child(at, static_cast<uint8_t>(c));
  nodes[static_cast<size_t>(at)].tokens.push_back(token);
}

std::shared_ptr<const VocabTrie> VocabTrie::build(const TextCodec& codec, int32_t vocab) {
  std::vector<std::string> bytes(static_cast<size_t>(std::max(vocab, 0)));
  for (int32_t id = 0; id < vocab; ++id)
    if (!codec.is_special(id)) bytes[static_cast<size_t>(id)] = codec.token_bytes(id);
  return std::make_shared<const VocabTrie>(bytes);
}

int32_t VocabTrie::Trie::child(int32_t node, uint8_t byte) {
  auto& kids = nodes[static_cast<size_t>(node)].children;
  auto it = std::lower_bound(kids.begin(), kids.end(), byte,
                             [](const auto& kid, uint8_t b) { return kid.first < b; });
  if (it != kids.end() && it->first == byte) return it->second;
  const int32_t made = static_cast<int32_t>(nodes.size());
  kids.insert(it, {byte, made});
  nodes.emplace_back();  // (after the insert: it may move the node `kids` belongs to)
  return made;
}

void VocabTrie::Trie::walk(int32_t node, const model::JsonRecognizer& state,
                           std::vector<uint32_t>& allowed) const {
  for (const auto& [byte, next] : nodes[static_cast<size_t>(node)].children) {
    model::JsonRecognizer s = state;
    if (!s.step(byte)) continue;
    for (int32_t t : nodes[static_cast<size_t>(next)].tokens)
      allowed[static_cast<size_t>(t) >> 5] |= 1u << (t & 31);
    walk(next, s, allowed);
  }
}

void VocabTrie::allowed_from(const model::JsonRecognizer& state,
                             std::vector<uint32_t>& allowed) const {
  if (state.in_string_body()) {
    for (size_t w = 0; w < std::min(allowed.size(), plain_.size()); ++w) allowed[w] |= plain_[w];
    unplain_.walk(0, state, allowed);
  } else {
    all_.walk(0, state, allowed);
  }
}

bool JsonConstraint::allowed_next(std::vector<uint32_t>& allowed) {
  if (state_.complete() || stuck_) return true;
  // The mask covers the model's vocabulary, which holds the tokenizer's (TokenizerCodec refuses
  // a tokenizer with ids beyond it): the trie's tokens are set in place, with no copy per step.
  if (allowed.size() < (static_cast<size_t>(trie_->vocab()) + 31) / 32)
    throw Error(ErrorKind::kInternal, "response_format",
                "the token mask is smaller than the tokenizer's vocabulary");
  trie_->allowed_from(state_, allowed);  // `allowed` arrives zeroed (TokenConstraint)
  stuck_ = std::none_of(allowed.begin(), allowed.end(), [](uint32_t w) { return w != 0; });
  return stuck_;
}

void JsonConstraint::accept(int32_t token) {
  if (token < 0 || token >= trie_->vocab() || state_.complete() || stuck_) return;
  model::JsonRecognizer next = state_;
  for (char c : trie_->bytes_[static_cast<size_t>(token)])
    if (!next.feed(static_cast<uint8_t>(c))) return;  // not from the mask: a stop or eos token
  state_ = next;
}

}  // namespace flashserve::server
