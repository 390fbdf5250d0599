#include "tokenizer/stages.h"

#include <optional>

#include "flashserve/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace flashserve::tokenizer {
namespace {

using nlohmann::json;

// GPT-2's pre-tokenizer pattern, used by ByteLevel when use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

[[noreturn]] void unsupported(const std::string& field, const std::string& type) {
  throw Error(ErrorKind::kUnsupported, field,
              "type '" + type + "' is not supported by flashserve's tokenizer");
}

std::string type_of(const json& j, const std::string& field) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    throw Error(ErrorKind::kInvalidArgument, field, "not an object with a string \"type\"");
  return j["type"].get<std::string>();
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t i = 0;
  for (size_t k; (k = s.find(from, i)) != std::string::npos; i = k + from.size())
    out.append(s, i, k - i).append(to);
  out.append(s, i, std::string::npos);
  s = std::move(out);
}

// {"String": "x"} or {"Regex": "x"}.
std::unique_ptr<Regex> pattern_of(const json& j, const std::string& field) {
  if (j.is_object() && j.contains("String") && j["String"].is_string())
    return std::make_unique<Regex>(j["String"].get<std::string>(), true, field);
  if (j.is_object() && j.contains("Regex") && j["Regex"].is_string())
    return std::make_unique<Regex>(j["Regex"].get<std::string>(), false, field);
  throw Error(ErrorKind::kInvalidArgument, field,
              "pattern is neither {\"String\"} nor {\"Regex\"}");
}

std::string literal_pattern(const json& j, const std::string& field) {
  if (j.is_object() && j.contains("String") && j["String"].is_string())
    return j["String"].get<std::string>();
  throw Error(ErrorKind::kUnsupported, field, "only {\"String\": ...} patterns are supported here");
}

// ---- normalizers ----

class NormalizerSequence : public Normalizer {
 public:
  std::vector<std::unique_ptr<Normalizer>> steps;
  void apply(std::string& t) const override {
    for (const auto& s : steps) s->apply(t);
  }
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string p) : prepend_(std::move(p)) {}
  void apply(std::string& t) const override {
    if (!t.empty()) t.insert(0, prepend_);
  }

 private:
  std::string prepend_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Regex> re, std::string content)
      : re_(std::move(re)), content_(std::move(content)) {}
  void apply(std::string& t) const override {
    std::string out;
    size_t i = 0;
    re_->for_each_match(t, [&](size_t b, size_t e) {
      out.append(t, i, b - i).append(content_);
      i = e;
    });
    out.append(t, i, std::string::npos);
    t = std::move(out);
  }

 private:
  std::unique_ptr<Regex> re_;
  std::string content_;
};

// NFC, NFD, NFKC, NFKD (Qwen2 has NFC; SentencePiece conversions NFKC).
class UnicodeForm : public Normalizer {
 public:
  explicit UnicodeForm(unicode::Form form) : form_(form) {}
  void apply(std::string& t) const override { t = unicode::normalize(t, form_); }

 private:
  unicode::Form form_;
};

class Lowercase : public Normalizer {
 public:
  void apply(std::string& t) const override { t = unicode::lowercase(t); }
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void apply(std::string& t) const override { t = unicode::strip(t, left_, right_); }

 private:
  bool left_, right_;
};

class StripAccents : public Normalizer {
 public:
  void apply(std::string& t) const override { t = unicode::strip_accents(t); }
};

// ---- pre-tokenizers ----

class PreTokenizerSequence : public PreTokenizer {
 public:
  std::vector<std::unique_ptr<PreTokenizer>> steps;
  void split(Piece piece, const PieceSink& sink) const override { run(0, std::move(piece), sink); }

 private:
  // Step i's pieces go through the later steps one by one, depth first.
  void run(size_t i, Piece piece, const PieceSink& sink) const {
    if (i == steps.size()) return sink(std::move(piece));
    steps[i]->split(std::move(piece), [&](Piece&& p) { run(i + 1, std::move(p), sink); });
  }
};

enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext };

// Splits `piece` at the matches of `re` (or, inverted, at what lies between them). The text is
// alternating delimiter and other spans; the behavior says what becomes of a delimiter. The
// latest piece is held back until the next span, which may still join it.
void split_piece(Piece piece, const Regex& re, SplitBehavior behavior, bool invert,
                 const PieceSink& sink) {
  const std::string& t = piece.text;
  std::optional<Piece> last;
  bool pending_merge = false;  // MergedWithNext: `last` takes the next span too
  auto start_piece = [&](size_t b, size_t e) {
    if (last) sink(std::move(*last));
    last = Piece{t.substr(b, e - b), piece.at_start && b == 0};
  };
  auto span = [&](bool delim, size_t b, size_t e) {
    if (!delim) {
      if (pending_merge)
        last->text.append(t, b, e - b);
      else
        start_piece(b, e);
      pending_merge = false;
      return;
    }
    switch (behavior) {
      case SplitBehavior::kIsolated:
        start_piece(b, e);
        break;
      case SplitBehavior::kRemoved:
        break;
      case SplitBehavior::kMergedWithPrevious:
        if (last && !pending_merge)
          last->text.append(t, b, e - b);
        else
          start_piece(b, e);
        break;
      case SplitBehavior::kMergedWithNext:
        start_piece(b, e);
        pending_merge = true;
        return;
    }
    pending_merge = false;
  };
  size_t i = 0;
  re.for_each_match(t, [&](size_t b, size_t e) {
    if (b > i) span(invert, i, b);
    span(!invert, b, e);
    i = e;
  });
  if (i < t.size()) span(invert, i, t.size());
  if (last) sink(std::move(*last));
}

class Split : public PreTokenizer {
 public:
  Split(std::unique_ptr<Regex> re, SplitBehavior b, bool invert)
      : re_(std::move(re)), behavior_(b), invert_(invert) {}
  void split(Piece piece, const PieceSink& sink) const override {
    split_piece(std::move(piece), *re_, behavior_, invert_, sink);
  }

 private:
  std::unique_ptr<Regex> re_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPre : public PreTokenizer {
 public:
  ByteLevelPre(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space) {
    if (use_regex) re_ = std::make_unique<Regex>(kGpt2Pattern, false, "ByteLevel");
  }
  void split(Piece piece, const PieceSink& sink) const override {
    if (add_prefix_space_ && (piece.text.empty() || piece.text[0] != ' '))
      piece.text.insert(0, " ");
    const auto to_byte_chars = [&](Piece&& p) {
      const ByteLevelMap& map = ByteLevelMap::get();
      std::string mapped;
      mapped.reserve(p.text.size() * 2);
      for (char c : p.text) mapped += map.encode(static_cast<uint8_t>(c));
      p.text = std::move(mapped);
      sink(std::move(p));
    };
    if (re_)
      split_piece(std::move(piece), *re_, SplitBehavior::kIsolated, false, to_byte_chars);
    else
      to_byte_chars(std::move(piece));
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> re_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

PrependScheme prepend_scheme(const json& j, const std::string& field) {
  if (j.contains("prepend_scheme")) {
    const std::string s = j["prepend_scheme"].get<std::string>();
    if (s == "always") return PrependScheme::kAlways;
    if (s == "first") return PrependScheme::kFirst;
    if (s == "never") return PrependScheme::kNever;
    throw Error(ErrorKind::kInvalidArgument, field + ".prepend_scheme",
                "unknown value '" + s + "'");
  }
  return j.value("add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
}

class MetaspacePre : public PreTokenizer {
 public:
  MetaspacePre(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)),
        scheme_(scheme),
        split_(split ? std::make_unique<Regex>(replacement_, true, "Metaspace") : nullptr) {}
  void split(Piece p, const PieceSink& sink) const override {
    replace_all(p.text, " ", replacement_);
    const bool prepend =
        scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && p.at_start);
    if (prepend && p.text.compare(0, replacement_.size(), replacement_) != 0)
      p.text.insert(0, replacement_);
    if (split_)
      split_piece(std::move(p), *split_, SplitBehavior::kMergedWithNext, false, sink);
    else
      sink(std::move(p));
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  std::unique_ptr<Regex> split_;
};

// ---- decoders ----

class DecoderSequence : public Decoder {
 public:
  std::vector<std::unique_ptr<Decoder>> steps;
  void apply(std::vector<std::string>& t) const override {
    for (const auto& s : steps) s->apply(t);
  }
};

class ByteLevelDecoder : public Decoder {
  // A token whose characters are all in the byte map becomes those bytes; any other token (an
  // added token such as "<|eot_id|>") keeps its own bytes. The result is one string.
  void apply(std::vector<std::string>& tokens) const override {
    const ByteLevelMap& map = ByteLevelMap::get();
    std::string out, bytes;
    for (const std::string& t : tokens) {
      bytes.clear();
      bool all = utf8::is_valid(t);
      for (size_t i = 0; all && i < t.size();) {
        size_t n;
        const int b = map.decode(utf8::decode(t, i, &n));
        if (b < 0)
          all = false;
        else
          bytes += static_cast<char>(b);
        i += n;
      }
      out += all ? bytes : t;
    }
    tokens.assign(1, std::move(out));
  }
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::string from, std::string to) : from_(std::move(from)), to_(std::move(to)) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) replace_all(t, from_, to_);
  }

 private:
  std::string from_, to_;
};

// "<0xAB>" gives 0xAB, anything else -1.
int byte_token(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  const auto hex = [](char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                  : -1;
  };
  const int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

class ByteFallbackDecoder : public Decoder {
  // Runs of byte tokens become their bytes when those are valid UTF-8, else one U+FFFD per byte.
  void apply(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string run;
    size_t run_len = 0;
    const auto flush = [&] {
      if (run_len == 0) return;
      if (utf8::is_valid(run)) {
        out.push_back(run);
      } else {
        for (size_t k = 0; k < run_len; ++k) out.emplace_back(utf8::kReplacement);
      }
      run.clear();
      run_len = 0;
    };
    for (std::string& t : tokens) {
      const int b = byte_token(t);
      if (b >= 0) {
        run += static_cast<char>(b);
        ++run_len;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

class FuseDecoder : public Decoder {
  void apply(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void apply(std::vector<std::string>& tokens) const override {
    if (content_.empty()) return;
    for (auto& t : tokens) {
      for (size_t k = 0; k < start_ && t.compare(0, content_.size(), content_) == 0; ++k)
        t.erase(0, content_.size());
      for (size_t k = 0; k < stop_ && t.size() >= content_.size() &&
                         t.compare(t.size() - content_.size(), content_.size(), content_) == 0;
           ++k)
        t.erase(t.size() - content_.size());
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, PrependScheme scheme)
      : replacement_(std::move(replacement)), scheme_(scheme) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      replace_all(tokens[i], replacement_, " ");
      if (i == 0 && scheme_ != PrependScheme::kNever && !tokens[i].empty() && tokens[i][0] == ' ')
        tokens[i].erase(0, 1);
    }
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
};

std::string str_field(const json& j, const char* key, const std::string& field) {
  if (!j.contains(key) || !j[key].is_string())
    throw Error(ErrorKind::kInvalidArgument, field + "." + key, "missing or not a string");
  return j[key].get<std::string>();
}

// A Sequence stage: its list under `key`, each element built by `make` (null ones skipped).
template <typename Seq, typename Make>
std::unique_ptr<Seq> make_sequence(const json& j, const char* key, const std::string& field,
                                   Make make) {
  auto seq = std::make_unique<Seq>();
  const json& list = j.at(key);
  for (size_t i = 0; i < list.size(); ++i)
    if (auto step = make(list[i], field + "." + key + "[" + std::to_string(i) + "]"))
      seq->steps.push_back(std::move(step));
  return seq;
}

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& field) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, field);
  if (type == "Sequence")
    return make_sequence<NormalizerSequence>(j, "normalizers", field, make_normalizer);
  if (type == "Prepend") return std::make_unique<Prepend>(str_field(j, "prepend", field));
  if (type == "NFC") return std::make_unique<UnicodeForm>(unicode::Form::kNFC);
  if (type == "NFD") return std::make_unique<UnicodeForm>(unicode::Form::kNFD);
  if (type == "NFKC") return std::make_unique<UnicodeForm>(unicode::Form::kNFKC);
  if (type == "NFKD") return std::make_unique<UnicodeForm>(unicode::Form::kNFKD);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "StripAccents") return std::make_unique<StripAccents>();
  if (type == "Strip")
    return std::make_unique<StripNormalizer>(j.value("strip_left", false),
                                             j.value("strip_right", false));
  if (type == "Replace")
    return std::make_unique<ReplaceNormalizer>(pattern_of(j.at("pattern"), field + ".pattern"),
                                               str_field(j, "content", field));
  unsupported(field, type);
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const std::string& field) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, field);
  if (type == "Sequence")
    return make_sequence<PreTokenizerSequence>(j, "pretokenizers", field, make_pre_tokenizer);
  if (type == "ByteLevel")
    return std::make_unique<ByteLevelPre>(j.value("add_prefix_space", false),
                                          j.value("use_regex", true));
  if (type == "Metaspace")
    return std::make_unique<MetaspacePre>(str_field(j, "replacement", field),
                                          prepend_scheme(j, field), j.value("split", true));
  if (type == "Split") {
    const std::string b = str_field(j, "behavior", field);
    SplitBehavior behavior;
    if (b == "Isolated")
      behavior = SplitBehavior::kIsolated;
    else if (b == "Removed")
      behavior = SplitBehavior::kRemoved;
    else if (b == "MergedWithPrevious")
      behavior = SplitBehavior::kMergedWithPrevious;
    else if (b == "MergedWithNext")
      behavior = SplitBehavior::kMergedWithNext;
    else
      throw Error(ErrorKind::kUnsupported, field + ".behavior", "'" + b + "' is not supported");
    return std::make_unique<Split>(pattern_of(j.at("pattern"), field + ".pattern"), behavior,
                                   j.value("invert", false));
  }
  unsupported(field, type);
}

std::unique_ptr<Decoder> make_decoder(const json& j, const std::string& field) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, field);
  if (type == "Sequence") return make_sequence<DecoderSequence>(j, "decoders", field, make_decoder);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Replace")
    return std::make_unique<ReplaceDecoder>(literal_pattern(j.at("pattern"), field + ".pattern"),
                                            str_field(j, "content", field));
  if (type == "Strip")
    return std::make_unique<StripDecoder>(str_field(j, "content", field), j.value("start", 0),
                                          j.value("stop", 0));
  if (type == "Metaspace")
    return std::make_unique<MetaspaceDecoder>(str_field(j, "replacement", field),
                                              prepend_scheme(j, field));
  unsupported(field, type);
}

}  // namespace flashserve::tokenizer
