// Tokenizer: loading tokenizer.json and running its pipeline (added tokens → normalizer →
// pre-tokenizer → BPE → post-processor; ids → tokens → decoders).
#include "tokenizer/tokenizer.h"

#include <cctype>
#include <filesystem>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "flashserve/error.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/json_file.h"
#include "tokenizer/stages.h"
#include "tokenizer/utf8.h"

namespace flashserve::tokenizer {

using nlohmann::json;

// tokenizer_config.json names tokens as a string or as an AddedToken object {"content": ...}.
std::string config_token(const json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  throw Error(ErrorKind::kInvalidArgument, std::string("tokenizer_config.json: ") + key,
              "neither a string nor {\"content\": ...}");
}

class TokenizerImpl {
 public:
  TokenizerImpl(const json& tj, const json& config)
      : bpe_(model_of(tj)), added_(tj.value("added_tokens", json())) {
    normalizer_ = make_normalizer(tj.value("normalizer", json()), "tokenizer.json: normalizer");
    pre_tokenizer_ =
        make_pre_tokenizer(tj.value("pre_tokenizer", json()), "tokenizer.json: pre_tokenizer");
    decoder_ = make_decoder(tj.value("decoder", json()), "tokenizer.json: decoder");
    // Dense ids are below the number of entries: a larger one is refused before the tables are
    // sized by it (an id of 2^31 - 1 overflowed id + 1; one of 2^30 asked for 32 GB).
    const size_t entries = bpe_.vocab().size() + added_.tokens().size();
    auto dense = [&](int32_t id, const char* field) {
      if (static_cast<size_t>(id) >= entries)
        throw Error(ErrorKind::kInvalidArgument, field,
                    "id " + std::to_string(id) + " is beyond the " + std::to_string(entries) +
                        " tokens (ids must be dense)");
    };
    for (const auto& [token, id] : bpe_.vocab()) dense(id, "tokenizer.json: model.vocab");
    for (const AddedToken& t : added_.tokens()) dense(t.id, "tokenizer.json: added_tokens");
    for (const auto& [token, id] : bpe_.vocab()) set_token(id, token);
    for (const AddedToken& t : added_.tokens()) {
      set_token(t.id, t.content);
      if (t.special) special_.resize(id_to_token_.size()), special_[t.id] = true;
      token_to_id_[t.content] = t.id;
    }
    special_.resize(id_to_token_.size());
    for (size_t id = 0; id < id_to_token_.size(); ++id)
      if (!has_token_[id])
        throw Error(ErrorKind::kInvalidArgument, "tokenizer.json: model.vocab",
                    "id " + std::to_string(id) + " has no token (ids must be dense)");
    read_post_processor(tj.value("post_processor", json()), "tokenizer.json: post_processor");

    bos_ = config_token(config, "bos_token");
    eos_ = config_token(config, "eos_token");
    if (!eos_.empty()) {
      if (auto id = token_id(eos_)) eos_ids_.push_back(*id);
    } else {
      for (const char* name :
           {"</s>", "<|endoftext|>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>"})
        if (auto id = token_id(name)) eos_ids_.push_back(*id);
    }
    if (!bos_.empty())
      bos_id_ = token_id(bos_);
    else if (!bos_template_ids_.empty())
      bos_id_ = bos_template_ids_.front();
    if (bos_.empty() && bos_id_) bos_ = id_to_token_[*bos_id_];
    if (eos_.empty() && !eos_ids_.empty()) eos_ = id_to_token_[eos_ids_.front()];
  }

  // The ids of `raw`, or nullopt once it is certain there are more than max_ids.
  std::optional<std::vector<int32_t>> encode(std::string_view raw, bool add_special,
                                             size_t max_ids) const {
    const std::string text = utf8::lossy(raw);
    std::vector<int32_t> ids;
    struct Enough {};  // thrown from inside the pre-tokenizers once there are too many ids
    const auto check = [&] {
      if (ids.size() > max_ids) throw Enough{};
    };
    try {
      if (add_special) ids.insert(ids.end(), prefix_ids_.begin(), prefix_ids_.end());
      check();
      for (const Segment& seg : added_.split(text)) {
        if (seg.id >= 0) {
          ids.push_back(seg.id);
          check();
          continue;
        }
        std::string normalized(seg.text);
        if (normalizer_) normalizer_->apply(normalized);
        Piece whole{std::move(normalized), seg.offset == 0};
        const auto encode_piece = [&](Piece&& p) {
          if (!bpe_.encode_word(p.text, ids, max_ids)) throw Enough{};
          check();
        };
        if (pre_tokenizer_)
          pre_tokenizer_->split(std::move(whole), encode_piece);
        else
          encode_piece(std::move(whole));
      }
      if (add_special) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
      check();
    } catch (const Enough&) {
      return std::nullopt;
    }
    return ids;
  }

  // The decoders' bytes, before the lossy conversion to valid UTF-8.
  std::string decode_bytes(std::span<const int32_t> ids, bool skip_special) const {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size())
        throw Error(ErrorKind::kInvalidArgument, "token_ids",
                    "id " + std::to_string(id) + " is outside the vocabulary [0, " +
                        std::to_string(vocab_size()) + ")");
      if (skip_special && special_[id]) continue;
      tokens.push_back(id_to_token_[id]);
    }
    if (!decoder_) {  // Hugging Face joins undecoded tokens with spaces
      std::string out;
      for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
      return out;
    }
    decoder_->apply(tokens);
    std::string out;
    for (const auto& t : tokens) out += t;
    return out;
  }

  std::string decode(std::span<const int32_t> ids, bool skip_special) const {
    return utf8::lossy(decode_bytes(ids, skip_special));
  }

  // What `id` adds to a text after other tokens: decode(id id) less decode(id), so the decoders'
  // start-of-text rules (Strip of the first space, Metaspace's prepend) do not apply; decode(id)
  // where the doubled decode does not begin with the single one.
  std::string token_bytes(int32_t id) const {
    const int32_t one[] = {id}, two[] = {id, id};
    // A byte-fallback token is its byte (the ByteFallback decoder would make a lone one U+FFFD).
    if (id >= 0 && id < vocab_size()) {
      const std::string& t = id_to_token_[id];
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
          std::isxdigit(static_cast<unsigned char>(t[3])) &&
          std::isxdigit(static_cast<unsigned char>(t[4])))
        return std::string(1, static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)));
    }
    const std::string single = decode_bytes(one, false), twice = decode_bytes(two, false);
    if (twice.size() >= single.size() && twice.compare(0, single.size(), single) == 0)
      return twice.substr(single.size());
    return single;
  }

  int32_t vocab_size() const { return static_cast<int32_t>(id_to_token_.size()); }
  std::optional<int32_t> token_id(std::string_view t) const {
    auto it = token_to_id_.find(std::string(t));
    if (it != token_to_id_.end()) return it->second;
    auto v = bpe_.vocab().find(std::string(t));
    if (v != bpe_.vocab().end()) return v->second;
    return std::nullopt;
  }
  const std::string& token(int32_t id) const { return id_to_token_.at(id); }
  bool is_special(int32_t id) const { return id >= 0 && id < vocab_size() && special_[id]; }

  std::vector<int32_t> eos_ids_;
  std::optional<int32_t> bos_id_;
  std::string bos_, eos_;

 private:
  static const json& model_of(const json& tj) {
    if (!tj.is_object())
      throw Error(ErrorKind::kInvalidArgument, "tokenizer.json", "not an object");
    auto it = tj.find("model");
    if (it == tj.end() || !it->is_object())
      throw Error(ErrorKind::kInvalidArgument, "tokenizer.json: model", "missing");
    const std::string type = it->value("type", std::string("BPE"));
    if (type != "BPE")
      throw Error(ErrorKind::kUnsupported, "tokenizer.json: model.type",
                  "'" + type + "' is not supported (only BPE)");
    return *it;
  }

  void set_token(int32_t id, const std::string& t) {
    if (static_cast<size_t>(id) >= id_to_token_.size())
      id_to_token_.resize(id + 1), has_token_.resize(id + 1, false);
    id_to_token_[id] = t;
    has_token_[id] = true;
  }

  // TemplateProcessing's "single" template: special tokens before and after the sequence "A".
  void read_post_processor(const json& pp, const std::string& field) {
    if (pp.is_null()) return;
    const std::string type = pp.value("type", std::string());
    if (type == "ByteLevel") return;  // only adjusts offsets, which we do not return
    if (type == "Sequence") {
      const json& list = pp.at("processors");
      for (size_t i = 0; i < list.size(); ++i)
        read_post_processor(list[i], field + ".processors[" + std::to_string(i) + "]");
      return;
    }
    if (type != "TemplateProcessing")
      throw Error(ErrorKind::kUnsupported, field, "type '" + type + "' is not supported");
    bool after = false;
    for (const json& item : pp.at("single")) {
      if (item.contains("Sequence")) {
        after = true;
        continue;
      }
      const std::string name = item.at("SpecialToken").at("id").get<std::string>();
      const json& st = pp.at("special_tokens");
      if (!st.contains(name))
        throw Error(ErrorKind::kInvalidArgument, field + ".special_tokens",
                    "'" + name + "' is used in the template but not defined");
      for (const json& id : st[name].at("ids")) {
        // Read as int64 and checked: get<int32_t> truncated 2^32 + 1 to 1, and an id outside
        // the vocabulary was later read as a token (out of bounds) and prepended to prompts.
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size())
          throw Error(ErrorKind::kInvalidArgument, field + ".special_tokens",
                      "'" + name + "' has id " + id.dump() + ", outside the vocabulary of " +
                          std::to_string(vocab_size()));
        const auto v = static_cast<int32_t>(id.get<int64_t>());
        (after ? suffix_ids_ : prefix_ids_).push_back(v);
        if (!after) bos_template_ids_.push_back(v);
      }
    }
  }

  Bpe bpe_;
  AddedTokens added_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<Decoder> decoder_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_token_, special_;
  std::unordered_map<std::string, int32_t> token_to_id_;  // added tokens (they take precedence)
  std::vector<int32_t> prefix_ids_, suffix_ids_, bos_template_ids_;
};

Tokenizer::Tokenizer(std::unique_ptr<TokenizerImpl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view config_json) {
  const json tj = parse_json(tokenizer_json, "tokenizer.json");
  const json config =
      config_json.empty() ? json::object() : parse_json(config_json, "tokenizer_config.json");
  try {
    return Tokenizer(std::make_unique<TokenizerImpl>(tj, config));
  } catch (const json::exception& e) {  // a field of the wrong JSON type somewhere
    throw Error(ErrorKind::kInvalidArgument, "tokenizer.json",
                std::string("malformed: ") + e.what());
  }
}

Tokenizer Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::string tokenizer_path = path, config_path;
  std::error_code ec;  // the throwing overloads would escape as filesystem_error, not Error
  if (!fs::exists(path, ec))
    throw Error(ErrorKind::kInvalidArgument, "tokenizer",
                "'" + path + "' does not exist (a model directory or its tokenizer.json)");
  if (fs::is_directory(path, ec)) {
    tokenizer_path = (fs::path(path) / "tokenizer.json").string();
    config_path = (fs::path(path) / "tokenizer_config.json").string();
  } else {
    config_path = (fs::path(path).parent_path() / "tokenizer_config.json").string();
  }
  const std::string tj = read_file(tokenizer_path, "tokenizer.json");
  const std::string config =
      fs::exists(config_path, ec) ? read_file(config_path, "tokenizer_config.json") : std::string();
  try {
    return from_json(tj, config);
  } catch (const Error& e) {
    throw in_file(e, tokenizer_path);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return *impl_->encode(text, add_special_tokens, SIZE_MAX);
}
std::optional<std::vector<int32_t>> Tokenizer::encode_within(std::string_view text,
                                                             bool add_special_tokens,
                                                             size_t max_ids) const {
  return impl_->encode(text, add_special_tokens, max_ids);
}
std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  return impl_->decode(ids, skip_special_tokens);
}
std::string Tokenizer::token_bytes(int32_t id) const {
  return impl_->token_bytes(id);
}
int32_t Tokenizer::vocab_size() const {
  return impl_->vocab_size();
}
std::optional<int32_t> Tokenizer::token_id(std::string_view t) const {
  return impl_->token_id(t);
}
std::optional<std::string> Tokenizer::token(int32_t id) const {
  if (id < 0 || id >= impl_->vocab_size()) return std::nullopt;
  return impl_->token(id);
}
bool Tokenizer::is_special(int32_t id) const {
  return impl_->is_special(id);
}
const std::vector<int32_t>& Tokenizer::eos_token_ids() const {
  return impl_->eos_ids_;
}
std::optional<int32_t> Tokenizer::bos_token_id() const {
  return impl_->bos_id_;
}
const std::string& Tokenizer::bos_token() const {
  return impl_->bos_;
}
const std::string& Tokenizer::eos_token() const {
  return impl_->eos_;
}

}  // namespace flashserve::tokenizer
