#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "flashserve/error.h"

namespace flashserve::tokenizer {
namespace {

bool is_space(unsigned char c) {
  return c == ' ' || (c >= '\t' && c <= '\r');
}
// Word characters for single_word: ASCII letters, digits, '_' and every non-ASCII byte (letters
// of other scripts); an approximation of Unicode's alphanumeric class that errs towards words.
bool is_word(unsigned char c) {
  return std::isalnum(c) || c == '_' || c >= 0x80;
}

}  // namespace

AddedTokens::AddedTokens(const nlohmann::json& added) {
  if (added.is_null()) return;
  if (!added.is_array())
    throw Error(ErrorKind::kInvalidArgument, "tokenizer.json: added_tokens", "not a list");
  for (size_t i = 0; i < added.size(); ++i) {
    const auto& t = added[i];
    const std::string field = "tokenizer.json: added_tokens[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
        !t.contains("content") || !t["content"].is_string() ||
        t["content"].get_ref<const std::string&>().empty())
      throw Error(ErrorKind::kInvalidArgument, field,
                  "needs an integer id and a non-empty content");
    const int64_t id = t["id"].get<int64_t>();
    if (id < 0 || id > INT32_MAX)
      throw Error(ErrorKind::kInvalidArgument, field + ".id", "out of range");
    tokens_.push_back({static_cast<int32_t>(id), t["content"].get<std::string>(),
                       t.value("special", false), t.value("lstrip", false),
                       t.value("rstrip", false), t.value("single_word", false)});
  }
  for (const AddedToken& t : tokens_)
    by_first_[static_cast<unsigned char>(t.content[0])].push_back(&t);
  for (auto& list : by_first_)
    std::stable_sort(list.begin(), list.end(), [](const AddedToken* a, const AddedToken* b) {
      return a->content.size() > b->content.size();
    });
}

std::vector<Segment> AddedTokens::split(std::string_view text) const {
  std::vector<Segment> out;
  size_t text_start = 0;  // the start of the pending model text
  for (size_t i = 0; i < text.size();) {
    const AddedToken* found = nullptr;
    for (const AddedToken* t : by_first_[static_cast<unsigned char>(text[i])]) {
      if (text.compare(i, t->content.size(), t->content) != 0) continue;
      const size_t end = i + t->content.size();
      if (t->single_word &&
          ((i > 0 && is_word(text[i - 1])) || (end < text.size() && is_word(text[end]))))
        continue;
      found = t;
      break;
    }
    if (!found) {
      ++i;
      continue;
    }
    size_t begin = i, end = i + found->content.size();
    if (found->lstrip)
      while (begin > text_start && is_space(text[begin - 1])) --begin;
    if (found->rstrip)
      while (end < text.size() && is_space(text[end])) ++end;
    if (begin > text_start)
      out.push_back({text.substr(text_start, begin - text_start), -1, text_start});
    out.push_back({text.substr(i, found->content.size()), found->id, i});
    i = text_start = end;
  }
  if (text_start < text.size()) out.push_back({text.substr(text_start), -1, text_start});
  return out;
}

}  // namespace flashserve::tokenizer
