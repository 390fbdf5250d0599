#include "tokenizer/bpe.h"

#include <algorithm>
#include <cstdio>
#include <queue>

#include "flashserve/error.h"
#include "tokenizer/utf8.h"

namespace flashserve::tokenizer {
namespace {

Error model_error(const std::string& field, const std::string& what) {
  return Error(ErrorKind::kInvalidArgument, "tokenizer.json: model." + field, what);
}

// merges are "a b" strings (older files) or ["a", "b"] pairs (tokenizers >= 0.20).
std::pair<std::string, std::string> merge_pair(const nlohmann::json& m, size_t rank) {
  if (m.is_string()) {
    const std::string& s = m.get_ref<const std::string&>();
    const size_t sp = s.find(' ', 1);
    if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
      throw model_error("merges", "entry " + std::to_string(rank) + " '" + s +
                                      "' is not two tokens separated by one space");
    return {s.substr(0, sp), s.substr(sp + 1)};
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
    return {m[0].get<std::string>(), m[1].get<std::string>()};
  throw model_error("merges", "entry " + std::to_string(rank) + " is neither \"a b\" nor [a, b]");
}

}  // namespace

Bpe::Bpe(const nlohmann::json& model) {
  const auto str = [&](const char* key) -> std::string {
    auto it = model.find(key);
    return it == model.end() || it->is_null() ? std::string() : it->get<std::string>();
  };
  if (!str("continuing_subword_prefix").empty() || !str("end_of_word_suffix").empty())
    throw Error(ErrorKind::kUnsupported, "tokenizer.json: model",
                "continuing_subword_prefix / end_of_word_suffix are not supported");
  if (auto d = model.find("dropout"); d != model.end() && !d->is_null() && d->get<double>() != 0)
    throw Error(ErrorKind::kUnsupported, "tokenizer.json: model.dropout",
                "BPE dropout is not supported");
  byte_fallback_ = model.value("byte_fallback", false);
  ignore_merges_ = model.value("ignore_merges", false);
  fuse_unk_ = model.value("fuse_unk", false);

  const auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object())
    throw model_error("vocab", "missing or not an object");
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      throw model_error("vocab", "id of '" + token + "' is not a non-negative 32-bit integer");
    vocab_.emplace(token, id.get<int32_t>());
    max_token_bytes_ = std::max(max_token_bytes_, token.size());
  }
  const std::string unk = str("unk_token");
  if (!unk.empty()) {
    auto it = vocab_.find(unk);
    if (it == vocab_.end())
      throw model_error("unk_token", "'" + unk + "' is not in the vocabulary");
    unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = vocab_.find(name);
    byte_ids_[b] = byte_fallback_ && it != vocab_.end() ? it->second : -1;
  }

  const auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array())
    throw model_error("merges", "missing or not a list");
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    auto [a, b] = merge_pair((*merges)[rank], rank);
    auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || iab == vocab_.end())
      throw model_error("merges", "entry " + std::to_string(rank) + " '" + a + " " + b +
                                      "' refers to a token not in the vocabulary");
    // The first occurrence of a pair sets its rank, as in Hugging Face's reader.
    merges_.try_emplace(pair_key(ia->second, ib->second),
                        Merge{static_cast<int32_t>(rank), iab->second});
  }
}

bool Bpe::encode_word(std::string_view word, std::vector<int32_t>& out, size_t max_out) const {
  if (word.empty()) return true;
  if (ignore_merges_) {
    if (auto it = vocab_.find(std::string(word)); it != vocab_.end()) {
      if (out.size() + 1 > max_out) return false;
      out.push_back(it->second);
      return true;
    }
  }
  // A merged token's string is its two parts' strings joined, and each symbol's is at least a
  // byte: no token joins more than max_token_bytes_ symbols, so the word has at least
  // symbols / max_token_bytes_ ids. Past max_out, say so without going on (a sentencepiece-style
  // tokenizer has no pre-tokenizer: a whole prompt is one word, and merging megabytes costs
  // seconds and ~25 bytes a byte).
  const auto too_many = [&](size_t symbols) {
    return max_out != SIZE_MAX &&
           out.size() + (symbols + max_token_bytes_ - 1) / max_token_bytes_ > max_out;
  };
  // The symbols of the word: one per character (or per byte with byte fallback), as a linked
  // list so merges are O(1) and the heap of candidate pairs keeps the whole word O(n log n).
  std::vector<int32_t> ids;
  std::string key;
  bool last_unk = false;
  for (size_t i = 0; i < word.size();) {
    if (too_many(ids.size())) return false;
    size_t n = utf8::valid_length(word, i);
    if (n == 0) n = 1;  // the caller passes valid UTF-8; a stray byte is its own symbol
    key.assign(word.substr(i, n));
    if (auto it = vocab_.find(key); it != vocab_.end()) {
      ids.push_back(it->second);
      last_unk = false;
    } else {
      bool all_bytes = byte_fallback_;
      for (size_t k = 0; k < n && all_bytes; ++k)
        all_bytes = byte_ids_[static_cast<uint8_t>(word[i + k])] >= 0;
      if (all_bytes) {
        for (size_t k = 0; k < n; ++k) ids.push_back(byte_ids_[static_cast<uint8_t>(word[i + k])]);
        last_unk = false;
      } else if (unk_id_ >= 0) {
        if (!(fuse_unk_ && last_unk)) ids.push_back(unk_id_);
        last_unk = true;
      } else {
        throw Error(ErrorKind::kInvalidArgument, "text",
                    "character '" + key +
                        "' is not in the vocabulary and the model has no "
                        "unk_token or byte fallback");
      }
    }
    i += n;
  }

  if (too_many(ids.size())) return false;
  const int n = static_cast<int>(ids.size());
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
  struct Candidate {
    int32_t rank;
    int pos;
    int32_t left, right;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto push = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    auto it = merges_.find(pair_key(ids[pos], ids[next[pos]]));
    if (it != merges_.end()) heap.push({it->second.rank, pos, ids[pos], ids[next[pos]]});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  std::vector<bool> dead(n, false);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    // Stale when either side has changed since the candidate was pushed.
    if (dead[c.pos] || next[c.pos] < 0 || ids[c.pos] != c.left || ids[next[c.pos]] != c.right)
      continue;
    const int right = next[c.pos];
    ids[c.pos] = merges_.at(pair_key(c.left, c.right)).merged_id;
    dead[right] = true;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  for (int i = 0; i >= 0 && i < n; i = next[i]) out.push_back(ids[i]);
  return true;
}

}  // namespace flashserve::tokenizer
